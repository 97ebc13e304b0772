// An IoQueue wrapper for tests: passes requests to a real queue and injects faults by rule:
//   kFail     the request fails with `error` (EIO, ENOSPC, ...) without reaching the disk;
//   kShort    only part of it is transferred (short_bytes, default half), then it fails with
//             `error`: what a queue reports when a short transfer's remainder fails;
//   kCorrupt  a read succeeds, then one bit of the data it delivered is flipped (a bad disk or
//             cable that the checksum has to catch).
// A rule matches requests by op, file and overlap with [offset_begin, offset_end) (a kSync by op
// and file alone); it lets `skip`
// matching requests through first ("fail the 3rd write": skip = 2) and then fires `times` times
// (-1: forever). The first rule that fires decides. Rules may be added or cleared from any thread
// while the queue runs (the owner thread's calls see them at the next Enqueue or completion).
#ifndef TIER_STORAGE_FAULTY_IO_QUEUE_H_
#define TIER_STORAGE_FAULTY_IO_QUEUE_H_

#include <cerrno>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "storage/io_queue.h"
#include "storage/io_queue_wrapper.h"

namespace tier::storage {

struct FaultRule {
  enum class Action { kFail, kShort, kCorrupt };
  IoOp op = IoOp::kWrite;
  Action action = Action::kFail;
  int error = EIO;  // kFail, kShort: the errno reported
  int file = -1;    // -1: any file index
  int file_count = 1;  // with file >= 0: the files file .. file + file_count - 1 match
  uint64_t offset_begin = 0;
  uint64_t offset_end = std::numeric_limits<uint64_t>::max();
  uint64_t skip = 0;
  int64_t times = 1;
  uint64_t short_bytes = 0;  // kShort: bytes really transferred (0: half of len)
  // kCorrupt: the file offset of the byte to flip when the read covers it, else the first byte of
  // the read that lies in the rule's range.
  uint64_t corrupt_offset = std::numeric_limits<uint64_t>::max();
};

// Rules from text (tierd's test-only `spill_inject_faults` setting): comma-separated
// `OP:FAULT[:SKIP[:TIMES]]`, OP read|write|sync, FAULT eio|enospc|short|corrupt (corrupt: reads
// only; short: not sync),
// SKIP matching requests let through first (default 0), TIMES firings (default 1; -1: forever).
// "write:enospc:2:1,read:corrupt" fails the third write with ENOSPC and corrupts the first read.
absl::StatusOr<std::vector<FaultRule>> ParseFaultRules(absl::string_view spec);

class FaultyIoQueue final : public IoQueueWrapper {
 public:
  explicit FaultyIoQueue(std::unique_ptr<IoQueue> inner);

  // Thread-safe. Returns the rule's id for fired().
  int AddRule(const FaultRule& rule);
  void ClearRules();
  // Thread-safe: how often rule `id` fired; all rules together.
  uint64_t fired(int id) const;
  uint64_t total_fired() const;

  // What it changes of the queue it wraps; the other calls pass through (IoQueueWrapper).
  absl::Status Enqueue(const IoRequest& request) override;
  int Poll(std::vector<IoCompletion>* out, bool wait) override;
  uint32_t outstanding() const override;
  std::string_view name() const override { return name_; }

 private:
  struct RuleState {
    FaultRule rule;
    uint64_t skip_left = 0;
    int64_t times_left = 0;
    uint64_t fired = 0;
  };
  struct Tracked {
    IoRequest original;
    int rule = -1;  // index of the rule that fired, -1 none
    FaultRule::Action action = FaultRule::Action::kFail;
    int error = 0;
    uint64_t corrupt_offset = 0;
  };
  // Under mu_: the rule that fires for `request`, if any (its counters updated).
  int Match(const IoRequest& request, FaultRule* fired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string name_;
  mutable Mutex mu_;
  std::vector<RuleState> rules_ ABSL_GUARDED_BY(mu_);
  uint64_t total_fired_ ABSL_GUARDED_BY(mu_) = 0;
  // Owner thread only.
  uint64_t next_tag_ = 1;
  std::unordered_map<uint64_t, Tracked> tracked_;  // inner user_data -> the caller's request
  std::vector<IoCompletion> ready_;                // failures made without the inner queue
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_FAULTY_IO_QUEUE_H_
