// Batch normalisation on the GPU (batchnorm.py states the maths; its NumPy code is the reference twin).
//
// Layout. x, y, dy and dx are contiguous (N, C, S) arrays (of elem_t: scalar_t, or half words, below), S =
// prod(spatial); channels-last ones are (M, C) rows, in their own section near the end. Channel c holds
// M = N·S values: value j (0 <= j < M) is x[(n·C + c)·S + s] with n = j / S, s = j % S, so a channel
// is N planes of S contiguous values, C·S apart. Per-channel vectors (C,) are contiguous, of x's dtype.
//
// Launches per call: training forward 2 (statistics, normalise), training backward 2 (sums, dx),
// inference forward 1, inference backward 1. An optional ReLU after the normalisation costs none:
// the forward kernels clamp y as they write it, and the backward kernels read dy·[y > 0] (the
// ReLU's gradient, with y the fused forward's output) wherever they read dy.
//
// Reductions (the statistics, the backward sums) run on a (C, splits) grid of blocks: block (c, k)
// owns the values j in [k·per, min((k + 1)·per, M)) of channel c, so that a small C (64 channels on
// a GPU of over a hundred SMs) still fills the GPU; batchnorm.py picks splits from C and M. Thread t of a block visits
// j = begin + t, begin + t + B, ... (B = blockDim.x): the 32 threads of a warp read 32 consecutive j,
// which are consecutive addresses inside a plane (for S = 1, (N, C) inputs, they are C apart: correct
// but not coalesced; a channels-last kernel would serve that case better). A Cursor steps from one j to
// the next without a division per value, and each thread reads four values per iteration (four loads
// in flight). The statistics are one pass: each thread keeps a Welford state (count, mean, M2) and
// merges each group of four reads into it with the parallel-combination formula. Accumulators are
// double for float inputs too: they live in registers, so this costs no memory traffic (the channels-last
// kernels' per-thread sums, V channels a thread, are float in the half build: row_sum_t). A group's own
// sums run in chunk_t (below), one chain per read, so that no thread waits on one long chain of
// dependent adds (a double add's latency, 4·V times, per group). A block merges
// its threads' results with a fixed tree (warp shuffles, then shared memory) and thread 0 writes the
// block's partial result to a (fields, splits, C) double workspace.
//
// Finishing a channel (merging its splits, then mean and invstd, the running statistics, the backward
// coefficients) needs every split's result. Rather than a second launch, the block that completes a
// channel last does it: each block publishes its partial result and counts itself in a per-channel
// counter (the "last block done" handshake of CUDA's threadFenceReduction sample, CUB and PyTorch);
// the block that counts last merges the channel's splits in a fixed order (lane l takes splits
// l, l + 32, ... in turn, then the warp's shuffle tree), whichever block that happens to be. No
// floating-point atomics, and the launch shape depends only on the problem's shape: the results are
// the same bits on every run.
//
// Element-wise kernels: one thread per element (grid-stride loop of stride G); a ChannelStep tracks the
// channel c = (i / S) % C of the thread's element with two divisions per thread, not per element. The
// per-channel coefficients they read (a few doubles per channel) stay in the caches; their arithmetic is
// math_t's (float in the half build).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;
typedef double acc_t;  // accumulators and per-channel coefficients, for float and double inputs alike

// The elements of x, y, dy, dx and relu_output: scalar_t, or in the half build (HALF = 1 for float16, 2 for
// bfloat16, with SCALAR float) 16-bit words (elements.cuh). The per-channel vectors (weight, bias, the
// statistics) stay float there: the master weights of mixed precision.
#include "elements.cuh"

#include "channels.cuh"

// The reductions' inner sums, over one group of 4·V values, before they merge into the double accumulators:
// double for float and double inputs, float in the half build. A half value has 8 or 11 significant bits, so a
// float sum of 32 of them (and of their products with a float) rounds far below what the half result can
// hold; double there is 2-4 times the issue slots per value (and twice the registers) for no visible bit.
#ifdef HALF
typedef float chunk_t;
#else
typedef acc_t chunk_t;
#endif

// The element-wise kernels' arithmetic (normalise, dx), from the double per-channel coefficients: double for float
// and double inputs, float in the half build. There the one rounding to 8 or 11 significant bits is of a float
// result whose own error is 2^-24 relative (x − mean is still taken before the scaling), as PyTorch's half batch
// norm computes in float; a thread's coefficients then take half the registers, which is what limits how many
// threads of the channels-last kernels (V channels' coefficients each) an SM holds.
#ifdef HALF
typedef float math_t;
#else
typedef acc_t math_t;
#endif

// Every kernel has builds that move packs of VECTOR elements (16 bytes, elements.cuh's Pack) and of VECTOR8
// (8 bytes) as well as the plain one (V = 1); batchnorm.py launches the widest whose pack S is a multiple of, so
// that a pack lies inside one plane (a 14 x 14 plane holds whole packs of 4 half words, not of 8), and whose
// size the arrays are aligned to. The element-wise arithmetic is the same, element by element in the same order, so
// V changes no result of the element-wise kernels; the reductions group their values by 4·V before a Welford
// merge, a different rounding of the double accumulators.

// ----------------------------------------------------------------------------------------------
// Walking one channel's values
// ----------------------------------------------------------------------------------------------

// How many values of a `len`-value range thread t visits with stride B.
__device__ __forceinline__ int values_of_thread(const int len, const int t, const int B) {
    return t < len ? (len - 1 - t) / B + 1 : 0;
}

// ----------------------------------------------------------------------------------------------
// Welford states and fixed-order merges
// ----------------------------------------------------------------------------------------------

// (n, mean, m2) absorbs (nb, meanb, m2b): Chan et al.'s parallel combination. n = 0 takes the other
// state exactly (mean + (meanb − 0)·1), nb = 0 changes nothing (and avoids 0/0).
__device__ __forceinline__ void welford_merge(acc_t& n, acc_t& mean, acc_t& m2,
                                              const acc_t nb, const acc_t meanb, const acc_t m2b) {
    if (nb == 0) return;
    const acc_t total = n + nb;
    const acc_t delta = meanb - mean;
    const acc_t fb = nb / total;
    mean += delta * fb;
    m2 += m2b + delta * delta * n * fb;
    n = total;
}

// Lane 0 ends with the merge of the warp's 32 states (lane l absorbs lane l + offset, offsets 16..1).
// Lanes whose partner is past lane 31 absorb themselves: garbage that lane 0 never reads.
__device__ __forceinline__ void warp_welford(acc_t& n, acc_t& mean, acc_t& m2) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const acc_t nb = __shfl_down_sync(FULL_MASK, n, offset);
        const acc_t meanb = __shfl_down_sync(FULL_MASK, mean, offset);
        const acc_t m2b = __shfl_down_sync(FULL_MASK, m2, offset);
        welford_merge(n, mean, m2, nb, meanb, m2b);
    }
}

// Thread 0 ends with the block's state: each warp merges its lanes, warp 0 merges the warps.
__device__ void block_welford(acc_t& n, acc_t& mean, acc_t& m2) {
    __shared__ acc_t shared_n[MAX_WARPS], shared_mean[MAX_WARPS], shared_m2[MAX_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_welford(n, mean, m2);
    if (lane == 0) {
        shared_n[warp] = n;
        shared_mean[warp] = mean;
        shared_m2[warp] = m2;
    }
    __syncthreads();
    if (warp == 0) {
        const bool real = lane < (int)(blockDim.x >> 5);
        n = real ? shared_n[lane] : 0;
        mean = real ? shared_mean[lane] : 0;
        m2 = real ? shared_m2[lane] : 0;
        warp_welford(n, mean, m2);
    }
}

// Lane 0 ends with the warp's sums of a and b (same fixed tree as warp_welford).
__device__ __forceinline__ void warp_sum2(acc_t& a, acc_t& b) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        a += __shfl_down_sync(FULL_MASK, a, offset);
        b += __shfl_down_sync(FULL_MASK, b, offset);
    }
}

