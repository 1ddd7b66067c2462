// fwd_v3_fast.cu: ladder step 3, the fast forward kernel.
//
// Same math and register layout as step 2 (fwd_v2_mma.cu); what changes is how data moves:
//  * cp.async copies Q, K and V tiles global -> shared without passing through registers, and
//    K/V are double buffered (V3_STAGES = 2): tile j+1 is in flight while tile j is computed;
//  * ldmatrix loads a whole 16x16 mma operand for the warp in one instruction; ldmatrix.trans
//    gives V's B fragments (keys along k) from V stored key-major, with no 16-bit shuffling;
//  * shared memory is swizzled: the 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so
//    the 8 row addresses of one ldmatrix (same c, 8 consecutive rows) fall in 8 different
//    bank groups instead of one: no bank conflicts, and no padding bytes;
//  * exp2 with scale * log2(e) folded into one FMA per score;
//  * causal: tiles right of the diagonal are never loaded (block level) or computed (warp
//    level), the mask is only evaluated on tiles that cross the diagonal or the end of K,
//    and the heaviest query blocks are started first.
// Real models: K/V head = h / kv_group (grouped-query heads share one K/V head), and with causal
// query i sees key j iff j <= i + diag_offset (0: top-left; Nk - Nq: bottom-right, new queries at
// the end of a KV cache). A row that sees no key writes o = 0 and lse = -inf.
// Before sm_80 (T4) cp.async does not exist: the copies are synchronous and V3_STAGES is 1.
// V3_MT = 2 gives each warp 32 query rows (two 16-row m-tiles) instead of 16: every K and V
// fragment read from shared memory then feeds two MMAs instead of one, at the price of twice the
// accumulator registers; Q's fragments are then re-read from shared memory at each tile when
// keeping them would not fit the register file.
#include "ft_mma.cuh"

#ifndef V3_WARPS
#define V3_WARPS 8  // 16 query rows per warp: V3_BLOCK_M = 128
#endif
#ifndef V3_BLOCK_N
#define V3_BLOCK_N 64
#endif
#ifndef V3_STAGES
#define V3_STAGES 2
#endif
#ifndef V3_MT
#define V3_MT 1  // 16-row m-tiles per warp
#endif
#ifndef V3_MIN_BLOCKS
#define V3_MIN_BLOCKS 1  // blocks per SM the register budget must allow (2 would cap registers at 128)
#endif
#define V3_ROWS (16 * V3_MT)  // query rows per warp
#define V3_BLOCK_M (V3_ROWS * V3_WARPS)
#define V3_THREADS (32 * V3_WARPS)
#define V3_CHUNKS (HEAD_DIM / 8)  // 16-byte chunks per row
#define V3_NT (V3_BLOCK_N / 8)
#define V3_DT (HEAD_DIM / 8)
#define V3_KQ (HEAD_DIM / 16)
#define V3_KP (V3_BLOCK_N / 16)
#define V3_Q_IN_REGS (V3_MT * HEAD_DIM <= 128)  // Q fragments: 32 registers per 16 rows at D = 128

// element offset of (row, col) in a swizzled [rows][HEAD_DIM] tile; col is a multiple of 8
// wherever a whole chunk is addressed (cp.async, ldmatrix)
__device__ __forceinline__ int swz(int row, int col) {
    return row * HEAD_DIM + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// rows [r0, r0 + rows) of a (N, HEAD_DIM) matrix into a swizzled tile; rows >= N become zeros
template <int ROWS>
__device__ __forceinline__ void load_tile(ft_raw* tile, const ft_raw* src, int r0, int N) {
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * V3_CHUNKS; i += V3_THREADS) {
        int r = i / V3_CHUNKS, c = (i % V3_CHUNKS) * 8;
        bool ok = r0 + r < N;
        const ft_raw* g = src + (size_t)(ok ? r0 + r : 0) * HEAD_DIM + c;
        cp_async_16(tile + swz(r, c), g, ok);
    }
}

