// Named, persistent objects: objects that outlive the session that offloaded them.
//
// Each uid has a namespace of names and its own ObjectTable, whose quota is
// persistent_quota_bytes_per_uid; every uid's table also counts against persistent_max_bytes
// (a SharedQuota), and names are bounded per uid and per node. Persistent objects live in those
// tables, not in any session's, so a session's end (DropAll of its table) does not touch them. A
// session reaches one through a binding (Session::Bind): the client names one of its object ids
// for the persistent object, once, over the session socket, and from then on offload, reload and
// free of that id are ordinary ring jobs on the uid's table. So the hot path stays a ring job and
// the object's every state change stays an ObjectTable transition (fill, spill, fetch, pins).
//
// Create reserves a name for an object the session's next offload of the bound id creates;
// Open finds an existing one; Delete frees it. A name whose object is gone (freed, or its fill
// failed) is no longer listed and may be created again; a reservation never filled goes when its
// session ends or gives the id back (Released). Names are looked up in the caller's own uid only
// (the session socket's SO_PEERCRED): another uid's names are NOT_FOUND, never "not yours", so
// their existence is not revealed. Only Delete may name another uid, and only root may do so (the
// listener checks).
//
// Every operation is a hash lookup under the store's lock: by (uid, name), by id (the fills and
// frees of jobs), by session (its reservations). No operation scans another uid's names, and no
// caller thread (session listener, ring poller, engine completions, reaper) does journal I/O.
//
// Durability, with a journal (daemon/persistent/persistent_journal.h): one batch thread drives
// every journal append, sync and compaction; the NVMe writes and flushes themselves run where the
// spill path's do, on the spill store's I/O thread through its io_uring queue
// (daemon/persistent/journal_file.h), so the batcher only copies and waits. A filled object is
// queued (not pinned: it may be spilled meanwhile); the batcher takes batches, round robin over
// uids (one uid's flood does not hold another's object back), pins each object only while it
// copies its bytes (from host memory, or read back from the spill store) into the journal's
// staging memory and their writes complete (small objects in host memory in groups: one wait
// for the device per group), then syncs the batch once and marks its objects
// durable (only after that flush completed), in fill order per uid. A delete or a job's free of
// an object whose record may be in the journal is answered only once its delete record is synced
// (the caller's `done` runs on the batch thread then), so a crash never brings back an object
// whose end was answered; one whose record was never started is answered at once (its queued
// write is skipped).
//
// Lock order: the store's lock, then a table's (ObjectTable methods), then the pool's. Memory a
// delete releases is given back to the tiers after the store's lock is dropped.
#ifndef TIER_DAEMON_PERSISTENT_PERSISTENT_STORE_H_
#define TIER_DAEMON_PERSISTENT_PERSISTENT_STORE_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "daemon/persistent/journal_format.h"
#include "daemon/persistent/persistent_journal.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/tier_manager.h"

namespace tier::daemon {

// One persistent object as `tierctl objects` shows it.
struct PersistentObjectInfo {
  uid_t uid = 0;
  std::string name;
  uint64_t bytes = 0;
  std::string tier;  // "host", "nvme", or "journal" (left on NVMe at start: no room to load it)
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

struct PersistentLimits {
  uint64_t quota_bytes_per_uid = 0;  // persistent_quota_bytes_per_uid
  uint64_t max_bytes = 0;            // persistent_max_bytes: every uid together
  uint32_t max_objects_per_uid = 0;  // persistent_max_objects_per_uid (names, reservations too)
  uint32_t max_objects = 0;          // persistent_max_objects
};

// The store as status and metrics show it.
struct PersistentUsage {
  PersistentLimits limits;
  uint64_t objects = 0;  // names, reservations included
  uint64_t bytes = 0;    // charged to persistent_max_bytes
  uint64_t uids = 0;     // with at least one name
  uint64_t writes_queued = 0;  // objects and deletes waiting for the journal's batcher
  bool journaled = false;
  JournalUsage journal;
};

class PersistentStore {
 public:
  static constexpr size_t kMaxNameBytes = journal::kMaxNameBytes;
  // A delete's answer, once it is durable (runs on the batch thread; must be short).
  using Done = std::function<void(absl::Status)>;

