// Implicit GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): implicit_gemm_nhwc.cu's gather of 16-byte
// channels-last vectors by cp.async, but the tiles laid out in shared memory as wgmma reads them, 128-byte rows
// swizzled, and each warpgroup multiplying its 64 rows by the whole tile's columns at once.
//
//                    rows M       columns N   reduction       A (gathered)            B
//   forward          N·P·Q        K           R·S·C           x  (N, H, W, C)        w  (K, R, S, C)
//   backward-filter  R·S·C        K           N·P·Q, split    x  (N, H, W, C)        dy (N, P, Q, K)
//
// Stride-1 backward-data runs the forward kernel on dy and the turned filter, as in implicit_gemm_nhwc.py. The TMA
// build (below) copies each stage of the forward kernel, of the strided backward-data's phase kernel and of the half
// backward-filter by the bulk tensor copy engine instead of the gather, where a group's channels fill whole stages;
// implicit_gemm_wgmma.FORWARD_TMA, PHASES_TMA and FILTER_TMA say at which widths.
// The values are float16 or bfloat16 (HALF 1, 2), or float32 multiplied as TF32 (HALF 0, below).
//
// One CTA of 256 threads is two warpgroups; it computes a 128 × BLOCK_N tile of C, BLOCK_K reduction values a
// stage, STAGES stages (three by default) of cp.async copies. A stage holds A (128 rows) and B (BLOCK_N rows) as
// rows of 128 bytes (64 half values or 32 floats): the K-major layout with the 128-byte swizzle, in which 16-byte
// chunk j of row r lies at chunk j ^ (r % 8) of its row, so that the eight rows of a 1024-byte group spread each
// column of chunks over all 32 banks. A shared-memory descriptor names a tile to wgmma (its start, 1024 bytes from
// one group of 8 rows to the next, the swizzle); one wgmma reduces 32 bytes of each row (k16 for half values, k8
// for TF32), so the k-th of a stage's four starts 32·k bytes into the rows. Each warpgroup issues four m64nN wgmma
// a stage, then, while they run, the copies of the stage two on (into the buffer the products of the step before
// read), then waits for them. The pipeline is a build (STAGES, IN_FLIGHT: stages of shared memory, product groups
// left in flight across the barrier); implicit_gemm_wgmma.PIPELINES says which runs.
//
// BLOCK_N is 128, 64 for a product 64 columns wide or less, or 256 for the TF32 backward-filter of more than 128
// filters (implicit_gemm_wgmma.tile_width says which). A 256-wide tile copies and turns its 128 rows of A once for
// twice the columns: three quarters of the copies a product. Its 128 float32 accumulators a thread and its stages
// leave room for one CTA an SM (the launch bounds say so); forward and backward-data at 256 were slower on most
// layers.
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
// backward-filter turns its operands in shared memory, between their copies and the products (below).

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
#ifndef PRODUCER  // 1: the forward kernel's copies by a producer warpgroup, through mbarriers (below)
#define PRODUCER 0
#endif
#ifndef TMA  // 1: the copies by the bulk tensor copy engine (below): forward's (either pipeline), the phases', filter's
#define TMA 0
#endif
// The forward kernel's launch bounds: the CTAs an SM its registers are sized for. A 64-wide tile's three stages
// (73 KiB with the period) leave room for three in the 227 KiB of shared memory, and its 32 accumulators a thread
// fit the 80 registers that leaves each thread: a third CTA hides more of each one's waits at barriers and copies.
// A 128-wide tile's stages leave room for two, a 256-wide tile's for one.
#ifndef FORWARD_CTAS_PER_SM
#define FORWARD_CTAS_PER_SM (BLOCK_N == 256 ? 1 : BLOCK_N == 64 ? 3 : 2)
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

