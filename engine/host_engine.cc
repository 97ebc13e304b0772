// The host engine: client buffers are shared-memory segments (memfds) the client registered; the
// daemon maps them and copies with memcpy. It is what runs where no GPU exists (this machine, CI),
// and it runs the whole daemon/client path the GPU engines use, with only the copy step different.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status.h"
#include "engine/copy_engine.h"
#include "engine/memfd_mapping.h"
#include "engine/memfd_mappings.h"

namespace tier::engine {
namespace {

// One registration: the first `bytes` of a memfd's mapping, which other registrations of the same
// memfd may share (memfd_mappings.h).
class MappedMemfd final : public ImportedBuffer {
 public:
  MappedMemfd(std::shared_ptr<MemfdMapping> mapping, uint64_t bytes, std::atomic<uint64_t>& live)
      : mapping_(std::move(mapping)), bytes_(bytes), live_(live) {
    live_.fetch_add(1);
  }
  ~MappedMemfd() override { live_.fetch_sub(1); }
  char* base() const override { return mapping_->base(); }
  uint64_t bytes() const override { return bytes_; }

 private:
  std::shared_ptr<MemfdMapping> mapping_;
  const uint64_t bytes_;
  std::atomic<uint64_t>& live_;
};

class HostSession final : public EngineSession {};

// A job whose source is still arriving (CopyJob::feed): copied in parts, each queued on the lane
// as soon as the feed has it in place. Guarded by the lane's mutex.
struct FedCopy {
  char* client = nullptr;
  const char* pool = nullptr;
  absl::AnyInvocable<void(absl::Status) &&> done;
  uint64_t queued = 0;       // bytes handed to parts so far
  uint32_t outstanding = 0;  // parts queued or running
  bool ended = false;        // the feed ended
  absl::Status status;       // its end
  bool finished = false;     // done was taken
};

// One direction's queue and workers. Jobs start in submission order; the parts of a fed job start
// as their bytes arrive.
class CopyLane {
 public:
  CopyLane(int threads, uint64_t inline_max_bytes, uint64_t delay_us)
      : inline_max_bytes_(inline_max_bytes), delay_us_(delay_us) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~CopyLane() { Shutdown(); }

  void Submit(CopyJob job) {
    if (job.feed != nullptr && job.len > 0) {
      SubmitFed(std::move(job));
      return;
    }
    bool stopping = false;
    {
      MutexLock lock(&mu_);
      stopping = stopping_;
      // Small copies run right here when nothing is queued ahead of them: no thread hand-off,
      // which is most of a small job's latency.
      if (!stopping && !(job.len <= inline_max_bytes_ && queue_.empty() && delay_us_ == 0)) {
        queue_.push_back(Item{std::move(job), nullptr, 0, 0});
        cv_.Signal();
        return;
      }
    }
    if (stopping) {
      std::move(job.done)(absl::UnavailableError("copy engine is shut down"));
      return;
    }
    Run(job);
  }

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.SignalAll();
    for (std::thread& t : workers_) t.join();
  }

 private:
  struct Item {
    CopyJob job;                     // a whole job, or
    std::shared_ptr<FedCopy> fed;    // a part [begin, end) of a fed one
    uint64_t begin = 0;
    uint64_t end = 0;
  };

  void SubmitFed(CopyJob job) {
    auto fed = std::make_shared<FedCopy>();
    fed->client = job.client;
    fed->pool = job.pool;
    fed->done = std::move(job.done);
    std::shared_ptr<SourceFeed> feed = std::move(job.feed);
    // Runs on the producer's thread under the feed's lock: queue what arrived, never copy here.
    feed->Subscribe([this, fed](uint64_t ready, bool ended, const absl::Status& status) {
      absl::AnyInvocable<void(absl::Status) &&> finish;
      absl::Status result;
      {
        MutexLock lock(&mu_);
        if (fed->finished) return;
        if (ended) {
          fed->ended = true;
          fed->status = status;
        }
        if (stopping_) {
          // Workers may be gone: nothing more is copied.
          if (!fed->ended) return;
          fed->finished = true;
          finish = std::move(fed->done);
          result = fed->status.ok() ? absl::UnavailableError("copy engine is shut down")
                                    : fed->status;
        } else {
          if (fed->status.ok() && ready > fed->queued) {
            queue_.push_back(Item{CopyJob{}, fed, fed->queued, ready});
            fed->queued = ready;
            ++fed->outstanding;
            cv_.Signal();
          }
          if (fed->ended && fed->outstanding == 0) {
            // Nothing left to copy: a worker reports it, outside the feed's lock.
            queue_.push_back(Item{CopyJob{}, fed, 0, 0});
            ++fed->outstanding;
            cv_.Signal();
          }
        }
      }
      if (finish) std::move(finish)(std::move(result));
    });
  }

