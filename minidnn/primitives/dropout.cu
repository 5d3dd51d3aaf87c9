// Counter-based dropout (dropout.py's module docstring specifies the generator; its NumPy code is the twin).
//
// Element i (C order, 0 <= i < n) of a draw is the SplitMix64 hash
//     bits(i) = mix64(start + i·GAMMA)   with start = mix64(seed) + (offset + 1)·GAMMA   (mod 2^64)
// start is computed once per call on the host (Python ints), so a kernel needs no RNG state in
// memory: each thread hashes its own counters, the results do not depend on the launch shape, and
// the same (seed, offset) gives the same bits on the CPU and the GPU. unsigned long long arithmetic
// wraps modulo 2^64, exactly as the docstring's formula. Since nothing is read from or written to a
// generator state, these kernels can be captured in a CUDA graph (cuRAND-based dropout cannot, through
// CuPy): a graph replays them with a new (seed, offset) when start is passed through device memory
// (dropout_forward_from_device). One thread per element, grid-stride loops; the mask is bool (one byte), so a warp
// writes 32 consecutive bytes.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;
typedef unsigned long long u64;

// x, y, dy and dx: scalar_t, or in the half build (HALF = 1 for float16, 2 for bfloat16, with SCALAR float)
// 16-bit words, read as their exact float values and written rounded once from the float product
// (elements.cuh): the float kernels' results on the widened arrays, bit for bit.
#include "elements.cuh"

#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull
#define MIX_MULTIPLIER_1 0xBF58476D1CE4E5B9ull
#define MIX_MULTIPLIER_2 0x94D049BB133111EBull
#define UNIFORM_SHIFT 40  // keep the top 24 bits: exact in float32

// SplitMix64's finaliser (a bijection of 64-bit words).
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * MIX_MULTIPLIER_1;
    z = (z ^ (z >> 27)) * MIX_MULTIPLIER_2;
    return z ^ (z >> 31);
}

// The top 24 bits of bits(i), the integer k of uniform(i) = k·2^-24.
__device__ __forceinline__ unsigned top_bits(const u64 start, const int i) {
    return (unsigned)(mix64(start + (u64)i * GOLDEN_GAMMA) >> UNIFORM_SHIFT);
}

// The raw 64-bit hashes (dropout._random_bits).
extern "C" __global__ void dropout_bits(u64* __restrict__ out, const u64 start, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out[i] = mix64(start + (u64)i * GOLDEN_GAMMA);
    }
}

// uniform(i) = k·2^-24 in float32, whatever SCALAR is (dropout.uniform returns float32).
extern "C" __global__ void dropout_uniform(float* __restrict__ out, const u64 start, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out[i] = (float)top_bits(start, i) * (1.0f / 16777216.0f);  // k < 2^24: both steps exact
    }
}

// keep(i) = k >= threshold with threshold = ceil(p·2^24) (the same as uniform(i) >= p, in integers).
extern "C" __global__ void dropout_mask(bool* __restrict__ mask, const u64 start, const unsigned threshold,
                                        const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        mask[i] = top_bits(start, i) >= threshold;
    }
}

// mask and y = x·(mask·scale) in one pass; scale = 1/(1 − p) (0 for p = 1), rounded once to the
// array's dtype as the NumPy twin does. A multiply, not a select, so that x·0 keeps NaN and turns
// inf into NaN, as in PyTorch. p = 0 (threshold 0) keeps everything, p = 1 (threshold 2^24) nothing.
__device__ __forceinline__ void dropout_body(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                             bool* __restrict__ mask, const u64 start, const unsigned threshold,
                                             const double scale_arg, const int n) {
    const scalar_t scale = (scalar_t)scale_arg;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const bool keep = top_bits(start, i) >= threshold;
        mask[i] = keep;
        y[i] = element_of(element_value(x[i]) * (keep ? scale : scalar_t(0)));
    }
}

extern "C" __global__ void dropout_forward(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                           bool* __restrict__ mask, const u64 start, const unsigned threshold,
                                           const double scale_arg, const int n) {
    dropout_body(x, y, mask, start, threshold, scale_arg, n);
}

// The same, with the start read from device memory plus delta·GAMMA (mod 2^64): a CUDA graph records
// kernel arguments by value, so this is how a replay draws a new mask (dropout.DeviceOffset).
extern "C" __global__ void dropout_forward_from_device(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                                       bool* __restrict__ mask, const u64* __restrict__ start_base,
                                                       const u64 delta_gamma, const unsigned threshold,
                                                       const double scale_arg, const int n) {
    dropout_body(x, y, mask, start_base[0] + delta_gamma, threshold, scale_arg, n);
}

// dx = dy·(mask·scale).
extern "C" __global__ void dropout_backward(const elem_t* __restrict__ dy, const bool* __restrict__ mask,
                                            elem_t* __restrict__ dx, const double scale_arg, const int n) {
    const scalar_t scale = (scalar_t)scale_arg;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        dx[i] = element_of(element_value(dy[i]) * (mask[i] ? scale : scalar_t(0)));
    }
}
