// fwd_w3_pingpong.cu: Hopper rung W3, W2 with the softmax overlapped with the tensor cores (sm_90a).
//
// W2's consumers run each tile as: S = Q K^T, wait, softmax, O += P V, wait. While a warpgroup does its
// softmax (exp2, max, sum: the multi-function and FP32 units) its tensor-core work is stopped, and the
// other consumer's wgmma run only when the two happen to fall out of step. W3 overlaps them on purpose,
// in two ways (the overlap to which the FlashAttention-3 paper attributes its largest step):
//  * intra-warpgroup pipelining: in one "slot" a warpgroup issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1}
//    (two wgmma groups), waits only for the first (wgmma.wait_group 1: all but the newest group done), and
//    runs the softmax of S_j while its P V of the previous tile is still on the tensor cores; then it waits
//    for that (wait_group 0) and rescales O. Slot 0 issues S_0 alone, slot T (T = its tiles) the last P V.
//    That is the source's order. ptxas does not keep it: it places wait_group 0 above the softmax, which
//    then runs after the P V (W3_PIN_OVERLAP below pins it back; measured, it does not pay).
//  * inter-warpgroup ping-pong: the two consumers take turns to issue their slot, ordered by two named
//    barriers (W3_BAR_TURN0 + w: "consumer w may issue"): warpgroup w waits on its own (bar.sync, 256
//    threads: its 128 plus the other's 128 arrivals), issues, then lets the other go (bar.arrive on the
//    other's barrier). The tensor cores then take the groups whole, one warpgroup's after the other's,
//    so while consumer 0 computes the softmax of S_j, consumer 1's S_j and P V run, and vice versa.
// The schedule and its barrier phases are simulated on the CPU, for every tile count and skip pattern
// the kernel can meet, by flashtut.cuda.hopper_schedule (no waiter on a phase that never completes, no
// two warpgroups issuing in one slot, no arrival on a named barrier counted in the wrong generation).
//
// Register budget per consumer thread (setmaxnreg gives the consumers 240; the 64 x N accumulators of a
// warpgroup are spread over its 128 threads, N / 2 each), at D = 128 and 128-key tiles
// (flashtut.cuda.hopper_layout.w3_register_budget):
//   S_j accumulator, float32                                64   (BN / 2)
//   P_{j-1} as A fragments, read by the P V still in flight   32   (BN / 4: two 16-bit values a register)
//   O accumulator, float32                                  64   (D / 2)
//   m, l, alpha, -m * scale for 2 rows                         8
//   = 168, plus addresses, barrier parities, loop state and the exp2 temporaries (ptxas' share; the
//   highest register in the SASS is R198 at D = 128, R162 at D = 64, both under 240, no spills).
// The pipelining's "second S" is P_{j-1}, kept in 16 bits. P_j is computed in S_j's own registers
// (exp2 in place, float32) and packed into pf only after the P V reading P_{j-1} is done, so it adds
// nothing to the peak. At D = 64: 136. With three consumers (D = 64 only) setmaxnreg gives each 160
// and the highest register in the SASS is R151, no spills (nvcc 13.0).
// Shared memory: Q (128 rows) and W3_STAGES stages of K and V as in W2, but K and V are released
// separately (K_j once S_j is done, V_j a slot later once its P V is done): with one release for both,
// a two-stage ring could refill the stage of tile j - 1 only after slot j, exposing the TMA latency to
// slot j + 1; with separate releases the producer reloads K one slot ahead of use.
//
// Kept from W2: the producer warpgroup and its TMA tensor maps, setmaxnreg 24 / 240, the swizzled tiles,
// causal block skipping with the heaviest query blocks first, grouped heads, either causal alignment,
// masked tails for any Nq and Nk, o = 0 and lse = -inf for a row that sees no key, the launch interface.
//
// W3_CONSUMERS = 3 (the D = 64 variant, FlashAttention-3's choice at head dim 64): three consumer
// warpgroups of 64 rows, 192-row blocks, 512 threads, setmaxnreg 24 / 160. Each keeps the
// intra-warpgroup pipelining. By default they take no turns: with three warpgroups on the tensor cores
// each one's softmax may already run under the others' products. W3_C3_TURNS = 1 makes them take turns in
// a ring, 0, 1, 2, 0 ... (barrier W3_BAR_TURN0 + w, 256 threads: warpgroup w's bar.sync and its
// predecessor's bar.arrive), so that the three softmaxes are staggered by the order of the products
// rather than left to fall into step: at D = 64 a tile's exponentials take the special-function unit
// as long as its two products take the tensor cores (book/perflog_hopper.md).
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
#ifndef W3_SECTION_ORDER
#define W3_SECTION_ORDER 0  // 1: causal blocks in W4's order (section_query_block), not head by head
#endif
#ifndef W3_HEADS_FIRST
#define W3_HEADS_FIRST 0   // 1: grid (heads, query blocks), so that blocks start heaviest first across all heads
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
#ifndef W3_PIN_OVERLAP
#define W3_PIN_OVERLAP 0   // 1: the softmax of S_j is pinned above wait_group 0, under the P V in flight
#endif
// W3_PIN_OVERLAP: ptxas schedules arithmetic freely across wgmma.wait_group (it has no register operands),
// and without a pin it places the wait of a slot's P V right after S_j's wait, above the whole softmax of
// S_j: the SASS runs the exponentials after the P V is done, not under it, and the intra-warpgroup
// overlap described above is gone (0 of the slot's 66 MUFU.EX2 between the two WARPGROUP.DEPBAR). It
// does keep memory operations in order with the wait, so the pin is one: the release of K_j's stage, an
// mbarrier arrival, moves below the softmax and takes a predicate that reads the row sums, which every
// exponential feeds (warp_release_after). Then all 66 stay between the two waits.
#ifndef W3_PIN_ANCHOR
#define W3_PIN_ANCHOR 0   // 1: the same pin on an mbarrier of its own, K_j's release left where it was
#endif
// W3_PIN_ANCHOR: the pin of W3_PIN_OVERLAP delays K_j's release by a softmax, which at D = 64, where a
// slot is short, may leave the producer too little time to refill the stage. This pin arrives instead on
// an mbarrier that no one waits for (W3_ANCHOR, after W4's slots; its phases complete and are never
// looked at), so the release stays right after S_j's wait.
#if W3_PIN_OVERLAP && W3_PIN_ANCHOR
#error "W3_PIN_OVERLAP and W3_PIN_ANCHOR are two pins of the same softmax: choose one"
#endif
#ifndef FT_WG_UNIFORM
#define FT_WG_UNIFORM 0   // 1: the warpgroup index taken from lane 0 with a warp shuffle, so that ptxas knows it uniform
#endif
// FT_WG_UNIFORM: a consumer's warpgroup index, threadIdx.x / 128, is the same in the 32 lanes of a warp, but
// ptxas does not know it: it treats everything derived from it as possibly different per lane, so the Q
// address, the turns, the tile count and (W4) the ring position live in ordinary registers, and each wgmma
// descriptor built from them is moved to the uniform registers wgmma reads (R2UR) inside the loop, a
// fixed-latency dependency before every HGMMA. The result of __shfl_sync from a fixed lane is known to be
// the same in every lane, and then the descriptors are built in uniform registers: W3's loop at D = 64
// loses its 10 R2UR (716 -> 700 instructions), W4's its 32 (745 -> 708), nvcc 13.0.
#ifndef W4_STATIC
#define W4_STATIC 0    // W4: 1, block b takes query blocks b, b + gridDim.x, ... (no counter, no handover)
#endif
#if W4_STATIC && !W3_PERSISTENT
#error "W4_STATIC is a schedule of the persistent rung W4"
#endif
#ifndef W4_NAMED_HANDOVER
#define W4_NAMED_HANDOVER 0   // W4: 1, the query block number handed over on two named barriers, not on q_full
#endif
// W4_NAMED_HANDOVER: the counter's number reaches the consumers through the same shared-memory slot, but
// ordered by two named barriers of the producer warp and every consumer thread (W4_SLOT_THREADS): the
// producer stores the number and arrives on W4_SLOT_FULL, the consumers bar.sync on it, load the number
// and arrive on W4_SLOT_EMPTY, on which the producer waits before it stores the next one (FlashAttention-
// 3's handshake). An arrive releases and a bar.sync acquires, as q_full's arrival and wait did. Measured,
// it is no faster, and racecheck reports its slot as it does q_full's: the tool follows either ordering
// from writer to reader but reports a slot written again after the reader's arrival
// (probe_racecheck.cu, book/perflog_hopper.md). A named barrier counts whole warps, so the whole
// producer warp runs the loop, lane 0 alone loading and taking numbers.
#if W4_NAMED_HANDOVER && (!W3_PERSISTENT || W4_STATIC)
#error "W4_NAMED_HANDOVER is the handover of W4's counter (not W3's, not W4_STATIC's, which has none)"
#endif
#if W3_PERSISTENT && (W3_SECTION_ORDER || W3_TMA_STORE || W3_HEADS_FIRST)
#error "W4 has its own order and grid, and refills the Q tile that W3_TMA_STORE writes the output into"
#endif
#define W3_TURNS (W3_CONSUMERS == 2 || W3_C3_TURNS)   // the consumers take turns to issue their wgmma
#define FT_TMA_BLOCK_M (64 * W3_CONSUMERS)
#include "ft_tma.cuh"
// FT_TAIL_FIRST (ft_tma.cuh): with a causal mask, the query block short of rows is the first, not the last.
// The last block reads every key tile; short of rows, some of its consumers have no row and pass
// their turns idle while the one with rows runs alone, its softmax under no one's products. At Nq = 4096
// and 192-row blocks that block is a third full and the heaviest of its head. First, it reads one tile.
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
// W4_NAMED_HANDOVER's two, after the turns' (W4 has no TMA store and so no store barriers)
#define W4_SLOT_FULL (W3_BAR_TURN0 + W3_CONSUMERS)
#define W4_SLOT_EMPTY (W4_SLOT_FULL + 1)
#define W4_SLOT_THREADS (32 + 128 * W3_CONSUMERS)

