"""The GPU through cuda.bindings.driver: context, device memory, modules, launches, events and CUDA graphs.

One Device owns everything it creates: every allocation is recorded in its DeviceMemory and freed by close()
(or at exit of a `with Device() as dev:` block), modules are unloaded, and the context is released. The driver's
calls and errors: engine/cuda/driver.py.

Failures a user can act on are EngineErrors with plain messages: NoGpuError (no driver, no device),
UnsupportedGpuError (older than sm_80), DeviceOutOfMemoryError (with the request and what was free).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.cuda import env_flag
# (the errors are this module's too: Device's calls raise them, callers catch them as device.NoGpuError etc.)
from engine.cuda.driver import (CudaError, DeviceOutOfMemoryError, NoGpuError,  # noqa: F401
                                UnsupportedGpuError, check, driver)
from engine.cuda.memory import Buffer, DeviceMemory

MIN_COMPUTE_CAPABILITY = (8, 0)
SIDE_LANES = 2  # side streams (Device.beside): 0 inside a pass, 1 beside a whole launch sequence
PDL_ENV = "OPENJET_CUDA_PDL"  # "1": every pass with programmatic dependent launch, "0": none (default: "auto")
PDL_MIN_ARCH = 90  # griddepcontrol (kernels/common.cuh PDL_ENTER) exists from sm_90 on
# Which passes launch with PDL (Device.pdl_policy; engine/cuda/model.py applies it per pass): "off", "on", or
# "auto", the passes of PDL_TOKEN_COUNTS tokens and the verify passes of PDL_VERIFY_TOKENS and more. Measured on the
# H200 (bench/NOTES.md): faster at 5 tokens (v15: 12.37 against 12.87 ms), no gain in prefill; since the producers'
# block per token (v19, 1890cfd) faster at 2 and 4 tokens (7.29 / 8.25 against 7.74 / 8.70), and with the one-token
# producers launched apart (v20, 1a0439f) at 1 token too: 6.93 against 7.18 ms (with them fused into the matmul it
# lost, 7.94 against 7.82). Slower at 3 tokens while they ran mmvq_i8 (c2bb4e3: 8.38 against 7.91; H100 87c4e46,
# variant pdl3: 9.153 against 8.706), faster since they run mmvq_i8v in 12-warp blocks (i8v3pdl: 8.341 against
# 8.706, bench/NOTES.md Z5): every pass of 1-4 tokens now.
PDL_POLICIES = ("off", "auto", "on")
PDL_VERIFY_TOKENS = 5
DEFAULT_PDL_TOKEN_COUNTS = frozenset({1, 2, 3, 4})
PDL_TOKEN_COUNTS = DEFAULT_PDL_TOKEN_COUNTS


def _pdl_policy(arch: int) -> str:
    """PDL_POLICIES entry from OPENJET_CUDA_PDL; always "off" before sm_90."""
    if arch < PDL_MIN_ARCH:
        return "off"
    if os.environ.get(PDL_ENV) is None:
        return "auto"
    return "on" if env_flag(PDL_ENV, False) else "off"


def pdl_for(policy: str, num_tokens: int, verify_max: int) -> bool:
    """Whether a pass of num_tokens launches with PDL under policy (verify_max: the longest verify pass)."""
    assert policy in PDL_POLICIES, policy
    chosen = num_tokens in PDL_TOKEN_COUNTS or PDL_VERIFY_TOKENS <= num_tokens <= verify_max
    return policy == "on" or (policy == "auto" and chosen)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What the kernels and launchers need to know about the GPU."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int
    multiprocessors: int
    l2_bytes: int
    max_smem_per_block: int  # opt-in maximum of dynamic shared memory per block

    @property
    def arch(self) -> int:
        """Compute capability as NVRTC spells it: 90 for sm_90."""
        major, minor = self.compute_capability
        return 10 * major + minor


def _pack_args(args: Sequence[Any]) -> tuple[ctypes.Array, list]:
    """Kernel arguments as the void*[] cuLaunchKernel reads: Buffers and None become pointers, ints int32,
    floats float32; ctypes values pass through."""
    values: list = []
    for a in args:
        if isinstance(a, Buffer):
            values.append(ctypes.c_uint64(a.ptr))
        elif a is None:
            values.append(ctypes.c_uint64(0))
        elif isinstance(a, (ctypes._SimpleCData, ctypes.Structure)):
            values.append(a)
        elif isinstance(a, (bool, int, np.integer)):
            values.append(ctypes.c_int32(int(a)))
        elif isinstance(a, (float, np.floating)):
            values.append(ctypes.c_float(float(a)))
        else:
            raise TypeError(f"unsupported kernel argument {a!r}")
    ptrs = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    return ptrs, values


def dims3(dims: int | tuple[int, ...]) -> tuple[int, int, int]:
    """A launch's grid or block as (x, y, z): an int is x, a shorter tuple is padded with 1s."""
    return (tuple(dims) + (1, 1))[:3] if isinstance(dims, tuple) else (dims, 1, 1)


