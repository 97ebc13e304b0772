// The admission queue alone, served by the test thread: order within a session, fairness between
// sessions, who gives up when no room can come, and that every wait ends exactly once (closing
// included, even while a waiter is being tried).
#include "daemon/jobs/admission_queue.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

// Records what happened to each waiter, by name.
struct Log {
  std::vector<std::string> events;
  std::function<bool()> Try(std::string name, std::function<bool()> room) {
    return [this, name, room] {
      events.push_back("try " + name);
      return room();
    };
  }
  std::function<void()> GiveUp(std::string name) {
    return [this, name] { events.push_back("gave up " + name); };
  }
};

TEST(AdmissionQueueTest, TellsTheOwnerWhenTheFirstWaitBegins) {
  std::vector<bool> waits;
  AdmissionQueue queue([&](bool first) { waits.push_back(first); });
  Log log;
  EXPECT_FALSE(queue.HasWaiters());
  queue.Wait(1, log.Try("a", [] { return false; }), log.GiveUp("a"));
  queue.Wait(2, log.Try("b", [] { return false; }), log.GiveUp("b"));
  EXPECT_EQ(waits, (std::vector<bool>{true, false}));
  EXPECT_TRUE(queue.HasWaiters());
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_TRUE(log.events.empty()) << "a wait must not try or give up by itself";
  queue.Close();
}

TEST(AdmissionQueueTest, WaitersOfOneQueueAreServedInArrivalOrder) {
  AdmissionQueue queue(nullptr);
  Log log;
  int room = 0;  // how many may be served
  auto take = [&] { return room > 0 ? (--room, true) : false; };
  queue.Wait(1, log.Try("first", take), log.GiveUp("first"));
  queue.Wait(1, log.Try("second", take), log.GiveUp("second"));
  queue.Serve(AdmissionQueue::Mode::kTry);
  // The second is not even tried while the first finds no room.
  EXPECT_EQ(log.events, (std::vector<std::string>{"try first"}));
  room = 2;
  log.events.clear();
  queue.Serve(AdmissionQueue::Mode::kTry);
  EXPECT_EQ(log.events, (std::vector<std::string>{"try first", "try second"}));
  EXPECT_FALSE(queue.HasWaiters());
  EXPECT_EQ(queue.size(), 0u);
}

// Issue 16: one session's parked offload held every later offload of every session.
TEST(AdmissionQueueTest, OneQueuesStuckWaiterDoesNotHoldUpAnother) {
  AdmissionQueue queue(nullptr);
  Log log;
  queue.Wait(7, log.Try("big", [] { return false; }), log.GiveUp("big"));
  queue.Wait(8, log.Try("small", [] { return true; }), log.GiveUp("small"));
  queue.Serve(AdmissionQueue::Mode::kTry);
  EXPECT_NE(std::find(log.events.begin(), log.events.end(), "try small"), log.events.end());
  EXPECT_EQ(queue.size(), 1u);  // the big one still waits
  queue.Close();
  EXPECT_EQ(log.events.back(), "gave up big");
}

TEST(AdmissionQueueTest, QueuesTakeTurnsBeingServedFirst) {
  AdmissionQueue queue(nullptr);
  std::vector<uint64_t> first_tried;
  for (int round = 0; round < 3; ++round) {
    bool tried = false;
    for (uint64_t q : {1, 2, 3}) {
      queue.Wait(
          q,
          [&, q] {
            if (!tried) first_tried.push_back(q);
            tried = true;
            return true;
          },
          [] {});
    }
    queue.Serve(AdmissionQueue::Mode::kTry);
  }
  EXPECT_EQ(first_tried, (std::vector<uint64_t>{1, 2, 3}));
}

// Issue 16: the spiller failed every waiter, so one impossible offload cost every session its
// jobs. Now only the one waiting longest gives up per round.
TEST(AdmissionQueueTest, WhenStuckOnlyTheOldestGivesUp) {
  AdmissionQueue queue(nullptr);
  Log log;
  bool first_gone = false;
  queue.Wait(1, log.Try("first", [] { return false; }), [&] {
    first_gone = true;
    log.events.push_back("gave up first");
  });
  // Fits once the first is gone (as if the first's end released what it needs).
  queue.Wait(1, log.Try("second", [&] { return first_gone; }), log.GiveUp("second"));
  queue.Wait(2, log.Try("other", [] { return false; }), log.GiveUp("other"));
  queue.Serve(AdmissionQueue::Mode::kStuck);
  EXPECT_EQ(log.events, (std::vector<std::string>{"try first", "try other", "gave up first"}));
  log.events.clear();
  queue.Serve(AdmissionQueue::Mode::kTry);
  // (Queue 2 is first this round: the queues take turns.)
  EXPECT_EQ(log.events, (std::vector<std::string>{"try other", "try second", "try other"}));
  EXPECT_EQ(queue.size(), 1u);
  queue.Close();
}

