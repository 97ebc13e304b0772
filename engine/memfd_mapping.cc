#include "engine/memfd_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

// Linux 5.14; Debian 12's headers may lack it.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

namespace tier::engine {

absl::StatusOr<std::unique_ptr<MemfdMapping>> MemfdMapping::Map(const UniqueFd& fd,
                                                               uint64_t bytes,
                                                               bool seal_future_writes) {
  if (!fd.valid()) return absl::InvalidArgumentError("host buffer without a memfd");
  if (bytes == 0) return absl::InvalidArgumentError("host buffer of 0 bytes");
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError("host buffer fd must be a memfd sealed with F_SEAL_SHRINK");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    // (Short: the session protocol carries 159 bytes of message.)
    return absl::InvalidArgumentError(
        "memfd sealed against writes (F_SEAL_[FUTURE_]WRITE; tierd seals what it maps, and its "
        "registrations ended): register a new memfd");
  }
  if (seal_future_writes && (seals & F_SEAL_SEAL) != 0) {
    return absl::InvalidArgumentError(
        "memfd sealed with F_SEAL_SEAL: leave it off (tierd adds F_SEAL_FUTURE_WRITE once mapped, "
        "so that no hole can be punched into it)");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of host buffer");
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat("host buffer memfd holds ", st.st_size,
                                                   " bytes, fewer than the ", bytes,
                                                   " registered"));
  }
  struct statfs fs {};
  if (::fstatfs(fd.get(), &fs) != 0) return ErrnoStatus("fstatfs of host buffer");
  if (static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC) {
    return absl::InvalidArgumentError(
        "host buffer memfd is on hugetlbfs (MFD_HUGETLB): tierd does not map those, since a huge "
        "page punched out of it cannot always be faulted back; use a plain memfd");
  }
  // shmem's SEEK_HOLE counts pages written (in memory or in swap) as data. (Pages fallocate()d
  // but never written count as holes, though they are allocated: they are refused too.)
  off_t hole = ::lseek(fd.get(), 0, SEEK_HOLE);
  if (hole < 0) return ErrnoStatus("lseek(SEEK_HOLE) on host buffer");
  if (static_cast<uint64_t>(hole) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host buffer memfd is not populated (no memory at byte ", hole, " of ", bytes,
        "): write every page before registering (MADV_POPULATE_WRITE; MAP_POPULATE's clean "
        "pages can be dropped)"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return ErrnoStatus("mmap of host buffer");
  if (::madvise(base, bytes, MADV_POPULATE_WRITE) != 0) {
    int error = errno;
    if (error != EINVAL) {  // EINVAL: a kernel before 5.14; the checks above have to do
      ::munmap(base, bytes);
      return ErrnoStatus("host buffer memory cannot be faulted in (MADV_POPULATE_WRITE)", error);
    }
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      LogWarning("this kernel lacks MADV_POPULATE_WRITE (Linux 5.14): host buffers are not "
                 "faulted in at registration");
    }
  }
  if (seal_future_writes && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0) {
    int error = errno;
    if (error != EINVAL) {  // EINVAL: a kernel before 5.1
      ::munmap(base, bytes);
      return ErrnoStatus("sealing host buffer memfd with F_SEAL_FUTURE_WRITE", error);
    }
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      LogWarning("this kernel lacks F_SEAL_FUTURE_WRITE (Linux 5.1): a client can punch holes "
                 "into a registered host buffer, and tierd's copies then fault pages in");
    }
  }
  return std::unique_ptr<MemfdMapping>(new MemfdMapping(static_cast<char*>(base), bytes));
}

MemfdMapping::~MemfdMapping() { ::munmap(base_, bytes_); }

}  // namespace tier::engine
