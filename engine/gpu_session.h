// A session as the GPU engine keeps it: the client memory it registered (by address, to find a
// job's GPU), its lanes per GPU, its ticket page and that page's registration. SessionState is
// shared by the session, its buffers (their destructors drop their ranges) and the engine's list
// of sessions; GpuSession is what the daemon holds, and abandons the session when it goes.
#ifndef TIER_ENGINE_GPU_SESSION_H_
#define TIER_ENGINE_GPU_SESSION_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "engine/copy_engine.h"
#include "engine/lane.h"
#include "tier/ring.h"

namespace tier::engine {

class JobIntake;

struct SessionState {
  explicit SessionState(const EngineSessionInfo& info)
      : id(info.id), label(info.label), uid(info.uid), tickets(info.tickets),
        tickets_owner(info.tickets_owner) {}

  // The device holding [addr, addr + len), or -1; *host: whether it is a client's host memory.
  int FindDevice(const char* addr, uint64_t len, bool* host) ABSL_LOCKS_EXCLUDED(mu);
  // For a ticket-only job without memory: the only GPU with a bound ticket slot, or -1.
  int OnlySemaphoreDevice() ABSL_LOCKS_EXCLUDED(mu);
  std::shared_ptr<Lane> FindLane(int device, Direction direction) ABSL_LOCKS_EXCLUDED(mu);
  std::vector<std::shared_ptr<Lane>> AllLanes() ABSL_LOCKS_EXCLUDED(mu);

  const uint64_t id;
  const std::string label;
  const uint32_t uid;
  ring::TicketPage* const tickets;
  const std::shared_ptr<const void> tickets_owner;
  std::atomic<bool> abandoned{false};

  // The ticket page's registration, made by the first slot bound (registration only: never
  // taken by the job path, since registering is a setup call). Held alone.
  Mutex pin_mu;
  std::weak_ptr<TicketPagePin> ticket_pin ABSL_GUARDED_BY(pin_mu);

  // Under it: a lane's lock (binding a ticket slot sets the GPU's lanes' ticket words).
  Mutex mu ABSL_ACQUIRED_BEFORE(Lane::mu);
  struct Range {
    uintptr_t end = 0;
    int device = -1;
    int refs = 0;
    bool host = false;  // a client's host memory (ImportHost)
  };
  std::map<uintptr_t, Range> ranges ABSL_GUARDED_BY(mu);  // imported buffers by base address
  std::map<int, DeviceLanes> devices ABSL_GUARDED_BY(mu);
};

class GpuSession final : public EngineSession {
 public:
  GpuSession(JobIntake& intake, std::shared_ptr<SessionState> state)
      : intake_(intake), state_(std::move(state)) {}
  ~GpuSession() override;  // abandons the session (JobIntake::Abandon)
  SessionState& state() { return *state_; }
  const std::shared_ptr<SessionState>& shared() { return state_; }

 private:
  JobIntake& intake_;
  std::shared_ptr<SessionState> state_;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_GPU_SESSION_H_
