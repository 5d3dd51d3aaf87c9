// Half-precision implicit GEMM on channels-last copies of the operands: with the channels innermost, eight
// consecutive reduction values are 16 contiguous bytes, so each CTA gathers its tiles with 16-byte cp.async
// copies into a three-stage shared-memory pipeline and multiplies them with ldmatrix + mma.sync m16n8k16.
//
//                    rows M       columns N   reduction       A (gathered)            B
//   forward          N·P·Q        K           R·S·C           x  (N, H, W, C)        w  (K, R, S, C)
//   backward-filter  R·S·C        K           N·P·Q, split    x  (N, H, W, C)        dy (N, P, Q, K)
//
// Backward-data of a stride-1 convolution is the forward kernel run on dy (N, P, Q, K) with the filter turned
// (C, R, S, K), flipped in r and s, and the padding d·(R − 1) − pad (implicit_gemm_nhwc.py arranges it).
//
// One CTA of 256 threads (8 warps) computes a 128 × BLOCK_N tile of C (BLOCK_N 128, or 64 for a product with
// 64 columns or fewer, which a 128-wide tile would half waste), BLOCK_K = 32 reduction values a stage: each
// thread's copies of a stage are one cp.async group, and the copies of the next two stages are in flight while
// the tensor cores work on the current one. A copy whose tap falls on the padding, or past the matrix, reads
// zero bytes and fills 16 zero bytes (cp.async's src-size 0). The reduction index a thread copies is kept as
// (tap r, s; channel c) and advanced by BLOCK_K each stage, so the inner loop divides nothing.
//
// Shared-memory rows are padded by 8 values (16 bytes): the eight 16-byte row reads of one ldmatrix then fall
// on eight different groups of four banks. Forward's tiles are [row][k] (ldmatrix reads A's m16k16 and B's
// k16n8 fragments as they lie); backward-filter's are [k][row], since both of its operands are contiguous
// along the rows, and ldmatrix.trans turns them. Sums are float32; forward's epilogue rounds each once to
// nearest even and writes y in the caller's layout (N, K, P, Q) through shared memory, 32 consecutive pixels
// of one channel per warp store; backward-filter adds each split's partial sums into a float32 sum laid
// (K, R, S, C) with atomicAdd, which filter_gradient_to_float or _to_half lays out as dw (K, C, R, S).
//
// Groups: each is its own GEMM of the sizes above with C and K one group's (channels_last.cuh's NhwcShape),
// blockIdx.z = g. Its CTAs move x, y and dy to the group's channels and w and the sums to its filters, and step
// from pixel to pixel by all the channels.

#ifndef HALF
#define HALF 2  // 1: float16, 2: bfloat16 (both as 16-bit words)
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#include "../half.cuh"
#include "channels_last.cuh"

constexpr int THREADS = 256;
constexpr int BLOCK_M = 128;
constexpr int BLOCK_K = 32;  // two m16n8k16 steps a stage
constexpr int STAGES = 3;
constexpr int VECTOR = 8;    // half values in one 16-byte copy
constexpr int PAD = 8;
constexpr int WARPS_N = BLOCK_N == 128 ? 4 : 2;
constexpr int WARPS_M = THREADS / 32 / WARPS_N;
constexpr int WARP_M = BLOCK_M / WARPS_M;  // 64 (or 32 with BLOCK_N 64)
constexpr int WARP_N = BLOCK_N / WARPS_N;  // 32
constexpr int MI = WARP_M / 16;            // m16 tiles per warp
constexpr int NI = WARP_N / 8;             // n8 tiles per warp

struct ForwardTiles {
    u16 a[STAGES][BLOCK_M][BLOCK_K + PAD];
    u16 b[STAGES][BLOCK_N][BLOCK_K + PAD];
};
struct FilterTiles {
    u16 a[STAGES][BLOCK_K][BLOCK_M + PAD];
    u16 b[STAGES][BLOCK_K][BLOCK_N + PAD];
};
typedef OutputStage<BLOCK_M, BLOCK_N> OutputTile;  // forward's epilogue, over the pipeline's memory

