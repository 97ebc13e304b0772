#include "daemon/tiers/nvme_transfers.h"

#include <algorithm>
#include <thread>

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

NvmeTransfers::WriteSettle::WriteSettle(NvmeTransfers& io, uint64_t bytes)
    : io_(io), bytes_(bytes) {
  io_.settling_.fetch_add(1);
  io_.settle_generation_.fetch_add(1);
}

NvmeTransfers::WriteSettle::~WriteSettle() {
  io_.writing_bytes_.fetch_sub(bytes_);
  io_.settle_generation_.fetch_add(1);
  io_.settling_.fetch_sub(1);
}

storage::PoolUsage NvmeTransfers::ProjectedUsage() const {
  const auto give_up = std::chrono::steady_clock::now() + kMaxSettleWait;
  storage::PoolUsage usage;
  uint64_t writing = 0;
  for (;;) {
    const uint64_t before = settle_generation_.load();
    const bool quiet = settling_.load() == 0;
    usage = pool_.Usage();
    writing = writing_bytes_.load();
    if (quiet && settle_generation_.load() == before) break;
    if (std::chrono::steady_clock::now() >= give_up) break;
    std::this_thread::yield();
  }
  writing = std::min(writing, usage.used_bytes);
  usage.used_bytes -= writing;
  usage.free_bytes += writing;
  return usage;
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
