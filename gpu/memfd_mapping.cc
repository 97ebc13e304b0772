#include "gpu/memfd_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tier::gpu {

absl::StatusOr<std::unique_ptr<MemfdMapping>> MemfdMapping::Map(const UniqueFd& fd,
                                                               uint64_t bytes) {
  if (!fd.valid()) return absl::InvalidArgumentError("host buffer without a memfd");
  if (bytes == 0) return absl::InvalidArgumentError("host buffer of 0 bytes");
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError("host buffer fd must be a memfd sealed with F_SEAL_SHRINK");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of host buffer");
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat("host buffer memfd holds ", st.st_size,
                                                   " bytes, fewer than the ", bytes,
                                                   " registered"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return ErrnoStatus("mmap of host buffer");
  return std::unique_ptr<MemfdMapping>(new MemfdMapping(static_cast<char*>(base), bytes));
}

MemfdMapping::~MemfdMapping() { ::munmap(base_, bytes_); }

}  // namespace tier::gpu
