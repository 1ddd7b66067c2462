// Shared pieces of the backward kernels (bwd_preprocess.cu, bwd_dkdv.cu, bwd_dq.cu,
// bwd_dq_convert.cu): the warp-level tile products they all use, and the tile loaders.
//
// NVRTC has no system headers, so 16-bit floats travel as raw bit patterns (`ft_raw`) and every
// conversion, tensor-core product and shared-memory move is one line of inline PTX. Everything
// here and in ft_mma.cuh also builds for sm_75: Colab's T4 has ldmatrix and the m16n8k8 fp16
// mma, but no cp.async (plain copies there) and no bf16 tensor cores.
#ifndef FT_BWD_COMMON_CUH
#define FT_BWD_COMMON_CUH

// mma_16x8x16, ldmatrix_x4(_trans), cp_async_16/commit/wait, ft_pack2, ft_exp2: the forward
// kernels' helpers, shared so both directions use one definition of each fragment layout.
#include "ft_mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800 && FT_BF16
#error "bfloat16 tensor-core instructions need sm_80 or newer"
#endif
#if HEAD_DIM % 16 != 0
#error "HEAD_DIM must be a multiple of 16 (one mma k-step)"
#endif

typedef unsigned int u32;

// Shared-memory rows are HEAD_DIM + 8 elements long: the 16 extra bytes shift consecutive rows
// by four banks, so the eight 16-byte rows an ldmatrix phase reads hit 32 different banks.
#define BWD_LDS (HEAD_DIM + 8)
#define BWD_CHUNKS_PER_ROW (HEAD_DIM / 8)   // 16-byte pieces per row

// Byte offsets (within a tile of `ld`-element rows, BWD_LDS unless said) that lane l passes to
// ldmatrix (lane 8m + r gives the address of row r of 8x8 matrix m; matrix m lands in register m):
// A operand (16 rows x 16 k, row-major) and B operand stored k-major (16 k x 16 n, `_trans`):
//   row l % 16, column 8 * (l / 16);
// B operand stored n-major (16 n x 16 k, plain), or an A operand stored k-major (`_trans`):
//   row (l % 8) + 8 * (l / 16), column 8 * ((l / 8) % 2).
// Either way registers {r0, r1} feed the first 8 columns / n-tile and {r2, r3} the next
// (ft_mma.cuh has the fragment layouts).
__device__ __forceinline__ u32 lane_off_a(int lane, int ld = BWD_LDS) {
    return (u32)(((lane % 16) * ld + 8 * (lane / 16)) * 2);
}
__device__ __forceinline__ u32 lane_off_b(int lane, int ld = BWD_LDS) {
    return (u32)((((lane % 8) + 8 * (lane / 16)) * ld + 8 * ((lane / 8) % 2)) * 2);
}

// ---- global -> shared copies ----------------------------------------------------------------
// cp.async (sm_80+) copies without passing through registers, so the next tile's load overlaps
// this tile's arithmetic. src-size 0 writes zeros: rows past the end of the sequence become
// zeros in shared memory (never garbage that could be NaN times a zero probability).
// cp_async_16 (ft_mma.cuh) moves the tiles; this moves one float (lse2 or Delta of one row).
__device__ __forceinline__ void cp_async_4(float* dst, const float* src, bool valid) {
#if FT_SM80
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
#else
    *dst = valid ? *src : 0.0f;
#endif
}

// Rows [row0, row0 + ROWS) of an (n_rows x HEAD_DIM) row-major matrix into a shared tile;
// rows at or past n_rows become zeros, and global memory past the end is never touched (their
// source address is clamped to the start).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(ft_raw* dst, const ft_raw* src, int row0, int n_rows) {
    for (int c = threadIdx.x; c < ROWS * BWD_CHUNKS_PER_ROW; c += THREADS) {
        const int r = c / BWD_CHUNKS_PER_ROW, col = (c % BWD_CHUNKS_PER_ROW) * 8;
        const bool valid = row0 + r < n_rows;
        const ft_raw* g = src + (valid ? (long long)(row0 + r) * HEAD_DIM + col : 0);
        cp_async_16(dst + r * BWD_LDS + col, g, valid);
    }
}

template <int ROWS, int THREADS>
__device__ __forceinline__ void load_vec(float* dst, const float* src, int row0, int n_rows) {
    for (int r = threadIdx.x; r < ROWS; r += THREADS) {
        const bool valid = row0 + r < n_rows;
        cp_async_4(dst + r, src + (valid ? row0 + r : 0), valid);
    }
}

