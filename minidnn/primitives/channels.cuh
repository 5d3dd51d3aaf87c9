// Helpers shared by the per-channel kernels of batchnorm.cu and linear.cu (bias).
//
// Both walk an (N, C, S) array, S = the product of the trailing axes, either one channel at a time
// (reductions: Cursor) or all elements in a grid-stride loop while tracking each element's channel
// (element-wise kernels: ChannelStep), without an integer division per element. Both reductions split a
// channel over several blocks and finish it in the last of them to arrive (last_block_of_channel).

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

// Finishing a channel in the last of its blocks, rather than in a second launch: each block publishes its
// partial result and counts itself in a per-channel counter (the "last block done" handshake of CUDA's
// threadFenceReduction sample, CUB and PyTorch); the block that counts last merges the channel's partial
// results in a fixed order, whichever block that happens to be, so the result has the same bits on every run.
// The counters (_cuda.block_counters) are zeroed once, per GPU, and shared by every kernel that uses them: each
// launch leaves its counters at 0 again, so such kernels must not run at once on two streams.
//
// Every thread of the block calls this after the block's partial results are written (by any of its
// threads); true in the block of channel c that counts itself last in *counter (all of c's partial results
// are then written). That block resets the counter, so the next launch finds it at 0 again.
__device__ bool last_block_of_channel(unsigned int* __restrict__ counter, const int splits) {
    __shared__ bool last;
    __threadfence();  // each thread's partial results are visible to the GPU before the block is counted,
    __syncthreads();  // and every thread's are written before thread 0 counts the block
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == (unsigned int)(splits - 1);
        if (last) {
            *counter = 0;     // every block of the channel has counted: no other access this launch
            __threadfence();  // the other blocks' partial results are read after their counts were seen
        }
    }
    __syncthreads();
    return last;
}

#endif  // MINIDNN_CHANNELS_CUH
