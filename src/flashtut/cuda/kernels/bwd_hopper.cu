// bwd_hopper.cu: the attention backward on Hopper with warpgroup MMA (wgmma, sm_90a), rungs B1 to B4.
//
// One block per (key block of 128 keys, K/V head, batch); it keeps dK and dV of its keys in registers and
// walks the query blocks of BWDH_BLOCK_M rows of every query head of its group. Two consumer warpgroups
// own 64 keys each (the M of every wgmma but dQ's), and per query block each computes, transposed so that
// its keys are the rows:
//   S^T  = K_w Q^T          64 x BM   A: K (shared, K-major)      B: Q (shared, K-major)
//   dP^T = V_w dO^T         64 x BM   A: V (shared, K-major)      B: dO (shared, K-major)
//   P^T  = 2^(S^T scale log2 e - lse2[query]),  dS^T = P^T (dP^T - Delta[query])   (registers)
//   dV  += P^T dO           64 x D    A: P^T (registers)          B: dO (shared, MN-major: trans-b)
//   dK  += dS^T Q           64 x D    A: dS^T (registers)         B: Q (shared, MN-major: trans-b)
//   dQ   = dS K             64 x 64   A: dS (shared, MN-major: trans-a)  B: K (shared, MN-major: trans-b)
// The accumulator of S^T (and dP^T) is, pair by pair, the A-from-registers fragment of the next product
// (ft_wgmma.cuh), so P^T and dS^T feed dV and dK with no transpose and no trip through shared memory; Q and
// dO, stored query by query, are read as K-major B operands for S^T and dP^T and as MN-major B operands
// (the transpose bit of the instruction) for dV and dK. Only dQ needs dS with the queries as rows: each
// warpgroup writes its dS^T (16-bit) into a shared tile [BM / 64][128 keys][64 queries] with the 128-byte
// swizzle, which is the MN-major layout of an A operand, and after a barrier between the two consumers
// each computes 64 x 64 of this query block's dQ over all 128 keys (BM = 64: its half of the head dim;
// BM = 128: its 64 query rows) and adds it with 8-byte float32 reductions (red.global.add.v2.f32) into a
// zeroed buffer that bwd_dq_convert.cu scales and converts.
// lse2 (= lse log2 e, +inf for rows that see no key or lie past Nq) and Delta (= rowsum(dO O)) come from
// bwdh_preprocess below, one row of Nq_pad (a multiple of BWDH_BLOCK_M) per query head, so a query block's
// values are one aligned 16-byte-multiple run.
//
// B1 (BWDH_TMA = 0): 256 threads, both consumers also load; Q, dO, lse2, Delta of the next query block go to
//   a second stage by cp.async while this one computes; one __syncthreads per query block.
// B2 (BWDH_TMA = 1): 384 threads, warpgroup 0 the producer (one thread issues TMA copies of Q and dO and bulk
//   copies of lse2 and Delta into a ring of BWDH_STAGES stages guarded by mbarriers, K and V once), the
//   consumers do arithmetic only and meet at one named barrier per query block (dS^T of both written);
//   setmaxnreg hands the producer's registers to the consumers. dS^T is double-buffered, so the barrier of
//   the next query block also says that both warpgroups are done reading this one's.
// Masks (only on tiles that need them): query i sees key j iff j <= i + diag_offset (causal) and
// j > i + diag_offset - window (window > 0), j < Nk and i < Nq. Query blocks no key of the block sees are
// skipped. Grouped-query heads: the block loops over the kv_group query heads of its K/V head, so dK and dV
// of the group are summed in its registers.
#include "ft_tma.cuh"

