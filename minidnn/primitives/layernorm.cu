// Layer normalisation, forward and backward (layernorm.py states the maths; its NumPy code is the
// reference twin of every kernel here).
//
// Layout: x, dy, y, dx are contiguous (M, D) rows; weight and bias D values or null (no scale, no
// shift); mean and invstd M values of scalar_t.
//
// Thread mapping: the statistics, the normalisation and dx take one 256-thread block per row (a
// grid-stride loop over rows), each thread striding over the row's D values, so that a warp reads
// consecutive addresses; the row sums go through warp shuffles and shared memory in a fixed order, in
// double. dweight and dbias sum over rows: a block takes 32 columns × 8 row lanes of one split of the
// rows, writes its partial column sums, and a second kernel adds the splits in order: no atomics, so
// every result is the same from run to run.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

constexpr int THREADS = 256;  // layernorm.py launches every kernel with _cuda.THREADS = 256 threads
constexpr int WARPS = THREADS / 32;
constexpr int COLUMNS = 32;   // layer_norm_backward_parameters: columns per block (COLUMNS_PER_BLOCK)
constexpr int ROW_LANES = THREADS / COLUMNS;

// The sum of every thread's v over the block, returned to all threads. shared: WARPS + 1 doubles.
__device__ double block_sum(double v, double* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < WARPS ? shared[lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (lane == 0) shared[WARPS] = v;
    }
    __syncthreads();
    const double total = shared[WARPS];
    __syncthreads();  // every thread has read the total before the next call overwrites it
    return total;
}

// mean, invstd and y for each row: two passes over the row (mean, then squared deviations), a third writes y.
extern "C" __global__ void layer_norm_forward(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                                              const scalar_t* __restrict__ bias, scalar_t* __restrict__ y,
                                              scalar_t* __restrict__ mean_out, scalar_t* __restrict__ invstd_out,
                                              const int rows, const int D, const double eps) {
    __shared__ double shared[WARPS + 1];
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const scalar_t* xr = x + (size_t)row * D;
        scalar_t* yr = y + (size_t)row * D;
        double sum = 0.0;
        for (int d = threadIdx.x; d < D; d += blockDim.x) sum += double(xr[d]);
        const scalar_t mean = scalar_t(block_sum(sum, shared) / D);
        double squares = 0.0;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            const scalar_t c = xr[d] - mean;
            squares += double(c * c);
        }
        const scalar_t invstd = scalar_t(1.0 / sqrt(block_sum(squares, shared) / D + eps));
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            scalar_t v = (xr[d] - mean) * invstd;
            if (weight) v *= weight[d];
            if (bias) v += bias[d];
            yr[d] = v;
        }
        if (threadIdx.x == 0) {
            mean_out[row] = mean;
            invstd_out[row] = invstd;
        }
    }
}

// dx = invstd·(g − Σg/D − x̂·Σg·x̂/D) per row, with x̂ = (x − mean)·invstd and g = dy·weight.
extern "C" __global__ void layer_norm_backward_data(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                                    const scalar_t* __restrict__ weight,
                                                    const scalar_t* __restrict__ mean,
                                                    const scalar_t* __restrict__ invstd, scalar_t* __restrict__ dx,
                                                    const int rows, const int D) {
    __shared__ double shared[WARPS + 1];
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const size_t base = (size_t)row * D;
        const scalar_t m = mean[row], s = invstd[row];
        double sum_g = 0.0, sum_gx = 0.0;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            const scalar_t g = weight ? dy[base + d] * weight[d] : dy[base + d];
            sum_g += double(g);
            sum_gx += double(g * ((x[base + d] - m) * s));
        }
        const scalar_t mean_g = scalar_t(block_sum(sum_g, shared) / D);
        const scalar_t mean_gx = scalar_t(block_sum(sum_gx, shared) / D);
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            const scalar_t g = weight ? dy[base + d] * weight[d] : dy[base + d];
            dx[base + d] = (g - mean_g - (x[base + d] - m) * s * mean_gx) * s;
        }
    }
}

// partial[0][split][d] = Σ dy·x̂ and partial[1][split][d] = Σ dy over the rows [split·per, (split + 1)·per).
// Grid (ceil(D / 32), splits); thread t takes column blockIdx.x·32 + t % 32 and every 8th row from t / 32.
extern "C" __global__ void layer_norm_backward_parameters(const scalar_t* __restrict__ dy,
                                                          const scalar_t* __restrict__ x,
                                                          const scalar_t* __restrict__ mean,
                                                          const scalar_t* __restrict__ invstd,
                                                          double* __restrict__ partial, const int rows, const int D,
                                                          const int splits, const int per) {
    __shared__ double sums[2][ROW_LANES][COLUMNS + 1];
    const int column_in_block = threadIdx.x % COLUMNS, lane = threadIdx.x / COLUMNS;
    const int column = blockIdx.x * COLUMNS + column_in_block, split = blockIdx.y;
    const int begin = split * per, end = min(rows, begin + per);
    double sum_gx = 0.0, sum_g = 0.0;
    if (column < D) {
        for (int row = begin + lane; row < end; row += ROW_LANES) {
            const size_t at = (size_t)row * D + column;
            const scalar_t g = dy[at];
            sum_gx += double(g * ((x[at] - mean[row]) * invstd[row]));
            sum_g += double(g);
        }
    }
    sums[0][lane][column_in_block] = sum_gx;
    sums[1][lane][column_in_block] = sum_g;
    __syncthreads();
    if (lane < 2 && column < D) {  // lane 0 finishes Σ dy·x̂, lane 1 Σ dy, each over the 8 lanes in order
        double total = 0.0;
        for (int r = 0; r < ROW_LANES; ++r) total += sums[lane][r][column_in_block];
        partial[((size_t)lane * splits + split) * D + column] = total;
    }
}

// dweight[d], dbias[d]: the splits' partial sums added in split order.
extern "C" __global__ void layer_norm_finish_parameters(const double* __restrict__ partial,
                                                        scalar_t* __restrict__ dweight, scalar_t* __restrict__ dbias,
                                                        const int D, const int splits) {
    for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < D; d += blockDim.x * gridDim.x) {
        double sum_gx = 0.0, sum_g = 0.0;
        for (int split = 0; split < splits; ++split) {
            sum_gx += partial[(size_t)split * D + d];
            sum_g += partial[((size_t)splits + split) * D + d];
        }
        dweight[d] = scalar_t(sum_gx);
        dbias[d] = scalar_t(sum_g);
    }
}
