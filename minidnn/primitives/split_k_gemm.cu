// Batched GEMM with the reduction split over CTAs, for products with a small output and a long
// reduction (blas.gemm_batched_split_k): Winograd's weight gradient, whose α²·G products of
// K/G × C/G (64 × 64 for ResNet's first 3x3 layers) each sum over every tile of the batch.
//
//     out[s][g] (M × N) = A[g][:, range s] · B[g][:, range s]ᵀ  (+ out[s][g] when accumulating)
//
// A (M × L) and B (N × L) are both stored reduction-contiguous (row-major, row strides lda and ldb),
// as Winograd's transformed tiles lie. Range s is the reduction indices [s·per, (s+1)·per), so each
// split writes its own partial product: the sum over s is left to the caller (Winograd's filter-
// gradient transform adds them as it reads), which keeps the result deterministic, unlike atomics.
//
// Why not cuBLAS there: its batched GEMM gives a small product few CTAs (ResNet's 36 products of
// 64 × 64 fill a fraction of 132 SMs); splitting the reduction multiplies the CTAs by the splits.
//
// One CTA of 128 threads computes a TILE_M × TILE_N tile of one split's product: 16 × 8 threads,
// each 8 rows × 6 columns of a 128 × 48 tile (4 × 6 of 64 × 48 for double). The reduction is walked
// TILE_K at a time. Tiles travel global -> shared with cp.async (sm_80+), STAGES steps in flight and
// no staging registers, which measured 1.06-1.7x faster than staging through registers on an H200
// (benchmarks/results/2026-12-01-h200-split-k-gemm.md). Each element is a 4-byte (8 for double) copy:
// the tiles' rows are not 16-byte aligned in general (Winograd's row length is the tile count).

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// Builds for other depths and occupancies (benchmarks/split_k_gemm.py compares them) define these.
#ifndef STAGES
#define STAGES 3
#endif
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 4  // at most 128 registers a thread; shared memory allows four too
#endif
constexpr bool FLOAT = sizeof(scalar_t) == sizeof(float);
constexpr int THREADS = 128;
constexpr int THREADS_M = 16, THREADS_N = 8;
constexpr int THREAD_M = FLOAT ? 8 : 4;  // a double takes two registers: half the rows
constexpr int THREAD_N = 6;
constexpr int HALF_ROWS = THREAD_M / 2;  // a thread's rows lie in two runs, one in each half of the tile
constexpr int TILE_M = THREADS_M * THREAD_M;
constexpr int TILE_N = THREADS_N * THREAD_N;
constexpr int TILE_K = FLOAT ? 16 : 8;
// Shared tiles are [k][row], rows padded by 4 values: still 16-byte aligned for the FMA loop's vector reads.
constexpr int LDA = TILE_M + 4;
constexpr int LDB = TILE_N + 4;
// Each thread copies these many elements of A and of B per step: TILE_K consecutive reduction indices
// of a row are read by TILE_K consecutive threads (one coalesced run per row).
constexpr int ROWS_PER_PASS = THREADS / TILE_K;
constexpr int A_LOADS = TILE_M / ROWS_PER_PASS;
constexpr int B_LOADS = TILE_N / ROWS_PER_PASS;
static_assert(THREAD_N % 2 == 0, "columns are read in pairs");
static_assert(TILE_M % ROWS_PER_PASS == 0 && TILE_N % ROWS_PER_PASS == 0, "whole passes");

struct SplitKShape {
    int M, N, L;          // out is M × N, reduction L
    int lda, ldb;         // row strides of A and B (elements)
    int batch_a, batch_b; // strides between consecutive A and B matrices (0: one shared matrix)
    int batch;            // matrices per split: out is [splits][batch][M][N]
    int per_split;        // reduction indices per split, a multiple of TILE_K
    int accumulate;       // add to out instead of overwriting it
};

// SIZE consecutive values read from shared memory as one vector (16 bytes for a run of rows, 8 or 16 for
// a pair of columns).
template <int SIZE>
struct alignas(SIZE * sizeof(scalar_t)) Values {
    scalar_t v[SIZE];
};

__device__ __forceinline__ void copy_async(scalar_t* shared, const scalar_t* global, bool inside) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    // src-size 0 fills the shared element with zeros and reads nothing (the pointer is not dereferenced).
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(address), "l"(global),
                 "n"(sizeof(scalar_t)), "r"(inside ? int(sizeof(scalar_t)) : 0));
}

