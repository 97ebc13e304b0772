// An IoQueue wrapper for durability-ordering tests: while closed, it holds back the completions
// of writes and syncs of files at or past `first_file` (a spill store's attached files,
// registered after its spill files): writes until OpenWrites() or Open(), syncs until Open(); and
// it logs, in order, each such request's enqueue ("write", "sync") and delivered completion
// ("written", "synced"), so a test can tell a flush asked for before the writes it must cover
// had completed, or a record called durable before its flush completed.
#ifndef TIER_TESTS_UNIT_GATED_IO_QUEUE_H_
#define TIER_TESTS_UNIT_GATED_IO_QUEUE_H_

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "storage/io_queue.h"

namespace tier::daemon::testing {

class GatedIoQueue final : public storage::IoQueue {
 public:
  GatedIoQueue(std::unique_ptr<storage::IoQueue> inner, int first_file)
      : inner_(std::move(inner)), first_file_(first_file) {}

  // Thread-safe (the test's thread; the queue runs on the store's I/O thread).
  void Close() {
    MutexLock lock(&mu_);
    hold_writes_ = hold_syncs_ = true;
  }
  void OpenWrites() {
    {
      MutexLock lock(&mu_);
      hold_writes_ = false;
    }
    cv_.SignalAll();
    inner_->Wake();
  }
  void Open() {
    {
      MutexLock lock(&mu_);
      hold_writes_ = hold_syncs_ = false;
    }
    cv_.SignalAll();
    inner_->Wake();
  }
  size_t held() const {
    MutexLock lock(&mu_);
    return held_.size();
  }
  // "write", "written", "sync", "synced", in order.
  std::vector<std::string> log() const {
    MutexLock lock(&mu_);
    return log_;
  }

  absl::Status RegisterBuffers(absl::Span<const storage::IoBuffer> b) override {
    return inner_->RegisterBuffers(b);
  }
  absl::StatusOr<int> RegisterFile(int fd) override { return inner_->RegisterFile(fd); }
  absl::Status UnregisterFile(int index) override { return inner_->UnregisterFile(index); }
  absl::Status Enqueue(const storage::IoRequest& request) override {
    absl::Status s = inner_->Enqueue(request);
    if (s.ok() && request.file >= first_file_ && request.op != storage::IoOp::kRead) {
      MutexLock lock(&mu_);
      const bool write = request.op == storage::IoOp::kWrite;
      (write ? writes_ : syncs_).push_back(request.user_data);
      log_.push_back(write ? "write" : "sync");
    }
    return s;
  }
  int Submit() override { return inner_->Submit(); }
  int Poll(std::vector<storage::IoCompletion>* out, bool wait) override {
    std::vector<storage::IoCompletion> got;
    bool holding;
    {
      MutexLock lock(&mu_);
      // Holding completions back with nothing else in flight: wait for Open or a Wake.
      holding = wait && (hold_writes_ || hold_syncs_) && !held_.empty();
      if (holding && inner_->outstanding() == 0) {
        while (hold_writes_ && hold_syncs_ && !woken_) cv_.Wait(&mu_);
      }
      woken_ = false;
    }
    inner_->Poll(&got, wait && !holding);
    MutexLock lock(&mu_);
    for (storage::IoCompletion& c : got) held_.push_back(std::move(c));
    std::vector<storage::IoCompletion> keep;
    int n = 0;
    for (storage::IoCompletion& c : held_) {
      auto write = std::find(writes_.begin(), writes_.end(), c.user_data);
      auto sync = std::find(syncs_.begin(), syncs_.end(), c.user_data);
      if ((write != writes_.end() && hold_writes_) || (sync != syncs_.end() && hold_syncs_)) {
        keep.push_back(std::move(c));
        continue;
      }
      if (write != writes_.end()) {
        writes_.erase(write);
        log_.push_back("written");
      } else if (sync != syncs_.end()) {
        syncs_.erase(sync);
        log_.push_back("synced");
      }
      out->push_back(std::move(c));
      ++n;
    }
    held_ = std::move(keep);
    return n;
  }
  void Wake() override {
    {
      MutexLock lock(&mu_);
      woken_ = true;
    }
    cv_.SignalAll();
    inner_->Wake();
  }
  uint32_t outstanding() const override {
    MutexLock lock(&mu_);
    return inner_->outstanding() + static_cast<uint32_t>(held_.size());
  }
  uint32_t depth() const override { return inner_->depth(); }
  std::string_view name() const override { return inner_->name(); }

 private:
  std::unique_ptr<storage::IoQueue> inner_;
  const int first_file_;
  mutable Mutex mu_;
  CondVar cv_;  // Open or Wake
  bool hold_writes_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_syncs_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> writes_ ABSL_GUARDED_BY(mu_);  // user_data of watched requests
  std::vector<uint64_t> syncs_ ABSL_GUARDED_BY(mu_);
  std::vector<storage::IoCompletion> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::daemon::testing

#endif  // TIER_TESTS_UNIT_GATED_IO_QUEUE_H_
