// The NVMe spill store: host-pool data written to preallocated files (one per spill directory)
// and read back, every record checksummed (CRC-32C) and verified on the way back.
//
// Files: at Create, each directory gets one file (`file_name`), locked against a second daemon
// (flock), preallocated to `file_bytes` (fallocate) and opened O_DIRECT. Where the filesystem
// refuses O_DIRECT (checked by a real aligned write and read, not by the filesystem's name) the
// file falls back to buffered I/O with a warning, unless direct_io is kRequired. An
// ExtentAllocator per file hands out 4096-aligned extents; nothing is persisted across restarts
// (the host pool is not either), so the files are recreated and, by default, removed at close.
//
// I/O: a record is moved in requests of at most `io_bytes`, at most `queue_depth` of them in
// flight per file (device), through one IoQueue for all files (io_uring with registered buffers
// and files where available, else a thread pool; see io_queue.h). Reads are issued before writes:
// a reload is what a job waits on.
// The CRC of a write is computed while its chunks are already on their way to the device; the CRC
// of a read is extended over each chunk as soon as all chunks before it have arrived.
//
// Integrity: every chunk of a record (io_bytes of it; the last one shorter) has its own CRC-32C,
// computed at write and kept by the store with the record. A read verifies each chunk as soon as
// it and every chunk before it have arrived, and reports the verified prefix through its optional
// `progress` callback, so a caller can pass verified bytes on while the rest is still being read;
// a chunk that does not match fails the read (DATA_LOSS naming the chunk) and nothing past the
// verified prefix is ever reported.
//
// Buffers: `src` of Write and `dst` of Read must be 4096-aligned (O_DIRECT) and hold `len` bytes
// rounded up to 4096 (host-pool extents are): the whole last block is written and read back; the
// bytes past `len` are not checksummed. `src` must stay unchanged, and `dst` untouched by the
// caller, until the operation's callback has run.
//
// Errors: an I/O error (EIO, ENOSPC, short transfer), a checksum mismatch (DATA_LOSS naming the
// record) or running out of space fails that one operation with a status saying what and where;
// its extent goes back to the free space (a failed write) or stays with its record (a failed read,
// which may be retried); other records and later operations are unaffected. A Read that reports
// an error may have written partial or wrong bytes into `dst`: only an OK status hands data over.
//
// Attached files: a file besides the spill files (the persistent journal's) may be written, read
// and flushed through the same queue and I/O thread (AttachFile, FileIo), its writes from the
// store's staging memory (aligned, registered with the queue like the host pool). The caller
// owns the file and its layout; the store only moves the requests, ahead of spill writes.
//
// Threading: Write, Read, Free, Usage and the *AndWait helpers are thread-safe. The store runs one
// internal I/O thread that owns the IoQueue; every WriteDone/ReadDone callback runs on that thread,
// exactly once for each Write/Read that returned OK, and must be short and must not call
// WriteAndWait/ReadAndWait (it may call Write, Read and Free). Destroying the store cancels
// operations that have not started (their callbacks get CANCELLED), waits for the ones in flight
// (their callbacks get the real result), then closes the files.
#ifndef TIER_STORAGE_SPILL_STORE_H_
#define TIER_STORAGE_SPILL_STORE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "storage/extent_allocator.h"
#include "storage/io_queue.h"

