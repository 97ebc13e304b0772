// Does a copy kernel beat the copy engine for small jobs between device memory and pinned host
// memory? For batches of --batch jobs of each size, D2H and H2D, the time per batch of:
//   memcpy   one cudaMemcpyAsync per job (what tierd issues without batching)
//   batch    one cudaMemcpyBatchAsync for the batch (what tierd issues for a batch, CUDA >= 12.8)
//   kernel   one kernel launch copying every job of the batch with SM loads and stores (16-byte
//            vectors, a block per 64 KiB)
// Each figure is the median over 200 back-to-back batches on one stream, measured with events.
// Standalone (nvcc bench/copy_kernel_probe.cu -o copy_kernel_probe); prints a table and JSON.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_probe_check.h"

struct Job {
  const int4* src;
  int4* dst;
  unsigned long long vecs;  // 16-byte vectors
};

__global__ void CopyJobs(const Job* jobs, int count, unsigned long long vecs_per_block) {
  // Blocks are laid out job after job: block b covers a slice of one job.
  unsigned long long block = blockIdx.x;
  for (int j = 0; j < count; ++j) {
    unsigned long long blocks = (jobs[j].vecs + vecs_per_block - 1) / vecs_per_block;
    if (block < blocks) {
      unsigned long long begin = block * vecs_per_block;
      unsigned long long end = min(begin + vecs_per_block, jobs[j].vecs);
      for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        jobs[j].dst[i] = jobs[j].src[i];
      }
      return;
    }
    block -= blocks;
  }
}

int main(int argc, char** argv) {
  int batch = 16;
  std::string json = "copy_kernel_probe.json";
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--batch=", 8)) batch = std::atoi(argv[i] + 8);
    if (!std::strncmp(argv[i], "--json=", 7)) json = argv[i] + 7;
  }
  const size_t max_bytes = 4 << 20;
  char *dev = nullptr, *host = nullptr;
  CHECK(cudaMalloc(&dev, max_bytes * batch));
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), max_bytes * batch, cudaHostAllocDefault));
  CHECK(cudaMemset(dev, 1, max_bytes * batch));
  std::memset(host, 2, max_bytes * batch);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Job* jobs = nullptr;  // the batch's descriptors, in device memory
  CHECK(cudaMalloc(&jobs, sizeof(Job) * batch));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const int reps = 200;
  const unsigned long long vecs_per_block = (64 << 10) / 16;
  FILE* out = std::fopen(json.c_str(), "w");
  std::fprintf(out, "{\"batch\": %d, \"rows\": [", batch);
  std::printf("%9s %4s | %10s %10s %10s | %8s %8s (us per batch; GB/s)\n", "job", "dir", "memcpy",
              "batch", "kernel", "memcpy", "kernel");
  bool first_row = true;
  for (size_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
    for (int d2h = 1; d2h >= 0; --d2h) {
      std::vector<Job> host_jobs(batch);
      std::vector<void*> dsts(batch);
      std::vector<const void*> srcs(batch);
      std::vector<size_t> sizes(batch, bytes);
      for (int j = 0; j < batch; ++j) {
        char* d = dev + j * bytes;
        char* h = host + j * bytes;
        dsts[j] = d2h ? static_cast<void*>(h) : static_cast<void*>(d);
        srcs[j] = d2h ? static_cast<const void*>(d) : static_cast<const void*>(h);
        host_jobs[j] = Job{static_cast<const int4*>(srcs[j]), static_cast<int4*>(dsts[j]), bytes / 16};
      }
      CHECK(cudaMemcpy(jobs, host_jobs.data(), sizeof(Job) * batch, cudaMemcpyHostToDevice));
      unsigned long long blocks =
          batch * ((bytes / 16 + vecs_per_block - 1) / vecs_per_block);
      double us[3];
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<float> times;
        for (int r = 0; r < reps + 10; ++r) {
          CHECK(cudaEventRecord(start, stream));
          if (mode == 0) {
            for (int j = 0; j < batch; ++j) {
              CHECK(cudaMemcpyAsync(dsts[j], srcs[j], bytes, cudaMemcpyDefault, stream));
            }
          } else if (mode == 1) {
            cudaMemcpyAttributes attrs{};
            attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t idx = 0;
            CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), batch, &attrs, &idx,
                                       1, stream));
          } else {
            CopyJobs<<<static_cast<unsigned>(blocks), 512, 0, stream>>>(jobs, batch, vecs_per_block);
            CHECK(cudaGetLastError());
          }
          CHECK(cudaEventRecord(stop, stream));
          CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (r >= 10) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        us[mode] = times[times.size() / 2] * 1000.0;
      }
      double gb = static_cast<double>(bytes) * batch / 1e3;  // bytes per us -> GB/s
      std::printf("%7zu K %4s | %10.1f %10.1f %10.1f | %8.1f %8.1f\n", bytes >> 10,
                  d2h ? "D2H" : "H2D", us[0], us[1], us[2], gb / us[0], gb / us[2]);
      std::fprintf(out, "%s{\"bytes\": %zu, \"dir\": \"%s\", \"memcpy_us\": %.2f, \"batch_us\": %.2f, \"kernel_us\": %.2f}",
                   first_row ? "" : ", ", bytes, d2h ? "d2h" : "h2d", us[0], us[1], us[2]);
      first_row = false;
    }
  }
  std::fprintf(out, "]}\n");
  std::fclose(out);
  return 0;
}
