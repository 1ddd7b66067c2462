// fwd_v4_fa2.cu: ladder steps 4 to 7, FlashAttention-2's own forward on mma.sync, one change per step.
//
// Step 4 (V4_PIPE = 0): FlashAttention-2's tiling. 4 warps of 32 query rows (two 16-row m-tiles
//   per warp, V4_MT = 2), so every K or V fragment read from shared memory feeds two MMAs instead
//   of one; Q stays in shared memory and its fragments are re-read at every k-step (8 registers
//   instead of 64), which is what lets the 32-row warp fit 255 registers at D = 128 without a
//   spill; 128 threads and 96 KB per block, so two blocks share an SM. Data movement as in
//   step 3: K and V of tile j + 1 are copied together, in one cp.async group, while tile j is
//   computed (issued after its softmax), and one block-wide barrier per tile.
// Step 5 (V4_PIPE = 1): FlashAttention-2's pipeline. One K buffer and one V buffer, each in its
//   own cp.async group: issue V_j, compute S = Q K_j^T and the softmax, wait for V_j, issue
//   K_(j+1), then O += P V_j. A tile's V copy hides behind its S product and softmax, the next
//   K copy behind the P V product; 64 KB per block.
// Step 6 (V4_PIPE = 2): both: K and V each double buffered, each in its own group. A warp waits
//   only for the operand it needs next (K_j before S, V_j before P V), and each copy has a whole
//   tile of work to hide behind.
// Step 7 (V4_SKIP_RESCALE = 1): the rescaling of the output accumulator by exp2(m_old - m_new) is
//   skipped, for the whole warp, when no row maximum of the warp changed in this tile (a
//   warp-uniform __any_sync test, so the branch never diverges).
//
// Grouped-query heads and causal alignment, for real models: q is (B, H, Nq, D), k and v are
// (B, H / kv_group, Nk, D); query head bh reads K/V head bh / kv_group. Causal: query i sees key
// j iff j <= i + diag_offset (0: top-left, Nk - Nq: bottom-right); a row that sees no key writes
// o = 0 and lse = -inf. kv_group = 1, diag_offset = 0 is the behaviour of steps 1 to 3.
// Before sm_80 (T4) cp.async does not exist: the copies are synchronous, the groups empty, and
// the steps differ only in their barriers.
#include "ft_swizzle.cuh"

#ifndef V4_WARPS
#define V4_WARPS 4
#endif
#ifndef V4_MT
#define V4_MT 2  // 16-row m-tiles per warp
#endif
#ifndef V4_BLOCK_N
#define V4_BLOCK_N 64
#endif
#ifndef V4_PIPE
#define V4_PIPE 0  // 0: K+V double buffered together; 1: single K, V buffers, own groups; 2: both
#endif
#ifndef V4_SKIP_RESCALE
#define V4_SKIP_RESCALE 0
#endif
#ifndef V4_MIN_BLOCKS
#define V4_MIN_BLOCKS 2  // 2 x 128 threads: ptxas may still use 255 registers per thread
#endif
#define V4_ROWS (16 * V4_MT)
#define V4_BLOCK_M (V4_ROWS * V4_WARPS)
#define V4_THREADS (32 * V4_WARPS)
#define V4_BUFS (V4_PIPE == 1 ? 1 : 2)  // buffers of K (and of V)
#define V4_NT (V4_BLOCK_N / 8)
#define V4_DT (HEAD_DIM / 8)
#define V4_KQ (HEAD_DIM / 16)
#define V4_KP (V4_BLOCK_N / 16)

#if V4_PIPE < 0 || V4_PIPE > 2
#error "V4_PIPE must be 0, 1 or 2"
#endif

