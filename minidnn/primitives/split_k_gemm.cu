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
// 64 × 64 fill a fraction of the GPU's SMs); splitting the reduction multiplies the CTAs by the splits.
//
// One CTA of 128 threads computes a TILE_M × TILE_N tile of one split's product: 16 × 8 threads,
// each 8 rows × 6 columns of a 128 × 48 tile (4 × 6 of 64 × 48 for double), rows tm + 16·i and
// columns tn + 8·j. The reduction is walked TILE_K at a time. Tiles travel global -> shared with
// cp.async (sm_80+), STAGES steps in flight and no staging registers. Shared tiles are [row][k], so
// the FMA loop reads VECTOR consecutive k of a row (16 bytes) at once, and rows 20 words apart put
// a warp's reads on distinct banks. Two entry points differ only in how they copy:
//
//   split_k_gemm_aligned   16-byte copies (VECTOR values); rows and matrices must start 16-byte aligned
//   split_k_gemm           one value per copy, any layout (Winograd's row length is the tile count)

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// Builds for other depths and occupancies (benchmarks/probes/winograd_weight_gradient_split_k.py compares them) define these.
#ifndef STAGES
#define STAGES 3
#endif
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 4  // at most 128 registers a thread; shared memory allows four too
#endif
#ifndef K_UNROLL
#define K_UNROLL 1  // the FMA loop's vectors of k unrolled 1 at a time: unrolled fully, 128 registers spill
#endif

constexpr int k_vectors_unrolled = K_UNROLL;  // (#pragma unroll takes a constant, not a macro)
constexpr bool FLOAT = sizeof(scalar_t) == sizeof(float);
constexpr int THREADS = 128;
constexpr int THREADS_M = 16, THREADS_N = 8;
constexpr int THREAD_M = FLOAT ? 8 : 4;  // a double takes two registers: half the rows
constexpr int THREAD_N = 6;
constexpr int TILE_M = THREADS_M * THREAD_M;
constexpr int TILE_N = THREADS_N * THREAD_N;
constexpr int VECTOR = 16 / sizeof(scalar_t);  // values in 16 bytes: one shared read, one aligned copy
constexpr int TILE_K = 4 * VECTOR;             // 16 floats or 8 doubles per step
constexpr int LDK = TILE_K + VECTOR;           // 20 words a row: 4 rows (8 columns) of a warp hit distinct banks

struct SplitKShape {
    int M, N, L;          // out is M × N, reduction L
    int lda, ldb;         // row strides of A and B (elements)
    int batch_a, batch_b; // strides between consecutive A and B matrices (0: one shared matrix)
    int batch;            // matrices per split: out is [splits][batch][M][N]
    int per_split;        // reduction indices per split, a multiple of TILE_K
    int accumulate;       // add to out instead of overwriting it
};

template <int SIZE>
struct alignas(SIZE * sizeof(scalar_t)) Values {
    scalar_t v[SIZE];
};

// Copy `count` values (0 to WIDTH: fewer zero-fill the rest, 0 reads nothing) of global memory into shared.
template <int WIDTH>
__device__ __forceinline__ void copy_async(scalar_t* shared, const scalar_t* global, int count) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    if (WIDTH * sizeof(scalar_t) == 16) {  // .cg (L2 only) takes 16-byte copies alone
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
                     "r"(count * int(sizeof(scalar_t))));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(address), "l"(global),
                     "n"(WIDTH * sizeof(scalar_t)), "r"(count * int(sizeof(scalar_t))));
    }
}

// Start the copies of one step of a ROWS × TILE_K tile, WIDTH values per copy: PER_ROW consecutive threads
// copy one row's TILE_K values, so a warp reads whole runs of rows; a pass of the CTA covers THREADS / PER_ROW
// rows. Zeros past the matrix's `rows` rows and past the split's end k_end.
template <int WIDTH, int ROWS>
__device__ __forceinline__ void copy_step(scalar_t (*tile)[LDK], const scalar_t* matrix, int ld, int rows, int k0,
                                          int k_end) {
    constexpr int PER_ROW = TILE_K / WIDTH, ROWS_PER_PASS = THREADS / PER_ROW;
    static_assert(THREADS % PER_ROW == 0, "a pass covers whole rows");
    const int first_row = threadIdx.x / PER_ROW, k = (threadIdx.x % PER_ROW) * WIDTH;
    const int count = max(0, min(WIDTH, k_end - (k0 + k)));  // the same in every row
    const scalar_t* source = matrix + first_row * ld + k0 + k;
#pragma unroll
    for (int pass = 0; pass < (ROWS + ROWS_PER_PASS - 1) / ROWS_PER_PASS; ++pass) {
        const int row = first_row + pass * ROWS_PER_PASS;
        if (ROWS % ROWS_PER_PASS != 0 && row >= ROWS) break;
        const int copied = row < rows ? count : 0;
        copy_async<WIDTH>(&tile[row][k], copied > 0 ? source + pass * ROWS_PER_PASS * ld : matrix, copied);
    }
}

