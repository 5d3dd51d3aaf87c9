// Layout changes of (N, C, H, W) arrays (layout.py): C-contiguous (N, C, H·W) <-> channels-last (N, H·W, C).
// Both directions are one kernel: each image's rows × cols matrix transposed, (N, C, HW) -> (N, HW, C) with
// rows = C, or back with rows = HW. The elements are moved as raw words of 2, 4 or 8 bytes (any dtype). At the end,
// a filter's copy in the orders the implicit GEMMs on channels-last operands read.
//
// A block moves a 32 × 32 tile through shared memory: its 256 threads read 8 rows of 32 consecutive columns
// (coalesced), then write 8 columns of the tile as rows of the output (coalesced again); the tile's extra column
// keeps the transposed reads of one warp on 32 different banks. blockIdx = (cols / 32, rows / 32, N).
//
// A narrow matrix (rows or cols under NARROW in layout.py: a 3-channel image, a 3 × 3 filter's taps) would leave a
// tile mostly empty, so its own kernels move single words: out[c·rows + r] = in[r·cols + c] for output word
// o = c·rows + r of each image, consecutive threads writing consecutive words and reading words cols apart (so
// few columns lie in the same cache lines). blockIdx = (a share of the plane, images), both in grid-stride loops.

template <typename Word>
__device__ __forceinline__ void transpose_tile(const Word* __restrict__ in, Word* __restrict__ out, const int rows,
                                               const int cols) {
    __shared__ Word tile[32][33];
    const int n = blockIdx.z, row0 = blockIdx.y * 32, col0 = blockIdx.x * 32;
    const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
    const long long image = (long long)n * rows * cols;
    const Word* source = in + image;
    Word* destination = out + image;
    for (int i = row; i < 32; i += 8) {
        const int r = row0 + i, c = col0 + lane;
        if (r < rows && c < cols) tile[i][lane] = source[(long long)r * cols + c];
    }
    __syncthreads();
    for (int i = row; i < 32; i += 8) {
        const int c = col0 + i, r = row0 + lane;
        if (r < rows && c < cols) destination[(long long)c * rows + r] = tile[lane][i];
    }
}

template <typename Word>
__device__ __forceinline__ void transpose_narrow(const Word* __restrict__ in, Word* __restrict__ out, const int rows,
                                                 const int cols, const int images) {
    const int plane = rows * cols;
    for (int n = blockIdx.y; n < images; n += gridDim.y) {
        const long long image = (long long)n * plane;
        for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < plane; o += blockDim.x * gridDim.x) {
            const int c = o / rows, r = o - c * rows;
            out[image + o] = in[image + (long long)r * cols + c];
        }
    }
}

extern "C" __global__ void transpose_planes_2(const unsigned short* in, unsigned short* out, int rows, int cols) {
    transpose_tile(in, out, rows, cols);
}
extern "C" __global__ void transpose_planes_4(const unsigned int* in, unsigned int* out, int rows, int cols) {
    transpose_tile(in, out, rows, cols);
}
extern "C" __global__ void transpose_planes_8(const unsigned long long* in, unsigned long long* out, int rows,
                                              int cols) {
    transpose_tile(in, out, rows, cols);
}

extern "C" __global__ void transpose_narrow_2(const unsigned short* in, unsigned short* out, int rows, int cols,
                                              int images) {
    transpose_narrow(in, out, rows, cols, images);
}
extern "C" __global__ void transpose_narrow_4(const unsigned int* in, unsigned int* out, int rows, int cols,
                                              int images) {
    transpose_narrow(in, out, rows, cols, images);
}
extern "C" __global__ void transpose_narrow_8(const unsigned long long* in, unsigned long long* out, int rows,
                                              int cols, int images) {
    transpose_narrow(in, out, rows, cols, images);
}

// A filter's channels-last copy for the implicit GEMMs on channels-last operands (conv/implicit_gemm_nhwc.py):
// w (K, C, R, S) -> (K, R, S, C) for forward, or -> (C, R, S, K) with r and s reversed for backward-data
// (`turned` non-zero): one thread per value. With groups, C is a group's channels and the turned copy is laid
// group after group, (groups, C, R, S, K / groups): each group's filter turned on its own, as the forward kernel
// on dy reads it. w is read at its element strides (stride_k, stride_c, stride_r, stride_s), so a channels-last w
// and a strided slice of one (strided_dgrad's phase w[:, :, a::u, b::v]) need no C-contiguous copy first.
template <typename Word>
__device__ __forceinline__ void filter_to_channels_last(const Word* __restrict__ w, Word* __restrict__ out, int K,
                                                        int C, int R, int S, int turned, int groups,
                                                        long long stride_k, long long stride_c, long long stride_r,
                                                        long long stride_s) {
    const int total = K * C * R * S, group_k = K / groups;
    // w's value (k, c, r, s)
    const auto at = [&](const int k, const int c, const int r, const int s_) {
        return k * stride_k + c * stride_c + r * stride_r + s_ * stride_s;
    };
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        if (turned) {  // out[g][c][r][s][k] = w[g·K/groups + k][c][R-1-r][S-1-s]
            const int k = i % group_k, s_ = i / group_k % S, r = i / group_k / S % R, c = i / group_k / S / R % C;
            const int g = i / group_k / S / R / C;
            out[i] = w[at(g * group_k + k, c, R - 1 - r, S - 1 - s_)];
        } else {       // out[k][r][s][c] = w[k][c][r][s]
            const int c = i % C, s_ = i / C % S, r = i / C / S % R, k = i / C / S / R;
            out[i] = w[at(k, c, r, s_)];
        }
    }
}

