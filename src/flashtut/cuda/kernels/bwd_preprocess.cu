// Backward step 0: Delta = rowsum(dO * O) per query row, and the log-sum-exp in base 2.
//
// dS = P * (dP - Delta) needs, for every query row, Delta_i = sum_j P_ij dP_ij, which equals
// sum_d dO_id O_id (substitute dP = dO V^T and O = P V). Computing it once here from O and dO,
// a pass over 2 x N x D elements, saves the main kernels a reduction over the whole key axis.
// The kernels evaluate P = 2^(S * scale * log2 e - lse2), so lse2 = lse * log2 e is stored too.
#include "bwd_common.cuh"

#ifndef PRE_WARPS
#define PRE_WARPS 4        // rows per block: one warp per query row
#endif

extern "C" __global__ void __launch_bounds__(32 * PRE_WARPS)
attn_bwd_preprocess(const ft_raw* __restrict__ o, const ft_raw* __restrict__ dout,
                    const float* __restrict__ lse, float* __restrict__ delta,
                    float* __restrict__ lse2, int n_rows) {
    const int row = blockIdx.x * PRE_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= n_rows) return;
    // a warp reads a row as 32 consecutive words per step: one coalesced 128-byte transaction
    const u32* o2 = reinterpret_cast<const u32*>(o + (long long)row * HEAD_DIM);
    const u32* d2 = reinterpret_cast<const u32*>(dout + (long long)row * HEAD_DIM);
    float acc = 0.0f;
    for (int i = lane; i < HEAD_DIM / 2; i += 32) {
        const u32 a = o2[i], b = d2[i];
        acc += ft_to_float((ft_raw)(a & 0xffffu)) * ft_to_float((ft_raw)(b & 0xffffu));
        acc += ft_to_float((ft_raw)(a >> 16)) * ft_to_float((ft_raw)(b >> 16));
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        delta[row] = acc;
        // a row that saw no key has lse = -inf; +inf makes every recomputed P of it 2^-inf = 0
        lse2[row] = lse[row] == FT_NEG_INF ? -FT_NEG_INF : lse[row] * FT_LOG2E;
    }
}