  void RunPart(Item& item) {
    FedCopy& fed = *item.fed;
    if (item.end > item.begin) {
      std::memcpy(fed.client + item.begin, fed.pool + item.begin, item.end - item.begin);
    }
    absl::AnyInvocable<void(absl::Status) &&> finish;
    absl::Status result;
    {
      MutexLock lock(&mu_);
      --fed.outstanding;
      if (fed.ended && fed.outstanding == 0 && !fed.finished) {
        fed.finished = true;
        finish = std::move(fed.done);
        result = fed.status;
      }
    }
    if (finish) std::move(finish)(std::move(result));
  }

  void Run(CopyJob& job) {
    if (job.len == 0) {  // ticket-only: nothing to copy, tickets mean nothing here
      std::move(job.done)(absl::OkStatus());
      return;
    }
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    if (job.direction == Direction::kToPool) {
      std::memcpy(job.pool, job.client, job.len);
    } else {
      std::memcpy(job.client, job.pool, job.len);
    }
    std::move(job.done)(absl::OkStatus());
  }

  void Work() {
    for (;;) {
      Item item;
      {
        MutexLock lock(&mu_);
        while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
        // Drain what is queued even when stopping: every job's callback must run.
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      if (item.fed != nullptr) {
        RunPart(item);
      } else {
        Run(item.job);
      }
    }
  }

  const uint64_t inline_max_bytes_;
  const uint64_t delay_us_;
  // A leaf: copies and callbacks run with it released. Also guards the FedCopy records.
  Mutex mu_;
  CondVar cv_;  // work queued, or stopping
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

class HostEngine final : public CopyEngine {
 public:
  explicit HostEngine(const HostEngineOptions& options)
      : to_pool_(options.threads_per_direction, options.inline_max_bytes, options.copy_delay_us),
        from_pool_(options.threads_per_direction, options.inline_max_bytes,
                   options.copy_delay_us) {}

  absl::string_view name() const override { return "host"; }

  absl::Status RegisterPool(char*, uint64_t) override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<EngineSession>> OpenSession(const EngineSessionInfo&) override {
    return std::make_unique<HostSession>();
  }
  void AbandonSession(EngineSession*) override {}

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(EngineSession*,
                                                         BufferImport import) override {
    if (import.kind != wire::BufferKind::kHostMemfd) {
      return absl::UnimplementedError(
          "the host engine copies only host memory (memfd buffers); this daemon has no GPU engine");
    }
    if (import.bytes == 0) return absl::InvalidArgumentError("host buffer of 0 bytes");
    absl::StatusOr<std::shared_ptr<MemfdMapping>> mapping = mappings_.Get(import.fd, import.bytes);
    if (!mapping.ok()) return mapping.status();
    return std::make_unique<MappedMemfd>(*std::move(mapping), import.bytes, live_buffers_);
  }

  void Submit(CopyJob job) override {
    (job.direction == Direction::kToPool ? to_pool_ : from_pool_).Submit(std::move(job));
  }

  void Shutdown() override {
    to_pool_.Shutdown();
    from_pool_.Shutdown();
  }

  EngineCounts Counts() const override {
    EngineCounts c;
    c.buffers = live_buffers_.load();
    return c;
  }

 private:
  std::atomic<uint64_t> live_buffers_{0};
  MemfdMappings mappings_;
  CopyLane to_pool_;
  CopyLane from_pool_;
};

}  // namespace

std::unique_ptr<CopyEngine> MakeHostEngine(const HostEngineOptions& options) {
  return std::make_unique<HostEngine>(options);
}

}  // namespace tier::engine