extern __shared__ __align__(16) unsigned char shared_memory[];

// ---------------------------------------------------------------------------------------------------------------
// The instructions
// ---------------------------------------------------------------------------------------------------------------

// Four 8 × 8 blocks of 16-bit values, lanes 8j .. 8j + 7 giving block j's row addresses.
__device__ __forceinline__ void load_matrices(unsigned (&f)[4], const u16* address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                 : "r"(shared_address(address)));
}
__device__ __forceinline__ void load_matrices_transposed(unsigned (&f)[4], const u16* address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                 : "r"(shared_address(address)));
}

// c += a · b for one m16n8k16 tile: a = {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},
// b = {B[2t..][g], B[2t+8..][g]}, c = {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]} (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
#if HALF == 2
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#else
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#endif
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The warp's corner in the CTA's tile: warps along M fastest.
__device__ __forceinline__ int warp_row() { return threadIdx.x / 32 % WARPS_M * WARP_M; }
__device__ __forceinline__ int warp_column() { return threadIdx.x / 32 / WARPS_M * WARP_N; }

// One 8 × 8-block load per lane group for a fragment whose top-left element is (row, k) of the tile: each lane
// gives the address of its row of its group's block. [row][k] tiles (forward) are read as they lie; [k][row]
// tiles (backward-filter, whose operands are both contiguous along the rows) through ldmatrix.trans.
template <bool TRANSPOSED>
__device__ __forceinline__ void load_fragment(unsigned (&f)[4], const u16* tile, int leading, int row, int k) {
    const int lane_row = threadIdx.x % 8;
    if (TRANSPOSED) {
        load_matrices_transposed(f, tile + (k + lane_row) * leading + row);
    } else {
        load_matrices(f, tile + (row + lane_row) * leading + k);
    }
}