// Start the copies of one step's elements of this thread (rows row0 + ROWS_PER_PASS·i, reduction k) into
// the shared tile; zeros past the matrix or past the split.
template <int LOADS, int LD>
__device__ __forceinline__ void copy_step(scalar_t (*tile)[LD], const scalar_t* __restrict__ matrix, int ld,
                                          int rows, int row0, int lane, int k, int k_end) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int row = row0 + ROWS_PER_PASS * i;
        const bool inside = row < rows && k < k_end;
        copy_async(&tile[lane][row], matrix + (inside ? row * ld + k : 0), inside);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM)
    split_k_gemm(const scalar_t* __restrict__ A, const scalar_t* __restrict__ B, scalar_t* __restrict__ out,
                 const SplitKShape s) {
    __shared__ __align__(16) scalar_t a_tile[STAGES][TILE_K][LDA];
    __shared__ __align__(16) scalar_t b_tile[STAGES][TILE_K][LDB];

    const int matrix = blockIdx.z % s.batch, split = blockIdx.z / s.batch;
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    const int k_begin = split * s.per_split, k_end = min(s.L, k_begin + s.per_split);
    const scalar_t* a = A + (long long)matrix * s.batch_a + (long long)m0 * s.lda;
    const scalar_t* b = B + (long long)matrix * s.batch_b + (long long)n0 * s.ldb;
    const int lane = threadIdx.x % TILE_K, first_row = threadIdx.x / TILE_K;
    const int rows_a = s.M - m0, rows_b = s.N - n0;
    const int tm = threadIdx.x / THREADS_N, tn = threadIdx.x % THREADS_N;

    scalar_t accumulator[THREAD_M][THREAD_N] = {};
    const int steps = k_end > k_begin ? (k_end - k_begin + TILE_K - 1) / TILE_K : 0;
    // The first STAGES - 1 steps' copies are started before any FMA; every step then starts the copies of
    // the step STAGES - 1 ahead into the buffer the step before it used. One commit group per step, empty
    // or not, so that "all but the newest STAGES - 2 groups have landed" always means "this step's".
#pragma unroll
    for (int stage = 0; stage < STAGES - 1; ++stage) {
        if (stage < steps) {
            const int k = k_begin + stage * TILE_K + lane;
            copy_step<A_LOADS>(a_tile[stage], a, s.lda, rows_a, first_row, lane, k, k_end);
            copy_step<B_LOADS>(b_tile[stage], b, s.ldb, rows_b, first_row, lane, k, k_end);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();  // step's tiles have landed for every thread; step - 1's buffer is free
        const int next = step + STAGES - 1;
        if (next < steps) {
            const int k = k_begin + next * TILE_K + lane;
            copy_step<A_LOADS>(a_tile[next % STAGES], a, s.lda, rows_a, first_row, lane, k, k_end);
            copy_step<B_LOADS>(b_tile[next % STAGES], b, s.ldb, rows_b, first_row, lane, k, k_end);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        const int buffer = step % STAGES;
#pragma unroll
        for (int k = 0; k < TILE_K; ++k) {
            // Rows tm·HALF_ROWS.. and TILE_M/2 + tm·HALF_ROWS..: a warp's 4 values of tm read one
            // 64-byte run per half; columns in pairs, pair j at 16·j + 2·tn, a warp's 8 values of tn one run.
            scalar_t rows[THREAD_M], columns[THREAD_N];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const Values<HALF_ROWS> run =
                    *reinterpret_cast<const Values<HALF_ROWS>*>(&a_tile[buffer][k][half * (TILE_M / 2) + tm * HALF_ROWS]);
#pragma unroll
                for (int i = 0; i < HALF_ROWS; ++i) rows[half * HALF_ROWS + i] = run.v[i];
            }
#pragma unroll
            for (int j = 0; j < THREAD_N / 2; ++j) {
                const Values<2> pair = *reinterpret_cast<const Values<2>*>(&b_tile[buffer][k][16 * j + 2 * tn]);
                columns[2 * j] = pair.v[0];
                columns[2 * j + 1] = pair.v[1];
            }
#pragma unroll
            for (int i = 0; i < THREAD_M; ++i)
#pragma unroll
                for (int j = 0; j < THREAD_N; ++j) accumulator[i][j] = fma(rows[i], columns[j], accumulator[i][j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);  // no copy may still be writing when the CTA exits

    scalar_t* c = out + ((long long)split * s.batch + matrix) * s.M * s.N;
#pragma unroll
    for (int i = 0; i < THREAD_M; ++i) {
        const int row = m0 + (i / HALF_ROWS) * (TILE_M / 2) + tm * HALF_ROWS + i % HALF_ROWS;
        if (row >= s.M) continue;
#pragma unroll
        for (int j = 0; j < THREAD_N; ++j) {
            const int column = n0 + 16 * (j / 2) + 2 * tn + j % 2;
            if (column >= s.N) continue;
            scalar_t* element = c + row * s.N + column;
            *element = s.accumulate ? *element + accumulator[i][j] : accumulator[i][j];
        }
    }
}
