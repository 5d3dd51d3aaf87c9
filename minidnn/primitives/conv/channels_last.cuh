// What the implicit GEMMs on channels-last copies share (implicit_gemm_nhwc.cu on mma.sync, implicit_gemm_wgmma.cu
// on Hopper's warpgroup MMA): the problem's shape, the 16-byte cp.async copy, the reduction index kept as (tap,
// channel), forward's gather, and its store of a tile to y (N, K, P, Q) or to a channels-last y's (N, P, Q, K)
// buffer (the Y_LAST build).
// Include after half.cuh, with HALF defined: 1 float16, 2 bfloat16 (the values 16-bit words, each output rounded
// once to the half type), or 0 float32 (implicit_gemm_wgmma's TF32 build: the sums stored as they are).
//
// Groups: C and K are one group's channels and filters. Each group is its own GEMM over a slice of every pixel's
// channels, run by the CTAs of blockIdx.z = g, whose kernels first move their pointers to the group's slice;
// from one pixel to the next is then all the channels, channels_in() (C·groups) or channels_out() (K·groups).

#ifndef MINIDNN_CHANNELS_LAST_CUH
#define MINIDNN_CHANNELS_LAST_CUH

struct NhwcShape {
    int N, C, H, W, K, R, S, P, Q;
    int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
    // The Y_PLACED build's placement of output pixel (n, p, q) among a channels-last y's pixels:
    // n·out_image + p·out_row + q·out_column + out_first (a strided backward-data's phase writing its pixels of dx in
    // place, strided_dgrad.py); (P·Q, Q, 1, 0) elsewhere, where no build reads them.
    int out_image, out_row, out_column, out_first;
    __device__ __forceinline__ int channels_in() const { return C * groups; }    // x's pixel stride
    __device__ __forceinline__ int channels_out() const { return K * groups; }   // y's and dy's pixel stride
};

#if HALF == 0
typedef float Element;
#else
typedef u16 Element;
#endif
constexpr int VALUES_PER_COPY = 16 / sizeof(Element);  // one 16-byte cp.async: 8 half values or 4 floats

constexpr int NOWHERE = -(1 << 29);  // a row past the matrix: its taps are never inside the tensor

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
    return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1; `valid` false copies nothing and writes 16 zero bytes.
__device__ __forceinline__ void copy_16(void* shared, const void* global, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING)); }

__device__ __forceinline__ u16 half_word(const float value) {
    return HALF == 2 ? bfloat16_word(__float_as_uint(value)) : float16_word(__float_as_uint(value), value);
}

// A float32 sum as the output stores it: rounded once to the half type, or as it is.
__device__ __forceinline__ Element stored(const float sum) {
#if HALF == 0
    return sum;
#else
    return half_word(sum);
#endif
}

// A reduction index r·S·C + s·C + c, as its tap and channel, advanced stage by stage without dividing.
struct Tap {
    int index, r, s, c;
    __device__ __forceinline__ Tap(int first, int C, int S) : index(first), r(first / C / S), s(first / C % S),
                                                                c(first % C) {}
    __device__ __forceinline__ void advance(int step, int C, int S) {
        index += step;
        c += step;
        while (c >= C) {
            c -= C;
            if (++s == S) s = 0, ++r;
        }
    }
};

// Backward-filter's walk over the pixels it reduces: the thread copies COPIES pixels of each stage, `rows_per_pass`
// apart, and each stage lies `step` pixels past the one before. Each pixel is kept as its image and output (p, q)
// and moved on without dividing: `step` is step_n images, step_p rows and step_q columns, and a column or row past
// the end carries at most once (q + step_q < 2Q; p + step_p + 1 < 2P). A pixel past the last has n >= N.
template <int COPIES>
struct PixelWalk {
    int n[COPIES], p[COPIES], q[COPIES];
    int step_n, step_p, step_q;

