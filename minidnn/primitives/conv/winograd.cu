// The five Winograd transforms of the winograd_2x2, winograd_4x4 and winograd_4x4_5x5 algorithms, and the three
// of winograd_7x7_5x5's weight gradient (see winograd.py).
//
// Each is a "sandwich" out = L · in · Lᵀ with a small constant matrix L (Bᵀ, G, Aᵀ and, for the
// filter gradient, their transposes A and Gᵀ). The matrices are constexpr and the loops fully
// unrolled, so zero entries cost nothing and ±1 entries cost an addition: the compiler emits
// the hand-written transforms. One thread per (channel, tile) or per (k, c), grid-stride loops over the
// blocks a transform is given (`block` of `blocks`: the whole grid, or its share of a paired launch).
//
// Transformed arrays are α²-major, V[ξ·α + ν][channel][tile], ready for the α² batched GEMMs.
// Tiles are numbered (n, tile row, tile column), column fastest: consecutive threads take
// consecutive tiles along W, so each of their α² stores is one coalesced row segment and their
// loads of the image are m elements apart.

#ifndef SCALAR
#define SCALAR float
#endif
typedef SCALAR scalar_t;

// The image a tile transform reads (input, gradient) or writes (output), and its tiling.
struct TileShape {
    int N, channels, height, width;
    int origin_h, origin_w;  // where tile (0, 0) starts in the image: minus the padding (may be > 0)
    int tiles_h, tiles_w;
};

// ---------------------------------------------------------------------------------------------
// The transform matrices (Lavin & Gray; wincnn), as types whose entries are compile-time constants. Each
// matrix's entries are one constant table at namespace scope, not an array built inside `at`: the latter leaves
// the optimizer thousands of array copies to fold after full unrolling, and compiles several times slower.
// ---------------------------------------------------------------------------------------------
#define MATRIX(NAME, ROWS, COLS, ...)                                                    \
    __device__ constexpr scalar_t NAME##_entries[ROWS][COLS] = __VA_ARGS__;              \
    struct NAME {                                                                        \
        static constexpr int rows = ROWS, cols = COLS;                                   \
        __device__ static constexpr scalar_t at(int i, int j) { return NAME##_entries[i][j]; } \
    };

// F(2x2, 3x3): interpolation points 0, 1, -1 (α = 4).
MATRIX(InputMatrix2, 4, 4, {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}})
MATRIX(FilterMatrix2, 4, 3, {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}})
MATRIX(OutputMatrix2, 2, 4, {{1, 1, 1, 0}, {0, 1, -1, -1}})

