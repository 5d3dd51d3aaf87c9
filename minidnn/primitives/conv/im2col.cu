// im2col and col2im for the `gemm` convolution algorithm (see im2col.py for the layout).
//
// Columns are laid out (C, R, S, N, P, Q): row c·R·S + r·S + s of the lowered matrix holds filter
// tap (c, r, s) for every output pixel (n, p, q) of the (micro-)batch. One thread per element,
// consecutive threads on consecutive q, so the column writes (im2col) and reads (col2im) of a warp
// are contiguous.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

struct ConvShape {
    int N, C, H, W, R, S, P, Q;
    int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};

// x (N, C, H, W) -> columns (C, R, S, N, P, Q); taps that fall on the padding are 0.
extern "C" __global__ void im2col(const scalar_t* __restrict__ x, scalar_t* __restrict__ columns,
                                  const ConvShape shape) {
    const int total = shape.C * shape.R * shape.S * shape.N * shape.P * shape.Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        int rest = i;
        const int q = rest % shape.Q; rest /= shape.Q;
        const int p = rest % shape.P; rest /= shape.P;
        const int n = rest % shape.N; rest /= shape.N;
        const int s = rest % shape.S; rest /= shape.S;
        const int r = rest % shape.R;
        const int c = rest / shape.R;
        const int h = p * shape.stride_h - shape.pad_h + r * shape.dilation_h;
        const int w = q * shape.stride_w - shape.pad_w + s * shape.dilation_w;
        const bool inside = h >= 0 && h < shape.H && w >= 0 && w < shape.W;
        columns[i] = inside ? x[((n * shape.C + c) * shape.H + h) * shape.W + w] : scalar_t(0);
    }
}

// columns (C, R, S, N, P, Q) -> dx (N, C, H, W), the adjoint of im2col. A gather: each thread owns
// one input pixel and sums the column entries copied from it, so no two threads write the same
// address: no atomics, and the summation order (r, then s) is fixed, so the result is deterministic.
extern "C" __global__ void col2im(const scalar_t* __restrict__ columns, scalar_t* __restrict__ dx,
                                  const ConvShape shape) {
    const int total = shape.N * shape.C * shape.H * shape.W;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        int rest = i;
        const int w = rest % shape.W; rest /= shape.W;
        const int h = rest % shape.H; rest /= shape.H;
        const int c = rest % shape.C;
        const int n = rest / shape.C;
        scalar_t sum = 0;
        for (int r = 0; r < shape.R; ++r) {
            // Output row p reads input row h through tap r when p·stride_h = h + pad_h − r·dilation_h.
            const int row = h + shape.pad_h - r * shape.dilation_h;
            if (row < 0 || row % shape.stride_h != 0) continue;
            const int p = row / shape.stride_h;
            if (p >= shape.P) continue;
            for (int s = 0; s < shape.S; ++s) {
                const int col = w + shape.pad_w - s * shape.dilation_w;
                if (col < 0 || col % shape.stride_w != 0) continue;
                const int q = col / shape.stride_w;
                if (q >= shape.Q) continue;
                sum += columns[((((c * shape.R + r) * shape.S + s) * shape.N + n) * shape.P + p) * shape.Q + q];
            }
        }
        dx[i] = sum;
    }
}
