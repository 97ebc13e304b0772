// The spill store a persistent journal writes through in tests (daemon/persistent/journal_file.h):
// one small spill file in `dir`, staging memory as tierd gives it, and optionally a wrapped queue.
#ifndef TIER_TESTS_UNIT_JOURNAL_IO_H_
#define TIER_TESTS_UNIT_JOURNAL_IO_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "storage/spill_store.h"

namespace tier::daemon::testing {

inline std::unique_ptr<storage::SpillStore> MakeJournalIo(
    const std::string& dir,
    std::function<std::unique_ptr<storage::IoQueue>(std::unique_ptr<storage::IoQueue>)> wrap =
        nullptr) {
  storage::SpillStoreOptions options;
  options.directories = {dir};
  options.file_bytes = 1 << 20;
  options.staging_bytes = 16 << 20;
  options.file_name = "journal-io.spill";
  options.wrap_io_queue = std::move(wrap);
  auto store = storage::SpillStore::Create(std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

}  // namespace tier::daemon::testing

#endif  // TIER_TESTS_UNIT_JOURNAL_IO_H_
