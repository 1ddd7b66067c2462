// ft_wgmma_softmax.cuh: the softmax and output of the Hopper rungs, between and after their two wgmma.
//
// Every consumer thread holds, for its rows r0 and r0 + 8, a slice of the S = Q K^T accumulator of a
// 64 x BN wgmma: s[i] is S[row r0 + 8 * ((i / 2) % 2)][key n0 + 8 * (i / 4) + 2t + i % 2] (ft_wgmma.cuh),
// and the matching slice of the O accumulator (HEAD_DIM / 2 floats, the same layout along the head dim).
// The rungs differ in how tiles reach shared memory, not in this arithmetic, so it is written once here.
#pragma once
#include "ft_wgmma.cuh"

#ifndef FT_EXP2_POLY
#define FT_EXP2_POLY 0   // of every 8 exponentials of S, how many run on the float32 pipe (ft_exp2_poly)
#endif
#if FT_EXP2_POLY < 0 || FT_EXP2_POLY > 8
#error "FT_EXP2_POLY counts exponentials of every 8: 0 to 8"
#endif

#ifndef FT_ROW_TREE
#define FT_ROW_TREE 0    // 1: a tile's row maxima and row sums as trees of pairs instead of one chain each
#endif

#ifndef FT_LAZY_RESCALE
#define FT_LAZY_RESCALE 0   // 1: a warp moves its rows' maxima (and rescales O) only past FT_RESCALE_SLACK
#endif
// Lazy rescaling: the running maximum m need not be the true maximum, only close enough above the scores
// that exp2((S - m) scale_log2) cannot overflow; o = O / l and lse = m + log2 l come out the same for any m
// used consistently in O and l. So a warp keeps its maxima until some row's grows by more than
// FT_RESCALE_SLACK (log2 units): P then stays at most 2^8 = 256, which float16 and bfloat16 hold, and for
// scores of about unit spread after scaling (a growth of 8 in log2 units is 5.5 of them) the warp skips
// alpha's exponentials and O's multiplies on nearly every tile after its first. The exact test (skip only
// when no maximum grew) skips too rarely to pay: with independent scores a row's maximum grows at its j-th
// tile with probability 1 / j, so at each of its first 23 tiles some row of a 16-row warp grows with
// probability above one half.
// Measured, the vote the lazy test needs costs more than it saves (book/perflog_hopper.md).
#define FT_RESCALE_SLACK 8.f

// Row r's BN / 4 values of a thread's slice of S (i = 4k + 2r and 4k + 2r + 1) combined by op as a tree of
// pairs: the same BN / 4 - 1 operations as a chain, but log2(BN / 4) = 5 deep instead of 31 at BN = 128.
// A chain is what the plain loop compiles to: ptxas may not reorder fmaxf or + (a max of -0 and +0, and
// rounding, depend on the order), so each step waits out the latency of the one before, and with three or
// four warps per scheduler there is little else to issue meanwhile (book/perflog_hopper.md).
// one level of the tree, then the next (a template, so that every index is a constant: an array indexed
// by a loop that is not unrolled lives in local memory)
template <int W, typename Op>
__device__ __forceinline__ void wg_tree_level(float* v, Op op) {
    if constexpr (W > 0) {
#pragma unroll
        for (int j = 0; j < W; ++j) v[j] = op(v[j], v[j + W]);
        wg_tree_level<W / 2>(v, op);
    }
}
template <int BN, typename Op>
__device__ __forceinline__ float wg_row_tree(const float* s, int r, Op op) {
    float v[BN / 4];
#pragma unroll
    for (int k = 0; k < BN / 8; ++k) {
        v[2 * k] = s[4 * k + 2 * r];
        v[2 * k + 1] = s[4 * k + 2 * r + 1];
    }
    wg_tree_level<BN / 8>(v, op);
    return v[0];
}
struct ft_max_op { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct ft_add_op { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };

// exponential i of a thread's slice of S: the first FT_EXP2_POLY of every 8 by the polynomial, the rest
// by the special-function unit, so that both pipes work on each tile (i is a constant once unrolled)
__device__ __forceinline__ float wg_exp2(int i, float x) {
    return i % 8 < FT_EXP2_POLY ? ft_exp2_poly(x) : ft_exp2(x);
}

// S to -inf where the key is past Nk or (causal) right of row + diag_offset; the mask costs instructions,
// so it is evaluated only on tiles that cross the end of K or the diagonal of this warp's rows
template <int BN>
__device__ __forceinline__ void wg_mask(float* s, int n0, int Nk, int causal, int diag_offset, int warp_row0,
                                        int r0, int t) {
    if (n0 + BN > Nk || (causal && n0 + BN - 1 > warp_row0 + diag_offset)) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int row = r0 + 8 * ((i / 2) % 2), col = n0 + 8 * (i / 4) + 2 * t + i % 2;
            if (col >= Nk || (causal && col > row + diag_offset)) s[i] = FT_NEG_INF;
        }
    }
}

