// The stream engine (tests/gpu/stream_engine_fixture.h) orders copies: a job waits for its ticket
// and signals its done word once; tickets issue in order; a batch issues whole and signals once; a
// large copy goes in chunks while the link is shared (the window); a reload waits for the offload
// into the same pool bytes; a stalled session on one GPU holds no other GPU's jobs; delays.
#include "gpu/stream_engine_fixture.h"

namespace tier::engine::stream_engine_testing {
namespace {

TEST_F(StreamEngineTest, OffloadWaitsForTicketAndSignalsDone) {
  Start();
  std::memset(a_.memory[0].data(), 0x11, kLen);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  EXPECT_FALSE(done.Ready(50));  // produced is still 0
  {
    std::lock_guard lock(memory_mu);
    std::memset(a_.memory[0].data(), 0x77, kLen);  // the producer finishes...
  }
  a_.SetTicket(Direction::kToPool, 1);  // ...and its ticket lands
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x77));
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
}

TEST_F(StreamEngineTest, ReloadSignalsReloadDone) {
  Start();
  std::memset(pool_.data(), 0x5C, kLen);
  a_.SetTicket(Direction::kFromPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kFromPool, 1, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0x5C);
}

TEST_F(StreamEngineTest, LaterTicketIsHeldUntilEarlierArrives) {
  Start();
  a_.SetTicket(Direction::kToPool, 2);
  std::memset(a_.memory[0].data(), 0x01, kLen);
  std::memset(a_.memory[1].data(), 0x02, kLen);
  Completion first, second;
  Submit(Job(a_, Direction::kToPool, 1, 1, 2, second));
  EXPECT_FALSE(second.Ready(50));
  EXPECT_EQ(a_.Done(Direction::kToPool), 0u);  // done = 2 would claim ticket 1 done too
  std::vector<LaneStatus> lanes = engine_->Lanes(a_.session.get());
  ASSERT_EQ(lanes.size(), 2u);
  EXPECT_EQ(lanes[0].held, 1u);
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, first));
  ASSERT_TRUE(first.Ready(5000));
  ASSERT_TRUE(second.Ready(5000));
  EXPECT_TRUE(PoolHolds(0, 0x01));
  EXPECT_TRUE(PoolHolds(1, 0x02));
  EXPECT_EQ(a_.Done(Direction::kToPool), 2u);

  Completion again;
  Submit(Job(a_, Direction::kToPool, 0, 2, 2, again));  // a ticket used twice
  ASSERT_TRUE(again.Ready(1000));
  EXPECT_EQ(again.future.get().code(), absl::StatusCode::kInvalidArgument);
}

// A batch: three offloads under one ticket. Nothing is issued until all three arrived (the
// ticket is already there); then the three copies go to the runtime in one call and the ticket
// is signalled once, after them.
TEST_F(StreamEngineTest, BatchIsIssuedOnceCompleteAndSignalledOnce) {
  Start();
  for (int b = 0; b < 3; ++b) std::memset(a_.memory[b].data(), 0x21 + b, kLen);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done[3];
  for (int b = 0; b < 2; ++b) {
    CopyJob job = Job(a_, Direction::kToPool, b, b, 1, done[b]);
    job.batch_size = 3;
    Submit(std::move(job));
  }
  EXPECT_FALSE(done[0].Ready(50)) << "a batch was issued before all of its jobs arrived";
  EXPECT_EQ(a_.Done(Direction::kToPool), 0u);
  EXPECT_EQ(engine_->Lanes(a_.session.get())[0].held, 2u);
  CopyJob last = Job(a_, Direction::kToPool, 2, 2, 1, done[2]);
  last.batch_size = 3;
  Submit(std::move(last));
  for (auto& d : done) {
    ASSERT_TRUE(d.Ready(5000));
    EXPECT_TRUE(d.future.get().ok());
  }
  for (int b = 0; b < 3; ++b) EXPECT_TRUE(PoolHolds(b, static_cast<char>(0x21 + b)));
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
  std::lock_guard lock(observed_.mu);
  EXPECT_EQ(std::count(observed_.write_targets.begin(), observed_.write_targets.end(),
                       a_.DoneAddr(Direction::kToPool)),
            1);
  EXPECT_NE(std::find(observed_.batch_calls.begin(), observed_.batch_calls.end(), 3u),
            observed_.batch_calls.end())
      << "the batch's copies did not go to the runtime in one call";
}

