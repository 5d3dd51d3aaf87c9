// Random crop with padding, horizontal flip and normalisation of a uint8 (N, H, W, C) batch into a float
// (N, C, h, w) one, in one pass (augment.py states the maths; its NumPy code is the twin of this kernel).
//
// One thread per output element, in NCHW order (grid-stride), so the float writes are coalesced; the
// uint8 reads gather from an NHWC image that the L1/L2 caches hold (a CIFAR batch is 393 KB). The
// random choices are inputs: top[n], left[n] (the window's corner in the padded image) and flip[n],
// drawn on the host, so a replay of the same draws gives the same images.
//
// Every value is rounded as the NumPy twin rounds it: x·scale, then − mean[c], then / std[c], each in
// scalar_t and each rounded once (the _rn intrinsics), never contracted into a fused multiply-add.
// That keeps float32 results bitwise equal to the twin's (and to ToTensor followed by Normalize).
//
// Offsets are not range-checked on the GPU (that would need a host synchronisation): an image whose
// top or left lies outside [0, H + 2p − h] or [0, W + 2p − w] never indexes memory outside it; its
// output is NaN, so the loss of a step that uses it is NaN (augment.py's docstring).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// The C struct AugmentShape: augment.py's _AUGMENT_SHAPE has the same fields in the same order.
struct AugmentShape {
    int N, H, W, C;    // the uint8 input batch
    int h, w;          // the window (output) size
    int padding;       // fill pixels added on each side before cropping
    int fill;          // their value, 0..255
};

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }

__device__ __forceinline__ scalar_t quiet_nan() {
    return scalar_t(__longlong_as_double(0x7ff8000000000000LL));
}

// out[n, c, i, j] = (padded[n, top[n] + i, left[n] + (flip[n] ? w − 1 − j : j), c]·scale − mean[c]) / std[c]
// where padded is the image with `padding` rows and columns of `fill` on each side.
extern "C" __global__ void crop_flip_normalize(const unsigned char* __restrict__ images,
                                               const int* __restrict__ top, const int* __restrict__ left,
                                               const unsigned char* __restrict__ flip,
                                               const scalar_t* __restrict__ mean, const scalar_t* __restrict__ std,
                                               scalar_t* __restrict__ out, const AugmentShape s,
                                               const double scale_value) {
    const scalar_t scale = scalar_t(scale_value);  // rounded once, as np.float32(scale) is
    const int plane = s.h * s.w;
    const int count = s.N * s.C * plane;
    const int top_limit = s.H + 2 * s.padding - s.h;
    const int left_limit = s.W + 2 * s.padding - s.w;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < count; e += blockDim.x * gridDim.x) {
        const int j = e % s.w;
        const int i = (e / s.w) % s.h;
        const int c = (e / plane) % s.C;
        const int n = e / (plane * s.C);
        const int corner_row = top[n];
        const int corner_column = left[n];
        if (corner_row < 0 || corner_row > top_limit || corner_column < 0 || corner_column > left_limit) {
            out[e] = quiet_nan();
            continue;
        }
        const int row = corner_row + i - s.padding;
        const int column = corner_column + (flip[n] ? s.w - 1 - j : j) - s.padding;
        const bool inside = row >= 0 && row < s.H && column >= 0 && column < s.W;
        const int pixel = inside ? images[((n * s.H + row) * s.W + column) * s.C + c] : s.fill;
        out[e] = div_rn(sub_rn(mul_rn(scalar_t(pixel), scale), mean[c]), std[c]);
    }
}