// One stage of the product: the warp's MI × NI m16n8 tiles over BLOCK_K. Lane group j = lane / 8 loads block j:
// for A, rows +8·(j % 2) and k +8·(j / 2) (a's register order); for B, columns +8·(j / 2) and k +8·(j % 2), the b
// registers of two n8 tiles. `leading_a`, `leading_b`: the tiles' row lengths in values.
template <bool TRANSPOSED>
__device__ __forceinline__ void multiply_stage(float (&acc)[MI][NI][4], const u16* a, int leading_a, const u16* b,
                                               int leading_b) {
    const int j = threadIdx.x % 32 / 8, row0 = warp_row(), column0 = warp_column();
#pragma unroll
    for (int k0 = 0; k0 < BLOCK_K; k0 += 16) {
        unsigned fa[MI][4], fb[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
            load_fragment<TRANSPOSED>(fa[mi], a, leading_a, row0 + mi * 16 + j % 2 * 8, k0 + j / 2 * 8);
#pragma unroll
        for (int nj = 0; nj < NI / 2; ++nj) {
            unsigned f[4];
            load_fragment<TRANSPOSED>(f, b, leading_b, column0 + nj * 16 + j / 2 * 8, k0 + j % 2 * 8);
            fb[2 * nj][0] = f[0], fb[2 * nj][1] = f[1], fb[2 * nj + 1][0] = f[2], fb[2 * nj + 1][1] = f[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma(acc[mi][ni], fa[mi], fb[ni][0], fb[ni][1]);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward: y (N, K, P, Q) = x (N, H, W, C) ⋆ w (K, R, S, C)
// ---------------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 2)
implicit_gemm_nhwc_forward(const u16* __restrict__ x, const u16* __restrict__ w, u16* __restrict__ y,
                           const NhwcShape s) {
    ForwardTiles& tiles = *reinterpret_cast<ForwardTiles*>(shared_memory);
    const int reduction = s.R * s.S * s.C, group = blockIdx.z;
    x += group * s.C;
    w += group * s.K * reduction;
    y += group * s.K * (Y_LAST ? 1 : s.P * s.Q);
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int tid = threadIdx.x, vector = tid % (BLOCK_K / VECTOR), copy_row = tid / (BLOCK_K / VECTOR);
    constexpr int ROWS_PER_PASS = THREADS / (BLOCK_K / VECTOR);  // 64
    constexpr int A_COPIES = BLOCK_M / ROWS_PER_PASS, B_COPIES = BLOCK_N / ROWS_PER_PASS;

    // Each thread copies vector `vector` of the rows copy_row + 64·i of A and B (channels_last.cuh's gather).
    ForwardGather<A_COPIES, B_COPIES> gather(s, tile_m * BLOCK_M + copy_row, tile_n * BLOCK_N + copy_row,
                                             ROWS_PER_PASS, vector * VECTOR);
    auto copy_stage = [&](int stage) {
        gather.copy_stage(
            x, w, s, reduction, BLOCK_K,
            [&](int i) { return &tiles.a[stage][copy_row + ROWS_PER_PASS * i][vector * VECTOR]; },
            [&](int i) { return &tiles.b[stage][copy_row + ROWS_PER_PASS * i][vector * VECTOR]; });
    };

    const int steps = (reduction + BLOCK_K - 1) / BLOCK_K;
    float acc[MI][NI][4] = {};
#pragma unroll
    for (int stage = 0; stage < STAGES - 1; ++stage) {
        if (stage < steps) copy_stage(stage);
        commit_copies();
    }
    // Stage `step` has landed once at most STAGES − 2 later groups are pending; the barrier also tells every
    // thread that the stage read last step is free for the copies of step + STAGES − 1.
    for (int step = 0; step < steps; ++step) {
        wait_copies<STAGES - 2>();
        __syncthreads();
        if (step + STAGES - 1 < steps) copy_stage((step + STAGES - 1) % STAGES);
        commit_copies();
        multiply_stage<false>(acc, &tiles.a[step % STAGES][0][0], BLOCK_K + PAD, &tiles.b[step % STAGES][0][0],
                              BLOCK_K + PAD);
    }
    wait_copies<0>();
    __syncthreads();  // the output tile reuses the pipeline's memory

    OutputTile& out = *reinterpret_cast<OutputTile*>(shared_memory);
    const int lane = tid % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int row = warp_row() + mi * 16 + g + v / 2 * 8, column = warp_column() + ni * 8 + 2 * t + v % 2;
                out.at(row, column) = half_word(acc[mi][ni][v]);
            }
    __syncthreads();
    store_output_tile<BLOCK_M, BLOCK_N, THREADS>(out, y, s, tile_m, tile_n);
}

// ---------------------------------------------------------------------------------------------------------------
// Backward-filter: sums (K, R, S, C) += Σ over this CTA's slice of pixels of x (N, H, W, C) and dy (N, P, Q, K),
// float32. blockIdx.y is the slice: `steps_per_split` stages of BLOCK_K pixels.
// ---------------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 2)
implicit_gemm_nhwc_backward_filter(const u16* __restrict__ x, const u16* __restrict__ dy, float* __restrict__ sums,
                                   const NhwcShape s, int steps_per_split) {
    FilterTiles& tiles = *reinterpret_cast<FilterTiles*>(shared_memory);
    const int rows = s.R * s.S * s.C, pixels = s.N * s.P * s.Q, group = blockIdx.z;
    x += group * s.C;
    dy += group * s.K;
    sums += group * s.K * rows;
    const int n_tiles = (s.K + BLOCK_N - 1) / BLOCK_N;
    const int tile_m = blockIdx.x / n_tiles, tile_n = blockIdx.x % n_tiles;
    const int steps = (pixels + BLOCK_K - 1) / BLOCK_K;
    const int first = blockIdx.y * steps_per_split, last = min(first + steps_per_split, steps);
    const int tid = threadIdx.x;
    constexpr int A_VECTORS = BLOCK_M / VECTOR, B_VECTORS = BLOCK_N / VECTOR;  // per pixel
    constexpr int A_PIXELS = THREADS / A_VECTORS, B_PIXELS = THREADS / B_VECTORS;  // per pass
    constexpr int A_COPIES = BLOCK_K / A_PIXELS, B_COPIES = BLOCK_K / B_PIXELS;

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
    PixelWalk<A_COPIES> walk(s, first * BLOCK_K + a_pixel, A_PIXELS, BLOCK_K);
    auto copy_stage = [&](int stage, int step) {
#pragma unroll
        for (int i = 0; i < A_COPIES; ++i) {
            bool inside = row_inside;
            const u16* const source = walk.input(x, s, i, dh, dw_, tap.c, inside);
            copy_16(&tiles.a[stage][a_pixel + A_PIXELS * i][a_vector * VECTOR], source, inside);
        }
        walk.advance(s);
#pragma unroll
        for (int i = 0; i < B_COPIES; ++i) {
            const int row = b_pixel + B_PIXELS * i, pixel = step * BLOCK_K + row;
            const bool inside = column_inside && pixel < pixels;
            copy_16(&tiles.b[stage][row][b_vector * VECTOR], inside ? dy + pixel * s.channels_out() + k0 : dy, inside);
        }
    };

    float acc[MI][NI][4] = {};
#pragma unroll
    for (int stage = 0; stage < STAGES - 1; ++stage) {
        if (first + stage < last) copy_stage(stage, first + stage);
        commit_copies();
    }
    for (int step = first; step < last; ++step) {
        const int index = step - first;
        wait_copies<STAGES - 2>();
        __syncthreads();
        if (step + STAGES - 1 < last) copy_stage((index + STAGES - 1) % STAGES, step + STAGES - 1);
        commit_copies();
        multiply_stage<true>(acc, &tiles.a[index % STAGES][0][0], BLOCK_M + PAD, &tiles.b[index % STAGES][0][0],
                             BLOCK_N + PAD);
    }
    wait_copies<0>();

    // C (row (r, s, c), column k) is sums[k][r][s][c]: a warp's eight consecutive rows g are 32 contiguous bytes.
    const int lane = tid % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int row = tile_m * BLOCK_M + warp_row() + mi * 16 + g + v / 2 * 8;
                const int k = tile_n * BLOCK_N + warp_column() + ni * 8 + 2 * t + v % 2;
                if (row < rows && k < s.K) atomicAdd(sums + k * rows + row, acc[mi][ni][v]);
            }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward-filter's finish: the float32 sums, laid (K, R, S, C) as the kernels add them, into dw (K, C, R, S)
// ---------------------------------------------------------------------------------------------------------------
// out[k][c][r][s] = sums[k][r][s][c], plus out's own value when `accumulate` is non-zero; one thread per value. The
// float32 build writes a float32 weight gradient; the half build rounds the sum once, to nearest even.
template <typename Out>
__device__ __forceinline__ void finish_filter_gradient(const float* __restrict__ sums, Out* __restrict__ out,
                                                       const int K, const int C, const int RS, const int accumulate) {
    const int total = K * C * RS;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int rs = i % RS, c = i / RS % C, k = i / RS / C;
        float value = sums[(k * RS + rs) * C + c];
        if constexpr (sizeof(Out) == 4) {
            out[i] = accumulate ? out[i] + value : value;
        } else {
            if (accumulate) value += HALF == 2 ? bfloat16_value(out[i]) : float16_value(out[i]);
            out[i] = half_word(value);
        }
    }
}
extern "C" __global__ void filter_gradient_to_float(const float* __restrict__ sums, float* __restrict__ out, int K,
                                                    int C, int RS, int accumulate) {
    finish_filter_gradient(sums, out, K, C, RS, accumulate);
}
extern "C" __global__ void filter_gradient_to_half(const float* __restrict__ sums, u16* __restrict__ out, int K,
                                                   int C, int RS, int accumulate) {
    finish_filter_gradient(sums, out, K, C, RS, accumulate);
}
