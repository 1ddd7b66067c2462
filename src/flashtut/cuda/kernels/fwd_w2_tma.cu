// fwd_w2_tma.cu: Hopper rung W2, W1 fed by the Tensor Memory Accelerator from a producer warpgroup (sm_90a).
//
// What changes from fwd_w1_wgmma.cu:
//  * a block is three warpgroups: warpgroup 0 produces, 1 and 2 consume (64 query rows each, the W1 math);
//  * one thread of the producer issues every load as a TMA copy (cp.async.bulk.tensor): the copy engine
//    moves a whole 64-column box of a tile and writes it in the 128-byte swizzle wgmma reads, so no
//    consumer thread computes an address or issues a load;
//  * K and V tiles go to a ring of W2_STAGES shared-memory stages, each guarded by mbarriers: "full"
//    (the producer announces the bytes to expect, the TMA unit counts them in as they land) and "empty"
//    (one arrival per consumer warp once its wgmma have read the stage), so a stage is refilled the
//    moment both consumers are done with it, without a __syncthreads anywhere in the loop;
//  * register reallocation: the producer needs a handful of registers, the consumers all they can get;
//    setmaxnreg moves them (the producer gives back down to W2_PRODUCER_REGS, the consumers grow to
//    W2_CONSUMER_REGS: 128 * 24 + 256 * 240 = 64512 of the SM's 65536).
// The loads: three tensor maps (Q, K, V as 3-D arrays of (HEAD_DIM, N, heads), boxes of 64 columns x
// rows x 1 head, 128-byte swizzle, rows past N filled with zeros by the TMA unit), encoded on the host by
// cuTensorMapEncodeTiled and passed in global memory, 128 bytes each (flashtut.cuda.hopper_launch).
// Kept from W1: the two products with wgmma, the online softmax in registers, causal tile skipping with
// the heaviest query blocks first, grouped heads, either causal alignment, o = 0 and lse = -inf for a
// row that sees no key.
// mbarriers, TMA copies, setmaxnreg, the two products on the TMA tiles (shared with W3)
#include "ft_tma.cuh"

#ifndef W2_BLOCK_N
#define W2_BLOCK_N 128  // keys per K/V tile (64 or 128)
#endif
#ifndef W2_STAGES
#define W2_STAGES 2     // K/V stages in the ring
#endif
#define W2_BLOCK_M FT_TMA_BLOCK_M
#define W2_THREADS 384
#define W2_PRODUCER_REGS 24
#define W2_CONSUMER_REGS 240
#define W2_Q_BYTES (W2_BLOCK_M * HEAD_DIM * 2)
#define W2_KV_BYTES (W2_BLOCK_N * HEAD_DIM * 2)
#define W2_CONSUMER_WARPS 8   // arrivals that free a stage: every consumer warp once

