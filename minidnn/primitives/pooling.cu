// Max, average and adaptive average pooling over the H and W axes of NCHW (see pooling.py, whose
// NumPy code is the reference twin of every kernel here; Caffe's pooling_layer.cu design).
//
// Layout: x and dx are (N, C, H, W), y and dy are (N, C, P, Q), indices (int64) or taps (uint8) are (N, C, P, Q),
// all contiguous (max pooling's *_last kernels: all channels-last, see Max pooling). Output p, q reads the window of input rows p·stride_h − pad_h + r·dilation_h,
// r < kernel_h (columns alike); pixels outside [0, H) × [0, W) are padding or ceil-mode overhang.
//
// Thread mapping: forward kernels run one thread per output element, backward kernels one thread
// per input element, with w (or q) fastest, so consecutive threads of a warp read and write
// consecutive addresses. The backward passes are gathers: a thread finds the outputs whose windows
// can cover its pixel and sums their gradients in a fixed order (p, then q), so no two threads
// write one address (no atomics) and the result is deterministic.
//
// Max pooling's backward kernels give each thread one input position (h, w) of a plane (blockIdx.x and
// threadIdx.x) and loop over the N·C planes (from blockIdx.y, gridDim.y apart). The outputs that may have
// chosen its pixel, and the tap each would have chosen it by, are the same in every plane: worked out once,
// their divisions (a few dozen instructions each on a runtime divisor) leave the per-element loop, where the
// gather ran at many times its memory time. The forward kernels stay one thread per output: the same plane
// loop made them slower, and so did loading a fixed 3 × 3 window's taps before comparing them, on some layers
// (docs/gpu.md, Max pooling).
//
// Index arithmetic stays in int: pooling.py refuses arrays of 2^31 elements or more and windows
// with size + 2·pad + stride + span >= 2^31 on an axis, and every intermediate below is bounded by
// an array size or by that sum (the adaptive kernels and the divisor say where they need more).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// x, y, dy and dx: scalar_t, or in the half build (HALF = 1 for float16, 2 for bfloat16, with SCALAR float)
// 16-bit words, read as their exact float values and written rounded once (elements.cuh). A maximum is one
// of its window's values, so it comes back exactly; a sum (an average, a backward) is float's, rounded once:
// the float kernels' results on the widened arrays, bit for bit. max_pool_backward_serial, which adds into
// dx in place, keeps scalar_t (pooling.py widens for it).
#include "elements.cuh"

// Shapes and window parameters (the NumPy dtype _POOL_SHAPE in pooling.py: sixteen ints, in this
// order). The adaptive kernels read only N, C, H, W, P, Q; the average-pool kernels ignore the
// dilation (always 1); divisor_override is 0 when not given (0 itself is refused in Python).
struct PoolShape {
    int N, C, H, W, P, Q;
    int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
    int count_include_pad, divisor_override;
};

// Taps [first, last) of a window starting at `start` whose coordinates start + t·dilation fall in
// [0, size). Written without adding dilation to anything, so a huge dilation cannot overflow.
// pooling.py guarantees start < size and first < last (a window without an input pixel is a
// ValueError before the launch).
__device__ __forceinline__ int first_tap(int start, int dilation) {
    return start < 0 ? (-start - 1) / dilation + 1 : 0;  // ceil(−start / dilation)
}
__device__ __forceinline__ int last_tap(int start, int size, int kernel, int dilation) {
    return min(kernel, (size - 1 - start) / dilation + 1);  // taps with start + t·dilation <= size − 1
}

// Outputs [begin, end) along one axis whose windows [o·stride − pad, o·stride − pad + span) can
// cover input coordinate `i` (span = dilation·(kernel − 1) + 1). With dilation the windows have
// holes, so this is a superset: callers test the taps exactly (max pool: by the argmax index).
__device__ __forceinline__ int first_window(int i, int stride, int pad, int span) {
    return i + pad < span ? 0 : (i + pad - span) / stride + 1;  // smallest o with o·stride > i + pad − span
}
__device__ __forceinline__ int last_window(int i, int stride, int pad, int out) {
    return min((i + pad) / stride + 1, out);  // largest o with o·stride <= i + pad, plus one
}

