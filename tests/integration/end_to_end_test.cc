// The whole path with the host engine: a real tierd process, real sockets, real shared memory,
// the client library as a trainer would link it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process_state.h"
#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::ChildProcess;
using testing::TierdProcess;

// True once every thread of `pid` is stopped. kill(SIGSTOP) returns before the group stop is
// done: each thread stops when it next takes the signal, and a thread still running may serve a
// job meanwhile (seen on a 2-core CI host under TSan).
bool AllThreadsStopped(pid_t pid) {
  std::error_code error;
  int threads = 0;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const char state = ProcStatState(line);
    if (state != 'T' && state != 't') return false;
    ++threads;
  }
  return !error && threads > 0;
}

bool WaitAllThreadsStopped(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!AllThreadsStopped(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void Fill(void* data, uint64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* words = static_cast<uint32_t*>(data);
  for (uint64_t i = 0; i < len / 4; ++i) words[i] = rng();
}

bool Matches(const void* data, uint64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* words = static_cast<const uint32_t*>(data);
  for (uint64_t i = 0; i < len / 4; ++i) {
    if (words[i] != rng()) return false;
  }
  return true;
}

bool NoSessionsAndEmptyPool(const v1::GetStatusResponse& s) {
  return s.sessions() == 0 && TierdProcess::HostTier(s).used_bytes() == 0 &&
         s.jobs_in_flight() == 0;
}

TEST(EndToEnd, OffloadReloadRoundTrip) {
  TierdProcess tierd;
  {
    Session session(tierd.SessionOptions("test"));
    HostBuffer buffer = session.AllocHost(1 << 20);
    Fill(buffer.data, buffer.bytes, 1);
    auto [object, job] = session.Offload(buffer.id, 0, buffer.bytes);
    session.Wait(job);
    std::memset(buffer.data, 0, buffer.bytes);
    session.Wait(session.Reload(object, buffer.id, 0, buffer.bytes));
    EXPECT_TRUE(Matches(buffer.data, buffer.bytes, 1));

    v1::GetStatusResponse status = tierd.Status();
    EXPECT_EQ(TierdProcess::HostTier(status).used_bytes(), 1u << 20);
    EXPECT_EQ(status.bytes_offloaded(), 1u << 20);
    EXPECT_EQ(status.bytes_reloaded(), 1u << 20);
    session.Wait(session.Free(object));
    EXPECT_EQ(TierdProcess::HostTier(tierd.Status()).used_bytes(), 0u);
  }
  EXPECT_TRUE(tierd.WaitForStatus(NoSessionsAndEmptyPool));
  EXPECT_EQ(tierd.Stop(), 0);
}

TEST(EndToEnd, ThousandsOfPipelinedJobsOverflowTheRingAndStayOrdered) {
  TierdProcess tierd({"--ring_entries=64"});
  Session session(tierd.SessionOptions("test"));
  constexpr uint64_t kChunk = 4096;
  constexpr int kJobs = 3000;
  HostBuffer buffer = session.AllocHost(kChunk * 64);
  Fill(buffer.data, buffer.bytes, 7);
  std::vector<tier_object_id> objects;
  std::vector<tier_job_id> jobs;
  for (int i = 0; i < kJobs; ++i) {
    auto [object, job] = session.Offload(buffer.id, (i % 64) * kChunk, kChunk);
    objects.push_back(object);
    jobs.push_back(job);
  }
  for (tier_job_id job : jobs) session.Wait(job);
  HostBuffer out = session.AllocHost(kChunk);
  // Reverse order, as activation offload reloads.
  for (int i = kJobs - 1; i >= 0; --i) {
    session.Wait(session.Reload(objects[i], out.id, 0, kChunk, /*free_after=*/true));
    ASSERT_EQ(std::memcmp(out.data, static_cast<char*>(buffer.data) + (i % 64) * kChunk, kChunk), 0)
        << "object " << i;
  }
  EXPECT_EQ(TierdProcess::HostTier(tierd.Status()).used_bytes(), 0u);
}

TEST(EndToEnd, ReloadQueuedBehindItsOffloadWaitsForItUnderDelayInjection) {
  // Every copy is delayed: a reload that did not wait for its offload would read stale memory.
  TierdProcess tierd({"--copy_delay_us=3000"});
  Session session(tierd.SessionOptions("test"));
  HostBuffer src = session.AllocHost(256 << 10);
  HostBuffer dst = session.AllocHost(256 << 10);
  for (uint32_t round = 0; round < 5; ++round) {
    Fill(src.data, src.bytes, 100 + round);
    std::memset(dst.data, 0, dst.bytes);
    auto [object, offload] = session.Offload(src.id, 0, src.bytes);
    tier_job_id reload = session.Reload(object, dst.id, 0, dst.bytes, true);  // no wait between
    session.Wait(reload);
    session.Wait(offload);
    EXPECT_TRUE(Matches(dst.data, dst.bytes, 100 + round));
  }
}

TEST(EndToEnd, BadJobsFailAloneWithClearCodes) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("test"));
  HostBuffer buffer = session.AllocHost(64 << 10);
  Fill(buffer.data, buffer.bytes, 3);
  auto [good, job] = session.Offload(buffer.id, 0, 4096);
  session.Wait(job);

  EXPECT_EQ(session.TryWait(session.Reload(999999, buffer.id, 0, 4096)), TIER_NOT_FOUND);
  EXPECT_EQ(session.TryWait(session.Offload(buffer.id, 0, 0).second), TIER_INVALID_ARGUMENT);
  EXPECT_EQ(session.TryWait(session.Offload(buffer.id, 60 << 10, 8 << 10).second),
            TIER_OUT_OF_RANGE);
  EXPECT_EQ(session.TryWait(session.Offload(buffer.id, ~uint64_t{0} - 100, 4096).second),
            TIER_OUT_OF_RANGE);
  EXPECT_EQ(session.TryWait(session.Offload(buffer.id, 4096, ~uint64_t{0} - 100).second),
            TIER_OUT_OF_RANGE);
  EXPECT_EQ(session.TryWait(session.Offload(4242, 0, 4096).second), TIER_NOT_FOUND);
  EXPECT_EQ(session.TryWait(session.Reload(good, buffer.id, 0, 8192)), TIER_INVALID_ARGUMENT);
  EXPECT_EQ(session.TryWait(session.Reload(good, buffer.id, 62 << 10, 4096)), TIER_OUT_OF_RANGE);
  EXPECT_EQ(session.TryWait(session.Free(31337)), TIER_NOT_FOUND);

  // The session and the daemon go on serving, the good object intact.
  std::memset(buffer.data, 0, 4096);
  session.Wait(session.Reload(good, buffer.id, 0, 4096));
  EXPECT_TRUE(Matches(buffer.data, 4096, 3));
  v1::GetStatusResponse status = tierd.Status();
  EXPECT_EQ(status.jobs_failed(), 9u);
  EXPECT_EQ(TierdProcess::HostTier(status).used_bytes(), 4096u);
}

