"""The megakernel: one persistent launch per speculative cycle (bench/MEGAKERNEL.md has the design).

instructions.py  the instruction set (mirrors opcodes.cuh)        layout.py   control words, stages, buffers
schedule.py      programs: ops, tiles, counters, SM assignment    vm.py       the Python VM (solvers.py: one per op)
sampling.py      token choice as the device makes it              backend.py  the backend contract over an executor
build.py         NVRTC compilation of megakernel.cu               runner.py   the GPU executor
"""
