// Element-wise activations: ReLU, sigmoid and tanh, forward and backward, the residual add with its
// ReLU, leaky ReLU, SiLU and GELU (activation.py states the maths; its NumPy code is the reference twin
// of every kernel here).
//
// Layout: every array is contiguous and seen as a flat vector of n elements; the backward kernels of
// ReLU, sigmoid and tanh take the forward output y, not x (their derivatives are functions of y, as in
// cuDNN); those of leaky ReLU, SiLU and GELU take x. Hyper-parameters (the slope) are double, after n.
//
// Thread mapping: one thread per element in a grid-stride loop (activation.py caps the grid), so
// consecutive threads of a warp read and write consecutive addresses; ReLU, its backward (of one gradient or of
// two parts summed) and the residual add also move 16-byte packs (elements.cuh's by_packs). One launch per call.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// ReLU, its backward and the residual add with its ReLU also have a half build (HALF = 1 for float16, 2 for
// bfloat16, SCALAR float): elements are 16-bit words, the arithmetic float, one rounding (elements.cuh).
#include "elements.cuh"

// max(v, 0). NaN propagates and −0 gives +0, as NumPy's maximum(x, 0) does.
__device__ __forceinline__ scalar_t relu(const scalar_t v) {
    return (v > scalar_t(0) || isnan(v)) ? v : scalar_t(0);
}

// y = max(x, 0); y may be x (the in-place ReLU). elements.cuh's Map.
struct ReluOf {
    __device__ __forceinline__ elem_t operator()(const elem_t x) const { return element_of(relu(element_value(x))); }
};

// y = max(a + b, 0), the sum rounded to scalar_t first (as relu_forward(a + b)); y may be a or b.
struct AddThenRelu {
    __device__ __forceinline__ elem_t operator()(const elem_t a, const elem_t b) const {
        return element_of(relu(element_value(a) + element_value(b)));
    }
};

// dx = dy where y > 0, else 0: the gradient at x = 0 is 0 (PyTorch), and y > 0 exactly when x > 0. A body of its
// own rather than Map2: its arrays never alias, and __restrict__ leaves the compiler free to order the loads.
struct ReluBackward {
    const elem_t *__restrict__ dy, *__restrict__ y;
    elem_t* __restrict__ dx;
    template <int V>
    __device__ __forceinline__ void run(const int i) const {
        const Pack<V> g = packs<V>(dy)[i], out = packs<V>(y)[i];
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u) p.e[u] = element_value(out.e[u]) > scalar_t(0) ? g.e[u] : elem_t(0);  // word 0: +0
        packs<V>(dx)[i] = p;
    }
};

// dx = (dy + dy_other) where y > 0, else 0: y's gradient in two parts (y fed two operations, as a residual block's
// output feeds the next block's convolution and its shortcut), summed here, rounded to the element type as the sum
// alone would be, then masked. One pass over four arrays where the sum and the mask apart took two over six.
struct ReluBackwardOfSum {
    const elem_t *__restrict__ dy, *__restrict__ y, *__restrict__ dy_other;
    elem_t* __restrict__ dx;
    template <int V>
    __device__ __forceinline__ void run(const int i) const {
        const Pack<V> g = packs<V>(dy)[i], out = packs<V>(y)[i], h = packs<V>(dy_other)[i];
        Pack<V> p;
#pragma unroll
        for (int u = 0; u < V; ++u)
            p.e[u] = element_value(out.e[u]) > scalar_t(0) ? element_of(element_value(g.e[u]) + element_value(h.e[u]))
                                                           : elem_t(0);
        packs<V>(dx)[i] = p;
    }
};

// Each in single elements and in packs of VECTOR (activation.py launches the packs where every array is
// 16-byte aligned).
extern "C" __global__ void relu_forward(const elem_t* x, elem_t* y, const int n) {
    by_packs<1>(n, Map<ReluOf>{x, y, {}});
}
extern "C" __global__ void relu_forward_vector(const elem_t* x, elem_t* y, const int n) {
    by_packs<VECTOR>(n, Map<ReluOf>{x, y, {}});
}
extern "C" __global__ void add_relu_forward(const elem_t* a, const elem_t* b, elem_t* y, const int n) {
    by_packs<1>(n, Map2<AddThenRelu>{a, b, y, {}});
}
extern "C" __global__ void add_relu_forward_vector(const elem_t* a, const elem_t* b, elem_t* y, const int n) {
    by_packs<VECTOR>(n, Map2<AddThenRelu>{a, b, y, {}});
}
extern "C" __global__ void relu_backward(const elem_t* __restrict__ dy, const elem_t* __restrict__ y,
                                         elem_t* __restrict__ dx, const int n) {
    by_packs<1>(n, ReluBackward{dy, y, dx});
}
extern "C" __global__ void relu_backward_vector(const elem_t* __restrict__ dy, const elem_t* __restrict__ y,
                                                elem_t* __restrict__ dx, const int n) {
    by_packs<VECTOR>(n, ReluBackward{dy, y, dx});
}
extern "C" __global__ void relu_backward_sum(const elem_t* __restrict__ dy, const elem_t* __restrict__ y,
                                             const elem_t* __restrict__ dy_other, elem_t* __restrict__ dx, const int n) {
    by_packs<1>(n, ReluBackwardOfSum{dy, y, dy_other, dx});
}
extern "C" __global__ void relu_backward_sum_vector(const elem_t* __restrict__ dy, const elem_t* __restrict__ y,
                                                    const elem_t* __restrict__ dy_other, elem_t* __restrict__ dx,
                                                    const int n) {
    by_packs<VECTOR>(n, ReluBackwardOfSum{dy, y, dy_other, dx});
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

// y = x where x > 0, else slope·x. y may be x (in place): no __restrict__ (see relu_forward).
extern "C" __global__ void leaky_relu_forward(const scalar_t* x, scalar_t* y, const int n, const double slope) {
    const scalar_t a = scalar_t(slope);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        y[i] = v > scalar_t(0) ? v : v * a;
    }
}

