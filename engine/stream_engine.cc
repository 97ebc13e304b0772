#include "engine/stream_engine.h"

#include <sys/prctl.h>

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
#include "engine/link_meter.h"
#include "engine/link_share.h"
#include "engine/memfd_mapping.h"
#include "gpu/ticket_protocol.h"
#include "engine/release_thread.h"
#include "common/thread_role.h"

namespace tier::engine {

using gpu::kMaxTicket;
using gpu::kReleasedTicket;
namespace {

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// The rule of stream_engine.h, checked where the engine calls the runtime. A violation is a bug
// in tierd: logged once per role and class (tests run the fake runtime, which fails on it).
void CheckCall(GpuCallClass call) {
  ThreadRole role = CurrentThreadRole();
  if (MayCall(role, call)) return;
  static std::atomic<uint32_t> warned{0};
  uint32_t bit = 1u << (static_cast<uint32_t>(role) * 3 + static_cast<uint32_t>(call));
  if ((warned.fetch_or(bit) & bit) == 0) {
    LogError("internal: a ", GpuCallClassName(call), " GPU runtime call on a ", ThreadRoleName(role),
             " thread (see engine/stream_engine.h)");
  }
}

// A lane's completion word, in pinned host memory every GPU can address: the stream writes the
// seq of each job it finished; the worker reads it (no runtime call).
struct alignas(64) LaneWord {
  uint64_t completed;
  uint64_t pad[7];
};
static_assert(sizeof(LaneWord) == 64);

uint64_t LoadWord(const uint64_t& word) {
  return std::atomic_ref<const uint64_t>(word).load(std::memory_order_acquire);
}

// Hands out LaneWord slots from mapped host blocks (a cudaHostAlloc per lane would cost far more
// than the lane). Blocks live as long as the engine.
class HostWordPool {
 public:
  struct Slot {
    LaneWord* host = nullptr;
    uint64_t device_addr = 0;
  };

  explicit HostWordPool(GpuRuntime& runtime) : runtime_(runtime) {}
  ~HostWordPool() {
    for (void* block : blocks_) runtime_.FreeMappedHost(block);
  }

  absl::StatusOr<Slot> Take() {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      CheckCall(GpuCallClass::kSetup);
      absl::StatusOr<MappedHost> block = runtime_.AllocMappedHost(kBlockBytes);
      if (!block.ok()) return block.status();
      blocks_.push_back(block->host);
      for (uint64_t off = 0; off < kBlockBytes; off += sizeof(LaneWord)) {
        free_.push_back(Slot{reinterpret_cast<LaneWord*>(static_cast<char*>(block->host) + off),
                             block->device_addr + off});
      }
    }
    Slot slot = free_.back();
    free_.pop_back();
    new (slot.host) LaneWord{};  // zero: no job done
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

// A fed reload's progress: chunks in place in the pool, raised by the feed's callback (on the
// spill I/O path) and read by the worker.
struct FeedProgress {
  std::atomic<uint64_t> ready_chunks{0};
};

// A GPU-side wait a job was issued behind: the writer lane's completion word reaching `seq`.
struct GpuWait {
  const uint64_t* word = nullptr;  // host view of the word
  uint64_t seq = 0;
};

// A job accepted on its lane, in ticket order, not yet (fully) issued.
struct QueuedJob {
  CopyJob job;
  bool host = false;             // host-to-host: copied by the runtime's host-function thread
  uint64_t pool_write = 0;       // kToPool: id of its entry in the engine's pool writes
  uint64_t writes_before = 0;    // kFromPool: newest pool write registered before it
  std::vector<GpuWait> gpu_waits;  // kFromPool: the pool writes it was ordered after
  uint64_t eligible_ns = 0;      // delay injection: when its ticket was first seen
  bool started = false;          // fed: its first chunk (and the pool waits) are issued
  uint64_t chunks_issued = 0;    // fed
  std::shared_ptr<FeedProgress> progress;  // fed
  uint64_t issued_bytes = 0;     // a plain copy issued in chunks (the lane's window): so far
  absl::Status status;           // a failure while issuing, reported at completion
  bool signal = true;            // writes done = sync after its copy (the last job of its ticket)
};

// The jobs of one ticket on a lane, until all of them arrived and every smaller ticket is queued.
struct HeldTicket {
  uint32_t expected = 1;  // the batch's size, as its first job said
  std::vector<QueuedJob> jobs;
};

// A job issued on the stream, waiting for its `completed` write; or a chunk of a job still being
// issued (no `done`: the job completes with its last chunk).
struct PendingJob {
  uint64_t seq = 0;
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::Status status;
  uint64_t pool_write = 0;  // kToPool: its entry in the engine's pool writes (0: none)
  char* pool = nullptr;
  std::shared_ptr<SourceFeed> feed;
  std::vector<GpuWait> gpu_waits;  // for diagnostics
  uint64_t issued_ns = 0;
  uint64_t window_bytes = 0;  // of the lane's window it holds until completed
};

// The GPU-side waits of a job not yet done, as "pool write seq S (word at V)"; "" for none.
std::string DescribeGpuWaits(const PendingJob& p) {
  std::string out;
  for (const GpuWait& w : p.gpu_waits) {
    uint64_t at = LoadWord(*w.word);
    if (at >= w.seq) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", "pool write seq ", w.seq, " (word at ", at, ")");
  }
  return out;
}

struct FailedJob {
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::Status status;
};

void RunFailed(std::vector<FailedJob>& failed) {
  for (FailedJob& f : failed) std::move(f.done)(std::move(f.status));
  failed.clear();
}

class StreamEngine;
class DeviceWorker;

// One GPU's link, both directions.
struct LinkMeters {
  LinkMeter d2h;
  LinkMeter h2d;
  LinkMeter& of(Direction d) { return d == Direction::kToPool ? d2h : h2d; }
};

// A session's ticket page registered with the runtime (mapped, for every GPU), so that the
// lanes' streams write its done counters. Held by the session's lanes; the last one to go
// unregisters it on the release thread (cudaHostUnregister waits for the device, so the done
// writes already queued land first) and only then lets the page be unmapped (`owner`).
struct TicketPagePin {
  char* base = nullptr;
  std::shared_ptr<const void> owner;
};

// One direction of one session on one GPU: its own stream, its jobs in ticket order.
struct Lane {
  Lane(GpuRuntime& runtime, HostWordPool& pool, std::shared_ptr<ReleaseThread> releaser,
       std::atomic<uint64_t>& live, DeviceWorker& worker, LinkMeter& meter, std::string label,
       uint32_t uid, int device, Direction direction, GpuStream stream, HostWordPool::Slot word)
      : runtime(runtime), pool(pool), releaser(std::move(releaser)), live(live), worker(worker),
        meter(meter), label(std::move(label)), uid(uid), device(device), direction(direction),
        stream(stream), word(word) {
    live.fetch_add(1);
  }
  ~Lane() {
    // Every job issued on the stream completed (a lane goes only when idle), so nothing will
    // write the word again; the stream is destroyed on the release thread.
    pool.Give(word);
    releaser->Post([&runtime = runtime, device = device, stream = stream, &live = live] {
      runtime.DestroyStream(device, stream);
      live.fetch_sub(1);
    });
  }
  uint64_t completed_addr() const { return word.device_addr + offsetof(LaneWord, completed); }
  const char* name() const { return direction == Direction::kToPool ? "D2H" : "H2D"; }