// Fragment registers of a 16-row accumulator strip -> A-operand fragments for the next product:
// n-tiles 2t and 2t+1 of the C layout are exactly k-step t of the A layout, so the tile never
// leaves registers. (FlashAttention-2 keeps P this way between its two products.)
template <int NT>
__device__ __forceinline__ void acc_to_a(u32 (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
    for (int t = 0; t < NT / 2; ++t) {
        a[t][0] = ft_pack2(c[2 * t][0], c[2 * t][1]);
        a[t][1] = ft_pack2(c[2 * t][2], c[2 * t][3]);
        a[t][2] = ft_pack2(c[2 * t + 1][0], c[2 * t + 1][1]);
        a[t][3] = ft_pack2(c[2 * t + 1][2], c[2 * t + 1][3]);
    }
}

// c (16*MT x 8*NT) = A (16*MT x HEAD_DIM, rows of a shared tile at a_base) * B^T where B is NT*8
// rows of a shared tile at b_base (both HEAD_DIM wide, n-major): the "X Y^T" product of S = Q K^T.
// Each B fragment loaded feeds 2*MT products and each A fragment NT: more m-tiles per warp, fewer
// shared-memory bytes per product.
template <int MT, int NT>
__device__ __forceinline__ void mma_abt_m(float (&c)[MT][NT][4], u32 a_base, u32 b_base, int lane) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int t = 0; t < NT; ++t) c[m][t][0] = c[m][t][1] = c[m][t][2] = c[m][t][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
            ldmatrix_x4(a[m], a_base + lane_off_a(lane) + (u32)(m * 16 * BWD_LDS * 2) + kk * 32);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 b[4];
            ldmatrix_x4(b, b_base + lane_off_b(lane) + (u32)(np * 16 * BWD_LDS * 2) + kk * 32);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16x8x16(c[m][2 * np], a[m], b[0], b[1]);
                mma_16x8x16(c[m][2 * np + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// the one-m-tile case: a warp's 16-row strip
template <int NT>
__device__ __forceinline__ void mma_abt(float (&c)[NT][4], u32 a_base, u32 b_base, int lane) {
    mma_abt_m<1, NT>(reinterpret_cast<float (&)[1][NT][4]>(c), a_base, b_base, lane);
}

// acc (16*MT x 8*NT) += A (16*MT x 16*KT, register fragments) * B where B is 16*KT rows of a
// shared tile at b_base (k-major, HEAD_DIM wide; b_base may point into a row, at the first of
// the 8*NT columns): the "P V" kind of product. Each B fragment feeds 2*MT products.
template <int MT, int KT, int NT>
__device__ __forceinline__ void mma_ab_m(float (&acc)[MT][NT][4], const u32 (&a)[MT][KT][4],
                                         u32 b_base, int lane) {
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
        for (int dn = 0; dn < NT / 2; ++dn) {
            u32 b[4];
            ldmatrix_x4_trans(b, b_base + lane_off_a(lane) + (u32)(kt * 16 * BWD_LDS * 2) + dn * 32);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16x8x16(acc[m][2 * dn], a[m][kt], b[0], b[1]);
                mma_16x8x16(acc[m][2 * dn + 1], a[m][kt], b[2], b[3]);
            }
        }
    }
}

// the one-m-tile case over all HEAD_DIM columns
template <int KT>
__device__ __forceinline__ void mma_ab(float (&acc)[HEAD_DIM / 8][4], const u32 (&a)[KT][4],
                                       u32 b_base, int lane) {
    mma_ab_m<1, KT, HEAD_DIM / 8>(reinterpret_cast<float (&)[1][HEAD_DIM / 8][4]>(acc),
                                  reinterpret_cast<const u32 (&)[1][KT][4]>(a), b_base, lane);
}

// Write a 16 x 8*NT fp32 strip (rows row0.., C layout) times `mul` as 16-bit floats into a
// HEAD_DIM-wide row-major matrix; dst points at the strip's first column.
template <int NT>
__device__ __forceinline__ void store_strip(ft_raw* dst, const float (&acc)[NT][4],
                                            int row0, int n_rows, float mul, int lane) {
    const int r0 = row0 + lane / 4, r1 = r0 + 8, col = 2 * (lane % 4);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (r0 < n_rows)
            *reinterpret_cast<u32*>(dst + (long long)r0 * HEAD_DIM + t * 8 + col) =
                ft_pack2(acc[t][0] * mul, acc[t][1] * mul);
        if (r1 < n_rows)
            *reinterpret_cast<u32*>(dst + (long long)r1 * HEAD_DIM + t * 8 + col) =
                ft_pack2(acc[t][2] * mul, acc[t][3] * mul);
    }
}

#endif  // FT_BWD_COMMON_CUH