// A batch's jobs may reach the engine out of order with other tickets (the daemon holds a reload
// of a spilled object back): ticket 2 waits for the whole batch 1, and an entry beyond the
// batch's size is refused without disturbing it.
TEST_F(StreamEngineTest, BatchHoldsLaterTicketsAndRefusesExtraEntries) {
  Start();
  std::memset(pool_.data(), 0x61, 3 * kLen);
  a_.SetTicket(Direction::kFromPool, 2);
  Completion batch[2], after, extra;
  Submit(Job(a_, Direction::kFromPool, 2, 2, 2, after));  // ticket 2, lone
  CopyJob first = Job(a_, Direction::kFromPool, 0, 0, 1, batch[0]);
  first.batch_size = 2;
  Submit(std::move(first));
  EXPECT_FALSE(after.Ready(50));
  EXPECT_EQ(a_.Done(Direction::kFromPool), 0u);
  CopyJob second = Job(a_, Direction::kFromPool, 1, 1, 1, batch[1]);
  second.batch_size = 2;
  Submit(std::move(second));
  for (Completion* c : {&batch[0], &batch[1], &after}) {
    ASSERT_TRUE(c->Ready(5000));
    EXPECT_TRUE(c->future.get().ok());
  }
  EXPECT_EQ(a_.Done(Direction::kFromPool), 2u);
  EXPECT_EQ(a_.memory[0][kLen - 1], 0x61);
  EXPECT_EQ(a_.memory[1][0], 0x61);
  CopyJob late = Job(a_, Direction::kFromPool, 0, 0, 1, extra);
  late.batch_size = 2;
  Submit(std::move(late));
  ASSERT_TRUE(extra.Ready(1000));
  EXPECT_EQ(extra.future.get().code(), absl::StatusCode::kInvalidArgument);
}

// A rejected job of a batch reaches the engine as a ticket-only job: the batch still completes,
// and the ticket is still signalled.
TEST_F(StreamEngineTest, BatchWithATicketOnlyMemberStillSignals) {
  Start();
  std::memset(a_.memory[0].data(), 0x71, kLen);
  a_.SetTicket(Direction::kToPool, 1);
  Completion copied, rejected;
  CopyJob job = Job(a_, Direction::kToPool, 0, 0, 1, copied);
  job.batch_size = 2;
  Submit(std::move(job));
  CopyJob ticket_only;
  ticket_only.direction = Direction::kToPool;
  ticket_only.session = a_.session.get();
  ticket_only.sync = 1;
  ticket_only.batch_size = 2;
  ticket_only.device = 0;
  ticket_only.done = rejected.Callback();
  Submit(std::move(ticket_only));
  ASSERT_TRUE(copied.Ready(5000));
  ASSERT_TRUE(rejected.Ready(5000));
  EXPECT_TRUE(copied.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x71));
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
}