  GpuRuntime& runtime;
  HostWordPool& pool;
  const std::shared_ptr<ReleaseThread> releaser;
  std::atomic<uint64_t>& live;
  DeviceWorker& worker;     // the GPU's worker (lives as long as the engine)
  LinkMeter& meter;         // the GPU's link in this direction (lives as long as the engine)
  const std::string label;  // the session, for logs
  const uint32_t uid;       // the session's user: a uid's lanes share one window (LinkShare)
  const int device;
  const Direction direction;
  const GpuStream stream;
  const HostWordPool::Slot word;

  std::mutex mu;
  // The client's ticket counter of this lane in the session's ticket page (host memory, written
  // by the client's GPU stream, untrusted) and the done counter beside it (written by this
  // lane's stream, at done_addr as the GPU addresses it). Unset until the session bound its
  // ticket slot for this GPU (BufferKind kCudaSemaphores).
  const std::atomic<uint64_t>* ready = nullptr;
  uint64_t done_addr = 0;
  std::shared_ptr<TicketPagePin> ticket_pin;  // keeps done_addr registered
  uint64_t next_seq = 1;
  uint64_t next_ticket = 1;
  // Tickets not yet queued: a smaller ticket has not arrived, or not all jobs of the batch.
  std::map<uint64_t, HeldTicket> held;
  uint64_t held_jobs = 0;
  std::deque<QueuedJob> queue;       // accepted in ticket order, not yet issued
  // Copies issued by this pass of the worker and not yet given to the runtime (one
  // CopyBatchAsync per run of plain copies), and the seq of the first job among them.
  std::vector<GpuRuntime::CopyOp> staged;
  uint64_t staged_from_seq = 0;
  std::deque<PendingJob> pending;    // issued on the stream, in seq order
  uint64_t window_bytes = 0;         // plain copies issued and not completed (lane_window_bytes)
  // The window this pass: lane_window_bytes while another lane of the GPU and direction had
  // work in the last kShareMemoryNs (set by the worker), else 0 (no limit).
  uint64_t window_limit = 0;
  bool abandoned = false;
  uint64_t progress_ns = 0;    // last completion, or when the first pending job was issued
  uint64_t wait_since_ns = 0;  // when the head job began to wait for its ticket (0: not)
  uint64_t client_ticket = 0;  // the ticket counter as last read
  const char* blocked = "";    // what the head job waits for on the host (diagnostics)
  bool warned_wait = false;
  bool warned_stuck = false;
  bool warned_idle = false;
  std::atomic<bool> in_worker{false};  // in its worker's active list

  bool busy() const { return !queue.empty() || !pending.empty(); }
};

struct DeviceLanes {
  std::shared_ptr<Lane> lanes[2];  // [0] kToPool, [1] kFromPool
  bool slot_bound = false;         // the client bound its ticket slot for this GPU
};

int LaneIndex(Direction direction) { return direction == Direction::kToPool ? 0 : 1; }

struct SessionState {
  SessionState(const EngineSessionInfo& info) : id(info.id), label(info.label), uid(info.uid),
                                                tickets(info.tickets),
                                                tickets_owner(info.tickets_owner) {}
  const uint64_t id;
  const std::string label;
  const uint32_t uid;
  ring::TicketPage* const tickets;
  const std::shared_ptr<const void> tickets_owner;
  std::atomic<bool> abandoned{false};
  // The ticket page's registration, made by the first slot bound (registration only: never
  // taken by the job path, since registering is a setup call).
  std::mutex pin_mu;
  std::weak_ptr<TicketPagePin> ticket_pin;  // guarded by pin_mu
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

  // For a ticket-only job without memory: the only GPU with a bound ticket slot, or -1.
  int OnlySemaphoreDevice() {
    std::lock_guard lock(mu);
    int found = -1;
    for (auto& [device, lanes] : devices) {
      if (!lanes.slot_bound) continue;
      if (found >= 0) return -1;
      found = device;
    }
    return found;
  }

  std::shared_ptr<Lane> FindLane(int device, Direction direction) {
    std::lock_guard lock(mu);
    auto it = devices.find(device);
    return it == devices.end() ? nullptr : it->second.lanes[LaneIndex(direction)];
  }

  std::vector<std::shared_ptr<Lane>> AllLanes() {
    std::vector<std::shared_ptr<Lane>> all;
    std::lock_guard lock(mu);
    for (auto& [device, d] : devices) {
      for (auto& lane : d.lanes) {
        if (lane != nullptr) all.push_back(lane);
      }
    }
    return all;
  }
};

// A client buffer: its mapping and its entry in the session's range map. Its mapping is closed on
// the release thread.
class GpuBuffer final : public ImportedBuffer {
 public:
  GpuBuffer(std::unique_ptr<DeviceMapping> mapping, std::shared_ptr<SessionState> session,
            std::shared_ptr<ReleaseThread> releaser, std::atomic<uint64_t>& live)
      : mapping_(std::move(mapping)), session_(std::move(session)),
        releaser_(std::move(releaser)), live_(live) {
    live_.fetch_add(1);
  }
  ~GpuBuffer() override {
    {
      std::lock_guard lock(session_->mu);
      auto it = session_->ranges.find(reinterpret_cast<uintptr_t>(mapping_->base()));
      if (it != session_->ranges.end() && --it->second.refs == 0) session_->ranges.erase(it);
    }
    releaser_->Post([mapping = std::move(mapping_), &live = live_]() mutable {
      mapping.reset();  // closes the IPC handle / unmaps / unpins
      live.fetch_sub(1);
    });
  }
  char* base() const override { return mapping_->base(); }
  uint64_t bytes() const override { return mapping_->bytes(); }
  int device() const override { return mapping_->device(); }
  absl::Status Extend(BufferExtension& extension) override {
    if (absl::Status s = mapping_->Extend(extension); !s.ok()) return s;
    // The session's range map finds the GPU of a job's addresses: it covers the new pages before
    // the client learns of them (jobs on them come after the reply).
    std::lock_guard lock(session_->mu);
    auto it = session_->ranges.find(reinterpret_cast<uintptr_t>(mapping_->base()));
    if (it != session_->ranges.end()) {
      it->second.end = reinterpret_cast<uintptr_t>(mapping_->base()) + mapping_->bytes();
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<DeviceMapping> mapping_;
  std::shared_ptr<SessionState> session_;
  std::shared_ptr<ReleaseThread> releaser_;
  std::atomic<uint64_t>& live_;
};

// A bound ticket slot as the daemon's session sees it: zero bytes, so no job can name it. The
// ticket page stays registered (held by the session's lanes) until the session is gone.
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

// Copies queued into the pool (offloads), so that a reload of the same pool bytes is ordered
// after them on the GPU. Registered when the offload is accepted; the reload is issued only once
// every overlapping write is issued, and then waits on the GPU for the writer lane's `completed`
// word: a wait for a tierd copy already issued, the one kind of GPU wait the rule allows.
class PoolWrites {
 public:
  struct Write {
    char* end = nullptr;
    uint64_t id = 0;
    bool issued = false;
    uint64_t completed_addr = 0;
    const uint64_t* completed_host = nullptr;
    uint64_t seq = 0;
  };

  uint64_t Add(char* pool, uint64_t len) {
    std::lock_guard lock(mu_);
    uint64_t id = next_id_++;
    writes_.emplace(pool, Write{pool + len, id, false, 0, 0});
    return id;
  }
  // The id of the newest write registered so far: a reload is ordered after the writes up to it.
  uint64_t Newest() {
    std::lock_guard lock(mu_);
    return next_id_ - 1;
  }
  void Issued(uint64_t id, char* pool, uint64_t completed_addr, const uint64_t* completed_host,
              uint64_t seq) {
    std::lock_guard lock(mu_);
    for (auto it = writes_.lower_bound(pool); it != writes_.end() && it->first == pool; ++it) {
      if (it->second.id == id) {
        it->second.issued = true;
        it->second.completed_addr = completed_addr;
        it->second.completed_host = completed_host;
        it->second.seq = seq;
      }
    }
  }
  void End(uint64_t id, char* pool) {
    if (id == 0) return;
    std::lock_guard lock(mu_);
    for (auto it = writes_.lower_bound(pool); it != writes_.end() && it->first == pool; ++it) {
      if (it->second.id == id) {
        writes_.erase(it);
        return;
      }
    }
  }
  // The writes up to id `newest` overlapping [pool, +len); false if one of them is not issued
  // yet. (Pool extents in use are disjoint, so of the writes that start before `pool` only the
  // last can overlap.)
  bool Overlapping(char* pool, uint64_t len, uint64_t newest, std::vector<Write>* out) {
    std::lock_guard lock(mu_);
    out->clear();
    auto take = [&](const Write& w) {
      if (w.id > newest) return true;  // registered after the reload: not its business
      if (!w.issued) return false;
      out->push_back(w);
      return true;
    };
    auto it = writes_.lower_bound(pool);
    if (it != writes_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > pool && !take(prev->second)) return false;
    }
    for (; it != writes_.end() && it->first < pool + len; ++it) {
      if (!take(it->second)) return false;
    }
    return true;
  }

 private:
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::multimap<char*, Write> writes_;
};

// One GPU's worker: issues the jobs of that GPU's lanes as their tickets arrive, and completes
// them as their `completed` words move. Owns no lane; holds the busy ones. Its LinkShare says
// which lanes shared the GPU's link lately (engine/link_share.h); only its thread uses it.
class DeviceWorker {
 public:
  DeviceWorker(StreamEngine& engine, GpuRuntime& runtime, int device, uint32_t spin_us,
               uint32_t max_sleep_us)
      : engine_(engine), runtime_(runtime), device_(device), spin_us_(spin_us),
        max_sleep_us_(std::max<uint32_t>(max_sleep_us, 1)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~DeviceWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // The lane has work: look at it now.
  void Wake(const std::shared_ptr<Lane>& lane) {
    {
      std::lock_guard lock(mu_);
      if (std::find(active_.begin(), active_.end(), lane) == active_.end()) {
        active_.push_back(lane);
        lane->in_worker.store(true);
      }
      woken_.store(true);
    }
    cv_.notify_all();
  }
  // Something moved for a lane already active (a feed): look again soon. Takes no lock, so any
  // thread may call it holding anything; a lost wake-up costs at most one backoff sleep.
  void Poke() {
    woken_.store(true);
    cv_.notify_all();
  }

  bool Idle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return idle_cv_.wait_for(lock, timeout, [this] { return active_.empty(); });
  }

