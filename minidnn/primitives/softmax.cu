// Softmax, log-softmax, NLL and fused cross-entropy (softmax.py states the maths; its NumPy code is
// the reference twin of every kernel here).
//
// Layout. A softmax input of any shape is seen as a contiguous (outer, C, inner) array, C the
// softmax axis: element (o, c, i) is at (o·C + c)·inner + i. The losses work on (N, C) rows:
// logits, log_probs and grad are contiguous (N, C), target is int64 (N,), weight (C,) or a null
// pointer (no class weights), row_loss and row_weight (N,) are per-row scratch, grad_loss is the
// loss's shape (a 0-d array for "mean"/"sum", (N,) for "none").
//
// Thread mapping.
// * Last axis (inner = 1) and the cross-entropy forward: one warp per row (blockDim.x a multiple of
//   32, warps loop over rows grid-stride). Lane l reads columns l, l + 32, ..., so a warp reads 32
//   consecutive values per step; the row's max and sums are combined by an xor-butterfly of warp
//   shuffles, after which every lane holds the same bits (a + b = b + a exactly), so no lane needs
//   a broadcast and the order is fixed: deterministic.
// * Other axes (inner > 1): one thread per (o, i), looping over c with stride inner; consecutive
//   threads take consecutive i, so each step of a warp reads consecutive addresses.
// * Loss reductions and the backward denominators: one block (a tiny second launch), each thread
//   summing a fixed strided subset, then a fixed warp-shuffle / shared-memory tree. No atomics.
// * Loss backward passes: one thread per element of grad (N·C), grid-stride; the per-row values
//   (target, its weight, the scale) are recomputed per element from cached loads.
//
// Sums are accumulated in double (acc_t) for float inputs too, in registers only. Element values
// (exp, the log-probabilities, products) are computed in scalar_t as the NumPy twin does.
//
// Targets are not range-checked on the GPU (that would need a host synchronisation): a target
// outside [0, C) that is not ignore_index never indexes memory; it acts as a class of weight NaN
// and log-probability NaN, so its row's loss and gradient are NaN (softmax.py's docstring).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;
typedef double acc_t;

#define FULL_MASK 0xffffffffu
#define WARP_SIZE 32

// Reductions of the losses (softmax.py passes the same codes).
#define REDUCTION_NONE 0
#define REDUCTION_SUM 1
#define REDUCTION_MEAN 2

__device__ __forceinline__ scalar_t quiet_nan() {
    return scalar_t(__longlong_as_double(0x7ff8000000000000LL));
}
__device__ __forceinline__ scalar_t minus_infinity() {
    return scalar_t(-__longlong_as_double(0x7ff0000000000000LL));
}

// max that propagates NaN, as NumPy's max does (fmax would drop it).
__device__ __forceinline__ scalar_t max_nan(scalar_t a, scalar_t b) {
    return (b > a || isnan(b)) ? b : a;
}

// Butterfly reductions over the 32 lanes of a warp (all lanes must call them). After the sum every
// lane holds the same bits; the max broadcasts lane 0's result, because max(−0, +0) depends on the
// argument order and the lanes would otherwise disagree on the sign of a zero.
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}
__device__ __forceinline__ scalar_t warp_max(scalar_t v) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v = max_nan(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return __shfl_sync(FULL_MASK, v, 0);
}

// Sum over a block (all threads must call it; blockDim.x a multiple of 32, at most 1024). The result
// is valid in warp 0. The first barrier lets a previous call's warp 0 finish reading `partial`.
__device__ __forceinline__ acc_t block_sum(acc_t v) {
    __shared__ acc_t partial[WARP_SIZE];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) v = warp_sum(lane < static_cast<int>(blockDim.x / WARP_SIZE) ? partial[lane] : acc_t(0));
    return v;
}

// The weight of a row with target t, as softmax.py's _row_weights: 0 for ignore_index, w[t] (1
// without weights) for a class, NaN for anything else (never read out of bounds).
__device__ __forceinline__ scalar_t target_weight(long long t, const scalar_t* __restrict__ weight, int C,
                                                  long long ignore_index) {
    if (t == ignore_index) return scalar_t(0);
    if (t < 0 || t >= C) return quiet_nan();
    return weight != nullptr ? weight[t] : scalar_t(1);
}

// Warps of this block, and the first row of this warp; rows advance by gridDim.x · warps.
#define FOR_EACH_ROW(row, rows)                                                                       \
    for (int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE; row < (rows); \
         row += gridDim.x * (blockDim.x / WARP_SIZE))

#define FOR_EACH_INDEX(i, count) \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (count); i += blockDim.x * gridDim.x)

// ------------------------------------------------------------------------------------------------
// Softmax and log-softmax
// ------------------------------------------------------------------------------------------------

