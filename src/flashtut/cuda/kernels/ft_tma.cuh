// ft_tma.cuh: what the TMA rungs of the Hopper ladder share (fwd_w2_tma.cu, fwd_w3_pingpong.cu, sm_90a).
//
// Both rungs are three warpgroups: a producer that issues every load as a TMA copy into shared memory,
// and two consumers of 64 query rows each that read the tiles with wgmma. They differ in how the
// consumers order their work (W3 pipelines and ping-pongs it), not in these pieces:
//  * mbarriers: a 64-bit object in shared memory whose phase completes when the expected arrivals (and,
//    with expect_tx, the announced bytes of the TMA copies) are in; a waiter names the parity of the
//    phase it waits for, and try_wait.parity succeeds once that phase has completed (the barrier's
//    current phase parity differs from it), so a barrier reused round a ring alternates 0, 1, 0 ...;
//  * the TMA copy of one 64-column box of a 3-D tensor map, and of a tile as HEAD_DIM / 64 boxes;
//  * the register hand-over (setmaxnreg) between producer and consumers;
//  * the two products on the tiles as the TMA unit writes them (Q of 128 rows, K and V of BN rows,
//    [HEAD_DIM / 64][rows][64] with the 128-byte swizzle).
#pragma once
#include "ft_wgmma_softmax.cuh"

#ifndef FT_TMA_BLOCK_M
#define FT_TMA_BLOCK_M 128   // query rows per block: two consumer warpgroups of 64 (W3 may take three)
#endif

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#if FT_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
#if FT_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#if FT_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#if FT_SM90A
    unsigned done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
#endif
}

// The initialised barriers, visible to the TMA unit (the async proxy) and to the other threads: the
// thread that ran mbar_init calls this before the block-wide barrier that publishes them.
__device__ __forceinline__ void mbar_init_fence() {
#if FT_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    fence_proxy_async_smem();
#endif
}

// One warp's arrival on a consumer-release barrier (its count is one per consumer warp): the wgmma
// wait before it is warp-collective, the __syncwarp makes every lane's wait precede lane 0's arrival.
__device__ __forceinline__ void warp_release(unsigned bar, int lane) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}

// one box (64 columns x rows x 1 head) of a 3-D tensor map into shared memory at dst; its bytes count
// towards bar's transaction total
__device__ __forceinline__ void tma_load_3d(unsigned dst, const void* tmap, int col, int row, int head, unsigned bar) {
#if FT_SM90A
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(dst), "l"(tmap), "r"(col), "r"(row), "r"(head), "r"(bar) : "memory");
#endif
}

// a ROWS x HEAD_DIM tile: HEAD_DIM / 64 boxes, one per 64-column block (the [cols / 64][ROWS][64] layout)
template <int ROWS>
__device__ __forceinline__ void tma_tile(unsigned dst, const void* tmap, int row0, int head, unsigned bar) {
#pragma unroll
    for (int cb = 0; cb < HEAD_DIM / 64; ++cb) tma_load_3d(dst + cb * ROWS * 128, tmap, cb * 64, row0, head, bar);
}

// setmaxnreg: a warpgroup gives back registers (dec) or takes them (inc) from the block's pool; the
// count is an immediate, so these are templates
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
#if FT_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
#if FT_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS));
#endif
}

// The start of the dynamic shared memory rounded up to 1024 bytes, where the 128-byte swizzle's
// pattern starts (the launch asks for 1024 bytes of slack).
__device__ __forceinline__ unsigned char* smem_align1024(unsigned char* raw) {
    return raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
}

// Query block mb's rows and the key tiles any of them may see: causal blocks skip the tiles right of the
// block's diagonal. Blocks start at row mb * BM, the last one short of rows when BM does not divide Nq;
// with FT_TAIL_FIRST and a causal mask the short one is the first (rows 0 .. m_end - 1) and the others end
// at Nq - k BM, so that the block with fewer rows is the one that reads a single key tile, not the one that
// reads them all. Without a mask every block reads every tile, and where the short one sits changes nothing.
#ifndef FT_TAIL_FIRST
#define FT_TAIL_FIRST 0
#endif
struct ft_tma_block {
    int m0;        // first query row
    int n_tiles;   // key tiles of BN keys that some row of the block sees
};
template <int BN>
__device__ __forceinline__ ft_tma_block tma_block_at(int mb, int n_mb, int Nq, int Nk, int causal, int diag_offset) {
    int m0 = mb * FT_TMA_BLOCK_M, m_end = min(m0 + FT_TMA_BLOCK_M, Nq);
#if FT_TAIL_FIRST
    if (causal) {
        m_end = Nq - (n_mb - 1 - mb) * FT_TMA_BLOCK_M;   // n_mb: the query blocks, ceil(Nq / BM)
        m0 = max(0, m_end - FT_TMA_BLOCK_M);
    }
#else
    (void)n_mb;
#endif
    int n_end = Nk;
    if (causal) n_end = min(Nk, max(0, m_end + diag_offset));
    return {m0, (n_end + BN - 1) / BN};
}
// One past the last row that the block starting at row m0 writes: Nq (a block's rows past Nq are no one's),
// but with FT_TAIL_FIRST and a causal mask the first block's end, where the second's rows start. Worked out
// from m0 and the kernel's parameters where it is needed rather than kept in a register across the
// consumer's loop: W4's three consumers, at 160 registers, spill when they keep it.
__device__ __forceinline__ int tma_row_end(int m0, int Nq, int causal) {
#if FT_TAIL_FIRST
    return causal && m0 == 0 ? (Nq - 1) % FT_TMA_BLOCK_M + 1 : Nq;
#else
    (void)m0;
    (void)causal;
    return Nq;
#endif
}
// The query block of a grid with one block per query block (gridDim.x of them): causal grids run the
// heaviest (last) query block first so that it does not finish last.
template <int BN>
__device__ __forceinline__ ft_tma_block tma_block(int Nq, int Nk, int causal, int diag_offset) {
    const int mb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    return tma_block_at<BN>(mb, gridDim.x, Nq, Nk, causal, diag_offset);
}