TEST_F(StreamEngineTest, AbandonCancelsAPartialBatch) {
  Start();
  a_.SetTicket(Direction::kToPool, 1);
  Completion first;
  CopyJob job = Job(a_, Direction::kToPool, 0, 0, 1, first);
  job.batch_size = 4;
  Submit(std::move(job));
  EXPECT_FALSE(first.Ready(50));
  engine_->AbandonSession(a_.session.get());
  ASSERT_TRUE(first.Ready(5000));
  EXPECT_EQ(first.future.get().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(PoolHolds(0, 0));
}

// Jobs issued in one pass of the worker complete through one `completed` write: many lone jobs
// whose tickets are all there take fewer completion writes than jobs.
TEST_F(StreamEngineTest, OneCompletionWritePerPass) {
  Start();
  a_.SetTicket(Direction::kToPool, 64);
  std::vector<Completion> done(64);
  // Queued while the lane waits for a smaller ticket, then released at once.
  for (uint64_t t = 64; t >= 2; --t) {
    Submit(Job(a_, Direction::kToPool, t % 3, t % 4, t, done[t - 1]));
  }
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done[0]));
  for (auto& d : done) {
    ASSERT_TRUE(d.Ready(5000));
    EXPECT_TRUE(d.future.get().ok());
  }
  EXPECT_EQ(a_.Done(Direction::kToPool), 64u);
  std::lock_guard lock(observed_.mu);
  size_t done_writes = std::count(observed_.write_targets.begin(), observed_.write_targets.end(),
                                  a_.DoneAddr(Direction::kToPool));
  EXPECT_EQ(done_writes, 64u);  // lone tickets: one each
  EXPECT_LT(observed_.write_targets.size() - done_writes, 64u);
}

// The lane's window, while another session's lane of the GPU has work: a copy larger than it
// goes in chunks of a quarter of it, at most a window's worth on the stream at once, each chunk
// completed on its own; the job completes once, whole, with one done write. The other lane here
// waits for its client's ticket.
TEST_F(StreamEngineTest, ACopyLargerThanTheWindowGoesInChunksWhileTheLinkIsShared) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  Completion waiting;
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(waiting));  // copy 0: b's, held on its stream
  for (uint64_t i = 0; i < kLen; ++i) a_.memory[0][i] = static_cast<char>(i * 7);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(std::memcmp(pool_.data(), a_.memory[0].data(), kLen), 0);
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
  {
    std::lock_guard lock(observed_.mu);
    ASSERT_EQ(observed_.copies.size(), 9u);
    for (size_t i = 1; i < observed_.copies.size(); ++i) {
      EXPECT_EQ(observed_.copies[i].first, a_.memory[0].data() + (i - 1) * (kLen / 8));
      EXPECT_EQ(observed_.copies[i].second, kLen / 8);
    }
    EXPECT_EQ(std::count(observed_.write_targets.begin(), observed_.write_targets.end(),
                         a_.DoneAddr(Direction::kToPool)),
              1);
  }
  ReleaseHeld();
  ASSERT_TRUE(waiting.Ready(5000));
  EXPECT_TRUE(waiting.future.get().ok());
}

// Finding 17 (issue 30): a lane that only waits for its client's ticket is not on the link: it
// does not force the window on another session (it used to, for as long as the ticket stayed
// away).
TEST_F(StreamEngineTest, ALaneWaitingForATicketDoesNotWindowAnother) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  Completion waiting;
  Submit(Job(b_, Direction::kToPool, 0, 1, 1, waiting));  // its ticket never comes (here)
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  {
    std::lock_guard lock(observed_.mu);
    ASSERT_EQ(observed_.copies.size(), 1u);
    EXPECT_EQ(observed_.copies[0].second, kLen);
  }
  b_.SetTicket(Direction::kToPool, 1);
  ASSERT_TRUE(waiting.Ready(5000));
}

// A session alone on the GPU is never held back by the window: its copy goes whole.
TEST_F(StreamEngineTest, ALaneAloneIgnoresTheWindow) {
  Start(0, 10000, kLen / 2);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  std::lock_guard lock(observed_.mu);
  ASSERT_EQ(observed_.copies.size(), 1u);
  EXPECT_EQ(observed_.copies[0].second, kLen);
}

