// Fused optimizer updates over lists of tensors (optimizer.py states the maths; its NumPy code is the
// reference twin). One kernel reads a parameter, its gradient and its state once and writes them once.
//
// Multi-tensor apply (apex's design): one launch updates a chunk of up to MAX_TENSORS tensors. The
// launch's TensorTable travels by value, as a kernel parameter (< 4 KB): the chunk's pointers and
// sizes, and for each block of the grid the tensor and the first element it updates. Nothing is
// copied to the device before a launch, so a captured CUDA graph replays it as recorded. Block b
// updates elements [block_start[b], block_start[b] + elements_per_block) of tensor block_tensor[b]
// (clipped to the tensor's size); optimizer.py sizes elements_per_block so that a chunk needs at most
// MAX_BLOCKS blocks. Each thread takes UNROLL elements per iteration, blockDim.x apart (coalesced),
// loading all of them before computing, so that UNROLL loads per array are in flight.
//
// The learning rate is lr_device[0] when lr_device is not null (a float64 array that a schedule
// updates between CUDA-graph replays), else lr_value; Adam's step count likewise. SGD skips its update
// when found_inf is not null and found_inf[0] != 0 (a loss scaler's overflow flag, left on the device
// so that a captured step decides at each replay, with no host read). Hyper-parameters
// arrive as double and are rounded to scalar_t once, so float32 parameters are updated in float32
// arithmetic, as PyTorch does.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

#define LISTS 5          // param, grad and up to three state arrays per tensor
#define MAX_TENSORS 48   // tensors per launch
#define MAX_BLOCKS 320   // blocks per launch
#define THREADS 512      // threads per block (optimizer.py launches with this many)
#define UNROLL 4         // elements per thread per iteration

// optimizer.py's _TABLE dtype has these fields, in this order, with C's alignment (3720 bytes).
struct TensorTable {
    scalar_t* pointers[LISTS][MAX_TENSORS];  // [list][tensor]; null for a list a kernel does not read
    int sizes[MAX_TENSORS];                  // elements of each tensor
    int block_start[MAX_BLOCKS];             // first element of block b's range in its tensor
    int elements_per_block;
    unsigned char block_tensor[MAX_BLOCKS];  // the tensor (index into the chunk) block b updates
};