// Thread 0 ends with the block's sums of a and b.
__device__ void block_sum2(acc_t& a, acc_t& b) {
    __shared__ acc_t shared_a[MAX_WARPS], shared_b[MAX_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_sum2(a, b);
    if (lane == 0) {
        shared_a[warp] = a;
        shared_b[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        const bool real = lane < (int)(blockDim.x >> 5);
        a = real ? shared_a[lane] : 0;
        b = real ? shared_b[lane] : 0;
        warp_sum2(a, b);
    }
}

// invstd of the inference path (running variance), shared by its forward and backward kernels so
// that both use the very same value. The training path computes 1/sqrt once per channel instead,
// as the NumPy twin does.
__device__ __forceinline__ acc_t inference_invstd(const scalar_t running_var, const acc_t eps) {
    return rsqrt((acc_t)running_var + eps);
}

// ----------------------------------------------------------------------------------------------
// The fused ReLU
// ----------------------------------------------------------------------------------------------

// y = max(v, 0), with NaN propagated as relu_forward does (activation.cu), when relu != 0.
template <typename T>
__device__ __forceinline__ T apply_relu(const T v, const int relu) {
    return (!relu || v > 0 || isnan(v)) ? v : T(0);
}

// One element's dy·[y > 0], y the fused ReLU's output (relu_output), or plain dy without the ReLU (y is then
// not read): the ReLU's gradient folded into the read. A select, not a product, so that dy = ±inf or NaN
// where y <= 0 gives 0 as relu_backward does.
template <typename T = acc_t>
__device__ __forceinline__ T gradient(const elem_t dy, const elem_t y, const bool relu) {
    return (!relu || element_value(y) > 0) ? (T)element_value(dy) : T(0);
}

// Arithmetic rounded as written: the compiler contracts none of it into a fused multiply-add of its own choosing,
// which it may choose differently in one kernel than in another. The normalisation below and the backward's
// products of a gradient and a centred x go through these, so that the training backward's ReLU mask recomputed
// from x is the forward's to the bit, and its sums those of the y path (another kernel). One fused multiply-add
// where the sums accumulate, as the compiler's contraction would have made.
__device__ __forceinline__ float rounded_difference(const float a, const float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double rounded_difference(const double a, const double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float rounded_product(const float a, const float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rounded_product(const double a, const double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float rounded_fma(const float a, const float b, const float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double rounded_fma(const double a, const double b, const double c) {
    return __fma_rn(a, b, c);
}

// The normalisation w = (x − mean)·scale + shift (shift only where there is a bias), rounded as written.
__device__ __forceinline__ math_t normalised(const math_t v, const math_t mean, const math_t scale, const math_t shift,
                                             const bool has_shift) {
    const math_t centered = rounded_difference(v, mean);
    return has_shift ? rounded_fma(centered, scale, shift) : rounded_product(centered, scale);
}

// dx = (g − Σg/M)·scale − (x − mean)·slope (finish_sums's coefficients), rounded as written.
__device__ __forceinline__ math_t dx_value(const math_t g, const math_t mean_dy, const math_t scale, const math_t v,
                                          const math_t mean, const math_t slope) {
    return rounded_fma(rounded_difference(g, mean_dy), scale, -rounded_product(rounded_difference(v, mean), slope));
}

// The fused ReLU's mask recomputed from x (the training backward's `relu`): [y > 0] for the forward's y =
// element_of(max(w, 0)), which is w > 0 unless w rounds to 0 in the element type (NaN: false either way). The
// backward takes w's coefficients from the saved statistics, as the forward's (finish_statistics): mean, and
// scale = invstd·weight, a product of two floats that a double holds exactly.
__device__ __forceinline__ bool relu_passes(const math_t w) { return element_value(element_of(w)) > 0; }

// The normalisation's per-channel scale from the saved invstd, invstd·weight in double: finish_statistics's for the
// forward, and the training backward's for the mask from x.
__device__ __forceinline__ acc_t saved_scale(const scalar_t invstd, const scalar_t* __restrict__ weight, const int c) {
    return weight ? (acc_t)invstd * (acc_t)weight[c] : (acc_t)invstd;
}

// One element's gradient in the training backward: dy·[y > 0] by the mask from x (the FROM_X builds, batchnorm.py's
// `relu`), from y (relu_output), or plain dy.
template <typename T, bool FROM_X>
__device__ __forceinline__ T masked_gradient(const elem_t dy, const elem_t y, const bool from_y, const elem_t x,
                                             const math_t mean, const math_t scale, const math_t shift,
                                             const bool has_shift) {
    if (FROM_X) {
        return relu_passes(normalised((math_t)element_value(x), mean, scale, shift, has_shift))
                   ? (T)element_value(dy) : T(0);
    }
    return gradient<T>(dy, y, from_y);
}

// ----------------------------------------------------------------------------------------------
// Finishing a channel in the last of its blocks (last_block_of_channel: channels.cuh)
// ----------------------------------------------------------------------------------------------

// What the last block does for channel c once its state (n, mean, M2) is merged: mean_out, invstd_out (the
// caller's), coef (2, C) = (mean, invstd·weight) for the normalisation, the running statistics in place (the
// unbiased variance M2/(n − 1)), and channel 0 counts the batch. The plane and the row kernels share it.
__device__ __forceinline__ void finish_statistics(const int c, const int C, const acc_t n, const acc_t mean,
                                                  const acc_t m2, const acc_t eps, const acc_t momentum,
                                                  const scalar_t* __restrict__ weight,
                                                  scalar_t* __restrict__ running_mean,
                                                  scalar_t* __restrict__ running_var, scalar_t* __restrict__ mean_out,
                                                  scalar_t* __restrict__ invstd_out, acc_t* __restrict__ coef,
                                                  long long* __restrict__ batches_tracked) {
    const acc_t var = m2 / n;  // biased: the normalisation uses it
    const acc_t invstd = 1.0 / sqrt(var + eps);
    // The normalisation's coefficients come from the saved statistics as the caller gets them (x's dtype), so that
    // the backward, which has only those, can recompute the fused ReLU's mask to the bit (relu_passes).
    const scalar_t saved_mean = (scalar_t)mean, saved_invstd = (scalar_t)invstd;
    mean_out[c] = saved_mean;
    invstd_out[c] = saved_invstd;
    coef[c] = saved_mean;
    coef[C + c] = saved_scale(saved_invstd, weight, c);
    if (running_mean) {
        running_mean[c] = (scalar_t)((1.0 - momentum) * (acc_t)running_mean[c] + momentum * mean);
        const acc_t unbiased = var * (n / (n - 1.0));
        running_var[c] = (scalar_t)((1.0 - momentum) * (acc_t)running_var[c] + momentum * unbiased);
    }
    if (batches_tracked && c == 0) *batches_tracked += 1;
}

// What the last block does for channel c once its sums are in (Σg over M values, Σg·(x − center)): dbias, dweight
// = Σg·(x − center)·invstd, with invstd the saved one (training: invstd not null) or from running_var (inference);
// training's coef (3, C) for the dx kernel: Σg/M, scale = invstd·weight, scale·invstd·dweight/M.
__device__ __forceinline__ void finish_sums(const int c, const int C, const int M, const acc_t sum_dy,
                                            const acc_t sum_dy_xc, const scalar_t* __restrict__ invstd,
                                            const scalar_t* __restrict__ running_var, const acc_t eps,
                                            const scalar_t* __restrict__ weight, scalar_t* __restrict__ dweight,
                                            scalar_t* __restrict__ dbias, acc_t* __restrict__ coef) {
    const acc_t is = invstd ? (acc_t)invstd[c] : inference_invstd(running_var[c], eps);
    const acc_t dw = sum_dy_xc * is;
    dbias[c] = (scalar_t)sum_dy;
    dweight[c] = (scalar_t)dw;
    if (coef) {
        const acc_t scale = weight ? is * (acc_t)weight[c] : is;
        coef[c] = sum_dy / M;
        coef[C + c] = scale;
        coef[2 * C + c] = scale * is * dw / M;
    }
}

// ----------------------------------------------------------------------------------------------
// Training forward: statistics (finished by the last block of each channel), then normalise
// ----------------------------------------------------------------------------------------------

// Grid (C, splits), 1-D blocks (a multiple of 32 threads); V elements a pack (see Pack), so that split k
// owns packs [k·per, (k + 1)·per) of the channel's M/V. partial: (3, splits, C) doubles, fields count, mean,
// M2 (sum of squared deviations) of each block's values; counters: C zeroed counters. The last block of
// channel c merges its splits and writes mean_out, invstd_out (x's dtype, returned to the caller); coef (2,
// C) doubles = (mean, invstd·weight) for bn_apply; and, when running_mean is not null, the in-place
// running-statistics update with the unbiased variance M2/(M − 1); channel 0's also adds 1 to
// *batches_tracked when it is not null (the layer's count of batches). weight may be null (weight 1).
#define STATISTICS_PARAMETERS                                                                                    \
    const elem_t* __restrict__ x, acc_t* __restrict__ partial, unsigned int* __restrict__ counters, const int N, \
    const int C, const int S, const int per, const scalar_t* __restrict__ weight,                                \
    scalar_t* __restrict__ running_mean, scalar_t* __restrict__ running_var, scalar_t* __restrict__ mean_out,    \
    scalar_t* __restrict__ invstd_out, acc_t* __restrict__ coef, const double eps_arg,                           \
    const double momentum_arg, long long* __restrict__ batches_tracked
#define STATISTICS_ARGUMENTS                                                                                    \
    x, partial, counters, N, C, S, per, weight, running_mean, running_var, mean_out, invstd_out, coef, eps_arg, \
    momentum_arg, batches_tracked
template <int V>
__device__ void statistics(STATISTICS_PARAMETERS) {
    const int c = blockIdx.x, k = blockIdx.y, splits = gridDim.y;
    const int t = threadIdx.x, B = blockDim.x;
    const int packs_of_channel = N * (S / V);
    const int begin = k * per;
    int left = values_of_thread(min(per, packs_of_channel - begin), t, B);
    acc_t n = 0, mean = 0, m2 = 0;
    if (left > 0) {
        const Pack<V>* __restrict__ xc = packs<V>(x + c * S);
        Cursor cursor(begin + t, B, C, S / V);
        while (left >= 4) {
            // Four packs per step (four loads in flight): exact two-pass statistics of their 4·V values,
            // then one Welford merge, so the division of the merge is paid once per 4·V values.
            int o[4];
            cursor.take4(o, left);
            // Each pack sums into its own accumulator, four chains of V dependent adds rather than one of 4·V,
            // then the four in a fixed tree.
            Pack<V> p[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) p[q] = xc[o[q]];
            chunk_t sums[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                sums[q] = 0;
#pragma unroll
                for (int u = 0; u < V; ++u) sums[q] += (chunk_t)element_value(p[q].e[u]);
            }
            const chunk_t chunk_mean = ((sums[0] + sums[1]) + (sums[2] + sums[3])) * (chunk_t)(1.0 / (4 * V));
            chunk_t squares[4];  // 4·V is a power of two: the mean's scaling is exact
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                squares[q] = 0;
#pragma unroll
                for (int u = 0; u < V; ++u) {
                    const chunk_t d = (chunk_t)element_value(p[q].e[u]) - chunk_mean;
                    squares[q] += d * d;
                }
            }
            welford_merge(n, mean, m2, 4.0 * V, chunk_mean, (squares[0] + squares[1]) + (squares[2] + squares[3]));
        }
        while (left > 0) {
            const Pack<V> p = xc[cursor.take(left)];
#pragma unroll
            for (int u = 0; u < V; ++u) welford_merge(n, mean, m2, 1.0, element_value(p.e[u]), 0.0);
        }
    }
    block_welford(n, mean, m2);
    if (t == 0) {
        partial[k * C + c] = n;
        partial[(splits + k) * C + c] = mean;
        partial[(2 * splits + k) * C + c] = m2;
    }
    if (!last_block_of_channel(counters + c, splits) || t >= 32) return;

    // Warp 0 of the channel's last block. __ldcg reads through L2, where the other blocks' results are.
    n = mean = m2 = 0;
    for (int j = t; j < splits; j += 32) {
        welford_merge(n, mean, m2, __ldcg(partial + j * C + c), __ldcg(partial + (splits + j) * C + c),
                      __ldcg(partial + (2 * splits + j) * C + c));
    }
    warp_welford(n, mean, m2);
    if (t == 0) {
        finish_statistics(c, C, n, mean, m2, eps_arg, momentum_arg, weight, running_mean, running_var, mean_out,
                          invstd_out, coef, batches_tracked);
    }
}

// y = (x − mean)·(invstd·weight) + bias, then max(·, 0) when relu != 0, element-wise, with coef (2, C)
// from bn_statistics; a grid-stride loop over total/V packs. The mean is subtracted before scaling, in
// double, so |mean| ≫ std does not cancel. bias may be null.
#define APPLY_PARAMETERS                                                                         \
    const elem_t* __restrict__ x, elem_t* __restrict__ y, const acc_t* __restrict__ coef,        \
    const scalar_t* __restrict__ bias, const int relu, const int C, const int S, const int total
#define APPLY_ARGUMENTS x, y, coef, bias, relu, C, S, total
template <int V>
__device__ void apply(APPLY_PARAMETERS) {
    const int G = blockDim.x * gridDim.x, count = total / V;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    Pack<V>* __restrict__ out = packs<V>(y);
    for (ChannelStep channel(i, G, C, S / V); i < count; i += G, channel.advance()) {
        const int c = channel.c;
        const math_t mean = coef[c], scale = coef[C + c], shift = bias ? (math_t)bias[c] : math_t(0);
        const Pack<V> in = packs<V>(x)[i];
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            const math_t w = normalised((math_t)element_value(in.e[u]), mean, scale, shift, bias != nullptr);
            p.e[u] = element_of(apply_relu(w, relu));
        }
        out[i] = p;
    }
}

// ----------------------------------------------------------------------------------------------
// Inference forward: one element-wise kernel
// ----------------------------------------------------------------------------------------------

// y = (x − running_mean)·rsqrt(running_var + eps)·weight + bias, then max(·, 0) when relu != 0;
// weight and bias may be null. The per-channel invstd is recomputed per pack (a double rsqrt)
// rather than in a second launch: the kernel stays memory-bound and inference stays a single launch.
#define INFERENCE_PARAMETERS                                                                           \
    const elem_t* __restrict__ x, elem_t* __restrict__ y, const scalar_t* __restrict__ running_mean,   \
    const scalar_t* __restrict__ running_var, const scalar_t* __restrict__ weight,                     \
    const scalar_t* __restrict__ bias, const double eps_arg, const int relu, const int C, const int S, \
    const int total
#define INFERENCE_ARGUMENTS x, y, running_mean, running_var, weight, bias, eps_arg, relu, C, S, total
template <int V>
__device__ void inference(INFERENCE_PARAMETERS) {
    const acc_t eps = eps_arg;
    const int G = blockDim.x * gridDim.x, count = total / V;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    Pack<V>* __restrict__ out = packs<V>(y);
    for (ChannelStep channel(i, G, C, S / V); i < count; i += G, channel.advance()) {
        const int c = channel.c;
        acc_t invstd_weight = inference_invstd(running_var[c], eps);
        if (weight) invstd_weight *= (acc_t)weight[c];
        const math_t scale = invstd_weight, mean = running_mean[c], shift = bias ? (math_t)bias[c] : math_t(0);
        const Pack<V> in = packs<V>(x)[i];
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            const math_t w = normalised((math_t)element_value(in.e[u]), mean, scale, shift, bias != nullptr);
            p.e[u] = element_of(apply_relu(w, relu));
        }
        out[i] = p;
    }
}

// ----------------------------------------------------------------------------------------------
// Backward: one reduction (finished by the last block of each channel; for inference it also writes
// dx), then, for training, the element-wise dx
// ----------------------------------------------------------------------------------------------

// Grid (C, splits), packs of V as in statistics. partial: (2, splits, C) doubles, fields Σg and
// Σg·(x − center) over each block's values, g = dy·[relu_output > 0] (plain dy when relu_output is null),
// center = the saved batch mean (training) or running_mean (inference); counters: C zeroed counters. The
// last block of channel c writes dbias = Σg and dweight = Σg·(x − center)·invstd, with invstd the saved
// one (training: invstd not null) or from running_var (inference: invstd null); training also writes coef
// (3, C) doubles for bn_backward_dx: Σg/M, scale = invstd·weight, scale·invstd·dweight/M.
// Inference passes dx (not null), and dx = g·weight·invstd is written in the same pass, as its scale
// is a per-channel constant. weight may be null.
#define BACKWARD_REDUCE_PARAMETERS                                                                               \
    const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const elem_t* __restrict__ relu_output,         \
    const scalar_t* __restrict__ bias, const scalar_t* __restrict__ center, acc_t* __restrict__ partial,         \
    unsigned int* __restrict__ counters,                                                                         \
    elem_t* __restrict__ dx, const scalar_t* __restrict__ invstd, const scalar_t* __restrict__ running_var,      \
    const scalar_t* __restrict__ weight, const double eps_arg, scalar_t* __restrict__ dweight,                   \
    scalar_t* __restrict__ dbias, acc_t* __restrict__ coef, const int N, const int C, const int S, const int per
#define BACKWARD_REDUCE_ARGUMENTS                                                                            \
    dy, x, relu_output, bias, center, partial, counters, dx, invstd, running_var, weight, eps_arg, dweight, dbias, \
    coef, N, C, S, per
template <int V, bool FROM_X>
__device__ void backward_reduce(BACKWARD_REDUCE_PARAMETERS) {
    const int c = blockIdx.x, k = blockIdx.y, splits = gridDim.y;
    const int t = threadIdx.x, B = blockDim.x;
    const int packs_of_channel = N * (S / V);
    const int begin = k * per;
    const acc_t eps = eps_arg;
    int left = values_of_thread(min(per, packs_of_channel - begin), t, B);
    acc_t sum_dy = 0, sum_dy_xc = 0;
    if (left > 0) {
        const int base = c * S;
        const Pack<V>* __restrict__ dyc = packs<V>(dy + base);
        const Pack<V>* __restrict__ xc = packs<V>(x + base);
        const Pack<V>* __restrict__ yc = (!FROM_X && relu_output) ? packs<V>(relu_output + base) : nullptr;
        Pack<V>* __restrict__ dxc = dx ? packs<V>(dx + base) : nullptr;
        const acc_t mu = (acc_t)center[c];
        const chunk_t chunk_mu = (chunk_t)center[c];
        // The fused ReLU's mask from x (training: center is the saved mean, invstd the saved one).
        const bool has_shift = bias != nullptr;
        const math_t relu_mean = center[c], relu_scale = FROM_X ? (math_t)saved_scale(invstd[c], weight, c) : math_t(0);
        const math_t relu_shift = (FROM_X && has_shift) ? (math_t)bias[c] : math_t(0);
        acc_t scale = 0;
        if (dx) {
            scale = inference_invstd(running_var[c], eps);
            if (weight) scale *= (acc_t)weight[c];
        }
        Cursor cursor(begin + t, B, C, S / V);
        while (left >= 4) {
            int o[4];
            cursor.take4(o, left);
            // Every load first (twelve in flight), then the arithmetic, pack by pack.
            Pack<V> d[4], y[4], p[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                d[q] = dyc[o[q]];
                y[q] = yc ? yc[o[q]] : d[q];
                p[q] = xc[o[q]];
            }
            // Each pack sums into its own pair of accumulators (as in statistics), added to the double sums
            // once per four packs in a fixed tree.
            chunk_t group_dy[4], group_dy_xc[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                Pack<V> out;
                group_dy[q] = group_dy_xc[q] = 0;
#pragma unroll
                for (int u = 0; u < V; ++u) {
                    const chunk_t g = masked_gradient<chunk_t, FROM_X>(d[q].e[u], y[q].e[u], yc != nullptr, p[q].e[u],
                                                                       relu_mean, relu_scale, relu_shift, has_shift);
                    group_dy[q] += g;
                    group_dy_xc[q] = rounded_fma(g, rounded_difference((chunk_t)element_value(p[q].e[u]), chunk_mu),
                                                 group_dy_xc[q]);
                    out.e[u] = element_of((acc_t)g * scale);
                }
                if (dxc) dxc[o[q]] = out;
            }
            sum_dy += (group_dy[0] + group_dy[1]) + (group_dy[2] + group_dy[3]);
            sum_dy_xc += (group_dy_xc[0] + group_dy_xc[1]) + (group_dy_xc[2] + group_dy_xc[3]);
        }
        while (left > 0) {
            const int o = cursor.take(left);
            const Pack<V> d = dyc[o], y = yc ? yc[o] : d, p = xc[o];
            Pack<V> out;
#pragma unroll
            for (int u = 0; u < V; ++u) {
                const acc_t g = masked_gradient<acc_t, FROM_X>(d.e[u], y.e[u], yc != nullptr, p.e[u], relu_mean,
                                                               relu_scale, relu_shift, has_shift);
                sum_dy += g;
                sum_dy_xc = rounded_fma(g, rounded_difference((acc_t)element_value(p.e[u]), mu), sum_dy_xc);
                out.e[u] = element_of(g * scale);
            }
            if (dxc) dxc[o] = out;
        }
    }
    block_sum2(sum_dy, sum_dy_xc);
    if (t == 0) {
        partial[k * C + c] = sum_dy;
        partial[(splits + k) * C + c] = sum_dy_xc;
    }
    if (!last_block_of_channel(counters + c, splits) || t >= 32) return;

    // Warp 0 of the channel's last block (see statistics).
    sum_dy = sum_dy_xc = 0;
    for (int j = t; j < splits; j += 32) {
        sum_dy += __ldcg(partial + j * C + c);
        sum_dy_xc += __ldcg(partial + (splits + j) * C + c);
    }
    warp_sum2(sum_dy, sum_dy_xc);
    if (t == 0) finish_sums(c, C, N * S, sum_dy, sum_dy_xc, invstd, running_var, eps, weight, dweight, dbias, coef);
}

// Training dx = (g − Σg/M)·scale − (x − mean)·scale·invstd·dweight/M with g = dy·[relu_output > 0] (or
// dy), the NumPy twin's formula, element-wise (packs of V) with coef (3, C) from bn_backward_reduce and the
// saved mean.
#define BACKWARD_DX_PARAMETERS                                                                               \
    const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const elem_t* __restrict__ relu_output,     \
    const scalar_t* __restrict__ bias, const scalar_t* __restrict__ mean, const acc_t* __restrict__ coef,      \
    elem_t* __restrict__ dx, const int C,                                                                    \
    const int S, const int total
#define BACKWARD_DX_ARGUMENTS dy, x, relu_output, bias, mean, coef, dx, C, S, total
template <int V, bool FROM_X>
__device__ void backward_dx(BACKWARD_DX_PARAMETERS) {
    const int G = blockDim.x * gridDim.x, count = total / V;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const Pack<V>* __restrict__ relu_packs = (!FROM_X && relu_output) ? packs<V>(relu_output) : nullptr;
    Pack<V>* __restrict__ out = packs<V>(dx);
    const bool has_shift = bias != nullptr;
    for (ChannelStep channel(i, G, C, S / V); i < count; i += G, channel.advance()) {
        const int c = channel.c;
        // scale is finish_sums's invstd·weight, the forward's own (the ReLU mask from x needs it too).
        const math_t mean_dy = coef[c], scale = coef[C + c], slope = coef[2 * C + c], mean_of = mean[c];
        const math_t shift = (FROM_X && has_shift) ? (math_t)bias[c] : math_t(0);
        const Pack<V> d = packs<V>(dy)[i], y = relu_packs ? relu_packs[i] : d, in = packs<V>(x)[i];
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            const math_t g = masked_gradient<math_t, FROM_X>(d.e[u], y.e[u], relu_packs != nullptr, in.e[u], mean_of,
                                                             scale, shift, has_shift);
            p.e[u] = element_of(dx_value(g, mean_dy, scale, (math_t)element_value(in.e[u]), mean_of, slope));
        }
        out[i] = p;
    }
}

// ----------------------------------------------------------------------------------------------
// Channels-last: x, y, dy, dx as (M, C) rows, M = N·H·W, the channels contiguous
// ----------------------------------------------------------------------------------------------
// A channels-last (N, C, H, W) tensor's buffer is (N, H, W, C): row m holds one pixel's C channels. The planes
// above do not exist there, so these kernels walk rows. A pack of V holds V consecutive channels of one row
// (batchnorm.py launches V > 1 where C is a multiple of V and the arrays are aligned), so each thread reads
// whole packs and keeps V channels' sums; the threads of a block split into `block_packs` columns of packs (the
// row's packs, or fewer: the launch's block_packs, at most 32) by rows_per_pass = blockDim.x / block_packs rows,
// so a warp reads contiguous runs of rows. Fewer columns make more channel blocks of fewer channels, whose last
// block merges its splits with more threads a channel (batchnorm.py's _rows_packing picks the columns, _rows_split
// the splits: one wave of blocks at most).
// Grid (channel blocks, splits): block (b, k) owns packs [b·block_packs, ...) and the
// rows [k·per, min((k + 1)·per, M)). Its threads merge into the block's per-channel results in a fixed order
// (thread row 0, 1, ... of each column, through shared memory), the block publishes them, and the last block of
// its channel block finishes those channels: every thread takes splits g, g + groups, ... of one channel (groups
// = blockDim.x / channels of the block), then one thread per channel merges the groups, again in a fixed order.
// The same bits on every run, as above. A channel block's last block merges up to a hundred splits a thread
// (many splits: a channel block covers every channel of a small C, and the grid must still fill the GPU), so it
// loads MERGE_BATCH splits' results before merging any (in flight together; then merged one by one in the same
// order, the same bits): one wait for L2 a batch rather than one a split.
#define LAST_THREADS 256  // blockDim.x of the channels-last reductions (batchnorm.py launches _cuda.THREADS)
#define MERGE_BATCH 8

struct RowsOfBlock {
    int block_packs, rows_per_pass, pack, row, channels, first_channel;
    bool active;
    __device__ RowsOfBlock(const int packs_per_row, const int most_packs, const int V) {
        block_packs = min(packs_per_row, most_packs);
        rows_per_pass = blockDim.x / block_packs;
        const int t = threadIdx.x, column = t % block_packs;
        pack = blockIdx.x * block_packs + column;
        row = t / block_packs;
        active = row < rows_per_pass && pack < packs_per_row;
        first_channel = blockIdx.x * block_packs * V;
        channels = min(block_packs, packs_per_row - blockIdx.x * block_packs) * V;
    }
};

// A channels-last thread's own sums over the rows it visits (its Welford states, its backward sums), before they
// merge into the block's double results: double for float and double inputs, float in the half build. A thread
// keeps V channels' sums (3V values, 24 for 16-byte packs of half words) and, at two blocks an SM, every register
// of theirs less is bytes in flight more; a thread visits tens of rows, whose float sums of 8- or 11-bit values
// err by about that many float roundings, far below what the half results hold.
#ifdef HALF
typedef float row_sum_t;
#else
typedef acc_t row_sum_t;
#endif

// One thread's Welford states of V channels: the count is the same for all of them (every row has each channel).
template <int V, typename T = acc_t>
struct ChannelStates {
    T n, mean[V], m2[V];
};

template <int V, typename T, typename U>
__device__ __forceinline__ void merge_states(ChannelStates<V, T>& a, const U nb, const U* meanb, const U* m2b) {
    if (nb == 0) return;
    const T total = a.n + (T)nb, fb = (T)nb / total, weight = a.n * fb;
#pragma unroll
    for (int u = 0; u < V; ++u) {
        const T delta = (T)meanb[u] - a.mean[u];
        a.mean[u] += delta * fb;
        a.m2[u] += (T)m2b[u] + delta * delta * weight;
    }
    a.n = total;
}

// Grid (channel blocks, splits), LAST_THREADS threads; partial (3, splits, C) as in statistics; counters: one
// per channel block. The finish is statistics' (mean_out, invstd_out, coef, the running statistics, the batch
// count), channel by channel.
#define STATISTICS_LAST_PARAMETERS                                                                                  \
    const elem_t* __restrict__ x, acc_t* __restrict__ partial, unsigned int* __restrict__ counters, const int M,   \
    const int C, const int per, const scalar_t* __restrict__ weight, scalar_t* __restrict__ running_mean,         \
    scalar_t* __restrict__ running_var, scalar_t* __restrict__ mean_out, scalar_t* __restrict__ invstd_out,       \
    acc_t* __restrict__ coef, const double eps_arg, const double momentum_arg, long long* __restrict__ batches_tracked, \
    const int block_packs
#define STATISTICS_LAST_ARGUMENTS                                                                                 \
    x, partial, counters, M, C, per, weight, running_mean, running_var, mean_out, invstd_out, coef, eps_arg, \
    momentum_arg, batches_tracked, block_packs
template <int V>
__device__ void statistics_last(STATISTICS_LAST_PARAMETERS) {
    __shared__ acc_t shared_n[LAST_THREADS], shared_mean[LAST_THREADS * V], shared_m2[LAST_THREADS * V];
    const int packs_per_row = C / V, k = blockIdx.y, splits = gridDim.y, t = threadIdx.x;
    const RowsOfBlock rows(packs_per_row, block_packs, V);
    const int begin = k * per, end = min(begin + per, M), pass = rows.rows_per_pass;
    ChannelStates<V, row_sum_t> state = {};
    if (rows.active) {
        const Pack<V>* __restrict__ xp = packs<V>(x) + rows.pack;
        int m = begin + rows.row;
        for (; m + 3 * pass < end; m += 4 * pass) {
            // Four rows per step (four loads in flight): each channel's four values, their exact two-pass
            // statistics in chunk_t, one merge for all V channels (one division).
            Pack<V> p[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) p[q] = xp[(long long)(m + q * pass) * packs_per_row];
            chunk_t chunk_mean[V], chunk_m2[V];
#pragma unroll
            for (int u = 0; u < V; ++u) {
                const chunk_t a = element_value(p[0].e[u]), b = element_value(p[1].e[u]);
                const chunk_t c = element_value(p[2].e[u]), d = element_value(p[3].e[u]);
                const chunk_t mu = ((a + b) + (c + d)) * (chunk_t)0.25;  // a power of two: exact scaling
                chunk_mean[u] = mu;
                chunk_m2[u] = ((a - mu) * (a - mu) + (b - mu) * (b - mu)) + ((c - mu) * (c - mu) + (d - mu) * (d - mu));
            }
            merge_states<V>(state, (chunk_t)4, chunk_mean, chunk_m2);
        }
        for (; m < end; m += pass) {
            const Pack<V> p = xp[(long long)m * packs_per_row];
            chunk_t value[V], zero[V];
#pragma unroll
            for (int u = 0; u < V; ++u) value[u] = element_value(p.e[u]), zero[u] = 0;
            merge_states<V>(state, (chunk_t)1, value, zero);
        }
    }
    // The block's result per channel: thread row 0, 1, ... of each column, in order.
    shared_n[t] = state.n;
#pragma unroll
    for (int u = 0; u < V; ++u) shared_mean[t * V + u] = state.mean[u], shared_m2[t * V + u] = state.m2[u];
    __syncthreads();
    if (t < rows.channels) {
        const int column = t / V, u = t % V;
        ChannelStates<1> block = {};
        for (int r = 0; r < pass; ++r) {
            const int from = r * rows.block_packs + column;
            merge_states<1, acc_t, acc_t>(block, shared_n[from], &shared_mean[from * V + u], &shared_m2[from * V + u]);
        }
        const int c = rows.first_channel + t;
        partial[k * C + c] = block.n;
        partial[(splits + k) * C + c] = block.mean[0];
        partial[(2 * splits + k) * C + c] = block.m2[0];
    }
    if (!last_block_of_channel(counters + blockIdx.x, splits)) return;

    // The channel block's last block: splits g, g + groups, ... per thread, then the groups in order.
    const int groups = blockDim.x / rows.channels, group = t / rows.channels, j = t % rows.channels;
    const int c = rows.first_channel + j;
    ChannelStates<1> merged = {};
    if (group < groups) {
        for (int first = group; first < splits; first += MERGE_BATCH * groups) {
            acc_t nb[MERGE_BATCH], meanb[MERGE_BATCH], m2b[MERGE_BATCH];
#pragma unroll
            for (int b = 0; b < MERGE_BATCH; ++b) {
                const int split = first + b * groups;
                const bool inside = split < splits;  // a count of 0 merges nothing
                nb[b] = inside ? __ldcg(partial + split * C + c) : 0;
                meanb[b] = inside ? __ldcg(partial + (splits + split) * C + c) : 0;
                m2b[b] = inside ? __ldcg(partial + (2 * splits + split) * C + c) : 0;
            }
#pragma unroll
            for (int b = 0; b < MERGE_BATCH; ++b) merge_states<1, acc_t, acc_t>(merged, nb[b], &meanb[b], &m2b[b]);
        }
    }
    __syncthreads();  // the block's own shared results are read: the arrays are free
    shared_n[t] = merged.n, shared_mean[t] = merged.mean[0], shared_m2[t] = merged.m2[0];
    __syncthreads();
    if (t >= rows.channels) return;
    ChannelStates<1> total = {};
    for (int g = 0; g < groups; ++g) {
        const int from = g * rows.channels + t;
        merge_states<1, acc_t, acc_t>(total, shared_n[from], &shared_mean[from], &shared_m2[from]);
    }
    finish_statistics(c, C, total.n, total.mean[0], total.m2[0], eps_arg, momentum_arg, weight, running_mean,
                      running_var, mean_out, invstd_out, coef, batches_tracked);
}

// Grid (channel blocks, splits), LAST_THREADS threads: backward_reduce's sums (Σg, Σg·(x − center)) and
// finish, channel by channel; the DX build (inference: dx not null) writes dx = g·weight·invstd in the same pass,
// a build of its own so that training's reduction keeps no per-channel scale in registers.
#define BACKWARD_REDUCE_LAST_PARAMETERS                                                                          \
    const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const elem_t* __restrict__ relu_output,         \
    const scalar_t* __restrict__ bias, const scalar_t* __restrict__ center, acc_t* __restrict__ partial,         \
    unsigned int* __restrict__ counters,                                                                         \
    elem_t* __restrict__ dx, const scalar_t* __restrict__ invstd, const scalar_t* __restrict__ running_var,      \
    const scalar_t* __restrict__ weight, const double eps_arg, scalar_t* __restrict__ dweight,                   \
    scalar_t* __restrict__ dbias, acc_t* __restrict__ coef, const int M, const int C, const int per,            \
    const int block_packs
#define BACKWARD_REDUCE_LAST_ARGUMENTS                                                                       \
    dy, x, relu_output, bias, center, partial, counters, dx, invstd, running_var, weight, eps_arg, dweight, dbias, \
    coef, M, C, per, block_packs
template <int V, bool DX, bool FROM_X>
__device__ void backward_reduce_last(BACKWARD_REDUCE_LAST_PARAMETERS) {
    __shared__ acc_t shared_a[LAST_THREADS * V], shared_b[LAST_THREADS * V];
    const int packs_per_row = C / V, k = blockIdx.y, splits = gridDim.y, t = threadIdx.x;
    const RowsOfBlock rows(packs_per_row, block_packs, V);
    const int begin = k * per, end = min(begin + per, M), pass = rows.rows_per_pass;
    const acc_t eps = eps_arg;
    row_sum_t sum_dy[V] = {}, sum_dy_xc[V] = {};
    if (rows.active) {
        const int c0 = rows.pack * V;
        chunk_t mu[V];
        acc_t scale[DX ? V : 1];
        // The fused ReLU's mask from x (training only: never the DX build): the saved mean (mu: chunk_t is math_t),
        // invstd·weight and the bias of each of the thread's channels.
        const bool has_shift = bias != nullptr;
        math_t relu_scale[FROM_X ? V : 1], relu_shift[FROM_X ? V : 1];
#pragma unroll
        for (int u = 0; u < V; ++u) {
            mu[u] = (chunk_t)center[c0 + u];
            if (FROM_X) {
                relu_scale[FROM_X ? u : 0] = (math_t)saved_scale(invstd[c0 + u], weight, c0 + u);
                relu_shift[FROM_X ? u : 0] = has_shift ? (math_t)bias[c0 + u] : math_t(0);
            }
            if (DX) {
                scale[u] = inference_invstd(running_var[c0 + u], eps);
                if (weight) scale[u] *= (acc_t)weight[c0 + u];
            }
        }
        const Pack<V>* __restrict__ dyp = packs<V>(dy) + rows.pack;
        const Pack<V>* __restrict__ xp = packs<V>(x) + rows.pack;
        const Pack<V>* __restrict__ yp = (!FROM_X && relu_output) ? packs<V>(relu_output) + rows.pack : nullptr;
        Pack<V>* __restrict__ dxp = DX ? packs<V>(dx) + rows.pack : nullptr;
        // ROWS rows per step, every load first: four for narrow packs; two for 16-byte packs of half words,
        // whose twelve loads and double sums would not fit the registers of two blocks an SM.
        constexpr int ROWS = (V >= 8) ? 2 : 4;
        int m = begin + rows.row;
        for (; m + (ROWS - 1) * pass < end; m += ROWS * pass) {
            Pack<V> d[ROWS], y[ROWS], p[ROWS];
#pragma unroll
            for (int q = 0; q < ROWS; ++q) {
                const long long o = (long long)(m + q * pass) * packs_per_row;
                d[q] = dyp[o];
                y[q] = yp ? yp[o] : d[q];
                p[q] = xp[o];
            }
            // Each channel's rows sum in chunk_t (a pair, or a pair of pairs), then into the double sums.
#pragma unroll
            for (int u = 0; u < V; ++u) {
                chunk_t g[ROWS], gx[ROWS];
#pragma unroll
                for (int q = 0; q < ROWS; ++q) {
                    g[q] = masked_gradient<chunk_t, FROM_X>(d[q].e[u], y[q].e[u], yp != nullptr, p[q].e[u], mu[u],
                                                            relu_scale[FROM_X ? u : 0], relu_shift[FROM_X ? u : 0],
                                                            has_shift);
                    gx[q] = rounded_product(g[q], rounded_difference((chunk_t)element_value(p[q].e[u]), mu[u]));
                }
                if (ROWS == 4) {
                    sum_dy[u] += (g[0] + g[1]) + (g[ROWS - 2] + g[ROWS - 1]);
                    sum_dy_xc[u] += (gx[0] + gx[1]) + (gx[ROWS - 2] + gx[ROWS - 1]);
                } else {
                    sum_dy[u] += g[0] + g[1];
                    sum_dy_xc[u] += gx[0] + gx[1];
                }
            }
            if (DX) {
#pragma unroll
                for (int q = 0; q < ROWS; ++q) {
                    Pack<V> out;
#pragma unroll
                    for (int u = 0; u < V; ++u) {
                        out.e[u] = element_of(gradient(d[q].e[u], y[q].e[u], yp != nullptr) * scale[DX ? u : 0]);
                    }
                    dxp[(long long)(m + q * pass) * packs_per_row] = out;
                }
            }
        }
        for (; m < end; m += pass) {
            const long long o = (long long)m * packs_per_row;
            const Pack<V> d = dyp[o], y = yp ? yp[o] : d, p = xp[o];
            Pack<V> out;
#pragma unroll
            for (int u = 0; u < V; ++u) {
                const chunk_t g = masked_gradient<chunk_t, FROM_X>(d.e[u], y.e[u], yp != nullptr, p.e[u], mu[u],
                                                                   relu_scale[FROM_X ? u : 0],
                                                                   relu_shift[FROM_X ? u : 0], has_shift);
                sum_dy[u] += g;
                sum_dy_xc[u] += rounded_product(g, rounded_difference((chunk_t)element_value(p.e[u]), mu[u]));
                if (DX) out.e[u] = element_of(g * scale[DX ? u : 0]);
            }
            if (DX) dxp[o] = out;
        }
    }
#pragma unroll
    for (int u = 0; u < V; ++u) shared_a[t * V + u] = sum_dy[u], shared_b[t * V + u] = sum_dy_xc[u];
    __syncthreads();
    if (t < rows.channels) {
        const int column = t / V, u = t % V;
        acc_t a = 0, b = 0;
        for (int r = 0; r < pass; ++r) {
            const int from = (r * rows.block_packs + column) * V + u;
            a += shared_a[from];
            b += shared_b[from];
        }
        const int c = rows.first_channel + t;
        partial[k * C + c] = a;
        partial[(splits + k) * C + c] = b;
    }
    if (!last_block_of_channel(counters + blockIdx.x, splits)) return;

    const int groups = blockDim.x / rows.channels, group = t / rows.channels, j = t % rows.channels;
    const int c = rows.first_channel + j;
    acc_t a = 0, b = 0;
    if (group < groups) {
        for (int first = group; first < splits; first += MERGE_BATCH * groups) {
            acc_t batch_a[MERGE_BATCH], batch_b[MERGE_BATCH];
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                const int split = first + u * groups;
                batch_a[u] = split < splits ? __ldcg(partial + split * C + c) : 0;
                batch_b[u] = split < splits ? __ldcg(partial + (splits + split) * C + c) : 0;
            }
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                if (first + u * groups < splits) a += batch_a[u], b += batch_b[u];  // no + 0: it would turn −0 to +0
            }
        }
    }
    __syncthreads();
    shared_a[t] = a, shared_b[t] = b;
    __syncthreads();
    if (t >= rows.channels) return;
    a = b = 0;
    for (int g = 0; g < groups; ++g) a += shared_a[g * rows.channels + t], b += shared_b[g * rows.channels + t];
    finish_sums(c, C, M, a, b, invstd, running_var, eps, weight, dweight, dbias, coef);
}

// The element-wise kernels on (M, C) rows: pack i holds channels (i·V) mod C, ..., + V − 1 (C a multiple of V).
// The channel of the thread's first pack is one division; each grid step adds (G·V) mod C.
struct RowChannel {
    int c, C, step;
    __device__ RowChannel(const int i, const int G, const int V, const int C_) : C(C_) {
        c = (int)(((long long)i * V) % C);
        step = (int)(((long long)G * V) % C);
    }
    __device__ __forceinline__ void advance() {
        c += step;
        if (c >= C) c -= C;
    }
};

// The element-wise row kernels' grid-stride walk over the packs [0, count): `load(c)` fetches the thread's
// channels' coefficients (c, ..., c + V − 1) whenever its channel moves, `one(i)` does pack i, and `two(i, j)` packs
// i and j of the same channels, loading both before working on either.
// Each thread loads its channels' coefficients when its channel moves: once, where the grid's stride is a whole
// number of rows (G·V a multiple of C: every C dividing 256·V, i.e. powers of two up to 2048 half channels),
// so a pack costs its loads and stores, not 2V coefficient loads more. Those V channels' coefficients are doubles
// held in registers (up to 4V of them), which leaves room for few threads an SM: where the channels stay, a thread
// loads its next two packs before it works on either, so that twice the bytes are in flight (the same arithmetic
// on each pack: the same bits).
template <int V, typename Load, typename One, typename Two>
__device__ __forceinline__ void walk_row_packs(const int C, const int count, const Load& load, const One& one,
                                               const Two& two) {
    const int G = blockDim.x * gridDim.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    RowChannel channel(i, G, V, C);
    int loaded = channel.c;
    load(loaded);
    if (channel.step == 0) {  // every pack of this thread holds the same channels: two in flight at a time
        for (; i + G < count; i += 2 * G) two(i, i + G);
        if (i < count) one(i);
        return;
    }
    for (; i < count; i += G, channel.advance()) {
        if (channel.c != loaded) {
            loaded = channel.c;
            load(loaded);
        }
        one(i);
    }
}

// y = (x − mean)·scale + shift, then max(·, 0) when relu != 0, over (M, C) rows, with each pack's coefficients from
// `load(c, mean, scale, shift)` for its channels c, ..., c + V − 1 (shift added only when has_shift): the training
// and the inference forward differ only in where the coefficients come from.
template <int V, typename Load>
__device__ __forceinline__ void normalise_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                               const bool has_shift, const int relu, const int C, const int total,
                                               const Load& load) {
    const Pack<V>* __restrict__ in = packs<V>(x);
    Pack<V>* __restrict__ out = packs<V>(y);
    math_t mean_of[V], scale_of[V], shift_of[V];
    const auto normalise_pack = [&](const Pack<V> a) {
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            const math_t w = normalised((math_t)element_value(a.e[u]), mean_of[u], scale_of[u], shift_of[u], has_shift);
            p.e[u] = element_of(apply_relu(w, relu));
        }
        return p;
    };
    walk_row_packs<V>(
        C, total / V, [&](const int c) { load(c, mean_of, scale_of, shift_of); },
        [&](const int i) { out[i] = normalise_pack(in[i]); },
        [&](const int i, const int j) {
            const Pack<V> a = in[i], b = in[j];
            out[i] = normalise_pack(a);
            out[j] = normalise_pack(b);
        });
}

