#include "gpu/stream_engine.h"

#include "gpu/memfd_mapping.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gpu/client_gpu.h"

namespace tier::gpu {
namespace {

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// The host words of one lane, in pinned host memory every GPU can address. The stream writes
// `completed` and `reached`; the engine writes `gate` (on its own cache line).
struct alignas(64) LaneWords {
  uint64_t completed;  // seq of the last job the stream finished
  uint64_t reached;    // delay injection: seq of the last job that passed its ticket wait
  uint64_t pad0[6];
  uint64_t gate;       // delay injection: jobs up to this seq may copy
  uint64_t pad1[7];
};
static_assert(sizeof(LaneWords) == 128);
constexpr uint64_t kCompletedOffset = offsetof(LaneWords, completed);
constexpr uint64_t kReachedOffset = offsetof(LaneWords, reached);
constexpr uint64_t kGateOffset = offsetof(LaneWords, gate);

uint64_t LoadWord(uint64_t& word) {
  return std::atomic_ref<uint64_t>(word).load(std::memory_order_acquire);
}
void StoreWord(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
}

// Hands out LaneWords slots from mapped host blocks (a cudaHostAlloc per lane would cost far more
// than the lane). Blocks live as long as the engine.
class HostWordPool {
 public:
  struct Slot {
    LaneWords* host = nullptr;
    uint64_t device_addr = 0;
  };

  explicit HostWordPool(GpuRuntime& runtime) : runtime_(runtime) {}
  ~HostWordPool() {
    for (void* block : blocks_) runtime_.FreeMappedHost(block);
  }

  absl::StatusOr<Slot> Take() {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      absl::StatusOr<MappedHost> block = runtime_.AllocMappedHost(kBlockBytes);
      if (!block.ok()) return block.status();
      blocks_.push_back(block->host);
      for (uint64_t off = 0; off < kBlockBytes; off += sizeof(LaneWords)) {
        free_.push_back(Slot{reinterpret_cast<LaneWords*>(static_cast<char*>(block->host) + off),
                             block->device_addr + off});
      }
    }
    Slot slot = free_.back();
    free_.pop_back();
    new (slot.host) LaneWords{};  // zero: no job done, gate closed
    return slot;
  }

  void Give(Slot slot) {
    std::lock_guard lock(mu_);
    free_.push_back(slot);
  }

 private:
  static constexpr uint64_t kBlockBytes = 64 * 1024;
  GpuRuntime& runtime_;
  std::mutex mu_;
  std::vector<void*> blocks_;
  std::vector<Slot> free_;
};

struct PendingJob {
  uint64_t seq = 0;
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::Status status;       // a failure found while queueing, reported when the stream passes it
  char* pool_write = nullptr;  // kToPool: key of the engine's pool-write entry, dropped at the end
  // A fed reload (CopyJob::feed): the feed, and the host word its chunks wait on (`gate` of a
  // LaneWords slot: the number of chunks in place), returned when the job is done.
  std::shared_ptr<SourceFeed> feed;
  std::optional<HostWordPool::Slot> feed_word;
};

struct FailedJob {
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::Status status;
};

// One direction of one session on one GPU: its own stream, its jobs in order.
struct Lane {
  Lane(GpuRuntime& runtime, HostWordPool& pool, int device, Direction direction, GpuStream stream,
       HostWordPool::Slot words)
      : runtime(runtime), pool(pool), device(device), direction(direction), stream(stream),
        words(words) {}
  ~Lane() {
    runtime.DestroyStream(device, stream);
    pool.Give(words);
  }
  uint64_t completed_addr() const { return words.device_addr + kCompletedOffset; }

  GpuRuntime& runtime;
  HostWordPool& pool;
  const int device;
  const Direction direction;
  const GpuStream stream;
  const HostWordPool::Slot words;

  std::mutex mu;
  // The semaphore page's counters this lane waits on and signals (0 until the page registers).
  uint64_t ready_addr = 0;  // produced (D2H) or reload_ready (H2D)
  uint64_t done_addr = 0;   // offload_done (D2H) or reload_done (H2D)
  uint64_t next_seq = 1;
  uint64_t next_ticket = 1;
  std::map<uint64_t, CopyJob> held;  // tickets waiting for a smaller one to arrive
  std::deque<PendingJob> pending;    // queued on the stream, in seq order
  bool abandoned = false;

  bool in_active = false;  // guarded by the engine's mu_

  uint64_t progress_ns = 0;  // last completion, or when the first pending job was queued

