// Checks of the messages that register and grow an expandable segment (wire::BufferKind::
// kCudaVmmSegment, wire::ExtendBuffer), as pure functions of the message and the number of
// descriptors that came with it (the fuzz target tests/fuzz/session_message_fuzzer.cc calls
// them). Everything that can be checked without the GPU is checked here: counts, sizes,
// totals without overflow, limits. The engine checks the rest (granularity, the pages' GPU, that
// an extension lands at the registration's end and within its reservation).
#ifndef TIER_DAEMON_SESSIONS_SEGMENT_REQUEST_H_
#define TIER_DAEMON_SESSIONS_SEGMENT_REQUEST_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "tier/session_wire.h"

namespace tier::daemon {

struct SegmentPages {
  uint64_t page_bytes = 0;
  uint32_t page_count = 0;
  uint64_t bytes = 0;          // page_bytes * page_count
  uint64_t reserve_bytes = 0;  // registration: the VA tierd reserves (>= bytes)
};

// A kCudaVmmSegment RegisterBuffer carrying `fds` descriptors. INVALID_ARGUMENT saying what is
// wrong.
absl::StatusOr<SegmentPages> CheckSegmentRegister(const wire::RegisterBuffer& request, size_t fds);

// An ExtendBuffer carrying `fds` descriptors: the new pages only (the engine checks them against
// the registration). INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<SegmentPages> CheckSegmentExtend(const wire::ExtendBuffer& request, size_t fds);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SESSIONS_SEGMENT_REQUEST_H_