// ------------------------------------------------------------------------------------------------
// Max pooling
// ------------------------------------------------------------------------------------------------

// Channels-last arrays (the kernels named *_last, pooling.py's layout rule): x, y, dy, dx and the record are
// (N, H, W, C) buffers of (N, C, H, W) views. The same kernels with the roles of plane and position moved: a
// forward thread's output i counts channels fastest, so consecutive threads read consecutive channels of one
// pixel; a backward thread takes one (h, w, c) of an image, position (h·W + w)·C + c, and loops over the N
// images (the planes of that layout), its candidates worked out once as in the plane loop.

// Output i (an index in y's memory order): its (p, q), and where its (n, c) starts in x, whose pixel (h, w)
// then lies at x[start + (h·W + w)·step].
template <bool LAST>
__device__ __forceinline__ void output_place(const PoolShape& s, const int i, int& p, int& q, int& start, int& step) {
    const int pixel = LAST ? i / s.C : i;  // (n·P + p)·Q + q
    q = pixel % s.Q;
    p = (pixel / s.Q) % s.P;
    step = LAST ? s.C : 1;
    start = LAST ? pixel / (s.Q * s.P) * s.H * s.W * s.C + i % s.C : pixel / (s.Q * s.P) * s.H * s.W;
}

// y = max over the window's input pixels, indices = its flat position h·W + w in the (n, c) plane.
// Same rule as the NumPy twin: only a strictly greater value or a NaN replaces the running maximum,
// so ties keep the first maximum in row-major window order, the last NaN wins, padding is never
// read, and a window of −inf pixels points at its first input pixel. Starting from that first
// pixel (instead of −inf) gives the same result: re-visiting it changes nothing.
// The maximum of output i's window, its (p, q), and where the maximum is: (row, column) of the winning tap.
template <bool LAST>
__device__ __forceinline__ scalar_t window_max(const elem_t* __restrict__ x, const PoolShape& s, const int i,
                                              int& p, int& q, int& best_r, int& best_c) {
    int start, step;
    output_place<LAST>(s, i, p, q, start, step);
    const int hstart = p * s.stride_h - s.pad_h;
    const int wstart = q * s.stride_w - s.pad_w;
    const int r0 = first_tap(hstart, s.dilation_h), r1 = last_tap(hstart, s.H, s.kernel_h, s.dilation_h);
    const int c0 = first_tap(wstart, s.dilation_w), c1 = last_tap(wstart, s.W, s.kernel_w, s.dilation_w);
    const elem_t* __restrict__ xs = x + start;
    best_r = r0;
    best_c = c0;
    scalar_t best = element_value(xs[((hstart + r0 * s.dilation_h) * s.W + (wstart + c0 * s.dilation_w)) * step]);
    for (int r = r0; r < r1; ++r) {
        const int row = (hstart + r * s.dilation_h) * s.W;
        for (int c = c0; c < c1; ++c) {
            const scalar_t v = element_value(xs[(row + wstart + c * s.dilation_w) * step]);
            if (v > best || isnan(v)) {
                best = v;
                best_r = r;
                best_c = c;
            }
        }
    }
    return best;
}

// y and PyTorch's indices: the flat position h·W + w of each maximum in its plane (return_indices).
template <bool LAST>
__device__ __forceinline__ void max_pool_forward_body(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                                      long long* __restrict__ indices, const PoolShape& s) {
    const int total = s.N * s.C * s.P * s.Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        int p, q, r, c;
        y[i] = element_of(window_max<LAST>(x, s, i, p, q, r, c));
        indices[i] = (p * s.stride_h - s.pad_h + r * s.dilation_h) * s.W + (q * s.stride_w - s.pad_w + c * s.dilation_w);
    }
}

// y and the compact record the layer keeps for its backward: the winning tap r·kernel_w + c of each
// window, one byte (kernel_h·kernel_w <= 256): an eighth of int64 indices' memory.
template <bool LAST>
__device__ __forceinline__ void max_pool_forward_taps_body(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                                           unsigned char* __restrict__ taps, const PoolShape& s) {
    const int total = s.N * s.C * s.P * s.Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        int p, q, r, c;
        y[i] = element_of(window_max<LAST>(x, s, i, p, q, r, c));
        taps[i] = (unsigned char)(r * s.kernel_w + c);
    }
}