// One warp per row of x (rows, C), last axis. softmax: y = e^(x − max) / Σ e^(x − max);
// log-softmax: y = (x − max) − log Σ e^(x − max). Three passes over the row (max, sum, write);
// the second and third read it from the caches.
extern "C" __global__ void softmax_forward_rows(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                const int rows, const int C, const int log_softmax) {
    const int lane = threadIdx.x % WARP_SIZE;
    FOR_EACH_ROW(row, rows) {
        const scalar_t* __restrict__ xr = x + row * C;
        scalar_t* __restrict__ yr = y + row * C;
        scalar_t top = minus_infinity();
        for (int c = lane; c < C; c += WARP_SIZE) top = max_nan(top, xr[c]);
        top = warp_max(top);
        acc_t total = 0;
        for (int c = lane; c < C; c += WARP_SIZE) total += exp(xr[c] - top);
        total = warp_sum(total);
        if (log_softmax) {
            const scalar_t log_total = scalar_t(log(total));
            for (int c = lane; c < C; c += WARP_SIZE) yr[c] = (xr[c] - top) - log_total;
        } else {
            const scalar_t denominator = scalar_t(total);
            for (int c = lane; c < C; c += WARP_SIZE) yr[c] = exp(xr[c] - top) / denominator;
        }
    }
}

// One warp per row, last axis. softmax: dx = y · (dy − Σ dy·y); log-softmax: dx = dy − e^y · Σ dy.
extern "C" __global__ void softmax_backward_rows(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                                 scalar_t* __restrict__ dx, const int rows, const int C,
                                                 const int log_softmax) {
    const int lane = threadIdx.x % WARP_SIZE;
    FOR_EACH_ROW(row, rows) {
        const int offset = row * C;
        acc_t total = 0;
        for (int c = lane; c < C; c += WARP_SIZE) {
            total += log_softmax ? acc_t(dy[offset + c]) : acc_t(dy[offset + c] * y[offset + c]);
        }
        const scalar_t sum = scalar_t(warp_sum(total));
        for (int c = lane; c < C; c += WARP_SIZE) {
            const int j = offset + c;
            dx[j] = log_softmax ? dy[j] - exp(y[j]) * sum : y[j] * (dy[j] - sum);
        }
    }
}

// One thread per (o, i) of x (outer, C, inner), inner > 1: the same passes as softmax_forward_rows
// along c, at stride inner.
extern "C" __global__ void softmax_forward_strided(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                   const int outer, const int C, const int inner,
                                                   const int log_softmax) {
    FOR_EACH_INDEX(t, outer * inner) {
        const int o = t / inner;
        const int base = o * C * inner + (t - o * inner);  // (o·C + 0)·inner + i
        const scalar_t* __restrict__ xs = x + base;
        scalar_t* __restrict__ ys = y + base;
        scalar_t top = minus_infinity();
        for (int c = 0; c < C; ++c) top = max_nan(top, xs[c * inner]);
        acc_t total = 0;
        for (int c = 0; c < C; ++c) total += exp(xs[c * inner] - top);
        if (log_softmax) {
            const scalar_t log_total = scalar_t(log(total));
            for (int c = 0; c < C; ++c) ys[c * inner] = (xs[c * inner] - top) - log_total;
        } else {
            const scalar_t denominator = scalar_t(total);
            for (int c = 0; c < C; ++c) ys[c * inner] = exp(xs[c * inner] - top) / denominator;
        }
    }
}

