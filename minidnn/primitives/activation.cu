// Element-wise activations: ReLU, sigmoid and tanh, forward and backward, and the residual add with
// its ReLU (activation.py states the maths; its NumPy code is the reference twin of every kernel here).
//
// Layout: every array is contiguous and seen as a flat vector of n elements; the backward kernels
// take the forward output y, not x (all three derivatives are functions of y, as in cuDNN).
//
// Thread mapping: one thread per element in a grid-stride loop (activation.py caps the grid), so
// consecutive threads of a warp read and write consecutive addresses. One launch per call.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// max(v, 0). NaN propagates and −0 gives +0, as NumPy's maximum(x, 0) does.
__device__ __forceinline__ scalar_t relu(const scalar_t v) {
    return (v > scalar_t(0) || isnan(v)) ? v : scalar_t(0);
}

// y = max(x, 0). y may be x (the in-place ReLU), so the pointers are not __restrict__: each element is
// read once and then written by the same thread, which is safe when they alias.
extern "C" __global__ void relu_forward(const scalar_t* x, scalar_t* y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = relu(x[i]);
    }
}

// y = max(a + b, 0), the sum rounded to scalar_t first (as relu_forward(a + b)). y may be a or b
// (in place), hence no __restrict__ (see relu_forward).
extern "C" __global__ void add_relu_forward(const scalar_t* a, const scalar_t* b, scalar_t* y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = relu(a[i] + b[i]);
    }
}

// dx = dy where y > 0, else 0: the gradient at x = 0 is 0 (PyTorch), and y > 0 exactly when x > 0.
extern "C" __global__ void relu_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                         scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        dx[i] = y[i] > scalar_t(0) ? dy[i] : scalar_t(0);
    }
}

// y = 1 / (1 + e^−x), with exp taken only of −|x| <= 0 so that it cannot overflow: 1 / (1 + e^−x)
// for x >= 0, the equal e^x / (1 + e^x) for x < 0 (a NaN takes the second branch and stays NaN).
extern "C" __global__ void sigmoid_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        const scalar_t decay = exp(-fabs(v));
        y[i] = v >= scalar_t(0) ? scalar_t(1) / (scalar_t(1) + decay) : decay / (scalar_t(1) + decay);
    }
}

// dx = dy · y · (1 − y), in the NumPy twin's order.
extern "C" __global__ void sigmoid_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                            scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = y[i];
        dx[i] = dy[i] * v * (scalar_t(1) - v);
    }
}

extern "C" __global__ void tanh_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = tanh(x[i]);
    }
}

// dx = dy · (1 − y²).
extern "C" __global__ void tanh_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                         scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = y[i];
        dx[i] = dy[i] * (scalar_t(1) - v * v);
    }
}