// Backward: the thread's input position in a plane of dx (blockIdx.x and threadIdx.x), its pixel (h, w) and
// channel, and where a plane's elements lie (see the layouts above).
template <bool LAST>
struct BackwardPlace {
    int position, positions, planes, h, w, channel, step;
    __device__ __forceinline__ explicit BackwardPlace(const PoolShape& s)
        : position(blockIdx.x * blockDim.x + threadIdx.x), positions(LAST ? s.H * s.W * s.C : s.H * s.W),
          planes(LAST ? s.N : s.N * s.C), channel(LAST ? position % s.C : 0), step(LAST ? s.C : 1) {
        const int pixel = LAST ? position / s.C : position;
        h = pixel / s.W;
        w = pixel % s.W;
    }
    __device__ __forceinline__ bool inside() const { return position < positions; }
    // Output (p, q)'s place in a plane of dy (and of the record), and this thread's place in plane `plane` of dx.
    __device__ __forceinline__ int output(const PoolShape& s, const int p, const int q) const {
        return (p * s.Q + q) * step + channel;
    }
    __device__ __forceinline__ int input(const int plane) const { return plane * positions + position; }
};

// The outputs [p0, p1) × [q0, q1) whose windows may cover input pixel (h, w): a superset where the windows
// have holes (dilation); the callers test each by its record of the winning pixel.
struct Candidates {
    int p0, p1, q0, q1;
    __device__ __forceinline__ Candidates(const PoolShape& s, const int h, const int w)
        : p0(first_window(h, s.stride_h, s.pad_h, s.dilation_h * (s.kernel_h - 1) + 1)),
          p1(last_window(h, s.stride_h, s.pad_h, s.P)),
          q0(first_window(w, s.stride_w, s.pad_w, s.dilation_w * (s.kernel_w - 1) + 1)),
          q1(last_window(w, s.stride_w, s.pad_w, s.Q)) {}
};

// dy[o] as the backward kernels read it: one array, or (the *_sum kernels, PARTS) the two parts of the pooled
// output's gradient where it fed two operations (ResNet's stem pooling feeds the first block's convolution and its
// shortcut), added in scalar_t as the sum's own array would hold them. So one pass reads both parts where autograd's
// sum took a pass of its own over three arrays. The float builds only: in the half builds the gather of two parts
// was slower than the packed sum and the one-gradient gather (pooling.py).
template <bool PARTS>
struct OutputGradient {
    const elem_t* __restrict__ dy;
    const elem_t* __restrict__ dy_other;  // read only with PARTS
    __device__ __forceinline__ scalar_t operator[](const int o) const {
        return PARTS ? element_value(dy[o]) + element_value(dy_other[o]) : element_value(dy[o]);
    }
    __device__ __forceinline__ OutputGradient from(const int offset) const {  // the entries from `offset` on
        return {dy + offset, PARTS ? dy_other + offset : dy_other};
    }
};

// dx[h, w] = Σ dy[p, q] over the outputs whose index is h·W + w, in the order p, then q. An index that no
// candidate window holds (a corrupt or foreign indices array) is simply never matched: the GPU skips the
// range check that would need a host sync.
template <bool LAST, bool PARTS>
__device__ __forceinline__ void max_pool_backward_body(const OutputGradient<PARTS> dy,
                                                       const long long* __restrict__ indices,
                                                       elem_t* __restrict__ dx, const PoolShape& s) {
    const BackwardPlace<LAST> place(s);
    if (!place.inside()) return;
    const Candidates candidates(s, place.h, place.w);
    const int pixel = place.h * s.W + place.w;
    for (int plane = blockIdx.y; plane < place.planes; plane += gridDim.y) {
        const int offset = plane * s.P * s.Q * place.step;
        scalar_t sum = 0;
        for (int p = candidates.p0; p < candidates.p1; ++p) {
            for (int q = candidates.q0; q < candidates.q1; ++q) {
                const int o = offset + place.output(s, p, q);
                if (indices[o] == pixel) sum += dy[o];
            }
        }
        dx[place.input(plane)] = element_of(sum);
    }
}

