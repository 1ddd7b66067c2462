// fwd_w1_wgmma.cu: Hopper rung W1, the forward with warpgroup MMA (wgmma, sm_90a).
//
// What changes from fwd_v3_fast.cu (mma.sync, one warp per 16 rows):
//  * a block of 128 query rows is two warpgroups of 4 warps, each owning 64 rows; one wgmma
//    instruction computes a 64 x N slice of S = Q K^T (or O += P V) for the whole warpgroup, where
//    mma.sync needed 8 x N / 8 instructions of 16 x 8, each fed through registers by ldmatrix;
//  * S = Q K^T reads both operands straight from shared memory through matrix descriptors
//    (ft_wgmma.cuh); O += P V takes P from registers (the S accumulator converted in place) and V
//    from shared memory, transposed by the tensor core (V is N-major: imm-trans-b = 1);
//  * Q, K and V tiles sit in shared memory in the layout wgmma reads: 64-column blocks of 128-byte
//    rows with the 128-byte swizzle, each block aligned to 1024 bytes;
//  * the wgmma are asynchronous: a group is issued, committed and waited for before its
//    accumulators are read (W1 waits at once; overlapping the wait with softmax is rung W3).
// Kept from v3: the cp.async double buffer for K and V (rung W2 replaces it with TMA), exp2 with
// scale * log2(e) folded into one FMA, causal block skipping with the heaviest blocks first, masked
// tails for any Nq and Nk, natural-log lse.
//
// Grouped heads: query head bh = b * H + h reads key/value head bh / kv_group = b * Hkv + h / kv_group.
// Causal: query i sees key j iff j <= i + diag_offset (0: top-left, Nk - Nq: bottom-right); a row that
// sees no key writes o = 0 and lse = -inf.
#include "ft_wgmma_softmax.cuh"

#ifndef W1_BLOCK_N
#define W1_BLOCK_N 128  // keys per K/V tile: the N of the S = Q K^T wgmma (64 or 128)
#endif
#ifndef W1_PV_SPLIT
// 1: at D = 128, O += P V is two m64n64 wgmma per 16 keys, one per 64-column block of V, so the
// descriptor needs no leading-dimension offset; 0: one m64n128 wgmma whose LBO steps from the
// first 64-column block of V to the second
#define W1_PV_SPLIT 1
#endif
#define W1_BLOCK_M 128                 // two warpgroups of 64 rows
#define W1_THREADS 256
#define W1_CHUNKS (HEAD_DIM / 8)       // 16-byte chunks per row
#define W1_KSTEPS (HEAD_DIM / 16)      // k-steps of S = Q K^T
#define W1_PSTEPS (W1_BLOCK_N / 16)    // k-steps of O += P V
#define W1_Q_BYTES (W1_BLOCK_M * HEAD_DIM * 2)
#define W1_KV_BYTES (W1_BLOCK_N * HEAD_DIM * 2)

// rows [r0, r0 + ROWS) of a (N, HEAD_DIM) matrix into a swizzled tile; rows >= N become zeros.
// Consecutive threads take consecutive 16-byte chunks of a row: coalesced in global memory, and the
// 8 chunks of a row land in 8 different 16-byte bank groups in shared memory.
template <int ROWS>
__device__ __forceinline__ void w1_load(unsigned char* tile, const ft_raw* src, int r0, int N) {
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * W1_CHUNKS; i += W1_THREADS) {
        int r = i / W1_CHUNKS, c = (i % W1_CHUNKS) * 8;
        bool ok = r0 + r < N;
        const ft_raw* g = src + (size_t)(ok ? r0 + r : 0) * HEAD_DIM + c;
        cp_async_16(tile + sw128_offset<ROWS>(r, c), g, ok);
    }
}

