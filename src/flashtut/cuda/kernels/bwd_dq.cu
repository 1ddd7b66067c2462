// Backward step 2: dQ, one thread block per query block, in a separate pass.
//
// Why a second pass: the alternative (bwd_dkdv.cu built with DKDV_DQ_ATOMIC=1, then
// bwd_dq_convert.cu) lets each key block add its share of dQ (BLOCK_M x HEAD_DIM values per
// query block it visits) into a float32 buffer with atomic adds: one atomic per 10 * BLOCK_N =
// 640 useful FLOPs, contended in L2 (every key block of a head adds into the same rows), a dS
// round trip through shared memory with an extra barrier, and a sum order (so the last bits of
// dQ) that changes from run to run. This pass instead recomputes S and dP once more: 3 products
// per tile here + 4 in bwd_dkdv.cu = 7, against 5 with atomics, i.e. 40% more tensor-core work,
// in exchange for no atomics, no float32 buffer, no convert kernel, and bit-reproducible results:
// cuda_attention runs it with deterministic=True, and on GPUs before sm_80 (configs.pick_config).
//
// The structure is the forward kernel's: warp w owns query rows 16w..16w+15 of the block and
// keeps their dQ (16 x HEAD_DIM, fp32) in registers; the block walks the key blocks
// (DQ_BLOCK_N keys each) with K and V double-buffered through shared memory:
//   S  = Q_w K^T,   P = 2^(S * scale * log2e - lse2[row]),   dP = dO_w V^T,
//   dS = P * (dP - Delta[row]),   dQ += dS K                (dQ scaled once at the end)
// Causal: key blocks that start after the block's last query are never loaded. Query i sees
// key j iff j <= i + diag_offset (0: top-left, Nk - Nq: bottom-right); K/V head = h / kv_group.
#include "bwd_common.cuh"

#ifndef DQ_WARPS
#define DQ_WARPS 4
#endif
#ifndef DQ_BLOCK_N
#define DQ_BLOCK_N 64      // keys per step (a multiple of 16)
#endif
#ifndef DQ_STAGES
#define DQ_STAGES 2
#endif

#define DQ_BLOCK_M (16 * DQ_WARPS)
#define DQ_THREADS (32 * DQ_WARPS)
#define DQ_NT (DQ_BLOCK_N / 8)            // n-tiles of 8 keys in S

#if DQ_BLOCK_N % 16 != 0
#error "DQ_BLOCK_N must be a multiple of 16"
#endif
#if DQ_STAGES != 1 && DQ_STAGES != 2
#error "DQ_STAGES must be 1 or 2"
#endif

// Dynamic shared memory of a launch: Q and dO tiles, then DQ_STAGES stages of K and V.

