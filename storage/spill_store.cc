#include "storage/spill_store.h"

#include "common/thread_role.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "storage/crc32c.h"
#include "storage/direct_io.h"
#include "storage/spill_store_op.h"

namespace tier::storage {
namespace {

constexpr uint64_t kBlock = kDirectIoBlock;

uint64_t RoundUp(uint64_t n) { return (n + kBlock - 1) & ~(kBlock - 1); }

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & (kBlock - 1)) == 0; }

// Opens and locks `path`. Two daemons on one spill directory would overwrite each other's records:
// the file is locked (flock) for the store's life. `opened` are the files this store holds already
// (a directory named twice, through a link say, is refused at once); a lock held by another
// process is waited for up to lock_wait_ms (see SpillStoreOptions::lock_wait_ms).
absl::StatusOr<UniqueFd> OpenLocked(const std::string& path, bool direct, uint32_t lock_wait_ms,
                                    const std::vector<std::pair<dev_t, ino_t>>& opened) {
  int flags = O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0);
  UniqueFd fd(::open(path.c_str(), flags, 0600));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("fstat ", path));
  if (std::find(opened.begin(), opened.end(), std::make_pair(st.st_dev, st.st_ino)) != opened.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spill file ", path, " is another spill directory's file (listed twice)"));
  }
  const auto start = std::chrono::steady_clock::now();
  auto waited_ms = [&start] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
  };
  bool logged = false;
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoStatus(absl::StrCat("flock ", path));
    const uint64_t waited = waited_ms();
    if (waited >= lock_wait_ms) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spill file ", path, " is in use by another process",
          lock_wait_ms > 0 ? absl::StrCat(" (waited ", waited, " ms for it)") : "",
          ": is another tierd using this spill directory?"));
    }
    if (!logged) {
      logged = true;
      LogWarning("spill file ", path, " is held by another process: waiting for it, at most ",
                 lock_wait_ms, " ms (a tierd killed a moment ago holds its files until the kernel "
                 "has torn down its io_uring)");
    }
    // (Start-up only, and rare: a short poll, not a blocking flock that could not time out.)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (logged) LogInfo("spill file ", path, ": free after ", waited_ms(), " ms");
  return fd;
}

}  // namespace

struct SpillStore::File {
  explicit File(uint64_t bytes) : allocator(bytes, kBlock) {}
  ~File() {
    if (remove && fd.valid()) ::unlink(path.c_str());
  }

  std::string directory;
  std::string path;
  UniqueFd fd;
  bool direct = false;
  bool remove = true;
  int queue_index = -1;
  uint32_t in_flight = 0;  // requests in the io queue; I/O thread only
  // Guarded by SpillStore::mu_.
  ExtentAllocator allocator;
  std::unordered_map<uint64_t, Live> live;  // extent offset -> record
  uint64_t records = 0;                     // entries of `live` not freed
  SpillFileUsage usage;                     // the counters; sizes are filled in by Usage()
};

