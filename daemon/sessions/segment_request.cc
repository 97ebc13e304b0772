#include "daemon/sessions/segment_request.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tier::daemon {
namespace {

// Page size and count against the descriptors: 1..kMaxSegmentPagesPerMessage pages of one
// non-zero size, one descriptor each, their total not overflowing.
absl::StatusOr<SegmentPages> CheckPages(uint64_t page_bytes, uint32_t page_count, size_t fds) {
  if (page_bytes == 0 || page_bytes > wire::kMaxSegmentPageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("segment pages of ", page_bytes,
                                                   " bytes (1 to ", wire::kMaxSegmentPageBytes,
                                                   ")"));
  }
  if (page_count == 0 || page_count > wire::kMaxSegmentPagesPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(page_count, " segment pages in one message (1 "
                                                   "to ", wire::kMaxSegmentPagesPerMessage, ")"));
  }
  if (fds != page_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(page_count, " segment pages with ", fds, " descriptors"));
  }
  // page_bytes <= 2^40 and page_count <= kMaxSegmentPagesPerMessage: no overflow.
  static_assert(wire::kMaxSegmentPageBytes <= (uint64_t{1} << 40));
  static_assert(wire::kMaxSegmentPagesPerMessage <= (uint64_t{1} << 20));
  return SegmentPages{page_bytes, page_count, page_bytes * page_count, 0};
}

}  // namespace

absl::StatusOr<SegmentPages> CheckSegmentRegister(const wire::RegisterBuffer& request,
                                                  size_t fds) {
  wire::SegmentLayout layout;
  static_assert(sizeof(layout) <= sizeof(request.handle));
  std::memcpy(&layout, request.handle, sizeof(layout));
  absl::StatusOr<SegmentPages> pages = CheckPages(layout.page_bytes, layout.page_count, fds);
  if (!pages.ok()) return pages.status();
  if (layout.reserved != 0) {
    return absl::InvalidArgumentError("segment layout with non-zero reserved field");
  }
  if (request.bytes != pages->bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segment of ", request.bytes, " bytes registered with ", pages->page_count, " pages of ",
        pages->page_bytes, " bytes"));
  }
  if (layout.reserve_bytes < pages->bytes || layout.reserve_bytes % pages->page_bytes != 0 ||
      layout.reserve_bytes > wire::kMaxSegmentReserveBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segment reservation of ", layout.reserve_bytes, " bytes: must hold its ", pages->bytes,
        " bytes, be whole pages of ", pages->page_bytes, " bytes, and at most ",
        wire::kMaxSegmentReserveBytes));
  }
  pages->reserve_bytes = layout.reserve_bytes;
  return pages;
}

absl::StatusOr<SegmentPages> CheckSegmentExtend(const wire::ExtendBuffer& request, size_t fds) {
  if (request.reserved != 0) {
    return absl::InvalidArgumentError("extend request with non-zero reserved field");
  }
  if (request.offset > wire::kMaxSegmentReserveBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("extension at offset ", request.offset, ", past any segment's reservation"));
  }
  return CheckPages(request.page_bytes, request.page_count, fds);
}

}  // namespace tier::daemon
