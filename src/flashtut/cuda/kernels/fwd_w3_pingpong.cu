// fwd_w3_pingpong.cu: Hopper rung W3, W2 with the softmax overlapped with the tensor cores (sm_90a),
// kernel flash_fwd_w3; with W3_PERSISTENT (fwd_w4_persistent.cu) rung W4, flash_fwd_w4.
//
// What it computes: o = softmax(q k^T * scale) v for one block of W3_BLOCK_M query rows of one head
// (grid: query blocks x B * H), with the row's logsumexp in log2 units (lse), causal or not, for any
// Nq and Nk, grouped heads (kv_group query heads per K/V head) and either causal alignment (diag_offset).
//
// Layout: a producer warpgroup (warpgroup 0; one thread issues the copies) and W3_CONSUMERS consumer
// warpgroups of 64 query rows each. The producer loads Q once and K/V tiles of W3_BLOCK_N keys into a
// ring of W3_STAGES stages in shared memory with TMA (128-byte swizzled, 64-column boxes, ft_tma.cuh);
// each stage has a "full" mbarrier per K and per V (the copy's bytes complete it) and an "empty" one per
// K and per V (every consumer warp arrives once it no longer reads the tile). setmaxnreg gives the
// producer 24 registers a thread and the consumers the rest: 240 with two consumers, 160 with three.
// A consumer thread holds its slice of S_j (W3_BLOCK_N / 2 floats), of P_{j-1} as 16-bit A fragments
// (W3_BLOCK_N / 4 registers) and of O (HEAD_DIM / 2 floats), for its rows r0 and r0 + 8
// (flashtut.cuda.models.hopper_layout models the slices and the register budget).
//
// Schedule (w3_consume, right below the configuration), in two overlaps, FlashAttention-3's:
//  * within a warpgroup: in "slot" j it issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1} (two wgmma
//    groups), waits only for the first (wgmma.wait_group 1), and runs the softmax of S_j while its P V
//    is still on the tensor cores; then it waits for that (wait_group 0), rescales O and packs P_j.
//    Slot 0 issues S_0 alone, slot T (T = its tiles) the last P V alone.
//  * between warpgroups: the consumers take turns to issue their slot's wgmma, ordered by named barriers
//    (W3_BAR_TURN0 + w: "consumer w may issue", 256 threads: its own 128 waiting with bar.sync and the
//    previous consumer's 128 letting it go with bar.arrive). With two consumers this is ping-pong: while
//    one computes its softmax, the other's products run. Three consumers (W3_CONSUMERS = 3, D = 64
//    only, 192-row blocks, 512 threads) issue whenever ready, or with W3_C3_TURNS take turns in a ring
//    0, 1, 2, 0 ... so that their softmaxes are staggered by the order of their products.
// K and V are released separately (K_j once S_j is in registers, V_j a slot later once its P V is
// done), so that a two-stage ring refills K one slot ahead of its use. Causal blocks skip the tiles
// right of the diagonal; a warpgroup with fewer tiles than its block still takes every turn, idle.
// flashtut.cuda.models.hopper_schedule plays this protocol on the CPU for every tile count and skip
// pattern the kernel can meet (no wait on a phase that never completes, no two warpgroups issuing in one
// slot, no arrival counted in the wrong generation of a named barrier).
//
// Build options (what cuda_attention ships, configs.HOPPER_OPTIONS): W3_TMA_STORE, the output through
// the warpgroup's rows of the Q tile and a TMA store (w3_store_tma); FT_TAIL_FIRST (ft_tma.cuh), causal,
// the query block short of rows first; FT_WG_UNIFORM, the warpgroup index broadcast from lane 0 so that
// ptxas knows it is the same in every lane and keeps the wgmma descriptors in uniform registers.
#ifndef W3_CONSUMERS
#define W3_CONSUMERS 2  // consumer warpgroups: 2 (ping-pong) or 3 (no turns unless W3_C3_TURNS)
#endif
#if W3_CONSUMERS != 2 && W3_CONSUMERS != 3
#error "W3_CONSUMERS must be 2 or 3"
#endif
#if W3_CONSUMERS == 3 && HEAD_DIM != 64
#error "three consumer warpgroups are built for HEAD_DIM 64: at 128 their 160 registers spill and ptxas serialises the wgmma (C7512)"
#endif
#ifndef W3_PERSISTENT
#define W3_PERSISTENT 0  // 1: rung W4, one block per SM walking the query blocks (flash_fwd_w4)
#endif
#ifndef W3_TMA_STORE
#define W3_TMA_STORE 0   // 1: the output through shared memory and TMA stores (w3_store_tma), not from registers
#endif
#ifndef W3_C3_TURNS
#define W3_C3_TURNS 0    // 1: three consumers take turns in a ring (W3_CONSUMERS = 3 only)
#endif
#if W3_C3_TURNS && W3_CONSUMERS != 3
#error "W3_C3_TURNS is the turn ring of three consumers; two always take turns (ping-pong)"
#endif
#ifndef FT_WG_UNIFORM
#define FT_WG_UNIFORM 0   // 1: the warpgroup index taken from lane 0 with a warp shuffle (see the kernel)
#endif
#if W3_PERSISTENT && W3_TMA_STORE
#error "W4 refills the Q tile that W3_TMA_STORE writes the output into"
#endif
#define W3_TURNS (W3_CONSUMERS == 2 || W3_C3_TURNS)   // the consumers take turns to issue their wgmma
#define FT_TMA_BLOCK_M (64 * W3_CONSUMERS)
#include "ft_tma.cuh"
#if FT_TAIL_FIRST && W3_TMA_STORE
#error "FT_TAIL_FIRST's first block ends inside a consumer's 64 rows, which W3_TMA_STORE's box would write whole"
#endif

