// How tier_journal_bench opens a journal, as tierd does: PersistentJournal::Open in `dir`, its
// writes through a spill store (one small spill file beside it, the staging memory tierd gives).
#ifndef TIER_BENCH_JOURNAL_BENCH_OPEN_H_
#define TIER_BENCH_JOURNAL_BENCH_OPEN_H_

#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string>

#include "daemon/persistent/persistent_journal.h"
#include "storage/spill_store.h"

namespace tier::bench {

struct JournalHandle {
  std::unique_ptr<storage::SpillStore> io;  // destroyed after the journal
  std::unique_ptr<daemon::PersistentJournal> journal;
};

inline JournalHandle OpenJournal(const std::string& dir) {
  JournalHandle handle;
  const std::string spill_dir = dir + "-spill";
  ::mkdir(spill_dir.c_str(), 0700);
  storage::SpillStoreOptions options;
  options.directories = {spill_dir};
  options.file_bytes = 1 << 20;
  options.staging_bytes = 16 << 20;
  auto io = storage::SpillStore::Create(std::move(options));
  if (!io.ok()) {
    std::fprintf(stderr, "spill store in %s: %s\n", spill_dir.c_str(), io.status().ToString().c_str());
    return handle;
  }
  handle.io = *std::move(io);
  auto journal = daemon::PersistentJournal::Open(dir, *handle.io);
  if (!journal.ok()) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(), journal.status().ToString().c_str());
    return handle;
  }
  handle.journal = *std::move(journal);
  return handle;
}

}  // namespace tier::bench

#endif  // TIER_BENCH_JOURNAL_BENCH_OPEN_H_
