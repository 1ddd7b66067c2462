// ft_wgmma.cuh: Hopper warpgroup MMA (wgmma, sm_90a) as inline PTX, and the shared-memory layout it reads.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp index a multiple of 4). One
// wgmma.mma_async instruction multiplies a 64 x 16 A tile by a 16 x N B tile into a 64 x N float32
// accumulator spread over the warpgroup's registers, asynchronously: the instruction is issued, the
// tensor cores read A and B from shared memory (or A from registers) on their own, and the threads
// learn that it finished only through wgmma.commit_group / wgmma.wait_group.
//
// Register layout of the m64nNk16 float32 accumulator (PTX ISA, "Register fragments" of wgmma): warp w
// of the warpgroup owns rows 16w..16w+15; in it the lane with g = lane / 4, t = lane % 4 holds N / 2
// floats, d[i] at row 16w + g + 8 * ((i / 2) % 2), column 8 * (i / 4) + 2t + i % 2. That is the
// mma.m16n8 accumulator layout repeated along N, and the A-from-registers fragment of one k-step
// (4 registers of two 16-bit values: rows g and g + 8, columns 2t.. and 2t + 8..) is the same
// layout for 16 columns: so the probabilities P = exp2(S - m) leave the S accumulator and enter the
// second product without a trip through shared memory (flashtut.cuda.models.hopper_layout proves it on the CPU).
//
// Shared-memory operands are described by a 64-bit matrix descriptor, not a pointer:
//   bits  0-13  start address >> 4          bits 32-45  stride-dimension byte offset (SBO) >> 4
//   bits 16-29  leading-dimension byte offset (LBO) >> 4
//   bits 49-51  base offset (0: the swizzle pattern starts on a 1024-byte boundary)
//   bits 62-63  swizzle mode: 0 none, 1 = 128-byte, 2 = 64-byte, 3 = 32-byte
// The tiles here use the 128-byte swizzle: rows of 64 16-bit values (128 bytes), 8 rows (1024 bytes)
// per swizzle atom, the 16-byte chunk c of row r stored at chunk c ^ (r % 8). The hardware applies
// the XOR to address bits 4-6 from bits 7-9, so a start address moved by 32 bytes along a row (the next
// k-step of 16 values) still reads the right chunks, provided each atom starts 1024-byte aligned.
#pragma once
#include "ft_mma.cuh"

// wgmma and setmaxnreg exist only on the sm_90a target; other targets compile the kernels' signatures
// (so one file builds everywhere) and never run them
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FT_SM90A 1
#else
#define FT_SM90A 0
#endif

#if FT_BF16
#define FT_WGMMA_AB "bf16.bf16"
#else
#define FT_WGMMA_AB "f16.f16"
#endif

// byte offset of element (row, col) in a [cols / 64][ROWS][64] tile of 16-bit values with the
// 128-byte swizzle: a head dim wider than 64 is cut into 64-column blocks, each ROWS x 128 bytes
template <int ROWS>
__host__ __device__ __forceinline__ unsigned sw128_offset(int row, int col) {
    return (unsigned)((col >> 6) * (ROWS * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + (col & 7) * 2);
}

// 128-byte-swizzle descriptor of the operand starting at shared address addr (host too: the CPU tests
// compare both functions with flashtut.cuda.models.hopper_layout)
__host__ __device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4)
         | ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16)
         | ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32)
         | (1ull << 62);
}

// The descriptor of the operand `bytes` further on in shared memory than desc's: its start-address field
// (bits 0-13, the address >> 4) plus bytes >> 4, in the low word alone. Equal to wgmma_desc of the moved
// address wherever that address stays below 2^18 (every shared address of a block: 228 KB at most). The
// Hopper backward steps each tile's descriptor along K with it instead of masking and shifting every address.
__host__ __device__ __forceinline__ unsigned long long wgmma_desc_step(unsigned long long desc, unsigned bytes) {
    return (desc >> 32 << 32) | (unsigned)((unsigned)desc + (bytes >> 4));
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() {
#if FT_SM90A
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if FT_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

// wait until at most N committed wgmma groups of this warpgroup are still running
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if FT_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}

// The compiler sees a wgmma's accumulators as written when the asm statement "returns", which is
// not when the tensor cores write them. An empty asm that claims to modify each register, placed
// after wgmma_wait, keeps every later use of the register below the wait (and every earlier write
// above the next wgmma_fence).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// The same for the A fragments of a wgmma that reads them from registers: the compiler sees them as read
// when the asm statement issues, and could give their registers to new values (the next tile's P) while
// the tensor cores are still reading them. Claiming to modify them after wgmma_wait keeps them live up to it.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(ft_raw2* a) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i]) :: "memory");
}

// Writes by ordinary threads (cp.async, st.shared) are in the generic proxy; wgmma reads shared memory
// through the async proxy. Each writing thread fences before the barrier that publishes its writes.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FT_SM90A
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

#define FT_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                      "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FT_ACC32(d) FT_ACC8(d, 0), FT_ACC8(d, 8), FT_ACC8(d, 16), FT_ACC8(d, 24)
#define FT_ACC64(d) FT_ACC32(d), FT_ACC8(d, 32), FT_ACC8(d, 40), FT_ACC8(d, 48), FT_ACC8(d, 56)

#define FT_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
                  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FT_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
                  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
                  "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
                  "%55, %56, %57, %58, %59, %60, %61, %62, %63}"

// D (64 x N, float32) = A (64 x 16, shared, K-major) * B (16 x N, shared, K-major) + (accumulate ? D : 0).
// d points at N / 2 floats of the caller's register array (a constant offset after unrolling).
template <int N>
__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long desc_a, unsigned long long desc_b, int accumulate);

template <>
__device__ __forceinline__ void wgmma_ss<64>(float* d, unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
#if FT_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FT_WGMMA_AB " " FT_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : FT_ACC32(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}

template <>
__device__ __forceinline__ void wgmma_ss<128>(float* d, unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
#if FT_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." FT_WGMMA_AB " " FT_REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : FT_ACC64(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}

// D (64 x N, float32) += A (64 x 16, registers: the fragment a[4]) * B (16 x N, shared, N-major:
// imm-trans-b = 1, because V is stored key by key with the head dim contiguous).
template <int N>
__device__ __forceinline__ void wgmma_rs_nmajor(float* d, const ft_raw2 (&a)[4], unsigned long long desc_b);

template <>
__device__ __forceinline__ void wgmma_rs_nmajor<64>(float* d, const ft_raw2 (&a)[4], unsigned long long desc_b) {
#if FT_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FT_WGMMA_AB " " FT_REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : FT_ACC32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
#endif
}

template <>
__device__ __forceinline__ void wgmma_rs_nmajor<128>(float* d, const ft_raw2 (&a)[4], unsigned long long desc_b) {
#if FT_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." FT_WGMMA_AB " " FT_REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : FT_ACC64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
#endif
}
