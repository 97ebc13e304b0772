// libFuzzer target: the daemon's side of a job ring whose shared memory a hostile client wrote
// (indices and entries), then each entry through the validator (daemon/jobs/entry_validator.h) and the
// buffer range check. The consumer must never read outside the ring or take more entries than it
// holds, and whatever the checks pass must be a range inside the buffer.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "daemon/jobs/entry_validator.h"
#include "tier/ring.h"

namespace {

constexpr uint32_t kEntries = 8;

struct Input {
  const uint8_t* bytes;
  size_t size;
  template <typename T>
  T Take() {
    T value{};
    size_t n = std::min(size, sizeof(T));
    std::memcpy(&value, bytes, n);
    bytes += n;
    size -= n;
    return value;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  Input in{bytes, size};
  // The segment as the client left it: its indices and its entries, all hostile.
  alignas(4096) static char segment[tier::ring::SegmentBytes(kEntries)];
  std::memset(segment, 0, sizeof(segment));
  tier::ring::RingHeader* header = tier::ring::InitSegment(segment, kEntries, 1);
  auto* entries =
      reinterpret_cast<tier::ring::SubmissionEntry*>(segment + tier::ring::kHeaderBytes);
  const uint32_t head = in.Take<uint32_t>();
  header->sq.head.value.store(head);
  tier::ring::Consumer<tier::ring::SubmissionEntry> consumer(&header->sq, entries, kEntries);
  header->sq.tail.value.store(in.Take<uint32_t>());
  for (uint32_t i = 0; i < kEntries; ++i) entries[i] = in.Take<tier::ring::SubmissionEntry>();
  const uint64_t buffer_bytes = in.Take<uint64_t>();

  const uint32_t available = header->sq.tail.value.load() - head;
  uint32_t taken = 0;
  tier::ring::SubmissionEntry entry;
  for (;;) {
    auto result = consumer.TryPop(&entry);
    if (result == tier::ring::Consumer<tier::ring::SubmissionEntry>::Result::kEmpty) break;
    if (result == tier::ring::Consumer<tier::ring::SubmissionEntry>::Result::kCorrupt) {
      if (available <= kEntries) std::abort();  // refused a sane queue
      return 0;
    }
    if (++taken > kEntries || available > kEntries) std::abort();  // took what is not there
    if (!tier::daemon::ValidateEntry(entry).ok()) continue;
    auto opcode = static_cast<tier::ring::Opcode>(entry.opcode);
    if ((opcode == tier::ring::Opcode::kOffload || opcode == tier::ring::Opcode::kReload) &&
        entry.len == 0) {
      std::abort();
    }
    if (opcode == tier::ring::Opcode::kOffload && entry.object_id == 0) std::abort();
    if (tier::daemon::CheckBufferRange(entry.offset, entry.len, buffer_bytes, entry.buffer_id)
            .ok()) {
      // In range, computed without overflow.
      if (entry.offset > buffer_bytes || entry.len > buffer_bytes - entry.offset) std::abort();
    }
  }
  if (taken != available) std::abort();  // left entries behind or invented some
  return 0;
}
