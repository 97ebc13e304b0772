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
// requests (register/unregister) one at a time and waits for each reply.
#ifndef TIER_SESSION_WIRE_H_
#define TIER_SESSION_WIRE_H_

#include <cstdint>

namespace tier::wire {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxMessageBytes = 512;
inline constexpr size_t kMaxFds = 8;  // kCudaVmmPages carries up to 8

enum class MessageType : uint32_t {
  kAttachRequest = 1,
  kAttachReply = 2,
  kRegisterBuffer = 3,
  kRegisterBufferReply = 4,
  kUnregisterBuffer = 5,
  kUnregisterBufferReply = 6,
  kObjectRequest = 7,  // named, persistent objects (ObjectRequest)
  kObjectReply = 8,
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
  kCudaSemaphores = 4,  // handle: cudaIpcMemHandle_t of a semaphore page (client/gpu/client_gpu.h)
  // fds: POSIX fd shareable handles of 1..kMaxVmmPages VMM allocations mapped side by side in the
  // client (PyTorch expandable segments), in address order; handle: their sizes as little-endian
  // uint64 (unused slots 0); `bytes` their sum. The daemon maps them side by side too.
  kCudaVmmPages = 5,
};

inline constexpr size_t kMaxVmmPages = 8;

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

struct UnregisterBuffer {
  MessageHeader header;
  uint64_t buffer_id;
};

struct UnregisterBufferReply {
  Reply reply;
};

// Named, persistent objects (daemon/persistent_store.h). Names live in the namespace of the
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

}  // namespace tier::wire

#endif  // TIER_SESSION_WIRE_H_