// F(4x4, 3x3): interpolation points 0, 1, -1, 2, -2 (α = 6).
MATRIX(InputMatrix4, 6, 6, {{4, 0, -5, 0, 1, 0}, {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                            {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}})
MATRIX(FilterMatrix4, 6, 3, {{1.0 / 4, 0, 0}, {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                             {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}})
MATRIX(OutputMatrix4, 4, 6, {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}})

// F(4x4, 5x5): interpolation points 0, 1, -1, 2, -2, 1/2, -1/2 (α = 8).
MATRIX(InputMatrix4x5, 8, 8, {{1, 0, -21.0 / 4, 0, 21.0 / 4, 0, -1, 0},
                              {0, 1, 1, -17.0 / 4, -17.0 / 4, 1, 1, 0},
                              {0, -1, 1, 17.0 / 4, -17.0 / 4, -1, 1, 0},
                              {0, 0.5, 0.25, -2.5, -1.25, 2, 1, 0},
                              {0, -0.5, 0.25, 2.5, -1.25, -2, 1, 0},
                              {0, 2, 4, -2.5, -5, 0.5, 1, 0},
                              {0, -2, 4, 2.5, -5, -0.5, 1, 0},
                              {0, -1, 0, 21.0 / 4, 0, -21.0 / 4, 0, 1}})
MATRIX(FilterMatrix4x5, 8, 5, {{1, 0, 0, 0, 0},
                               {-2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9},
                               {-2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9},
                               {1.0 / 90, 1.0 / 45, 2.0 / 45, 4.0 / 45, 8.0 / 45},
                               {1.0 / 90, -1.0 / 45, 2.0 / 45, -4.0 / 45, 8.0 / 45},
                               {32.0 / 45, 16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45},
                               {32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45},
                               {0, 0, 0, 0, 1}})
MATRIX(OutputMatrix4x5, 4, 8, {{1, 1, 1, 1, 1, 1, 1, 0},
                               {0, 1, -1, 2, -2, 0.5, -0.5, 0},
                               {0, 1, 1, 4, 4, 0.25, 0.25, 0},
                               {0, 1, -1, 8, -8, 0.125, -0.125, 1}})

// F(7x7, 5x5), backward-filter only: points 0, ±3, ±1/3, ±3/2, ±2/3, 1 (α = 11), generated exactly by
// winograd.cook_toom (tests/test_conv_winograd.py checks these literals against it).
MATRIX(InputMatrix7x5, 11, 11, {
    {-1, 1, 425.0 / 36, -425.0 / 36, -4301.0 / 162, 4301.0 / 162, 425.0 / 36, -425.0 / 36, -1, 1, 0},
    {0, 1.0 / 3, -2.0 / 9, -433.0 / 108, 421.0 / 162, 787.0 / 81, -101.0 / 18, -209.0 / 36, 2, 1, 0},
    {0, -1.0 / 3, 4.0 / 9, 409.0 / 108, -421.0 / 81, -1153.0 / 162, 101.0 / 9, 7.0 / 36, -4, 1, 0},
    {0, 3, 6, -209.0 / 12, -101.0 / 6, 787.0 / 27, 421.0 / 54, -433.0 / 36, -2.0 / 3, 1, 0},
    {0, -3, 12, -7.0 / 12, -101.0 / 3, 1153.0 / 54, 421.0 / 27, -409.0 / 36, -4.0 / 3, 1, 0},
    {0, 2.0 / 3, -2.0 / 9, -433.0 / 54, 409.0 / 162, 1570.0 / 81, -43.0 / 9, -199.0 / 18, 1.0 / 2, 1, 0},
    {0, -2.0 / 3, 10.0 / 9, 385.0 / 54, -2045.0 / 162, -752.0 / 81, 215.0 / 9, -145.0 / 18, -5.0 / 2, 1, 0},
    {0, 3.0 / 2, 3.0 / 4, -199.0 / 12, -43.0 / 6, 785.0 / 27, 409.0 / 108, -433.0 / 36, -1.0 / 3, 1, 0},
    {0, -3.0 / 2, 15.0 / 4, 145.0 / 12, -215.0 / 6, 376.0 / 27, 2045.0 / 108, -385.0 / 36, -5.0 / 3, 1, 0},
    {0, 1, 0, -425.0 / 36, 0, 4301.0 / 162, 0, -425.0 / 36, 0, 1, 0},
    {0, -1, 1, 425.0 / 36, -425.0 / 36, -4301.0 / 162, 4301.0 / 162, 425.0 / 36, -425.0 / 36, -1, 1}})
MATRIX(FilterMatrix7x5, 11, 5, {
    {-1, 0, 0, 0, 0},
    {1.0 / 18480, 1.0 / 6160, 3.0 / 6160, 9.0 / 6160, 27.0 / 6160},
    {-1.0 / 36960, 1.0 / 12320, -3.0 / 12320, 9.0 / 12320, -27.0 / 12320},
    {6561.0 / 6160, 2187.0 / 6160, 729.0 / 6160, 243.0 / 6160, 81.0 / 6160},
    {6561.0 / 12320, -2187.0 / 12320, 729.0 / 12320, -243.0 / 12320, 81.0 / 12320},
    {-256.0 / 15015, -128.0 / 5005, -192.0 / 5005, -288.0 / 5005, -432.0 / 5005},
    {256.0 / 75075, -128.0 / 25025, 192.0 / 25025, -288.0 / 25025, 432.0 / 25025},
    {-6561.0 / 10010, -2187.0 / 5005, -1458.0 / 5005, -972.0 / 5005, -648.0 / 5005},
    {-6561.0 / 50050, 2187.0 / 25025, -1458.0 / 25025, 972.0 / 25025, -648.0 / 25025},
    {81.0 / 400, 81.0 / 400, 81.0 / 400, 81.0 / 400, 81.0 / 400},
    {0, 0, 0, 0, 1}})
MATRIX(OutputMatrix7x5, 7, 11, {
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0},
    {0, 3, -3, 1.0 / 3, -1.0 / 3, 3.0 / 2, -3.0 / 2, 2.0 / 3, -2.0 / 3, 1, 0},
    {0, 9, 9, 1.0 / 9, 1.0 / 9, 9.0 / 4, 9.0 / 4, 4.0 / 9, 4.0 / 9, 1, 0},
    {0, 27, -27, 1.0 / 27, -1.0 / 27, 27.0 / 8, -27.0 / 8, 8.0 / 27, -8.0 / 27, 1, 0},
    {0, 81, 81, 1.0 / 81, 1.0 / 81, 81.0 / 16, 81.0 / 16, 16.0 / 81, 16.0 / 81, 1, 0},
    {0, 243, -243, 1.0 / 243, -1.0 / 243, 243.0 / 32, -243.0 / 32, 32.0 / 243, -32.0 / 243, 1, 0},
    {0, 729, 729, 1.0 / 729, 1.0 / 729, 729.0 / 64, 729.0 / 64, 64.0 / 729, 64.0 / 729, 1, 1}})

