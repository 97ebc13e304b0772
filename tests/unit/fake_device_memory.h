// A GPU without a GPU, for DeviceRegistry's tests: cudaMalloc-style allocations and VMM pages
// mapped side by side in reservations (PyTorch's expandable segments), each with the identity
// gpu::AllocationId would read; pages can be unmapped and mapped anew (empty_cache). Exports
// hand out real (eventfd) descriptors, as the registry passes them on. A quiet SyncRuntime lets
// the registry create its per-GPU semaphore page.
#ifndef TIER_TESTS_UNIT_FAKE_DEVICE_MEMORY_H_
#define TIER_TESTS_UNIT_FAKE_DEVICE_MEMORY_H_

#include <sys/eventfd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "client/gpu/client_gpu.h"
#include "client/gpu/device_memory.h"
#include "client/gpu/sync_runtime.h"
#include "gpu/ticket_protocol.h"

namespace tier::client::gpu {

class QuietSyncRuntime final : public SyncRuntime {
 public:
  absl::StatusOr<int> SwapDevice(int) const override { return -1; }
  void RestoreDevice(int) const override {}
  absl::Status CheckStreamMemOps(int) const override { return absl::OkStatus(); }
  absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) const override {
    std::array<uint8_t, 16> uuid{};
    uuid[0] = static_cast<uint8_t>(0xA0 + device);
    return uuid;
  }
  absl::StatusOr<uint64_t> HostDevicePointer(void* host) const override {
    return reinterpret_cast<uint64_t>(host);
  }
  absl::StatusOr<Stream> CreateStream() const override { return Next(); }
  void DestroyStream(Stream) const override {}
  absl::StatusOr<Event> CreateEvent() const override { return Next(); }
  void DestroyEvent(Event) const override {}
  absl::Status RecordEvent(Event, Stream) const override { return absl::OkStatus(); }
  absl::Status StreamWaitEvent(Stream, Event) const override { return absl::OkStatus(); }
  absl::Status WriteValue64(Stream, uint64_t, uint64_t) const override { return absl::OkStatus(); }
  absl::Status WaitValue64(Stream, uint64_t, uint64_t) const override { return absl::OkStatus(); }

 private:
  void* Next() const { return reinterpret_cast<void*>(++next_); }
  mutable uintptr_t next_ = 1000;
};

class FakeDeviceMemory final : public DeviceMemory {
 public:
  // Shared with the test; the registry owns the FakeDeviceMemory.
  struct State {
    std::mutex mu;
    struct Allocation {
      uint64_t bytes = 0;
      uint64_t id = 0;
      bool vmm = false;
      uint64_t reservation_base = 0;  // vmm: the VA reservation holding the page
      uint64_t reservation_bytes = 0;
      bool exportable = true;
    };
    std::map<uint64_t, Allocation> allocations;  // by base address
    uint64_t next_id = 1;
    int exports = 0;  // ExportAllocation calls that returned an allocation
    // Like the H100's driver: a VMM page's address range is that page alone, not its
    // reservation; device_memory_bytes is then what bounds a segment's growth.
    bool range_is_the_page = false;
    uint64_t device_memory_bytes = 0;

    void Malloc(uint64_t base, uint64_t bytes) {
      std::lock_guard lock(mu);
      allocations[base] = {bytes, next_id++, false, 0, 0, true};
    }
    // A VMM page at `base`, in the reservation [reservation, +reservation_bytes).
    void MapPage(uint64_t reservation, uint64_t reservation_bytes, uint64_t base, uint64_t bytes) {
      std::lock_guard lock(mu);
      allocations[base] = {bytes, next_id++, true, reservation, reservation_bytes, true};
    }
    void Unmap(uint64_t base) {
      std::lock_guard lock(mu);
      allocations.erase(base);
    }
    // Unmapped and mapped anew (another physical allocation at the same address).
    void Remap(uint64_t base) {
      std::lock_guard lock(mu);
      allocations.at(base).id = next_id++;
    }
    int Exports() {
      std::lock_guard lock(mu);
      return exports;
    }
    // The allocation holding `ptr`, or end().
    std::map<uint64_t, Allocation>::iterator Find(uint64_t ptr) {
      auto it = allocations.upper_bound(ptr);
      if (it == allocations.begin()) return allocations.end();
      --it;
      return ptr < it->first + it->second.bytes ? it : allocations.end();
    }
  };

  explicit FakeDeviceMemory(State* state) : s_(state) {}

  absl::StatusOr<DeviceAllocation> ExportAllocation(const void* device_ptr) override {
    std::lock_guard lock(s_->mu);
    auto ptr = reinterpret_cast<uint64_t>(device_ptr);
    auto it = s_->Find(ptr);
    if (it == s_->allocations.end() || !it->second.exportable) {
      return absl::InvalidArgumentError("not device memory");
    }
    ++s_->exports;
    DeviceAllocation out;
    out.device = 0;
    out.device_uuid[0] = 0xA0;
    out.base = it->first;
    out.bytes = it->second.bytes;
    out.offset = ptr - it->first;
    if (it->second.vmm) {
      out.kind = wire::BufferKind::kCudaVmmFd;
      out.fd = UniqueFd(::eventfd(0, EFD_CLOEXEC));
      out.reservation_base = it->second.reservation_base;
      out.reservation_bytes = it->second.reservation_bytes;
      if (s_->range_is_the_page) {
        out.reservation_base = it->first;
        out.reservation_bytes = it->second.bytes;
      }
      out.device_memory_bytes = s_->device_memory_bytes;
    } else {
      out.kind = wire::BufferKind::kCudaIpc;
      out.ipc_handle[0] = static_cast<uint8_t>(it->second.id);
      out.reservation_base = it->first;
      out.reservation_bytes = it->second.bytes;
    }
    return out;
  }
  uint64_t AllocationId(const void* device_ptr) override {
    std::lock_guard lock(s_->mu);
    auto it = s_->Find(reinterpret_cast<uint64_t>(device_ptr));
    return it == s_->allocations.end() ? 0 : it->second.id;
  }
  absl::StatusOr<std::unique_ptr<TicketPageRegistration>> RegisterTicketPage(
      ring::TicketPage*) override {
    return std::make_unique<TicketPageRegistration>();
  }
  absl::StatusOr<std::unique_ptr<DeviceSync>> CreateDeviceSync(int device,
                                                               ring::TicketSlot* slot) override {
    return DeviceSync::Create(std::make_unique<QuietSyncRuntime>(), device, slot);
  }

 private:
  State* s_;
};

}  // namespace tier::client::gpu

#endif  // TIER_TESTS_UNIT_FAKE_DEVICE_MEMORY_H_