  // Poller thread only.
  uint64_t delay_seq = 0;
  uint64_t delay_since_ns = 0;
  bool warned_idle = false;
};

struct DeviceLanes {
  std::shared_ptr<Lane> lanes[2];  // [0] kToPool, [1] kFromPool
  std::shared_ptr<DeviceMapping> semaphores;
};

int LaneIndex(Direction direction) { return direction == Direction::kToPool ? 0 : 1; }

struct SessionState {
  explicit SessionState(uint64_t id) : id(id) {}
  const uint64_t id;
  std::atomic<bool> abandoned{false};
  std::mutex mu;
  struct Range {
    uintptr_t end = 0;
    int device = -1;
    int refs = 0;
    bool host = false;  // a client's host memory (ImportHost)
  };
  std::map<uintptr_t, Range> ranges;  // imported buffers by base address
  std::map<int, DeviceLanes> devices;

  // The device holding [addr, addr + len), or -1; *host: whether it is a client's host memory.
  int FindDevice(const char* addr, uint64_t len, bool* host) {
    std::lock_guard lock(mu);
    auto p = reinterpret_cast<uintptr_t>(addr);
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return -1;
    --it;
    if (p < it->first || p >= it->second.end || len > it->second.end - p) return -1;
    *host = it->second.host;
    return it->second.device;
  }

  // For a ticket-only job without memory: the only GPU with a semaphore page, or -1.
  int OnlySemaphoreDevice() {
    std::lock_guard lock(mu);
    int found = -1;
    for (auto& [device, lanes] : devices) {
      if (lanes.semaphores == nullptr) continue;
      if (found >= 0) return -1;
      found = device;
    }
    return found;
  }
};

class GpuSession final : public EngineSession {
 public:
  explicit GpuSession(std::shared_ptr<SessionState> state) : state_(std::move(state)) {}
  SessionState& state() { return *state_; }
  const std::shared_ptr<SessionState>& shared() { return state_; }

 private:
  std::shared_ptr<SessionState> state_;
};

// A client buffer: its mapping and its entry in the session's range map.
class GpuBuffer final : public ImportedBuffer {
 public:
  GpuBuffer(std::unique_ptr<DeviceMapping> mapping, std::shared_ptr<SessionState> session)
      : mapping_(std::move(mapping)), session_(std::move(session)) {}
  ~GpuBuffer() override {
    {
      std::lock_guard lock(session_->mu);
      auto it = session_->ranges.find(reinterpret_cast<uintptr_t>(mapping_->base()));
      if (it != session_->ranges.end() && --it->second.refs == 0) session_->ranges.erase(it);
    }
    mapping_.reset();  // unmaps
  }
  char* base() const override { return mapping_->base(); }
  uint64_t bytes() const override { return mapping_->bytes(); }
  int device() const override { return mapping_->device(); }

 private:
  std::unique_ptr<DeviceMapping> mapping_;
  std::shared_ptr<SessionState> session_;
};

// The semaphore page as the daemon's session sees it: zero bytes, so no job can name it. The
// page itself stays mapped (held by the session's lanes) until the session is gone.
class SemaphoreBuffer final : public ImportedBuffer {
 public:
  SemaphoreBuffer(char* base, int device) : base_(base), device_(device) {}
  char* base() const override { return base_; }
  uint64_t bytes() const override { return 0; }
  int device() const override { return device_; }

 private:
  char* base_;
  int device_;
};

// Writing kReleasedTicket into a page's client -> daemon counters after the client died, from a
// fresh stream. A fresh stream can share a hardware queue with a stream that is blocked on a
// wait the dead client will never satisfy; then the write sits behind it, so after a while the
// poller tries again from another fresh stream (the runtime spreads streams over its queues).
struct Release {
  int device = -1;
  std::shared_ptr<DeviceMapping> page;  // kept mapped until every release stream finished
  std::vector<uint64_t> addrs;
  std::vector<GpuStream> streams;
  uint64_t last_try_ns = 0;
  int tries = 0;
  bool landed = false;
};

constexpr int kMaxReleaseTries = 8;
constexpr uint64_t kReleaseRetryNs = 200 * 1000 * 1000;

// A registered (pinned) client memfd, unpinned and unmapped on destruction.
class HostMapping final : public DeviceMapping {
 public:
  HostMapping(GpuRuntime& runtime, std::unique_ptr<MemfdMapping> mapping, int device)
      : runtime_(runtime), mapping_(std::move(mapping)), device_(device) {}
  ~HostMapping() override { runtime_.UnregisterHost(mapping_->base()); }
  char* base() const override { return mapping_->base(); }
  uint64_t bytes() const override { return mapping_->bytes(); }
  int device() const override { return device_; }

 private:
  GpuRuntime& runtime_;
  std::unique_ptr<MemfdMapping> mapping_;
  int device_;
};

class StreamEngine final : public CopyEngine {
 public:
  StreamEngine(std::unique_ptr<GpuRuntime> runtime, const GpuEngineOptions& options)
      : runtime_(std::move(runtime)), options_(options), words_(*runtime_),
        poller_([this] { PollLoop(); }) {}

