#include "client/registration_holds.h"

#include <algorithm>

namespace tier::client {

void RegistrationHolds::Hold(uint64_t id) { ++entries_[id].leases; }

void RegistrationHolds::Release(uint64_t id, uint64_t last_job) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.leases == 0) return;
  --it->second.leases;
  it->second.fence = std::max(it->second.fence, last_job);
  Settle(it);
}

void RegistrationHolds::Owe(uint64_t id, uint64_t last_job) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.leases == 0) return;
  --it->second.leases;
  ++it->second.owed;
  it->second.owed_at = std::max(it->second.owed_at, last_job);
}

void RegistrationHolds::Paid(uint64_t id, uint64_t job) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  // Every job naming it raises the fence, paid or not: a caller holding a lease may push after
  // another caller's payment.
  it->second.fence = std::max(it->second.fence, job);
  if (it->second.owed > 0) --it->second.owed;
  Settle(it);
}

void RegistrationHolds::Retire(uint64_t id, uint64_t last_job) {
  Entry& entry = entries_[id];
  if (entry.retired) return;
  entry.retired = true;
  entry.fence = std::max(entry.fence, last_job);
  ++retired_;
}

void RegistrationHolds::Forget(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  if (it->second.retired) --retired_;
  entries_.erase(it);
}

std::vector<uint64_t> RegistrationHolds::TakeDue(uint64_t oldest_pending, uint64_t last_pushed) {
  std::vector<uint64_t> due;
  if (retired_ == 0) return due;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    if (e.retired && e.owed > 0 && last_pushed >= e.owed_at + kOwedJobs) {
      // Lapsed: a job naming it from now on is pushed after this fence and finds it gone.
      e.owed = 0;
      e.fence = std::max(e.fence, last_pushed);
    }
    if (e.retired && e.free() && e.fence < oldest_pending) {
      due.push_back(it->first);
      --retired_;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return due;
}

uint64_t RegistrationHolds::holders(uint64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.leases + it->second.owed;
}

void RegistrationHolds::Settle(std::unordered_map<uint64_t, Entry>::iterator it) {
  if (!it->second.retired && it->second.free()) entries_.erase(it);
}

}  // namespace tier::client
