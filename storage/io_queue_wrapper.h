// An IoQueue that passes every call to another one it owns: the base of queues that change a few
// calls of a real queue (FaultyIoQueue) and pass the rest through, so that each of them states
// only what it changes.
#ifndef TIER_STORAGE_IO_QUEUE_WRAPPER_H_
#define TIER_STORAGE_IO_QUEUE_WRAPPER_H_

#include <memory>
#include <utility>
#include <vector>

#include "storage/io_queue.h"

namespace tier::storage {

class IoQueueWrapper : public IoQueue {
 public:
  explicit IoQueueWrapper(std::unique_ptr<IoQueue> inner) : inner_(std::move(inner)) {}

  absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  absl::StatusOr<int> RegisterFile(int fd) override { return inner_->RegisterFile(fd); }
  absl::Status UnregisterFile(int index) override { return inner_->UnregisterFile(index); }
  absl::Status Enqueue(const IoRequest& request) override { return inner_->Enqueue(request); }
  int Submit() override { return inner_->Submit(); }
  int Poll(std::vector<IoCompletion>* out, bool wait) override { return inner_->Poll(out, wait); }
  void Wake() override { inner_->Wake(); }
  uint32_t outstanding() const override { return inner_->outstanding(); }
  uint32_t depth() const override { return inner_->depth(); }
  std::string_view name() const override { return inner_->name(); }

  IoQueue* inner() const { return inner_.get(); }

 private:
  std::unique_ptr<IoQueue> inner_;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_IO_QUEUE_WRAPPER_H_
