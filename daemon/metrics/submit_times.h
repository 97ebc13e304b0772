// When each job in flight was submitted, for its latency at completion, without a per-job map:
// one fixed table of 64-bit words, allocated once, never resized, no lock.
//
// A job's slot is (job_id + a mix of its session id) modulo the table size. Client job ids count
// up by one, so the jobs a session has in flight sit in consecutive slots and never collide with
// each other while fewer than kSlots are in flight; sessions start at scattered offsets. A slot
// holds a 16-bit tag of (session, job) beside 48 bits of the submit time (ns, wrapping every 78
// hours: latencies are right up to that). A job whose slot was since taken by another one (or that
// never had one) is told apart by the tag and simply not measured. A client that reuses its job
// ids can only spoil its own samples.
#ifndef TIER_DAEMON_METRICS_SUBMIT_TIMES_H_
#define TIER_DAEMON_METRICS_SUBMIT_TIMES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

namespace tier::daemon {

class SubmitTimes {
 public:
  static constexpr int kSlotBits = 16;
  static constexpr uint64_t kSlots = uint64_t{1} << kSlotBits;

  SubmitTimes();

  void Record(uint64_t session_id, uint64_t job_id, uint64_t now_ns) {
    const uint64_t word = Tag(session_id, job_id) << kTimeBits | (now_ns & kTimeMask);
    slots_[Slot(session_id, job_id)].store(word, std::memory_order_relaxed);
  }

  // Nanoseconds since Record() of this job, or nullopt when its slot holds another job's time.
  std::optional<uint64_t> Elapsed(uint64_t session_id, uint64_t job_id, uint64_t now_ns) const {
    uint64_t word = slots_[Slot(session_id, job_id)].load(std::memory_order_relaxed);
    if (word == 0 || word >> kTimeBits != Tag(session_id, job_id)) return std::nullopt;
    return (now_ns - word) & kTimeMask;
  }

 private:
  static constexpr int kTimeBits = 48;
  static constexpr uint64_t kTimeMask = (uint64_t{1} << kTimeBits) - 1;

  static uint64_t Mix(uint64_t session_id) { return session_id * 0x9E3779B97F4A7C15ull; }
  static uint64_t Slot(uint64_t session_id, uint64_t job_id) {
    return (job_id + (Mix(session_id) >> 32)) & (kSlots - 1);
  }
  // The bits the slot index leaves out: the job id's high bits and the session.
  static uint64_t Tag(uint64_t session_id, uint64_t job_id) {
    return ((job_id >> kSlotBits) ^ (Mix(session_id) >> 48)) & 0xFFFF;
  }

  std::unique_ptr<std::atomic<uint64_t>[]> slots_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_SUBMIT_TIMES_H_
