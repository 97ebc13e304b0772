// A client that talks the session protocol by hand and writes the shared ring itself, as a
// hostile or broken one would: for tests of what tierd does with such clients.
#ifndef TIER_TESTS_INTEGRATION_RAW_SESSION_H_
#define TIER_TESTS_INTEGRATION_RAW_SESSION_H_

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "client/control_client.h"
#include "client/session_channel.h"
#include "common/populate.h"
#include "gtest/gtest.h"
#include "tier/ring.h"
#include "tierd_process.h"

namespace tier::testing {

inline v1::OpenSessionResponse OpenRaw(const TierdProcess& tierd,
                                       const std::string& name = "raw") {
  client::ControlClient control(tierd.socket(), 5000);
  v1::OpenSessionRequest request;
  request.set_name(name);
  absl::StatusOr<v1::OpenSessionResponse> opened = control.OpenSession(request, /*daemon_wait_ms=*/0);
  EXPECT_TRUE(opened.ok()) << opened.status();
  return *opened;
}

// Writes the first `bytes` of a memfd, as a client does before registering it (tierd refuses
// memfds with holes).
inline void PopulateMemfd(int fd, uint64_t bytes) {
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  EXPECT_TRUE(PopulateForWrite(mapped, bytes).ok());
  ::munmap(mapped, bytes);
}

// A raw session: attached by hand, its ring mapped by the test.
struct RawSession {
  explicit RawSession(const TierdProcess& tierd) {
    opened = OpenRaw(tierd, "hostile");
    auto connected = client::SessionChannel::Connect(opened.session_socket());
    EXPECT_TRUE(connected.ok());
    channel.emplace(*std::move(connected));
    auto result = channel->Attach(opened.session_id(), opened.attach_token());
    EXPECT_TRUE(result.ok()) << result.status();
    attached = *std::move(result);
    base = ::mmap(nullptr, attached.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                  attached.ring_fd.get(), 0);
    view = *ring::ViewSegment(base, attached.ring_bytes);
  }
  ~RawSession() { ::munmap(base, attached.ring_bytes); }
  void Push(const ring::SubmissionEntry& entry) {
    uint32_t tail = view.header->sq.tail.value.load();
    view.sq[tail & (view.header->sq_entries - 1)] = entry;
    view.header->sq.tail.value.store(tail + 1);
    uint64_t one = 1;
    // (MSG_NOSIGNAL: a daemon that ended the session closed its end, and SIGPIPE would end the
    // test.)
    (void)!::send(attached.sq_doorbell.get(), &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  // Waits for the next completion (the daemon's poller picks entries up within microseconds).
  ring::CompletionEntry Next() {
    for (int i = 0; i < 5000000; ++i) {
      uint32_t head = view.header->cq.head.value.load();
      if (view.header->cq.tail.value.load() != head) {
        ring::CompletionEntry c = view.cq[head & (view.header->cq_entries - 1)];
        view.header->cq.head.value.store(head + 1);
        return c;
      }
      if (i > 1000) ::usleep(10);
    }
    ADD_FAILURE() << "no completion";
    return {};
  }
  v1::OpenSessionResponse opened;
  std::optional<client::SessionChannel> channel;
  client::AttachResult attached;
  void* base = nullptr;
  ring::SegmentView view;
};

}  // namespace tier::testing

#endif  // TIER_TESTS_INTEGRATION_RAW_SESSION_H_
