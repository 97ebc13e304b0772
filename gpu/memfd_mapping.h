// A client's host buffer (a memfd) mapped into the daemon, validated first: it must be sealed
// against shrinking (else the client could shrink it under the mapping and crash the daemon with
// SIGBUS on the next copy) and hold at least the registered size. Unmapped on destruction.
#ifndef TIER_GPU_MEMFD_MAPPING_H_
#define TIER_GPU_MEMFD_MAPPING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tier::gpu {

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

}  // namespace tier::gpu

#endif  // TIER_GPU_MEMFD_MAPPING_H_