// The id is a register (the warpgroup's own turn), so ptxas reserves all 16 hardware barriers ("used 16
// barriers"); one block per SM fits anyway (384 threads x 168 registers, up to 224 KB of shared memory).
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

#if W4_NAMED_HANDOVER
template <int ID> __device__ __forceinline__ void slot_bar_sync() {
    asm volatile("bar.sync %0, %1;" :: "n"(ID), "n"(W4_SLOT_THREADS) : "memory");
}
template <int ID> __device__ __forceinline__ void slot_bar_arrive() {
    asm volatile("bar.arrive %0, %1;" :: "n"(ID), "n"(W4_SLOT_THREADS) : "memory");
}

// The grid size read where it is used: kept across the producer's loop in one of its 24 registers, it is
// the one value ptxas spills in this build at D = 128.
__device__ __forceinline__ int grid_blocks_here() {
    unsigned g;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(g));
    return (int)g;
}
#endif

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
#define W3_ANCHOR (bars + 8u * (3 + 4 * W3_STAGES))   // W3_PIN_ANCHOR's, past W4's q_empty and two slots
#define W3_STAGE(j) ((kv0 + (j)) % W3_STAGES)
#define W3_PARITY(j) ((unsigned)((kv0 + (j)) / W3_STAGES) & 1u)

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

