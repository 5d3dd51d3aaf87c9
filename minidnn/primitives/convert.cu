// float32 <-> bfloat16 and float16, as 16-bit words (convert.py's module docstring gives the rules; its NumPy
// functions are the twins). Rounding to nearest, ties to even, with the bits ml_dtypes (bfloat16) and NumPy
// (float16) give for every input, NaNs included. One thread per element, grid-stride loops.
//
// The wide side is always float32, whatever SCALAR this file is compiled with: the half types are storage for
// float32 arithmetic (mixed precision), and a float64 value would round twice on its way through float32.

#ifndef SCALAR
#define SCALAR float
#endif
#include "half.cuh"

extern "C" __global__ void float_to_bfloat16(const float* __restrict__ x, u16* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = bfloat16_word(__float_as_uint(x[i]));
    }
}

extern "C" __global__ void bfloat16_to_float(const u16* __restrict__ x, float* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = bfloat16_value(x[i]);
    }
}

extern "C" __global__ void float_to_float16(const float* __restrict__ x, u16* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const float value = x[i];
        y[i] = float16_word(__float_as_uint(value), value);
    }
}

extern "C" __global__ void float16_to_float(const u16* __restrict__ x, float* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = float16_value(x[i]);
    }
}

// float32 addition as IEEE 754 defines it, subnormals kept: CuPy compiles every kernel with -ftz=true, under
// which a + b flushes subnormal operands and sums to zero; the PTX instruction without .ftz keeps them.
// bfloat16 has float32's exponent range, so its subnormals are float32's, and ml_dtypes keeps them.
__device__ __forceinline__ float add_keeping_subnormals(const float a, const float b) {
    float sum;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
}

// y = a + b for two arrays of bfloat16 words: each word widened exactly, the pair added in float32 and rounded
// once (ml_dtypes' bfloat16 addition), in one pass where widening both, adding and rounding took four. Built on
// elements.cuh's packs of 16-bit words (its bfloat16 element type, HALF 2) and Map2: add_bfloat16_vector moves eight
// words an access where the arrays are 16-byte aligned, add_bfloat16 one.
#define HALF 2
#include "elements.cuh"
struct AddBfloat16 {
    __device__ __forceinline__ elem_t operator()(const elem_t a, const elem_t b) const {
        return element_of(add_keeping_subnormals(element_value(a), element_value(b)));
    }
};
extern "C" __global__ void add_bfloat16(const u16* __restrict__ a, const u16* __restrict__ b, u16* __restrict__ y,
                                        const int n) {
    by_packs<1>(n, Map2<AddBfloat16>{a, b, y, {}});
}
extern "C" __global__ void add_bfloat16_vector(const u16* __restrict__ a, const u16* __restrict__ b,
                                               u16* __restrict__ y, const int n) {
    by_packs<VECTOR>(n, Map2<AddBfloat16>{a, b, y, {}});
}