template <int V>
__device__ void apply_last(APPLY_PARAMETERS) {  // S is unused (1)
    normalise_rows<V>(x, y, bias != nullptr, relu, C, total, [&](const int c, math_t* mean, math_t* scale, math_t* shift) {
#pragma unroll
        for (int u = 0; u < V; ++u) {
            mean[u] = coef[c + u];
            scale[u] = coef[C + c + u];
            shift[u] = bias ? (math_t)bias[c + u] : math_t(0);
        }
    });
}

template <int V>
__device__ void inference_last(INFERENCE_PARAMETERS) {  // S is unused (1)
    const acc_t eps = eps_arg;
    normalise_rows<V>(x, y, bias != nullptr, relu, C, total, [&](const int c0, math_t* mean, math_t* scale, math_t* shift) {
#pragma unroll
        for (int u = 0; u < V; ++u) {
            const int c = c0 + u;
            acc_t invstd_weight = inference_invstd(running_var[c], eps);
            if (weight) invstd_weight *= (acc_t)weight[c];
            scale[u] = invstd_weight;
            mean[u] = running_mean[c];
            shift[u] = bias ? (math_t)bias[c] : math_t(0);
        }
    });
}

template <int V, bool FROM_X>
__device__ void backward_dx_last(BACKWARD_DX_PARAMETERS) {
    const Pack<V>* __restrict__ relu_packs = (!FROM_X && relu_output) ? packs<V>(relu_output) : nullptr;
    const Pack<V>* __restrict__ dy_packs = packs<V>(dy);
    const Pack<V>* __restrict__ x_packs = packs<V>(x);
    Pack<V>* __restrict__ out = packs<V>(dx);
    const bool has_shift = bias != nullptr;
    math_t mean_dy[V], scale[V], mean_of[V], slope[V], shift[FROM_X ? V : 1];
    const auto gradient_of = [&](const Pack<V> d, const Pack<V> y, const Pack<V> in) {
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            // scale is finish_sums's invstd·weight, the forward's own (the ReLU mask from x needs it too).
            const math_t g = masked_gradient<math_t, FROM_X>(d.e[u], y.e[u], relu_packs != nullptr, in.e[u],
                                                             mean_of[u], scale[u], shift[FROM_X ? u : 0], has_shift);
            p.e[u] = element_of(dx_value(g, mean_dy[u], scale[u], (math_t)element_value(in.e[u]), mean_of[u],
                                         slope[u]));
        }
        return p;
    };
    walk_row_packs<V>(
        C, total / V,
        [&](const int c0) {
#pragma unroll
            for (int u = 0; u < V; ++u) {
                const int c = c0 + u;
                mean_dy[u] = coef[c], scale[u] = coef[C + c], slope[u] = coef[2 * C + c], mean_of[u] = mean[c];
                if (FROM_X) shift[FROM_X ? u : 0] = has_shift ? (math_t)bias[c] : math_t(0);
            }
        },
        [&](const int i) {
            const Pack<V> d = dy_packs[i], y = relu_packs ? relu_packs[i] : d, a = x_packs[i];
            out[i] = gradient_of(d, y, a);
        },
        [&](const int i, const int j) {
            const Pack<V> d = dy_packs[i], e = dy_packs[j];
            const Pack<V> y = relu_packs ? relu_packs[i] : d, z = relu_packs ? relu_packs[j] : e;
            const Pack<V> a = x_packs[i], b = x_packs[j];
            out[i] = gradient_of(d, y, a);
            out[j] = gradient_of(e, z, b);
        });
}

