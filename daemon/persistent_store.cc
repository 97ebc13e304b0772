#include "daemon/persistent_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/metrics.h"

namespace tier::daemon {
namespace {

absl::Status NoSuchName(absl::string_view name) {
  // The same words whether the name is unknown or another uid's: existence is not revealed.
  return absl::NotFoundError(absl::StrCat("no persistent object named \"", name, "\""));
}

}  // namespace

PersistentStore::PersistentStore(TierManager& tiers, uint64_t quota_bytes_per_uid,
                                 PersistentJournal* journal)
    : tiers_(tiers), quota_bytes_per_uid_(quota_bytes_per_uid), journal_(journal) {
  if (journal_ != nullptr) writer_ = std::thread([this] { RunWriter(); });
}

PersistentStore::~PersistentStore() { DropAll(); }

void PersistentStore::Enqueue(JournalOp op) {
  MutexLock lock(&writer_mu_);
  writes_.push_back(std::move(op));
  writer_cv_.SignalAll();
}

void PersistentStore::RunWriter() {
  for (;;) {
    JournalOp op;
    {
      MutexLock lock(&writer_mu_);
      writer_busy_ = false;
      writer_cv_.SignalAll();
      while (writes_.empty() && !stop_) writer_cv_.Wait(&writer_mu_);
      if (writes_.empty()) return;  // stopping, and everything queued is written
      op = std::move(writes_.front());
      writes_.pop_front();
      writer_busy_ = true;
    }
    // File I/O and fsync here, on this thread only: never on a job's path.
    if (op.object == nullptr) {
      MutexLock journal_lock(&journal_mu_);
      if (absl::Status s = journal_->Remove(op.uid, op.name); !s.ok()) {
        LogError("persistent object \"", op.name, "\" of uid ", op.uid,
                 " not removed from the journal: ", s.message());
      }
      continue;
    }
    absl::Status written;
    bool skipped = false;
    {
      MutexLock journal_lock(&journal_mu_);
      {
        // Deleted while queued (Delete removed it already, or will find nothing): not written.
        MutexLock lock(&mu_);
        skipped = true;
        if (auto space = spaces_.find(op.uid); space != spaces_.end()) {
          auto it = space->second.names.find(op.name);
          skipped = it == space->second.names.end() || it->second.id != op.id;
        }
      }
      if (!skipped) {
        const char* data = tiers_.pool().At(op.table->extent(*op.object));
        written = journal_->Add(op.uid, op.name, data, op.object->len());
      }
    }
    tiers_.Settle(op.table->Unpin(*op.object));
    if (skipped) continue;
    if (!written.ok()) {
      LogError("persistent object \"", op.name, "\" of uid ", op.uid,
               " not written to NVMe (it will not survive a restart): ", written.message());
      continue;
    }
    MutexLock lock(&mu_);
    auto space = spaces_.find(op.uid);
    if (space == spaces_.end()) continue;
    auto it = space->second.names.find(op.name);
    if (it != space->second.names.end() && it->second.id == op.id) it->second.durable = true;
  }
}

void PersistentStore::Filled(const std::shared_ptr<ObjectTable>& table,
                             const std::shared_ptr<Object>& object) {
  if (journal_ == nullptr) return;
  JournalOp op;
  {
    MutexLock lock(&mu_);
    for (auto& [uid, space] : spaces_) {
      if (space.table != table) continue;
      for (const auto& [name, entry] : space.names) {
        if (entry.id != object->id()) continue;
        op.uid = uid;
        op.name = name;
      }
    }
  }
  if (op.name.empty()) return;  // not a persistent object (or deleted already)
  // Pinned until written: neither spilled nor freed under the writer.
  absl::StatusOr<ObjectTable::Pinned> pinned = table->PinForReload(object->id(), object->len());
  if (!pinned.ok()) return;
  op.id = object->id();
  op.table = table;
  op.object = object;
  Enqueue(std::move(op));
}

size_t PersistentStore::Restore() {
  if (journal_ == nullptr) return 0;
  if (!journal_->manifest_status().ok()) {
    LogError("persistent objects: the manifest in ", journal_->dir(),
             " is damaged and was set aside (manifest.damaged); none of it is served: ",
             journal_->manifest_status().message());
  }
  size_t restored = 0;
  for (const PersistentJournal::Record& record : journal_->records()) {
    absl::Status status = CheckName(record.name);
    std::optional<storage::Extent> extent;
    const uint64_t charge = tiers_.Charge(record.len);
    if (status.ok() && record.len == 0) status = absl::DataLossError("empty record");
    if (status.ok()) {
      extent = tiers_.pool().Allocate(charge);
      if (!extent) status = absl::ResourceExhaustedError("no room in the host pool");
    }
    if (status.ok()) status = journal_->Load(record, tiers_.pool().At(*extent));
    std::shared_ptr<ObjectTable> table;
    std::shared_ptr<Object> object;
    if (status.ok()) {
      MutexLock lock(&mu_);
      Namespace& space = SpaceLocked(record.uid);
      Entry entry{next_id_++, 0, MonotonicMs(), true};
      absl::StatusOr<std::shared_ptr<Object>> created =
          space.table->Create(entry.id, record.len, 0, 0, charge);
      if (created.ok()) status = space.table->Admit(**created, *extent);
      if (!created.ok()) status = created.status();
      if (status.ok()) {
        std::vector<ObjectWaiter> none;
        (void)space.table->EndFill(**created, absl::OkStatus(), &none);
        space.names[record.name] = entry;
        table = space.table;
        object = *created;
      }
    }
    if (!status.ok()) {
      if (extent && object == nullptr) tiers_.pool().Free(*extent);
      LogError("persistent object \"", record.name, "\" of uid ", record.uid,
               " not restored: ", status.ToString());
      continue;
    }
    tiers_.Filled(table, object);  // a spill candidate like any other
    ++restored;
  }
  return restored;
}

absl::Status PersistentStore::CheckName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("a persistent object needs a name");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("object name of ", name.size(), " bytes; at most ", kMaxNameBytes));
  }
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "object names are printable ASCII without spaces or control characters");
    }
  }
  return absl::OkStatus();
}