// mbarriers (the PRODUCER and TMA builds'): 8 bytes of shared memory each, completing a phase once their count of
// arrivals, and of the bytes they expect, has come.
__device__ __forceinline__ void barrier_init(const unsigned barrier, const unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed (parity 1 before the first: at once).
__device__ __forceinline__ void barrier_wait(const unsigned barrier, const unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(barrier), "r"(parity) : "memory");
}
__device__ __forceinline__ void barrier_arrive(const unsigned barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
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
__device__ __forceinline__ void wgmma_n256(float (&d)[128], const uint64_t a, const uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned." WGMMA_TYPES(256) " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "
        "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
        "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
        "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
        "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "
        "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "
        "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, "
        "%126, %127}, %128, %129, p, 1, 1"
        TRANSPOSES(131) ";\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
          "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
          "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
          "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
          "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
          "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
          "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b), "r"(1), "n"(TRANSPOSED));
}

template <int TRANSPOSED>
__device__ __forceinline__ void wgmma_tile(float (&d)[ACCUMULATORS], const uint64_t a, const uint64_t b) {
#if BLOCK_N == 256
    wgmma_n256<TRANSPOSED>(d, a, b);
#elif BLOCK_N == 128
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

// The K-major pipeline (forward's, and the TF32 backward-filter's): `steps` stages, copy(buffer, index) issuing the
// cp.async copies of the index-th stage into buffer `buffer`, committed here. AHEAD stages of copies are in flight
// while one is multiplied: stage `index` has landed once at most AHEAD − 1 later groups are pending; after the barrier
// every thread's copies of it are visible to wgmma, and the products of stage index − 1 − IN_FLIGHT, which last read
// the buffer the next copies go into, are done.
template <class Copy>
__device__ __forceinline__ void k_major_pipeline(float (&acc)[ACCUMULATORS], unsigned char* const tiles,
                                                 const int steps, Copy copy) {
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
#pragma unroll
    for (int stage = 0; stage < AHEAD; ++stage) {
        if (stage < steps) copy(stage, stage);
        commit_copies();
    }
    for (int index = 0; index < steps; ++index) {
        wait_copies<AHEAD - 1>();
        fence_async_proxy();
        __syncthreads();
        multiply_stage(acc, shared_address(tiles + index % STAGES * STAGE_BYTES) + warpgroup * (A_BYTES / 2),
                       shared_address(tiles + index % STAGES * STAGE_BYTES + A_BYTES));
        // While the tensor cores multiply, the copies of the stage AHEAD on go into the buffer those products
        // last read.
        if (index + AHEAD < steps) copy((index + AHEAD) % STAGES, index + AHEAD);
        commit_copies();
        wgmma_wait<IN_FLIGHT>();
        fence_accumulators(acc);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    wait_copies<0>();
}

// The accumulators of `thread` (0 ... THREADS − 1 of the two warpgroups that multiply) rounded once into the output
// tile: an m64nN product's fragment, row g and g + 8 of each 16-row slice of its warpgroup's 64, columns 2q and 2q + 1
// of each 8.
__device__ __forceinline__ void fill_output_tile(const float (&acc)[ACCUMULATORS], OutputTile& out, const int thread) {
    const int t = thread % 128, g = t % 32 / 4, q = t % 4, row0 = thread / 128 * 64 + t / 32 * 16 + g;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i)
#pragma unroll
        for (int v = 0; v < 4; ++v) out.at(row0 + v / 2 * 8, 8 * i + 2 * q + v % 2) = stored(acc[4 * i + v]);
}

// The forward tile's epilogue: the accumulators into the output tile (over the pipeline's memory, which the caller's
// barrier has freed), then stored.
__device__ __forceinline__ void store_forward_tile(const float (&acc)[ACCUMULATORS], unsigned char* const tiles,
                                                   Element* __restrict__ y, const NhwcShape& s, const int tile_m,
                                                   const int tile_n) {
    OutputTile& out = *reinterpret_cast<OutputTile*>(tiles);
    fill_output_tile(acc, out, threadIdx.x);
    __syncthreads();
    store_output_tile<BLOCK_M, BLOCK_N, THREADS>(out, y, s, tile_m, tile_n);
}

// One CTA's tile of the forward product: tile `tile` of group blockIdx.z (its m and n tiles, n fastest).
__device__ __forceinline__ void forward_tile(const Element* __restrict__ x, const Element* __restrict__ w,
                                             Element* __restrict__ y, const NhwcShape& s, const int tile) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    const int reduction = s.R * s.S * s.C, group = blockIdx.z;
    x += group * s.C;
    w += group * s.K * reduction;
    y += group * s.K * (Y_LAST ? 1 : s.P * s.Q);
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = tile / n_tiles, tile_n = tile % n_tiles;
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

    float acc[ACCUMULATORS] = {};
    k_major_pipeline(acc, tiles, (reduction + BLOCK_K - 1) / BLOCK_K, [&](int buffer, int) { copy_stage(buffer); });
    __syncthreads();  // the output tile reuses the pipeline's memory
    store_forward_tile(acc, tiles, y, s, tile_m, tile_n);
}

#if TMA
// The TMA build of the forward kernel: the barrier pipeline above, each stage copied by the bulk tensor copy engine
// instead of the threads' gathers. One thread issues a stage's two copies: A, the tile's 128 output pixels at one tap,
// 128 bytes of channels each, through an im2col tensor map of x, which zero-fills the padding and the pixels past the
// last image; and B, the tile's BLOCK_N filter rows, the same 128 bytes of their reduction, through a tiled map of w
// (K·G, R·S·C). Both land in the stage's 128-byte-swizzled rows and complete on the stage's mbarrier, which expects
// their bytes. A stage is one tap of one 128-byte slice of a group's channels, so C (per group) is a multiple of
// BLOCK_K here; the stages run taps in order, slices within a tap, as the gathers' reduction index does, and the sums
// come out bit for bit the gathers'. implicit_gemm_wgmma.py encodes the maps (tensor_map.py) and says which problems
// take this build. With PRODUCER too, the producer warpgroup's thread 0 issues the copies (below).
struct alignas(64) TensorMap {  // cuda.h's CUtensorMap: opaque, 128 bytes
    unsigned long long words[16];
};

__device__ __forceinline__ void expect_bytes(const unsigned barrier, const unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}

// 128 pixels × 128 bytes of x into `destination`: the first pixel's window corner (w, h), its image n and channel c,
// the tap's offsets within the window.
__device__ __forceinline__ void copy_pixels(const unsigned destination, const TensorMap& map, const unsigned barrier,
                                            const int c, const int w, const int h, const int n,
                                            const unsigned short tap_w, const unsigned short tap_h) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};\n"
        ::"r"(destination), "l"(reinterpret_cast<uint64_t>(&map)), "r"(barrier), "r"(c), "r"(w), "r"(h), "r"(n),
        "h"(tap_w), "h"(tap_h) : "memory");
}

// BLOCK_N rows × 128 bytes of w from row `row`, value `column` into `destination`.
__device__ __forceinline__ void copy_rows(const unsigned destination, const TensorMap& map, const unsigned barrier,
                                          const int column, const int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
        ::"r"(destination), "l"(reinterpret_cast<uint64_t>(&map)), "r"(barrier), "r"(column), "r"(row) : "memory");
}

