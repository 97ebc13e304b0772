// The GPU data path end to end: a real tierd running the CUDA engine, this process a client
// through the C ABI (libtierclient's code), device buffers from cudaMalloc and from VMM with POSIX
// fd handles (PyTorch's expandable segments). One test per rule of the ordering contract
// (docs/architecture.md, client/gpu/client_gpu.h), each run with delay injection so that a broken rule
// shows up as wrong bytes every time, not once in a while:
//   copy-before-produced   OffloadWaitsForAllProducerStreams (one and several producers)
//   use-before-reloaded    ConsumerSeesReloadedBytesWithoutHostWait
//   free-before-copied     StreamWaitOffloadProtectsTheSource
// plus a randomized graph over several streams, bad input, and the daemon's death.
// Exits 77 ("no GPU: skipped") where no device exists.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "client/gpu/client_gpu.h"
#include "gpu/cuda_driver.h"
#include "gtest/gtest.h"
#include "tier/tier.h"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::TierdProcess;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(expr)

enum class Alloc { kCudaMalloc, kVmm };

// A device allocation of either kind, freed at scope end.
class DeviceMemory {
 public:
  DeviceMemory(Alloc kind, uint64_t bytes) : kind_(kind) {
    if (kind == Alloc::kCudaMalloc) {
      if (cudaMalloc(&ptr_, bytes) == cudaSuccess) bytes_ = bytes;
      return;
    }
    absl::StatusOr<const gpu::cuda::Driver*> d = gpu::cuda::GetDriver();
    if (!d.ok()) return;
    driver_ = *d;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    if (driver_->MemGetAllocationGranularity(&granularity, &prop,
                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      return;
    }
    uint64_t rounded = (bytes + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle = 0;
    if (driver_->MemCreate(&handle, rounded, &prop, 0) != CUDA_SUCCESS) return;
    CUdeviceptr va = 0;
    if (driver_->MemAddressReserve(&va, rounded, granularity, 0, 0) != CUDA_SUCCESS ||
        driver_->MemMap(va, rounded, 0, handle, 0) != CUDA_SUCCESS) {
      driver_->MemRelease(handle);
      return;
    }
    driver_->MemRelease(handle);  // the mapping keeps it
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (driver_->MemSetAccess(va, rounded, &access, 1) != CUDA_SUCCESS) return;
    ptr_ = reinterpret_cast<void*>(va);
    bytes_ = rounded;
  }
  ~DeviceMemory() {
    if (ptr_ == nullptr) return;
    cudaDeviceSynchronize();
    if (kind_ == Alloc::kCudaMalloc) {
      cudaFree(ptr_);
    } else {
      driver_->MemUnmap(reinterpret_cast<CUdeviceptr>(ptr_), bytes_);
      driver_->MemAddressFree(reinterpret_cast<CUdeviceptr>(ptr_), bytes_);
    }
  }
  char* get() const { return static_cast<char*>(ptr_); }
  uint64_t bytes() const { return bytes_; }

 private:
  Alloc kind_;
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
  const gpu::cuda::Driver* driver_ = nullptr;
};

// A stream held at a host-controlled gate: work queued after Hold() runs only after Open().
class Gate {
 public:
  Gate() {
    cudaHostAlloc(reinterpret_cast<void**>(&word_), 64, cudaHostAllocMapped | cudaHostAllocPortable);
    *word_ = 0;
    cudaHostGetDevicePointer(&device_word_, word_, 0);
  }
  ~Gate() {
    Open();
    cudaDeviceSynchronize();
    cudaFreeHost(word_);
  }
  void Hold(cudaStream_t stream) {
    const gpu::cuda::Driver* d = *gpu::cuda::GetDriver();
    ASSERT_EQ(d->StreamWaitValue64(stream, reinterpret_cast<CUdeviceptr>(device_word_), 1,
                                   CU_STREAM_WAIT_VALUE_GEQ),
              CUDA_SUCCESS);
  }
  void Open() { std::atomic_ref<uint64_t>(*word_).store(1); }

 private:
  uint64_t* word_ = nullptr;
  void* device_word_ = nullptr;
};

class Session {
 public:
  explicit Session(const TierdProcess& tierd) {
    tier_session_options options;
    tier_session_options_init(&options);
    socket_ = tierd.socket();
    options.socket_path = socket_.c_str();
    options.name = "gpu-test";
    status_ = tier_session_open(&options, &session_);
  }
  ~Session() {
    if (session_ != nullptr) tier_session_close(session_);
  }
  tier_session* get() const { return session_; }
  tier_status status() const { return status_; }
  // Registers the allocation holding ptr; returns {buffer, offset}.
  std::pair<tier_buffer_id, uint64_t> Register(const void* ptr) {
    tier_buffer_id id = 0;
    uint64_t offset = 0;
    tier_status s = tier_buffer_register_device(session_, ptr, &id, &offset);
    EXPECT_EQ(s, TIER_OK) << tier_last_error();
    return {id, offset};
  }
  std::pair<tier_object_id, tier_job_id> Offload(tier_buffer_id buffer, uint64_t offset,
                                                 uint64_t len, std::vector<void*> producers) {
    tier_offload_options options;
    tier_offload_options_init(&options);
    options.num_producer_streams = static_cast<uint32_t>(producers.size());
    options.producer_streams = producers.data();
    tier_object_id object = 0;
    tier_job_id job = 0;
    tier_status s = tier_offload(session_, buffer, offset, len, &options, &object, &job);
    EXPECT_EQ(s, TIER_OK) << tier_last_error();
    return {object, job};
  }
  tier_job_id Reload(tier_object_id object, tier_buffer_id buffer, uint64_t offset, uint64_t len,
                     cudaStream_t consumer, bool free_after = false) {
    tier_reload_options options;
    tier_reload_options_init(&options);
    options.consumer_stream = consumer;
    if (free_after) options.flags = TIER_RELOAD_FREE_AFTER;
    tier_job_id job = 0;
    tier_status s = tier_reload(session_, object, buffer, offset, len, &options, &job);
    EXPECT_EQ(s, TIER_OK) << tier_last_error();
    return job;
  }
  // Batches of (buffer, offset, len[, object]); returns the jobs (objects filled in for offloads).
  std::vector<tier_batch_job> OffloadBatch(tier_buffer_id buffer,
                                           const std::vector<uint64_t>& offsets, uint64_t len,
                                           std::vector<void*> producers) {
    std::vector<tier_batch_job> jobs;
    for (uint64_t offset : offsets) jobs.push_back(tier::Session::BatchJob(buffer, offset, len));
    tier_offload_options options;
    tier_offload_options_init(&options);
    options.num_producer_streams = static_cast<uint32_t>(producers.size());
    options.producer_streams = producers.data();
    tier_status s = tier_offload_batch(session_, jobs.data(), jobs.size(), &options);
    EXPECT_EQ(s, TIER_OK) << tier_last_error();
    return jobs;
  }
  std::vector<tier_batch_job> ReloadBatch(tier_buffer_id buffer,
                                          const std::vector<uint64_t>& offsets, uint64_t len,
                                          const std::vector<tier_object_id>& objects,
                                          cudaStream_t consumer, bool free_after = false) {
    std::vector<tier_batch_job> jobs;
    for (size_t i = 0; i < offsets.size(); ++i) {
      jobs.push_back(tier::Session::BatchJob(buffer, offsets[i], len, objects[i]));
    }
    tier_reload_options options;
    tier_reload_options_init(&options);
    options.consumer_stream = consumer;
    if (free_after) options.flags = TIER_RELOAD_FREE_AFTER;
    tier_status s = tier_reload_batch(session_, jobs.data(), jobs.size(), &options);
    EXPECT_EQ(s, TIER_OK) << tier_last_error();
    return jobs;
  }
  tier_status Wait(tier_job_id job, int64_t timeout_ms = 30000) {
    return tier_job_wait(session_, job, timeout_ms);
  }

 private:
  std::string socket_;
  tier_session* session_ = nullptr;
  tier_status status_ = TIER_OK;
};

// Checks `bytes` of device memory hold `value` everywhere, reading on `stream`.
::testing::AssertionResult DeviceHolds(const char* data, uint64_t bytes, uint8_t value,
                                       cudaStream_t stream = nullptr) {
  std::vector<uint8_t> host(bytes);
  if (cudaMemcpyAsync(host.data(), data, bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return ::testing::AssertionFailure() << "read back failed";
  }
  for (uint64_t i = 0; i < bytes; ++i) {
    if (host[i] != value) {
      return ::testing::AssertionFailure() << "byte " << i << " is 0x" << std::hex << int(host[i])
                                           << ", expected 0x" << int(value);
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr uint64_t kMiB = 1 << 20;

class DaemonGpuTest : public ::testing::TestWithParam<Alloc> {
 protected:
  // By default every copy starts 20 ms after its ticket wait passed: a missing wait is a wrong
  // byte. Tests with thousands of jobs use less.
  void SetUp() override { Start(20000); }
  void Start(uint64_t delay_us) {
    tierd_.reset();
    tierd_.emplace(std::vector<std::string>{"--engine=cuda", "--pool_bytes=512M",
                                            "--copy_delay_us=" + std::to_string(delay_us)});
  }
  // Thousands of offloads and reloads over several streams in a random order (batches of 1 to
  // max_batch jobs on one stream), every reload checked on its consumer stream.
  void RandomGraph(int max_batch);
  std::optional<TierdProcess> tierd_;
};

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

// PyTorch's expandable segments: several physical allocations mapped side by side in one VA
// reservation. A range crossing pages is registered as one buffer of those pages; jobs over the
// page boundaries move the right bytes both ways.
TEST(DaemonGpuVmmPages, JobsCrossPagesOfOneReservation) {
  CUDA_OK(cudaFree(nullptr));  // the runtime's context first, as a framework would have it
  const gpu::cuda::Driver* d = *gpu::cuda::GetDriver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  ASSERT_EQ(d->MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  const uint64_t page = 2 * granularity;  // pages of different sizes: 2, 1 and 3 granules
  const uint64_t sizes[] = {page, granularity, 3 * granularity};
  const uint64_t total = sizes[0] + sizes[1] + sizes[2];
  CUdeviceptr va = 0;
  ASSERT_EQ(d->MemAddressReserve(&va, total, granularity, 0, 0), CUDA_SUCCESS);
  uint64_t offset = 0;
  for (uint64_t size : sizes) {
    CUmemGenericAllocationHandle handle = 0;
    ASSERT_EQ(d->MemCreate(&handle, size, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d->MemMap(va + offset, size, 0, handle, 0), CUDA_SUCCESS);
    d->MemRelease(handle);
    offset += size;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(d->MemSetAccess(va, total, &access, 1), CUDA_SUCCESS);
  char* base = reinterpret_cast<char*>(va);

  TierdProcess tierd({"--engine=cuda", "--copy_delay_us=5000"});
  {  // the session closes (the daemon unmaps the pages) before the pages go
  Session session(tierd);
  // One page alone is still one page (plain registration and a range inside it).
  tier_buffer_id first_page;
  uint64_t first_offset;
  ASSERT_EQ(tier_buffer_register_device(session.get(), base + 4096, &first_page, &first_offset),
            TIER_OK) << tier_last_error();
  EXPECT_EQ(first_offset, 4096u);
  // A range from inside page 0 to inside page 2: three pages, one buffer.
  const uint64_t start = sizes[0] / 2, len = total - sizes[2] / 2 - start;
  tier_buffer_id buffer;
  uint64_t at;
  ASSERT_EQ(tier_buffer_register_device_range(session.get(), base + start, len, &buffer, &at),
            TIER_OK) << tier_last_error();
  EXPECT_EQ(at, start);
  std::vector<uint8_t> pattern(len);
  for (uint64_t i = 0; i < len; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + i / 4096);
  CUDA_OK(cudaMemcpy(base + start, pattern.data(), len, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto [object, offload] = session.Offload(buffer, at, len, {stream});
  ASSERT_EQ(session.Wait(offload), TIER_OK) << tier_last_error();
  CUDA_OK(cudaMemsetAsync(base, 0, total, stream));
  tier_job_id reload = session.Reload(object, buffer, at, len, stream, true);
  std::vector<uint8_t> back(len);
  CUDA_OK(cudaMemcpyAsync(back.data(), base + start, len, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(session.Wait(reload), TIER_OK);
  EXPECT_TRUE(back == pattern) << "bytes differ after a round trip across VMM pages";
  // Past the reservation's mapped pages: OUT_OF_RANGE, clearly.
  EXPECT_EQ(tier_buffer_register_device_range(session.get(), base + start, total, &buffer, &at),
            TIER_OUT_OF_RANGE);
  // A cudaMalloc range past its allocation: OUT_OF_RANGE too.
  DeviceMemory plain(Alloc::kCudaMalloc, kMiB);
  EXPECT_EQ(tier_buffer_register_device_range(session.get(), plain.get(), 2 * kMiB, &buffer, &at),
            TIER_OUT_OF_RANGE);
  // The same ranges in one call (tier_buffer_register_device_ranges): per range, what the
  // one-range call answers, ids and offsets included.
  const void* ptrs[] = {base + start, base + start, plain.get(), base + 4096};
  const uint64_t lens[] = {len, total, 2 * kMiB, 4096};
  tier_buffer_id ids[4];
  uint64_t offsets[4];
  tier_status statuses[4];
  ASSERT_EQ(tier_buffer_register_device_ranges(session.get(), 4, ptrs, lens, ids, offsets,
                                               statuses),
            TIER_OK);
  EXPECT_EQ(statuses[0], TIER_OK);
  EXPECT_EQ(ids[0], buffer);
  EXPECT_EQ(offsets[0], start);
  EXPECT_EQ(statuses[1], TIER_OUT_OF_RANGE);
  EXPECT_EQ(statuses[2], TIER_OUT_OF_RANGE);
  EXPECT_EQ(statuses[3], TIER_OK);
  EXPECT_EQ(offsets[3], first_offset);
  cudaStreamDestroy(stream);
  }
  offset = 0;
  for (uint64_t size : sizes) {
    d->MemUnmap(va + offset, size);
    offset += size;
  }
  d->MemAddressFree(va, total);
}

// Issue 13, point 3: an expandable segment is registered whole, once, and grown in place. A
// range over far more than 8 pages (the old kCudaVmmPages limit) is one (buffer, offset) and
// round-trips bit-exact; every range inside reuses the registration (no export, no message); pages
// mapped later extend it under the same buffer id; a page remapped after that gets a new
// registration, and the old one goes once its jobs are done.
TEST(DaemonGpuVmmSegment, ASegmentIsRegisteredOnceGrownInPlaceAndRoundTripsBitExact) {
  const gpu::cuda::Driver* d = *gpu::cuda::GetDriver();
  int supported = 0;
  d->DeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                        0);
  if (!supported) GTEST_SKIP() << "VMM POSIX fd handles unsupported on this GPU";
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  ASSERT_EQ(d->MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  // PyTorch's pages: 2 MiB (small) or 20 MiB (large); here whole granules of about 2 MiB.
  const uint64_t page = std::max<uint64_t>(granularity, 2 * kMiB) / granularity * granularity;
  constexpr int kReserved = 200, kFirst = 80, kMore = 70;  // > 64 pages: continuation messages
  CUdeviceptr va = 0;
  ASSERT_EQ(d->MemAddressReserve(&va, kReserved * page, granularity, 0, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  auto map_page = [&](int i) {
    CUmemGenericAllocationHandle handle = 0;
    ASSERT_EQ(d->MemCreate(&handle, page, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d->MemMap(va + i * page, page, 0, handle, 0), CUDA_SUCCESS);
    d->MemRelease(handle);
    ASSERT_EQ(d->MemSetAccess(va + i * page, page, &access, 1), CUDA_SUCCESS);
  };
  for (int i = 0; i < kFirst; ++i) map_page(i);
  char* base = reinterpret_cast<char*>(va);
  auto counters = [](tier_session* s) {
    tier_session_info info{};
    info.struct_size = sizeof(info);
    EXPECT_EQ(tier_session_get_info(s, &info), TIER_OK);
    return std::tuple{info.device_registrations, info.device_extensions, info.device_exports};
  };
  // One round trip of [start, +len) through `buffer`: offload, clobber, reload, compare.
  auto round_trip = [&](Session& session, cudaStream_t stream, uint64_t start, uint64_t len,
                        uint8_t seed) -> tier_buffer_id {
    tier_buffer_id buffer;
    uint64_t at;
    EXPECT_EQ(tier_buffer_register_device_range(session.get(), base + start, len, &buffer, &at),
              TIER_OK) << tier_last_error();
    EXPECT_EQ(at, start);
    std::vector<uint8_t> pattern(len);
    for (uint64_t i = 0; i < len; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + i / 4096 + seed);
    EXPECT_EQ(cudaMemcpy(base + start, pattern.data(), len, cudaMemcpyHostToDevice), cudaSuccess);
    auto [object, offload] = session.Offload(buffer, at, len, {stream});
    EXPECT_EQ(session.Wait(offload), TIER_OK) << tier_last_error();
    EXPECT_EQ(cudaMemsetAsync(base + start, 0, len, stream), cudaSuccess);
    tier_job_id reload = session.Reload(object, buffer, at, len, stream, true);
    std::vector<uint8_t> back(len);
    EXPECT_EQ(cudaMemcpyAsync(back.data(), base + start, len, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(session.Wait(reload), TIER_OK);
    EXPECT_TRUE(back == pattern) << "bytes differ after a round trip of " << len << " bytes at "
                                 << start;
    return buffer;
  };

  TierdProcess tierd({"--engine=cuda", "--pool_bytes=1G", "--copy_delay_us=2000"});
  {
    Session session(tierd);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // 60 pages from inside page 3: one registration of all 80 pages (64 + one extension).
    const tier_buffer_id segment = round_trip(session, stream, 3 * page + 4096, 60 * page, 1);
    auto [registrations, extensions, exports] = counters(session.get());
    EXPECT_EQ(registrations, 1u);
    EXPECT_EQ(extensions, 1u);
    EXPECT_EQ(exports, static_cast<uint64_t>(kFirst));
    // Steps: ranges of any size anywhere inside cost nothing more.
    for (int step = 0; step < 5; ++step) {
      EXPECT_EQ(round_trip(session, stream, (step * 7 % 20) * page + 512, (10 + step * 9) * page,
                           static_cast<uint8_t>(10 + step)),
                segment);
    }
    EXPECT_EQ(counters(session.get()), std::tuple(registrations, extensions, exports))
        << "registering inside a registered segment exported or sent something";
    // The allocator maps more pages: the registration grows in place, same buffer id.
    for (int i = kFirst; i < kFirst + kMore; ++i) map_page(i);
    EXPECT_EQ(round_trip(session, stream, (kFirst - 5) * page, 30 * page, 30), segment);
    auto [r2, e2, x2] = counters(session.get());
    EXPECT_EQ(r2, 1u);
    EXPECT_EQ(e2, 3u);  // 70 new pages: 64 + 6
    EXPECT_EQ(x2, static_cast<uint64_t>(kFirst + kMore));
    EXPECT_EQ(round_trip(session, stream, 0, (kFirst + kMore) * page, 40), segment);
    // A page unmapped and mapped anew (empty_cache): a range over it is a new registration, never
    // the old mapping; the old registration goes once its jobs are done.
    ASSERT_EQ(d->MemUnmap(va + 10 * page, page), CUDA_SUCCESS);
    map_page(10);
    const tier_buffer_id fresh = round_trip(session, stream, 9 * page, 3 * page, 50);
    EXPECT_NE(fresh, segment);
    EXPECT_EQ(round_trip(session, stream, 0, 4 * page, 60), fresh);
    EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
      return s.buffers() == 1;  // the fresh segment (the semaphore page is no GPU mapping)
    })) << "the stale segment registration stayed in tierd: " << tierd.Status().ShortDebugString();
    cudaStreamDestroy(stream);
  }
  for (int i = 0; i < kFirst + kMore; ++i) d->MemUnmap(va + i * page, page);
  d->MemAddressFree(va, kReserved * page);
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.buffers() == 0 && s.pending_releases() == 0;
  }));
}

// PyTorch's expandable segments after torch.cuda.empty_cache(): a page is unmapped and released,
// and later new physical memory is mapped at the same address. A registration of the old page
// must not be reused for it: the daemon's mapping still holds the old memory, so jobs would copy
// to and from memory the client no longer sees (found by scripts/gpu-stress: wrong gradients,
// then illegal addresses from reloaded index tensors). The registry tells pages apart by the
// physical allocation's id.
TEST(DaemonGpuVmmPages, RemappedPageIsRegisteredAnew) {
  const gpu::cuda::Driver* d = *gpu::cuda::GetDriver();
  int supported = 0;
  d->DeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                        0);
  if (!supported) GTEST_SKIP() << "VMM POSIX fd handles unsupported on this GPU";
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t page = 0;
  ASSERT_EQ(d->MemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(d->MemAddressReserve(&va, page, page, 0, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  auto map_new_page = [&] {
    CUmemGenericAllocationHandle handle = 0;
    ASSERT_EQ(d->MemCreate(&handle, page, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d->MemMap(va, page, 0, handle, 0), CUDA_SUCCESS);
    d->MemRelease(handle);
    ASSERT_EQ(d->MemSetAccess(va, page, &access, 1), CUDA_SUCCESS);
  };
  auto ids = [&] {
    unsigned long long buffer_id = 0, block_id = 0;
    d->PointerGetAttribute(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, va);
    d->PointerGetAttribute(&block_id, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, va);
    return std::pair{buffer_id, block_id};
  };
  char* base = reinterpret_cast<char*>(va);
  TierdProcess tierd({"--engine=cuda"});
  DeviceMemory check(Alloc::kCudaMalloc, page);
  {
    Session session(tierd);
    auto [check_buffer, check_base] = session.Register(check.get());
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    uint8_t value = 0x11;
    for (int round = 0; round < 3; ++round, value += 0x11) {
      map_new_page();
      auto [buffer_id, block_id] = ids();
      std::printf("round %d: CU_POINTER_ATTRIBUTE_BUFFER_ID %llu, MEMORY_BLOCK_ID %llu\n", round,
                  buffer_id, block_id);
      CUDA_OK(cudaMemsetAsync(base, value, page, stream));
      auto [buffer, at] = session.Register(base);
      auto [object, offload] = session.Offload(buffer, at, page, {stream});
      ASSERT_EQ(session.Wait(offload), TIER_OK) << tier_last_error();
      tier_job_id reload = session.Reload(object, check_buffer, check_base, page, stream, true);
      EXPECT_TRUE(DeviceHolds(check.get(), page, value, stream))
          << "round " << round << ": tierd copied from a page the client unmapped";
      EXPECT_EQ(session.Wait(reload), TIER_OK);
      CUDA_OK(cudaStreamSynchronize(stream));
      ASSERT_EQ(d->MemUnmap(va, page), CUDA_SUCCESS);  // empty_cache
    }
    cudaStreamDestroy(stream);
  }
  d->MemAddressFree(va, page);
  // Every stale registration was dropped once its jobs were done (at the next registration), and
  // the session's end dropped the rest: tierd holds no client memory.
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.buffers() == 0 && s.gpu_lanes() == 0 && s.pending_releases() == 0;
  }));
}

// Host memory (CPU tensors, the demo client) through the CUDA engine: pinned by the daemon and
// copied by a GPU lane; the bytes come back intact.
TEST(DaemonGpuHostMemory, HostBuffersRoundTripThroughTheCudaEngine) {
  TierdProcess tierd({"--engine=cuda"});
  Session session(tierd);
  void* data = nullptr;
  tier_buffer_id buffer;
  ASSERT_EQ(tier_buffer_alloc_host(session.get(), 8 * kMiB, &data, &buffer), TIER_OK)
      << tier_last_error();
  auto* bytes = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < 4 * kMiB; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  tier_object_id object;
  tier_job_id job;
  ASSERT_EQ(tier_offload(session.get(), buffer, 0, 4 * kMiB, nullptr, &object, &job), TIER_OK);
  ASSERT_EQ(session.Wait(job), TIER_OK) << tier_last_error();
  ASSERT_EQ(tier_reload(session.get(), object, buffer, 4 * kMiB, 4 * kMiB, nullptr, &job), TIER_OK);
  ASSERT_EQ(session.Wait(job), TIER_OK) << tier_last_error();
  EXPECT_EQ(std::memcmp(bytes, bytes + 4 * kMiB, 4 * kMiB), 0);
}

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
}  // namespace tier

int main(int argc, char** argv) {
  if (tier::client::gpu::GpuDeviceCount() == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
