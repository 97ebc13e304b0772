#include "daemon/sessions/usage_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"

namespace tier::daemon {

absl::Status UsageLedger::AddSession(uid_t uid) { return Add(uid, /*attached=*/true); }

absl::Status UsageLedger::AddPending(uid_t uid) { return Add(uid, /*attached=*/false); }

absl::Status UsageLedger::Add(uid_t uid, bool attached) {
  MutexLock lock(&mu_);
  Usage& usage = by_uid_[uid];
  if (usage.sessions + usage.pending >= limits_.max_sessions_per_uid) {
    const Usage held = usage;
    ForgetIfIdleLocked(uid);
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", uid, " already has ", held.sessions, " sessions attached and ",
                     held.pending, " opened (max_sessions_per_uid ",
                     limits_.max_sessions_per_uid, ")"));
  }
  if (attached) {
    ++usage.sessions;
    ++sessions_;
  } else {
    ++usage.pending;
  }
  return absl::OkStatus();
}

void UsageLedger::RemovePending(uid_t uid) {
  MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end() || it->second.pending == 0) return;
  --it->second.pending;
  ForgetIfIdleLocked(uid);
}

void UsageLedger::RemoveSession(uid_t uid) {
  MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end() || it->second.sessions == 0) return;
  --it->second.sessions;
  --sessions_;
  ForgetIfIdleLocked(uid);
}

absl::Status UsageLedger::CheckBuffer(uid_t uid, const BufferCharge& charge) const {
  MutexLock lock(&mu_);
  if (buffers_ >= limits_.max_buffers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tierd holds ", limits_.max_buffers, " registered buffers in all (max_buffers)"));
  }
  Usage usage;
  if (auto it = by_uid_.find(uid); it != by_uid_.end()) usage = it->second;
  if (usage.buffers >= limits_.max_buffers_per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", uid, " already has ", limits_.max_buffers_per_uid,
                     " buffers registered (max_buffers_per_uid)"));
  }
  // Written so that nothing overflows: usage <= limit always holds.
  const uint64_t mapped = charge.mapped_bytes;
  const uint64_t node_mapped = std::min(charged_.mapped_bytes, limits_.max_mapped_bytes);
  if (mapped > limits_.max_mapped_bytes - node_mapped) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tierd has ", charged_.mapped_bytes, " bytes of host memory registered in all; ", mapped,
        " more would pass ", limits_.max_mapped_bytes, " (max_mapped_bytes)"));
  }
  if (mapped > limits_.max_mapped_bytes_per_uid - usage.mapped_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " has ", usage.mapped_bytes, " bytes of host memory registered; ", mapped,
        " more would pass ", limits_.max_mapped_bytes_per_uid, " (max_mapped_bytes_per_uid)"));
  }
  if (charge.reserved_bytes > limits_.max_reserved_bytes_per_uid - usage.reserved_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " has ", usage.reserved_bytes >> 30, " GiB of GPU address space reserved; ",
        charge.reserved_bytes >> 30, " GiB more would pass ",
        limits_.max_reserved_bytes_per_uid >> 30, " GiB (max_reserved_bytes_per_uid)"));
  }
  return absl::OkStatus();
}

void UsageLedger::AddBuffer(uid_t uid, const BufferCharge& charge) {
  MutexLock lock(&mu_);
  Usage& usage = by_uid_[uid];
  ++usage.buffers;
  usage.Add(charge);
  ++buffers_;
  charged_.Add(charge);
}

void UsageLedger::RemoveBuffer(uid_t uid, const BufferCharge& charge) {
  MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end() || it->second.buffers == 0) return;
  Usage& usage = it->second;
  --usage.buffers;
  usage.Remove(charge);
  --buffers_;
  charged_.Remove(charge);
  ForgetIfIdleLocked(uid);
}

UsageLedger::Usage UsageLedger::UsageOf(uid_t uid) const {
  MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? Usage{} : it->second;
}

UsageLedger::Usage UsageLedger::Totals() const {
  MutexLock lock(&mu_);
  Usage totals;
  static_cast<BufferCharge&>(totals) = charged_;
  totals.sessions = sessions_;
  totals.buffers = buffers_;
  return totals;
}

void UsageLedger::ForgetIfIdleLocked(uid_t uid) {
  auto it = by_uid_.find(uid);
  if (it != by_uid_.end() && it->second.sessions == 0 && it->second.buffers == 0 &&
      it->second.pending == 0) {
    by_uid_.erase(it);
  }
}

}  // namespace tier::daemon