// The spill file in `dir`: created or reused, locked (waiting up to lock_wait_ms for a killed
// tierd's lock), preallocated to file_bytes, O_DIRECT where the filesystem takes it (and the
// options allow); `opened` (the files opened so far) tells a directory named twice apart.
absl::StatusOr<std::unique_ptr<SpillStore::File>> SpillStore::OpenFile(
    const SpillStoreOptions& options, const std::string& dir, uint64_t file_bytes,
    std::vector<std::pair<dev_t, ino_t>>& opened) {
  auto file = std::make_unique<File>(file_bytes);
  file->directory = dir;
  file->path = absl::StrCat(dir, "/", options.file_name);
  file->remove = options.remove_files;
  bool direct = options.direct_io != DirectIo::kOff;
  absl::StatusOr<UniqueFd> fd = OpenLocked(file->path, direct, options.lock_wait_ms, opened);
  if (!fd.ok() && direct && absl::IsInvalidArgument(fd.status())) {
    // EINVAL at open: O_DIRECT refused outright (tmpfs before Linux 6.6).
    if (options.direct_io == DirectIo::kRequired) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spill directory ", dir, " does not support O_DIRECT: ", fd.status().message()));
    }
    direct = false;
    fd = OpenLocked(file->path, false, options.lock_wait_ms, opened);
  }
  if (!fd.ok()) return fd.status();
  file->fd = std::move(*fd);

  if (::fallocate(file->fd.get(), 0, 0, static_cast<off_t>(file_bytes)) != 0) {
    int err = errno;
    if (err != EOPNOTSUPP) {
      ::unlink(file->path.c_str());
      return ErrnoStatus(absl::StrCat("preallocate ", file_bytes, " bytes for ", file->path), err);
    }
    LogWarning("spill: ", dir, " cannot preallocate (fallocate unsupported); the file is sparse ",
               "and a full disk shows up as write errors");
  }
  if (::ftruncate(file->fd.get(), static_cast<off_t>(file_bytes)) != 0) {  // shrink a larger leftover
    return ErrnoStatus(absl::StrCat("ftruncate ", file->path));
  }
  if (direct) {
    absl::Status probe = ProbeDirectIo(file->fd.get());
    if (absl::IsInvalidArgument(probe)) {
      if (options.direct_io == DirectIo::kRequired) {
        return absl::FailedPreconditionError(absl::StrCat(
            "spill directory ", dir, " does not support O_DIRECT: ", probe.message()));
      }
      direct = false;
      file->fd.reset();  // drops the lock before taking it again below
      absl::StatusOr<UniqueFd> buffered =
          OpenLocked(file->path, false, options.lock_wait_ms, opened);
      if (!buffered.ok()) return buffered.status();
      file->fd = std::move(*buffered);
      probe = ProbeDirectIo(file->fd.get());
    }
    if (!probe.ok()) return probe;
  }
  if (!direct && options.direct_io != DirectIo::kOff) {
    LogWarning("spill: ", dir, " refuses O_DIRECT (tmpfs?): using buffered I/O, which goes ",
               "through the page cache");
  }
  file->direct = direct;
  struct stat st {};
  if (::fstat(file->fd.get(), &st) == 0) opened.emplace_back(st.st_dev, st.st_ino);
  return file;
}

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::Create(SpillStoreOptions options) {
  if (options.directories.empty()) return absl::InvalidArgumentError("no spill directory");
  uint64_t file_bytes = options.file_bytes & ~(kBlock - 1);
  if (file_bytes == 0) return absl::InvalidArgumentError("spill file size must be >= 4096 bytes");
  if (options.io_bytes == 0 || options.io_bytes % kBlock != 0 || options.io_bytes > (1u << 30)) {
    return absl::InvalidArgumentError("spill io size must be a multiple of 4096, at most 1 GiB");
  }

  std::vector<std::unique_ptr<File>> files;
  std::vector<std::pair<dev_t, ino_t>> opened;  // the files, one per directory
  for (const std::string& dir : options.directories) {
    absl::StatusOr<std::unique_ptr<File>> file = OpenFile(options, dir, file_bytes, opened);
    if (!file.ok()) return file.status();
    files.push_back(*std::move(file));
  }

  // queue_depth per file: each device gets its own depth (one depth shared by all would drive N
  // devices at 1/N of it each).
  const uint64_t total_depth = uint64_t{options.queue_depth} * files.size();
  if (options.queue_depth == 0 || total_depth > kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spill queue depth ", options.queue_depth, " per file x ", files.size(),
        " files must be 1..", kMaxIoQueueDepth, " requests in all"));
  }
  absl::StatusOr<std::unique_ptr<IoQueue>> queue =
      MakeIoQueue({.kind = options.io_queue,
                   .depth = static_cast<uint32_t>(total_depth),
                   .threads = options.io_threads});
  if (!queue.ok()) return queue.status();
  if (options.wrap_io_queue) *queue = options.wrap_io_queue(std::move(*queue));
  char* staging = nullptr;
  const uint64_t staging_bytes = RoundUp(options.staging_bytes);
  if (staging_bytes > 0) {
    void* mapped = ::mmap(nullptr, staging_bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return ErrnoStatus("mmap of the spill store's staging memory");
    staging = static_cast<char*>(mapped);
    options.registered_buffers.push_back(IoBuffer{staging, staging_bytes});
  }
  if (!options.registered_buffers.empty()) {
    if (absl::Status s = (*queue)->RegisterBuffers(options.registered_buffers); !s.ok()) {
      LogWarning("spill: buffers not registered with the io queue (", s.message(),
                 "); I/O works, with per-request page pinning");
    }
  }
  for (auto& file : files) {
    absl::StatusOr<int> index = (*queue)->RegisterFile(file->fd.get());
    if (!index.ok()) {
      if (staging != nullptr) ::munmap(staging, staging_bytes);
      return index.status();
    }
    file->queue_index = *index;
    LogInfo("spill: ", file->path, ", ", file_bytes, " bytes, ",
            file->direct ? "O_DIRECT" : "buffered", ", ", std::string((*queue)->name()));
  }
  return std::unique_ptr<SpillStore>(new SpillStore(options.io_bytes, options.queue_depth,
                                                    std::move(files), std::move(*queue), staging,
                                                    staging_bytes));
}

