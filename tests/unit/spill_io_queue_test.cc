// Every IoQueue engine against real files: round trips with registered and unregistered buffers,
// depth limits, real short transfers (end of file, RLIMIT_FSIZE), real errors, Wake, and the
// fault-injecting wrapper. The factory's fallback is tested by refusing io_uring_setup with seccomp
// in a child process, the way container runtimes do.
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "spill_test_util.h"
#include "storage/faulty_io_queue.h"
#include "storage/host_pool.h"
#include "storage/io_queue.h"
#include "storage/thread_pool_io_queue.h"
#include "storage/uring_io_queue.h"

namespace tier::storage {
namespace {

using testing::FillPattern;
using testing::TempDir;

enum class Engine { kUring, kThreadPool, kFaultyUring, kFaultyThreadPool };

const char* EngineName(Engine e) {
  switch (e) {
    case Engine::kUring: return "IoUring";
    case Engine::kThreadPool: return "ThreadPool";
    case Engine::kFaultyUring: return "FaultyOverIoUring";
    case Engine::kFaultyThreadPool: return "FaultyOverThreadPool";
  }
  return "?";
}

class IoQueueTest : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    auto pool = HostPool::Create({.bytes = 32 << 20, .lock = LockMode::kOff});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    direct_ = testing::DirectIoWorks(dir_.path());
    if (!direct_) std::fprintf(stderr, "note: %s refuses O_DIRECT; testing buffered files\n",
                               dir_.path().c_str());
    queue_ = Make(8);
    if (queue_ == nullptr) GTEST_SKIP() << "io_uring is not available here (detected, not assumed)";
  }

  std::unique_ptr<IoQueue> Make(uint32_t depth) {
    bool uring = GetParam() == Engine::kUring || GetParam() == Engine::kFaultyUring;
    std::unique_ptr<IoQueue> q;
    if (uring) {
      auto u = UringIoQueue::Create(depth);
      if (!u.ok()) return nullptr;
      q = std::move(*u);
    } else {
      q = std::make_unique<ThreadPoolIoQueue>(depth, 0);
    }
    if (GetParam() == Engine::kFaultyUring || GetParam() == Engine::kFaultyThreadPool) {
      auto faulty = std::make_unique<FaultyIoQueue>(std::move(q));
      faulty_ = faulty.get();
      q = std::move(faulty);
    }
    return q;
  }

  int OpenFile(const std::string& name, bool direct, uint64_t preallocate = 0) {
    UniqueFd fd(::open(dir_.File(name).c_str(),
                       O_RDWR | O_CREAT | O_CLOEXEC | (direct && direct_ ? O_DIRECT : 0), 0600));
    EXPECT_TRUE(fd.valid()) << std::strerror(errno);
    if (preallocate > 0) {
      EXPECT_EQ(::fallocate(fd.get(), 0, 0, preallocate), 0);
    }
    fds_.push_back(std::move(fd));
    return fds_.back().get();
  }

  // Enqueues everything (polling whenever the queue is full) and returns each completion by
  // user_data.
  std::map<uint64_t, IoCompletion> RunAll(IoQueue* q, const std::vector<IoRequest>& requests) {
    std::map<uint64_t, IoCompletion> done;
    std::vector<IoCompletion> out;
    auto reap = [&](bool wait) {
      q->Poll(&out, wait);
      for (auto& c : out) {
        EXPECT_TRUE(done.emplace(c.user_data, c).second) << "completed twice: " << c.user_data;
      }
      out.clear();
    };
    for (const IoRequest& r : requests) {
      while (true) {
        absl::Status s = q->Enqueue(r);
        if (s.ok()) break;
        EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
        EXPECT_EQ(q->outstanding(), q->depth());
        reap(true);
      }
    }
    while (q->outstanding() > 0) reap(true);
    EXPECT_EQ(done.size(), requests.size());
    return done;
  }

  Extent Alloc(uint64_t bytes) {
    std::optional<Extent> e = pool_->Allocate(bytes);
    EXPECT_TRUE(e.has_value());
    return e.value_or(Extent{});
  }

  TempDir dir_;
  bool direct_ = false;
  std::unique_ptr<HostPool> pool_;
  std::vector<UniqueFd> fds_;
  FaultyIoQueue* faulty_ = nullptr;
  std::unique_ptr<IoQueue> queue_;  // destroyed before fds_ and pool_ (declared after them)
};