#ifndef W3_BLOCK_N
#define W3_BLOCK_N 128  // keys per K/V tile (64 or 128)
#endif
#ifndef W3_STAGES
#define W3_STAGES 2     // K/V stages in the ring
#endif
#define W3_BLOCK_M FT_TMA_BLOCK_M
#define W3_THREADS (128 * (1 + W3_CONSUMERS))
#define W3_PRODUCER_REGS 24
// the register file (64 K) less the producer's 128 x 24, shared by the consumers, rounded down to 8
#define W3_CONSUMER_REGS (W3_CONSUMERS == 2 ? 240 : 160)
#define W3_Q_BYTES (W3_BLOCK_M * HEAD_DIM * 2)
#define W3_KV_BYTES (W3_BLOCK_N * HEAD_DIM * 2)
#define W3_CONSUMER_WARPS (4 * W3_CONSUMERS)   // arrivals that release a K or V stage: every consumer warp once
// Named barriers: 0 is __syncthreads' (all the block's threads, once, before the roles split); 1 and 2 (and 3
// with W3_C3_TURNS) are the turns of consumer warpgroups 0 and 1 (and 2). Each counts 256 threads: the 128
// of the warpgroup that waits (bar.sync) and the 128 of the one that lets it go (bar.arrive), so it
// completes only when both did.
#define W3_BAR_TURN0 1
#define W3_TURN_THREADS 256

// The id is a register (the warpgroup's own turn), so ptxas reserves all 16 hardware barriers ("used 16
// barriers"); one block per SM fits anyway.
__device__ __forceinline__ void named_bar_sync(int id) {
#if FT_SM90A && W3_TURNS
    asm volatile("bar.sync %0, %1;" :: "r"(id), "n"(W3_TURN_THREADS) : "memory");
#endif
}
__device__ __forceinline__ void named_bar_arrive(int id) {
#if FT_SM90A && W3_TURNS
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "n"(W3_TURN_THREADS) : "memory");
#endif
}

