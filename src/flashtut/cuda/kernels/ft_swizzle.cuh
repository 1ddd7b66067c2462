// ft_swizzle.cuh: the swizzled shared-memory tile layout of the fast forward kernels
// (fwd_v3_fast.cu, fwd_v4_fa2.cu) and the cp.async loader that fills it.
//
// A tile is [rows][HEAD_DIM] 16-bit values with no padding; the 16-byte chunk c of row r is stored
// at chunk c ^ (r % 8). The 8 row addresses of one ldmatrix phase (same chunk, 8 consecutive rows)
// then fall in 8 different groups of four banks instead of one: no bank conflicts, no wasted bytes.
// The XOR stays inside the row only when a row holds a multiple of 8 chunks (HEAD_DIM % 64 == 0).
#pragma once
#include "ft_mma.cuh"

#if HEAD_DIM % 64 != 0
#error "the swizzled layout needs HEAD_DIM to be a multiple of 64"
#endif

// element offset of (row, col) in a swizzled tile; col is a multiple of 8 wherever a whole chunk
// is addressed (cp.async, ldmatrix)
__device__ __forceinline__ int swz(int row, int col) {
    return row * HEAD_DIM + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// rows [r0, r0 + ROWS) of a (N, HEAD_DIM) matrix into a swizzled tile, by THREADS threads;
// rows >= N become zeros and global memory past the end is never read. Each thread keeps one
// chunk column and walks the rows THREADS / (HEAD_DIM / 8) apart, so its addresses are one base
// plus constant steps (a few registers, whatever the tile's size).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_swz(ft_raw* tile, const ft_raw* src, int r0, int N) {
    constexpr int chunks = HEAD_DIM / 8, step = THREADS / chunks;
    static_assert(THREADS % chunks == 0, "a block's threads must cover whole rows");
    const int c = (threadIdx.x % chunks) * 8, rr = threadIdx.x / chunks;
    const ft_raw* g = src + (size_t)(r0 + rr) * HEAD_DIM + c;
    // a trip count known at compile time: the loop unrolls into straight-line copies
#pragma unroll
    for (int p = 0; p < (ROWS + step - 1) / step; ++p) {
        const int r = rr + p * step;
        if (ROWS % step == 0 || r < ROWS) {
            bool ok = r0 + r < N;
            cp_async_16(tile + swz(r, c), ok ? g + (size_t)p * step * HEAD_DIM : src, ok);
        }
    }
}
