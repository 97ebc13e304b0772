#include "daemon/tiers/nvme_transfers.h"

namespace tier::daemon {

SpillTraffic SpillCounters::Read() const {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  SpillTraffic traffic;
  traffic.bytes_spilled = bytes_spilled.load(kRelaxed);
  traffic.bytes_fetched = bytes_fetched.load(kRelaxed);
  traffic.spills = spills.load(kRelaxed);
  traffic.fetches = fetches.load(kRelaxed);
  traffic.prefetches = prefetches.load(kRelaxed);
  traffic.bytes_prefetched = bytes_prefetched.load(kRelaxed);
  traffic.prefetch_hits = prefetch_hits.load(kRelaxed);
  traffic.prefetch_misses = prefetch_misses.load(kRelaxed);
  return traffic;
}

void NvmeTransfers::Began(Kind kind, uint64_t bytes) {
  MutexLock lock(&mu_);
  (kind == Kind::kWrite ? writes_ : reads_).fetch_add(1);
  writing_bytes_.fetch_add(bytes);
}

void NvmeTransfers::Ended(Kind kind) {
  // Signalled under the lock: a waiter may return (and the tiers go) as soon as the count reaches
  // zero, so nothing of ours may be touched after the unlock.
  MutexLock lock(&mu_);
  (kind == Kind::kWrite ? writes_ : reads_).fetch_sub(1);
  cv_.SignalAll();
}

bool NvmeTransfers::AwaitWriteSlot(uint64_t max) {
  MutexLock lock(&mu_);
  while (!closed_ && writes_.load() >= max) cv_.Wait(&mu_);
  return !closed_;
}

void NvmeTransfers::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

bool NvmeTransfers::AwaitIdle(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (writes_.load() + reads_.load() != 0) {
    if (!cv_.WaitUntil(&mu_, deadline)) return false;
  }
  return true;
}

}  // namespace tier::daemon
