#include "client/device_registry.h"

#include <algorithm>
#include <cstring>
#include <utility>

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
  if (device < 0 || device >= ring::kMaxTicketDevices) {
    return absl::OutOfRangeError(absl::StrCat("GPU ", device, ": tierd serves GPUs 0 to ",
                                              ring::kMaxTicketDevices - 1, " of a process"));
  }
  if (ticket_registration_ == nullptr) {
    absl::StatusOr<std::unique_ptr<gpu::TicketPageRegistration>> registration =
        memory_->RegisterTicketPage(tickets_);
    if (!registration.ok()) return registration.status();
    ticket_registration_ = *std::move(registration);
  }
  absl::StatusOr<std::unique_ptr<gpu::DeviceSync>> sync =
      memory_->CreateDeviceSync(device, &tickets_->slots[device]);
  if (!sync.ok()) return sync.status();
  absl::StatusOr<gpu::DeviceAllocation> page = (*sync)->Export();
  if (!page.ok()) return page.status();
  absl::StatusOr<uint64_t> id = register_fn_(Describe(*page), {});
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat("registering the semaphore page of GPU ",
                                                         device, ": ", id.status().message()));
  }
  std::lock_guard lock(mu_);
  return (syncs_[device] = *std::move(sync)).get();
}

std::optional<DeviceRegistry::Registered> DeviceRegistry::FindCachedLocked(
    uint64_t ptr, uint64_t len, std::vector<uint64_t>* stale) {
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return std::nullopt;
  --it;
  const Range& range = it->second;
  if (ptr >= range.end) return std::nullopt;
  const uint64_t last = ptr + std::max<uint64_t>(len, 1) - 1;
  bool fits = std::max<uint64_t>(len, 1) <= range.end - ptr;
  for (size_t i = 0; i < range.pages.size(); ++i) {
    uint64_t page_end = i + 1 < range.pages.size() ? range.pages[i + 1].first : range.end;
    if (page_end <= ptr || range.pages[i].first > last) continue;  // not touched by the range
    uint64_t id = memory_->AllocationId(reinterpret_cast<const void*>(range.pages[i].first));
    if (id != range.pages[i].second) {
      // Freed (or remapped) since it was registered: the registration names memory the client
      // no longer has there. It leaves the cache here, and the daemon once no caller holds it.
      stale->push_back(range.buffer_id);
      UncacheLocked(range.buffer_id);
      return std::nullopt;
    }
  }
  if (!fits) return std::nullopt;
  holds_.Hold(range.buffer_id);
  return Registered{range.buffer_id, ptr - it->first, range.end - it->first, range.device,
                    Lease(this, range.buffer_id)};
}

DeviceRegistry::Lease& DeviceRegistry::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void DeviceRegistry::Lease::Release() {
  if (registry_ != nullptr) std::exchange(registry_, nullptr)->Release(id_);
}

void DeviceRegistry::Release(uint64_t buffer_id) {
  const uint64_t last = marks_.last_pushed();
  std::lock_guard lock(mu_);
  holds_.Release(buffer_id, last);
}

void DeviceRegistry::Owe(Lease lease) {
  if (lease.registry_ == nullptr) return;
  std::lock_guard lock(mu_);
  holds_.Owe(lease.id_);
  lease.registry_ = nullptr;
}

void DeviceRegistry::Paid(uint64_t buffer_id, uint64_t job) {
  std::lock_guard lock(mu_);
  holds_.Paid(buffer_id, job);
}

uint64_t DeviceRegistry::holders(uint64_t buffer_id) const {
  std::lock_guard lock(mu_);
  return holds_.holders(buffer_id);
}

void DeviceRegistry::Retire(const std::vector<uint64_t>& stale) {
  if (stale.empty()) return;
  // Read after the ids left the cache: a job naming one that was pushed by then is at or below.
  const uint64_t last = marks_.last_pushed();
  std::lock_guard lock(mu_);
  for (uint64_t id : stale) holds_.Retire(id, last);
}