// one row's running maximum moved to m_new: alpha = exp2(m - m_new) rescales its sum l here (and its O
// row, by the caller), and -m_new * scale_log2 is the exponent's offset
__device__ __forceinline__ void wg_move_max(float& m, float& l, float m_new, float scale_log2, float& alpha,
                                            float& neg_mscaled) {
    const float m_use = m_new == FT_NEG_INF ? 0.f : m_new;  // a row with no key yet stays at 0
    alpha = ft_exp2((m - m_use) * scale_log2);
    m = m_new;
    l *= alpha;
    neg_mscaled = -m_use * scale_log2;
}

// The online-softmax step in log2 units, in two halves, because rung W3 runs them at different times.
// wg_softmax_max: the tile's row maxima (the 4 lanes of a quad share rows g and g + 8), the new running
// maxima, the factors alpha = exp2(m_old - m_new) that rescale l (here) and the O accumulator (by the
// caller, wg_rescale, only where this returns true), and -m_new * scale_log2 for the exponent. It returns
// false (the same for the whole warp) where FT_LAZY_RESCALE kept every maximum: alpha is then 1.
template <int BN>
__device__ __forceinline__ bool wg_softmax_max(const float* s, float (&m)[2], float (&l)[2], float scale_log2,
                                               float (&alpha)[2], float (&neg_mscaled)[2]) {
#if FT_ROW_TREE
    const float m_tile[2] = {wg_row_tree<BN>(s, 0, ft_max_op()), wg_row_tree<BN>(s, 1, ft_max_op())};
#else
    float m_tile[2] = {FT_NEG_INF, FT_NEG_INF};
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) m_tile[(i / 2) % 2] = fmaxf(m_tile[(i / 2) % 2], s[i]);
#endif
#if FT_LAZY_RESCALE
    float m_new[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) m_new[r] = fmaxf(m[r], quad_max(m_tile[r]));
    // a row that saw no key yet compares -inf with -inf: NaN, not a growth; its first key is +inf
    const bool moved = __any_sync(0xffffffffu, (m_new[0] - m[0]) * scale_log2 > FT_RESCALE_SLACK
                                               || (m_new[1] - m[1]) * scale_log2 > FT_RESCALE_SLACK);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (moved) {
            wg_move_max(m[r], l[r], m_new[r], scale_log2, alpha[r], neg_mscaled[r]);
        } else {
            alpha[r] = 1.f;
            neg_mscaled[r] = -(m[r] == FT_NEG_INF ? 0.f : m[r]) * scale_log2;
        }
    }
    return moved;
#else
#pragma unroll
    for (int r = 0; r < 2; ++r)
        wg_move_max(m[r], l[r], fmaxf(m[r], quad_max(m_tile[r])), scale_log2, alpha[r], neg_mscaled[r]);
    return true;
#endif
}

// the O accumulator moved to the new maxima: its rows r0 and r0 + 8 times alpha[0] and alpha[1]
__device__ __forceinline__ void wg_rescale(float* acc, const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) acc[i] *= alpha[(i / 2) % 2];
}

