// The pages of an expandable segment as one registration: a run of VMM pages of one size mapped
// side by side in one VA reservation (PyTorch's expandable segments map a 2 MiB or 20 MiB page at
// a time, each its own cuMemCreate allocation), exported page by page over DeviceMemory.
#ifndef TIER_CLIENT_GPU_VMM_SEGMENT_H_
#define TIER_CLIENT_GPU_VMM_SEGMENT_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "client/gpu/device_allocation.h"
#include "client/gpu/device_memory.h"
#include "common/unique_fd.h"

namespace tier::client::gpu {

struct VmmPages {
  int device = -1;
  std::array<uint8_t, 16> device_uuid{};
  uint64_t base = 0;        // the first page's address
  uint64_t page_bytes = 0;  // every page's size
  uint64_t reservation_base = 0;  // the VA reservation holding them
  uint64_t reservation_end = 0;
  std::vector<UniqueFd> fds;     // one per page, in address order
  std::vector<uint64_t> ids;     // DeviceMemory::AllocationId of each page, read before its export
  uint64_t bytes() const { return page_bytes * fds.size(); }
  uint64_t end() const { return base + bytes(); }
};

// The whole run of same-size pages mapped side by side around the VMM page `page` (exported by
// DeviceMemory::ExportAllocation, kind kCudaVmmFd, whose AllocationId read before the export was
// `page_id`; its descriptor moves into the result): pages before it down to the first gap (or a
// page of another size or GPU, or one without an identity), and after it up to the next, within
// the reservation or the GPU's memory past the page, whichever reaches further. One export per page. Each page's identity is read before its export and checked after
// it, so a page remapped meanwhile ends the run rather than pairing new memory with an old id.
VmmPages ExportVmmRun(DeviceMemory& memory, DeviceAllocation page, uint64_t page_id);

// The pages of `run`'s size mapped side by side from `run.end()` on (none when the next address
// is unmapped or holds something else): what the allocator mapped since `run` was exported.
// Appends them to `run` and returns how many.
size_t ExportVmmGrowth(DeviceMemory& memory, VmmPages& run);

}  // namespace tier::client::gpu

#endif  // TIER_CLIENT_GPU_VMM_SEGMENT_H_
