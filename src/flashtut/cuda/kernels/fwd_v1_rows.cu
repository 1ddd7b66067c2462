// fwd_v1_rows.cu: ladder step 1. One thread per query row; K/V tiles staged in shared memory.
//
// FlashAttention-2 loop order: a block owns V1_BLOCK_M query rows (one thread each) and walks
// over all key/value tiles; each thread keeps its running max m, its running sum l and its
// output row o in registers the whole time (its query row waits in shared memory), and writes
// o to global memory once, at the end. (FlashAttention-1 swaps the loops: the outer loop is over K/V tiles, so every
// step reads O, m and l back from global memory, rescales, and writes them out again.)
//
// The arithmetic is plain float32 on the CUDA cores, one fused multiply-add at a time: no
// tensor cores. Every thread of the block reads the same K/V element at the same moment, so
// shared memory broadcasts it (no bank conflicts), but each element read feeds only one FMA.
#include "ft_common.cuh"

#ifndef V1_BLOCK_M
#define V1_BLOCK_M 64  // query rows (= threads) per block
#endif
#ifndef V1_BLOCK_N
#define V1_BLOCK_N 32  // keys per tile
#endif

// q: (B*H, Nq, D)   k, v: (B*H, Nk, D)   o: like q   lse: (B*H, Nq) float32, natural log
// grid (ceil(Nq / V1_BLOCK_M), B*H), block V1_BLOCK_M threads
extern "C" __global__ void __launch_bounds__(V1_BLOCK_M)
flash_fwd_v1(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k, const ft_raw* __restrict__ v,
             ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal) {
    __shared__ ft_raw2 k_s[V1_BLOCK_N][HEAD_DIM / 2];
    __shared__ ft_raw2 v_s[V1_BLOCK_N][HEAD_DIM / 2];
    // the query rows, transposed: thread i's row is column i, so when all threads read their
    // element d at once they hit consecutive words (no bank conflicts)
    __shared__ ft_raw2 q_s[HEAD_DIM / 2][V1_BLOCK_M];
    __shared__ float s_s[V1_BLOCK_N][V1_BLOCK_M];  // this tile's scores, one column per thread

    const int bh = blockIdx.y;
    const int row = blockIdx.x * V1_BLOCK_M + threadIdx.x;
    const bool row_ok = row < Nq;
    const ft_raw2* q2 = reinterpret_cast<const ft_raw2*>(q + ((size_t)bh * Nq + (row_ok ? row : 0)) * HEAD_DIM);
    const ft_raw2* k2 = reinterpret_cast<const ft_raw2*>(k + (size_t)bh * Nk * HEAD_DIM);
    const ft_raw2* v2 = reinterpret_cast<const ft_raw2*>(v + (size_t)bh * Nk * HEAD_DIM);

    // Registers hold the output row (HEAD_DIM floats); the query row would add HEAD_DIM / 2
    // more and, with the compiler's temporaries, go over 255 registers at HEAD_DIM = 128, so it
    // waits in shared memory. Only this thread reads its column: no __syncthreads needed for it.
    for (int d = 0; d < HEAD_DIM / 2; ++d) q_s[d][threadIdx.x] = q2[d];
    float acc[HEAD_DIM];
#pragma unroll
    for (int d = 0; d < HEAD_DIM; ++d) acc[d] = 0.f;
    float m = FT_NEG_INF;  // running max of the scores, in log2 units
    float l = 0.f;         // running sum of 2^(s - m)

    // causal: no key beyond the block's last row is needed by any of its threads
    int n_end = Nk;
    if (causal) n_end = min(Nk, (int)(blockIdx.x + 1) * V1_BLOCK_M);

    for (int n0 = 0; n0 < n_end; n0 += V1_BLOCK_N) {
        __syncthreads();  // the previous tile is no longer being read
        for (int i = threadIdx.x; i < V1_BLOCK_N * HEAD_DIM / 2; i += V1_BLOCK_M) {
            int j = i / (HEAD_DIM / 2), d = i % (HEAD_DIM / 2);
            bool ok = n0 + j < Nk;
            k_s[j][d] = ok ? k2[(size_t)(n0 + j) * (HEAD_DIM / 2) + d] : 0u;
            v_s[j][d] = ok ? v2[(size_t)(n0 + j) * (HEAD_DIM / 2) + d] : 0u;
        }
        __syncthreads();

        // scores of this row against the tile's keys, in log2 units (scale * log2(e) folded in);
        // they wait in this thread's column of s_s (a register array would need the j loops
        // fully unrolled, which multiplies code size and compile time by V1_BLOCK_N)
        float m_tile = FT_NEG_INF;
#pragma unroll 1
        for (int j = 0; j < V1_BLOCK_N; ++j) {
            float dot = 0.f;
#pragma unroll 8
            for (int d = 0; d < HEAD_DIM / 2; ++d) {
                ft_raw2 kk = k_s[j][d];  // same address for every thread: a broadcast
                ft_raw2 qq = q_s[d][threadIdx.x];
                dot = fmaf(ft_lo(qq), ft_lo(kk), dot);
                dot = fmaf(ft_hi(qq), ft_hi(kk), dot);
            }
            int col = n0 + j;
            bool masked = col >= Nk || (causal && col > row);
            float sj = masked ? FT_NEG_INF : dot * scale_log2;
            s_s[j][threadIdx.x] = sj;
            m_tile = fmaxf(m_tile, sj);
        }
        // online softmax: rescale what was accumulated under the old max once per tile
        float m_new = fmaxf(m, m_tile);
        float m_use = (m_new == FT_NEG_INF) ? 0.f : m_new;  // a row with nothing unmasked yet
        float alpha = ft_exp2(m - m_use);
        l *= alpha;
#pragma unroll
        for (int d = 0; d < HEAD_DIM; ++d) acc[d] *= alpha;
#pragma unroll 1
        for (int j = 0; j < V1_BLOCK_N; ++j) {
            float p = ft_exp2(s_s[j][threadIdx.x] - m_use);
            l += p;
#pragma unroll
            for (int d = 0; d < HEAD_DIM / 2; ++d) {
                ft_raw2 vv = v_s[j][d];
                acc[2 * d] = fmaf(p, ft_lo(vv), acc[2 * d]);
                acc[2 * d + 1] = fmaf(p, ft_hi(vv), acc[2 * d + 1]);
            }
        }
        m = m_new;
    }

    if (!row_ok) return;
    float inv_l = 1.f / l;
    ft_raw2* o2 = reinterpret_cast<ft_raw2*>(o + ((size_t)bh * Nq + row) * HEAD_DIM);
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 2; ++d) o2[d] = ft_pack2(acc[2 * d] * inv_l, acc[2 * d + 1] * inv_l);
    // natural-log lse: (m + log2 l) is in log2 units
    lse[(size_t)bh * Nq + row] = (m + ft_log2(l)) * FT_LN2;
}
