// Whether a filesystem does O_DIRECT, decided the one reliable way: by a real aligned write and
// read (some filesystems accept the flag at open and refuse the I/O with EINVAL; tmpfs before
// Linux 6.6 refuses it at open). The spill files and the persistent journal both ask here, and
// both fall back to buffered I/O where the answer is no.
#ifndef TIER_STORAGE_DIRECT_IO_H_
#define TIER_STORAGE_DIRECT_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tier::storage {

// O_DIRECT alignment of buffers, offsets and lengths.
inline constexpr uint64_t kDirectIoBlock = 4096;

// One aligned block written and read back at offset 0 of `fd` (its first block is overwritten).
// INVALID_ARGUMENT where the filesystem refuses O_DIRECT I/O.
absl::Status ProbeDirectIo(int fd);

// Whether files in `dir` take O_DIRECT: a scratch file there opened O_DIRECT and probed, then
// removed. False where the open or the probe says EINVAL; other failures are errors.
absl::StatusOr<bool> DirectIoWorks(const std::string& dir);

}  // namespace tier::storage

#endif  // TIER_STORAGE_DIRECT_IO_H_
