// fwd_v2_mma.cu: ladder step 2. A block of warps per query tile, both products on tensor cores.
//
// Each warp owns 16 query rows and computes, per K/V tile of V2_BLOCK_N keys,
//   S = Q K^T     with mma.sync (16 x V2_BLOCK_N, float32 accumulators in registers),
//   P = 2^(S - m) the online softmax on those registers (a row is spread over 4 lanes),
//   O += P V      with mma.sync, P converted to 16-bit and used directly as the A operand:
//                 the accumulator layout of S is the A-fragment layout of P (see ft_mma.cuh),
//                 so P never goes through shared memory.
// Kept simple on purpose: Q fragments are read straight from global memory, K/V tiles are
// copied with ordinary loads, and the mma operands are read from shared memory one 32-bit word
// (or, for V, one 16-bit value) at a time. Those reads conflict on shared-memory banks, and the
// loads do not overlap the math: step 3 (fwd_v3_fast.cu) removes both.
#include "ft_mma.cuh"

#ifndef V2_WARPS
#define V2_WARPS 4
#endif
#ifndef V2_BLOCK_N
#define V2_BLOCK_N 64
#endif
#define V2_BLOCK_M (16 * V2_WARPS)
#define V2_NT (V2_BLOCK_N / 8)  // n-tiles of S per warp
#define V2_DT (HEAD_DIM / 8)    // n-tiles of O per warp
#define V2_KQ (HEAD_DIM / 16)   // k-steps of Q K^T
#define V2_KP (V2_BLOCK_N / 16) // k-steps of P V

// grid (ceil(Nq / V2_BLOCK_M), B*H), block 32 * V2_WARPS threads
extern "C" __global__ void __launch_bounds__(32 * V2_WARPS)
flash_fwd_v2(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k, const ft_raw* __restrict__ v,
             ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal) {
    __shared__ __align__(16) ft_raw k_s[V2_BLOCK_N][HEAD_DIM];
    __shared__ __align__(16) ft_raw v_s[V2_BLOCK_N][HEAD_DIM];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y;
    const int m0 = blockIdx.x * V2_BLOCK_M;
    const int r0 = m0 + warp * 16 + g;  // this lane's two rows: r0 and r0 + 8
    const ft_raw* qb = q + (size_t)bh * Nq * HEAD_DIM;
    const ft_raw* kb = k + (size_t)bh * Nk * HEAD_DIM;
    const ft_raw* vb = v + (size_t)bh * Nk * HEAD_DIM;

    // Q fragments for all HEAD_DIM/16 k-steps, straight from global memory (rows past Nq: zeros)
    ft_raw2 qf[V2_KQ][4];
#pragma unroll
    for (int ks = 0; ks < V2_KQ; ++ks) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int r = r0 + (i % 2) * 8, c = ks * 16 + 2 * t + (i / 2) * 8;
            qf[ks][i] = r < Nq ? *reinterpret_cast<const ft_raw2*>(qb + (size_t)r * HEAD_DIM + c) : 0u;
        }
    }

    float acc[V2_DT][4];
