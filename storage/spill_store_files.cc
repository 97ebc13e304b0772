// SpillStore's attached files (storage/spill_store.h): a file besides the spill files, such as
// the persistent journal, written, read and flushed through the store's queue and I/O thread.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "storage/spill_store.h"
#include "storage/spill_store_op.h"

namespace tier::storage {

absl::Status SpillStore::OnIoThread(absl::AnyInvocable<absl::Status()> task) {
  Mutex mu;
  CondVar cv;
  std::optional<absl::Status> result;
  bool wake;
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("spill store is closing");
    tasks_.push_back([&] {
      absl::Status status = task();
      MutexLock done(&mu);
      result = std::move(status);
      cv.Signal();
    });
    wake = in_poll_;
  }
  cv_.Signal();
  if (wake) queue_->Wake();
  MutexLock lock(&mu);
  while (!result.has_value()) cv.Wait(&mu);
  return *std::move(result);
}

void SpillStore::RunTasks() {
  std::vector<absl::AnyInvocable<void()>> tasks;
  {
    MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
}

absl::StatusOr<uint32_t> SpillStore::AttachFile(int fd) {
  uint32_t attached = 0;
  absl::Status status = OnIoThread([&]() -> absl::Status {
    absl::StatusOr<int> index = queue_->RegisterFile(fd);
    if (!index.ok()) return index.status();
    attached = static_cast<uint32_t>(attached_.size());
    for (uint32_t i = 0; i < attached_.size(); ++i) {
      if (attached_[i] < 0) attached = i;
    }
    if (attached == attached_.size()) attached_.push_back(-1);
    attached_[attached] = *index;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return attached;
}

absl::Status SpillStore::DetachFile(uint32_t file) {
  return OnIoThread([&]() -> absl::Status {
    if (file >= attached_.size() || attached_[file] < 0) {
      return absl::NotFoundError(absl::StrCat("no attached file ", file));
    }
    for (const auto& op : file_ops_) {
      if (op->queue_file == attached_[file]) {
        return absl::FailedPreconditionError("attached file detached with requests outstanding");
      }
    }
    absl::Status s = queue_->UnregisterFile(attached_[file]);
    attached_[file] = -1;
    return s;
  });
}

absl::Status SpillStore::FileIo(uint32_t file, IoOp op, uint64_t offset, char* buf, uint64_t len,
                                FileDone done) {
  if (op != IoOp::kSync && (buf == nullptr || len == 0)) {
    return absl::InvalidArgumentError("attached-file request of nothing");
  }
  auto request = std::make_unique<Op>();
  request->kind = op;
  request->buf = buf;
  request->io_len = len;
  request->file_offset = offset;
  request->file_done = std::move(done);
  request->attached = true;  // (its queue index is looked up on the I/O thread: attached_)
  request->record.file = file;
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("spill store is closing");
  }
  Post(std::move(request));
  return absl::OkStatus();
}

bool SpillStore::IssueFileOps(std::vector<Op*>* failed) {
  for (auto& owned : file_ops_) {
    Op* op = owned.get();
    if (op->issued > 0 || op->in_flight > 0 || !op->status.ok()) continue;
    if (op->queue_file < 0) {
      const uint32_t file = op->record.file;
      op->queue_file = file < attached_.size() ? attached_[file] : -1;
      if (op->queue_file < 0) {
        op->status = absl::NotFoundError(absl::StrCat("no attached file ", file));
        failed->push_back(op);
        continue;
      }
    }
    if (queue_->outstanding() >= queue_->depth()) return false;
    const uint64_t tag = next_tag_++;
    absl::Status s = queue_->Enqueue(
        IoRequest{op->kind, op->queue_file, op->file_offset, op->buf, op->io_len, tag});
    if (!s.ok()) {
      op->status = s;
      failed->push_back(op);
      continue;
    }
    chunks_[tag] = ChunkRef{op, 0};
    op->issued = op->io_len + 1;  // (issued: its one request is in the queue)
    ++op->in_flight;
  }
  return true;
}

}  // namespace tier::storage