// The mbarriers, after the tiles: q_full, k_full[S], v_full[S], k_empty[S], v_empty[S] and, persistent
// (W4), q_empty. Tile g of the block's K/V stream (g counts on across the query blocks of a persistent
// block) sits in stage g % S and is the (g / S)-th fill of that stage, so the full barriers' phase for
// it is g / S and a consumer waits on parity (g / S) & 1; the producer refills the stage with tile g
// only after the release of tile g - S, phase g / S - 1 of the empty barrier.
#define W3_Q_FULL(bars) (bars)
#define W3_K_FULL(s) (bars + 8u * (1 + (s)))
#define W3_V_FULL(s) (bars + 8u * (1 + W3_STAGES + (s)))
#define W3_K_EMPTY(s) (bars + 8u * (1 + 2 * W3_STAGES + (s)))
#define W3_V_EMPTY(s) (bars + 8u * (1 + 3 * W3_STAGES + (s)))
#define W3_Q_EMPTY (bars + 8u * (1 + 4 * W3_STAGES))
#define W3_STAGE(j) ((kv0 + (j)) % W3_STAGES)
#define W3_PARITY(j) ((unsigned)((kv0 + (j)) / W3_STAGES) & 1u)

// W4 releases Q once the warpgroup's last Q K^T is complete (its softmax, last P V and store then run
// while the producer loads the next block's Q); W3 loads Q once and never releases it.
#if W3_PERSISTENT
#define W3_RELEASE_Q() warp_release(W3_Q_EMPTY, lane)
#else
#define W3_RELEASE_Q() do { } while (0)
#endif

// (defined after the consumer: the output through the Q tile and a TMA store)
#if W3_TMA_STORE
__device__ __forceinline__ void w3_store_tma(const unsigned char* tmaps, const float* acc, const float (&m)[2],
                                             const float (&l)[2], float* lse, unsigned q_s, int cw, int wg_row0,
                                             int bh, int Nq, int r0, int t, float scale_log2);
#endif

// One consumer warpgroup's share of one query block: its slots, its idle turns and the store.
__device__ __forceinline__ void w3_consume(const unsigned char* tmaps, int wg, unsigned q_s, unsigned k_s, unsigned v_s, unsigned bars,
                                           ft_raw* __restrict__ o, float* __restrict__ lse, int m0, int bh,
                                           int n_tiles, int kv0, int it, int Nq, int Nk, float scale_log2,
                                           int causal, int diag_offset) {
    const ft_consumer me = tma_consumer(wg, m0, q_s);
    const int cw = me.cw, lane = me.lane, t = me.t, wg_row0 = me.wg_row0, warp_row0 = me.warp_row0, r0 = me.r0;
    const unsigned q_addr = me.q_addr;
    // The ring's successor is (cw == last ? 0 : cw + 1) for two consumers as for three; two keep
    // ping-pong's own form, 1 - cw, which ptxas compiles to a shorter prologue.
#if W3_CONSUMERS == 2
    const int my_turn = W3_BAR_TURN0 + cw, other_turn = W3_BAR_TURN0 + 1 - cw;
#elif W3_TURNS
    const int my_turn = W3_BAR_TURN0 + cw, other_turn = W3_BAR_TURN0 + (cw == 2 ? 0 : cw + 1);   // the next
#else
    const int my_turn = 0;   // named_bar_sync(my_turn) compiles to nothing without turns
    (void)cw;
#endif

    // Tiles this warpgroup reads: the block's, less those (causal) right of its last row's diagonal, none
    // when all its rows are past Nq. Always a prefix 0 .. my_tiles - 1 of the block's n_tiles.
    int my_end = 0;
    const int row_end = tma_row_end(m0, Nq, causal);
    if (wg_row0 < row_end) my_end = causal ? min(Nk, max(0, min(wg_row0 + 64, row_end) + diag_offset)) : Nk;
    const int my_tiles = min(n_tiles, (my_end + W3_BLOCK_N - 1) / W3_BLOCK_N);

    // Every consumer takes the same n_tiles + 1 turns, whatever its own tile count: slot j of consumer 0,
    // then slot j of consumer 1 (and 2), then slot j + 1 of consumer 0 ... A warpgroup with fewer tiles
    // spends its remaining turns idle rather than leaving, because a named barrier counts arrivals, not who
    // made them: had one warpgroup arrived twice on the next one's barrier in a row, the 256 would be reached
    // by one side. Consumer 0 issues first: the last consumer gives it its first turn here, and gives none
    // after its last slot (n_tiles): consumer 0 has no slot n_tiles + 1 to take it, and an arrival left on
    // the barrier would be a half-counted generation at exit (W4: at the next query block, whose first
    // turn the last consumer gives here again, so the turns go round across blocks too).
    // Without turns (three consumers, W3_C3_TURNS = 0) they compile to nothing: named_bar_sync and
    // named_bar_arrive are empty and W3_END_TURN gives no turn.
#if W3_CONSUMERS == 2
    if (cw == 1) named_bar_arrive(W3_BAR_TURN0);
#define W3_END_TURN(slot) do { if (cw == 0 || (slot) < n_tiles) named_bar_arrive(other_turn); } while (0)
#elif W3_TURNS
    if (cw == 2) named_bar_arrive(W3_BAR_TURN0);
#define W3_END_TURN(slot) do { if (cw != 2 || (slot) < n_tiles) named_bar_arrive(other_turn); } while (0)
#else
#define W3_END_TURN(slot) do { } while (0)
#endif

    float acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) acc[i] = 0.f;
    float m[2] = {FT_NEG_INF, FT_NEG_INF}, l[2] = {0.f, 0.f};
    float alpha[2], neg_mscaled[2];
    float sc[W3_BLOCK_N / 2];        // S_j
    ft_raw2 pf[W3_BLOCK_N / 4];      // P_{j-1}: the A operand of the P V issued next
    // Q is waited for even by a warpgroup that reads no tile: no TMA copy may still be writing into the
    // block's shared memory when its threads exit (or, W4, when it releases the Q buffer). W4's caller
    // has waited already: the same phase tells it which query block this is.
