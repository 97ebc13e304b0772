// The client's GPU side of a session: which registered buffers are device allocations, and the
// per-GPU ticket slot (gpu::DeviceSync) whose tickets order the client's streams against the
// daemon's copies. Created empty; the first device buffer of a GPU creates that GPU's DeviceSync
// and binds its slot in the daemon (kind kCudaSemaphores) before the buffer itself.
//
// Registration is once per allocation: a pointer inside an allocation already registered returns
// the same buffer id (the cache key includes the IPC handle, so a new allocation that happens to
// reuse an address is registered anew). When a registered range turns out to hold other memory
// now (the allocator gave it back to the driver and mapped new memory there: CUDA's buffer ids
// differ), the old registration leaves the cache at once and is dropped in the daemon once no
// caller that received it can still name it in a job (RegistrationHolds), so the daemon does not
// keep freed memory mapped (and alive) for the rest of the session, and no job names a buffer
// dropped under it.
//
// Expandable segments (VMM pages of one size mapped side by side in one reservation, PyTorch's
// expandable_segments): the first range in one registers the segment's whole run of mapped pages
// (kCudaVmmSegment, continued by ExtendBuffer past one message's descriptors), and every later
// range inside it reuses that registration; a range past its end (the allocator mapped more
// pages) extends it in place. So a tensor of any size inside a segment is one (buffer, offset),
// and in steady state registering costs no export and no message. Each page keeps its identity:
// a range over a page remapped since becomes a new registration of the run, and the old one is
// retired as above.
//
// Thread-safe. Lock order: the registry never holds its own lock while it calls `register_fn`
// (which takes the session's locks). ReleaseWaiters() takes no lock at all: a thread may hold the
// registry's or the session's lock while it is stuck in a runtime call behind one of the very
// waits it releases (a launch into a full stream queue), so it runs before any lock is taken.
#ifndef TIER_CLIENT_DEVICE_REGISTRY_H_
#define TIER_CLIENT_DEVICE_REGISTRY_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#include <tuple>
#include <unordered_map>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/gpu/client_gpu.h"
#include "client/gpu/device_memory.h"
#include "client/gpu/vmm_segment.h"
#include "client/registration_holds.h"
#include "tier/session_wire.h"

namespace tier::client {

// The session's jobs, for RegistrationHolds' rule 2: the newest job id pushed so far (0: none),
// and the oldest not yet complete (the next id when none is). Called without the registry's lock
// held. The defaults: no jobs.
struct RegistryJobMarks {
  absl::AnyInvocable<uint64_t() const> last_pushed = [] { return uint64_t{0}; };
  absl::AnyInvocable<uint64_t() const> oldest_pending = [] { return ~uint64_t{0}; };
};

class DeviceRegistry {
 public:
  // Registers a buffer with the daemon (the session's RegisterRaw); fd -1 when none.
  using RegisterFn = absl::AnyInvocable<absl::StatusOr<uint64_t>(const wire::RegisterBuffer&,
                                                                  absl::Span<const int> fds)>;
  // Drops a registration in the daemon (no wait for jobs: the daemon keeps the mapping until the
  // jobs that use it are done).
  using UnregisterFn = absl::AnyInvocable<absl::Status(uint64_t buffer_id)>;
  // Appends pages to a segment registration (the session's ExtendRaw); returns its size after.
  using ExtendFn = absl::AnyInvocable<absl::StatusOr<uint64_t>(const wire::ExtendBuffer&,
                                                                absl::Span<const int> fds)>;
  using JobMarks = RegistryJobMarks;
  // `tickets`: the session ring's ticket page (tier/ring.h). `memory`: the GPU runtime (a fake in
  // tests).
  DeviceRegistry(RegisterFn register_fn, UnregisterFn unregister_fn, ExtendFn extend_fn,
                 ring::TicketPage* tickets, JobMarks marks = {},
                 std::unique_ptr<gpu::DeviceMemory> memory = gpu::RuntimeDeviceMemory())
      : register_fn_(std::move(register_fn)), unregister_fn_(std::move(unregister_fn)),
        extend_fn_(std::move(extend_fn)), tickets_(tickets), marks_(std::move(marks)),
        memory_(std::move(memory)) {}
  DeviceRegistry(const DeviceRegistry&) = delete;
  DeviceRegistry& operator=(const DeviceRegistry&) = delete;

