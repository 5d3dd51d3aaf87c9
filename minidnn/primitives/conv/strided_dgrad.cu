// strided_dgrad's filter for its phases on wgmma (strided_dgrad.py): every phase's turned channels-last sub-filter in
// one pass over w. A tap (r, s) belongs to phase (r mod u, s mod v); each phase's copy is laid (G, C, R_a, S_b, K)
// with its taps reversed, as the forward kernel reads a turned filter for backward-data.
//
// w (K·G, C, R, S), read at its element strides, seen as a matrix of K·G rows (filters) by C·R·S columns (a channel's
// taps); each copy runs along the filters. So the pass is a transpose: a block moves a 32 × 32 tile through shared
// memory, its 256 threads reading 8 rows of 32 consecutive columns (consecutive taps and channels of one filter,
// coalesced where w is C-contiguous), then writing 8 columns of the tile as runs of 32 consecutive filters of one
// phase's copy (coalesced). The tile's extra column keeps one warp's transposed reads on 32 banks.
// blockIdx = (columns / 32, rows / 32). Words of 2 or 4 bytes are copied as they are.

constexpr int MAX_PHASES = 16;  // strides up to 4 × 4 (strided_dgrad.MAX_TURNED_PHASES)

// Where each phase's copy starts in `out`, in words, phase (a, b) at a·v + b; −1: a phase not run (no taps, or no dx
// pixels), whose taps are not copied.
struct PhaseOffsets {
    int at[MAX_PHASES];
};

template <typename Word>
__device__ __forceinline__ void phase_filters(const Word* __restrict__ w, Word* __restrict__ out, const int K,
                                              const int C, const int R, const int S, const int u, const int v,
                                              const int groups, const long long stride_k, const long long stride_c,
                                              const long long stride_r, const long long stride_s,
                                              const PhaseOffsets& offsets) {
    __shared__ Word tile[32][33];
    // Where each of the tile's columns goes: its word in its phase's copy for the first filter of group 0 (−1: not
    // copied), and the words from one group's copy to the next. Worked out once a column, since the divisions by
    // the runtime sizes cost more than the copy itself when each word does them.
    __shared__ long long column_place[32];
    __shared__ long long group_words[32];
    const int rows = K, columns = C * R * S, group_k = K / groups;
    const int row0 = blockIdx.y * 32, column0 = blockIdx.x * 32, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int column = column0 + lane;  // the column this thread reads, and (warp 0) places
    const int s = column % S, r = column / S % R, c = column / S / R;
    if (column < columns) {
        const Word* const source = w + c * stride_c + r * stride_r + s * stride_s;
        for (int i = warp; i < 32; i += 8)
            if (row0 + i < rows) tile[i][lane] = source[(row0 + i) * stride_k];
    }
    if (warp == 0) {
        long long place = -1, words = 0;
        const int a = r % u, b = s % v, offset = column < columns ? offsets.at[a * v + b] : -1;
        if (offset >= 0) {
            const int taps_h = (R - a + u - 1) / u, taps_w = (S - b + v - 1) / v;  // the phase's R_a × S_b
            const int turned_r = taps_h - 1 - r / u, turned_s = taps_w - 1 - s / v;
            place = offset + ((long long)(c * taps_h + turned_r) * taps_w + turned_s) * group_k;
            words = (long long)C * taps_h * taps_w * group_k;
        }
        column_place[lane] = place;
        group_words[lane] = words;
    }
    __syncthreads();
    const int k = row0 + lane;  // the filter this thread writes, for each of the tile's columns
    if (k >= rows) return;
    const int g = k / group_k;
    const long long filter = k - g * group_k;
    for (int i = warp; i < 32; i += 8) {
        const long long place = column_place[i];
        if (place >= 0) out[place + g * group_words[i] + filter] = tile[lane][i];
    }
}

extern "C" __global__ void phase_filters_2(const unsigned short* w, unsigned short* out, int K, int C, int R, int S,
                                           int u, int v, int groups, long long stride_k, long long stride_c,
                                           long long stride_r, long long stride_s, const PhaseOffsets offsets) {
    phase_filters(w, out, K, C, R, S, u, v, groups, stride_k, stride_c, stride_r, stride_s, offsets);
}
extern "C" __global__ void phase_filters_4(const unsigned int* w, unsigned int* out, int K, int C, int R, int S,
                                           int u, int v, int groups, long long stride_k, long long stride_c,
                                           long long stride_r, long long stride_s, const PhaseOffsets offsets) {
    phase_filters(w, out, K, C, R, S, u, v, groups, stride_k, stride_c, stride_r, stride_s, offsets);
}
