#include "daemon/persistent/persistent_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/metrics/metrics.h"

namespace tier::daemon {
namespace {

absl::Status NoSuchName(absl::string_view name) {
  // The same words whether the name is unknown or another uid's: existence is not revealed.
  return absl::NotFoundError(absl::StrCat("no persistent object named \"", name, "\""));
}

// Waits for a callback's status (restore only: at start, before any session).
class Awaited {
 public:
  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status status) {
      MutexLock lock(&mu_);
      status_ = std::move(status);
      cv_.SignalAll();
    };
  }
  absl::Status Wait() {
    MutexLock lock(&mu_);
    while (!status_.has_value()) cv_.Wait(&mu_);
    return *status_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::optional<absl::Status> status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

PersistentStore::PersistentStore(TierManager& tiers, PersistentLimits limits,
                                 PersistentJournal* journal)
    : tiers_(tiers),
      limits_(limits),
      node_quota_(std::make_shared<SharedQuota>(
          limits.max_bytes, "persistent objects of every uid (persistent_max_bytes)")),
      journal_(journal) {
  if (journal_ != nullptr) batcher_ = std::thread([this] { RunBatcher(); });
}

PersistentStore::~PersistentStore() { DropAll(); }

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

PersistentStore::Space& PersistentStore::SpaceLocked(uid_t uid) {
  Space& space = spaces_[uid];
  if (space.table == nullptr) {
    space.table = std::make_shared<ObjectTable>(
        limits_.quota_bytes_per_uid,
        absl::StrCat("persistent quota of uid ", uid, " (persistent_quota_bytes_per_uid)"),
        node_quota_);
  }
  return space;
}

bool PersistentStore::EraseLocked(std::unordered_map<Key, Entry, KeyHash>::iterator it) {
  const Key& key = it->first;
  const Entry& entry = it->second;
  const bool recorded =
      journal_ != nullptr && (entry.written == Written::kWriting || entry.written == Written::kYes);
  if (auto id = ids_.find(entry.id); id != ids_.end() && id->second == key) ids_.erase(id);
  if (entry.reserved_by != 0) {
    if (auto r = reservations_.find(entry.reserved_by); r != reservations_.end()) {
      r->second.erase(entry.id);
      if (r->second.empty()) reservations_.erase(r);
    }
  }
  Space& space = spaces_[key.uid];
  if (entry.unloaded) space.table->RefundOutside(tiers_.Charge(entry.len));
  --space.names;
  --names_;
  entries_.erase(it);
  return recorded;
}

void PersistentStore::DropReservationLocked(uint64_t session, uint64_t id,
                                            std::vector<Release>* released) {
  if (auto r = reservations_.find(session); r != reservations_.end()) {
    r->second.erase(id);
    if (r->second.empty()) reservations_.erase(r);
  }
  auto it = ids_.find(id);
  if (it == ids_.end()) return;
  std::shared_ptr<ObjectTable> table = spaces_[it->second.uid].table;
  ids_.erase(it);
  absl::StatusOr<Release> freed = table->Free(id);
  if (freed.ok() && !freed->empty()) released->push_back(*std::move(freed));
}

absl::StatusOr<ObjectSlot> PersistentStore::Create(uid_t uid, absl::string_view name,
                                                   uint64_t session, uint64_t len) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  MutexLock lock(&mu_);
  Space& space = SpaceLocked(uid);
  Key key{uid, std::string(name)};
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    const Entry& entry = it->second;
    if (entry.unloaded || space.table->Find(entry.id) != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("a persistent object named \"", name, "\" exists"));
    }
    // No object: its offload has not run yet, or failed. Only a reservation of another session
    // that is still alive keeps the name (its offload may yet come).
    if (entry.reserved_by != 0 && entry.reserved_by != session) {
      return absl::AlreadyExistsError(absl::StrCat(
          "a persistent object named \"", name, "\" is being created by another session"));
    }
    if (entry.written != Written::kNo) {
      // (An object that was recorded and is gone: its end is recorded before the name is new.)
      if (EraseLocked(it)) Enqueue(JournalOp{key, 0, nullptr, nullptr, nullptr});
      it = entries_.end();
    }
  }
  // (len first: the charge of a length near 2^64 would wrap.)
  const uint64_t quota = limits_.quota_bytes_per_uid;
  const uint64_t used = space.table->used_bytes();
  const uint64_t charge = len > quota ? 0 : tiers_.Charge(len);
  if (len > quota || charge > quota || used > quota - charge) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "persistent quota of uid ", uid, " exceeded: ", used, " + ", len > quota ? len : charge,
        " bytes > persistent_quota_bytes_per_uid of ", quota));
  }
  const uint64_t node_used = node_quota_->used_bytes();
  if (charge > limits_.max_bytes || node_used > limits_.max_bytes - charge) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "persistent objects of every uid hold ", node_used, " bytes; + ", charge,
        " > persistent_max_bytes of ", limits_.max_bytes));
  }
  if (it == entries_.end()) {
    if (space.names >= limits_.max_objects_per_uid) {
      return absl::ResourceExhaustedError(
          absl::StrCat("uid ", uid, " has ", space.names,
                       " persistent objects and names reserved: persistent_max_objects_per_uid"));
    }
    if (names_ >= limits_.max_objects) {
      return absl::ResourceExhaustedError(absl::StrCat(
          names_, " persistent objects and names reserved on this node: persistent_max_objects"));
    }
    it = entries_.emplace(key, Entry{}).first;
    ++space.names;
    ++names_;
  }
  // A name this session reserved before and never filled takes the new id; the old id stays
  // indexed as an orphan, so that an offload into it still lands somewhere it can be freed.
  Entry& entry = it->second;
  entry = Entry{next_id_++, session, MonotonicMs(), len};
  ids_[entry.id] = key;
  reservations_[session].insert(entry.id);
  return ObjectSlot{space.table, entry.id};
}