    __device__ __forceinline__ PixelWalk(const NhwcShape& s, const int first_pixel, const int rows_per_pass,
                                         const int step) {
        const int PQ = s.P * s.Q, rest = step % PQ;
        step_n = step / PQ;
        step_p = rest / s.Q;
        step_q = rest % s.Q;
#pragma unroll
        for (int i = 0; i < COPIES; ++i) {
            const int pixel = first_pixel + rows_per_pass * i, pq = pixel % PQ;
            n[i] = pixel / PQ;
            p[i] = pq / s.Q;
            q[i] = pq % s.Q;
        }
    }

    // Every pixel `step` on.
    __device__ __forceinline__ void advance(const NhwcShape& s) {
#pragma unroll
        for (int i = 0; i < COPIES; ++i) {
            q[i] += step_q;
            const bool column_carry = q[i] >= s.Q;
            q[i] -= column_carry ? s.Q : 0;
            p[i] += step_p + column_carry;
            const bool row_carry = p[i] >= s.P;
            p[i] -= row_carry ? s.P : 0;
            n[i] += step_n + row_carry;
        }
    }

    // x's vector of pixel i's input (p·u + top, q·v + left), channels c.. (top, left: the tap's offsets), or x
    // itself where it lies outside x. `inside` says on entry whether the thread's rows are inside the matrix, and on
    // return whether the vector is copied: also not in the padding, not past the last pixel.
    __device__ __forceinline__ const Element* input(const Element* __restrict__ x, const NhwcShape& s, const int i,
                                                const int top, const int left, const int c, bool& inside) const {
        const int h = p[i] * s.stride_h + top, w = q[i] * s.stride_w + left;
        inside = inside && n[i] < s.N && unsigned(h) < unsigned(s.H) && unsigned(w) < unsigned(s.W);
        return inside ? x + ((n[i] * s.H + h) * s.W + w) * s.channels_in() + c : x;
    }
};

// Forward's gather (A: x's rows, one per output pixel; B: the filter's rows): the thread copies one 16-byte
// vector of each of A_COPIES rows of A and B_COPIES rows of B, `rows_per_pass` apart, a stage at a time. Per row
// it keeps the pixel's image offset and first input row and column (NOWHERE past the matrix), per filter its
// offset (-1 past K), and the reduction index it copies as a Tap. `a_at(i)` and `b_at(i)` give the shared-memory
// destination of the i-th copy: each kernel lays its tiles out its own way.
template <int A_COPIES, int B_COPIES>
struct ForwardGather {
    int image[A_COPIES], top[A_COPIES], left[A_COPIES], filter[B_COPIES];
    Tap tap;

    __device__ __forceinline__ ForwardGather(const NhwcShape& s, const int first_row, const int first_filter,
                                             const int rows_per_pass, const int first_k)
        : tap(first_k, s.C, s.S) {
        const int rows = s.N * s.P * s.Q, PQ = s.P * s.Q, reduction = s.R * s.S * s.C;
#pragma unroll
        for (int i = 0; i < A_COPIES; ++i) {
            const int row = first_row + rows_per_pass * i;
            const int n = row / PQ, pq = row % PQ;
            const bool inside = row < rows;
            image[i] = inside ? n * s.H * s.W * s.channels_in() : 0;
            top[i] = inside ? pq / s.Q * s.stride_h - s.pad_h : NOWHERE;
            left[i] = inside ? pq % s.Q * s.stride_w - s.pad_w : NOWHERE;
        }
#pragma unroll
        for (int i = 0; i < B_COPIES; ++i) {
            const int k = first_filter + rows_per_pass * i;
            filter[i] = k < s.K ? k * reduction : -1;
        }
    }

    // One stage's copies, then the reduction index moves on by `step` values.
    template <typename AAt, typename BAt>
    __device__ __forceinline__ void copy_stage(const Element* __restrict__ x, const Element* __restrict__ w,
                                               const NhwcShape& s, const int reduction, const int step,
                                               const AAt& a_at, const BAt& b_at) {
        const bool k_inside = tap.index < reduction;
        const int dh = tap.r * s.dilation_h, dw = tap.s * s.dilation_w;
#pragma unroll
        for (int i = 0; i < A_COPIES; ++i) {
            const int h = top[i] + dh, w_ = left[i] + dw;
            const bool inside = k_inside && unsigned(h) < unsigned(s.H) && unsigned(w_) < unsigned(s.W);
            copy_16(a_at(i), inside ? x + image[i] + (h * s.W + w_) * s.channels_in() + tap.c : x, inside);
        }
#pragma unroll
        for (int i = 0; i < B_COPIES; ++i) {
            const bool inside = k_inside && filter[i] >= 0;
            copy_16(b_at(i), inside ? w + filter[i] + tap.index : w, inside);
        }
        tap.advance(step, s.C, s.S);
    }
};

