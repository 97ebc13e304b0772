#include "storage/host_pool.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

constexpr uint64_t kHugePage = 2ull << 20;
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14; older kernels: touch each page

uint64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Faults [base, base + bytes) in for writing, so that no copy ever takes a page fault.
void Populate(char* base, uint64_t bytes) {
  if (::madvise(base, bytes, kMadvPopulateWrite) == 0) return;
  volatile char* p = base;  // every small page: huge pages may not have been given
  for (uint64_t off = 0; off < bytes; off += 4096) p[off] = 0;
}

// Several threads, each its own range: populating is bound by the kernel zeroing pages and
// building page tables, which one core does at a fraction of the memory bandwidth.
uint32_t PopulateInParallel(char* base, uint64_t bytes, uint32_t threads) {
  if (threads == 0) threads = std::min(16u, std::max(1u, std::thread::hardware_concurrency()));
  constexpr uint64_t kMinPerThread = 64ull << 20;
  threads = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(threads,
                                                                             bytes / kMinPerThread)));
  const uint64_t chunk = (bytes / threads + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<std::thread> workers;
  for (uint32_t i = 1; i < threads && i * chunk < bytes; ++i) {
    const uint64_t begin = i * chunk;
    const uint64_t len = std::min(chunk, bytes - begin);
    workers.emplace_back([=] { Populate(base + begin, len); });
  }
  Populate(base, std::min(chunk, bytes));
  for (std::thread& t : workers) t.join();
  return static_cast<uint32_t>(workers.size() + 1);
}

// AnonHugePages of the range, from /proc/self/smaps (0 where it cannot be read).
uint64_t HugeBytesOf(const char* base) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_range = false;
  char start_text[32];
  std::snprintf(start_text, sizeof(start_text), "%lx-", reinterpret_cast<unsigned long>(base));
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') > line.find('-')) {
      in_range = line.rfind(start_text, 0) == 0;
      continue;
    }
    if (in_range && line.rfind("AnonHugePages:", 0) == 0) {
      return std::strtoull(line.c_str() + 14, nullptr, 10) * 1024;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(const HostPoolOptions& options) {
  uint64_t alignment = options.alignment;
  if (alignment < 4096 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("pool alignment must be a power of two >= 4096");
  }
  uint64_t bytes = options.bytes & ~(alignment - 1);
  if (bytes == 0) return absl::InvalidArgumentError("pool size must be at least one extent");

  // Reserve without populating, so that the NUMA binding and the huge-page advice apply to the
  // first touch; a huge page more, to start at a 2 MiB boundary (the rest is given back).
  const bool huge = options.huge_pages && bytes >= kHugePage;
  const uint64_t reserve = huge ? bytes + kHugePage : bytes;
  void* raw = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap of a ", bytes, "-byte pool"));
  char* base = static_cast<char*>(raw);
  if (huge) {
    const uint64_t addr = reinterpret_cast<uint64_t>(raw);
    base = reinterpret_cast<char*>((addr + kHugePage - 1) & ~(kHugePage - 1));
    const uint64_t head = static_cast<uint64_t>(base - static_cast<char*>(raw));
    if (head > 0) ::munmap(raw, head);
    if (reserve - head - bytes > 0) ::munmap(base + bytes, reserve - head - bytes);
  }
  if (options.numa_node >= 0) {
    if (absl::Status bound = BindToNode(base, bytes, options.numa_node); !bound.ok()) {
      ::munmap(base, bytes);
      return bound;
    }
  }
  PoolSetup setup;
  setup.huge_pages = huge && ::madvise(base, bytes, MADV_HUGEPAGE) == 0;
  uint64_t t0 = NowNs();
  setup.threads = PopulateInParallel(base, bytes, options.populate_threads);
  setup.populate_ns = NowNs() - t0;
  if (setup.huge_pages) setup.huge_bytes = HugeBytesOf(base);

  bool locked = false;
  if (options.lock != LockMode::kOff) {
    t0 = NowNs();
    if (::mlock(base, bytes) == 0) {
      locked = true;
      setup.lock_ns = NowNs() - t0;
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
  return std::unique_ptr<HostPool>(new HostPool(base, bytes, alignment, locked, setup));
}

HostPool::HostPool(char* base, uint64_t bytes, uint64_t alignment, bool locked, PoolSetup setup)
    : base_(base), bytes_(bytes), alignment_(alignment), locked_(locked), setup_(setup),
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