// dx = dy where x > 0, else slope·dy (x may be the forward's output when slope >= 0: same signs).
extern "C" __global__ void leaky_relu_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                               scalar_t* __restrict__ dx, const int n, const double slope) {
    const scalar_t a = scalar_t(slope);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        dx[i] = x[i] > scalar_t(0) ? dy[i] : dy[i] * a;
    }
}

// σ(v) as sigmoid_forward computes it: exp of −|v| only.
__device__ __forceinline__ scalar_t stable_sigmoid(const scalar_t v) {
    const scalar_t decay = exp(-fabs(v));
    return v >= scalar_t(0) ? scalar_t(1) / (scalar_t(1) + decay) : decay / (scalar_t(1) + decay);
}

// y = x·σ(x). y may be x (in place): no __restrict__.
extern "C" __global__ void silu_forward(const scalar_t* x, scalar_t* y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        y[i] = v * stable_sigmoid(v);
    }
}

// dx = dy·σ(x)·(1 + x·(1 − σ(x))).
extern "C" __global__ void silu_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                         scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        const scalar_t s = stable_sigmoid(v);
        dx[i] = dy[i] * s * (scalar_t(1) + v * (scalar_t(1) - s));
    }
}

// GELU's constants: 1/√2, 1/√(2π), and the tanh form's √(2/π) and cubic coefficient.
#define GELU_RSQRT2 0.70710678118654752440
#define GELU_RSQRT_2PI 0.39894228040143267794
#define GELU_SQRT_2_OVER_PI 0.79788456080286535588
#define GELU_CUBIC 0.044715

// y = x·Φ(x) = x·(1 + erf(x/√2))/2.
extern "C" __global__ void gelu_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        y[i] = v * (scalar_t(1) + erf(v * scalar_t(GELU_RSQRT2))) / scalar_t(2);
    }
}

// dx = dy·(Φ(x) + x·φ(x)).
extern "C" __global__ void gelu_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                         scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        const scalar_t cdf = (scalar_t(1) + erf(v * scalar_t(GELU_RSQRT2))) / scalar_t(2);
        const scalar_t density = exp(-v * v / scalar_t(2)) * scalar_t(GELU_RSQRT_2PI);
        dx[i] = dy[i] * (cdf + v * density);
    }
}

// The tanh form through the logistic function: (1 + tanh(u))/2 = σ(2u) and (1 − tanh²(u))/2 = 2·σ(2u)·σ(−2u),
// with e = exp(−2|u|) <= 1 so that neither σ(2u) nor σ(−2u) is ever 1 minus something close to 1 (where x is
// very negative, 1 + tanh(u) would cancel to a few correct bits in float).
struct GeluTanhTerms {
    scalar_t v, sigma, sigma_complement, u_slope;  // x, σ(2u), σ(−2u), du/dx
};

__device__ inline GeluTanhTerms gelu_tanh_terms(const scalar_t v) {
    const scalar_t scale = scalar_t(GELU_SQRT_2_OVER_PI), cubic = scalar_t(GELU_CUBIC);
    const scalar_t u = scale * (v + cubic * v * v * v);
    const scalar_t e = exp(scalar_t(-2) * fabs(u));
    const scalar_t near = scalar_t(1) / (scalar_t(1) + e), far = e / (scalar_t(1) + e);
    const bool positive = u >= scalar_t(0);
    return {v, positive ? near : far, positive ? far : near, scale * (scalar_t(1) + scalar_t(3) * cubic * v * v)};
}

// y = x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))/2 = x·σ(2u).
extern "C" __global__ void gelu_tanh_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const GeluTanhTerms t = gelu_tanh_terms(x[i]);
        y[i] = t.v * t.sigma;
    }
}

// dx = dy·((1 + t)/2 + x/2·(1 − t²)·u') = dy·(σ(2u) + 2x·σ(2u)·σ(−2u)·u').
extern "C" __global__ void gelu_tanh_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                              scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const GeluTanhTerms t = gelu_tanh_terms(x[i]);
        dx[i] = dy[i] * (t.sigma + scalar_t(2) * t.v * t.sigma * t.sigma_complement * t.u_slope);
    }
}
