#include "storage/uring_io_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace tier::storage {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};
// One SQE moves at most this much (sqe->len is 32 bits and the kernel caps a single read or write
// near 2 GiB); longer requests go as several pieces, exactly like short transfers.
constexpr uint64_t kMaxPiece = uint64_t{1} << 30;
// The kernel refuses to register a single buffer larger than 1 GiB.
constexpr uint64_t kMaxRegisteredBuffer = uint64_t{1} << 30;
// Registered-file table size; files beyond it are used by plain descriptor.
constexpr unsigned kFileTableSize = 64;
constexpr uint32_t kMaxRetries = 8;

std::string Describe(const IoRequest& r) {
  if (r.op == IoOp::kSync) return absl::StrCat("io_uring fdatasync of file ", r.file);
  return absl::StrCat("io_uring ", r.op == IoOp::kRead ? "read" : "write", " of ", r.len,
                      " bytes at offset ", r.offset, " of file ", r.file);
}

bool Transient(int err) { return err == EAGAIN || err == EINTR || err == EBUSY; }

}  // namespace

absl::StatusOr<std::unique_ptr<UringIoQueue>> UringIoQueue::Create(uint32_t depth) {
  if (depth == 0 || depth > kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat("io queue depth must be 1..", kMaxIoQueueDepth));
  }
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoStatus("eventfd for the io_uring queue");
  auto queue = std::unique_ptr<UringIoQueue>(new UringIoQueue(depth, std::move(wake)));
  // depth requests plus the wake poll; the CQ ring is twice that by default, so it cannot overflow.
  int ret = io_uring_queue_init(depth + 1, &queue->ring_, 0);
  if (ret < 0) {
    queue->ring_.ring_fd = -1;
    return ErrnoStatus("io_uring_queue_init", -ret);
  }
  return queue;
}

UringIoQueue::UringIoQueue(uint32_t depth, UniqueFd wake_fd)
    : depth_(depth), slots_(depth), wake_fd_(std::move(wake_fd)) {
  ring_.ring_fd = -1;
  free_slots_.reserve(depth);
  for (uint32_t i = depth; i > 0; --i) free_slots_.push_back(i - 1);
}

UringIoQueue::~UringIoQueue() {
  if (ring_.ring_fd < 0) return;
  // The kernel may still be reading into or out of callers' buffers: wait for every piece in the
  // ring before tearing it down (the wake poll touches no memory and is cancelled by the exit).
  to_submit_.clear();
  while (in_ring_ > 0) {
    int ret = io_uring_submit_and_wait(&ring_, 1);
    if (ret < 0 && !Transient(-ret) && ret != -ETIME) {
      LogError("io_uring queue teardown: ", ErrnoStatus("io_uring_enter", -ret).message());
      break;
    }
    io_uring_cqe* cqe;
    unsigned head;
    unsigned count = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      if (io_uring_cqe_get_data64(cqe) != kWakeTag) --in_ring_;
      ++count;
    }
    io_uring_cq_advance(&ring_, count);
  }
  io_uring_queue_exit(&ring_);
}

absl::Status UringIoQueue::RegisterBuffers(absl::Span<const IoBuffer> buffers) {
  if (!regions_.empty()) return absl::FailedPreconditionError("io_uring buffers already registered");
  if (outstanding() > 0) return absl::FailedPreconditionError("register buffers before any I/O");
  std::vector<iovec> iovs;
  std::vector<Region> regions;
  for (const IoBuffer& b : buffers) {
    if (b.base == nullptr || b.len == 0) return absl::InvalidArgumentError("empty buffer region");
    for (uint64_t off = 0; off < b.len; off += kMaxRegisteredBuffer) {
      uint64_t len = std::min(kMaxRegisteredBuffer, b.len - off);
      char* base = static_cast<char*>(b.base) + off;
      regions.push_back({reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(base) + len,
                         static_cast<int>(iovs.size())});
      iovs.push_back({base, len});
    }
  }
  if (iovs.empty()) return absl::OkStatus();
  int ret = io_uring_register_buffers(&ring_, iovs.data(), static_cast<unsigned>(iovs.size()));
  if (ret < 0) {
    // ENOMEM here is usually RLIMIT_MEMLOCK without CAP_IPC_LOCK: the pages are pinned by this.
    return ErrnoStatus(absl::StrCat("io_uring_register_buffers (", iovs.size(), " regions)"), -ret);
  }
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  regions_ = std::move(regions);
  return absl::OkStatus();
}

