#include "client/device_registry.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

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
  absl::StatusOr<gpu::DeviceAllocation> slot = (*sync)->Export();
  if (!slot.ok()) return slot.status();
  absl::StatusOr<uint64_t> id = register_fn_(Describe(*slot), {});
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat("binding the ticket slot of GPU ",
                                                         device, ": ", id.status().message()));
  }
  std::lock_guard lock(mu_);
  gpu::DeviceSync* created = (syncs_[device] = *std::move(sync)).get();
  released_[device].store(created);
  return created;
}

std::optional<DeviceRegistry::Registered> DeviceRegistry::FindCachedLocked(
    uint64_t ptr, uint64_t len, std::vector<uint64_t>* stale, std::optional<Growth>* growth) {
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return std::nullopt;
  --it;
  const uint64_t base = it->first;
  const Range& range = it->second;
  if (ptr >= range.end) return std::nullopt;
  const uint64_t want = std::max<uint64_t>(len, 1);
  const bool fits = want <= range.end - ptr;
  // The pages the range touches inside the registration (the rest of it may lie past its end).
  const uint64_t last = ptr + std::min(want, range.end - ptr) - 1;
  size_t first_page = 0;
  size_t end_page = range.pages.size();
  if (range.page_bytes != 0) {  // a segment: its pages are found by arithmetic
    first_page = (ptr - base) / range.page_bytes;
    end_page = (last - base) / range.page_bytes + 1;
  }
  for (size_t i = first_page; i < end_page; ++i) {
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
  if (!fits) {
    if (range.page_bytes != 0) *growth = Growth{base, range.buffer_id};
    return std::nullopt;
  }
  holds_.Hold(range.buffer_id);
  return Registered{range.buffer_id, ptr - base, range.end - base, range.device,
                    Lease(this, range.buffer_id)};
}

DeviceRegistry::Counters DeviceRegistry::counters() const {
  return Counters{registrations_.load(), extensions_.load(), exports_.load()};
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
  const uint64_t last = marks_.last_pushed();  // read without our lock (see DropDue)
  std::lock_guard lock(mu_);
  holds_.Owe(lease.id_, last);
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
  const uint64_t last = marks_.last_pushed();
  std::vector<uint64_t> due;
  {
    std::lock_guard lock(mu_);
    due = holds_.TakeDue(oldest, last);
    for (uint64_t id : due) by_buffer_.erase(id);
  }
  // No wait for jobs: all that named it are complete (RegistrationHolds, rule 2).
  for (uint64_t id : due) (void)unregister_fn_(id);
}

absl::StatusOr<DeviceRegistry::Registered> DeviceRegistry::Register(const void* device_ptr,
                                                                     uint64_t len) {
  const auto ptr = reinterpret_cast<uint64_t>(device_ptr);
  DropDue();
  for (int attempt = 0;; ++attempt) {
    std::vector<uint64_t> stale;
    std::optional<Growth> growth;
    {
      std::lock_guard lock(mu_);
      if (std::optional<Registered> cached = FindCachedLocked(ptr, len, &stale, &growth)) {
        return *std::move(cached);
      }
    }
    Retire(stale);
    if (!growth || attempt > 0) break;
    if (std::optional<Registered> grown = Grow(*growth, ptr, len)) return *std::move(grown);
    // Not grown (the pages after it end before the range, or tierd refused): look again, since
    // another thread may have grown it meanwhile; then register anew.
  }
  // The identity before the export: memory remapped between the two reads as stale later, never
  // as the memory exported.
  const uint64_t page_id = memory_->AllocationId(device_ptr);
  absl::StatusOr<gpu::DeviceAllocation> first = memory_->ExportAllocation(device_ptr);
  if (!first.ok()) return first.status();
  if (first->kind == wire::BufferKind::kCudaVmmFd && page_id != 0 &&
      !segments_refused_.load(std::memory_order_relaxed)) {
    absl::StatusOr<std::optional<Registered>> segment =
        RegisterSegment(*std::move(first), page_id, ptr, len);
    if (!segment.ok()) return segment.status();
    if (*segment) return **std::move(segment);
    // The range leaves the run of same-size pages: registered as pages, as before segments.
    first = memory_->ExportAllocation(device_ptr);
    if (!first.ok()) return first.status();
  }
  return RegisterPages(*std::move(first), device_ptr, len);
}

std::optional<DeviceRegistry::Registered> DeviceRegistry::Grow(const Growth& growth, uint64_t ptr,
                                                              uint64_t len) {
  std::lock_guard grow(grow_mu_);
  gpu::VmmPages more;
  uint64_t base = 0;
  {
    std::lock_guard lock(mu_);
    auto it = ranges_.find(growth.base);
    if (it == ranges_.end() || it->second.buffer_id != growth.buffer_id) return std::nullopt;
    const Range& range = it->second;
    if (range.end - ptr >= std::max<uint64_t>(len, 1)) return std::nullopt;  // grown meanwhile
    base = it->first;
    more.device = range.device;
    more.base = range.end;
    more.page_bytes = range.page_bytes;
    more.reservation_base = range.reservation_base;
    more.reservation_end = range.reservation_end;
  }
  // Every page mapped after it now, not only those the range needs: the allocator maps pages as
  // it grows, so one extension then serves the ranges that follow.
  (void)gpu::ExportVmmGrowth(*memory_, more);
  exports_.fetch_add(more.fds.size(), std::memory_order_relaxed);
  if (more.end() - ptr < std::max<uint64_t>(len, 1)) return std::nullopt;
  if (absl::Status s = ExtendSegment(growth.buffer_id, more.base - base, more.page_bytes,
                                     more.fds, 0);
      !s.ok()) {
    // tierd refused (its reservation is full, ...): the segment stays as it is for the ranges it
    // holds; this range gets a new registration of the whole run, which then replaces it.
    return std::nullopt;
  }
  std::lock_guard lock(mu_);
  if (auto it = ranges_.find(growth.base);
      it != ranges_.end() && it->second.buffer_id == growth.buffer_id) {
    Range& range = it->second;
    for (size_t i = 0; i < more.ids.size(); ++i) {
      range.pages.push_back({more.base + i * more.page_bytes, more.ids[i]});
    }
    range.end = more.end();
    if (auto entry = by_buffer_.find(growth.buffer_id); entry != by_buffer_.end()) {
      entry->second.bytes = range.end - base;
    }
  }
  // (Retired meanwhile: still registered, with these pages, until its holders are done.)
  holds_.Hold(growth.buffer_id);
  return Registered{growth.buffer_id, ptr - base, more.end() - base, more.device,
                    Lease(this, growth.buffer_id)};
}

absl::Status DeviceRegistry::ExtendSegment(uint64_t id, uint64_t offset, uint64_t page_bytes,
                                           const std::vector<UniqueFd>& fds, size_t from) {
  while (from < fds.size()) {
    const size_t count = std::min(fds.size() - from, wire::kMaxSegmentPagesPerMessage);
    wire::ExtendBuffer request{};
    request.buffer_id = id;
    request.offset = offset;
    request.page_bytes = page_bytes;
    request.page_count = static_cast<uint32_t>(count);
    std::vector<int> raw;
    for (size_t i = from; i < from + count; ++i) raw.push_back(fds[i].get());
    absl::StatusOr<uint64_t> bytes = extend_fn_(request, raw);
    if (!bytes.ok()) return bytes.status();
    extensions_.fetch_add(1, std::memory_order_relaxed);
    offset += count * page_bytes;
    if (*bytes != offset) {
      return absl::InternalError(absl::StrCat("tierd's segment holds ", *bytes, " bytes after an "
                                              "extension to ", offset));
    }
    from += count;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<DeviceRegistry::Registered>> DeviceRegistry::RegisterSegment(
    gpu::DeviceAllocation page, uint64_t page_id, uint64_t ptr, uint64_t len) {
  gpu::VmmPages run = gpu::ExportVmmRun(*memory_, std::move(page), page_id);
  exports_.fetch_add(run.fds.size(), std::memory_order_relaxed);
  if (ptr < run.base || run.end() - ptr < std::max<uint64_t>(len, 1)) return std::nullopt;
  // What tierd reserves: up to the end of the client's reservation (PyTorch reserves about the
  // GPU's memory per segment), whole pages, within the protocol's bound.
  uint64_t reserve = std::min(run.reservation_end - run.base, wire::kMaxSegmentReserveBytes);
  reserve -= reserve % run.page_bytes;
  if (reserve < run.bytes()) return std::nullopt;
  absl::StatusOr<gpu::DeviceSync*> sync = SyncFor(run.device);
  if (!sync.ok()) return sync.status();
  const size_t first = std::min(run.fds.size(), wire::kMaxSegmentPagesPerMessage);
  wire::RegisterBuffer request{};
  request.kind = static_cast<uint32_t>(wire::BufferKind::kCudaVmmSegment);
  request.device = run.device;
  request.bytes = first * run.page_bytes;
  std::memcpy(request.device_uuid, run.device_uuid.data(), sizeof(request.device_uuid));
  wire::SegmentLayout layout{run.page_bytes, reserve, static_cast<uint32_t>(first), 0};
  std::memcpy(request.handle, &layout, sizeof(layout));
  std::vector<int> fds;
  for (size_t i = 0; i < first; ++i) fds.push_back(run.fds[i].get());
  absl::StatusOr<uint64_t> id = register_fn_(request, fds);
  if (!id.ok()) {
    if (absl::IsUnimplemented(id.status()) || absl::IsInvalidArgument(id.status())) {
      // A tierd that predates segments (or whose engine cannot map them): pages, from now on.
      if (!segments_refused_.exchange(true, std::memory_order_relaxed)) {
        LogWarning("libtierclient: tierd refused a whole expandable segment (",
                   id.status().message(), "); ranges in VMM memory are registered page by page "
                   "from now on, at most ", wire::kMaxVmmPages, " pages each");
      }
      return std::nullopt;
    }
    return id.status();
  }
  registrations_.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = ExtendSegment(*id, request.bytes, run.page_bytes, run.fds, first);
      !s.ok()) {
    (void)unregister_fn_(*id);  // nobody got it yet
    return s;
  }
  Range range{run.end(), *id, run.device, {}, run.page_bytes, run.reservation_base,
              run.reservation_end};
  for (size_t i = 0; i < run.ids.size(); ++i) {
    range.pages.push_back({run.base + i * run.page_bytes, run.ids[i]});
  }
  std::vector<uint64_t> replaced;
  {
    std::lock_guard lock(mu_);
    by_buffer_[*id] = Allocation{run.device, run.base, run.bytes(), {}, {}};
    auto [it, inserted] = ranges_.try_emplace(run.base);
    if (!inserted && it->second.buffer_id != *id) {
      // Another registration of this run (a thread that raced us, or one that could not grow):
      // ours replaces it in the cache; it goes once its holders are done.
      replaced.push_back(it->second.buffer_id);
      UncacheLocked(it->second.buffer_id);
      it = ranges_.try_emplace(run.base).first;
    }
    it->second = std::move(range);
    holds_.Hold(*id);
  }
  Retire(replaced);
  return Registered{*id, ptr - run.base, run.bytes(), run.device, Lease(this, *id)};
}

absl::StatusOr<DeviceRegistry::Registered> DeviceRegistry::RegisterPages(
    gpu::DeviceAllocation first, const void* device_ptr, uint64_t len) {
  absl::StatusOr<gpu::DeviceAllocation> allocation =
      ExportDeviceRangeFrom(*memory_, std::move(first), device_ptr, len);
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
  exports_.fetch_add(range.pages.size(), std::memory_order_relaxed);
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
  registrations_.fetch_add(1, std::memory_order_relaxed);
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
  // No lock: a thread holding mu_ may be stuck in a runtime call behind the very waits this
  // releases (see the header).
  for (std::atomic<gpu::DeviceSync*>& sync : released_) {
    if (gpu::DeviceSync* s = sync.load(); s != nullptr) s->ReleaseWaiters();
  }
}

bool DeviceRegistry::empty() const {
  std::lock_guard lock(mu_);
  return syncs_.empty();
}

}  // namespace tier::client