#if !W3_PERSISTENT
    mbar_wait(W3_Q_FULL(bars), (unsigned)it & 1u);
#endif

    if (my_tiles > 0) {
        // slot 0: S_0 alone (there is no P yet); O is zero, so its rescale is skipped
        mbar_wait(W3_K_FULL(W3_STAGE(0)), W3_PARITY(0));
        named_bar_sync(my_turn);
        wgmma_fence();
        wg_qk<W3_BLOCK_N>(sc, q_addr, k_s + W3_STAGE(0) * W3_KV_BYTES);
        wgmma_commit();
        W3_END_TURN(0);
        wgmma_wait<0>();
        wgmma_fence_operands<W3_BLOCK_N / 2>(sc);
        warp_release(W3_K_EMPTY(W3_STAGE(0)), lane);   // S_0 is in registers: K_0's stage may be refilled
        if (my_tiles == 1) W3_RELEASE_Q();
        wg_mask<W3_BLOCK_N>(sc, 0, Nk, causal, diag_offset, warp_row0, r0, t);
        wg_softmax_max<W3_BLOCK_N>(sc, m, l, scale_log2, alpha, neg_mscaled);
        wg_softmax_exp<W3_BLOCK_N>(sc, l, neg_mscaled, scale_log2, pf);

        // slots 1 .. my_tiles - 1: S_j and P_{j-1} V_{j-1}, the softmax of S_j under the P V
        for (int j = 1; j < my_tiles; ++j) {
            const int s = W3_STAGE(j), ps = W3_STAGE(j - 1);
            // the operands land before the turn is taken: a warpgroup waiting for a copy while holding
            // the turn would stall the other's issue too
            mbar_wait(W3_K_FULL(s), W3_PARITY(j));
            mbar_wait(W3_V_FULL(ps), W3_PARITY(j - 1));
            named_bar_sync(my_turn);
            wgmma_fence();   // pf was packed and acc rescaled by ordinary instructions since the last wgmma
            wg_qk<W3_BLOCK_N>(sc, q_addr, k_s + s * W3_KV_BYTES);
            wgmma_commit();                                       // group 1: S_j
            wg_pv<W3_BLOCK_N>(acc, pf, v_s + ps * W3_KV_BYTES);
            wgmma_commit();                                       // group 2: O += P_{j-1} V_{j-1}
            W3_END_TURN(j);
            // wait_group 1: every group but the newest (the P V) is complete, so S_j is in registers
            wgmma_wait<1>();
            wgmma_fence_operands<W3_BLOCK_N / 2>(sc);
            warp_release(W3_K_EMPTY(s), lane);
            if (j == my_tiles - 1) W3_RELEASE_Q();
            wg_mask<W3_BLOCK_N>(sc, j * W3_BLOCK_N, Nk, causal, diag_offset, warp_row0, r0, t);
            // P_j = exp2(...) in float32 over S_j itself: pf still holds P_{j-1}, which the P V in flight
            // is reading. (A second array for P_j, copied into pf at the end of the slot, makes ptxas
            // serialise every wgmma, C7513: it merges the copy's registers with the operands in flight.)
            wg_softmax_max<W3_BLOCK_N>(sc, m, l, scale_log2, alpha, neg_mscaled);
            wg_softmax_exp_inplace<W3_BLOCK_N>(sc, l, neg_mscaled, scale_log2);
            // O holds tiles 0 .. j - 1 at the old maxima once the P V is done; only then may it be
            // rescaled, and pf overwritten with P_j
            wgmma_wait<0>();
            wgmma_fence_operands<HEAD_DIM / 2>(acc);
            wgmma_fence_operands<W3_BLOCK_N / 4>(pf);   // P_{j-1} stays in its registers until here
            warp_release(W3_V_EMPTY(ps), lane);
            wg_rescale(acc, alpha);
            wg_pack_p<W3_BLOCK_N>(sc, pf);
        }

        // slot my_tiles: the last P V alone
        const int ps = W3_STAGE(my_tiles - 1);
        mbar_wait(W3_V_FULL(ps), W3_PARITY(my_tiles - 1));
        named_bar_sync(my_turn);
        wgmma_fence();
        wg_pv<W3_BLOCK_N>(acc, pf, v_s + ps * W3_KV_BYTES);
        wgmma_commit();
        W3_END_TURN(my_tiles);
        wgmma_wait<0>();
        wgmma_fence_operands<HEAD_DIM / 2>(acc);
        warp_release(W3_V_EMPTY(ps), lane);
    } else {
        W3_RELEASE_Q();
    }

    // Tiles my_tiles .. n_tiles - 1 hold no key for this warpgroup's rows, but the producer counts every
    // consumer warp's release of every tile. Tile j is released in slot j, after waiting for it to land
    // (an arrival before the fill would count towards the previous phase of the stage's empty barrier),
    // and the idle turns are taken in the same order: releasing every remaining tile first would wait for
    // fills that need the other consumer's releases, which need turns this warpgroup has not given yet.
    for (int j = my_tiles; j <= n_tiles; ++j) {
        if (j > my_tiles || my_tiles == 0) {
            named_bar_sync(my_turn);
            W3_END_TURN(j);
        }
        if (j < n_tiles) {
            const int s = W3_STAGE(j);
            mbar_wait(W3_K_FULL(s), W3_PARITY(j));
            warp_release(W3_K_EMPTY(s), lane);
            mbar_wait(W3_V_FULL(s), W3_PARITY(j));
            warp_release(W3_V_EMPTY(s), lane);
        }
    }

