// The half types as 16-bit words, and float32 to and from them (convert.py's module docstring gives the rules;
// its NumPy functions are the twins): round to nearest, ties to even, with the bits ml_dtypes (bfloat16) and
// NumPy (float16) give for every input, NaNs included. Shared by convert.cu and the half-precision kernels.
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

// float16 to float32 is exact: normal values move their exponent from bias 15 to bias 127, subnormals
// (fraction · 2^-24) are computed exactly in float32, infinities and NaNs keep their fraction bits.
__device__ __forceinline__ float float16_value(const u16 word) {
    const u32 sign = ((u32)word & 0x8000u) << 16, exponent = ((u32)word >> 10) & 0x1fu, fraction = word & 0x3ffu;
    if (exponent == 0x1fu) {
        return __uint_as_float(sign | INF_32 | (fraction << 13));
    }
    if (exponent == 0u) {
        return __uint_as_float(sign | __float_as_uint((float)fraction * 5.9604644775390625e-8f));  // 2^-24
    }
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (fraction << 13));
}

// bfloat16 to float32 is exact: the word is the float's top half.
__device__ __forceinline__ float bfloat16_value(const u16 word) { return __uint_as_float((u32)word << 16); }