#ifndef BWDH_TMA
#define BWDH_TMA 0        // 0: rung B1 (cp.async, no producer); 1: rung B2 (TMA producer, mbarrier ring)
#endif
#ifndef BWDH_BLOCK_M
#define BWDH_BLOCK_M (HEAD_DIM == 64 ? 128 : 64)   // queries per step: 64 x 64 of dQ per consumer
#endif
#ifndef BWDH_STAGES
#define BWDH_STAGES 2     // Q / dO stages (B1: always 2)
#endif
#ifndef BWDH_DQ
#define BWDH_DQ 1         // 0: dK and dV only (the deterministic mode takes dQ from a separate pass)
#endif
#ifndef BWDH_DQ_FIRST
#define BWDH_DQ_FIRST 0   // 1 (B4): the dQ product issued before dV and dK, its store overlapping them
#endif
#ifndef BWDH_DQ_TMA
#define BWDH_DQ_TMA 0     // 1 (B3, with BWDH_TMA): dQ tiles staged in shared memory and added by TMA reduce-add
#endif
#define BWDH_BLOCK_N 128  // keys per block: two consumer warpgroups of 64
#define BWDH_CONSUMERS 256
#define BWDH_THREADS (BWDH_CONSUMERS + 128 * BWDH_TMA)
#define BWDH_PRODUCER_REGS 24
#define BWDH_CONSUMER_REGS 240
#define BWDH_TILE_M (BWDH_BLOCK_M * HEAD_DIM * 2)     // bytes of a Q or dO tile
#define BWDH_TILE_N (BWDH_BLOCK_N * HEAD_DIM * 2)     // bytes of a K or V tile
#define BWDH_DS_BYTES (BWDH_BLOCK_N * BWDH_BLOCK_M * 2)
#define BWDH_STAGE_BYTES (2 * BWDH_TILE_M + 2 * BWDH_BLOCK_M * 4)   // Q, dO, lse2, Delta
#define BWDH_NSTAGE (BWDH_TMA ? BWDH_STAGES : 2)
// dynamic shared memory: K, V, the stages, two dS^T tiles, mbarriers; + 1024 for the alignment
#define BWDH_DQ_STAGE_BYTES (BWDH_DQ_TMA ? 2 * 64 * 64 * 4 : 0)   // B3: each consumer's 64 x 64 float32 dQ tile
#define BWDH_SMEM (2 * BWDH_TILE_N + BWDH_NSTAGE * BWDH_STAGE_BYTES + 2 * BWDH_DS_BYTES + BWDH_DQ_STAGE_BYTES \
                   + 8 * (1 + 2 * BWDH_NSTAGE) + 1024)

#if BWDH_BLOCK_M * HEAD_DIM != 8192
#error "the dQ product is 64 x 64 per consumer: BWDH_BLOCK_M * HEAD_DIM must be 8192 (D 64: BM 128, D 128: BM 64)"
#endif

// dQ (64 x 64, float32) = A (64 x 16 per step, shared, MN-major) * B (16 x 64, shared, MN-major).
__device__ __forceinline__ void bwdh_wgmma_tt(float* d, unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
#if FT_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FT_WGMMA_AB " " FT_REGS32 ", %32, %33, p, 1, 1, 1, 1;\n}\n"
        : FT_ACC32(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}

// p[0], p[1] += v0, v1 in global memory: one 8-byte reduction performed in L2
__device__ __forceinline__ void bwdh_red_add2(float* p, float v0, float v1) {
#if FT_SM90A
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(v0), "f"(v1) : "memory");
#endif
}

// bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared memory, counted on bar
__device__ __forceinline__ void bwdh_bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
#if FT_SM90A
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

#if BWDH_DQ_TMA && (!BWDH_TMA || !BWDH_DQ)
#error "BWDH_DQ_TMA needs the producer (BWDH_TMA) and dQ (BWDH_DQ)"
#endif

// shared-memory accesses by 32-bit shared addresses (a generic pointer takes two registers, and the consumers
// are short of registers)
__device__ __forceinline__ float2 bwdh_ld_f2(unsigned addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}
__device__ __forceinline__ void bwdh_st_b32(unsigned addr, unsigned v) {
    asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void bwdh_st_f2(unsigned addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(addr), "f"(x), "f"(y) : "memory");
}

// named barrier 1 over the two consumer warpgroups (B2: the producer never joins it)
__device__ __forceinline__ void bwdh_consumer_sync() {
#if BWDH_TMA
    asm volatile("bar.sync 1, %0;" :: "n"(BWDH_CONSUMERS) : "memory");
#else
    __syncthreads();
#endif
}

// B1: rows [r0, r0 + ROWS) of an (N, HEAD_DIM) matrix into a 128-byte-swizzled tile by the 256 consumer
// threads, consecutive threads on consecutive 16-byte chunks; rows >= N become zeros
template <int ROWS>
__device__ __forceinline__ void bwdh_load(unsigned tile, const ft_raw* src, int r0, int N) {
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * (HEAD_DIM / 8); i += BWDH_CONSUMERS) {
        const int r = i / (HEAD_DIM / 8), c = (i % (HEAD_DIM / 8)) * 8;
        const bool ok = r0 + r < N;
        const ft_raw* g = src + (size_t)(ok ? r0 + r : 0) * HEAD_DIM + c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     :: "r"(tile + sw128_offset<ROWS>(r, c)), "l"(g), "r"(ok ? 16 : 0));
    }
}