// ----------------------------------------------------------------------------------------------
// The kernels: each body above for single elements and for packs of VECTOR and VECTOR8 (batchnorm.py picks)
// ----------------------------------------------------------------------------------------------

#define VECTOR8 (8 / (int)sizeof(elem_t))

extern "C" __global__ void bn_statistics(STATISTICS_PARAMETERS) { statistics<1>(STATISTICS_ARGUMENTS); }
extern "C" __global__ void bn_statistics_vector(STATISTICS_PARAMETERS) { statistics<VECTOR>(STATISTICS_ARGUMENTS); }
extern "C" __global__ void bn_statistics_vector8(STATISTICS_PARAMETERS) { statistics<VECTOR8>(STATISTICS_ARGUMENTS); }

extern "C" __global__ void bn_apply(APPLY_PARAMETERS) { apply<1>(APPLY_ARGUMENTS); }
extern "C" __global__ void bn_apply_vector(APPLY_PARAMETERS) { apply<VECTOR>(APPLY_ARGUMENTS); }
extern "C" __global__ void bn_apply_vector8(APPLY_PARAMETERS) { apply<VECTOR8>(APPLY_ARGUMENTS); }

extern "C" __global__ void bn_inference(INFERENCE_PARAMETERS) { inference<1>(INFERENCE_ARGUMENTS); }
extern "C" __global__ void bn_inference_vector(INFERENCE_PARAMETERS) { inference<VECTOR>(INFERENCE_ARGUMENTS); }
extern "C" __global__ void bn_inference_vector8(INFERENCE_PARAMETERS) { inference<VECTOR8>(INFERENCE_ARGUMENTS); }

