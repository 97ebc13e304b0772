// Faulting a shared mapping's pages in for writing, so that they hold memory that stays.
//
// MAP_POPULATE on a MAP_SHARED mapping faults pages in for reading: a memfd's pages come in
// clean, and reclaim (or drop_caches) may drop a clean shmem page, which leaves a hole again.
// tierd refuses a memfd with holes, so a buffer populated that way was refused at random under
// memory pressure. Pages faulted in for writing are dirty: reclaim swaps them, it never drops
// them, and SEEK_HOLE counts a swapped page as data.
#ifndef TIER_COMMON_POPULATE_H_
#define TIER_COMMON_POPULATE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tier {

// Faults [base, base + bytes) of a writable mapping in for writing: MADV_POPULATE_WRITE, or on a
// kernel without it (before Linux 5.14) a write of each page's first byte with its own value.
// base is page aligned. Fails (ENOMEM, EFAULT, ...) instead of raising SIGBUS where the kernel
// has the madvise.
absl::Status PopulateForWrite(void* base, uint64_t bytes);

}  // namespace tier

#endif  // TIER_COMMON_POPULATE_H_
