// One small interface for asynchronous block I/O on files, with interchangeable engines behind it
// (the shape of NIXL's POSIX storage plugin): io_uring (UringIoQueue), pread/pwrite on worker
// threads (ThreadPoolIoQueue), and a fault-injecting wrapper for tests (FaultyIoQueue). The caller
// never knows which engine runs; MakeIoQueue picks one.
//
// Life of a request: Enqueue (validated, queued locally) -> Submit (handed to the engine) ->
// Poll (its IoCompletion comes back exactly once). At most depth() requests are outstanding
// (enqueued and not yet returned by Poll); Enqueue beyond that is refused with RESOURCE_EXHAUSTED.
//
// Short transfers are the queue's business, not the caller's: when the kernel moves fewer bytes
// than asked, the queue resubmits the remainder itself. So an OK completion always means all `len`
// bytes moved. A non-OK completion carries the error and, in `bytes`, how many bytes did move
// before it (a read that meets end of file after a partial transfer is OUT_OF_RANGE with bytes < len;
// a write that makes no progress is an EIO-style error).
//
// Thread-safety: one thread owns a queue (Enqueue, Submit, Poll, Register*); only Wake() may be
// called from any thread. Destroying a queue waits for the requests it has in flight, so no I/O
// touches a buffer after the queue is gone.
#ifndef TIER_STORAGE_IO_QUEUE_H_
#define TIER_STORAGE_IO_QUEUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tier::storage {

// kSync: fdatasync of the file (buf and len unused): it covers the writes that completed before
// it was enqueued, not those still in flight (the caller orders them).
enum class IoOp : uint8_t { kRead, kWrite, kSync };

// A region of memory the engine may pin once and then reference without per-request cost
// (io_uring fixed buffers). Typically the whole pinned host pool.
struct IoBuffer {
  void* base = nullptr;
  uint64_t len = 0;
};

// IoRequest::offset for pipes and other unseekable files: read or write at the current position.
inline constexpr uint64_t kCurrentPosition = ~uint64_t{0};

struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;        // an index returned by RegisterFile
  uint64_t offset = 0;  // bytes from the start of the file, or kCurrentPosition
  char* buf = nullptr;  // source (write) or destination (read); owned by the caller until completion
  uint64_t len = 0;     // bytes, > 0 (kSync: 0)
  uint64_t user_data = 0;  // returned untouched in the completion
};

struct IoCompletion {
  uint64_t user_data = 0;
  absl::Status status;  // OK: all `len` bytes transferred
  uint64_t bytes = 0;   // bytes transferred (== len when OK)
};

// INVALID_ARGUMENT for a read or write without a buffer or of len 0 (a kSync needs neither).
absl::Status CheckBuffer(const IoRequest& request);

class IoQueue {
 public:
  virtual ~IoQueue() = default;

  // Declares memory that requests' buffers will usually lie in. Call at most once, before the
  // first Enqueue. Engines without the notion accept and ignore it. An error leaves the queue
  // working with unregistered buffers (only slower).
  virtual absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) = 0;

  // Makes `fd` addressable by requests; returns its index. The caller keeps `fd` open for as long
  // as the queue lives.
  virtual absl::StatusOr<int> RegisterFile(int fd) = 0;
  // Forgets a file no request of which is outstanding (its index may be handed out again; the
  // queue holds no reference to the file after this).
  virtual absl::Status UnregisterFile(int index) = 0;

  // Queues a request locally (no system call). INVALID_ARGUMENT for an unknown file, a read or
  // write with a null buffer or len 0; RESOURCE_EXHAUSTED when depth() requests are already outstanding.
  virtual absl::Status Enqueue(const IoRequest& request) = 0;

  // Hands every queued request to the engine; returns how many it handed over. A transient
  // refusal by the kernel (EAGAIN/EBUSY/EINTR) leaves requests queued for the next Submit or Poll;
  // a request-specific error always arrives as that request's completion, never as a lost request.
  virtual int Submit() = 0;

  // Submits what is queued, then appends finished requests to `out` and returns how many it
  // appended. With wait=true it blocks until at least one completion arrives, Wake() is called,
  // or nothing is outstanding (then it returns 0 at once rather than block forever).
  virtual int Poll(std::vector<IoCompletion>* out, bool wait) = 0;

  // Thread-safe: makes a blocked Poll(wait=true) return (perhaps with nothing), or the next one
  // if none is blocked now.
  virtual void Wake() = 0;

  // Requests enqueued and not yet returned by Poll.
  virtual uint32_t outstanding() const = 0;
  virtual uint32_t depth() const = 0;
  // "io_uring", "thread_pool", or a wrapper's name.
  virtual std::string_view name() const = 0;
};

enum class IoQueueKind {
  kAuto,        // io_uring, else (io_uring_setup refused: ENOSYS, EPERM, ...) the thread pool
  kUring,       // io_uring or fail
  kThreadPool,  // pread/pwrite on worker threads
};

// "auto", "io_uring", "thread_pool".
bool ParseIoQueueKind(std::string_view text, IoQueueKind* out);
const char* IoQueueKindName(IoQueueKind kind);

// The most requests an io queue may hold outstanding (io_uring's ring is sized by it).
inline constexpr uint32_t kMaxIoQueueDepth = 4096;

struct IoQueueOptions {
  IoQueueKind kind = IoQueueKind::kAuto;
  uint32_t depth = 16;   // most requests outstanding at once, 1..kMaxIoQueueDepth
  uint32_t threads = 0;  // thread pool only; 0: one per depth slot, at most 64
};

// Creates the engine `options` asks for and logs which one runs (and why, on a fallback).
absl::StatusOr<std::unique_ptr<IoQueue>> MakeIoQueue(const IoQueueOptions& options);

}  // namespace tier::storage

#endif  // TIER_STORAGE_IO_QUEUE_H_
