// Implicit-GEMM convolution (cuDNN's IMPLICIT_GEMM): each direction is one matrix product
// C (M × N) = A (M × K) · B (K × N) per group whose lowered operand is never stored. Every CTA
// gathers its tiles of A and B straight from the tensors into shared memory (zero-fill where a
// filter tap falls on the padding), so the algorithm needs no workspace at all.
//
//                    rows M         columns N   reduction K      A, gathered   B     C
//   forward          N·P·Q          K/G         C/G·R·S          x             w     y
//   backward-data    N·H·W          C/G         K/G·R·S          dy            w     dx
//   backward-filter  C/G·R·S        K/G         N·P·Q, split     x             dy    dwᵀ, atomicAdd
//   bwd-data, phase  N·H_a·W_b      C/G         K/G·R_a·S_b      dy            w     dx (one phase's pixels)
//
// (Backward-filter is computed transposed, dwᵀ = xᵀ-gather · dy, so that K/G, 64..512 in the
// benchmark models, lies along the 64-wide N side of the tile as in the other two directions.)
//
// One CTA of 256 threads computes a 128 × 64 tile of C (64 × 64 for double), walking the reduction
// in steps of TILE_K (16 floats or 8 doubles). Tiles are staged through registers into two
// shared-memory buffers: the global loads of step t + 1 are in flight while the FMAs of step t run.
// Two consumers share that producer: SIMT FMAs (each thread an 8 × 4 block of C, 4 × 4 for double)
// and, for float with TF32 allowed, tensor cores (mma.sync m16n8k8 TF32, each warp a 32 × 32
// block, operands rounded with cvt.rna).
//
// The half build (HALF = 1 for float16, 2 for bfloat16, both stored as 16-bit words) runs the same
// producer on 16-bit elements, 32 reduction indices a step, and consumes the tiles on tensor cores
// with mma.sync m16n8k16 accumulating in float32; ldmatrix.trans reads each fragment from the
// [k][row] tiles in one instruction per four 8 × 8 blocks. The epilogue adds the bias and applies
// ReLU in float32 and rounds once, to nearest even; backward-filter adds its float32 partial sums
// into a float32 accumulator, which implicit_gemm.py rounds to the half type when all are in.
//
// Index arithmetic stays out of the inner loop. An element of A is the sum of a part that depends
// only on its row and a part that depends only on its reduction index (for forward: the pixel
// (n, p, q) and the tap (c, r, s)). Each CTA decodes its rows once into a shared table, and the
// TILE_K reduction indices of the next step into a second, double-buffered table, so a load is two
// shared reads, two adds and a bounds test.

#ifndef SCALAR
#define SCALAR float
#endif
#ifndef HALF
#define HALF 0
#endif
#include "../half.cuh"
#if HALF
typedef u16 scalar_t;  // the half type's words; arithmetic happens in float32
#else
typedef SCALAR scalar_t;
#endif

// True in the float build only: the tensor-core kernels exist there alone.
#define IS_FLOAT_float 1
#define IS_FLOAT_OF(type) IS_FLOAT_##type
#define IS_FLOAT(type) IS_FLOAT_OF(type)

struct ImplicitGemmShape {
    int N, C, H, W, K, R, S, P, Q;
    int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
    int groups;
};

// Each kernel is compiled to fit CTAS_PER_SM CTAs on one SM, i.e. at most 65536 / (256 · CTAS_PER_SM)
// registers a thread: 128 for the default two. implicit_gemm.py builds a second copy with three (80
// registers, a few spilled) for SIMT grids longer than one wave of two per SM, whose last wave would
// otherwise leave SMs idle (392 CTAs on an H200's 132 SMs: 1.5 waves of two, one wave of three).
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 2
#endif

constexpr int THREADS = 256;
constexpr bool HALF_BUILD = HALF != 0;
constexpr bool FLOAT = sizeof(scalar_t) == sizeof(float);
// A double takes two registers: the double build halves the rows (each thread 4 × 4 instead of
// 8 × 4 of C) and the reduction step, so both builds fit 128 registers, two CTAs per SM. The half
// build takes 32 reduction indices a step: two m16n8k16 steps, the same bytes per step as float.
constexpr int TILE_M = FLOAT || HALF_BUILD ? 128 : 64;
constexpr int TILE_N = 64;
constexpr int TILE_K = HALF_BUILD ? 32 : FLOAT ? 16 : 8;
constexpr int THREAD_ROWS = TILE_M / 16;  // SIMT: rows of C per thread
// Rows padded by 8 values: a warp's tensor-core fragment reads (rows k0 + t, columns g) then fall
// on 32 different banks (the SIMT reads are runs along one row, conflict-free at any padding).
constexpr int LDA = TILE_M + 8;
constexpr int LDB = TILE_N + 8;
constexpr int A_LOADS = TILE_K * TILE_M / THREADS;  // elements of A each thread stages per step
constexpr int B_LOADS = TILE_K * TILE_N / THREADS;

