// The naive engine's kernels: the layers Caffe ran as one kernel per direction before cuDNN
// (BVLC/caffe, src/caffe/layers/*.cu and src/caffe/solvers/*.cu), written anew with PyTorch's
// semantics so that the naive engine computes what minidnn's primitives compute. Each kernel names
// the Caffe kernel it follows and says where it departs from it. The NumPy twins are the plain
// array code of pooling.py, activation.py, lrn.py and optimizer.py beside this file.
//
// Conventions (primitives/_cuda.py): extern "C" kernels on scalar_t from -DSCALAR=float|double,
// int indices (the Python side refuses arrays of 2^31 elements or more), grid-stride loops with one
// thread per output element or per pixel, hyper-parameters passed as double and rounded to scalar_t
// once. Arrays are contiguous.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// ------------------------------------------------------------------------------------------------
// Pooling (pooling_layer.cu). x and dx are (planes, H, W), y, dy and the mask (planes, P, Q), with
// planes = N·C. Output (p, q) pools input rows [p·stride_h − pad_h, + kernel_h) and columns alike,
// clipped to the input; P and Q come from pooling.py (PyTorch's floor or ceil mode; Caffe always
// rounded up). No dilation: Caffe had none, and pooling.py runs dilated windows as plain array code.
// ------------------------------------------------------------------------------------------------

// Outputs [first, last) along one axis whose windows cover input coordinate i: the covering windows
// of MaxPoolBackward and AvePoolBackward.
__device__ __forceinline__ int first_window(int i, int kernel, int stride, int pad) {
    return i + pad < kernel ? 0 : (i + pad - kernel) / stride + 1;
}
__device__ __forceinline__ int last_window(int i, int stride, int pad, int out) {
    return min((i + pad) / stride + 1, out);
}

// MaxPoolForward: the maximum over the window and its flat index h·W + w in the plane (the mask),
// in one pass. Departures, for PyTorch's results: the mask is int64 (PyTorch's indices), the scan
// starts from the window's first pixel rather than −FLT_MAX (so a window of −inf reports that pixel),
// and a NaN wins over any number (the last NaN, as PyTorch). Ties keep the first maximum in row-major
// order, as Caffe's strict comparison does.
extern "C" __global__ void max_pool_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                            int* __restrict__ mask, const int planes, const int H,
                                            const int W, const int P, const int Q, const int kernel_h,
                                            const int kernel_w, const int stride_h, const int stride_w,
                                            const int pad_h, const int pad_w) {
    const int total = planes * P * Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int q = i % Q;
        const int p = (i / Q) % P;
        const int plane = i / (Q * P);
        const int hstart = max(p * stride_h - pad_h, 0), hend = min(p * stride_h - pad_h + kernel_h, H);
        const int wstart = max(q * stride_w - pad_w, 0), wend = min(q * stride_w - pad_w + kernel_w, W);
        const scalar_t* __restrict__ xs = x + plane * H * W;
        int best_index = hstart * W + wstart;
        scalar_t best = xs[best_index];
        for (int h = hstart; h < hend; ++h) {
            for (int w = wstart; w < wend; ++w) {
                const int index = h * W + w;
                const scalar_t v = xs[index];
                if (v > best || isnan(v)) {
                    best = v;
                    best_index = index;
                }
            }
        }
        y[i] = best;
        mask[i] = best_index;
    }
}

// MaxPoolBackward: a gather, one thread per input pixel, summing dy over the covering windows whose
// mask points at it (in p, then q order: deterministic, no atomics). Caffe zeroed dx first; every
// element is written here, so no memset is needed.
extern "C" __global__ void max_pool_backward(const scalar_t* __restrict__ dy, const int* __restrict__ mask,
                                             scalar_t* __restrict__ dx, const int planes, const int H, const int W,
                                             const int P, const int Q, const int kernel_h, const int kernel_w,
                                             const int stride_h, const int stride_w, const int pad_h,
                                             const int pad_w) {
    const int total = planes * H * W;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int w = i % W;
        const int h = (i / W) % H;
        const int plane = i / (W * H);
        const int p0 = first_window(h, kernel_h, stride_h, pad_h), p1 = last_window(h, stride_h, pad_h, P);
        const int q0 = first_window(w, kernel_w, stride_w, pad_w), q1 = last_window(w, stride_w, pad_w, Q);
        const int offset = plane * P * Q;
        const long long own = h * W + w;
        scalar_t gradient = 0;
        for (int p = p0; p < p1; ++p) {
            for (int q = q0; q < q1; ++q) {
                const int o = offset + p * Q + q;
                if (mask[o] == own) gradient += dy[o];
            }
        }
        dx[i] = gradient;
    }
}