PersistentStore::Namespace& PersistentStore::SpaceLocked(uid_t uid) {
  Namespace& space = spaces_[uid];
  if (space.table == nullptr) {
    space.table = std::make_shared<ObjectTable>(
        quota_bytes_per_uid_,
        absl::StrCat("persistent quota of uid ", uid, " (persistent_quota_bytes_per_uid)"));
  }
  return space;
}

absl::StatusOr<ObjectSlot> PersistentStore::Create(uid_t uid, absl::string_view name,
                                                   uint64_t session, uint64_t len) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  MutexLock lock(&mu_);
  Namespace& space = SpaceLocked(uid);
  auto it = space.names.find(name);
  if (it != space.names.end()) {
    const Entry& entry = it->second;
    if (space.table->Find(entry.id) != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("a persistent object named \"", name, "\" exists"));
    }
    // No object: its offload has not run yet, or failed, or it was deleted. Only a reservation of
    // another session that is still alive keeps the name (its offload may yet come).
    if (entry.reserved_by != 0 && entry.reserved_by != session) {
      return absl::AlreadyExistsError(absl::StrCat(
          "a persistent object named \"", name, "\" is being created by another session"));
    }
  }
  const uint64_t used = space.table->used_bytes();
  const uint64_t charge = tiers_.Charge(len);
  if (charge > quota_bytes_per_uid_ || used > quota_bytes_per_uid_ - charge) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "persistent quota of uid ", uid, " exceeded: ", used, " + ", charge,
        " bytes > persistent_quota_bytes_per_uid of ", quota_bytes_per_uid_));
  }
  Entry entry{next_id_++, session, MonotonicMs()};
  space.names[std::string(name)] = entry;
  return ObjectSlot{space.table, entry.id};
}

absl::StatusOr<PersistentStore::Found> PersistentStore::FindLocked(uid_t uid,
                                                                  absl::string_view name) const {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  auto space = spaces_.find(uid);
  if (space == spaces_.end()) return NoSuchName(name);
  auto it = space->second.names.find(name);
  if (it == space->second.names.end()) return NoSuchName(name);
  std::shared_ptr<Object> object = space->second.table->Find(it->second.id);
  if (object == nullptr) return NoSuchName(name);
  return Found{space->second.table, &it->second, std::move(object)};
}

absl::StatusOr<ObjectSlot> PersistentStore::Open(uid_t uid, absl::string_view name,
                                                 uint64_t* len) {
  MutexLock lock(&mu_);
  absl::StatusOr<Found> found = FindLocked(uid, name);
  if (!found.ok()) return found.status();
  *len = found->object->len();
  return ObjectSlot{found->table, found->entry->id};
}