// A consumer thread's place: consumer warpgroup cw = wg - 1 (0 or 1: warpgroups 1 and 2) owns rows
// wg_row0 .. wg_row0 + 63, its warp 16 of them from warp_row0, the thread rows r0 and r0 + 8 (the
// accumulator layout of ft_wgmma.cuh); q_addr: the warpgroup's 64 rows of the Q tile.
struct ft_consumer {
    int cw, lane, t, wg_row0, warp_row0, r0;
    unsigned q_addr;
};
__device__ __forceinline__ ft_consumer tma_consumer(int wg, int m0, unsigned q_s) {
    ft_consumer c;
    c.cw = wg - 1;
    const int warp = (threadIdx.x % 128) / 32;
    c.lane = threadIdx.x % 32;
    c.t = c.lane % 4;
    c.wg_row0 = m0 + c.cw * 64;
    c.warp_row0 = c.wg_row0 + warp * 16;
    c.r0 = c.warp_row0 + c.lane / 4;
    c.q_addr = q_s + c.cw * 64 * 128;
    return c;
}

// S (64 x BN) = Q K^T issued as HEAD_DIM / 16 wgmma of k = 16, both operands from shared memory: step ks
// reads columns 16 ks.. of this warpgroup's 64 rows of Q (at q_addr) and of the BN rows of K, 64-column
// block ks / 4, 32 bytes further along the swizzled rows per step (SBO 1024: the next 8-row group). Not
// committed: the caller commits, so that it decides which products form one wgmma group.
#ifndef FT_DESC_STEP
#define FT_DESC_STEP 0   // 1 (the Hopper backward): each tile's descriptor built once and stepped
#endif
template <int BN>
__device__ __forceinline__ void wg_qk(float* sc, unsigned q_addr, unsigned k_addr) {
#if FT_DESC_STEP
    const unsigned long long qd = wgmma_desc(q_addr, 16, 1024), kd = wgmma_desc(k_addr, 16, 1024);
#endif
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
        const unsigned a = (ks / 4) * (FT_TMA_BLOCK_M * 128) + (ks % 4) * 32;
        const unsigned b = (ks / 4) * (BN * 128) + (ks % 4) * 32;
#if FT_DESC_STEP
        wgmma_ss<BN>(sc, wgmma_desc_step(qd, a), wgmma_desc_step(kd, b), ks > 0);
#else
        wgmma_ss<BN>(sc, wgmma_desc(q_addr + a, 16, 1024), wgmma_desc(k_addr + b, 16, 1024), ks > 0);
#endif
    }
}

// O += P V issued as BN / 16 k-steps, each HEAD_DIM / 64 wgmma of 64 output columns: P from registers
// (pf, the layout wg_softmax packs), V N-major from its tile (8-key groups 1024 bytes apart). Not committed.
template <int BN>
__device__ __forceinline__ void wg_pv(float* acc, const ft_raw2* pf, unsigned v_addr) {
#if FT_DESC_STEP
    const unsigned long long vd = wgmma_desc(v_addr, 1024, 1024);
#endif
#pragma unroll
    for (int kp = 0; kp < BN / 16; ++kp) {
        const ft_raw2 a[4] = {pf[4 * kp], pf[4 * kp + 1], pf[4 * kp + 2], pf[4 * kp + 3]};
#pragma unroll
        for (int cb = 0; cb < HEAD_DIM / 64; ++cb) {
            const unsigned off = kp * 16 * 128 + cb * BN * 128;
#if FT_DESC_STEP
            wgmma_rs_nmajor<64>(acc + 32 * cb, a, wgmma_desc_step(vd, off));
#else
            wgmma_rs_nmajor<64>(acc + 32 * cb, a, wgmma_desc(v_addr + off, 1024, 1024));
#endif
        }
    }
}