absl::StatusOr<PersistentStore::Found> PersistentStore::FindLocked(uid_t uid,
                                                                  absl::string_view name) const {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  auto it = entries_.find(Key{uid, std::string(name)});
  if (it == entries_.end()) return NoSuchName(name);
  auto space = spaces_.find(uid);
  if (space == spaces_.end()) return NoSuchName(name);
  if (it->second.unloaded) return Found{space->second.table, &it->second, nullptr};
  std::shared_ptr<Object> object = space->second.table->Find(it->second.id);
  if (object == nullptr) return NoSuchName(name);
  return Found{space->second.table, &it->second, std::move(object)};
}

absl::StatusOr<ObjectSlot> PersistentStore::Open(uid_t uid, absl::string_view name,
                                                 uint64_t* len) {
  MutexLock lock(&mu_);
  absl::StatusOr<Found> found = FindLocked(uid, name);
  if (!found.ok()) return found.status();
  if (found->object == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "persistent object \"", name,
        "\" is on NVMe in tierd's journal and was not loaded at start (no room in any tier): "
        "delete it, or restart tierd with room"));
  }
  *len = found->object->len();
  return ObjectSlot{found->table, found->entry->id};
}

absl::StatusOr<PersistentObjectState> PersistentStore::Stat(uid_t uid,
                                                            absl::string_view name) const {
  MutexLock lock(&mu_);
  absl::StatusOr<Found> found = FindLocked(uid, name);
  if (!found.ok()) return found.status();
  PersistentObjectState state;
  state.journaled = journal_ != nullptr;
  state.durable = found->entry->durable;
  if (found->object == nullptr) {
    state.len = found->entry->len;
    return state;
  }
  state.len = found->object->len();
  state.ready = found->table->Look(*found->object).state == Object::State::kReady;
  return state;
}