absl::StatusOr<PersistentObjectState> PersistentStore::Stat(uid_t uid,
                                                            absl::string_view name) const {
  MutexLock lock(&mu_);
  absl::StatusOr<Found> found = FindLocked(uid, name);
  if (!found.ok()) return found.status();
  PersistentObjectState state;
  state.len = found->object->len();
  state.ready = found->table->Look(*found->object).state == Object::State::kReady;
  state.durable = found->entry->durable;
  state.journaled = journal_ != nullptr;
  return state;
}

absl::Status PersistentStore::Delete(uid_t uid, absl::string_view name) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  absl::StatusOr<Release> released;
  MutexLock journal_lock(&journal_mu_);  // a write of it in progress ends first
  {
    MutexLock lock(&mu_);
    auto space = spaces_.find(uid);
    if (space == spaces_.end()) return NoSuchName(name);
    auto it = space->second.names.find(name);
    if (it == space->second.names.end()) return NoSuchName(name);
    released = space->second.table->Free(it->second.id);
    space->second.names.erase(it);
    if (!released.ok()) return NoSuchName(name);
  }
  // Off NVMe before the answer (a write of it still queued finds the name gone and skips).
  if (journal_ != nullptr) {
    if (absl::Status s = journal_->Remove(uid, std::string(name)); !s.ok()) {
      LogError("persistent object \"", name, "\" of uid ", uid,
               " deleted, but its journal record could not be removed: ", s.message());
    }
  }
  tiers_.Settle(*released);  // outside the store's lock: the pool and the spill store
  return absl::OkStatus();
}

void PersistentStore::Forget(const std::shared_ptr<ObjectTable>& table, uint64_t id) {
  MutexLock lock(&mu_);
  for (auto& [uid, space] : spaces_) {
    if (space.table != table) continue;
    for (auto it = space.names.begin(); it != space.names.end(); ++it) {
      if (it->second.id != id) continue;
      if (journal_ != nullptr) Enqueue(JournalOp{uid, it->first, 0, nullptr, nullptr});
      space.names.erase(it);
      return;
    }
  }
}

void PersistentStore::SessionEnded(uint64_t session) {
  std::vector<Release> released;
  {
    MutexLock lock(&mu_);
    for (auto& [uid, space] : spaces_) {
      bool touched = false;
      for (auto it = space.names.begin(); it != space.names.end();) {
        Entry& entry = it->second;
        if (entry.reserved_by != session) {
          ++it;
          continue;
        }
        touched = true;
        entry.reserved_by = 0;
        if (space.table->Find(entry.id) == nullptr) {
          it = space.names.erase(it);
        } else {
          ++it;
        }
      }
      if (!touched) continue;
      // An object no name reaches (the session reserved one name twice and offloaded into both
      // ids) would hold quota for ever: it goes now.
      std::map<uint64_t, bool> named;
      for (const auto& [name, entry] : space.names) named[entry.id] = true;
      for (uint64_t id : space.table->Ids()) {
        if (named.contains(id)) continue;
        absl::StatusOr<Release> r = space.table->Free(id);
        if (r.ok() && !r->empty()) released.push_back(*r);
      }
    }
  }
  for (const Release& r : released) tiers_.Settle(r);
}

std::vector<PersistentObjectInfo> PersistentStore::List() const {
  std::vector<PersistentObjectInfo> out;
  uint64_t now = MonotonicMs();
  MutexLock lock(&mu_);
  for (const auto& [uid, space] : spaces_) {
    for (const auto& [name, entry] : space.names) {
      std::shared_ptr<Object> object = space.table->Find(entry.id);
      if (object == nullptr) continue;
      ObjectTable::View view = space.table->Look(*object);
      if (view.state != Object::State::kReady) continue;  // still filling: not there yet
      PersistentObjectInfo info;
      info.uid = uid;
      info.name = name;
      info.bytes = object->len();
      info.tier = view.where == Object::Where::kNvme || view.where == Object::Where::kFetching
                      ? "nvme"
                      : "host";
      info.age_ms = now - entry.created_ms;
      info.durable = entry.durable;
      out.push_back(std::move(info));
    }
  }
  return out;
}

size_t PersistentStore::size() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [uid, space] : spaces_) n += space.table->size();
  return n;
}

void PersistentStore::DropAll() {
  if (writer_.joinable()) {
    {
      MutexLock lock(&writer_mu_);
      stop_ = true;
      writer_cv_.SignalAll();
    }
    writer_.join();
  }
  std::vector<Release> released;
  {
    MutexLock lock(&mu_);
    for (auto& [uid, space] : spaces_) {
      for (const Release& r : space.table->DropAll()) released.push_back(r);
      space.names.clear();
    }
  }
  for (const Release& r : released) tiers_.Settle(r);
}

}  // namespace tier::daemon
