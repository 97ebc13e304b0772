#include "engine/lane_words.h"

#include <new>

#include "engine/runtime_call_rule.h"

namespace tier::engine {

HostWordPool::~HostWordPool() {
  for (void* block : blocks_) runtime_.FreeMappedHost(block);
}

absl::StatusOr<HostWordPool::Slot> HostWordPool::Take() {
  MutexLock lock(&mu_);
  if (free_.empty()) {
    CheckCall(GpuCallClass::kSetup);
    absl::StatusOr<MappedHost> block = runtime_.AllocMappedHost(kBlockBytes);
    if (!block.ok()) return block.status();
    blocks_.push_back(block->host);
    for (uint64_t off = 0; off < kBlockBytes; off += sizeof(LaneWord)) {
      free_.push_back(Slot{reinterpret_cast<LaneWord*>(static_cast<char*>(block->host) + off),
                           block->device_addr + off});
    }
  }
  Slot slot = free_.back();
  free_.pop_back();
  new (slot.host) LaneWord{};  // zero: no job done
  return slot;
}

void HostWordPool::Give(Slot slot) {
  MutexLock lock(&mu_);
  free_.push_back(slot);
}

}  // namespace tier::engine
