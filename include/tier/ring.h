// The per-session job ring: a submission queue (client -> daemon) and a completion queue
// (daemon -> client) in one shared-memory segment (a sealed memfd the daemon creates and passes to
// the client over the session socket).
//
// Each queue is single-producer/single-consumer with free-running 32-bit indices. The producer
// writes an entry, then publishes it with a release store of its tail; the consumer reads the tail
// with acquire, copies the entry out, then releases its head. The daemon treats everything the
// client can write as hostile: it reads each index once, checks that tail - head never exceeds the
// capacity, and copies an entry before validating it (so the client cannot change it between check
// and use). A broken index ends that session, never the daemon.
//
// Sleeping and waking (no syscall while both sides are busy): a consumer about to sleep sets its
// queue's need_wakeup flag, issues a seq_cst fence, and looks at the queue once more before it
// blocks on the queue's eventfd. A producer publishes its tail, issues a seq_cst fence, and writes
// the eventfd only if need_wakeup is set. With both fences, either the consumer sees the new entry
// or the producer sees the flag (Dekker), so no wake-up is lost. The producer clears the flag as it
// takes the request (TakeWakeupRequest), so a burst of entries to a sleeping consumer costs one
// wake-up, not one per entry: the first one's write is pending on the eventfd until the consumer
// wakes and reads it, and a consumer that sleeps again sets the flag again first.
#ifndef TIER_RING_H_
#define TIER_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

