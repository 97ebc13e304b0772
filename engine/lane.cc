#include "engine/lane.h"

#include <utility>

namespace tier::engine {

Lane::Lane(GpuRuntime& runtime, HostWordPool& pool, std::shared_ptr<ReleaseThread> releaser,
           std::atomic<uint64_t>& live, DeviceWorker& worker, LinkMeter& meter, std::string label,
           uint32_t uid, int device, Direction direction, GpuStream stream,
           HostWordPool::Slot word)
    : runtime(runtime), pool(pool), releaser(std::move(releaser)), live(live), worker(worker),
      meter(meter), label(std::move(label)), uid(uid), device(device), direction(direction),
      stream(stream), word(word) {
  live.fetch_add(1);
}

Lane::~Lane() {
  // Every job issued on the stream completed (a lane goes only when idle), so nothing will write
  // the word again; the stream is destroyed on the release thread.
  pool.Give(word);
  releaser->Post([&runtime = runtime, device = device, stream = stream, &live = live] {
    runtime.DestroyStream(device, stream);
    live.fetch_sub(1);
  });
}

LaneStatus Lane::Status(uint64_t now) const {
  LaneStatus s;
  s.device = device;
  s.direction = direction;
  s.queued = queue.size();
  s.held = held_jobs;
  s.in_flight = pending.size();
  s.client_ticket = client_ticket;
  if (!queue.empty()) s.blocked_on = blocked;
  s.active = in_worker.load();
  s.completed_seq = LoadWord(word.host->completed);
  s.issued_seq = next_seq - 1;
  if (!pending.empty()) {
    const PendingJob& oldest = pending.front();
    s.oldest_in_flight_ms = (now - oldest.issued_ns) / 1000000;
    s.gpu_waits = DescribeGpuWaits(oldest);
  }
  if (wait_since_ns != 0 && !queue.empty()) {
    s.waiting_ticket = queue.front().job.sync;
    s.waiting_ms = (now - wait_since_ns) / 1000000;
  }
  return s;
}

}  // namespace tier::engine
