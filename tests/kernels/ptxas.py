"""ptxas's resource report (`-Xptxas=-v`) for each instance of a kernel file, compiled with NVRTC: what a test holds
a launcher's occupancy and shared-memory arithmetic to."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.cuda import instances, nvrtc


@dataclass(frozen=True, slots=True)
class Usage:
    """One kernel's registers a thread, bytes of spill stores and bytes of static shared memory."""

    registers: int
    spill_bytes: int
    static_smem: int


def usage(file: str, arch: int = 90) -> dict[str, Usage]:
    """Instance name -> its Usage, for every instance of kernels/<file>.cu (instances.files()), built for sm_<arch>
    with the options it compiles with."""
    insts = instances.files()[file]
    compiled = nvrtc.compile_file(nvrtc.KERNEL_DIR / f"{file}.cu", arch, tuple(i.expr for i in insts),
                                  options=("-Xptxas=-v", *nvrtc.file_options(file, arch)))
    names = {compiled.symbols[i.expr]: i.name for i in insts}
    found: dict[str, Usage] = {}
    current, spill = None, 0
    for line in compiled.log.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            current, spill = names.get(m.group(1)), 0
        elif current and (m := re.search(r"(\d+) bytes spill stores", line)):
            spill = int(m.group(1))
        elif current and (m := re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)):
            found[current] = Usage(int(m.group(1)), spill, int(m.group(2) or 0))
    assert set(found) == {i.name for i in insts}, "ptxas reported other functions than the file's instances"
    return found
