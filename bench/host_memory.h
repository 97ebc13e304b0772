// The host's memory bandwidth, as threads of this process reach it: what caps the sum of every
// GPU's DMA into and out of pinned host memory (a D2H copy writes each byte into host memory once,
// an H2D copy reads it once). Three kernels, each thread on its own slice of one region of at
// least 1 GiB per side (far beyond any last-level cache):
//   read   64-bit loads, summed (what H2D DMA does to host memory)
//   write  memset (what D2H DMA does; glibc streams large sets past the cache)
//   copy   memcpy; reported as bytes copied, which moves twice as many bytes through memory
// No GPU call: the GPU benches run it in their CUDA-free parent process.
#ifndef TIER_BENCH_HOST_MEMORY_H_
#define TIER_BENCH_HOST_MEMORY_H_

#include <cstdint>
#include <vector>

namespace tier::bench {

struct HostMemoryRate {
  int threads = 0;
  double read_gbps = 0, write_gbps = 0, copy_gbps = 0;  // 1e9 bytes per second
};

// One row per entry of `thread_counts`, each kernel timed for `seconds`.
std::vector<HostMemoryRate> MeasureHostMemory(const std::vector<int>& thread_counts,
                                              double seconds);

}  // namespace tier::bench

#endif  // TIER_BENCH_HOST_MEMORY_H_