// W4 releases Q once the warpgroup's last Q K^T is complete (its softmax, last P V and store then run
// while the producer loads the next block's Q); W3 loads Q once and never releases it.
#if W3_PERSISTENT
#define W3_RELEASE_Q() warp_release(W3_Q_EMPTY, lane)
#else
#define W3_RELEASE_Q() do { } while (0)
#endif

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

// One consumer warpgroup's share of one query block: its slots, its idle turns and the store.
__device__ __forceinline__ void w3_consume(const unsigned char* tmaps, int wg, unsigned q_s, unsigned k_s, unsigned v_s, unsigned bars,
                                           ft_raw* __restrict__ o, float* __restrict__ lse, int m0, int bh,
                                           int n_tiles, int kv0, int it, int Nq, int Nk, float scale_log2,
                                           int causal, int diag_offset) {
    const ft_consumer me = tma_consumer(wg, m0, q_s);
    const int cw = me.cw, lane = me.lane, t = me.t, wg_row0 = me.wg_row0, warp_row0 = me.warp_row0, r0 = me.r0;
    const unsigned q_addr = me.q_addr;
    // The ring's successor is (cw == last ? 0 : cw + 1) for two consumers as for three, but written that
    // way ptxas compiles ping-pong to another prologue than the one every two-consumer measurement ran
    // (book/perflog_hopper.md), so two consumers keep ping-pong's own form, 1 - cw.
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
#if !W3_PIN_OVERLAP
            warp_release(W3_K_EMPTY(s), lane);   // (W3_PIN_ANCHOR keeps it here)
#endif
            if (j == my_tiles - 1) W3_RELEASE_Q();
            wg_mask<W3_BLOCK_N>(sc, j * W3_BLOCK_N, Nk, causal, diag_offset, warp_row0, r0, t);
            // P_j = exp2(...) in float32 over S_j itself: pf still holds P_{j-1}, which the P V in flight
            // is reading. (A second array for P_j, copied into pf at the end of the slot, makes ptxas
            // serialise every wgmma, C7513: it merges the copy's registers with the operands in flight.)
            const bool moved = wg_softmax_max<W3_BLOCK_N>(sc, m, l, scale_log2, alpha, neg_mscaled);
            wg_softmax_exp_inplace<W3_BLOCK_N>(sc, l, neg_mscaled, scale_log2);
#if W3_PIN_OVERLAP
            warp_release_after(W3_K_EMPTY(s), lane, l);   // keeps the softmax above the wait (W3_PIN_OVERLAP)
#elif W3_PIN_ANCHOR
            warp_release_after(W3_ANCHOR, lane, l);       // the same, on a barrier nobody waits for
#endif
            // O holds tiles 0 .. j - 1 at the old maxima once the P V is done; only then may it be
            // rescaled, and pf overwritten with P_j
            wgmma_wait<0>();
            wgmma_fence_operands<HEAD_DIM / 2>(acc);
            wgmma_fence_operands<W3_BLOCK_N / 4>(pf);   // P_{j-1} stays in its registers until here
            warp_release(W3_V_EMPTY(ps), lane);
            if (moved) wg_rescale(acc, alpha);
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

// W3: grid (ceil(Nq / W3_BLOCK_M), B * H), one query block per block ((B * H, ceil(Nq / W3_BLOCK_M)) with
// W3_HEADS_FIRST; with W3_TMA_STORE the tensor map of o follows V's). W4 (W3_PERSISTENT): grid (at most
// the SM count) of blocks that each take query blocks until none is left (B * H heads: n_bh).
// Block W3_THREADS threads (384, or 512 with three consumers), dynamic shared memory
// W3_Q_BYTES + 2 * W3_STAGES * W3_KV_BYTES + 1024 (alignment) + 8 * (1 + 4 * W3_STAGES) (mbarriers)
// and for W4 8 more (q_empty) and 8 (the query block numbers handed to the consumers, two slots).

#ifndef W3_HEAD_SECTION
#define W3_HEAD_SECTION 8   // causal: heads whose query blocks are taken together, heaviest first
#endif
// Query block number t (0, 1, ... in the order blocks take them) -> (query block mb, head bh): W4's
// order, and W3's with W3_SECTION_ORDER (the hardware starts a grid's blocks about in index order).
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
    // lane 0's warpgroup index, broadcast: every lane's is the same, but ptxas knows it only of a shuffle's
    // result (FT_WG_UNIFORM above)
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
#else
    const int wg = threadIdx.x / 128;
#endif
#if !W3_PERSISTENT && W3_SECTION_ORDER
    int mb = blockIdx.x, bh = blockIdx.y;
    if (causal) section_query_block(blockIdx.x + gridDim.x * blockIdx.y, gridDim.x, gridDim.y, 1, mb, bh);
    const ft_tma_block blk = tma_block_at<W3_BLOCK_N>(mb, gridDim.x, Nq, Nk, causal, diag_offset);
#elif !W3_PERSISTENT && W3_HEADS_FIRST
    // the hardware starts blocks about in index order, x fastest: every head's heaviest query block, then
    // every head's next heaviest ... (causal), the longest work first across the whole grid
    const int bh = blockIdx.x;
    const ft_tma_block blk = tma_block_at<W3_BLOCK_N>(causal ? (int)(gridDim.y - 1 - blockIdx.y) : (int)blockIdx.y,
                                                      gridDim.y, Nq, Nk, causal, diag_offset);
#elif !W3_PERSISTENT
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
#if W3_PIN_ANCHOR
        mbar_init(W3_ANCHOR, 1);
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
    // W4_STATIC: block b takes t = b, b + gridDim.x, ... and every warpgroup computes the same sequence,
    // so nothing is handed over (the causal order still puts the heaviest query blocks first).
    const int n_mb = (Nq + W3_BLOCK_M - 1) / W3_BLOCK_M, n_work = n_mb * n_bh;
#if !W4_STATIC
    int* const counter = reinterpret_cast<int*>(tmaps + 3 * 128);
    volatile int* const slot = (volatile int*)(smem + (bars - q_s) + 8 * (2 + 4 * W3_STAGES));
#endif
    if (wg == 0) {
        setmaxnreg_dec<W3_PRODUCER_REGS>();
#if W4_NAMED_HANDOVER
        if (threadIdx.x < 32) {
            const bool lead = threadIdx.x == 0;
            int t = blockIdx.x, kv0 = 0;
            for (int it = 0;; ++it) {
                if (it > 0) slot_bar_sync<W4_SLOT_EMPTY>();   // every consumer has loaded the last number
                if (lead) *slot = t < n_work ? t : -1;
                slot_bar_arrive<W4_SLOT_FULL>();
                if (t >= n_work) break;
                int next = 0;
                if (lead) {   // the next number taken before the loads, so that the atomic's round trip runs under them
                    next = atomicAdd(counter, 1) + grid_blocks_here();
                    int bh;
                    const ft_tma_block blk = w4_query_block(t, n_mb, n_bh, Nq, Nk, causal, diag_offset, bh);
                    w3_produce(tmaps, q_s, k_s, v_s, bars, blk.m0, bh, bh / kv_group, blk.n_tiles, kv0, it);
                    kv0 += blk.n_tiles;
                }
                t = __shfl_sync(0xffffffffu, next, 0);   // lane 0's: whether to go on is the warp's
            }
        }
        return;
#endif
        if (threadIdx.x == 0) {
            int t = blockIdx.x, kv0 = 0;
            for (int it = 0;; ++it) {
#if W4_STATIC
                if (t >= n_work) break;
                if (it > 0) mbar_wait(W3_Q_EMPTY, (unsigned)(it - 1) & 1u);   // Q is free
                const int next = t + (int)gridDim.x;
#else
                if (it > 0) mbar_wait(W3_Q_EMPTY, (unsigned)(it - 1) & 1u);   // Q and slot it % 2 are free
                slot[it & 1] = t < n_work ? t : -1;
                if (t >= n_work) {
                    mbar_arrive(W3_Q_FULL(bars));
                    break;
                }
                const int next = atomicAdd(counter, 1) + (int)gridDim.x;
#endif
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
#if W4_STATIC
        const int t = (int)blockIdx.x + it * (int)gridDim.x;
        if (t >= n_work) break;
        mbar_wait(W3_Q_FULL(bars), (unsigned)it & 1u);
#elif W4_NAMED_HANDOVER
        slot_bar_sync<W4_SLOT_FULL>();
        const int t = *slot;
        if (t < 0) break;               // the producer has left: no arrival on W4_SLOT_EMPTY
        slot_bar_arrive<W4_SLOT_EMPTY>();
        mbar_wait(W3_Q_FULL(bars), (unsigned)it & 1u);
#else
        mbar_wait(W3_Q_FULL(bars), (unsigned)it & 1u);
        const int t = slot[it & 1];
        if (t < 0) break;
#endif
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
#undef W3_ANCHOR