  ~StreamEngine() override {
    Shutdown();
    // Let semaphore releases land before their pages are unmapped (bounded: a release that
    // cannot land is logged by the poller and its page leaked rather than unmapped under it).
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard lock(mu_);
        if (releases_.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    {
      std::lock_guard lock(mu_);
      stop_poller_ = true;
    }
    cv_.notify_all();
    poller_.join();
    if (pool_base_ != nullptr) runtime_->UnregisterHost(pool_base_);
  }

  absl::string_view name() const override { return runtime_->name(); }

  absl::Status RegisterPool(char* base, uint64_t bytes) override {
    if (pool_base_ != nullptr) return absl::FailedPreconditionError("host pool already registered");
    if (absl::Status s = runtime_->RegisterHost(base, bytes); !s.ok()) return s;
    pool_base_ = base;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<EngineSession>> OpenSession(uint64_t session_id) override {
    auto state = std::make_shared<SessionState>(session_id);
    std::lock_guard lock(mu_);
    if (stopping_) return absl::UnavailableError("copy engine is shut down");
    std::erase_if(sessions_, [](const std::weak_ptr<SessionState>& s) { return s.expired(); });
    sessions_.push_back(state);
    return std::make_unique<GpuSession>(std::move(state));
  }

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(EngineSession* engine_session,
                                                         BufferImport import) override {
    auto* session = static_cast<GpuSession*>(engine_session);
    SessionState& state = session->state();
    if (state.abandoned.load()) return absl::FailedPreconditionError("session is ending");
    switch (import.kind) {
      case wire::BufferKind::kCudaIpc:
      case wire::BufferKind::kCudaVmmFd:
      case wire::BufferKind::kCudaVmmPages:
      case wire::BufferKind::kCudaSemaphores:
        break;
      case wire::BufferKind::kHostMemfd:
        return ImportHost(state, session, import);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unknown buffer kind ", static_cast<uint32_t>(import.kind)));
    }
    bool semaphores = import.kind == wire::BufferKind::kCudaSemaphores;
    if (semaphores && import.bytes < kSemaphorePageBytes) {
      return absl::InvalidArgumentError(absl::StrCat("semaphore page of ", import.bytes,
                                                     " bytes; it must hold ",
                                                     kSemaphorePageBytes));
    }
    absl::StatusOr<std::unique_ptr<DeviceMapping>> mapping = runtime_->Open(import);
    if (!mapping.ok()) return mapping.status();
    int device = (*mapping)->device();
    // Both lanes of the GPU now, so that Submit rarely creates a stream.
    for (Direction direction : {Direction::kToPool, Direction::kFromPool}) {
      absl::StatusOr<std::shared_ptr<Lane>> lane = GetLane(state, device, direction);
      if (!lane.ok()) return lane.status();
    }
    if (semaphores) return AttachSemaphores(state, std::move(*mapping));

    char* base = (*mapping)->base();
    {
      std::lock_guard lock(state.mu);
      SessionState::Range& range = state.ranges[reinterpret_cast<uintptr_t>(base)];
      range.end = reinterpret_cast<uintptr_t>(base) + (*mapping)->bytes();
      range.device = device;
      ++range.refs;
    }
    return std::make_unique<GpuBuffer>(std::move(*mapping), session->shared());
  }

  bool orders_pool_reads() const override { return true; }

  // A client's host memory (CPU tensors, the demo): mapped, pinned for the GPUs (portable), and
  // copied by GPU 0's lanes like device memory. Jobs on it carry no tickets.
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> ImportHost(SessionState& state,
                                                             GpuSession* session,
                                                             BufferImport& import) {
    absl::StatusOr<std::unique_ptr<MemfdMapping>> mapped =
        MemfdMapping::Map(import.fd, import.bytes);
    if (!mapped.ok()) return mapped.status();
    if (absl::Status s = runtime_->RegisterHost((*mapped)->base(), (*mapped)->bytes()); !s.ok()) {
      return s;
    }
    constexpr int kDevice = 0;
    for (Direction direction : {Direction::kToPool, Direction::kFromPool}) {
      absl::StatusOr<std::shared_ptr<Lane>> lane = GetLane(state, kDevice, direction);
      if (!lane.ok()) {
        runtime_->UnregisterHost((*mapped)->base());
        return lane.status();
      }
    }
    auto mapping = std::make_unique<HostMapping>(*runtime_, *std::move(mapped), kDevice);
    char* base = mapping->base();
    {
      std::lock_guard lock(state.mu);
      SessionState::Range& range = state.ranges[reinterpret_cast<uintptr_t>(base)];
      range.end = reinterpret_cast<uintptr_t>(base) + mapping->bytes();
      range.device = kDevice;
      range.host = true;
      ++range.refs;
    }
    return std::make_unique<GpuBuffer>(std::move(mapping), session->shared());
  }

  void Submit(CopyJob job) override {
    auto* session = static_cast<GpuSession*>(job.session);
    SessionState& state = session->state();
    {
      std::lock_guard lock(mu_);
      if (stopping_) {
        std::move(job.done)(absl::UnavailableError("copy engine is shut down"));
        return;
      }
    }
    if (state.abandoned.load()) {
      std::move(job.done)(absl::CancelledError("session is ending"));
      return;
    }
    int device = job.device;
    bool host = false;  // host-to-host: copied by the runtime's host-function thread
    if (job.client != nullptr) {
      int found = state.FindDevice(job.client, job.len, &host);
      if (device < 0) device = found;
    } else if (device < 0) {
      device = state.OnlySemaphoreDevice();
    }
    if (device < 0) {
      std::move(job.done)(absl::InvalidArgumentError(
          job.client != nullptr
              ? "job memory lies in no GPU buffer of this session"
              : "ticket-only job names no GPU and the session has not exactly one semaphore page"));
      return;
    }
    if (job.sync >= kMaxTicket) {
      std::move(job.done)(
          absl::InvalidArgumentError(absl::StrCat("ticket ", job.sync, " is out of range")));
      return;
    }
    absl::StatusOr<std::shared_ptr<Lane>> found = GetLane(state, device, job.direction);
    if (!found.ok()) {
      std::move(job.done)(found.status());
      return;
    }
    Lane& lane = **found;
    std::vector<FailedJob> failed;
    {
      std::lock_guard lock(lane.mu);
      if (lane.abandoned) {
        failed.push_back({std::move(job.done), absl::CancelledError("session is ending")});
      } else if (job.sync == 0) {
        Issue(lane, job, failed, host);
      } else if (lane.ready_addr == 0) {
        failed.push_back({std::move(job.done),
                          absl::FailedPreconditionError(absl::StrCat(
                              "job carries ticket ", job.sync, " but the session registered no "
                              "semaphore page for GPU ", device))});
      } else if (job.sync < lane.next_ticket || lane.held.contains(job.sync)) {
        failed.push_back({std::move(job.done),
                          absl::InvalidArgumentError(absl::StrCat(
                              "ticket ", job.sync, " was already used on this GPU and direction"))});
      } else if (job.sync > lane.next_ticket) {
        // A smaller ticket has not arrived yet (the daemon may hold a job back, e.g. a reload of
        // an object still being filled). Issuing this one first would signal done = sync while
        // the smaller job has not copied, so it waits here, on the host, not on the GPU.
        lane.held.emplace(job.sync, std::move(job));
      } else {
        Issue(lane, job, failed);
        ++lane.next_ticket;
        while (!lane.held.empty() && lane.held.begin()->first == lane.next_ticket) {
          Issue(lane, lane.held.begin()->second, failed);
          lane.held.erase(lane.held.begin());
          ++lane.next_ticket;
        }
      }
    }
    for (FailedJob& f : failed) std::move(f.done)(std::move(f.status));
    Activate(*found);
  }

  void AbandonSession(EngineSession* engine_session) override {
    SessionState& state = static_cast<GpuSession*>(engine_session)->state();
    if (state.abandoned.exchange(true)) return;
    std::vector<std::shared_ptr<Lane>> lanes;
    std::vector<std::pair<int, std::shared_ptr<DeviceMapping>>> pages;
    {
      std::lock_guard lock(state.mu);
      for (auto& [device, d] : state.devices) {
        for (auto& lane : d.lanes) {
          if (lane != nullptr) lanes.push_back(lane);
        }
        if (d.semaphores != nullptr) pages.emplace_back(device, d.semaphores);
      }
    }
    std::vector<FailedJob> failed;
    for (auto& lane : lanes) {
      std::lock_guard lock(lane->mu);
      lane->abandoned = true;
      for (auto& [ticket, job] : lane->held) {
        failed.push_back({std::move(job.done),
                          absl::CancelledError(absl::StrCat(
                              "session ended while ticket ", ticket, " waited for ticket ",
                              lane->next_ticket))});
      }
      lane->held.clear();
      // Delay injection: let queued jobs copy now.
      StoreWord(lane->words.host->gate, kReleasedTicket);
    }
    // The client will not write its tickets any more: release the session's streams waiting on
    // produced / reload_ready. Their copies then run on memory of a process that may be gone;
    // its IPC mappings stay valid until we close them, which happens only after these jobs ended.
    for (auto& [device, page] : pages) {
      Release release;
      release.device = device;
      release.page = page;
      uint64_t base = reinterpret_cast<uint64_t>(page->base());
      release.addrs = {base + kProducedOffset, base + kReloadReadyOffset};
      TryRelease(release);
      {
        std::lock_guard lock(mu_);
        releases_.push_back(std::move(release));
      }
      cv_.notify_all();
    }
    for (FailedJob& f : failed) std::move(f.done)(std::move(f.status));
    for (auto& lane : lanes) Activate(lane);
  }

  void Shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    auto grace = std::chrono::milliseconds(options_.shutdown_grace_ms);
    if (WaitIdle(grace)) return;
    LogWarning(runtime_->name(), " engine: jobs still in flight after ",
               options_.shutdown_grace_ms, " ms; releasing every session's semaphores");
    std::vector<std::shared_ptr<SessionState>> sessions;
    {
      std::lock_guard lock(mu_);
      for (auto& weak : sessions_) {
        if (auto s = weak.lock()) sessions.push_back(std::move(s));
      }
    }
    for (auto& s : sessions) {
      GpuSession view(s);
      AbandonSession(&view);
    }
    if (WaitIdle(grace)) return;
    // Nothing more to wait for: fail what is left, so every callback runs once.
    std::vector<FailedJob> failed;
    {
      std::lock_guard lock(mu_);
      for (auto& lane : active_) {
        std::lock_guard lane_lock(lane->mu);
        for (PendingJob& p : lane->pending) {
          if (p.feed != nullptr) p.feed->Unsubscribe();
          failed.push_back({std::move(p.done),
                            absl::UnavailableError("copy engine shut down before the copy ended")});
        }
        lane->pending.clear();
      }
    }
    LogError(runtime_->name(), " engine: ", failed.size(), " jobs failed at shutdown");
    for (FailedJob& f : failed) std::move(f.done)(std::move(f.status));
  }

 private:
  absl::StatusOr<std::shared_ptr<Lane>> GetLane(SessionState& state, int device,
                                                Direction direction) {
    std::lock_guard lock(state.mu);
    DeviceLanes& d = state.devices[device];
    std::shared_ptr<Lane>& lane = d.lanes[LaneIndex(direction)];
    if (lane != nullptr) return lane;
    absl::StatusOr<GpuStream> stream = runtime_->CreateStream(device, /*high_priority=*/false);
    if (!stream.ok()) return stream.status();
    absl::StatusOr<HostWordPool::Slot> words = words_.Take();
    if (!words.ok()) {
      runtime_->DestroyStream(device, *stream);
      return words.status();
    }
    lane = std::make_shared<Lane>(*runtime_, words_, device, direction, *stream, *words);
    if (d.semaphores != nullptr) SetSemaphoreAddrs(*lane, *d.semaphores);
    return lane;
  }

  static void SetSemaphoreAddrs(Lane& lane, const DeviceMapping& page) {
    uint64_t base = reinterpret_cast<uint64_t>(page.base());
    std::lock_guard lock(lane.mu);
    bool d2h = lane.direction == Direction::kToPool;
    lane.ready_addr = base + (d2h ? kProducedOffset : kReloadReadyOffset);
    lane.done_addr = base + (d2h ? kOffloadDoneOffset : kReloadDoneOffset);
  }

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> AttachSemaphores(
      SessionState& state, std::unique_ptr<DeviceMapping> mapping) {
    int device = mapping->device();
    char* base = mapping->base();
    std::shared_ptr<DeviceMapping> page(std::move(mapping));
    std::lock_guard lock(state.mu);
    DeviceLanes& d = state.devices[device];
    if (d.semaphores != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("the session already registered a semaphore page for GPU ", device));
    }
    d.semaphores = page;
    for (auto& lane : d.lanes) SetSemaphoreAddrs(*lane, *page);
    return std::make_unique<SemaphoreBuffer>(base, device);
  }