  // `journal`: where objects are written through to NVMe so they survive a restart (null: host
  // memory only, lost on restart).
  PersistentStore(TierManager& tiers, PersistentLimits limits,
                  PersistentJournal* journal = nullptr);
  ~PersistentStore();
  PersistentStore(const PersistentStore&) = delete;
  PersistentStore& operator=(const PersistentStore&) = delete;

  const PersistentLimits& limits() const { return limits_; }
  uint64_t quota_bytes_per_uid() const { return limits_.quota_bytes_per_uid; }

  // 1..kMaxNameBytes printable ASCII bytes: INVALID_ARGUMENT saying why otherwise.
  static absl::Status CheckName(absl::string_view name);

  // Reserves `name` in `uid`'s namespace for session `session`: the slot the session's next
  // offload creates the object in, of `len` bytes. ALREADY_EXISTS when the name holds an object,
  // or another session's offload into it has not ended yet; RESOURCE_EXHAUSTED, naming the
  // setting, when `len` does not fit the uid's quota or the node's now, or the uid or the node
  // has its most names (the offload is checked again when it runs: this answer comes with a
  // message, the job's only with a code).
  absl::StatusOr<ObjectSlot> Create(uid_t uid, absl::string_view name, uint64_t session,
                                    uint64_t len);
  // The object `name` of `uid`, and its length. NOT_FOUND; UNAVAILABLE for one left on NVMe at
  // start (no room to load it: delete it, or restart tierd with room).
  absl::StatusOr<ObjectSlot> Open(uid_t uid, absl::string_view name, uint64_t* len);
  // The state of the object `name` of `uid`. NOT_FOUND (also while its offload has not begun).
  absl::StatusOr<PersistentObjectState> Stat(uid_t uid, absl::string_view name) const;
  // Frees the object `name` of `uid` (its memory returns once jobs using it end). The answer now
  // (NOT_FOUND, or OK when no record of it can be in the journal), or nullopt: `done` gets it
  // once the deletion is durable.
  std::optional<absl::Status> Delete(uid_t uid, absl::string_view name, Done done);
  // Synchronous form (tests, tools): waits for the answer.
  absl::Status DeleteAndWait(uid_t uid, absl::string_view name);
  // The object `id` of `table` was freed by a job (a free, or a reload with
  // TIER_RELOAD_FREE_AFTER, of an id bound to it): its name goes. True when `durable` will run
  // once its journal record's end is synced (the job completes then); false: nothing to wait for.
  bool Forget(const std::shared_ptr<ObjectTable>& table, uint64_t id,
              std::function<void()> durable);
  // Session `session` gave back its binding of `slot` (kRelease): a name it reserved for it and
  // never filled goes.
  void Released(uint64_t session, const ObjectSlot& slot);
  // Session `session` ended: names it reserved but never filled are released, and objects that
  // no name reaches any more (a name it reserved twice, both filled) are freed.
  void SessionEnded(uint64_t session);
  // Every persistent object, by uid then name (admin: it walks them all).
  std::vector<PersistentObjectInfo> List() const;
  size_t size() const;  // objects in the uid tables
  PersistentUsage usage() const;
  // Shutdown: the journal writes already queued finish, then every persistent object leaves
  // host memory (the journal keeps the durable ones).
  void DropAll();

  // With a journal. At start, before any session: brings back every object the journal holds
  // whose bytes check out, admitted through the tiers like an offload (the spiller makes room on
  // NVMe). One that no tier has room for stays on NVMe in the journal: listed, charged and
  // deletable, loaded at a later start. Damaged ones are reported and dropped. Returns how many
  // came back into the tiers.
  size_t Restore();
  // A fill of an object in `table` succeeded (job executor): if it is a persistent object, its
  // bytes are queued for the journal; if no name reaches it (a reservation replaced), it is freed.
  void Filled(const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object);