// Batches over the host engine: each job completes on its own, a bad one fails alone, and the
// data goes out and comes back whole. (The GPU engine's side of batches, one ticket for all, is
// in stream_engine_test and daemon_gpu_test.)
TEST(EndToEnd, BatchesOffloadAndReloadWithPerJobResults) {
  TierdProcess tierd({"--ring_entries=64"});
  Session session(tierd.SessionOptions("test"));
  constexpr uint64_t kJob = 16 << 10;
  constexpr int kJobs = 48;
  HostBuffer buffer = session.AllocHost(kJob * kJobs);
  for (int i = 0; i < kJobs; ++i) Fill(static_cast<char*>(buffer.data) + i * kJob, kJob, 100 + i);
  std::vector<tier_batch_job> out;
  for (int i = 0; i < kJobs; ++i) out.push_back(Session::BatchJob(buffer.id, i * kJob, kJob));
  out[5].len = 0;  // invalid: fails alone
  session.OffloadBatch(out);
  for (int i = 0; i < kJobs; ++i) {
    EXPECT_NE(out[i].job, 0u);
    EXPECT_EQ(session.TryWait(out[i].job), i == 5 ? TIER_INVALID_ARGUMENT : TIER_OK) << i;
  }
  std::memset(buffer.data, 0, buffer.bytes);
  std::vector<tier_batch_job> back;
  for (int i = 0; i < kJobs; ++i) {
    if (i != 5) back.push_back(Session::BatchJob(buffer.id, i * kJob, kJob, out[i].object));
  }
  session.ReloadBatch(back, /*free_after=*/true);
  for (const tier_batch_job& j : back) session.Wait(j.job);
  for (int i = 0; i < kJobs; ++i) {
    if (i != 5) {
      EXPECT_TRUE(Matches(static_cast<char*>(buffer.data) + i * kJob, kJob, 100 + i)) << i;
    }
  }
  EXPECT_TRUE(tierd.WaitForStatus(
      [](const v1::GetStatusResponse& s) { return TierdProcess::HostTier(s).used_bytes() == 0; }));

  // A batch larger than the ring, or than the limit, is refused whole; an empty one is fine.
  std::vector<tier_batch_job> big(65, Session::BatchJob(buffer.id, 0, kJob));
  EXPECT_EQ(tier_offload_batch(session.get(), big.data(), big.size(), nullptr),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tier_offload_batch(session.get(), big.data(), TIER_MAX_BATCH_JOBS + 1, nullptr),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tier_offload_batch(session.get(), nullptr, 0, nullptr), TIER_OK);
  big[3].struct_size = 8;
  EXPECT_EQ(tier_offload_batch(session.get(), big.data(), 4, nullptr), TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tierd.Status().jobs_in_flight(), 0u);
}

