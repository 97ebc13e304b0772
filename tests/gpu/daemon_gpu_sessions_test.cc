// Sessions on the GPU data path (tests/gpu/daemon_gpu_fixture.h): bad input gets clear errors and
// the session keeps working; a session ending while another waits for its ticket; the daemon's
// death releases the consumer streams, also a launch blocked behind the wait; the link tierd
// reports from its own copies.
#include "gpu/daemon_gpu_fixture.h"

namespace tier::daemon_gpu_testing {
namespace {

// Bad input: host and unknown pointers, ranges past the allocation. Each gets a clear error;
// ticketed jobs that fail still release the streams that wait on them, and the session and the
// daemon keep working.
TEST(DaemonGpuBadInput, ClearErrorsAndTheSessionKeepsWorking) {
  TierdProcess tierd({"--engine=cuda"});
  Session session(tierd);
  std::vector<char> host(4096);
  tier_buffer_id id;
  uint64_t offset;
  EXPECT_EQ(tier_buffer_register_device(session.get(), host.data(), &id, &offset),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(tier_buffer_register_device(session.get(), reinterpret_cast<void*>(0x10), &id, &offset),
            TIER_INVALID_ARGUMENT);
  DeviceMemory memory(Alloc::kCudaMalloc, 2 * kMiB);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Past the end of the allocation: the job fails, its ticket still goes through.
  auto [bad_object, bad] = session.Offload(buffer, base + 2 * kMiB - 4096, 8192, {stream});
  EXPECT_EQ(session.Wait(bad), TIER_OUT_OF_RANGE);
  // A reload of an unknown object, on the consumer stream: fails, and the stream is not stuck.
  tier_job_id bad_reload = session.Reload(999999, buffer, base, 4096, stream);
  EXPECT_EQ(session.Wait(bad_reload), TIER_NOT_FOUND);
  CUDA_OK(cudaStreamSynchronize(stream));
  // The lane still works: the next tickets are served.
  CUDA_OK(cudaMemsetAsync(memory.get(), 0x3C, kMiB, stream));
  auto [object, good] = session.Offload(buffer, base, kMiB, {stream});
  EXPECT_EQ(session.Wait(good), TIER_OK) << tier_last_error();
  tier_job_id reload = session.Reload(object, buffer, base + kMiB, kMiB, stream);
  EXPECT_TRUE(DeviceHolds(memory.get() + kMiB, kMiB, 0x3C, stream));
  EXPECT_EQ(session.Wait(reload), TIER_OK);
  cudaStreamDestroy(stream);
}

// Issue 10 on the GPU. Session b ends (tierd closes its IPC mappings, which waits for the device
// while holding a driver lock) while session a's offload depends on a's reload (backward: the
// next saved tensor is produced after a reloaded one is used), so a's ticket comes only once
// tierd issued and finished the reload. Before the fix tierd's copy waited on the GPU for that
// ticket, the close waited for the copy, and the reload could not be issued: a hang. Twenty
// rounds, each with a fresh session b; a watchdog fails the test instead of hanging it.
TEST(DaemonGpuManySessions, SessionEndsWhileAnotherWaitsForItsTicket) {
  TierdProcess tierd({"--engine=cuda", "--copy_delay_us=2000"});
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 6000 && !finished.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!finished.load()) {
      std::fprintf(stderr, "HANG: a session's end and another's ticket deadlocked tierd\n");
      std::fflush(stderr);
      std::_Exit(1);
    }
  });
  Session a(tierd);
  DeviceMemory memory(Alloc::kCudaMalloc, 4 * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = a.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaMemsetAsync(memory.get(), 0x21, kMiB, stream));
  auto [saved, first] = a.Offload(buffer, base, kMiB, {stream});
  ASSERT_EQ(a.Wait(first), TIER_OK) << tier_last_error();
  for (int round = 0; round < 20; ++round) {
    auto b = std::make_unique<Session>(tierd);
    DeviceMemory other(Alloc::kCudaMalloc, 2 * kMiB);
    (void)b->Register(other.get());
    // The reload, then the next "activation" produced on the same stream after it, offloaded.
    tier_job_id reload = a.Reload(saved, buffer, base + kMiB, kMiB, stream);
    uint8_t value = static_cast<uint8_t>(0x40 + round);
    CUDA_OK(cudaMemsetAsync(memory.get() + 2 * kMiB, value, kMiB, stream));
    auto [next, offload] = a.Offload(buffer, base + 2 * kMiB, kMiB, {stream});
    std::thread closer([&] { b.reset(); });  // tierd closes b's IPC mapping now
    EXPECT_EQ(a.Wait(reload), TIER_OK) << "round " << round << ": " << tier_last_error();
    EXPECT_EQ(a.Wait(offload), TIER_OK) << "round " << round << ": " << tier_last_error();
    closer.join();
    tier_job_id check = a.Reload(next, buffer, base + 3 * kMiB, kMiB, stream, true);
    EXPECT_TRUE(DeviceHolds(memory.get() + 3 * kMiB, kMiB, value, stream)) << "round " << round;
    EXPECT_TRUE(DeviceHolds(memory.get() + kMiB, kMiB, 0x21, stream)) << "round " << round;
    EXPECT_EQ(a.Wait(check), TIER_OK);
  }
  finished = true;
  watchdog.join();
  cudaStreamDestroy(stream);
}