// Output pixel `pixel` (of N·P·Q, in order) as an im2col copy names the first of its pixels: its image n and its
// window's corner (h, w) = (p·stride − pad, q·stride − pad).
struct WindowCorner {
    int n, h, w;

    __device__ __forceinline__ WindowCorner(const NhwcShape& s, const int pixel) {
        const int PQ = s.P * s.Q, pq = pixel % PQ;
        n = pixel / PQ;
        h = pq / s.Q * s.stride_h - s.pad_h;
        w = pq % s.Q * s.stride_w - s.pad_w;
    }
};

// A tile's stages through the two maps: its first pixel's window corner, its first filter row of w (K·G, R·S·C);
// stage `index` is tap index / slices, channel slice index % slices, of group blockIdx.z.
struct TmaTile {
    WindowCorner corner;
    int filter_row, slices;

    __device__ __forceinline__ TmaTile(const NhwcShape& s, const int tile_m, const int tile_n)
        : corner(s, tile_m * BLOCK_M), filter_row(blockIdx.z * s.K + tile_n * BLOCK_N), slices(s.C / BLOCK_K) {}

    // Stage `index`'s two copies into the stage at shared address `a`, completing on `barrier`, which expects them.
    __device__ __forceinline__ void copy(const unsigned a, const unsigned barrier, const int index, const NhwcShape& s,
                                         const TensorMap& x_map, const TensorMap& w_map) const {
        const int tap = index / slices, r = tap / s.S, c = blockIdx.z * s.C + (index - tap * slices) * BLOCK_K;
        expect_bytes(barrier, STAGE_BYTES);
        copy_pixels(a, x_map, barrier, c, corner.w, corner.h, corner.n, (tap - r * s.S) * s.dilation_w,
                    r * s.dilation_h);
        copy_rows(a + A_BYTES, w_map, barrier, index * BLOCK_K, filter_row);
    }
};
#ifndef PREFETCH_TENSOR_MAPS  // 1: the issuing thread fetches both maps into the descriptor cache before its barriers
#define PREFETCH_TENSOR_MAPS 0
#endif

// The maps are kernel parameters; the first copy through each waits for its 128 bytes to reach the copy engine's
// descriptor cache unless this has brought them there while the barriers are set up.
__device__ __forceinline__ void prefetch_maps(const TensorMap& first_map, const TensorMap& second_map) {
    if (!PREFETCH_TENSOR_MAPS) return;
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&first_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&second_map)) : "memory");
}