enum Direction { FORWARD, BACKWARD_DATA, BACKWARD_FILTER, BACKWARD_DATA_BY_PHASE };

// Backward-data by stride phases (strided_dgrad.py), one phase per blockIdx.z. With stride u, dx row h
// receives gradient only from the filter rows r ≡ h + pad_h (mod u), so phase (a, b) is the dx pixels
// h = u·h' + a − pad_h, w = v·w' + b − pad_w with the taps r = a + u·i, s = b + v·j alone: a GEMM whose
// reduction is K/G·R_a·S_b instead of K/G·R·S (plain BACKWARD_DATA gathers every tap and masks the
// ones that fall between dy's samples). Every dx pixel lies in exactly one phase and is written once.
// Every phase must have taps (R ≥ u, S ≥ v; implicit_gemm.py refuses others): an empty reduction
// would make the job count below divide by zero.
struct Phase {
    int a, b;             // the phase: its first filter row and column
    int taps_h, taps_w;   // R_a = ⌈(R − a)/u⌉ and S_b = ⌈(S − b)/v⌉ (0 when the stride exceeds the filter)
    int first_h, first_w; // the first h' (and w') whose dx row is 0 or more: ⌈(pad_h − a)/u⌉, at least 0
    int count_h, count_w; // how many h' (and w') land inside dx
};

__device__ __forceinline__ int floor_div(int x, int d) { return x >= 0 ? x / d : -((d - 1 - x) / d); }

__device__ __forceinline__ Phase phase_of(const ImplicitGemmShape& s, int index) {
    Phase ph;
    ph.a = index / s.stride_w;
    ph.b = index % s.stride_w;
    ph.taps_h = (s.R - ph.a + s.stride_h - 1) / s.stride_h;  // R − a + u − 1 ≥ 1: no negative division
    ph.taps_w = (s.S - ph.b + s.stride_w - 1) / s.stride_w;
    ph.first_h = max(0, -floor_div(ph.a - s.pad_h, s.stride_h));
    ph.first_w = max(0, -floor_div(ph.b - s.pad_w, s.stride_w));
    ph.count_h = max(0, floor_div(s.H - 1 + s.pad_h - ph.a, s.stride_h) + 1 - ph.first_h);
    ph.count_w = max(0, floor_div(s.W - 1 + s.pad_w - ph.b, s.stride_w) + 1 - ph.first_w);
    return ph;
}

// One half of a gathered element's coordinates. A's element (row, k) reads
// source[row.offset + k.offset] at (h, w) = (row.h + k.h, row.w + k.w) when that lies inside the
// tensor and row.phase == k.phase; otherwise it is 0. The phase is backward-data's stride test
// ((h + pad_h − r·dilation_h) divisible by stride_h, likewise w); -1 marks a row past the matrix
// and -2 a reduction index past it, so neither ever matches.
struct Coordinates {
    int offset, h, w, phase;
};
constexpr int ROW_OUTSIDE = -1;
constexpr int REDUCTION_OUTSIDE = -2;

struct SharedTiles {
    scalar_t a[2][TILE_K][LDA];  // A tile as [k][row], two buffers
    scalar_t b[2][TILE_K][LDB];  // B tile as [k][column]
    Coordinates a_rows[TILE_M];  // row half of A's coordinates, once per CTA
    int b_columns[TILE_N];       // column half of B's offsets (-1: past the matrix)
    int c_rows[TILE_M];          // the output element of C (row, column) is out[c_rows + c_columns]
    int c_columns[TILE_N];
    Coordinates a_reduction[2][TILE_K];  // reduction halves for the step being loaded, two buffers
    int b_reduction[2][TILE_K];
};

struct GemmSize {
    int rows, columns, reduction;
};

__device__ __forceinline__ GemmSize gemm_size(const Direction direction, const ImplicitGemmShape& s, const Phase& ph) {
    const int Cg = s.C / s.groups, Kg = s.K / s.groups;
    if (direction == FORWARD) return {s.N * s.P * s.Q, Kg, Cg * s.R * s.S};
    if (direction == BACKWARD_DATA) return {s.N * s.H * s.W, Cg, Kg * s.R * s.S};
    if (direction == BACKWARD_DATA_BY_PHASE) return {s.N * ph.count_h * ph.count_w, Cg, Kg * ph.taps_h * ph.taps_w};
    return {Cg * s.R * s.S, Kg, s.N * s.P * s.Q};
}