// The divisor of the window starting at (hstart, wstart), unclipped. Caffe's is the window's area
// inside the padded input (the ceil-mode overhang past it never counts): PyTorch's count_include_pad.
// PyTorch adds the count of real input pixels (count_include_pad off) and divisor_override (0 when
// not given). The area is formed in 64 bits, as a huge padded kernel can pass 2^31.
__device__ __forceinline__ scalar_t avg_divisor(int hstart, int wstart, int H, int W, int kernel_h, int kernel_w,
                                                int pad_h, int pad_w, int count_include_pad, int divisor_override) {
    if (divisor_override != 0) return scalar_t(divisor_override);
    const int hend = min(hstart + kernel_h, H + pad_h), wend = min(wstart + kernel_w, W + pad_w);
    if (count_include_pad) return scalar_t(static_cast<long long>(hend - hstart) * (wend - wstart));
    return scalar_t(static_cast<long long>(min(hend, H) - max(hstart, 0)) * (min(wend, W) - max(wstart, 0)));
}

// AvePoolForward: the sum of the window's input pixels, row by row, over the divisor.
extern "C" __global__ void avg_pool_forward(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                            const int planes, const int H, const int W, const int P, const int Q,
                                            const int kernel_h, const int kernel_w, const int stride_h,
                                            const int stride_w, const int pad_h, const int pad_w,
                                            const int count_include_pad, const int divisor_override) {
    const int total = planes * P * Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int q = i % Q;
        const int p = (i / Q) % P;
        const int plane = i / (Q * P);
        const int hstart = p * stride_h - pad_h, wstart = q * stride_w - pad_w;
        const int h1 = min(hstart + kernel_h, H), w1 = min(wstart + kernel_w, W);
        const scalar_t* __restrict__ xs = x + plane * H * W;
        scalar_t sum = 0;
        for (int h = max(hstart, 0); h < h1; ++h) {
            for (int w = max(wstart, 0); w < w1; ++w) sum += xs[h * W + w];
        }
        y[i] = sum / avg_divisor(hstart, wstart, H, W, kernel_h, kernel_w, pad_h, pad_w, count_include_pad,
                                 divisor_override);
    }
}

// AvePoolBackward: a gather, one thread per input pixel, summing dy / divisor over the covering
// windows (each term divided first, as Caffe).
extern "C" __global__ void avg_pool_backward(const scalar_t* __restrict__ dy, scalar_t* __restrict__ dx,
                                             const int planes, const int H, const int W, const int P, const int Q,
                                             const int kernel_h, const int kernel_w, const int stride_h,
                                             const int stride_w, const int pad_h, const int pad_w,
                                             const int count_include_pad, const int divisor_override) {
    const int total = planes * H * W;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int w = i % W;
        const int h = (i / W) % H;
        const int plane = i / (W * H);
        const int p0 = first_window(h, kernel_h, stride_h, pad_h), p1 = last_window(h, stride_h, pad_h, P);
        const int q0 = first_window(w, kernel_w, stride_w, pad_w), q1 = last_window(w, stride_w, pad_w, Q);
        const scalar_t* __restrict__ dys = dy + plane * P * Q;
        scalar_t gradient = 0;
        for (int p = p0; p < p1; ++p) {
            for (int q = q0; q < q1; ++q) {
                gradient += dys[p * Q + q] / avg_divisor(p * stride_h - pad_h, q * stride_w - pad_w, H, W, kernel_h,
                                                         kernel_w, pad_h, pad_w, count_include_pad, divisor_override);
            }
        }
        dx[i] = gradient;
    }
}

// ------------------------------------------------------------------------------------------------
// ReLU (relu_layer.cu, negative_slope 0)
// ------------------------------------------------------------------------------------------------

// ReLUForward. y may be x itself (Caffe runs ReLU in place), hence no __restrict__. A NaN passes and
// −0 gives +0, as the primitives' max(x, 0) (Caffe's x·0 gave −0).
extern "C" __global__ void relu_forward(const scalar_t* x, scalar_t* y, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t v = x[i];
        y[i] = (v > scalar_t(0) || isnan(v)) ? v : scalar_t(0);
    }
}

