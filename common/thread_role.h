// Which kind of tierd thread is running: the rule of engine/stream_engine.h ("which thread may make
// which GPU runtime call") is stated per role and checked against it (GpuCallClass).
#ifndef TIER_COMMON_THREAD_ROLE_H_
#define TIER_COMMON_THREAD_ROLE_H_

#include <cstdint>

namespace tier {

enum class ThreadRole : uint8_t {
  kOther = 0,      // main, gRPC, the session listener (registration), tests
  kDeviceWorker,   // a GPU engine's worker: issues and completes one GPU's jobs
  kReleaser,       // a GPU engine's release thread
  kRingPoller,     // the daemon's ring poller: takes jobs off every session's ring
  kSpillIo,        // the NVMe tier's I/O thread(s)
};

// The runtime calls of engine/stream_engine.h's GpuRuntime, by what they may do to the caller.
enum class GpuCallClass : uint8_t {
  kEnqueue,  // queue work on a stream, query it: never waits for the GPU
  kSetup,    // create streams, open client memory, pin host memory: may take driver locks
  kRelease,  // destroy streams, close client memory, unpin: may wait for the GPU (implicitly)
};

void SetThreadRole(ThreadRole role);
ThreadRole CurrentThreadRole();
const char* ThreadRoleName(ThreadRole role);
const char* GpuCallClassName(GpuCallClass call);

// The rule: device workers make enqueue calls (and nothing else); only the release thread makes
// release calls; setup calls come from registration (the listener) or start-up, never from a
// device worker, the release thread, the ring poller or the spill I/O threads; the ring poller and
// the spill I/O threads make no runtime call at all.
bool MayCall(ThreadRole role, GpuCallClass call);

}  // namespace tier

#endif  // TIER_COMMON_THREAD_ROLE_H_
