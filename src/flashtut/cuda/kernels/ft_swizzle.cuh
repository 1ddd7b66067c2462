// ft_swizzle.cuh: the swizzled shared-memory tile layout of the fast forward kernels
// (fwd_v3_fast.cu, fwd_v4_fa2.cu) and the cp.async loader that fills it.
//
// A tile is [rows][HEAD_DIM] 16-bit values with no padding. An ldmatrix phase reads one 16-byte
// chunk from each of 8 consecutive rows; the swizzle moves those 8 chunks into the 8 different
// groups of four banks (a bank group is the 16-byte slot mod 128 bytes):
//  * chunks in a full group of 8 (all of them when HEAD_DIM % 64 == 0): chunk c of row r is
//    stored at c ^ (r % 8). Rows 128 bytes long (or a multiple) start in the same bank group, so
//    the XOR alone spreads them; at HEAD_DIM = 96 (192-byte rows) odd rows start 4 groups later,
//    which flips bit 2 of the group: r -> (c ^ r) ^ 4 (r % 2) is still one-to-one over 8 rows.
//  * the last 4 chunks when HEAD_DIM % 64 == 32 (D = 32, 96): rows are 64 bytes (mod 128) apart,
//    so even and odd rows fill the two halves of the 8 groups, and c ^ ((r / 2) % 4) spreads the
//    4 rows of each parity over its 4 groups.
// Either way no bank conflicts and no padding bytes; the XOR stays inside its group of chunks.
#pragma once
#include "ft_mma.cuh"

#if HEAD_DIM % 32 != 0
#error "the swizzled layout needs HEAD_DIM to be a multiple of 32 (groups of 4 or 8 chunks)"
#endif

#define FT_SWZ_FULL_CHUNKS (HEAD_DIM / 64 * 8)   // chunks in full groups of 8; the rest: one group of 4

// element offset of (row, col) in a swizzled tile; col is a multiple of 8 wherever a whole chunk
// is addressed (cp.async, ldmatrix)
__device__ __forceinline__ int swz(int row, int col) {
    const int c = col >> 3;
    const int x = (HEAD_DIM % 64 == 0 || c < FT_SWZ_FULL_CHUNKS) ? (row & 7) : ((row >> 1) & 3);
    return row * HEAD_DIM + ((c ^ x) << 3) + (col & 7);
}

// rows [r0, r0 + ROWS) of a (N, HEAD_DIM) matrix into a swizzled tile, by THREADS threads;
// rows >= N become zeros and global memory past the end is never read. Each thread keeps one
// chunk column and walks the rows THREADS / (HEAD_DIM / 8) apart, so its addresses are one base
// plus constant steps (a few registers, whatever the tile's size). When the block's threads are
// not a multiple of a row's chunks (12 at D = 96), the last THREADS % chunks threads sit out.
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_swz(ft_raw* tile, const ft_raw* src, int r0, int N) {
    constexpr int chunks = HEAD_DIM / 8, step = THREADS / chunks;
    static_assert(step > 0, "a block needs at least one thread per chunk of a row");
    if (THREADS % chunks != 0 && threadIdx.x >= step * chunks) return;
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