namespace tier::ring {

inline constexpr uint32_t kMagic = 0x54524e47;  // "TRNG"
inline constexpr uint32_t kVersion = 3;  // 2: the ticket page after the header; 3: done words in it
inline constexpr uint32_t kMinEntries = 8;
inline constexpr uint32_t kMaxEntries = 1u << 16;

enum class Opcode : uint32_t {
  kOffload = 1,  // buffer[offset, offset+len) -> new object `object_id`
  kReload = 2,   // object `object_id` -> buffer[offset, offset+len)
  kFree = 3,     // drop object `object_id`
  kNop = 4,      // completes at once; used to measure the ring itself
};

inline constexpr uint32_t kFlagFreeAfterReload = 1u << 0;
// A batch (GPU jobs): the client took one ticket (`sync`) for several offloads or reloads of one
// GPU; each of their entries carries the batch's size in the flags' top 16 bits (0 or 1: a lone
// job). The daemon's engine issues the batch once all of its entries arrived and signals the
// ticket once, after the last copy; each job still completes on its own.
inline constexpr uint32_t kBatchSizeShift = 16;
inline constexpr uint32_t kMaxBatchJobs = 0xffff;
constexpr uint32_t BatchSizeFlags(uint32_t jobs) { return jobs << kBatchSizeShift; }
constexpr uint32_t BatchSizeOf(uint32_t flags) { return flags >> kBatchSizeShift; }

// 64 bytes: one cache line per entry.
struct SubmissionEntry {
  uint64_t job_id = 0;     // echoed in the completion
  uint32_t opcode = 0;     // Opcode
  uint32_t flags = 0;      // kFlag*
  uint64_t object_id = 0;  // chosen by the client for offload (unique in the session, non-zero)
  uint64_t buffer_id = 0;
  uint64_t offset = 0;     // bytes into the buffer
  uint64_t len = 0;        // bytes
  uint64_t hint = 0;       // next-use order for the spill policy; 0 = none
  uint64_t sync = 0;       // GPU engine: this job's ticket (0 = none)
};
static_assert(sizeof(SubmissionEntry) == 64);

struct CompletionEntry {
  uint64_t job_id = 0;
  int32_t status = 0;  // tier_status / absl::StatusCode
  uint32_t reserved = 0;
  uint64_t object_id = 0;
  uint64_t len = 0;
};
static_assert(sizeof(CompletionEntry) == 32);

// One cache line per index so producer and consumer never share a line they write.
struct alignas(64) Index {
  std::atomic<uint32_t> value{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct QueueIndices {
  Index head;         // written by the consumer
  Index tail;         // written by the producer
  Index need_wakeup;  // set by the consumer before it sleeps on the queue's eventfd
};

// What the daemon tells every client of its state, without a message (RingHeader::daemon_state;
// written by the daemon only, read by the client before it pushes offloads).
inline constexpr uint32_t kDaemonDraining = 1;  // tierd is stopping: offload no more, keep data

struct alignas(64) RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t sq_entries;  // power of two
  uint32_t cq_entries;  // power of two
  uint64_t sq_offset;   // bytes from the segment start
  uint64_t cq_offset;
  uint64_t session_id;
  alignas(64) QueueIndices sq;
  QueueIndices cq;
  alignas(64) std::atomic<uint32_t> daemon_state{0};  // kDaemon* bits
};

inline constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(RingHeader) <= kHeaderBytes);

// THE TICKET PAGE (GPU sessions; see gpu/ticket_protocol.h). The page after the header holds, for
// each GPU of the client (by the client's ordinal), the protocol's four counters:
//  - produced, reload_ready: raised by the client's ticket stream (offload tickets whose producers
//    finished; reload tickets whose destinations may be written). The client registers the page
//    with its GPU runtime so its streams write it; the daemon reads them on the host and issues a
//    job's copy only once its ticket is here, so no daemon stream ever waits on a client.
//  - offload_done, reload_done: raised by the daemon's copy streams after a ticket's copies (the
//    daemon registers its own mapping of the page with its GPU runtime); the client's streams wait
//    on them on the GPU. Because they are host memory, a client whose daemon died releases every
//    such wait with a plain CPU store: no GPU runtime call, so nothing a blocked launch holds
//    (a driver lock) can stand in its way.
// Both sides treat the other's words as untrusted: a wrong value can only make that client's own
// copies start early or never, or its own streams pass early or wait.
struct alignas(64) TicketWord {
  std::atomic<uint64_t> value{0};
};
struct TicketSlot {
  TicketWord produced;      // offload tickets up to this one: sources written (client)
  TicketWord reload_ready;  // reload tickets up to this one: destinations may be written (client)
  TicketWord offload_done;  // offload copies finished up to this ticket (daemon)
  TicketWord reload_done;   // reload copies finished up to this ticket (daemon)
};
inline constexpr size_t kTicketPageOffset = kHeaderBytes;
inline constexpr size_t kTicketPageBytes = 4096;
inline constexpr int kMaxTicketDevices = static_cast<int>(kTicketPageBytes / sizeof(TicketSlot));
struct TicketPage {
  TicketSlot slots[kMaxTicketDevices];
};
static_assert(sizeof(TicketPage) == kTicketPageBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
inline constexpr size_t kQueuesOffset = kTicketPageOffset + kTicketPageBytes;

// Bytes of a segment holding `entries` submissions and as many completions, page aligned.
constexpr size_t SegmentBytes(uint32_t entries) {
  size_t bytes = kQueuesOffset + size_t{entries} * sizeof(SubmissionEntry) +
                 size_t{entries} * sizeof(CompletionEntry);
  return (bytes + 4095) & ~size_t{4095};
}

// Lays out a fresh segment (daemon side).
inline RingHeader* InitSegment(void* base, uint32_t entries, uint64_t session_id) {
  auto* header = new (base) RingHeader();
  header->magic = kMagic;
  header->version = kVersion;
  header->sq_entries = entries;
  header->cq_entries = entries;
  header->sq_offset = kQueuesOffset;
  header->cq_offset = kQueuesOffset + size_t{entries} * sizeof(SubmissionEntry);
  new (static_cast<char*>(base) + kTicketPageOffset) TicketPage();
  header->session_id = session_id;
  return header;
}

// What both ends of one queue hold: the shared indices, the entries, and the end's own index
// (read once from shared memory when the end is made, trusted from then on: the producer's tail,
// the consumer's head). The peer's index is re-read at each use and checked.
template <typename Entry>
class QueueEnd {
 public:
  uint32_t capacity() const { return mask_ + 1; }

 protected:
  QueueEnd() = default;
  QueueEnd(QueueIndices* indices, Entry* entries, uint32_t capacity, const Index& own)
      : indices_(indices), entries_(entries), mask_(capacity - 1),
        own_(own.value.load(std::memory_order_relaxed)) {}

  // Entries between `head` and `tail`, or nullopt when that is more than the queue holds (the
  // peer's index is impossible: a corrupt peer).
  std::optional<uint32_t> Between(uint32_t head, uint32_t tail) const {
    uint32_t used = tail - head;
    if (used > mask_ + 1) return std::nullopt;
    return used;
  }
  Entry* Slot(uint32_t index) const { return &entries_[index & mask_]; }

  QueueIndices* indices_ = nullptr;
  Entry* entries_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t own_ = 0;  // the producer's tail, or the consumer's head
};

// Producer end of one queue. Only the producer's own tail is trusted; the consumer's head is
// re-read and checked on each push.
template <typename Entry>
class Producer : public QueueEnd<Entry> {
 public:
  Producer() = default;
  Producer(QueueIndices* indices, Entry* entries, uint32_t capacity)
      : QueueEnd<Entry>(indices, entries, capacity, indices->tail) {}
  using QueueEnd<Entry>::capacity;

  // Entries the consumer has not taken yet, or nullopt if its head is impossible (corrupt peer).
  std::optional<uint32_t> Pending() const {
    return Between(indices_->head.value.load(std::memory_order_acquire), own_);
  }

  // False when full (or the peer's head is corrupt: see Pending()).
  bool TryPush(const Entry& entry) {
    std::optional<uint32_t> used = Pending();
    if (!used || *used == capacity()) return false;
    std::memcpy(Slot(own_), &entry, sizeof(Entry));
    ++own_;
    indices_->tail.value.store(own_, std::memory_order_release);
    return true;
  }

  // After publishing: true when the consumer asked to be woken; the request is then taken
  // (cleared), and the caller must write the consumer's eventfd. False: it is awake, or an earlier
  // write of the eventfd will wake it.
  bool TakeWakeupRequest() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (indices_->need_wakeup.value.load(std::memory_order_relaxed) == 0) return false;
    return indices_->need_wakeup.value.exchange(0, std::memory_order_relaxed) != 0;
  }

 private:
  using QueueEnd<Entry>::Between;
  using QueueEnd<Entry>::Slot;
  using QueueEnd<Entry>::indices_;
  using QueueEnd<Entry>::own_;  // the tail
};

// Consumer end of one queue. Only the consumer's own head is trusted.
template <typename Entry>
class Consumer : public QueueEnd<Entry> {
 public:
  Consumer() = default;
  Consumer(QueueIndices* indices, Entry* entries, uint32_t capacity)
      : QueueEnd<Entry>(indices, entries, capacity, indices->head) {}

