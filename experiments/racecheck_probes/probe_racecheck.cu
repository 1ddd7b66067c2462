// probe_racecheck.cu: a word handed from warp 0 to warp 1 through shared memory, ordered in several ways,
// for compute-sanitizer's racecheck (sm_90a; probe_launches.py beside it launches them, one block of 64
// threads; it includes flashtut's ft_tma.cuh, as the kernels do).
//
// W4 hands its consumers the number of their next query block through a shared-memory word, and racecheck
// reports that word, ordered by an mbarrier and again by named barriers (book/perflog_hopper.md). Each
// kernel here is the same handover, six lines long, so that what the tool reports for it says which
// orderings the tool follows, not what W4 does:
//  * probe_unordered: no ordering at all, a real race (the tool must report it);
//  * probe_both_sync: both warps bar.sync on one named barrier (what __syncthreads is);
//  * probe_arrive_sync: warp 0 bar.arrive, warp 1 bar.sync (W4_NAMED_HANDOVER's pattern);
//  * probe_mbar_parity: thread 0 arrives on an mbarrier, thread 32 waits for its phase by parity
//    (W4's q_full);
//  * probe_mbar_token: both arrive, thread 32 waits with the state its own arrival returned (the
//    cuda::barrier pattern);
//  * probe_mbar_tx: the phase thread 32 waits for completes with the bytes of a bulk copy, after thread 0's
//    arrive.expect_tx (how q_full completes in W3 and W4: the last event is the copy's, not the arrival);
//  * probe_named_ring, probe_mbar_ring: PROBE_ROUNDS words in a row through the same barriers, the next
//    word written once warp 1 has read the last (slot_full / slot_empty of W4_NAMED_HANDOVER; q_full and
//    q_empty with two slots, as W4 hands over its counter).
// The word is the kernel's argument and goes through a volatile reference: written as a constant, the
// compiler forwards it and no shared-memory access is left for the tool to see. Warp 1 writes the word it
// read to out[0] (the rings: the sum of what it read), so the launcher can check the handover.
// Measured on the H200 (compute-sanitizer 2025.3.1): the unordered probe and the two rings get one
// report each, every single handover none. The tool follows each ordering from writer to reader, and
// reports a word written again after the reader's arrival, which is what W4's slot is.
#include "ft_tma.cuh"

#define PROBE_ROUNDS 8

extern "C" __global__ void probe_unordered(int* out, int value) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    if (threadIdx.x == 0) word = value;
    if (threadIdx.x == 32) out[0] = word;
}

extern "C" __global__ void probe_both_sync(int* out, int value) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    if (threadIdx.x == 0) word = value;
    asm volatile("bar.sync 1, 64;" ::: "memory");
    if (threadIdx.x == 32) out[0] = word;
}

extern "C" __global__ void probe_arrive_sync(int* out, int value) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) word = value;
        asm volatile("bar.arrive 1, 64;" ::: "memory");
    } else {
        asm volatile("bar.sync 1, 64;" ::: "memory");
        if (threadIdx.x == 32) out[0] = word;
    }
}

// The mbarrier probes: the barrier initialised for ``count`` arrivals, then thread 0 writes the word and
// arrives on it (with ``tx`` bytes announced for a copy to complete, if any).
__device__ __forceinline__ unsigned probe_mbar_write(volatile int& word, int value, unsigned long long& bar_obj,
                                                     unsigned count, unsigned tx = 0) {
    const unsigned bar = smem_addr(&bar_obj);
    if (threadIdx.x == 0) {
        mbar_init(bar, count);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        word = value;
        if (tx) mbar_arrive_expect_tx(bar, tx);
        else mbar_arrive(bar);
    }
    return bar;
}

// Thread 32 waits for the barrier's first phase by parity (as W4's consumers wait on q_full) and writes
// the word it then reads.
__device__ __forceinline__ void probe_mbar_read(int* out, volatile int& word, unsigned bar) {
    if (threadIdx.x == 32) {
        mbar_wait(bar, 0);
        out[0] = word;
    }
}

extern "C" __global__ void probe_mbar_parity(int* out, int value) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    __shared__ __align__(8) unsigned long long bar_obj;
    probe_mbar_read(out, word, probe_mbar_write(word, value, bar_obj, 1));
}

extern "C" __global__ void probe_mbar_token(int* out, int value) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    __shared__ __align__(8) unsigned long long bar_obj;
    const unsigned bar = probe_mbar_write(word, value, bar_obj, 2);
    if (threadIdx.x == 32) {
#if FT_SM90A
        unsigned long long state;
        asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(bar) : "memory");
        unsigned done = 0;
        do {
            asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done) : "r"(bar), "l"(state) : "memory");
        } while (!done);
#endif
        out[0] = word;
    }
}

extern "C" __global__ void probe_mbar_tx(int* out, int value, const int4* __restrict__ src) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    __shared__ __align__(8) unsigned long long bar_obj;
    const unsigned bar = probe_mbar_write(word, value, bar_obj, 1, 16);
#if FT_SM90A
    __shared__ __align__(16) int4 landing;
    if (threadIdx.x == 0)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 16, [%2];"
                     :: "r"(smem_addr(&landing)), "l"(src), "r"(bar) : "memory");
#else
    (void)src;
#endif
    probe_mbar_read(out, word, bar);
}

extern "C" __global__ void probe_named_ring(int* out, int value) {
    __shared__ int word_obj;
    volatile int& word = word_obj;
    int sum = 0;
#pragma unroll 1
    for (int it = 0; it < PROBE_ROUNDS; ++it) {
        if (threadIdx.x < 32) {
            if (it > 0) asm volatile("bar.sync 2, 64;" ::: "memory");    // slot_empty
            if (threadIdx.x == 0) word = value + it;
            asm volatile("bar.arrive 1, 64;" ::: "memory");              // slot_full
        } else {
            asm volatile("bar.sync 1, 64;" ::: "memory");
            sum += word;
            if (it + 1 < PROBE_ROUNDS) asm volatile("bar.arrive 2, 64;" ::: "memory");
        }
    }
    if (threadIdx.x == 32) out[0] = sum;
}

extern "C" __global__ void probe_mbar_ring(int* out, int value) {
    __shared__ int slot_obj[2];
    volatile int* slot = slot_obj;
    __shared__ __align__(8) unsigned long long bar_obj[2];
    const unsigned full = smem_addr(&bar_obj[0]), empty = smem_addr(&bar_obj[1]);
    if (threadIdx.x == 0) {
        mbar_init(full, 1);
        mbar_init(empty, 1);
        mbar_init_fence();
    }
    __syncthreads();
    int sum = 0;
#pragma unroll 1
    for (int it = 0; it < PROBE_ROUNDS; ++it) {
        if (threadIdx.x == 0) {
            if (it > 0) mbar_wait(empty, (unsigned)(it - 1) & 1u);   // warp 1 read the last word
            slot[it & 1] = value + it;
            mbar_arrive(full);
        } else if (threadIdx.x >= 32) {
            mbar_wait(full, (unsigned)it & 1u);
            sum += slot[it & 1];
            warp_release(empty, threadIdx.x % 32);
        }
    }
    if (threadIdx.x == 32) out[0] = sum;
}