template <class L>
struct Transposed {
    static constexpr int rows = L::cols, cols = L::rows;
    __device__ static constexpr scalar_t at(int i, int j) { return L::at(j, i); }
};

// One tile size: m outputs per side for an r×r filter, α = m + r − 1 inputs per side, and its five transforms.
template <int M, int R, class InputMatrix, class FilterMatrix, class OutputMatrix>
struct Tiling {
    static constexpr int m = M, r = R, alpha = M + R - 1;
    typedef InputMatrix Input;                     // Bᵀ: input tile -> V
    typedef FilterMatrix Filter;                   // G: filter -> U
    typedef OutputMatrix Output;                   // Aᵀ: M -> output tile
    typedef Transposed<OutputMatrix> Gradient;     // A: output-gradient tile -> its transform
    typedef Transposed<FilterMatrix> FilterGradient;  // Gᵀ: product -> filter gradient
};
typedef Tiling<2, 3, InputMatrix2, FilterMatrix2, OutputMatrix2> Tiling2;
typedef Tiling<4, 3, InputMatrix4, FilterMatrix4, OutputMatrix4> Tiling4;
typedef Tiling<4, 5, InputMatrix4x5, FilterMatrix4x5, OutputMatrix4x5> Tiling4x5;
typedef Tiling<7, 5, InputMatrix7x5, FilterMatrix7x5, OutputMatrix7x5> Tiling7x5;

// Row `row` of L times the vector (value(0), value(1), ...): the zero coefficients are skipped (their values
// never asked for) and the first term is a product, not an addition to zero, so a ±1 coefficient leaves a
// plain copy, add or subtract.
template <class L, class Value>
__device__ __forceinline__ scalar_t row_times_values(int row, Value value) {
    scalar_t sum = 0;
    bool empty = true;
#pragma unroll
    for (int k = 0; k < L::cols; ++k) {
        const scalar_t coefficient = L::at(row, k);
        if (coefficient != scalar_t(0)) {
            sum = empty ? coefficient * value(k) : fma(coefficient, value(k), sum);
            empty = false;
        }
    }
    return sum;
}