// The training backward's builds with the fused ReLU's mask recomputed from x are the _relu kernels.
#define BACKWARD_PLANE_KERNELS(SUFFIX, FROM_X)                                                      \
    extern "C" __global__ void bn_backward_reduce##SUFFIX(BACKWARD_REDUCE_PARAMETERS) {             \
        backward_reduce<1, FROM_X>(BACKWARD_REDUCE_ARGUMENTS);                                      \
    }                                                                                               \
    extern "C" __global__ void bn_backward_reduce##SUFFIX##_vector(BACKWARD_REDUCE_PARAMETERS) {    \
        backward_reduce<VECTOR, FROM_X>(BACKWARD_REDUCE_ARGUMENTS);                                 \
    }                                                                                               \
    extern "C" __global__ void bn_backward_reduce##SUFFIX##_vector8(BACKWARD_REDUCE_PARAMETERS) {   \
        backward_reduce<VECTOR8, FROM_X>(BACKWARD_REDUCE_ARGUMENTS);                                \
    }                                                                                               \
    extern "C" __global__ void bn_backward_dx##SUFFIX(BACKWARD_DX_PARAMETERS) {                     \
        backward_dx<1, FROM_X>(BACKWARD_DX_ARGUMENTS);                                              \
    }                                                                                               \
    extern "C" __global__ void bn_backward_dx##SUFFIX##_vector(BACKWARD_DX_PARAMETERS) {            \
        backward_dx<VECTOR, FROM_X>(BACKWARD_DX_ARGUMENTS);                                         \
    }                                                                                               \
    extern "C" __global__ void bn_backward_dx##SUFFIX##_vector8(BACKWARD_DX_PARAMETERS) {           \
        backward_dx<VECTOR8, FROM_X>(BACKWARD_DX_ARGUMENTS);                                        \
    }