// ---------------------------------------------------------------------------------------------
// The tables: every division of the kernel happens here, once per row per CTA or once per
// reduction index per step.
// ---------------------------------------------------------------------------------------------
// Row `row` of A (and of C) for `group`.
__device__ __forceinline__ void decode_row(const Direction direction, const ImplicitGemmShape& s, const Phase& ph,
                                           int group, int row, Coordinates& a, int& c) {
    const int Cg = s.C / s.groups, Kg = s.K / s.groups, HW = s.H * s.W, PQ = s.P * s.Q;
    if (direction == FORWARD) {  // output pixel (n, p, q)
        const int n = row / PQ, pq = row % PQ, p = pq / s.Q, q = pq % s.Q;
        const int h0 = p * s.stride_h - s.pad_h, w0 = q * s.stride_w - s.pad_w;
        a = {n * s.C * HW + group * Cg * HW + h0 * s.W + w0, h0, w0, 0};
        c = n * s.K * PQ + pq;
    } else if (direction == BACKWARD_DATA) {  // input pixel (n, h, w): output row p = (h + pad_h − r·dh) / stride_h
        const int n = row / HW, hw = row % HW;
        const int h = hw / s.W + s.pad_h, w = hw % s.W + s.pad_w;
        const int hq = h / s.stride_h, wq = w / s.stride_w;
        a = {n * s.K * PQ + group * Kg * PQ + hq * s.Q + wq, hq, wq, (h % s.stride_h) * s.stride_w + w % s.stride_w};
        c = n * s.C * HW + hw;
    } else if (direction == BACKWARD_DATA_BY_PHASE) {  // the phase's pixel (n, h', w'): dy row p = h' − i for tap i
        const int per_image = ph.count_h * ph.count_w, n = row / per_image, rest = row % per_image;
        const int hq = ph.first_h + rest / ph.count_w, wq = ph.first_w + rest % ph.count_w;
        const int h = hq * s.stride_h + ph.a - s.pad_h, w = wq * s.stride_w + ph.b - s.pad_w;
        a = {n * s.K * PQ + group * Kg * PQ + hq * s.Q + wq, hq, wq, 0};
        c = n * s.C * HW + h * s.W + w;
    } else {  // filter tap (c, r, s) of the transposed weight gradient
        const int RS = s.R * s.S, channel = row / RS, rs = row % RS;
        const int dh = rs / s.S * s.dilation_h, dw = rs % s.S * s.dilation_w;
        a = {(group * Cg + channel) * HW + dh * s.W + dw, dh, dw, 0};
        c = row;
    }
}

// Column `column` of B (and of C) for `group`.
__device__ __forceinline__ void decode_column(const Direction direction, const ImplicitGemmShape& s, int group,
                                              int column, int& b, int& c) {
    const int Cg = s.C / s.groups, Kg = s.K / s.groups;
    if (direction == FORWARD) {  // filter k = group·Kg + column
        b = (group * Kg + column) * Cg * s.R * s.S;
        c = (group * Kg + column) * s.P * s.Q;
    } else if (direction == BACKWARD_DATA || direction == BACKWARD_DATA_BY_PHASE) {  // input channel group·Cg + column
        b = column * s.R * s.S;
        c = (group * Cg + column) * s.H * s.W;
    } else {  // filter k = group·Kg + column
        b = (group * Kg + column) * s.P * s.Q;
        c = (group * Kg + column) * Cg * s.R * s.S;
    }
}