  std::vector<std::shared_ptr<Lane>> Active() {
    std::lock_guard lock(mu_);
    return active_;
  }

 private:
  void Run();

  StreamEngine& engine_;
  GpuRuntime& runtime_;
  const int device_;
  const uint32_t spin_us_;
  const uint32_t max_sleep_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::vector<std::shared_ptr<Lane>> active_;  // lanes with queued or issued jobs
  LinkShare share_;  // the worker thread's only
  std::atomic<bool> woken_{false};
  bool stop_ = false;
  std::thread thread_;
};

class GpuSession final : public EngineSession {
 public:
  GpuSession(StreamEngine& engine, std::shared_ptr<SessionState> state)
      : engine_(engine), state_(std::move(state)) {}
  ~GpuSession() override;
  SessionState& state() { return *state_; }
  const std::shared_ptr<SessionState>& shared() { return state_; }

 private:
  StreamEngine& engine_;
  std::shared_ptr<SessionState> state_;
};

class StreamEngine final : public CopyEngine {
 public:
  StreamEngine(std::unique_ptr<GpuRuntime> runtime, const GpuEngineOptions& options)
      : runtime_(std::move(runtime)), options_(options),
        releaser_(std::make_shared<ReleaseThread>()), words_(*runtime_) {}

  ~StreamEngine() override {
    Shutdown();
    {
      std::lock_guard lock(mu_);
      workers_.clear();  // joins the workers
    }
    if (pool_base_ != nullptr) {
      releaser_->Post([this] { runtime_->UnregisterHost(pool_base_); });
    }
    releaser_->Drain();
  }

  absl::string_view name() const override { return runtime_->name(); }
  bool orders_pool_reads() const override { return true; }

  absl::Status RegisterPool(char* base, uint64_t bytes) override {
    if (pool_base_ != nullptr) return absl::FailedPreconditionError("host pool already registered");
    if (absl::Status s = runtime_->RegisterHost(base, bytes); !s.ok()) return s;
    pool_base_ = base;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<EngineSession>> OpenSession(
      const EngineSessionInfo& info) override {
    auto state = std::make_shared<SessionState>(info);
    std::lock_guard lock(mu_);
    if (stopping_) return absl::UnavailableError("copy engine is shut down");
    std::erase_if(sessions_, [](const std::weak_ptr<SessionState>& s) { return s.expired(); });
    sessions_.push_back(state);
    return std::make_unique<GpuSession>(*this, std::move(state));
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
      case wire::BufferKind::kCudaVmmSegment:
        break;
      case wire::BufferKind::kCudaSemaphores:
        return BindTicketSlot(state, import);
      case wire::BufferKind::kHostMemfd:
        return ImportHost(state, session, import);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unknown buffer kind ", static_cast<uint32_t>(import.kind)));
    }
    CheckCall(GpuCallClass::kSetup);
    absl::StatusOr<std::unique_ptr<DeviceMapping>> mapping = runtime_->Open(import);
    if (!mapping.ok()) return mapping.status();
    int device = (*mapping)->device();
    // Both lanes of the GPU now, so that Submit never creates a stream.
    for (Direction direction : {Direction::kToPool, Direction::kFromPool}) {
      absl::Status s = EnsureLane(state, device, direction);
      if (!s.ok()) {
        Release(std::move(*mapping));
        return s;
      }
    }

    char* base = (*mapping)->base();
    {
      std::lock_guard lock(state.mu);
      SessionState::Range& range = state.ranges[reinterpret_cast<uintptr_t>(base)];
      range.end = reinterpret_cast<uintptr_t>(base) + (*mapping)->bytes();
      range.device = device;
      ++range.refs;
    }
    return std::make_unique<GpuBuffer>(std::move(*mapping), session->shared(), releaser_,
                                       live_buffers_);
  }

  // A client's host memory (CPU tensors, the demo): mapped, pinned for the GPUs (portable), and
  // copied by GPU 0's lanes like device memory. Jobs on it carry no tickets.
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> ImportHost(SessionState& state,
                                                             GpuSession* session,
                                                             BufferImport& import) {
    absl::StatusOr<std::unique_ptr<MemfdMapping>> mapped =
        MemfdMapping::Map(import.fd, import.bytes);
    if (!mapped.ok()) return mapped.status();
    CheckCall(GpuCallClass::kSetup);
    if (absl::Status s = runtime_->RegisterHost((*mapped)->base(), (*mapped)->bytes()); !s.ok()) {
      return s;
    }
    constexpr int kDevice = 0;
    auto mapping = std::make_unique<HostMapping>(*runtime_, *std::move(mapped), kDevice);
    for (Direction direction : {Direction::kToPool, Direction::kFromPool}) {
      absl::Status s = EnsureLane(state, kDevice, direction);
      if (!s.ok()) {
        Release(std::move(mapping));
        return s;
      }
    }
    char* base = mapping->base();
    {
      std::lock_guard lock(state.mu);
      SessionState::Range& range = state.ranges[reinterpret_cast<uintptr_t>(base)];
      range.end = reinterpret_cast<uintptr_t>(base) + mapping->bytes();
      range.device = kDevice;
      range.host = true;
      ++range.refs;
    }
    return std::make_unique<GpuBuffer>(std::move(mapping), session->shared(), releaser_,
                                       live_buffers_);
  }