SpillStore::SpillStore(uint64_t io_bytes, uint32_t file_depth,
                       std::vector<std::unique_ptr<File>> files, std::unique_ptr<IoQueue> queue,
                       char* staging, uint64_t staging_bytes)
    : io_bytes_(io_bytes), file_depth_(file_depth), files_(std::move(files)),
      queue_(std::move(queue)),
      io_queue_name_(queue_->name()),
      staging_(staging),
      staging_bytes_(staging_bytes) {
  thread_ = std::thread([this] { Run(); });
}

SpillStore::~SpillStore() {
  bool wake;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    wake = in_poll_;
  }
  cv_.Signal();
  if (wake) queue_->Wake();
  thread_.join();
  queue_.reset();  // waits for nothing more: the I/O thread drained it
  if (staging_ != nullptr) ::munmap(staging_, staging_bytes_);
}

const std::string& SpillStore::file_path(uint32_t file) const { return files_[file]->path; }

std::string SpillStore::Describe(const SpillRecord& record) const {
  std::string path = record.file < files_.size() ? files_[record.file]->path
                                                 : absl::StrCat("file #", record.file);
  return absl::StrCat("spill record ", record.id, " (", path, " at offset ", record.extent.offset,
                      ", ", record.len, " bytes)");
}

void SpillStore::Post(std::unique_ptr<Op> op) {
  bool wake;
  {
    MutexLock lock(&mu_);
    inbox_.push_back(std::move(op));
    wake = in_poll_;
  }
  // The I/O thread is either idle on cv_ or (in_poll_) possibly blocked in the queue's Poll; it
  // set in_poll_ under mu_ after seeing an empty inbox, so one of these two always reaches it.
  cv_.Signal();
  if (wake) queue_->Wake();
}

absl::Status SpillStore::Write(const char* src, uint64_t len, WriteDone done) {
  if (src == nullptr || len == 0) return absl::InvalidArgumentError("spill write of nothing");
  if (!Aligned(src)) return absl::InvalidArgumentError("spill write source is not 4096-aligned");
  auto op = std::make_unique<Op>();
  op->kind = IoOp::kWrite;
  op->buf = const_cast<char*>(src);  // only ever written to the file
  op->write_done = std::move(done);
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("spill store is closing");
    // The file with the most free space that has room: spreads records over the devices.
    File* best = nullptr;
    uint32_t best_index = 0;
    for (uint32_t i = 0; i < files_.size(); ++i) {
      File& f = *files_[i];
      if (f.allocator.largest_free() < RoundUp(len)) continue;
      if (best == nullptr || f.allocator.free_bytes() > best->allocator.free_bytes()) {
        best = &f;
        best_index = i;
      }
    }
    std::optional<Extent> extent;
    if (best != nullptr) extent = best->allocator.Allocate(len);
    if (!extent) {
      uint64_t free = 0;
      for (const auto& f : files_) free += f->allocator.free_bytes();
      return absl::ResourceExhaustedError(absl::StrCat(
          "spill store full: no file has ", RoundUp(len), " contiguous free bytes (", free,
          " bytes free in all)"));
    }
    op->record = SpillRecord{next_id_++, best_index, *extent, len};
    op->io_len = extent->bytes;
  }
  Post(std::move(op));
  return absl::OkStatus();
}

