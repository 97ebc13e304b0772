// Helpers shared by the spill tests: a real temporary directory (on the build directory's
// filesystem, not /tmp, which may be tmpfs), a countdown to wait on callbacks without sleeping,
// and reproducible data.
#ifndef TIER_TESTS_UNIT_SPILL_TEST_UTIL_H_
#define TIER_TESTS_UNIT_SPILL_TEST_UTIL_H_

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tier::storage::testing {

// TIER_SPILL_TEST_DIR (environment) wins, then the build directory (compile definition), then
// /var/tmp. /tmp is avoided: it may be a tmpfs, where O_DIRECT is refused on older kernels.
inline std::string SpillTestRoot() {
  if (const char* env = std::getenv("TIER_SPILL_TEST_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
#ifdef TIER_SPILL_TEST_DIR
  return TIER_SPILL_TEST_DIR;
#else
  return "/var/tmp";
#endif
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = SpillTestRoot() + "/spill-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << ": " << std::strerror(errno);
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Whether `dir` takes O_DIRECT I/O (a real aligned write), for tests that open files themselves.
inline bool DirectIoWorks(const std::string& dir) {
  std::string path = dir + "/.direct-probe";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  void* block = std::aligned_alloc(4096, 4096);
  std::memset(block, 0, 4096);
  bool ok = ::pwrite(fd, block, 4096, 0) == 4096;
  std::free(block);
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

// Counts callbacks down to zero; Wait blocks until then (no sleeps).
class Countdown {
 public:
  explicit Countdown(int n) : left_(n) {}
  void Done() {
    std::lock_guard lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return left_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

// Reproducible, position-dependent bytes: any misplaced block shows up as a mismatch.
inline void FillPattern(char* p, uint64_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  uint64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  uint64_t v = rng();
  for (; i < len; ++i) p[i] = static_cast<char>(v >> (8 * (i % 8)));
}

// Whether [p, p + len) holds FillPattern(..., seed).
inline bool MatchesPattern(const char* p, uint64_t len, uint64_t seed) {
  std::string expected(len, '\0');
  FillPattern(expected.data(), len, seed);
  return std::memcmp(p, expected.data(), len) == 0;
}

}  // namespace tier::storage::testing

#endif  // TIER_TESTS_UNIT_SPILL_TEST_UTIL_H_
