#include "storage/io_queue.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "storage/thread_pool_io_queue.h"
#include "storage/uring_io_queue.h"

namespace tier::storage {

absl::Status CheckBuffer(const IoRequest& request) {
  if (request.op != IoOp::kSync && (request.buf == nullptr || request.len == 0)) {
    return absl::InvalidArgumentError("I/O request needs a buffer and len > 0");
  }
  return absl::OkStatus();
}

bool ParseIoQueueKind(std::string_view text, IoQueueKind* out) {
  if (text == "auto") {
    *out = IoQueueKind::kAuto;
  } else if (text == "io_uring" || text == "uring") {
    *out = IoQueueKind::kUring;
  } else if (text == "thread_pool" || text == "threads") {
    *out = IoQueueKind::kThreadPool;
  } else {
    return false;
  }
  return true;
}

const char* IoQueueKindName(IoQueueKind kind) {
  switch (kind) {
    case IoQueueKind::kAuto: return "auto";
    case IoQueueKind::kUring: return "io_uring";
    case IoQueueKind::kThreadPool: return "thread_pool";
  }
  return "auto";
}

absl::StatusOr<std::unique_ptr<IoQueue>> MakeIoQueue(const IoQueueOptions& options) {
  if (options.depth == 0 || options.depth > kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat("io queue depth must be 1..", kMaxIoQueueDepth));
  }
  if (options.kind != IoQueueKind::kThreadPool) {
    absl::StatusOr<std::unique_ptr<UringIoQueue>> uring = UringIoQueue::Create(options.depth);
    if (uring.ok()) {
      LogInfo("spill I/O: io_uring, queue depth ", options.depth);
      return std::unique_ptr<IoQueue>(std::move(*uring));
    }
    if (options.kind == IoQueueKind::kUring) {
      return absl::Status(uring.status().code(),
                          absl::StrCat("io_uring requested but unavailable: ",
                                       uring.status().message()));
    }
    // ENOSYS: no io_uring in this kernel; EPERM: kernel.io_uring_disabled or a seccomp profile
    // (Docker's default one refuses io_uring_setup).
    LogWarning("spill I/O: io_uring unavailable (", uring.status().message(),
               "); using the thread-pool queue");
  }
  auto pool = std::make_unique<ThreadPoolIoQueue>(options.depth, options.threads);
  LogInfo("spill I/O: thread_pool, queue depth ", options.depth, ", ", pool->threads(),
          " threads");
  return std::unique_ptr<IoQueue>(std::move(pool));
}

}  // namespace tier::storage