// Delta = rowsum(dO * O) and lse2 = lse log2 e for every query row, one warp per row, written to rows of
// Nq_pad per head; the padding rows (and rows whose lse is -inf: no key seen) get lse2 = +inf, so every P
// recomputed for them is 2^-inf = 0, and Delta = 0. Launched over B * H * Nq_pad rows.
extern "C" __global__ void __launch_bounds__(128)
bwdh_preprocess(const ft_raw* __restrict__ o, const ft_raw* __restrict__ dout, const float* __restrict__ lse,
                float* __restrict__ delta, float* __restrict__ lse2, int Nq, int Nq_pad, int rows_pad) {
    const int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows_pad) return;
    const int bh = row / Nq_pad, i = row % Nq_pad;
    float acc = 0.f, l2 = -FT_NEG_INF;
    if (i < Nq) {
        const size_t src = (size_t)bh * Nq + i;
        const unsigned* o2 = reinterpret_cast<const unsigned*>(o + src * HEAD_DIM);
        const unsigned* d2 = reinterpret_cast<const unsigned*>(dout + src * HEAD_DIM);
        for (int c = lane; c < HEAD_DIM / 2; c += 32) {
            const unsigned a = o2[c], b = d2[c];
            acc += ft_lo(a) * ft_lo(b) + ft_hi(a) * ft_hi(b);
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        const float x = lse[src];
        if (x != FT_NEG_INF) l2 = x * FT_LOG2E;
    }
    if (lane == 0) {
        delta[row] = acc;
        lse2[row] = l2;
    }
}