// ReLUBackward from the output y (after an in-place forward Caffe's bottom data is y). A select, not
// Caffe's product dy·[y > 0], so a NaN or inf in dy stays out of the pixels the ReLU blocked (PyTorch).
extern "C" __global__ void relu_backward(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                         scalar_t* __restrict__ dx, const int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        dx[i] = y[i] > scalar_t(0) ? dy[i] : scalar_t(0);
    }
}

// ------------------------------------------------------------------------------------------------
// Local response normalisation across channels (lrn_layer.cu). x, scale, y, dy and dx are
// (N, C, S) with S the spatial size: channel c of pixel (n, s) is at (n·C + c)·S + s. Channel c's
// window is c − before … c + after, clipped to [0, C); lrn.py passes before and after clipped to C.
// ------------------------------------------------------------------------------------------------

// LRNFillScale: one thread per pixel walks the channels with a running window sum of x² (add the
// channel entering, subtract the one leaving) and writes scale = k + (α/size)·Σ. Departures: the
// window may be asymmetric (PyTorch's even sizes; Caffe took odd sizes only), and the running sum is
// a double (Caffe's was scalar_t: in float32 it drifts as channels come and go, and the engines must
// agree), clamped at 0 where the subtraction rounds below it.
extern "C" __global__ void lrn_fill_scale(const scalar_t* __restrict__ x, scalar_t* __restrict__ scale, const int N,
                                          const int C, const int S, const int before, const int after,
                                          const double alpha_over_size, const double k) {
    const scalar_t coefficient = scalar_t(alpha_over_size), offset = scalar_t(k);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < N * S; t += blockDim.x * gridDim.x) {
        const int n = t / S;
        const scalar_t* __restrict__ xs = x + n * C * S + (t - n * S);
        scalar_t* __restrict__ scales = scale + n * C * S + (t - n * S);
        double window = 0;
        for (int j = 0; j <= after && j < C; ++j) window += double(xs[j * S] * xs[j * S]);
        for (int c = 0; c < C; ++c) {
            scales[c * S] = offset + coefficient * scalar_t(window < 0 ? 0.0 : window);
            const int enter = c + 1 + after, leave = c - before;
            if (enter < C) window += double(xs[enter * S] * xs[enter * S]);
            if (leave >= 0) window -= double(xs[leave * S] * xs[leave * S]);
        }
    }
}

// LRNComputeOutput: y = x·scale^−β, one thread per element (Caffe's second forward kernel).
extern "C" __global__ void lrn_compute_output(const scalar_t* __restrict__ x, const scalar_t* __restrict__ scale,
                                              scalar_t* __restrict__ y, const int n, const double beta) {
    const scalar_t minus_beta = scalar_t(-beta);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = x[i] * pow(scale[i], minus_beta);
    }
}

