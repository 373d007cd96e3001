"""`openjet doctor [--json]`: what this machine has, which model file is ready, and every engine decision with its
reason, in the same words the log and the app's engine panel use."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from openjet_tui.runtime.catalog import load_catalog
from openjet_tui.runtime.download import find_ready_model, model_path
from openjet_tui.runtime.engines import Decision, decision_line, gather_facts, select_engine
from openjet_tui.runtime.errors import RuntimeSetupError
from openjet_tui.runtime.hardware import HardwareInfo, probe_hardware
from openjet_tui.runtime.kernels import KernelReport, gpu_arch, run_compile
from openjet_tui.runtime.paths import cache_dir, logs_dir, models_dir
from openjet_tui.runtime.setup import SetupRecord, is_setup_current, read_record
from openjet_tui.runtime.verify import read_stamp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet doctor`."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _model_section(hardware: HardwareInfo, record: SetupRecord | None) -> tuple[dict[str, object], Path | None, int]:
    catalog = load_catalog()
    default, why = catalog.choose_for(hardware)
    section: dict[str, object] = {"catalog_default": default.name, "catalog_reason": why}
    path, context = None, default.default_context
    if is_setup_current(record):
        assert record is not None
        path, context = Path(record.model_path), record.context
        section["source"] = "setup record"
    elif ready := find_ready_model(default):
        path, section["source"] = ready, "catalog default, verified in the cache"
    elif model_path(default).exists():
        section["source"] = f"{model_path(default)} is in the cache but not verified yet (`openjet setup` checks it)"
    else:
        section["source"] = "none: run `openjet setup`"
    if path is not None:
        stamp = read_stamp(path)
        section.update(path=str(path), context=context, sha256=stamp.sha256 if stamp else "",
                       verification=("sha256 matches the catalog" if stamp and stamp.is_pinned else
                                     "not verified by the catalog" if stamp else "your own file, not verified"))
    return section, path, context


def _kernel_section(hardware: HardwareInfo) -> dict[str, object]:
    """Whether the kernels for this GPU are compiled and cached (asked of `openjet-engine compile --check`)."""
    arch, why = gpu_arch(hardware)
    report = KernelReport("skipped", f"not needed: {why}") if arch is None else run_compile(arch, is_check=True)
    return asdict(report)


def collect(probe_local: bool = True, hardware: HardwareInfo | None = None) -> dict[str, object]:
    """Everything doctor reports, as plain data (`hardware` describes the machine instead of probing it)."""
    hardware = hardware or probe_hardware()
    record = read_record()
    model, path, context = _model_section(hardware, record)
    selection = select_engine(gather_facts(path, context=context, hardware=hardware, probe_local=probe_local))
    facts = selection.facts
    return {
        "hardware": {**asdict(hardware), "summary": hardware.gpu_summary()},
        "model": model,
        "engines": [asdict(d) | {"label": d.label} for d in selection.decisions],
        "chosen": selection.chosen.engine if selection.chosen else None,
        "llama_server_build": asdict(facts.llama_build) if facts.llama_build else None,
        "local_servers": [asdict(s) for s in facts.local_servers],
        "kernels": _kernel_section(hardware),
        "setup_record": asdict(record) if record else None,
        "paths": {"cache": str(cache_dir()), "models": str(models_dir()), "logs": str(logs_dir())},
    }


def format_text(data: dict) -> list[str]:
    """The doctor report as lines of text."""
    hw, model = data["hardware"], data["model"]
    lines = ["hardware", f"  GPU: {hw['summary']}",
             f"  CPU: {hw['num_cpus']} cores; RAM {hw['ram_total'] / 2**30:.1f} GiB "
             f"({hw['ram_available'] / 2**30:.1f} GiB available)", f"  nvcc: {hw['nvcc_path'] or 'not found'}",
             "model", f"  catalog default: {model['catalog_default']} ({model['catalog_reason']})",
             f"  in use: {model.get('path', 'none')} ({model['source']})"]
    if "path" in model:
        lines.append(f"  verification: {model['verification']}; context {model['context']} tokens")
    lines.append("engines, in order of preference")
    lines += [f"  {decision_line(Decision(d['engine'], d['is_available'], d['reason'], d['is_chosen']))}"
              for d in data["engines"]]
    lines += ["kernels", f"  {data['kernels']['reason']}"]
    if build := data["llama_server_build"]:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(build["updated_at"]))
        lines.append(f"llama-server build: {build['state']} ({build['percent']}%, {build['message']}, {when})")
    if record := data["setup_record"]:
        lines.append(f"last setup: {record['engine'] or 'no engine'} for {record['model_path']}")
    else:
        lines.append("last setup: none (the next `openjet` runs it)")
    lines.append(f"paths: cache {data['paths']['cache']}, logs {data['paths']['logs']}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 0 when some engine can serve, 1 when none can."""
    try:
        data = collect()
    except RuntimeSetupError as error:
        print(f"openjet doctor: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(data, indent=1, default=str))
    else:
        print("\n".join(format_text(data)))
    return 0 if data["chosen"] else 1


def main(argv: list[str] | None = None) -> int:
    """Run doctor on its own (python -m openjet_tui.runtime.doctor_cmd)."""
    parser = argparse.ArgumentParser(prog="openjet doctor")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
