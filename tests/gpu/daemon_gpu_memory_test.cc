// The kinds of client memory on the GPU data path (tests/gpu/daemon_gpu_fixture.h): PyTorch's
// expandable segments (pages of one VMM reservation, a segment grown in place, a page remapped)
// and host buffers through the CUDA engine.
#include "gpu/daemon_gpu_fixture.h"

namespace tier::daemon_gpu_testing {
namespace {

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
    // 60 pages from inside page kRegistered: one registration of all 80 pages (64 + one
    // extension).
    constexpr uint64_t kRegistered = 3;
    const tier_buffer_id segment =
        round_trip(session, stream, kRegistered * page + 4096, 60 * page, 1);
    auto [registrations, extensions, exports] = counters(session.get());
    EXPECT_EQ(registrations, 1u);
    EXPECT_EQ(extensions, 1u);
    EXPECT_EQ(exports, static_cast<uint64_t>(kFirst));
    // What tierd reserved for it: counted against max_reserved_bytes_per_session and _per_uid,
    // and shown in status. The library asks for as much as the segment may grow to, as
    // PyTorch's reservations run: the GPU's memory past the page of the pointer registered
    // (kRegistered), from the segment's first page on, in whole pages; not the client's 200
    // pages (the driver may report one page's mapping as the address range).
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_OK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const uint64_t reserved =
        std::max<uint64_t>(kRegistered * page + total_bytes, kReserved * page) / page * page;
    EXPECT_EQ(tierd.Status().client_reserved_bytes(), reserved);
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
    return s.buffers() == 0 && s.pending_releases() == 0 && s.client_reserved_bytes() == 0;
  })) << tierd.Status().ShortDebugString();
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
  // Host memory mapped into tierd, counted against max_mapped_bytes (its buffer says GPU 0, the
  // GPU whose lanes copy it: the count comes from the request).
  EXPECT_EQ(tierd.Status().client_mapped_bytes(), 8 * kMiB);
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

}  // namespace
}  // namespace tier::daemon_gpu_testing