// S = Q K^T for this warp's V4_ROWS rows and one tile of keys. Q's A fragments are re-read from
// shared memory at every k-step; one ldmatrix.x4 of K gives the B fragments of two n-tiles, used
// by both m-tiles.
__device__ __forceinline__ void v4_qk(float (&s)[V4_MT][V4_NT][4], const ft_raw* q_w, const ft_raw* kt,
                                      int lane) {
    const int a_row = (lane % 8) + ((lane / 8) & 1) * 8, a_col = (lane / 16) * 8;
    const int b_row = (lane % 8) + (lane / 16) * 8, b_col = ((lane / 8) & 1) * 8;
#pragma unroll
    for (int mt = 0; mt < V4_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < V4_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.f;
#pragma unroll
    for (int ks = 0; ks < V4_KQ; ++ks) {
        ft_raw2 a[V4_MT][4];
#pragma unroll
        for (int mt = 0; mt < V4_MT; ++mt)
            ldmatrix_x4(a[mt], smem_addr(q_w + swz(mt * 16 + a_row, ks * 16 + a_col)));
#pragma unroll
        for (int np = 0; np < V4_NT / 2; ++np) {
            ft_raw2 b[4];
            ldmatrix_x4(b, smem_addr(kt + swz(np * 16 + b_row, ks * 16 + b_col)));
#pragma unroll
            for (int mt = 0; mt < V4_MT; ++mt) {
                mma_16x8x16(s[mt][2 * np], a[mt], b[0], b[1]);
                mma_16x8x16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// O += P V for one tile: ldmatrix.trans gives V's B fragments of two d-tiles for one k-step,
// used by both m-tiles
__device__ __forceinline__ void v4_pv(float (&acc)[V4_MT][V4_DT][4], const ft_raw2 (&pf)[V4_MT][V4_KP][4],
                                      const ft_raw* vt, int lane) {
    const int a_row = (lane % 8) + ((lane / 8) & 1) * 8, a_col = (lane / 16) * 8;
#pragma unroll
    for (int kp = 0; kp < V4_KP; ++kp)
#pragma unroll
        for (int dp = 0; dp < V4_DT / 2; ++dp) {
            ft_raw2 b[4];
            ldmatrix_x4_trans(b, smem_addr(vt + swz(kp * 16 + a_row, dp * 16 + a_col)));
#pragma unroll
            for (int mt = 0; mt < V4_MT; ++mt) {
                mma_16x8x16(acc[mt][2 * dp], pf[mt][kp], b[0], b[1]);
                mma_16x8x16(acc[mt][2 * dp + 1], pf[mt][kp], b[2], b[3]);
            }
        }
}

// mask, online softmax in log2 units (p = 2^(s * scale_log2 - m * scale_log2)), rescale of l and
// the accumulator, and P packed into A fragments
__device__ __forceinline__ void v4_softmax(float (&s)[V4_MT][V4_NT][4], float (&acc)[V4_MT][V4_DT][4],
                                           float (&m)[V4_MT][2], float (&l)[V4_MT][2],
                                           ft_raw2 (&pf)[V4_MT][V4_KP][4], bool need_mask, int r0, int n0,
                                           int Nk, int causal, int diag_offset, float scale_log2, int t) {
    if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < V4_MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < V4_NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    int row = r0 + mt * 16 + (i / 2) * 8, col = n0 + nt * 8 + 2 * t + (i % 2);
                    if (col >= Nk || (causal && col > row + diag_offset)) s[mt][nt][i] = FT_NEG_INF;
                }
    }
    float m_new[V4_MT][2];
    bool grew = false;
#pragma unroll
    for (int mt = 0; mt < V4_MT; ++mt) {
        float mx[2] = {FT_NEG_INF, FT_NEG_INF};
#pragma unroll
        for (int nt = 0; nt < V4_NT; ++nt) {
            mx[0] = fmaxf(mx[0], fmaxf(s[mt][nt][0], s[mt][nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[mt][nt][2], s[mt][nt][3]));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m_new[mt][r] = fmaxf(m[mt][r], quad_max(mx[r]));  // raw score units
            grew |= m_new[mt][r] > m[mt][r];
        }
    }
#if V4_SKIP_RESCALE
    // every alpha is 1 when no row of the warp has a new maximum: skip the multiplies
    if (__any_sync(0xffffffffu, grew))
#endif
    {
#pragma unroll
        for (int mt = 0; mt < V4_MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float m_use = m_new[mt][r] == FT_NEG_INF ? 0.f : m_new[mt][r];
                float alpha = ft_exp2((m[mt][r] - m_use) * scale_log2);
                l[mt][r] *= alpha;
#pragma unroll
                for (int dt = 0; dt < V4_DT; ++dt) {
                    acc[mt][dt][2 * r] *= alpha;
                    acc[mt][dt][2 * r + 1] *= alpha;
                }
            }
    }
#pragma unroll
    for (int mt = 0; mt < V4_MT; ++mt) {
        float neg_ms[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m[mt][r] = m_new[mt][r];
            neg_ms[r] = -(m_new[mt][r] == FT_NEG_INF ? 0.f : m_new[mt][r]) * scale_log2;
        }
#pragma unroll
        for (int nt = 0; nt < V4_NT; ++nt) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                p[i] = ft_exp2(fmaf(s[mt][nt][i], scale_log2, neg_ms[i / 2]));
                l[mt][i / 2] += p[i];
            }
            pf[mt][nt / 2][(nt % 2) * 2 + 0] = ft_pack2(p[0], p[1]);
            pf[mt][nt / 2][(nt % 2) * 2 + 1] = ft_pack2(p[2], p[3]);
        }
    }
}

// grid (ceil(Nq / V4_BLOCK_M), B*H), block V4_THREADS, dynamic shared memory
// (V4_BLOCK_M + 2 * V4_BUFS * V4_BLOCK_N) * HEAD_DIM * 2 bytes
extern "C" __global__ void __launch_bounds__(V4_THREADS, V4_MIN_BLOCKS)
flash_fwd_v4(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k, const ft_raw* __restrict__ v,
             ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal, int kv_group, int diag_offset) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    ft_raw* q_s = reinterpret_cast<ft_raw*>(smem_raw);
    ft_raw* k_s = q_s + V4_BLOCK_M * HEAD_DIM;            // [V4_BUFS][V4_BLOCK_N][HEAD_DIM]
    ft_raw* v_s = k_s + V4_BUFS * V4_BLOCK_N * HEAD_DIM;  // [V4_BUFS][V4_BLOCK_N][HEAD_DIM]
    constexpr int TILE = V4_BLOCK_N * HEAD_DIM;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y, bkv = bh / kv_group;
    // causal: the last query blocks see the most keys; start them first so they do not finish last
    const int mb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int m0 = mb * V4_BLOCK_M;
    const int wrow0 = m0 + warp * V4_ROWS;  // first row of this warp
    const int r0 = wrow0 + g;                // this lane's rows: r0 + 16 * mt + 8 * r
    const ft_raw* qb = q + (size_t)bh * Nq * HEAD_DIM;
    const ft_raw* kb = k + (size_t)bkv * Nk * HEAD_DIM;
    const ft_raw* vb = v + (size_t)bkv * Nk * HEAD_DIM;
    const ft_raw* q_w = q_s + warp * V4_ROWS * HEAD_DIM;

    // keys any row of this block sees; a causal block whose rows all lie above the diagonal sees none
    const int n_end = causal ? max(0, min(Nk, min(Nq, m0 + V4_BLOCK_M) + diag_offset)) : Nk;
    const int n_tiles = (n_end + V4_BLOCK_N - 1) / V4_BLOCK_N;

    load_tile_swz<V4_BLOCK_M, V4_THREADS>(q_s, qb, m0, Nq);
    if (n_tiles > 0) {
        load_tile_swz<V4_BLOCK_N, V4_THREADS>(k_s, kb, 0, Nk);
#if V4_PIPE == 0
        load_tile_swz<V4_BLOCK_N, V4_THREADS>(v_s, vb, 0, Nk);
#endif
    }
    cp_async_commit();  // Q + K_0 (+ V_0 in step 4)
#if V4_PIPE == 2
    if (n_tiles > 0) load_tile_swz<V4_BLOCK_N, V4_THREADS>(v_s, vb, 0, Nk);
    cp_async_commit();  // V_0
#endif

    float acc[V4_MT][V4_DT][4];
    float m[V4_MT][2], l[V4_MT][2];
#pragma unroll
    for (int mt = 0; mt < V4_MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < V4_DT; ++dt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][dt][i] = 0.f;
        m[mt][0] = m[mt][1] = FT_NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }

    for (int j = 0; j < n_tiles; ++j) {
        const int n0 = j * V4_BLOCK_N;
        const bool more = j + 1 < n_tiles;
        const int buf = V4_BUFS == 2 ? (j & 1) : 0;
        const ft_raw* kt = k_s + buf * TILE;
        const ft_raw* vt = v_s + buf * TILE;
        // warp-level causal skip: every key of this tile is right of every row of this warp
        // (the warp still takes part in every copy and barrier)
        const bool active = !(causal && n0 > wrow0 + V4_ROWS - 1 + diag_offset);
        const bool need_mask = (n0 + V4_BLOCK_N > Nk) || (causal && n0 + V4_BLOCK_N - 1 > wrow0 + diag_offset);
        float s[V4_MT][V4_NT][4];
        ft_raw2 pf[V4_MT][V4_KP][4];

#if V4_PIPE == 0
        cp_async_wait<0>();
        __syncthreads();  // K_j, V_j have landed, and every warp is done with tile j - 1's buffers
        if (active) {
            v4_qk(s, q_w, kt, lane);
            v4_softmax(s, acc, m, l, pf, need_mask, r0, n0, Nk, causal, diag_offset, scale_log2, t);
        }
        // issued once S is no longer live (issued before S = Q K^T, its addresses pushed D = 128
        // past 255 registers); the copies still have P V and the next tile's wait to land
        if (more) {
            load_tile_swz<V4_BLOCK_N, V4_THREADS>(k_s + (buf ^ 1) * TILE, kb, n0 + V4_BLOCK_N, Nk);
            load_tile_swz<V4_BLOCK_N, V4_THREADS>(v_s + (buf ^ 1) * TILE, vb, n0 + V4_BLOCK_N, Nk);
            cp_async_commit();
        }
        if (active) v4_pv(acc, pf, vt, lane);
#elif V4_PIPE == 1
        cp_async_wait<0>();
        __syncthreads();  // K_j has landed, and every warp is done with V_(j-1)
        load_tile_swz<V4_BLOCK_N, V4_THREADS>(v_s, vb, n0, Nk);
        cp_async_commit();
        if (active) {
            v4_qk(s, q_w, kt, lane);
            v4_softmax(s, acc, m, l, pf, need_mask, r0, n0, Nk, causal, diag_offset, scale_log2, t);
        }
        cp_async_wait<0>();
        __syncthreads();  // V_j has landed, and every warp is done with K_j
        // FlashAttention-2 issues K_(j+1) before the softmax; here it waits until S is dead
        // (with S live across the barrier, D = 128 spilled)
        if (more) {
            load_tile_swz<V4_BLOCK_N, V4_THREADS>(k_s, kb, n0 + V4_BLOCK_N, Nk);
            cp_async_commit();
        }
        if (active) v4_pv(acc, pf, vt, lane);
#else
        // groups in flight here: K_j, V_j (committed in that order)
        cp_async_wait<1>();
        __syncthreads();  // K_j has landed, and every warp is done with tile j - 1
        if (more) {
            load_tile_swz<V4_BLOCK_N, V4_THREADS>(k_s + (buf ^ 1) * TILE, kb, n0 + V4_BLOCK_N, Nk);
            cp_async_commit();
        }
        if (active) {
            v4_qk(s, q_w, kt, lane);
            v4_softmax(s, acc, m, l, pf, need_mask, r0, n0, Nk, causal, diag_offset, scale_log2, t);
        }
        // in flight: V_j, then K_(j+1) if there is one
        if (more) cp_async_wait<1>(); else cp_async_wait<0>();
        __syncthreads();  // V_j has landed in every thread's part
        if (more) {
            load_tile_swz<V4_BLOCK_N, V4_THREADS>(v_s + (buf ^ 1) * TILE, vb, n0 + V4_BLOCK_N, Nk);
            cp_async_commit();
        }
        if (active) v4_pv(acc, pf, vt, lane);
#endif
    }
    cp_async_wait<0>();  // a block that saw no key still has its Q copy in flight

#pragma unroll
    for (int mt = 0; mt < V4_MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float lsum = quad_sum(l[mt][r]);
            int row = r0 + mt * 16 + r * 8;
            if (row >= Nq) continue;
            // a row that saw no key (causal, diag_offset < 0) has lsum 0: o = 0, lse = -inf
            float inv = lsum > 0.f ? 1.f / lsum : 0.f;
            ft_raw* orow = o + ((size_t)bh * Nq + row) * HEAD_DIM;
#pragma unroll
            for (int dt = 0; dt < V4_DT; ++dt)
                *reinterpret_cast<ft_raw2*>(orow + dt * 8 + 2 * t) =
                    ft_pack2(acc[mt][dt][2 * r] * inv, acc[mt][dt][2 * r + 1] * inv);
            if (t == 0)
                lse[(size_t)bh * Nq + row] =
                    lsum > 0.f ? (m[mt][r] * scale_log2 + ft_log2(lsum)) * FT_LN2 : FT_NEG_INF;
        }
}