// Reduction index `k` of A and B for `group`.
__device__ __forceinline__ void decode_reduction(const Direction direction, const ImplicitGemmShape& s,
                                                 const Phase& ph, int group, int k, Coordinates& a, int& b) {
    const int Kg = s.K / s.groups, RS = s.R * s.S, PQ = s.P * s.Q;
    if (direction == FORWARD) {  // tap (c, r, s)
        const int channel = k / RS, rs = k % RS;
        const int dh = rs / s.S * s.dilation_h, dw = rs % s.S * s.dilation_w;
        a = {channel * s.H * s.W + dh * s.W + dw, dh, dw, 0};
        b = k;
    } else if (direction == BACKWARD_DATA) {  // output channel and tap (k, r, s)
        const int channel = k / RS, rs = k % RS;
        const int dh = rs / s.S * s.dilation_h, dw = rs % s.S * s.dilation_w;
        const int hq = dh / s.stride_h, wq = dw / s.stride_w;
        a = {channel * PQ - hq * s.Q - wq, -hq, -wq, (dh % s.stride_h) * s.stride_w + dw % s.stride_w};
        b = (group * Kg + channel) * (s.C / s.groups) * RS + rs;
    } else if (direction == BACKWARD_DATA_BY_PHASE) {  // output channel and the phase's tap (i, j): r = a + u·i
        const int taps = ph.taps_h * ph.taps_w, channel = k / taps, tap = k % taps;
        const int i = tap / ph.taps_w, j = tap % ph.taps_w;
        a = {channel * PQ - i * s.Q - j, -i, -j, 0};
        b = (group * Kg + channel) * (s.C / s.groups) * RS + (ph.a + s.stride_h * i) * s.S + ph.b + s.stride_w * j;
    } else {  // output pixel (n, p, q)
        const int n = k / PQ, pq = k % PQ;
        const int h0 = pq / s.Q * s.stride_h - s.pad_h, w0 = pq % s.Q * s.stride_w - s.pad_w;
        a = {n * s.C * s.H * s.W + h0 * s.W + w0, h0, w0, 0};
        b = n * s.K * PQ + pq;
    }
}

// The CTA's row and column tables (threads 0..TILE_M-1 the rows, the next TILE_N the columns).
__device__ __forceinline__ void build_row_tables(const Direction direction, const ImplicitGemmShape& s,
                                                 const Phase& ph, const GemmSize& size, int group, int tile_m,
                                                 int tile_n, SharedTiles& tiles) {
    const int i = threadIdx.x;
    if (i < TILE_M) {
        const int row = tile_m * TILE_M + i;
        Coordinates a = {0, 0, 0, ROW_OUTSIDE};
        int c = -1;
        if (row < size.rows) decode_row(direction, s, ph, group, row, a, c);
        tiles.a_rows[i] = a;
        tiles.c_rows[i] = c;
    } else if (i - TILE_M < TILE_N) {
        const int column = tile_n * TILE_N + i - TILE_M;
        int b = -1, c = -1;
        if (column < size.columns) decode_column(direction, s, group, column, b, c);
        tiles.b_columns[i - TILE_M] = b;
        tiles.c_columns[i - TILE_M] = c;
    }
}

// Reduction table `buffer` for step `step` (threads 0..TILE_K-1).
__device__ __forceinline__ void build_reduction_table(const Direction direction, const ImplicitGemmShape& s,
                                                      const Phase& ph, const GemmSize& size, int group, int step,
                                                      int buffer, SharedTiles& tiles) {
    const int i = threadIdx.x;
    if (i < TILE_K) {
        const int k = step * TILE_K + i;
        Coordinates a = {0, 0, 0, REDUCTION_OUTSIDE};
        int b = -1;
        if (k < size.reduction) decode_reduction(direction, s, ph, group, k, a, b);
        tiles.a_reduction[buffer][i] = a;
        tiles.b_reduction[buffer][i] = b;
    }
}

// ---------------------------------------------------------------------------------------------
// The producer: global -> registers -> shared memory
// ---------------------------------------------------------------------------------------------
// Which element (k, row) of a TILE_K × rows tile is a thread's e-th load. Rows fastest: a warp
// reads 32 consecutive rows of one k (A of forward and backward-data, consecutive pixels).
// Reduction fastest: a warp reads 8 consecutive k of 4 rows (operands contiguous along the
// reduction: the weights, and both operands of backward-filter, whose reduction runs over pixels).
__device__ __forceinline__ void element_of(int e, int rows, bool rows_fastest, int& k, int& row) {
    const int t = threadIdx.x;
    if (rows_fastest) {
        row = t % rows;
        k = t / rows + THREADS / rows * e;
    } else {
        k = t % 8 + 8 * (e % (TILE_K / 8));
        row = t / 8 + THREADS / 8 * (e / (TILE_K / 8));
    }
}

struct Staged {
    scalar_t a[A_LOADS];
    scalar_t b[B_LOADS];
};