BACKWARD_PLANE_KERNELS(, false)
BACKWARD_PLANE_KERNELS(_relu, true)

// Channels-last builds: packs of VECTOR and single elements.
// Two blocks an SM at least (the reductions keep V channels' sums per thread); the statistics' packs three, which
// their registers allow without a spill in every build (ptxas -v), so that half as many more bytes are in flight.
extern "C" __global__ void __launch_bounds__(LAST_THREADS, 2) bn_statistics_last(STATISTICS_LAST_PARAMETERS) {
    statistics_last<1>(STATISTICS_LAST_ARGUMENTS);
}
extern "C" __global__ void __launch_bounds__(LAST_THREADS, 3) bn_statistics_last_vector(STATISTICS_LAST_PARAMETERS) {
    statistics_last<VECTOR>(STATISTICS_LAST_ARGUMENTS);
}
// VECTOR_BLOCKS: the blocks an SM the vector build asks room for. The half build's mask from x keeps its packs'
// scales and shifts (2·V floats) where the y path keeps y's loads: three blocks, as the y path has, fit without a
// spill there (ptxas -v); the float build's need two.
#define BACKWARD_REDUCE_LAST_KERNELS(NAME, DX, FROM_X, VECTOR_BLOCKS)                                          \
    extern "C" __global__ void __launch_bounds__(LAST_THREADS, 2) NAME(BACKWARD_REDUCE_LAST_PARAMETERS) {      \
        backward_reduce_last<1, DX, FROM_X>(BACKWARD_REDUCE_LAST_ARGUMENTS);                                   \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(LAST_THREADS, VECTOR_BLOCKS)                                  \
        NAME##_vector(BACKWARD_REDUCE_LAST_PARAMETERS) {                                                       \
        backward_reduce_last<VECTOR, DX, FROM_X>(BACKWARD_REDUCE_LAST_ARGUMENTS);                              \
    }
