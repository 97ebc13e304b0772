// The node's pinned host pool: one anonymous mapping made once at start (bound to a NUMA node when
// asked; transparent huge pages where the kernel gives them; its pages faulted in by several
// threads at once), locked in RAM (mlock, or registered with the GPU runtime by the copy engine,
// which pins it), and carved into extents with no per-job system call.
#ifndef TIER_STORAGE_HOST_POOL_H_
#define TIER_STORAGE_HOST_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "storage/extent_allocator.h"

namespace tier::storage {

enum class LockMode {
  kOff,       // pageable (tests)
  kBestEffort,  // mlock; on failure (RLIMIT_MEMLOCK) log and run pageable
  kRequired,  // mlock or fail to start
};

struct HostPoolOptions {
  uint64_t bytes = 0;          // rounded down to alignment; > 0
  uint64_t alignment = 4096;   // extent granularity (O_DIRECT needs 4096)
  int numa_node = -1;          // -1: no binding
  LockMode lock = LockMode::kBestEffort;
  // Ask for transparent huge pages (madvise MADV_HUGEPAGE on a 2 MiB-aligned mapping): 512x
  // fewer page faults to populate, fewer entries to lock and to register with the GPU. The
  // kernel may still give small pages (THP "never", fragmentation); nothing else changes then.
  bool huge_pages = true;
  // Threads that fault the pages in, each its own range (0: one per CPU, at most 16).
  uint32_t populate_threads = 0;
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

  // Thread-safe. nullopt when the pool has no free range that large.
  std::optional<Extent> Allocate(uint64_t bytes);
  void Free(Extent extent);

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
  PoolUsage Usage() const;

 private:
  HostPool(char* base, uint64_t bytes, uint64_t alignment, bool locked, PoolSetup setup);

  char* base_;
  uint64_t bytes_;
  uint64_t alignment_;
  bool locked_;
  PoolSetup setup_;
  bool registered_ = false;
  mutable Mutex mu_;
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_HOST_POOL_H_