  // A caller's hold on a registration: while it lives, the registration stays registered in the
  // daemon (RegistrationHolds). Keep it until the job naming the buffer is on the ring.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }
    void Release();

   private:
    friend class DeviceRegistry;
    Lease(DeviceRegistry* registry, uint64_t id) : registry_(registry), id_(id) {}
    DeviceRegistry* registry_ = nullptr;
    uint64_t id_ = 0;
  };

  struct Registered {
    uint64_t buffer_id = 0;
    uint64_t offset = 0;  // the pointer's offset in the allocation
    uint64_t bytes = 0;   // the allocation's size
    int device = -1;
    Lease lease;
  };
  // len > 0: the range must lie in the buffer (see gpu::ExportDeviceRange). Also drops, in the
  // daemon, retired registrations that became due.
  absl::StatusOr<Registered> Register(const void* device_ptr, uint64_t len = 0);
  // The C ABI hands the id out: the lease becomes a use owed by the caller, paid by the first job
  // naming the id (Paid).
  void Owe(Lease lease);
  // Job `job`, just pushed, names `buffer_id`.
  void Paid(uint64_t buffer_id, uint64_t job);
  // Leases and owed uses of `buffer_id` (tests, diagnostics).
  uint64_t holders(uint64_t buffer_id) const;

  // What registering cost so far: registrations sent (device buffers; the ticket slots not
  // counted), extensions sent, and allocations (VMM: pages) exported for them. Flat across
  // training steps once every segment is registered.
  struct Counters {
    uint64_t registrations = 0;
    uint64_t extensions = 0;
    uint64_t exports = 0;
  };
  Counters counters() const;

  // The GPU (this process's ordinal) of a registered device buffer; -1 for any other buffer.
  int DeviceOf(uint64_t buffer_id) const;
  // The DeviceSync of `device`; null until a buffer of that GPU was registered.
  gpu::DeviceSync* Sync(int device) const;
  // The buffer was unregistered: drop it from the cache.
  void Forget(uint64_t buffer_id);
  // The daemon is gone: release every stream waiting on it (see gpu::DeviceSync::ReleaseWaiters).
  // Lock-free and free of runtime calls; call it again for a while after the death.
  void ReleaseWaiters();
  bool empty() const;

 private:
  absl::StatusOr<gpu::DeviceSync*> SyncFor(int device);

  RegisterFn register_fn_;
  UnregisterFn unregister_fn_;
  ExtendFn extend_fn_;
  ring::TicketPage* const tickets_;
  const JobMarks marks_;
  const std::unique_ptr<gpu::DeviceMemory> memory_;
  std::mutex create_mu_;  // serializes creating pages (held across register_fn_)
  mutable std::mutex mu_;
  // Declared before the pages: unregistered after the last DeviceSync is gone.
  std::unique_ptr<gpu::TicketPageRegistration> ticket_registration_;  // guarded by create_mu_
  std::map<int, std::unique_ptr<gpu::DeviceSync>> syncs_;
  // The same DeviceSyncs, published for ReleaseWaiters (which takes no lock); they live as long as
  // the registry.
  std::array<std::atomic<gpu::DeviceSync*>, ring::kMaxTicketDevices> released_{};
  // What a registration names: the address range and the physical allocations under it.
  struct Allocation {
    int device;
    uint64_t base;
    uint64_t bytes;
    std::array<uint8_t, 64> handle;  // the IPC handle, or the pages' sizes
    std::vector<uint64_t> ids;       // gpu::AllocationId of each page, in address order
    auto key() const { return std::tie(device, base, bytes, handle, ids); }
    bool operator<(const Allocation& other) const { return key() < other.key(); }
  };
  std::map<Allocation, uint64_t> by_allocation_;  // -> buffer id
  std::unordered_map<uint64_t, Allocation> by_buffer_;