// One thread per (o, i), inner > 1: softmax_backward_rows along c at stride inner.
extern "C" __global__ void softmax_backward_strided(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ y,
                                                    scalar_t* __restrict__ dx, const int outer, const int C,
                                                    const int inner, const int log_softmax) {
    FOR_EACH_INDEX(t, outer * inner) {
        const int o = t / inner;
        const int base = o * C * inner + (t - o * inner);
        acc_t total = 0;
        for (int c = 0; c < C; ++c) {
            const int j = base + c * inner;
            total += log_softmax ? acc_t(dy[j]) : acc_t(dy[j] * y[j]);
        }
        const scalar_t sum = scalar_t(total);
        for (int c = 0; c < C; ++c) {
            const int j = base + c * inner;
            dx[j] = log_softmax ? dy[j] - exp(y[j]) * sum : y[j] * (dy[j] - sum);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Losses: per-row forward kernels, then loss_reduce
// ------------------------------------------------------------------------------------------------

// Fused cross-entropy forward, one warp per row: log_probs = log-softmax(logits) as in
// softmax_forward_rows, and in the same pass the row's loss and weight (softmax.py's
// cross_entropy_forward): row_loss = w[t]·(−logp[t]), and with label smoothing ε > 0
// (1 − ε)·row_loss + (ε/C)·(−Σ_c w[c]·logp[c]); 0 on ignored rows. Without smoothing the uniform
// term is skipped, not multiplied by 0 (a logp of −inf would make it NaN).
extern "C" __global__ void cross_entropy_forward_rows(
        const scalar_t* __restrict__ logits, const long long* __restrict__ target, const scalar_t* __restrict__ weight,
        scalar_t* __restrict__ log_probs, scalar_t* __restrict__ row_loss, scalar_t* __restrict__ row_weight,
        const int rows, const int C, const long long ignore_index, const double epsilon) {
    // Rounded once to scalar_t, as NumPy does with a Python float times a float32 array.
    const scalar_t on_target = scalar_t(1.0 - epsilon);
    const scalar_t uniform = scalar_t(epsilon / C);
    const bool smoothing = epsilon > 0;
    const int lane = threadIdx.x % WARP_SIZE;
    FOR_EACH_ROW(row, rows) {
        const scalar_t* __restrict__ xr = logits + row * C;
        scalar_t* __restrict__ lr = log_probs + row * C;
        scalar_t top = minus_infinity();
        for (int c = lane; c < C; c += WARP_SIZE) top = max_nan(top, xr[c]);
        top = warp_max(top);
        acc_t total = 0;
        for (int c = lane; c < C; c += WARP_SIZE) total += exp(xr[c] - top);
        const scalar_t log_total = scalar_t(log(warp_sum(total)));
        acc_t weighted = 0;  // Σ_c w[c]·logp[c], for the smoothing term
        for (int c = lane; c < C; c += WARP_SIZE) {
            const scalar_t logp = (xr[c] - top) - log_total;
            lr[c] = logp;
            if (smoothing) weighted += acc_t(weight != nullptr ? logp * weight[c] : logp);
        }
        weighted = warp_sum(weighted);  // every lane calls it: the shuffles need the full warp
        if (lane == 0) {
            const long long t = target[row];
            const scalar_t w = target_weight(t, weight, C, ignore_index);
            scalar_t loss = w;  // 0 when ignored, NaN for an out-of-range target
            if (t != ignore_index && t >= 0 && t < C) {
                // logp[t] recomputed from the logit with the very expression above (same bits):
                // another lane wrote lr[t], and reading it back would need a __syncwarp.
                loss = w * -((xr[t] - top) - log_total);
                if (smoothing) loss = on_target * loss + uniform * -scalar_t(weighted);
            }
            row_loss[row] = loss;
            row_weight[row] = w;
        }
    }
}

// NLL forward, one thread per row: row_loss = w[t]·(−log_probs[t]), 0 on ignored rows.
extern "C" __global__ void nll_loss_forward_rows(const scalar_t* __restrict__ log_probs,
                                                 const long long* __restrict__ target,
                                                 const scalar_t* __restrict__ weight, scalar_t* __restrict__ row_loss,
                                                 scalar_t* __restrict__ row_weight, const int rows, const int C,
                                                 const long long ignore_index) {
    FOR_EACH_INDEX(row, rows) {
        const long long t = target[row];
        const scalar_t w = target_weight(t, weight, C, ignore_index);
        row_loss[row] = (t != ignore_index && t >= 0 && t < C) ? w * -log_probs[row * C + static_cast<int>(t)] : w;
        row_weight[row] = w;
    }
}

// One block: out[0] = Σ row_loss (REDUCTION_SUM) or Σ row_loss / Σ row_weight (REDUCTION_MEAN,
// NaN when the denominator is 0, as PyTorch's mean over no rows). Both sums in double, in a fixed
// order; the quotient is rounded once.
extern "C" __global__ void loss_reduce(const scalar_t* __restrict__ row_loss, const scalar_t* __restrict__ row_weight,
                                       scalar_t* __restrict__ out, const int rows, const int reduction) {
    acc_t loss = 0, weight = 0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        loss += row_loss[i];
        if (reduction == REDUCTION_MEAN) weight += row_weight[i];
    }
    loss = block_sum(loss);
    weight = block_sum(weight);
    if (threadIdx.x == 0) {
        if (reduction == REDUCTION_MEAN) {
            out[0] = weight != 0 ? scalar_t(loss / weight) : quiet_nan();
        } else {
            out[0] = scalar_t(loss);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Losses: backward (a denominators pre-pass when needed, then one element-wise kernel)
// ------------------------------------------------------------------------------------------------

// One block: sums[0] = Σ_i w[t_i] over the rows (the mean's denominator), sums[1] = Σ_c w[c] (the
// smoothed target's row total with weights); each rounded once to scalar_t, as the twin's sums are
// of its dtype.
extern "C" __global__ void loss_denominators(const long long* __restrict__ target, const scalar_t* __restrict__ weight,
                                             scalar_t* __restrict__ sums, const int rows, const int C,
                                             const long long ignore_index) {
    acc_t rows_total = 0, classes_total = 0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        rows_total += target_weight(target[i], weight, C, ignore_index);
    }
    if (weight != nullptr) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) classes_total += weight[c];
    }
    rows_total = block_sum(rows_total);
    classes_total = block_sum(classes_total);
    if (threadIdx.x == 0) {
        sums[0] = scalar_t(rows_total);
        sums[1] = scalar_t(classes_total);
    }
}

// ∂loss/∂(row loss i) times grad_loss (softmax.py's _row_scale): grad_loss[i] ("none"), grad_loss
// ("sum") or grad_loss / Σ_i w[t_i] ("mean", NaN over a zero denominator); 0 on ignored rows.
__device__ __forceinline__ scalar_t row_scale(const scalar_t* __restrict__ grad_loss,
                                              const scalar_t* __restrict__ sums, int row, bool kept, int reduction) {
    if (!kept) return scalar_t(0);
    if (reduction == REDUCTION_NONE) return grad_loss[row];
    if (reduction == REDUCTION_SUM) return grad_loss[0];
    return sums[0] != scalar_t(0) ? grad_loss[0] / sums[0] : quiet_nan();
}

// grad[i, c] = scale_i · (e^logp[i, c] · Q_i − q[i, c]), the twin's fused formula: q[i, c] =
// (1 − ε)·w[t_i]·[c = t_i] + (ε/C)·w[c] is the weighted, smoothed one-hot target, Q_i its row total
// (1 − ε)·w[t_i] + ε (without weights) or + (ε/C)·Σ_c w[c]. `sums` comes from loss_denominators
// and is read only when needed: for the mean (sums[0]) and with weights and ε > 0 (sums[1]);
// without smoothing the weights' total is not needed (the twin adds 0·Σ_c w[c]: the same for
// finite weights).
extern "C" __global__ void cross_entropy_backward(
        const scalar_t* __restrict__ grad_loss, const scalar_t* __restrict__ log_probs,
        const long long* __restrict__ target, const scalar_t* __restrict__ weight, const scalar_t* __restrict__ sums,
        scalar_t* __restrict__ grad, const int rows, const int C, const long long ignore_index, const double epsilon,
        const int reduction) {
    const scalar_t on_coefficient = scalar_t(1.0 - epsilon);
    const scalar_t uniform_coefficient = scalar_t(epsilon / C);
    scalar_t smoothing_total = 0;  // the smoothing part of Q_i, the same for every row
    if (epsilon > 0) smoothing_total = weight != nullptr ? uniform_coefficient * sums[1] : scalar_t(epsilon);
    FOR_EACH_INDEX(e, rows * C) {
        const int row = e / C;
        const int c = e - row * C;
        const long long t = target[row];
        const bool kept = t != ignore_index;
        const scalar_t on_target = on_coefficient * target_weight(t, weight, C, ignore_index);
        const scalar_t row_total = on_target + smoothing_total;
        const scalar_t uniform = weight != nullptr ? uniform_coefficient * weight[c] : uniform_coefficient;
        // An ignored row's placeholder target is class 0 in the twin; its on_target is 0 anyway.
        const scalar_t smoothed = (c == (kept ? t : 0) ? on_target : scalar_t(0)) + uniform;
        grad[e] = row_scale(grad_loss, sums, row, kept, reduction) * (exp(log_probs[e]) * row_total - smoothed);
    }
}

// ∂loss/∂log_probs: −w[t_i]·scale_i at [i, t_i], 0 elsewhere (an ignored row writes its −0·0 onto
// its placeholder class 0, as the twin); a row with an out-of-range target is NaN throughout.
extern "C" __global__ void nll_loss_backward(const scalar_t* __restrict__ grad_loss,
                                             const long long* __restrict__ target, const scalar_t* __restrict__ weight,
                                             const scalar_t* __restrict__ sums, scalar_t* __restrict__ grad,
                                             const int rows, const int C, const long long ignore_index,
                                             const int reduction) {
    FOR_EACH_INDEX(e, rows * C) {
        const int row = e / C;
        const int c = e - row * C;
        const long long t = target[row];
        const bool kept = t != ignore_index;
        scalar_t value = 0;
        if (kept && (t < 0 || t >= C)) {
            value = quiet_nan();
        } else if (c == (kept ? t : 0)) {
            value = -target_weight(t, weight, C, ignore_index) * row_scale(grad_loss, sums, row, kept, reduction);
        }
        grad[e] = value;
    }
}