// LRNComputeDiff: dx = dy·scale^−β − (2αβ/size)·x·Σ dy·y/scale over the mirrored window (the channels
// whose windows hold c: c − after … c + before), one thread per pixel with a running double sum as in
// lrn_fill_scale. Each term is recomputed from the same loads when it leaves, so the sum subtracts
// exactly what it added.
extern "C" __global__ void lrn_compute_diff(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                            const scalar_t* __restrict__ y, const scalar_t* __restrict__ scale,
                                            scalar_t* __restrict__ dx, const int N, const int C, const int S,
                                            const int before, const int after, const double beta,
                                            const double two_alpha_beta_over_size) {
    const scalar_t minus_beta = scalar_t(-beta), coefficient = scalar_t(two_alpha_beta_over_size);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < N * S; t += blockDim.x * gridDim.x) {
        const int n = t / S;
        const int base = n * C * S + (t - n * S);
        double window = 0;
        for (int j = 0; j <= before && j < C; ++j) {
            const int i = base + j * S;
            window += double(dy[i] * y[i] / scale[i]);
        }
        for (int c = 0; c < C; ++c) {
            const int i = base + c * S;
            dx[i] = dy[i] * pow(scale[i], minus_beta) - coefficient * x[i] * scalar_t(window);
            if (c + 1 + before < C) {
                const int enter = base + (c + 1 + before) * S;
                window += double(dy[enter] * y[enter] / scale[enter]);
            }
            if (c - after >= 0) {
                const int leave = base + (c - after) * S;
                window -= double(dy[leave] * y[leave] / scale[leave]);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Solver updates (sgd_solver.cpp/.cu, adam_solver.cpp/.cu), per parameter, in Caffe's three steps:
// Regularize (an axpy of the weight decay into the gradient), ComputeUpdateValue (SGDUpdate or
// AdamUpdate: the gradient becomes the update value), Update (param −= update, an axpy). PyTorch's
// arithmetic throughout, so that the engines' training runs agree. The gradient buffer `g` is the
// caller's gradient or a scratch copy (optimizer.py): the caller's own gradient is never written.
// ------------------------------------------------------------------------------------------------

// Regularize: g = ±grad + weight_decay·param into a scratch buffer (maximize negates first, as PyTorch).
extern "C" __global__ void regularize(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ param,
                                      scalar_t* __restrict__ g, const int n, const int maximize,
                                      const double weight_decay) {
    const scalar_t decay = scalar_t(weight_decay);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        scalar_t value = maximize ? -grad[i] : grad[i];
        if (weight_decay != 0.0) value += decay * param[i];
        g[i] = value;
    }
}

// SGDUpdate: update = lr·(b or g + μ·b) with b = g on the first step, else μ·b + (1 − dampening)·g
// (PyTorch; Caffe kept lr inside the history, h = μ·h + lr·g). `update` may be `g` (Caffe writes the
// diff in place), hence no __restrict__ on those two; the buffer is not read when momentum is 0.
extern "C" __global__ void sgd_update(const scalar_t* g, scalar_t* __restrict__ momentum_buffer, scalar_t* update,
                                      const int n, const double lr, const double momentum, const double dampening,
                                      const int nesterov, const int first_step) {
    const scalar_t rate = scalar_t(lr), momentum_ = scalar_t(momentum), keep = scalar_t(1.0 - dampening);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        scalar_t direction = g[i];
        if (momentum != 0.0) {
            const scalar_t buffer = first_step ? direction : momentum_ * momentum_buffer[i] + keep * direction;
            momentum_buffer[i] = buffer;
            direction = nesterov ? direction + momentum_ * buffer : buffer;
        }
        update[i] = rate * direction;
    }
}

// AdamUpdate: the moments and update = step_size·m / (√v / √(1 − β2^t) + eps) with step_size =
// lr / (1 − β1^t), AMSGrad's running maximum of v (PyTorch; Caffe added eps to √v and folded
// √(1 − β2^t) into the rate). `update` may be `g`.
extern "C" __global__ void adam_update(const scalar_t* g, scalar_t* __restrict__ exp_avg,
                                       scalar_t* __restrict__ exp_avg_sq, scalar_t* __restrict__ max_exp_avg_sq,
                                       scalar_t* update, const int n, const double beta1, const double beta2,
                                       const double eps, const double step_size, const double correction2_sqrt,
                                       const int amsgrad) {
    const scalar_t b1 = scalar_t(beta1), b2 = scalar_t(beta2), eps_ = scalar_t(eps);
    const scalar_t step_ = scalar_t(step_size), correction = scalar_t(correction2_sqrt);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const scalar_t gi = g[i];
        const scalar_t m = b1 * exp_avg[i] + (scalar_t(1) - b1) * gi;
        const scalar_t v = b2 * exp_avg_sq[i] + (scalar_t(1) - b2) * gi * gi;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        scalar_t second = v;
        if (amsgrad) {
            second = max(max_exp_avg_sq[i], v);
            max_exp_avg_sq[i] = second;
        }
        update[i] = step_ * m / (sqrt(second) / correction + eps_);
    }
}

// Update and the other BLAS-1 steps Caffe took from cuBLAS: y += alpha·x (caffe_gpu_axpy; Update is
// alpha = −1) and x *= alpha (caffe_gpu_scal; AdamW's decoupled decay, which Caffe did not have).
extern "C" __global__ void axpy(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const int n,
                                const double alpha) {
    const scalar_t a = scalar_t(alpha);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] += a * x[i];
}

extern "C" __global__ void scal(scalar_t* __restrict__ x, const int n, const double alpha) {
    const scalar_t a = scalar_t(alpha);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) x[i] *= a;
}
