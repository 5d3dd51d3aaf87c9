// Holds a stream: one thread waits `nanoseconds` on the GPU's global timer, then the kernel ends.
//
// Work the host queues behind it meanwhile starts the moment it ends and runs back to back, so CUDA
// events around that work time the GPU alone, not the host's launches (find uses it: its times are
// then what a training step pays when the host runs ahead of the GPU, as cuDNN's find measures).
// The wait sleeps between reads of the timer, so the held SM stays nearly idle.

extern "C" __global__ void hold_stream(long long nanoseconds) {
    long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}
