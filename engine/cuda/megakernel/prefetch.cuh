// The L2 prefetch of weight rows (the loader warp's with MK_CONTROLLER=1 and MK_PREFETCH_AHEAD >= 0, the waiting
// consumers' with MK_WAIT_PREFETCH=1; both off by default): a hint, it never blocks and never faults.
#pragma once
#include "matvec.cuh"

// Bytes per block of each row-major plane of a type (engine/cuda/repack.py PLANES); returns the number of such
// planes. Q4_K and Q5_K have the tiled words plane after them (TILE_WORDS): `tiled` says so.
__device__ __forceinline__ int plane_sizes(int qtype, int cols, int (&size)[4], int& nb, bool& tiled) {
    tiled = qtype == QT_Q4_K || qtype == QT_Q5_K;
    switch (qtype) {
        case QT_Q4_K: nb = cols / 256; size[0] = 128; return 1;
        case QT_Q5_K: nb = cols / 256; size[0] = 128; size[1] = 32; return 2;
        case QT_Q6_K: nb = cols / 256; size[0] = 128; size[1] = 64; size[2] = 16; size[3] = 2; return 4;
        case QT_Q8_0: nb = cols / 32; size[0] = 32; size[1] = 2; return 2;
        case QT_Q5_0: nb = cols / 32; size[0] = 16; size[1] = 4; size[2] = 2; return 3;
        case QT_Q4_0: nb = cols / 32; size[0] = 16; size[1] = 2; return 2;
        case QT_F16: nb = 1; size[0] = 2 * cols; return 1;
        case QT_F32: nb = 1; size[0] = 4 * cols; return 1;
        default: nb = 0; return 0;
    }
}

// One lane's share of prefetching [start, start + bytes) into L2, a 128-byte line per lane and step.
__device__ __forceinline__ void prefetch_bytes(const u8* start, u64 bytes) {
    for (u64 o = (u64)(threadIdx.x & 31) * 128; o < bytes; o += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(start + o));
}

// MK_PREFETCH_CAP_ROWS > 0: only an instruction's first that many rows (the wait prefetch's share, megakernel.cu).
#ifndef MK_PREFETCH_CAP_ROWS
#define MK_PREFETCH_CAP_ROWS 0
#endif

// Called by the loader warp (or a consumer warp while its instruction waits): request rows [r0, r1) of w into L2.
__device__ __noinline__ void prefetch_rows(const WeightRef& w, int r0, int r1) {
    if (MK_PREFETCH_CAP_ROWS > 0) r1 = min(r1, r0 + MK_PREFETCH_CAP_ROWS);
    int size[4], nb;
    bool tiled;
    const int planes = plane_sizes(w.qtype, w.cols, size, nb, tiled);
    const u64 ntot = (u64)w.rows_total * nb;
    const int a = w.row_offset + r0, b = w.row_offset + r1;
    u64 base = 0;
    for (int p = 0; p < planes; ++p) {
        prefetch_bytes(w.ptr + base + (u64)a * nb * size[p], (u64)(b - a) * nb * size[p]);
        base += ntot * size[p];
    }
    if (tiled)  // the units of the tiles that rows a .. b - 1 touch
        prefetch_bytes(w.ptr + base + (u64)(a >> 4) * nb * TILE_UNIT, (u64)(((b + 15) >> 4) - (a >> 4)) * nb * TILE_UNIT);
}
