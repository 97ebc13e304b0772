// One file of the persistent journal (daemon/persistent/persistent_journal.h), written through
// the NVMe spill path's mechanism: the spill store's io queue and I/O thread (an attached file,
// storage/spill_store.h), O_DIRECT where the filesystem takes it (buffered where it does not,
// as the spill files fall back), from the store's staging memory (aligned, registered).
//
// Records are packed and of any length; the device takes whole aligned blocks. So the bytes of
// the file's last, partial block are kept here (tail_) and written again, ahead of what follows
// them, by the next append; the rest of that block is zero (padding, which a scan reads as the
// end: journal_format.h).
//
// Append returns once every byte it was given is written (not yet flushed), copying into one
// staging chunk while the chunks before it are on their way. An Append that fails leaves the
// file as it was (cut back to its end, the padding zero again) and end() unchanged. Sync asks the
// queue for an fdatasync only after every write completed (Append waited for them), and returns
// once it completed: what Append wrote before it is on the device then, not before.
//
// Thread-compatible: one caller thread at a time (the journal's; the staging memory is used by
// one file at a time, and the journal writes one file at a time); the store's I/O thread runs
// only the completions.
#ifndef TIER_DAEMON_PERSISTENT_JOURNAL_FILE_H_
#define TIER_DAEMON_PERSISTENT_JOURNAL_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "storage/spill_store.h"

namespace tier::daemon {

class JournalFile {
 public:
  // Opens `path` (created, O_EXCL, when `create`) for appends at `end` (the bytes before it
  // stand; what follows is overwritten). `direct`: O_DIRECT (storage::DirectIoWorks said yes).
  static absl::StatusOr<std::unique_ptr<JournalFile>> Open(storage::SpillStore& io,
                                                           std::string path, bool create,
                                                           bool direct, uint64_t end);
  ~JournalFile();
  JournalFile(const JournalFile&) = delete;
  JournalFile& operator=(const JournalFile&) = delete;

  // A buffered descriptor of the file, for reads (pread), fstat and ftruncate.
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  void Renamed(std::string path) { path_ = std::move(path); }
  uint64_t end() const { return end_; }
  // The file's size on disk once `bytes` more are appended (its last block is whole).
  uint64_t SizeAfter(uint64_t bytes) const { return (end_ + bytes + 4095) & ~uint64_t{4095}; }
  bool direct() const { return direct_io_.valid(); }

  // Writes `pieces`, one after another, at end(); see above.
  absl::Status Append(absl::Span<const absl::string_view> pieces);
  // Every Append so far is on the device when this returns OK.
  absl::Status Sync();

 private:
  JournalFile(storage::SpillStore& io, std::string path, UniqueFd fd, UniqueFd direct_io,
              uint64_t end);
  absl::Status Init();
  // A staging chunk no write uses any more (waits for the oldest one).
  char* NextChunk();
  // Hands `len` bytes (whole blocks) of `chunk` to the queue, for `offset` of the file.
  void Submit(char* chunk, uint64_t offset, uint64_t len);
  // Until no request is in flight; the first error since the last call, or OK.
  absl::Status AwaitAll();
  // After a failed Append: the file back to end_ and its padding, the error counted by the caller.
  void CutBack();

  storage::SpillStore& io_;
  std::string path_;
  UniqueFd fd_;         // buffered
  UniqueFd direct_io_;  // O_DIRECT (invalid: the file is written through fd_)
  uint32_t attached_ = 0;
  bool is_attached_ = false;
  uint64_t end_ = 0;
  uint64_t synced_end_ = 0;
  std::string tail_;  // the bytes of the last block before end_ (end_ % 4096 of them)
  char* staging_ = nullptr;  // the store's, or own_staging_
  std::unique_ptr<char, void (*)(void*)> own_staging_{nullptr, nullptr};
  uint64_t chunk_bytes_ = 0;
  uint32_t chunks_ = 0;
  uint32_t next_chunk_ = 0;

  Mutex mu_;
  CondVar cv_;  // a request completed
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunk_busy_ ABSL_GUARDED_BY(mu_) = 0;  // bit i: chunk i is being written
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_PERSISTENT_JOURNAL_FILE_H_
