// Messages on the session socket (SOCK_SEQPACKET, next to the gRPC socket).
//
// This socket carries what gRPC cannot: file descriptors (SCM_RIGHTS) and the peer's kernel
// credentials (SO_PEERCRED). Its lifetime is the session's: when the client process dies the kernel
// closes it and the daemon cleans the session up; when the daemon dies the client sees the hang-up
// and fails its pending jobs. All messages are fixed-size, little-endian host structs (both ends
// run on the same machine); every field the daemon receives is validated.
//
// Exchange: the client sends AttachRequest; the daemon answers AttachReply with three fds (ring
// memfd, submission doorbell, completion doorbell). After that the client sends
// requests (register/extend/unregister/object) one at a time and waits for each reply.
#ifndef TIER_SESSION_WIRE_H_
#define TIER_SESSION_WIRE_H_

#include <cstdint>

namespace tier::wire {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxMessageBytes = 512;
// Descriptors per message: kCudaVmmPages carries up to 8, a segment's register or extend message
// up to kMaxSegmentPagesPerMessage (SCM_RIGHTS allows 253).
inline constexpr size_t kMaxFds = 64;

enum class MessageType : uint32_t {
  kAttachRequest = 1,
  kAttachReply = 2,
  kRegisterBuffer = 3,
  kRegisterBufferReply = 4,
  kUnregisterBuffer = 5,
  kUnregisterBufferReply = 6,
  kObjectRequest = 7,  // named, persistent objects (ObjectRequest)
  kObjectReply = 8,
  kExtendBuffer = 9,  // more pages for a kCudaVmmSegment registration (ExtendBuffer)
  kExtendBufferReply = 10,
};

struct MessageHeader {
  uint32_t type;  // MessageType
  uint32_t version;
  uint64_t request_id;
};

struct AttachRequest {
  MessageHeader header;
  uint64_t session_id;
  uint8_t token[16];
};

struct Reply {
  MessageHeader header;
  int32_t status;  // tier_status
  uint32_t reserved;
  char message[160];  // NUL-terminated; empty on success
};

struct AttachReply {
  Reply reply;
  uint64_t ring_bytes;  // size of the ring memfd
  uint64_t quota_bytes;
  uint32_t ring_entries;
  uint32_t reserved;
  char engine[16];
  // fds: [0] ring memfd, [1] submission doorbell, [2] completion doorbell. The doorbells are the
  // client's ends of two Unix stream socket pairs: send 8 bytes to ring (MSG_NOSIGNAL), read to
  // clear. (They were eventfds, whose O_NONBLOCK the client shared with the daemon; a client
  // written for those works unchanged.)
};

enum class BufferKind : uint32_t {
  kHostMemfd = 1,     // fd: a memfd sealed with F_SEAL_SHRINK, at least `bytes` long
  kCudaIpc = 2,       // handle: cudaIpcMemHandle_t of an allocation base, `bytes` its size
  kCudaVmmFd = 3,     // fd: POSIX fd shareable handle of a VMM allocation of `bytes`
  // No fd, no handle: the client's GPU `device` (its ordinal: the ticket page slot) is the daemon's
  // GPU of `device_uuid`; that slot's done words are written by the daemon's streams for that GPU
  // (gpu/ticket_protocol.h). `bytes` must be 0.
  kCudaSemaphores = 4,
  // fds: POSIX fd shareable handles of 1..kMaxVmmPages VMM allocations mapped side by side in the
  // client (PyTorch expandable segments), in address order; handle: their sizes as little-endian
  // uint64 (unused slots 0); `bytes` their sum. The daemon maps them side by side too.
  kCudaVmmPages = 5,
  // An expandable segment, registered once and grown in place: fds: POSIX fd shareable handles of
  // 1..kMaxSegmentPagesPerMessage VMM allocations of one size mapped side by side in the client
  // (a run of an expandable segment's pages), in address order; handle: SegmentLayout; `bytes`:
  // page_bytes * page_count. The daemon reserves reserve_bytes of address space and maps the
  // pages from its start; ExtendBuffer maps more after them (the allocator mapped more pages, or
  // the segment had more than one message carries), so the buffer id and every offset in it stay.
  kCudaVmmSegment = 6,
};

inline constexpr size_t kMaxVmmPages = 8;
inline constexpr size_t kMaxSegmentPagesPerMessage = kMaxFds;
inline constexpr uint64_t kMaxSegmentPageBytes = uint64_t{1} << 40;
// Address space tierd reserves for one segment, at most (PyTorch reserves about 1.125 times the
// GPU's memory per segment).
inline constexpr uint64_t kMaxSegmentReserveBytes = uint64_t{1} << 42;

// RegisterBuffer.handle of a kCudaVmmSegment.
struct SegmentLayout {
  uint64_t page_bytes;     // every page's size (PyTorch: 2 MiB small, 20 MiB large pages)
  uint64_t reserve_bytes;  // how far it may grow: >= bytes, whole pages, <= kMaxSegmentReserveBytes
  uint32_t page_count;     // pages (and fds) in this message
  uint32_t reserved;       // 0
};

struct RegisterBuffer {
  MessageHeader header;
  uint32_t kind;  // BufferKind
  int32_t device;  // GPU ordinal in the client's view (kCuda*); -1 for host
  uint64_t bytes;
  uint8_t handle[64];  // kCudaIpc
  uint8_t device_uuid[16];  // kCuda*: identifies the GPU independent of CUDA_VISIBLE_DEVICES
};

struct RegisterBufferReply {
  Reply reply;
  uint64_t buffer_id;
};

// Appends pages to a kCudaVmmSegment registration: they are mapped at `offset` (which must be
// the registration's size now) and after, in address order, one fd each; all of the segment's
// page size; within its reservation. The reply carries the registration's size after it. On an
// error nothing was added.
struct ExtendBuffer {
  MessageHeader header;
  uint64_t buffer_id;
  uint64_t offset;
  uint64_t page_bytes;
  uint32_t page_count;  // 1..kMaxSegmentPagesPerMessage
  uint32_t reserved;    // 0
};

struct ExtendBufferReply {
  Reply reply;
  uint64_t bytes;
};

struct UnregisterBuffer {
  MessageHeader header;
  uint64_t buffer_id;
};

struct UnregisterBufferReply {
  Reply reply;
};

// Named, persistent objects (daemon/persistent/persistent_store.h). Names live in the namespace of the
// caller's uid (SO_PEERCRED of this socket); another uid's names are NOT_FOUND.
enum class ObjectOp : uint32_t {
  // Binds the session's `object_id` to a new persistent object `name`: the session's next
  // offload of that id fills it, and it then outlives the session. ALREADY_EXISTS.
  kCreate = 1,
  // Binds `object_id` to the existing persistent object `name` (reload it, free it = delete it);
  // the reply carries its length. NOT_FOUND.
  kOpen = 2,
  // Deletes `name` of `uid` (kCallerUid: the caller's own; another uid only for root). NOT_FOUND.
  kDelete = 3,
  // The state of `name` (length, ready, durable) without binding an id. NOT_FOUND.
  kStat = 4,
  // Drops the session's binding of `object_id` (made by kCreate or kOpen); the object stays.
  // A job that starts on that id afterwards finds no object. NOT_FOUND when it is not bound.
  kRelease = 5,
};
// ObjectReply.flags (kOpen, kStat).
inline constexpr uint32_t kObjectReady = 1;      // its offload landed: it can be reloaded
inline constexpr uint32_t kObjectDurable = 2;    // written through to NVMe: survives a restart
inline constexpr uint32_t kObjectJournaled = 4;  // this tierd writes persistent objects through
inline constexpr uint32_t kCallerUid = 0xffffffffu;
inline constexpr size_t kObjectNameBytes = 128;  // names up to 127 bytes, NUL-terminated

struct ObjectRequest {
  MessageHeader header;
  uint32_t op;  // ObjectOp
  uint32_t uid;  // kDelete; kCallerUid otherwise
  uint64_t object_id;  // kCreate, kOpen
  uint64_t len;  // kCreate: the offload's length (checked against the uid's quota at once)
  char name[kObjectNameBytes];
};

struct ObjectReply {
  Reply reply;
  uint64_t len;  // kOpen, kStat: the object's length in bytes
  uint32_t flags;  // kOpen, kStat: kObjectReady | kObjectDurable | kObjectJournaled
  uint32_t reserved;
};

static_assert(sizeof(AttachReply) <= kMaxMessageBytes);
static_assert(sizeof(ObjectRequest) <= kMaxMessageBytes);
static_assert(sizeof(RegisterBuffer) <= kMaxMessageBytes);
static_assert(sizeof(ExtendBuffer) <= kMaxMessageBytes);
static_assert(sizeof(SegmentLayout) <= sizeof(RegisterBuffer::handle));

}  // namespace tier::wire

#endif  // TIER_SESSION_WIRE_H_
