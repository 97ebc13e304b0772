#include "engine/cuda_vmm.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "engine/portable_runtime.h"
#include "gpu/cuda_driver.h"
#include "gpu/runtime.h"

namespace tier::engine {

namespace cuda = ::tier::gpu::cuda;
using cuda::CheckDriver;
using cuda::Driver;
using gpu::CheckRuntime;

namespace {

// VMM allocations imported from POSIX-fd shareable handles (ImportPages): each holds a reference
// on its allocation until mapped, then the mapping keeps the allocation alive.
struct ImportedPages {
  struct Page {
    CUmemGenericAllocationHandle handle = 0;
    uint64_t bytes = 0;
  };
  explicit ImportedPages(const Driver& driver) : driver(driver) {}
  ImportedPages(ImportedPages&& other) noexcept
      : driver(other.driver), pages(std::move(other.pages)), granularity(other.granularity) {
    other.pages.clear();
  }
  ~ImportedPages() {
    for (Page& page : pages) (void)driver.MemRelease(page.handle);
  }
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const Page& page : pages) total += page.bytes;
    return total;
  }
  const Driver& driver;
  std::vector<Page> pages;
  size_t granularity = 0;
};

// Imports one page per fd, of the size given for it, checking that each lives on `device` (the
// GPU the client named, `gpu` in messages) and is a whole number of allocation granules.
absl::StatusOr<ImportedPages> ImportPages(const Driver& driver, std::vector<UniqueFd>& fds,
                                          const std::vector<uint64_t>& sizes, int device,
                                          const std::string& gpu) {
  if (fds.empty() || fds.size() != sizes.size()) {
    return absl::InvalidArgumentError("VMM buffer registered without its file descriptors");
  }
  ImportedPages out(driver);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].valid()) return absl::InvalidArgumentError("VMM page without a valid descriptor");
    CUmemGenericAllocationHandle handle = 0;
    CUresult r = driver.MemImportFromShareableHandle(
        &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i].get())),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat(
          cuda::DriverError(r, "cannot import the VMM allocation fd").message(),
          "; the fd is not a CUDA shareable handle of a device allocation"));
    }
    out.pages.push_back({handle, sizes[i]});
    CUmemAllocationProp prop{};
    if (absl::Status s = CheckDriver(driver.MemGetAllocationPropertiesFromHandle(&prop, handle),
                                     "cuMemGetAllocationPropertiesFromHandle");
        !s.ok()) {
      return s;
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the VMM allocation lives on ",
          prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE
              ? absl::StrCat("GPU ", prop.location.id, " of tierd")
              : std::string("a non-device location"),
          ", but the client registered it for GPU ", device, " (", gpu, ")"));
    }
    if (out.granularity == 0) {
      if (absl::Status s = CheckDriver(driver.MemGetAllocationGranularity(
                                           &out.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                       "cuMemGetAllocationGranularity");
          !s.ok()) {
        return s;
      }
    }
    if (out.granularity == 0 || sizes[i] == 0 || sizes[i] % out.granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "VMM page of ", sizes[i], " bytes is not a positive multiple of the ", out.granularity,
          "-byte allocation granularity"));
    }
  }
  return out;
}

// VMM pages mapped side by side in one reservation of tierd's address space: one page
// (kCudaVmmFd), several (kCudaVmmPages), or an expandable segment (kCudaVmmSegment), whose
// reservation is larger than what is mapped so that Extend maps more pages after the last.
class VmmMapping final : public DeviceMapping {
 public:
  // `segment_page_bytes`: a segment's page size (0: not a segment, it cannot grow).
  // `reserved_total`: the engine's count of address space reserved for client memory, which this
  // reservation is part of until it is freed.
  VmmMapping(const Driver& driver, CUdeviceptr base, uint64_t reserved, int device,
             uint64_t segment_page_bytes, std::string gpu,
             std::atomic<uint64_t>& reserved_total)
      : driver_(driver), base_(base), reserved_(reserved), device_(device),
        segment_page_bytes_(segment_page_bytes), gpu_(std::move(gpu)),
        reserved_total_(reserved_total) {}
  ~VmmMapping() override {
    reserved_total_.fetch_sub(reserved_);
    gpu::DeviceGuard guard(device_);
    uint64_t unmapped = 0;
    for (uint64_t page : mapped_pages_) {  // each cuMemMap is unmapped whole
      if (CUresult r = driver_.MemUnmap(base_ + unmapped, page); r != CUDA_SUCCESS) {
        LogWarning(cuda::DriverError(r, "cuMemUnmap").message());
      }
      unmapped += page;
    }
    (void)driver_.MemAddressFree(base_, reserved_);
  }

