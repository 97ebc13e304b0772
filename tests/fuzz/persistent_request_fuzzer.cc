// libFuzzer target: the session socket's persistent-object requests (wire::ObjectRequest: create,
// open, stat, release, delete) from several sessions of a few uids, interleaved with the job
// events around them (a bound id's offload landing, a free job, a session's end), handled as the
// session listener and the job executor hand them to a real PersistentStore over a small host
// pool (no journal: no disk I/O per input). After every step the store's bounds hold; at the end
// every byte is back in the pool, whatever came in between.
//
// Steps: one byte (the event; the caller's uid and session from its high bits), then the event's
// bytes: a whole ObjectRequest for requests, one byte (which binding) for the others.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "daemon/persistent/persistent_store.h"
#include "daemon/sessions/session_message.h"
#include "storage/host_pool.h"
#include "tier/session_wire.h"

namespace {

using namespace tier;
using namespace tier::daemon;

constexpr PersistentLimits kLimits{256 << 10, 512 << 10, 16, 40};
constexpr uid_t kUids[] = {0, 1000, 1001};

struct World {
  World() {
    storage::HostPoolOptions options;
    options.bytes = 4 << 20;
    options.lock = storage::LockMode::kOff;
    pool = *storage::HostPool::Create(options);
    tiers = std::make_unique<TierManager>(*pool, nullptr, SpillerOptions{});
    tiers->Start();
  }
  std::unique_ptr<storage::HostPool> pool;
  std::unique_ptr<TierManager> tiers;
};

World& TheWorld() {
  static World* world = new World;  // (one pool for every input)
  return *world;
}

struct Binding {
  ObjectSlot slot;
  uid_t uid = 0;
  uint64_t session = 0;
};

class Harness {
 public:
  explicit Harness(World& world) : world_(world), store_(*world.tiers, kLimits) {}
  ~Harness() {
    store_.DropAll();
    if (world_.pool->Usage().used_bytes != 0) std::abort();  // something leaked
  }

  void Request(uid_t uid, uint64_t session, const wire::ObjectRequest& request) {
    const void* nul = std::memchr(request.name, '\0', sizeof(request.name));
    if (nul == nullptr) return;  // (refused by the listener before the store)
    absl::string_view name(request.name, static_cast<const char*>(nul) - request.name);
    auto& bound = bindings_[session];
    switch (static_cast<wire::ObjectOp>(request.op)) {
      case wire::ObjectOp::kCreate:
      case wire::ObjectOp::kOpen: {
        if (request.object_id == 0 || bound.contains(request.object_id) || bound.size() >= 64) {
          return;  // (Session::CheckBindable)
        }
        uint64_t len = 0;
        absl::StatusOr<ObjectSlot> slot =
            request.op == static_cast<uint32_t>(wire::ObjectOp::kCreate)
                ? store_.Create(uid, name, session, request.len)
                : store_.Open(uid, name, &len);
        if (slot.ok()) bound[request.object_id] = Binding{*slot, uid, session};
        break;
      }
      case wire::ObjectOp::kStat:
        (void)store_.Stat(uid, name);
        break;
      case wire::ObjectOp::kRelease: {
        auto it = bound.find(request.object_id);
        if (it == bound.end()) return;
        const ObjectSlot slot = it->second.slot;
        bound.erase(it);
        store_.Released(session, slot);
        break;
      }
      case wire::ObjectOp::kDelete: {
        const uid_t owner = request.uid == wire::kCallerUid ? uid : request.uid;
        if (owner != uid && uid != 0) return;  // (refused by the listener)
        std::optional<absl::Status> answer =
            store_.Delete(owner, name, [](absl::Status) { std::abort(); });
        if (!answer.has_value()) std::abort();  // no journal: always answered at once
        break;
      }
      default:
        break;
    }
  }

  // The offload of a bound id lands (as an OffloadJob would), len 1..64 KiB.
  void Fill(uint64_t session, uint8_t which, uint8_t len_byte) {
    Binding* b = Pick(session, which);
    if (b == nullptr) return;
    const uint64_t len = 1 + (static_cast<uint64_t>(len_byte) << 8);
    absl::StatusOr<std::shared_ptr<Object>> object =
        b->slot.table->Create(b->slot.id, len, 0, 0, world_.tiers->Charge(len));
    if (!object.ok()) return;
    std::optional<storage::Extent> extent = world_.pool->Allocate(world_.tiers->Charge(len));
    absl::Status filled = extent ? b->slot.table->Admit(**object, *extent, world_.tiers->home())
                                 : absl::ResourceExhaustedError("pool");
    if (!filled.ok() && extent) world_.pool->Free(*extent);
    std::vector<ObjectWaiter> waiters;
    b->slot.table->EndFill(**object, filled, &waiters);
    if (filled.ok()) store_.Filled(b->slot.table, *object);
  }

  // A free job of a bound id (JobExecutor::Free).
  void Free(uint64_t session, uint8_t which) {
    Binding* b = Pick(session, which);
    if (b == nullptr) return;
    absl::StatusOr<Release> released = b->slot.table->Free(b->slot.id);
    if (!released.ok()) return;
    if (store_.Forget(b->slot.table, b->slot.id, [] { std::abort(); })) std::abort();
    // (`released` goes back when it goes out of scope, as in the executor.)
  }

  void End(uint64_t session) {
    bindings_.erase(session);
    store_.SessionEnded(session);
  }

  void Check() {
    const PersistentUsage usage = store_.usage();
    if (usage.objects > kLimits.max_objects || usage.bytes > kLimits.max_bytes) std::abort();
    for (auto& [session, bound] : bindings_) {
      for (auto& [id, b] : bound) {
        if (b.slot.table->used_bytes() > kLimits.quota_bytes_per_uid) std::abort();
      }
    }
  }

 private:
  Binding* Pick(uint64_t session, uint8_t which) {
    auto& bound = bindings_[session];
    if (bound.empty()) return nullptr;
    auto it = bound.begin();
    std::advance(it, which % bound.size());
    return &it->second;
  }

  World& world_;
  PersistentStore store_;
  std::map<uint64_t, std::map<uint64_t, Binding>> bindings_;  // session -> object id -> slot
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  Harness harness(TheWorld());
  size_t i = 0;
  while (i < size) {
    const uint8_t step = bytes[i++];
    const uid_t uid = kUids[(step >> 3) % 3];
    const uint64_t session = 1 + ((step >> 5) % 4);
    switch (step & 7) {
      case 0: case 1: case 2: case 3: {
        wire::ObjectRequest request{};
        const size_t n = std::min(sizeof(request), size - i);
        std::memcpy(&request, bytes + i, n);  // (short at the end: zeros)
        i += n;
        if (!ParseMessage(absl::Span<const char>(reinterpret_cast<const char*>(&request),
                                                 sizeof(request)),
                          &request)) {
          std::abort();
        }
        harness.Request(uid, session, request);
        break;
      }
      case 4:
      case 5:
        if (i + 2 > size) return 0;
        harness.Fill(session, bytes[i], bytes[i + 1]);
        i += 2;
        break;
      case 6:
        if (i + 1 > size) return 0;
        harness.Free(session, bytes[i++]);
        break;
      default:
        harness.End(session);
        break;
    }
    harness.Check();
  }
  return 0;
}