// grid (ceil(Nq / 128), B * H), block 384 threads, dynamic shared memory
// W2_Q_BYTES + 2 * W2_STAGES * W2_KV_BYTES + 1024 (alignment) + 8 * (1 + 3 * W2_STAGES) (mbarriers)
extern "C" __global__ void __launch_bounds__(W2_THREADS, 1)
flash_fwd_w2(const unsigned char* __restrict__ tmaps, ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal, int kv_group, int diag_offset) {
#if FT_SM90A
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_align1024(smem_raw);
    const unsigned q_s = smem_addr(smem);                          // [HEAD_DIM / 64][128][64]
    const unsigned k_s = q_s + W2_Q_BYTES;                         // [W2_STAGES][HEAD_DIM / 64][W2_BLOCK_N][64]
    const unsigned v_s = k_s + W2_STAGES * W2_KV_BYTES;
    const unsigned bars = v_s + W2_STAGES * W2_KV_BYTES;           // q_full, k_full[S], v_full[S], kv_empty[S]
    const unsigned q_full = bars;
#define W2_K_FULL(s) (bars + 8u * (1 + (s)))
#define W2_V_FULL(s) (bars + 8u * (1 + W2_STAGES + (s)))
#define W2_KV_EMPTY(s) (bars + 8u * (1 + 2 * W2_STAGES + (s)))

    const int wg = threadIdx.x / 128;
    const int bh = blockIdx.y;
    const ft_tma_block blk = tma_block<W2_BLOCK_N>(Nq, Nk, causal, diag_offset);
    const int m0 = blk.m0, n_tiles = blk.n_tiles;

    if (threadIdx.x == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < W2_STAGES; ++s) {
            mbar_init(W2_K_FULL(s), 1);
            mbar_init(W2_V_FULL(s), 1);
            mbar_init(W2_KV_EMPTY(s), W2_CONSUMER_WARPS);
        }
        mbar_init_fence();
    }
    __syncthreads();  // the only block-wide barrier: the producer returns early, the loop needs none

    if (wg == 0) {
        setmaxnreg_dec<W2_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            const void* tq = tmaps;
            const void* tk = tmaps + 128;
            const void* tv = tmaps + 256;
            const int kv_head = bh / kv_group;
            mbar_arrive_expect_tx(q_full, W2_Q_BYTES);
            tma_tile<W2_BLOCK_M>(q_s, tq, m0, bh, q_full);
            for (int j = 0; j < n_tiles; ++j) {
                const int s = j % W2_STAGES;
                // the stage's previous tile (j - W2_STAGES) must be released by every consumer warp
                if (j >= W2_STAGES) mbar_wait(W2_KV_EMPTY(s), ((j / W2_STAGES) - 1) & 1);
                mbar_arrive_expect_tx(W2_K_FULL(s), W2_KV_BYTES);
                tma_tile<W2_BLOCK_N>(k_s + s * W2_KV_BYTES, tk, j * W2_BLOCK_N, kv_head, W2_K_FULL(s));
                mbar_arrive_expect_tx(W2_V_FULL(s), W2_KV_BYTES);
                tma_tile<W2_BLOCK_N>(v_s + s * W2_KV_BYTES, tv, j * W2_BLOCK_N, kv_head, W2_V_FULL(s));
            }
        }
        return;
    }
    setmaxnreg_inc<W2_CONSUMER_REGS>();

    const ft_consumer me = tma_consumer(wg, m0, q_s);
    const int lane = me.lane, t = me.t, wg_row0 = me.wg_row0, warp_row0 = me.warp_row0, r0 = me.r0;
    const unsigned q_addr = me.q_addr;

    float acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) acc[i] = 0.f;
    float m[2] = {FT_NEG_INF, FT_NEG_INF}, l[2] = {0.f, 0.f};
    mbar_wait(q_full, 0);

    for (int j = 0; j < n_tiles; ++j) {
        const int s = j % W2_STAGES;
        const unsigned parity = (j / W2_STAGES) & 1;
        const int n0 = j * W2_BLOCK_N;
        const unsigned k_addr = k_s + s * W2_KV_BYTES, v_addr = v_s + s * W2_KV_BYTES;
        mbar_wait(W2_K_FULL(s), parity);
        // a warpgroup with no row that sees this tile still waits for it and releases it: the producer
        // counts every consumer warp once per tile, and waiting keeps each warp's arrivals in tile order
        if (wg_row0 >= Nq || (causal && n0 > wg_row0 + 63 + diag_offset)) {
            mbar_wait(W2_V_FULL(s), parity);
            if (lane == 0) mbar_arrive(W2_KV_EMPTY(s));
            continue;
        }

        float sc[W2_BLOCK_N / 2];
        wgmma_fence();
        wg_qk<W2_BLOCK_N>(sc, q_addr, k_addr);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands<W2_BLOCK_N / 2>(sc);

        wg_mask<W2_BLOCK_N>(sc, n0, Nk, causal, diag_offset, warp_row0, r0, t);

        ft_raw2 pf[W2_BLOCK_N / 4];
        wg_softmax<W2_BLOCK_N>(sc, m, l, acc, scale_log2, pf);

        mbar_wait(W2_V_FULL(s), parity);
        wgmma_fence();
        wg_pv<W2_BLOCK_N>(acc, pf, v_addr);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands<HEAD_DIM / 2>(acc);
        warp_release(W2_KV_EMPTY(s), lane);  // this warp's wgmma have read stage s
    }

    wg_store(acc, m, l, o, lse, bh, Nq, Nq, r0, t, scale_log2);
#undef W2_K_FULL
#undef W2_V_FULL
#undef W2_KV_EMPTY
#else
    __trap();  // built for a target without TMA and wgmma; flashtut.cuda.hopper launches it on sm_90a only
#endif
}