// wg_softmax_exp: P = exp2(S scale_log2 - m scale_log2) added into the running sums and packed into the
// A-from-registers layout of the P V wgmma: register 4 kp + e of k-step kp is s[8 kp + 2e], s[8 kp + 2e + 1]
template <int BN>
__device__ __forceinline__ void wg_softmax_exp(const float* s, float (&l)[2], const float (&neg_mscaled)[2],
                                               float scale_log2, ft_raw2* pf) {
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
        const float p0 = wg_exp2(i, fmaf(s[i], scale_log2, neg_mscaled[(i / 2) % 2]));
        const float p1 = wg_exp2(i + 1, fmaf(s[i + 1], scale_log2, neg_mscaled[(i / 2) % 2]));
        l[(i / 2) % 2] += p0 + p1;
        pf[i / 2] = ft_pack2(p0, p1);
    }
}

// The same in two parts, for rung W3, which may pack P only once the P V still reading the previous P
// from those registers is done: the exponentials in float32 over S itself (and the sums), then the packing.
template <int BN>
__device__ __forceinline__ void wg_softmax_exp_inplace(float* s, float (&l)[2], const float (&neg_mscaled)[2],
                                                       float scale_log2) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] = wg_exp2(i, fmaf(s[i], scale_log2, neg_mscaled[(i / 2) % 2]));
#if FT_ROW_TREE
    l[0] += wg_row_tree<BN>(s, 0, ft_add_op());
    l[1] += wg_row_tree<BN>(s, 1, ft_add_op());
#else
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) l[(i / 2) % 2] += s[i] + s[i + 1];
#endif
}
template <int BN>
__device__ __forceinline__ void wg_pack_p(const float* s, ft_raw2* pf) {
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) pf[i / 2] = ft_pack2(s[i], s[i + 1]);
}

// one whole step, for the rungs whose O accumulator is idle during the softmax (W1, W2)
template <int BN>
__device__ __forceinline__ void wg_softmax(const float* s, float (&m)[2], float (&l)[2], float* acc,
                                           float scale_log2, ft_raw2* pf) {
    float alpha[2], neg_mscaled[2];
    if (wg_softmax_max<BN>(s, m, l, scale_log2, alpha, neg_mscaled)) wg_rescale(acc, alpha);
    wg_softmax_exp<BN>(s, l, neg_mscaled, scale_log2, pf);
}

// the natural-log lse of a row from its running maximum and its whole sum (-inf for a row that saw no key)
__device__ __forceinline__ void wg_store_lse(float* lse, int bh, int Nq, int row, float m, float lsum, float scale_log2) {
    lse[(size_t)bh * Nq + row] = lsum > 0.f ? (m * scale_log2 + ft_log2(lsum)) * FT_LN2 : FT_NEG_INF;
}

// O / l for rows r0 and r0 + 8 of head bh (those below row_end: Nq, or where the rows of the next query
// block start), and their natural-log lse; a row that saw no key writes o = 0 and lse = -inf
__device__ __forceinline__ void wg_store(const float* acc, const float (&m)[2], const float (&l)[2], ft_raw* o,
                                         float* lse, int bh, int Nq, int row_end, int r0, int t, float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lsum = quad_sum(l[r]);
        const int row = r0 + 8 * r;
        if (row >= row_end) continue;
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
        ft_raw* orow = o + ((size_t)bh * Nq + row) * HEAD_DIM;
#pragma unroll
        for (int c8 = 0; c8 < HEAD_DIM / 8; ++c8)
            *reinterpret_cast<ft_raw2*>(orow + 8 * c8 + 2 * t) =
                ft_pack2(acc[4 * c8 + 2 * r] * inv, acc[4 * c8 + 2 * r + 1] * inv);
        if (t == 0) wg_store_lse(lse, bh, Nq, row, m[r], lsum, scale_log2);
    }
}
