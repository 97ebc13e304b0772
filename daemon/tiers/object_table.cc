#include "daemon/tiers/object_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tier::daemon {

bool SharedQuota::TryCharge(uint64_t bytes, bool force) {
  uint64_t used = used_bytes_.load(std::memory_order_relaxed);
  do {
    if (!force && (bytes > limit_bytes_ || used > limit_bytes_ - bytes)) return false;
  } while (!used_bytes_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

absl::Status ObjectTable::ChargeLocked(uint64_t bytes, Charge mode) {
  const bool force = mode == Charge::kForce;
  if (!force && (bytes > quota_bytes_ || used_bytes_ > quota_bytes_ - bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(quota_name_, " exceeded: ", used_bytes_,
                                                     " + ", bytes, " bytes > quota of ",
                                                     quota_bytes_));
  }
  if (shared_ != nullptr && !shared_->TryCharge(bytes, force)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(shared_->name(), " exceeded: ", shared_->used_bytes(), " + ", bytes,
                     " bytes > ", shared_->limit_bytes()));
  }
  used_bytes_ += bytes;
  return absl::OkStatus();
}

void ObjectTable::RefundLocked(uint64_t bytes) {
  used_bytes_ -= bytes;
  if (shared_ != nullptr) shared_->Refund(bytes);
}

void ObjectTable::ChargeOutside(uint64_t bytes) {
  MutexLock lock(&mu_);
  (void)ChargeLocked(bytes, Charge::kForce);
}

void ObjectTable::RefundOutside(uint64_t bytes) {
  MutexLock lock(&mu_);
  RefundLocked(bytes);
}

uint64_t ObjectTable::used_bytes() const {
  MutexLock lock(&mu_);
  return used_bytes_;
}

size_t ObjectTable::size() const {
  MutexLock lock(&mu_);
  return objects_.size();
}

std::shared_ptr<Object> ObjectTable::Find(uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = objects_.find(id);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<uint64_t> ObjectTable::Ids() const {
  MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  ids.reserve(objects_.size());
  for (const auto& [id, object] : objects_) ids.push_back(id);
  return ids;
}

absl::StatusOr<std::shared_ptr<Object>> ObjectTable::Create(uint64_t id, uint64_t len,
                                                            uint64_t hint, uint64_t seq,
                                                            uint64_t charge, Charge mode) {
  MutexLock lock(&mu_);
  if (objects_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("object ", id, " already exists"));
  }
  if (absl::Status charged = ChargeLocked(charge, mode); !charged.ok()) return charged;
  auto object = std::make_shared<Object>(id, len, hint, seq);
  object->pins_ = 1;  // the fill
  object->charged_ = charge;
  objects_.emplace(id, object);
  return object;
}

absl::Status ObjectTable::Admit(Object& object, storage::Extent extent, MemoryHome& home) {
  MutexLock lock(&mu_);
  if (object.extent_.bytes != 0 || object.state_ != Object::State::kFilling) {
    return absl::FailedPreconditionError(
        absl::StrCat("object ", object.id(), " was admitted already or is not filling"));
  }
  object.extent_ = extent;
  object.home_ = &home;
  (void)ChargeLocked(extent.bytes, Charge::kForce);  // (the extent exists: it counts)
  RefundLocked(object.charged_);
  object.charged_ = extent.bytes;
  return absl::OkStatus();
}

void ObjectTable::FillSubmitted(Object& object) {
  MutexLock lock(&mu_);
  if (object.state_ == Object::State::kFilling) object.fill_submitted_ = true;
}

Release ObjectTable::EndFill(Object& object, const absl::Status& status,
                             std::vector<ObjectWaiter>* waiters) {
  MutexLock lock(&mu_);
  if (status.ok()) {
    object.state_ = Object::State::kReady;
  } else {
    object.state_ = Object::State::kFailed;
    DropLocked(object);  // a failed offload leaves no object behind
  }
  waiters->swap(object.on_filled_);
  return UnpinLocked(object);
}

absl::StatusOr<Release> ObjectTable::Free(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = objects_.find(id);
  if (it == objects_.end()) {
    return absl::NotFoundError(absl::StrCat("no object ", id, " in this session"));
  }
  std::shared_ptr<Object> object = it->second;
  DropLocked(*object);
  // Jobs already accepted keep their pins; the memory returns when the last one ends.
  ++object->pins_;
  return UnpinLocked(*object);
}

void ObjectTable::DropAfterReload(Object& object) {
  MutexLock lock(&mu_);
  DropLocked(object);
}

std::vector<Release> ObjectTable::DropAll() {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Object>> all;
  all.reserve(objects_.size());
  for (auto& [id, object] : objects_) all.push_back(object);
  std::vector<Release> released;
  for (const std::shared_ptr<Object>& object : all) {
    DropLocked(*object);
    ++object->pins_;
    Release r = UnpinLocked(*object);
    if (!r.empty()) released.push_back(std::move(r));
  }
  return released;
}

absl::StatusOr<ObjectTable::Pinned> ObjectTable::PinForReload(uint64_t id, uint64_t len) {
  MutexLock lock(&mu_);
  auto it = objects_.find(id);
  if (it == objects_.end()) {
    return absl::NotFoundError(absl::StrCat("no object ", id, " in this session"));
  }
  Object& object = *it->second;
  if (len != object.len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reload of ", len, " bytes from object ", id, " of ", object.len(), " bytes"));
  }
  ++object.pins_;
  Pinned pinned;
  pinned.object = it->second;
  pinned.filling = object.state_ == Object::State::kFilling;
  pinned.fill_submitted = object.fill_submitted_;
  pinned.on_nvme =
      object.where_ == Object::Where::kNvme || object.where_ == Object::Where::kFetching;
  if (pinned.on_nvme) {
    pinned.prefetch = Prefetch::kMiss;
  } else if (object.prefetched_) {
    pinned.prefetch = Prefetch::kHit;
  }
  object.prefetched_ = false;
  return pinned;
}

absl::StatusOr<ObjectTable::CopySource> ObjectTable::PinForCopy(Object& object) {
  MutexLock lock(&mu_);
  if (object.dropped_) return absl::NotFoundError(absl::StrCat("object ", object.id(), " is gone"));
  if (object.state_ != Object::State::kReady) {
    return absl::FailedPreconditionError(absl::StrCat("object ", object.id(), " is not filled"));
  }
  ++object.pins_;
  CopySource source;
  source.on_nvme =
      object.where_ == Object::Where::kNvme || object.where_ == Object::Where::kFetching;
  if (source.on_nvme) {
    source.record = object.record_;
  } else {
    source.extent = object.extent_;
  }
  return source;
}

ObjectTable::Fill ObjectTable::AwaitFill(Object& object, ObjectWaiter waiter) {
  MutexLock lock(&mu_);
  switch (object.state_) {
    case Object::State::kFilling:
      object.on_filled_.push_back(std::move(waiter));
      return Fill::kRunning;
    case Object::State::kReady:
      return Fill::kSucceeded;
    case Object::State::kFailed:
      break;
  }
  return Fill::kFailed;
}

Release ObjectTable::Unpin(Object& object) {
  MutexLock lock(&mu_);
  return UnpinLocked(object);
}

storage::Extent ObjectTable::extent(const Object& object) const {
  MutexLock lock(&mu_);
  return object.extent_;
}

ObjectTable::View ObjectTable::Look(const Object& object) const {
  MutexLock lock(&mu_);
  return View{object.state_, object.where_,   object.extent_,
              object.pins_,  object.dropped_, object.prefetched_};
}

ObjectTable::SpillStart ObjectTable::BeginSpill(Object& object, storage::Extent* extent) {
  MutexLock lock(&mu_);
  if (object.dropped_ || object.state_ != Object::State::kReady ||
      object.where_ != Object::Where::kHost) {
    return SpillStart::kNot;
  }
  if (object.pins_ > 0) return SpillStart::kBusy;  // a reload uses it: later
  object.where_ = Object::Where::kSpilling;
  object.prefetched_ = false;
  ++object.pins_;  // the write reads the extent
  *extent = object.extent_;
  return SpillStart::kBegan;
}

Release ObjectTable::EndSpill(Object& object, const absl::StatusOr<storage::SpillRecord>& record,
                              bool* spilled) {
  MutexLock lock(&mu_);
  Release release(object.home_);
  *spilled = false;
  if (object.where_ != Object::Where::kSpilling) return release;  // no spill began
  if (record.ok() && object.pins_ == 1 && !object.dropped_) {
    release.set_extent(object.extent_);
    object.extent_ = {};
    object.record_ = *record;
    object.where_ = Object::Where::kNvme;
    *spilled = true;
  } else {
    // Failed, or used or freed during the write: the host copy stays (or goes with the last
    // unpin); the record is not needed.
    object.where_ = Object::Where::kHost;
    if (record.ok()) release.set_record(*record);
  }
  release.Absorb(UnpinLocked(object));  // (not both an extent: see UnpinLocked)
  return release;
}

ObjectTable::FetchBegun ObjectTable::BeginFetch(
    Object& object, Reader reader, const std::function<std::optional<storage::Extent>()>& allocate,
    ObjectWaiter joiner) {
  MutexLock lock(&mu_);
  FetchBegun begun;
  const bool prefetch = reader == Reader::kPrefetch;
  if (prefetch && object.dropped_) {
    begun.fetch = Fetch::kGone;
    begun.released = UnpinLocked(object);
    return begun;
  }
  switch (object.where_) {
    case Object::Where::kHost:
    case Object::Where::kSpilling:  // the host copy is intact until the write lands
      begun.fetch = Fetch::kInHost;
      if (prefetch) begun.released = UnpinLocked(object);
      return begun;
    case Object::Where::kFetching:
      begun.fetch = Fetch::kJoined;
      if (prefetch) {
        begun.released = UnpinLocked(object);  // someone else's read brings it back
      } else if (joiner) {
        object.on_fetched_.push_back(std::move(joiner));
      }
      return begun;
    case Object::Where::kNvme: {
      if (!allocate) return begun;  // kNoRoom
      std::optional<storage::Extent> got = allocate();
      if (!got) return begun;
      object.extent_ = *got;
      object.where_ = Object::Where::kFetching;
      begun.fetch = Fetch::kStarted;
      begun.extent = *got;
      begun.record = object.record_;
      return begun;
    }
  }
  return begun;
}

Release ObjectTable::EndFetch(Object& object, const absl::Status& read, bool prefetch,
                              bool* spillable, std::vector<ObjectWaiter>* joined) {
  MutexLock lock(&mu_);
  Release release(object.home_);
  joined->swap(object.on_fetched_);
  if (read.ok()) {
    object.where_ = Object::Where::kHost;
    release.set_record(object.record_);
    object.record_ = {};
    object.prefetched_ = prefetch;
  } else {  // the bytes stay on NVMe; the host extent goes back (after the reader's copy)
    release.set_extent(object.extent_);
    object.extent_ = {};
    object.where_ = Object::Where::kNvme;
  }
  if (prefetch) release.Absorb(UnpinLocked(object));
  *spillable = read.ok() && !object.dropped_;
  return release;
}

bool ObjectTable::PinIfOnNvme(Object& object) {
  MutexLock lock(&mu_);
  if (object.dropped_ || object.where_ != Object::Where::kNvme) return false;
  ++object.pins_;
  return true;
}

Release ObjectTable::UnpinLocked(Object& object) {
  Release release(object.home_);
  if (object.pins_ > 0) --object.pins_;
  if (object.pins_ > 0 || !object.dropped_) return release;
  if (object.where_ == Object::Where::kNvme) {
    release.set_record(object.record_);
    object.record_ = {};
  } else if (object.extent_.bytes != 0) {
    release.set_extent(object.extent_);
    object.extent_ = {};
  }
  RefundLocked(object.charged_);
  object.charged_ = 0;
  return release;
}

void ObjectTable::DropLocked(Object& object) {
  if (object.dropped_) return;
  object.dropped_ = true;
  auto it = objects_.find(object.id());
  if (it != objects_.end() && it->second.get() == &object) objects_.erase(it);
}

}  // namespace tier::daemon
