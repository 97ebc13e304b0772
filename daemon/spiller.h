// The policy between the host tier and the NVMe tier: keeps the host pool under its high
// watermark by writing objects to the spill store, and brings spilled objects back when a job
// needs them.
//
// Victims: objects whose bytes are only in host memory, completely filled and not in use by any
// job. With next-use hints (tier_offload_options.next_use_hint: smaller = sooner) the one used
// last goes first; objects without a hint go oldest first, since activation offload reloads in
// reverse order of offload. Spilling runs on the spiller's thread; the I/O on the store's.
//
// An object is pinned (Object::pins) while its write runs, so neither a free nor a session's end
// releases its host bytes under the write; when the write lands, the host extent is released only
// if nothing else pinned the object meanwhile (a reload that arrived during the write keeps the
// host copy, and the record is dropped).
//
// Locks: the spiller's own mutex guards the candidate set only; it never holds it while taking a
// session's mutex, and it never calls into the store while holding a session's mutex.
#ifndef TIER_DAEMON_SPILLER_H_
#define TIER_DAEMON_SPILLER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "daemon/session.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tier::daemon {

struct SpillerOptions {
  uint32_t high_pct = 90;
  uint32_t low_pct = 75;
};

struct SpillCounters {
  std::atomic<uint64_t> bytes_spilled{0};
  std::atomic<uint64_t> bytes_fetched{0};
  std::atomic<uint64_t> spills{0};
  std::atomic<uint64_t> fetches{0};
  std::atomic<uint64_t> write_errors{0};
  std::atomic<uint64_t> read_errors{0};
  std::atomic<uint64_t> checksum_failures{0};
};

class Spiller {
 public:
  Spiller(storage::HostPool& pool, storage::SpillStore& store, SpillerOptions options);
  ~Spiller();
  Spiller(const Spiller&) = delete;
  Spiller& operator=(const Spiller&) = delete;

  void Start();
  // Stops the thread; writes already started finish through the store.
  void Stop();

  // A filled object (Where kHost) becomes a spill candidate.
  void Track(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object);
  // The host pool got fuller (or an allocation failed): look at the watermark again.
  void Kick();

  // Brings a spilled object's bytes back into host memory and then runs `then` (on the store's
  // I/O thread, or at once on error). The caller has pinned the object and holds no lock.
  // Concurrent calls for one object share one read. RESOURCE_EXHAUSTED when the host pool has no
  // room (the spiller is kicked to make some).
  void Fetch(const std::shared_ptr<Session>& session, const std::shared_ptr<Object>& object,
             std::function<void(absl::Status)> then);

  // The object is gone (freed and unpinned) while its bytes are on NVMe: release the record.
  void Release(const storage::SpillRecord& record);

  // Backpressure: an offload found the host pool full. `retry(true)` runs (without locks held)
  // each time host memory was freed; it tries again and, if it still finds no room, calls
  // WaitForRoom again. `retry(false)` when no room can come: nothing left to spill (everything is
  // pinned or the NVMe tier is full) and no write in flight. Either way it runs exactly once.
  void WaitForRoom(std::function<void(bool room)> retry);
  // Host memory was freed (a job's extent went back): parked offloads try again.
  void NotifyFreed();

  const SpillCounters& counters() const { return counters_; }
  storage::SpillStore& store() { return store_; }

 private:
  void Run();
  bool AboveHigh() const;
  bool AboveLow() const;
  // Takes the next candidate that may be spilled now and pins it; false if none.
  bool SpillOne();
  // Runs the parked offloads' retries (stuck: they fail).
  void ServeWaiters(bool stuck);

  storage::HostPool& pool_;
  storage::SpillStore& store_;
  const SpillerOptions options_;
  SpillCounters counters_;

  struct Candidate {
    std::weak_ptr<Session> session;
    std::weak_ptr<Object> object;
  };
  // Ordered by spill priority: (hinted first, larger hint first), then oldest first.
  using Key = std::tuple<int, uint64_t>;
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Key, Candidate> candidates_;
  bool kicked_ = false;
  std::vector<std::function<void(bool)>> waiting_;  // parked offloads
  bool nvme_full_ = false;                         // the last write found no room on NVMe
  bool stopping_ = false;
  std::atomic<uint64_t> writes_in_flight_{0};
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_SPILLER_H_
