// The GPU ordering protocol between a client's streams and the daemon's copy streams: the
// tickets, the semaphore page's layout, and why the protocol cannot deadlock. One place for both
// sides: the client's GPU layer (client/gpu/device_sync.h) and the daemon's stream engine
// (engine/stream_engine.h) include it.
//
// TICKETS AND THE SEMAPHORE PAGE. Per session and per GPU the client keeps four monotonically
// increasing 64-bit counters:
//   produced      client -> daemon  offload sources are written, up to offload ticket k
//   reload_ready  client -> daemon  reload destinations may be written, up to reload ticket k
//   offload_done  daemon -> client  offload copies finished, up to offload ticket k
//   reload_done   daemon -> client  reload copies finished, up to reload ticket k
// The two client -> daemon counters live in the session ring's ticket page (tier/ring.h: host
// memory shared with the daemon, registered with the GPU runtime here so streams can write it):
// the daemon reads them on the host and issues job k's copy only once its ticket is there. The
// two daemon -> client counters live in the semaphore page, 4 KiB of device memory the client
// allocates and registers with the daemon (BufferKind kCudaSemaphores; the daemon opens it by
// IPC and writes it from its copy streams), so the client's streams wait on them on the GPU.
// Offloads and reloads are numbered separately, 1, 2, 3, ... (TicketOffload / TicketReload); the
// ticket travels in the ring entry's `sync` field.
//
// Offload k: the client's ticket stream (one internal non-blocking stream per GPU) waits for an
// event recorded on every producer stream, then writes produced = k. The daemon issues the D2H
// copy once it reads produced >= k, then its stream writes offload_done = k. Reload k: the ticket
// stream waits for an event recorded on the consumer stream (after the destination was allocated
// there), writes reload_ready = k; the consumer stream then waits reload_done >= k
// (WaitReloadDone), before tier_reload returns. The daemon issues the H2D copy once it reads
// reload_ready >= k; its stream writes reload_done = k. Because the ticket stream is one in-order
// stream, produced and reload_ready only grow; the daemon issues each lane's jobs in ticket
// order, so the done counters only grow.
//
// BATCHES (tier_offload_batch / tier_reload_batch). Several jobs of one GPU and direction may
// share one ticket k: the client takes it once (one producer wait, or one consumer point), writes
// produced/reload_ready = k once, and pushes all of the batch's entries, each carrying the
// batch's size (ring::BatchSizeFlags), before it enqueues any wait on k; it waits for ring room
// for the whole batch before taking the ticket, so no entry of a batch waits behind a completion
// of the same batch. The daemon treats the batch as one job of the protocol: it issues the copies
// only once every entry of the batch (and every smaller ticket) arrived, and writes done = k once,
// after the last copy. Each entry still completes on its own in the ring. Batching across
// tickets is not allowed: a client stream may wait on done k before it produces job k+1.
//
// WHY THIS CANNOT DEADLOCK. (1) No daemon stream waits for a client: the daemon issues a copy only
// after its ticket is visible, so everything queued on the daemon's streams finishes on its own
// (engine/stream_engine.h; the daemon's threads may block in the driver for a bounded time only).
// (2) The client enqueues `produced = k` / `reload_ready = k` on its ticket stream before it
// pushes job k (for a batch: all of its entries), and any wait of a client stream on a done
// counter is enqueued after that push.
// So, ordering the client's GPU operations by the time they were enqueued, every wait points at
// something enqueued earlier: a done value whose daemon copy needs only a ticket enqueued before
// the wait, or an event of work enqueued before. Induction on enqueue time: the earliest
// unfinished operation can always run, even where the GPU runs several streams on one hardware
// queue (an operation then also waits for whatever was enqueued before it on that queue, which
// is again earlier). (3) No client thread's progress is needed by a GPU stream: the streams wait
// only on values written by streams. A client thread may block (on tierd's reply, a lock, a
// synchronizing CUDA call such as cudaFree) without stalling anything a stream waits for.
//
// DEAD PEER. If the daemon dies, consumer streams wait on reload_done forever; the client library
// then calls ReleaseWaiters(), which sets offload_done and reload_done to kReleasedTicket from a
// fresh stream so no stream hangs, and reports the pending jobs failed. The page must stay
// allocated while the daemon may use it: free it (destroy the DeviceSync) only after the session
// closed or the daemon is known dead and ReleaseWaiters() returned.
#ifndef TIER_GPU_TICKET_PROTOCOL_H_
#define TIER_GPU_TICKET_PROTOCOL_H_

#include <cstdint>

namespace tier::gpu {

// Layout of the semaphore page: byte offsets of the 64-bit done counters (each on its own 64
// bytes).
inline constexpr uint64_t kSemaphorePageBytes = 4096;
// What the client allocates for it: a whole 2 MiB allocation, so that the IPC handle names
// exactly this allocation (small cudaMalloc blocks may share a larger driver allocation).
inline constexpr uint64_t kSemaphoreAllocBytes = 2 << 20;
inline constexpr uint64_t kOffloadDoneOffset = 64;
inline constexpr uint64_t kReloadDoneOffset = 192;
// Written to a counter to release every wait on it for good (a dead peer). CUDA's wait is a cyclic
// compare, (int64_t)(*addr - k) >= 0, so the release value is 2^63 - 1, not UINT64_MAX.
inline constexpr uint64_t kReleasedTicket = UINT64_MAX / 2;
// Tickets stay below this (the daemon rejects larger ones), far from the cyclic compare's wrap.
inline constexpr uint64_t kMaxTicket = uint64_t{1} << 62;

}  // namespace tier::gpu

#endif  // TIER_GPU_TICKET_PROTOCOL_H_