// The TMA builds' stage barriers: one mbarrier a stage at `full`, each completing once the copy engine has landed the
// bytes its one expecting arrival names; thread 0 sets them up (first fetching the maps, PREFETCH_TENSOR_MAPS) and the
// CTA's barrier makes them seen before any thread waits on one.
__device__ __forceinline__ void init_stage_barriers(const unsigned full, const TensorMap& first_map,
                                                    const TensorMap& second_map) {
    if (threadIdx.x == 0) {
        prefetch_maps(first_map, second_map);
#pragma unroll
        for (int stage = 0; stage < STAGES; ++stage) barrier_init(full + 8 * stage, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // seen by the copy engine
    }
    __syncthreads();
}

// The TMA builds' barrier pipeline: `steps` stages, thread 0 issuing stage `index`'s copies into buffer `buffer` by
// copy(buffer, index), completing on that buffer's barrier in `full`; multiply(stage address) issues a landed stage's
// products. AHEAD stages of copies are in flight while one is multiplied.
template <class Copy, class Multiply>
__device__ __forceinline__ void tma_pipeline(float (&acc)[ACCUMULATORS], const unsigned first_stage,
                                             const unsigned full, const int steps, Copy copy, Multiply multiply) {
    const int tid = threadIdx.x;
    if (tid == 0)
#pragma unroll
        for (int stage = 0; stage < AHEAD; ++stage)
            if (stage < steps) copy(stage, stage);
    for (int index = 0; index < steps; ++index) {
        const int buffer = index % STAGES;
        barrier_wait(full + 8 * buffer, index / STAGES & 1);
        // Every warpgroup is past its products of stage index − 1 − IN_FLIGHT, the last to read the buffer the next
        // copies go into.
        __syncthreads();
        multiply(first_stage + buffer * STAGE_BYTES);
        if (tid == 0 && index + AHEAD < steps) copy((index + AHEAD) % STAGES, index + AHEAD);
        wgmma_wait<IN_FLIGHT>();
        fence_accumulators(acc);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
}

#define FORWARD_OPERANDS const __grid_constant__ TensorMap x_map, const __grid_constant__ TensorMap w_map
#else
#define FORWARD_OPERANDS const Element* __restrict__ x, const Element* __restrict__ w
#endif

#if TMA && !PRODUCER
static_assert(sizeof(OutputTile) <= STAGES * STAGE_BYTES, "the output tile lies in the stages, before the barriers");

// One CTA's tile of the TMA forward product: tile `tile` of group blockIdx.z (its m and n tiles, n fastest), its stages
// copied through x_map and w_map. Launched with STAGES · 8 bytes more shared memory than the barrier build: the
// stages' mbarriers after the stages.
__device__ __forceinline__ void tma_forward_tile(const TensorMap& x_map, const TensorMap& w_map,
                                                 Element* __restrict__ y, const NhwcShape& s, const unsigned tile) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    const unsigned first_stage = shared_address(tiles), full = first_stage + STAGES * STAGE_BYTES;
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N, tile_m = tile / n_tiles, tile_n = tile % n_tiles;
    y += blockIdx.z * s.K * (Y_LAST ? 1 : s.P * s.Q);
    const TmaTile copies(s, tile_m, tile_n);
    const int steps = s.R * s.S * copies.slices, warpgroup = static_cast<int>(threadIdx.x) / 128;
    init_stage_barriers(full, x_map, w_map);

    float acc[ACCUMULATORS] = {};
    tma_pipeline(
        acc, first_stage, full, steps,
        [&](const int buffer, const int index) {
            copies.copy(first_stage + buffer * STAGE_BYTES, full + 8 * buffer, index, s, x_map, w_map);
        },
        [&](const unsigned stage) { multiply_stage(acc, stage + warpgroup * (A_BYTES / 2), stage + A_BYTES); });
    __syncthreads();  // the output tile reuses the pipeline's memory
    store_forward_tile(acc, tiles, y, s, tile_m, tile_n);
}

extern "C" __global__ void __launch_bounds__(THREADS, FORWARD_CTAS_PER_SM)
implicit_gemm_wgmma_forward(FORWARD_OPERANDS, Element* __restrict__ y, const NhwcShape s) {
    tma_forward_tile(x_map, w_map, y, s, blockIdx.x);
}
#elif !PRODUCER
extern "C" __global__ void __launch_bounds__(THREADS, FORWARD_CTAS_PER_SM)
implicit_gemm_wgmma_forward(const Element* __restrict__ x, const Element* __restrict__ w, Element* __restrict__ y,
                            const NhwcShape s) {
    forward_tile(x, w, y, s, blockIdx.x);
}
#else
// The PRODUCER build of the forward kernel: one or two more warpgroups copy, the two others only multiply, and one
// CTA an SM runs tile after tile (a persistent kernel: blockIdx.x, then gridDim.x on). Above, every thread copies,
// and a CTA barrier a stage makes the tensor cores wait for the slowest copy of the CTA, and the copies for the
// products; a second CTA on the SM fills those waits. Here each stage has two mbarriers: `full`, on which each
// producer thread's copies arrive as they land (cp.async.mbarrier.arrive), and `empty`, on which each consumer warp
// arrives once its products have read the stage. The producers run up to STAGES stages ahead of the products, into
// the next tile while the consumers store this one (the output tile has memory of its own), and IN_FLIGHT product
// groups stay in flight while the next stage's are issued. One CTA of 384 or 512 threads leaves 168 or 128
// registers a thread, enough for the consumers' accumulators (ptxas allocates every role at the launch bounds'
// count, setmaxnreg or not). It timed slower than the barrier pipeline: implicit_gemm_wgmma.FORWARD_PRODUCER says
// which widths take it (none).
#ifndef PRODUCER_WARPGROUPS
#define PRODUCER_WARPGROUPS 1  // or 2: one CTA of 512 threads still leaves the consumers 128 registers
#endif
constexpr int PRODUCER_THREADS = 128 * PRODUCER_WARPGROUPS, FORWARD_THREADS = THREADS + PRODUCER_THREADS;
constexpr int CONSUMER_WARPS = THREADS / 32;
constexpr int PRODUCER_ROWS_PER_PASS = PRODUCER_THREADS / CHUNKS;  // 16 a warpgroup
constexpr int PRODUCER_A_COPIES = BLOCK_M / PRODUCER_ROWS_PER_PASS;
constexpr int PRODUCER_B_COPIES = BLOCK_N / PRODUCER_ROWS_PER_PASS;
static_assert(sizeof(OutputTile) % 16 == 0, "the barriers after the output tile stay 8-byte aligned");

// The barrier receives one arrival once every cp.async this thread has issued has landed.
__device__ __forceinline__ void arrive_when_copied(const unsigned barrier) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}
// A barrier of the two consumer warpgroups alone (barrier 0 is __syncthreads').
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
}