__device__ __forceinline__ void load_step(Staged& staged, const SharedTiles& tiles, int buffer,
                                          const scalar_t* __restrict__ a_source, const scalar_t* __restrict__ b_source,
                                          bool a_rows_fastest, int height, int width) {
#pragma unroll
    for (int e = 0; e < A_LOADS; ++e) {
        int k, row;
        element_of(e, TILE_M, a_rows_fastest, k, row);
        const Coordinates r = tiles.a_rows[row], q = tiles.a_reduction[buffer][k];
        const int h = r.h + q.h, w = r.w + q.w;
        const bool inside = r.phase == q.phase && unsigned(h) < unsigned(height) && unsigned(w) < unsigned(width);
        staged.a[e] = inside ? __ldg(a_source + (unsigned(r.offset) + unsigned(q.offset))) : scalar_t(0);
    }
#pragma unroll
    for (int e = 0; e < B_LOADS; ++e) {
        int k, column;
        element_of(e, TILE_N, false, k, column);
        const int offset = tiles.b_reduction[buffer][k], column_offset = tiles.b_columns[column];
        staged.b[e] = (offset | column_offset) >= 0 ? __ldg(b_source + offset + column_offset) : scalar_t(0);
    }
}

// Round to TF32 (10-bit mantissa, to nearest, ties away) as the tensor cores expect: fed raw fp32
// bits, they would truncate instead.
__device__ __forceinline__ float round_tf32(float value) {
    unsigned bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(value));
    return __uint_as_float(bits);
}

__device__ __forceinline__ scalar_t tile_value(scalar_t value, bool tensor_cores) {
#if HALF
    return value;  // half words go to the tensor cores as they are
#else
    return tensor_cores ? round_tf32(value) : value;
#endif
}

__device__ __forceinline__ void store_step(const Staged& staged, SharedTiles& tiles, int buffer, bool a_rows_fastest,
                                           bool tensor_cores) {
#pragma unroll
    for (int e = 0; e < A_LOADS; ++e) {
        int k, row;
        element_of(e, TILE_M, a_rows_fastest, k, row);
        tiles.a[buffer][k][row] = tile_value(staged.a[e], tensor_cores);
    }
#pragma unroll
    for (int e = 0; e < B_LOADS; ++e) {
        int k, column;
        element_of(e, TILE_N, false, k, column);
        tiles.b[buffer][k][column] = tile_value(staged.b[e], tensor_cores);
    }
}

// ---------------------------------------------------------------------------------------------
// The consumers
// ---------------------------------------------------------------------------------------------
// SIMT: thread (tm, tn) = (t % 16, t / 16) owns rows tm·4 + {0..3} (and 64 + tm·4 + {0..3} in the
// float build) and columns tn·4 + {0..3}, so each fragment is read as runs of 4 consecutive values.
__device__ __forceinline__ int simt_row(int i) { return i / 4 * 64 + threadIdx.x % 16 * 4 + i % 4; }
__device__ __forceinline__ int simt_column(int j) { return threadIdx.x / 16 * 4 + j; }

struct alignas(16) Four {  // 4 consecutive values: one 16-byte shared load per float4 (two for double)
    scalar_t v[4];
};

__device__ __forceinline__ void compute_simt(scalar_t (&acc)[THREAD_ROWS][4], const scalar_t (*a)[LDA],
                                             const scalar_t (*b)[LDB]) {
    const int tm = threadIdx.x % 16, tn = threadIdx.x / 16;
#pragma unroll
    for (int k = 0; k < TILE_K; ++k) {
        const Four column = *reinterpret_cast<const Four*>(&b[k][tn * 4]);
#pragma unroll
        for (int half = 0; half < THREAD_ROWS / 4; ++half) {
            const Four rows = *reinterpret_cast<const Four*>(&a[k][half * 64 + tm * 4]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[half * 4 + i][j] += rows.v[i] * column.v[j];
        }
    }
}

// Tensor cores: warp w owns rows (w % 4)·32 .. +31 and columns (w / 4)·32 .. +31 as 2 × 4 tiles of
// m16n8. Fragment layout of mma.m16n8k8 (g = lane / 4, t = lane % 4): a0 = A[g][t], a1 = A[g+8][t],
// a2 = A[g][t+4], a3 = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]; c0, c1 = C[g][2t, 2t+1],
// c2, c3 = C[g+8][2t, 2t+1]. The shared tiles hold values already rounded to TF32.
__device__ __forceinline__ int mma_row(int mi, int half) {
    return threadIdx.x / 32 % 4 * 32 + mi * 16 + threadIdx.x % 32 / 4 + half * 8;
}
__device__ __forceinline__ int mma_column(int ni, int odd) {
    return threadIdx.x / 128 * 32 + ni * 8 + threadIdx.x % 4 * 2 + odd;
}

// One warp's 2 × 4 MMA tiles from its A and B fragments: Mma(c, a, b) is one mma.sync instruction.
template <typename Mma>
__device__ __forceinline__ void mma_warp_tiles(float (&acc)[2][4][4], const unsigned (&fa)[2][4],
                                               const unsigned (&fb)[4][2], const Mma mma) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma(acc[mi][ni], fa[mi], fb[ni]);
}

