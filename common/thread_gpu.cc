#include "common/thread_gpu.h"

namespace tier {
namespace {

thread_local int current_gpu = -1;

}  // namespace

void SetThreadGpu(int device) { current_gpu = device; }
int CurrentThreadGpu() { return current_gpu; }

}  // namespace tier