// Row `row` of L times the vector v.
template <class L>
__device__ __forceinline__ scalar_t row_times(int row, const scalar_t (&v)[L::cols]) {
    return row_times_values<L>(row, [&](int k) { return v[k]; });
}

// out = L · in · Lᵀ, computed as (L · in) then (· Lᵀ), the order the NumPy twin multiplies in.
template <class L>
__device__ __forceinline__ void sandwich(const scalar_t (&in)[L::cols][L::cols], scalar_t (&out)[L::rows][L::rows]) {
    scalar_t left[L::rows][L::cols];
#pragma unroll
    for (int j = 0; j < L::cols; ++j) {
        scalar_t column[L::cols];
#pragma unroll
        for (int k = 0; k < L::cols; ++k) column[k] = in[k][j];
#pragma unroll
        for (int i = 0; i < L::rows; ++i) left[i][j] = row_times<L>(i, column);
    }
#pragma unroll
    for (int i = 0; i < L::rows; ++i)
#pragma unroll
        for (int j = 0; j < L::rows; ++j) out[i][j] = row_times<L>(j, left[i]);
}

// The same out = L · in · Lᵀ, in the same order of operations (so bitwise the same), without holding `in` or
// L · in: row i of L · in is summed from `in`'s values read as needed, load(a, b), then multiplied by Lᵀ and
// handed to store(i, j, value). `in` is read once per non-zero of L's column: `load` must read memory each time
// (volatile), or the compiler keeps every value it read in registers again. For the tiles whose registers would
// spill otherwise: F(7x7, 5x5) in double, whose 11×11 tile and L · in alone take 484 registers.
template <class L, class Load, class Store>
__device__ __forceinline__ void sandwich_by_rows(Load load, Store store) {
#pragma unroll
    for (int i = 0; i < L::rows; ++i) {
        scalar_t row[L::cols];
#pragma unroll
        for (int j = 0; j < L::cols; ++j) row[j] = row_times_values<L>(i, [&](int k) { return load(k, j); });
#pragma unroll
        for (int j = 0; j < L::rows; ++j) store(i, j, row_times<L>(j, row));
    }
}

template <class T>
constexpr bool by_rows = sizeof(scalar_t) == sizeof(double) && T::alpha > 8;

// ---------------------------------------------------------------------------------------------
// The transforms, one template each, instantiated per tile size below
// ---------------------------------------------------------------------------------------------
// U[ξν][k][c] = (G · g · Gᵀ)[ξ][ν] for the r×r filter g = w[k][c], rotated by 180° when `rotate`
// (backward-data runs the forward algorithm on dy with the rotated filter). One thread per (k, c).
template <class T>
__device__ void filter_transform(const scalar_t* __restrict__ w, scalar_t* __restrict__ U, int filters, int rotate,
                                 int block, int blocks) {
    for (int i = block * blockDim.x + threadIdx.x; i < filters; i += blockDim.x * blocks) {
        constexpr int taps = T::r * T::r;
        scalar_t g[T::r][T::r];
#pragma unroll
        for (int tap = 0; tap < taps; ++tap) g[tap / T::r][tap % T::r] = w[i * taps + (rotate ? taps - 1 - tap : tap)];
        scalar_t u[T::alpha][T::alpha];
        sandwich<typename T::Filter>(g, u);
#pragma unroll
        for (int e = 0; e < T::alpha * T::alpha; ++e) U[e * filters + i] = u[e / T::alpha][e % T::alpha];
    }
}

// A tile transform's thread i as (channel, image, tile row, tile column): threads run over the tiles of
// one channel after another, tiles numbered (n, row, column), column fastest. `plane` is the channel's
// image plane's offset in an (N, channels, height, width) tensor.
struct TileOf {
    int row, column, plane;
};

__device__ __forceinline__ TileOf tile_of(int i, int tiles, const TileShape& shape) {
    const int tile = i % tiles, channel = i / tiles;
    const int column = tile % shape.tiles_w, rest = tile / shape.tiles_w;
    const int row = rest % shape.tiles_h, n = rest / shape.tiles_h;
    return {row, column, (n * shape.channels + channel) * shape.height * shape.width};
}

