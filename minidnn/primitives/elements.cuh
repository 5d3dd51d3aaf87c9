// The element type of kernels that have a half-precision build: with HALF undefined, elem_t is scalar_t and
// both conversions are the identity; with HALF = 1 (float16) or 2 (bfloat16), and SCALAR float, elements are
// 16-bit words, read as their exact float values and written rounded to nearest even (half.cuh) from the
// float of what the kernel computed. Include after scalar_t is defined.
#ifdef HALF
#include "half.cuh"
typedef u16 elem_t;
__device__ __forceinline__ float element_value(const elem_t word) {
    return HALF == 2 ? bfloat16_value(word) : float16_value(word);
}
template <typename T>
__device__ __forceinline__ elem_t element_of(const T value) {
    const float rounded = (float)value;
    const u32 bits = __float_as_uint(rounded);
    return HALF == 2 ? bfloat16_word(bits) : float16_word(bits, rounded);
}
#else
typedef scalar_t elem_t;
__device__ __forceinline__ scalar_t element_value(const elem_t value) { return value; }
template <typename T>
__device__ __forceinline__ elem_t element_of(const T value) { return (elem_t)value; }
#endif
