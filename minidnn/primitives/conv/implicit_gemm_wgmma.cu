// Implicit GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): implicit_gemm_nhwc.cu's gather of 16-byte
// channels-last vectors by cp.async, but the tiles laid out in shared memory as wgmma reads them, 128-byte rows
// swizzled, and each warpgroup multiplying its 64 rows by the whole tile's columns at once.
//
//                    rows M       columns N   reduction       A (gathered)            B
//   forward          N·P·Q        K           R·S·C           x  (N, H, W, C)        w  (K, R, S, C)
//   backward-filter  R·S·C        K           N·P·Q, split    x  (N, H, W, C)        dy (N, P, Q, K)
//
// Stride-1 backward-data runs the forward kernel on dy and the turned filter, as in implicit_gemm_nhwc.py.
// The values are float16 or bfloat16 (HALF 1, 2), or float32 multiplied as TF32 (HALF 0, below).
//
// One CTA of 256 threads is two warpgroups; it computes a 128 × BLOCK_N tile of C (BLOCK_N 128, or 64 for a
// product 64 columns wide or less), BLOCK_K reduction values a stage, STAGES stages (three by default) of
// cp.async copies. A stage holds A (128 rows) and B (BLOCK_N rows) as rows of 128 bytes (64 half values or 32
// floats): the K-major layout with the 128-byte swizzle, in which 16-byte chunk j of row r lies at chunk
// j ^ (r % 8) of its row, so that the eight rows of a 1024-byte group spread each column of chunks over all 32
// banks. A shared-memory descriptor names a tile to wgmma (its start, 1024 bytes from one group of 8 rows to the
// next, the swizzle); one wgmma reduces 32 bytes of each row (k16 for half values, k8 for TF32), so the k-th of
// a stage's four starts 32·k bytes into the rows. Each warpgroup issues four m64nN wgmma a stage, then, while
// they run, the copies of the stage two on (into the buffer the products of the step before read), then waits
// for them. The pipeline is a build (STAGES, IN_FLIGHT: stages of shared memory, product groups left in flight
// across the barrier); implicit_gemm_wgmma.PIPELINES says which runs.
//
// The accumulators are float32 in registers, thread t of a warpgroup holding, for each n8 column block i, rows
// 16·(t / 32) + t % 32 / 4 and that + 8, columns 8i + 2·(t % 4) and the next: mma.sync's m16n8 layout repeated.
// Forward's epilogue rounds each sum once to nearest even (half builds; TF32's sums are stored as they are), as
// implicit_gemm_nhwc's, and stores through shared memory; backward-filter's adds each split's partial sums into
// a float32 sum laid (K, R, S, C) with atomicAdd, which implicit_gemm_nhwc.cu's filter_gradient_to_float or
// _to_half lays out as dw (K, C, R, S). Groups are implicit_gemm_nhwc.cu's: blockIdx.z = g, the pointers moved
// to the group's channels and filters.
//
// TF32: wgmma reads the float32 words the copies left in shared memory and multiplies their top 19 bits (sign,
// exponent, 10 of the 23 fraction bits): each operand is cut toward zero to TF32, with no rounding pass between
// the copy and the product. wgmma takes TF32 operands K-major only: forward's tiles are, and the TF32
// backward-filter turns its operands on their way into shared memory (below).

#ifndef HALF
#define HALF 2  // 1: float16, 2: bfloat16 (both as 16-bit words), 0: float32 multiplied as TF32
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#include "../half.cuh"
#include "channels_last.cuh"

// One wgmma's shape and types: a 64 × N product over 32 bytes of each row, float32 sums. Half operands may be
// read transposed (MN-major tiles: the two immediates after the scales); TF32 operands only K-major.
#if HALF == 0
#define WGMMA_TYPES(n) "m64n" #n "k8.f32.tf32.tf32"
#define TRANSPOSES(operand) ""
#elif HALF == 2
#define WGMMA_TYPES(n) "m64n" #n "k16.f32.bf16.bf16"
#define TRANSPOSES(operand) ", %" #operand ", %" #operand
#else
#define WGMMA_TYPES(n) "m64n" #n "k16.f32.f16.f16"
#define TRANSPOSES(operand) ", %" #operand ", %" #operand
#endif

typedef unsigned long long uint64_t;

