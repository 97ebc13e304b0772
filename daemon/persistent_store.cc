#include "daemon/persistent_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/metrics.h"

namespace tier::daemon {
namespace {

absl::Status NoSuchName(absl::string_view name) {
  // The same words whether the name is unknown or another uid's: existence is not revealed.
  return absl::NotFoundError(absl::StrCat("no persistent object named \"", name, "\""));
}

}  // namespace

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

absl::StatusOr<ObjectSlot> PersistentStore::Open(uid_t uid, absl::string_view name,
                                                 uint64_t* len) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  MutexLock lock(&mu_);
  auto space = spaces_.find(uid);
  if (space == spaces_.end()) return NoSuchName(name);
  auto it = space->second.names.find(name);
  if (it == space->second.names.end()) return NoSuchName(name);
  std::shared_ptr<Object> object = space->second.table->Find(it->second.id);
  if (object == nullptr) return NoSuchName(name);
  *len = object->len();
  return ObjectSlot{space->second.table, it->second.id};
}

absl::Status PersistentStore::Delete(uid_t uid, absl::string_view name) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  absl::StatusOr<Release> released;
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
  tiers_.Settle(*released);  // outside the store's lock: the pool and the spill store
  return absl::OkStatus();
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
