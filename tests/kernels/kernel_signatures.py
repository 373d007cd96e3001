"""What each kernel instance declares, read from the CUDA sources: its parameters and its launch bound.

A launch passes its arguments as Device.launch packs them (engine/cuda/device.py _pack_args: a Buffer or None a
64-bit pointer, a Python int an int32, a float a float32, ctypes values as they are); a kernel reads them at the
offsets its own parameter list gives. A launcher and a kernel that disagree on the count or the kind of a parameter
show nothing on the CPU and read garbage on the GPU, so tests/kernels/test_launch_signatures.py holds every launch
of the engine against these declarations.
"""

from __future__ import annotations

import ast
import ctypes
import operator
import re
from dataclasses import dataclass
from functools import cache

from engine.cuda import instances, nvrtc
from engine.cuda.memory import Buffer

QUALIFIERS = {"const", "__restrict__", "__grid_constant__", "volatile", "struct"}
SCALARS = {
    "int": "i32", "unsigned": "i32", "unsigned int": "i32", "u32": "i32", "i32": "i32", "uint32_t": "i32",
    "int32_t": "i32", "bool": "i8",
    "float": "f32", "double": "f64",
    "u64": "i64", "i64": "i64", "uint64_t": "i64", "int64_t": "i64", "size_t": "i64", "long long": "i64",
    "unsigned long long": "i64",
}
CTYPES = {ctypes.c_int32: "i32", ctypes.c_uint32: "i32", ctypes.c_int: "i32", ctypes.c_uint: "i32",
          ctypes.c_float: "f32", ctypes.c_double: "f64", ctypes.c_int64: "i64", ctypes.c_uint64: "i64",
          ctypes.c_bool: "i8"}


@dataclass(frozen=True, slots=True)
class Param:
    """One declared parameter: its kind (ptr, i32, i64, f32, f64, i8, or struct:<C type>) and name."""

    kind: str
    name: str


@dataclass(frozen=True, slots=True)
class Signature:
    """A kernel instance's parameters, and its launch bound's most threads a block (None where not evaluable)."""

    params: tuple[Param, ...]
    max_threads: int | None


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


@cache
def _sources() -> dict[str, str]:
    """Every kernel source and header, comments removed, by file name (the megakernel's beside the others)."""
    dirs = [nvrtc.KERNEL_DIR, nvrtc.KERNEL_DIR.parent / "megakernel"]
    return {p.name: _strip_comments(p.read_text()) for d in dirs for p in sorted(d.glob("*.cu*"))}


@cache
def _macros() -> dict[str, str]:
    """Object-like #defines of every source (the last definition of a name wins)."""
    out: dict[str, str] = {}
    for text in _sources().values():
        for name, value in re.findall(r"^\s*#\s*define\s+(\w+)[ \t]+([^\n]+)$", text, flags=re.M):
            out[name] = value.strip()
    return out


def _balanced(text: str, start: int) -> int:
    """The index just past the parenthesis that closes the one at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError("unbalanced parentheses")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """text split at the separators outside any (), <>, [] or {}."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def _param(decl: str) -> Param:
    decl = decl.split("=", 1)[0].strip()
    words = re.findall(r"\w+", decl)
    name = words[-1]
    if "*" in decl:
        return Param("ptr", name)
    if "&" in decl:
        raise ValueError(f"a kernel parameter by reference: {decl!r}")
    type_words = [w for w in words[:-1] if w not in QUALIFIERS]
    spelled = " ".join(type_words)
    return Param(SCALARS.get(spelled, f"struct:{spelled}"), name)


def _template_param(decl: str) -> tuple[str, str | None]:
    """(name, default or None) of a template parameter's declaration ("int MAXW = I8V_MAX_WARPS")."""
    head, _, default = decl.partition("=")
    return re.findall(r"\w+", head)[-1], default.strip() or None


@dataclass(frozen=True, slots=True)
class _Definition:
    template: tuple[tuple[str, str | None], ...]  # template parameters (name, default), in order
    bound: str | None  # the launch bound's first argument, as written
    params: tuple[Param, ...]


@cache
def _definitions() -> dict[str, list[_Definition]]:
    """Every __global__ function of the sources, by name."""
    out: dict[str, list[_Definition]] = {}
    bounds = re.compile(r"\s*(?:void\s+)?__launch_bounds__\s*\(")
    function = re.compile(r"\s*(?:void\s+)?(\w+)\s*\(")
    for text in _sources().values():
        for m in re.finditer(r"__global__\b", text):
            i, bound = m.end(), None
            lb = bounds.match(text, i)
            if lb:
                open_at = lb.end() - 1
                close_at = _balanced(text, open_at)
                bound = _split_top(text[open_at + 1:close_at - 1])[0]
                i = close_at
            named = function.match(text, i)
            if not named:
                continue
            open_at = named.end() - 1
            params = tuple(_param(p) for p in _split_top(text[open_at + 1:_balanced(text, open_at) - 1]) if p)
            tpl = re.search(r"template\s*<([^;{}]*)>\s*$", text[max(0, m.start() - 400):m.start()])
            template = tuple(_template_param(p) for p in _split_top(tpl.group(1))) if tpl else ()
            out.setdefault(named.group(1), []).append(_Definition(template, bound, params))
    return out


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Gt: operator.gt, ast.Lt: operator.lt, ast.GtE: operator.ge, ast.LtE: operator.le, ast.Eq: operator.eq,
        ast.NotEq: operator.ne}


