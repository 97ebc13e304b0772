#include "common/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/status.h"

// Linux 5.14; Debian 12's headers may lack it.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tier {

absl::Status PopulateForWrite(void* base, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (::madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
  if (errno != EINVAL) return ErrnoStatus("faulting memory in (MADV_POPULATE_WRITE)");
  // A kernel before 5.14: a write fault per page. The value written is the one read, so the
  // memory's contents stay as they were.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto* bytes_at = static_cast<volatile unsigned char*>(base);
  for (uint64_t offset = 0; offset < bytes; offset += page) bytes_at[offset] = bytes_at[offset];
  return absl::OkStatus();
}

}  // namespace tier