constexpr int THREADS = 256;  // two warpgroups
constexpr int BLOCK_M = 128;  // 64 rows per warpgroup
constexpr int ROW_BYTES = 128;                     // one swizzled row of a stage
constexpr int BLOCK_K = ROW_BYTES / sizeof(Element);  // its reduction values: 64 half values or 32 floats
#ifndef STAGES
#define STAGES 3
#endif
#ifndef IN_FLIGHT
#define IN_FLIGHT 0
#endif
constexpr int AHEAD = STAGES - 1 - IN_FLIGHT;  // stages whose copies are in flight while one is multiplied
static_assert(AHEAD >= 1, "at least one stage of copies ahead");
constexpr int VECTOR = VALUES_PER_COPY;   // values in one 16-byte copy
constexpr int CHUNKS = BLOCK_K / VECTOR;  // 16-byte chunks of a row: 8
constexpr int PRODUCTS = ROW_BYTES / 32;  // wgmma a stage, each over 32 bytes of the rows
constexpr int A_BYTES = BLOCK_M * ROW_BYTES, B_BYTES = BLOCK_N * ROW_BYTES, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int GROUP_BYTES = 8 * ROW_BYTES;  // the swizzle's period: 8 rows
constexpr int ACCUMULATORS = BLOCK_N / 2;  // floats per thread of an m64nN product
constexpr int ROWS_PER_PASS = THREADS / CHUNKS;  // 32
constexpr int A_COPIES = BLOCK_M / ROWS_PER_PASS, B_COPIES = BLOCK_N / ROWS_PER_PASS;
constexpr int PAD = 8;
typedef OutputStage<BLOCK_M, BLOCK_N> OutputTile;  // the epilogue's, over the pipeline's memory
static_assert(STAGE_BYTES % GROUP_BYTES == 0, "stages start on the swizzle's 1024-byte period");

// The kernel's shared memory: STAGES stages, from the first 1024-byte boundary of the dynamic allocation (the
// launch asks for 1024 bytes more), since the swizzle is a function of the address bits.
extern __shared__ __align__(16) unsigned char shared_memory[];

// The byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
__device__ __forceinline__ int swizzled(const int row, const int chunk) {
    return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}

// A shared-memory matrix descriptor: start address / 16 (bits 0-13), leading byte offset / 16 (16-29: unused
// by swizzled K-major layouts, 16 by convention; for MN-major ones, from one 64-value panel of M or N to the
// next), stride byte offset / 16 (32-45: from one group of 8 rows to the next), base offset 0 (49-51: the tile
// starts on the swizzle's period), swizzle mode (62-63: 1, 128 bytes).
__device__ __forceinline__ uint64_t descriptor(const unsigned address, const unsigned leading = 16) {
    return (uint64_t)((address & 0x3FFFF) >> 4) | ((uint64_t)(leading >> 4) << 16) |
           ((uint64_t)(GROUP_BYTES >> 4) << 32) | ((uint64_t)1 << 62);
}

// The copies' writes (the generic proxy) made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous products.
__device__ __forceinline__ void fence_accumulators(float (&d)[ACCUMULATORS]) {
#pragma unroll
    for (int i = 0; i < ACCUMULATORS; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 × N, float32) += A (64 × 32 bytes, descriptor a) · B (32 bytes × N, descriptor b): both K-major (stored as
// rows along the reduction), or with TRANSPOSED (half builds) both MN-major (stored as rows along M and N).
template <int TRANSPOSED>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], const uint64_t a, const uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned." WGMMA_TYPES(128) " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1"
        TRANSPOSES(67) ";\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1), "n"(TRANSPOSED));
}

template <int TRANSPOSED>
__device__ __forceinline__ void wgmma_n64(float (&d)[32], const uint64_t a, const uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned." WGMMA_TYPES(64) " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1"
        TRANSPOSES(35) ";\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1), "n"(TRANSPOSED));
}

template <int TRANSPOSED>
__device__ __forceinline__ void wgmma_tile(float (&d)[ACCUMULATORS], const uint64_t a, const uint64_t b) {
#if BLOCK_N == 128
    wgmma_n128<TRANSPOSED>(d, a, b);
#else
    wgmma_n64<TRANSPOSED>(d, a, b);
#endif
}

