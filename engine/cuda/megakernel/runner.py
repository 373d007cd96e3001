"""The GPU executor of the megakernel: compiles it for the GPU and the model present, uploads the weights, the
buffers of layout.buffer_specs and each program's instruction words, and launches one persistent cooperative
grid (one block per SM) per program run. MegakernelBackend drives it exactly as it drives the VM.

Untested on a GPU at the time of writing (see bench/MEGAKERNEL.md, "Status"): bench/gpu_megakernel.py and
tests/kernels/test_megakernel_diff.py are the first things to run on one.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from pathlib import Path

import numpy as np

from engine.cuda.device import Buffer, Device
from engine.cuda.driver import CudaError, check, driver
from engine.cuda.megakernel import build, formats
from engine.cuda.megakernel.errors import MegakernelError
from engine.cuda.megakernel.layout import (CTL_WORDS, MAX_ROWS, BufferSpec, ModelSpec, buffer_specs, proj_offsets,
                                           proj_width, lw)
from engine.cuda.megakernel.schedule import PROGRAMS, Program, ScheduleConfig, build_program
from engine.cuda.megakernel.structs import ActRef, Globals, assign
from engine.cuda.megakernel.upload import DeviceModel, layer_tables, rope_inv_freq, upload_model, weight_ref

ELEMENT_BYTES = {"f32": 4, "i32": 4, "u32": 4, "u8": 1, "kv": 2}
TIME_SLOTS = 8  # opcodes.cuh TIME_*
TRACE_WARPS, TRACE_EVENTS = 8, 16  # opcodes.cuh: a build with MK_TRACE=1 writes them after the timing slots
# Acts with an int8 copy (globals.cuh ActRef::q8), which the K-quant matmuls of one row take as two int8 levels
# (matvec.cuh MK_MV_I8): the norms' output, and FILL_ACTS, whose writers (FFN_UP's 128-160-position runs, DN_RULE's
# and ATTN_COMBINE's heads) each write part of a superblock and the last of them forms its copy (a count a
# superblock, mk_common.cuh act8_fill). act_mix's copy (MIX_OUT at one row on the int8 batch) was off from round 7
# (the greedy tokens left the per-op path's at token 251 of 256 on a near tie) until the accuracy rule of the
# eleventh session: its median max |dlogit| against the f16 per-op path 0.0243, within the per-op int8 path's
# 0.0254, and 0.00494 against the reference (0.00505); diff + tiny all ok with it (H100, 979b95a); d = 0 12.22
# against 12.40 ms (bench/MEGAKERNEL.md Status).
INT8_ACTS = ("act_h", "act_ffn", "act_mix")
FILL_ACTS = ("act_ffn", "act_mix")
# A benchmark knob: the acts that get an int8 copy, comma-separated, from act_h and FILL_ACTS.
INT8_ACTS_ENV = "OPENJET_MK_INT8_ACTS"


def int8_acts() -> tuple[str, ...]:
    """INT8_ACTS, or the acts OPENJET_MK_INT8_ACTS names (act_h and FILL_ACTS)."""
    want = os.environ.get(INT8_ACTS_ENV)
    if want is None:
        return INT8_ACTS
    names = tuple(n.strip() for n in want.split(",") if n.strip())
    known = ("act_h", *FILL_ACTS)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{INT8_ACTS_ENV}: {', '.join(unknown)} not among {', '.join(known)}")
    return names


def globals_sizes(spec: ModelSpec, capacity: int, config: ScheduleConfig, num_lm_parts: int,
                  num_draft_parts: int, max_len: int) -> dict[str, int]:
    """The int32 size fields of Globals (structs.SIZE_FIELDS) for a model, a KV capacity and a schedule."""
    cfg, offsets = spec.cfg, proj_offsets(spec.cfg)
    return dict(max_len=max_len, num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, ffn_size=cfg.ffn_size,
                vocab=cfg.vocab_size, draft_vocab=spec.draft_vocab, num_heads=cfg.num_heads,
                num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rope_dim=cfg.rope_dim, q_size=cfg.q_size,
                kv_size=cfg.kv_size, ssm_k_heads=cfg.ssm_num_k_heads, ssm_v_heads=cfg.ssm_num_v_heads,
                ssm_dk=cfg.ssm_head_dim, ssm_dv=cfg.ssm_v_head_dim, conv_kernel=cfg.ssm_conv_kernel,
                conv_dim=cfg.ssm_conv_dim, inner=cfg.ssm_inner_size, capacity=capacity, proj_width=proj_width(cfg),
                attn_splits=config.attn_splits, num_lm_parts=num_lm_parts, num_draft_parts=max(num_draft_parts, 1),
                has_mtp=int(spec.has_mtp), off_q=offsets[lw("attn_q")], off_k=offsets[lw("attn_k")],
                off_v=offsets[lw("attn_v")], off_gate=offsets[lw("attn_gate")], off_alpha=offsets[lw("ssm_alpha")],
                off_beta=offsets[lw("ssm_beta")])


class GpuExecutor:
    """One model on one GPU, ready to run the megakernel's programs."""

    def __init__(self, dev: Device, spec: ModelSpec, tensors, capacity: int, config: ScheduleConfig | None = None,
                 timings: bool = False, owns_device: bool = False, reserve: tuple[ScheduleConfig, ...] = ()):
        """reserve: other schedules of the same SMs that reschedule() may take later (a benchmark's variants): the
        head-part buffers are sized for the most any of them needs."""
        self.dev, self.spec, self.capacity, self.owns_device = dev, spec, capacity, owns_device
        self.int8_acts = int8_acts()
        self.config = config or ScheduleConfig(num_sms=dev.info.multiprocessors)
        if self.config.num_sms > dev.info.multiprocessors:
            raise MegakernelError(f"a schedule for {self.config.num_sms} SMs cannot be co-resident on "
                                  f"{dev.info.multiprocessors}")
        if spec.cfg.hidden_size % 256:
            raise MegakernelError(f"hidden size {spec.cfg.hidden_size} is not a multiple of 256")
        if spec.cfg.head_dim % 32:  # ATTN_COMBINE stores a query head at a time into act_mix's 32-wide sub-blocks
            raise MegakernelError(f"head dim {spec.cfg.head_dim} is not a multiple of 32")
        names = [n for n in PROGRAMS if n != "mtp" or spec.has_mtp]
        self.programs = {n: build_program(spec, n, self.config) for n in names}
        sized = list(self.programs.values()) + [build_program(spec, n, c) for c in reserve for n in names]
        self.num_lm_parts = max(p.num_lm_parts for p in sized)
        self.num_draft_parts = max(p.num_draft_parts for p in sized)
        self._compile()
        self.model: DeviceModel = upload_model(dev, spec, tensors)
        self.specs = buffer_specs(spec, capacity, self.num_lm_parts, self.num_draft_parts, self.config.attn_splits,
                                  self.config.num_sms)
        self.bufs: dict[str, Buffer] = {}
        self.acts: dict[str, tuple[Buffer, ...]] = {}
        self._allocate()
        self._rope = dev.to_device(rope_inv_freq(spec), "mk.rope_inv_freq")
        self._tables = layer_tables(spec, self.model, self.bufs)
        self._layers = dev.to_device(np.frombuffer(bytes(self._tables), np.uint8), "mk.layers")
        self.timings = self._alloc_timings() if timings else None
        self._uploaded: dict[str, tuple[Buffer, Buffer, int]] = {}
        for name, program in self.programs.items():
            self._uploaded[name] = self._upload_program(program)

    # ---- setup ----

    def compile_args(self) -> tuple[int, tuple[str, ...], bool]:
        """(arch, options, ptx) of build.compile_megakernel for this GPU and model, under the environment as it is
        now (OPENJET_MK_DEFINES, OPENJET_MK_SMEM_KB): a benchmark compiles its variants ahead with them."""
        from engine.cuda import nvrtc

        arch, ptx = self.dev.info.arch, False
        # the shared memory this GPU allows, whatever architecture the code is compiled for
        extra = build.model_options(self.spec) + build.arch_options(arch)
        supported = nvrtc.supported_archs()
        if arch not in supported:  # a GPU newer than this NVRTC: PTX, JIT-compiled by the driver
            arch, ptx = max(a for a in supported if a <= arch), True
        return arch, extra, ptx

    def _compile(self) -> None:
        """Compile (through the disk cache) and load the megakernel for this GPU and model."""
        from engine.cuda import nvrtc

        self.smem_bytes = build.smem_bytes(self.dev.info.arch)
        arch, extra, ptx = self.compile_args()
        self.threads = build.threads(extra)
        try:
            compiled = build.compile_megakernel(arch, extra, ptx=ptx)
        except nvrtc.KernelCompileError as exc:
            raise MegakernelError(f"the megakernel did not compile for sm_{arch}: {exc}") from exc
        drv = driver()
        image = compiled.image + (b"\0" if ptx else b"")
        self._module = check(drv.cuModuleLoadData(image), "cuModuleLoadData(megakernel)")
        self._fn = check(drv.cuModuleGetFunction(self._module, compiled.symbols[build.ENTRY].encode()), "megakernel")
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(self._fn, attr, self.smem_bytes), "cuFuncSetAttribute(megakernel)")
        blocks = check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._fn, self.threads, self.smem_bytes),
                       "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        if int(blocks) < 1:
            raise MegakernelError("the megakernel does not fit on one SM of this GPU (registers or shared memory)")

    def _allocate(self) -> None:
        """Every buffer, zeroed (act positions past a row's width must read as zeros)."""
        for s in self.specs:
            if s.kind == "act":
                self._allocate_act(s.name, s.shape[1], s.name in self.int8_acts,
                                   s.name in FILL_ACTS and s.name in self.int8_acts)
                continue
            buf = self.dev.alloc(int(np.prod(s.shape)) * ELEMENT_BYTES[s.kind], f"mk.{s.name}")
            self._zero(buf)
            self.bufs[s.name] = buf
        # each SM's own act of act_h's shape (globals.cuh act_own: the one-row norm inside MIX_IN and FFN_UP),
        # with an int8 copy where act_h has one; not a VM buffer (the VM forms those values inside its matmuls)
        self._allocate_act("act_own", self.spec.cfg.hidden_size, "act_h" in self.int8_acts, False,
                           self.config.num_sms)

    def _allocate_act(self, name: str, width: int, int8: bool, fill: bool, copies: int = 1) -> None:
        """An act's parts (formats.act_nbytes, act8_nbytes; `copies` of each, back to back), zeroed."""
        x16, sums = formats.act_nbytes(width)
        sizes = [(x16, "x16"), (sums, "sums"), (x16, "lo"), (sums, "sums_lo")]
        if int8:
            q8, scale8, sums8 = formats.act8_nbytes(width)
            sizes += [(q8, "q8"), (scale8, "scale8"), (sums8, "sums8"), (sums8, "sums8_lo")]
        if fill:
            sizes.append((4 * -(-width // 256), "fill"))
        parts = tuple(self.dev.alloc(copies * n, f"mk.{name}.{p}") for n, p in sizes)
        self.acts[name] = parts
        for part in parts:
            self.dev.fill_u32(part, 0)

    def _zero(self, buf: Buffer) -> None:
        check(driver().cuMemsetD8Async(buf.ptr, 0, buf.nbytes, self.dev.stream), f"memset {buf.what}")

    def _alloc_timings(self) -> Buffer:
        """The timing slots, then room for a warp trace (a variant compiled with MK_TRACE=1 fills it), for the
        longest queue; zeroed, so that what a launch did not record reads as 0."""
        slots = TIME_SLOTS + TRACE_WARPS * TRACE_EVENTS
        buf = self.dev.alloc(8 * self.config.num_sms * self._max_len() * slots, "mk.timings")
        self._zero(buf)
        return buf

    def _max_len(self) -> int:
        return max(max(len(q) for q in p.queues) for p in self.programs.values())

    def _upload_program(self, program: Program) -> tuple[Buffer, Buffer, int]:
        """A program's instruction words and queue lengths on the device."""
        words, lengths = program.words()
        return (self.dev.to_device(words, f"mk.{program.name}.instructions"),
                self.dev.to_device(lengths, f"mk.{program.name}.queues"), int(words.shape[1]))

    def _act_ref(self, name: str, width: int) -> ActRef:
        x16, sums, lo, sums_lo, *int8 = self.acts[name]
        q8, scale8, sums8, sums8_lo, fill = ([part.ptr for part in int8] + [0])[:5] if int8 else (0, 0, 0, 0, 0)
        return ActRef(x16.ptr, sums.ptr, lo.ptr, sums_lo.ptr, q8, scale8, sums8, sums8_lo, fill, width,
                      -(-width // 256))

    def _globals(self, instructions: Buffer, queues: Buffer, max_len: int) -> Globals:
        """The kernel argument for one program."""
        spec, cfg, b, m = self.spec, self.spec.cfg, self.bufs, self.model.matrices
        g = Globals(instructions=instructions.ptr, queue_len=queues.ptr, ctl=b["ctl"].ptr, counters=b["counters"].ptr,
                    timings=self.timings.ptr if self.timings else 0, layers=self._layers.ptr,
                    token_embd=weight_ref(m[(None, "token_embd")]), output=weight_ref(m[(None, "output")]),
                    mtp_output=weight_ref(m[spec.mtp_output_key()], spec.draft_vocab) if spec.has_mtp else
                    weight_ref(None), mtp_embd=weight_ref(m.get((spec.mtp_layer, "nextn.embed_tokens"),
                                                                m[(None, "token_embd")])),
                    output_norm=self.model.vectors[(None, "output_norm")].ptr, rope_inv_freq=self._rope.ptr)
        for name in ("x", "mtp_x", "proj", "conv_out", "attn_part", "hidden", "mtp_hidden", "last_hidden", "logits",
                     "lm_part_v", "lm_part_i", "draft_logits", "draft_part_v", "draft_part_i", "counts", "seen",
                     "mv_part", "mv_count"):
            setattr(g, name, b[name].ptr)
        for s in self.specs:
            if s.kind == "act":
                setattr(g, s.name, self._act_ref(s.name, s.shape[1]))
        g.act_own = self._act_ref("act_own", cfg.hidden_size)
        assign(g, **globals_sizes(spec, self.capacity, self.config, self.num_lm_parts, self.num_draft_parts,
                                  max_len))
        g.eps, g.rope_theta = cfg.rms_eps, cfg.rope_theta
        return g

    # ---- the executor interface (engine/cuda/megakernel/backend.py) ----

    def run(self, program: str | Program) -> None:
        """Zero the counters and launch one cooperative grid running the program (asynchronous)."""
        if isinstance(program, Program):
            uploaded = self._upload_program(program)
        else:
            uploaded = self._uploaded[program]
        params = self._globals(*uploaded)
        drv = driver()
        for name in ("counters", "mv_count"):  # mv_count too: a launch that failed may have left a split tile half-counted
            check(drv.cuMemsetD32Async(self.bufs[name].ptr, 0, self.bufs[name].nbytes // 4, self.dev.stream),
                  f"zero {name}")
        ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        try:
            check(drv.cuLaunchCooperativeKernel(self._fn, self.config.num_sms, 1, 1, self.threads, 1, 1, self.smem_bytes,
                                                self.dev.stream, ctypes.addressof(ptrs)), "launch megakernel")
            if isinstance(program, Program):
                self.dev.synchronize()
        except CudaError as exc:
            raise MegakernelError(f"megakernel launch failed: {exc}") from exc
        finally:
            if isinstance(program, Program):
                for buf in uploaded[:2]:
                    self.dev.memory.free(buf)

    def write_ctl(self, values: dict[int, int]) -> None:
        """Read-modify-write of the control words (256 bytes each way)."""
        ctl = self.read_ctl()
        for index, value in values.items():
            ctl[index] = value
        self.dev.upload(self.bufs["ctl"], ctl)

    def read_ctl(self) -> np.ndarray:
        """The control words, after the work queued before (a launch failure surfaces here)."""
        try:
            return self.dev.download(self.bufs["ctl"], np.int32, (CTL_WORDS,))
        except CudaError as exc:
            raise MegakernelError(f"megakernel failed: {exc}") from exc

    def _spec(self, name: str) -> BufferSpec:
        return next(s for s in self.specs if s.name == name)

    def read(self, name: str, rows: int | None = None) -> np.ndarray:
        """A buffer in the VM's form (act layouts decoded to float32 rows, f16 caches widened)."""
        s = self._spec(name)
        if s.kind == "act":
            return self._read_act(name, s.shape[1], rows or MAX_ROWS)
        dtype = {"f32": np.float32, "i32": np.int32, "u32": np.uint32, "u8": np.uint8, "kv": np.float16}[s.kind]
        out = self.dev.download(self.bufs[name], dtype, s.shape).astype(np.float32 if s.kind == "kv" else dtype)
        return out if rows is None else out[:rows]

    def read_int8(self, name: str) -> tuple[np.ndarray, ...] | None:
        """An act's int8 copy as formats.act8_encode returns it (q8 as uint8, scale8, sums8 and sums8_lo as uint16
        bit patterns), or None where the act has none."""
        return self._read_act8(name, self._spec(name).shape[1]) if name in self.int8_acts else None

    def read_own(self, sm: int) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SM `sm`'s own act (globals.cuh act_own: what its last one-row MIX_IN or FFN_UP normed): the float32 rows
        as read() gives them, and its int8 copy as read_int8 does (None where act_h has none)."""
        width = self.spec.cfg.hidden_size
        return (self._read_act("act_own", width, MAX_ROWS, sm),
                self._read_act8("act_own", width, sm) if "act_h" in self.int8_acts else None)

    def _read_act(self, name: str, width: int, rows: int, copy: int = 0) -> np.ndarray:
        x16, _, lo, *_ = self.acts[name]
        n = formats.act_nbytes(width)[0] // 2
        hi_h = self.dev.download(x16, np.uint16, (n,), copy * 2 * n)
        lo_h = self.dev.download(lo, np.uint16, (n,), copy * 2 * n)
        return formats.act_decode(hi_h, lo_h, rows, width)

    def _read_act8(self, name: str, width: int, copy: int = 0) -> tuple[np.ndarray, ...]:
        q8, scale8, sums8, sums8_lo = self.acts[name][4:8]
        nq, nscale, nsums = formats.act8_nbytes(width)
        return (self.dev.download(q8, np.uint8, (nq,), copy * nq),
                self.dev.download(scale8, np.float32, (nscale // 4,), copy * nscale),
                self.dev.download(sums8, np.uint16, (nsums // 2,), copy * nsums),
                self.dev.download(sums8_lo, np.uint16, (nsums // 2,), copy * nsums))

    def write(self, name: str, array: np.ndarray) -> None:
        """Overwrite a buffer (or its leading rows) from the VM's form."""
        s = self._spec(name)
        if s.kind == "act":
            encoded = formats.act_encode(array, s.shape[1])
            if s.name in self.int8_acts:
                encoded += formats.act8_encode(array, s.shape[1])
            if s.name in FILL_ACTS and s.name in self.int8_acts:  # every superblock's count starts at zero
                encoded += (np.zeros(-(-s.shape[1] // 256), np.uint32),)
            for part, data in zip(self.acts[name], encoded, strict=True):
                self.dev.upload(part, data)
            return
        dtype = {"f32": np.float32, "i32": np.int32, "u32": np.uint32, "u8": np.uint8, "kv": np.float16}[s.kind]
        self.dev.upload(self.bufs[name], np.ascontiguousarray(array, dtype))

    def snapshot(self) -> dict[str, Buffer]:
        """Device copies of every state buffer (freed when the snapshot is dropped)."""
        copies = {}
        for s in self.specs:
            if s.is_state:
                src = self.bufs[s.name]
                copies[s.name] = self.dev.alloc(src.nbytes, f"mk.checkpoint.{s.name}")
                self.dev.copy(copies[s.name], src, src.nbytes)
        holder = _Snapshot(copies)
        weakref.finalize(holder, _free, self.dev, list(copies.values()))
        return holder

    def restore(self, snapshot: _Snapshot) -> None:
        """Copy a snapshot back."""
        for name, copy in snapshot.copies.items():
            self.dev.copy(self.bufs[name], copy, copy.nbytes)

    def reset_state(self) -> None:
        """Zero every state buffer."""
        for s in self.specs:
            if s.is_state:
                self._zero(self.bufs[s.name])

    def read_timings(self, program: str) -> np.ndarray:
        """[num_sms, max_len, TIME_SLOTS] globaltimer ns of the last run of `program` (timings=True), max_len its
        own: the kernel indexes the slots by the launched program's queue length (Globals.max_len)."""
        if self.timings is None:
            raise ValueError("the executor was built without timings")
        max_len = self._uploaded[program][2]
        return self.dev.download(self.timings, np.uint64, (self.config.num_sms, max_len, TIME_SLOTS))

    def read_trace(self, program: str) -> np.ndarray:
        """[num_sms, max_len, TRACE_WARPS, TRACE_EVENTS] of the last run of `program`, compiled with MK_TRACE=1
        (opcodes.cuh TRACE_*: globaltimer ns, unit counts; zero where nothing was recorded), after its timing slots
        as the kernel lays them out: bench/mk_profile.py warp_trace."""
        if self.timings is None:
            raise ValueError("the executor was built without timings")
        sms, max_len = self.config.num_sms, self._uploaded[program][2]
        return self.dev.download(self.timings, np.uint64, (sms, max_len, TRACE_WARPS, TRACE_EVENTS),
                                 offset=8 * sms * max_len * TIME_SLOTS)

    def reschedule(self, config: ScheduleConfig) -> None:
        """Build and upload the programs again under another schedule of the same SMs: a benchmark times schedules
        on one upload of the model, as recompile does kernel variants. The buffers stay as they are, so a schedule
        that would size them otherwise (SMs, key splits, more head parts) is refused."""
        if (config.num_sms, config.attn_splits) != (self.config.num_sms, self.config.attn_splits):
            raise MegakernelError("a new schedule must keep the SMs and the key splits the buffers were sized for")
        programs = {n: build_program(self.spec, n, config) for n in self.programs}
        if (max(p.num_lm_parts for p in programs.values()) > self.num_lm_parts
                or max(p.num_draft_parts for p in programs.values()) > self.num_draft_parts):
            raise MegakernelError("the new schedule takes more head parts than the buffers hold")
        longer = max(max(len(q) for q in p.queues) for p in programs.values()) > self._max_len()
        _free(self.dev, [buf for words, queues, _ in self._uploaded.values() for buf in (words, queues)])
        self.config, self.programs = config, programs
        self._uploaded = {name: self._upload_program(program) for name, program in programs.items()}
        if self.timings is not None and longer:  # room for the longer queues' slots and trace
            _free(self.dev, [self.timings])
            self.timings = self._alloc_timings()

    def recompile(self) -> None:
        """Compile and load the megakernel again, with OPENJET_MK_DEFINES / OPENJET_MK_SMEM_KB as they are now: a
        benchmark times variants of the kernel on one upload of the model (bench/gpu_megakernel.py --variants).
        The schedule and the buffers stay."""
        if getattr(self, "_module", None) is not None:
            check(driver().cuModuleUnload(self._module), "cuModuleUnload(megakernel)")
            self._module = None
        self._compile()

    def close(self) -> None:
        """Unload the module; close the device when this executor opened it (its memory goes with it)."""
        if getattr(self, "_module", None) is not None and not self.dev.closed:
            check(driver().cuModuleUnload(self._module), "cuModuleUnload(megakernel)")
        self._module = None
        if self.owns_device:
            self.dev.close()


class _Snapshot:
    """Device copies of the state buffers."""

    def __init__(self, copies: dict[str, Buffer]):
        self.copies = copies


def _free(dev: Device, buffers: list[Buffer]) -> None:
    if dev.closed:
        return
    for buf in buffers:
        if buf.ptr in dev.memory.live:
            dev.memory.free(buf)


def open_backend(path: str | Path, context_size: int | None = None, device: Device | None = None,
                 config: ScheduleConfig | None = None, draft_vocab: int | None = None, timings: bool = False,
                 reserve: tuple[ScheduleConfig, ...] = ()):
    """A MegakernelBackend on the GPU for a qwen35 GGUF file (MegakernelError / UnsupportedModelError say why not);
    draft_vocab: the ids the MTP head drafts from (default: OPENJET_DRAFT_VOCAB, else all: engine/backend.py
    draft_vocab_size); reserve: GpuExecutor's."""
    from engine.backend import draft_vocab_size
    from engine.cuda.megakernel.backend import MegakernelBackend, capacity_for
    from engine.model.weights import load_model

    _, cfg, tensors = load_model(str(path))
    if tensors.nextn:  # a bad value is said before any upload, where there is a head to draft with
        draft_vocab = draft_vocab_size(cfg.vocab_size, draft_vocab)
    spec = ModelSpec.from_tensors(tensors, draft_vocab=draft_vocab)
    context = cfg.context_length if context_size is None else int(context_size)
    dev = device or Device()
    try:
        executor = GpuExecutor(dev, spec, tensors, capacity_for(context), config, timings, owns_device=device is None,
                               reserve=reserve)
    except BaseException:
        if device is None:
            dev.close()
        raise
    return MegakernelBackend(executor, spec, context)
