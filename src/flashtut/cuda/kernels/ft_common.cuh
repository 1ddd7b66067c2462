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

__device__ __forceinline__ float ft_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
