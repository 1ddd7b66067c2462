// Backward step 1: dK and dV, one thread block per key block, probabilities recomputed.
//
// A block owns DKDV_BLOCK_N = 16 * DKDV_WARPS keys; warp w owns keys 16w..16w+15 of them and keeps
// their dK and dV rows (16 x HEAD_DIM each, fp32) in registers for the whole kernel. The block walks
// the query blocks (DKDV_BLOCK_M queries each), double-buffering Q, dO, lse2 and Delta through
// shared memory with cp.async, and per query block every warp computes, on tensor cores and in
// the transposed orientation (its keys are the rows, so no two warps share an output row):
//   S^T  = K_w Q^T                      16 x BLOCK_M   (A: K rows, B: Q rows)
//   P^T  = 2^(S^T * scale * log2e - lse2[query])       recomputed, exactly normalised
//   dP^T = V_w dO^T                     16 x BLOCK_M   (A: V rows, B: dO rows)
//   dS^T = P^T * (dP^T - Delta[query])
//   dV  += P^T dO,   dK += dS^T Q       P^T and dS^T go from accumulator to A-operand registers
// dK is multiplied by the softmax scale once at the end. dQ is left to bwd_dq.cu (see there why),
// or, built with DKDV_DQ_ATOMIC=1, the block also writes dS^T to shared memory and adds
// dQ += dS K for its key block into a float32 buffer with atomic adds (bwd_dq_convert.cu then
// scales and converts it).
// Causal (query i sees keys j <= i + diag_offset; 0 is top-left, Nk - Nq bottom-right): query
// blocks that end before this key block's diagonal are skipped; only tiles that cross the
// diagonal, or hang over the end of the query sequence, pay for the per-element mask.
// Grouped-query heads: a block still belongs to one query head (grid.y = B * H) and reads K/V
// head bh / kv_group; it writes that query head's share of dK/dV, and backward.py sums the
// kv_group shares of each K/V head in float32 (accumulate, then reduce). Looping over the group
// inside the block would avoid the (B, H, Nk, D) buffers, but at D = 128 this kernel uses 254 of
// the 255 registers a thread can have, and the loop's extra live values made it spill.
// D = 256 (DKDV_SPLIT): dK and dV of 16 keys x 256 columns in float32 would take 256 registers
// per thread on their own. The grid gets a z dimension of 2 instead: z = 0 blocks accumulate dV
// (S^T, then dV += P^T dO: two products), z = 1 blocks dK (S^T, dP^T, dK += dS^T Q: three, and
// the atomic dQ if built with it), each in one 128-register accumulator. Five products per tile
// pair instead of four, in exchange for no spill; both halves run side by side on the GPU.
// DKDV_WARP_GRID (8 warps, 128 keys, atomic dQ, D = 64 or 128): FlashAttention-2's split. With
// one warp per 16 keys every warp reads the whole Q and dO tile for S^T and dP^T (each B fragment
// feeds 2 products), and only BLOCK_M / 16 of the 8 warps have a dQ tile. On the grid, warp
// w = 4h + g (g = w % 4, h = w / 4):
//   S^T, dP^T   keys 32g..32g+31 x queries h*BLOCK_M/2.. (2 m-tiles: each Q/dO fragment feeds 4)
//   dK, dV      keys 32g..32g+31 x columns h*HEAD_DIM/2.. (the same keys: same register budget)
//   dQ          queries 32(w % (BLOCK_M/32)).. x HEAD_DIM*BLOCK_M/256 columns, on every warp
// dV += P^T dO needs P^T of its keys for all queries: warps w and w ^ 4 each hold half. Both write
// P^T (and dS^T, which dQ needs anyway) to shared memory, multiply their own half from registers,
// and after the block's barrier read the partner's half; still two barriers per step.
#include "bwd_common.cuh"

