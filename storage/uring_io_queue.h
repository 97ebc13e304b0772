// IoQueue on io_uring (liburing): one ring of `depth` requests, fixed (registered) buffers over the
// host pool, registered files, IORING_OP_READ_FIXED/WRITE_FIXED when a buffer lies inside a
// registered region and plain READ/WRITE otherwise; kSync is IORING_OP_FSYNC with
// IORING_FSYNC_DATASYNC. Every CQE is checked: res < 0 fails the request
// (after a few retries of EAGAIN/EINTR), a short transfer is resubmitted for the remainder, and a
// transfer of 0 bytes ends the request (end of file for a read, no progress for a write).
//
// Wake() is an eventfd watched by a POLL_ADD in the ring, so a Poll blocked in io_uring_enter
// returns when another thread has new work.
#ifndef TIER_STORAGE_URING_IO_QUEUE_H_
#define TIER_STORAGE_URING_IO_QUEUE_H_

#include <liburing.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "common/unique_fd.h"
#include "storage/io_queue.h"

namespace tier::storage {

class UringIoQueue final : public IoQueue {
 public:
  // Fails with the errno of io_uring_queue_init: ENOSYS where the kernel has no io_uring, EPERM
  // where it is disabled (sysctl kernel.io_uring_disabled, a seccomp profile), ENOMEM, ...
  static absl::StatusOr<std::unique_ptr<UringIoQueue>> Create(uint32_t depth);
  ~UringIoQueue() override;
  UringIoQueue(const UringIoQueue&) = delete;
  UringIoQueue& operator=(const UringIoQueue&) = delete;

  absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) override;
  absl::StatusOr<int> RegisterFile(int fd) override;
  absl::Status UnregisterFile(int index) override;
  absl::Status Enqueue(const IoRequest& request) override;
  int Submit() override;
  int Poll(std::vector<IoCompletion>* out, bool wait) override;
  void Wake() override;
  uint32_t outstanding() const override { return depth_ - static_cast<uint32_t>(free_slots_.size()); }
  uint32_t depth() const override { return depth_; }
  std::string_view name() const override { return "io_uring"; }

  // What the ring actually used, for tests and stats.
  uint64_t fixed_buffer_submissions() const { return fixed_buffer_submissions_; }
  uint64_t plain_submissions() const { return plain_submissions_; }
  uint64_t resubmissions() const { return resubmissions_; }
  bool buffers_registered() const { return !regions_.empty(); }
  bool file_registered(int index) const;

 private:
  // One outstanding request; its index in slots_ is the CQE's user_data.
  struct Slot {
    IoRequest request;
    uint64_t done = 0;     // bytes transferred so far
    uint32_t retries = 0;  // EAGAIN/EINTR retries of the current piece
  };
  struct File {
    int fd = -1;
    bool fixed = false;  // in the ring's registered file table at the same index
  };
  struct Region {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    int index = 0;  // io_uring buffer index
  };

  UringIoQueue(uint32_t depth, UniqueFd wake_fd);
  // Index of the registered buffer that holds [buf, buf + len), or -1.
  int FindRegion(const char* buf, uint64_t len) const;
  void PrepPiece(io_uring_sqe* sqe, uint32_t slot);
  void HandleCqe(uint64_t tag, int res, std::vector<IoCompletion>* out);
  void Complete(uint32_t slot, absl::Status status, std::vector<IoCompletion>* out);
  int Reap(std::vector<IoCompletion>* out);

  io_uring ring_{};
  uint32_t depth_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::deque<uint32_t> to_submit_;  // slots whose next piece is not yet in the ring
  uint32_t in_ring_ = 0;            // pieces placed in the ring whose CQE has not been seen
  std::vector<File> files_;         // fd -1: unregistered, its index free for the next file
  bool file_table_ = false;  // a sparse registered-file table exists
  std::vector<Region> regions_;  // sorted by begin
  UniqueFd wake_fd_;  // eventfd
  bool wake_armed_ = false;
  bool woken_ = false;
  uint64_t fixed_buffer_submissions_ = 0;
  uint64_t plain_submissions_ = 0;
  uint64_t resubmissions_ = 0;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_URING_IO_QUEUE_H_
