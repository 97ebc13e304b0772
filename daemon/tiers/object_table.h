// A session's objects and every change of their state, in one place.
//
// An object is the data of one offload: it is filling (the copy into the host pool runs), ready,
// or failed; its bytes are in host memory, being written to NVMe (spilling: the host copy is
// still whole), on NVMe, or being read back (fetching). Jobs pin it while they use its memory (the
// fill counts as one); a free drops it from the table, and its memory goes back only when the last
// pin goes. The session's quota is charged when an object is created and refunded when its memory
// goes, both here.
//
// Every transition is a method that takes the table's lock for its duration and returns what the
// caller must do outside it: memory to give back (a host extent, a spill record: a Release, which
// goes back to the object's MemoryHome by itself when the caller's scope ends) and jobs to start
// (waiters: the reloads that waited for a fill, or joined a read from NVMe). Callers hold no lock
// of their own when they call in, except the host pool's allocation, which runs under the table's
// lock (BeginFetch: lock order table, then pool). A transition that does not apply in the
// object's state (landing a spill that never began, admitting an object twice) changes nothing
// and says so.
//
// Objects are shared (jobs in flight and the spill candidate lists hold them), but their state is
// only read and written under their table's lock, through the methods below.
#ifndef TIER_DAEMON_TIERS_OBJECT_TABLE_H_
#define TIER_DAEMON_TIERS_OBJECT_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/tiers/release.h"
#include "storage/extent_allocator.h"
#include "storage/spill_store.h"

namespace tier::daemon {

// A job to start once something happened to an object (its fill ended, its bytes are back in
// host memory), with the outcome.
using ObjectWaiter = std::function<void(absl::Status)>;

class Object {
 public:
  enum class State { kFilling, kReady, kFailed };
  enum class Where { kHost, kSpilling, kNvme, kFetching };

  Object(uint64_t id, uint64_t len, uint64_t hint, uint64_t seq)
      : id_(id), len_(len), hint_(hint), seq_(seq) {}
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;

  uint64_t id() const { return id_; }
  uint64_t len() const { return len_; }
  uint64_t hint() const { return hint_; }  // the offload's next-use hint (0: none)
  uint64_t seq() const { return seq_; }    // offload order within the daemon
  // The host pool part its bytes belong in (its GPU's; storage::HostPool::kAnyPart: none): set
  // at admission (TierManager::Admit), read when a fetch from NVMe needs a new extent.
  int home_part() const { return home_part_.load(std::memory_order_relaxed); }
  void set_home_part(int part) { home_part_.store(part, std::memory_order_relaxed); }

 private:
  friend class ObjectTable;

  const uint64_t id_;
  const uint64_t len_;
  const uint64_t hint_;
  const uint64_t seq_;
  std::atomic<int> home_part_{-1};
  // Read and written under the owning table's lock only.
  State state_ = State::kFilling;
  Where where_ = Where::kHost;
  storage::Extent extent_;       // host bytes (kHost, kSpilling, kFetching); none before admission
  storage::SpillRecord record_;  // kNvme, kFetching
  MemoryHome* home_ = nullptr;   // where its memory goes back (set at admission)
  uint64_t charged_ = 0;         // quota bytes charged (refunded when the memory goes)
  uint32_t pins_ = 0;            // jobs and I/O using the memory (the fill counts as one)
  bool dropped_ = false;         // freed by the client, or its fill failed: gone from the table
  bool prefetched_ = false;      // brought back by a prefetch and not reloaded since
  bool fill_submitted_ = false;  // its fill's copy is in the engine (FillSubmitted)
  std::vector<ObjectWaiter> on_filled_;   // jobs waiting for the fill to end
  std::vector<ObjectWaiter> on_fetched_;  // kFetching: reloads that joined the running read
};

// A byte limit several tables charge together besides their own quota (the persistent objects
// of every uid: persistent_max_bytes). Lock-free; a table charges it under its own lock.
class SharedQuota {
 public:
  SharedQuota(uint64_t limit_bytes, std::string name)
      : limit_bytes_(limit_bytes), name_(std::move(name)) {}
  SharedQuota(const SharedQuota&) = delete;
  SharedQuota& operator=(const SharedQuota&) = delete;