def _evaluate(expr: str, names: dict[str, str], depth: int = 0) -> int:
    """A C integer expression of literals, macros and template arguments (ValueError where it has anything else)."""
    if depth > 8:
        raise ValueError(expr)
    expr = re.sub(r"\b(\w+)\b", lambda w: f"({names[w.group(1)]})" if w.group(1) in names else w.group(1), expr)
    if re.search(r"[A-Za-z_]", expr.replace("true", "1").replace("false", "0")):
        macros = _macros()
        again = re.sub(r"\b([A-Za-z_]\w*)\b", lambda w: f"({macros[w.group(1)]})" if w.group(1) in macros
                       else w.group(1), expr)
        if again == expr:
            raise ValueError(expr)
        return _evaluate(again, {}, depth + 1)
    expr = expr.replace("true", "1").replace("false", "0").replace("/", "//").replace("||", " or ")
    expr = expr.replace("&&", " and ")
    expr = re.sub(r"(.+?)\?(.+?):(.+)", r"(\2) if (\1) else (\3)", expr)
    return int(_eval_node(ast.parse(expr.strip(), mode="eval").body))


def _eval_node(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPS:
        return int(_OPS[type(node.ops[0])](_eval_node(node.left), _eval_node(node.comparators[0])))
    if isinstance(node, ast.BoolOp):
        values = [_eval_node(v) for v in node.values]
        return int(all(values) if isinstance(node.op, ast.And) else any(values))
    if isinstance(node, ast.IfExp):
        return _eval_node(node.body) if _eval_node(node.test) else _eval_node(node.orelse)
    raise ValueError(ast.dump(node))


@cache
def signature(instance: str) -> Signature:
    """The parameters and launch bound of a kernel instance (engine.cuda.instances name, or "megakernel")."""
    expr = instances.INSTANCES[instance].expr if instance in instances.INSTANCES else instance
    name = re.match(r"\s*(\w+)", expr).group(1)
    found = _definitions().get(name)
    if not found:
        raise KeyError(f"{instance}: no __global__ {name} in the kernel sources")
    if len({d.params for d in found}) > 1:
        raise KeyError(f"{instance}: {name} is declared with different parameters in several places")
    definition = found[0]
    args = _split_top(expr[expr.index("<") + 1:expr.rindex(">")]) if "<" in expr else []
    names = {name: args[i] if i < len(args) else default for i, (name, default) in enumerate(definition.template)}
    names = {k: v for k, v in names.items() if v is not None}
    try:
        max_threads = _evaluate(definition.bound, names) if definition.bound else 1024
    except (ValueError, SyntaxError, KeyError):
        max_threads = None
    return Signature(definition.params, max_threads)


def arg_kind(arg: object) -> str:
    """What Device.launch makes of a Python argument, in Param.kind's terms."""
    if isinstance(arg, Buffer) or arg is None:
        return "ptr"
    if isinstance(arg, ctypes.Structure):
        return f"struct:{type(arg).__name__}"
    if isinstance(arg, ctypes._SimpleCData):
        return CTYPES.get(type(arg), type(arg).__name__)
    if isinstance(arg, (bool, int)) or type(arg).__module__ == "numpy" and "int" in type(arg).__name__:
        return "i32"
    if isinstance(arg, float) or type(arg).__module__ == "numpy" and "float" in type(arg).__name__:
        return "f32"
    return type(arg).__name__


def launch_problems(launch) -> list[str]:
    """What is wrong with one recorded launch (tests/kernels/shadow_device.py Launch; empty: nothing): its
    arguments against the kernel's parameters, its block against the launch bound, its dynamic shared memory
    against what was allowed, its grid, and its Buffers against the live allocations."""
    sig, out = signature(launch.kernel), []
    kinds = [arg_kind(a) for a in launch.args]
    want = [p.kind for p in sig.params]
    if len(kinds) != len(want):
        out.append(f"{len(kinds)} arguments for {len(want)} parameters ({', '.join(p.name for p in sig.params)})")
    for i, (got, param) in enumerate(zip(kinds, sig.params)):
        expected = param.kind  # (a struct's ctypes mirror has its C name: tests/kernels/test_struct_mirrors.py)
        if got != expected and not (got == "i32" and expected == "i8"):
            out.append(f"argument {i} ({param.name}): {got} where the kernel reads {param.kind}")
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if sig.max_threads is not None and threads > sig.max_threads:
        out.append(f"{threads} threads a block, past the launch bound {sig.max_threads}")
    if launch.smem > launch.smem_allowed:
        out.append(f"{launch.smem} bytes of dynamic shared memory, {launch.smem_allowed} allowed")
    if launch.grid[1] > 65535 or launch.grid[2] > 65535 or launch.grid[0] >= 2**31:
        out.append(f"grid {launch.grid}")
    if not launch.live:
        out.append("a Buffer outside every live allocation")
    return out


def problems_of(launches) -> set[str]:
    """Every distinct "kernel: problem" of recorded launches (empty: all of them are right)."""
    return {f"{launch.kernel}: {p}" for launch in launches for p in launch_problems(launch)}