// grid (ceil(Nq / 128), B * H), block 256 threads, dynamic shared memory
// W1_Q_BYTES + 4 * W1_KV_BYTES + 1024 (the 1024 lets the tiles start on a 1024-byte boundary)
extern "C" __global__ void __launch_bounds__(W1_THREADS, 1)
flash_fwd_w1(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k, const ft_raw* __restrict__ v,
             ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal, int kv_group, int diag_offset) {
#if FT_SM90A
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    unsigned char* q_s = smem;                      // [HEAD_DIM / 64][128][64]
    unsigned char* k_s = q_s + W1_Q_BYTES;          // [2][HEAD_DIM / 64][W1_BLOCK_N][64]
    unsigned char* v_s = k_s + 2 * W1_KV_BYTES;     // [2][HEAD_DIM / 64][W1_BLOCK_N][64]

    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y;
    // causal: the last query blocks see the most keys; start them first so they do not finish last
    const int mb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int m0 = mb * W1_BLOCK_M;
    const int wg_row0 = m0 + wg * 64;        // first row of this warpgroup
    const int warp_row0 = wg_row0 + warp * 16;
    const int r0 = warp_row0 + g;            // this thread's rows: r0 and r0 + 8
    const ft_raw* qb = q + (size_t)bh * Nq * HEAD_DIM;
    const ft_raw* kb = k + (size_t)(bh / kv_group) * Nk * HEAD_DIM;
    const ft_raw* vb = v + (size_t)(bh / kv_group) * Nk * HEAD_DIM;

    // keys any row of this block may see
    int n_end = Nk;
    if (causal) n_end = min(Nk, max(0, min(m0 + W1_BLOCK_M, Nq) + diag_offset));
    const int n_tiles = (n_end + W1_BLOCK_N - 1) / W1_BLOCK_N;

    w1_load<W1_BLOCK_M>(q_s, qb, m0, Nq);
    if (n_tiles > 0) {
        w1_load<W1_BLOCK_N>(k_s, kb, 0, Nk);
        w1_load<W1_BLOCK_N>(v_s, vb, 0, Nk);
    }
    cp_async_commit();

    const unsigned q_addr = smem_addr(q_s) + wg * 64 * 128;  // this warpgroup's 64 rows
    float acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) acc[i] = 0.f;
    float m[2] = {FT_NEG_INF, FT_NEG_INF}, l[2] = {0.f, 0.f};

    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<0>();
        fence_proxy_async_smem();  // this thread's cp.async writes, visible to the tensor cores' reads
        __syncthreads();           // tile j has landed, and both warpgroups are done with tile j - 1
        if (j + 1 < n_tiles) {
            const int nb = (j + 1) & 1;
            w1_load<W1_BLOCK_N>(k_s + nb * W1_KV_BYTES, kb, (j + 1) * W1_BLOCK_N, Nk);
            w1_load<W1_BLOCK_N>(v_s + nb * W1_KV_BYTES, vb, (j + 1) * W1_BLOCK_N, Nk);
            cp_async_commit();
        }
        const int n0 = j * W1_BLOCK_N;
        const unsigned k_addr = smem_addr(k_s + (j & 1) * W1_KV_BYTES);
        const unsigned v_addr = smem_addr(v_s + (j & 1) * W1_KV_BYTES);

        // a warpgroup whose rows are all past Nq, or (causal) all left of this tile's first key, skips it;
        // the condition is the same in its 128 threads, as the collective wgmma requires
        if (wg_row0 >= Nq || (causal && n0 > wg_row0 + 63 + diag_offset)) continue;

        // S = Q K^T: HEAD_DIM / 16 wgmma of 64 x W1_BLOCK_N x 16. Step ks reads columns 16 ks.. of
        // Q and K: 64-column block ks / 4, 32 bytes further along the swizzled rows per step.
        // SBO: 1024 bytes from one 8-row group to the next; LBO is unused by swizzled K-major operands.
        float s[W1_BLOCK_N / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < W1_KSTEPS; ++ks) {
            const unsigned a = q_addr + (ks / 4) * (W1_BLOCK_M * 128) + (ks % 4) * 32;
            const unsigned b = k_addr + (ks / 4) * (W1_BLOCK_N * 128) + (ks % 4) * 32;
            wgmma_ss<W1_BLOCK_N>(s, wgmma_desc(a, 16, 1024), wgmma_desc(b, 16, 1024), ks > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands<W1_BLOCK_N / 2>(s);

        wg_mask<W1_BLOCK_N>(s, n0, Nk, causal, diag_offset, warp_row0, r0, t);

        ft_raw2 pf[W1_BLOCK_N / 4];
        wg_softmax<W1_BLOCK_N>(s, m, l, acc, scale_log2, pf);

        // O += P V: per 16 keys (8-key groups 1024 bytes apart: SBO), V read N-major from its tile
        wgmma_fence();  // acc was rescaled and pf written by ordinary instructions
#pragma unroll
        for (int kp = 0; kp < W1_PSTEPS; ++kp) {
            const ft_raw2 a[4] = {pf[4 * kp], pf[4 * kp + 1], pf[4 * kp + 2], pf[4 * kp + 3]};
            const unsigned b = v_addr + kp * 16 * 128;
#if HEAD_DIM == 64 || !W1_PV_SPLIT
            wgmma_rs_nmajor<HEAD_DIM>(acc, a, wgmma_desc(b, W1_BLOCK_N * 128, 1024));
#else
#pragma unroll
            for (int cb = 0; cb < HEAD_DIM / 64; ++cb)
                wgmma_rs_nmajor<64>(acc + 32 * cb, a, wgmma_desc(b + cb * W1_BLOCK_N * 128, 1024, 1024));
#endif
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands<HEAD_DIM / 2>(acc);
    }

    wg_store(acc, m, l, o, lse, bh, Nq, Nq, r0, t, scale_log2);
#else
    __trap();  // built for a target without wgmma; flashtut.cuda.hopper launches it on sm_90a only
#endif
}
