#pragma once
// CPU emulation of the CUDA bits these kernels use: each block's threads are std::threads meeting at a barrier.
#include <barrier>
#include <thread>
#include <vector>
#include <cstdio>
#include <cstdint>
#include <functional>
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline Dim3 blockIdx, gridDim, blockDim;
inline thread_local Dim3 threadIdx;
inline std::barrier<>* block_barrier = nullptr;
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __restrict__
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void run_grid(Dim3 grid, unsigned threads, const std::function<void()>& body) {
    gridDim = grid; blockDim.x = threads; blockDim.y = blockDim.z = 1;
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx.x = x; blockIdx.y = y; blockIdx.z = z;
        std::barrier<> barrier(threads); block_barrier = &barrier;
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t) pool.emplace_back([&, t] { threadIdx.x = t; body(); });
        for (auto& th : pool) th.join();
    }
}