  // Fast path: registered address ranges by start address, each with the identity
  // (gpu::AllocationId) of every page it covers. A pointer range inside one whose pages still
  // have those identities is the same memory: no export, no message.
  struct Range {
    uint64_t end = 0;
    uint64_t buffer_id = 0;
    int device = -1;
    std::vector<std::pair<uint64_t, uint64_t>> pages;  // (start address, allocation id)
    // Segments: every page's size (pages[i] starts at base + i * page_bytes), and the client's
    // reservation they lie in (how far the segment may grow). 0 for other registrations.
    uint64_t page_bytes = 0;
    uint64_t reservation_base = 0;
    uint64_t reservation_end = 0;
  };
  // A segment registration whose pages under a range are still the same but that ends before the
  // range does: extending it registers the range.
  struct Growth {
    uint64_t base = 0;
    uint64_t buffer_id = 0;
  };
  // A cached registration holding [ptr, +len) whose memory is still the same; a range found whose
  // memory changed is dropped from the cache and its buffer id added to *stale; a segment that
  // holds the start of the range but not its end is named in *growth.
  std::optional<Registered> FindCachedLocked(uint64_t ptr, uint64_t len,
                                             std::vector<uint64_t>* stale,
                                             std::optional<Growth>* growth);
  // Extends `growth`'s segment by the pages mapped after it; the registration of [ptr, +len) if
  // they reach that far, nullopt if not (or the segment is gone; then register anew).
  std::optional<Registered> Grow(const Growth& growth, uint64_t ptr, uint64_t len);
  // Registers the run of VMM pages around `page` (exported, with `page_id`) as one segment; the
  // registration of [ptr, +len), or nullopt when the range leaves the run (or tierd does not
  // know segments): then register it as pages.
  absl::StatusOr<std::optional<Registered>> RegisterSegment(gpu::DeviceAllocation page,
                                                            uint64_t page_id, uint64_t ptr,
                                                            uint64_t len);
  // Sends `fds` (pages of `page_bytes`) to segment `id` from `offset` on, in messages of at most
  // wire::kMaxSegmentPagesPerMessage.
  absl::Status ExtendSegment(uint64_t id, uint64_t offset, uint64_t page_bytes,
                             const std::vector<UniqueFd>& fds, size_t from);
  // Registers [ptr, +len) as before segments: the allocation, or up to wire::kMaxVmmPages pages.
  absl::StatusOr<Registered> RegisterPages(gpu::DeviceAllocation first, const void* device_ptr,
                                           uint64_t len);
  // Removes `buffer_id` from the cache only.
  void UncacheLocked(uint64_t buffer_id);
  void Release(uint64_t buffer_id);
  // Retires `stale` ids and unregisters, in the daemon, those RegistrationHolds finds due.
  void Retire(const std::vector<uint64_t>& stale);
  void DropDue();
  std::map<uint64_t, Range> ranges_;
  RegistrationHolds holds_;  // guarded by mu_
  // Serializes growing segments (held across export and the round trip; never under mu_), so
  // that two threads do not both append pages at one segment's end.
  std::mutex grow_mu_;
  std::atomic<bool> segments_refused_{false};  // tierd does not know kCudaVmmSegment
  std::atomic<uint64_t> registrations_{0};
  std::atomic<uint64_t> extensions_{0};
  std::atomic<uint64_t> exports_{0};
};

}  // namespace tier::client

#endif  // TIER_CLIENT_DEVICE_REGISTRY_H_