TEST_P(IoQueueTest, RoundTripWithRegisteredBuffersAndFiles) {
  ASSERT_TRUE(queue_->RegisterBuffers({{IoBuffer{pool_->base(), pool_->bytes()}}}).ok());
  int fd = OpenFile("data", /*direct=*/true, 8 << 20);
  absl::StatusOr<int> file = queue_->RegisterFile(fd);
  ASSERT_TRUE(file.ok()) << file.status();

  // 48 requests of 4 KiB .. 188 KiB, laid end to end in the file: more than the depth of 8.
  Extent src = Alloc(8 << 20);
  Extent dst = Alloc(8 << 20);
  FillPattern(pool_->At(src), 8 << 20, 1);
  std::vector<IoRequest> writes, reads;
  uint64_t offset = 0;
  for (uint64_t i = 0; i < 48; ++i) {
    uint64_t len = 4096 * (1 + (i * 7) % 47);
    writes.push_back({IoOp::kWrite, *file, offset, pool_->At(src) + offset, len, 100 + i});
    reads.push_back({IoOp::kRead, *file, offset, pool_->At(dst) + offset, len, 200 + i});
    offset += len;
  }
  for (const auto& [tag, c] : RunAll(queue_.get(), writes)) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.bytes, writes[tag - 100].len);
  }
  for (const auto& [tag, c] : RunAll(queue_.get(), reads)) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.bytes, reads[tag - 200].len);
  }
  ASSERT_EQ(std::memcmp(pool_->At(src), pool_->At(dst), offset), 0);

  if (auto* uring = dynamic_cast<UringIoQueue*>(queue_.get())) {
    EXPECT_TRUE(uring->buffers_registered());
    EXPECT_EQ(uring->fixed_buffer_submissions(), 96u);
    EXPECT_EQ(uring->plain_submissions(), 0u);
    EXPECT_TRUE(uring->file_registered(*file));
  }
}

TEST_P(IoQueueTest, UnregisteredBuffersWorkToo) {
  ASSERT_TRUE(queue_->RegisterBuffers({{IoBuffer{pool_->base(), 1 << 20}}}).ok());
  int fd = OpenFile("data", /*direct=*/true, 1 << 20);
  absl::StatusOr<int> file = queue_->RegisterFile(fd);
  ASSERT_TRUE(file.ok());
  // Outside the registered region (the pool's second MiB) and straddling its end.
  Extent e = Alloc(4 << 20);
  char* outside = pool_->base() + (2 << 20);
  char* straddling = pool_->base() + (1 << 20) - 4096;
  ASSERT_GE(e.offset + e.bytes, uint64_t{3} << 20);
  FillPattern(outside, 64 << 10, 2);
  auto done = RunAll(queue_.get(), {{IoOp::kWrite, *file, 0, outside, 64 << 10, 1}});
  ASSERT_TRUE(done[1].status.ok()) << done[1].status;
  done = RunAll(queue_.get(), {{IoOp::kRead, *file, 0, straddling, 64 << 10, 2}});
  ASSERT_TRUE(done[2].status.ok()) << done[2].status;
  EXPECT_EQ(std::memcmp(outside, straddling, 64 << 10), 0);
  if (auto* uring = dynamic_cast<UringIoQueue*>(queue_.get())) {
    EXPECT_EQ(uring->plain_submissions(), 2u);
    EXPECT_EQ(uring->fixed_buffer_submissions(), 0u);
  }
}

TEST_P(IoQueueTest, RefusesBadRequestsAndMoreThanDepth) {
  int fd = OpenFile("data", /*direct=*/true, 1 << 20);
  absl::StatusOr<int> file = queue_->RegisterFile(fd);
  ASSERT_TRUE(file.ok());
  Extent e = Alloc(1 << 20);
  char* buf = pool_->At(e);
  EXPECT_TRUE(absl::IsInvalidArgument(queue_->Enqueue({IoOp::kRead, *file + 5, 0, buf, 4096, 0})));
  EXPECT_TRUE(absl::IsInvalidArgument(queue_->Enqueue({IoOp::kRead, *file, 0, nullptr, 4096, 0})));
  EXPECT_TRUE(absl::IsInvalidArgument(queue_->Enqueue({IoOp::kRead, *file, 0, buf, 0, 0})));
  for (uint64_t i = 0; i < queue_->depth(); ++i) {
    ASSERT_TRUE(queue_->Enqueue({IoOp::kRead, *file, i * 4096, buf + i * 4096, 4096, i}).ok());
  }
  EXPECT_TRUE(absl::IsResourceExhausted(queue_->Enqueue({IoOp::kRead, *file, 0, buf, 4096, 99})));
  EXPECT_EQ(queue_->outstanding(), queue_->depth());
  std::vector<IoCompletion> out;
  while (queue_->outstanding() > 0) queue_->Poll(&out, true);
  EXPECT_EQ(out.size(), queue_->depth());
  // Nothing outstanding: a waiting Poll returns at once instead of blocking.
  EXPECT_EQ(queue_->Poll(&out, true), 0);
}