// grid (ceil(Nq / V3_BLOCK_M), B*H), block V3_THREADS, dynamic shared memory
// (V3_BLOCK_M + 2 * V3_STAGES * V3_BLOCK_N) * HEAD_DIM * 2 bytes
extern "C" __global__ void __launch_bounds__(V3_THREADS, V3_MIN_BLOCKS)
flash_fwd_v3(const ft_raw* __restrict__ q, const ft_raw* __restrict__ k, const ft_raw* __restrict__ v,
             ft_raw* __restrict__ o, float* __restrict__ lse,
             int Nq, int Nk, float scale_log2, int causal, int kv_group, int diag_offset) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    ft_raw* q_s = reinterpret_cast<ft_raw*>(smem_raw);
    ft_raw* k_s = q_s + V3_BLOCK_M * HEAD_DIM;              // [V3_STAGES][V3_BLOCK_N][HEAD_DIM]
    ft_raw* v_s = k_s + V3_STAGES * V3_BLOCK_N * HEAD_DIM;  // [V3_STAGES][V3_BLOCK_N][HEAD_DIM]

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y;
    // causal: the last query blocks see the most keys; start them first so they do not finish last
    const int mb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int m0 = mb * V3_BLOCK_M;
    const int wrow0 = m0 + warp * V3_ROWS;  // first row of this warp
    const int r0 = wrow0 + g;                // this lane's rows: r0 + 16 * mt + 8 * r
    const ft_raw* qb = q + (size_t)bh * Nq * HEAD_DIM;
    // bh = b * H + h and H = Hkv * kv_group, so b * Hkv + h / kv_group = bh / kv_group
    const ft_raw* kb = k + (size_t)(bh / kv_group) * Nk * HEAD_DIM;
    const ft_raw* vb = v + (size_t)(bh / kv_group) * Nk * HEAD_DIM;

    const int n_end = causal ? max(0, min(Nk, m0 + V3_BLOCK_M + diag_offset)) : Nk;
    const int n_tiles = (n_end + V3_BLOCK_N - 1) / V3_BLOCK_N;

    load_tile<V3_BLOCK_M>(q_s, qb, m0, Nq);
    load_tile<V3_BLOCK_N>(k_s, kb, 0, Nk);
    load_tile<V3_BLOCK_N>(v_s, vb, 0, Nk);
    cp_async_commit();

    // per-lane ldmatrix row offsets (see ft_mma.cuh for the fragment layouts)
    const int a_row = (lane % 8) + ((lane / 8) & 1) * 8, a_col = (lane / 16) * 8;  // Q (A) and V (trans)
    const int b_row = (lane % 8) + (lane / 16) * 8, b_col = ((lane / 8) & 1) * 8;  // K (B)

#if V3_Q_IN_REGS
    ft_raw2 qf[V3_MT][V3_KQ][4];
#endif
    float acc[V3_MT][V3_DT][4];
    float m[V3_MT][2], l[V3_MT][2];
#pragma unroll
    for (int mt = 0; mt < V3_MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < V3_DT; ++dt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][dt][i] = 0.f;
        m[mt][0] = m[mt][1] = FT_NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }

    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<0>();
        __syncthreads();  // tile j has landed, and every warp is done with tile j - 1's buffer
#if V3_Q_IN_REGS
        if (j == 0) {
#pragma unroll
            for (int mt = 0; mt < V3_MT; ++mt)
#pragma unroll
                for (int ks = 0; ks < V3_KQ; ++ks)
                    ldmatrix_x4(qf[mt][ks], smem_addr(q_s + swz(warp * V3_ROWS + mt * 16 + a_row, ks * 16 + a_col)));
        }