 private:
  using Key = journal::Key;
  using KeyHash = journal::KeyHash;
  enum class Written : uint8_t {
    kNo,       // no record of this object is in the journal, and none is being appended
    kQueued,   // its put waits in the batcher's queue (skipped if the name goes first)
    kWriting,  // the batcher appends it now
    kYes,      // appended (durable once synced)
  };
  struct Entry {
    uint64_t id = 0;
    uint64_t reserved_by = 0;  // the session whose offload fills it; 0 once filled or ended
    uint64_t created_ms = 0;
    uint64_t len = 0;          // (kept for an unloaded one)
    Written written = Written::kNo;
    bool durable = false;      // synced in the journal
    bool unloaded = false;     // left on NVMe at start (charged outside the table)
  };
  struct Space {
    std::shared_ptr<ObjectTable> table;
    uint32_t names = 0;
  };
  // One job of the batch thread: write an object's bytes (object set) or end a name.
  struct JournalOp {
    Key key;
    uint64_t id = 0;
    std::shared_ptr<ObjectTable> table;
    std::shared_ptr<Object> object;  // null: a delete
    Done done;                       // deletes: the answer
  };

  Space& SpaceLocked(uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `it` and everything indexing it. Returns whether a delete record must be appended (a
  // record of it may be in the journal).
  bool EraseLocked(std::unordered_map<Key, Entry, KeyHash>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reservation of `session` under `id` that never became (or no longer names) an object:
  // forgets it; the object, if one exists with no name, is freed into *released.
  void DropReservationLocked(uint64_t session, uint64_t id, std::vector<Release>* released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The object a name of `uid` reaches now (NOT_FOUND for a bad name, a reservation whose
  // offload has not run, and another uid's name alike).
  struct Found {
    std::shared_ptr<ObjectTable> table;
    const Entry* entry;
    std::shared_ptr<Object> object;  // null for an unloaded one
  };
  absl::StatusOr<Found> FindLocked(uid_t uid, absl::string_view name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Enqueue(JournalOp op);
  void RunBatcher();
  // One batch: deletes first (each follows the put it ends, which was appended
  // before it was queued), then puts round robin over uids.
  void WriteBatch(std::vector<JournalOp> deletes, std::vector<JournalOp> puts);
  // Marks a queued put as being written; false when its name went (or moved on) meanwhile.
  bool Claim(const JournalOp& op);
  // Appends the batch's puts in order, small objects in host memory grouped; the result of each
  // (none: not written, its name went meanwhile; NOT_FOUND: its object went).
  std::vector<std::optional<absl::Status>> AppendPuts(const std::vector<JournalOp>& puts);
  // Appends an object's bytes wherever they are now. OK, or why not (NOT_FOUND: gone meanwhile).
  absl::Status AppendObject(const JournalOp& op);
  // Restore of one record: an object in the tiers, or left on NVMe, or refused.
  bool RestoreOne(const PersistentJournal::Record& record);

  TierManager& tiers_;
  const PersistentLimits limits_;
  const std::shared_ptr<SharedQuota> node_quota_;
  mutable Mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> entries_ ABSL_GUARDED_BY(mu_);
  // Every id a name was reserved under -> that name (an id whose entry moved on is an orphan).
  std::unordered_map<uint64_t, Key> ids_ ABSL_GUARDED_BY(mu_);
  // Session -> ids it reserved whose offload has not landed.
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> reservations_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uid_t, Space> spaces_ ABSL_GUARDED_BY(mu_);
  uint64_t names_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  PersistentJournal* const journal_;
  mutable Mutex batch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  CondVar batch_cv_;
  std::deque<JournalOp> deletes_ ABSL_GUARDED_BY(batch_mu_);
  std::unordered_map<uid_t, std::deque<JournalOp>> puts_ ABSL_GUARDED_BY(batch_mu_);
  std::deque<uid_t> turns_ ABSL_GUARDED_BY(batch_mu_);  // uids with puts queued, in turn
  uint64_t queued_ ABSL_GUARDED_BY(batch_mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(batch_mu_) = false;
  bool batcher_exited_ ABSL_GUARDED_BY(batch_mu_) = false;  // nothing queued from now is written
  std::thread batcher_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_PERSISTENT_PERSISTENT_STORE_H_
