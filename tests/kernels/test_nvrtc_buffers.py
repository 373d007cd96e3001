"""NVRTC output buffers must be fresh memory: writing into a cached bytes object corrupts the whole process."""

import pytest

from engine.cuda import nvrtc as openjet_nvrtc


def test_empty_log_leaves_shared_single_byte_objects_alone(tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    source = tmp_path / "tiny.cu"
    source.write_text('extern "C" __global__ void tiny(float* x) { x[0] = 1.0f; }\n')
    space = bytes([32])  # CPython hands out one shared object for every one-byte bytes value
    openjet_nvrtc.compile_file(source, 90, ())  # a clean compile: its log is a single NUL byte
    assert space == b" " and bytes([32]) == b"\x20"
