// Cross-channel local response normalisation, forward and backward (lrn.py states the maths; its
// NumPy code is the reference twin of both kernels; Caffe's lrn_layer.cu design).
//
// Layout: x, y, scale, dy and dx are contiguous (N, C, S) arrays, S = the product of the spatial
// sizes: channel c of pixel (n, s) is at (n·C + c)·S + s; or, for the _last kernels at the end,
// all channels-last, (N, S, C) buffers, channel c of pixel (n, s) at (n·S + s)·C + c.
//
// Thread mapping: one thread per pixel (n, s), grid-stride, walking the channels c = 0 … C − 1 at
// stride S; consecutive threads take consecutive s, so each step of a warp reads and writes
// consecutive addresses. Each thread slides a window over the channels, keeping its running sum:
// the value of the channel entering on the right is added, the one leaving on the left subtracted,
// so a pixel costs O(C) whatever the window size. The running sum is a double for float inputs
// too (the twin's prefix sums are float64: a float32 running sum would lose the digits the test
// tolerances count on); the terms themselves are rounded to scalar_t first, as the twin computes
// them in its dtype.
//
// Windows: channel c sums the channels c − before … c + after clipped to [0, C) (beyond the edges
// count as zeros). lrn.py passes before and after already clipped to C, so no index below can
// overflow whatever the window size: the forward window is (size/2, (size−1)/2), the backward
// window the mirror image ((size−1)/2, size/2).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;
typedef double acc_t;

// scale = k + (α/size)·Σ_window x², y = x·scale^−β. The window sum is clamped at 0 (a sum of
// squares is never negative; the running subtraction can round below it, as the twin's prefix
// differences can) without dropping a NaN, as the twin's maximum(·, 0). Either output may be a null
// pointer: the forward pass of a layer writes y only (the backward recomputes scale, rather than
// keep an array of x's size alive between the passes), the backward pass scale only.
extern "C" __global__ void lrn_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                       scalar_t* __restrict__ scale, const int N, const int C, const int S,
                                       const int before, const int after, const double alpha_over_size,
                                       const double beta, const double k) {
    // Rounded once to scalar_t, as NumPy does with a Python float times a float32 array.
    const scalar_t coefficient = scalar_t(alpha_over_size);
    const scalar_t minus_beta = scalar_t(-beta);
    const scalar_t offset = scalar_t(k);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < N * S; t += blockDim.x * gridDim.x) {
        const int n = t / S;
        const int base = n * C * S + (t - n * S);  // (n·C + 0)·S + s
        const scalar_t* __restrict__ xs = x + base;
        scalar_t* __restrict__ ys = y ? y + base : nullptr;
        scalar_t* __restrict__ scales = scale ? scale + base : nullptr;
        // The window of channel 0: channels 0 … after.
        acc_t window = 0;
        for (int j = 0; j <= after && j < C; ++j) {
            const scalar_t v = xs[j * S];
            window += acc_t(v * v);
        }
        for (int c = 0; c < C; ++c) {
            const scalar_t squares = scalar_t(window < 0 ? acc_t(0) : window);
            const scalar_t s = offset + coefficient * squares;
            if (scales) scales[c * S] = s;
            if (ys) ys[c * S] = xs[c * S] * pow(s, minus_beta);
            // Slide to channel c + 1: channel c + 1 + after enters, channel c − before leaves.
            const int enter = c + 1 + after, leave = c - before;
            if (enter < C) {
                const scalar_t v = xs[enter * S];
                window += acc_t(v * v);
            }
            if (leave >= 0) {
                const scalar_t v = xs[leave * S];
                window -= acc_t(v * v);
            }
        }
    }
}

// The backward window's term dy·y / scale at index i, in scalar_t as the twin's dy * y / scale.
__device__ __forceinline__ scalar_t ratio(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                          const scalar_t* __restrict__ scale, int i) {
    return (dy[i] * y[i]) / scale[i];
}

// dx = dy·scale^−β − (2αβ/size)·x·Σ_window dy·y/scale over the mirrored window (lrn.py). The ratio
// of a leaving channel is recomputed from the same loads (same bits as when it entered), so the
// running sum adds and subtracts exactly the same values; those loads hit the caches.
extern "C" __global__ void lrn_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                        const scalar_t* __restrict__ y, const scalar_t* __restrict__ scale,
                                        scalar_t* __restrict__ dx, const int N, const int C, const int S,
                                        const int before, const int after, const double beta,
                                        const double two_alpha_beta_over_size) {
    const scalar_t minus_beta = scalar_t(-beta);
    const scalar_t coefficient = scalar_t(two_alpha_beta_over_size);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < N * S; t += blockDim.x * gridDim.x) {
        const int n = t / S;
        const int base = n * C * S + (t - n * S);
        acc_t window = 0;
        for (int j = 0; j <= after && j < C; ++j) window += acc_t(ratio(dy, y, scale, base + j * S));
        for (int c = 0; c < C; ++c) {
            const int i = base + c * S;
            const scalar_t reached = scalar_t(window);
            dx[i] = dy[i] * pow(scale[i], minus_beta) - coefficient * x[i] * reached;
            const int enter = c + 1 + after, leave = c - before;
            if (enter < C) window += acc_t(ratio(dy, y, scale, base + enter * S));
            if (leave >= 0) window -= acc_t(ratio(dy, y, scale, base + leave * S));
        }
    }
}

// Channels-last: one thread per element, grid-stride over the (N, S, C) buffer, so a warp's loads and
// stores are consecutive addresses. A pixel's channels are consecutive here, and the walk above would
// give each thread its own pixel: a warp's loads would spread over 32 pixels' cache lines, and one
// thread would serialise the C channels. So each thread adds its own window's terms directly (size
// loads of its pixel's neighbouring channels, through L1): a double sum of the same scalar_t terms
// as the running sum's, never below 0, so no clamp.
extern "C" __global__ void lrn_forward_last(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                            scalar_t* __restrict__ scale, const int count, const int C,
                                            const int before, const int after, const double alpha_over_size,
                                            const double beta, const double k) {
    const scalar_t coefficient = scalar_t(alpha_over_size);
    const scalar_t minus_beta = scalar_t(-beta);
    const scalar_t offset = scalar_t(k);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x) {
        const int c = i % C;
        const scalar_t* __restrict__ pixel = x + (i - c);
        const int last = min(c + after, C - 1);
        acc_t window = 0;
        for (int j = max(c - before, 0); j <= last; ++j) {
            const scalar_t v = pixel[j];
            window += acc_t(v * v);
        }
        const scalar_t s = offset + coefficient * scalar_t(window);
        if (scale) scale[i] = s;
        if (y) y[i] = x[i] * pow(s, minus_beta);
    }
}

// The backward of the channels-last layout: each thread sums its mirrored window's ratios directly.
extern "C" __global__ void lrn_backward_last(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                             const scalar_t* __restrict__ y, const scalar_t* __restrict__ scale,
                                             scalar_t* __restrict__ dx, const int count, const int C,
                                             const int before, const int after, const double beta,
                                             const double two_alpha_beta_over_size) {
    const scalar_t minus_beta = scalar_t(-beta);
    const scalar_t coefficient = scalar_t(two_alpha_beta_over_size);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x) {
        const int c = i % C;
        const int pixel = i - c, last = min(c + after, C - 1);
        acc_t window = 0;
        for (int j = max(c - before, 0); j <= last; ++j) window += acc_t(ratio(dy, y, scale, pixel + j));
        dx[i] = dy[i] * pow(scale[i], minus_beta) - coefficient * x[i] * scalar_t(window);
    }
}
