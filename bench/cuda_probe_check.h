// CHECK and CHECK_CU for the standalone CUDA probes of bench/ (built with a bare nvcc command, no
// library of ours): a failed call prints itself and its error and exits 1.
#ifndef TIER_BENCH_CUDA_PROBE_CHECK_H_
#define TIER_BENCH_CUDA_PROBE_CHECK_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

#define CHECK_CU(x)                                                                \
  do {                                                                             \
    CUresult r_ = (x);                                                             \
    if (r_ != CUDA_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s: CUresult %d\n", #x, static_cast<int>(r_));         \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

#endif  // TIER_BENCH_CUDA_PROBE_CHECK_H_