  uint64_t limit_bytes() const { return limit_bytes_; }
  uint64_t used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }
  const std::string& name() const { return name_; }
  // Charges `bytes` if they fit (or always, with `force`); false otherwise (nothing charged).
  bool TryCharge(uint64_t bytes, bool force = false);
  void Refund(uint64_t bytes) { used_bytes_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  const uint64_t limit_bytes_;
  const std::string name_;
  std::atomic<uint64_t> used_bytes_{0};
};

class ObjectTable {
 public:
  // `quota_name` says whose quota an error names ("session quota", "persistent quota of uid 7").
  // `shared`: a limit this table's charges count against too (null: none).
  explicit ObjectTable(uint64_t quota_bytes, std::string quota_name = "session quota",
                       std::shared_ptr<SharedQuota> shared = nullptr)
      : quota_bytes_(quota_bytes), quota_name_(std::move(quota_name)), shared_(std::move(shared)) {}
  ObjectTable(const ObjectTable&) = delete;
  ObjectTable& operator=(const ObjectTable&) = delete;

  uint64_t quota_bytes() const { return quota_bytes_; }
  uint64_t used_bytes() const;  // charged to the quota now
  size_t size() const;          // objects in the table
  // The object `id` while it is in the table (not freed, its fill not failed), else null.
  std::shared_ptr<Object> Find(uint64_t id) const;
  // The ids of every object in the table.
  std::vector<uint64_t> Ids() const;

  // ---- life ----
  enum class Charge {
    kWithinQuota,  // RESOURCE_EXHAUSTED past the quota (or the shared one)
    kForce,        // charged whatever the quota says: bytes that exist already (a restore)
  };
  // A new object `id` of `len` bytes, filling, pinned by its fill, charged `charge` bytes (what
  // the pool will hand out for it). ALREADY_EXISTS, RESOURCE_EXHAUSTED (quota).
  absl::StatusOr<std::shared_ptr<Object>> Create(uint64_t id, uint64_t len, uint64_t hint,
                                                 uint64_t seq, uint64_t charge,
                                                 Charge mode = Charge::kWithinQuota);
  // Bytes the quota's owner holds outside the table's objects (a persistent object left on NVMe
  // at restart): charged whatever the quota says, and refunded by the caller.
  void ChargeOutside(uint64_t bytes);
  void RefundOutside(uint64_t bytes);
  // The object's host extent, given by the tiers when it was admitted: the charge becomes the
  // extent's size, and `home` is where the object's memory goes back (every Release of it). Once,
  // before the fill's copy. FAILED_PRECONDITION otherwise (the extent is not taken).
  absl::Status Admit(Object& object, storage::Extent extent, MemoryHome& home);
  // The fill's copy is in the engine now: from here on, a GPU engine orders a reload of the
  // object's bytes after that copy (engine::PoolWrites), so a reload need not wait for the fill's
  // end. Call after CopyEngine::Submit returned, never before: between Admit and Submit the
  // engine knows nothing of the write, and a reload submitted then would read the pool first.
  void FillSubmitted(Object& object);
  // The fill ended: ready, or failed (a failed fill leaves no object behind). Drops the fill's
  // pin. The jobs that waited for the fill go to *waiters (start them with `status`).
  Release EndFill(Object& object, const absl::Status& status, std::vector<ObjectWaiter>* waiters);
  // The client frees `id`. NOT_FOUND.
  absl::StatusOr<Release> Free(uint64_t id);
  // A reload that succeeded with TIER_RELOAD_FREE_AFTER: the object leaves the table (its memory
  // goes with the reload's unpin).
  void DropAfterReload(Object& object);
  // The session ended: every object leaves the table; returns the memory of those no job uses
  // (dropped at once, it goes back at once).
  std::vector<Release> DropAll();

  // ---- jobs ----
  enum class Prefetch { kNone, kHit, kMiss };  // how a reload found the object (statistics)
  struct Pinned {
    std::shared_ptr<Object> object;
    bool filling = false;         // its fill runs still
    bool fill_submitted = false;  // that fill's copy is in the engine (FillSubmitted)
    bool on_nvme = false;   // its bytes must come back from NVMe first (kNvme or kFetching)
    Prefetch prefetch = Prefetch::kNone;
  };
  // A reload of `len` bytes of `id`: pins it. NOT_FOUND, INVALID_ARGUMENT (length).
  absl::StatusOr<Pinned> PinForReload(uint64_t id, uint64_t len);
  // A reader of a ready object's bytes beside the jobs (the persistent journal's writer): pins
  // it and says where its bytes are now. In host memory (kHost, kSpilling: `extent`), or on NVMe
  // (kNvme, kFetching: `record`; a fetch may free that record under the reader, which the spill
  // store answers NOT_FOUND: then ask again). NOT_FOUND once dropped, FAILED_PRECONDITION while
  // filling. Unpin when done.
  struct CopySource {
    bool on_nvme = false;
    storage::Extent extent;
    storage::SpillRecord record;
  };
  absl::StatusOr<CopySource> PinForCopy(Object& object);
  // Where the fill is: still running (then `waiter` starts when it ends), or ended (nothing kept;
  // a reload submitted while it ran reports a failed fill's failure).
  enum class Fill { kRunning, kSucceeded, kFailed };
  Fill AwaitFill(Object& object, ObjectWaiter waiter);
  // Drops one pin; the memory of a dropped object goes with the last.
  Release Unpin(Object& object);
  // The object's host bytes (while pinned and in host memory, or once its read began).
  storage::Extent extent(const Object& object) const;