#if W3_TMA_STORE
    (void)o;
    w3_store_tma(tmaps, acc, m, l, lse, q_s, cw, wg_row0, bh, Nq, r0, t, scale_log2);
#else
    wg_store(acc, m, l, o, lse, bh, Nq, tma_row_end(m0, Nq, causal), r0, t, scale_log2);
#endif
#undef W3_END_TURN
}

#if W3_TMA_STORE
// W3_TMA_STORE: one consumer warpgroup's output tile through shared memory. O / l, packed to 16 bits, goes
// into the warpgroup's own 64 rows of the Q tile, in the swizzled layout TMA reads there (those rows are
// free: the warpgroup's last Q K^T is complete, and no other warpgroup reads them), then one thread copies
// the 64 x HEAD_DIM box out with cp.async.bulk.tensor (a 64-column box per copy), 128-byte transactions
// instead of the 4-byte stores of wg_store, whose lanes write 8 rows apart. Rows past Nq are not written:
// the tensor map's bounds clip them. Ordering: each thread's shared-memory writes are made visible to the
// TMA unit (the async proxy) by fence.proxy.async before the warpgroup's named barrier, and the thread that
// issued the copies waits until they have read shared memory (wait_group.read) before the block may end.
#define W3_STORE_BAR0 (W3_BAR_TURN0 + W3_CONSUMERS)   // one per consumer warpgroup, 128 threads, after the turns'
__device__ __forceinline__ void w3_store_tma(const unsigned char* tmaps, const float* acc, const float (&m)[2],
                                             const float (&l)[2], float* lse, unsigned q_s, int cw, int wg_row0,
                                             int bh, int Nq, int r0, int t, float scale_log2) {
    const int lane_row = r0 - (wg_row0 - cw * 64);   // r0's row within the block's Q tile
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lsum = quad_sum(l[r]);
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
        for (int c8 = 0; c8 < HEAD_DIM / 8; ++c8) {
            const unsigned addr = q_s + sw128_offset<W3_BLOCK_M>(lane_row + 8 * r, 8 * c8 + 2 * t);
            const ft_raw2 v = ft_pack2(acc[4 * c8 + 2 * r] * inv, acc[4 * c8 + 2 * r + 1] * inv);
            asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
        }
        if (t == 0 && r0 + 8 * r < Nq) wg_store_lse(lse, bh, Nq, r0 + 8 * r, m[r], lsum, scale_log2);
    }