extern "C" __global__ void __launch_bounds__(FORWARD_THREADS, 1)
implicit_gemm_wgmma_forward(FORWARD_OPERANDS, Element* __restrict__ y, const NhwcShape s) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    OutputTile& out = *reinterpret_cast<OutputTile*>(tiles + STAGES * STAGE_BYTES);
    const unsigned full = shared_address(&out + 1), empty = full + 8 * STAGES;  // 8 bytes a barrier
    if (threadIdx.x == 0) {
#if TMA
        prefetch_maps(x_map, w_map);
#endif
#pragma unroll
        for (int stage = 0; stage < STAGES; ++stage) {
            barrier_init(full + 8 * stage, TMA ? 1 : PRODUCER_THREADS);  // the copy engine's: one expecting arrival
            barrier_init(empty + 8 * stage, CONSUMER_WARPS);
        }
        if (TMA) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int reduction = s.R * s.S * s.C, group = blockIdx.z, steps = (reduction + BLOCK_K - 1) / BLOCK_K;
#if !TMA
    x += group * s.C;
    w += group * s.K * reduction;
#endif
    y += group * s.K * (Y_LAST ? 1 : s.P * s.Q);
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tiles_count = (s.N * s.P * s.Q + BLOCK_M - 1) / BLOCK_M * n_tiles;

    if (threadIdx.x < PRODUCER_THREADS) {
#if TMA
        if (threadIdx.x == 0) {  // one thread issues every copy; C per group fills whole stages here
            int index = 0;
            for (int tile = blockIdx.x; tile < tiles_count; tile += gridDim.x) {
                const TmaTile copies(s, tile / n_tiles, tile % n_tiles);
                for (int step = 0; step < steps; ++step, ++index) {
                    const int stage = index % STAGES;
                    barrier_wait(empty + 8 * stage, (index / STAGES & 1) ^ 1);
                    copies.copy(shared_address(tiles + stage * STAGE_BYTES), full + 8 * stage, step, s, x_map, w_map);
                }
            }
        }
        return;
#else
        const int chunk = threadIdx.x % CHUNKS, copy_row = threadIdx.x / CHUNKS;
        int index = 0;  // the stages copied so far, over all the CTA's tiles
        for (int tile = blockIdx.x; tile < tiles_count; tile += gridDim.x) {
            ForwardGather<PRODUCER_A_COPIES, PRODUCER_B_COPIES> gather(
                s, tile / n_tiles * BLOCK_M + copy_row, tile % n_tiles * BLOCK_N + copy_row,
                PRODUCER_ROWS_PER_PASS, chunk * VECTOR);
            for (int step = 0; step < steps; ++step, ++index) {
                const int stage = index % STAGES;
                barrier_wait(empty + 8 * stage, (index / STAGES & 1) ^ 1);  // its last products have read it
                unsigned char* const a = tiles + stage * STAGE_BYTES;
                unsigned char* const b = a + A_BYTES;
                gather.copy_stage(x, w, s, reduction, BLOCK_K,
                                  [&](int i) { return a + swizzled(copy_row + PRODUCER_ROWS_PER_PASS * i, chunk); },
                                  [&](int i) { return b + swizzled(copy_row + PRODUCER_ROWS_PER_PASS * i, chunk); });
                arrive_when_copied(full + 8 * stage);
            }
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
        return;
#endif
    }

    const int thread = threadIdx.x - PRODUCER_THREADS, warpgroup = thread / 128, lane = thread % 32;
    int index = 0;  // the stages multiplied so far
    for (int tile = blockIdx.x; tile < tiles_count; tile += gridDim.x) {
        float acc[ACCUMULATORS] = {};
        for (int step = 0; step < steps; ++step, ++index) {
            const int stage = index % STAGES;
            barrier_wait(full + 8 * stage, index / STAGES & 1);
            fence_async_proxy();
            multiply_stage(acc, shared_address(tiles + stage * STAGE_BYTES) + warpgroup * (A_BYTES / 2),
                           shared_address(tiles + stage * STAGE_BYTES + A_BYTES));
            wgmma_wait<IN_FLIGHT>();
            fence_accumulators(acc);
            // The stage whose products are now done goes back to the producer.
            if (step >= IN_FLIGHT && lane == 0) barrier_arrive(empty + 8 * ((index - IN_FLIGHT) % STAGES));
        }
        wgmma_wait<0>();
        fence_accumulators(acc);
        for (int last = 1; last <= min(IN_FLIGHT, steps); ++last)  // the stages still held
            if (lane == 0) barrier_arrive(empty + 8 * ((index - last) % STAGES));
        consumers_sync();  // the last tile's store has read the output tile
        fill_output_tile(acc, out, thread);
        consumers_sync();
        store_output_tile<BLOCK_M, BLOCK_N, THREADS>(out, y, s, tile / n_tiles, tile % n_tiles, thread);
    }
}
#endif

#if Y_PLACED
// A strided backward-data's phases in one launch (strided_dgrad.py): phase i is a forward product of dy with its
// turned sub-filter, at w + filter_offset[i], storing its rows at their places in dx (its shape's placement). Its
// tiles are blockIdx.x first_tile[i] ... first_tile[i + 1] − 1; the phases come longest reduction first, so the
// CTAs that run longest start first and the short ones fill the last wave.
constexpr int MAX_PHASES = 4;  // a stride of up to 2 × 2
struct Phases {
    NhwcShape shape[MAX_PHASES];
    int filter_offset[MAX_PHASES];
    int first_tile[MAX_PHASES + 1];  // first_tile[count] is the grid's x
    int count;
};

// The phase whose tiles blockIdx.x falls in.
__device__ __forceinline__ int phase_of_block(const Phases& phases) {
    int phase = 0;
    while (phase + 1 < phases.count && static_cast<int>(blockIdx.x) >= phases.first_tile[phase + 1]) ++phase;
    return phase;
}

#if TMA && !PRODUCER
// The TMA build of the phase kernel: each phase's stages copied through its own two maps, an im2col map of dy whose
// box of window corners is exactly the phase's cropped output (tensor_map.im2col_arguments' padding_after) and a
// tiled map of its turned sub-filter (C·G, R_a·S_b·K); the tile code is the TMA forward kernel's. The phase's
// channels (K per group) fill whole stages here.
struct PhaseMaps {
    TensorMap dy[MAX_PHASES];
    TensorMap w[MAX_PHASES];
};

extern "C" __global__ void __launch_bounds__(THREADS, FORWARD_CTAS_PER_SM)
implicit_gemm_wgmma_phases(const __grid_constant__ PhaseMaps maps, Element* __restrict__ dx, const Phases phases) {
    const int phase = phase_of_block(phases);
    tma_forward_tile(maps.dy[phase], maps.w[phase], dx, phases.shape[phase], blockIdx.x - phases.first_tile[phase]);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS, FORWARD_CTAS_PER_SM)
implicit_gemm_wgmma_phases(const Element* __restrict__ dy, const Element* __restrict__ w, Element* __restrict__ dx,
                           const Phases phases) {
    const int phase = phase_of_block(phases);
    forward_tile(dy, w + phases.filter_offset[phase], dx, phases.shape[phase], blockIdx.x - phases.first_tile[phase]);
}
#endif
#endif

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

// Both builds' copies of a stage: each thread copies 16-byte vectors of one fixed column of A (VECTOR consecutive
// rows (r, s, c..) of dwᵀ: x's channels c.. at one tap of a pixel) and of one fixed column of B (VECTOR filters k..
// of dy), for A_PIXEL_COPIES and B_PIXEL_COPIES of the stage's BLOCK_K pixels, A_PIXELS and B_PIXELS apart.
// `a_at(pixel, vector)` and `b_at(pixel, vector)` give the shared-memory destination: each build lays the stage out
// its own way.
constexpr int A_VECTORS = BLOCK_M / VECTOR, B_VECTORS = BLOCK_N / VECTOR;  // vectors per pixel
constexpr int A_PIXELS = THREADS / A_VECTORS, B_PIXELS = THREADS / B_VECTORS;  // pixels per pass
constexpr int A_PIXEL_COPIES = BLOCK_K / A_PIXELS, B_PIXEL_COPIES = BLOCK_K / B_PIXELS;

struct FilterGradientCopies {
    Tap tap;  // the first of the thread's A rows
    int top, left;  // its tap's offsets from each pixel's first input tap
    int a_vector, a_pixel, b_vector, b_pixel, k0;
    bool row_inside, column_inside;
    PixelWalk<A_PIXEL_COPIES> walk;  // the stages are copied in order, each BLOCK_K pixels past the last

    __device__ __forceinline__ FilterGradientCopies(const NhwcShape& s, const int rows, const int tile_m,
                                                    const int tile_n, const int first_step)
        : tap(tile_m * BLOCK_M + threadIdx.x % A_VECTORS * VECTOR, s.C, s.S),
          walk(s, first_step * BLOCK_K + static_cast<int>(threadIdx.x) / A_VECTORS, A_PIXELS, BLOCK_K) {
        const int tid = threadIdx.x;
        a_vector = tid % A_VECTORS, a_pixel = tid / A_VECTORS;
        row_inside = tap.index < rows;
        top = tap.r * s.dilation_h - s.pad_h, left = tap.s * s.dilation_w - s.pad_w;
        b_vector = tid % B_VECTORS, b_pixel = tid / B_VECTORS;
        k0 = tile_n * BLOCK_N + b_vector * VECTOR;
        column_inside = k0 < s.K;
    }

    template <typename AAt, typename BAt>
    __device__ __forceinline__ void copy_stage(const Element* __restrict__ x, const Element* __restrict__ dy,
                                               const NhwcShape& s, const int pixels, const int step, const AAt& a_at,
                                               const BAt& b_at) {
#pragma unroll
        for (int i = 0; i < A_PIXEL_COPIES; ++i) {
            bool inside = row_inside;
            const Element* const source = walk.input(x, s, i, top, left, tap.c, inside);
            copy_16(a_at(a_pixel + A_PIXELS * i, a_vector), source, inside);
        }
        walk.advance(s);
#pragma unroll
        for (int i = 0; i < B_PIXEL_COPIES; ++i) {
            const int row = b_pixel + B_PIXELS * i, pixel = step * BLOCK_K + row;
            const bool inside = column_inside && pixel < pixels;
            copy_16(b_at(row, b_vector), inside ? dy + pixel * s.channels_out() + k0 : dy, inside);
        }
    }
};

#if HALF != 0
// Half values: both operands lie along M and N (a pixel's eight channels c..c+7 of one tap of x, its eight filters
// k..k+7 of dy), so the tiles are MN-major: a stage stores, for each 64-wide panel of M (or N), one 128-byte
// row per pixel, swizzled as forward's rows are; a wgmma reads them transposed. The warpgroup's A is its own
// panel; B's panels lie PANEL_BYTES apart (the descriptor's leading offset); each k16 step starts 16 rows on.
constexpr int PANEL_BYTES = BLOCK_K * 128;  // 64 pixels × 64 values

// The byte offset of chunk `vector` (values 8·vector ..) of pixel row `row` in an MN-major stage of panels.
__device__ __forceinline__ int panel_swizzled(const int row, const int vector) {
    return vector / 8 * PANEL_BYTES + swizzled(row, vector % 8);
}

// One stage's products on MN-major tiles: the warpgroup's panel of A (shared address a) times B's panels (b), one
// wgmma per 16 pixels of the stage, committed as one group.
__device__ __forceinline__ void multiply_panels(float (&acc)[ACCUMULATORS], const unsigned a, const unsigned b) {
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BLOCK_K / 16; ++k)
        wgmma_tile<1>(acc, descriptor(a + 16 * 128 * k, PANEL_BYTES), descriptor(b + 16 * 128 * k, PANEL_BYTES));
    wgmma_commit();
}

