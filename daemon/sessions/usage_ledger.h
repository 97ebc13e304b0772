// What each user (uid, from SO_PEERCRED) holds in tierd across all its sessions, checked against
// the per-uid and node-wide limits, so that one user's clients cannot take every session slot,
// every mapping (vm.max_map_count), the daemon's address space (issue 16) or the GPU address
// space tierd reserves for expandable segments. Per-session limits
// are the session's own (Session::CheckBufferLimits); this is the sum over sessions.
//
// Thread-safe. Lock order: a session's mutex may be held when calling in; the ledger never calls
// out.
#ifndef TIER_DAEMON_SESSIONS_USAGE_LEDGER_H_
#define TIER_DAEMON_SESSIONS_USAGE_LEDGER_H_

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "absl/status/status.h"
#include "common/mutex.h"

namespace tier::daemon {

// The settings of the same names (daemon/config/config.h).
struct ClientLimits {
  uint32_t max_sessions_per_uid = 64;
  uint32_t max_buffers_per_session = 4096;
  uint32_t max_buffers_per_uid = 16384;
  uint32_t max_buffers = 32768;
  uint64_t max_mapped_bytes_per_session = 64ull << 30;
  uint64_t max_mapped_bytes_per_uid = 256ull << 30;
  uint64_t max_mapped_bytes = ~uint64_t{0};  // all uids
  // GPU address space reserved for VMM registrations. All uids together are bounded by the
  // engine (VmmImporter, 32 TiB); these keep one process, or one user, from taking all of it.
  uint64_t max_reserved_bytes_per_session = uint64_t{8} << 40;
  uint64_t max_reserved_bytes_per_uid = uint64_t{16} << 40;
};

// What one registered buffer costs tierd, counted against the limits above.
struct BufferCharge {
  uint64_t mapped_bytes = 0;    // host memory tierd maps (memfds)
  uint64_t reserved_bytes = 0;  // GPU address space tierd reserves (VMM pages and segments)

  void Add(const BufferCharge& c) {
    mapped_bytes += c.mapped_bytes;
    reserved_bytes += c.reserved_bytes;
  }
  // Never below zero: taking off more than was added leaves 0, not a wrapped count.
  void Remove(const BufferCharge& c) {
    mapped_bytes -= std::min(c.mapped_bytes, mapped_bytes);
    reserved_bytes -= std::min(c.reserved_bytes, reserved_bytes);
  }
};

class UsageLedger {
 public:
  explicit UsageLedger(const ClientLimits& limits) : limits_(limits) {}
  UsageLedger(const UsageLedger&) = delete;
  UsageLedger& operator=(const UsageLedger&) = delete;

  const ClientLimits& limits() const { return limits_; }

  // An attached session of `uid`; RESOURCE_EXHAUSTED at max_sessions_per_uid (its pending
  // sessions included).
  absl::Status AddSession(uid_t uid);
  void RemoveSession(uid_t uid);
  // A session `uid` opened and has not attached yet (OpenSession; the uid from the control
  // connection's SO_PEERCRED): counted against max_sessions_per_uid with its attached ones, so
  // that one user's opens that never attach cannot hold every session slot of the node.
  absl::Status AddPending(uid_t uid);
  void RemovePending(uid_t uid);

  // Whether one more buffer costing `charge` fits `uid`'s limits and the node's;
  // RESOURCE_EXHAUSTED naming the setting if not. The caller charges it with AddBuffer once the
  // buffer exists (the session listener is the only thread that adds buffers, so nothing can
  // take the room in between).
  absl::Status CheckBuffer(uid_t uid, const BufferCharge& charge) const;
  void AddBuffer(uid_t uid, const BufferCharge& charge);
  void RemoveBuffer(uid_t uid, const BufferCharge& charge);

  // What a uid's buffers are charged (mapped_bytes, reserved_bytes), with its counts.
  struct Usage : BufferCharge {
    uint32_t sessions = 0;  // attached
    uint64_t buffers = 0;
    uint32_t pending = 0;  // opened, not attached
  };
  Usage UsageOf(uid_t uid) const;
  // Every uid's together (sessions: attached ones).
  Usage Totals() const;

 private:
  // AddSession (attached) or AddPending: counted against max_sessions_per_uid.
  absl::Status Add(uid_t uid, bool attached);
  void ForgetIfIdleLocked(uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientLimits limits_;
  mutable Mutex mu_;
  std::unordered_map<uid_t, Usage> by_uid_ ABSL_GUARDED_BY(mu_);
  uint64_t buffers_ ABSL_GUARDED_BY(mu_) = 0;  // all uids
  BufferCharge charged_ ABSL_GUARDED_BY(mu_);  // all uids
  uint32_t sessions_ ABSL_GUARDED_BY(mu_) = 0;  // all uids
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSIONS_USAGE_LEDGER_H_
