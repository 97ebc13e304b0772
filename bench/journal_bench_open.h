// How tier_journal_bench opens a journal: PersistentJournal::Open in `dir`, as tierd would.
#ifndef TIER_BENCH_JOURNAL_BENCH_OPEN_H_
#define TIER_BENCH_JOURNAL_BENCH_OPEN_H_

#include <cstdio>
#include <memory>
#include <string>

#include "daemon/persistent/persistent_journal.h"

namespace tier::bench {

struct JournalHandle {
  std::unique_ptr<daemon::PersistentJournal> journal;
};

inline JournalHandle OpenJournal(const std::string& dir, uint64_t /*batch_bytes*/) {
  JournalHandle handle;
  auto journal = daemon::PersistentJournal::Open(dir);
  if (!journal.ok()) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(), journal.status().ToString().c_str());
    return handle;
  }
  handle.journal = *std::move(journal);
  return handle;
}

}  // namespace tier::bench

#endif  // TIER_BENCH_JOURNAL_BENCH_OPEN_H_