  // What an object is now (diagnostics and tests; it may change the moment the lock is gone).
  struct View {
    Object::State state;
    Object::Where where;
    storage::Extent extent;
    uint32_t pins;
    bool dropped;
    bool prefetched;
  };
  View Look(const Object& object) const;

  // ---- tiers ----
  // Spilling: a ready object only in host memory and used by nothing may be written to NVMe.
  enum class SpillStart {
    kBegan,  // pinned (the write reads *extent), Where kSpilling
    kBusy,   // a job uses it now: try again later
    kNot,    // not a candidate any more (dropped, failed, not in host memory)
  };
  SpillStart BeginSpill(Object& object, storage::Extent* extent);
  // The write landed (or failed). The host extent goes back if the write succeeded and nothing
  // used or freed the object meanwhile (then it is on NVMe: *spilled true); else the host copy
  // stays and the record goes back. Drops the write's pin. The Release holds what to give back.
  Release EndSpill(Object& object, const absl::StatusOr<storage::SpillRecord>& record,
                   bool* spilled);
  // Making the bytes readable in host memory.
  enum class Fetch {
    kInHost,   // readable now (host, or spilling: the host copy is whole)
    kJoined,   // a read runs (a reload joins it: `joiner` runs when it ends)
    kStarted,  // was on NVMe: the caller reads `record` into `extent` now, then EndFetch
    kNoRoom,   // on NVMe, and no host room (`allocate` null, or it found none)
    kGone,     // dropped (a prefetch of an object freed meanwhile)
  };
  // Who begins a read: a reload, or a prefetch (a dropped object is kGone for it).
  enum class Reader { kPipelined, kPrefetch };
  struct FetchBegun {
    Fetch fetch = Fetch::kNoRoom;
    Release released;             // a prefetch with nothing to read: its pin's end
    storage::Extent extent;       // kStarted
    storage::SpillRecord record;  // kStarted
  };
  // `allocate` gives the new extent; it runs under the table's lock (the pool's own lock comes
  // after this one). Null: do not start a read that needs one. A reload that finds a read
  // running joins it: `joiner` runs with the read's result once it ended (EndFetch hands it
  // over). A prefetch that starts no read drops its pin here.
  FetchBegun BeginFetch(Object& object, Reader reader,
                        const std::function<std::optional<storage::Extent>()>& allocate,
                        ObjectWaiter joiner = nullptr);
  // The read ended. OK: the object is in host memory again (the record goes back; `prefetch`
  // marks it prefetched; *spillable: it is a spill candidate again). Failed: it stays on NVMe and
  // the extent is in the Release (a pipelined reader keeps it while its copy may still read it).
  // A prefetch's read drops its pin. The reloads that joined the read go to *joined (start them
  // with `read`).
  Release EndFetch(Object& object, const absl::Status& read, bool prefetch, bool* spillable,
                   std::vector<ObjectWaiter>* joined);
  // A prefetch pins an object on NVMe (false: not on NVMe any more, or dropped).
  bool PinIfOnNvme(Object& object);

 private:
  Release UnpinLocked(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Out of the table (a free, a failed fill, the session's end); the memory stays with the pins.
  void DropLocked(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Charges `bytes` to the table and the shared quota (`mode` kForce: whatever they say).
  absl::Status ChargeLocked(uint64_t bytes, Charge mode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefundLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t quota_bytes_;
  const std::string quota_name_;
  const std::shared_ptr<SharedQuota> shared_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Object>> objects_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Where the object a job names lives: a table, and the object's id in it (a session's own table
// under the client's id, or a persistent object's uid table: daemon/persistent/persistent_store.h).
struct ObjectSlot {
  std::shared_ptr<ObjectTable> table;
  uint64_t id = 0;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_OBJECT_TABLE_H_