// One stage's products on K-major tiles (forward's, and the TF32 backward-filter's): the warpgroup's 64 rows of A
// (shared address a) times B's BLOCK_N rows (b), one wgmma per 32 bytes of the rows, committed as one group.
__device__ __forceinline__ void multiply_stage(float (&acc)[ACCUMULATORS], const unsigned a, const unsigned b) {
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < PRODUCTS; ++k) wgmma_tile<0>(acc, descriptor(a + 32 * k), descriptor(b + 32 * k));
    wgmma_commit();
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
implicit_gemm_wgmma_forward(const Element* __restrict__ x, const Element* __restrict__ w, Element* __restrict__ y,
                            const NhwcShape s) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    const int reduction = s.R * s.S * s.C, group = blockIdx.z;
    x += group * s.C;
    w += group * s.K * reduction;
    y += group * s.K * (Y_LAST ? 1 : s.P * s.Q);
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int tid = threadIdx.x, chunk = tid % CHUNKS, copy_row = tid / CHUNKS;

    // Each thread copies chunk `chunk` of the rows copy_row + 32·i of A and B (channels_last.cuh's gather).
    ForwardGather<A_COPIES, B_COPIES> gather(s, tile_m * BLOCK_M + copy_row, tile_n * BLOCK_N + copy_row,
                                             ROWS_PER_PASS, chunk * VECTOR);
    auto copy_stage = [&](int stage) {
        unsigned char* const a = tiles + stage * STAGE_BYTES;
        unsigned char* const b = a + A_BYTES;
        gather.copy_stage(x, w, s, reduction, BLOCK_K,
                          [&](int i) { return a + swizzled(copy_row + ROWS_PER_PASS * i, chunk); },
                          [&](int i) { return b + swizzled(copy_row + ROWS_PER_PASS * i, chunk); });
    };

    const int steps = (reduction + BLOCK_K - 1) / BLOCK_K, warpgroup = tid / 128;
    float acc[ACCUMULATORS] = {};
#pragma unroll
    for (int stage = 0; stage < AHEAD; ++stage) {
        if (stage < steps) copy_stage(stage);
        commit_copies();
    }
    for (int step = 0; step < steps; ++step) {
        // Stage `step` has landed once at most AHEAD − 1 later groups are pending; after the barrier every
        // thread's copies of it are visible to wgmma, and the products of stage step − 1 − IN_FLIGHT are done.
        wait_copies<AHEAD - 1>();
        fence_async_proxy();
        __syncthreads();
        multiply_stage(acc, shared_address(tiles + step % STAGES * STAGE_BYTES) + warpgroup * (A_BYTES / 2),
                       shared_address(tiles + step % STAGES * STAGE_BYTES + A_BYTES));
        // While the tensor cores multiply, the copies of the stage AHEAD on go into the buffer those products
        // last read.
        if (step + AHEAD < steps) copy_stage((step + AHEAD) % STAGES);
        commit_copies();
        wgmma_wait<IN_FLIGHT>();
        fence_accumulators(acc);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    wait_copies<0>();
    __syncthreads();  // the output tile reuses the pipeline's memory

    OutputTile& out = *reinterpret_cast<OutputTile*>(tiles);
    const int t = tid % 128, g = t % 32 / 4, q = t % 4, row0 = warpgroup * 64 + t / 32 * 16 + g;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i)
#pragma unroll
        for (int v = 0; v < 4; ++v) out.at(row0 + v / 2 * 8, 8 * i + 2 * q + v % 2) = stored(acc[4 * i + v]);
    __syncthreads();
    store_output_tile<BLOCK_M, BLOCK_N, THREADS>(out, y, s, tile_m, tile_n);
}

// ---------------------------------------------------------------------------------------------------------------
// Backward-filter: sums (K, R, S, C) += Σ over this CTA's slice of pixels of x (N, H, W, C) and dy (N, P, Q, K),
// float32. blockIdx.y is the slice: `steps_per_split` stages of BLOCK_K pixels.
// ---------------------------------------------------------------------------------------------------------------

// The end of both builds' backward-filter: C (row (r, s, c), column k) is sums[k][r][s][c] of the CTA's group,
// added with atomicAdd; a warp's eight consecutive rows g are 32 contiguous bytes. (The tile's place is worked out
// again here rather than kept in registers through the products.)
__device__ __forceinline__ void add_filter_gradient_tile(const float (&acc)[ACCUMULATORS], float* __restrict__ sums,
                                                         const NhwcShape& s) {
    const int rows = s.R * s.S * s.C, n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    sums += blockIdx.z * s.K * rows;
    const int t = threadIdx.x % 128, g = t % 32 / 4, q = t % 4;
    const int row0 = tile_m * BLOCK_M + threadIdx.x / 128 * 64 + t / 32 * 16 + g;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i)