std::optional<absl::Status> PersistentStore::Delete(uid_t uid, absl::string_view name, Done done) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  Release released;  // goes back when this returns, after the store's lock (declared later)
  bool deferred = false;
  {
    MutexLock lock(&mu_);
    Key key{uid, std::string(name)};
    auto it = entries_.find(key);
    if (it == entries_.end()) return NoSuchName(name);
    if (!it->second.unloaded) {
      std::shared_ptr<ObjectTable> table = spaces_[uid].table;
      if (table->Find(it->second.id) == nullptr) return NoSuchName(name);  // not filled (yet)
      absl::StatusOr<Release> freed = table->Free(it->second.id);
      // (A job's free got there first: it forgets the name.)
      if (!freed.ok()) return NoSuchName(name);
      released = *std::move(freed);
    }
    if (EraseLocked(it)) {
      Enqueue(JournalOp{std::move(key), 0, nullptr, nullptr, std::move(done)});
      deferred = true;
    }
  }
  if (deferred) return std::nullopt;
  return absl::OkStatus();
}

absl::Status PersistentStore::DeleteAndWait(uid_t uid, absl::string_view name) {
  Awaited answer;
  std::optional<absl::Status> now = Delete(uid, name, answer.Callback());
  return now.has_value() ? *now : answer.Wait();
}

bool PersistentStore::Forget(const std::shared_ptr<ObjectTable>& table, uint64_t id,
                             std::function<void()> durable) {
  MutexLock lock(&mu_);
  auto name = ids_.find(id);
  if (name == ids_.end()) return false;
  auto it = entries_.find(name->second);
  if (it == entries_.end() || it->second.id != id || spaces_[it->first.uid].table != table) {
    ids_.erase(name);  // an orphan: no name to forget
    return false;
  }
  Key key = it->first;
  if (!EraseLocked(it)) return false;
  Enqueue(JournalOp{std::move(key), 0, nullptr, nullptr,
                    [durable = std::move(durable)](const absl::Status&) { durable(); }});
  return true;
}

void PersistentStore::Released(uint64_t session, const ObjectSlot& slot) {
  std::vector<Release> released;  // goes back after the store's lock
  {
    MutexLock lock(&mu_);
    auto name = ids_.find(slot.id);
    if (name == ids_.end()) return;
    auto it = entries_.find(name->second);
    if (it != entries_.end() && it->second.id == slot.id) {
      // A name reserved for this id and never filled goes with the binding; one whose offload
      // runs or landed stays.
      const Entry& entry = it->second;
      if (entry.reserved_by == session && !entry.unloaded &&
          spaces_[it->first.uid].table->Find(slot.id) == nullptr) {
        EraseLocked(it);
      }
      return;
    }
    DropReservationLocked(session, slot.id, &released);  // an orphan id of this session
  }
}

void PersistentStore::SessionEnded(uint64_t session) {
  std::vector<Release> released;
  {
    MutexLock lock(&mu_);
    auto reserved = reservations_.find(session);
    if (reserved == reservations_.end()) return;
    std::unordered_set<uint64_t> ids = std::move(reserved->second);
    reservations_.erase(reserved);
    for (uint64_t id : ids) {
      auto name = ids_.find(id);
      if (name == ids_.end()) continue;
      auto it = entries_.find(name->second);
      if (it != entries_.end() && it->second.id == id) {
        it->second.reserved_by = 0;
        if (!it->second.unloaded && spaces_[it->first.uid].table->Find(id) == nullptr) {
          EraseLocked(it);  // never filled (or its fill failed)
        }
        continue;
      }
      // An orphan (the session reserved this name again under another id): an object in it is
      // reached by no name and would hold quota for ever.
      std::shared_ptr<ObjectTable> table = spaces_[name->second.uid].table;
      ids_.erase(name);
      absl::StatusOr<Release> freed = table->Free(id);
      if (freed.ok() && !freed->empty()) released.push_back(*std::move(freed));
    }
  }
}