#ifndef DKDV_WARPS
#define DKDV_WARPS 4
#endif
#ifndef DKDV_BLOCK_M
#define DKDV_BLOCK_M 64    // queries per step (a multiple of 16)
#endif
#ifndef DKDV_STAGES
#define DKDV_STAGES 2      // 2: prefetch the next query block while computing this one
#endif
#ifndef DKDV_DQ_ATOMIC
#define DKDV_DQ_ATOMIC 0   // 1: also add this key block's share of dQ into a float32 buffer
#endif
#ifndef DKDV_ONE_BARRIER
#define DKDV_ONE_BARRIER 0 // 1 (two stages): the next stage is copied after the step's first barrier,
#endif                     // which then also protects its buffer: no barrier at the end of a step
#ifndef DKDV_SPLIT
#define DKDV_SPLIT (HEAD_DIM > 128)  // 1: dV in blocks with blockIdx.z == 0, dK in those with 1
#endif
#ifndef DKDV_WARP_GRID
#define DKDV_WARP_GRID 0   // 1: FlashAttention-2's warp grid (see above); 8 warps and atomic dQ only
#endif
#ifndef DKDV_DQ_STAGE
#define DKDV_DQ_STAGE 0    // 1 (atomic dQ): each warp stages its dQ tile in shared memory and adds
#endif                     // it with 16-byte red.global.add.v4.f32 (sm_90) instead of 8-byte ones
// Blocks per SM to keep resident; it sets ptxas' register budget (65536 / (blocks * threads)).
// As many as shared memory holds: three 55 KB blocks at D = 64 on sm_90 (168 registers), two
// on sm_80 (A100: 164 KB per SM) and at D = 128 everywhere, one on a T4 (64 KB per SM). Eight
// warps (128-key blocks) take one block per SM: two would leave 128 registers per thread.
#ifndef DKDV_MIN_BLOCKS
#if DKDV_WARPS >= 8
#define DKDV_MIN_BLOCKS 1
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && HEAD_DIM <= 64
#define DKDV_MIN_BLOCKS 3
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define DKDV_MIN_BLOCKS 2
#else
#define DKDV_MIN_BLOCKS 1
#endif
#endif

#define DKDV_BLOCK_N (16 * DKDV_WARPS)
#define DKDV_THREADS (32 * DKDV_WARPS)
#define DKDV_MT (DKDV_BLOCK_M / 8)        // n-tiles of 8 queries in S^T
#define DKDV_TILE_BYTES(rows) ((rows) * BWD_LDS * 2)
// one stage: Q tile, dO tile, lse2[BLOCK_M], Delta[BLOCK_M]
#define DKDV_STAGE_BYTES (2 * DKDV_TILE_BYTES(DKDV_BLOCK_M) + 2 * DKDV_BLOCK_M * 4)
// atomic-dQ variant: dS^T of the whole block, BLOCK_N keys x BLOCK_M queries (+8 padding)
#define DKDV_LDS_DS (DKDV_BLOCK_M + 8)
#if DKDV_DQ_ATOMIC
#define DKDV_DS_BYTES (DKDV_BLOCK_N * DKDV_LDS_DS * 2)
#else
#define DKDV_DS_BYTES 0
#endif
// the atomic dQ product works on DKDV_DQ_COLS columns at a time: 64 keep its accumulator at 32
// registers; head dims that are an odd multiple of 32 (32, 96) take 32-column chunks. On the warp
// grid each warp has 32 queries x DKDV_DQ_COLS columns, the block's 8 warps the whole tile
#if DKDV_WARP_GRID
#define DKDV_DQ_COLS (HEAD_DIM * DKDV_BLOCK_M / 256)
#else
#define DKDV_DQ_COLS (HEAD_DIM % 64 == 0 ? 64 : 32)
#endif
// dQ staging (DKDV_DQ_STAGE): per warp 16 rows x DKDV_DQ_COLS float32 columns, rows padded by 8
// floats so the accumulator's 8-byte writes (a half-warp covers 4 rows x 4 pairs) hit 32
// different banks
#define DKDV_LDS_DQ (DKDV_DQ_COLS + 8)
#if DKDV_DQ_ATOMIC && DKDV_DQ_STAGE
#define DKDV_DQ_STAGE_BYTES (DKDV_WARPS * 16 * DKDV_LDS_DQ * 4)
#else
#define DKDV_DQ_STAGE_BYTES 0
#endif
// the warp grid's P^T tile (the same shape as dS^T), after the staging tiles
#define DKDV_P_BYTES (DKDV_WARP_GRID ? DKDV_BLOCK_N * DKDV_LDS_DS * 2 : 0)

#if DKDV_BLOCK_M % 16 != 0
#error "DKDV_BLOCK_M must be a multiple of 16"
#endif
#if DKDV_STAGES != 1 && DKDV_STAGES != 2
#error "DKDV_STAGES must be 1 or 2"
#endif
#if DKDV_DQ_ATOMIC && HEAD_DIM % 32 != 0
#error "the atomic-dQ variant works on 32- or 64-column chunks of the head dim"
#endif
#if DKDV_ONE_BARRIER && DKDV_STAGES != 2
#error "DKDV_ONE_BARRIER needs two stages"
#endif
#if DKDV_WARP_GRID && (DKDV_WARPS != 8 || !DKDV_DQ_ATOMIC || DKDV_SPLIT || (HEAD_DIM != 64 && HEAD_DIM != 128) \
                       || DKDV_BLOCK_M % 32 != 0 || DKDV_DQ_COLS % 16 != 0)
