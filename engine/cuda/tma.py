"""Tensor maps for Hopper's tensor copies (kernels/tma.cuh): the driver's cuTensorMapEncodeTiled, passed to a kernel
by value as struct TensorMap; each map encoded once and kept (a driver call each launch would cost more than the
copy).

Two maps: the quant plane of a repacked Q4_K weight (the int8 matmuls, engine/cuda/i8b.py) and a prefill chunk's
f16 activations in the act layout (gemm_ws's B, engine/cuda/gemm.py).
"""

from __future__ import annotations

import ctypes


class TensorMap(ctypes.Structure):
    """Mirror of struct TensorMap (a CUtensorMap's 128 bytes, passed by value)."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


_MAPS: dict[tuple, TensorMap] = {}  # encode's arguments -> its map


def encode(ptr: int, dtype: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...],
           swizzle: int) -> TensorMap:
    """The tiled map of the tensor at device address ptr: dims innermost first (elements), strides of dims 1.. in
    bytes (multiples of 16, in any order), a box of `box` elements a copy, `swizzle` bytes (0, 32, 64 or 128: the
    16-byte chunks of each swizzle-wide row XORed by the row's index, as wgmma's swizzled layouts read them); boxes
    past the end read zeros. Encoded once per set of arguments."""
    key = (ptr, dtype, dims, strides, box, swizzle)
    if key not in _MAPS:
        _MAPS[key] = _encode(*key)
    return _MAPS[key]


def _encode(ptr: int, dtype: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...],
            swizzle: int) -> TensorMap:
    from cuda.bindings import driver as drv

    from engine.cuda.driver import check

    types = {"u8": drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,
             "f16": drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    swizzles = {0: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
                32: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
                64: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                128: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    assert len(strides) == len(dims) - 1 == len(box) - 1, (dims, strides, box)
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t  # the binding takes its own integer types in these lists
    tmap = check(drv.cuTensorMapEncodeTiled(
        types[dtype], len(dims), ptr, [u64(d) for d in dims], [u64(s) for s in strides], [u32(b) for b in box],
        [u32(1)] * len(dims), drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzles[swizzle],
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return TensorMap((ctypes.c_uint64 * 16)(*[int(v) for v in tmap.opaque]))