void DeviceRegistry::DropDue() {
  {
    std::lock_guard lock(mu_);
    if (holds_.retired() == 0) return;
  }
  // The session's lock is taken here, never under ours (the session calls ReleaseWaiters under
  // its own).
  const uint64_t oldest = marks_.oldest_pending();
  std::vector<uint64_t> due;
  {
    std::lock_guard lock(mu_);
    due = holds_.TakeDue(oldest);
    for (uint64_t id : due) by_buffer_.erase(id);
  }
  // No wait for jobs: all that named it are complete (RegistrationHolds, rule 2).
  for (uint64_t id : due) (void)unregister_fn_(id);
}

absl::StatusOr<DeviceRegistry::Registered> DeviceRegistry::Register(const void* device_ptr,
                                                                     uint64_t len) {
  const auto ptr = reinterpret_cast<uint64_t>(device_ptr);
  DropDue();
  std::vector<uint64_t> stale;
  {
    std::lock_guard lock(mu_);
    if (std::optional<Registered> cached = FindCachedLocked(ptr, len, &stale)) {
      return *std::move(cached);
    }
  }
  Retire(stale);
  absl::StatusOr<gpu::DeviceAllocation> allocation = ExportDeviceRange(*memory_, device_ptr, len);
  if (!allocation.ok()) return allocation.status();
  // The physical allocations under the range, by id (gpu::AllocationId), read right after the
  // export took its handles: they tell memory mapped anew at the same address (a VMM page after
  // empty_cache, a cudaMalloc block after a free) from the memory registered before. Pages in
  // address order; one unless kCudaVmmPages.
  Range range{allocation->base + allocation->bytes, 0, allocation->device, {}};
  if (allocation->page_bytes.empty()) {
    range.pages.push_back({allocation->base, memory_->AllocationId(device_ptr)});
  } else {
    uint64_t at = allocation->base;
    for (uint64_t bytes : allocation->page_bytes) {
      range.pages.push_back({at, memory_->AllocationId(reinterpret_cast<const void*>(at))});
      at += bytes;
    }
  }
  bool identified = true;
  for (const auto& page : range.pages) identified = identified && page.second != 0;
  // Without ids nothing is reused: every call registers anew (correct, just slower).
  Allocation key{allocation->device, allocation->base, allocation->bytes, allocation->ipc_handle,
                 {}};
  for (const auto& page : range.pages) key.ids.push_back(page.second);
  if (identified) {
    std::lock_guard lock(mu_);
    if (auto it = by_allocation_.find(key); it != by_allocation_.end()) {
      holds_.Hold(it->second);
      return Registered{it->second, allocation->offset, allocation->bytes, allocation->device,
                        Lease(this, it->second)};
    }
  }
  absl::StatusOr<gpu::DeviceSync*> sync = SyncFor(allocation->device);
  if (!sync.ok()) return sync.status();
  std::vector<int> fds;
  if (allocation->fd.valid()) fds.push_back(allocation->fd.get());
  for (const UniqueFd& fd : allocation->page_fds) fds.push_back(fd.get());
  absl::StatusOr<uint64_t> id = register_fn_(Describe(*allocation), fds);
  if (!id.ok()) return id.status();
  range.buffer_id = *id;
  std::lock_guard lock(mu_);
  by_buffer_[*id] = key;
  if (identified) {
    // Two threads may register one allocation at once; both ids stay valid, the later one is
    // cached.
    by_allocation_[key] = *id;
    ranges_[allocation->base] = std::move(range);
  }
  holds_.Hold(*id);
  return Registered{*id, allocation->offset, allocation->bytes, allocation->device,
                    Lease(this, *id)};
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
  UncacheLocked(buffer_id);
  holds_.Forget(buffer_id);
  by_buffer_.erase(buffer_id);
}

void DeviceRegistry::UncacheLocked(uint64_t buffer_id) {
  // by_buffer_ keeps it: DeviceOf still knows its GPU for jobs naming it until it is dropped.
  auto it = by_buffer_.find(buffer_id);
  if (it == by_buffer_.end()) return;
  if (auto cached = by_allocation_.find(it->second);
      cached != by_allocation_.end() && cached->second == buffer_id) {
    by_allocation_.erase(cached);
  }
  if (auto range = ranges_.find(it->second.base);
      range != ranges_.end() && range->second.buffer_id == buffer_id) {
    ranges_.erase(range);
  }
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