// Forward's output: y (N, K, P, Q), or with Y_LAST 1 the channels-last buffer (N, P, Q, K) of a channels-last y,
// which is the product's own row-major layout (row n·P·Q + p·Q + q, column k).
#ifndef Y_LAST
#define Y_LAST 0
#endif
#ifndef Y_PLACED  // with Y_LAST: rows stored at NhwcShape's placement, not in order
#define Y_PLACED 0
#endif

// The CTA's M_TILE × N_TILE tile of stored outputs, staged in shared memory (rows padded by 8 values) in the
// order its store reads: [column][row] for y (N, K, P, Q), [row][column] for the channels-last buffer.
template <int M_TILE, int N_TILE>
struct OutputStage {
    Element values[Y_LAST ? M_TILE : N_TILE][(Y_LAST ? N_TILE : M_TILE) + 8];
    __device__ __forceinline__ Element& at(const int row, const int column) {
        return Y_LAST ? values[row][column] : values[column][row];
    }
};

// Forward's store of the staged tile. To y (N, K, P, Q): thread i writes pixel i % M_TILE of every
// (THREAD_COUNT / M_TILE)-th channel, so that a warp stores 32 consecutive pixels of one channel. To the
// channels-last buffer: each thread writes 16-byte runs of VALUES_PER_COPY channels of one pixel (single values
// where K is not a multiple of a run, so a run would not start 16-byte aligned), consecutive threads along a
// pixel's row. y points at the group's first channel: K is the group's filters, channels_out() the pixels' stride
// (with K a multiple of a run, so are the group's first channel and the stride, and every run is aligned).
template <int M_TILE, int N_TILE, int THREAD_COUNT>
__device__ __forceinline__ void store_output_tile(OutputStage<M_TILE, N_TILE>& out, Element* __restrict__ y,
                                                  const NhwcShape& s, const int tile_m, const int tile_n,
                                                  const int thread = threadIdx.x) {
    const int PQ = s.P * s.Q, rows = s.N * PQ;
#if Y_LAST
    constexpr int RUN = VALUES_PER_COPY, RUNS = N_TILE / RUN;
    for (int i = thread; i < M_TILE * RUNS; i += THREAD_COUNT) {
        const int pixel = i / RUNS, run = i % RUNS, row = tile_m * M_TILE + pixel, k = tile_n * N_TILE + RUN * run;
        if (row >= rows || k >= s.K) continue;
#if Y_PLACED
        const int image = row / PQ, pq = row - image * PQ, p = pq / s.Q;
        const long long placed = (long long)image * s.out_image + p * s.out_row + (pq - p * s.Q) * s.out_column +
                                 s.out_first;
        Element* destination = y + placed * s.channels_out() + k;
#else
        Element* destination = y + (long long)row * s.channels_out() + k;
#endif
        if (s.K % RUN == 0) {
            *reinterpret_cast<uint4*>(destination) = *reinterpret_cast<const uint4*>(&out.values[pixel][RUN * run]);
        } else {
            for (int j = 0; j < RUN && k + j < s.K; ++j) destination[j] = out.values[pixel][RUN * run + j];
        }
    }
#else
    const int pixel = thread % M_TILE, row = tile_m * M_TILE + pixel;
    if (row >= rows) return;
    Element* destination = y + (row / PQ) * s.channels_out() * PQ + row % PQ;
    for (int column = thread / M_TILE; column < N_TILE; column += THREAD_COUNT / M_TILE) {
        const int k = tile_n * N_TILE + column;
        if (k < s.K) destination[k * PQ] = out.values[column][pixel];
    }
#endif
}

#endif  // MINIDNN_CHANNELS_LAST_CUH
