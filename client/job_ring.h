// The client's end of a session's job ring: pushes submissions (ringing the daemon's doorbell only
// when it sleeps), pops completions, and sleeps on the completion doorbell. Not thread-safe: the
// session serializes producers and consumers.
#ifndef TIER_CLIENT_JOB_RING_H_
#define TIER_CLIENT_JOB_RING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"
#include "tier/ring.h"

namespace tier::client {

class JobRing {
 public:
  static absl::StatusOr<JobRing> Map(UniqueFd ring_fd, uint64_t ring_bytes, UniqueFd sq_doorbell,
                                     UniqueFd cq_doorbell);
  JobRing(JobRing&& other) noexcept;
  JobRing& operator=(JobRing&&) = delete;
  ~JobRing();

  uint32_t capacity() const { return sq_.capacity(); }
  // False when the submission queue is full.
  bool Push(const ring::SubmissionEntry& entry);
  // Pushes all of `entries` (false, pushing none, unless there is room for all) and rings the
  // doorbell at most once.
  bool PushAll(absl::Span<const ring::SubmissionEntry> entries);
  bool Pop(ring::CompletionEntry* entry);
  bool CompletionsEmpty() const { return cq_.Empty(); }
  // The session's ticket page (tier/ring.h), for the GPU layer; page aligned.
  ring::TicketPage* tickets() const { return tickets_; }
  // The daemon's state bits (ring::kDaemon*), as it last wrote them.
  uint32_t daemon_state() const { return header_->daemon_state.load(std::memory_order_acquire); }

  enum class WaitResult { kReady, kTimeout, kPeerGone };
  // Sleeps until a completion may be there, `timeout_ms` passes (< 0: no limit) or `socket_fd`
  // (the session socket) hangs up.
  WaitResult SleepForCompletion(int64_t timeout_ms, int socket_fd);

 private:
  JobRing() = default;
  void RingDoorbell();
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  ring::TicketPage* tickets_ = nullptr;
  const ring::RingHeader* header_ = nullptr;
  UniqueFd sq_doorbell_;
  UniqueFd cq_doorbell_;
  ring::Producer<ring::SubmissionEntry> sq_;
  ring::Consumer<ring::CompletionEntry> cq_;
};

}  // namespace tier::client

#endif  // TIER_CLIENT_JOB_RING_H_