// The daemon dies while a consumer stream waits for a reload: the stream is released (nothing
// hangs) and the job fails with UNAVAILABLE.
TEST(DaemonGpuDeath, ConsumerStreamIsReleasedWhenTheDaemonDies) {
  auto tierd = std::make_unique<TierdProcess>(
      std::vector<std::string>{"--engine=cuda", "--copy_delay_us=2000000"});
  Session session(*tierd);
  DeviceMemory memory(Alloc::kCudaMalloc, 2 * kMiB);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto [object, offload] = session.Offload(buffer, base, kMiB, {stream});
  tier_job_id reload = session.Reload(object, buffer, base + kMiB, kMiB, stream);
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);  // waiting for the daemon
  tierd->Kill();
  // No thread of ours waits on the ring: the client's death watch must release the stream.
  auto start = std::chrono::steady_clock::now();
  while (cudaStreamQuery(stream) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess) << "the consumer stream still waits";
  EXPECT_EQ(session.Wait(offload, 5000), TIER_UNAVAILABLE);
  EXPECT_EQ(session.Wait(reload, 5000), TIER_UNAVAILABLE);
  cudaStreamDestroy(stream);
}

// The dead-daemon hang (issue 30) end to end: the consumer stream waits for a reload tierd
// holds back, a thread launches onto that stream until the launch blocks inside the driver (its
// queue full, a driver lock held), then tierd is SIGKILLed. The client's death watch must
// release the wait without any CUDA call of its own, and every launch must complete.
TEST(DaemonGpuDeath, ALaunchBlockedBehindTheWaitCompletesWhenTheDaemonDies) {
  auto tierd = std::make_unique<TierdProcess>(
      std::vector<std::string>{"--engine=cuda", "--copy_delay_us=30000000"});
  Session session(*tierd);
  DeviceMemory memory(Alloc::kCudaMalloc, 2 * kMiB);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto [object, offload] = session.Offload(buffer, base, kMiB, {stream});
  session.Reload(object, buffer, base + kMiB, kMiB, stream);
  void* scratch = nullptr;
  CUDA_OK(cudaMalloc(&scratch, 4096));
  std::atomic<uint64_t> launched{0};
  std::atomic<bool> done{false};
  std::thread launcher([&] {
    for (int i = 0; i < 2000000; ++i) {
      if (cudaMemsetAsync(scratch, i & 0xFF, 4096, stream) != cudaSuccess) break;
      launched.fetch_add(1);
    }
    done = true;
  });
  uint64_t seen = ~uint64_t{0};
  while (!done && launched.load() != seen) {  // until the launcher stops moving: blocked
    seen = launched.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const bool blocked = !done;
  std::printf("launches queued behind the wait: %llu; launcher blocked at the kill: %s\n",
              static_cast<unsigned long long>(launched.load()), blocked ? "yes" : "no");
  tierd->Kill();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!done) {
    ADD_FAILURE() << "hang: the launcher is still blocked 20 s after tierd died";
    std::fflush(stdout);
    std::_Exit(1);  // the thread cannot be joined; leave rather than hang the suite
  }
  launcher.join();
  EXPECT_TRUE(blocked) << "the launcher never blocked: the queue did not fill";
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaFree(scratch));
  cudaStreamDestroy(stream);
}

// tierd measures its own link: after it moved a few hundred MiB each way in large jobs, every
// client of the node reads the same figure (tier_link_rate), close to what the copies took.
TEST(DaemonGpuLink, TierdReportsTheLinkItsCopiesAchieved) {
  TierdProcess tierd({"--engine=cuda", "--pool_bytes=1G"});
  Session session(tierd);
  ASSERT_EQ(session.status(), TIER_OK) << tier_last_error();
  double d2h = -1, h2d = -1;
  EXPECT_EQ(tier_link_rate(session.get(), 0, &d2h, &h2d), TIER_OK) << tier_last_error();
  EXPECT_EQ(d2h, 0);  // nothing moved yet
  constexpr uint64_t kJob = 32 * kMiB;
  constexpr int kJobs = 16;
  DeviceMemory memory(Alloc::kCudaMalloc, kJob * kJobs);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<uint64_t> offsets;
  for (int i = 0; i < kJobs; ++i) offsets.push_back(base + i * kJob);
  for (int round = 0; round < 4; ++round) {
    auto start = std::chrono::steady_clock::now();
    std::vector<tier_batch_job> out = session.OffloadBatch(buffer, offsets, kJob, {stream});
    for (const tier_batch_job& j : out) ASSERT_EQ(session.Wait(j.job), TIER_OK);
    std::vector<tier_object_id> objects;
    for (const tier_batch_job& j : out) objects.push_back(j.object);
    std::vector<tier_batch_job> in =
        session.ReloadBatch(buffer, offsets, kJob, objects, stream, /*free_after=*/true);
    for (const tier_batch_job& j : in) ASSERT_EQ(session.Wait(j.job), TIER_OK);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("round %d: %.1f GB/s through tierd (both legs, one after the other)\n", round,
                2.0 * kJob * kJobs / s / 1e9);
  }
  ASSERT_EQ(tier_link_rate(session.get(), 0, &d2h, &h2d), TIER_OK) << tier_last_error();
  std::printf("tierd's link figure: D2H %.1f GB/s, H2D %.1f GB/s\n", d2h / 1e9, h2d / 1e9);
  // PCIe Gen4/5 and NVLink-C2C hosts all move more than 10 GB/s each way; a figure far outside
  // that is a measuring bug (the bench compares it with its own figure within 10%).
  EXPECT_GT(d2h, 10e9);
  EXPECT_GT(h2d, 10e9);
  EXPECT_LT(d2h, 1000e9);
  EXPECT_LT(h2d, 1000e9);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tier::daemon_gpu_testing