absl::StatusOr<int> UringIoQueue::RegisterFile(int fd) {
  if (fd < 0) return absl::InvalidArgumentError("bad file descriptor");
  int index = static_cast<int>(files_.size());
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].fd < 0) index = static_cast<int>(i);  // an unregistered file's index
  }
  File file{fd, false};
  if (!file_table_ && files_.empty()) {
    // A sparse table, filled one slot per file, so files can be added while I/O runs.
    int ret = io_uring_register_files_sparse(&ring_, kFileTableSize);
    file_table_ = ret == 0;
    if (!file_table_) LogDebug("io_uring: no registered file table: ", ErrnoStatus("", -ret).message());
  }
  if (file_table_ && static_cast<unsigned>(index) < kFileTableSize) {
    int ret = io_uring_register_files_update(&ring_, static_cast<unsigned>(index), &fd, 1);
    file.fixed = ret == 1;
  }
  if (static_cast<size_t>(index) == files_.size()) {
    files_.push_back(file);
  } else {
    files_[index] = file;
  }
  return index;
}

absl::Status UringIoQueue::UnregisterFile(int index) {
  if (index < 0 || static_cast<size_t>(index) >= files_.size() || files_[index].fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown file index ", index));
  }
  if (files_[index].fixed) {
    // The ring's table holds a reference to the file until its slot is cleared.
    int none = -1;
    int ret = io_uring_register_files_update(&ring_, static_cast<unsigned>(index), &none, 1);
    if (ret < 0) return ErrnoStatus("io_uring_register_files_update", -ret);
  }
  files_[index] = File{};
  return absl::OkStatus();
}

bool UringIoQueue::file_registered(int index) const {
  return index >= 0 && static_cast<size_t>(index) < files_.size() && files_[index].fixed;
}

absl::Status UringIoQueue::Enqueue(const IoRequest& request) {
  if (request.file < 0 || static_cast<size_t>(request.file) >= files_.size() ||
      files_[request.file].fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown file index ", request.file));
  }
  if (absl::Status s = CheckBuffer(request); !s.ok()) return s;
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("io_uring queue full (depth ", depth_, ")"));
  }
  uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[slot] = Slot{request, 0, 0};
  to_submit_.push_back(slot);
  return absl::OkStatus();
}

int UringIoQueue::FindRegion(const char* buf, uint64_t len) const {
  auto addr = reinterpret_cast<uintptr_t>(buf);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), addr,
                             [](uintptr_t a, const Region& r) { return a < r.begin; });
  if (it == regions_.begin()) return -1;
  --it;
  return addr + len <= it->end ? it->index : -1;
}

void UringIoQueue::PrepPiece(io_uring_sqe* sqe, uint32_t slot) {
  const Slot& s = slots_[slot];
  const File& file = files_[s.request.file];
  uint64_t len = std::min(kMaxPiece, s.request.len - s.done);
  char* buf = s.request.buf + s.done;
  // io_uring reads an offset of -1 as "the current file position" (pipes, sockets).
  uint64_t offset = s.request.offset == kCurrentPosition ? kCurrentPosition : s.request.offset + s.done;
  int fd = file.fixed ? s.request.file : file.fd;
  int buf_index = s.request.op == IoOp::kSync ? -1 : FindRegion(buf, len);
  bool read = s.request.op == IoOp::kRead;
  if (s.request.op == IoOp::kSync) {
    io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
  } else if (buf_index >= 0) {
    if (read) {
      io_uring_prep_read_fixed(sqe, fd, buf, static_cast<unsigned>(len), offset, buf_index);
    } else {
      io_uring_prep_write_fixed(sqe, fd, buf, static_cast<unsigned>(len), offset, buf_index);
    }
    ++fixed_buffer_submissions_;
  } else {
    if (read) {
      io_uring_prep_read(sqe, fd, buf, static_cast<unsigned>(len), offset);
    } else {
      io_uring_prep_write(sqe, fd, buf, static_cast<unsigned>(len), offset);
    }
    ++plain_submissions_;
  }
  if (file.fixed) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, slot);
}