#if TMA
// The TMA build of the half backward-filter: the barrier pipeline of the TMA forward kernel, each stage copied by
// the bulk tensor copy engine instead of the threads' gathers. A stage is BLOCK_K = 64 pixels; thread 0 issues
//   A: for each 64-row panel of the tile's rows (r, s, c), the stage's pixels × 128 bytes of x's channels at that
//      panel's tap, through an im2col map of x (boxes of 64 pixels): C (per group) is a multiple of 64 here, so a
//      panel is one tap's 64 channels. A panel past R·S·C is not copied; its rows' sums are dropped at the end.
//   B: for each 64-wide panel of the tile's filters, the same pixels × 128 bytes of dy's, through a tiled map of dy
//      (N·P·Q, K·G).
// Each box lands as the gathers lay a panel, one 128-byte row a pixel, swizzled; the engine zero-fills the padding,
// the pixels past N·P·Q and the filters past K·G, as the gathers copy zeros there. Filters of the next group that a
// last column tile reads are dropped at the end, as the gathers' are never copied. The products, and so the sums,
// are the gathers' bit for bit.
extern "C" __global__ void __launch_bounds__(THREADS, BLOCK_N == 256 ? 1 : 2)
implicit_gemm_wgmma_backward_filter(const __grid_constant__ TensorMap x_map, const __grid_constant__ TensorMap dy_map,
                                    float* __restrict__ sums, const NhwcShape s, int steps_per_split) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    const unsigned first_stage = shared_address(tiles), full = first_stage + STAGES * STAGE_BYTES;
    const int rows = s.R * s.S * s.C, pixels = s.N * s.P * s.Q;
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int steps = (pixels + BLOCK_K - 1) / BLOCK_K;
    const int first = blockIdx.y * steps_per_split, count = min(first + steps_per_split, steps) - first;
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
    const int a_panels = min(BLOCK_M, rows - tile_m * BLOCK_M) / BLOCK_K, filter = blockIdx.z * s.K + tile_n * BLOCK_N;
    init_stage_barriers(full, x_map, dy_map);

    auto copy_stage = [&](const int buffer, const int index) {  // thread 0 only
        const unsigned a = first_stage + buffer * STAGE_BYTES, barrier = full + 8 * buffer;
        const int pixel = (first + index) * BLOCK_K;
        const WindowCorner corner(s, pixel);
        expect_bytes(barrier, a_panels * PANEL_BYTES + B_BYTES);
        for (int panel = 0; panel < a_panels; ++panel) {
            const int row = tile_m * BLOCK_M + BLOCK_K * panel, tap = row / s.C, r = tap / s.S;
            copy_pixels(a + panel * PANEL_BYTES, x_map, barrier, blockIdx.z * s.C + row - tap * s.C, corner.w,
                        corner.h, corner.n, (tap - r * s.S) * s.dilation_w, r * s.dilation_h);
        }
#pragma unroll
        for (int panel = 0; panel < BLOCK_N / BLOCK_K; ++panel)
            copy_rows(a + A_BYTES + panel * PANEL_BYTES, dy_map, barrier, filter + BLOCK_K * panel, pixel);
    };

    float acc[ACCUMULATORS] = {};
    tma_pipeline(acc, first_stage, full, count, copy_stage, [&](const unsigned stage) {
        multiply_panels(acc, stage + warpgroup * PANEL_BYTES, stage + A_BYTES);
    });
    add_filter_gradient_tile(acc, sums, s);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS, BLOCK_N == 256 ? 1 : 2)
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
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;

    FilterGradientCopies copies(s, rows, tile_m, tile_n, first);
    auto copy_stage = [&](int stage, int step) {
        unsigned char* const a = tiles + stage * STAGE_BYTES;
        unsigned char* const b = a + A_BYTES;
        copies.copy_stage(x, dy, s, pixels, step,
                          [&](int pixel, int vector) { return a + panel_swizzled(pixel, vector); },
                          [&](int pixel, int vector) { return b + panel_swizzled(pixel, vector); });
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
        multiply_panels(acc, shared_address(tiles + index % STAGES * STAGE_BYTES) + warpgroup * PANEL_BYTES,
                        shared_address(tiles + index % STAGES * STAGE_BYTES + A_BYTES));
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
#endif  // TMA
#else
// TF32: wgmma takes TF32 tiles K-major only, so both tiles lie along the pixels, as forward's lie along its
// reduction: a stage is BLOCK_K = 32 pixels, one 128-byte row of them for each of A's 128 rows (r, s, c) and each
// of B's BLOCK_N filters k, swizzled as forward's rows are. The channels-last operands lie the other way (a pixel's
// channels contiguous), so a stage is copied as it lies, in 16-byte vectors (the half build's copies), into a
// staging buffer of one row per pixel (A's 128 values, then B's BLOCK_N, each row padded by one vector), and the
// CTA then turns it into the K-major tiles in shared memory: a warp reads one vector column for all 32 pixels (lane
// l pixel l: the padding puts each quarter-warp's eight 16-byte reads on all 32 banks) and writes its four rows,
// each a 128-byte row of 32 pixels that the swizzle spreads over all 32 banks.
//
// The pipeline: two staging buffers, and two stages of tiles where the shared memory holds them (64- and 256-wide
// tiles: one CTA an SM at 256, two at 64). There, while the tensor cores multiply stage i's tiles, the CTA turns
// stage i + 1 (copied while stage i − 1 was multiplied) into the other tiles. A 128-wide tile keeps one stage of
// tiles, so that two CTAs fit an SM: each turns stage i + 1 once its products of stage i are done, and the other
// CTA's products fill that time. Then, behind the barrier that ends the step, the copies of stage i + 3 go into the
// staging buffer stage i + 1 left.
constexpr int WARPS = THREADS / 32;
constexpr int A_STAGING_ROW = BLOCK_M + VECTOR, B_STAGING_ROW = BLOCK_N + VECTOR;  // floats a pixel
constexpr int STAGING_BYTES = BLOCK_K * (A_STAGING_ROW + B_STAGING_ROW) * 4;
constexpr int TILE_BUFFERS = BLOCK_N == 128 ? 1 : 2, STAGING_BUFFERS = 2;
static_assert(A_VECTORS % WARPS == 0 && B_VECTORS % WARPS == 0, "every warp turns as many vector columns");

// Vector column `column` (rows VECTOR·column ..) of a staging buffer whose pixel rows are `row_floats` apart, for
// pixel `pixel` (the lane), into the K-major tile at `tile`.
__device__ __forceinline__ void turn_column(const float* staging, const int row_floats, unsigned char* tile,
                                            const int column, const int pixel) {
    const float4 v = *reinterpret_cast<const float4*>(staging + pixel * row_floats + VECTOR * column);
    const float values[VECTOR] = {v.x, v.y, v.z, v.w};
    const int word = swizzled(0, pixel / 4) + 4 * (pixel % 4);
#pragma unroll
    for (int u = 0; u < VECTOR; ++u) {
        const int row = VECTOR * column + u;
        *reinterpret_cast<float*>(tile + row * ROW_BYTES + (word ^ ((row & 7) << 4))) = values[u];
    }
}

// A staging buffer's stage into K-major tiles (A, then B A_BYTES on).
__device__ __forceinline__ void turn_stage(const unsigned char* staging, unsigned char* tile) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = threadIdx.x % 32;
    const float* const a = reinterpret_cast<const float*>(staging);
    const float* const b = a + BLOCK_K * A_STAGING_ROW;
#pragma unroll
    for (int j = 0; j < A_VECTORS / WARPS; ++j) turn_column(a, A_STAGING_ROW, tile, warp + WARPS * j, lane);
#pragma unroll
    for (int j = 0; j < B_VECTORS / WARPS; ++j) turn_column(b, B_STAGING_ROW, tile + A_BYTES, warp + WARPS * j, lane);
}

