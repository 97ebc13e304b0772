#include "daemon/tiers/tier_manager.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tier::daemon {

TierManager::TierManager(storage::HostPool& pool, storage::SpillStore* store,
                         SpillerOptions options, std::vector<int> part_of_device)
    : pool_(pool), part_of_device_(std::move(part_of_device)), admission_([this](bool first) {
        if (spiller_ != nullptr) spiller_->WaitBegan(first);
      }) {
  if (store != nullptr) {
    spiller_ = std::make_unique<Spiller>(pool_, *store, admission_, options);
  }
}

TierManager::~TierManager() { Stop(); }

void TierManager::Start() {
  if (spiller_ != nullptr) spiller_->Start();
}

void TierManager::Stop() {
  admission_.Close();
  if (spiller_ != nullptr) spiller_->Stop();
}

int TierManager::PartOf(int device) const {
  if (device < 0 || static_cast<size_t>(device) >= part_of_device_.size()) {
    return storage::HostPool::kAnyPart;
  }
  return part_of_device_[device];
}

void TierManager::Admit(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
                        const std::shared_ptr<Object>& object, int device,
                        std::function<void(absl::Status)> then) {
  const uint64_t len = object->len();
  const int part = PartOf(device);
  object->set_home_part(part);
  // With jobs already waiting for room, this one waits behind them (in order).
  if (spiller_ == nullptr || !admission_.HasWaiters()) {
    if (std::optional<storage::Extent> extent = pool_.Allocate(len, part)) {
      then(AdmitWith(*table, *object, *extent));
      return;
    }
    if (spiller_ == nullptr) {
      then(absl::ResourceExhaustedError(
          absl::StrCat("host pool full: no free extent of ", len, " bytes")));
      return;
    }
  }
  // Host pool full: the object exists (jobs naming it queue behind its fill), and the copy
  // starts once the spiller has made room, or fails if none can come.
  auto shared_then = std::make_shared<std::function<void(absl::Status)>>(std::move(then));
  admission_.Wait(
      queue,
      [this, table, object, shared_then, part]() {
        std::optional<storage::Extent> extent = pool_.Allocate(object->len(), part);
        if (!extent) return false;
        (*shared_then)(AdmitWith(*table, *object, *extent));
        return true;
      },
      [shared_then, len]() {
        (*shared_then)(absl::ResourceExhaustedError(absl::StrCat(
            "host pool and NVMe tier full: no room for ", len, " bytes (nothing more to spill)")));
      });
}

absl::Status TierManager::AdmitWith(ObjectTable& table, Object& object, storage::Extent extent) {
  absl::Status admitted = table.Admit(object, extent);
  if (!admitted.ok()) Settle(Release{extent, std::nullopt});  // not waiting for one
  return admitted;
}

void TierManager::NoteReload(ObjectTable::Prefetch prefetch) {
  if (spiller_ == nullptr) return;
  if (prefetch == ObjectTable::Prefetch::kHit) {
    spiller_->counters().prefetch_hits.fetch_add(1, std::memory_order_relaxed);
  } else if (prefetch == ObjectTable::Prefetch::kMiss) {
    spiller_->counters().prefetch_misses.fetch_add(1, std::memory_order_relaxed);
  }
}

void TierManager::MakeReadable(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
                               const ObjectTable::Pinned& pinned,
                               std::function<void(absl::StatusOr<Readable>)> then) {
  if (!pinned.on_nvme || spiller_ == nullptr) {
    then(Readable{});
    return;
  }
  // NVMe -> host -> destination: the reload that starts the read copies each chunk onward as the
  // read verifies it; a reload that finds a read already running waits for it, then copies.
  spiller_->Fetch(table, queue, pinned.object, std::move(then));
}

void TierManager::Filled(const std::shared_ptr<ObjectTable>& table,
                         const std::shared_ptr<Object>& object) {
  if (spiller_ != nullptr) spiller_->Track(table, object);
}

void TierManager::CopyStarted() {
  if (spiller_ != nullptr) spiller_->CopyStarted();
}

void TierManager::CopyEnded() {
  if (spiller_ != nullptr) spiller_->CopyEnded();
}

void TierManager::Settle(const Release& release) {
  if (spiller_ != nullptr) {
    spiller_->Settle(release);
  } else if (release.extent) {
    pool_.Free(*release.extent);
  }
}

}  // namespace tier::daemon
