// Named, persistent objects: objects that outlive the session that offloaded them.
//
// Each uid has a namespace of names and its own ObjectTable, whose quota is
// persistent_quota_bytes_per_uid; persistent objects live there, not in any session's table, so a
// session's end (DropAll of its table) does not touch them. A session reaches one through a
// binding (Session::Bind): the client names one of its object ids for the persistent object,
// once, over the session socket, and from then on offload, reload and free of that id are ordinary
// ring jobs on the uid's table. So the hot path stays a ring job and the object's every state
// change stays an ObjectTable transition.
//
// Create reserves a name for an object the session's next offload of the bound id creates;
// Open finds an existing one; Delete frees it. A name whose object is gone (freed, or its fill
// failed) is no longer listed and may be created again. Names are looked up in the caller's own
// uid only (the session socket's SO_PEERCRED): another uid's names are NOT_FOUND, never "not
// yours", so their existence is not revealed. Only Delete may name another uid, and only root may
// do so (the listener checks).
//
// Lock order: the store's lock, then a table's (ObjectTable methods), then the pool's. Memory a
// delete releases is given back to the tiers after the store's lock is dropped.
#ifndef TIER_DAEMON_PERSISTENT_STORE_H_
#define TIER_DAEMON_PERSISTENT_STORE_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "daemon/object_table.h"
#include "daemon/persistent_journal.h"
#include "daemon/tier_manager.h"

namespace tier::daemon {

// One persistent object as `tierctl objects` shows it.
struct PersistentObjectInfo {
  uid_t uid = 0;
  std::string name;
  uint64_t bytes = 0;
  std::string tier;  // "host" or "nvme"
  uint64_t age_ms = 0;
  bool durable = false;  // written through to NVMe: it survives a restart of tierd
};

// What a client may learn of its own persistent object (the session socket's kStat).
struct PersistentObjectState {
  uint64_t len = 0;
  bool ready = false;      // its offload landed
  bool durable = false;    // written through to NVMe
  bool journaled = false;  // this store writes objects through (durable follows ready)
};

class PersistentStore {
 public:
  static constexpr size_t kMaxNameBytes = 127;

  // `journal`: where objects are written through to NVMe so they survive a restart (null: host
  // memory only, lost on restart).
  PersistentStore(TierManager& tiers, uint64_t quota_bytes_per_uid,
                  PersistentJournal* journal = nullptr);
  ~PersistentStore();
  PersistentStore(const PersistentStore&) = delete;
  PersistentStore& operator=(const PersistentStore&) = delete;

  uint64_t quota_bytes_per_uid() const { return quota_bytes_per_uid_; }

  // 1..kMaxNameBytes printable ASCII bytes: INVALID_ARGUMENT saying why otherwise.
  static absl::Status CheckName(absl::string_view name);

  // Reserves `name` in `uid`'s namespace for session `session`: the slot the session's next
  // offload creates the object in, of `len` bytes. ALREADY_EXISTS when the name holds an object,
  // or another session's offload into it has not ended yet; RESOURCE_EXHAUSTED, naming the
  // setting, when `len` does not fit the uid's quota now (the offload is checked again when it
  // runs: this answer comes with a message, the job's only with a code).
  absl::StatusOr<ObjectSlot> Create(uid_t uid, absl::string_view name, uint64_t session,
                                    uint64_t len);
  // The object `name` of `uid`, and its length. NOT_FOUND.
  absl::StatusOr<ObjectSlot> Open(uid_t uid, absl::string_view name, uint64_t* len);
  // The state of the object `name` of `uid`. NOT_FOUND (also while its offload has not begun).
  absl::StatusOr<PersistentObjectState> Stat(uid_t uid, absl::string_view name) const;
  // Frees the object `name` of `uid` (its memory returns once jobs using it end). NOT_FOUND.
  // With a journal, its record is gone from NVMe when this returns (it waits for a write of it
  // in progress): a deleted object never comes back after a crash.
  absl::Status Delete(uid_t uid, absl::string_view name);
  // The object `id` of `table` was freed by a job (a free, or a reload with
  // TIER_RELOAD_FREE_AFTER, of an id bound to it): its name and its journal record go.
  void Forget(const std::shared_ptr<ObjectTable>& table, uint64_t id);
  // Session `session` ended: names it reserved but never filled are released, and objects of its
  // uid that no name reaches any more (a name reserved twice by one session) are freed.
  void SessionEnded(uint64_t session);
  // Every persistent object, by uid then name.
  std::vector<PersistentObjectInfo> List() const;
  size_t size() const;
  // Shutdown: the writes through to NVMe already queued finish, then every persistent object
  // leaves host memory (the journal keeps the durable ones).
  void DropAll();

  // With a journal. At start, before any session: brings back every object the journal holds
  // whose bytes check out (the others are reported and not served). Returns how many came back.
  size_t Restore();
  // A fill of an object in `table` succeeded (job executor, before the object may be spilled):
  // if it is a persistent object, its bytes are written through to the journal, in the order of
  // fills and deletes, by the store's writer thread (the object stays pinned meanwhile).
  void Filled(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object);

 private:
  struct Entry {
    uint64_t id = 0;
    uint64_t reserved_by = 0;  // the session whose offload fills it; 0 once that session ended
    uint64_t created_ms = 0;
    bool durable = false;      // in the journal
  };
  // One job of the writer thread: write an object's bytes (object set) or forget a name.
  struct JournalOp {
    uid_t uid = 0;
    std::string name;
    uint64_t id = 0;
    std::shared_ptr<ObjectTable> table;  // (writes) pinned until written
    std::shared_ptr<Object> object;
  };
  void RunWriter();
  void Enqueue(JournalOp op);
  struct Namespace {
    std::shared_ptr<ObjectTable> table;
    std::map<std::string, Entry, std::less<>> names;
  };
  Namespace& SpaceLocked(uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The object a name of `uid` reaches now (NOT_FOUND for a bad name, a reservation whose offload
  // has not run, and another uid's name alike).
  struct Found {
    std::shared_ptr<ObjectTable> table;
    const Entry* entry;
    std::shared_ptr<Object> object;
  };
  absl::StatusOr<Found> FindLocked(uid_t uid, absl::string_view name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TierManager& tiers_;
  const uint64_t quota_bytes_per_uid_;
  mutable Mutex mu_;
  std::map<uid_t, Namespace> spaces_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  PersistentJournal* const journal_;
  // Serializes the journal's writes (writer thread) and Delete's synchronous removal; taken
  // before mu_.
  Mutex journal_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  Mutex writer_mu_;
  CondVar writer_cv_;
  std::deque<JournalOp> writes_ ABSL_GUARDED_BY(writer_mu_);
  bool writer_busy_ ABSL_GUARDED_BY(writer_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(writer_mu_) = false;
  std::thread writer_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_PERSISTENT_STORE_H_
