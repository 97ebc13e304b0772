// The host engine's mappings of client memfds, one per memfd (inode): a memfd registered again
// while a registration of it lives shares that mapping, so N registrations of one memfd cost the
// daemon one mapping and one set of page tables, not N (13,890 registrations of one 16 MiB memfd
// made 446 MB of page tables in tierd). It is also the only way to register a memfd again: the
// first mapping seals it against new writable mappings (memfd_mapping.h).
//
// Thread-safe; a mapping is unmapped when its last registration is destroyed.
#ifndef TIER_ENGINE_MEMFD_MAPPINGS_H_
#define TIER_ENGINE_MEMFD_MAPPINGS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "engine/memfd_mapping.h"

namespace tier::engine {

class MemfdMappings {
 public:
  // The mapping of `fd`'s memfd covering at least [0, bytes): a live one, or a new one
  // (MemfdMapping::Map, sealed). INVALID_ARGUMENT when a live one is shorter than `bytes` (it
  // cannot be mapped again: register the memfd with its full size first) and for what Map refuses.
  absl::StatusOr<std::shared_ptr<MemfdMapping>> Get(const UniqueFd& fd, uint64_t bytes);

 private:
  using Key = std::pair<dev_t, ino_t>;
  Mutex mu_;
  std::map<Key, std::weak_ptr<MemfdMapping>> mappings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_MEMFD_MAPPINGS_H_
