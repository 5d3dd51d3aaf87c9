// Bias kernels (linear.py; its NumPy code is the reference twin). The GEMMs of linear layers run on
// cuBLAS through cupy.matmul; only the bias is here.
//
// Layout. The bias axis splits a contiguous array into (outer, C, inner): element i belongs to
// channel c = (i / inner) % C. axis = 1 of NCHW gives (N, C, H·W); axis = -1 gives (rows, C, 1).
//
// bias_add: one thread per element, grid-stride; a ChannelStep tracks c without a division per element.
//
// bias_backward sums every value of a channel, in double, in a fixed order, in one launch: the blocks
// of a channel write per-split partial sums to a (splits, C) double workspace and the last of them to
// arrive (last_block_of_channel, channels.cuh) adds the channel's splits in a fixed order and writes
// dbias, rounded once. Two mappings:
//   * bias_grad_columns, inner = 1 (linear layers, dy (rows, C)): the 32 lanes of a warp own 32
//     consecutive channels and the warps of a block take rows round-robin, so every load of a warp is
//     one contiguous row segment. Grid (ceil(C / 32), splits), split k owns rows [k·per, (k+1)·per);
//     a counter per block of 32 channels, and lane l of the last block adds channel l's splits in order.
//   * bias_grad_planes, inner > 1 (convolutions): as the batch-norm statistics (batchnorm.cu), a block
//     per (channel, split) walks its channel's planes of `inner` contiguous values with a Cursor; a
//     counter per channel, and the last block's warp 0 adds the splits (lane l takes splits l, l + 32, ...,
//     then a shuffle tree).
// No floating-point atomics; the launch shape depends only on the shape of dy, so the sums are deterministic.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;
typedef double acc_t;  // float64 accumulation for float32 too, as the NumPy twin

#include "channels.cuh"

// y, bias, out, dy and dbias: scalar_t, or in the half build (HALF = 1 for float16, 2 for bfloat16, with SCALAR
// float) 16-bit words, read as their exact values and written rounded once (elements.cuh): bias_add adds in
// float, and dbias is the double sum rounded to float and then to the half type, as the float kernels' result
// on the widened arrays is.
#include "elements.cuh"

// out = y + bias broadcast along the bias axis. out may be y itself (in place after a GEMM), hence
// no __restrict__ on y and out.
extern "C" __global__ void bias_add(const elem_t* y, const elem_t* __restrict__ bias, elem_t* out,
                                    const int C, const int inner, const int total) {
    const int G = blockDim.x * gridDim.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    for (ChannelStep channel(i, G, C, inner); i < total; i += G, channel.advance()) {
        out[i] = element_of(element_value(y[i]) + element_value(bias[channel.c]));
    }
}

// Grid (ceil(C / 32), splits), blockDim.x a multiple of 32 (treated as warps × 32 lanes). partial:
// (splits, C) doubles, the sum of dy[r, c] over the split's rows; counters: one zeroed counter per block of
// 32 channels. dbias[c] = Σ_k partial[k, c], added in order of k and rounded once.
extern "C" __global__ void bias_grad_columns(const elem_t* __restrict__ dy, acc_t* __restrict__ partial,
                                             unsigned int* __restrict__ counters, elem_t* __restrict__ dbias,
                                             const int rows, const int C, const int per) {
    __shared__ acc_t tile[MAX_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    const int k = blockIdx.y, splits = gridDim.y;
    const int begin = k * per;
    const int len = min(per, rows - begin);
    acc_t sum = 0;
    if (c < C) {
        // Counted loop: r never steps past the last row, so r·C stays within the array.
        const int count = warp < len ? (len - 1 - warp) / warps + 1 : 0;
#pragma unroll 4
        for (int q = 0; q < count; ++q) sum += (acc_t)element_value(dy[(begin + warp + q * warps) * C + c]);
    }
    tile[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && c < C) {
        acc_t total = 0;
        for (int w = 0; w < warps; ++w) total += tile[w][lane];  // fixed order
        partial[k * C + c] = total;
    }
    if (!last_block_of_channel(counters + blockIdx.x, splits) || warp != 0 || c >= C) return;
    // Warp 0 of the last block. __ldcg reads through L2, where the other blocks' partial sums are.
    acc_t total = 0;
    for (int j = 0; j < splits; ++j) total += __ldcg(partial + j * C + c);
    dbias[c] = element_of((scalar_t)total);
}

// Lane 0 ends with the warp's sum (lane l adds lane l + offset, offsets 16..1).
__device__ __forceinline__ acc_t warp_sum(acc_t a) {
    for (int offset = 16; offset > 0; offset >>= 1) a += __shfl_down_sync(FULL_MASK, a, offset);
    return a;
}

// Grid (C, splits), 1-D blocks (a multiple of 32 threads). partial: (splits, C) doubles, the sum of the
// channel's values [k·per, min((k + 1)·per, outer·inner)); counters: C zeroed counters. The channel's last
// block adds its splits (lane l of warp 0 takes splits l, l + 32, ..., then the shuffle tree) and writes
// dbias[c], rounded once.
extern "C" __global__ void bias_grad_planes(const elem_t* __restrict__ dy, acc_t* __restrict__ partial,
                                            unsigned int* __restrict__ counters, elem_t* __restrict__ dbias,
                                            const int outer, const int C, const int inner, const int per) {
    __shared__ acc_t warp_sums[MAX_WARPS];
    const int c = blockIdx.x, k = blockIdx.y, splits = gridDim.y;
    const int t = threadIdx.x, B = blockDim.x;
    const int M = outer * inner;
    const int begin = k * per;
    const int len = min(per, M - begin);
    int left = t < len ? (len - 1 - t) / B + 1 : 0;
    acc_t sum = 0;
    if (left > 0) {
        const elem_t* __restrict__ dyc = dy + c * inner;
        Cursor cursor(begin + t, B, C, inner);
        while (left >= 4) {  // four loads in flight, summed in order
            const int o0 = cursor.take(left), o1 = cursor.take(left), o2 = cursor.take(left), o3 = cursor.take(left);
            const acc_t v0 = element_value(dyc[o0]), v1 = element_value(dyc[o1]), v2 = element_value(dyc[o2]),
                        v3 = element_value(dyc[o3]);
            sum += v0;
            sum += v1;
            sum += v2;
            sum += v3;
        }
        while (left > 0) sum += (acc_t)element_value(dyc[cursor.take(left)]);
    }
    sum = warp_sum(sum);
    const int lane = t & 31, warp = t >> 5;
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = lane < (B >> 5) ? warp_sums[lane] : 0;
        sum = warp_sum(sum);
        if (lane == 0) partial[k * C + c] = sum;
    }
    if (!last_block_of_channel(counters + c, splits) || warp != 0) return;
    // Warp 0 of the channel's last block (see bias_grad_columns).
    sum = 0;
    for (int j = lane; j < splits; j += 32) sum += __ldcg(partial + j * C + c);
    sum = warp_sum(sum);
    if (lane == 0) dbias[c] = element_of((scalar_t)sum);
}