#if FT_SM90A
    fence_proxy_async_smem();
    asm volatile("bar.sync %0, 128;" :: "r"(W3_STORE_BAR0 + cw) : "memory");
    if (threadIdx.x % 128 == 0 && wg_row0 < Nq) {
        const void* tmap = tmaps + 3 * 128;
#pragma unroll
        for (int cb = 0; cb < HEAD_DIM / 64; ++cb)
            asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
                         :: "l"(tmap), "r"(cb * 64), "r"(wg_row0), "r"(bh),
                            "r"(q_s + cb * W3_BLOCK_M * 128 + cw * 64 * 128) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
#endif
}
#endif

// The producer's share of one query block (thread 0 of warpgroup 0): Q, then in the order the consumers
// need them K_j (slot j) and V_j (slot j + 1); each waits for the release of the tile S earlier in its
// stage, which every consumer gives in slot j - S (K) and j - S + 1 (V), so with S = 2 K_j is requested
// a whole slot before slot j needs it. kv0: K/V tiles this block loaded before this query block; it:
// query blocks before it (W4's Q buffer is refilled once every consumer has issued its last Q K^T).
__device__ __forceinline__ void w3_produce(const unsigned char* tmaps, unsigned q_s, unsigned k_s, unsigned v_s,
                                           unsigned bars, int m0, int bh, int kv_head, int n_tiles, int kv0, int it) {
    const void* tq = tmaps;
    const void* tk = tmaps + 128;
    const void* tv = tmaps + 256;
#if W3_PERSISTENT
    if (it > 0) mbar_wait(W3_Q_EMPTY, (unsigned)(it - 1) & 1u);
#endif
    mbar_arrive_expect_tx(W3_Q_FULL(bars), W3_Q_BYTES);
    tma_tile<W3_BLOCK_M>(q_s, tq, m0, bh, W3_Q_FULL(bars));
    for (int j = 0; j < n_tiles; ++j) {
        const int s = W3_STAGE(j);
        if (kv0 + j >= W3_STAGES) mbar_wait(W3_K_EMPTY(s), W3_PARITY(j) ^ 1u);
        mbar_arrive_expect_tx(W3_K_FULL(s), W3_KV_BYTES);
        tma_tile<W3_BLOCK_N>(k_s + s * W3_KV_BYTES, tk, j * W3_BLOCK_N, kv_head, W3_K_FULL(s));
        if (kv0 + j >= W3_STAGES) mbar_wait(W3_V_EMPTY(s), W3_PARITY(j) ^ 1u);
        mbar_arrive_expect_tx(W3_V_FULL(s), W3_KV_BYTES);
        tma_tile<W3_BLOCK_N>(v_s + s * W3_KV_BYTES, tv, j * W3_BLOCK_N, kv_head, W3_V_FULL(s));
    }
}