// w's strides are in words.
extern "C" __global__ void filter_to_channels_last_2(const unsigned short* w, unsigned short* out, int K, int C,
                                                     int R, int S, int turned, int groups, long long stride_k,
                                                     long long stride_c, long long stride_r, long long stride_s) {
    filter_to_channels_last(w, out, K, C, R, S, turned, groups, stride_k, stride_c, stride_r, stride_s);
}
extern "C" __global__ void filter_to_channels_last_4(const unsigned int* w, unsigned int* out, int K, int C, int R,
                                                     int S, int turned, int groups, long long stride_k,
                                                     long long stride_c, long long stride_r, long long stride_s) {
    filter_to_channels_last(w, out, K, C, R, S, turned, groups, stride_k, stride_c, stride_r, stride_s);
}

// A padded channels-last copy (layout.py's to_channels_last_padded): out (N, H, W, P) = in's (N, C, H, W) values,
// read at their element strides (either layout, or a slice of one), each pixel's C channels followed by P − C zeros,
// for kernels that copy whole 16-byte vectors of a pixel (a first layer's 3 colour channels). The zeros are written
// with the values, in the one pass a memset and a strided copy took two for. Where a pixel's P words are 16 bytes
// (4 floats, 8 half words) one thread writes the pixel as one vector (pad_pixels): its n, h and w worked out once for
// the whole pixel, where one thread a word spent more on those divisions than on its bytes. Else one thread a word.
template <typename Word>
__device__ __forceinline__ void pad_channels_last(const Word* __restrict__ in, Word* __restrict__ out, const int total,
                                                  const int C, const int P, const int H, const int W,
                                                  const long long stride_n, const long long stride_c,
                                                  const long long stride_h, const long long stride_w) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int c = i % P, pixel = i / P;
        const int w = pixel % W, h = pixel / W % H, n = pixel / W / H;
        out[i] = c < C ? in[n * stride_n + c * stride_c + h * stride_h + w * stride_w] : Word(0);
    }
}

template <typename Word>
__device__ __forceinline__ void pad_pixels(const Word* __restrict__ in, uint4* __restrict__ out, const int pixels,
                                           const int C, const int H, const int W, const long long stride_n,
                                           const long long stride_c, const long long stride_h,
                                           const long long stride_w) {
    constexpr int P = 16 / sizeof(Word);
    for (int pixel = blockIdx.x * blockDim.x + threadIdx.x; pixel < pixels; pixel += gridDim.x * blockDim.x) {
        const int w = pixel % W, h = pixel / W % H, n = pixel / W / H;
        const Word* source = in + n * stride_n + h * stride_h + w * stride_w;
        union {
            uint4 vector;
            Word words[P];
        } pack;
#pragma unroll
        for (int c = 0; c < P; ++c) pack.words[c] = c < C ? source[c * stride_c] : Word(0);
        out[pixel] = pack.vector;
    }
}

// in's strides are in words.
extern "C" __global__ void pad_channels_last_2(const unsigned short* in, unsigned short* out, int total, int C, int P,
                                               int H, int W, long long stride_n, long long stride_c,
                                               long long stride_h, long long stride_w) {
    pad_channels_last(in, out, total, C, P, H, W, stride_n, stride_c, stride_h, stride_w);
}
extern "C" __global__ void pad_channels_last_4(const unsigned int* in, unsigned int* out, int total, int C, int P,
                                               int H, int W, long long stride_n, long long stride_c,
                                               long long stride_h, long long stride_w) {
    pad_channels_last(in, out, total, C, P, H, W, stride_n, stride_c, stride_h, stride_w);
}
extern "C" __global__ void pad_pixels_2(const unsigned short* in, uint4* out, int pixels, int C, int H, int W,
                                        long long stride_n, long long stride_c, long long stride_h,
                                        long long stride_w) {
    pad_pixels(in, out, pixels, C, H, W, stride_n, stride_c, stride_h, stride_w);
}
extern "C" __global__ void pad_pixels_4(const unsigned int* in, uint4* out, int pixels, int C, int H, int W,
                                        long long stride_n, long long stride_c, long long stride_h,
                                        long long stride_w) {
    pad_pixels(in, out, pixels, C, H, W, stride_n, stride_c, stride_h, stride_w);
}