// grid (ceil(Nk / 128), B * Hkv), BWDH_THREADS threads, BWDH_SMEM bytes of dynamic shared memory.
// B1 reads q, k, v, dout; B2 reads them through tmaps (Q, K, V, dO tensor maps, 128 bytes each).
// lse2, delta: (B * H, Nq_pad) from bwdh_preprocess; dq_acc: (B, H, Nq, D) float32, zeroed, unscaled dQ;
// dk, dv: (B, Hkv, Nk, D) in the input type.
extern "C" __global__ void __launch_bounds__(BWDH_THREADS, 1)
bwd_hopper(const unsigned char* __restrict__ tmaps, const ft_raw* __restrict__ q, const ft_raw* __restrict__ k,
           const ft_raw* __restrict__ v, const ft_raw* __restrict__ dout, const float* __restrict__ lse2,
           const float* __restrict__ delta, float* __restrict__ dq_acc, ft_raw* __restrict__ dk,
           ft_raw* __restrict__ dv, int Nq, int Nq_pad, int Nk, float scale, float scale_log2, int causal,
           int kv_group, int diag_offset, int window) {
#if FT_SM90A
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned k_s = smem_addr(smem_align1024(smem_raw));  // [HEAD_DIM / 64][128][64], swizzled
    const unsigned v_s = k_s + BWDH_TILE_N;
    const unsigned st_s = v_s + BWDH_TILE_N;                    // stages: Q, dO tiles
    const unsigned ds_s = st_s + BWDH_NSTAGE * 2 * BWDH_TILE_M;  // [2][BM / 64][128][64]
    const unsigned dqs_s = ds_s + 2 * BWDH_DS_BYTES;            // B3: [2 consumers][2][64][32] float32, swizzled
    const unsigned ld_s = dqs_s + BWDH_DQ_STAGE_BYTES;          // stages: lse2, Delta (BM floats each)
    const unsigned bars = ld_s + BWDH_NSTAGE * BWDH_BLOCK_M * 8;  // kv_full, full[S], empty[S]
    (void)bars;
    // every tile starts on a 1024-byte boundary (the 128-byte swizzle's period): K, V, Q and dO tiles are
    // multiples of 8 KB, the dS^T tiles of 16 KB; the float vectors come after them
#define BWDH_Q(s) (st_s + (s) * 2 * BWDH_TILE_M)
#define BWDH_DO(s) (BWDH_Q(s) + BWDH_TILE_M)
#define BWDH_L(s) (ld_s + (s) * BWDH_BLOCK_M * 8)
#define BWDH_D(s) (BWDH_L(s) + BWDH_BLOCK_M * 4)
#define BWDH_FULL(s) (bars + 8u * (1 + (s)))
#define BWDH_EMPTY(s) (bars + 8u * (1 + BWDH_NSTAGE + (s)))

    const int n0 = blockIdx.x * BWDH_BLOCK_N;
    const int bhk = blockIdx.y;  // K/V head b * Hkv + hk; its query heads are bhk * kv_group + g
    // the query rows some key of this block sees: causal from n0 - diag_offset, a window up to
    // (last key) - diag_offset + window - 1
    int i_lo = causal ? max(0, n0 - diag_offset) : 0;
    int i_hi = Nq;
    if (causal && window > 0) i_hi = min(Nq, min(n0 + BWDH_BLOCK_N, Nk) - 1 - diag_offset + window);
    const int mb_lo = i_lo / BWDH_BLOCK_M;
    const int n_mb = i_hi > i_lo ? (i_hi + BWDH_BLOCK_M - 1) / BWDH_BLOCK_M - mb_lo : 0;
    const int n_steps = n_mb * kv_group;   // step it: query head bhk * kv_group + it / n_mb, block mb_lo + it % n_mb

#if BWDH_TMA
    if (threadIdx.x == 0) {
        mbar_init(bars, 1);
        for (int s = 0; s < BWDH_NSTAGE; ++s) {
            mbar_init(BWDH_FULL(s), 1);
            mbar_init(BWDH_EMPTY(s), 8);   // every consumer warp once
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        setmaxnreg_dec<BWDH_PRODUCER_REGS>();
        if (threadIdx.x == 0 && n_steps > 0) {
            const void* tq = tmaps;
            const void* tk = tmaps + 128;
            const void* tv = tmaps + 256;
            const void* tdo = tmaps + 384;
            mbar_arrive_expect_tx(bars, 2 * BWDH_TILE_N);
            tma_tile<BWDH_BLOCK_N>(k_s, tk, n0, bhk, bars);
            tma_tile<BWDH_BLOCK_N>(v_s, tv, n0, bhk, bars);
            for (int it = 0; it < n_steps; ++it) {
                const int s = it % BWDH_NSTAGE;
                const int bh = bhk * kv_group + it / n_mb, m0 = (mb_lo + it % n_mb) * BWDH_BLOCK_M;
                if (it >= BWDH_NSTAGE) mbar_wait(BWDH_EMPTY(s), ((it / BWDH_NSTAGE) - 1) & 1);
                mbar_arrive_expect_tx(BWDH_FULL(s), BWDH_STAGE_BYTES);
                tma_tile<BWDH_BLOCK_M>(BWDH_Q(s), tq, m0, bh, BWDH_FULL(s));
                tma_tile<BWDH_BLOCK_M>(BWDH_DO(s), tdo, m0, bh, BWDH_FULL(s));
                const size_t row = (size_t)bh * Nq_pad + m0;
                bwdh_bulk_load(BWDH_L(s), lse2 + row, BWDH_BLOCK_M * 4, BWDH_FULL(s));
                bwdh_bulk_load(BWDH_D(s), delta + row, BWDH_BLOCK_M * 4, BWDH_FULL(s));
            }
        }
        return;
    }
    setmaxnreg_inc<BWDH_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;   // consumer thread 0..255
#else
    const int ct = threadIdx.x;
    const ft_raw* kb = k + (size_t)bhk * Nk * HEAD_DIM;
    const ft_raw* vb = v + (size_t)bhk * Nk * HEAD_DIM;
    // B1's loads of step it into stage it % 2 (one cp.async group with K and V for the first)
    auto load_step = [&](int it) {
        const int s = it & 1;
        const int bh = bhk * kv_group + it / n_mb, m0 = (mb_lo + it % n_mb) * BWDH_BLOCK_M;
        bwdh_load<BWDH_BLOCK_M>(BWDH_Q(s), q + (size_t)bh * Nq * HEAD_DIM, m0, Nq);
        bwdh_load<BWDH_BLOCK_M>(BWDH_DO(s), dout + (size_t)bh * Nq * HEAD_DIM, m0, Nq);
        const size_t row = (size_t)bh * Nq_pad + m0;
        for (int c = ct; c < BWDH_BLOCK_M / 2; c += BWDH_CONSUMERS) {   // 16 bytes each, lse2 then Delta
            const float* src = c < BWDH_BLOCK_M / 4 ? lse2 + row + 4 * c : delta + row + 4 * (c - BWDH_BLOCK_M / 4);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(BWDH_L(s) + 16 * c), "l"(src));
        }
    };
    if (n_steps > 0) {   // a block with no query to visit only writes zeros
        bwdh_load<BWDH_BLOCK_N>(k_s, kb, n0, Nk);
        bwdh_load<BWDH_BLOCK_N>(v_s, vb, n0, Nk);
        load_step(0);
        cp_async_commit();
    }
#endif

    const int wg = ct / 128, warp = (ct % 128) / 32, lane = ct % 32, g = lane / 4, t = lane % 4;
    const int key0 = n0 + 64 * wg + 16 * warp + g;   // this thread's keys: key0 and key0 + 8
    const unsigned kw = k_s + wg * 64 * 128, vw = v_s + wg * 64 * 128;   // this warpgroup's 64 keys
    // dQ of a step: this warpgroup's 64 x 64, query rows 64 * qb.. and head-dim columns 64 * cb..
    const int qb = BWDH_BLOCK_M == 128 ? wg : 0, cb = BWDH_BLOCK_M == 128 ? 0 : wg;

    float dv_acc[HEAD_DIM / 2], dk_acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) dv_acc[i] = dk_acc[i] = 0.f;