// The same gather from the compact record: output (p, q) chose this pixel when its winning tap (r, c) lands
// on it, i.e. h = p·stride_h − pad_h + r·dilation_h (and w alike) with r·kernel_w + c equal to the stored tap.
// Each candidate's tap is the same in every plane; with dilation 1 it takes no division to find.
//
// Without dilation a pixel has at most ⌈kernel / stride⌉ candidate outputs along each axis (2 for ResNet's and
// CaffeNet's 3 × 3 windows of stride 2): for up to 3 of them, a fixed grid of candidates, each one's tap loaded
// first and its dy only where the tap chose the pixel, so that a thread waits for memory twice per plane rather
// than twice per candidate; the sums in the same order.
template <int M, bool LAST, bool PARTS>
__device__ __forceinline__ void fixed_candidates_backward(const OutputGradient<PARTS> dy,
                                                          const unsigned char* __restrict__ taps,
                                                          elem_t* __restrict__ dx, const PoolShape& s,
                                                          const BackwardPlace<LAST>& place,
                                                          const Candidates& candidates) {
    int tap[M][M];  // the tap by which candidate (p0 + i, q0 + j) would have chosen (h, w); -1 if none
    int at[M][M];   // its place in a plane
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < M; ++j) {
            const int p = candidates.p0 + i, q = candidates.q0 + j;
            const bool valid = p < candidates.p1 && q < candidates.q1;
            tap[i][j] = valid ? (place.h - (p * s.stride_h - s.pad_h)) * s.kernel_w + (place.w - (q * s.stride_w - s.pad_w))
                              : -1;
            at[i][j] = valid ? place.output(s, p, q) : 0;
        }
    for (int plane = blockIdx.y; plane < place.planes; plane += gridDim.y) {
        const unsigned char* __restrict__ plane_taps = taps + plane * s.P * s.Q * place.step;
        const OutputGradient<PARTS> plane_dy = dy.from(plane * s.P * s.Q * place.step);
        bool chose[M][M];
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
            for (int j = 0; j < M; ++j) chose[i][j] = tap[i][j] >= 0 && plane_taps[at[i][j]] == tap[i][j];
        scalar_t sum = 0;
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
            for (int j = 0; j < M; ++j)
                if (chose[i][j]) sum += plane_dy[at[i][j]];
        dx[place.input(plane)] = element_of(sum);
    }
}

template <bool LAST, bool PARTS>
__device__ __forceinline__ void max_pool_backward_taps_body(const OutputGradient<PARTS> dy,
                                                            const unsigned char* __restrict__ taps,
                                                            elem_t* __restrict__ dx, const PoolShape& s) {
    const BackwardPlace<LAST> place(s);
    if (!place.inside()) return;
    const int h = place.h, w = place.w;
    const Candidates candidates(s, h, w);
    const bool dilated = s.dilation_h != 1 || s.dilation_w != 1;
    if (!dilated) {
        const int most = max((s.kernel_h + s.stride_h - 1) / s.stride_h, (s.kernel_w + s.stride_w - 1) / s.stride_w);
        if (most == 1) return fixed_candidates_backward<1, LAST, PARTS>(dy, taps, dx, s, place, candidates);
        if (most == 2) return fixed_candidates_backward<2, LAST, PARTS>(dy, taps, dx, s, place, candidates);
        if (most == 3) return fixed_candidates_backward<3, LAST, PARTS>(dy, taps, dx, s, place, candidates);
    }
    for (int plane = blockIdx.y; plane < place.planes; plane += gridDim.y) {
        const int offset = plane * s.P * s.Q * place.step;
        scalar_t sum = 0;
        for (int p = candidates.p0; p < candidates.p1; ++p) {
            int r = h - (p * s.stride_h - s.pad_h);
            if (dilated) {
                if (r % s.dilation_h != 0) continue;
                r /= s.dilation_h;
            }
            for (int q = candidates.q0; q < candidates.q1; ++q) {
                int c = w - (q * s.stride_w - s.pad_w);
                if (dilated) {
                    if (c % s.dilation_w != 0) continue;
                    c /= s.dilation_w;
                }
                const int o = offset + place.output(s, p, q);
                if (taps[o] == r * s.kernel_w + c) sum += dy[o];
            }
        }
        dx[place.input(plane)] = element_of(sum);
    }
}