// Two sessions on one GPU: while the first one's large copy fills its window (its copies held
// on the stream), the second one's copy is issued ahead of the first one's remaining chunks,
// instead of behind all of them. Both land whole.
TEST_F(StreamEngineTest, TheWindowLetsAnotherSessionsCopyAheadOfALargeOne) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  for (uint64_t i = 0; i < kLen; ++i) a_.memory[0][i] = static_cast<char>(i * 3);
  std::memset(b_.memory[0].data(), 0x4B, kLen);
  Completion on_link, big, small;
  // Copy 0, small: b's second copy below still fits its own window.
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(on_link, Direction::kToPool, kLen / 8));
  Hold(a_.memory[0]);  // a's chunks stay in flight: its window fills
  a_.SetTicket(Direction::kToPool, 1);
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, big));
  ASSERT_TRUE(AwaitIssued(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Issued(), 5u) << "the first lane issued more than its window";
  CopyJob job = Job(b_, Direction::kToPool, 0, 1, 2, small);
  job.len = kLen / 8;
  b_.SetTicket(Direction::kToPool, 2);
  Submit(std::move(job));
  ASSERT_TRUE(AwaitIssued(6));
  {
    std::lock_guard lock(observed_.mu);
    ASSERT_EQ(observed_.copies.size(), 6u);
    EXPECT_EQ(observed_.copies[5].first, b_.memory[0].data())
        << "the second session's copy waited behind the first one's chunks";
  }
  ReleaseHeld();
  ASSERT_TRUE(big.Ready(5000));
  ASSERT_TRUE(small.Ready(5000));
  ASSERT_TRUE(on_link.Ready(5000));
  EXPECT_TRUE(big.future.get().ok());
  EXPECT_TRUE(small.future.get().ok());
  EXPECT_EQ(std::memcmp(pool_.data(), a_.memory[0].data(), kLen), 0);
  EXPECT_EQ(std::memcmp(pool_.data() + kLen, b_.memory[0].data(), kLen / 8), 0);
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
  EXPECT_EQ(b_.Done(Direction::kToPool), 2u);
}

// A reload of pool bytes an offload is still writing in chunks waits for the whole offload: it
// is issued after the offload's last chunk and waits on the GPU for it.
TEST_F(StreamEngineTest, AReloadWaitsForEveryChunkOfTheOffloadItReads) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  Completion waiting[2];
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(waiting[0], Direction::kToPool));  // both directions
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(waiting[1], Direction::kFromPool));
  for (uint64_t i = 0; i < kLen; ++i) a_.memory[0][i] = static_cast<char>(i * 5 + 1);
  a_.SetTicket(Direction::kToPool, 1);
  a_.SetTicket(Direction::kFromPool, 1);
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));
  Submit(Job(a_, Direction::kFromPool, 1, 0, 1, reload));
  ASSERT_TRUE(offload.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_TRUE(offload.future.get().ok());
  EXPECT_TRUE(reload.future.get().ok());
  EXPECT_EQ(std::memcmp(a_.memory[1].data(), a_.memory[0].data(), kLen), 0);
  {
    std::lock_guard lock(observed_.mu);
    EXPECT_GE(observed_.copies.size(), 16u) << "the copies were not chunked";
  }
  ReleaseHeld();
  for (auto& w : waiting) ASSERT_TRUE(w.Ready(5000));
}

TEST_F(StreamEngineTest, TicketOnlyJobSignals) {
  Start();
  a_.SetTicket(Direction::kFromPool, 1);
  Completion done;
  CopyJob job;
  job.direction = Direction::kFromPool;
  job.len = 0;
  job.session = a_.session.get();
  job.sync = 1;
  job.done = done.Callback();
  Submit(std::move(job));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
}

// A reload of pool bytes an offload is still filling waits for that offload: on the host until
// the offload is issued, then on the "GPU" for its copy.
TEST_F(StreamEngineTest, ReloadWaitsForOffloadIntoSamePoolBytes) {
  Start();
  std::memset(a_.memory[0].data(), 0x42, kLen);
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));  // waits: produced = 0
  Submit(Job(a_, Direction::kFromPool, 1, 0, 0, reload));
  EXPECT_FALSE(reload.Ready(50));
  a_.SetTicket(Direction::kToPool, 1);
  ASSERT_TRUE(offload.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_EQ(a_.memory[1][0], 0x42);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0x42);
}

