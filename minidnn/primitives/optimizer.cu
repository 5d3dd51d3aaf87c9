// Fused optimizer updates: one kernel reads a parameter, its gradient and its state once and
// writes them once (the NumPy twin in optimizer.py needs several passes and temporaries).
// One thread per element, grid-stride; hyper-parameters arrive as double and are rounded to
// scalar_t once, so float32 parameters are updated in float32 arithmetic as PyTorch does.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// SGD with momentum, PyTorch's rule. momentum_buffer is read only when momentum != 0.
extern "C" __global__ void sgd_update(scalar_t* __restrict__ param, const scalar_t* __restrict__ grad,
                                      scalar_t* __restrict__ momentum_buffer, const int count,
                                      const double lr, const double momentum, const double dampening,
                                      const double weight_decay, const int nesterov, const int maximize,
                                      const int first_step) {
    const scalar_t lr_ = (scalar_t)lr, momentum_ = (scalar_t)momentum;
    const scalar_t keep = (scalar_t)(1.0 - dampening), decay = (scalar_t)weight_decay;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x) {
        scalar_t g = maximize ? -grad[i] : grad[i];
        if (weight_decay != 0.0) g += decay * param[i];
        if (momentum != 0.0) {
            const scalar_t buffer = first_step ? g : momentum_ * momentum_buffer[i] + keep * g;
            momentum_buffer[i] = buffer;
            g = nesterov ? g + momentum_ * buffer : buffer;
        }
        param[i] -= lr_ * g;
    }
}

// Adam (decoupled = 0) or AdamW (decoupled = 1); AMSGrad keeps the running maximum of v in max_exp_avg_sq.
// step_size = lr / (1 − β1^t) and correction2_sqrt = √(1 − β2^t) are computed on the host once per step.
extern "C" __global__ void adam_update(scalar_t* __restrict__ param, const scalar_t* __restrict__ grad,
                                       scalar_t* __restrict__ exp_avg, scalar_t* __restrict__ exp_avg_sq,
                                       scalar_t* __restrict__ max_exp_avg_sq, const int count, const double lr,
                                       const double beta1, const double beta2, const double eps,
                                       const double weight_decay, const double step_size,
                                       const double correction2_sqrt, const int decoupled, const int amsgrad,
                                       const int maximize) {
    const scalar_t b1 = (scalar_t)beta1, b2 = (scalar_t)beta2, eps_ = (scalar_t)eps;
    const scalar_t decay = (scalar_t)weight_decay, shrink = (scalar_t)(1.0 - lr * weight_decay);
    const scalar_t step_ = (scalar_t)step_size, correction = (scalar_t)correction2_sqrt;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x) {
        scalar_t g = maximize ? -grad[i] : grad[i];
        scalar_t p = param[i];
        if (weight_decay != 0.0) {
            if (decoupled) p *= shrink;
            else g += decay * p;
        }
        const scalar_t m = b1 * exp_avg[i] + (scalar_t(1) - b1) * g;
        const scalar_t v = b2 * exp_avg_sq[i] + (scalar_t(1) - b2) * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        scalar_t second = v;
        if (amsgrad) {
            second = max(max_exp_avg_sq[i], v);
            max_exp_avg_sq[i] = second;
        }
        param[i] = p - step_ * m / (sqrt(second) / correction + eps_);
    }
}