#if BWDH_TMA
    if (n_steps > 0) mbar_wait(bars, 0);
#endif
    for (int it = 0; it < n_steps; ++it) {
        const int s = it % BWDH_NSTAGE;
        const int bh = bhk * kv_group + it / n_mb, m0 = (mb_lo + it % n_mb) * BWDH_BLOCK_M;
#if BWDH_TMA
        mbar_wait(BWDH_FULL(s), (it / BWDH_NSTAGE) & 1);
#else
        cp_async_wait<0>();
        fence_proxy_async_smem();   // this thread's cp.async writes, visible to the tensor cores
        __syncthreads();            // step it has landed; both warpgroups are done with step it - 1
        if (it + 1 < n_steps) {
            load_step(it + 1);
            cp_async_commit();
        }
#endif
        const unsigned q_addr = BWDH_Q(s), do_addr = BWDH_DO(s);
        const unsigned lse_s = BWDH_L(s) + 8 * t, del_s = BWDH_D(s) + 8 * t;   // this thread's columns 2t, 2t + 1

        // S^T = K_w Q^T and dP^T = V_w dO^T: two wgmma groups, the second running during P's exponentials
        float sc[BWDH_BLOCK_M / 2], dp[BWDH_BLOCK_M / 2];
        wgmma_fence();
        wg_qk<BWDH_BLOCK_M>(sc, kw, q_addr);
        wgmma_commit();
        wg_qk<BWDH_BLOCK_M>(dp, vw, do_addr);
        wgmma_commit();
        wgmma_wait<1>();
        wgmma_fence_operands<BWDH_BLOCK_M / 2>(sc);

        // the mask, where some element of the tile may be hidden (sc[i]: key key0 + 8 ((i / 2) % 2),
        // query m0 + 8 (i / 4) + 2t + i % 2)
        const bool edge = m0 + BWDH_BLOCK_M > Nq || n0 + BWDH_BLOCK_N > Nk ||
                          (causal && n0 + BWDH_BLOCK_N - 1 > m0 + diag_offset) ||
                          (causal && window > 0 && n0 <= m0 + BWDH_BLOCK_M - 1 + diag_offset - window);
        if (edge) {
#pragma unroll
            for (int i = 0; i < BWDH_BLOCK_M / 2; ++i) {
                const int j = key0 + 8 * ((i / 2) % 2), qi = m0 + 8 * (i / 4) + 2 * t + i % 2;
                if (j >= Nk || qi >= Nq || (causal && (j > qi + diag_offset ||
                                                       (window > 0 && j <= qi + diag_offset - window))))
                    sc[i] = FT_NEG_INF;
            }
        }
        // P^T in place of S^T while dP^T is still on the tensor cores
#pragma unroll
        for (int i = 0; i < BWDH_BLOCK_M / 2; i += 2) {
            const float2 l2 = bwdh_ld_f2(lse_s + 32 * (i / 4));
            sc[i] = ft_exp2(fmaf(sc[i], scale_log2, -l2.x));
            sc[i + 1] = ft_exp2(fmaf(sc[i + 1], scale_log2, -l2.y));
        }

        // P^T and dS^T packed into A fragments in one pass, so that the float tiles die as the packed ones
        // grow (at D = 64 both float tiles are 64 registers a thread); dS^T also into the dQ tile
        wgmma_wait<0>();
        wgmma_fence_operands<BWDH_BLOCK_M / 2>(dp);
        ft_raw2 pf[BWDH_BLOCK_M / 4], dsf[BWDH_BLOCK_M / 4];
#if BWDH_DQ
        // dS^T goes into the MN-major A tile of dQ: element (key row r = 64 wg + 16 warp + g + 8 h, query
        // column 8 c8 + 2t) at sw128_offset(r, 8 c8 + 2t) = row part + 16 ((c8 ^ g) % 8) + 4t + 16384 (c8 / 8).
        // Since r % 8 = g, that is xrow ^ 16 (c8 % 8) plus constants, xrow holding g in bits 4-6. xrow comes
        // out of an asm statement inside the loop so that the compiler cannot hoist the 32 store addresses out
        // of the loop into 32 registers (it did, and spilled at D = 64).
        unsigned xrow;
        asm volatile("mov.b32 %0, %1;" : "=r"(xrow) : "r"((unsigned)((64 * wg + 16 * warp + g) * 128 + (g << 4) + 4 * t)));
        const unsigned ds_w = ds_s + (it & 1) * BWDH_DS_BYTES;
#endif
#pragma unroll
        for (int i = 0; i < BWDH_BLOCK_M / 2; i += 2) {
            const float2 dl = bwdh_ld_f2(del_s + 32 * (i / 4));
            pf[i / 2] = ft_pack2(sc[i], sc[i + 1]);
            dsf[i / 2] = ft_pack2(sc[i] * (dp[i] - dl.x), sc[i + 1] * (dp[i + 1] - dl.y));
#if BWDH_DQ
            const unsigned off = ((xrow + 1024u * ((i / 2) % 2) + (i / 32) * (BWDH_BLOCK_N * 128)) ^ (((i / 4) % 8) << 4));
            bwdh_st_b32(ds_w + off, dsf[i / 2]);
#endif
        }

        // dV += P^T dO and dK += dS^T Q (A from registers, B MN-major from the stage), and dQ = dS K once both
        // consumers' dS^T are in shared memory. B4 (BWDH_DQ_FIRST) issues dQ first, so that its store to the
        // float32 buffer runs while the tensor cores do dV and dK.
#if BWDH_DQ
        // dQ of this step from registers into the float32 buffer
        auto store_dq = [&](const float* dq) {
#if BWDH_DQ_TMA
            // the tile into this consumer's staging buffer, [2 halves of 32 columns][64 rows][32 floats] with the
            // 128-byte swizzle (16-byte chunk k of row r at k ^ (r % 8)): dq[i] is row 16 warp + g + 8 ((i / 2) % 2),
            // column 8 (i / 4) + 2t + i % 2, chunk (2 ((i / 4) % 4) + t / 2) ^ g of its half. As for dS^T, one
            // register from an asm statement holds the part that depends on the thread, XORed with constants.
            unsigned xq;
            asm volatile("mov.b32 %0, %1;" : "=r"(xq) : "r"((unsigned)((16 * warp + g) * 128 + (((t / 2) ^ g) << 4) + 8 * (t % 2))));
            const unsigned dq_w = dqs_s + wg * (64 * 64 * 4);
#pragma unroll
            for (int i = 0; i < 32; i += 2) {
                const unsigned off = ((xq + 1024u * ((i / 2) % 2) + (i / 16) * 8192u) ^ ((2 * ((i / 4) % 4)) << 4));
                bwdh_st_f2(dq_w + off, dq[i], dq[i + 1]);
            }
            fence_proxy_async_smem();   // the stores, visible to the TMA unit
            if (wg == 0)                // this consumer's tile is complete (named barriers 2 and 3, 128 threads)
                asm volatile("bar.sync 2, 128;" ::: "memory");
            else
                asm volatile("bar.sync 3, 128;" ::: "memory");
            if (ct % 128 == 0) {
                const void* tdq = tmaps + 512;
                const unsigned src = dqs_s + wg * (64 * 64 * 4);
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];"
                                 :: "l"(tdq), "r"(64 * cb + 32 * h), "r"(m0 + 64 * qb), "r"(bh), "r"(src + h * 8192) : "memory");
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                // the buffer is written again after the next step's consumer barrier, which this thread reaches
                // only once the copy engine has read it
                asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            }