absl::Status SpillStore::Read(const SpillRecord& record, char* dst, ReadDone done,
                              ReadProgress progress) {
  if (dst == nullptr) return absl::InvalidArgumentError("spill read into nothing");
  if (!Aligned(dst)) return absl::InvalidArgumentError("spill read destination is not 4096-aligned");
  auto op = std::make_unique<Op>();
  op->kind = IoOp::kRead;
  op->buf = dst;
  op->read_done = std::move(done);
  op->progress = std::move(progress);
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("spill store is closing");
    if (record.file >= files_.size()) return absl::NotFoundError(Describe(record) + ": no such file");
    File& f = *files_[record.file];
    auto it = f.live.find(record.extent.offset);
    if (it == f.live.end() || it->second.freed || !(it->second.record == record)) {
      return absl::NotFoundError(Describe(record) + ": not held by this store (freed?)");
    }
    ++it->second.readers;
    op->record = it->second.record;
    op->chunk_crcs = it->second.chunk_crcs;
    op->io_len = record.extent.bytes;
    op->chunk_done.assign((op->io_len + io_bytes_ - 1) / io_bytes_, false);
  }
  Post(std::move(op));
  return absl::OkStatus();
}

absl::Status SpillStore::Free(const SpillRecord& record) {
  MutexLock lock(&mu_);
  if (record.file >= files_.size()) return absl::NotFoundError(Describe(record) + ": no such file");
  File& f = *files_[record.file];
  auto it = f.live.find(record.extent.offset);
  if (it == f.live.end() || it->second.freed || !(it->second.record == record)) {
    return absl::NotFoundError(Describe(record) + ": not held by this store (freed twice?)");
  }
  --f.records;
  if (it->second.readers > 0) {
    it->second.freed = true;  // the last reader releases the extent
  } else {
    ReleaseLocked(f, it->second.record.extent);
    f.live.erase(it);
  }
  return absl::OkStatus();
}

void SpillStore::ReleaseLocked(File& file, const Extent& extent) {
  if (!file.allocator.Free(extent)) {
    LogError("spill: allocator refused extent ", extent.offset, "+", extent.bytes, " of ",
             file.path, " (bookkeeping bug)");
  }
}

absl::StatusOr<SpillRecord> SpillStore::WriteAndWait(const char* src, uint64_t len) {
  Mutex mu;
  CondVar cv;
  std::optional<absl::StatusOr<SpillRecord>> result;
  absl::Status posted = Write(src, len, [&](absl::StatusOr<SpillRecord> r) {
    MutexLock lock(&mu);
    result = std::move(r);
    cv.Signal();
  });
  if (!posted.ok()) return posted;
  MutexLock lock(&mu);
  while (!result.has_value()) cv.Wait(&mu);
  return std::move(*result);
}

absl::Status SpillStore::ReadAndWait(const SpillRecord& record, char* dst) {
  Mutex mu;
  CondVar cv;
  std::optional<absl::Status> result;
  absl::Status posted = Read(record, dst, [&](absl::Status s) {
    MutexLock lock(&mu);
    result = std::move(s);
    cv.Signal();
  });
  if (!posted.ok()) return posted;
  MutexLock lock(&mu);
  while (!result.has_value()) cv.Wait(&mu);
  return std::move(*result);
}

std::vector<SpillFileUsage> SpillStore::Usage() const {
  MutexLock lock(&mu_);
  std::vector<SpillFileUsage> out;
  for (const auto& f : files_) {
    SpillFileUsage u = f->usage;
    u.directory = f->directory;
    u.path = f->path;
    u.direct_io = f->direct;
    u.capacity_bytes = f->allocator.capacity();
    u.used_bytes = f->allocator.used_bytes();
    u.largest_free = f->allocator.largest_free();
    u.records = f->records;
    out.push_back(std::move(u));
  }
  return out;
}

// ---- The I/O thread ----

