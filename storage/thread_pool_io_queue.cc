#include "storage/thread_pool_io_queue.h"

#include "common/thread_role.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tier::storage {
namespace {

// A single pread/pwrite moves at most about 2 GiB; ask for no more than this per call.
constexpr uint64_t kMaxPiece = uint64_t{1} << 30;

std::string Describe(const IoRequest& r) {
  if (r.op == IoOp::kSync) return absl::StrCat("fdatasync of file ", r.file);
  return absl::StrCat(r.op == IoOp::kRead ? "pread" : "pwrite", " of ", r.len, " bytes at offset ",
                      r.offset, " of file ", r.file);
}

}  // namespace

ThreadPoolIoQueue::ThreadPoolIoQueue(uint32_t depth, uint32_t threads)
    : depth_(std::clamp<uint32_t>(depth, 1, kMaxIoQueueDepth)) {
  if (threads == 0) threads = std::min<uint32_t>(depth_, 64);
  threads_.reserve(threads);
  for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPoolIoQueue::~ThreadPoolIoQueue() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    work_.clear();  // never started: no buffer is touched
  }
  work_cv_.SignalAll();
  // Workers finish the request they run (it may be writing into a caller's buffer) before exiting.
  for (std::thread& t : threads_) t.join();
}

absl::Status ThreadPoolIoQueue::RegisterBuffers(absl::Span<const IoBuffer> buffers) {
  for (const IoBuffer& b : buffers) {
    if (b.base == nullptr || b.len == 0) return absl::InvalidArgumentError("empty buffer region");
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ThreadPoolIoQueue::RegisterFile(int fd) {
  if (fd < 0) return absl::InvalidArgumentError("bad file descriptor");
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (fds_[i] < 0) {  // an unregistered file's index
      fds_[i] = fd;
      return static_cast<int>(i);
    }
  }
  fds_.push_back(fd);
  return static_cast<int>(fds_.size() - 1);
}

absl::Status ThreadPoolIoQueue::UnregisterFile(int index) {
  if (index < 0 || static_cast<size_t>(index) >= fds_.size() || fds_[index] < 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown file index ", index));
  }
  fds_[index] = -1;
  return absl::OkStatus();
}

absl::Status ThreadPoolIoQueue::Enqueue(const IoRequest& request) {
  if (request.file < 0 || static_cast<size_t>(request.file) >= fds_.size() ||
      fds_[request.file] < 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown file index ", request.file));
  }
  if (absl::Status s = CheckBuffer(request); !s.ok()) return s;
  if (outstanding_ >= depth_) {
    return absl::ResourceExhaustedError(absl::StrCat("thread-pool queue full (depth ", depth_, ")"));
  }
  queued_.push_back(Work{request, fds_[request.file]});
  ++outstanding_;
  return absl::OkStatus();
}

int ThreadPoolIoQueue::Submit() {
  if (queued_.empty()) return 0;
  int n = static_cast<int>(queued_.size());
  {
    MutexLock lock(&mu_);
    for (Work& w : queued_) work_.push_back(w);
  }
  queued_.clear();
  if (n == 1) {
    work_cv_.Signal();
  } else {
    work_cv_.SignalAll();
  }
  return n;
}

int ThreadPoolIoQueue::Poll(std::vector<IoCompletion>* out, bool wait) {
  Submit();
  MutexLock lock(&mu_);
  while (wait && done_.empty() && !wake_ && !(work_.empty() && running_ == 0)) {
    done_cv_.Wait(&mu_);
  }
  wake_ = false;
  int n = static_cast<int>(done_.size());
  for (IoCompletion& c : done_) out->push_back(std::move(c));
  done_.clear();
  outstanding_ -= static_cast<uint32_t>(n);
  return n;
}

void ThreadPoolIoQueue::Wake() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  done_cv_.SignalAll();
}

void ThreadPoolIoQueue::WorkerLoop() {
  SetThreadRole(ThreadRole::kSpillIo);
  while (std::optional<Work> work = NextWork()) {
    IoCompletion completion = Execute(*work);
    MutexLock lock(&mu_);
    --running_;
    done_.push_back(std::move(completion));
    done_cv_.SignalAll();
  }
}

std::optional<ThreadPoolIoQueue::Work> ThreadPoolIoQueue::NextWork() {
  MutexLock lock(&mu_);
  while (!stop_ && work_.empty()) work_cv_.Wait(&mu_);
  if (stop_) return std::nullopt;
  Work work = work_.front();
  work_.pop_front();
  ++running_;
  return work;
}

IoCompletion ThreadPoolIoQueue::Execute(const Work& work) {
  const IoRequest& r = work.request;
  IoCompletion c{r.user_data, absl::OkStatus(), 0};
  if (r.op == IoOp::kSync) {
    while (::fdatasync(work.fd) != 0) {
      if (errno != EINTR) {
        c.status = ErrnoStatus(Describe(r));
        break;
      }
    }
    return c;
  }
  while (c.bytes < r.len) {
    size_t len = static_cast<size_t>(std::min(kMaxPiece, r.len - c.bytes));
    off_t offset = static_cast<off_t>(r.offset + c.bytes);
    ssize_t n;
    if (r.offset == kCurrentPosition) {
      n = r.op == IoOp::kRead ? ::read(work.fd, r.buf + c.bytes, len)
                              : ::write(work.fd, r.buf + c.bytes, len);
    } else {
      n = r.op == IoOp::kRead ? ::pread(work.fd, r.buf + c.bytes, len, offset)
                              : ::pwrite(work.fd, r.buf + c.bytes, len, offset);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      c.status = ErrnoStatus(Describe(r));
      return c;
    }
    if (n == 0) {
      c.status = r.op == IoOp::kRead
                     ? absl::OutOfRangeError(absl::StrCat(Describe(r), ": end of file after ",
                                                          c.bytes, " bytes"))
                     : ErrnoStatus(absl::StrCat(Describe(r), ": no progress after ", c.bytes,
                                                " bytes"),
                                   EIO);
      return c;
    }
    c.bytes += static_cast<uint64_t>(n);  // a short transfer continues from here
  }
  return c;
}

}  // namespace tier::storage