// The kernels of both layouts; the float builds' backward also of two parts (*_sum).
#define MAX_POOL_KERNELS(suffix, last)                                                                            \
    extern "C" __global__ void max_pool_forward##suffix(const elem_t* __restrict__ x, elem_t* __restrict__ y,     \
                                                        long long* __restrict__ indices, const PoolShape s) {     \
        max_pool_forward_body<last>(x, y, indices, s);                                                            \
    }                                                                                                             \
    extern "C" __global__ void max_pool_forward_taps##suffix(const elem_t* __restrict__ x, elem_t* __restrict__ y,\
                                                             unsigned char* __restrict__ taps, const PoolShape s) {\
        max_pool_forward_taps_body<last>(x, y, taps, s);                                                          \
    }                                                                                                             \
    extern "C" __global__ void max_pool_backward##suffix(const elem_t* __restrict__ dy,                           \
                                                         const long long* __restrict__ indices,                   \
                                                         elem_t* __restrict__ dx, const PoolShape s) {            \
        max_pool_backward_body<last, false>({dy, nullptr}, indices, dx, s);                                       \
    }                                                                                                             \
    extern "C" __global__ void max_pool_backward_taps##suffix(const elem_t* __restrict__ dy,                      \
                                                              const unsigned char* __restrict__ taps,             \
                                                              elem_t* __restrict__ dx, const PoolShape s) {       \
        max_pool_backward_taps_body<last, false>({dy, nullptr}, taps, dx, s);                                     \
    }
#ifdef HALF
#define MAX_POOL_SUM_KERNELS(suffix, last)
#else
#define MAX_POOL_SUM_KERNELS(suffix, last)                                                                        \
    extern "C" __global__ void max_pool_backward_sum##suffix(const elem_t* __restrict__ dy,                       \
                                                             const elem_t* __restrict__ dy_other,                 \
                                                             const long long* __restrict__ indices,               \
                                                             elem_t* __restrict__ dx, const PoolShape s) {        \
        max_pool_backward_body<last, true>({dy, dy_other}, indices, dx, s);                                       \
    }                                                                                                             \
    extern "C" __global__ void max_pool_backward_taps_sum##suffix(const elem_t* __restrict__ dy,                  \
                                                                  const elem_t* __restrict__ dy_other,            \
                                                                  const unsigned char* __restrict__ taps,         \
                                                                  elem_t* __restrict__ dx, const PoolShape s) {   \
        max_pool_backward_taps_body<last, true>({dy, dy_other}, taps, dx, s);                                     \
    }
#endif
MAX_POOL_KERNELS(, false)
MAX_POOL_KERNELS(_last, true)
MAX_POOL_SUM_KERNELS(, false)
MAX_POOL_SUM_KERNELS(_last, true)