  // Queues one job on its lane's stream. Called with lane.mu held, in ticket order. host: the
  // client memory is host memory (jobs on it carry no tickets, so never wait in `held`).
  void Issue(Lane& lane, CopyJob& job, std::vector<FailedJob>& failed, bool host = false) {
    GpuStream stream = lane.stream;
    uint64_t seq = lane.next_seq;
    bool copy = job.len > 0;
    absl::Status status = runtime_->SetDevice(lane.device);
    // The client's ticket: its producers (offload) or its consumer's allocation point (reload)
    // were enqueued on its ticket stream before it pushed this job, so the write this waits for
    // is already queued on the GPU (see the deadlock argument in gpu/client_gpu.h).
    if (status.ok() && job.sync != 0) status = runtime_->WaitValue64(stream, lane.ready_addr, job.sync);
    if (status.ok() && copy && options_.copy_delay_us > 0) {
      // Delay injection on the GPU: announce that the ticket wait passed, then wait for the gate
      // the poller opens copy_delay_us later. The copy thus starts late relative to the client's
      // producer/consumer work, whatever the host did meanwhile.
      status = runtime_->WriteValue64(stream, lane.words.device_addr + kReachedOffset, seq);
      if (status.ok()) {
        status = runtime_->WaitValue64(stream, lane.words.device_addr + kGateOffset, seq);
      }
    }
    char* pool_write = nullptr;
    std::optional<HostWordPool::Slot> feed_word;
    if (status.ok() && copy) {
      // A reload may read pool bytes an offload on another lane is still writing (the daemon may
      // submit the reload of an object right after its offload): wait for those copies on the
      // GPU. The writer's `completed` word only grows, and the writer's job was queued earlier.
      if (job.direction == Direction::kFromPool) status = WaitForPoolWrites(stream, job.pool, job.len);
      if (status.ok() && job.feed != nullptr && job.direction == Direction::kFromPool) {
        status = IssueFed(stream, job, host, &feed_word);
      } else if (status.ok()) {
        status = Copy(stream, job.direction, host, job.client, job.pool, job.len);
      }
      if (status.ok() && job.direction == Direction::kToPool) {
        pool_write = job.pool;
        std::lock_guard lock(pool_mu_);
        pool_writes_[job.pool] = PoolWrite{job.pool + job.len, lane.completed_addr(), seq};
      }
    }
    // Whatever failed above, the ticket is still signalled: the client's streams wait on it and
    // must not hang. The failure reaches the client through the job's completion.
    absl::Status signal;
    if (job.sync != 0) signal = runtime_->WriteValue64(stream, lane.done_addr, job.sync);
    absl::Status mark = runtime_->WriteValue64(stream, lane.completed_addr(), seq);
    if (!mark.ok()) {
      if (pool_write != nullptr) EndPoolWrite(pool_write, lane.completed_addr(), seq);
      // (A fed job's word stays taken: chunk waits may be queued on it on a broken stream.)
      if (job.feed != nullptr) job.feed->Unsubscribe();
      failed.push_back({std::move(job.done), status.ok() ? mark : status});
      return;
    }
    ++lane.next_seq;
    if (status.ok()) status = signal;
    if (lane.pending.empty()) lane.progress_ns = NowNs();  // the watchdog counts from here
    lane.pending.push_back(PendingJob{seq, std::move(job.done), std::move(status), pool_write,
                                      std::move(job.feed), feed_word});
  }

