#include "daemon/tiers/tier_manager.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tier::daemon {

TierManager::TierManager(storage::HostPool& pool, storage::SpillStore* store,
                         SpillerOptions options, std::vector<int> part_of_device)
    : pool_(pool), part_of_device_(std::move(part_of_device)), admission_([this](bool first) {
        if (spiller_ != nullptr) spiller_->WaitBegan(first);
      }) {
  if (store != nullptr) {
    transfers_ = std::make_unique<NvmeTransfers>(pool_, *store);
    spiller_ = std::make_unique<Spiller>(*transfers_, admission_, options);
  }
}

TierManager::~TierManager() { Stop(); }

void TierManager::Start() {
  if (spiller_ != nullptr) spiller_->Start();
}

void TierManager::Stop() {
  admission_.Close();
  if (spiller_ == nullptr) return;
  spiller_->Stop();
  // Writes and reads call back into the spiller when they land: wait for them while the store
  // still runs (it goes after the tiers). Bounded: a device that never answers is logged.
  if (!transfers_->AwaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(30))) {
    LogError("tiers stopping with NVMe I/O still in flight after 30 s");
  }
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
  absl::Status admitted = table.Admit(object, extent, home_);
  if (!admitted.ok()) {
    Release refused(&home_, extent);  // not waiting for one: back at once
    return admitted;
  }
  CopyStarted();  // the fill's
  return admitted;
}

void TierManager::MakeReadable(const std::shared_ptr<ObjectTable>& table, uint64_t queue,
                               const ObjectTable::Pinned& pinned,
                               std::function<void(absl::StatusOr<Readable>)> answer) {
  if (transfers_ != nullptr && pinned.prefetch == ObjectTable::Prefetch::kHit) {
    transfers_->counters().prefetch_hits.fetch_add(1, std::memory_order_relaxed);
  } else if (transfers_ != nullptr && pinned.prefetch == ObjectTable::Prefetch::kMiss) {
    transfers_->counters().prefetch_misses.fetch_add(1, std::memory_order_relaxed);
  }
  // An OK answer starts the reload's copy.
  SpillRead::Then then = [this, answer = std::move(answer)](absl::StatusOr<Readable> readable) {
    if (readable.ok()) CopyStarted();
    answer(std::move(readable));
  };
  if (!pinned.on_nvme || transfers_ == nullptr) {
    then(Readable{});
    return;
  }
  // Behind jobs already waiting for room, unless no room is needed (a read already runs).
  const std::shared_ptr<Object>& object = pinned.object;
  if (Fetch(table, object, /*may_allocate=*/!admission_.HasWaiters(), then)) return;
  // Like an offload: tried again each time room may have come; fails only when none can come.
  const uint64_t len = object->len();
  admission_.Wait(
      queue, [this, table, object, then]() { return Fetch(table, object, true, then); },
      [then, len]() {
        then(absl::ResourceExhaustedError(absl::StrCat(
            "host pool full and nothing can be spilled: no room to bring back ", len,
            " spilled bytes")));
      });
}

bool TierManager::Fetch(const std::shared_ptr<ObjectTable>& table,
                        const std::shared_ptr<Object>& object, bool may_allocate,
                        const SpillRead::Then& then) {
  // NVMe -> host -> destination: the reload that starts the read copies each chunk onward as the
  // read verifies it; a reload that finds a read already running waits for it, then copies.
  constexpr ObjectTable::Reader kReader = ObjectTable::Reader::kPipelined;
  std::function<std::optional<storage::Extent>()> allocate;
  if (may_allocate) allocate = [this, object] { return transfers_->AllocateFetch(*object); };
  ObjectTable::FetchBegun begun =
      table->BeginFetch(*object, kReader, allocate, [then](absl::Status ended) {
        if (ended.ok()) {
          then(Readable{});
        } else {
          then(std::move(ended));
        }
      });
  switch (begun.fetch) {
    case ObjectTable::Fetch::kNoRoom:
      return false;
    case ObjectTable::Fetch::kJoined:  // copies once the running read ended
      return true;
    case ObjectTable::Fetch::kInHost:
    case ObjectTable::Fetch::kGone:
      then(Readable{});
      return true;
    case ObjectTable::Fetch::kStarted:
      break;
  }
  SpillRead::Start(*transfers_, table, object, kReader, begun, then);
  return true;
}

void TierManager::FillEnded(const std::shared_ptr<ObjectTable>& table,
                            const std::shared_ptr<Object>& object, const absl::Status& status,
                            std::vector<ObjectWaiter>* waiters) {
  table->EndFill(*object, status, waiters);  // (memory it releases goes back at once)
  if (status.ok() && spiller_ != nullptr) spiller_->Track(table, object);
  CopyEnded();
}

void TierManager::ReloadEnded(ObjectTable& table, Object& object) {
  table.Unpin(object);  // (memory it releases goes back at once)
  CopyEnded();
}

void TierManager::CopyStarted() {
  if (spiller_ != nullptr) spiller_->CopyStarted();
}

void TierManager::CopyEnded() {
  if (spiller_ != nullptr) spiller_->CopyEnded();
}

void TierManager::Home::Return(std::optional<storage::Extent> extent,
                               std::optional<storage::SpillRecord> record) {
  if (record && tiers_.transfers_ != nullptr) (void)tiers_.transfers_->store().Free(*record);
  if (extent) {
    tiers_.pool_.Free(*extent);
    if (tiers_.spiller_ != nullptr) tiers_.spiller_->NotifyFreed();  // waiters may fit now
  }
}

}  // namespace tier::daemon