TEST(EndToEnd, QuotaIsEnforcedAndFreedBytesReturnToIt) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("quota", 1 << 20));
  HostBuffer buffer = session.AllocHost(1 << 20);
  auto [first, job] = session.Offload(buffer.id, 0, 768 << 10);
  session.Wait(job);
  auto [second, over] = session.Offload(buffer.id, 0, 512 << 10);
  EXPECT_EQ(session.TryWait(over), TIER_RESOURCE_EXHAUSTED);
  session.Wait(session.Free(first));
  session.Wait(session.Offload(buffer.id, 0, 512 << 10).second);
  EXPECT_EQ(TierdProcess::HostTier(tierd.Status()).used_bytes(), 512u << 10);
}

TEST(EndToEnd, FullPoolFailsAtOnceAndKeepsServing) {
  TierdProcess tierd;  // 64 MiB pool
  Session session(tierd.SessionOptions("test"));
  HostBuffer buffer = session.AllocHost(40 << 20);
  session.Wait(session.Offload(buffer.id, 0, 40 << 20).second);
  tier_job_id refused = session.Offload(buffer.id, 0, 32 << 20).second;
  EXPECT_EQ(session.TryWait(refused), TIER_RESOURCE_EXHAUSTED);
  session.Wait(session.Offload(buffer.id, 0, 16 << 20).second);
  EXPECT_EQ(TierdProcess::HostTier(tierd.Status()).used_bytes(), 56u << 20);
}