  // Queues the job on its lane; never calls the runtime (the ring poller calls this).
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
    bool host = false;
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
              : "ticket-only job names no GPU and the session has not bound exactly one "
                "ticket slot"));
      return;
    }
    if (job.sync >= kMaxTicket) {
      std::move(job.done)(
          absl::InvalidArgumentError(absl::StrCat("ticket ", job.sync, " is out of range")));
      return;
    }
    std::shared_ptr<Lane> found = state.FindLane(device, job.direction);
    if (found == nullptr) {
      std::move(job.done)(absl::FailedPreconditionError(
          absl::StrCat("the session registered no memory on GPU ", device)));
      return;
    }
    Lane& lane = *found;
    std::vector<FailedJob> failed;
    {
      std::lock_guard lock(lane.mu);
      if (lane.abandoned) {
        failed.push_back({std::move(job.done), absl::CancelledError("session is ending")});
      } else if (job.sync == 0) {
        lane.queue.push_back(Accept(lane, std::move(job), host));
      } else if (lane.ready == nullptr) {
        failed.push_back({std::move(job.done),
                          absl::FailedPreconditionError(absl::StrCat(
                              "job carries ticket ", job.sync, " but the session bound no "
                              "ticket slot for GPU ", device))});
      } else {
        // Held on the host until every smaller ticket and every job of this one arrived (the
        // daemon may hold a job back, e.g. a reload of a spilled object): issuing it earlier
        // would signal done = sync while another job up to that ticket has not copied.
        HeldTicket* held = nullptr;
        if (job.sync >= lane.next_ticket) {
          auto [it, fresh] = lane.held.try_emplace(job.sync);
          if (fresh) it->second.expected = std::max<uint32_t>(job.batch_size, 1);
          held = &it->second;
        }
        if (held == nullptr || held->jobs.size() >= held->expected) {
          failed.push_back({std::move(job.done),
                            absl::InvalidArgumentError(absl::StrCat(
                                "ticket ", job.sync, " was already used on this GPU and direction",
                                held == nullptr ? "" : absl::StrCat(" by the ", held->expected,
                                                                    " jobs of its batch")))});
        } else {
          held->jobs.push_back(Accept(lane, std::move(job), host));
          ++lane.held_jobs;
          QueueArrived(lane);
        }
      }
    }
    RunFailed(failed);
    lane.worker.Wake(found);
  }

  void AbandonSession(EngineSession* engine_session) override {
    Abandon(static_cast<GpuSession*>(engine_session)->state());
  }

  void Abandon(SessionState& state) {
    if (state.abandoned.exchange(true)) return;
    std::vector<FailedJob> failed;
    std::vector<std::shared_ptr<Lane>> lanes = state.AllLanes();
    for (auto& lane : lanes) {
      std::lock_guard lock(lane->mu);
      lane->abandoned = true;  // the worker cancels what is queued; it reads no ticket any more
      for (auto& [ticket, held] : lane->held) {
        for (QueuedJob& q : held.jobs) {
          pool_writes_.End(q.pool_write, q.job.pool);
          if (q.job.feed != nullptr) q.job.feed->Unsubscribe();
          failed.push_back({std::move(q.job.done),
                            absl::CancelledError(absl::StrCat(
                                "session ended while ticket ", ticket, " waited for ticket ",
                                lane->next_ticket, " (", held.jobs.size(), " of its ",
                                held.expected, " jobs arrived)"))});
        }
      }
      lane->held.clear();
      lane->held_jobs = 0;
    }
    RunFailed(failed);
    for (auto& lane : lanes) lane->worker.Wake(lane);
  }