// SGD with momentum, PyTorch's rule (lists: param, grad, momentum_buffer). g = ±grad + weight_decay·p;
// b = g on the first step, else momentum·b + (1 − dampening)·g; p −= lr·(g + momentum·b if nesterov
// else b). momentum_buffer is read only when momentum != 0, and not on the first step.
extern "C" __global__ void __launch_bounds__(THREADS)
sgd_update_multi(const TensorTable table, const double* __restrict__ lr_device, const double lr_value,
                 const double momentum, const double dampening, const double weight_decay, const int nesterov,
                 const int maximize, const int first_step, const int* __restrict__ found_inf) {
    if (found_inf && *found_inf) return;  // the gradients overflowed: this step is skipped
    const int t = table.block_tensor[blockIdx.x];
    const int begin = table.block_start[blockIdx.x];
    const int count = min(table.elements_per_block, table.sizes[t] - begin);
    scalar_t* __restrict__ param = table.pointers[0][t] + begin;
    const scalar_t* __restrict__ grad = table.pointers[1][t] + begin;
    scalar_t* __restrict__ buffer = momentum != 0.0 ? table.pointers[2][t] + begin : nullptr;
    const bool read_buffer = buffer && !first_step;

    const scalar_t lr = (scalar_t)(lr_device ? *lr_device : lr_value);
    const scalar_t momentum_ = (scalar_t)momentum, keep = (scalar_t)(1.0 - dampening);
    const scalar_t decay = (scalar_t)weight_decay;
    for (int first = threadIdx.x; first < count; first += UNROLL * blockDim.x) {
        scalar_t p[UNROLL], g[UNROLL], b[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = first + u * blockDim.x;
            p[u] = g[u] = b[u] = 0;
            if (k < count) {
                p[u] = param[k];
                g[u] = grad[k];
                if (read_buffer) b[u] = buffer[k];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = first + u * blockDim.x;
            if (k >= count) break;
            scalar_t step = maximize ? -g[u] : g[u];
            if (weight_decay != 0.0) step += decay * p[u];
            if (buffer) {
                const scalar_t average = first_step ? step : momentum_ * b[u] + keep * step;
                buffer[k] = average;
                step = nesterov ? step + momentum_ * average : average;
            }
            param[k] = p[u] - lr * step;
        }
    }
}

// Adam (decoupled = 0) or AdamW (decoupled = 1), PyTorch's rule (lists: param, grad, exp_avg,
// exp_avg_sq, max_exp_avg_sq; the last read only under AMSGrad). The step count t is step_int[0],
// step_float[0] or step_value, whichever pointer is not null first; the bias corrections
// 1 − β1^t and √(1 − β2^t) are computed here, once per thread, so that t may live on the device.
extern "C" __global__ void __launch_bounds__(THREADS)
adam_update_multi(const TensorTable table, const double* __restrict__ lr_device, const double lr_value,
                  const long long* __restrict__ step_int, const double* __restrict__ step_float,
                  const double step_value, const double beta1, const double beta2, const double eps,
                  const double weight_decay, const int decoupled, const int amsgrad, const int maximize) {
    const int t = table.block_tensor[blockIdx.x];
    const int begin = table.block_start[blockIdx.x];
    const int count = min(table.elements_per_block, table.sizes[t] - begin);
    scalar_t* __restrict__ param = table.pointers[0][t] + begin;
    const scalar_t* __restrict__ grad = table.pointers[1][t] + begin;
    scalar_t* __restrict__ exp_avg = table.pointers[2][t] + begin;
    scalar_t* __restrict__ exp_avg_sq = table.pointers[3][t] + begin;
    scalar_t* __restrict__ max_exp_avg_sq = amsgrad ? table.pointers[4][t] + begin : nullptr;

    const double lr = lr_device ? *lr_device : lr_value;
    const double step = step_int ? (double)*step_int : (step_float ? *step_float : step_value);
    const scalar_t step_size = (scalar_t)(lr / (1.0 - pow(beta1, step)));
    const scalar_t correction2_sqrt = (scalar_t)sqrt(1.0 - pow(beta2, step));
    const scalar_t b1 = (scalar_t)beta1, b2 = (scalar_t)beta2, eps_ = (scalar_t)eps;
    const scalar_t decay = (scalar_t)weight_decay, shrink = (scalar_t)(1.0 - lr * weight_decay);
    for (int first = threadIdx.x; first < count; first += UNROLL * blockDim.x) {
        scalar_t p[UNROLL], g[UNROLL], m[UNROLL], v[UNROLL], v_max[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = first + u * blockDim.x;
            p[u] = g[u] = m[u] = v[u] = v_max[u] = 0;
            if (k < count) {
                p[u] = param[k];
                g[u] = grad[k];
                m[u] = exp_avg[k];
                v[u] = exp_avg_sq[k];
                if (max_exp_avg_sq) v_max[u] = max_exp_avg_sq[k];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = first + u * blockDim.x;
            if (k >= count) break;
            scalar_t gradient = maximize ? -g[u] : g[u];
            scalar_t value = p[u];
            if (weight_decay != 0.0) {
                if (decoupled) value *= shrink;
                else gradient += decay * value;
            }
            const scalar_t average = b1 * m[u] + (scalar_t(1) - b1) * gradient;
            const scalar_t square = b2 * v[u] + (scalar_t(1) - b2) * gradient * gradient;
            exp_avg[k] = average;
            exp_avg_sq[k] = square;
            scalar_t second = square;
            if (max_exp_avg_sq) {
                second = max(v_max[u], square);
                max_exp_avg_sq[k] = second;
            }
            param[k] = value - step_size * average / (sqrt(second) / correction2_sqrt + eps_);
        }
    }
}

// Dynamic loss scaling's unscale (lists: grad): notes in found_inf[0] whether any value of the chunk is inf or
// NaN (it writes 1, never 0: a flag for the whole list, which the caller zeroes), then multiplies every value by
// the factor in place: inv_scale_device[0] when that is not null (a float32 array: a captured step reads the
// scale of its replay), else inv_scale rounded to float, for either dtype (PyTorch's GradScaler multiplies by the
// float32 reciprocal of its float32 scale).
extern "C" __global__ void __launch_bounds__(THREADS)
unscale_gradients_multi(const TensorTable table, const float* __restrict__ inv_scale_device, const double inv_scale,
                        int* __restrict__ found_inf) {
    const int t = table.block_tensor[blockIdx.x];
    const int begin = table.block_start[blockIdx.x];
    const int count = min(table.elements_per_block, table.sizes[t] - begin);
    scalar_t* __restrict__ grad = table.pointers[0][t] + begin;
    const scalar_t factor = (scalar_t)(inv_scale_device ? *inv_scale_device : (float)inv_scale);
    bool not_finite = false;
    for (int k = threadIdx.x; k < count; k += blockDim.x) {
        const scalar_t g = grad[k];
        not_finite |= !isfinite(g);
        grad[k] = g * factor;
    }
    if (not_finite) *found_inf = 1;
}

// Dynamic loss scaling's update, PyTorch's _amp_update_scale_ (one thread; scale and the tracker live on the
// device, so a captured step updates them at each replay): after an overflow (found_inf[0] != 0) the scale is
// multiplied by backoff_factor and the count of clean steps restarts; otherwise the count grows, and when it
// reaches growth_interval the scale is multiplied by growth_factor (kept only if float32 holds the product)
// and the count restarts. The arithmetic is float32's, as PyTorch's scale is a float32 tensor.
extern "C" __global__ void update_loss_scale(float* __restrict__ scale, int* __restrict__ growth_tracker,
                                             const int* __restrict__ found_inf, const double growth_factor,
                                             const double backoff_factor, const int growth_interval) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (*found_inf) {
        *scale = *scale * (float)backoff_factor;
        *growth_tracker = 0;
        return;
    }
    const int clean_steps = *growth_tracker + 1;
    if (clean_steps == growth_interval) {
        const float grown = *scale * (float)growth_factor;
        if (isfinite(grown)) *scale = grown;
        *growth_tracker = 0;
    } else {
        *growth_tracker = clean_steps;
    }
}