// V[ξν][c][tile] = (Bᵀ · d · B)[ξ][ν] for the α×α input patch d of each tile (zero outside the
// image: the padding). Patches of neighbouring tiles overlap by r − 1. One thread per (c, tile).
template <class T>
__device__ void input_transform(const scalar_t* __restrict__ x, scalar_t* __restrict__ V, const TileShape shape,
                                int block, int blocks) {
    const int tiles = shape.N * shape.tiles_h * shape.tiles_w;
    const int total = shape.channels * tiles;
    for (int i = block * blockDim.x + threadIdx.x; i < total; i += blockDim.x * blocks) {
        const TileOf t = tile_of(i, tiles, shape);
        const int top = t.row * T::m + shape.origin_h, left = t.column * T::m + shape.origin_w;
        const scalar_t* plane = x + t.plane;
        if constexpr (by_rows<T>) {
            sandwich_by_rows<typename T::Input>(
                [&](int a, int b) {
                    const int h = top + a, w = left + b;
                    const volatile scalar_t* value = plane + h * shape.width + w;
                    return h >= 0 && h < shape.height && w >= 0 && w < shape.width ? *value : scalar_t(0);
                },
                [&](int xi, int nu, scalar_t value) { V[(xi * T::alpha + nu) * total + i] = value; });
        } else {
            scalar_t d[T::alpha][T::alpha];
#pragma unroll
            for (int a = 0; a < T::alpha; ++a) {
                const int h = top + a;
#pragma unroll
                for (int b = 0; b < T::alpha; ++b) {
                    const int w = left + b;
                    const bool inside = h >= 0 && h < shape.height && w >= 0 && w < shape.width;
                    d[a][b] = inside ? plane[h * shape.width + w] : scalar_t(0);
                }
            }
            scalar_t v[T::alpha][T::alpha];
            sandwich<typename T::Input>(d, v);
#pragma unroll
            for (int e = 0; e < T::alpha * T::alpha; ++e) V[e * total + i] = v[e / T::alpha][e % T::alpha];
        }
    }
}

// y tile = Aᵀ · M · A for each (k, tile), its m×m outputs cropped at the image's bottom and right
// edges (the last row and column of tiles overhang when m does not divide the size).
template <class T>
__device__ void output_transform(const scalar_t* __restrict__ M, scalar_t* __restrict__ y, const TileShape shape,
                                 int block, int blocks) {
    const int tiles = shape.N * shape.tiles_h * shape.tiles_w;
    const int total = shape.channels * tiles;
    for (int i = block * blockDim.x + threadIdx.x; i < total; i += blockDim.x * blocks) {
        const TileOf t = tile_of(i, tiles, shape);
        scalar_t product[T::alpha][T::alpha];
#pragma unroll
        for (int e = 0; e < T::alpha * T::alpha; ++e) product[e / T::alpha][e % T::alpha] = M[e * total + i];
        scalar_t out[T::m][T::m];
        sandwich<typename T::Output>(product, out);
        scalar_t* plane = y + t.plane;
#pragma unroll
        for (int a = 0; a < T::m; ++a) {
            const int h = t.row * T::m + a;
#pragma unroll
            for (int b = 0; b < T::m; ++b) {
                const int w = t.column * T::m + b;
                if (h < shape.height && w < shape.width) plane[h * shape.width + w] = out[a][b];
            }
        }
    }
}

