// The ordering contract on the GPU (tests/gpu/daemon_gpu_fixture.h; docs/architecture.md,
// client/gpu/client_gpu.h), one test per rule, each run with delay injection so that a broken rule
// shows up as wrong bytes every time, not once in a while:
//   copy-before-produced   OffloadWaitsForAllProducerStreams (one and several producers)
//   use-before-reloaded    ConsumerSeesReloadedBytesWithoutHostWait
//   free-before-copied     StreamWaitOffloadProtectsTheSource
// plus a randomized graph over several streams, batches, and reloads of spilled objects; each
// with buffers from cudaMalloc and from VMM.
#include "gpu/daemon_gpu_fixture.h"

namespace tier::daemon_gpu_testing {

TEST_P(DaemonGpuTest, RoundTripThroughTheDaemon) {
  Session session(*tierd_);
  ASSERT_EQ(session.status(), TIER_OK) << tier_last_error();
  DeviceMemory memory(GetParam(), 8 * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  // A pointer inside the same allocation: same buffer, its offset.
  auto [again, inner] = session.Register(memory.get() + kMiB);
  EXPECT_EQ(again, buffer);
  EXPECT_EQ(inner, base + kMiB);
  CUDA_OK(cudaMemset(memory.get(), 0x5A, 4 * kMiB));
  CUDA_OK(cudaDeviceSynchronize());
  auto [object, offload] = session.Offload(buffer, base, 4 * kMiB, {});
  ASSERT_EQ(session.Wait(offload), TIER_OK) << tier_last_error();
  tier_job_id reload = session.Reload(object, buffer, base + 4 * kMiB, 4 * kMiB, nullptr, true);
  EXPECT_TRUE(DeviceHolds(memory.get() + 4 * kMiB, 4 * kMiB, 0x5A));
  EXPECT_EQ(session.Wait(reload), TIER_OK);
  // The object went with the reload: the daemon holds nothing for us.
  EXPECT_TRUE(tierd_->WaitForStatus(
      [](const v1::GetStatusResponse& s) { return TierdProcess::HostTier(s).used_bytes() == 0; }));
}

// Copy before produced: the producers' writes are held on the GPU when the offload is submitted;
// the daemon's copy must wait for every producer stream (the DeepSpeed IPG case has several).
TEST_P(DaemonGpuTest, OffloadWaitsForAllProducerStreams) {
  Session session(*tierd_);
  DeviceMemory memory(GetParam(), 4 * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  CUDA_OK(cudaMemset(memory.get(), 0x11, 4 * kMiB));
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t first, second;
  CUDA_OK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  Gate gate_first, gate_second;
  gate_first.Hold(first);
  gate_second.Hold(second);
  CUDA_OK(cudaMemsetAsync(memory.get(), 0x77, 2 * kMiB, first));
  CUDA_OK(cudaMemsetAsync(memory.get() + 2 * kMiB, 0x77, 2 * kMiB, second));
  auto [object, offload] = session.Offload(buffer, base, 4 * kMiB, {first, second});
  EXPECT_EQ(session.Wait(offload, 300), TIER_DEADLINE_EXCEEDED) << "copied before produced";
  gate_first.Open();
  EXPECT_EQ(session.Wait(offload, 300), TIER_DEADLINE_EXCEEDED)
      << "the copy waited for one producer stream of two";
  gate_second.Open();
  ASSERT_EQ(session.Wait(offload), TIER_OK) << tier_last_error();
  // Read back what the daemon holds into other memory.
  DeviceMemory check(Alloc::kCudaMalloc, 4 * kMiB);
  auto [check_buffer, check_base] = session.Register(check.get());
  cudaStream_t consumer;
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  tier_job_id reload = session.Reload(object, check_buffer, check_base, 4 * kMiB, consumer);
  EXPECT_TRUE(DeviceHolds(check.get(), 4 * kMiB, 0x77, consumer));
  EXPECT_EQ(session.Wait(reload), TIER_OK);
  for (cudaStream_t s : {first, second, consumer}) cudaStreamDestroy(s);
}

// Use before reloaded: the consumer stream reads right after tier_reload returns, with no host
// wait; it must see the reloaded bytes (the copy starts 20 ms late).
TEST_P(DaemonGpuTest, ConsumerSeesReloadedBytesWithoutHostWait) {
  Session session(*tierd_);
  DeviceMemory memory(GetParam(), 2 * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t consumer;
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  for (int round = 0; round < 5; ++round) {
    uint8_t value = static_cast<uint8_t>(0x30 + round);
    CUDA_OK(cudaMemsetAsync(memory.get(), value, kMiB, consumer));
    auto [object, offload] = session.Offload(buffer, base, kMiB, {consumer});
    CUDA_OK(cudaMemsetAsync(memory.get() + kMiB, 0, kMiB, consumer));
    tier_job_id reload = session.Reload(object, buffer, base + kMiB, kMiB, consumer, true);
    EXPECT_TRUE(DeviceHolds(memory.get() + kMiB, kMiB, value, consumer)) << "round " << round;
    EXPECT_EQ(session.Wait(offload), TIER_OK);
    EXPECT_EQ(session.Wait(reload), TIER_OK);
  }
  cudaStreamDestroy(consumer);
}

// Free before copied: the stream that overwrites the source first waits for the offload's copy
// (tier_stream_wait_offload), on the GPU; the object must hold the bytes from before.
TEST_P(DaemonGpuTest, StreamWaitOffloadProtectsTheSource) {
  Session session(*tierd_);
  DeviceMemory memory(GetParam(), 2 * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaMemsetAsync(memory.get(), 0x42, kMiB, stream));
  auto [object, offload] = session.Offload(buffer, base, kMiB, {stream});
  ASSERT_EQ(tier_stream_wait_offload(session.get(), offload, stream), TIER_OK) << tier_last_error();
  CUDA_OK(cudaMemsetAsync(memory.get(), 0xEE, kMiB, stream));  // reuse of the "freed" source
  tier_job_id reload = session.Reload(object, buffer, base + kMiB, kMiB, stream);
  EXPECT_TRUE(DeviceHolds(memory.get() + kMiB, kMiB, 0x42, stream));
  EXPECT_EQ(session.Wait(offload), TIER_OK);
  EXPECT_EQ(session.Wait(reload), TIER_OK);
  cudaStreamDestroy(stream);
}

// A prefetch into the consumer's own memory (TIER_RELOAD_DEFER_WAIT): the consumer is not held at
// submission (its next work runs beside the copy), waits only where tier_stream_wait_reload puts
// the wait, and there sees the reloaded bytes (every copy lands 20 ms late here).
TEST_P(DaemonGpuTest, DeferredReloadWaitsWhereTheConsumerAsks) {
  Session session(*tierd_);
  DeviceMemory memory(GetParam(), 2 * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t consumer;
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  for (int round = 0; round < 3; ++round) {
    const uint8_t value = static_cast<uint8_t>(0x61 + round);
    CUDA_OK(cudaMemsetAsync(memory.get(), value, kMiB, consumer));
    auto [object, offload] = session.Offload(buffer, base, kMiB, {consumer});
    CUDA_OK(cudaMemsetAsync(memory.get() + kMiB, 0, kMiB, consumer));
    tier_reload_options options;
    tier_reload_options_init(&options);
    options.consumer_stream = consumer;
    options.flags = TIER_RELOAD_FREE_AFTER | TIER_RELOAD_DEFER_WAIT;
    tier_job_id reload = 0;
    ASSERT_EQ(tier_reload(session.get(), object, buffer, base + kMiB, kMiB, &options, &reload),
              TIER_OK)
        << tier_last_error();
    // Not held: the consumer's queue drains while the copy still waits its 20 ms.
    CUDA_OK(cudaStreamSynchronize(consumer));
    EXPECT_EQ(tier_stream_wait_offload(session.get(), reload, consumer), TIER_INVALID_ARGUMENT);
    ASSERT_EQ(tier_stream_wait_reload(session.get(), reload, consumer), TIER_OK)
        << tier_last_error();
    EXPECT_TRUE(DeviceHolds(memory.get() + kMiB, kMiB, value, consumer)) << "round " << round;
    EXPECT_EQ(session.Wait(offload), TIER_OK);
    EXPECT_EQ(session.Wait(reload), TIER_OK);
    // Reaped: nothing left to wait for.
    EXPECT_EQ(tier_stream_wait_reload(session.get(), reload, consumer), TIER_OK);
  }
  cudaStreamDestroy(consumer);
}

// Thousands of offloads and reloads over several streams in a random order, every reload checked
// byte for byte on its consumer stream; finishes (no deadlock) and leaks nothing.
TEST_P(DaemonGpuTest, RandomGraphOverSeveralStreams) { RandomGraph(1); }

// The same with batches: one ticket for up to 8 jobs of a stream, under delay injection.
TEST_P(DaemonGpuTest, RandomGraphOfBatchesOverSeveralStreams) { RandomGraph(8); }

void DaemonGpuTest::RandomGraph(int max_batch) {
  Start(500);
  Session session(*tierd_);
  constexpr int kStreams = 4;
  constexpr uint64_t kChunk = 64 << 10;
  constexpr int kSlots = 64;
  constexpr int kOps = 3000;
  DeviceMemory src(GetParam(), kSlots * kChunk);
  DeviceMemory dst(GetParam(), kSlots * kChunk);
  ASSERT_NE(src.get(), nullptr);
  ASSERT_NE(dst.get(), nullptr);
  auto [src_buffer, src_base] = session.Register(src.get());
  auto [dst_buffer, dst_base] = session.Register(dst.get());
  std::vector<cudaStream_t> streams(kStreams);
  for (auto& s : streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Results read back into pinned memory on the consumer stream, checked at the end.
  uint8_t* readback = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&readback), kOps * 16, cudaHostAllocDefault));
  std::mt19937 rng(1234);
  struct Live {
    tier_object_id object;
    uint8_t value;
  };
  std::vector<Live> live;
  std::vector<tier_job_id> jobs;
  std::vector<std::pair<int, uint8_t>> expected;  // readback slot -> value
  // Each slot of src/dst is used by one stream at a time: the last stream that touched it.
  std::vector<int> src_owner(kSlots, 0), dst_owner(kSlots, 0);
  // The stream waits for the slot's previous user (an event).
  auto take_slot = [&](std::vector<int>& owner, int slot, int stream) {
    cudaEvent_t e;
    CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(e, streams[owner[slot]]));
    CUDA_OK(cudaStreamWaitEvent(streams[stream], e, 0));
    cudaEventDestroy(e);
    owner[slot] = stream;
  };
  // `count` distinct slots.
  auto pick_slots = [&](int count) {
    std::vector<int> all(kSlots);
    for (int i = 0; i < kSlots; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    return std::vector<int>(all.begin(), all.begin() + count);
  };
  for (int op = 0; op < kOps && !HasFatalFailure();) {
    bool offload = live.empty() || (live.size() < 200 && rng() % 2 == 0);
    int stream = static_cast<int>(rng() % kStreams);
    int count = 1 + static_cast<int>(rng() % max_batch);
    if (!offload) count = std::min<int>(count, static_cast<int>(live.size()));
    op += count;
    std::vector<int> slots = pick_slots(count);
    std::vector<uint64_t> offsets;
    if (offload) {
      std::vector<uint8_t> values;
      for (int slot : slots) {
        take_slot(src_owner, slot, stream);
        values.push_back(static_cast<uint8_t>(rng()));
        CUDA_OK(cudaMemsetAsync(src.get() + slot * kChunk, values.back(), kChunk, streams[stream]));
        offsets.push_back(src_base + slot * kChunk);
      }
      std::vector<std::pair<tier_object_id, tier_job_id>> done;
      if (count == 1) {
        done.push_back(session.Offload(src_buffer, offsets[0], kChunk, {streams[stream]}));
      } else {
        for (const tier_batch_job& j :
             session.OffloadBatch(src_buffer, offsets, kChunk, {streams[stream]})) {
          done.push_back({j.object, j.job});
        }
      }
      for (size_t i = 0; i < done.size(); ++i) {
        ASSERT_EQ(tier_stream_wait_offload(session.get(), done[i].second, streams[stream]),
                  TIER_OK);
        jobs.push_back(done[i].second);
        live.push_back({done[i].first, values[i]});
      }
    } else {
      std::vector<Live> items;
      std::vector<tier_object_id> objects;
      for (int i = 0; i < count; ++i) {
        size_t pick = rng() % live.size();
        items.push_back(live[pick]);
        objects.push_back(live[pick].object);
        live.erase(live.begin() + static_cast<long>(pick));
      }
      for (int slot : slots) {
        take_slot(dst_owner, slot, stream);
        offsets.push_back(dst_base + slot * kChunk);
      }
      if (count == 1) {
        jobs.push_back(session.Reload(objects[0], dst_buffer, offsets[0], kChunk,
                                      streams[stream], true));
      } else {
        for (const tier_batch_job& j : session.ReloadBatch(dst_buffer, offsets, kChunk, objects,
                                                           streams[stream], true)) {
          jobs.push_back(j.job);
        }
      }
      for (int i = 0; i < count; ++i) {
        // Sample 16 bytes spread over the chunk (first, last and between).
        int index = static_cast<int>(expected.size());
        CUDA_OK(cudaMemcpy2DAsync(readback + index * 16, 1, dst.get() + slots[i] * kChunk,
                                  kChunk / 16, 1, 16, cudaMemcpyDeviceToHost, streams[stream]));
        expected.push_back({index, items[i].value});
      }
    }
    // Reap as we go so the ring never fills with unreaped results.
    if (jobs.size() >= 256) {
      for (tier_job_id job : jobs) ASSERT_EQ(session.Wait(job), TIER_OK) << tier_last_error();
      jobs.clear();
    }
  }
  for (tier_job_id job : jobs) ASSERT_EQ(session.Wait(job), TIER_OK) << tier_last_error();
  for (auto& s : streams) CUDA_OK(cudaStreamSynchronize(s));
  int wrong = 0;
  for (auto [index, value] : expected) {
    for (int i = 0; i < 16; ++i) wrong += readback[index * 16 + i] != value;
  }
  EXPECT_EQ(wrong, 0) << "of " << expected.size() * 16 << " bytes sampled";
  for (auto& s : streams) cudaStreamDestroy(s);
  cudaFreeHost(readback);
  for (const Live& item : live) {
    tier_job_id job;
    ASSERT_EQ(tier_free(session.get(), item.object, &job), TIER_OK);
    ASSERT_EQ(session.Wait(job), TIER_OK);
  }
  EXPECT_TRUE(tierd_->WaitForStatus(
      [](const v1::GetStatusResponse& s) { return TierdProcess::HostTier(s).used_bytes() == 0; }));
}

// A batch waits for every producer stream before any of its copies, and one completion value
// releases the consumer for all of them (20 ms delay injection: a missing wait is a wrong byte).
TEST_P(DaemonGpuTest, BatchWaitsForEveryProducerAndReleasesTheConsumerForAll) {
  Session session(*tierd_);
  constexpr int kJobs = 8;
  DeviceMemory memory(GetParam(), 2 * kJobs * kMiB);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  CUDA_OK(cudaMemset(memory.get(), 0x11, 2 * kJobs * kMiB));
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t first, second, consumer;
  CUDA_OK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  Gate gate_first, gate_second;
  gate_first.Hold(first);
  gate_second.Hold(second);
  std::vector<uint64_t> sources, targets;
  for (int i = 0; i < kJobs; ++i) {
    CUDA_OK(cudaMemsetAsync(memory.get() + i * kMiB, 0x60 + i, kMiB, i % 2 ? second : first));
    sources.push_back(base + i * kMiB);
    targets.push_back(base + (kJobs + i) * kMiB);
  }
  std::vector<tier_batch_job> out = session.OffloadBatch(buffer, sources, kMiB, {first, second});
  ASSERT_EQ(out.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(session.Wait(out[0].job, 300), TIER_DEADLINE_EXCEEDED) << "copied before produced";
  gate_first.Open();
  EXPECT_EQ(session.Wait(out[0].job, 300), TIER_DEADLINE_EXCEEDED)
      << "the batch waited for one producer stream of two";
  gate_second.Open();
  std::vector<tier_object_id> objects;
  for (const tier_batch_job& j : out) {
    ASSERT_EQ(session.Wait(j.job), TIER_OK) << tier_last_error();
    objects.push_back(j.object);
  }
  std::vector<tier_batch_job> back =
      session.ReloadBatch(buffer, targets, kMiB, objects, consumer, /*free_after=*/true);
  for (int i = 0; i < kJobs; ++i) {  // read on the consumer right away: no host wait
    EXPECT_TRUE(DeviceHolds(memory.get() + (kJobs + i) * kMiB, kMiB,
                            static_cast<uint8_t>(0x60 + i), consumer))
        << "job " << i;
  }
  for (const tier_batch_job& j : back) EXPECT_EQ(session.Wait(j.job), TIER_OK);
  for (cudaStream_t s : {first, second, consumer}) cudaStreamDestroy(s);
  EXPECT_TRUE(tierd_->WaitForStatus(
      [](const v1::GetStatusResponse& s) { return TierdProcess::HostTier(s).used_bytes() == 0; }));
}

// The NVMe tier under the GPU path: four times what the host pool holds is offloaded from device
// memory (most of it spilled), then reloaded in reverse order straight into device memory, each
// reload of a spilled object pipelined (every 1 MiB chunk goes to the GPU as the NVMe read
// verifies it), every byte checked on the consumer stream.
TEST_P(DaemonGpuTest, SpillsMoreThanThePoolAndReloadsItIntoTheGpu) {
  tierd_.reset();
  tierd_.emplace(std::vector<std::string>{"--engine=cuda", "--pool_bytes=64M", "--spill_bytes=1G",
                                          "--spill_high_pct=50", "--spill_low_pct=25",
                                          "--spill_io_bytes=1M"});
  Session session(*tierd_);
  ASSERT_EQ(session.status(), TIER_OK) << tier_last_error();
  constexpr uint64_t kObject = 8 * kMiB;
  constexpr int kObjects = 32;  // 256 MiB through a 64 MiB pool
  DeviceMemory memory(GetParam(), kObjects * kObject);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<tier_object_id> objects(kObjects);
  std::vector<tier_job_id> jobs(kObjects);
  for (int i = 0; i < kObjects; ++i) {
    CUDA_OK(cudaMemsetAsync(memory.get() + i * kObject, 0x40 + i, kObject, stream));
    std::tie(objects[i], jobs[i]) = session.Offload(buffer, base + i * kObject, kObject, {stream});
  }
  for (int i = 0; i < kObjects; ++i) ASSERT_EQ(session.Wait(jobs[i], 60000), TIER_OK) << i;
  v1::GetStatusResponse status = tierd_->Status();
  EXPECT_GE(status.bytes_spilled(), 192 * kMiB);
  CUDA_OK(cudaMemsetAsync(memory.get(), 0, kObjects * kObject, stream));
  for (int i = kObjects - 1; i >= 0; --i) {
    jobs[i] = session.Reload(objects[i], buffer, base + i * kObject, kObject, stream, true);
  }
  for (int i = 0; i < kObjects; ++i) {
    EXPECT_TRUE(DeviceHolds(memory.get() + i * kObject, kObject, 0x40 + i, stream)) << i;
  }
  for (int i = 0; i < kObjects; ++i) EXPECT_EQ(session.Wait(jobs[i], 60000), TIER_OK) << i;
  status = tierd_->Status();
  EXPECT_GE(status.bytes_fetched(), 192 * kMiB);
  EXPECT_EQ(status.checksum_failures(), 0u);
  EXPECT_TRUE(tierd_->WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.tiers(0).used_bytes() == 0 && s.tiers(1).used_bytes() == 0;
  })) << "extents or records leaked";
  cudaStreamDestroy(stream);
}

// A spilled chunk that comes back damaged (a bit flipped in transit, injected in tierd's I/O
// layer) fails its pipelined reload with DATA_LOSS: the consumer stream is released all the same,
// the destination holds verified bytes or zeros (never the damaged ones), and a second reload
// brings back every byte.
TEST_P(DaemonGpuTest, DamagedSpilledChunkFailsThePipelinedReloadCleanly) {
  tierd_.reset();
  tierd_.emplace(std::vector<std::string>{
      "--engine=cuda", "--pool_bytes=64M", "--spill_bytes=1G", "--spill_high_pct=50",
      "--spill_low_pct=25", "--spill_io_bytes=1M", "--spill_prefetch=0",
      "--spill_inject_faults=read:corrupt:3:1"});
  Session session(*tierd_);
  ASSERT_EQ(session.status(), TIER_OK) << tier_last_error();
  constexpr uint64_t kObject = 8 * kMiB;
  constexpr int kObjects = 16;
  DeviceMemory memory(GetParam(), kObjects * kObject);
  ASSERT_NE(memory.get(), nullptr);
  auto [buffer, base] = session.Register(memory.get());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<tier_object_id> objects(kObjects);
  for (int i = 0; i < kObjects; ++i) {
    CUDA_OK(cudaMemsetAsync(memory.get() + i * kObject, 0x60 + i, kObject, stream));
    tier_job_id job;
    std::tie(objects[i], job) = session.Offload(buffer, base + i * kObject, kObject, {stream});
    ASSERT_EQ(session.Wait(job, 60000), TIER_OK) << i;
  }
  ASSERT_TRUE(tierd_->WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.bytes_spilled() >= 8 * kMiB;
  }));
  // The oldest object was spilled first; its first read is the one the rule damages (chunk 3).
  CUDA_OK(cudaMemsetAsync(memory.get(), 0x01, kObject, stream));
  tier_job_id first = session.Reload(objects[0], buffer, base, kObject, stream);
  std::vector<uint8_t> host(kObject);
  CUDA_OK(cudaMemcpyAsync(host.data(), memory.get(), kObject, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));  // returns: the stream was released
  EXPECT_EQ(session.Wait(first, 60000), TIER_DATA_LOSS) << tier_last_error();
  uint64_t verified = 0, zeros = 0;
  for (uint64_t b = 0; b < kObject; ++b) {
    if (host[b] == 0x60) {
      ++verified;
    } else if (host[b] == 0) {
      ++zeros;
    } else {
      ADD_FAILURE() << "byte " << b << " is 0x" << std::hex << int(host[b]);
      break;
    }
  }
  EXPECT_EQ(verified, 3 * kMiB);  // the chunks before the damaged one
  EXPECT_EQ(zeros, kObject - 3 * kMiB);
  EXPECT_EQ(tierd_->Status().checksum_failures(), 1u);
  // The record is intact on disk: a second reload brings it all back.
  tier_job_id second = session.Reload(objects[0], buffer, base, kObject, stream);
  EXPECT_TRUE(DeviceHolds(memory.get(), kObject, 0x60, stream));
  EXPECT_EQ(session.Wait(second, 60000), TIER_OK);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Allocators, DaemonGpuTest,
                         ::testing::Values(Alloc::kCudaMalloc, Alloc::kVmm),
                         [](const auto& info) {
                           return info.param == Alloc::kCudaMalloc ? "cudaMalloc" : "VMM";
                         });

}  // namespace tier::daemon_gpu_testing
