// Persistent objects on NVMe, so that they survive a restart of tierd.
//
// One directory (<first spill_dir>/persistent) holding one append-only file, journal-<G> (G the
// generation): each put of an object appends a record with its bytes, each delete a small record
// (format and checks: daemon/persistent/journal_format.h). Appends of many objects are made durable
// together by one Sync (fdatasync), so the cost of durability is the bytes, not a rewrite per
// object. Every write and flush of the journal goes through the NVMe spill path's mechanism (the
// spill store's io queue and I/O thread, O_DIRECT where the directory takes it, as the spill
// files: daemon/persistent/journal_file.h); reads (Open, Load, a compaction's copy) are plain. When dead records (replaced or deleted) take as much room as the live ones, the live
// records are copied into a new generation: journal-<G+1>.new is written and synced, renamed to
// journal-<G+1> (directory synced), and only then is journal-<G> removed. After a crash at any
// point the newest whole generation holds every record that was synced, and at Open:
//   - an older generation beside a newer one (the removal did not land) is removed;
//   - a .new file (a compaction cut short) is removed;
//   - a torn tail (an append cut short) is cut off;
//   - a file whose header is damaged is set aside (journal-<G>.damaged) and none of it served;
//   - a file damaged in the middle serves what precedes the damage and is set aside after its
//     live records were copied into a new generation.
// Generation numbers only grow, over every file in the directory, set-aside ones included, so a
// new file never takes the name of data already on disk. The issue-17 layout (a text manifest
// and a file per object) is imported once, then removed.
//
// The file is bounded by max_bytes: an append that would pass it compacts first, and fails
// RESOURCE_EXHAUSTED if that is not enough (the object then stays in memory only).
//
// Nothing read back is trusted: record headers carry their own CRC-32C and each object's bytes
// are checked against theirs when loaded (DATA_LOSS: that object is not served).
//
// Thread-compatible: the PersistentStore calls it at start (Open, Records, Load) and then from its
// batch thread only (never from the spill store's I/O thread, which it waits for); usage() may be
// read from any thread.
#ifndef TIER_DAEMON_PERSISTENT_PERSISTENT_JOURNAL_H_
#define TIER_DAEMON_PERSISTENT_PERSISTENT_JOURNAL_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/persistent/journal_file.h"
#include "daemon/persistent/journal_format.h"
#include "storage/spill_store.h"

namespace tier::daemon {

struct JournalOptions {
  uint64_t max_bytes = 0;  // the journal file may not grow past this (0: no bound)
  // Dead bytes below this never trigger a compaction (small journals are not rewritten often).
  uint64_t compact_min_dead_bytes = 16 << 20;
  // As the spill files': O_DIRECT where the directory takes it (kAuto), always (kRequired: Open
  // fails where it is refused) or never (kOff).
  storage::DirectIo direct_io = storage::DirectIo::kAuto;
};

struct JournalUsage {
  uint64_t file_bytes = 0;  // on disk now
  uint64_t live_bytes = 0;  // records of live objects (the rest is dead, until compacted)
  uint64_t live_records = 0;
  uint64_t max_bytes = 0;
  uint64_t compactions = 0;
  uint64_t errors = 0;  // failed appends, syncs and compactions
};

class PersistentJournal {
 public:
  using Record = journal::LiveRecord;

  // Opens (creating) `dir` and reads its journal; its writes go through `io` (which outlives the
  // journal). Damage is not an error here: what was damaged is set aside and open_status() says
  // what.
  static absl::StatusOr<std::unique_ptr<PersistentJournal>> Open(const std::string& dir,
                                                                 storage::SpillStore& io,
                                                                 JournalOptions options = {});
  ~PersistentJournal();

  const std::string& dir() const { return dir_; }
  // OK, or DATA_LOSS saying what was damaged at Open and is not served.
  const absl::Status& open_status() const { return open_status_; }
  // What Open cleaned up or imported (a torn tail cut off, leftovers removed), for the log.
  const std::vector<std::string>& open_notes() const { return notes_; }
  // The live records, in the order they were written.
  std::vector<Record> Records() const;
  std::optional<Record> Find(uid_t uid, absl::string_view name) const;

  // Appends `len` bytes as the object `name` of `uid` (replacing one of that name). Durable after
  // the next Sync. RESOURCE_EXHAUSTED past max_bytes; an I/O error leaves the file as it was.
  absl::Status AppendPut(uid_t uid, absl::string_view name, const char* data, uint64_t len);
  // Appends `puts` one after another, all or none (one wait for their writes: the batcher groups
  // small objects so that each does not wait for the device alone). A group that does not fit is
  // RESOURCE_EXHAUSTED without counting an error (its objects may be tried one by one).
  struct Put {
    uid_t uid = 0;
    absl::string_view name;
    const char* data = nullptr;
    uint64_t len = 0;
  };
  absl::Status AppendPuts(absl::Span<const Put> puts);
  // Appends the end of `name` of `uid` (nothing, and OK, when it is not live).
  absl::Status AppendDelete(uid_t uid, absl::string_view name);
  // Every append so far is on the device when this returns OK (and not before: the flush is
  // asked for only once every append's writes completed).
  absl::Status Sync();
  // Whether the journal's file is written O_DIRECT (false: the directory refuses it).
  bool direct_io() const { return direct_; }
  // Copies the live records into a new generation when the dead ones take at least as much room
  // (and compact_min_dead_bytes), or when `force`. Records' offsets change: Find them again.
  absl::Status CompactIfDue(bool force = false);
  // Reads a record's bytes into `out` (`record.len` bytes) and checks them: DATA_LOSS when they
  // are short or their checksum differs.
  absl::Status Load(const Record& record, char* out) const;

  JournalUsage usage() const;

 private:
  PersistentJournal(std::string dir, storage::SpillStore& io, JournalOptions options)
      : dir_(std::move(dir)), io_(io), options_(options) {}
  std::string PathOf(uint64_t generation) const;
  absl::Status OpenFiles();
  absl::Status CreateGeneration();
  absl::Status ImportLegacy();
  absl::Status Append(absl::Span<const absl::string_view> pieces);
  // Compacts when `bytes` more would pass max_bytes; RESOURCE_EXHAUSTED if that is not enough.
  absl::Status MakeRoom(uint64_t bytes);
  absl::Status Compact();
  // Copies the records `order` names into `to`, their new offsets into *offsets.
  absl::Status CopyLive(JournalFile& to, const std::vector<Record*>& order,
                        std::vector<uint64_t>* offsets) const;
  void Count();
  absl::Status Failed(absl::Status status);

  const std::string dir_;
  storage::SpillStore& io_;
  const JournalOptions options_;
  bool direct_ = false;
  absl::Status open_status_;
  std::vector<std::string> notes_;
  std::unique_ptr<JournalFile> file_;
  uint64_t generation_ = 0;
  uint64_t max_generation_ = 0;  // of every file seen, set-aside ones included
  bool set_aside_ = false;       // the current file is damaged: kept as .damaged when compacted
  uint64_t next_seq_ = 1;
  std::unordered_map<journal::Key, Record, journal::KeyHash> live_;
  uint64_t live_bytes_ = 0;
  std::atomic<uint64_t> file_bytes_seen_{0};
  std::atomic<uint64_t> live_bytes_seen_{0};
  std::atomic<uint64_t> live_records_seen_{0};
  std::atomic<uint64_t> compactions_{0};
  std::atomic<uint64_t> errors_{0};
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_PERSISTENT_PERSISTENT_JOURNAL_H_
