// IoQueue on pread/pwrite run by worker threads: the fallback where io_uring is unavailable
// (kernel.io_uring_disabled, seccomp profiles of container runtimes, old kernels). Same semantics
// as UringIoQueue: short transfers are continued by the worker until the request is whole, EINTR is
// retried, a 0-byte transfer ends the request. Registered buffers are accepted and ignored.
#ifndef TIER_STORAGE_THREAD_POOL_IO_QUEUE_H_
#define TIER_STORAGE_THREAD_POOL_IO_QUEUE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "storage/io_queue.h"

namespace tier::storage {

class ThreadPoolIoQueue final : public IoQueue {
 public:
  // threads == 0: one per depth slot, at most 64 (each thread keeps one request in flight, so
  // that many threads give the device a queue depth of `depth`).
  ThreadPoolIoQueue(uint32_t depth, uint32_t threads);
  // Waits for the requests the workers are running, drops queued ones, joins the workers.
  ~ThreadPoolIoQueue() override;
  ThreadPoolIoQueue(const ThreadPoolIoQueue&) = delete;
  ThreadPoolIoQueue& operator=(const ThreadPoolIoQueue&) = delete;

  absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) override;
  absl::StatusOr<int> RegisterFile(int fd) override;
  absl::Status UnregisterFile(int index) override;
  absl::Status Enqueue(const IoRequest& request) override;
  int Submit() override;
  int Poll(std::vector<IoCompletion>* out, bool wait) override;
  void Wake() override;
  uint32_t outstanding() const override { return outstanding_; }
  uint32_t depth() const override { return depth_; }
  std::string_view name() const override { return "thread_pool"; }
  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }

 private:
  struct Work {
    IoRequest request;
    int fd = -1;
  };
  void WorkerLoop();
  // The next request for a worker (counted as running); nullopt once stopping.
  std::optional<Work> NextWork();
  static IoCompletion Execute(const Work& work);

  const uint32_t depth_;
  // Owner thread only.
  std::vector<int> fds_;
  std::vector<Work> queued_;  // enqueued, not yet submitted
  uint32_t outstanding_ = 0;

  Mutex mu_;
  CondVar work_cv_;  // workers wait for work_ or stop_
  CondVar done_cv_;  // Poll waits for done_, wake_, or an idle engine
  std::deque<Work> work_ ABSL_GUARDED_BY(mu_);
  std::vector<IoCompletion> done_ ABSL_GUARDED_BY(mu_);
  uint32_t running_ ABSL_GUARDED_BY(mu_) = 0;  // taken by a worker, not yet in done_
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_THREAD_POOL_IO_QUEUE_H_