#ifdef HALF
#define RELU_ROWS_BLOCKS 3
#else
#define RELU_ROWS_BLOCKS 2
#endif
BACKWARD_REDUCE_LAST_KERNELS(bn_backward_reduce_last, false, false, 2)
BACKWARD_REDUCE_LAST_KERNELS(bn_backward_reduce_relu_last, false, true, RELU_ROWS_BLOCKS)
BACKWARD_REDUCE_LAST_KERNELS(bn_backward_reduce_dx_last, true, false, 2)
extern "C" __global__ void bn_apply_last(APPLY_PARAMETERS) { apply_last<1>(APPLY_ARGUMENTS); }
extern "C" __global__ void bn_apply_last_vector(APPLY_PARAMETERS) { apply_last<VECTOR>(APPLY_ARGUMENTS); }
extern "C" __global__ void bn_inference_last(INFERENCE_PARAMETERS) { inference_last<1>(INFERENCE_ARGUMENTS); }
extern "C" __global__ void bn_inference_last_vector(INFERENCE_PARAMETERS) {
    inference_last<VECTOR>(INFERENCE_ARGUMENTS);
}
extern "C" __global__ void bn_backward_dx_last(BACKWARD_DX_PARAMETERS) {
    backward_dx_last<1, false>(BACKWARD_DX_ARGUMENTS);
}
extern "C" __global__ void bn_backward_dx_last_vector(BACKWARD_DX_PARAMETERS) {
    backward_dx_last<VECTOR, false>(BACKWARD_DX_ARGUMENTS);
}
extern "C" __global__ void bn_backward_dx_relu_last(BACKWARD_DX_PARAMETERS) {
    backward_dx_last<1, true>(BACKWARD_DX_ARGUMENTS);
}
extern "C" __global__ void bn_backward_dx_relu_last_vector(BACKWARD_DX_PARAMETERS) {
    backward_dx_last<VECTOR, true>(BACKWARD_DX_ARGUMENTS);
}