#endif
        if (V3_STAGES == 2 && j + 1 < n_tiles) {
            int buf = (j + 1) & 1;
            load_tile<V3_BLOCK_N>(k_s + buf * V3_BLOCK_N * HEAD_DIM, kb, (j + 1) * V3_BLOCK_N, Nk);
            load_tile<V3_BLOCK_N>(v_s + buf * V3_BLOCK_N * HEAD_DIM, vb, (j + 1) * V3_BLOCK_N, Nk);
            cp_async_commit();
        }
        const int n0 = j * V3_BLOCK_N;
        const int buf = V3_STAGES == 2 ? (j & 1) : 0;
        const ft_raw* kt = k_s + buf * V3_BLOCK_N * HEAD_DIM;
        const ft_raw* vt = v_s + buf * V3_BLOCK_N * HEAD_DIM;

        // warp-level causal skip: every key of this tile is right of every row of this warp
        if (!(causal && n0 > wrow0 + V3_ROWS - 1 + diag_offset)) {
            float s[V3_MT][V3_NT][4];
#pragma unroll
            for (int mt = 0; mt < V3_MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < V3_NT; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.f;
            // S = Q K^T; one ldmatrix.x4 gives the B fragments of two n-tiles for one k-step,
            // used by every m-tile of the warp
#pragma unroll
            for (int ks = 0; ks < V3_KQ; ++ks) {
#if !V3_Q_IN_REGS
                ft_raw2 qk[V3_MT][4];
#pragma unroll
                for (int mt = 0; mt < V3_MT; ++mt)
                    ldmatrix_x4(qk[mt], smem_addr(q_s + swz(warp * V3_ROWS + mt * 16 + a_row, ks * 16 + a_col)));
#endif
#pragma unroll
                for (int np = 0; np < V3_NT / 2; ++np) {
                    ft_raw2 b[4];
                    ldmatrix_x4(b, smem_addr(kt + swz(np * 16 + b_row, ks * 16 + b_col)));
#pragma unroll
                    for (int mt = 0; mt < V3_MT; ++mt) {
#if V3_Q_IN_REGS
                        const ft_raw2 (&a)[4] = qf[mt][ks];
#else
                        const ft_raw2 (&a)[4] = qk[mt];
#endif
                        mma_16x8x16(s[mt][2 * np], a, b[0], b[1]);
                        mma_16x8x16(s[mt][2 * np + 1], a, b[2], b[3]);
                    }
                }
            }

            // the mask costs instructions: evaluate it only where it can bite
            const bool need_mask = (n0 + V3_BLOCK_N > Nk) || (causal && n0 + V3_BLOCK_N - 1 > wrow0 + diag_offset);
            if (need_mask) {
#pragma unroll
                for (int mt = 0; mt < V3_MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < V3_NT; ++nt)
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            int row = r0 + mt * 16 + (i / 2) * 8, col = n0 + nt * 8 + 2 * t + (i % 2);
                            if (col >= Nk || (causal && col > row + diag_offset)) s[mt][nt][i] = FT_NEG_INF;
                        }
            }
            // online softmax in log2 units: p = 2^(s * scale_log2 - m * scale_log2), one FMA + one ex2
            ft_raw2 pf[V3_MT][V3_KP][4];
#pragma unroll
            for (int mt = 0; mt < V3_MT; ++mt) {
                float m_tile[2] = {FT_NEG_INF, FT_NEG_INF};
#pragma unroll
                for (int nt = 0; nt < V3_NT; ++nt) {
                    m_tile[0] = fmaxf(m_tile[0], fmaxf(s[mt][nt][0], s[mt][nt][1]));
                    m_tile[1] = fmaxf(m_tile[1], fmaxf(s[mt][nt][2], s[mt][nt][3]));
                }
                float neg_mscaled[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float m_new = fmaxf(m[mt][r], quad_max(m_tile[r]));  // raw score units
                    float m_use = m_new == FT_NEG_INF ? 0.f : m_new;
                    float alpha = ft_exp2((m[mt][r] - m_use) * scale_log2);
                    m[mt][r] = m_new;
                    l[mt][r] *= alpha;
#pragma unroll
                    for (int dt = 0; dt < V3_DT; ++dt) {
                        acc[mt][dt][2 * r] *= alpha;
                        acc[mt][dt][2 * r + 1] *= alpha;
                    }
                    neg_mscaled[r] = -m_use * scale_log2;
                }
#pragma unroll
                for (int nt = 0; nt < V3_NT; ++nt) {
                    float p[4];
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        p[i] = ft_exp2(fmaf(s[mt][nt][i], scale_log2, neg_mscaled[i / 2]));
                        l[mt][i / 2] += p[i];
                    }
                    pf[mt][nt / 2][(nt % 2) * 2 + 0] = ft_pack2(p[0], p[1]);
                    pf[mt][nt / 2][(nt % 2) * 2 + 1] = ft_pack2(p[2], p[3]);
                }
            }

            // O += P V; ldmatrix.trans gives the B fragments of two d-tiles for one k-step
#pragma unroll
            for (int kp = 0; kp < V3_KP; ++kp)
#pragma unroll
                for (int dp = 0; dp < V3_DT / 2; ++dp) {
                    ft_raw2 b[4];
                    ldmatrix_x4_trans(b, smem_addr(vt + swz(kp * 16 + a_row, dp * 16 + a_col)));
#pragma unroll
                    for (int mt = 0; mt < V3_MT; ++mt) {
                        mma_16x8x16(acc[mt][2 * dp], pf[mt][kp], b[0], b[1]);
                        mma_16x8x16(acc[mt][2 * dp + 1], pf[mt][kp], b[2], b[3]);
                    }
                }
        }

        if (V3_STAGES == 1 && j + 1 < n_tiles) {
            __syncthreads();  // single buffer: everyone is done reading it before it is refilled
            load_tile<V3_BLOCK_N>(k_s, kb, (j + 1) * V3_BLOCK_N, Nk);
            load_tile<V3_BLOCK_N>(v_s, vb, (j + 1) * V3_BLOCK_N, Nk);
            cp_async_commit();
        }
    }

    if (n_tiles == 0) cp_async_wait<0>();  // a block that sees no key still has its copies in flight

#pragma unroll
    for (int mt = 0; mt < V3_MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float lsum = quad_sum(l[mt][r]);
            int row = r0 + mt * 16 + r * 8;
            if (row >= Nq) continue;
            float inv = lsum > 0.f ? 1.f / lsum : 0.f;  // a row that saw no key: o = 0
            ft_raw* orow = o + ((size_t)bh * Nq + row) * HEAD_DIM;
#pragma unroll
            for (int dt = 0; dt < V3_DT; ++dt)
                *reinterpret_cast<ft_raw2*>(orow + dt * 8 + 2 * t) =
                    ft_pack2(acc[mt][dt][2 * r] * inv, acc[mt][dt][2 * r + 1] * inv);
            if (t == 0)
                lse[(size_t)bh * Nq + row] = lsum > 0.f ? m[mt][r] * scale_log2 * FT_LN2 + ft_log2(lsum) * FT_LN2
                                                        : FT_NEG_INF;
        }
}
