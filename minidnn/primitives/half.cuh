// The half types as 16-bit words, and float32 to and from them (convert.py's module docstring gives the rules;
// its NumPy functions are the twins): round to nearest, ties to even, with the bits ml_dtypes (bfloat16) and
// NumPy (float16) give for every input, NaNs included. Shared by convert.cu and the half-precision kernels.
#ifndef MINIDNN_HALF_CUH  // included by elements.cuh and by sources that include both (nvcc reads it twice)
#define MINIDNN_HALF_CUH

typedef unsigned short u16;
typedef unsigned int u32;

#define SIGN_32 0x80000000u
#define ABS_32 0x7fffffffu
#define INF_32 0x7f800000u

// bfloat16 is float32's top half: add just under half a unit of the 16 bits dropped, plus one where the kept
// half is odd (so that a tie goes to the even neighbour), and keep the top 16 bits. The carry rounds the
// largest finite floats up to infinity, as it should. NaN would carry into the sign or become infinity: it
// becomes the quiet NaN 0x7fc0 with its sign.
__device__ __forceinline__ u16 bfloat16_word(const u32 bits) {
    if ((bits & ABS_32) > INF_32) {
        return (u16)(((bits & SIGN_32) >> 16) | 0x7fc0u);
    }
    return (u16)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// float16: 5 exponent bits (bias 15), 10 fraction bits. Magnitudes from 65520 round to infinity; below 2^-14
// the result is subnormal, a multiple of 2^-24, and below 2^-25 (half the smallest) it is zero; the hardware
// conversion rounds each case to nearest even. A NaN keeps its sign and its top 10 fraction bits, made
// non-zero, as NumPy does.
__device__ __forceinline__ u16 float16_word(const u32 bits, const float value) {
    if ((bits & ABS_32) > INF_32) {
        const u32 fraction = (bits & 0x007fffffu) >> 13;
        return (u16)(((bits & SIGN_32) >> 16) | 0x7c00u | (fraction ? fraction : 1u));
    }
    u16 word;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(word) : "f"(value));
    return word;
}

// float16 to float32 is exact, and the hardware conversion (one instruction, subnormals kept: no .ftz) does it
// for every finite word. Infinities and NaNs are put together from the bits instead, so that a NaN keeps its
// fraction as NumPy's widening does. A select, not a branch: a warp whose words differ in kind (zeros among
// normal values, as ReLU's gradients are) would otherwise run each path in turn.
__device__ __forceinline__ float float16_value(const u16 word) {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(word));
    const u32 special = (((u32)word & 0x8000u) << 16) | INF_32 | (((u32)word & 0x3ffu) << 13);
    return ((word & 0x7c00u) == 0x7c00u) ? __uint_as_float(special) : value;
}

// bfloat16 to float32 is exact: the word is the float's top half.
__device__ __forceinline__ float bfloat16_value(const u16 word) { return __uint_as_float((u32)word << 16); }

#endif  // MINIDNN_HALF_CUH