// The same while the offload waits for a smaller ticket (held): the reload, submitted after it,
// must still wait for it, though the offload reaches its lane's queue only later.
TEST_F(StreamEngineTest, ReloadWaitsForAHeldOffloadIntoSamePoolBytes) {
  Start();
  std::memset(a_.memory[0].data(), 0x33, kLen);
  a_.SetTicket(Direction::kToPool, 2);
  Completion second, first, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 2, second));  // held: ticket 1 has not arrived
  Submit(Job(a_, Direction::kFromPool, 1, 0, 0, reload));
  EXPECT_FALSE(reload.Ready(50)) << "the reload read pool bytes before the offload wrote them";
  Submit(Job(a_, Direction::kToPool, 2, 1, 1, first));
  ASSERT_TRUE(second.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_EQ(a_.memory[1][0], 0x33);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0x33);
  ASSERT_TRUE(first.Ready(5000));
}

// Issue 26, item 3: GPUs share one engine, never a wait. A session on GPU 0 whose client stopped
// (its offloads and a reload of their pool bytes wait in GPU 0's lanes for tickets that do not
// come) does not hold a session on GPU 1: its offload and the reload right behind it, into and out
// of the same pool bytes, complete (each within a deadline, no sleep). GPU 0's jobs then go on
// once their tickets arrive.
TEST_F(StreamEngineTest, AStalledSessionOnOneGpuDoesNotHoldAnotherGpusJobs) {
  Start();
  std::vector<Completion> stalled(3);
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, stalled[0]));
  Submit(Job(a_, Direction::kToPool, 1, 1, 2, stalled[1]));
  Submit(Job(a_, Direction::kFromPool, 2, 0, 1, stalled[2]));  // behind offload 0's pool bytes
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8, /*semaphores=*/false, /*device=*/1));
  std::memset(b_.memory[0].data(), 0x5A, kLen);
  for (int round = 0; round < 20; ++round) {
    Completion offload, reload;
    Submit(Job(b_, Direction::kToPool, 0, 3, 0, offload));
    Submit(Job(b_, Direction::kFromPool, 1, 3, 0, reload));
    ASSERT_TRUE(offload.Ready(5000)) << "GPU 1's offload waited for GPU 0's stalled lanes";
    ASSERT_TRUE(reload.Ready(5000)) << "GPU 1's reload waited for GPU 0's stalled lanes";
    EXPECT_TRUE(offload.future.get().ok());
    EXPECT_TRUE(reload.future.get().ok());
  }
  EXPECT_EQ(b_.memory[1][0], 0x5A);
  EXPECT_EQ(b_.memory[1][kLen - 1], 0x5A);
  for (Completion& c : stalled) EXPECT_FALSE(c.Ready(0)) << "GPU 0's jobs did not wait";
  a_.SetTicket(Direction::kToPool, 2);
  a_.SetTicket(Direction::kFromPool, 1);
  for (Completion& c : stalled) ASSERT_TRUE(c.Ready(5000));
}

// Delay injection: the copy is issued copy_delay_us after its ticket arrived, so a client that
// overwrites the source without waiting for offload_done deterministically changes the result.
TEST_F(StreamEngineTest, DelayStartsCopyLate) {
  Start(/*delay_us=*/100000);
  std::memset(a_.memory[0].data(), 0x10, kLen);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  auto start = std::chrono::steady_clock::now();
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // well inside the delay
  {
    std::lock_guard lock(memory_mu);
    std::memset(a_.memory[0].data(), 0x20, kLen);  // the early reuse a missing wait would allow
  }
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_TRUE(PoolHolds(0, 0x20));
}

}  // namespace
}  // namespace tier::engine::stream_engine_testing
