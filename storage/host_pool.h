// The node's pinned host pool: one anonymous mapping made once at start (transparent huge pages
// where the kernel gives them; its pages faulted in by several threads at once), locked in RAM
// (mlock, or registered with the GPU runtime by the copy engine, which pins it), and carved into
// extents with no per-job system call.
//
// The mapping is split into parts (storage/pool_part.h), one per NUMA node that has GPUs on a
// multi-socket machine: each part is a contiguous sub-range whose memory policy is bound to its
// node (mbind) before its first page is touched, so the kernel places its pages there. One
// mapping rather than one per node, so that the GPU registration, the io_uring registered buffer
// and every Extent (an offset into the pool) stay one range. An allocation names the part it
// prefers (its GPU's local one) and takes another only when that one is full (counted).
#ifndef TIER_STORAGE_HOST_POOL_H_
#define TIER_STORAGE_HOST_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/extent_allocator.h"
#include "storage/pool_part.h"

namespace tier::storage {

enum class LockMode {
  kOff,       // pageable (tests)
  kBestEffort,  // mlock; on failure (RLIMIT_MEMLOCK) log and run pageable
  kRequired,  // mlock or fail to start
};

// One part of the pool as asked for.
struct PoolPartOptions {
  int numa_node = -1;   // -1: not bound
  uint64_t weight = 1;  // its share of the pool: bytes * weight / (sum of weights), > 0
};

struct HostPoolOptions {
  uint64_t bytes = 0;          // rounded down to alignment; > 0
  uint64_t alignment = 4096;   // extent granularity (O_DIRECT needs 4096)
  int numa_node = -1;          // one part (`parts` empty): bound here; -1: no binding
  LockMode lock = LockMode::kBestEffort;
  // Ask for transparent huge pages (madvise MADV_HUGEPAGE on a 2 MiB-aligned mapping): 512x
  // fewer page faults to populate, fewer entries to lock and to register with the GPU. The
  // kernel may still give small pages (THP "never", fragmentation); nothing else changes then.
  bool huge_pages = true;
  // Threads that fault the pages in, each its own range (0: one per CPU, at most 16).
  uint32_t populate_threads = 0;
  // The parts, in address order; empty: one part bound to `numa_node`. A part's size is rounded
  // down to the split granularity (2 MiB with huge pages, so that no huge page straddles two
  // nodes' policies; else the alignment) and the last part takes what is left.
  std::vector<PoolPartOptions> parts = {};
};

// How a pool was made, for the log and the status API.
struct PoolSetup {
  uint64_t populate_ns = 0;  // faulting every page in
  uint64_t lock_ns = 0;      // mlock
  uint32_t threads = 1;      // that populated it
  bool huge_pages = false;   // MADV_HUGEPAGE accepted
  uint64_t huge_bytes = 0;   // of the pool in huge pages after populating (AnonHugePages)
  uint64_t register_ns = 0;  // registering it with the GPU (set by the daemon, 0 without)
  uint64_t total_ns = 0;     // all of it, from reserving to pinned (set by the daemon)
};

struct PoolUsage {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t allocations = 0;  // extents currently handed out
};

class HostPool {
 public:
  static absl::StatusOr<std::unique_ptr<HostPool>> Create(const HostPoolOptions& options);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  static constexpr int kAnyPart = -1;

  // Thread-safe. From `preferred_part` when it has room, else from another part (the one with
  // the most free bytes first; counted as remote); kAnyPart (or an index out of range): the part
  // with the most free bytes. nullopt when no part has a free range that large.
  std::optional<Extent> Allocate(uint64_t bytes, int preferred_part = kAnyPart);
  // Back to the part that handed it out.
  void Free(Extent extent);

  size_t part_count() const { return parts_.size(); }
  // The index of the part holding pool offset `offset` (0 when out of range).
  int PartOf(uint64_t offset) const;
  // The largest extent the pool could ever hand out: the largest part.
  uint64_t largest_part_bytes() const;
  std::vector<PoolPartUsage> PartUsage() const;

  char* At(const Extent& extent) const { return base_ + extent.offset; }
  char* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t alignment() const { return alignment_; }
  bool locked() const { return locked_; }
  const PoolSetup& setup() const { return setup_; }
  // Set once the copy engine pinned the pool (cudaHostRegister), with the time that took.
  void set_registered(bool registered, uint64_t register_ns = 0) {
    registered_ = registered;
    setup_.register_ns = register_ns;
  }
  bool registered() const { return registered_; }
  void set_setup_total_ns(uint64_t ns) { setup_.total_ns = ns; }
  // The sum over the parts (largest_free: the largest of any part).
  PoolUsage Usage() const;

 private:
  HostPool(char* base, uint64_t bytes, uint64_t alignment, bool locked, PoolSetup setup,
           std::vector<std::unique_ptr<PoolPart>> parts);

  char* base_;
  uint64_t bytes_;
  uint64_t alignment_;
  bool locked_;
  PoolSetup setup_;
  bool registered_ = false;
  // In address order; fixed after Create. Each part has its own lock.
  const std::vector<std::unique_ptr<PoolPart>> parts_;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_HOST_POOL_H_
