#include "engine/memfd_mappings.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tier::engine {

absl::StatusOr<std::shared_ptr<MemfdMapping>> MemfdMappings::Get(const UniqueFd& fd,
                                                                 uint64_t bytes) {
  if (!fd.valid()) return absl::InvalidArgumentError("host buffer without a memfd");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of host buffer");
  const Key key{st.st_dev, st.st_ino};
  MutexLock lock(&mu_);
  // (Expired entries of other memfds go as they are met, so the map stays as large as what lives.)
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    it = it->second.expired() ? mappings_.erase(it) : std::next(it);
  }
  if (auto it = mappings_.find(key); it != mappings_.end()) {
    std::shared_ptr<MemfdMapping> live = it->second.lock();
    if (live != nullptr) {
      if (bytes > live->bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "memfd registered already with ", live->bytes(), " bytes (tierd maps a memfd once): "
            "register all ", bytes, " first, or a new memfd"));
      }
      return live;
    }
  }
  absl::StatusOr<std::unique_ptr<MemfdMapping>> mapped =
      MemfdMapping::Map(fd, bytes, /*seal_future_writes=*/true);
  if (!mapped.ok()) return mapped.status();
  std::shared_ptr<MemfdMapping> mapping = *std::move(mapped);
  mappings_[key] = mapping;
  return mapping;
}

}  // namespace tier::engine
