#include "client/gpu/vmm_segment.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace tier::client::gpu {
namespace {

// The page at `address` if it continues a run of `like`'s pages: a VMM page of the same size,
// GPU and reservation, starting exactly at `address`.
// *id: its identity, read before the export and the same after it.
std::optional<DeviceAllocation> PageAt(DeviceMemory& memory, uint64_t address,
                                       const VmmPages& like, uint64_t* id) {
  const void* at = reinterpret_cast<const void*>(address);
  *id = memory.AllocationId(at);
  if (*id == 0) return std::nullopt;
  absl::StatusOr<DeviceAllocation> page = memory.ExportAllocation(at);
  if (!page.ok() || page->kind != wire::BufferKind::kCudaVmmFd || page->base != address ||
      page->bytes != like.page_bytes || page->device != like.device || !page->fd.valid() ||
      memory.AllocationId(at) != *id) {
    return std::nullopt;
  }
  return *std::move(page);
}

}  // namespace

VmmPages ExportVmmRun(DeviceMemory& memory, DeviceAllocation page, uint64_t page_id) {
  VmmPages run;
  run.device = page.device;
  run.device_uuid = page.device_uuid;
  run.base = page.base;
  run.page_bytes = page.bytes;
  // The driver may report one page's mapping as the address range (H100, driver 580): pages
  // mapped side by side are one run whatever it says, and the run may grow as far as the GPU's
  // memory past its first page.
  run.reservation_base = page.reservation_base;
  run.reservation_end = std::max(page.reservation_base + page.reservation_bytes,
                                 page.base + page.device_memory_bytes);
  std::vector<std::pair<UniqueFd, uint64_t>> before;  // nearest first
  while (run.base >= run.page_bytes) {
    uint64_t id = 0;
    std::optional<DeviceAllocation> prev = PageAt(memory, run.base - run.page_bytes, run, &id);
    if (!prev) break;
    before.emplace_back(std::move(prev->fd), id);
    run.base -= run.page_bytes;
  }
  for (auto it = before.rbegin(); it != before.rend(); ++it) {
    run.fds.push_back(std::move(it->first));
    run.ids.push_back(it->second);
  }
  run.fds.push_back(std::move(page.fd));
  run.ids.push_back(page_id);
  (void)ExportVmmGrowth(memory, run);
  return run;
}

size_t ExportVmmGrowth(DeviceMemory& memory, VmmPages& run) {
  size_t added = 0;
  while (run.reservation_end - run.end() >= run.page_bytes) {
    uint64_t id = 0;
    std::optional<DeviceAllocation> next = PageAt(memory, run.end(), run, &id);
    if (!next) break;
    run.fds.push_back(std::move(next->fd));
    run.ids.push_back(id);
    ++added;
  }
  return added;
}

}  // namespace tier::client::gpu