  void Shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    auto grace = std::chrono::milliseconds(options_.shutdown_grace_ms);
    if (WaitIdle(grace)) return;
    LogWarning(runtime_->name(), " engine: jobs still queued after ", options_.shutdown_grace_ms,
               " ms; cancelling what waits for a client");
    std::vector<std::shared_ptr<SessionState>> sessions;
    {
      std::lock_guard lock(mu_);
      for (auto& weak : sessions_) {
        if (auto s = weak.lock()) sessions.push_back(std::move(s));
      }
    }
    for (auto& s : sessions) Abandon(*s);
    if (WaitIdle(grace)) return;
    // Issued copies that never completed (a broken stream): fail them, so every callback runs.
    std::vector<FailedJob> failed;
    for (auto& worker : WorkersSnapshot()) {
      for (auto& lane : worker->Active()) {
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
    RunFailed(failed);
  }

  std::vector<LaneStatus> Lanes(EngineSession* engine_session) override {
    std::vector<LaneStatus> out;
    uint64_t now = NowNs();
    for (auto& lane : static_cast<GpuSession*>(engine_session)->state().AllLanes()) {
      std::lock_guard lock(lane->mu);
      LaneStatus s;
      s.device = lane->device;
      s.direction = lane->direction;
      s.queued = lane->queue.size();
      s.held = lane->held_jobs;
      s.in_flight = lane->pending.size();
      s.client_ticket = lane->client_ticket;
      if (!lane->queue.empty()) s.blocked_on = lane->blocked;
      s.active = lane->in_worker.load();
      s.completed_seq = LoadWord(lane->word.host->completed);
      s.issued_seq = lane->next_seq - 1;
      if (!lane->pending.empty()) {
        const PendingJob& oldest = lane->pending.front();
        s.oldest_in_flight_ms = (now - oldest.issued_ns) / 1000000;
        s.gpu_waits = DescribeGpuWaits(oldest);
      }
      if (lane->wait_since_ns != 0 && !lane->queue.empty()) {
        s.waiting_ticket = lane->queue.front().job.sync;
        s.waiting_ms = (now - lane->wait_since_ns) / 1000000;
      }
      out.push_back(s);
    }
    return out;
  }

  EngineCounts Counts() const override {
    EngineCounts c;
    c.buffers = live_buffers_.load();
    c.lanes = live_lanes_.load();
    c.pending_releases = releaser_->pending();
    return c;
  }

  std::vector<LinkRate> LinkRates() const override {
    std::vector<LinkRate> out;
    const uint64_t now = NowNs();
    std::lock_guard lock(mu_);
    for (const auto& [device, meters] : meters_) {
      LinkRate rate;
      rate.device = device;
      rate.d2h_bytes_per_s = meters->d2h.Current(now).bytes_per_s;
      rate.h2d_bytes_per_s = meters->h2d.Current(now).bytes_per_s;
      rate.d2h_bytes = meters->d2h.total_bytes();
      rate.h2d_bytes = meters->h2d.total_bytes();
      out.push_back(rate);
    }
    return out;
  }

  // ---- the device workers' side ----

  uint64_t UnticketedBehindClients() const override {
    std::vector<std::shared_ptr<SessionState>> sessions;
    {
      std::lock_guard lock(mu_);
      for (auto& weak : sessions_) {
        if (auto s = weak.lock()) sessions.push_back(std::move(s));
      }
    }
    uint64_t held = 0;
    for (auto& session : sessions) {
      for (auto& lane : session->AllLanes()) {
        std::lock_guard lock(lane->mu);
        if (lane->wait_since_ns == 0) continue;  // its head is not waiting for a client's ticket
        for (const QueuedJob& q : lane->queue) held += q.job.sync == 0 ? 1 : 0;
      }
    }
    return held;
  }

  // Lanes of `device` with work that their worker is not looking at. There should be none (Submit
  // wakes the worker); the worker checks now and then and logs any it finds.
  std::vector<std::shared_ptr<Lane>> StrandedLanes(int device) {
    std::vector<std::shared_ptr<SessionState>> sessions;
    {
      std::lock_guard lock(mu_);
      for (auto& weak : sessions_) {
        if (auto s = weak.lock()) sessions.push_back(std::move(s));
      }
    }
    std::vector<std::shared_ptr<Lane>> stranded;
    for (auto& session : sessions) {
      for (auto& lane : session->AllLanes()) {
        if (lane->device != device || lane->in_worker.load()) continue;
        std::lock_guard lock(lane->mu);
        if (lane->busy()) stranded.push_back(lane);
      }
    }
    return stranded;
  }

  // Issues what is ready on `lane` and completes what finished. True if anything moved; *busy:
  // whether the lane still has work.
  // `shared`: another lane of the GPU and direction has work (LinkShare): the window applies.
  // window: the lane's window this pass (0: none; DeviceWorker's LinkShare).
  bool Step(Lane& lane, uint64_t now, uint64_t window, bool* busy);
  uint64_t lane_window_bytes() const { return options_.lane_window_bytes; }

 private:
  friend class GpuSession;

  absl::Status EnsureLane(SessionState& state, int device, Direction direction) {
    {
      std::lock_guard lock(state.mu);
      if (state.devices[device].lanes[LaneIndex(direction)] != nullptr) return absl::OkStatus();
    }
    // Created outside the session's lock: the job path takes it.
    CheckCall(GpuCallClass::kSetup);
    absl::StatusOr<GpuStream> stream = runtime_->CreateStream(device, /*high_priority=*/false);
    if (!stream.ok()) return stream.status();
    absl::StatusOr<HostWordPool::Slot> word = words_.Take();
    if (!word.ok()) {
      releaser_->Post([this, device, s = *stream] { runtime_->DestroyStream(device, s); });
      return word.status();
    }
    auto lane = std::make_shared<Lane>(*runtime_, words_, releaser_, live_lanes_, Worker(device),
                                       Meters(device).of(direction), state.label, state.uid,
                                       device, direction, *stream, *word);
    std::lock_guard lock(state.mu);
    DeviceLanes& d = state.devices[device];
    std::shared_ptr<Lane>& slot = d.lanes[LaneIndex(direction)];
    if (slot == nullptr) slot = std::move(lane);  // else a concurrent import made it first
    return absl::OkStatus();
  }

  // The client binds its ticket slot for one of its GPUs (gpu/ticket_protocol.h): this GPU's
  // lanes then read that slot's tickets and write its done counters. The first slot bound
  // registers the session's ticket page with the runtime.
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> BindTicketSlot(SessionState& state,
                                                                 const BufferImport& import) {
    if (import.bytes != 0 || import.fd.valid()) {
      return absl::InvalidArgumentError(
          "a ticket slot (kCudaSemaphores) carries no memory: bytes must be 0 and no descriptor "
          "sent (a client of protocol 1 sends a semaphore page; use a client of this release)");
    }
    const int client_device = import.device;
    if (client_device < 0 || client_device >= ring::kMaxTicketDevices) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ticket slot for GPU ", client_device, ": tickets exist for GPUs 0 to ",
          ring::kMaxTicketDevices - 1, " of the client"));
    }
    if (state.tickets == nullptr) {
      return absl::FailedPreconditionError("the session has no ticket page");
    }
    CheckCall(GpuCallClass::kSetup);
    absl::StatusOr<int> device = runtime_->FindDevice(import);
    if (!device.ok()) return device.status();
    for (Direction direction : {Direction::kToPool, Direction::kFromPool}) {
      if (absl::Status s = EnsureLane(state, *device, direction); !s.ok()) return s;
    }
    absl::StatusOr<std::shared_ptr<TicketPagePin>> pin = PinTicketPage(state);
    if (!pin.ok()) return pin.status();
    absl::StatusOr<uint64_t> page = runtime_->HostDeviceAddress(*device, (*pin)->base);
    if (!page.ok()) return page.status();
    ring::TicketSlot& slot = state.tickets->slots[client_device];
    const auto offset_of = [&](const ring::TicketWord& word) {
      return static_cast<uint64_t>(reinterpret_cast<const char*>(&word) -
                                   reinterpret_cast<const char*>(state.tickets));
    };
    std::lock_guard lock(state.mu);
    DeviceLanes& d = state.devices[*device];
    if (d.slot_bound) {
      return absl::AlreadyExistsError(
          absl::StrCat("the session already bound a ticket slot for GPU ", *device));
    }
    d.slot_bound = true;
    for (auto& lane : d.lanes) {
      std::lock_guard lane_lock(lane->mu);
      bool d2h = lane->direction == Direction::kToPool;
      lane->ready = d2h ? &slot.produced.value : &slot.reload_ready.value;
      lane->done_addr = *page + offset_of(d2h ? slot.offload_done : slot.reload_done);
      lane->ticket_pin = *pin;
    }
    return std::make_unique<SemaphoreBuffer>(reinterpret_cast<char*>(&slot), *device);
  }

  // The session's ticket page registered with the runtime: once, by the first slot bound; kept
  // by the lanes that write it.
  absl::StatusOr<std::shared_ptr<TicketPagePin>> PinTicketPage(SessionState& state) {
    std::lock_guard lock(state.pin_mu);
    if (std::shared_ptr<TicketPagePin> pin = state.ticket_pin.lock()) return pin;
    char* base = reinterpret_cast<char*>(state.tickets);
    if (absl::Status s = runtime_->RegisterMappedHost(base, sizeof(ring::TicketPage)); !s.ok()) {
      return s;
    }
    std::shared_ptr<TicketPagePin> pin(
        new TicketPagePin{base, state.tickets_owner},
        [r = releaser_, &runtime = *runtime_](TicketPagePin* p) {
          r->Post([p, &runtime] {
            runtime.UnregisterHost(p->base);
            delete p;  // then the page may be unmapped
          });
        });
    state.ticket_pin = pin;
    return pin;
  }

  // Closes a mapping on the release thread.
  template <typename Mapping>
  void Release(Mapping mapping) {
    releaser_->Post([m = std::move(mapping)]() mutable { m.reset(); });
  }

  // Moves the tickets that are complete and next in order from `held` to the queue; the last job
  // of each ticket signals it. Called with lane.mu held.
  static void QueueArrived(Lane& lane) {
    while (!lane.held.empty()) {
      auto it = lane.held.begin();
      if (it->first != lane.next_ticket || it->second.jobs.size() < it->second.expected) return;
      std::vector<QueuedJob>& jobs = it->second.jobs;
      for (size_t i = 0; i < jobs.size(); ++i) {
        jobs[i].signal = i + 1 == jobs.size();
        lane.queue.push_back(std::move(jobs[i]));
      }
      lane.held_jobs -= jobs.size();
      lane.held.erase(it);
      ++lane.next_ticket;
    }
  }

  // A job accepted on its lane (queued or held), in the order the daemon submitted it: its place
  // among the pool writes is fixed now, so a reload submitted after an offload into the same
  // pool bytes is ordered after it even while either waits for a smaller ticket. Called with
  // lane.mu held.
  QueuedJob Accept(Lane& lane, CopyJob job, bool host) {
    QueuedJob q;
    q.host = host;
    if (job.direction == Direction::kToPool && job.len > 0) {
      q.pool_write = pool_writes_.Add(job.pool, job.len);
    } else if (job.direction == Direction::kFromPool) {
      q.writes_before = pool_writes_.Newest();
    }
    if (job.feed != nullptr && job.direction == Direction::kFromPool && job.len > 0) {
      auto progress = std::make_shared<FeedProgress>();
      const uint64_t chunks = job.feed->chunks();
      SourceFeed* raw = job.feed.get();
      DeviceWorker* worker = &lane.worker;
      // Subscribed now, so that no chunk is missed; the worker issues each chunk as it lands.
      // (Runs on the spill I/O path, under the feed's lock: no lock taken, no runtime call.)
      job.feed->Subscribe([progress, chunks, raw, worker](uint64_t ready, bool ended,
                                                          const absl::Status&) {
        progress->ready_chunks.store(ended ? chunks : raw->ChunksIn(ready));
        worker->Poke();
      });
      q.progress = std::move(progress);
    }
    q.job = std::move(job);
    return q;
  }

  LinkMeters& Meters(int device) {
    std::lock_guard lock(mu_);
    std::unique_ptr<LinkMeters>& m = meters_[device];
    if (m == nullptr) m = std::make_unique<LinkMeters>();
    return *m;
  }

  DeviceWorker& Worker(int device) {
    std::lock_guard lock(mu_);
    std::unique_ptr<DeviceWorker>& w = workers_[device];
    if (w == nullptr) {
      w = std::make_unique<DeviceWorker>(*this, *runtime_, device, options_.poll_spin_us,
                                         options_.poll_max_sleep_us);
    }
    return *w;
  }

  std::vector<DeviceWorker*> WorkersSnapshot() {
    std::vector<DeviceWorker*> out;
    std::lock_guard lock(mu_);
    for (auto& [device, w] : workers_) out.push_back(w.get());
    return out;
  }

  bool WaitIdle(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (DeviceWorker* w : WorkersSnapshot()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!w->Idle(std::max(left, std::chrono::milliseconds(0)))) return false;
    }
    return true;
  }

  bool IssueHead(Lane& lane, QueuedJob& q, uint64_t now);
  bool IssueChunks(Lane& lane, QueuedJob& q, uint64_t now);
  absl::Status MarkPiece(Lane& lane);
  absl::Status FlushStaged(Lane& lane);
  void MarkCompleted(Lane& lane, uint64_t first_seq, std::vector<FailedJob>& failed);
  bool Complete(Lane& lane, uint64_t now);
  absl::Status Copy(GpuStream stream, Direction direction, bool host, char* client, char* pool,
                    uint64_t len) {
    if (!host) return runtime_->CopyAsync(stream, direction, client, pool, len);
    return direction == Direction::kToPool ? runtime_->HostCopyAsync(stream, pool, client, len)
                                           : runtime_->HostCopyAsync(stream, client, pool, len);
  }

  const std::unique_ptr<GpuRuntime> runtime_;
  const GpuEngineOptions options_;
  const std::shared_ptr<ReleaseThread> releaser_;
  HostWordPool words_;
  PoolWrites pool_writes_;
  char* pool_base_ = nullptr;
  std::atomic<uint64_t> live_buffers_{0};
  std::atomic<uint64_t> live_lanes_{0};

  mutable std::mutex mu_;  // lock order: mu_, a DeviceWorker's, a Lane's; none held calling callbacks
  std::vector<std::weak_ptr<SessionState>> sessions_;
  std::map<int, std::unique_ptr<DeviceWorker>> workers_;
  // Each GPU's link, both directions, fed by its worker (Issue, Complete); made with the lanes.
  std::map<int, std::unique_ptr<LinkMeters>> meters_;
  bool stopping_ = false;
};

