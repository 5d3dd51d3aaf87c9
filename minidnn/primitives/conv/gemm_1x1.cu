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
