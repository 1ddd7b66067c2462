// ft_common.cuh: the few device helpers every flashtut kernel shares.
//
// NVRTC compiles these kernels with no system headers, so we do not include cuda_fp16.h or
// cuda_bf16.h: a float16 or bfloat16 value is carried as its raw 16 bits (ft_raw), and the
// conversions and tensor-core instructions are one line of inline PTX each. That keeps the
// build independent of where (or whether) CuPy finds the CUDA headers.
#pragma once

#ifndef FT_BF16
#define FT_BF16 0  // 0: float16, 1: bfloat16 (needs sm_80)
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif

typedef unsigned short ft_raw;  // the bits of one float16 / bfloat16 value
typedef unsigned int ft_raw2;   // two of them: element 2i in the low half, 2i+1 in the high half

#define FT_NEG_INF __int_as_float(0xff800000)
#define FT_LOG2E 1.4426950408889634f
#define FT_LN2 0.6931471805599453f

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FT_SM80 1
#else
#define FT_SM80 0
#endif

__device__ __forceinline__ float ft_to_float(ft_raw x) {
#if FT_BF16
    return __uint_as_float(((unsigned)x) << 16);  // bfloat16 is the top half of a float32
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#endif
}

__device__ __forceinline__ ft_raw ft_from_float(float f) {
    ft_raw r;
#if FT_BF16
#if FT_SM80
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
#else
    // no bf16 cvt before sm_80: round to nearest even by hand (finite inputs)
    unsigned u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    r = (ft_raw)(u >> 16);
#endif
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
#endif
    return r;
}

// two floats -> one 32-bit register holding (lo, hi) as 16-bit values: the layout of an
// mma A/B fragment register
__device__ __forceinline__ ft_raw2 ft_pack2(float lo, float hi) {
    ft_raw2 r;
#if FT_SM80
#if FT_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
#else
    r = (ft_raw2)ft_from_float(lo) | ((ft_raw2)ft_from_float(hi) << 16);
#endif
    return r;
}

__device__ __forceinline__ float ft_lo(ft_raw2 x) { return ft_to_float((ft_raw)(x & 0xffffu)); }
__device__ __forceinline__ float ft_hi(ft_raw2 x) { return ft_to_float((ft_raw)(x >> 16)); }

// 2^x with the hardware's approximate exp2 (one MUFU instruction; exp() would add a multiply)
__device__ __forceinline__ float ft_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 2^x on the float32 pipe instead of the special-function unit (MUFU), FlashAttention-4's way of moving a
// share of a softmax's exponentials to the pipe with 8 times the throughput. Chapter 11 teaches it; no
// kernel here calls it (the Hopper rungs lost time with it: the performance log). x = j + f with j = round(x)
// and f in [-1/2, 1/2]: 2^f by a cubic (relative error under 1e-4, a fifth of a float16 rounding), 2^j
// by writing j + 127 into a float's exponent field. Adding 1.5 * 2^23 rounds x to an integer held in
// the low mantissa bits of t (no conversion instruction, which would run on the SFU's pipe again);
// shifting t's bits left by 23 keeps those bits, j mod 2^9, as the exponent, and 127 << 23 biases it.
// x is clamped at -127, where the exponent field is 0: 2^j is then exactly 0, so a masked score (-inf)
// gives p = 0 as ex2 does. x <= 0 here (a score minus its row maximum), so j + 127 never overflows.
// __host__ too: the CPU tests compile this very function with nvcc and check it bit for bit against
// flashtut.cuda.models.exp2_poly, its model in numpy.
// The cubic: the minimax fit of 2^f on [-1/2, 1/2] in relative error (7.5e-5), rounded to float32
// (flashtut.cuda.models.exp2_poly.minimax_cubic computes it).
#define FT_EXP2_P0 0.999928057f
#define FT_EXP2_P1 0.693260968f
#define FT_EXP2_P2 0.242611125f
#define FT_EXP2_P3 0.0551716685f
#define FT_EXP2_MAGIC 12582912.0f   // 1.5 * 2^23
__host__ __device__ __forceinline__ float ft_exp2_poly(float x) {
    x = fmaxf(x, -127.f);
    const float t = x + FT_EXP2_MAGIC;
    const float f = x - (t - FT_EXP2_MAGIC);
    const float p = fmaf(fmaf(fmaf(FT_EXP2_P3, f, FT_EXP2_P2), f, FT_EXP2_P1), f, FT_EXP2_P0);
#ifdef __CUDA_ARCH__
    const unsigned tb = __float_as_uint(t);
#else
    unsigned tb;
    __builtin_memcpy(&tb, &t, 4);
#endif
    const unsigned sb = (tb << 23) + (127u << 23);
#ifdef __CUDA_ARCH__
    return p * __uint_as_float(sb);
#else
    float s;
    __builtin_memcpy(&s, &sb, 4);
    return p * s;
#endif
}

__device__ __forceinline__ float ft_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
