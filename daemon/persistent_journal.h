// Persistent objects on NVMe, so that they survive a restart of tierd (issue 17).
//
// One directory (<first spill_dir>/persistent): a data file per object and a manifest naming
// them: uid, name, length, CRC-32C of the bytes, file. The manifest is rewritten whole on every
// change, crash-consistently: written to manifest.new, fsynced, renamed over manifest, and the
// directory fsynced; a data file is written and fsynced before the manifest that names it, and
// unlinked only after the manifest that no longer does. So after a crash at any point the
// manifest is the old or the new one, and every object it names was whole on disk.
//
// Nothing read back is trusted: the manifest carries its own CRC-32C (a torn or edited manifest
// is DATA_LOSS: none of it is served, it is moved aside to manifest.damaged and reported), and
// each object's bytes are checked against its CRC when loaded (DATA_LOSS: that object is not
// served). An object whose write had not landed when tierd died is not in the manifest: objects
// only in host memory are lost on restart.
//
// Thread-compatible: the PersistentStore calls it from its writer thread and at start only.
#ifndef TIER_DAEMON_PERSISTENT_JOURNAL_H_
#define TIER_DAEMON_PERSISTENT_JOURNAL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tier::daemon {

class PersistentJournal {
 public:
  struct Record {
    uid_t uid = 0;
    std::string name;
    uint64_t len = 0;
    uint32_t crc = 0;
    std::string file;  // in the journal's directory
  };

  // Opens (creating) `dir` and reads its manifest. A damaged manifest is not an error here: it
  // is moved aside and manifest_status() says what was wrong.
  static absl::StatusOr<std::unique_ptr<PersistentJournal>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // OK, or DATA_LOSS naming what was wrong with the manifest found at Open.
  const absl::Status& manifest_status() const { return manifest_status_; }
  // The records the manifest named at Open (and those added since).
  const std::vector<Record>& records() const { return records_; }

  // Writes `len` bytes as the object `name` of `uid` (replacing one of that name).
  absl::Status Add(uid_t uid, const std::string& name, const char* data, uint64_t len);
  // Forgets `name` of `uid` (OK if it was not there).
  absl::Status Remove(uid_t uid, const std::string& name);
  // Reads a record's bytes into `out` (`record.len` bytes) and checks them: DATA_LOSS when the
  // file is short or its checksum differs.
  absl::Status Load(const Record& record, char* out) const;

 private:
  explicit PersistentJournal(std::string dir) : dir_(std::move(dir)) {}
  absl::Status ReadManifest();
  absl::Status WriteManifest();

  const std::string dir_;
  absl::Status manifest_status_;
  std::vector<Record> records_;
  uint64_t next_file_ = 1;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_PERSISTENT_JOURNAL_H_