GpuSession::~GpuSession() { engine_.Abandon(*state_); }

// Issues the lane's head job if it is ready, or as much of it as is ready (fed reloads). True if
// the job was fully issued (then the caller pops it; its `completed` write comes at the end of
// the pass, MarkCompleted). A plain copy is staged, to go to the runtime with the copies of the
// jobs after it in one call; any other stream operation, and the ticket's done write, first
// flushes what is staged, so the stream runs them in job order. Called by the worker with lane.mu
// held.
bool StreamEngine::IssueHead(Lane& lane, QueuedJob& q, uint64_t now) {
  CopyJob& job = q.job;
  if (job.sync != 0) {
    // The client's ticket: its ticket stream raised it after the job's producers (offload) or
    // its consumer's allocation point (reload). Until it is here nothing is queued on the GPU.
    uint64_t seen = lane.ready->load(std::memory_order_acquire);
    lane.client_ticket = seen;
    if (seen < job.sync) {
      lane.blocked = "the client's ticket";
      if (lane.wait_since_ns == 0) lane.wait_since_ns = now;
      if (!lane.warned_wait &&
          now - lane.wait_since_ns > uint64_t{options_.lane_wait_warn_ms} * 1000000) {
        lane.warned_wait = true;
        LogWarning(lane.label, ": GPU ", lane.device, " ", lane.name(), " lane has waited ",
                   (now - lane.wait_since_ns) / 1000000, " ms for the client's ticket ", job.sync,
                   " (the client has reported tickets up to ", seen, "; ", lane.queue.size(),
                   " jobs queued behind it): the client's ",
                   lane.direction == Direction::kToPool ? "producer" : "consumer",
                   " stream has not reached the job's point yet, or the client stopped");
      }
      return false;
    }
    if (lane.wait_since_ns != 0 && lane.warned_wait) {
      LogInfo(lane.label, ": GPU ", lane.device, " ", lane.name(), " lane: ticket ", job.sync,
              " arrived after ", (now - lane.wait_since_ns) / 1000000, " ms");
    }
    lane.wait_since_ns = 0;
    lane.warned_wait = false;
  }
  const bool copy = job.len > 0;
  if (copy && options_.copy_delay_us > 0) {
    // Delay injection: the copy is issued copy_delay_us after its ticket arrived, late relative
    // to the client's producer/consumer work, whatever the host did meanwhile.
    if (q.eligible_ns == 0) q.eligible_ns = now;
    if (now - q.eligible_ns < options_.copy_delay_us * 1000) {
      lane.blocked = "delay injection";
      return false;
    }
  }
  GpuStream stream = lane.stream;
  bool staged = false;
  uint64_t window = 0;  // of the lane's window the job's pending entry holds
  auto flush = [&] {
    absl::Status flushed = FlushStaged(lane);
    if (!flushed.ok() && staged && q.status.ok()) q.status = flushed;
  };
  if (copy && !q.started) {
    if (job.direction == Direction::kFromPool) {
      // A reload may read pool bytes an offload is still writing (the daemon submits the reload
      // of an object right after its offload): issue it only after those copies are issued, and
      // order it after them on the GPU.
      std::vector<PoolWrites::Write> writes;
      if (!pool_writes_.Overlapping(job.pool, job.len, q.writes_before, &writes)) {
        lane.blocked = "an offload into the same pool bytes to be issued";
        return false;
      }
      if (!writes.empty()) flush();
      for (const PoolWrites::Write& w : writes) {
        if (q.status.ok()) q.status = runtime_->WaitValue64(stream, w.completed_addr, w.seq);
        q.gpu_waits.push_back(GpuWait{w.completed_host, w.seq});
      }
    }
    q.started = true;
  }
  if (copy && q.status.ok()) {
    if (q.progress != nullptr) {
      // Fed: chunk i goes once the feed has it in place (all of them once it ended; the bytes it
      // could not deliver are zeroed first). The lane's later jobs wait behind this one.
      flush();
      const uint64_t chunk = job.feed->chunk_bytes();
      const uint64_t chunks = job.feed->chunks();
      uint64_t ready = std::min(q.progress->ready_chunks.load(), chunks);
      while (q.chunks_issued < ready && q.status.ok()) {
        uint64_t off = q.chunks_issued * chunk;
        uint64_t n = std::min(chunk, job.len - off);
        q.status = Copy(stream, job.direction, q.host, job.client + off, job.pool + off, n);
        ++q.chunks_issued;
      }
      if (q.status.ok() && q.chunks_issued < chunks) {
        lane.blocked = "NVMe chunks";
        return false;
      }
    } else if (q.host) {
      flush();
      q.status = Copy(stream, job.direction, q.host, job.client, job.pool, job.len);
    } else {
      // A plain copy: whole, or its chunks as the lane's window lets them go; the last (or only)
      // piece is this job's pending entry below.
      if (!IssueChunks(lane, q, now)) return false;
      const uint64_t rest = job.len - q.issued_bytes;
      if (lane.staged.empty()) lane.staged_from_seq = lane.next_seq;
      lane.staged.push_back(
          GpuRuntime::CopyOp{job.client + q.issued_bytes, job.pool + q.issued_bytes, rest});
      lane.window_bytes += rest;
      window = rest;
      staged = true;
    }
  }
  lane.blocked = "";
  const uint64_t seq = lane.next_seq;  // after any chunks: the seq of the job's last piece
  if (q.pool_write != 0 && q.status.ok()) {
    pool_writes_.Issued(q.pool_write, job.pool, lane.completed_addr(), &lane.word.host->completed,
                        seq);
  }
  // Whatever failed above, the ticket is still signalled: the client's streams wait on it and
  // must not hang. The failure reaches the client through the job's completion. A batch signals
  // once, after its last job's copy.
  absl::Status signal;
  if (job.sync != 0 && q.signal) {
    flush();
    signal = runtime_->WriteValue64(stream, lane.done_addr, job.sync);
  }
  ++lane.next_seq;
  absl::Status status = q.status.ok() ? signal : q.status;
  if (lane.pending.empty()) lane.progress_ns = now;  // the watchdog counts from here
  lane.pending.push_back(PendingJob{seq, std::move(job.done), std::move(status), q.pool_write,
                                    job.pool, std::move(job.feed), std::move(q.gpu_waits), now,
                                    window});
  lane.meter.Issued(now, window);
  if (window != 0 && lane.window_limit != 0) {
    if (absl::Status s = MarkPiece(lane); !s.ok() && lane.pending.back().status.ok()) {
      lane.pending.back().status = s;
    }
  }
  return true;
}

