// Index helpers shared by the per-channel kernels of batchnorm.cu and linear.cu (bias).
//
// Both walk an (N, C, S) array, S = the product of the trailing axes, either one channel at a time
// (reductions: Cursor) or all elements in a grid-stride loop while tracking each element's channel
// (element-wise kernels: ChannelStep), without an integer division per element.

#ifndef MINIDNN_CHANNELS_CUH
#define MINIDNN_CHANNELS_CUH

#define FULL_MASK 0xffffffffu
#define MAX_WARPS 32  // blockDim.x <= 1024

// The offsets (from x + c·S) of the values j0, j0 + B, j0 + 2B, ... of one channel. B = q·S + r is
// split once, so a step adds q planes and r values and carries one plane when s passes S. take()
// advances only while the thread has values left, so offsets stay below N·C·S (no int overflow).
struct Cursor {
    int s, offset;                         // the current value: n·C·S + s
    int S, step_s, step_offset, carry;

    __device__ Cursor(const int j0, const int B, const int C, const int S_) : S(S_) {
        const int n = j0 / S;
        s = j0 - n * S;
        offset = n * (C * S) + s;
        step_s = B % S;
        // Unsigned: the product can exceed int only when the thread has a single value, which
        // never steps (its values are j0 < M <= N·S, so a step is taken only when B < M, i.e. B / S < N).
        step_offset = (int)((unsigned)(B / S) * (unsigned)(C * S) + (unsigned)step_s);
        carry = C * S - S;
    }

    __device__ __forceinline__ void advance() {
        s += step_s;
        offset += step_offset;
        if (s >= S) {
            s -= S;
            offset += carry;
        }
    }

    // The offset of the next value; `left` counts the thread's values not yet taken.
    __device__ __forceinline__ int take(int& left) {
        const int o = offset;
        if (--left > 0) advance();
        return o;
    }

    // Four offsets at once (left >= 4): the first three always have a successor.
    __device__ __forceinline__ void take4(int o[4], int& left) {
        o[0] = offset; advance();
        o[1] = offset; advance();
        o[2] = offset; advance();
        o[3] = offset;
        left -= 4;
        if (left > 0) advance();
    }
};

// The channel c = (i / S) % C of the elements i, i + G, i + 2G, ... of an (N, C, S) array, G the grid's
// thread count: G = q·S + r is split once (q taken mod C), each step adds r to s and q to c and carries
// (s + r < 2S and c + q + 1 < 2C, so one subtraction each). Used by the grid-stride element-wise kernels,
// where an integer division per element would cost more issue slots than the memory traffic leaves.
struct ChannelStep {
    int s, c;
    int S, C, step_s, step_c;

    __device__ ChannelStep(const int i, const int G, const int C_, const int S_) : S(S_), C(C_) {
        const int plane = i / S;
        s = i - plane * S;
        c = plane % C;
        step_s = G % S;
        step_c = (G / S) % C;
    }

    __device__ __forceinline__ void advance() {
        s += step_s;
        c += step_c;
        if (s >= S) {
            s -= S;
            ++c;
        }
        if (c >= C) c -= C;
    }
};

#endif  // MINIDNN_CHANNELS_CUH
