// OP_NOOP: nothing (pads a queue); it still counts, so it may be waited on. VM: solvers.noop.
#pragma once
#include "mk_common.cuh"

struct NoopOp {
    static constexpr int OPCODE = OP_NOOP;
    static constexpr int WAITS_ON = OP_NOOP;
    struct Parsed {
        __device__ explicit Parsed(const i32* w) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {}
    };
};