// Under a window, each piece (chunk or job) completes on its own: its copy goes to the runtime
// and `completed` is written after it, so the window reopens as pieces land instead of once the
// whole pass's copies are done (which would drain the stream before the next piece). A failure
// goes to the job (the caller); the pass's own completion write still completes its pieces.
absl::Status StreamEngine::MarkPiece(Lane& lane) {
  absl::Status s = FlushStaged(lane);
  if (!s.ok()) return s;
  return runtime_->WriteValue64(lane.stream, lane.completed_addr(), lane.next_seq - 1);
}

// A plain copy under the lane's window (GpuEngineOptions::lane_window_bytes): stages every chunk
// but the last that fits, each its own pending entry; true once the rest (the last chunk, or the
// whole copy) may be staged too. False: the window is full; the job stays at the head, and the
// lane's completions open the window again.
bool StreamEngine::IssueChunks(Lane& lane, QueuedJob& q, uint64_t now) {
  const uint64_t window = lane.window_limit;
  const CopyJob& job = q.job;
  if (window == 0) return true;
  const uint64_t chunk = std::max<uint64_t>(window / 4, 1);
  // An empty window always takes the next piece, so a lane alone is never held back by it.
  auto fits = [&](uint64_t n) { return lane.window_bytes == 0 || lane.window_bytes + n <= window; };
  while (job.len - q.issued_bytes > chunk) {
    if (!fits(chunk)) {
      lane.blocked = "its window of the GPU link";
      return false;
    }
    if (lane.staged.empty()) lane.staged_from_seq = lane.next_seq;
    lane.staged.push_back(
        GpuRuntime::CopyOp{job.client + q.issued_bytes, job.pool + q.issued_bytes, chunk});
    lane.pending.push_back(PendingJob{lane.next_seq++, nullptr, absl::OkStatus(), 0, nullptr,
                                      nullptr, {}, now, chunk});
    lane.meter.Issued(now, chunk);
    lane.window_bytes += chunk;
    q.issued_bytes += chunk;
    if (lane.pending.size() == 1) lane.progress_ns = now;
    if (absl::Status s = MarkPiece(lane); !s.ok() && q.status.ok()) q.status = s;
  }
  if (!fits(job.len - q.issued_bytes)) {
    lane.blocked = "its window of the GPU link";
    return false;
  }
  return true;
}

// Gives the staged copies to the runtime in one call. A failure fails every job among them.
absl::Status StreamEngine::FlushStaged(Lane& lane) {
  if (lane.staged.empty()) return absl::OkStatus();
  absl::Status s = runtime_->CopyBatchAsync(lane.stream, lane.direction, lane.staged);
  lane.staged.clear();
  if (!s.ok()) {
    for (PendingJob& p : lane.pending) {
      if (p.seq >= lane.staged_from_seq && p.status.ok()) p.status = s;
    }
    // Chunks have no completion of their own: their job, still at the head, reports it.
    if (!lane.queue.empty() && lane.queue.front().issued_bytes > 0 &&
        lane.queue.front().status.ok()) {
      lane.queue.front().status = s;
    }
  }
  return s;
}

// The end of a pass that issued jobs first_seq and up: flushes staged copies and writes the
// lane's `completed` word once, for the last of them. If that write cannot be queued, the jobs
// of the pass would never complete: they fail now. Called with lane.mu held.
void StreamEngine::MarkCompleted(Lane& lane, uint64_t first_seq, std::vector<FailedJob>& failed) {
  (void)FlushStaged(lane);  // a failure is recorded on the jobs it concerns
  absl::Status mark = runtime_->WriteValue64(lane.stream, lane.completed_addr(), lane.next_seq - 1);
  if (mark.ok()) return;
  while (!lane.pending.empty() && lane.pending.back().seq >= first_seq) {
    PendingJob& p = lane.pending.back();
    pool_writes_.End(p.pool_write, p.pool);
    if (p.feed != nullptr) p.feed->Unsubscribe();
    lane.window_bytes -= p.window_bytes;
    lane.meter.Completed(NowNs(), p.window_bytes);  // never ran: keeps the meter's count right
    if (p.done) {
      failed.push_back({std::move(p.done), p.status.ok() ? mark : std::move(p.status)});
    } else if (!lane.queue.empty() && lane.queue.front().status.ok()) {
      lane.queue.front().status = mark;  // a chunk of the head job
    }
    lane.pending.pop_back();
  }
}

bool StreamEngine::Step(Lane& lane, uint64_t now, uint64_t window, bool* busy) {
  std::vector<FailedJob> failed;
  bool moved = false;
  {
    std::lock_guard lock(lane.mu);
    lane.window_limit = window;
    if (lane.abandoned) {
      // Nothing queued may wait for this client any more; what is issued finishes on its own.
      for (QueuedJob& q : lane.queue) {
        pool_writes_.End(q.pool_write, q.job.pool);
        if (q.job.feed != nullptr) q.job.feed->Unsubscribe();
        failed.push_back({std::move(q.job.done), absl::CancelledError("session is ending")});
      }
      moved = !lane.queue.empty();
      lane.queue.clear();
      lane.wait_since_ns = 0;
    }
    const uint64_t first_seq = lane.next_seq;
    while (!lane.queue.empty()) {
      if (!IssueHead(lane, lane.queue.front(), now)) break;
      lane.queue.pop_front();
      moved = true;
    }
    if (lane.next_seq != first_seq) MarkCompleted(lane, first_seq, failed);
  }
  RunFailed(failed);
  moved |= Complete(lane, now);
  std::lock_guard lock(lane.mu);
  *busy = lane.busy();
  return moved;
}

