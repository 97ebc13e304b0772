// A client's host buffer (a memfd) mapped into the daemon, validated first, so that no later copy
// can fault where the daemon would die (SIGBUS) or be charged for the client's memory:
//  - sealed against shrinking (else the client could shrink it under the mapping: SIGBUS on the
//    next copy) and at least the registered size;
//  - not on hugetlbfs: a huge page the client punches out after registration cannot always be
//    faulted back (no free huge pages), and then the daemon's next copy dies of SIGBUS; no seal
//    prevents the punch (F_SEAL_WRITE would prevent the client's own writes too);
//  - populated: no holes in [0, bytes). A hole would be filled by the daemon's first copy into
//    it, and the page charged to tierd's memory cgroup (a sparse memfd of the size of a pool
//    got tierd OOM-killed). The client writes every page of its memfd first, so its memory is
//    charged to the client (common/populate.h: pages faulted in for reading can be dropped by
//    reclaim, and become holes again);
//  - faulted in by the daemon at registration with MADV_POPULATE_WRITE, which fails instead of
//    raising SIGBUS, so memory that cannot be faulted is refused here, not met in a copy.
//  - with seal_future_writes (the host engine, whose copies touch the pages with the CPU): sealed
//    with F_SEAL_FUTURE_WRITE once mapped, so the client cannot punch holes into it afterwards
//    (fallocate(PUNCH_HOLE) and MADV_REMOVE then fail with EPERM). A hole punched after
//    registration was filled by the daemon's next copy into it, the page charged to tierd's
//    memory cgroup, again and again (tierd OOM-killed after 416 MiB of reloads in a 700 MiB
//    cgroup). The client's mappings made before the seal stay writable; write(2) and new
//    writable mappings of the memfd are refused from then on, and for good: a memfd is mapped
//    by tierd once (MemfdMappings shares that mapping between its registrations) and cannot be
//    registered again once its last registration ended. (The GPU engines pin the pages with the
//    GPU driver and never fault them from the CPU.)
// Unmapped on destruction.
#ifndef TIER_ENGINE_MEMFD_MAPPING_H_
#define TIER_ENGINE_MEMFD_MAPPING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tier::engine {

class MemfdMapping {
 public:
  static absl::StatusOr<std::unique_ptr<MemfdMapping>> Map(const UniqueFd& fd, uint64_t bytes,
                                                            bool seal_future_writes = false);
  ~MemfdMapping();
  MemfdMapping(const MemfdMapping&) = delete;
  MemfdMapping& operator=(const MemfdMapping&) = delete;

  char* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  MemfdMapping(char* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  char* base_;
  uint64_t bytes_;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_MEMFD_MAPPING_H_
