#include "daemon/persistent/journal_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "storage/direct_io.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kBlock = storage::kDirectIoBlock;
// The staging memory is cut into this many chunks: one is filled while the others are written.
constexpr uint32_t kChunks = 4;
constexpr uint64_t kMaxChunkBytes = 8ull << 20;
// Without the store's staging memory: a buffer of this file's own (not registered).
constexpr uint64_t kOwnStagingBytes = 4ull << 20;

uint64_t AlignDown(uint64_t n) { return n & ~(kBlock - 1); }
uint64_t AlignUp(uint64_t n) { return AlignDown(n + kBlock - 1); }

}  // namespace

absl::StatusOr<std::unique_ptr<JournalFile>> JournalFile::Open(storage::SpillStore& io,
                                                               std::string path, bool create,
                                                               bool direct, uint64_t end) {
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
  UniqueFd fd(::open(path.c_str(), flags, 0600));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat(create ? "create " : "open ", path));
  UniqueFd direct_io;
  if (direct) {
    direct_io.reset(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT));
    if (!direct_io.valid()) return ErrnoStatus(absl::StrCat("open (O_DIRECT) ", path));
  }
  std::unique_ptr<JournalFile> file(
      new JournalFile(io, std::move(path), std::move(fd), std::move(direct_io), end));
  if (absl::Status s = file->Init(); !s.ok()) return s;
  return file;
}

JournalFile::JournalFile(storage::SpillStore& io, std::string path, UniqueFd fd,
                         UniqueFd direct_io, uint64_t end)
    : io_(io), path_(std::move(path)), fd_(std::move(fd)), direct_io_(std::move(direct_io)),
      end_(end), synced_end_(end) {}

absl::Status JournalFile::Init() {
  // The last partial block's bytes: the next append writes them again.
  tail_.resize(end_ - AlignDown(end_));
  if (!tail_.empty() && ::pread(fd_.get(), tail_.data(), tail_.size(),
                                static_cast<off_t>(AlignDown(end_))) !=
                            static_cast<ssize_t>(tail_.size())) {
    return ErrnoStatus(absl::StrCat("read the last block of ", path_), errno == 0 ? EIO : errno);
  }
  if (io_.staging_bytes() >= kChunks * kBlock) {
    staging_ = io_.staging();
    chunk_bytes_ = std::min(kMaxChunkBytes, AlignDown(io_.staging_bytes() / kChunks));
  } else {
    own_staging_ = {static_cast<char*>(std::aligned_alloc(kBlock, kOwnStagingBytes)), std::free};
    if (own_staging_ == nullptr) return absl::ResourceExhaustedError("journal staging memory");
    staging_ = own_staging_.get();
    chunk_bytes_ = kOwnStagingBytes / kChunks;
  }
  chunks_ = kChunks;
  absl::StatusOr<uint32_t> attached = io_.AttachFile(direct() ? direct_io_.get() : fd_.get());
  if (!attached.ok()) return attached.status();
  attached_ = *attached;
  is_attached_ = true;
  return absl::OkStatus();
}

JournalFile::~JournalFile() {
  (void)AwaitAll();  // (nothing is in flight between calls; this is only a guard)
  if (is_attached_) (void)io_.DetachFile(attached_);
}

char* JournalFile::NextChunk() {
  const uint32_t chunk = next_chunk_;
  next_chunk_ = (next_chunk_ + 1) % chunks_;
  MutexLock lock(&mu_);
  while (chunk_busy_ & (uint64_t{1} << chunk)) cv_.Wait(&mu_);
  return staging_ + chunk * chunk_bytes_;
}

void JournalFile::Submit(char* chunk, uint64_t offset, uint64_t len) {
  const uint64_t bit = uint64_t{1} << ((chunk - staging_) / chunk_bytes_);
  {
    MutexLock lock(&mu_);
    chunk_busy_ |= bit;
    ++in_flight_;
  }
  absl::Status posted = io_.FileIo(attached_, storage::IoOp::kWrite, offset, chunk, len,
                                   [this, bit](absl::Status status) {
                                     MutexLock lock(&mu_);
                                     if (!status.ok() && failed_.ok()) failed_ = std::move(status);
                                     chunk_busy_ &= ~bit;
                                     --in_flight_;
                                     cv_.SignalAll();
                                   });
  if (!posted.ok()) {
    MutexLock lock(&mu_);
    if (failed_.ok()) failed_ = std::move(posted);
    chunk_busy_ &= ~bit;
    --in_flight_;
  }
}

absl::Status JournalFile::AwaitAll() {
  MutexLock lock(&mu_);
  while (in_flight_ > 0) cv_.Wait(&mu_);
  absl::Status failed = std::move(failed_);
  failed_ = absl::OkStatus();
  return failed;
}

absl::Status JournalFile::Append(absl::Span<const absl::string_view> pieces) {
  // The stream from the start of end_'s block: the tail again, then the pieces.
  uint64_t offset = AlignDown(end_);
  char* chunk = NextChunk();
  uint64_t fill = tail_.size();
  std::memcpy(chunk, tail_.data(), fill);
  for (absl::string_view piece : pieces) {
    while (!piece.empty()) {
      if (fill == chunk_bytes_) {
        Submit(chunk, offset, fill);
        offset += fill;
        chunk = NextChunk();
        fill = 0;
      }
      const uint64_t take = std::min<uint64_t>(piece.size(), chunk_bytes_ - fill);
      std::memcpy(chunk + fill, piece.data(), take);
      fill += take;
      piece.remove_prefix(take);
    }
  }
  // The last block goes whole, zero past the end; its bytes are the next append's tail.
  std::string tail(chunk + AlignDown(fill), fill - AlignDown(fill));
  std::memset(chunk + fill, 0, AlignUp(fill) - fill);
  if (fill > 0) Submit(chunk, offset, AlignUp(fill));
  absl::Status written = AwaitAll();
  if (!written.ok()) {
    CutBack();
    return absl::Status(written.code(), absl::StrCat("write ", path_, ": ", written.message()));
  }
  end_ = offset + fill;
  tail_ = std::move(tail);
  return absl::OkStatus();
}

void JournalFile::CutBack() {
  // Nothing partial stays: the next record goes where this one began, and the bytes after it to
  // its block's end are zero again.
  (void)!::ftruncate(fd_.get(), static_cast<off_t>(end_));
  (void)!::ftruncate(fd_.get(), static_cast<off_t>(AlignUp(end_)));
}

absl::Status JournalFile::Sync() {
  {
    MutexLock lock(&mu_);
    ++in_flight_;
  }
  absl::Status posted = io_.FileIo(attached_, storage::IoOp::kSync, 0, nullptr, 0,
                                   [this](absl::Status status) {
                                     MutexLock lock(&mu_);
                                     if (!status.ok() && failed_.ok()) failed_ = std::move(status);
                                     --in_flight_;
                                     cv_.SignalAll();
                                   });
  if (!posted.ok()) {
    MutexLock lock(&mu_);
    --in_flight_;
    return posted;
  }
  if (absl::Status s = AwaitAll(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("fdatasync ", path_, ": ", s.message()));
  }
  if (!direct() && end_ > synced_end_) {
    // On the disk now, and read again only at a restart or a compaction: out of the page cache,
    // so that checkpoints written through tierd do not push the node's other files out of it.
    (void)::posix_fadvise(fd_.get(), static_cast<off_t>(synced_end_),
                          static_cast<off_t>(end_ - synced_end_), POSIX_FADV_DONTNEED);
  }
  synced_end_ = end_;
  return absl::OkStatus();
}

}  // namespace tier::daemon
