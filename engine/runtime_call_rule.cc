#include "engine/runtime_call_rule.h"

#include <atomic>
#include <cstdint>

#include "common/log.h"

namespace tier::engine {

void CheckCall(GpuCallClass call) {
  ThreadRole role = CurrentThreadRole();
  if (MayCall(role, call)) return;
  static std::atomic<uint32_t> warned{0};
  uint32_t bit = 1u << (static_cast<uint32_t>(role) * 3 + static_cast<uint32_t>(call));
  if ((warned.fetch_or(bit) & bit) == 0) {
    LogError("internal: a ", GpuCallClassName(call), " GPU runtime call on a ",
             ThreadRoleName(role), " thread (see engine/stream_engine.h)");
  }
}

}  // namespace tier::engine