#pragma unroll
        for (int o = 0; o < 2; ++o) {
            const int k = tile_n * BLOCK_N + 8 * i + 2 * q + o;
            if (k >= s.K) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (row0 + h * 8 < rows) atomicAdd(sums + k * rows + row0 + h * 8, acc[4 * i + 2 * h + o]);
        }
}

#if HALF != 0
// Half values: both operands lie along M and N (a pixel's eight channels c..c+7 of one tap of x, its eight filters
// k..k+7 of dy), so the tiles are MN-major: a stage stores, for each 64-wide panel of M (or N), one 128-byte
// row per pixel, swizzled as forward's rows are; a wgmma reads them transposed. The warpgroup's A is its own
// panel; B's panels lie PANEL_BYTES apart (the descriptor's leading offset); each k16 step starts 16 rows on.
constexpr int PANEL_BYTES = BLOCK_K * 128;  // 64 pixels × 64 values
constexpr int A_VECTORS = BLOCK_M / VECTOR, B_VECTORS = BLOCK_N / VECTOR;  // chunks per pixel
constexpr int A_PIXELS = THREADS / A_VECTORS, B_PIXELS = THREADS / B_VECTORS;  // pixels per pass
constexpr int A_PIXEL_COPIES = BLOCK_K / A_PIXELS, B_PIXEL_COPIES = BLOCK_K / B_PIXELS;

// The byte offset of chunk `vector` (values 8·vector ..) of pixel row `row` in an MN-major stage of panels.
__device__ __forceinline__ int panel_swizzled(const int row, const int vector) {
    return vector / 8 * PANEL_BYTES + swizzled(row, vector % 8);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
implicit_gemm_wgmma_backward_filter(const u16* __restrict__ x, const u16* __restrict__ dy, float* __restrict__ sums,
                                    const NhwcShape s, int steps_per_split) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    const int rows = s.R * s.S * s.C, pixels = s.N * s.P * s.Q, group = blockIdx.z;
    x += group * s.C;
    dy += group * s.K;
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int steps = (pixels + BLOCK_K - 1) / BLOCK_K;
    const int first = blockIdx.y * steps_per_split, last = min(first + steps_per_split, steps);
    const int tid = threadIdx.x, warpgroup = tid / 128;

    // A: the thread's eight rows (r, s, c..c+7) of dwᵀ, fixed; as an offset from each pixel's first input tap.
    const int a_vector = tid % A_VECTORS, a_pixel = tid / A_VECTORS;
    const Tap tap(tile_m * BLOCK_M + a_vector * VECTOR, s.C, s.S);
    const bool row_inside = tap.index < rows;
    const int dh = tap.r * s.dilation_h - s.pad_h, dw_ = tap.s * s.dilation_w - s.pad_w;
    // B: the thread's eight filters k..k+7, fixed.
    const int b_vector = tid % B_VECTORS, b_pixel = tid / B_VECTORS;
    const int k0 = tile_n * BLOCK_N + b_vector * VECTOR;
    const bool column_inside = k0 < s.K;

    // The stages are copied in order, each BLOCK_K pixels past the last: the walk keeps the A pixels' places.
    PixelWalk<A_PIXEL_COPIES> walk(s, first * BLOCK_K + a_pixel, A_PIXELS, BLOCK_K);
    auto copy_stage = [&](int stage, int step) {
        unsigned char* const a = tiles + stage * STAGE_BYTES;
        unsigned char* const b = a + A_BYTES;
#pragma unroll
        for (int i = 0; i < A_PIXEL_COPIES; ++i) {
            bool inside = row_inside;
            const u16* const source = walk.input(x, s, i, dh, dw_, tap.c, inside);
            copy_16(a + panel_swizzled(a_pixel + A_PIXELS * i, a_vector), source, inside);
        }
        walk.advance(s);
#pragma unroll
        for (int i = 0; i < B_PIXEL_COPIES; ++i) {
            const int row = b_pixel + B_PIXELS * i, pixel = step * BLOCK_K + row;
            const bool inside = column_inside && pixel < pixels;
            copy_16(b + panel_swizzled(row, b_vector), inside ? dy + pixel * s.channels_out() + k0 : dy, inside);
        }
    };

    float acc[ACCUMULATORS] = {};
#pragma unroll
    for (int stage = 0; stage < AHEAD; ++stage) {
        if (first + stage < last) copy_stage(stage, first + stage);
        commit_copies();
    }
    for (int step = first; step < last; ++step) {
        const int index = step - first;
        wait_copies<AHEAD - 1>();
        fence_async_proxy();
        __syncthreads();
        const unsigned a = shared_address(tiles + index % STAGES * STAGE_BYTES) + warpgroup * PANEL_BYTES;
        const unsigned b = shared_address(tiles + index % STAGES * STAGE_BYTES + A_BYTES);
        fence_accumulators(acc);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < BLOCK_K / 16; ++k)
            wgmma_tile<1>(acc, descriptor(a + 16 * 128 * k, PANEL_BYTES), descriptor(b + 16 * 128 * k, PANEL_BYTES));
        wgmma_commit();
        if (step + AHEAD < last) copy_stage((index + AHEAD) % STAGES, step + AHEAD);
        commit_copies();
        wgmma_wait<IN_FLIGHT>();
        fence_accumulators(acc);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    wait_copies<0>();

    add_filter_gradient_tile(acc, sums, s);
}
#else
// TF32: wgmma takes TF32 tiles K-major only, so both tiles lie along the pixels, as forward's lie along its
// reduction: a stage is BLOCK_K = 32 pixels, one 128-byte row of them for each of A's 128 rows (r, s, c) and each
// of B's BLOCK_N filters k, swizzled as forward's rows are. The channels-last operands lie the other way (a pixel's
// channels contiguous), so the copies turn them in registers: a thread loads 16-byte vectors (four channels of one
// pixel) and stores each one's four words down four rows of one column. A warp's task is 16 pixels of eight
// channels (two vectors, 32 contiguous bytes a pixel): lane l takes pixel l % 16 and vector l / 16, so that each of
// its four stores puts the warp's 32 words on 32 banks (rows four apart lie in the swizzle's two halves). A stage's
// loads are issued a step before their stores, which follow the step's products: the loads have a whole step.
constexpr int TASK_CHANNELS = 2 * VECTOR;     // the channels (rows) of a warp's task: 8
constexpr int TASK_PIXELS = 16;               // its pixels (columns)
constexpr int HALVES = BLOCK_K / TASK_PIXELS;  // 2
constexpr int WARPS = THREADS / 32;
// A warp's channel pairs (eight rows each) in A and in B, and its tasks: 4 in A, and 4 (BLOCK_N 128) or 2 (64) in B.
constexpr int A_PAIRS = BLOCK_M / TASK_CHANNELS / WARPS, B_PAIRS = BLOCK_N / TASK_CHANNELS / WARPS;
constexpr int A_TASKS = A_PAIRS * HALVES, B_TASKS = B_PAIRS * HALVES;
static_assert(BLOCK_N % (TASK_CHANNELS * WARPS) == 0, "every warp has the same tasks");