// A sync (fdatasync) needs no buffer and completes OK; an unregistered file's index refuses
// requests and is handed to the next file, whose requests reach that file and not the old one.
TEST_P(IoQueueTest, SyncAndUnregisteredFiles) {
  int old_fd = OpenFile("old", /*direct=*/true, 1 << 20);
  absl::StatusOr<int> old_file = queue_->RegisterFile(old_fd);
  ASSERT_TRUE(old_file.ok());
  Extent e = Alloc(1 << 20);
  char* buf = pool_->At(e);
  FillPattern(buf, 4096, 3);
  auto done = RunAll(queue_.get(), {{IoOp::kWrite, *old_file, 0, buf, 4096, 1},
                                    {IoOp::kSync, *old_file, 0, nullptr, 0, 2}});
  EXPECT_TRUE(done[1].status.ok()) << done[1].status;
  EXPECT_TRUE(done[2].status.ok()) << done[2].status;
  ASSERT_TRUE(queue_->UnregisterFile(*old_file).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(queue_->UnregisterFile(*old_file)));
  EXPECT_TRUE(absl::IsInvalidArgument(queue_->Enqueue({IoOp::kSync, *old_file, 0, nullptr, 0, 3})));
  int new_fd = OpenFile("new", /*direct=*/true, 1 << 20);
  absl::StatusOr<int> new_file = queue_->RegisterFile(new_fd);
  ASSERT_TRUE(new_file.ok());
  EXPECT_EQ(*new_file, *old_file);
  FillPattern(buf, 4096, 4);
  done = RunAll(queue_.get(), {{IoOp::kWrite, *new_file, 0, buf, 4096, 4},
                               {IoOp::kSync, *new_file, 0, nullptr, 0, 5}});
  EXPECT_TRUE(done[4].status.ok()) << done[4].status;
  EXPECT_TRUE(done[5].status.ok()) << done[5].status;
  char* old_bytes = buf + 4096;  // (aligned: the files may be O_DIRECT)
  char* new_bytes = buf + 8192;
  ASSERT_EQ(::pread(fds_[0].get(), old_bytes, 4096, 0), 4096);
  ASSERT_EQ(::pread(fds_[1].get(), new_bytes, 4096, 0), 4096);
  EXPECT_TRUE(testing::MatchesPattern(old_bytes, 4096, 3));
  EXPECT_TRUE(testing::MatchesPattern(new_bytes, 4096, 4));
}

TEST_P(IoQueueTest, ShortReadAtEndOfFileIsContinuedThenReported) {
  int fd = OpenFile("short", /*direct=*/false);
  std::vector<char> data(10000);
  FillPattern(data.data(), data.size(), 3);
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), 10000);
  absl::StatusOr<int> file = queue_->RegisterFile(fd);
  ASSERT_TRUE(file.ok());
  Extent e = Alloc(16384);
  // The kernel moves 10000 bytes (short); the queue asks for the rest, gets 0: end of file.
  auto done = RunAll(queue_.get(), {{IoOp::kRead, *file, 0, pool_->At(e), 16384, 7}});
  EXPECT_TRUE(absl::IsOutOfRange(done[7].status)) << done[7].status;
  EXPECT_EQ(done[7].bytes, 10000u);
  EXPECT_EQ(std::memcmp(pool_->At(e), data.data(), 10000), 0);
  if (auto* uring = dynamic_cast<UringIoQueue*>(queue_.get())) {
    EXPECT_GE(uring->resubmissions(), 1u);
  }
}

TEST_P(IoQueueTest, ShortWriteAtFileSizeLimitIsReportedWithBytesMoved) {
  // RLIMIT_FSIZE makes a write that crosses it short, and the next one fail with EFBIG: a real
  // short write followed by a real error, on every engine.
  int fd = OpenFile("limited", /*direct=*/false);
  absl::StatusOr<int> file = queue_->RegisterFile(fd);
  ASSERT_TRUE(file.ok());
  Extent e = Alloc(64 << 10);
  FillPattern(pool_->At(e), 64 << 10, 4);
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old), 0);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = (1 << 20) + 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  auto done = RunAll(queue_.get(), {{IoOp::kWrite, *file, 1 << 20, pool_->At(e), 64 << 10, 9}});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &old, nullptr);
  EXPECT_FALSE(done[9].status.ok());
  EXPECT_NE(done[9].status.message().find("File too large"), std::string_view::npos)
      << done[9].status;
  EXPECT_EQ(done[9].bytes, 4096u);
}

