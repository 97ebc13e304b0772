// When a device registration that the client stopped using may go in tierd.
//
// DeviceRegistry drops a registration from its cache the moment it finds memory under it
// remapped (a page of an expandable segment freed and mapped anew). But other callers may have
// received that buffer id a moment earlier, for pages of it that are still the same memory, and
// not yet pushed their jobs: unregistered in tierd now, those jobs would name no buffer. So the
// cache and tierd are kept apart: a dropped ("retired") registration is unregistered in tierd
// only once
//   1. no caller holds it: every lease (taken by Register, released once the caller's job is on
//      the ring) is released, and every id handed out through the C ABI (which the caller uses in
//      a later tier_offload / tier_reload / batch call) has been paid by one job naming it; and
//   2. every job pushed before that moment is complete: tierd resolves a job's buffer only when
//      its ring poller takes the job, which may be after an unregister sent over the socket;
//      once the job completed, tierd holds what the job needs itself.
// Proof sketch: a caller that got id X between its registration and its push is counted in (1)
// (a lease or an owed use), so X is not free before that caller's push; the fence of (2) is the
// newest job id at the moment X became free (job ids grow in push order), so every job that
// names X and was pushed by a caller counted in (1) is at or below it.
// Not covered: a caller that keeps an id for later use without registering again (the C ABI
// says an id may go when its memory is found remapped). An owed use is a promise to submit
// soon: one not paid by the time the session has pushed kOwedJobs more jobs lapses, so an id
// handed out and never used no longer keeps a retired registration (and the client memory it
// maps) in tierd until the session ends; a job naming it later fails with NOT_FOUND.
//
// Not thread-safe: DeviceRegistry guards it with its lock. Job ids: ClientSession's, from 1.
#ifndef TIER_CLIENT_REGISTRATION_HOLDS_H_
#define TIER_CLIENT_REGISTRATION_HOLDS_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tier::client {

class RegistrationHolds {
 public:
  // Jobs the session may push after an id was handed out before the owed use lapses.
  static constexpr uint64_t kOwedJobs = 4096;

  // A lease on `id` (Register returned it).
  void Hold(uint64_t id);
  // The lease ends; `last_job`: the newest job id pushed so far.
  void Release(uint64_t id, uint64_t last_job);
  // A lease becomes a use owed by a caller outside the library (the C ABI handed the id out);
  // `last_job`: the newest job id pushed so far.
  void Owe(uint64_t id, uint64_t last_job);
  // `job` (just pushed) names `id`: pays one owed use, if any.
  void Paid(uint64_t id, uint64_t job);
  // `id` left the cache (its memory changed): it goes once free (rules 1 and 2).
  void Retire(uint64_t id, uint64_t last_job);
  // The application unregistered `id` itself.
  void Forget(uint64_t id);
  // Removes and returns the retired, free ids whose every job is complete: the oldest job still
  // pending is `oldest_pending` (the next job id when none is). First the owed uses of retired
  // ids that lapsed (kOwedJobs pushed since: `last_pushed` is the newest) are dropped.
  std::vector<uint64_t> TakeDue(uint64_t oldest_pending, uint64_t last_pushed);
  // Retired ids not yet taken (still held, or waiting for their jobs).
  size_t retired() const { return retired_; }
  // Leases plus owed uses of `id` (tests).
  uint64_t holders(uint64_t id) const;

 private:
  struct Entry {
    uint64_t leases = 0;
    uint64_t owed = 0;
    bool retired = false;
    uint64_t fence = 0;  // the newest job that may name it (rule 2)
    uint64_t owed_at = 0;  // the newest job pushed when a use was last owed
    bool free() const { return leases == 0 && owed == 0; }
  };
  // Drops the entry of an id nobody holds that is still cached (nothing to remember).
  void Settle(std::unordered_map<uint64_t, Entry>::iterator it);
  std::unordered_map<uint64_t, Entry> entries_;
  size_t retired_ = 0;
};

}  // namespace tier::client

#endif  // TIER_CLIENT_REGISTRATION_HOLDS_H_