  enum class Result { kEntry, kEmpty, kCorrupt };

  // Copies the next entry out (never hands out a pointer into shared memory).
  Result TryPop(Entry* out) {
    std::optional<uint32_t> avail =
        Between(own_, indices_->tail.value.load(std::memory_order_acquire));
    if (!avail) return Result::kCorrupt;
    if (*avail == 0) return Result::kEmpty;
    std::memcpy(out, Slot(own_), sizeof(Entry));
    ++own_;
    indices_->head.value.store(own_, std::memory_order_release);
    return Result::kEntry;
  }

  bool Empty() const {
    return indices_->tail.value.load(std::memory_order_acquire) == own_;
  }
  // Empty() for a thread other than the consumer's: compares the published indices only.
  bool ObservedEmpty() const {
    return indices_->tail.value.load(std::memory_order_acquire) ==
           indices_->head.value.load(std::memory_order_acquire);
  }

  // Before sleeping: set need_wakeup, fence, and look again. Returns true if an entry arrived in
  // between (then do not sleep; call CancelSleep()).
  bool PrepareSleep() {
    indices_->need_wakeup.value.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return !Empty();
  }
  void CancelSleep() { indices_->need_wakeup.value.store(0, std::memory_order_relaxed); }

 private:
  using QueueEnd<Entry>::Between;
  using QueueEnd<Entry>::Slot;
  using QueueEnd<Entry>::indices_;
  using QueueEnd<Entry>::own_;  // the head
};

// Views of a mapped segment, for each side. The client validates the header it receives (its
// sizes must fit the mapping) before building these.
struct SegmentView {
  RingHeader* header = nullptr;
  TicketPage* tickets = nullptr;
  SubmissionEntry* sq = nullptr;
  CompletionEntry* cq = nullptr;
};

// Checks a header read from a mapping of `mapped_bytes`; returns a view or nullopt.
inline std::optional<SegmentView> ViewSegment(void* base, size_t mapped_bytes) {
  if (mapped_bytes < kHeaderBytes) return std::nullopt;
  auto* header = static_cast<RingHeader*>(base);
  uint32_t n = header->sq_entries;
  if (header->magic != kMagic || header->version != kVersion || n != header->cq_entries ||
      n < kMinEntries || n > kMaxEntries || (n & (n - 1)) != 0 ||
      header->sq_offset != kQueuesOffset ||
      header->cq_offset != kQueuesOffset + size_t{n} * sizeof(SubmissionEntry) ||
      SegmentBytes(n) > mapped_bytes) {
    return std::nullopt;
  }
  auto* bytes = static_cast<char*>(base);
  return SegmentView{header, reinterpret_cast<TicketPage*>(bytes + kTicketPageOffset),
                     reinterpret_cast<SubmissionEntry*>(bytes + header->sq_offset),
                     reinterpret_cast<CompletionEntry*>(bytes + header->cq_offset)};
}

}  // namespace tier::ring

#endif  // TIER_RING_H_