// A task's vector: four floats of one pixel (16-byte aligned: the channels' counts are multiples of 4), or zeros.
__device__ __forceinline__ float4 load_vector(const float* __restrict__ source, const bool inside) {
    return inside ? __ldg(reinterpret_cast<const float4*>(source)) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// Where a lane's four words go: down rows row..row + 3 of its column, for its first task (`first`: the byte
// offset of row `row`'s word). The row is a multiple of 4, its column within the stage's first 16 pixels, so word
// e's chunk is the first's XOR e (the swizzle XORs with row % 8, which is row's + e), 128·e bytes on. Another task
// is the same words 64·j rows on (8192·j bytes: whole swizzle periods) and, in the stage's second half of pixels,
// 16 columns on: chunk + 4, which is the chunk XOR 4 for the first half's chunks, before and after the swizzle.
__device__ __forceinline__ void store_down(unsigned char* tile, const int first, const int j, const int half,
                                           const float4 v) {
    unsigned char* const at = tile + 8192 * j;
    const int words[4] = {__float_as_int(v.x), __float_as_int(v.y), __float_as_int(v.z), __float_as_int(v.w)};
#pragma unroll
    for (int e = 0; e < 4; ++e) *reinterpret_cast<int*>(at + 128 * e + (first ^ (16 * e + 64 * half))) = words[e];
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
implicit_gemm_wgmma_backward_filter(const float* __restrict__ x, const float* __restrict__ dy,
                                    float* __restrict__ sums, const NhwcShape s, int steps_per_split) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    const int rows = s.R * s.S * s.C, pixels = s.N * s.P * s.Q, group = blockIdx.z;
    x += group * s.C;
    dy += group * s.K;
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int steps = (pixels + BLOCK_K - 1) / BLOCK_K;
    const int first = blockIdx.y * steps_per_split, count = min(first + steps_per_split, steps) - first;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, warpgroup = tid / 128;
    const int column = lane % TASK_PIXELS, vector_row = VECTOR * (lane / TASK_PIXELS);

    // Task i of the warp: channel pair j = i % PAIRS, rows task_row(j) of its tile (64·j rows past task_row(0)),
    // and pixel half i / PAIRS.
    auto task_row = [&](const int j) { return TASK_CHANNELS * (warp + WARPS * j) + vector_row; };
    // A's rows: fixed taps (r, s, c..c+3), kept as offsets from each pixel's first input tap (NOWHERE past the
    // matrix's rows: no pixel's tap is then inside x).
    int a_channel[A_PAIRS], a_top[A_PAIRS], a_left[A_PAIRS];
#pragma unroll
    for (int j = 0; j < A_PAIRS; ++j) {
        const Tap tap(tile_m * BLOCK_M + task_row(j), s.C, s.S);
        a_channel[j] = tap.c;
        a_top[j] = tap.index < rows ? tap.r * s.dilation_h - s.pad_h : NOWHERE;
        a_left[j] = tap.s * s.dilation_w - s.pad_w;
    }
    // B's rows: fixed filters k..k+3, tile_n · BLOCK_N + task_row(j).

    // The stages are loaded in order, each BLOCK_K pixels past the last: the walk keeps A's two pixels' places.
    PixelWalk<HALVES> walk(s, first * BLOCK_K + column, TASK_PIXELS, BLOCK_K);
    float4 a_values[A_TASKS], b_values[B_TASKS];
    auto load_stage = [&](const int step) {
#pragma unroll
        for (int i = 0; i < A_TASKS; ++i) {
            const int j = i % A_PAIRS, half = i / A_PAIRS;
            bool inside = true;
            const float* const source = walk.input(x, s, half, a_top[j], a_left[j], a_channel[j], inside);
            a_values[i] = load_vector(source, inside);
        }
        walk.advance(s);
#pragma unroll
        for (int i = 0; i < B_TASKS; ++i) {
            const int k = tile_n * BLOCK_N + task_row(i % B_PAIRS);
            const int pixel = step * BLOCK_K + TASK_PIXELS * (i / B_PAIRS) + column;
            const bool inside = k < s.K && pixel < pixels;
            b_values[i] = load_vector(inside ? dy + pixel * s.channels_out() + k : dy, inside);
        }
    };
    const int first_word = swizzled(task_row(0), column / 4) + 4 * (column % 4);  // the lane's, row task_row(0)
    auto store_stage = [&](const int buffer) {
        unsigned char* const a = tiles + buffer * STAGE_BYTES;
        unsigned char* const b = a + A_BYTES;
#pragma unroll
        for (int i = 0; i < A_TASKS; ++i) store_down(a, first_word, i % A_PAIRS, i / A_PAIRS, a_values[i]);
#pragma unroll
        for (int i = 0; i < B_TASKS; ++i) store_down(b, first_word, i % B_PAIRS, i / B_PAIRS, b_values[i]);
    };

    float acc[ACCUMULATORS] = {};
#pragma unroll
    for (int stage = 0; stage < AHEAD; ++stage) {
        if (stage < count) {
            load_stage(first + stage);
            store_stage(stage);
        }
    }
    if (AHEAD < count) load_stage(first + AHEAD);
    for (int index = 0; index < count; ++index) {
        // Every thread's stores of stage `index` are visible to wgmma after the barrier, and the products of stage
        // index − 1 − IN_FLIGHT, which read the buffer this step stores into, are done.
        fence_async_proxy();
        __syncthreads();
        multiply_stage(acc, shared_address(tiles + index % STAGES * STAGE_BYTES) + warpgroup * (A_BYTES / 2),
                       shared_address(tiles + index % STAGES * STAGE_BYTES + A_BYTES));
        if (index + AHEAD < count) {
            store_stage((index + AHEAD) % STAGES);
            if (index + AHEAD + 1 < count) load_stage(first + index + AHEAD + 1);
        }
        wgmma_wait<IN_FLIGHT>();
        fence_accumulators(acc);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    add_filter_gradient_tile(acc, sums, s);
}
#endif  // HALF