TEST(EndToEnd, SessionsCannotReachEachOthersObjects) {
  TierdProcess tierd;
  Session a(tierd.SessionOptions("a"));
  Session b(tierd.SessionOptions("b"));
  HostBuffer buf_a = a.AllocHost(4096);
  HostBuffer buf_b = b.AllocHost(4096);
  Fill(buf_a.data, 4096, 11);
  auto [object_a, job_a] = a.Offload(buf_a.id, 0, 4096);
  a.Wait(job_a);
  // b names a's object id (ids are per session: b has none) and a's buffer id: both unknown to b.
  EXPECT_EQ(b.TryWait(b.Reload(object_a, buf_b.id, 0, 4096)), TIER_NOT_FOUND);
  EXPECT_EQ(b.TryWait(b.Free(object_a)), TIER_NOT_FOUND);
  std::memset(buf_a.data, 0, 4096);
  a.Wait(a.Reload(object_a, buf_a.id, 0, 4096));
  EXPECT_TRUE(Matches(buf_a.data, 4096, 11));
  // b's own object 1 holds b's data, never a's.
  Fill(buf_b.data, 4096, 12);
  auto [object_b, job_b] = b.Offload(buf_b.id, 0, 4096);
  b.Wait(job_b);
  std::memset(buf_b.data, 0, 4096);
  b.Wait(b.Reload(object_b, buf_b.id, 0, 4096));
  EXPECT_TRUE(Matches(buf_b.data, 4096, 12));
}

TEST(EndToEnd, KilledClientIsCleanedUpAndOthersKeepTheirData) {
  TierdProcess tierd;
  Session survivor(tierd.SessionOptions("survivor"));
  HostBuffer keep = survivor.AllocHost(1 << 20);
  Fill(keep.data, keep.bytes, 21);
  auto [kept, job] = survivor.Offload(keep.id, 0, keep.bytes);
  survivor.Wait(job);

  // A separate program, not fork(): a forked child would inherit this process's gRPC state.
  // $TIER_BUILD_DIR: a bundle copied to another machine (the GPU host) holds it under tests/.
  const char* build_dir = std::getenv("TIER_BUILD_DIR");
  std::string doomed_bin = build_dir != nullptr && *build_dir != '\0'
                               ? std::string(build_dir) + "/tests/doomed_client"
                               : DOOMED_CLIENT_BIN;
  ChildProcess doomed({doomed_bin, "--socket=" + tierd.socket(), "--mib=8"});
  ASSERT_EQ(doomed.ReadLine(20000), "ready");
  EXPECT_GE(TierdProcess::HostTier(tierd.Status()).used_bytes(), 9u << 20);
  doomed.Kill();
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.sessions() == 1 && TierdProcess::HostTier(s).used_bytes() == 1u << 20;
  })) << "the dead client's extents were not all freed";
  std::memset(keep.data, 0, keep.bytes);
  survivor.Wait(survivor.Reload(kept, keep.id, 0, keep.bytes));
  EXPECT_TRUE(Matches(keep.data, keep.bytes, 21));
}

TEST(EndToEnd, SigtermLetsInFlightJobsFinishThenExitsZero) {
  TierdProcess tierd({"--copy_delay_us=20000"});
  Session session(tierd.SessionOptions("test"));
  HostBuffer buffer = session.AllocHost(4 << 20);
  Fill(buffer.data, buffer.bytes, 5);
  std::vector<tier_job_id> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(session.Offload(buffer.id, i << 19, 1 << 19).second);
  ASSERT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) { return s.jobs_in_flight() > 0; }));
  std::thread stopper([&] { EXPECT_EQ(tierd.Stop(), 0); });
  for (tier_job_id job : jobs) EXPECT_EQ(session.TryWait(job), TIER_OK);
  stopper.join();
}

TEST(EndToEnd, DeadDaemonFailsPendingJobsInsteadOfHanging) {
  auto tierd = std::make_unique<TierdProcess>(std::vector<std::string>{"--copy_delay_us=500000"});
  Session session(tierd->SessionOptions("test"));
  HostBuffer buffer = session.AllocHost(1 << 20);
  tier_job_id job = session.Offload(buffer.id, 0, 1 << 20).second;
  ASSERT_TRUE(tierd->WaitForStatus([](const v1::GetStatusResponse& s) { return s.jobs_in_flight() > 0; }));
  tierd->Kill();
  EXPECT_EQ(session.TryWait(job, 20000), TIER_UNAVAILABLE);
  tier_object_id object;
  tier_job_id next;
  EXPECT_EQ(tier_offload(session.get(), buffer.id, 0, 4096, nullptr, &object, &next),
            TIER_UNAVAILABLE);
}

