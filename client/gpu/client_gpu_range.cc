// ExportDeviceRange (client/gpu/device_memory.h): runtime neutral, over DeviceMemory.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/gpu/device_memory.h"

namespace tier::client::gpu {

absl::StatusOr<DeviceAllocation> ExportDeviceRange(DeviceMemory& memory, const void* device_ptr,
                                                   uint64_t len) {
  absl::StatusOr<DeviceAllocation> first = memory.ExportAllocation(device_ptr);
  if (!first.ok()) return first;
  return ExportDeviceRangeFrom(memory, *std::move(first), device_ptr, len);
}

absl::StatusOr<DeviceAllocation> ExportDeviceRangeFrom(DeviceMemory& memory,
                                                       DeviceAllocation first,
                                                       const void* device_ptr, uint64_t len) {
  if (len == 0 || (first.offset <= first.bytes && len <= first.bytes - first.offset)) {
    return first;
  }
  if (first.kind != wire::BufferKind::kCudaVmmFd) {
    return absl::OutOfRangeError(absl::StrCat("the range of ", len, " bytes crosses the end of "
                                              "its GPU allocation (", first.bytes, " bytes)"));
  }
  DeviceAllocation out = std::move(first);
  out.kind = wire::BufferKind::kCudaVmmPages;
  out.page_fds.push_back(std::move(out.fd));
  out.page_bytes.push_back(out.bytes);
  const uint64_t end = reinterpret_cast<uint64_t>(device_ptr) + len;
  uint64_t next = out.base + out.bytes;
  while (next < end) {
    if (out.page_fds.size() == wire::kMaxVmmPages) {
      return absl::OutOfRangeError(absl::StrCat("the range of ", len, " bytes spans more than ",
                                                wire::kMaxVmmPages, " VMM pages"));
    }
    absl::StatusOr<DeviceAllocation> page =
        memory.ExportAllocation(reinterpret_cast<const void*>(next));
    if (!page.ok() || page->kind != wire::BufferKind::kCudaVmmFd || page->base != next ||
        page->device != out.device) {
      return absl::OutOfRangeError(absl::StrCat(
          "the range of ", len, " bytes runs past its VMM page into memory that is not another "
          "exportable VMM page mapped right after it",
          page.ok() ? "" : absl::StrCat(" (", page.status().message(), ")")));
    }
    out.page_fds.push_back(std::move(page->fd));
    out.page_bytes.push_back(page->bytes);
    out.bytes += page->bytes;
    next += page->bytes;
  }
  out.ipc_handle.fill(0);
  for (size_t i = 0; i < out.page_bytes.size(); ++i) {
    std::memcpy(out.ipc_handle.data() + 8 * i, &out.page_bytes[i], sizeof(uint64_t));
  }
  return out;
}

}  // namespace tier::client::gpu