#error "DKDV_WARP_GRID is built for 8 warps, atomic dQ, HEAD_DIM 64 or 128 and BLOCK_M 64 or 128"
#endif

// dQ += x at p[0..3] (16-byte aligned): one vector reduction in L2 on sm_90, four scalar ones before
__device__ __forceinline__ void red_add4(float* p, float4 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "f"(x.x), "f"(x.y), "f"(x.z), "f"(x.w) : "memory");
#else
    atomicAdd(p, x.x);
    atomicAdd(p + 1, x.y);
    atomicAdd(p + 2, x.z);
    atomicAdd(p + 3, x.w);
#endif
}

// dQ += v0, v1 at p[0], p[1]: one vector reduction in L2 on sm_90, two scalar ones before
__device__ __forceinline__ void red_add2(float* p, float v0, float v1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(v0), "f"(v1) : "memory");
#else
    atomicAdd(p, v0);
    atomicAdd(p + 1, v1);
#endif
}

// A fragments (16 rows x 16*KT, packed pairs) -> rows row0.. and columns col0.. of a tile of
// DKDV_LDS_DS-element rows, in the layout the transposing and plain ldmatrix read back
template <int KT>
__device__ __forceinline__ void store_a_frags(ft_raw* tile, int row0, int col0, const u32 (&a)[KT][4], int lane) {
    ft_raw* row_a = tile + (row0 + lane / 4) * DKDV_LDS_DS + col0 + 2 * (lane % 4);
    ft_raw* row_b = row_a + 8 * DKDV_LDS_DS;
#pragma unroll
    for (int t = 0; t < KT; ++t) {
        *reinterpret_cast<u32*>(row_a + 16 * t) = a[t][0];
        *reinterpret_cast<u32*>(row_b + 16 * t) = a[t][1];
        *reinterpret_cast<u32*>(row_a + 16 * t + 8) = a[t][2];
        *reinterpret_cast<u32*>(row_b + 16 * t + 8) = a[t][3];
    }
}

// Warp grid: a warp's 32 x 8*NQ accumulator block (2 m-tiles, rows row0.., columns col0.. of a
// shared tile) -> packed A fragments, written to the tile for the other warps, and acc += them *
// B (k-major rows at b_base) for this warp's own half of the queries
template <int NQ, int NT>
__device__ __forceinline__ void share_and_accumulate(float (&acc)[2][NT][4], const float (&c)[2][NQ][4], ft_raw* tile,
                                                     int row0, int col0, u32 b_base, int lane) {
    u32 a[2][NQ / 2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        acc_to_a<NQ>(a[m], c[m]);
        store_a_frags<NQ / 2>(tile, row0 + 16 * m, col0, a[m], lane);
    }
    mma_ab_m<2, NQ / 2, NT>(acc, a, b_base, lane);
}

