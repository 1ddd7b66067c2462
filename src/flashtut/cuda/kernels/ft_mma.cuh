// ft_mma.cuh: warp-level tensor-core helpers (mma.sync, ldmatrix, cp.async) as inline PTX.
//
// Fragment layout of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), for the
// lane with groupID g = lane / 4 and thread-in-group t = lane % 4:
//   A (16x16, row major), 4 registers of 2 values: a0 = A[g][2t..2t+1],   a1 = A[g+8][2t..2t+1],
//                                                   a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]
//   B (16x8, "col"),      2 registers:            b0 = B[2t..2t+1][g],   b1 = B[2t+8..2t+9][g]
//   C/D (16x8, float),    4 floats:               c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// The C layout of two neighbouring n-tiles is exactly the A layout of one k-step, which is
// what lets the probabilities P stay in registers between S = Q K^T and O = P V.
#pragma once
#include "ft_common.cuh"

// D += A * B for one 16x8x16 tile, float32 accumulate.
// sm_80+: one m16n8k16 instruction (float16 or bfloat16).
// sm_75 (T4): two m16n8k8 float16 instructions, k 0..7 then k 8..15: a0,a1,b0 are the first
// half's fragments and a2,a3,b1 the second's, so the caller's registers need no reshuffling.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const ft_raw2 (&a)[4], ft_raw2 b0, ft_raw2 b1) {
#if FT_SM80
#if FT_BF16
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
#endif
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Four 8x8 matrices of 16-bit values from shared memory; lane i gives the address of row i % 8
// of matrix i / 8, and receives in r[m] the fragment (row lane/4, columns 2*(lane%4)..+1) of matrix m.
__device__ __forceinline__ void ldmatrix_x4(ft_raw2 (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// The same, each 8x8 matrix transposed on the way: the B fragment of V (keys along k) from V
// stored key-major.
__device__ __forceinline__ void ldmatrix_x4_trans(ft_raw2 (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Copy 16 bytes global -> shared; when !valid, write 16 zero bytes instead (masked tails).
// sm_80+: asynchronous (cp.async, bypassing registers and L1); before sm_80: a plain copy.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
#if FT_SM80
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
#else
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (valid) v = *reinterpret_cast<const uint4*>(gmem);
    *reinterpret_cast<uint4*>(smem) = v;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if FT_SM80
    asm volatile("cp.async.commit_group;");
#endif
}

// wait until at most N committed groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if FT_SM80
    asm volatile("cp.async.wait_group %0;" :: "n"(N));
#endif
}

// max / sum over the 4 lanes that share a row of an mma accumulator (lanes 4g..4g+3)
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