struct MmaTf32 {  // m16n8k8, TF32 operands
    __device__ __forceinline__ void operator()(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) const {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

__device__ __forceinline__ void compute_tensor_cores(float (&acc)[2][4][4], const scalar_t (*a)[LDA],
                                                     const scalar_t (*b)[LDB]) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int row0 = threadIdx.x / 32 % 4 * 32, column0 = threadIdx.x / 128 * 32;
#pragma unroll
    for (int k0 = 0; k0 < TILE_K; k0 += 8) {
        unsigned fa[2][4], fb[4][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int row = row0 + mi * 16 + g;
            fa[mi][0] = __float_as_uint(a[k0 + t][row]);
            fa[mi][1] = __float_as_uint(a[k0 + t][row + 8]);
            fa[mi][2] = __float_as_uint(a[k0 + t + 4][row]);
            fa[mi][3] = __float_as_uint(a[k0 + t + 4][row + 8]);
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            fb[ni][0] = __float_as_uint(b[k0 + t][column0 + ni * 8 + g]);
            fb[ni][1] = __float_as_uint(b[k0 + t + 4][column0 + ni * 8 + g]);
        }
        mma_warp_tiles(acc, fa, fb, MmaTf32());
    }
}

#if HALF
// Half tensor cores: the same warp tiling with mma.m16n8k16 (g = lane / 4, t = lane % 4). Each 32-bit
// register holds two elements, the lower index in the low half: a = {A[g][2t..], A[g+8][2t..],
// A[g][2t+8..], A[g+8][2t+8..]}, b = {B[2t..][g], B[2t+8..][g]}; C as m16n8k8's. The tiles are stored
// [k][row], so each register's pair runs down a tile column: ldmatrix.trans gathers it, one 8 × 8
// block per eight lanes' row addresses (16 contiguous bytes each; LDA and LDB keep them 16-byte
// aligned, and their padding puts the eight rows of a block on different banks).
__device__ __forceinline__ void load_matrices_transposed(unsigned (&fragment)[4], const scalar_t* address) {
    const unsigned shared = static_cast<unsigned>(__cvta_generic_to_shared(address));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
                 : "r"(shared));
}