// Fallback when max_pool2d_backward is not told the window parameters: without them no thread can
// know which outputs may point at its pixel, so one thread owns a whole (n, c) plane of dx (zeroed
// by the caller) and adds that plane's dy entries in output order: deterministic and atomic-free,
// but only N·C threads. Pass the window parameters to get max_pool_backward instead.
extern "C" __global__ void max_pool_backward_serial(const scalar_t* __restrict__ dy,
                                                    const long long* __restrict__ indices,
                                                    scalar_t* __restrict__ dx, const PoolShape s) {
    const int planes = s.N * s.C;
    const int outputs = s.P * s.Q;
    const int pixels = s.H * s.W;
    for (int plane = blockIdx.x * blockDim.x + threadIdx.x; plane < planes; plane += blockDim.x * gridDim.x) {
        scalar_t* __restrict__ dxs = dx + plane * pixels;
        const int offset = plane * outputs;
        for (int o = 0; o < outputs; ++o) {
            const long long index = indices[offset + o];
            // Skip what would write outside the plane (the GPU has no range check).
            if (index >= 0 && index < pixels) dxs[index] += dy[offset + o];
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Average pooling (dilation 1)
// ------------------------------------------------------------------------------------------------

// The divisor of the window starting at (hstart, wstart), as _avg_divisor in pooling.py: the
// window's area inside the padded input (the ceil-mode overhang past it never counts), its number
// of real input pixels without count_include_pad, or divisor_override. The padded area may pass
// 2^31 (a huge padded kernel on a tiny input), hence 64 bits; converting that exact integer to
// scalar_t rounds once, as NumPy's int64 → dtype conversion does.
__device__ __forceinline__ scalar_t avg_divisor(const PoolShape& s, int hstart, int wstart) {
    if (s.divisor_override != 0) return scalar_t(s.divisor_override);
    const int hend = min(hstart + s.kernel_h, s.H + s.pad_h);
    const int wend = min(wstart + s.kernel_w, s.W + s.pad_w);
    long long area;
    if (s.count_include_pad) {
        area = static_cast<long long>(hend - hstart) * (wend - wstart);
    } else {
        area = static_cast<long long>(min(hend, s.H) - max(hstart, 0)) * (min(wend, s.W) - max(wstart, 0));
    }
    return scalar_t(area);
}

// y = (Σ of the window's input pixels, row by row) / divisor; padding adds nothing, so it is skipped.
extern "C" __global__ void avg_pool_forward(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                            const PoolShape s) {
    const int total = s.N * s.C * s.P * s.Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int q = i % s.Q;
        const int p = (i / s.Q) % s.P;
        const int plane = i / (s.Q * s.P);
        const int hstart = p * s.stride_h - s.pad_h;
        const int wstart = q * s.stride_w - s.pad_w;
        const int h0 = max(hstart, 0), h1 = min(hstart + s.kernel_h, s.H);
        const int w0 = max(wstart, 0), w1 = min(wstart + s.kernel_w, s.W);
        const elem_t* __restrict__ xs = x + plane * s.H * s.W;
        scalar_t sum = 0;
        for (int h = h0; h < h1; ++h) {
            for (int w = w0; w < w1; ++w) sum += element_value(xs[h * s.W + w]);
        }
        y[i] = element_of(sum / avg_divisor(s, hstart, wstart));
    }
}

// dx[h, w] = Σ dy[p, q] / divisor(p, q) over the windows covering (h, w): without dilation every
// candidate from first_window/last_window covers the pixel, and the pixel (inside the input) is
// never in a window's uncounted overhang.
extern "C" __global__ void avg_pool_backward(const elem_t* __restrict__ dy, elem_t* __restrict__ dx,
                                             const PoolShape s) {
    const int total = s.N * s.C * s.H * s.W;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int w = i % s.W;
        const int h = (i / s.W) % s.H;
        const int plane = i / (s.W * s.H);
        const int p0 = first_window(h, s.stride_h, s.pad_h, s.kernel_h), p1 = last_window(h, s.stride_h, s.pad_h, s.P);
        const int q0 = first_window(w, s.stride_w, s.pad_w, s.kernel_w), q1 = last_window(w, s.stride_w, s.pad_w, s.Q);
        const elem_t* __restrict__ dys = dy + plane * s.P * s.Q;
        scalar_t sum = 0;
        for (int p = p0; p < p1; ++p) {
            const int hstart = p * s.stride_h - s.pad_h;
            for (int q = q0; q < q1; ++q) {
                // Divide each term as the NumPy twin does (dy / divisor, then sum).
                sum += element_value(dys[p * s.Q + q]) / avg_divisor(s, hstart, q * s.stride_w - s.pad_w);
            }
        }
        dx[i] = element_of(sum);
    }
}

// ------------------------------------------------------------------------------------------------
// Adaptive average pooling
// ------------------------------------------------------------------------------------------------
// The window bounds need products such as o·size, which pass 2^31 when an axis and its output size
// are both large although no array does. Each kernel comes in two builds: `wide_t` = int when
// pooling.py has checked that (size + 1)·(out + 1) fits in 31 bits on both axes (every product
// below is smaller), long long otherwise (64-bit division is several times slower).

// Output cell o of an axis of `size` inputs split into `out` cells averages
// [floor(o·size/out), ceil((o+1)·size/out)).
template <typename wide_t>
__device__ __forceinline__ int cell_start(int o, int size, int out) {
    return static_cast<int>(static_cast<wide_t>(o) * size / out);
}
template <typename wide_t>
__device__ __forceinline__ int cell_end(int o, int size, int out) {
    return static_cast<int>((static_cast<wide_t>(o + 1) * size + out - 1) / out);
}

// Cells along one axis whose windows contain input coordinate i: start(o) <= i holds exactly for
// o < ceil((i+1)·out/size) and end(o) > i exactly for o >= floor(i·out/size). Both bounds are
// monotone in o, so the cells form one range even when windows overlap, or repeat (out > size).
template <typename wide_t>
__device__ __forceinline__ int first_cell(int i, int size, int out) {
    return static_cast<int>(static_cast<wide_t>(i) * out / size);
}
template <typename wide_t>
__device__ __forceinline__ int last_cell(int i, int size, int out) {
    return min(static_cast<int>((static_cast<wide_t>(i + 1) * out + size - 1) / size), out);
}

// y[p, q] = (Σ of the cell's input pixels, row by row) / its area.
template <typename wide_t>
__device__ __forceinline__ void adaptive_forward(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                                 const PoolShape& s) {
    const int total = s.N * s.C * s.P * s.Q;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int q = i % s.Q;
        const int p = (i / s.Q) % s.P;
        const int plane = i / (s.Q * s.P);
        const int h0 = cell_start<wide_t>(p, s.H, s.P), h1 = cell_end<wide_t>(p, s.H, s.P);
        const int w0 = cell_start<wide_t>(q, s.W, s.Q), w1 = cell_end<wide_t>(q, s.W, s.Q);
        const elem_t* __restrict__ xs = x + plane * s.H * s.W;
        scalar_t sum = 0;
        for (int h = h0; h < h1; ++h) {
            for (int w = w0; w < w1; ++w) sum += element_value(xs[h * s.W + w]);
        }
        y[i] = element_of(sum / scalar_t((h1 - h0) * (w1 - w0)));  // the area is at most H·W: an int
    }
}

