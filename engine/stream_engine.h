// The GPU copy engine's runtime-neutral core, shared by CUDA and HIP (engine/gpu_engine.h). It
// holds what is the same on both: per-session lanes, ticket ordering, issue and completion, delay
// injection, abandoning sessions. The runtime behind it is reached only through GpuRuntime
// (engine/gpu_runtime.h; implemented in portable_runtime.*, cuda_engine.cc, cuda_vmm.*,
// hip_engine.cc), so none of the files below includes a GPU header.
//
// Where a change goes:
//   stream_engine.cc     the CopyEngine facade: hands each call to its part; shutdown, diagnostics
//   gpu_imports.*        client memory opened for a session (IPC, VMM pages and segments, host
//                        memfds), the ticket slot binding and the ticket page's pin; lane creation
//   gpu_session.*        a session's imported ranges and lanes (SessionState), its EngineSession
//   job_intake.*         Submit: a job's GPU and lane, ticket order (held tickets), Abandon
//   lane.*, lane_jobs.*  a lane and the records of its jobs (held, queued, pending)
//   lane_words.*         the lanes' completion words in mapped host memory
//   lane_runner.h        a worker's pass over one lane: lane_issue.cc, lane_complete.cc
//   pool_writes.*        offload -> reload ordering on the same pool bytes
//   device_worker.*      one GPU's thread: which lanes to serve, waiting, backoff
//   gpu_set.*            the GPUs met so far: their workers and link meters
//   link_share.*         the lane window's policy (pure); link_meter.*: a link's measured rate
//   runtime_call_rule.*  the thread rule below, checked at the engine's setup calls
//
// Locks (tier::Mutex; clang checks ABSL_GUARDED_BY, and with -Wthread-safety-beta on tier_engine
// the order ABSL_ACQUIRED_BEFORE declares):
//   StreamEngine::mu_ -> SessionState::mu -> Lane::mu
//   GpuSet::mu_ -> DeviceWorker::mu_ -> Lane::mu
//   Lane::mu -> a PoolWrites shard's mu, LinkMeter::mu_, SourceFeed::mu_ (leaves)
//   SessionState::pin_mu, HostWordPool::mu_, ReleaseThread::mu_: held alone.
// No lock is held while a job's callback runs or while a release call is made.
//
// Per session and per GPU the engine keeps two lanes (D2H = kToPool, H2D = kFromPool), each an
// own non-blocking stream. One worker thread per GPU issues and completes the jobs of that GPU's
// lanes; Submit (the ring poller) only queues. Job k of a lane is issued once the client's ticket
// for it is in the session's ticket page (tier/ring.h: host memory the client's ticket stream
// writes after the job's producers, or its consumer's allocation point), and then, with no host
// synchronization between jobs, the lane's stream runs
//   [wait(writer lane completed >= s)]   H2D only: a D2H copy into the same pool bytes, issued
//   copy                                 (fed reloads: one copy per chunk, issued as chunks land)
//   write(ticket page[done] = k)         host memory shared with the client: releases its streams
//   write(completed = seq)               host-mapped word the worker reads for completion
// `seq` is the lane's own job counter. A batch (the jobs of one ticket, CopyJob::batch_size) is
// issued once all of its jobs arrived: its copies in one CopyBatchAsync, then one done write. The
// completed write is made once per pass of the worker over the lane, for the last job issued in
// it (the word only grows, so it completes every job up to it).
//
// Sharing a GPU's link: the copy engine serves streams in the order copies were issued, so a
// session that queues 512 MiB ahead makes another session's 1 MiB job wait for all of it
// (measured: 3% of its fair share). While another lane of the GPU and direction has work (or had
// in the last 2 ms), a lane keeps at most GpuEngineOptions::lane_window_bytes issued and not
// completed, issues larger copies in chunks of a quarter of it, and writes `completed` after
// each piece so the window reopens as pieces land. A lane alone is not limited.
//
// WHY TIERD CANNOT DEADLOCK ON THE GPU (the rule, checked by the tests). A tierd stream waits on
// the GPU only for copies tierd has already issued (the pool-write wait above). Nothing queued on
// a tierd stream waits for a client, for a client's ticket, or for a word a tierd host thread is
// yet to write. So everything on tierd's streams finishes on its own in bounded time, whatever
// any client or tierd thread does. That matters because some runtime calls synchronize
// implicitly: closing an IPC mapping (cudaIpcCloseMemHandle), unmapping VMM memory, unpinning
// host memory wait until the device's queued work is done, and meanwhile hold a driver lock that
// every other runtime call of the process needs (measured: tests/gpu/cuda_blocking_probe.cc).
// Before, copies waited on the GPU for client tickets and delay-injection gates; a session's end
// closed its IPC mappings, which waited for those copies while holding the driver lock; the ring
// poller (issuing the reloads the clients' tickets waited behind) and the poller (opening the
// gates) blocked on that lock: a cycle, and every client hung in registration (issue 10). With
// the rule, such a call waits at most for copies already running.
// Which thread makes which runtime call (gpu/thread_role.h, MayCall): device workers only
// enqueue (copies, value writes, queries); setup calls (streams, opening client memory, pinning)
// come from registration, outside any lock the job path takes; release calls (closing client
// memory, unpinning, destroying streams) run on the engine's release thread only; the ring poller
// and the spill I/O threads make none. A blocked runtime call then delays only what it is for.
//
// Completion detection: the worker reads each busy lane's `completed` word (pinned host memory
// written by the stream: no runtime call, no driver lock), runs the callbacks of jobs up to it,
// spins briefly after progress and then backs off to short sleeps while its lanes have work. A
// lane whose issued jobs make no progress for watchdog_ms has its stream queried, which turns a
// stream error into failed jobs. A lane that waits lane_wait_warn_ms for a client's ticket logs
// it once; Lanes() reports every lane's wait (tierctl clients).
#ifndef TIER_ENGINE_STREAM_ENGINE_H_
#define TIER_ENGINE_STREAM_ENGINE_H_

#include <memory>

#include "engine/copy_engine.h"
#include "engine/gpu_runtime.h"

namespace tier::engine {

// The engine over `runtime` (name() is the runtime's).
std::unique_ptr<CopyEngine> MakeStreamEngine(std::unique_ptr<GpuRuntime> runtime,
                                             const GpuEngineOptions& options);

}  // namespace tier::engine

#endif  // TIER_ENGINE_STREAM_ENGINE_H_