void SpillStore::Run() {
  SetThreadRole(ThreadRole::kSpillIo);
  std::vector<std::unique_ptr<Op>> incoming;
  std::vector<IoCompletion> completions;
  while (true) {
    bool idle = reads_.empty() && writes_.empty() && file_ops_.empty();
    bool stopping;
    {
      MutexLock lock(&mu_);
      while (idle && !stopping_ && inbox_.empty() && tasks_.empty()) cv_.Wait(&mu_);
      incoming.swap(inbox_);
      stopping = stopping_;
    }
    RunTasks();
    if (idle && incoming.empty() && stopping) break;
    for (auto& op : incoming) {
      auto& list = op->attached ? file_ops_ : op->kind == IoOp::kRead ? reads_ : writes_;
      Op* raw = op.get();
      list.push_back(std::move(op));
      raw->where = std::prev(list.end());
    }
    incoming.clear();
    if (stopping) {
      // Closing: what has not started is cancelled; what has chunks in flight completes.
      std::vector<Op*> cancel;
      for (auto* list : {&reads_, &writes_, &file_ops_}) {
        for (auto& op : *list) {
          if (op->issued == 0 && op->in_flight == 0) cancel.push_back(op.get());
        }
      }
      for (Op* op : cancel) {
        op->status = absl::CancelledError("spill store closed before the operation started");
        Finish(op);
      }
    }

    Issue();

    // Block in Poll only while nothing new waits: Post sees in_poll_ and wakes the queue.
    bool wait;
    {
      MutexLock lock(&mu_);
      wait = inbox_.empty() && tasks_.empty() && !stopping_;
      in_poll_ = wait;
    }
    if (stopping) wait = queue_->outstanding() > 0;  // draining: block on the device alone
    queue_->Poll(&completions, wait);
    {
      MutexLock lock(&mu_);
      in_poll_ = false;
    }
    for (const IoCompletion& c : completions) HandleCompletion(c);
    completions.clear();
  }
}

void SpillStore::Issue() {
  std::vector<Op*> failed;
  // Reads first (a reload is what a job waits on), then attached files' requests (a journal's
  // durability is what a client waits on), then spill writes.
  for (auto* list : {&reads_, &writes_}) {
    if (list == &writes_ && !IssueFileOps(&failed)) break;
    for (auto& owned : *list) {
      Op* op = owned.get();
      File& f = *files_[op->record.file];
      // (An op whose file is at its depth waits; those behind it, for other files, go on.)
      while (op->status.ok() && op->issued < op->io_len && f.in_flight < file_depth_ &&
             queue_->outstanding() < queue_->depth()) {
        uint64_t len = std::min(io_bytes_, op->io_len - op->issued);
        uint64_t tag = next_tag_++;
        absl::Status s = queue_->Enqueue(IoRequest{op->kind, f.queue_index,
                                                   op->record.extent.offset + op->issued,
                                                   op->buf + op->issued, len, tag});
        if (!s.ok()) {
          op->status = s;
          if (op->in_flight == 0) failed.push_back(op);
          break;
        }
        chunks_[tag] = ChunkRef{op, static_cast<uint32_t>(op->issued / io_bytes_)};
        op->issued += len;
        ++op->in_flight;
        ++f.in_flight;
      }
    }
  }
  queue_->Submit();
  // Checksums of writes' chunks while they travel: the data does not change under the write.
  for (auto& op : writes_) {
    for (;;) {
      uint64_t begin = uint64_t{op->crc_chunks} * io_bytes_;
      if (begin >= std::min(op->issued, op->record.len)) break;
      uint64_t end = std::min(begin + io_bytes_, op->record.len);
      op->chunk_crcs.push_back(Crc32c(op->buf + begin, end - begin));
      ++op->crc_chunks;
    }
  }
  for (Op* op : failed) Finish(op);
}

