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
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
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

// AnonHugePages of [base, base + bytes), from /proc/self/smaps (0 where it cannot be read). The
// range may be several mappings: the kernel splits one where the parts' NUMA policies differ.
uint64_t HugeBytesOf(const char* base, uint64_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_range = false;
  uint64_t total = 0;
  const uint64_t begin = reinterpret_cast<uint64_t>(base);
  const uint64_t end = begin + bytes;
  while (std::getline(smaps, line)) {
    unsigned long start = 0;
    unsigned long stop = 0;
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') > line.find('-')) {
      in_range = std::sscanf(line.c_str(), "%lx-%lx", &start, &stop) == 2 && start >= begin &&
                 stop <= end;
      continue;
    }
    if (in_range && line.rfind("AnonHugePages:", 0) == 0) {
      total += std::strtoull(line.c_str() + 14, nullptr, 10) * 1024;
    }
  }
  return total;
}

// The parts' sizes: each its weight's share of `bytes`, rounded down to `granule`; the last takes
// the rest. Every part must get at least one granule.
absl::StatusOr<std::vector<uint64_t>> SplitSizes(uint64_t bytes, uint64_t granule,
                                                 const std::vector<PoolPartOptions>& parts) {
  long double total_weight = 0;
  for (const PoolPartOptions& part : parts) {
    if (part.weight == 0) return absl::InvalidArgumentError("a pool part's weight must be > 0");
    total_weight += static_cast<long double>(part.weight);
  }
  std::vector<uint64_t> sizes;
  uint64_t given = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const long double share =
        static_cast<long double>(bytes) * static_cast<long double>(parts[i].weight) / total_weight;
    const uint64_t size = static_cast<uint64_t>(share) / granule * granule;
    sizes.push_back(size);
    given += size;
  }
  sizes.push_back(bytes - given);
  for (uint64_t size : sizes) {
    if (size < granule) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a host pool of ", bytes, " bytes is too small for ", parts.size(),
          " parts (each needs at least ", granule, " bytes)"));
    }
  }
  return sizes;
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
  // Each part's policy before any of its pages exists: the first touch (populating, below)
  // allocates every page on its part's node, whichever thread touches it.
  std::vector<PoolPartOptions> wanted = options.parts;
  if (wanted.empty()) wanted.push_back(PoolPartOptions{options.numa_node, 1});
  absl::StatusOr<std::vector<uint64_t>> sizes =
      SplitSizes(bytes, huge ? std::max(kHugePage, alignment) : alignment, wanted);
  if (!sizes.ok()) {
    ::munmap(base, bytes);
    return sizes.status();
  }
  std::vector<std::unique_ptr<PoolPart>> parts;
  uint64_t offset = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const int node = wanted[i].numa_node;
    if (node >= 0) {
      if (absl::Status bound = BindToNode(base + offset, (*sizes)[i], node); !bound.ok()) {
        ::munmap(base, bytes);
        return bound;
      }
    }
    parts.push_back(std::make_unique<PoolPart>(offset, (*sizes)[i], alignment, node));
    offset += (*sizes)[i];
  }
  PoolSetup setup;
  setup.huge_pages = huge && ::madvise(base, bytes, MADV_HUGEPAGE) == 0;
  uint64_t t0 = NowNs();
  // One set of threads over the whole range: a page lands on its part's node whichever thread
  // faults it, since the policy, not the toucher, decides.
  setup.threads = PopulateInParallel(base, bytes, options.populate_threads);
  setup.populate_ns = NowNs() - t0;
  if (setup.huge_pages) setup.huge_bytes = HugeBytesOf(base, bytes);

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
  return std::unique_ptr<HostPool>(
      new HostPool(base, bytes, alignment, locked, setup, std::move(parts)));
}

HostPool::HostPool(char* base, uint64_t bytes, uint64_t alignment, bool locked, PoolSetup setup,
                   std::vector<std::unique_ptr<PoolPart>> parts)
    : base_(base), bytes_(bytes), alignment_(alignment), locked_(locked), setup_(setup),
      parts_(std::move(parts)) {}

HostPool::~HostPool() { ::munmap(base_, bytes_); }

std::optional<Extent> HostPool::Allocate(uint64_t bytes, int preferred_part) {
  const bool preferred =
      preferred_part >= 0 && static_cast<size_t>(preferred_part) < parts_.size();
  if (preferred) {
    if (std::optional<Extent> extent = parts_[preferred_part]->Allocate(bytes, Locality::kLocal)) {
      return extent;
    }
  }
  if (parts_.size() == 1) {
    return preferred ? std::nullopt : parts_[0]->Allocate(bytes, Locality::kAny);
  }
  // The others, the emptiest first (read without holding every lock: a part that filled in the
  // meantime just refuses, and the next is tried).
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (preferred && i == static_cast<size_t>(preferred_part)) continue;
    order.emplace_back(parts_[i]->free_bytes(), i);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const Locality locality = preferred ? Locality::kRemote : Locality::kAny;
  for (const auto& [free, i] : order) {
    if (std::optional<Extent> extent = parts_[i]->Allocate(bytes, locality)) return extent;
  }
  return std::nullopt;
}

void HostPool::Free(Extent extent) { parts_[PartOf(extent.offset)]->Free(extent); }

int HostPool::PartOf(uint64_t offset) const {
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i]->Contains(offset)) return static_cast<int>(i);
  }
  return 0;
}

uint64_t HostPool::largest_part_bytes() const {
  uint64_t largest = 0;
  for (const auto& part : parts_) largest = std::max(largest, part->bytes());
  return largest;
}

std::vector<PoolPartUsage> HostPool::PartUsage() const {
  std::vector<PoolPartUsage> usage;
  for (const auto& part : parts_) usage.push_back(part->Usage());
  return usage;
}

PoolUsage HostPool::Usage() const {
  PoolUsage total;
  for (const auto& part : parts_) {
    PoolPartUsage u = part->Usage();
    total.capacity_bytes += u.capacity_bytes;
    total.used_bytes += u.used_bytes;
    total.free_bytes += u.free_bytes;
    total.largest_free = std::max(total.largest_free, u.largest_free);
    total.allocations += u.allocations;
  }
  return total;
}

}  // namespace tier::storage
