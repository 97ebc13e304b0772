// PersistentStore's batch thread (daemon/persistent/persistent_store.h): takes the queued puts
// and deletes in batches and drives the journal's appends, syncs and compactions; the journal's
// writes and flushes run on the spill store's I/O thread (daemon/persistent/journal_file.h).
#include <sys/mman.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/persistent/persistent_store.h"

namespace tier::daemon {
namespace {

// A batch: at most this many objects or bytes before the sync, so that a delete queued
// behind a flood of writes waits for one bounded batch, not the flood.
constexpr size_t kBatchObjects = 4096;
constexpr uint64_t kBatchBytes = 64ull << 20;
// Objects up to kGroupObjectBytes in host memory are appended in groups of up to kGroupBytes: one
// wait for the device per group, not per object (the journal's writes are direct: each append
// waits until its bytes are on the device).
constexpr uint64_t kGroupObjectBytes = 1ull << 20;
constexpr uint64_t kGroupBytes = 8ull << 20;

}  // namespace

void PersistentStore::Enqueue(JournalOp op) {
  Done refused;
  {
    MutexLock lock(&batch_mu_);
    if (batcher_exited_ || journal_ == nullptr) {
      refused = std::move(op.done);  // (shut down: nothing will write it)
    } else {
      if (op.object == nullptr) {
        deletes_.push_back(std::move(op));
      } else {
        auto& queue = puts_[op.key.uid];
        if (queue.empty()) turns_.push_back(op.key.uid);
        queue.push_back(std::move(op));
      }
      ++queued_;
      batch_cv_.SignalAll();
      return;
    }
  }
  if (refused) refused(absl::UnavailableError("tierd is stopping: the journal is closed"));
}

void PersistentStore::RunBatcher() {
  for (;;) {
    std::vector<JournalOp> deletes;
    std::vector<JournalOp> puts;
    {
      MutexLock lock(&batch_mu_);
      while (queued_ == 0 && !stop_) batch_cv_.Wait(&batch_mu_);
      if (queued_ == 0) {  // stopping, and everything queued is written
        batcher_exited_ = true;
        return;
      }
      while (!deletes_.empty()) {
        deletes.push_back(std::move(deletes_.front()));
        deletes_.pop_front();
        --queued_;
      }
      uint64_t bytes = 0;
      while (!turns_.empty() && puts.size() < kBatchObjects && bytes < kBatchBytes) {
        const uid_t uid = turns_.front();
        turns_.pop_front();
        auto queue = puts_.find(uid);
        bytes += queue->second.front().object->len();
        puts.push_back(std::move(queue->second.front()));
        queue->second.pop_front();
        --queued_;
        if (queue->second.empty()) {
          puts_.erase(queue);
        } else {
          turns_.push_back(uid);  // round robin: one object per uid per turn
        }
      }
    }
    WriteBatch(std::move(deletes), std::move(puts));
  }
}

void PersistentStore::WriteBatch(std::vector<JournalOp> deletes, std::vector<JournalOp> puts) {
  // Journal work here, on this thread only (its writes and flushes run on the spill store's I/O
  // thread, which this one waits for): never on a job's or the listener's path.
  std::vector<absl::Status> ended;
  ended.reserve(deletes.size());
  for (const JournalOp& op : deletes) {
    ended.push_back(journal_->AppendDelete(op.key.uid, op.key.name));
  }
  struct Appended {
    const Key* key;
    uint64_t id;
  };
  std::vector<Appended> appended;
  size_t failed = 0;
  absl::Status first_failure;
  std::vector<std::optional<absl::Status>> results = AppendPuts(puts);
  for (size_t i = 0; i < puts.size(); ++i) {
    if (!results[i].has_value()) continue;  // not written: deleted or replaced while queued
    const JournalOp& op = puts[i];
    const absl::Status& written = *results[i];
    MutexLock lock(&mu_);
    auto it = entries_.find(op.key);
    if (it != entries_.end() && it->second.id == op.id) {
      it->second.written = written.ok() ? Written::kYes : Written::kNo;
      if (written.ok()) appended.push_back(Appended{&op.key, op.id});
    }
    // (Deleted while being written: that delete saw kWriting and queued its own record, which
    // comes after this one.)
    if (!written.ok() && !absl::IsNotFound(written)) {
      if (failed++ == 0) first_failure = written;
    }
  }
  absl::Status synced;
  if (!deletes.empty() || !appended.empty()) synced = journal_->Sync();
  if (failed > 0) {
    LogError(failed, " persistent objects not written to NVMe (they will not survive a restart "
             "of tierd), first: ", first_failure.ToString());
  }
  if (!synced.ok()) {
    LogError("persistent journal: ", synced.ToString(), ": the last ", appended.size(),
             " objects and ", deletes.size(), " deletes may not be on NVMe");
  } else if (!appended.empty()) {
    MutexLock lock(&mu_);
    for (const Appended& a : appended) {
      auto it = entries_.find(*a.key);
      if (it != entries_.end() && it->second.id == a.id) it->second.durable = true;
    }
  }
  for (size_t i = 0; i < deletes.size(); ++i) {
    absl::Status answer = ended[i].ok() ? synced : ended[i];
    if (!answer.ok()) {
      answer = absl::Status(answer.code(),
                            absl::StrCat("deleted, but the deletion may not be on NVMe (it may "
                                         "come back after a crash): ", answer.message()));
    }
    if (deletes[i].done) deletes[i].done(answer);
  }
  if (absl::Status s = journal_->CompactIfDue(); !s.ok()) {
    LogError("persistent journal: compaction failed (the journal keeps growing until it "
             "succeeds): ", s.ToString());
  }
}

bool PersistentStore::Claim(const JournalOp& op) {
  MutexLock lock(&mu_);
  auto it = entries_.find(op.key);
  // Deleted (or replaced) while queued: not written; its delete needed no record.
  if (it == entries_.end() || it->second.id != op.id || it->second.written != Written::kQueued) {
    return false;
  }
  it->second.written = Written::kWriting;
  return true;
}

std::vector<std::optional<absl::Status>> PersistentStore::AppendPuts(
    const std::vector<JournalOp>& puts) {
  std::vector<std::optional<absl::Status>> results(puts.size());
  // Small objects in host memory, pinned, waiting to go as one group (one wait for the device).
  std::vector<size_t> group;
  std::vector<PersistentJournal::Put> refs;
  uint64_t group_bytes = 0;
  auto flush = [&] {
    if (group.empty()) return;
    absl::Status status = journal_->AppendPuts(refs);
    for (size_t k = 0; k < group.size(); ++k) {
      // Refused for room as a group: one by one, so that those that fit get in.
      results[group[k]] = absl::IsResourceExhausted(status) && group.size() > 1
                              ? journal_->AppendPut(refs[k].uid, refs[k].name, refs[k].data,
                                                    refs[k].len)
                              : status;
    }
    for (size_t k : group) puts[k].table->Unpin(*puts[k].object);
    group.clear();
    refs.clear();
    group_bytes = 0;
  };
  for (size_t i = 0; i < puts.size(); ++i) {
    const JournalOp& op = puts[i];
    if (!Claim(op)) continue;
    const uint64_t len = op.object->len();
    // Pinned while its bytes are copied: it cannot be spilled or freed under the copy.
    absl::StatusOr<ObjectTable::CopySource> source = op.table->PinForCopy(*op.object);
    if (!source.ok()) {
      results[i] = absl::NotFoundError(source.status().message());
      continue;
    }
    if (source->on_nvme || len > kGroupObjectBytes) {
      op.table->Unpin(*op.object);
      flush();  // (records keep the batch's order)
      results[i] = AppendObject(op);
      continue;
    }
    if (group_bytes + len > kGroupBytes) flush();
    group.push_back(i);
    refs.push_back({op.key.uid, op.key.name, tiers_.pool().At(source->extent), len});
    group_bytes += len;
  }
  flush();
  return results;
}

absl::Status PersistentStore::AppendObject(const JournalOp& op) {
  const uint64_t len = op.object->len();
  for (int attempt = 0; attempt < 3; ++attempt) {
    // Pinned only while its bytes are copied: it cannot be spilled or freed under the copy.
    absl::StatusOr<ObjectTable::CopySource> source = op.table->PinForCopy(*op.object);
    if (!source.ok()) return absl::NotFoundError(source.status().message());
    absl::Status status;
    bool again = false;
    if (!source->on_nvme) {
      status = journal_->AppendPut(op.key.uid, op.key.name,
                                   tiers_.pool().At(source->extent), len);
    } else {
      // Spilled before its turn came: read back from the spill store into a buffer of its own
      // (the host pool may have no room; the copy is transient and one object at a time).
      const uint64_t bytes = (len + 4095) & ~uint64_t{4095};
      void* buffer = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (buffer == MAP_FAILED) {
        status = absl::ResourceExhaustedError("no memory to read a spilled object back");
      } else {
        NvmeTransfers* nvme = tiers_.nvme();
        status = nvme == nullptr
                     ? absl::InternalError("object on NVMe without an NVMe tier")
                     : nvme->store().ReadAndWait(source->record, static_cast<char*>(buffer));
        // NOT_FOUND: fetched back meanwhile (its record went); it is in host memory now.
        again = absl::IsNotFound(status);
        if (status.ok()) {
          status = journal_->AppendPut(op.key.uid, op.key.name, static_cast<char*>(buffer), len);
        }
        ::munmap(buffer, bytes);
      }
    }
    op.table->Unpin(*op.object);  // (what it releases goes back at once)
    if (!again) return status;
  }
  return absl::UnavailableError("the object kept moving between tiers");
}

}  // namespace tier::daemon