// One CTA an SM for 256-wide tiles (195 KiB of tiles and staging buffers), two for 64- and 128-wide ones (99 KiB
// each): implicit_gemm_wgmma.ctas_per_sm says the same.
extern "C" __global__ void __launch_bounds__(THREADS, BLOCK_N == 256 ? 1 : 2)
implicit_gemm_wgmma_backward_filter(const float* __restrict__ x, const float* __restrict__ dy,
                                    float* __restrict__ sums, const NhwcShape s, int steps_per_split) {
    const unsigned base = shared_address(shared_memory);
    unsigned char* const tiles = shared_memory + ((base + GROUP_BYTES - 1) / GROUP_BYTES * GROUP_BYTES - base);
    unsigned char* const staging = tiles + TILE_BUFFERS * STAGE_BYTES;
    const int rows = s.R * s.S * s.C, pixels = s.N * s.P * s.Q, group = blockIdx.z;
    x += group * s.C;
    dy += group * s.K;
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int steps = (pixels + BLOCK_K - 1) / BLOCK_K;
    const int first = blockIdx.y * steps_per_split, count = min(first + steps_per_split, steps) - first;
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;

    FilterGradientCopies copies(s, rows, tile_m, tile_n, first);
    auto copy_stage = [&](const int buffer, const int index) {
        unsigned char* const a = staging + buffer * STAGING_BYTES;
        unsigned char* const b = a + BLOCK_K * A_STAGING_ROW * 4;
        copies.copy_stage(x, dy, s, pixels, first + index,
                          [&](int pixel, int vector) { return a + (pixel * A_STAGING_ROW + vector * VECTOR) * 4; },
                          [&](int pixel, int vector) { return b + (pixel * B_STAGING_ROW + vector * VECTOR) * 4; });
    };
    auto tile = [&](const int index) { return tiles + index % TILE_BUFFERS * STAGE_BYTES; };

    // Stages 0 and 1 copied; stage 0 turned; stage 2's copies behind the barrier that frees its buffer.
#pragma unroll
    for (int index = 0; index < STAGING_BUFFERS; ++index) {
        if (index < count) copy_stage(index, index);
        commit_copies();
    }
    wait_copies<1>();
    __syncthreads();
    turn_stage(staging, tile(0));
    fence_async_proxy();
    __syncthreads();
    if (2 < count) copy_stage(0, 2);
    commit_copies();

    float acc[ACCUMULATORS] = {};
    for (int index = 0; index < count; ++index) {
        const unsigned a = shared_address(tile(index));
        multiply_stage(acc, a + warpgroup * (A_BYTES / 2), a + A_BYTES);
        if (TILE_BUFFERS == 1) {
            wgmma_wait<0>();
            fence_accumulators(acc);
        }
        if (index + 1 < count) {
            // Stage index + 1's copies (all but the newest group, stage index + 2's) are in. Its tiles were last read
            // by the products of stage index − 1 (two stages of tiles), done before the barrier that ended that
            // step, or of stage index (one), done before this barrier.
            wait_copies<1>();
            __syncthreads();
            turn_stage(staging + (index + 1) % STAGING_BUFFERS * STAGING_BYTES, tile(index + 1));
        }
        if (TILE_BUFFERS == 2) {
            wgmma_wait<0>();
            fence_accumulators(acc);
        }
        fence_async_proxy();  // the turned tiles, written by this thread, visible to the next step's products
        __syncthreads();
        if (index + 3 < count) copy_stage((index + 1) % STAGING_BUFFERS, index + 3);
        commit_copies();
    }
    wait_copies<0>();
    add_filter_gradient_tile(acc, sums, s);
}
#endif  // HALF
