#include "daemon/persistent/persistent_journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/crc32c.h"
#include "storage/direct_io.h"

namespace tier::daemon {
namespace {

constexpr char kPrefix[] = "journal-";
// A compaction copies records through a buffer of this size.
constexpr uint64_t kCopyBytes = 8ull << 20;

absl::Status SyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0) return ErrnoStatus(absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

absl::Status PreadAll(int fd, char* out, uint64_t len, uint64_t offset, const std::string& what) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, out + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("read ", what));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(what, ": short (", done, " of ", len, " bytes)"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

class FileSource : public journal::Source {
 public:
  FileSource(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  uint64_t size() const override { return size_; }
  absl::Status Read(uint64_t offset, uint64_t len, char* out) const override {
    return PreadAll(fd_, out, len, offset, path_);
  }

 private:
  int fd_;
  uint64_t size_;
  std::string path_;
};

// "journal-<digits>" (with `suffix`): the generation.
std::optional<uint64_t> GenerationOf(absl::string_view file, absl::string_view suffix) {
  if (!absl::StartsWith(file, kPrefix) || !absl::EndsWith(file, suffix)) {
    return std::nullopt;
  }
  file.remove_prefix(sizeof(kPrefix) - 1);
  file.remove_suffix(suffix.size());
  uint64_t generation = 0;
  if (file.empty() ||
      !std::all_of(file.begin(), file.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(file, &generation)) {
    return std::nullopt;
  }
  return generation;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* entry = ::readdir(d)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

PersistentJournal::~PersistentJournal() = default;

std::string PersistentJournal::PathOf(uint64_t generation) const {
  return absl::StrCat(dir_, "/", kPrefix, generation);
}

absl::StatusOr<std::unique_ptr<PersistentJournal>> PersistentJournal::Open(
    const std::string& dir, storage::SpillStore& io, JournalOptions options) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir ", dir));
  }
  std::unique_ptr<PersistentJournal> journal(new PersistentJournal(dir, io, options));
  // O_DIRECT where the directory takes it, decided as for the spill files (storage/direct_io.h).
  if (options.direct_io != storage::DirectIo::kOff) {
    absl::StatusOr<bool> direct = storage::DirectIoWorks(dir);
    if (!direct.ok()) return direct.status();
    journal->direct_ = *direct;
    if (!journal->direct_ && options.direct_io == storage::DirectIo::kRequired) {
      return absl::FailedPreconditionError(
          absl::StrCat("persistent journal directory ", dir, " does not support O_DIRECT"));
    }
    if (!journal->direct_) {
      LogWarning("persistent journal: ", dir, " refuses O_DIRECT (tmpfs?): buffered writes, ",
                 "through the page cache");
    }
  }
  if (absl::Status s = journal->OpenFiles(); !s.ok()) return s;
  if (absl::Status s = journal->ImportLegacy(); !s.ok()) return s;
  if (journal->set_aside_) {
    // Damaged in the middle: what preceded the damage moves to a new generation now, and the
    // damaged file is kept for a person to look at.
    if (absl::Status s = journal->Compact(); !s.ok()) return s;
  }
  journal->Count();
  return journal;
}

absl::Status PersistentJournal::OpenFiles() {
  std::vector<uint64_t> generations;
  for (const std::string& file : ListDir(dir_)) {
    if (std::optional<uint64_t> g = GenerationOf(file, "")) {
      generations.push_back(*g);
    } else if (std::optional<uint64_t> g = GenerationOf(file, ".new")) {
      // A compaction cut short: the generation before it is whole.
      ::unlink(absl::StrCat(dir_, "/", file).c_str());
      notes_.push_back(absl::StrCat("removed ", file, " (a compaction cut short)"));
      max_generation_ = std::max(max_generation_, *g);
    } else if (std::optional<uint64_t> g = GenerationOf(file, ".damaged")) {
      max_generation_ = std::max(max_generation_, *g);
    }
  }
  std::sort(generations.begin(), generations.end());
  if (!generations.empty()) max_generation_ = std::max(max_generation_, generations.back());
  // Older generations beside the newest: a compaction renamed its new file but its removal of
  // the old one did not land. The newest holds everything.
  for (size_t i = 0; i + 1 < generations.size(); ++i) {
    ::unlink(PathOf(generations[i]).c_str());
    notes_.push_back(absl::StrCat("removed ", kPrefix, generations[i], " (superseded by ",
                                  kPrefix, generations.back(), ")"));
  }
  if (generations.empty()) return CreateGeneration();

  generation_ = generations.back();
  const std::string path = PathOf(generation_);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", path));
  FileSource source(fd.get(), static_cast<uint64_t>(st.st_size), path);
  absl::StatusOr<journal::Scan> scan = journal::ScanJournal(source);
  if (!scan.ok()) {
    // Nothing of it is trusted: kept aside, reported, and a new generation begins.
    fd.reset();
    ::rename(path.c_str(), (path + ".damaged").c_str());
    open_status_ = absl::DataLossError(absl::StrCat(
        path, ": ", scan.status().message(), "; set aside as ", kPrefix, generation_,
        ".damaged, none of it served"));
    return CreateGeneration();
  }
  for (auto& [key, record] : scan->live) live_.emplace(key, record);
  live_bytes_ = scan->live_bytes;
  next_seq_ = scan->next_seq;
  if (scan->tail == journal::Scan::Tail::kTorn) {
    if (::ftruncate(fd.get(), static_cast<off_t>(scan->end)) != 0 || ::fsync(fd.get()) != 0) {
      return ErrnoStatus(absl::StrCat("truncate ", path));
    }
    notes_.push_back(absl::StrCat(path, ": ", scan->problem, " (an append cut short)"));
  } else if (scan->tail == journal::Scan::Tail::kDamaged) {
    set_aside_ = true;
    open_status_ = absl::DataLossError(absl::StrCat(
        path, ": ", scan->problem, "; ", live_.size(),
        " objects before it served, the file kept as ", kPrefix, generation_, ".damaged"));
  }
  fd.reset();
  absl::StatusOr<std::unique_ptr<JournalFile>> file =
      JournalFile::Open(io_, path, /*create=*/false, direct_, scan->end);
  if (!file.ok()) return file.status();
  file_ = *std::move(file);
  return absl::OkStatus();
}

absl::Status PersistentJournal::CreateGeneration() {
  generation_ = ++max_generation_;
  absl::StatusOr<std::unique_ptr<JournalFile>> file =
      JournalFile::Open(io_, PathOf(generation_), /*create=*/true, direct_, 0);
  if (!file.ok()) return file.status();
  file_ = *std::move(file);
  if (absl::Status s = file_->Append({journal::EncodeFileHeader(generation_)}); !s.ok()) return s;
  if (absl::Status s = file_->Sync(); !s.ok()) return s;
  return SyncDir(dir_);
}

absl::Status PersistentJournal::ImportLegacy() {
  const std::string manifest = dir_ + "/manifest";
  ::unlink((manifest + ".new").c_str());  // a rewrite cut short: the manifest before it stands
  std::vector<std::string> data_files;
  for (const std::string& file : ListDir(dir_)) {
    if (absl::StartsWith(file, "obj-")) data_files.push_back(file);
  }
  UniqueFd fd(::open(manifest.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    // No manifest: data files are leftovers of writes that never reached one.
    for (const std::string& file : data_files) ::unlink(absl::StrCat(dir_, "/", file).c_str());
    if (!data_files.empty()) {
      notes_.push_back(absl::StrCat("removed ", data_files.size(),
                                    " data files no manifest named (writes cut short)"));
    }
    return absl::OkStatus();
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (64u << 20)) break;  // no manifest of this tierd was ever this large
  }
  fd.reset();
  absl::StatusOr<std::vector<journal::LegacyRecord>> records = journal::ParseLegacyManifest(text);
  if (!records.ok()) {
    ::rename(manifest.c_str(), (manifest + ".damaged").c_str());
    std::string message = absl::StrCat(manifest, ": ", records.status().message(),
                                       "; set aside as manifest.damaged (with its data files), "
                                       "none of it served");
    open_status_ = open_status_.ok()
                       ? absl::DataLossError(message)
                       : absl::DataLossError(absl::StrCat(open_status_.message(), "; ", message));
    return absl::OkStatus();
  }
  size_t imported = 0;
  std::vector<std::string> refused;
  for (const journal::LegacyRecord& r : *records) {
    const std::string path = absl::StrCat(dir_, "/", r.file);
    UniqueFd data(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!data.valid() || ::fstat(data.get(), &st) != 0 ||
        static_cast<uint64_t>(st.st_size) < r.len || r.len == 0) {
      refused.push_back(absl::StrCat("\"", r.name, "\" of uid ", r.uid, " (short or missing)"));
      continue;
    }
    void* mapped = ::mmap(nullptr, r.len, PROT_READ, MAP_PRIVATE, data.get(), 0);
    if (mapped == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap ", path));
    absl::Status s;
    if (storage::Crc32c(mapped, r.len) != r.crc) {
      refused.push_back(absl::StrCat("\"", r.name, "\" of uid ", r.uid, " (checksum mismatch)"));
    } else {
      s = AppendPut(r.uid, r.name, static_cast<const char*>(mapped), r.len);
      if (s.ok()) ++imported;
    }
    ::munmap(mapped, r.len);
    if (!s.ok()) return s;
  }
  if (absl::Status s = Sync(); !s.ok()) return s;
  // Imported and synced: the old layout goes (manifest first: data files without it are
  // leftovers the next Open removes).
  ::unlink(manifest.c_str());
  if (absl::Status s = SyncDir(dir_); !s.ok()) return s;
  for (const std::string& file : data_files) ::unlink(absl::StrCat(dir_, "/", file).c_str());
  notes_.push_back(absl::StrCat("imported ", imported, " objects from the issue-17 manifest"));
  if (!refused.empty()) {
    std::string message =
        absl::StrCat("not imported (DATA_LOSS): ", absl::StrJoin(refused, ", "));
    open_status_ = open_status_.ok()
                       ? absl::DataLossError(message)
                       : absl::DataLossError(absl::StrCat(open_status_.message(), "; ", message));
  }
  return absl::OkStatus();
}

std::vector<PersistentJournal::Record> PersistentJournal::Records() const {
  std::vector<Record> out;
  out.reserve(live_.size());
  for (const auto& [key, record] : live_) out.push_back(record);
  std::sort(out.begin(), out.end(),
            [](const Record& a, const Record& b) { return a.offset < b.offset; });
  return out;
}

std::optional<PersistentJournal::Record> PersistentJournal::Find(uid_t uid,
                                                                 absl::string_view name) const {
  auto it = live_.find(journal::Key{uid, std::string(name)});
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

absl::Status PersistentJournal::Failed(absl::Status status) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

absl::Status PersistentJournal::Append(absl::Span<const absl::string_view> pieces) {
  // Through the spill path's queue, O_DIRECT from aligned staging (JournalFile): a failed append
  // leaves nothing partial, and the next record goes where this one began.
  absl::Status status = file_->Append(pieces);
  if (!status.ok()) return Failed(std::move(status));
  return absl::OkStatus();
}

absl::Status PersistentJournal::MakeRoom(uint64_t bytes) {
  if (options_.max_bytes == 0 || file_->SizeAfter(bytes) <= options_.max_bytes) {
    return absl::OkStatus();
  }
  if (file_->end() > journal::kFileHeaderBytes + live_bytes_) {
    if (absl::Status s = Compact(); !s.ok()) return s;
  }
  if (file_->SizeAfter(bytes) > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "persistent journal full: ", file_->end(), " + ", bytes, " bytes > ", options_.max_bytes,
        " (persistent_journal_max_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status PersistentJournal::AppendPut(uid_t uid, absl::string_view name, const char* data,
                                          uint64_t len) {
  const Put put{uid, name, data, len};
  return AppendPuts(absl::MakeConstSpan(&put, 1));
}

absl::Status PersistentJournal::AppendPuts(absl::Span<const Put> puts) {
  std::vector<std::string> heads;
  std::vector<uint32_t> crcs;
  heads.reserve(puts.size());
  crcs.reserve(puts.size());
  uint64_t bytes = 0;
  for (const Put& put : puts) {
    if (put.name.empty() || put.name.size() > journal::kMaxNameBytes) {
      return absl::InvalidArgumentError("journal: bad name");
    }
    crcs.push_back(storage::Crc32c(put.data, put.len));
    heads.push_back(journal::EncodeRecordHead(journal::RecordType::kPut, put.uid, put.name,
                                              put.len, crcs.back(), next_seq_ + heads.size()));
    bytes += heads.back().size() + put.len;
  }
  if (absl::Status s = MakeRoom(bytes); !s.ok()) {
    // (A group refused for room is not an error yet: its objects are tried one by one.)
    return absl::IsResourceExhausted(s) && puts.size() > 1 ? s : Failed(std::move(s));
  }
  std::vector<absl::string_view> pieces;
  pieces.reserve(2 * puts.size());
  for (size_t i = 0; i < puts.size(); ++i) {
    pieces.push_back(heads[i]);
    pieces.push_back(absl::string_view(puts[i].data, puts[i].len));
  }
  uint64_t offset = file_->end();
  if (absl::Status s = Append(pieces); !s.ok()) return s;
  for (size_t i = 0; i < puts.size(); ++i) {
    journal::Key key{puts[i].uid, std::string(puts[i].name)};
    if (auto it = live_.find(key); it != live_.end()) {
      live_bytes_ -= it->second.record_bytes();
      live_.erase(it);
    }
    Record record{puts[i].uid, key.name, puts[i].len, crcs[i], next_seq_++, offset,
                  heads[i].size()};
    offset += record.record_bytes();
    live_bytes_ += record.record_bytes();
    live_.emplace(std::move(key), std::move(record));
  }
  Count();
  return absl::OkStatus();
}

absl::Status PersistentJournal::AppendDelete(uid_t uid, absl::string_view name) {
  auto it = live_.find(journal::Key{uid, std::string(name)});
  if (it == live_.end()) return absl::OkStatus();
  std::string head =
      journal::EncodeRecordHead(journal::RecordType::kDelete, uid, name, 0, 0, next_seq_);
  // (A delete is never refused for room: it is what makes room.)
  if (absl::Status s = Append({head}); !s.ok()) return s;
  ++next_seq_;
  live_bytes_ -= it->second.record_bytes();
  live_.erase(it);
  Count();
  return absl::OkStatus();
}

absl::Status PersistentJournal::Sync() {
  if (absl::Status s = file_->Sync(); !s.ok()) return Failed(std::move(s));
  return absl::OkStatus();
}

absl::Status PersistentJournal::CompactIfDue(bool force) {
  const uint64_t dead = file_->end() - journal::kFileHeaderBytes - live_bytes_;
  const bool due = dead >= std::max(live_bytes_, options_.compact_min_dead_bytes);
  if (!force && !due) return absl::OkStatus();
  return Compact();
}

absl::Status PersistentJournal::CopyLive(JournalFile& to, const std::vector<Record*>& order,
                                         std::vector<uint64_t>* offsets) const {
  // Copied as they are, through the same writer as appends: their checksums travel with them.
  std::string buffer(kCopyBytes, '\0');
  const std::string from = file_->path();
  for (const Record* record : order) {
    offsets->push_back(to.end());
    for (uint64_t done = 0; done < record->record_bytes();) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), record->record_bytes() - done);
      if (absl::Status s = PreadAll(file_->fd(), buffer.data(), n, record->offset + done, from);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = to.Append({absl::string_view(buffer.data(), n)}); !s.ok()) return s;
      done += n;
    }
  }
  return absl::OkStatus();
}

absl::Status PersistentJournal::Compact() {
  const uint64_t generation = max_generation_ + 1;
  const std::string path = PathOf(generation);
  const std::string temp = path + ".new";
  ::unlink(temp.c_str());  // (a leftover of a compaction cut short)
  absl::StatusOr<std::unique_ptr<JournalFile>> created =
      JournalFile::Open(io_, temp, /*create=*/true, direct_, 0);
  if (!created.ok()) return Failed(created.status());
  std::unique_ptr<JournalFile> file = *std::move(created);
  auto fail = [&](absl::Status status) {
    file.reset();
    ::unlink(temp.c_str());
    return Failed(std::move(status));
  };
  if (absl::Status s = file->Append({journal::EncodeFileHeader(generation)}); !s.ok()) {
    return fail(s);
  }
  // Live records in the order they were written (so that replay order stays the write order).
  std::vector<Record*> order;
  order.reserve(live_.size());
  for (auto& [key, record] : live_) order.push_back(&record);
  std::sort(order.begin(), order.end(),
            [](const Record* a, const Record* b) { return a->offset < b->offset; });
  std::vector<uint64_t> offsets;
  offsets.reserve(order.size());
  if (absl::Status s = CopyLive(*file, order, &offsets); !s.ok()) return fail(s);
  if (absl::Status s = file->Sync(); !s.ok()) return fail(s);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    return fail(ErrnoStatus(absl::StrCat("rename to ", path)));
  }
  file->Renamed(path);
  max_generation_ = generation;
  if (absl::Status s = SyncDir(dir_); !s.ok()) return Failed(s);
  // The new generation is whole and named: the old one goes (or is kept aside when damaged).
  const std::string from = PathOf(generation_);
  if (set_aside_) {
    ::rename(from.c_str(), (from + ".damaged").c_str());
    set_aside_ = false;
  } else {
    ::unlink(from.c_str());
  }
  (void)SyncDir(dir_);
  for (size_t i = 0; i < order.size(); ++i) order[i]->offset = offsets[i];
  file_ = std::move(file);
  generation_ = generation;
  compactions_.fetch_add(1, std::memory_order_relaxed);
  Count();
  return absl::OkStatus();
}

absl::Status PersistentJournal::Load(const Record& record, char* out) const {
  const std::string path = PathOf(generation_);
  if (absl::Status s = PreadAll(file_->fd(), out, record.len, record.data_offset(), path);
      !s.ok()) {
    return absl::DataLossError(s.message());
  }
  if (storage::Crc32c(out, record.len) != record.crc) {
    return absl::DataLossError(absl::StrCat(path, " at offset ", record.data_offset(),
                                            ": checksum mismatch (torn or damaged)"));
  }
  return absl::OkStatus();
}

void PersistentJournal::Count() {
  file_bytes_seen_.store(file_->end(), std::memory_order_relaxed);
  live_bytes_seen_.store(live_bytes_, std::memory_order_relaxed);
  live_records_seen_.store(live_.size(), std::memory_order_relaxed);
}

JournalUsage PersistentJournal::usage() const {
  JournalUsage u;
  u.file_bytes = file_bytes_seen_.load(std::memory_order_relaxed);
  u.live_bytes = live_bytes_seen_.load(std::memory_order_relaxed);
  u.live_records = live_records_seen_.load(std::memory_order_relaxed);
  u.max_bytes = options_.max_bytes;
  u.compactions = compactions_.load(std::memory_order_relaxed);
  u.errors = errors_.load(std::memory_order_relaxed);
  return u;
}

}  // namespace tier::daemon