TEST(AdmissionQueueTest, NobodyGivesUpInARoundWhereSomeoneGotRoom) {
  AdmissionQueue queue(nullptr);
  Log log;
  queue.Wait(1, log.Try("stuck", [] { return false; }), log.GiveUp("stuck"));
  queue.Wait(2, log.Try("fits", [] { return true; }), log.GiveUp("fits"));
  queue.Serve(AdmissionQueue::Mode::kStuck);
  // The one served started a copy, which may free memory: no reason to give up yet.
  EXPECT_EQ(std::count(log.events.begin(), log.events.end(), "gave up stuck"), 0);
  queue.Serve(AdmissionQueue::Mode::kStuck);
  EXPECT_EQ(log.events.back(), "gave up stuck");
  EXPECT_FALSE(queue.HasWaiters());
}

TEST(AdmissionQueueTest, StuckWaitersGiveUpOneARoundOldestFirst) {
  AdmissionQueue queue(nullptr);
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) {
    queue.Wait(static_cast<uint64_t>(10 - i), [] { return false; }, [&, i] { order.push_back(i); });
  }
  for (int round = 1; round <= 4; ++round) {
    queue.Serve(AdmissionQueue::Mode::kStuck);
    EXPECT_EQ(order.size(), static_cast<size_t>(round));
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST(AdmissionQueueTest, CloseEndsEveryWaitAndLaterOnesAtOnce) {
  AdmissionQueue queue(nullptr);
  Log log;
  queue.Wait(1, log.Try("a", [] { return false; }), log.GiveUp("a"));
  queue.Wait(2, log.Try("b", [] { return false; }), log.GiveUp("b"));
  queue.Close();
  EXPECT_EQ(log.events, (std::vector<std::string>{"gave up a", "gave up b"}));
  EXPECT_FALSE(queue.HasWaiters());
  queue.Wait(3, log.Try("late", [] { return true; }), log.GiveUp("late"));
  EXPECT_EQ(log.events.back(), "gave up late");
  queue.Serve(AdmissionQueue::Mode::kStuck);  // nothing left
  EXPECT_EQ(log.events.size(), 3u);
}

// A waiter being tried is out of its queue; a Close at that moment must still end its wait (it
// stayed queued forever, and the session that owned it never went idle).
TEST(AdmissionQueueTest, CloseWhileAWaiterIsTriedEndsItToo) {
  AdmissionQueue queue(nullptr);
  int gave_up = 0, tries = 0;
  queue.Wait(
      1,
      [&] {
        ++tries;
        queue.Close();  // from inside the try: exactly the window in question
        return false;
      },
      [&] { ++gave_up; });
  queue.Serve(AdmissionQueue::Mode::kTry);
  EXPECT_EQ(tries, 1);
  EXPECT_EQ(gave_up, 1);
  EXPECT_FALSE(queue.HasWaiters());
  EXPECT_EQ(queue.size(), 0u);
}

TEST(AdmissionQueueTest, ManyThreadsWaitingWhileServedEachEndOnce) {
  AdmissionQueue queue(nullptr);
  constexpr int kThreads = 4, kEach = 500;
  std::atomic<int> ends{0}, room{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto once = std::make_shared<std::atomic<bool>>(false);
        auto end = [&ends, once] {
          EXPECT_FALSE(once->exchange(true)) << "a wait ended twice";
          ends.fetch_add(1);
        };
        queue.Wait(
            static_cast<uint64_t>(t),
            [end, &room] {
              if (room.fetch_sub(1) <= 0) {
                room.fetch_add(1);
                return false;
              }
              end();
              return true;
            },
            end);
      }
    });
  }
  std::thread server([&] {
    while (ends.load() < kThreads * kEach / 2) {
      room.fetch_add(7);
      queue.Serve(AdmissionQueue::Mode::kTry);
    }
  });
  server.join();
  for (std::thread& t : threads) t.join();
  queue.Close();
  EXPECT_EQ(ends.load(), kThreads * kEach);
  EXPECT_FALSE(queue.HasWaiters());
}

}  // namespace
}  // namespace tier::daemon