// E[ξν][k][tile] = (A · e · Aᵀ)[ξ][ν] for the m×m output-gradient tile e of each (k, tile), zero
// beyond the image (backward-filter: the output gradient plays the filter's part).
template <class T>
__device__ void gradient_transform(const scalar_t* __restrict__ dy, scalar_t* __restrict__ E, const TileShape shape,
                                   int block, int blocks) {
    const int tiles = shape.N * shape.tiles_h * shape.tiles_w;
    const int total = shape.channels * tiles;
    for (int i = block * blockDim.x + threadIdx.x; i < total; i += blockDim.x * blocks) {
        const TileOf t = tile_of(i, tiles, shape);
        const scalar_t* plane = dy + t.plane;
        scalar_t e[T::m][T::m];
#pragma unroll
        for (int a = 0; a < T::m; ++a) {
            const int h = t.row * T::m + a;
#pragma unroll
            for (int b = 0; b < T::m; ++b) {
                const int w = t.column * T::m + b;
                e[a][b] = h < shape.height && w < shape.width ? plane[h * shape.width + w] : scalar_t(0);
            }
        }
        scalar_t transformed[T::alpha][T::alpha];
        sandwich<typename T::Gradient>(e, transformed);
#pragma unroll
        for (int f = 0; f < T::alpha * T::alpha; ++f) E[f * total + i] = transformed[f / T::alpha][f % T::alpha];
    }
}

// dw[k][c] = Gᵀ · M · G (r×r) from the summed products M[ξν][k][c]; added to dw when `accumulate`.
// M is the sum of `splits` partial products M[s][ξν][k][c] (split-K's), added in order s = 0, 1, ...
template <class T>
__device__ void filter_gradient_transform(const scalar_t* __restrict__ M, scalar_t* __restrict__ dw, int filters,
                                          int accumulate, int splits, int block, int blocks) {
    constexpr int positions = T::alpha * T::alpha;
    for (int i = block * blockDim.x + threadIdx.x; i < filters; i += blockDim.x * blocks) {
        constexpr int taps = T::r * T::r;
        if constexpr (by_rows<T>) {
            sandwich_by_rows<typename T::FilterGradient>(
                [&](int a, int b) {
                    const volatile scalar_t* partial = M + (a * T::alpha + b) * filters + i;
                    scalar_t sum = partial[0];
                    for (int s = 1; s < splits; ++s) sum += partial[s * positions * filters];
                    return sum;
                },
                [&](int row, int column, scalar_t value) {
                    scalar_t* tap = &dw[i * taps + row * T::r + column];
                    *tap = accumulate ? *tap + value : value;
                });
        } else {
            scalar_t product[T::alpha][T::alpha];
#pragma unroll
            for (int e = 0; e < positions; ++e) product[e / T::alpha][e % T::alpha] = M[e * filters + i];
            for (int s = 1; s < splits; ++s)
#pragma unroll
                for (int e = 0; e < positions; ++e)
                    product[e / T::alpha][e % T::alpha] += M[(s * positions + e) * filters + i];
            scalar_t g[T::r][T::r];
            sandwich<typename T::FilterGradient>(product, g);
#pragma unroll
            for (int tap = 0; tap < taps; ++tap) {
                const scalar_t value = g[tap / T::r][tap % T::r];
                dw[i * taps + tap] = accumulate ? dw[i * taps + tap] + value : value;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels: the five transforms for F(2x2, 3x3) (suffix _2), F(4x4, 3x3) (suffix _4) and F(4x4, 5x5) (_4_5x5);
// backward-filter's three for F(7x7, 5x5) (_7_5x5). Each transform is a kernel of its own, and the pairs an
// algorithm issues back to back are one kernel too (two transforms, one launch: fewer launches for the host to make
// in an eager step): the first `first_blocks` blocks take the first transform, the rest the second. The two
// touch different memory, so they may run side by side.
// ---------------------------------------------------------------------------------------------
#define TILE_ARGS(NAME) const scalar_t* __restrict__ NAME##_in, scalar_t* __restrict__ NAME##_out, \
                        const TileShape NAME##_shape

#define WINOGRAD_WEIGHT_GRADIENT_KERNELS(SUFFIX, T)                                                             \
    extern "C" __global__ void winograd_input_transform##SUFFIX(const scalar_t* __restrict__ x,                  \
                                                                scalar_t* __restrict__ V, const TileShape shape) { \
        input_transform<T>(x, V, shape, blockIdx.x, gridDim.x);                                                  \
    }                                                                                                            \
    extern "C" __global__ void winograd_gradient_transform##SUFFIX(const scalar_t* __restrict__ dy,              \
                                                                   scalar_t* __restrict__ E,                     \
                                                                   const TileShape shape) {                      \
        gradient_transform<T>(dy, E, shape, blockIdx.x, gridDim.x);                                              \
    }                                                                                                            \
    extern "C" __global__ void winograd_filter_gradient_transform##SUFFIX(const scalar_t* __restrict__ M,        \
                                                                          scalar_t* __restrict__ dw,             \
                                                                          int filters, int accumulate,           \
                                                                          int splits) {                          \
        filter_gradient_transform<T>(M, dw, filters, accumulate, splits, blockIdx.x, gridDim.x);                 \
    }                                                                                                            \
    /* backward-filter: a chunk's images and its output gradient */                                             \
    extern "C" __global__ void winograd_input_and_gradient_transform##SUFFIX(TILE_ARGS(first), TILE_ARGS(second), \
                                                                             int first_blocks) {                 \
        if (blockIdx.x < first_blocks)                                                                           \
            input_transform<T>(first_in, first_out, first_shape, blockIdx.x, first_blocks);                     \
        else                                                                                                     \
            gradient_transform<T>(second_in, second_out, second_shape, blockIdx.x - first_blocks,               \
                                  gridDim.x - first_blocks);                                                     \
    }