extern "C" __global__ void __launch_bounds__(DQ_THREADS)
attn_bwd_dq(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k,
            const ft_raw* __restrict__ v, const ft_raw* __restrict__ dout,
            const float* __restrict__ lse2, const float* __restrict__ delta,
            ft_raw* __restrict__ dq, int n_q, int n_k, float scale, float scale_log2, int causal,
            int kv_group, int diag_offset) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // causal: the last query blocks see the most keys; launching them first evens out the tail
    const int qb = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int q0 = qb * DQ_BLOCK_M;
    const long long bh = blockIdx.y;
    q += bh * n_q * HEAD_DIM;
    dout += bh * n_q * HEAD_DIM;
    dq += bh * n_q * HEAD_DIM;
    k += (bh / kv_group) * n_k * HEAD_DIM;   // bh = b * H + h: b * Hkv + h / kv_group
    v += (bh / kv_group) * n_k * HEAD_DIM;
    lse2 += bh * n_q;
    delta += bh * n_q;

    // shared memory: Q tile, dO tile, then per stage a K tile and a V tile
    ft_raw* t_q = reinterpret_cast<ft_raw*>(smem);
    ft_raw* t_do = t_q + DQ_BLOCK_M * BWD_LDS;
    ft_raw* stage0 = t_do + DQ_BLOCK_M * BWD_LDS;

    const int key_end = causal ? max(0, min(n_k, q0 + DQ_BLOCK_M + diag_offset)) : n_k;  // one past the last visible key
    const int n_steps = (key_end + DQ_BLOCK_N - 1) / DQ_BLOCK_N;

    auto load_stage = [&](int stage, int k_start) {
        ft_raw* t_k = stage0 + stage * 2 * DQ_BLOCK_N * BWD_LDS;
        load_tile<DQ_BLOCK_N, DQ_THREADS>(t_k, k, k_start, n_k);
        load_tile<DQ_BLOCK_N, DQ_THREADS>(t_k + DQ_BLOCK_N * BWD_LDS, v, k_start, n_k);
    };

    load_tile<DQ_BLOCK_M, DQ_THREADS>(t_q, q, q0, n_q);
    load_tile<DQ_BLOCK_M, DQ_THREADS>(t_do, dout, q0, n_q);
    load_stage(0, 0);
    cp_async_commit();

    // this lane's two query rows; rows past n_q compute harmless finite values, never stored
    const int row_a = q0 + 16 * warp + lane / 4, row_b = row_a + 8;
    const float lse_a = row_a < n_q ? lse2[row_a] : 0.0f, lse_b = row_b < n_q ? lse2[row_b] : 0.0f;
    const float dlt_a = row_a < n_q ? delta[row_a] : 0.0f, dlt_b = row_b < n_q ? delta[row_b] : 0.0f;

    float acc[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    // ldmatrix takes shared-window addresses: this warp's 16 rows of Q and dO
    const u32 s_qw = smem_addr(t_q + 16 * warp * BWD_LDS), s_dow = smem_addr(t_do + 16 * warp * BWD_LDS);

    for (int step = 0; step < n_steps; ++step) {
        const int k0 = step * DQ_BLOCK_N;
        const int stage = DQ_STAGES == 1 ? 0 : step % 2;
        if (DQ_STAGES == 1) {
            if (step > 0) { load_stage(0, k0); cp_async_commit(); }
            cp_async_wait<0>();
        } else if (step + 1 < n_steps) {
            load_stage((step + 1) % 2, k0 + DQ_BLOCK_N);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        const ft_raw* t_k = stage0 + stage * 2 * DQ_BLOCK_N * BWD_LDS;
        const u32 s_k = smem_addr(t_k), s_v = smem_addr(t_k + DQ_BLOCK_N * BWD_LDS);

        float p[DQ_NT][4];
        mma_abt<DQ_NT>(p, s_qw, s_k, lane);                 // S = Q_w K^T
        const bool edge = k0 + DQ_BLOCK_N > n_k || (causal && k0 + DQ_BLOCK_N - 1 > q0 + diag_offset);
#pragma unroll
        for (int t = 0; t < DQ_NT; ++t) {
            p[t][0] = ft_exp2(p[t][0] * scale_log2 - lse_a);
            p[t][1] = ft_exp2(p[t][1] * scale_log2 - lse_a);
            p[t][2] = ft_exp2(p[t][2] * scale_log2 - lse_b);
            p[t][3] = ft_exp2(p[t][3] * scale_log2 - lse_b);
            if (edge) {   // keys past the end, and keys j > i, get probability 0
                const int ka = k0 + t * 8 + 2 * (lane % 4), kb = ka + 1;
                if (ka >= n_k || (causal && ka > row_a + diag_offset)) p[t][0] = 0.0f;
                if (kb >= n_k || (causal && kb > row_a + diag_offset)) p[t][1] = 0.0f;
                if (ka >= n_k || (causal && ka > row_b + diag_offset)) p[t][2] = 0.0f;
                if (kb >= n_k || (causal && kb > row_b + diag_offset)) p[t][3] = 0.0f;
            }
        }

        float ds[DQ_NT][4];
        mma_abt<DQ_NT>(ds, s_dow, s_v, lane);               // dP = dO_w V^T
#pragma unroll
        for (int t = 0; t < DQ_NT; ++t) {
            ds[t][0] = p[t][0] * (ds[t][0] - dlt_a);
            ds[t][1] = p[t][1] * (ds[t][1] - dlt_a);
            ds[t][2] = p[t][2] * (ds[t][2] - dlt_b);
            ds[t][3] = p[t][3] * (ds[t][3] - dlt_b);
        }
        u32 dsa[DQ_NT / 2][4];
        acc_to_a<DQ_NT>(dsa, ds);
        mma_ab<DQ_NT / 2>(acc, dsa, s_k, lane);             // dQ += dS K
        __syncthreads();
    }

    if (n_steps == 0) cp_async_wait<0>();   // a block that sees no key: its Q/dO copies are in flight
    store_strip(dq, acc, q0 + 16 * warp, n_q, scale, lane);
}
