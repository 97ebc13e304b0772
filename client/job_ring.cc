#include "client/job_ring.h"

#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <utility>

#include "common/status.h"

namespace tier::client {

absl::StatusOr<JobRing> JobRing::Map(UniqueFd ring_fd, uint64_t ring_bytes, UniqueFd sq_doorbell,
                                     UniqueFd cq_doorbell) {
  struct stat st {};
  if (::fstat(ring_fd.get(), &st) != 0) return ErrnoStatus("fstat of the job ring");
  if (static_cast<uint64_t>(st.st_size) != ring_bytes) {
    return absl::InternalError("job ring size does not match the attach reply");
  }
  void* base = ::mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd.get(), 0);
  if (base == MAP_FAILED) return ErrnoStatus("mmap of the job ring");
  std::optional<ring::SegmentView> view = ring::ViewSegment(base, ring_bytes);
  if (!view) {
    ::munmap(base, ring_bytes);
    return absl::InternalError("job ring has an unknown layout (client and daemon versions differ?)");
  }
  JobRing ring;
  ring.base_ = base;
  ring.bytes_ = ring_bytes;
  ring.tickets_ = view->tickets;
  ring.header_ = view->header;
  ring.sq_doorbell_ = std::move(sq_doorbell);
  ring.cq_doorbell_ = std::move(cq_doorbell);
  uint32_t entries = view->header->sq_entries;
  ring.sq_ = ring::Producer<ring::SubmissionEntry>(&view->header->sq, view->sq, entries);
  ring.cq_ = ring::Consumer<ring::CompletionEntry>(&view->header->cq, view->cq, entries);
  return ring;
}

JobRing::JobRing(JobRing&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), bytes_(other.bytes_), tickets_(other.tickets_),
      header_(other.header_), sq_doorbell_(std::move(other.sq_doorbell_)), cq_doorbell_(std::move(other.cq_doorbell_)),
      sq_(other.sq_), cq_(other.cq_) {}

JobRing::~JobRing() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

bool JobRing::Push(const ring::SubmissionEntry& entry) {
  if (!sq_.TryPush(entry)) return false;
  RingDoorbell();
  return true;
}

bool JobRing::PushAll(absl::Span<const ring::SubmissionEntry> entries) {
  std::optional<uint32_t> used = sq_.Pending();
  if (!used || entries.size() > sq_.capacity() - *used) return false;
  for (const ring::SubmissionEntry& entry : entries) {
    if (!sq_.TryPush(entry)) return false;  // cannot happen: there was room for all
  }
  RingDoorbell();
  return true;
}

void JobRing::RingDoorbell() {
  if (sq_.TakeWakeupRequest()) {
    uint64_t one = 1;
    // The doorbell is a socket: send with MSG_NOSIGNAL, so a daemon that died costs an EPIPE
    // (the jobs then fail through the session socket's hang-up), not a SIGPIPE that kills the
    // process. (A daemon from before handed out an eventfd: write to that.)
    if (::send(sq_doorbell_.get(), &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
        errno == ENOTSOCK) {
      [[maybe_unused]] ssize_t n = ::write(sq_doorbell_.get(), &one, sizeof(one));
    }
  }
}

bool JobRing::Pop(ring::CompletionEntry* entry) {
  return cq_.TryPop(entry) == ring::Consumer<ring::CompletionEntry>::Result::kEntry;
}

JobRing::WaitResult JobRing::SleepForCompletion(int64_t timeout_ms, int socket_fd) {
  if (cq_.PrepareSleep()) {
    cq_.CancelSleep();
    return WaitResult::kReady;
  }
  pollfd fds[2] = {{cq_doorbell_.get(), POLLIN, 0}, {socket_fd, POLLRDHUP, 0}};
  int n = ::poll(fds, 2, timeout_ms < 0 ? -1 : static_cast<int>(std::min<int64_t>(timeout_ms, 1 << 30)));
  cq_.CancelSleep();
  if (n > 0 && (fds[0].revents & POLLIN)) {
    // Every wake-up sent so far (a stream of 8-byte rings; an eventfd returns its counter).
    char rings[512];
    [[maybe_unused]] ssize_t r = ::read(cq_doorbell_.get(), rings, sizeof(rings));
  }
  if (n > 0 && (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    // Completions posted before the daemon died are still good; report them first.
    return cq_.Empty() ? WaitResult::kPeerGone : WaitResult::kReady;
  }
  return n == 0 && cq_.Empty() ? WaitResult::kTimeout : WaitResult::kReady;
}

}  // namespace tier::client
