// What a ring submission entry must satisfy before the executor looks anything up, as pure
// functions of the entry (the fuzz target tests/fuzz/ring_entry_fuzzer.cc calls them directly).
// The entry is the daemon's own copy (ring::Consumer copies it out of shared memory first), so
// the client cannot change it between these checks and its use.
#ifndef TIER_DAEMON_JOBS_ENTRY_VALIDATOR_H_
#define TIER_DAEMON_JOBS_ENTRY_VALIDATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tier/ring.h"

namespace tier::daemon {

// INVALID_ARGUMENT for an unknown opcode, an offload or reload of 0 bytes, an offload naming
// object 0 (reserved).
absl::Status ValidateEntry(const ring::SubmissionEntry& entry);

// OUT_OF_RANGE unless [offset, offset + len) lies in a buffer of `buffer_bytes` (no sum can
// overflow).
absl::Status CheckBufferRange(uint64_t offset, uint64_t len, uint64_t buffer_bytes,
                              uint64_t buffer_id);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_ENTRY_VALIDATOR_H_