namespace tier::storage {

// What the caller keeps for spilled data. Plain data: copy it freely; it stays valid until Free.
struct SpillRecord {
  uint64_t id = 0;      // unique within the store, never 0
  uint32_t file = 0;    // index of the spill file (the order of SpillStoreOptions::directories)
  Extent extent;        // where in that file; bytes is len rounded up to 4096
  uint64_t len = 0;     // bytes of data
  // (The CRC-32C of each chunk stays in the store: see "Integrity" above.)
  friend bool operator==(const SpillRecord&, const SpillRecord&) = default;
};

enum class DirectIo {
  kAuto,      // O_DIRECT, or buffered with a warning where the filesystem refuses it
  kRequired,  // O_DIRECT or fail to start
  kOff,       // buffered
};

struct SpillStoreOptions {
  std::vector<std::string> directories = {};  // one spill file each; they must exist
  uint64_t file_bytes = 0;               // per file; rounded down to 4096; > 0
  uint64_t io_bytes = 1 << 20;           // largest single request; a multiple of 4096
  uint32_t queue_depth = 16;             // requests in flight per file (device)
  IoQueueKind io_queue = IoQueueKind::kAuto;
  uint32_t io_threads = 0;               // thread-pool queue only; 0: one per depth slot
  DirectIo direct_io = DirectIo::kAuto;
  // Memory that Write/Read buffers lie in (the host pool): registered once with the io queue.
  std::vector<IoBuffer> registered_buffers = {};
  std::string file_name = "tierd.spill";
  bool remove_files = true;  // unlink the files when the store is destroyed
  // A spill file another process holds (flock) is waited for this long, logged, before Create
  // fails: a tierd killed a moment ago keeps its files until the kernel has torn down its io_uring,
  // which happens asynchronously after the process was reaped. 0: fail at once.
  uint32_t lock_wait_ms = 0;
  // Aligned memory for attached files' writes, registered with the io queue (0: none).
  uint64_t staging_bytes = 0;
  // Tests: wraps the io queue the store would use (e.g. in a FaultyIoQueue).
  std::function<std::unique_ptr<IoQueue>(std::unique_ptr<IoQueue>)> wrap_io_queue = nullptr;
};

struct SpillFileUsage {
  std::string directory;
  std::string path;
  bool direct_io = false;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t records = 0;        // live (not freed) records
  uint64_t bytes_written = 0;  // bytes the device accepted, whole blocks
  uint64_t bytes_read = 0;
  uint64_t writes = 0;  // records written successfully
  uint64_t reads = 0;   // records read and verified
  uint64_t write_errors = 0;
  uint64_t read_errors = 0;  // I/O errors; checksum mismatches are counted apart
  uint64_t checksum_failures = 0;
};

class SpillStore {
 public:
  using WriteDone = absl::AnyInvocable<void(absl::StatusOr<SpillRecord>)>;
  using ReadDone = absl::AnyInvocable<void(absl::Status)>;
  // Bytes of the record from its start that have arrived and matched their CRCs; grows with each
  // call; runs on the I/O thread, before ReadDone, never after a failure. Must be short.
  using ReadProgress = absl::AnyInvocable<void(uint64_t verified_bytes)>;

  static absl::StatusOr<std::unique_ptr<SpillStore>> Create(SpillStoreOptions options);
  ~SpillStore();
  SpillStore(const SpillStore&) = delete;
  SpillStore& operator=(const SpillStore&) = delete;

  // Spills `len` bytes at `src`. OK: `done` will run once, on the I/O thread, with the record or
  // the error. Not OK (bad arguments, no file with room: RESOURCE_EXHAUSTED, store closing):
  // nothing was started and `done` is dropped without being called.
  absl::Status Write(const char* src, uint64_t len, WriteDone done);
  // Reads `record` into `dst` and verifies its CRC. Same contract as Write; NOT_FOUND for a record
  // this store does not hold (never written, or freed).
  absl::Status Read(const SpillRecord& record, char* dst, ReadDone done,
                    ReadProgress progress = nullptr);
  // Returns the record's space. Reads of it already started still complete (the space is reused
  // only after them); later Reads get NOT_FOUND. NOT_FOUND for an unknown or already freed record.
  absl::Status Free(const SpillRecord& record);

  // Blocking forms for callers that are not the I/O thread (tools, tests).
  absl::StatusOr<SpillRecord> WriteAndWait(const char* src, uint64_t len);
  absl::Status ReadAndWait(const SpillRecord& record, char* dst);

