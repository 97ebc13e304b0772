// A client's host buffer (a memfd) mapped into the daemon, validated first, so that no later copy
// can fault where the daemon would die (SIGBUS) or be charged for the client's memory:
//  - sealed against shrinking (else the client could shrink it under the mapping: SIGBUS on the
//    next copy) and at least the registered size;
//  - not on hugetlbfs: a huge page the client punches out after registration cannot always be
//    faulted back (no free huge pages), and then the daemon's next copy dies of SIGBUS; no seal
//    prevents the punch (F_SEAL_WRITE would prevent the client's own writes too);
//  - populated: no holes in [0, bytes). A hole would be filled by the daemon's first copy into
//    it, and the page charged to tierd's memory cgroup (a sparse memfd of the size of a pool
//    got tierd OOM-killed). The client writes its memfd or maps it with MAP_POPULATE first, so
//    its memory is charged to the client;
//  - faulted in by the daemon at registration with MADV_POPULATE_WRITE, which fails instead of
//    raising SIGBUS, so memory that cannot be faulted is refused here, not met in a copy.
// What remains: a client may still punch holes after registration; the daemon's next copy into
// one then faults a page in, charged to tierd, at most the buffer's size, which
// max_mapped_bytes_per_session/_per_uid bound. Unmapped on destruction.
#ifndef TIER_ENGINE_MEMFD_MAPPING_H_
#define TIER_ENGINE_MEMFD_MAPPING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tier::engine {

class MemfdMapping {
 public:
  static absl::StatusOr<std::unique_ptr<MemfdMapping>> Map(const UniqueFd& fd, uint64_t bytes);
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
