#include "storage/direct_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace tier::storage {

absl::Status ProbeDirectIo(int fd) {
  void* block = std::aligned_alloc(kDirectIoBlock, kDirectIoBlock);
  if (block == nullptr) return absl::ResourceExhaustedError("probe buffer");
  std::memset(block, 0, kDirectIoBlock);
  absl::Status status;
  if (::pwrite(fd, block, kDirectIoBlock, 0) != static_cast<ssize_t>(kDirectIoBlock)) {
    status = ErrnoStatus("probe write", errno == 0 ? EIO : errno);
  } else if (::pread(fd, block, kDirectIoBlock, 0) != static_cast<ssize_t>(kDirectIoBlock)) {
    status = ErrnoStatus("probe read", errno == 0 ? EIO : errno);
  }
  std::free(block);
  return status;
}

absl::StatusOr<bool> DirectIoWorks(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/.direct-io-probe");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600));
  if (!fd.valid()) {
    if (errno == EINVAL) return false;
    return ErrnoStatus(absl::StrCat("open ", path));
  }
  absl::Status probe = ProbeDirectIo(fd.get());
  fd.reset();
  ::unlink(path.c_str());
  if (absl::IsInvalidArgument(probe)) return false;
  if (!probe.ok()) return probe;
  return true;
}

}  // namespace tier::storage
