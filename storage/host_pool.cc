#include "storage/host_pool.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tier::storage {
namespace {

// mbind(2) without libnuma: bind the (not yet populated) mapping to one node so its pages are
// allocated next to the GPU that copies them.
absl::Status BindToNode(void* base, uint64_t bytes, int node) {
  constexpr int kMpolBind = 2;
  constexpr int kMaxNodes = 1024;
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  if (node < 0 || node >= kMaxNodes) return absl::InvalidArgumentError("bad NUMA node");
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, base, bytes, kMpolBind, mask, kMaxNodes, 0) != 0) {
    return ErrnoStatus(absl::StrCat("mbind to NUMA node ", node));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(const HostPoolOptions& options) {
  uint64_t alignment = options.alignment;
  if (alignment < 4096 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("pool alignment must be a power of two >= 4096");
  }
  uint64_t bytes = options.bytes & ~(alignment - 1);
  if (bytes == 0) return absl::InvalidArgumentError("pool size must be at least one extent");

  // Reserve without populating so the NUMA binding applies to the first touch, then populate
  // (MAP_POPULATE equivalent: MADV_POPULATE_WRITE where the kernel has it, else touch each page).
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (options.numa_node < 0) flags = (flags & ~MAP_NORESERVE) | MAP_POPULATE;
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (base == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap of a ", bytes, "-byte pool"));
  if (options.numa_node >= 0) {
    if (absl::Status bound = BindToNode(base, bytes, options.numa_node); !bound.ok()) {
      ::munmap(base, bytes);
      return bound;
    }
    constexpr int kMadvPopulateWrite = 23;
    if (::madvise(base, bytes, kMadvPopulateWrite) != 0) {
      volatile char* p = static_cast<char*>(base);
      for (uint64_t off = 0; off < bytes; off += 4096) p[off] = 0;
    }
  }

  bool locked = false;
  if (options.lock != LockMode::kOff) {
    if (::mlock(base, bytes) == 0) {
      locked = true;
    } else {
      absl::Status status = ErrnoStatus("mlock of the host pool");
      if (options.lock == LockMode::kRequired) {
        ::munmap(base, bytes);
        return absl::FailedPreconditionError(absl::StrCat(
            status.message(), " (raise RLIMIT_MEMLOCK: LimitMEMLOCK=infinity or CAP_IPC_LOCK)"));
      }
      LogWarning("host pool is pageable: ", status.message(),
                 " (raise LimitMEMLOCK or grant CAP_IPC_LOCK to pin it)");
    }
  }
  return std::unique_ptr<HostPool>(new HostPool(static_cast<char*>(base), bytes, alignment, locked));
}

HostPool::HostPool(char* base, uint64_t bytes, uint64_t alignment, bool locked)
    : base_(base), bytes_(bytes), alignment_(alignment), locked_(locked),
      allocator_(bytes, alignment) {}

HostPool::~HostPool() { ::munmap(base_, bytes_); }

std::optional<Extent> HostPool::Allocate(uint64_t bytes) {
  MutexLock lock(&mu_);
  return allocator_.Allocate(bytes);
}

void HostPool::Free(Extent extent) {
  MutexLock lock(&mu_);
  allocator_.Free(extent);
}

PoolUsage HostPool::Usage() const {
  MutexLock lock(&mu_);
  return PoolUsage{allocator_.capacity(), allocator_.used_bytes(), allocator_.free_bytes(),
                   allocator_.largest_free(), allocator_.allocations()};
}

}  // namespace tier::storage