TEST_P(IoQueueTest, KernelErrorsArriveAsCompletions) {
  UniqueFd readonly(::open(dir_.File("ro").c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(readonly.valid());
  absl::StatusOr<int> file = queue_->RegisterFile(readonly.get());
  ASSERT_TRUE(file.ok());
  Extent e = Alloc(4096);
  auto done = RunAll(queue_.get(), {{IoOp::kWrite, *file, 0, pool_->At(e), 4096, 5}});
  EXPECT_TRUE(absl::IsInvalidArgument(done[5].status)) << done[5].status;  // EBADF
  EXPECT_EQ(done[5].bytes, 0u);
}

TEST_P(IoQueueTest, WakeReleasesAWaitingPoll) {
  // A read from an empty pipe stays in flight until data arrives: Poll(wait) would block on it.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  absl::StatusOr<int> file = queue_->RegisterFile(rd.get());
  ASSERT_TRUE(file.ok());
  Extent e = Alloc(4096);
  ASSERT_TRUE(queue_->Enqueue({IoOp::kRead, *file, kCurrentPosition, pool_->At(e), 8, 11}).ok());
  std::vector<IoCompletion> out;
  // Woken from another thread, whether Poll has started blocking yet or not.
  std::thread waker([&] { queue_->Wake(); });
  EXPECT_EQ(queue_->Poll(&out, true), 0);
  waker.join();
  ASSERT_EQ(::write(wr.get(), "12345678", 8), 8);
  while (out.empty()) queue_->Poll(&out, true);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].status.ok()) << out[0].status;
  EXPECT_EQ(out[0].bytes, 8u);
  EXPECT_EQ(std::memcmp(pool_->At(e), "12345678", 8), 0);
}

TEST_P(IoQueueTest, FaultRulesFailShortenAndCorrupt) {
  if (faulty_ == nullptr) GTEST_SKIP() << "fault rules apply to the FaultyIoQueue wrapper";
  int fd = OpenFile("data", /*direct=*/true, 1 << 20);
  absl::StatusOr<int> file = queue_->RegisterFile(fd);
  ASSERT_TRUE(file.ok());
  Extent src = Alloc(1 << 20), dst = Alloc(1 << 20);
  FillPattern(pool_->At(src), 1 << 20, 5);
  auto write = [&](uint64_t i, uint64_t tag) {
    return IoRequest{IoOp::kWrite, *file, i * 65536, pool_->At(src) + i * 65536, 65536, tag};
  };
  int third_write = faulty_->AddRule({.op = IoOp::kWrite, .error = EIO, .skip = 2});
  int enospc = faulty_->AddRule({.op = IoOp::kWrite, .error = ENOSPC,
                                 .offset_begin = 5 * 65536, .offset_end = 6 * 65536});
  int short_write = faulty_->AddRule({.op = IoOp::kWrite, .action = FaultRule::Action::kShort,
                                      .error = EIO, .offset_begin = 7 * 65536,
                                      .offset_end = 8 * 65536, .short_bytes = 8192});
  std::vector<IoRequest> writes;
  for (uint64_t i = 0; i < 16; ++i) writes.push_back(write(i, i));
  auto done = RunAll(queue_.get(), writes);
  for (uint64_t i = 0; i < 16; ++i) {
    if (i == 2) {
      EXPECT_TRUE(absl::IsDataLoss(done[i].status)) << done[i].status;  // EIO
      EXPECT_NE(done[i].status.message().find("injected"), std::string_view::npos);
    } else if (i == 5) {
      EXPECT_TRUE(absl::IsResourceExhausted(done[i].status)) << done[i].status;  // ENOSPC
    } else if (i == 7) {
      EXPECT_FALSE(done[i].status.ok());
      EXPECT_EQ(done[i].bytes, 8192u);
    } else {
      EXPECT_TRUE(done[i].status.ok()) << i << ": " << done[i].status;
    }
  }
  EXPECT_EQ(faulty_->fired(third_write), 1u);
  EXPECT_EQ(faulty_->fired(enospc), 1u);
  EXPECT_EQ(faulty_->fired(short_write), 1u);

  // Reads of the first block come back with one bit flipped; the next read of it is clean.
  int corrupt = faulty_->AddRule({.op = IoOp::kRead, .action = FaultRule::Action::kCorrupt,
                                  .offset_begin = 0, .offset_end = 65536,
                                  .corrupt_offset = 1000});
  done = RunAll(queue_.get(), {{IoOp::kRead, *file, 0, pool_->At(dst), 65536, 1}});
  ASSERT_TRUE(done[1].status.ok());
  EXPECT_EQ(faulty_->fired(corrupt), 1u);
  EXPECT_NE(std::memcmp(pool_->At(src), pool_->At(dst), 65536), 0);
  EXPECT_EQ(pool_->At(src)[1000] ^ pool_->At(dst)[1000], 0x10);
  EXPECT_EQ(std::memcmp(pool_->At(src), pool_->At(dst), 1000), 0);
  done = RunAll(queue_.get(), {{IoOp::kRead, *file, 0, pool_->At(dst), 65536, 2}});
  ASSERT_TRUE(done[2].status.ok());
  EXPECT_EQ(std::memcmp(pool_->At(src), pool_->At(dst), 65536), 0);
  EXPECT_EQ(faulty_->total_fired(), 4u);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoQueueTest,
                         ::testing::Values(Engine::kUring, Engine::kThreadPool,
                                           Engine::kFaultyUring, Engine::kFaultyThreadPool),
                         [](const auto& info) { return EngineName(info.param); });