#define WINOGRAD_KERNELS(SUFFIX, T)                                                                              \
    WINOGRAD_WEIGHT_GRADIENT_KERNELS(SUFFIX, T)                                                                  \
    extern "C" __global__ void winograd_filter_transform##SUFFIX(const scalar_t* __restrict__ w,                 \
                                                                 scalar_t* __restrict__ U, int filters,          \
                                                                 int rotate) {                                   \
        filter_transform<T>(w, U, filters, rotate, blockIdx.x, gridDim.x);                                       \
    }                                                                                                            \
    extern "C" __global__ void winograd_output_transform##SUFFIX(const scalar_t* __restrict__ M,                 \
                                                                 scalar_t* __restrict__ y, const TileShape shape) { \
        output_transform<T>(M, y, shape, blockIdx.x, gridDim.x);                                                 \
    }                                                                                                            \
    /* forward and backward-data: the filter and the first chunk's images */                                    \
    extern "C" __global__ void winograd_filter_and_input_transform##SUFFIX(                                      \
        const scalar_t* __restrict__ w, scalar_t* __restrict__ U, int filters, int rotate, TILE_ARGS(second),    \
        int first_blocks) {                                                                                      \
        if (blockIdx.x < first_blocks)                                                                           \
            filter_transform<T>(w, U, filters, rotate, blockIdx.x, first_blocks);                               \
        else                                                                                                     \
            input_transform<T>(second_in, second_out, second_shape, blockIdx.x - first_blocks,                  \
                               gridDim.x - first_blocks);                                                        \
    }                                                                                                            \
    /* forward and backward-data: a chunk's output, and the next chunk's images */                              \
    extern "C" __global__ void winograd_output_and_input_transform##SUFFIX(TILE_ARGS(first), TILE_ARGS(second),  \
                                                                           int first_blocks) {                   \
        if (blockIdx.x < first_blocks)                                                                           \
            output_transform<T>(first_in, first_out, first_shape, blockIdx.x, first_blocks);                    \
        else                                                                                                     \
            input_transform<T>(second_in, second_out, second_shape, blockIdx.x - first_blocks,                  \
                               gridDim.x - first_blocks);                                                        \
    }

WINOGRAD_KERNELS(_2, Tiling2)
WINOGRAD_KERNELS(_4, Tiling4)
WINOGRAD_KERNELS(_4_5x5, Tiling4x5)
WINOGRAD_WEIGHT_GRADIENT_KERNELS(_7_5x5, Tiling7x5)
