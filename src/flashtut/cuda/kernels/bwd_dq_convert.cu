// Backward, atomic-dQ variant only: the float32 dQ buffer that bwd_dkdv.cu added into, times the
// softmax scale, to the input's 16-bit type. Four elements per thread: one 16-byte load.
#include "bwd_common.cuh"

extern "C" __global__ void __launch_bounds__(256)
attn_bwd_dq_convert(const float* __restrict__ acc, ft_raw* __restrict__ dq, float scale, int n) {
    const int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;   // n is a multiple of 4 (HEAD_DIM is)
    const float4 x = *reinterpret_cast<const float4*>(acc + i);
    uint2 y;
    y.x = ft_pack2(x.x * scale, x.y * scale);
    y.y = ft_pack2(x.z * scale, x.w * scale);
    *reinterpret_cast<uint2*>(dq + i) = y;
}