  // A reload whose pool bytes are still arriving: chunk i is copied after the feed's word reaches
  // i + 1 (the feed raises it as chunks land, and to the last chunk when it ends, with the bytes
  // it could not deliver zeroed), so the NVMe read and the copy to the GPU overlap.
  absl::Status Copy(GpuStream stream, Direction direction, bool host, char* client, char* pool,
                    uint64_t len) {
    if (!host) return runtime_->CopyAsync(stream, direction, client, pool, len);
    return direction == Direction::kToPool ? runtime_->HostCopyAsync(stream, pool, client, len)
                                           : runtime_->HostCopyAsync(stream, client, pool, len);
  }

  absl::Status IssueFed(GpuStream stream, CopyJob& job, bool host_memory,
                        std::optional<HostWordPool::Slot>* word) {
    absl::StatusOr<HostWordPool::Slot> slot = words_.Take();
    if (!slot.ok()) return slot.status();
    *word = *slot;
    LaneWords* host = slot->host;
    const uint64_t chunks = job.feed->chunks();
    // Subscribed before any wait is queued, so every wait queued is eventually released.
    std::shared_ptr<SourceFeed> feed = job.feed;
    feed->Subscribe([host, chunks, raw = feed.get()](uint64_t ready, bool ended,
                                                     const absl::Status&) {
      StoreWord(host->gate, ended ? chunks : raw->ChunksIn(ready));
    });
    const uint64_t chunk = feed->chunk_bytes();
    for (uint64_t i = 0; i < chunks; ++i) {
      uint64_t off = i * chunk;
      uint64_t n = std::min(chunk, job.len - off);
      absl::Status s = runtime_->WaitValue64(stream, slot->device_addr + kGateOffset, i + 1);
      if (s.ok()) {
        s = Copy(stream, job.direction, host_memory, job.client + off, job.pool + off, n);
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // A finished job's fed-reload state: the word goes back, and a feed that ended in an error is
  // the job's result.
  void EndFed(PendingJob& p) {
    if (p.feed == nullptr) return;
    p.feed->Unsubscribe();
    if (p.feed_word) words_.Give(*p.feed_word);
    if (absl::Status fed = p.feed->status(); !fed.ok() && p.status.ok()) p.status = fed;
  }

  struct PoolWrite {
    char* end = nullptr;
    uint64_t completed_addr = 0;
    uint64_t seq = 0;
  };

  absl::Status WaitForPoolWrites(GpuStream stream, char* pool, uint64_t len) {
    std::vector<PoolWrite> writes;
    {
      std::lock_guard lock(pool_mu_);
      auto it = pool_writes_.upper_bound(pool);
      if (it != pool_writes_.begin()) {
        auto prev = std::prev(it);
        if (prev->second.end > pool) writes.push_back(prev->second);
      }
      for (; it != pool_writes_.end() && it->first < pool + len; ++it) writes.push_back(it->second);
    }
    for (const PoolWrite& w : writes) {
      if (absl::Status s = runtime_->WaitValue64(stream, w.completed_addr, w.seq); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  void EndPoolWrite(char* pool, uint64_t completed_addr, uint64_t seq) {
    std::lock_guard lock(pool_mu_);
    auto it = pool_writes_.find(pool);
    if (it != pool_writes_.end() && it->second.completed_addr == completed_addr &&
        it->second.seq == seq) {
      pool_writes_.erase(it);
    }
  }

  void Activate(const std::shared_ptr<Lane>& lane) {
    {
      std::lock_guard lock(mu_);
      if (lane->in_active) return;
      lane->in_active = true;
      active_.push_back(lane);
    }
    cv_.notify_all();
  }

  void TryRelease(Release& release) {
    release.last_try_ns = NowNs();
    ++release.tries;
    absl::StatusOr<GpuStream> stream = runtime_->CreateStream(release.device, /*high_priority=*/true);
    if (!stream.ok()) {
      LogError("releasing semaphores on GPU ", release.device, ": ", stream.status().message());
      return;
    }
    absl::Status status;
    for (uint64_t addr : release.addrs) {
      if (status.ok()) status = runtime_->WriteValue64(*stream, addr, kReleasedTicket);
    }
    if (!status.ok()) {
      LogError("releasing semaphores on GPU ", release.device, ": ", status.message());
    }
    release.streams.push_back(*stream);
  }

  // True once no lane has jobs on its stream.
  bool WaitIdle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return idle_cv_.wait_for(lock, timeout, [this] { return active_.empty(); });
  }

  void PollLoop() {
    uint64_t idle_since_ns = NowNs();
    uint64_t sleep_us = 1;
    for (;;) {
      std::vector<std::shared_ptr<Lane>> lanes;
      std::vector<Release> releases;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_poller_ || !active_.empty() || !releases_.empty(); });
        if (stop_poller_) {
          // Pages of releases that have not landed stay mapped for good (never unmapped under a
          // stream that may still write them).
          for (Release& r : releases_) new std::shared_ptr<DeviceMapping>(std::move(r.page));
          releases_.clear();
          return;
        }
        lanes = active_;
        releases.swap(releases_);
      }
      uint64_t now = NowNs();
      bool progress = false;
      for (auto& lane : lanes) progress |= PollLane(*lane, now);
      PollReleases(releases, now);
      {
        std::lock_guard lock(mu_);
        for (Release& r : releases) releases_.push_back(std::move(r));
        std::erase_if(active_, [](const std::shared_ptr<Lane>& lane) {
          std::lock_guard lane_lock(lane->mu);
          if (!lane->pending.empty()) return false;
          lane->in_active = false;
          return true;
        });
        if (active_.empty()) idle_cv_.notify_all();
      }
      lanes.clear();  // may destroy lanes of ended sessions (their streams) here
      // Spin right after progress (back-to-back small jobs complete microseconds apart), then
      // back off so a lane waiting for a slow producer does not burn a core.
      if (progress) {
        idle_since_ns = now;
        sleep_us = 1;
        continue;
      }
      if (now - idle_since_ns < uint64_t{options_.poll_spin_us} * 1000) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min<uint64_t>(sleep_us * 2, std::max<uint32_t>(options_.poll_max_sleep_us, 1));
    }
  }

  // Completes the lane's finished jobs; true if any.
  bool PollLane(Lane& lane, uint64_t now) {
    uint64_t completed = LoadWord(lane.words.host->completed);
    std::vector<PendingJob> finished;
    std::vector<PendingJob> broken;
    absl::Status broken_status;
    bool check_stream = false;
    uint64_t issued = 0;
    {
      std::lock_guard lock(lane.mu);
      while (!lane.pending.empty() && lane.pending.front().seq <= completed) {
        finished.push_back(std::move(lane.pending.front()));
        lane.pending.pop_front();
      }
      if (options_.copy_delay_us > 0) OpenGate(lane, now);
      if (!finished.empty() || lane.pending.empty()) {
        lane.progress_ns = now;
      } else if (now - lane.progress_ns > uint64_t{options_.watchdog_ms} * 1000000) {
        check_stream = true;
        issued = lane.next_seq - 1;
        lane.progress_ns = now;
      }
    }
    if (check_stream) {
      // No progress for a while: usually a client that has not written its ticket yet (nothing
      // wrong), but a failed stream never writes `completed`, so ask the runtime.
      absl::StatusOr<bool> done = runtime_->StreamDone(lane.device, lane.stream);
      if (!done.ok() || *done) {
        if (done.ok() && LoadWord(lane.words.host->completed) < issued && !lane.warned_idle) {
          lane.warned_idle = true;
          LogError(runtime_->name(), " engine: GPU ", lane.device,
                   " stream idle but its completion word did not move; completing by stream "
                   "query (slow path)");
        }
        std::lock_guard lock(lane.mu);
        while (!lane.pending.empty() && lane.pending.front().seq <= issued) {
          (done.ok() ? finished : broken).push_back(std::move(lane.pending.front()));
          lane.pending.pop_front();
        }
        if (!done.ok()) broken_status = done.status();
      }
    }
    for (PendingJob& p : finished) {
      if (p.pool_write != nullptr) EndPoolWrite(p.pool_write, lane.completed_addr(), p.seq);
      EndFed(p);
      std::move(p.done)(std::move(p.status));
    }
    for (PendingJob& p : broken) {
      if (p.pool_write != nullptr) EndPoolWrite(p.pool_write, lane.completed_addr(), p.seq);
      if (p.feed != nullptr) p.feed->Unsubscribe();  // (its word stays taken: the stream broke)
      std::move(p.done)(broken_status);
    }
    return !finished.empty() || !broken.empty();
  }

  // Delay injection: opens the gate for the job that passed its ticket wait copy_delay_us ago.
  // Called with lane.mu held. Jobs of a lane reach the gate one at a time (the stream is in
  // order), so one timer per lane suffices.
  void OpenGate(Lane& lane, uint64_t now) {
    uint64_t reached = LoadWord(lane.words.host->reached);
    uint64_t gate = LoadWord(lane.words.host->gate);
    if (reached <= gate) return;
    if (reached != lane.delay_seq) {
      lane.delay_seq = reached;
      lane.delay_since_ns = now;
    } else if (now - lane.delay_since_ns >= options_.copy_delay_us * 1000) {
      StoreWord(lane.words.host->gate, reached);
    }
  }

  void PollReleases(std::vector<Release>& releases, uint64_t now) {
    for (Release& r : releases) {
      std::erase_if(r.streams, [&](GpuStream stream) {
        absl::StatusOr<bool> done = runtime_->StreamDone(r.device, stream);
        if (done.ok() && !*done) return false;
        if (done.ok()) {
          r.landed = true;
        } else {
          LogError("semaphore release stream on GPU ", r.device, " failed: ",
                   done.status().message());
        }
        runtime_->DestroyStream(r.device, stream);
        return true;
      });
      if (!r.landed && r.tries < kMaxReleaseTries &&
          (r.streams.empty() || now - r.last_try_ns > kReleaseRetryNs)) {
        TryRelease(r);
      } else if (!r.landed && r.tries >= kMaxReleaseTries && r.streams.empty()) {
        LogError("could not release the semaphores of an ended session on GPU ", r.device,
                 "; its streams may stay blocked");
        r.landed = true;  // give up; nothing left queued on the page
      }
    }
    // A release is done when its write landed and no release stream can still touch the page.
    std::erase_if(releases, [](const Release& r) { return r.landed && r.streams.empty(); });
  }

  const std::unique_ptr<GpuRuntime> runtime_;
  const GpuEngineOptions options_;
  HostWordPool words_;
  char* pool_base_ = nullptr;

  std::mutex mu_;  // lock order: mu_ before any Lane::mu; never held while calling callbacks
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::vector<std::shared_ptr<Lane>> active_;  // lanes with jobs on their stream
  std::vector<Release> releases_;
  std::vector<std::weak_ptr<SessionState>> sessions_;
  bool stopping_ = false;
  bool stop_poller_ = false;

  std::mutex pool_mu_;  // taken under Lane::mu
  std::map<char*, PoolWrite> pool_writes_;  // queued copies into the pool, by start

  std::thread poller_;  // last: starts after everything above exists
};

}  // namespace

void HostCopyTask::Run(void* task) {
  auto* copy = static_cast<HostCopyTask*>(task);
  std::memcpy(copy->dst, copy->src, copy->len);
  delete copy;
}

std::unique_ptr<CopyEngine> MakeStreamEngine(std::unique_ptr<GpuRuntime> runtime,
                                             const GpuEngineOptions& options) {
  return std::make_unique<StreamEngine>(std::move(runtime), options);
}

}  // namespace tier::gpu
