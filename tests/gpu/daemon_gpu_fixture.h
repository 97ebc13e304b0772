// What the GPU data path's end-to-end tests share (daemon_gpu_contract_test.cc,
// daemon_gpu_memory_test.cc, daemon_gpu_sessions_test.cc; one executable, daemon_gpu_test): a real
// tierd running the CUDA engine, this process a client through the C ABI (libtierclient's code),
// device buffers from cudaMalloc and from VMM with POSIX fd handles (PyTorch's expandable
// segments). The executable exits 77 ("no GPU: skipped") where no device exists
// (daemon_gpu_main.cc).
#ifndef TIER_TESTS_GPU_DAEMON_GPU_FIXTURE_H_
#define TIER_TESTS_GPU_DAEMON_GPU_FIXTURE_H_

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

namespace tier::daemon_gpu_testing {

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
inline ::testing::AssertionResult DeviceHolds(const char* data, uint64_t bytes, uint8_t value,
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

}  // namespace tier::daemon_gpu_testing

#endif  // TIER_TESTS_GPU_DAEMON_GPU_FIXTURE_H_