@dataclass(frozen=True, slots=True)
class Kernel:
    """A loaded kernel function."""

    name: str
    handle: Any


class Graph:
    """An instantiated CUDA graph: launch() replays the captured work on the device's stream."""

    def __init__(self, device: Device, graph: Any, exec_: Any):
        self.device, self._graph, self._exec = device, graph, exec_

    def launch(self) -> None:
        """Replay the graph."""
        check(driver().cuGraphLaunch(self._exec, self.device.stream), "cuGraphLaunch")

    def destroy(self) -> None:
        """Release the graph."""
        drv = driver()
        if self._exec is not None:
            check(drv.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
            check(drv.cuGraphDestroy(self._graph), "cuGraphDestroy")
            self._exec = self._graph = None


def _opendriver():
    """Initialise the driver; NoGpuError where there is no driver library or no device."""
    try:
        drv = driver()
        err, = drv.cuInit(0)
    except Exception as exc:  # the loader raises its own error types where libcuda is absent
        raise NoGpuError(f"no NVIDIA driver found ({exc})") from exc
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise NoGpuError(f"the NVIDIA driver did not initialise: {(name or b'?').decode()}")
    return drv


def _query(drv, dev, index: int) -> DeviceInfo:
    """Read the attributes the engine needs."""
    attr = drv.CUdevice_attribute

    def get(a):
        """One integer attribute of the device."""
        return int(check(drv.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a})"))

    name = check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return DeviceInfo(
        index=index,
        name=name.split(b"\0", 1)[0].decode(errors="replace"),
        compute_capability=(get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        total_memory=int(check(drv.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
        multiprocessors=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        max_smem_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    )


class Device:
    """One GPU: its context, stream, memory, loaded kernels and graphs. Use as a context manager or close()."""

    def __init__(self, index: int = 0):
        drv = _opendriver()
        count = int(check(drv.cuDeviceGetCount(), "cuDeviceGetCount"))
        if count == 0:
            raise NoGpuError("the NVIDIA driver reports no GPU")
        if not 0 <= index < count:
            raise NoGpuError(f"GPU {index} requested, but the driver reports {count}")
        self._dev = check(drv.cuDeviceGet(index), "cuDeviceGet")
        self.info = _query(drv, self._dev, index)
        if self.info.compute_capability < MIN_COMPUTE_CAPABILITY:
            major, minor = self.info.compute_capability
            raise UnsupportedGpuError(
                f"{self.info.name} is compute capability {major}.{minor}; OpenJet's kernels need 8.0 or newer "
                f"(RTX 30/40/50 series, A100, H100/H200)")
        self._ctx = check(drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        check(drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        # stream priorities: the main stream and lane 0 first; lane 1's work (a commit beside a whole draft) takes
        # the SMs the main stream's kernels leave (graphs keep them: USE_NODE_PRIORITY)
        least, greatest = check(drv.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
        flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        self.stream = check(drv.cuStreamCreateWithPriority(flags, greatest), "cuStreamCreateWithPriority")
        # side streams for launches that may run beside the main stream's (beside(), join()), one a lane: lane 0
        # for a kernel beside another inside a pass, lane 1 for work beside a whole sequence of launches (the
        # commit beside the MTP draft), which may use lane 0 meanwhile; each lane's events order it after the
        # main stream's work so far and the main stream after it
        no_timing = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._sides = [check(drv.cuStreamCreateWithPriority(flags, greatest if lane == 0 else least),
                             "cuStreamCreateWithPriority") for lane in range(SIDE_LANES)]
        self._fork_events = [check(drv.cuEventCreate(no_timing), "cuEventCreate") for _ in range(SIDE_LANES)]
        self._join_events = [check(drv.cuEventCreate(no_timing), "cuEventCreate") for _ in range(SIDE_LANES)]
        self._launch_stream = self.stream  # where launch() queues: a side stream inside beside()
        self._unjoined = [False] * SIDE_LANES
        self.memory = DeviceMemory(self)
        self._modules: list[Any] = []
        self._kernels: dict[str, Kernel] = {}
        self._smem_limits: dict[str, int] = {}  # kernel name -> dynamic shared memory allowed so far
        self._graphs: list[Graph] = []
        self.profile: list[tuple[str, Any, Any]] | None = None  # (kernel, start event, end event) when profiling
        # benchmarks only: kernels (by instance name) whose launches are dropped, to time a pass without them
        self.skip: Callable[[str], bool] | None = None
        # programmatic dependent launch: each kernel may start while the previous one finishes (every kernel of
        # kernels/*.cu waits in PDL_ENTER before touching what an earlier kernel wrote). pdl: the next launches
        # use it; pdl_policy: which passes set it (pdl_for)
        self.pdl_policy = _pdl_policy(self.info.arch)
        self.pdl = self.pdl_policy == "on"
        self.closed = False

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        free, total = check(driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    # ---- kernels ----

    def kernel(self, name: str) -> Kernel:
        """The kernel instance `name` (engine.cuda.instances), compiling and loading its file on first use."""
        if name not in self._kernels:
            from engine.cuda import instances

            if name not in instances.INSTANCES:
                raise CudaError(f"unknown kernel instance {name!r}")
            self._load_file(instances.INSTANCES[name].file)
        return self._kernels[name]

    def load_all(self, workers: int | None = None) -> None:
        """Compile (in parallel processes, through the cache) and load every kernel, before any graph capture."""
        from engine.cuda import instances, nvrtc

        if self.info.arch in nvrtc.supported_archs():
            nvrtc.compile_all([self.info.arch], workers=workers)
        for file in instances.files():
            if not any(i.name in self._kernels for i in instances.files()[file]):
                self._load_file(file)

    def _load_file(self, file: str) -> None:
        """Compile (through the disk cache) and load every instance of one .cu file."""
        from engine.cuda import instances, nvrtc

        insts = instances.files()[file]
        arch, ptx = self.info.arch, False
        supported = nvrtc.supported_archs()
        if arch not in supported:
            # a GPU newer than this NVRTC: PTX for the newest architecture it knows, JIT-compiled by the driver
            arch, ptx = max(a for a in supported if a <= arch), True
        compiled = nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{file}.cu", arch, tuple(i.expr for i in insts),
                                        nvrtc.file_options(file, arch, ptx), ptx=ptx)
        image = compiled.image + (b"\0" if ptx else b"")
        self._kernels.update(self.load_kernels(image, {i.name: compiled.symbols[i.expr] for i in insts}, file))

    def load_kernels(self, image: bytes, symbols: dict[str, str], what: str) -> dict[str, Kernel]:
        """Load a compiled module (kept until close) and its functions, by name -> mangled symbol."""
        drv = driver()
        module = check(drv.cuModuleLoadData(image), f"cuModuleLoadData({what})")
        self._modules.append(module)
        return {name: Kernel(name, check(drv.cuModuleGetFunction(module, symbol.encode()), name))
                for name, symbol in symbols.items()}

    def set_max_dynamic_smem(self, kernel: Kernel, nbytes: int) -> None:
        """Allow a kernel more than 48 KB of dynamic shared memory (once per kernel and size: launchers call it
        before every launch, also while a graph is being captured)."""
        if self._smem_limits.get(kernel.name, 0) >= nbytes:
            return
        drv = driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(kernel.handle, attr, int(nbytes)), f"cuFuncSetAttribute({kernel.name})")
        self._smem_limits[kernel.name] = nbytes

    def launch(self, kernel: Kernel, grid: int | tuple[int, ...], block: int | tuple[int, ...],
               args: Sequence[Any], smem: int = 0) -> None:
        """Launch on the device's stream, or on the side stream inside beside() (asynchronous)."""
        (gx, gy, gz), (bx, by, bz) = dims3(grid), dims3(block)
        assert gx > 0 and gy > 0 and gz > 0, f"{kernel.name}: empty grid {(gx, gy, gz)}"
        if self.skip is not None and self.skip(kernel.name):
            return
        ptrs, keep = _pack_args(args)
        drv = driver()
        events = None
        if self.profile is not None:
            events = (check(drv.cuEventCreate(0), "cuEventCreate"), check(drv.cuEventCreate(0), "cuEventCreate"))
            check(drv.cuEventRecord(events[0], self._launch_stream), "cuEventRecord")
        if self.pdl:
            check(drv.cuLaunchKernelEx(self._pdl_config(gx, gy, gz, bx, by, bz, smem), kernel.handle,
                                       ctypes.addressof(ptrs), 0), f"launch {kernel.name}")
        else:
            check(drv.cuLaunchKernel(kernel.handle, gx, gy, gz, bx, by, bz, smem, self._launch_stream,
                                     ctypes.addressof(ptrs), 0), f"launch {kernel.name}")
        if events is not None:
            check(drv.cuEventRecord(events[1], self._launch_stream), "cuEventRecord")
            self.profile.append((kernel.name, *events))
        del keep

    def _pdl_config(self, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int) -> Any:
        """A launch configuration on this stream that lets the kernel overlap its predecessor's tail."""
        drv = driver()
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
        config.sharedMemBytes = smem
        config.hStream = self._launch_stream
        config.attrs = [attr]
        config.numAttrs = 1
        return config

    @contextmanager
    def beside(self, lane: int = 0) -> Iterator[None]:
        """Launches in the with-block go to side stream `lane`: they start after everything queued so far and run
        beside what the main stream gets next, until join(lane). So a small kernel (a 96-row matmul) overlaps a
        large one instead of queueing behind it; in a graph capture the two become parallel branches. Whatever
        runs beside must not write what the main stream's launches until the join read or write."""
        assert not self.side_active, "beside() does not nest"
        drv, side = driver(), self._sides[lane]
        check(drv.cuEventRecord(self._fork_events[lane], self.stream), "cuEventRecord")
        check(drv.cuStreamWaitEvent(side, self._fork_events[lane], 0), "cuStreamWaitEvent")
        self._launch_stream = side
        try:
            yield
        finally:
            self._launch_stream = self.stream
            check(drv.cuEventRecord(self._join_events[lane], side), "cuEventRecord")
            self._unjoined[lane] = True

    @property
    def side_active(self) -> bool:
        """Whether launches go to a side stream now (inside beside())."""
        return self._launch_stream is not self.stream

    def join(self, lane: int = 0) -> None:
        """Make the main stream wait for what was launched beside it on `lane` (nothing if all of it was joined)."""
        if self._unjoined[lane]:
            check(driver().cuStreamWaitEvent(self.stream, self._join_events[lane], 0), "cuStreamWaitEvent")
            self._unjoined[lane] = False

    # ---- memory ----

    def alloc(self, nbytes: int, what: str) -> Buffer:
        """Allocate device memory owned by this device."""
        return self.memory.alloc(nbytes, what)

    def upload(self, buf: Buffer, array: np.ndarray, offset: int = 0) -> None:
        """Copy a host array into buf at byte offset (synchronous for the host array)."""
        src = np.ascontiguousarray(array)
        assert offset + src.nbytes <= buf.nbytes, f"{buf.what}: {src.nbytes} bytes do not fit at {offset}"
        if src.nbytes:
            # on the device's stream, so the copy is ordered after kernels still reading the old contents
            drv = driver()
            check(drv.cuMemcpyHtoDAsync(buf.ptr + offset, src.ctypes.data, src.nbytes, self.stream),
                  f"upload {buf.what}")
            self.synchronize()  # the host array may be freed as soon as we return

    def to_device(self, array: np.ndarray, what: str) -> Buffer:
        """Allocate a buffer holding a copy of array."""
        buf = self.alloc(array.nbytes, what)
        self.upload(buf, array)
        return buf

    def download(self, buf: Buffer, dtype: Any, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """Copy device memory into a new host array, after the work queued before it (waits for the copy)."""
        out = np.empty(shape, dtype)
        assert offset + out.nbytes <= buf.nbytes, f"{buf.what}: read past the end"
        if out.nbytes:
            check(driver().cuMemcpyDtoHAsync(out.ctypes.data, buf.ptr + offset, out.nbytes, self.stream),
                  f"download {buf.what}")
        self.synchronize()
        return out

    def fill_u32(self, buf: Buffer, value: int, count: int | None = None) -> None:
        """Set count 32-bit words of buf to value (e.g. a NaN pattern to poison outputs)."""
        count = buf.nbytes // 4 if count is None else count
        check(driver().cuMemsetD32Async(buf.ptr, value & 0xFFFFFFFF, count, self.stream), f"fill {buf.what}")

    def copy(self, dst: Buffer, src: Buffer, nbytes: int) -> None:
        """Device-to-device copy on the stream."""
        check(driver().cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, self.stream), f"copy {src.what}")

    def synchronize(self) -> None:
        """Wait for all work on the stream (and beside it); a kernel fault surfaces here as a CudaError."""
        for lane in range(SIDE_LANES):
            self.join(lane)
        check(driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # ---- graphs and timing ----

    @contextmanager
    def capture(self) -> Iterator[list[Graph]]:
        """Capture the launches of the with-block into a graph: `with dev.capture() as g: ...; g[0].launch()`."""
        drv = driver()
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        holder: list[Graph] = []
        try:
            yield holder
        finally:
            for lane in range(SIDE_LANES):  # a capture must end with every side branch joined
                self.join(lane)
            graph = check(drv.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        use_priority = drv.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
        exec_ = check(drv.cuGraphInstantiate(graph, int(use_priority)), "cuGraphInstantiate")
        holder.append(Graph(self, graph, exec_))
        self._graphs.append(holder[0])

    def time_ms(self, fn, reps: int = 20, warmup: int = 3) -> list[float]:
        """Per-call device times (ms) of fn() measured with CUDA events, after warm-up calls."""
        drv = driver()
        for _ in range(warmup):
            fn()
        events = [check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(reps + 1)]
        check(drv.cuEventRecord(events[0], self.stream), "cuEventRecord")
        for i in range(reps):
            fn()
            check(drv.cuEventRecord(events[i + 1], self.stream), "cuEventRecord")
        check(drv.cuEventSynchronize(events[-1]), "cuEventSynchronize")
        times = [float(check(drv.cuEventElapsedTime(events[i], events[i + 1]), "cuEventElapsedTime"))
                 for i in range(reps)]
        for ev in events:
            check(drv.cuEventDestroy(ev), "cuEventDestroy")
        return times

    def profile_summary(self) -> dict[str, tuple[int, float]]:
        """Per kernel name: (launches, total ms) of the launches recorded since profiling was switched on
        (dev.profile = []); the events are then released and profiling switched off."""
        drv = driver()
        self.synchronize()
        out: dict[str, tuple[int, float]] = {}
        for name, start, end in self.profile or []:
            ms = float(check(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime"))
            count, total = out.get(name, (0, 0.0))
            out[name] = (count + 1, total + ms)
            check(drv.cuEventDestroy(start), "cuEventDestroy")
            check(drv.cuEventDestroy(end), "cuEventDestroy")
        self.profile = None
        return out

    def close(self) -> None:
        """Free every allocation, graph and module, and release the context."""
        if self.closed:
            return
        drv = driver()
        self.synchronize()
        for graph in self._graphs:
            graph.destroy()
        self.memory.free_all()
        for module in self._modules:
            check(drv.cuModuleUnload(module), "cuModuleUnload")
        for event in (*self._fork_events, *self._join_events):
            check(drv.cuEventDestroy(event), "cuEventDestroy")
        for side in self._sides:
            check(drv.cuStreamDestroy(side), "cuStreamDestroy")
        check(drv.cuStreamDestroy(self.stream), "cuStreamDestroy")
        check(drv.cuDevicePrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
        self._modules, self._kernels, self._graphs, self.closed = [], {}, [], True
