// peak_mma.cu: how fast each tensor-core instruction can go on its own, with nothing else to do.
//
// Chapter 09 says the FlashAttention-2 generation (mma.sync) cannot reach the dense rate of the
// H200's datasheet, which is the rate of wgmma. These two kernels measure both ceilings directly:
// each issues one instruction in a loop on operands that never change, so no load, softmax or
// barrier takes a cycle from it, and the rate they reach is the most any kernel built on that
// instruction can reach on this GPU at its current clocks.
//
//   peak_mma_sync_loop: every warp keeps PEAK_CHAINS independent m16n8k16 accumulators in registers
//     and issues one mma.sync to each per step: independent, so the tensor core pipelines them and
//     never waits for a result (the latency of one mma.sync is hidden behind the others).
//   peak_wgmma_loop (sm_90a): every warpgroup issues m64n128k16 wgmma reading A and B from shared
//     memory (128-byte swizzle, as the W1 kernel does) into two accumulators it alternates between,
//     so one group of wgmma runs while the next is issued (wait_group 1, never 0, inside the loop).
// The kernels' names say "peak", not fwd or bwd: they are not attention kernels.
#include "ft_wgmma.cuh"

#ifndef PEAK_CHAINS
#define PEAK_CHAINS 8
#endif
#ifndef PEAK_WARPGROUPS
#define PEAK_WARPGROUPS 2
#endif

// a few distinct, small 16-bit values per lane (about 1/64 in float16 and bfloat16 alike: the sums
// stay far from overflow after any number of steps); the value does not change the speed, and
// different lanes holding different bits keep the compiler from treating the operands as constants
__device__ __forceinline__ ft_raw2 peak_operand(unsigned seed) {
    ft_raw lo = ft_from_float(0.015625f * (1.0f + (float)(seed & 7u) / 8.0f));
    ft_raw hi = ft_from_float(0.015625f * (1.0f + (float)((seed >> 3) & 7u) / 8.0f));
    return (ft_raw2)lo | ((ft_raw2)hi << 16);
}

extern "C" __global__ void peak_mma_sync_loop(float* out, int steps) {
    unsigned seed = threadIdx.x * 2654435761u + blockIdx.x * 40503u;
    ft_raw2 a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = peak_operand(seed >> (3 * i));
    ft_raw2 b0 = peak_operand(seed >> 5), b1 = peak_operand(seed >> 9);
    float d[PEAK_CHAINS][4];
#pragma unroll
    for (int c = 0; c < PEAK_CHAINS; ++c) d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.0f;
    for (int s = 0; s < steps; ++s) {
#pragma unroll
        for (int c = 0; c < PEAK_CHAINS; ++c) mma_16x8x16(d[c], a, b0, b1);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < PEAK_CHAINS; ++c) sum += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;   // keeps every product live
}

// shared memory: A, 64 rows x 64 columns (8 KB), then B, 128 rows x 64 columns (16 KB), both in
// the 128-byte swizzled layout of ft_wgmma.cuh; four k-steps of 16 columns per group
#define PEAK_WGMMA_SMEM (8192 + 16384)

extern "C" __global__ void __launch_bounds__(PEAK_WARPGROUPS * 128, 1) peak_wgmma_loop(float* out, int steps) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    ft_raw2* fill = reinterpret_cast<ft_raw2*>(smem_raw);
    for (int i = threadIdx.x; i < PEAK_WGMMA_SMEM / 4; i += blockDim.x)
        fill[i] = peak_operand(i * 2654435761u + blockIdx.x);
    fence_proxy_async_smem();          // the generic-proxy writes above, before wgmma reads them
    __syncthreads();
    const unsigned a = smem_addr(smem_raw), b = a + 8192;
    float d0[64], d1[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d0[i] = d1[i] = 0.0f;
    for (int s = 0; s < steps; ++s) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
            wgmma_ss<128>(d0, wgmma_desc(a + 32 * ks, 16, 1024), wgmma_desc(b + 32 * ks, 16, 1024), 1);
        wgmma_commit();
        wgmma_wait<1>();               // d1's previous group has finished: it may be issued again
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
            wgmma_ss<128>(d1, wgmma_desc(a + 32 * ks, 16, 1024), wgmma_desc(b + 32 * ks, 16, 1024), 1);
        wgmma_commit();
        wgmma_wait<1>();               // and d0's, before the next step issues to it
    }
    wgmma_wait<0>();
    wgmma_fence_operands<64>(d0);
    wgmma_fence_operands<64>(d1);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) sum += d0[i] + d1[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