// W3: grid (ceil(Nq / W3_BLOCK_M), B * H), one query block per block (with W3_TMA_STORE the tensor map
// of o follows V's). W4 (W3_PERSISTENT): grid (at most
// the SM count) of blocks that each take query blocks until none is left (B * H heads: n_bh).
// Block W3_THREADS threads (384, or 512 with three consumers), dynamic shared memory
// W3_Q_BYTES + 2 * W3_STAGES * W3_KV_BYTES + 1024 (alignment) + 8 * (1 + 4 * W3_STAGES) (mbarriers)
// and for W4 8 more (q_empty) and 8 (the query block numbers handed to the consumers, two slots).

#ifndef W3_HEAD_SECTION
#define W3_HEAD_SECTION 8   // causal: heads whose query blocks are taken together, heaviest first
#endif
// Query block number t (0, 1, ... in the order blocks take them) -> (query block mb, head bh): W4's
// order (the hardware starts a grid's blocks about in index order).
// Causal: sections of W3_HEAD_SECTION heads, and within a section the heaviest (last) query block of
// each head first, then the next heaviest: a block that finishes early takes the heaviest work left,
// so the last to start are the shortest. A section rather than all heads at once, so that the blocks
// running together (132 on an H200) are about 132 / 8 per head and read that head's K and V from L2
// rather than each its own head's from memory. Not causal: a head's query blocks in a row.
__device__ __forceinline__ void section_query_block(int t, int n_mb, int n_bh, int causal, int& mb, int& bh) {
    if (causal) {
        const int sec = t / (W3_HEAD_SECTION * n_mb), r = t - sec * W3_HEAD_SECTION * n_mb;
        const int heads = min(W3_HEAD_SECTION, n_bh - sec * W3_HEAD_SECTION);
        mb = n_mb - 1 - r / heads;
        bh = sec * W3_HEAD_SECTION + r % heads;
    } else {
        mb = t % n_mb;
        bh = t / n_mb;
    }
}

// W4: query block number t's head (bh) and rows, the same in the producer and every consumer
__device__ __forceinline__ ft_tma_block w4_query_block(int t, int n_mb, int n_bh, int Nq, int Nk, int causal,
                                                       int diag_offset, int& bh) {
    int mb;
    section_query_block(t, n_mb, n_bh, causal, mb, bh);
    return tma_block_at<W3_BLOCK_N>(mb, n_mb, Nq, Nk, causal, diag_offset);
}

