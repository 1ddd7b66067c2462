// ft_wgmma_softmax.cuh: the softmax and output of the Hopper rungs, between and after their two wgmma.
//
// Every consumer thread holds, for its rows r0 and r0 + 8, a slice of the S = Q K^T accumulator of a
// 64 x BN wgmma: s[i] is S[row r0 + 8 * ((i / 2) % 2)][key n0 + 8 * (i / 4) + 2t + i % 2] (ft_wgmma.cuh),
// and the matching slice of the O accumulator (HEAD_DIM / 2 floats, the same layout along the head dim).
// The rungs differ in how tiles reach shared memory, not in this arithmetic, so it is written once here.
#pragma once
#include "ft_wgmma.cuh"

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
// caller, wg_rescale), and -m_new * scale_log2 for the exponent.
template <int BN>
__device__ __forceinline__ void wg_softmax_max(const float* s, float (&m)[2], float (&l)[2], float scale_log2,
                                               float (&alpha)[2], float (&neg_mscaled)[2]) {
    float m_tile[2] = {FT_NEG_INF, FT_NEG_INF};
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) m_tile[(i / 2) % 2] = fmaxf(m_tile[(i / 2) % 2], s[i]);
#pragma unroll
    for (int r = 0; r < 2; ++r)
        wg_move_max(m[r], l[r], fmaxf(m[r], quad_max(m_tile[r])), scale_log2, alpha[r], neg_mscaled[r]);
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
        const float p0 = ft_exp2(fmaf(s[i], scale_log2, neg_mscaled[(i / 2) % 2]));
        const float p1 = ft_exp2(fmaf(s[i + 1], scale_log2, neg_mscaled[(i / 2) % 2]));
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
    for (int i = 0; i < BN / 2; ++i) s[i] = ft_exp2(fmaf(s[i], scale_log2, neg_mscaled[(i / 2) % 2]));
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) l[(i / 2) % 2] += s[i] + s[i + 1];
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
    wg_softmax_max<BN>(s, m, l, scale_log2, alpha, neg_mscaled);
    wg_rescale(acc, alpha);
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
