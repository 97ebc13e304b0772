#include "daemon/persistent_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "storage/crc32c.h"

namespace tier::daemon {
namespace {

constexpr char kHeader[] = "tierd-persistent 1\n";

absl::Status WriteAll(int fd, const char* data, uint64_t len, const std::string& path) {
  while (len > 0) {
    ssize_t n = ::write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(absl::StrCat("write ", path));
    data += n;
    len -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Writes `path` whole and fsyncs it.
absl::Status WriteFileSynced(const std::string& path, const char* data, uint64_t len) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path));
  if (absl::Status s = WriteAll(fd.get(), data, len, path); !s.ok()) return s;
  if (::fsync(fd.get()) != 0) return ErrnoStatus(absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0) return ErrnoStatus(absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path));
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("read ", path));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PersistentJournal>> PersistentJournal::Open(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir ", dir));
  }
  std::unique_ptr<PersistentJournal> journal(new PersistentJournal(dir));
  if (absl::Status s = journal->ReadManifest(); !s.ok()) {
    // Never served: moved aside (kept for a person to look at) and reported.
    journal->manifest_status_ = s;
    journal->records_.clear();
    std::string manifest = dir + "/manifest";
    ::rename(manifest.c_str(), (manifest + ".damaged").c_str());
  }
  return journal;
}

absl::Status PersistentJournal::ReadManifest() {
  const std::string path = dir_ + "/manifest";
  if (::access(path.c_str(), F_OK) != 0) return absl::OkStatus();  // none yet
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::DataLossError(text.status().message());
  // The last line is "crc <hex>" over every byte before it.
  size_t end = text->rfind("crc ");
  if (end == std::string::npos || !text->starts_with(kHeader) || text->back() != '\n') {
    return absl::DataLossError(absl::StrCat(path, ": torn or not a manifest"));
  }
  uint32_t crc = 0;
  if (!absl::SimpleHexAtoi(absl::string_view(*text).substr(end + 4, text->size() - end - 5),
                           &crc) ||
      crc != storage::Crc32c(text->data(), end)) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (torn or damaged)"));
  }
  absl::string_view body = absl::string_view(*text).substr(sizeof(kHeader) - 1,
                                                           end - (sizeof(kHeader) - 1));
  for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    Record r;
    uint32_t uid = 0;
    uint64_t number = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &uid) || !absl::SimpleAtoi(f[1], &r.len) ||
        !absl::SimpleHexAtoi(f[2], &r.crc) || !absl::StartsWith(f[3], "obj-") ||
        !absl::SimpleAtoi(f[3].substr(4), &number) || f[4].empty()) {
      return absl::DataLossError(absl::StrCat(path, ": bad line \"", line, "\""));
    }
    r.uid = uid;
    r.file = std::string(f[3]);
    r.name = std::string(f[4]);
    next_file_ = std::max(next_file_, number + 1);
    records_.push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status PersistentJournal::WriteManifest() {
  std::string text = kHeader;
  for (const Record& r : records_) {
    absl::StrAppend(&text, r.uid, " ", r.len, " ", absl::Hex(r.crc), " ", r.file, " ", r.name,
                    "\n");
  }
  absl::StrAppend(&text, "crc ", absl::Hex(storage::Crc32c(text.data(), text.size())), "\n");
  const std::string path = dir_ + "/manifest";
  if (absl::Status s = WriteFileSynced(path + ".new", text.data(), text.size()); !s.ok()) return s;
  if (::rename((path + ".new").c_str(), path.c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("rename to ", path));
  }
  return SyncDir(dir_);
}

absl::Status PersistentJournal::Add(uid_t uid, const std::string& name, const char* data,
                                    uint64_t len) {
  Record r{uid, name, len, storage::Crc32c(data, len), absl::StrCat("obj-", next_file_++)};
  if (absl::Status s = WriteFileSynced(absl::StrCat(dir_, "/", r.file), data, len); !s.ok()) {
    return s;
  }
  std::string replaced;
  for (auto it = records_.begin(); it != records_.end(); ++it) {
    if (it->uid == uid && it->name == name) {
      replaced = it->file;
      records_.erase(it);
      break;
    }
  }
  records_.push_back(std::move(r));
  if (absl::Status s = WriteManifest(); !s.ok()) return s;
  if (!replaced.empty()) ::unlink(absl::StrCat(dir_, "/", replaced).c_str());
  return absl::OkStatus();
}

absl::Status PersistentJournal::Remove(uid_t uid, const std::string& name) {
  for (auto it = records_.begin(); it != records_.end(); ++it) {
    if (it->uid != uid || it->name != name) continue;
    std::string file = it->file;
    records_.erase(it);
    if (absl::Status s = WriteManifest(); !s.ok()) return s;
    ::unlink(absl::StrCat(dir_, "/", file).c_str());  // only once no manifest names it
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status PersistentJournal::Load(const Record& record, char* out) const {
  const std::string path = absl::StrCat(dir_, "/", record.file);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return absl::DataLossError(absl::StrCat("open ", path, ": ", strerror(errno)));
  uint64_t done = 0;
  while (done < record.len) {
    ssize_t n = ::pread(fd.get(), out + done, record.len - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": short (", done, " of ", record.len, " bytes)"));
    }
    done += static_cast<uint64_t>(n);
  }
  if (storage::Crc32c(out, record.len) != record.crc) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (torn or damaged)"));
  }
  return absl::OkStatus();
}

}  // namespace tier::daemon
