#include "daemon/tiers/release.h"

#include <utility>

namespace tier::daemon {

Release& Release::operator=(Release&& other) noexcept {
  if (this == &other) return *this;
  GiveBack();
  home_ = other.home_;
  extent_ = std::exchange(other.extent_, std::nullopt);
  record_ = std::exchange(other.record_, std::nullopt);
  return *this;
}

void Release::Absorb(Release&& other) {
  if (other.empty()) return;
  if (home_ == nullptr) home_ = other.home_;
  if (other.extent_) extent_ = std::exchange(other.extent_, std::nullopt);
  if (other.record_) record_ = std::exchange(other.record_, std::nullopt);
}

void Release::GiveBack() {
  if (empty()) return;
  std::optional<storage::Extent> extent = std::exchange(extent_, std::nullopt);
  std::optional<storage::SpillRecord> record = std::exchange(record_, std::nullopt);
  // An object that was never admitted has no memory, so no home is needed for it.
  if (home_ != nullptr) home_->Return(extent, record);
}

}  // namespace tier::daemon
