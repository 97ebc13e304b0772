// The stream engine (tests/gpu/stream_engine_fixture.h) over a session's life: fed reloads (chunks
// from NVMe), abandoning a session with jobs queued and held, ticket pages, what lanes report they
// wait for, the deadlock model of issue 10, releases on their own thread, and many sessions and
// threads that never strand a lane.
#include "gpu/stream_engine_fixture.h"

namespace tier::engine::stream_engine_testing {
namespace {

// A reload whose pool bytes arrive in chunks (from NVMe): each chunk reaches the client as soon
// as the feed has it, before the rest has arrived; the job completes once, after the end.
TEST_F(StreamEngineTest, FedReloadCopiesEachChunkAsItArrives) {
  Start();
  constexpr uint64_t kChunk = kLen / 4;
  a_.SetTicket(Direction::kFromPool, 1);
  auto feed = std::make_shared<SourceFeed>(kLen, kChunk);
  Completion done;
  CopyJob job = Job(a_, Direction::kFromPool, 0, 0, 1, done);
  job.feed = feed;
  Submit(std::move(job));
  EXPECT_FALSE(done.Ready(30));
  for (uint64_t i = 0; i < 3; ++i) {
    std::memset(pool_.data() + i * kChunk, 0x40 + static_cast<int>(i), kChunk);
    OnThread(ThreadRole::kSpillIo, [&] { feed->Advance((i + 1) * kChunk); });
    ASSERT_TRUE(Eventually([&] { return a_.memory[0][i * kChunk + kChunk - 1] == 0x40 + int(i); }))
        << "chunk " << i << " was not copied on arrival";
    EXPECT_EQ(a_.memory[0][(i + 1) * kChunk], 0) << "chunk " << i + 1 << " copied before it arrived";
    EXPECT_FALSE(done.Ready(0));
  }
  std::memset(pool_.data() + 3 * kChunk, 0x43, kChunk);
  OnThread(ThreadRole::kSpillIo, [&] { feed->End(absl::OkStatus()); });
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(a_.memory[0][kLen - 1], 0x43);
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
}

// The feed ends in an error half way: the job fails with it, the client's stream is still
// released (done written), and past the verified chunks the client gets the zeros the producer
// left, never other bytes.
TEST_F(StreamEngineTest, FedReloadEndingInAnErrorFailsButReleasesTheTicket) {
  Start();
  constexpr uint64_t kChunk = kLen / 4;
  std::memset(a_.memory[1].data(), 0x7F, kLen);
  a_.SetTicket(Direction::kFromPool, 1);
  auto feed = std::make_shared<SourceFeed>(kLen, kChunk);
  Completion done;
  CopyJob job = Job(a_, Direction::kFromPool, 1, 1, 1, done);
  job.feed = feed;
  Submit(std::move(job));
  std::memset(pool_.data() + kLen, 0x21, kChunk);
  feed->Advance(kChunk);
  feed->End(absl::DataLossError("checksum mismatch in chunk 1"));  // pool past chunk 0 is zero
  ASSERT_TRUE(done.Ready(5000));
  absl::Status status = done.future.get();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
  EXPECT_EQ(a_.memory[1][0], 0x21);
  EXPECT_EQ(a_.memory[1][kChunk], 0);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0);
  // The lane goes on.
  Completion next;
  a_.SetTicket(Direction::kFromPool, 2);
  Submit(Job(a_, Direction::kFromPool, 1, 1, 2, next));
  ASSERT_TRUE(next.Ready(5000));
  EXPECT_TRUE(next.future.get().ok());
}

TEST_F(StreamEngineTest, AbandonCancelsQueuedAndHeldJobs) {
  Start();
  Completion waiting, held;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, waiting));  // ticket never written
  Submit(Job(a_, Direction::kToPool, 1, 1, 3, held));     // ticket 2 never arrives
  EXPECT_FALSE(waiting.Ready(50));
  engine_->AbandonSession(a_.session.get());
  ASSERT_TRUE(held.Ready(5000));
  EXPECT_EQ(held.future.get().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(waiting.Ready(5000));
  EXPECT_EQ(waiting.future.get().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(PoolHolds(0, 0));  // nothing was copied for a client that is gone
  Completion late;
  Submit(Job(a_, Direction::kToPool, 0, 0, 0, late));
  ASSERT_TRUE(late.Ready(1000));
  EXPECT_EQ(late.future.get().code(), absl::StatusCode::kCancelled);
}

TEST_F(StreamEngineTest, TicketWithoutSemaphorePageFails) {
  Start();
  Open(b_, 8, /*semaphores=*/false);
  Completion done;
  Submit(Job(b_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(1000));
  EXPECT_EQ(done.future.get().code(), absl::StatusCode::kFailedPrecondition);
}

// The done counters are host words in the session's ticket page (the client releases its own
// streams with a CPU store when tierd dies): the slot carries no memory, names a GPU tierd sees,
// and is bound once per GPU; the page is registered mapped once for the session, and released.
TEST_F(StreamEngineTest, ATicketSlotCarriesNoMemoryAndTheDoneWordsLandInTheTicketPage) {
  Start();
  Open(b_, 8, /*semaphores=*/false);
  {
    BufferImport import;
    import.kind = wire::BufferKind::kCudaSemaphores;
    import.bytes = 4096;  // a protocol-1 client's semaphore page
    EXPECT_EQ(engine_->Import(b_.session.get(), std::move(import)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(BindSlot(a_).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(BindSlot(b_, 0xFF).status().code(), absl::StatusCode::kFailedPrecondition);
  {
    std::lock_guard lock(observed_.mu);
    EXPECT_EQ(observed_.mapped_hosts.count(reinterpret_cast<char*>(&a_.tickets)), 1u);
  }
  a_.SetTicket(Direction::kToPool, 1);
  a_.SetTicket(Direction::kFromPool, 1);
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));
  ASSERT_TRUE(offload.Ready(5000));
  Submit(Job(a_, Direction::kFromPool, 1, 0, 1, reload));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_TRUE(offload.future.get().ok());
  EXPECT_TRUE(reload.future.get().ok());
  EXPECT_EQ(a_.tickets.slots[0].offload_done.value.load(), 1u);
  EXPECT_EQ(a_.tickets.slots[0].reload_done.value.load(), 1u);
  // The link meter saw both copies (too few bytes for a rate: engine/link_meter.h).
  std::vector<LinkRate> rates = engine_->LinkRates();
  ASSERT_EQ(rates.size(), 1u);
  EXPECT_EQ(rates[0].device, 0);
  EXPECT_EQ(rates[0].d2h_bytes, kLen);
  EXPECT_EQ(rates[0].h2d_bytes, kLen);
}

// Finding 11 (issue 30): a job without a ticket queued behind one whose ticket the client never
// raises is held by the client, and the engine says so (health leaves such jobs out).
TEST_F(StreamEngineTest, UnticketedJobsBehindAClientsTicketAreCountedAsHeldByTheClient) {
  Start();
  Completion ticketed, plain;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, ticketed));  // ticket 1 never raised (yet)
  Submit(Job(a_, Direction::kToPool, 1, 1, 0, plain));     // no ticket, behind it
  for (int i = 0; i < 500 && engine_->UnticketedBehindClients() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(engine_->UnticketedBehindClients(), 1u);
  EXPECT_FALSE(plain.Ready(20));
  a_.SetTicket(Direction::kToPool, 1);
  ASSERT_TRUE(ticketed.Ready(5000));
  ASSERT_TRUE(plain.Ready(5000));
  EXPECT_EQ(engine_->UnticketedBehindClients(), 0u);
}

// What tierctl clients shows: a lane waiting for a client's ticket says which, and what the
// client reported so far.
TEST_F(StreamEngineTest, LanesReportWhatTheyWaitFor) {
  Start();
  a_.SetTicket(Direction::kToPool, 4);
  Completion jobs[5];
  for (uint64_t t = 1; t <= 5; ++t) Submit(Job(a_, Direction::kToPool, 0, t % 4, t, jobs[t - 1]));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(jobs[i].Ready(5000));
  LaneStatus d2h;
  for (int i = 0; i < 500; ++i) {
    d2h = engine_->Lanes(a_.session.get())[0];
    if (d2h.waiting_ms >= 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(d2h.direction, Direction::kToPool);
  EXPECT_EQ(d2h.queued, 1u);
  EXPECT_EQ(d2h.waiting_ticket, 5u);
  EXPECT_EQ(d2h.client_ticket, 4u);
  EXPECT_GE(d2h.waiting_ms, 20u);
  a_.SetTicket(Direction::kToPool, 5);
  ASSERT_TRUE(jobs[4].Ready(5000));
  EXPECT_EQ(engine_->Lanes(a_.session.get())[0].waiting_ticket, 0u);
}

// Issue 10, on the CPU. Session A has an offload whose ticket comes only after a reload of A
// completed (backward: the producer of the next saved tensor waits for a reloaded activation).
// Meanwhile session B ends and its memory is closed, which waits for every stream of the process
// to go idle while holding the driver lock (as cudaIpcCloseMemHandle does). Before the fix the
// offload waited for its ticket on the GPU, so the streams never went idle; the close held the
// driver lock; the reload could not be issued; the ticket never came: a deadlock. Now the
// offload is issued only once its ticket is here, so the close finds idle streams.
TEST_F(StreamEngineTest, DeadlockModel_ClosingMemoryWhileAClientTicketIsOutstanding) {
  Start();
  Open(b_, 8);
  std::memset(a_.memory[0].data(), 0x61, kLen);
  std::memset(pool_.data() + 2 * kLen, 0x62, kLen);
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 2000 && !finished.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!finished.load()) {
      std::fprintf(stderr, "DEADLOCK: the offload, the reload and session B's close did not "
                           "finish within 20 s (issue 10's cycle)\n");
      std::fflush(stderr);
      std::_Exit(1);  // the engine's threads are stuck: no orderly teardown is possible
    }
  });
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));  // ticket 1 comes after the reload
  // The client: its producer stream runs only once the reload landed, then raises ticket 1.
  std::thread client([&] {
    while (a_.Done(Direction::kFromPool) < 1) std::this_thread::sleep_for(std::chrono::microseconds(50));
    a_.SetTicket(Direction::kToPool, 1);
  });
  // The session reaper drops B's buffers (closing them synchronizes implicitly).
  std::thread reaper([&] { Close(b_); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  a_.SetTicket(Direction::kFromPool, 1);
  Submit(Job(a_, Direction::kFromPool, 1, 2, 1, reload));
  EXPECT_TRUE(reload.Ready(20000));
  EXPECT_TRUE(offload.Ready(20000));
  reaper.join();
  client.join();
  finished = true;
  watchdog.join();
  EXPECT_TRUE(reload.future.get().ok());
  EXPECT_TRUE(offload.future.get().ok());
  EXPECT_EQ(a_.memory[1][0], 0x62);
  EXPECT_TRUE(PoolHolds(0, 0x61));
}

// Closing memory, destroying lanes and unpinning happen on the engine's release thread (the fake
// fails any other thread that tries: see TearDown), and Counts() shows them go.
TEST_F(StreamEngineTest, ReleasesRunOnTheReleaseThreadAndCountsReturnToZero) {
  Start();
  Open(b_, 8);
  EXPECT_EQ(engine_->Counts().buffers, 6u);
  EXPECT_EQ(engine_->Counts().lanes, 4u);
  Close(b_);
  Close(a_);
  EngineCounts counts;
  for (int i = 0; i < 2000; ++i) {
    counts = engine_->Counts();
    if (counts.buffers == 0 && counts.lanes == 0 && counts.pending_releases == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(counts.buffers, 0u);
  EXPECT_EQ(counts.lanes, 0u);
  EXPECT_EQ(counts.pending_releases, 0u);
}

// Many sessions and threads at once, jobs in random order of arrival across lanes, tickets raised
// late by "client" threads, sessions closing while others run: everything completes, in ticket
// order per lane, with the rule checks of TearDown.
TEST_F(StreamEngineTest, ManySessionsAndThreadsNoHang) {
  Start(/*delay_us=*/200);
  constexpr int kClients = 4;
  constexpr uint64_t kJobs = 60;
  std::vector<std::unique_ptr<FakeClient>> clients;
  std::vector<std::vector<char>> pools(kClients, std::vector<char>(kLen));
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<FakeClient>());
    ASSERT_NO_FATAL_FAILURE(Open(*clients.back(), 100 + i));
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      FakeClient& c = *clients[i];
      std::vector<Completion> done(2 * kJobs);
      for (uint64_t t = 1; t <= kJobs; ++t) {
        for (Direction d : {Direction::kToPool, Direction::kFromPool}) {
          CopyJob job;
          job.direction = d;
          job.client = c.memory[t % 3].data();
          job.pool = pools[i].data();
          job.len = kLen / 8;
          job.session = c.session.get();
          job.sync = t;
          job.done = done[2 * (t - 1) + (d == Direction::kToPool ? 0 : 1)].Callback();
          SetThreadRole(ThreadRole::kRingPoller);
          engine_->Submit(std::move(job));
          SetThreadRole(ThreadRole::kOther);
        }
        if (t % 7 == 0) {  // the client's streams catch up now and then
          c.SetTicket(Direction::kToPool, t);
          c.SetTicket(Direction::kFromPool, t);
        }
      }
      c.SetTicket(Direction::kToPool, kJobs);
      c.SetTicket(Direction::kFromPool, kJobs);
      for (Completion& d : done) {
        if (!d.Ready(20000) || !d.future.get().ok()) ++failures;
      }
      if (c.Done(Direction::kToPool) != kJobs || c.Done(Direction::kFromPool) != kJobs) {
        ++failures;
      }
      Close(c);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// As the daemon drives the engine: a ring-poller thread submits offloads and reloads (tickets
// raised by "client" threads a little later, as streams reach them), completion callbacks (on the
// worker) submit reloads of what just filled, as the executor does, and the jobs must all end.
TEST_F(StreamEngineTest, CallbacksThatSubmitAndLateTicketsNeverStrandALane) {
  Start();
  constexpr uint64_t kRounds = 400;
  std::atomic<uint64_t> ended{0};
  std::atomic<uint64_t> offload_tickets{0};
  std::atomic<uint64_t> reload_tickets{0};
  std::atomic<int> helpers{0};  // detached submitters still running (they use this frame)
  std::mutex submit_mu;  // one submitter at a time per lane, as the ring poller
  std::function<void(int, uint64_t)> submit_reload;
  submit_reload = [&](int slot, uint64_t) {
    std::lock_guard lock(submit_mu);
    CopyJob job;
    job.direction = Direction::kFromPool;
    job.client = a_.memory[1].data();
    job.pool = pool_.data() + slot * kLen;
    job.len = kLen / 16;
    job.session = a_.session.get();
    job.sync = ++reload_tickets;
    job.done = [&](absl::Status) { ++ended; };
    engine_->Submit(std::move(job));
  };
  std::atomic<bool> stop{false};
  std::thread client([&] {  // the client's streams reach the tickets, in bursts
    std::mt19937 rng(1);
    while (!stop.load()) {
      a_.SetTicket(Direction::kToPool, offload_tickets.load());
      if (rng() % 3 == 0) a_.SetTicket(Direction::kFromPool, reload_tickets.load());
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    }
  });
  std::thread poller([&] {
    SetThreadRole(ThreadRole::kRingPoller);
    for (uint64_t i = 0; i < kRounds; ++i) {
      int slot = static_cast<int>(i % 4);
      {
        std::lock_guard lock(submit_mu);
        CopyJob job;
        job.direction = Direction::kToPool;
        job.client = a_.memory[0].data();
        job.pool = pool_.data() + slot * kLen;
        job.len = kLen / 16;
        job.session = a_.session.get();
        job.sync = ++offload_tickets;
        // Its completion submits a reload of what it filled (from the worker thread).
        job.done = [&, slot, i](absl::Status) {
          ++ended;
          ++helpers;
          std::thread([&, slot, i] {
            submit_reload(slot, i);
            --helpers;  // last: this frame may go once every helper is out
          }).detach();
        };
        engine_->Submit(std::move(job));
      }
      if (i % 5 == 0) submit_reload(slot, i);
    }
  });
  poller.join();
  bool all = false;
  for (int i = 0; i < 10000 && !all; ++i) {
    a_.SetTicket(Direction::kFromPool, reload_tickets.load());
    all = ended.load() == kRounds + kRounds + kRounds / 5;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  client.join();
  for (int i = 0; i < 10000 && helpers.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(all) << ended.load() << " of " << kRounds * 2 + kRounds / 5
                   << " jobs ended; lanes: " << engine_->Lanes(a_.session.get())[1].queued
                   << " reloads queued";
}

}  // namespace
}  // namespace tier::engine::stream_engine_testing