struct MmaHalf {  // m16n8k16, bfloat16 or float16 operands
    __device__ __forceinline__ void operator()(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) const {
        asm volatile(
#if HALF == 2
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
#else
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
#endif
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

__device__ __forceinline__ void compute_half_tensor_cores(float (&acc)[2][4][4], const scalar_t (*a)[LDA],
                                                          const scalar_t (*b)[LDB]) {
    const int lane = threadIdx.x % 32, block = lane / 8, block_row = lane % 8;
    const int row0 = threadIdx.x / 32 % 4 * 32, column0 = threadIdx.x / 128 * 32;
#pragma unroll
    for (int k0 = 0; k0 < TILE_K; k0 += 16) {
        unsigned fa[2][4], fb[4][2];
        // A's four blocks: rows +0/+8 (block % 2) by k +0/+8 (block / 2), in the order of a's registers.
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
            load_matrices_transposed(fa[mi], &a[k0 + block / 2 * 8 + block_row][row0 + mi * 16 + block % 2 * 8]);
        // B's: k +0/+8 (block % 2) by columns of n-tile 2j / 2j + 1 (block / 2): two n-tiles a load.
#pragma unroll
        for (int nj = 0; nj < 2; ++nj) {
            unsigned f[4];
            load_matrices_transposed(f, &b[k0 + block % 2 * 8 + block_row][column0 + (2 * nj + block / 2) * 8]);
            fb[2 * nj][0] = f[0];
            fb[2 * nj][1] = f[1];
            fb[2 * nj + 1][0] = f[2];
            fb[2 * nj + 1][1] = f[3];
        }
        mma_warp_tiles(acc, fa, fb, MmaHalf());
    }
}

__device__ __forceinline__ float half_value(const u16 word) {
    return HALF == 2 ? bfloat16_value(word) : float16_value(word);
}
__device__ __forceinline__ u16 half_word(const float value) {
    return HALF == 2 ? bfloat16_word(__float_as_uint(value)) : float16_word(__float_as_uint(value), value);
}
#endif

// ---------------------------------------------------------------------------------------------
// The epilogue: C (row, column) -> out, with forward's optional bias and ReLU; backward-filter adds
// its partial sum over one slice of the reduction with atomicAdd. OutT is scalar_t, except for the
// half build's backward-filter, whose out is the float32 accumulator.
// ---------------------------------------------------------------------------------------------
template <typename A, typename B> struct SameType { static constexpr bool value = false; };
template <typename A> struct SameType<A, A> { static constexpr bool value = true; };

template <typename OutT, typename Value>
__device__ __forceinline__ void write_output(const Direction direction, const SharedTiles& tiles, int row, int column,
                                             Value value, OutT* __restrict__ out,
                                             const scalar_t* __restrict__ bias, bool relu, int first_channel) {
    const int r = tiles.c_rows[row], c = tiles.c_columns[column];
    if ((r | c) < 0) return;
#if HALF
    if constexpr (SameType<OutT, float>::value) {  // backward-filter: float32 partial sums
        atomicAdd(out + r + c, value);
    } else {
        float v = value;
        if (bias != nullptr) v += half_value(bias[first_channel + column]);
        if (relu && v < 0.0f) v = 0.0f;
        out[r + c] = half_word(v);
    }
#else
    if (direction == BACKWARD_FILTER) {
        atomicAdd(out + r + c, scalar_t(value));
        return;
    }
    scalar_t v = value;
    if (bias != nullptr) v += bias[first_channel + column];
    if (relu && v < scalar_t(0)) v = scalar_t(0);
    out[r + c] = v;
#endif
}

// ---------------------------------------------------------------------------------------------
// The kernel body shared by all six kernels
// ---------------------------------------------------------------------------------------------
// blockIdx.x = output tile (column tiles fastest, so CTAs running together share their gathered
// A tile in L2); blockIdx.y walks (group, reduction slice) jobs. `steps_per_split` (> 0) cuts the
// reduction into slices of that many steps (split-K, backward-filter), 0 keeps it whole.
template <typename OutT>
__device__ __forceinline__ void implicit_gemm(const Direction direction, const bool tensor_cores,
                                              const scalar_t* __restrict__ a_source,
                                              const scalar_t* __restrict__ b_source, OutT* __restrict__ out,
                                              const scalar_t* __restrict__ bias, bool relu,
                                              const ImplicitGemmShape& shape, int steps_per_split) {
    __shared__ __align__(16) SharedTiles tiles;
    const Phase ph = direction == BACKWARD_DATA_BY_PHASE ? phase_of(shape, blockIdx.z) : Phase{};
    const GemmSize size = gemm_size(direction, shape, ph);
    const bool a_rows_fastest = direction != BACKWARD_FILTER;
    const bool gathers_dy = direction == BACKWARD_DATA || direction == BACKWARD_DATA_BY_PHASE;
    const int height = gathers_dy ? shape.P : shape.H;
    const int width = gathers_dy ? shape.Q : shape.W;
    const int n_tiles = (size.columns + TILE_N - 1) / TILE_N;
    const int steps = (size.reduction + TILE_K - 1) / TILE_K;
    const int per_split = steps_per_split > 0 ? steps_per_split : steps;  // steps ≥ 1: reduction ≥ 1
    const int jobs = shape.groups * ((steps + per_split - 1) / per_split);
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    // The grid covers the largest phase: a CTA past its own phase's rows has nothing to do (the whole
    // CTA leaves together, before any barrier).
    if (tile_m * TILE_M >= size.rows) return;

    for (int job = blockIdx.y; job < jobs; job += gridDim.y) {
        const int group = job % shape.groups, split = job / shape.groups;
        const int first = split * per_split, last = min(first + per_split, steps);
#if !HALF
        scalar_t simt[THREAD_ROWS][4] = {};
#endif
        float mma[2][4][4] = {};
        Staged staged;

        build_row_tables(direction, shape, ph, size, group, tile_m, tile_n, tiles);
        build_reduction_table(direction, shape, ph, size, group, first, 0, tiles);
        __syncthreads();
        load_step(staged, tiles, 0, a_source, b_source, a_rows_fastest, height, width);
        store_step(staged, tiles, 0, a_rows_fastest, tensor_cores);
        if (first + 1 < last) build_reduction_table(direction, shape, ph, size, group, first + 1, 1, tiles);
        __syncthreads();

        // Step t computes from buffer (t - first) % 2 while step t + 1's loads are in flight; the
        // reduction table of step t + 2 goes into the buffer step t's loads have finished with.
        for (int step = first; step < last; ++step) {
            const int current = (step - first) & 1, next = current ^ 1;
            if (step + 1 < last) load_step(staged, tiles, next, a_source, b_source, a_rows_fastest, height, width);
#if HALF
            compute_half_tensor_cores(mma, tiles.a[current], tiles.b[current]);
#else
            if (tensor_cores) {
                compute_tensor_cores(mma, tiles.a[current], tiles.b[current]);
            } else {
                compute_simt(simt, tiles.a[current], tiles.b[current]);
            }
#endif
            if (step + 1 < last) store_step(staged, tiles, next, a_rows_fastest, tensor_cores);
            if (step + 2 < last) build_reduction_table(direction, shape, ph, size, group, step + 2, current, tiles);
            __syncthreads();
        }

        const int first_channel = group * size.columns + tile_n * TILE_N;  // forward: the channel of column 0
        if (tensor_cores) {
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                    for (int v = 0; v < 4; ++v)
                        write_output(direction, tiles, mma_row(mi, v / 2), mma_column(ni, v % 2), mma[mi][ni][v], out,
                                     bias, relu, first_channel);
        } else {
#if !HALF
#pragma unroll
            for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    write_output(direction, tiles, simt_row(i), simt_column(j), simt[i][j], out, bias, relu,
                                 first_channel);
#endif
        }
        __syncthreads();  // the next job rewrites the tables
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels: one per direction, SIMT (float and double) and tensor cores (float only)
// ---------------------------------------------------------------------------------------------
// Each takes its operands as implicit_gemm() does; SUFFIX names the consumer ("" SIMT, _tf32 tensor cores,
// _half the half build's tensor cores, whose backward-filter adds into a float32 dw).
//   forward                 x (N, C, H, W), w (K, C/G, R, S) -> y (N, K, P, Q) = x ⋆ w (+ bias[k]) (then max(·, 0)
//                           if relu).
//   backward_data           dy (N, K, P, Q), w -> dx (N, C, H, W).
//   backward_data_by_phase  dy, w -> dx, stride phase blockIdx.z (of stride_h·stride_w); the grid's rows cover the
//                           largest phase. Every pixel of dx is written (dilation 1 only: strided_dgrad.py).
//   backward_filter         x, dy -> dw (K, C/G, R, S) += the slices' partial sums (atomicAdd: dw must hold zeros,
//                           or the gradient to add to).
#define IMPLICIT_GEMM_KERNELS(SUFFIX, TENSOR_CORES, FILTER_OUT)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) implicit_gemm_forward##SUFFIX(              \
        const scalar_t* __restrict__ x, const scalar_t* __restrict__ w, const scalar_t* __restrict__ bias,          \
        scalar_t* __restrict__ y, const ImplicitGemmShape shape, int has_bias, int relu) {                          \
        implicit_gemm(FORWARD, TENSOR_CORES, x, w, y, has_bias ? bias : nullptr, relu != 0, shape, 0);              \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) implicit_gemm_backward_data##SUFFIX(        \
        const scalar_t* __restrict__ dy, const scalar_t* __restrict__ w, scalar_t* __restrict__ dx,                 \
        const ImplicitGemmShape shape) {                                                                            \
        implicit_gemm(BACKWARD_DATA, TENSOR_CORES, dy, w, dx, nullptr, false, shape, 0);                            \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) implicit_gemm_backward_data_by_phase##SUFFIX( \
        const scalar_t* __restrict__ dy, const scalar_t* __restrict__ w, scalar_t* __restrict__ dx,                 \
        const ImplicitGemmShape shape) {                                                                            \
        implicit_gemm(BACKWARD_DATA_BY_PHASE, TENSOR_CORES, dy, w, dx, nullptr, false, shape, 0);                   \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) implicit_gemm_backward_filter##SUFFIX(      \
        const scalar_t* __restrict__ x, const scalar_t* __restrict__ dy, FILTER_OUT* __restrict__ dw,               \
        const ImplicitGemmShape shape, int steps_per_split) {                                                       \
        implicit_gemm(BACKWARD_FILTER, TENSOR_CORES, x, dy, dw, nullptr, false, shape, steps_per_split);            \
    }

#if HALF
IMPLICIT_GEMM_KERNELS(_half, true, float)
#else
IMPLICIT_GEMM_KERNELS(, false, scalar_t)
#if IS_FLOAT(SCALAR)
IMPLICIT_GEMM_KERNELS(_tf32, true, scalar_t)
#endif
#endif
