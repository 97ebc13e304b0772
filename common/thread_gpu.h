// The GPU whose jobs the calling thread serves: set by that GPU's ring poller and device worker
// (-1 on every other thread). Per-GPU state below the job path (the host pool's extent caches,
// storage/extent_cache.h) is picked by it, so that the threads of different GPUs do not share a
// lock or a cache line on every job (issue 26), without passing a GPU through every layer.
#ifndef TIER_COMMON_THREAD_GPU_H_
#define TIER_COMMON_THREAD_GPU_H_

namespace tier {

void SetThreadGpu(int device);
int CurrentThreadGpu();

}  // namespace tier

#endif  // TIER_COMMON_THREAD_GPU_H_
