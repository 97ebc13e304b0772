// The session listener's checks of expandable-segment messages (daemon/sessions/segment_request.h): each
// bad field is refused with INVALID_ARGUMENT saying what is wrong; good ones give the pages.
#include "daemon/sessions/segment_request.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

namespace tier::daemon {
namespace {

constexpr uint64_t kPage = uint64_t{2} << 20;

wire::RegisterBuffer Segment(uint64_t page_bytes, uint32_t count, uint64_t reserve,
                             uint64_t bytes) {
  wire::RegisterBuffer request{};
  request.kind = static_cast<uint32_t>(wire::BufferKind::kCudaVmmSegment);
  request.bytes = bytes;
  wire::SegmentLayout layout{page_bytes, reserve, count, 0};
  std::memcpy(request.handle, &layout, sizeof(layout));
  return request;
}

wire::ExtendBuffer Extend(uint64_t offset, uint64_t page_bytes, uint32_t count) {
  wire::ExtendBuffer request{};
  request.buffer_id = 5;
  request.offset = offset;
  request.page_bytes = page_bytes;
  request.page_count = count;
  return request;
}

TEST(SegmentRequest, AWellFormedRegistrationGivesItsPages) {
  absl::StatusOr<SegmentPages> pages =
      CheckSegmentRegister(Segment(kPage, 20, 100 * kPage, 20 * kPage), 20);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ(pages->page_bytes, kPage);
  EXPECT_EQ(pages->page_count, 20u);
  EXPECT_EQ(pages->bytes, 20 * kPage);
  EXPECT_EQ(pages->reserve_bytes, 100 * kPage);
}

TEST(SegmentRequest, BadRegistrationsAreRefusedSayingWhy) {
  struct Case {
    const char* what;
    wire::RegisterBuffer request;
    size_t fds;
  };
  const uint32_t too_many = static_cast<uint32_t>(wire::kMaxSegmentPagesPerMessage + 1);
  wire::RegisterBuffer reserved_field = Segment(kPage, 1, kPage, kPage);
  reserved_field.handle[20] = 1;
  const Case cases[] = {
      {"no pages", Segment(kPage, 0, kPage, 0), 0},
      {"page size 0", Segment(0, 1, kPage, 0), 1},
      {"page size past the bound", Segment(wire::kMaxSegmentPageBytes + 1, 1,
                                           wire::kMaxSegmentReserveBytes, 0), 1},
      {"more pages than one message carries", Segment(kPage, too_many, 1000 * kPage,
                                                      too_many * kPage), too_many},
      {"fewer descriptors than pages", Segment(kPage, 4, 4 * kPage, 4 * kPage), 3},
      {"more descriptors than pages", Segment(kPage, 4, 4 * kPage, 4 * kPage), 5},
      {"bytes not pages times size", Segment(kPage, 4, 4 * kPage, 4 * kPage + 1), 4},
      {"bytes overflowing", Segment(kPage, 4, 4 * kPage, std::numeric_limits<uint64_t>::max()), 4},
      {"reservation smaller than the pages", Segment(kPage, 4, 3 * kPage, 4 * kPage), 4},
      {"reservation not whole pages", Segment(kPage, 4, 4 * kPage + 4096, 4 * kPage), 4},
      {"reservation past the bound",
       Segment(kPage, 4, wire::kMaxSegmentReserveBytes + kPage, 4 * kPage), 4},
      {"reserved field set", reserved_field, 1},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SegmentPages> pages = CheckSegmentRegister(c.request, c.fds);
    EXPECT_TRUE(absl::IsInvalidArgument(pages.status())) << c.what << ": " << pages.status();
    EXPECT_FALSE(pages.status().message().empty()) << c.what;
  }
}

TEST(SegmentRequest, AWellFormedExtensionGivesItsPages) {
  absl::StatusOr<SegmentPages> pages = CheckSegmentExtend(Extend(20 * kPage, kPage, 64), 64);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ(pages->bytes, 64 * kPage);
}

TEST(SegmentRequest, BadExtensionsAreRefusedSayingWhy) {
  wire::ExtendBuffer reserved = Extend(0, kPage, 1);
  reserved.reserved = 3;
  struct Case {
    const char* what;
    wire::ExtendBuffer request;
    size_t fds;
  };
  const Case cases[] = {
      {"no pages", Extend(0, kPage, 0), 0},
      {"page size 0", Extend(0, 0, 1), 1},
      {"descriptors not one per page", Extend(0, kPage, 2), 1},
      {"too many pages", Extend(0, kPage, 1000), 1000},
      {"offset past any reservation", Extend(wire::kMaxSegmentReserveBytes + 1, kPage, 1), 1},
      {"reserved field set", reserved, 1},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SegmentPages> pages = CheckSegmentExtend(c.request, c.fds);
    EXPECT_TRUE(absl::IsInvalidArgument(pages.status())) << c.what << ": " << pages.status();
  }
}

}  // namespace
}  // namespace tier::daemon
