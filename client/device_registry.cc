#include "client/device_registry.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tier::client {
namespace {

wire::RegisterBuffer Describe(const gpu::DeviceAllocation& allocation) {
  wire::RegisterBuffer request{};
  request.kind = static_cast<uint32_t>(allocation.kind);
  request.device = allocation.device;
  request.bytes = allocation.bytes;
  std::memcpy(request.handle, allocation.ipc_handle.data(), sizeof(request.handle));
  std::memcpy(request.device_uuid, allocation.device_uuid.data(), sizeof(request.device_uuid));
  return request;
}

}  // namespace

absl::StatusOr<gpu::DeviceSync*> DeviceRegistry::SyncFor(int device) {
  std::lock_guard create(create_mu_);
  {
    std::lock_guard lock(mu_);
    if (auto it = syncs_.find(device); it != syncs_.end()) return it->second.get();
  }
  absl::StatusOr<std::unique_ptr<gpu::DeviceSync>> sync = gpu::CreateDeviceSync(device);
  if (!sync.ok()) return sync.status();
  absl::StatusOr<gpu::DeviceAllocation> page = (*sync)->Export();
  if (!page.ok()) return page.status();
  absl::StatusOr<uint64_t> id = register_fn_(Describe(*page), -1);
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat("registering the semaphore page of GPU ",
                                                         device, ": ", id.status().message()));
  }
  std::lock_guard lock(mu_);
  return (syncs_[device] = *std::move(sync)).get();
}

absl::StatusOr<DeviceRegistry::Registered> DeviceRegistry::Register(const void* device_ptr) {
  absl::StatusOr<gpu::DeviceAllocation> allocation = gpu::ExportDeviceAllocation(device_ptr);
  if (!allocation.ok()) return allocation.status();
  Allocation key{allocation->device, allocation->base, allocation->bytes,
                 allocation->kind == wire::BufferKind::kCudaIpc ? allocation->ipc_handle
                                                               : std::array<uint8_t, 64>{}};
  {
    std::lock_guard lock(mu_);
    if (auto it = by_allocation_.find(key); it != by_allocation_.end()) {
      return Registered{it->second, allocation->offset, allocation->bytes, allocation->device};
    }
  }
  absl::StatusOr<gpu::DeviceSync*> sync = SyncFor(allocation->device);
  if (!sync.ok()) return sync.status();
  absl::StatusOr<uint64_t> id =
      register_fn_(Describe(*allocation), allocation->fd.valid() ? allocation->fd.get() : -1);
  if (!id.ok()) return id.status();
  std::lock_guard lock(mu_);
  // Two threads may register one allocation at once; both ids stay valid, the later one is cached.
  by_allocation_[key] = *id;
  by_buffer_[*id] = key;
  return Registered{*id, allocation->offset, allocation->bytes, allocation->device};
}

int DeviceRegistry::DeviceOf(uint64_t buffer_id) const {
  std::lock_guard lock(mu_);
  auto it = by_buffer_.find(buffer_id);
  return it == by_buffer_.end() ? -1 : it->second.device;
}

gpu::DeviceSync* DeviceRegistry::Sync(int device) const {
  std::lock_guard lock(mu_);
  auto it = syncs_.find(device);
  return it == syncs_.end() ? nullptr : it->second.get();
}

void DeviceRegistry::Forget(uint64_t buffer_id) {
  std::lock_guard lock(mu_);
  auto it = by_buffer_.find(buffer_id);
  if (it == by_buffer_.end()) return;
  if (auto cached = by_allocation_.find(it->second);
      cached != by_allocation_.end() && cached->second == buffer_id) {
    by_allocation_.erase(cached);
  }
  by_buffer_.erase(it);
}

void DeviceRegistry::ReleaseWaiters() {
  std::lock_guard lock(mu_);
  for (auto& [device, sync] : syncs_) (void)sync->ReleaseWaiters();
}

bool DeviceRegistry::empty() const {
  std::lock_guard lock(mu_);
  return syncs_.empty();
}

}  // namespace tier::client