void SpillStore::HandleCompletion(const IoCompletion& c) {
  auto it = chunks_.find(c.user_data);
  if (it == chunks_.end()) {
    LogError("spill: completion for unknown request ", c.user_data);
    return;
  }
  ChunkRef ref = it->second;
  chunks_.erase(it);
  Op* op = ref.op;
  --op->in_flight;
  if (op->attached) {
    op->status = c.status;
    Finish(op);
    return;
  }
  --files_[op->record.file]->in_flight;
  {
    MutexLock lock(&mu_);
    SpillFileUsage& u = files_[op->record.file]->usage;
    (op->kind == IoOp::kRead ? u.bytes_read : u.bytes_written) += c.bytes;
  }
  if (!c.status.ok()) {
    if (op->status.ok()) op->status = c.status;  // the first error is the one reported
  } else if (op->kind == IoOp::kRead && op->status.ok()) {
    op->chunk_done[ref.chunk] = true;
    // Verify every chunk that now follows the verified prefix.
    uint64_t verified = 0;
    while (op->crc_chunks < op->chunk_done.size() && op->chunk_done[op->crc_chunks]) {
      uint32_t chunk = op->crc_chunks;
      uint64_t begin = uint64_t{chunk} * io_bytes_;
      uint64_t end = std::min(begin + io_bytes_, op->record.len);
      if (begin < end) {
        uint32_t got = Crc32c(op->buf + begin, end - begin);
        uint32_t want = chunk < op->chunk_crcs.size() ? op->chunk_crcs[chunk] : ~got;
        if (got != want) {
          // Never hand back data that is not what was written.
          op->checksum_failed = true;
          op->status = absl::DataLossError(absl::StrFormat(
              "%s: checksum mismatch in chunk %u (bytes %u..%u; stored crc32c 0x%08x, read "
              "0x%08x)",
              Describe(op->record), chunk, begin, end, want, got));
          break;
        }
        verified = end;
      }
      ++op->crc_chunks;
    }
    if (verified > 0 && op->progress) op->progress(verified);
  }
  if (op->in_flight == 0 && (!op->status.ok() || op->issued == op->io_len)) Finish(op);
}

void SpillStore::Finish(Op* op) {
  if (op->attached) {
    std::unique_ptr<Op> owned = std::move(*op->where);
    file_ops_.erase(op->where);
    op->file_done(std::move(op->status));
    return;
  }
  std::unique_ptr<Op> owned = std::move(*op->where);
  (op->kind == IoOp::kRead ? reads_ : writes_).erase(op->where);
  File& f = *files_[op->record.file];
  const char* what = op->kind == IoOp::kRead ? "read of " : "write of ";

  if (op->kind == IoOp::kWrite) {
    absl::StatusOr<SpillRecord> result;
    {
      MutexLock lock(&mu_);
      if (op->status.ok()) {
        f.live[op->record.extent.offset] = Live{op->record, std::move(op->chunk_crcs), 0, false};
        ++f.records;
        ++f.usage.writes;
        result = op->record;
      } else {
        // Nothing of the failed record is kept: its space goes straight back.
        ReleaseLocked(f, op->record.extent);
        if (!absl::IsCancelled(op->status)) ++f.usage.write_errors;
        result = absl::Status(op->status.code(),
                              absl::StrCat("spill ", what, Describe(op->record), " failed: ",
                                           op->status.message()));
      }
    }
    if (!result.ok() && !absl::IsCancelled(op->status)) LogWarning(result.status().message());
    op->write_done(std::move(result));
    return;
  }

  absl::Status result = op->status;
  if (result.ok() && op->crc_chunks < op->chunk_done.size()) {
    result = absl::InternalError(Describe(op->record) + ": read ended before every chunk arrived");
  } else if (!result.ok() && !op->checksum_failed) {
    result = absl::Status(result.code(), absl::StrCat("spill ", what, Describe(op->record),
                                                      " failed: ", result.message()));
  }
  {
    MutexLock lock(&mu_);
    if (result.ok()) {
      ++f.usage.reads;
    } else if (op->checksum_failed) {
      ++f.usage.checksum_failures;
    } else if (!absl::IsCancelled(result)) {
      ++f.usage.read_errors;
    }
    auto it = f.live.find(op->record.extent.offset);
    if (it != f.live.end() && it->second.record.id == op->record.id) {
      if (--it->second.readers == 0 && it->second.freed) {
        ReleaseLocked(f, it->second.record.extent);
        f.live.erase(it);
      }
    }
  }
  if (!result.ok() && !absl::IsCancelled(result)) LogWarning(result.message());
  op->read_done(std::move(result));
}

}  // namespace tier::storage