template <int WIDTH>
__device__ __forceinline__ void split_k_gemm_body(const scalar_t* __restrict__ A, const scalar_t* __restrict__ B,
                                                  scalar_t* __restrict__ out, const SplitKShape& s) {
    __shared__ __align__(16) scalar_t a_tile[STAGES][TILE_M][LDK];
    __shared__ __align__(16) scalar_t b_tile[STAGES][TILE_N][LDK];

    const int matrix = blockIdx.z % s.batch, split = blockIdx.z / s.batch;
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    const int k_begin = split * s.per_split, k_end = min(s.L, k_begin + s.per_split);
    const scalar_t* a = A + (long long)matrix * s.batch_a + (long long)m0 * s.lda;
    const scalar_t* b = B + (long long)matrix * s.batch_b + (long long)n0 * s.ldb;
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
            copy_step<WIDTH, TILE_M>(a_tile[stage], a, s.lda, rows_a, k_begin + stage * TILE_K, k_end);
            copy_step<WIDTH, TILE_N>(b_tile[stage], b, s.ldb, rows_b, k_begin + stage * TILE_K, k_end);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();  // step's tiles have landed for every thread; step - 1's buffer is free
        const int next = step + STAGES - 1;
        if (next < steps) {
            copy_step<WIDTH, TILE_M>(a_tile[next % STAGES], a, s.lda, rows_a, k_begin + next * TILE_K, k_end);
            copy_step<WIDTH, TILE_N>(b_tile[next % STAGES], b, s.ldb, rows_b, k_begin + next * TILE_K, k_end);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        const scalar_t(*a_step)[LDK] = a_tile[step % STAGES];
        const scalar_t(*b_step)[LDK] = b_tile[step % STAGES];
#pragma unroll k_vectors_unrolled
        for (int k = 0; k < TILE_K; k += VECTOR) {
            Values<VECTOR> columns[THREAD_N];  // VECTOR consecutive k of each of this thread's columns
#pragma unroll
            for (int j = 0; j < THREAD_N; ++j)
                columns[j] = *reinterpret_cast<const Values<VECTOR>*>(&b_step[tn + THREADS_N * j][k]);
#pragma unroll
            for (int i = 0; i < THREAD_M; ++i) {
                const Values<VECTOR> row = *reinterpret_cast<const Values<VECTOR>*>(&a_step[tm + THREADS_M * i][k]);
#pragma unroll
                for (int kk = 0; kk < VECTOR; ++kk)
#pragma unroll
                    for (int j = 0; j < THREAD_N; ++j)
                        accumulator[i][j] = fma(row.v[kk], columns[j].v[kk], accumulator[i][j]);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);  // no copy may still be writing when the CTA exits

    scalar_t* c = out + ((long long)split * s.batch + matrix) * s.M * s.N;
#pragma unroll
    for (int i = 0; i < THREAD_M; ++i) {
        const int row = m0 + tm + THREADS_M * i;
        if (row >= s.M) continue;
#pragma unroll
        for (int j = 0; j < THREAD_N; ++j) {
            const int column = n0 + tn + THREADS_N * j;
            if (column >= s.N) continue;
            scalar_t* element = c + row * s.N + column;
            *element = s.accumulate ? *element + accumulator[i][j] : accumulator[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM)
    split_k_gemm(const scalar_t* __restrict__ A, const scalar_t* __restrict__ B, scalar_t* __restrict__ out,
                 const SplitKShape s) {
    split_k_gemm_body<1>(A, B, out, s);
}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM)
    split_k_gemm_aligned(const scalar_t* __restrict__ A, const scalar_t* __restrict__ B, scalar_t* __restrict__ out,
                         const SplitKShape s) {
    split_k_gemm_body<VECTOR>(A, B, out, s);
}