#pragma unroll
    for (int dt = 0; dt < V2_DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[dt][i] = 0.f;
    float m[2] = {FT_NEG_INF, FT_NEG_INF}, l[2] = {0.f, 0.f};

    int n_end = Nk;
    if (causal) n_end = min(Nk, m0 + V2_BLOCK_M);

    for (int n0 = 0; n0 < n_end; n0 += V2_BLOCK_N) {
        __syncthreads();
        // 16-byte chunks of the K and V tiles, zero past Nk
        for (int i = threadIdx.x; i < V2_BLOCK_N * HEAD_DIM / 8; i += 32 * V2_WARPS) {
            int j = i / (HEAD_DIM / 8), c = (i % (HEAD_DIM / 8)) * 8;
            uint4 kk = make_uint4(0u, 0u, 0u, 0u), vv = kk;
            if (n0 + j < Nk) {
                kk = *reinterpret_cast<const uint4*>(kb + (size_t)(n0 + j) * HEAD_DIM + c);
                vv = *reinterpret_cast<const uint4*>(vb + (size_t)(n0 + j) * HEAD_DIM + c);
            }
            *reinterpret_cast<uint4*>(&k_s[j][c]) = kk;
            *reinterpret_cast<uint4*>(&v_s[j][c]) = vv;
        }
        __syncthreads();

        // S = Q K^T: B[k][n] = K[n][k], so b0 is the pair K[n][2t..2t+1], one 32-bit read
        float s[V2_NT][4];
#pragma unroll
        for (int nt = 0; nt < V2_NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
#pragma unroll
            for (int ks = 0; ks < V2_KQ; ++ks) {
                const ft_raw* kr = &k_s[nt * 8 + g][ks * 16 + 2 * t];
                mma_16x8x16(s[nt], qf[ks], *reinterpret_cast<const ft_raw2*>(kr),
                            *reinterpret_cast<const ft_raw2*>(kr + 8));
            }
        }

        // online softmax on the accumulators; element i of s[nt] is row r0 + (i/2)*8, key n0 + nt*8 + 2t + i%2
        float m_tile[2] = {FT_NEG_INF, FT_NEG_INF};
#pragma unroll
        for (int nt = 0; nt < V2_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int row = r0 + (i / 2) * 8, col = n0 + nt * 8 + 2 * t + (i % 2);
                bool masked = col >= Nk || (causal && col > row);
                s[nt][i] = masked ? FT_NEG_INF : s[nt][i] * scale_log2;
                m_tile[i / 2] = fmaxf(m_tile[i / 2], s[nt][i]);
            }
        float m_use[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float m_new = fmaxf(m[r], quad_max(m_tile[r]));
            m_use[r] = m_new == FT_NEG_INF ? 0.f : m_new;
            alpha[r] = ft_exp2(m[r] - m_use[r]);
            m[r] = m_new;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int dt = 0; dt < V2_DT; ++dt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[dt][i] *= alpha[i / 2];

        // P = 2^(S - m), packed to 16-bit A fragments: k-step kp takes n-tiles 2kp and 2kp+1
        ft_raw2 pf[V2_KP][4];
#pragma unroll
        for (int nt = 0; nt < V2_NT; ++nt) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                p[i] = ft_exp2(s[nt][i] - m_use[i / 2]);
                l[i / 2] += p[i];  // this lane's partial row sum; the 4 lanes are summed at the end
            }
            pf[nt / 2][(nt % 2) * 2 + 0] = ft_pack2(p[0], p[1]);
            pf[nt / 2][(nt % 2) * 2 + 1] = ft_pack2(p[2], p[3]);
        }

        // O += P V: B[k][n] = V[key k][d n]; b0 = (V[2t][g], V[2t+1][g]) are in two rows,
        // so each register is assembled from two 16-bit reads
#pragma unroll
        for (int dt = 0; dt < V2_DT; ++dt)
#pragma unroll
            for (int kp = 0; kp < V2_KP; ++kp) {
                int key = kp * 16 + 2 * t, d = dt * 8 + g;
                ft_raw2 b0 = (ft_raw2)v_s[key][d] | ((ft_raw2)v_s[key + 1][d] << 16);
                ft_raw2 b1 = (ft_raw2)v_s[key + 8][d] | ((ft_raw2)v_s[key + 9][d] << 16);
                mma_16x8x16(acc[dt], pf[kp], b0, b1);
            }
    }

    // finish: full row sums, normalise, write O once and the natural-log lse
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float lsum = quad_sum(l[r]);
        int row = r0 + r * 8;
        if (row >= Nq) continue;
        float inv = 1.f / lsum;
        ft_raw* orow = o + ((size_t)bh * Nq + row) * HEAD_DIM;
#pragma unroll
        for (int dt = 0; dt < V2_DT; ++dt)
            *reinterpret_cast<ft_raw2*>(orow + dt * 8 + 2 * t) =
                ft_pack2(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv);
        if (t == 0) lse[(size_t)bh * Nq + row] = (m[r] + ft_log2(lsum)) * FT_LN2;
    }
}