  // ---- Attached files (see above). `fd` stays open until DetachFile returned; where it is
  // O_DIRECT, requests' buffers, offsets and lengths are 4096-aligned. AttachFile and DetachFile
  // wait for the I/O thread: never call them from a callback.
  absl::StatusOr<uint32_t> AttachFile(int fd);
  // No request of `file` may be outstanding.
  absl::Status DetachFile(uint32_t file);
  using FileDone = absl::AnyInvocable<void(absl::Status)>;
  // One request of an attached file: a read or write of `len` bytes at `offset`, or a kSync
  // (fdatasync; it covers the writes that completed before it was asked for, not those in
  // flight: the caller waits for them first). OK: `done` runs once, on the I/O thread, with the
  // result. Not OK (bad arguments, store closing): nothing started, `done` dropped.
  absl::Status FileIo(uint32_t file, IoOp op, uint64_t offset, char* buf, uint64_t len,
                      FileDone done);
  // The staging memory (staging_bytes of SpillStoreOptions; null when 0), 4096-aligned.
  char* staging() const { return staging_; }
  uint64_t staging_bytes() const { return staging_bytes_; }

  std::vector<SpillFileUsage> Usage() const;
  std::string_view io_queue_name() const { return io_queue_name_; }
  uint64_t io_bytes() const { return io_bytes_; }
  size_t files() const { return files_.size(); }
  const std::string& file_path(uint32_t file) const;
  // "spill record 7 (/var/tmp/d/tierd.spill at offset 4096, 1000 bytes)"
  std::string Describe(const SpillRecord& record) const;

 private:
  struct File;
  static absl::StatusOr<std::unique_ptr<File>> OpenFile(
      const SpillStoreOptions& options, const std::string& dir, uint64_t file_bytes,
      std::vector<std::pair<dev_t, ino_t>>& opened);
  struct Op;
  struct Live {
    SpillRecord record;
    std::vector<uint32_t> chunk_crcs;  // one per io_bytes of record.len
    uint32_t readers = 0;  // Reads accepted and not finished
    bool freed = false;    // Free came while readers > 0: release the extent after the last one
  };

  SpillStore(uint64_t io_bytes, uint32_t file_depth, std::vector<std::unique_ptr<File>> files,
             std::unique_ptr<IoQueue> queue, char* staging, uint64_t staging_bytes);
  void Post(std::unique_ptr<Op> op);
  // Runs `task` on the I/O thread (it owns the queue) and waits for it.
  absl::Status OnIoThread(absl::AnyInvocable<absl::Status()> task);
  void RunTasks();
  // Issues file ops; false when the queue is full.
  bool IssueFileOps(std::vector<Op*>* failed);
  void Run();  // the I/O thread
  void Issue();
  void HandleCompletion(const IoCompletion& completion);
  void Finish(Op* op);
  void ReleaseLocked(File& file, const Extent& extent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t io_bytes_;
  const uint32_t file_depth_;  // requests in flight per file at most
  std::vector<std::unique_ptr<File>> files_;  // outlives queue_ (declared first, destroyed last)
  std::unique_ptr<IoQueue> queue_;            // I/O thread only (Wake: any thread)
  std::string io_queue_name_;

  mutable Mutex mu_;
  CondVar cv_;                 // the idle I/O thread waits for inbox_ or stopping_
  std::vector<std::unique_ptr<Op>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool in_poll_ ABSL_GUARDED_BY(mu_) = false;  // the I/O thread may block in Poll
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  // I/O thread only.
  std::list<std::unique_ptr<Op>> reads_;
  std::list<std::unique_ptr<Op>> writes_;
  std::list<std::unique_ptr<Op>> file_ops_;  // attached files' requests
  std::vector<int> attached_;  // attached file -> queue index (-1: detached)
  struct ChunkRef {
    Op* op = nullptr;
    uint32_t chunk = 0;
  };
  std::unordered_map<uint64_t, ChunkRef> chunks_;  // IoRequest user_data -> chunk
  uint64_t next_tag_ = 1;

  char* const staging_;  // mmap'd; unmapped after the queue is gone
  const uint64_t staging_bytes_;
  std::thread thread_;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_SPILL_STORE_H_