  // Maps `pages` from bytes() on and makes them accessible; bytes() grows by theirs. On an error
  // nothing stays mapped of them.
  absl::Status Map(const ImportedPages& pages) {
    const uint64_t at = bytes_.load(std::memory_order_relaxed);
    const uint64_t add = pages.bytes();
    if (add > reserved_ - at) {
      return absl::OutOfRangeError(absl::StrCat(
          add, " more bytes of pages do not fit the ", reserved_, "-byte reservation, ", at,
          " of which hold pages"));
    }
    const size_t before = mapped_pages_.size();
    auto undo = [&] {
      uint64_t offset = at;
      for (size_t i = before; i < mapped_pages_.size(); ++i) {
        (void)driver_.MemUnmap(base_ + offset, mapped_pages_[i]);
        offset += mapped_pages_[i];
      }
      mapped_pages_.resize(before);
    };
    uint64_t offset = at;
    for (size_t i = 0; i < pages.pages.size(); ++i) {
      CUresult r = driver_.MemMap(base_ + offset, pages.pages[i].bytes, 0, pages.pages[i].handle, 0);
      if (r != CUDA_SUCCESS) {
        undo();
        return absl::InvalidArgumentError(absl::StrCat(
            cuda::DriverError(r, "cuMemMap of the imported VMM allocation").message(),
            "; the registered size of page ", i, " (", pages.pages[i].bytes,
            " bytes) probably exceeds the allocation"));
      }
      mapped_pages_.push_back(pages.pages[i].bytes);
      offset += pages.pages[i].bytes;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (absl::Status s = CheckDriver(driver_.MemSetAccess(base_ + at, add, &access, 1),
                                     "cuMemSetAccess of the imported VMM allocation");
        !s.ok()) {
      undo();
      return s;
    }
    // Jobs read bytes() (the jobs' range check, ClientRange::Of) on other threads: they see the pages mapped.
    bytes_.store(at + add, std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status Extend(BufferExtension& extension) override {
    if (segment_page_bytes_ == 0) {
      return absl::FailedPreconditionError(
          "only an expandable-segment registration (kCudaVmmSegment) can be extended");
    }
    const uint64_t now = bytes();
    if (extension.offset != now) {
      return absl::FailedPreconditionError(absl::StrCat(
          "extension at offset ", extension.offset, " of a segment registration of ", now,
          " bytes: pages are added at its end"));
    }
    if (extension.page_bytes != segment_page_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("extension with pages of ",
                                                     extension.page_bytes, " bytes; the segment's are ",
                                                     segment_page_bytes_));
    }
    gpu::DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    std::vector<uint64_t> sizes(extension.page_fds.size(), extension.page_bytes);
    absl::StatusOr<ImportedPages> pages =
        ImportPages(driver_, extension.page_fds, sizes, device_, gpu_);
    if (!pages.ok()) return pages.status();
    return Map(*pages);
  }

  char* base() const override { return reinterpret_cast<char*>(base_); }
  uint64_t bytes() const override { return bytes_.load(std::memory_order_acquire); }
  int device() const override { return device_; }

 private:
  const Driver& driver_;
  const CUdeviceptr base_;
  const uint64_t reserved_;
  const int device_;
  const uint64_t segment_page_bytes_;
  const std::string gpu_;
  std::atomic<uint64_t>& reserved_total_;
  std::atomic<uint64_t> bytes_{0};
  std::vector<uint64_t> mapped_pages_;  // the mapper's (one caller at a time), then the destructor
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMapping>> VmmImporter::Open(BufferImport& import,
                                                                  int device) {
  absl::StatusOr<const Driver*> driver = cuda::GetDriver();
  if (!driver.ok()) return driver.status();
  if (import.kind == wire::BufferKind::kCudaVmmFd) {
    import.page_fds.clear();
    import.page_fds.push_back(std::move(import.fd));
    import.page_bytes = {import.bytes};
  }
  const std::string gpu = UuidText(import.device_uuid);
  absl::StatusOr<ImportedPages> pages =
      ImportPages(**driver, import.page_fds, import.page_bytes, device, gpu);
  if (!pages.ok()) return pages.status();
  const bool segment = import.kind == wire::BufferKind::kCudaVmmSegment;
  // (The listener checked a segment's reservation: whole pages, at least its bytes.)
  const uint64_t reserved = segment ? std::max(import.reserve_bytes, import.bytes) : import.bytes;
  if (absl::Status s = Reserve(reserved, pages->granularity, device); !s.ok()) return s;
  CUdeviceptr va = 0;
  if (absl::Status s = CheckDriver(
          (*driver)->MemAddressReserve(&va, reserved, pages->granularity, 0, 0),
          "cuMemAddressReserve");
      !s.ok()) {
    reserved_bytes_.fetch_sub(reserved);
    return s;
  }
  // From here the mapping frees the reservation (and its count), and unmaps what it mapped.
  auto mapping = std::make_unique<VmmMapping>(**driver, va, reserved, device,
                                              segment ? import.page_bytes[0] : 0, gpu,
                                              reserved_bytes_);
  if (absl::Status s = mapping->Map(*pages); !s.ok()) return s;
  return mapping;
}

// Address space is tierd's, not the client's: a reservation may not exceed twice the GPU's
// memory (no segment can hold more than the memory; PyTorch reserves 1.125 times it per segment,
// and a run may begin pages before the page registered), and all of them together stay under
// kMaxReservedBytes (each used to take up to 4 TiB of tierd's 128 TiB, counted nowhere: issue 30,
// finding 12). Counts `reserved` in reserved_bytes_ when it returns OK.
absl::Status VmmImporter::Reserve(uint64_t reserved, uint64_t granularity, int device) {
  size_t free_bytes = 0, total_bytes = 0;
  if (absl::Status s = CheckRuntime(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      !s.ok()) {
    return s;
  }
  const uint64_t bound = 2 * static_cast<uint64_t>(total_bytes);
  if (reserved > bound) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a VMM reservation of ", reserved, " bytes is larger than twice GPU ", device,
        "'s memory (", total_bytes, " bytes)"));
  }
  if (reserved_bytes_.fetch_add(reserved) + reserved > kMaxReservedBytes) {
    reserved_bytes_.fetch_sub(reserved);
    return absl::ResourceExhaustedError(absl::StrCat(
        "tierd has reserved ", reserved_bytes_.load() >> 30, " GiB of address space for "
        "clients' GPU memory, at most ", kMaxReservedBytes >> 30, " GiB: unregister buffers"));
  }
  if (reserved % granularity != 0) {
    reserved_bytes_.fetch_sub(reserved);
    return absl::InvalidArgumentError(absl::StrCat(
        "a VMM reservation of ", reserved, " bytes is not a multiple of the ", granularity,
        "-byte allocation granularity"));
  }
  return absl::OkStatus();
}

}  // namespace tier::engine