void PersistentStore::Filled(const std::shared_ptr<ObjectTable>& table,
                             const std::shared_ptr<Object>& object) {
  Release orphan;  // goes back after the store's lock
  {
    MutexLock lock(&mu_);
    auto name = ids_.find(object->id());
    auto it = name == ids_.end() ? entries_.end() : entries_.find(name->second);
    if (it != entries_.end() && it->second.id == object->id() &&
        spaces_[it->first.uid].table == table) {
      Entry& entry = it->second;
      if (entry.reserved_by != 0) {
        if (auto r = reservations_.find(entry.reserved_by); r != reservations_.end()) {
          r->second.erase(entry.id);
          if (r->second.empty()) reservations_.erase(r);
        }
        entry.reserved_by = 0;
      }
      if (journal_ != nullptr && entry.written == Written::kNo) {
        // Queued, not pinned: until the batcher's turn comes it may be spilled like any object.
        entry.written = Written::kQueued;
        Enqueue(JournalOp{it->first, entry.id, table, object, nullptr});
      }
      return;
    }
    // No name reaches it (deleted while it filled, or a reservation replaced): it goes.
    if (name != ids_.end()) ids_.erase(name);
    absl::StatusOr<Release> freed = table->Free(object->id());
    if (freed.ok()) orphan = *std::move(freed);
  }
}

std::vector<PersistentObjectInfo> PersistentStore::List() const {
  std::vector<PersistentObjectInfo> out;
  uint64_t now = MonotonicMs();
  MutexLock lock(&mu_);
  for (const auto& [key, entry] : entries_) {
    PersistentObjectInfo info;
    info.uid = key.uid;
    info.name = key.name;
    info.age_ms = now - entry.created_ms;
    info.durable = entry.durable;
    if (entry.unloaded) {
      info.bytes = entry.len;
      info.tier = "journal";
      out.push_back(std::move(info));
      continue;
    }
    auto space = spaces_.find(key.uid);
    std::shared_ptr<Object> object = space->second.table->Find(entry.id);
    if (object == nullptr) continue;
    ObjectTable::View view = space->second.table->Look(*object);
    if (view.state != Object::State::kReady) continue;  // still filling: not there yet
    info.bytes = object->len();
    info.tier = view.where == Object::Where::kNvme || view.where == Object::Where::kFetching
                    ? "nvme"
                    : "host";
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const PersistentObjectInfo& a,
                                       const PersistentObjectInfo& b) {
    return a.uid != b.uid ? a.uid < b.uid : a.name < b.name;
  });
  return out;
}

size_t PersistentStore::size() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [uid, space] : spaces_) n += space.table->size();
  return n;
}

PersistentUsage PersistentStore::usage() const {
  PersistentUsage usage;
  usage.limits = limits_;
  usage.bytes = node_quota_->used_bytes();
  usage.journaled = journal_ != nullptr;
  if (journal_ != nullptr) usage.journal = journal_->usage();
  {
    MutexLock lock(&mu_);
    usage.objects = names_;
    for (const auto& [uid, space] : spaces_) usage.uids += space.names > 0 ? 1 : 0;
  }
  MutexLock lock(&batch_mu_);
  usage.writes_queued = queued_;
  return usage;
}

void PersistentStore::DropAll() {
  if (batcher_.joinable()) {
    {
      MutexLock lock(&batch_mu_);
      stop_ = true;
      batch_cv_.SignalAll();
    }
    batcher_.join();
  }
  std::vector<Release> released;
  {
    MutexLock lock(&mu_);
    for (auto& [uid, space] : spaces_) {
      for (Release& r : space.table->DropAll()) released.push_back(std::move(r));
    }
    for (auto it = entries_.begin(); it != entries_.end();) EraseLocked(it++);
    ids_.clear();
    reservations_.clear();
  }
}