int UringIoQueue::Submit() {
  if (!wake_armed_) {
    if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) {
      io_uring_prep_poll_add(sqe, wake_fd_.get(), POLLIN);
      io_uring_sqe_set_data64(sqe, kWakeTag);
      wake_armed_ = true;
    }
  }
  int handed = 0;
  while (!to_submit_.empty()) {
    // The SQ ring holds depth + 1 entries, so this only runs dry while an earlier io_uring_enter
    // was refused transiently and its entries still wait in the ring.
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) break;
    PrepPiece(sqe, to_submit_.front());
    to_submit_.pop_front();
    ++in_ring_;
    ++handed;
  }
  if (io_uring_sq_ready(&ring_) > 0) {
    // Entries the kernel does not consume now stay in the SQ ring and go with the next enter.
    int ret = io_uring_submit(&ring_);
    if (ret < 0 && !Transient(-ret)) {
      LogError("io_uring_submit: ", ErrnoStatus("io_uring_enter", -ret).message());
    }
  }
  return handed;
}

void UringIoQueue::Complete(uint32_t slot, absl::Status status, std::vector<IoCompletion>* out) {
  Slot& s = slots_[slot];
  out->push_back(IoCompletion{s.request.user_data, std::move(status), s.done});
  free_slots_.push_back(slot);
}

void UringIoQueue::HandleCqe(uint64_t tag, int res, std::vector<IoCompletion>* out) {
  if (tag == kWakeTag) {
    uint64_t value;
    while (::read(wake_fd_.get(), &value, sizeof(value)) > 0) {
    }
    wake_armed_ = false;  // re-armed by the next Submit
    woken_ = true;
    return;
  }
  --in_ring_;
  uint32_t slot = static_cast<uint32_t>(tag);
  Slot& s = slots_[slot];
  if (res < 0) {
    if (Transient(-res) && s.retries < kMaxRetries) {
      ++s.retries;
      ++resubmissions_;
      to_submit_.push_back(slot);
      return;
    }
    Complete(slot, ErrnoStatus(Describe(s.request), -res), out);
    return;
  }
  if (s.request.op == IoOp::kSync) {
    Complete(slot, absl::OkStatus(), out);  // (res 0: synced)
    return;
  }
  if (res == 0) {
    // A piece of nonzero length moved nothing: end of file for a read, no progress for a write.
    // Resubmitting would spin, so the request ends here with what it moved.
    if (s.request.op == IoOp::kRead) {
      Complete(slot,
               absl::OutOfRangeError(absl::StrCat(Describe(s.request), ": end of file after ",
                                                  s.done, " bytes")),
               out);
    } else {
      Complete(slot, ErrnoStatus(absl::StrCat(Describe(s.request), ": no progress after ", s.done,
                                              " bytes"),
                                 EIO),
               out);
    }
    return;
  }
  s.done += static_cast<uint64_t>(res);
  s.retries = 0;
  if (s.done < s.request.len) {
    // Short transfer (or the next piece of a long request): send the remainder.
    ++resubmissions_;
    to_submit_.push_back(slot);
    return;
  }
  Complete(slot, absl::OkStatus(), out);
}

int UringIoQueue::Reap(std::vector<IoCompletion>* out) {
  size_t before = out->size();
  io_uring_cqe* cqe;
  unsigned head;
  unsigned count = 0;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    HandleCqe(io_uring_cqe_get_data64(cqe), cqe->res, out);
    ++count;
  }
  io_uring_cq_advance(&ring_, count);
  if (!to_submit_.empty() || !wake_armed_) Submit();  // remainders of short transfers, the wake poll
  return static_cast<int>(out->size() - before);
}

int UringIoQueue::Poll(std::vector<IoCompletion>* out, bool wait) {
  Submit();
  woken_ = false;
  int n = Reap(out);
  while (wait && n == 0 && !woken_ && (in_ring_ > 0 || !to_submit_.empty())) {
    int ret = io_uring_submit_and_wait(&ring_, 1);
    if (ret < 0 && !Transient(-ret) && ret != -ETIME) {
      LogError("io_uring wait: ", ErrnoStatus("io_uring_enter", -ret).message());
      break;
    }
    n += Reap(out);
  }
  return n;
}

void UringIoQueue::Wake() {
  uint64_t one = 1;
  // Cannot fail short of a counter overflow, which would still leave the eventfd readable.
  [[maybe_unused]] ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
}

}  // namespace tier::storage