// One body, two entry points: W4 writes its scheduler's counter after the maps (not const) and takes
// the head count.
#if W3_PERSISTENT
extern "C" __global__ void __launch_bounds__(W3_THREADS, 1)
flash_fwd_w4(unsigned char* __restrict__ tmaps, ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal, int kv_group, int diag_offset, int n_bh) {
#else
extern "C" __global__ void __launch_bounds__(W3_THREADS, 1)
flash_fwd_w3(const unsigned char* __restrict__ tmaps, ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal, int kv_group, int diag_offset) {
#endif
#if FT_SM90A
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_align1024(smem_raw);
    const unsigned q_s = smem_addr(smem);                          // [HEAD_DIM / 64][W3_BLOCK_M][64]
    const unsigned k_s = q_s + W3_Q_BYTES;                         // [W3_STAGES][HEAD_DIM / 64][W3_BLOCK_N][64]
    const unsigned v_s = k_s + W3_STAGES * W3_KV_BYTES;
    const unsigned bars = v_s + W3_STAGES * W3_KV_BYTES;
#if FT_WG_UNIFORM
    // lane 0's warpgroup index, broadcast: every lane's is the same, but ptxas knows that only of a
    // shuffle's result; then everything derived from it (the Q address, the turns, the ring position)
    // stays in uniform registers, which wgmma reads its descriptors from, instead of being moved there
    // (R2UR) before every wgmma
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
#else
    const int wg = threadIdx.x / 128;
#endif
#if !W3_PERSISTENT
    const int bh = blockIdx.y;
    const ft_tma_block blk = tma_block<W3_BLOCK_N>(Nq, Nk, causal, diag_offset);
#endif

    if (threadIdx.x == 0) {
        mbar_init(W3_Q_FULL(bars), 1);
        for (int s = 0; s < W3_STAGES; ++s) {
            mbar_init(W3_K_FULL(s), 1);    // the producer's arrive.expect_tx, then the copy's bytes
            mbar_init(W3_V_FULL(s), 1);
            mbar_init(W3_K_EMPTY(s), W3_CONSUMER_WARPS);
            mbar_init(W3_V_EMPTY(s), W3_CONSUMER_WARPS);
        }
#if W3_PERSISTENT
        mbar_init(W3_Q_EMPTY, W3_CONSUMER_WARPS);
#endif
        mbar_init_fence();
    }
    __syncthreads();  // the barriers are initialised before anyone waits on them; none is needed later

#if W3_PERSISTENT
    // The scheduler: block b's first query block is t = b; each later one is the next number of a
    // counter in global memory (4 bytes after the tensor maps, zeroed by the launch's copy), taken by
    // the producer one query block ahead so that the atomic's round trip is hidden. The producer hands
    // the number to the consumers in shared memory (two slots: query block it uses slot it % 2), written
    // before the arrival on q_full that the consumers wait for (a release; their wait acquires), and
    // -1 when none is left: then q_full is completed with no copy, and everyone leaves.
    const int n_mb = (Nq + W3_BLOCK_M - 1) / W3_BLOCK_M, n_work = n_mb * n_bh;
    int* const counter = reinterpret_cast<int*>(tmaps + 3 * 128);
    volatile int* const slot = (volatile int*)(smem + (bars - q_s) + 8 * (2 + 4 * W3_STAGES));
    if (wg == 0) {
        setmaxnreg_dec<W3_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            int t = blockIdx.x, kv0 = 0;
            for (int it = 0;; ++it) {
                if (it > 0) mbar_wait(W3_Q_EMPTY, (unsigned)(it - 1) & 1u);   // Q and slot it % 2 are free
                slot[it & 1] = t < n_work ? t : -1;
                if (t >= n_work) {
                    mbar_arrive(W3_Q_FULL(bars));
                    break;
                }
                const int next = atomicAdd(counter, 1) + (int)gridDim.x;
                int bh;
                const ft_tma_block blk = w4_query_block(t, n_mb, n_bh, Nq, Nk, causal, diag_offset, bh);
                w3_produce(tmaps, q_s, k_s, v_s, bars, blk.m0, bh, bh / kv_group, blk.n_tiles, kv0, it);
                kv0 += blk.n_tiles;
                t = next;
            }
        }
        return;
    }
    setmaxnreg_inc<W3_CONSUMER_REGS>();
    for (int it = 0, kv0 = 0;; ++it) {
        mbar_wait(W3_Q_FULL(bars), (unsigned)it & 1u);
        const int t = slot[it & 1];
        if (t < 0) break;
        int bh;
        const ft_tma_block blk = w4_query_block(t, n_mb, n_bh, Nq, Nk, causal, diag_offset, bh);
        w3_consume(tmaps, wg, q_s, k_s, v_s, bars, o, lse, blk.m0, bh, blk.n_tiles, kv0, it, Nq, Nk, scale_log2,
                   causal, diag_offset);
        kv0 += blk.n_tiles;
    }
#else
    if (wg == 0) {
        setmaxnreg_dec<W3_PRODUCER_REGS>();
        if (threadIdx.x == 0)
            w3_produce(tmaps, q_s, k_s, v_s, bars, blk.m0, bh, bh / kv_group, blk.n_tiles, 0, 0);
        return;
    }
    setmaxnreg_inc<W3_CONSUMER_REGS>();
    w3_consume(tmaps, wg, q_s, k_s, v_s, bars, o, lse, blk.m0, bh, blk.n_tiles, 0, 0, Nq, Nk, scale_log2, causal,
               diag_offset);
#endif
#else
    __trap();  // built for a target without TMA and wgmma; flashtut.cuda.hopper launches it on sm_90a only
#endif
}
#undef W3_PARITY
#undef W3_STAGE
#undef W3_Q_FULL
#undef W3_K_FULL
#undef W3_V_FULL
#undef W3_K_EMPTY
#undef W3_V_EMPTY
#undef W3_Q_EMPTY