// ---- restore ------------------------------------------------------------------------------

size_t PersistentStore::Restore() {
  if (journal_ == nullptr) return 0;
  for (const std::string& note : journal_->open_notes()) {
    LogInfo("persistent journal: ", note);
  }
  if (!journal_->open_status().ok()) {
    LogError("persistent objects: ", journal_->open_status().ToString());
  }
  size_t restored = 0;
  for (const PersistentJournal::Record& record : journal_->Records()) {
    if (RestoreOne(record)) ++restored;
  }
  if (absl::Status s = journal_->Sync(); !s.ok()) {
    LogError("persistent journal: ", s.ToString());
  }
  return restored;
}

bool PersistentStore::RestoreOne(const PersistentJournal::Record& record) {
  const uint64_t charge = tiers_.Charge(record.len);
  absl::Status status = CheckName(record.name);
  if (status.ok() && record.len == 0) status = absl::DataLossError("empty record");
  const Key key{record.uid, record.name};
  std::shared_ptr<ObjectTable> table;
  std::shared_ptr<Object> object;
  if (status.ok()) {
    MutexLock lock(&mu_);
    Space& space = SpaceLocked(record.uid);
    const uint64_t id = next_id_++;
    // Bytes that exist already count, whatever the quotas say now (they may have shrunk).
    absl::StatusOr<std::shared_ptr<Object>> created =
        space.table->Create(id, record.len, 0, 0, charge, ObjectTable::Charge::kForce);
    if (created.ok() && entries_.emplace(key, Entry{id, 0, MonotonicMs(), record.len,
                                                    Written::kYes, true, false})
                            .second) {
      ids_[id] = key;
      ++space.names;
      ++names_;
      table = space.table;
      object = *created;
    } else {
      status = created.ok() ? absl::AlreadyExistsError("listed twice") : created.status();
    }
  }
  // Admitted through the tiers like an offload: room in host memory now, or once the spiller
  // wrote other objects (those restored before it among them) to NVMe.
  absl::Status admitted = status;
  if (object != nullptr) {
    if (!tiers_.CanEverHold(record.len)) {
      admitted = absl::ResourceExhaustedError("larger than a part of the host pool");
    } else {
      Awaited admission;
      tiers_.Admit(table, /*queue=*/0, object, /*device=*/-1, admission.Callback());
      admitted = admission.Wait();
    }
  }
  absl::Status loaded = admitted;
  if (loaded.ok()) loaded = journal_->Load(record, tiers_.pool().At(table->extent(*object)));
  if (object != nullptr) {
    std::vector<ObjectWaiter> none;  // (no job can wait on it yet)
    if (admitted.ok()) {
      tiers_.FillEnded(table, object, loaded, &none);  // filled: a spill candidate like any other
    } else {
      table->EndFill(*object, loaded, &none);  // never admitted: no copy ran
    }
  }
  if (loaded.ok()) return true;
  if (object != nullptr && absl::IsResourceExhausted(admitted)) {
    // No tier has room: it stays on NVMe in the journal, listed, charged and deletable.
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    it->second.unloaded = true;
    table->ChargeOutside(charge);
    LogWarning("persistent object \"", record.name, "\" of uid ", record.uid, " (", record.len,
               " bytes) left on NVMe in the journal: ", admitted.message());
    return false;
  }
  LogError("persistent object \"", record.name, "\" of uid ", record.uid,
           " not restored: ", loaded.ToString());
  if (object != nullptr) {
    MutexLock lock(&mu_);
    if (auto it = entries_.find(key); it != entries_.end()) EraseLocked(it);
  }
  // Never served: its record goes, so that it is not reported at every start.
  if (absl::Status s = journal_->AppendDelete(record.uid, record.name); !s.ok()) {
    LogError("persistent journal: ", s.ToString());
  }
  return false;
}

}  // namespace tier::daemon