TEST(IoQueueFactory, ForcedKindsAndNames) {
  auto pool = MakeIoQueue({.kind = IoQueueKind::kThreadPool, .depth = 4});
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->name(), "thread_pool");
  EXPECT_EQ((*pool)->depth(), 4u);
  EXPECT_FALSE(MakeIoQueue({.depth = 0}).ok());
  bool uring_works = UringIoQueue::Create(4).ok();
  auto forced = MakeIoQueue({.kind = IoQueueKind::kUring, .depth = 4});
  EXPECT_EQ(forced.ok(), uring_works);
  auto automatic = MakeIoQueue({.kind = IoQueueKind::kAuto, .depth = 4});
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ((*automatic)->name(), uring_works ? "io_uring" : "thread_pool");
  IoQueueKind kind;
  EXPECT_TRUE(ParseIoQueueKind("thread_pool", &kind));
  EXPECT_EQ(kind, IoQueueKind::kThreadPool);
  EXPECT_TRUE(ParseIoQueueKind("io_uring", &kind));
  EXPECT_EQ(kind, IoQueueKind::kUring);
  EXPECT_FALSE(ParseIoQueueKind("aio", &kind));
}

#if defined(__x86_64__) || defined(__aarch64__)
// Makes io_uring_setup fail with `err` in this process, as Docker's default seccomp profile or
// kernel.io_uring_disabled=2 do.
void RefuseIoUringSetup(int err) {
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#else
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#endif
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    std::fprintf(stderr, "cannot install seccomp filter: %s\n", std::strerror(errno));
    std::exit(3);
  }
}

// In a child: io_uring refused with `err`; auto must fall back (and say so), forced must fail,
// and the fallback must really move data. Returns the child's exit code (0: all held).
int FallbackChildBody(int err) {
  RefuseIoUringSetup(err);
  if (MakeIoQueue({.kind = IoQueueKind::kUring, .depth = 4}).ok()) return 4;
  auto queue = MakeIoQueue({.kind = IoQueueKind::kAuto, .depth = 4});
  if (!queue.ok() || (*queue)->name() != "thread_pool") return 5;
  TempDir dir;
  UniqueFd fd(::open(dir.File("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  auto file = (*queue)->RegisterFile(fd.get());
  char out[64] = "fallback works", in[64] = {};
  if (!file.ok() || !(*queue)->Enqueue({IoOp::kWrite, *file, 0, out, sizeof(out), 1}).ok()) {
    return 6;
  }
  std::vector<IoCompletion> done;
  while (done.empty()) (*queue)->Poll(&done, true);
  if (!(*queue)->Enqueue({IoOp::kRead, *file, 0, in, sizeof(in), 2}).ok()) return 7;
  done.clear();
  while (done.empty()) (*queue)->Poll(&done, true);
  return done[0].status.ok() && std::strcmp(in, out) == 0 ? 0 : 8;
}

// std::exit skips the destructors of locals: the body returns first so its TempDir is removed.
[[noreturn]] void FallbackChild(int err) { std::exit(FallbackChildBody(err)); }

TEST(IoQueueFactoryDeathTest, FallsBackToThreadPoolWhenIoUringSetupIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(FallbackChild(EPERM), ::testing::ExitedWithCode(0),
              "io_uring unavailable .*Operation not permitted.*using the thread-pool queue");
  EXPECT_EXIT(FallbackChild(ENOSYS), ::testing::ExitedWithCode(0),
              "io_uring unavailable .*Function not implemented.*using the thread-pool queue");
}
#endif

}  // namespace
}  // namespace tier::storage