#else
            // dq[i]: query row m0 + 64 qb + 16 warp + g + 8 ((i / 2) % 2), column 64 cb + 8 (i / 4) + 2t + i % 2
            float* dqb = dq_acc + (size_t)bh * Nq * HEAD_DIM;
#pragma unroll
            for (int i = 0; i < 32; i += 2) {
                const int row = m0 + 64 * qb + 16 * warp + g + 8 * ((i / 2) % 2);
                if (row < Nq) bwdh_red_add2(dqb + (size_t)row * HEAD_DIM + 64 * cb + 8 * (i / 4) + 2 * t, dq[i], dq[i + 1]);
            }
#endif
        };
        float dq[32];
        auto issue_dq = [&]() {
            fence_proxy_async_smem();   // this thread's dS^T stores, visible to the tensor cores
            bwdh_consumer_sync();       // both warpgroups' dS^T are in
            const unsigned ds_addr = ds_s + (it & 1) * BWDH_DS_BYTES + qb * (BWDH_BLOCK_N * 128);
            const unsigned kq = k_s + cb * (BWDH_BLOCK_N * 128);
            const unsigned long long da = wgmma_desc(ds_addr, 1024, 1024), db = wgmma_desc(kq, 1024, 1024);
            wgmma_fence();
#pragma unroll
            for (int kp = 0; kp < BWDH_BLOCK_N / 16; ++kp)   // 16 keys a step: 2048 bytes down both tiles
                bwdh_wgmma_tt(dq, wgmma_desc_step(da, kp * 2048), wgmma_desc_step(db, kp * 2048), kp > 0);
            wgmma_commit();
        };