// acc (16*MT queries x 8*NT columns) = dS K over the block's keys, queries q_off.. of the tile and
// columns c0..: A = dS, stored key-major as dS^T at s_ds, is read with the transposing ldmatrix;
// B = the K tile at s_kb. Each K fragment feeds 2*MT products.
template <int MT, int NT>
__device__ __forceinline__ void dq_product(float (&acc)[MT][NT][4], u32 s_ds, int q_off, u32 s_kb, int c0,
                                           int lane) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < DKDV_BLOCK_N / 16; ++kt) {
        u32 a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
            ldmatrix_x4_trans(a[m], s_ds + lane_off_b(lane, DKDV_LDS_DS) +
                                    (u32)((kt * 16 * DKDV_LDS_DS + q_off + m * 16) * 2));
#pragma unroll
        for (int dn = 0; dn < NT / 2; ++dn) {
            u32 b[4];
            ldmatrix_x4_trans(b, s_kb + lane_off_a(lane) + (u32)((kt * 16 * BWD_LDS + c0 + dn * 16) * 2));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16x8x16(acc[m][2 * dn], a[m], b[0], b[1]);
                mma_16x8x16(acc[m][2 * dn + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// dQ[row0 .. row0 + 15][c0 .. c0 + 8*NT) += one m-tile of the accumulator (rows past n_q are
// dropped). DKDV_DQ_STAGE: through this warp's staging tile `st` (16 rows of DKDV_LDS_DQ floats,
// rows padded by 8 floats so the accumulator's 8-byte writes, a half-warp covering 4 rows x 4
// pairs, hit 32 different banks) as 16-byte reductions, else 8-byte ones from the registers.
template <int NT>
__device__ __forceinline__ void add_dq(float* dq_accum, const float (&acc)[NT][4], int row0, int n_q,
                                       int c0, float* st, int lane) {
#if DKDV_DQ_STAGE
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const int col = t * 8 + 2 * (lane % 4);
        *reinterpret_cast<float2*>(st + (lane / 4) * DKDV_LDS_DQ + col) = make_float2(acc[t][0], acc[t][1]);
        *reinterpret_cast<float2*>(st + (lane / 4 + 8) * DKDV_LDS_DQ + col) = make_float2(acc[t][2], acc[t][3]);
    }
    __syncwarp();
    // 16 rows of 2 * NT float4 each: `per_row` lanes share a row
    constexpr int per_row = 2 * NT, rows_per = 32 / per_row;
#pragma unroll
    for (int i = 0; i < 16 / rows_per; ++i) {
        const int row = lane / per_row + rows_per * i, col = 4 * (lane % per_row);
        const int qr = row0 + row;
        if (qr < n_q)
            red_add4(dq_accum + (long long)qr * HEAD_DIM + c0 + col,
                     *reinterpret_cast<const float4*>(st + row * DKDV_LDS_DQ + col));
    }
    __syncwarp();   // the staging tile is read before the next chunk overwrites it
#else
    const int qa = row0 + lane / 4, qb = qa + 8;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const int col = c0 + t * 8 + 2 * (lane % 4);
        if (qa < n_q) red_add2(dq_accum + (long long)qa * HEAD_DIM + col, acc[t][0], acc[t][1]);
        if (qb < n_q) red_add2(dq_accum + (long long)qb * HEAD_DIM + col, acc[t][2], acc[t][3]);
    }
#endif
}

// Dynamic shared memory of a launch: K and V tiles, the dS^T tile of the atomic variant, the dQ
// staging tiles, the warp grid's P^T tile, then DKDV_STAGES stages (configs.py computes the same sum).

extern "C" __global__ void __launch_bounds__(DKDV_THREADS, DKDV_MIN_BLOCKS)
attn_bwd_dkdv(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k,
              const ft_raw* __restrict__ v, const ft_raw* __restrict__ dout,
              const float* __restrict__ lse2, const float* __restrict__ delta,
              ft_raw* __restrict__ dk, ft_raw* __restrict__ dv,
              int n_q, int n_k, float scale, float scale_log2, int causal,
              float* __restrict__ dq_accum,     // atomic variant only: (B, H, Nq, D) float32, zeroed
              int kv_group, int diag_offset) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int k0 = blockIdx.x * DKDV_BLOCK_N;
    const long long bh = blockIdx.y;          // b * H + h; its K/V head is b * Hkv + h / kv_group
    q += bh * n_q * HEAD_DIM;
    dout += bh * n_q * HEAD_DIM;
    k += (bh / kv_group) * n_k * HEAD_DIM;
    v += (bh / kv_group) * n_k * HEAD_DIM;
    dk += bh * n_k * HEAD_DIM;
    dv += bh * n_k * HEAD_DIM;
    lse2 += bh * n_q;
    delta += bh * n_q;
#if DKDV_DQ_ATOMIC
    dq_accum += bh * n_q * HEAD_DIM;
#endif

    // shared memory: K tile, V tile, [dS^T tile, dQ staging, P^T tile], then per stage a Q tile,
    // a dO tile, lse2, Delta
    ft_raw* t_k = reinterpret_cast<ft_raw*>(smem);
    ft_raw* t_v = t_k + DKDV_BLOCK_N * BWD_LDS;
    unsigned char* stage0 = smem + 2 * DKDV_TILE_BYTES(DKDV_BLOCK_N) + DKDV_DS_BYTES + DKDV_DQ_STAGE_BYTES
                            + DKDV_P_BYTES;

    // causal: query i sees key j only if j <= i + diag_offset, so queries below k0 - diag_offset
    // see nothing of this block
    const int first_q = causal ? (max(0, k0 - diag_offset) / DKDV_BLOCK_M) * DKDV_BLOCK_M : 0;
    const int n_steps = first_q < n_q ? (n_q - first_q + DKDV_BLOCK_M - 1) / DKDV_BLOCK_M : 0;

    auto load_stage = [&](int stage, int q_start) {
        ft_raw* t_q = reinterpret_cast<ft_raw*>(stage0 + stage * DKDV_STAGE_BYTES);
        ft_raw* t_do = t_q + DKDV_BLOCK_M * BWD_LDS;
        float* vec = reinterpret_cast<float*>(t_do + DKDV_BLOCK_M * BWD_LDS);
        load_tile<DKDV_BLOCK_M, DKDV_THREADS>(t_q, q, q_start, n_q);
        load_tile<DKDV_BLOCK_M, DKDV_THREADS>(t_do, dout, q_start, n_q);
        load_vec<DKDV_BLOCK_M, DKDV_THREADS>(vec, lse2, q_start, n_q);
        load_vec<DKDV_BLOCK_M, DKDV_THREADS>(vec + DKDV_BLOCK_M, delta, q_start, n_q);
    };

    load_tile<DKDV_BLOCK_N, DKDV_THREADS>(t_k, k, k0, n_k);
    load_tile<DKDV_BLOCK_N, DKDV_THREADS>(t_v, v, k0, n_k);
    if (n_steps > 0) load_stage(0, first_q);
    cp_async_commit();

    // this warp's first key row in the block, and (warp grid) its half: of the queries in S^T and
    // of the columns of dK, dV
    const int wrow = DKDV_WARP_GRID ? 32 * (warp % 4) : 16 * warp;
#if DKDV_WARP_GRID
    constexpr bool want_dv = true, want_dk = true;
    constexpr int QN = DKDV_BLOCK_M / 2, DH = HEAD_DIM / 2;   // queries, columns of a warp's half
    const int half = warp / 4;
    float acc_dk[2][DH / 8][4], acc_dv[2][DH / 8][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int t = 0; t < DH / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[m][t][e] = acc_dv[m][t][e] = 0.0f;
#else
    // which outputs this block accumulates: both, or (DKDV_SPLIT) dV when blockIdx.z == 0 and dK
    // when it is 1; a block-uniform branch, so the barriers inside it are reached by all threads
#if DKDV_SPLIT
    const bool want_dv = blockIdx.z == 0, want_dk = !want_dv;
    float acc_dv[HEAD_DIM / 8][4];
    float (&acc_dk)[HEAD_DIM / 8][4] = acc_dv;    // one accumulator holds whichever it is
#else
    constexpr bool want_dv = true, want_dk = true;
    float acc_dk[HEAD_DIM / 8][4], acc_dv[HEAD_DIM / 8][4];
#endif
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[t][e] = acc_dv[t][e] = 0.0f;
#endif

    // this lane's first key row, shifted by -diag_offset: the first query row that sees it
    // (query i sees key j iff j - diag_offset <= i); kept shifted so diag_offset is not live in the loop
    const int key_a = k0 + wrow + lane / 4 - diag_offset, key_b = key_a + 8;
    const int diag_first = k0 + DKDV_BLOCK_N - 1 - diag_offset;  // queries below it cross the diagonal
    // ldmatrix takes shared-window addresses: this warp's rows of K and V
    const u32 s_kw = smem_addr(t_k + wrow * BWD_LDS), s_vw = smem_addr(t_v + wrow * BWD_LDS);

    for (int step = 0; step < n_steps; ++step) {
        const int q0 = first_q + step * DKDV_BLOCK_M;
        const int stage = DKDV_STAGES == 1 ? 0 : step % 2;
        if (DKDV_ONE_BARRIER) {
            cp_async_wait<0>();   // this step's stage has landed (it was copied during the last step)
        } else if (DKDV_STAGES == 1) {
            if (step > 0) { load_stage(0, q0); cp_async_commit(); }
            cp_async_wait<0>();
        } else if (step + 1 < n_steps) {
            load_stage((step + 1) % 2, q0 + DKDV_BLOCK_M);
            cp_async_commit();
            cp_async_wait<1>();       // this step's group has landed; the next one may still fly
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (DKDV_ONE_BARRIER && step + 1 < n_steps) {
            // every warp is past the last step, so the other stage (and dS^T) is free
            load_stage((step + 1) % 2, q0 + DKDV_BLOCK_M);
            cp_async_commit();
        }

        const ft_raw* t_q = reinterpret_cast<const ft_raw*>(stage0 + stage * DKDV_STAGE_BYTES);
        const u32 s_q = smem_addr(t_q), s_do = smem_addr(t_q + DKDV_BLOCK_M * BWD_LDS);
        const float* s_lse2 = reinterpret_cast<const float*>(t_q + 2 * DKDV_BLOCK_M * BWD_LDS);
        const float* s_delta = s_lse2 + DKDV_BLOCK_M;
        const bool edge = q0 + DKDV_BLOCK_M > n_q || (causal && diag_first > q0);
#if DKDV_WARP_GRID
        ft_raw* t_ds = t_v + DKDV_BLOCK_N * BWD_LDS;
        float* st = reinterpret_cast<float*>(t_ds + DKDV_BLOCK_N * DKDV_LDS_DS) + warp * 16 * DKDV_LDS_DQ;
        ft_raw* t_p = reinterpret_cast<ft_raw*>(reinterpret_cast<unsigned char*>(t_ds) + DKDV_DS_BYTES
                                                + DKDV_DQ_STAGE_BYTES);
        const int own_q = half * QN, other_q = QN - own_q;   // first query column of each half
        // S^T = K_w Q^T, dP^T = V_w dO^T on this warp's 32 keys x QN queries
        float p[2][QN / 8][4], ds[2][QN / 8][4];
        mma_abt_m<2, QN / 8>(p, s_kw, s_q + (u32)(own_q * BWD_LDS * 2), lane);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int t = 0; t < QN / 8; ++t) {
                const int qc = own_q + t * 8 + 2 * (lane % 4);   // this lane's two query columns
                const float l0 = s_lse2[qc], l1 = s_lse2[qc + 1];
                p[m][t][0] = ft_exp2(p[m][t][0] * scale_log2 - l0);
                p[m][t][1] = ft_exp2(p[m][t][1] * scale_log2 - l1);
                p[m][t][2] = ft_exp2(p[m][t][2] * scale_log2 - l0);
                p[m][t][3] = ft_exp2(p[m][t][3] * scale_log2 - l1);
                if (edge) {   // queries past the end contribute nothing; neither do keys j > i
                    const int qa = q0 + qc, qb = qa + 1, ka = key_a + 16 * m, kb = key_b + 16 * m;
                    if (qa >= n_q || (causal && ka > qa)) p[m][t][0] = 0.0f;
                    if (qb >= n_q || (causal && ka > qb)) p[m][t][1] = 0.0f;
                    if (qa >= n_q || (causal && kb > qa)) p[m][t][2] = 0.0f;
                    if (qb >= n_q || (causal && kb > qb)) p[m][t][3] = 0.0f;
                }
            }
        // P^T to shared for the partner warp; this warp's half of dV += P^T dO (dK below) from
        // registers, before dP^T: P's packed fragments are dead by then, which keeps D = 128 unspilled
        const u32 col = (u32)(half * DH * 2);
        share_and_accumulate(acc_dv, p, t_p, wrow, own_q, s_do + (u32)(own_q * BWD_LDS * 2) + col, lane);
        mma_abt_m<2, QN / 8>(ds, s_vw, s_do + (u32)(own_q * BWD_LDS * 2), lane);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int t = 0; t < QN / 8; ++t) {
                const int qc = own_q + t * 8 + 2 * (lane % 4);
                const float d0 = s_delta[qc], d1 = s_delta[qc + 1];
                ds[m][t][0] = p[m][t][0] * (ds[m][t][0] - d0);
                ds[m][t][1] = p[m][t][1] * (ds[m][t][1] - d1);
                ds[m][t][2] = p[m][t][2] * (ds[m][t][2] - d0);
                ds[m][t][3] = p[m][t][3] * (ds[m][t][3] - d1);
            }
        // dS^T to shared for the partner and for every warp's dQ
        share_and_accumulate(acc_dk, ds, t_ds, wrow, own_q, s_q + (u32)(own_q * BWD_LDS * 2) + col, lane);
        __syncthreads();   // P^T and dS^T of the whole block are in shared memory
        {
            // the partner's half of the queries, its A fragments read back 16 queries at a time
            const u32 s_pw = smem_addr(t_p + wrow * DKDV_LDS_DS + other_q) + lane_off_a(lane, DKDV_LDS_DS);
            const u32 s_dsw = smem_addr(t_ds + wrow * DKDV_LDS_DS + other_q) + lane_off_a(lane, DKDV_LDS_DS);
#pragma unroll
            for (int kt = 0; kt < QN / 16; ++kt) {
                u32 a[2][1][4];
                const u32 b_row = (u32)((other_q + 16 * kt) * BWD_LDS * 2) + col;
#pragma unroll
                for (int m = 0; m < 2; ++m)
                    ldmatrix_x4(a[m][0], s_pw + (u32)((16 * m * DKDV_LDS_DS + 16 * kt) * 2));
                mma_ab_m<2, 1, DH / 8>(acc_dv, a, s_do + b_row, lane);
#pragma unroll
                for (int m = 0; m < 2; ++m)
                    ldmatrix_x4(a[m][0], s_dsw + (u32)((16 * m * DKDV_LDS_DS + 16 * kt) * 2));
                mma_ab_m<2, 1, DH / 8>(acc_dk, a, s_q + b_row, lane);
            }
        }
        {
            // dQ += dS K on every warp: 32 queries x DKDV_DQ_COLS columns each
            constexpr int QG = DKDV_BLOCK_M / 32;   // query groups of the dQ grid
            const int qg = warp % QG, c0 = (warp / QG) * DKDV_DQ_COLS;
            float acc[2][DKDV_DQ_COLS / 8][4];
            dq_product<2, DKDV_DQ_COLS / 8>(acc, smem_addr(t_ds), 32 * qg, smem_addr(t_k), c0, lane);
#pragma unroll
            for (int m = 0; m < 2; ++m)
                add_dq<DKDV_DQ_COLS / 8>(dq_accum, acc[m], q0 + 32 * qg + 16 * m, n_q, c0, st, lane);
        }
#else
        float p[DKDV_MT][4];
        mma_abt<DKDV_MT>(p, s_kw, s_q, lane);                 // S^T = K_w Q^T
#pragma unroll
        for (int t = 0; t < DKDV_MT; ++t) {
            const int qc = t * 8 + 2 * (lane % 4);             // this lane's two query columns
            const float l0 = s_lse2[qc], l1 = s_lse2[qc + 1];
            p[t][0] = ft_exp2(p[t][0] * scale_log2 - l0);
            p[t][1] = ft_exp2(p[t][1] * scale_log2 - l1);
            p[t][2] = ft_exp2(p[t][2] * scale_log2 - l0);
            p[t][3] = ft_exp2(p[t][3] * scale_log2 - l1);
            if (edge) {   // queries past the end contribute nothing; neither do keys j > i
                const int qa = q0 + qc, qb = qa + 1;
                if (qa >= n_q || (causal && key_a > qa)) p[t][0] = 0.0f;
                if (qb >= n_q || (causal && key_a > qb)) p[t][1] = 0.0f;
                if (qa >= n_q || (causal && key_b > qa)) p[t][2] = 0.0f;
                if (qb >= n_q || (causal && key_b > qb)) p[t][3] = 0.0f;
            }
        }

        float ds[DKDV_MT][4];
        if (want_dk) {
            mma_abt<DKDV_MT>(ds, s_vw, s_do, lane);           // dP^T = V_w dO^T
#pragma unroll
            for (int t = 0; t < DKDV_MT; ++t) {
                const int qc = t * 8 + 2 * (lane % 4);
                const float d0 = s_delta[qc], d1 = s_delta[qc + 1];
                ds[t][0] = p[t][0] * (ds[t][0] - d0);
                ds[t][1] = p[t][1] * (ds[t][1] - d1);
                ds[t][2] = p[t][2] * (ds[t][2] - d0);
                ds[t][3] = p[t][3] * (ds[t][3] - d1);
            }
        }

        u32 pa[DKDV_MT / 2][4], dsa[DKDV_MT / 2][4];
        if (want_dv) acc_to_a<DKDV_MT>(pa, p);
        if (want_dk) acc_to_a<DKDV_MT>(dsa, ds);
#if DKDV_DQ_ATOMIC
        ft_raw* t_ds = t_v + DKDV_BLOCK_N * BWD_LDS;
        // this warp's 16 rows of dS^T -> shared (the A fragments are already packed pairs)
        if (want_dk) store_a_frags<DKDV_MT / 2>(t_ds, 16 * warp, 0, dsa, lane);
#endif
        if (want_dv) mma_ab<DKDV_MT / 2>(acc_dv, pa, s_do, lane);   // dV += P^T dO
        if (want_dk) mma_ab<DKDV_MT / 2>(acc_dk, dsa, s_q, lane);   // dK += dS^T Q
#if DKDV_DQ_ATOMIC
        if (want_dk) {   // block-uniform (DKDV_SPLIT: blockIdx.z), so every thread meets the barrier
            __syncthreads();   // the whole dS^T tile is in shared memory
            // dQ[q0 + 16 mt ...] += dS K: warp w takes query tiles w, w + WARPS, ...; A = dS, stored
            // key-major as dS^T, so it is read with the transposing ldmatrix; 64 columns at a time
            // keep the extra accumulator at 32 registers (DKDV_DQ_COLS); dq_product and add_dq compute
            // the same for the warp grid.
            const u32 s_ds = smem_addr(t_ds), s_kb = smem_addr(t_k);
            const u32 ds_lane = (u32)((((lane % 8) + 8 * (lane / 16)) * DKDV_LDS_DS + 8 * ((lane / 8) % 2)) * 2);
            for (int mt = warp; mt < DKDV_BLOCK_M / 16; mt += DKDV_WARPS) {
                const int qa = q0 + 16 * mt + lane / 4, qb = qa + 8;
#pragma unroll
                for (int c0 = 0; c0 < HEAD_DIM; c0 += DKDV_DQ_COLS) {
                    float acc[DKDV_DQ_COLS / 8][4];
#pragma unroll
                    for (int t = 0; t < DKDV_DQ_COLS / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
#pragma unroll
                    for (int kt = 0; kt < DKDV_BLOCK_N / 16; ++kt) {
                        u32 a[4];
                        ldmatrix_x4_trans(a, s_ds + ds_lane + (u32)((kt * 16 * DKDV_LDS_DS + mt * 16) * 2));
#pragma unroll
                        for (int dn = 0; dn < DKDV_DQ_COLS / 16; ++dn) {
                            u32 b[4];
                            ldmatrix_x4_trans(b, s_kb + lane_off_a(lane) +
                                                 (u32)((kt * 16 * BWD_LDS + c0 + dn * 16) * 2));
                            mma_16x8x16(acc[2 * dn], a, b[0], b[1]);
                            mma_16x8x16(acc[2 * dn + 1], a, b[2], b[3]);
                        }
                    }
#if DKDV_DQ_STAGE
                    // accumulator -> this warp's staging tile -> 16-byte reductions, 4 per row per lane
                    float* st = reinterpret_cast<float*>(t_ds + DKDV_BLOCK_N * DKDV_LDS_DS) + warp * 16 * DKDV_LDS_DQ;
#pragma unroll
                    for (int t = 0; t < DKDV_DQ_COLS / 8; ++t) {
                        const int col = t * 8 + 2 * (lane % 4);
                        *reinterpret_cast<float2*>(st + (lane / 4) * DKDV_LDS_DQ + col) = make_float2(acc[t][0], acc[t][1]);
                        *reinterpret_cast<float2*>(st + (lane / 4 + 8) * DKDV_LDS_DQ + col) = make_float2(acc[t][2], acc[t][3]);
                    }
                    __syncwarp();
                    // 16 rows of DKDV_DQ_COLS / 4 float4 each: `per_row` lanes share a row
                    constexpr int per_row = DKDV_DQ_COLS / 4, rows_per = 32 / per_row;
#pragma unroll
                    for (int i = 0; i < 16 / rows_per; ++i) {
                        const int row = lane / per_row + rows_per * i, col = 4 * (lane % per_row);
                        const int qr = q0 + 16 * mt + row;
                        if (qr < n_q)
                            red_add4(dq_accum + (long long)qr * HEAD_DIM + c0 + col,
                                     *reinterpret_cast<const float4*>(st + row * DKDV_LDS_DQ + col));
                    }
                    __syncwarp();   // the staging tile is read before the next chunk overwrites it
#else
#pragma unroll
                    for (int t = 0; t < DKDV_DQ_COLS / 8; ++t) {
                        const int col = c0 + t * 8 + 2 * (lane % 4);
                        if (qa < n_q) red_add2(dq_accum + (long long)qa * HEAD_DIM + col, acc[t][0], acc[t][1]);
                        if (qb < n_q) red_add2(dq_accum + (long long)qb * HEAD_DIM + col, acc[t][2], acc[t][3]);
                    }
#endif
                }
            }
        }
#endif
#endif
        if (!DKDV_ONE_BARRIER)
            __syncthreads();   // every warp is done with this stage (and dS^T) before it is refilled
    }

    cp_async_wait<0>();   // a block with no visible query block still has its K/V copies in flight
#if DKDV_WARP_GRID
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        const int col = (warp / 4) * (HEAD_DIM / 2);
        store_strip(dv + col, acc_dv[m], k0 + wrow + 16 * m, n_k, 1.0f, lane);
        store_strip(dk + col, acc_dk[m], k0 + wrow + 16 * m, n_k, scale, lane);
    }
#else
    if (want_dv) store_strip(dv, acc_dv, k0 + 16 * warp, n_k, 1.0f, lane);
    if (want_dk) store_strip(dk, acc_dk, k0 + 16 * warp, n_k, scale, lane);
#endif
}