TEST(EndToEnd, AWaitForAStoppedDaemonSaysItIsStoppedThenEndsWhenItResumes) {
  // A tierd that stops answering while alive (SIGSTOP, a debugger, a disk call that does not
  // return) is not a death the client can see; a wait for it says, after TIER_WAIT_WARN_MS, what
  // the kernel says tierd is doing.
  // (CTest sets TIER_WAIT_WARN_MS=300 for this binary: no setenv beside the library's threads.)
  const char* warn_ms = std::getenv("TIER_WAIT_WARN_MS");
  if (warn_ms == nullptr || std::atoi(warn_ms) <= 0 || std::atoi(warn_ms) > 1000) {
    GTEST_SKIP() << "needs TIER_WAIT_WARN_MS between 1 and 1000 (ctest sets 300)";
  }
  TierdProcess tierd;
  auto session = std::make_unique<Session>(tierd.SessionOptions("test"));
  HostBuffer buffer = session->AllocHost(1 << 20);
  Fill(buffer.data, buffer.bytes, 9);
  ASSERT_EQ(::kill(tierd.pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitAllThreadsStopped(tierd.pid(), std::chrono::seconds(10)))
      << "tierd's threads did not all stop within 10 s of SIGSTOP";
  tier_job_id job = session->Offload(buffer.id, 0, buffer.bytes).second;
  std::thread resume([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ::kill(tierd.pid(), SIGCONT);
  });
  ::testing::internal::CaptureStderr();
  const tier_status waited = session->TryWait(job, 20000);
  const std::string log = ::testing::internal::GetCapturedStderr();
  resume.join();
  EXPECT_EQ(waited, TIER_OK);
  EXPECT_NE(log.find(absl::StrCat("tierd (pid ", tierd.pid(), ") is stopped (T")),
            std::string::npos) << log;
  EXPECT_NE(log.find("ended after"), std::string::npos) << log;
  session.reset();
  EXPECT_EQ(tierd.Stop(), 0);
}

TEST(EndToEnd, ManyClientsInParallel) {
  TierdProcess tierd;
  std::vector<std::thread> threads;
  std::atomic<int> verified{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Session session(tierd.SessionOptions("worker" + std::to_string(t)));
      HostBuffer buffer = session.AllocHost(256 << 10);
      for (int round = 0; round < 50; ++round) {
        Fill(buffer.data, buffer.bytes, t * 1000 + round);
        auto [object, job] = session.Offload(buffer.id, 0, buffer.bytes);
        session.Wait(job);
        std::memset(buffer.data, 0, buffer.bytes);
        session.Wait(session.Reload(object, buffer.id, 0, buffer.bytes, true));
        if (Matches(buffer.data, buffer.bytes, t * 1000 + round)) ++verified;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(verified.load(), 200);
  EXPECT_TRUE(tierd.WaitForStatus(NoSessionsAndEmptyPool));
}

TEST(EndToEnd, OneSessionSharedByThreads) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("test"));
  std::vector<std::thread> threads;
  std::atomic<int> verified{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      HostBuffer buffer = session.AllocHost(64 << 10);
      for (int round = 0; round < 100; ++round) {
        Fill(buffer.data, buffer.bytes, t * 7919 + round);
        auto [object, job] = session.Offload(buffer.id, 0, buffer.bytes);
        session.Wait(job);
        std::memset(buffer.data, 0, buffer.bytes);
        session.Wait(session.Reload(object, buffer.id, 0, buffer.bytes, true));
        if (Matches(buffer.data, buffer.bytes, t * 7919 + round)) ++verified;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(verified.load(), 400);
}

}  // namespace
}  // namespace tier
