// common/populate.h: what it faults in stays memory, so tierd's SEEK_HOLE check keeps passing.
#include "common/populate.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>

#include "gtest/gtest.h"

namespace tier {
namespace {

constexpr uint64_t kBytes = 8 << 20;

struct Memfd {
  Memfd() : fd(::memfd_create("populate-test", MFD_CLOEXEC)) {
    EXPECT_EQ(::ftruncate(fd, kBytes), 0);
    base = static_cast<unsigned char*>(
        ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(base, MAP_FAILED);
  }
  ~Memfd() {
    ::munmap(base, kBytes);
    ::close(fd);
  }
  uint64_t FirstHole() const { return static_cast<uint64_t>(::lseek(fd, 0, SEEK_HOLE)); }
  int fd;
  unsigned char* base;
};

// Asks the kernel to drop clean cached pages, as reclaim does under memory pressure. Needs root.
bool DropCaches() {
  ::sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3" << std::endl;
  return drop.good();
}

// MAP_POPULATE on a shared mapping faults pages in for reading; dropping clean pages turned those
// back into holes (HostileClient.MappedBytesAreCappedNodeWideAndCounted failed in CI so). Pages
// the helper faulted in are dirty, and dropping caches leaves them.
TEST(PopulateForWrite, LeavesNoHoleEvenAfterCleanPagesAreDropped) {
  Memfd memfd;
  EXPECT_EQ(memfd.FirstHole(), 0u);
  ASSERT_TRUE(PopulateForWrite(memfd.base, kBytes).ok());
  EXPECT_EQ(memfd.FirstHole(), kBytes);
  if (!DropCaches()) GTEST_SKIP() << "cannot write /proc/sys/vm/drop_caches (needs root)";
  EXPECT_EQ(memfd.FirstHole(), kBytes);
}

TEST(PopulateForWrite, KeepsWhatThePagesHeld) {
  Memfd memfd;
  for (uint64_t i = 0; i < kBytes; i += 4096) memfd.base[i] = static_cast<unsigned char>(i >> 12);
  ASSERT_TRUE(PopulateForWrite(memfd.base, kBytes).ok());
  for (uint64_t i = 0; i < kBytes; i += 4096) {
    ASSERT_EQ(memfd.base[i], static_cast<unsigned char>(i >> 12)) << i;
  }
  EXPECT_TRUE(PopulateForWrite(memfd.base, 0).ok());
}

TEST(PopulateForWrite, FailsOnMemoryThatIsNotMapped) {
  void* base = ::mmap(nullptr, 2 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  ::munmap(base, 2 * 4096);
  EXPECT_FALSE(PopulateForWrite(base, 2 * 4096).ok());
}

}  // namespace
}  // namespace tier