// Completes the lane's finished jobs; true if any.
bool StreamEngine::Complete(Lane& lane, uint64_t now) {
  uint64_t completed = LoadWord(lane.word.host->completed);
  std::vector<PendingJob> finished;
  std::vector<PendingJob> broken;
  absl::Status broken_status;
  bool check_stream = false;
  uint64_t issued = 0;
  {
    std::lock_guard lock(lane.mu);
    while (!lane.pending.empty() && lane.pending.front().seq <= completed) {
      lane.window_bytes -= lane.pending.front().window_bytes;
      lane.meter.Completed(now, lane.pending.front().window_bytes);
      finished.push_back(std::move(lane.pending.front()));
      lane.pending.pop_front();
    }
    if (!finished.empty() || lane.pending.empty()) {
      lane.progress_ns = now;
    } else if (now - lane.progress_ns > uint64_t{options_.watchdog_ms} * 1000000) {
      check_stream = true;
      issued = lane.next_seq - 1;
      lane.progress_ns = now;
    }
  }
  if (check_stream) {
    // Issued copies made no progress for a while: usually a long copy (nothing wrong), but a
    // failed stream never writes `completed`, so ask the runtime.
    absl::StatusOr<bool> done = runtime_->StreamDone(lane.device, lane.stream);
    if (done.ok() && !*done) {
      std::lock_guard lock(lane.mu);
      if (!lane.pending.empty() && !lane.warned_stuck &&
          now - lane.pending.front().issued_ns > uint64_t{options_.lane_wait_warn_ms} * 1000000) {
        lane.warned_stuck = true;
        const PendingJob& oldest = lane.pending.front();
        std::string waits = DescribeGpuWaits(oldest);
        LogError(lane.label, ": GPU ", lane.device, " ", lane.name(), " lane: job seq ",
                 oldest.seq, " issued ", (now - oldest.issued_ns) / 1000000,
                 " ms ago has not completed (completion word at ",
                 LoadWord(lane.word.host->completed), ", ", lane.pending.size(),
                 " in flight); GPU waits not met: ", waits.empty() ? "none" : waits);
      }
    }
    if (!done.ok() || *done) {
      if (done.ok() && LoadWord(lane.word.host->completed) < issued && !lane.warned_idle) {
        lane.warned_idle = true;
        LogError(runtime_->name(), " engine: GPU ", lane.device,
                 " stream idle but its completion word did not move; completing by stream "
                 "query (slow path)");
      }
      std::lock_guard lock(lane.mu);
      while (!lane.pending.empty() && lane.pending.front().seq <= issued) {
        lane.window_bytes -= lane.pending.front().window_bytes;
        lane.meter.Completed(now, lane.pending.front().window_bytes);
        (done.ok() ? finished : broken).push_back(std::move(lane.pending.front()));
        lane.pending.pop_front();
      }
      if (!done.ok() && !lane.queue.empty() && lane.queue.front().issued_bytes > 0 &&
          lane.queue.front().status.ok()) {
        lane.queue.front().status = done.status();  // its chunks ran on the failed stream
      }
      if (!done.ok()) broken_status = done.status();
    }
  }
  for (PendingJob& p : finished) {
    if (p.feed != nullptr) {
      p.feed->Unsubscribe();
      if (absl::Status fed = p.feed->status(); !fed.ok() && p.status.ok()) p.status = fed;
    }
    pool_writes_.End(p.pool_write, p.pool);
    if (p.done) std::move(p.done)(std::move(p.status));
  }
  for (PendingJob& p : broken) {
    if (p.feed != nullptr) p.feed->Unsubscribe();
    pool_writes_.End(p.pool_write, p.pool);
    if (p.done) std::move(p.done)(broken_status);
  }
  return !finished.empty() || !broken.empty();
}

void DeviceWorker::Run() {
  SetThreadRole(ThreadRole::kDeviceWorker);
  // Sleeps of a few microseconds must be that short: the default timer slack is 50 us.
  (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  if (absl::Status s = runtime_.SetDevice(device_); !s.ok()) {
    LogError(runtime_.name(), " engine: GPU ", device_, " worker: ", s.message());
  }
  uint64_t last_progress_ns = NowNs();
  uint64_t sleep_us = 1;
  for (;;) {
    std::vector<std::shared_ptr<Lane>> lanes;
    {
      std::unique_lock lock(mu_);
      // Idle: sleep until a Submit wakes us, looking every second for a lane with work that no
      // one woke us for (a safety net: it logs, and the lane is served).
      while (!stop_ && active_.empty()) {
        if (cv_.wait_for(lock, std::chrono::seconds(1)) == std::cv_status::timeout) {
          lock.unlock();
          std::vector<std::shared_ptr<Lane>> stranded = engine_.StrandedLanes(device_);
          for (auto& lane : stranded) {
            LogError(lane->label, ": GPU ", device_, " ", lane->name(),
                     " lane had jobs its worker was not told of (a lost wake-up); serving it");
            Wake(lane);
          }
          lock.lock();
        }
      }
      if (stop_) return;
      lanes = active_;
      woken_.store(false);
    }
    uint64_t now = NowNs();
    bool progress = false;
    std::vector<Lane*> idle;
    // D2H lanes first: a reload issued in this pass may wait for an offload issued in it.
    std::stable_sort(lanes.begin(), lanes.end(), [](const auto& a, const auto& b) {
      return LaneIndex(a->direction) < LaneIndex(b->direction);
    });
    // Only lanes with copies on the link count as sharing it (engine/link_share.h).
    for (auto& lane : lanes) {
      bool copying;
      {
        std::lock_guard lane_lock(lane->mu);
        copying = !lane->pending.empty();
      }
      if (copying) share_.Saw(lane.get(), lane->uid, LaneIndex(lane->direction), now);
    }
    for (auto& lane : lanes) {
      bool busy = false;
      const uint64_t window = share_.Window(lane.get(), lane->uid, LaneIndex(lane->direction),
                                            now, engine_.lane_window_bytes());
      progress |= engine_.Step(*lane, now, window, &busy);
      if (!busy) idle.push_back(lane.get());
    }
    bool any_active;
    {
      std::lock_guard lock(mu_);
      std::erase_if(active_, [&](const std::shared_ptr<Lane>& lane) {
        if (std::find(idle.begin(), idle.end(), lane.get()) == idle.end()) return false;
        std::lock_guard lane_lock(lane->mu);
        if (lane->busy()) return false;  // a Submit queued meanwhile
        lane->in_worker.store(false);
        return true;
      });
      any_active = !active_.empty();
      if (!any_active) idle_cv_.notify_all();
    }
    lanes.clear();  // may destroy lanes of ended sessions (their streams go on the release thread)
    if (progress) {
      last_progress_ns = now;
      sleep_us = 1;
      continue;
    }
    if (!any_active) continue;  // blocks in cv_.wait above
    // Lanes wait for tickets or copies: spin right after progress (tickets and completions come
    // microseconds apart), then back off, waking at once for a Submit.
    if (now - last_progress_ns < uint64_t{spin_us_} * 1000) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::microseconds(sleep_us),
                 [this] { return stop_ || woken_.load(); });
    sleep_us = std::min<uint64_t>(sleep_us * 2, max_sleep_us_);
  }
}

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

}  // namespace tier::engine
