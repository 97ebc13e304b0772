// The GPU ordering protocol between a client's streams and the daemon's copy streams: the
// tickets, the ticket page's layout, and why the protocol cannot deadlock. One place for both
// sides: the client's GPU layer (client/gpu/device_sync.h) and the daemon's stream engine
// (engine/stream_engine.h) include it.
//
// TICKETS AND THE TICKET PAGE. Per session and per GPU the client keeps four monotonically
// increasing 64-bit counters, all in that GPU's slot of the session ring's ticket page
// (tier/ring.h: host memory shared by the client and the daemon, registered with the GPU runtime
// on both sides so that streams of either write and wait on it):
//   produced      client -> daemon  offload sources are written, up to offload ticket k
//   reload_ready  client -> daemon  reload destinations may be written, up to reload ticket k
//   offload_done  daemon -> client  offload copies finished, up to offload ticket k
//   reload_done   daemon -> client  reload copies finished, up to reload ticket k
// The daemon reads the two client -> daemon counters on the host and issues job k's copy only
// once its ticket is there; its copy streams write the two daemon -> client counters, and the
// client's streams wait on those on the GPU. The client tells the daemon which of the daemon's
// GPUs a slot belongs to by registering it (BufferKind kCudaSemaphores: the GPU's UUID and the
// client's ordinal, no memory handle). Offloads and reloads are numbered separately, 1, 2, 3, ...
// (TicketOffload / TicketReload); the ticket travels in the ring entry's `sync` field.
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
// DEAD PEER. If the daemon dies, consumer streams wait on reload_done (and freeing streams on
// offload_done) forever; the client library then stores kReleasedTicket into both done words of
// every slot (ReleaseWaiters): a plain CPU store into host memory, which the GPU's waits read.
// It makes no GPU runtime call on purpose: a launch stuck behind one of those waits (its
// stream's queue full) holds a driver lock that any runtime call may need, so a release that
// called the runtime could deadlock with the very launch it must free (seen: stream creation in
// the release path, blocked on the lock a stuck cuLaunchKernel held). A copy the dying daemon had
// queued may still land its done write after the store; the client stores again for a while
// after the death, so a stale write cannot re-close the gate.
#ifndef TIER_GPU_TICKET_PROTOCOL_H_
#define TIER_GPU_TICKET_PROTOCOL_H_

#include <cstdint>

namespace tier::gpu {

// Written to a counter to release every wait on it for good (a dead peer). CUDA's wait is a cyclic
// compare, (int64_t)(*addr - k) >= 0, so the release value is 2^63 - 1, not UINT64_MAX.
inline constexpr uint64_t kReleasedTicket = UINT64_MAX / 2;
// Tickets stay below this (the daemon rejects larger ones), far from the cyclic compare's wrap.
inline constexpr uint64_t kMaxTicket = uint64_t{1} << 62;

}  // namespace tier::gpu

#endif  // TIER_GPU_TICKET_PROTOCOL_H_