// dx[h, w] = Σ dy[p, q] / area(p, q) over the cells whose windows contain (h, w).
template <typename wide_t>
__device__ __forceinline__ void adaptive_backward(const elem_t* __restrict__ dy, elem_t* __restrict__ dx,
                                                  const PoolShape& s) {
    const int total = s.N * s.C * s.H * s.W;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const int w = i % s.W;
        const int h = (i / s.W) % s.H;
        const int plane = i / (s.W * s.H);
        const int p0 = first_cell<wide_t>(h, s.H, s.P), p1 = last_cell<wide_t>(h, s.H, s.P);
        const int q0 = first_cell<wide_t>(w, s.W, s.Q), q1 = last_cell<wide_t>(w, s.W, s.Q);
        const elem_t* __restrict__ dys = dy + plane * s.P * s.Q;
        scalar_t sum = 0;
        for (int p = p0; p < p1; ++p) {
            const int rows = cell_end<wide_t>(p, s.H, s.P) - cell_start<wide_t>(p, s.H, s.P);
            for (int q = q0; q < q1; ++q) {
                const int area = rows * (cell_end<wide_t>(q, s.W, s.Q) - cell_start<wide_t>(q, s.W, s.Q));
                sum += element_value(dys[p * s.Q + q]) / scalar_t(area);
            }
        }
        dx[i] = element_of(sum);
    }
}

extern "C" __global__ void adaptive_avg_pool_forward(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                                     const PoolShape s) {
    adaptive_forward<int>(x, y, s);
}
extern "C" __global__ void adaptive_avg_pool_forward_wide(const elem_t* __restrict__ x,
                                                          elem_t* __restrict__ y, const PoolShape s) {
    adaptive_forward<long long>(x, y, s);
}
extern "C" __global__ void adaptive_avg_pool_backward(const elem_t* __restrict__ dy, elem_t* __restrict__ dx,
                                                      const PoolShape s) {
    adaptive_backward<int>(dy, dx, s);
}
extern "C" __global__ void adaptive_avg_pool_backward_wide(const elem_t* __restrict__ dy,
                                                           elem_t* __restrict__ dx, const PoolShape s) {
    adaptive_backward<long long>(dy, dx, s);
}
