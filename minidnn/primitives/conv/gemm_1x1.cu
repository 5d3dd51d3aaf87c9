// The row of ones that gemm_1x1's backward-filter multiplies the images' partial products by, to sum them in one GEMM.
// It lies in the shared workspace, which other calls overwrite, so every call writes it again. A launch of our own,
// unlike a CuPy fill, is recorded with the call's GEMMs, so that a repeat of the call replays it too (_cuda.ReadyCall).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

extern "C" __global__ void ones(scalar_t* out, int count) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        out[i] = scalar_t(1);
    }
}

// A strided 1x1 channels-last problem's sampled pixels (gemm_1x1.py): x's pixels (u·p, v·q) gathered into (images·P·Q)
// rows before forward's GEMM, and backward-data's rows scattered onto dx, every other pixel of dx written zero (no dy
// reaches it), so that dx is written once, whole. Both move bits, in words of 2, 4, 8 or 16 bytes (whichever divides
// a pixel's bytes and both addresses): one build serves every type. Thread i takes word i of the array it writes.
template <typename Word>
__device__ void gather_sampled(const Word* __restrict__ x, Word* __restrict__ rows, const int count, const int words,
                               const int H, const int W, const int P, const int Q, const int u, const int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const int pixel = i / words, k = i - pixel * words;
        const int image = pixel / (P * Q), pq = pixel - image * (P * Q), p = pq / Q, q = pq - p * Q;
        rows[i] = x[(((long long)image * H + u * p) * W + v * q) * words + k];
    }
}

template <typename Word>
__device__ void scatter_sampled(const Word* __restrict__ rows, Word* __restrict__ dx, const int count, const int words,
                                const int H, const int W, const int P, const int Q, const int u, const int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const int pixel = i / words, k = i - pixel * words;
        const int image = pixel / (H * W), hw = pixel - image * (H * W), h = hw / W, w = hw - h * W;
        Word value{};
        if (h % u == 0 && w % v == 0 && h / u < P && w / v < Q) {
            value = rows[(((long long)image * P + h / u) * Q + w / v) * words + k];
        }
        dx[i] = value;
    }
}

#define SAMPLED_PARAMETERS(Word, from, to)                                                                          \
    const Word* from, Word* to, const int count, const int words, const int H, const int W, const int P, const int Q, \
        const int u, const int v
#define SAMPLED_KERNELS(bytes, Word)                                                                                 \
    extern "C" __global__ void gather_sampled_##bytes(SAMPLED_PARAMETERS(Word, x, rows)) {                          \
        gather_sampled<Word>(x, rows, count, words, H, W, P, Q, u, v);                                              \
    }                                                                                                                \
    extern "C" __global__ void scatter_sampled_##bytes(SAMPLED_PARAMETERS(Word, rows, dx)) {                        \
        scatter_sampled<Word>(rows, dx, count, words, H, W, P, Q, u, v);                                            \
    }
SAMPLED_KERNELS(2, unsigned short)
SAMPLED_KERNELS(4, unsigned int)
SAMPLED_KERNELS(8, unsigned long long)
SAMPLED_KERNELS(16, uint4)