#endif
        auto issue_dkdv = [&]() {
            wgmma_fence();
            wg_pv<BWDH_BLOCK_M>(dv_acc, pf, do_addr);
            wg_pv<BWDH_BLOCK_M>(dk_acc, dsf, q_addr);
            wgmma_commit();
        };
        auto release_stage = [&]() {   // dV and dK are done: the stage's Q and dO are read
            wgmma_fence_operands<HEAD_DIM / 2>(dv_acc);
            wgmma_fence_operands<HEAD_DIM / 2>(dk_acc);
            wgmma_fence_operands<BWDH_BLOCK_M / 4>(pf);
            wgmma_fence_operands<BWDH_BLOCK_M / 4>(dsf);
#if BWDH_TMA
            warp_release(BWDH_EMPTY(s), lane);
#endif
        };
#if BWDH_DQ && BWDH_DQ_FIRST
        issue_dq();
        issue_dkdv();
        wgmma_wait<1>();
        wgmma_fence_operands<32>(dq);
        store_dq(dq);
        wgmma_wait<0>();
        release_stage();
#elif BWDH_DQ
        issue_dkdv();
        issue_dq();
        wgmma_wait<1>();
        release_stage();
        wgmma_wait<0>();
        wgmma_fence_operands<32>(dq);
        store_dq(dq);
#else
        issue_dkdv();
        wgmma_wait<0>();
        release_stage();
        (void)bh;
        (void)qb;
        (void)cb;
#endif
    }

    // dK (times the softmax scale) and dV of this thread's keys, in the input type
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; i += 2) {
        const int j = key0 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t;
        if (j < Nk) {
            const size_t off = ((size_t)bhk * Nk + j) * HEAD_DIM + col;
            *reinterpret_cast<ft_raw2*>(dk + off) = ft_pack2(dk_acc[i] * scale, dk_acc[i + 1] * scale);
            *reinterpret_cast<ft_raw2*>(dv + off) = ft_pack2(dv_acc[i], dv_acc[i + 1]);
        }
    }
#undef BWDH_Q
#undef BWDH_DO
#undef BWDH_L
#undef BWDH_D
#undef BWDH_FULL
#undef BWDH_EMPTY
#else
    __trap();  // built for a target without wgmma; flashtut.cuda.hopper_backward launches it on sm_90a only
#endif
}
