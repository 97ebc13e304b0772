#include "tier/ring.h"

#include <sys/mman.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tier::ring {
namespace {

struct Segment {
  explicit Segment(uint32_t entries) : bytes(SegmentBytes(entries)) {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    header = InitSegment(base, entries, 7);
    view = *ViewSegment(base, bytes);
  }
  ~Segment() { ::munmap(base, bytes); }
  size_t bytes;
  void* base;
  RingHeader* header;
  SegmentView view;
};

TEST(Ring, ViewRejectsBadHeaders) {
  Segment s(64);
  EXPECT_TRUE(ViewSegment(s.base, s.bytes));
  EXPECT_FALSE(ViewSegment(s.base, s.bytes - 4096));  // mapping smaller than the layout
  s.header->sq_entries = 63;
  EXPECT_FALSE(ViewSegment(s.base, s.bytes));
  s.header->sq_entries = 64;
  s.header->magic = 0;
  EXPECT_FALSE(ViewSegment(s.base, s.bytes));
}

TEST(Ring, PushPopInOrderAndFullWhenCapacityReached) {
  Segment s(8);
  Producer<SubmissionEntry> p(&s.header->sq, s.view.sq, 8);
  Consumer<SubmissionEntry> c(&s.header->sq, s.view.sq, 8);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(p.TryPush(SubmissionEntry{.job_id = i}));
  EXPECT_FALSE(p.TryPush(SubmissionEntry{.job_id = 99}));
  SubmissionEntry e;
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(c.TryPop(&e), Consumer<SubmissionEntry>::Result::kEntry);
    EXPECT_EQ(e.job_id, i);
  }
  EXPECT_EQ(c.TryPop(&e), Consumer<SubmissionEntry>::Result::kEmpty);
}

TEST(Ring, ConsumerDetectsATailBeyondCapacity) {
  Segment s(8);
  Consumer<SubmissionEntry> c(&s.header->sq, s.view.sq, 8);
  s.header->sq.tail.value = 1000;  // a hostile producer
  SubmissionEntry e;
  EXPECT_EQ(c.TryPop(&e), Consumer<SubmissionEntry>::Result::kCorrupt);
}

TEST(Ring, ProducerDetectsAHeadThatMovedBackwards) {
  Segment s(8);
  Producer<CompletionEntry> p(&s.header->cq, s.view.cq, 8);
  ASSERT_TRUE(p.TryPush(CompletionEntry{.job_id = 1}));
  s.header->cq.head.value = 5000;  // a hostile consumer
  EXPECT_FALSE(p.Pending().has_value());
  EXPECT_FALSE(p.TryPush(CompletionEntry{.job_id = 2}));
}

TEST(Ring, SleepProtocolNeverLosesAWakeup) {
  Segment s(8);
  Consumer<SubmissionEntry> c(&s.header->sq, s.view.sq, 8);
  Producer<SubmissionEntry> p(&s.header->sq, s.view.sq, 8);
  // Consumer announces sleep; a push afterwards must see the flag.
  EXPECT_FALSE(c.PrepareSleep());
  ASSERT_TRUE(p.TryPush(SubmissionEntry{.job_id = 1}));
  EXPECT_TRUE(p.TakeWakeupRequest());
  c.CancelSleep();
  EXPECT_FALSE(p.TakeWakeupRequest());
  // An entry published before the announcement is seen by the re-check.
  EXPECT_TRUE(c.PrepareSleep());
}

TEST(Ring, ABurstToASleepingConsumerAsksForOneWakeup) {
  Segment s(8);
  Consumer<SubmissionEntry> c(&s.header->sq, s.view.sq, 8);
  Producer<SubmissionEntry> p(&s.header->sq, s.view.sq, 8);
  EXPECT_FALSE(c.PrepareSleep());
  int wakeups = 0;
  for (uint64_t i = 1; i <= 5; ++i) {
    ASSERT_TRUE(p.TryPush(SubmissionEntry{.job_id = i}));
    wakeups += p.TakeWakeupRequest() ? 1 : 0;
  }
  EXPECT_EQ(wakeups, 1);  // the first write is still pending on the eventfd for the rest
  // The consumer wakes, takes what is there and sleeps again: the next entry asks again.
  c.CancelSleep();
  SubmissionEntry e;
  while (c.TryPop(&e) == Consumer<SubmissionEntry>::Result::kEntry) {
  }
  EXPECT_FALSE(c.PrepareSleep());
  ASSERT_TRUE(p.TryPush(SubmissionEntry{.job_id = 6}));
  EXPECT_TRUE(p.TakeWakeupRequest());
}

TEST(Ring, ConcurrentProducerAndConsumerSeeEveryEntryOnce) {
  Segment s(64);
  Producer<SubmissionEntry> p(&s.header->sq, s.view.sq, 64);
  Consumer<SubmissionEntry> c(&s.header->sq, s.view.sq, 64);
  constexpr uint64_t kCount = 200000;
  std::thread producer([&] {
    for (uint64_t i = 1; i <= kCount;) {
      if (p.TryPush(SubmissionEntry{.job_id = i, .len = i * 3})) ++i;
    }
  });
  uint64_t expected = 1;
  SubmissionEntry e;
  while (expected <= kCount) {
    auto r = c.TryPop(&e);
    ASSERT_NE(r, Consumer<SubmissionEntry>::Result::kCorrupt);
    if (r == Consumer<SubmissionEntry>::Result::kEntry) {
      ASSERT_EQ(e.job_id, expected);
      ASSERT_EQ(e.len, expected * 3);
      ++expected;
    }
  }
  producer.join();
}

}  // namespace
}  // namespace tier::ring
