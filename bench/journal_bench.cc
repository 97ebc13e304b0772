// Persistent-object durability bandwidth: objects filled in host memory and handed to a
// PersistentStore with a journal (as the job executor does), timed until the last one is durable
// (its batch written and flushed), against dd (O_DIRECT, 8 MiB blocks, conv=fsync) of the same
// bytes in the same directory, in one run. Two shapes: large objects (checkpoint tensors) and
// small ones (many small tensors).
//
//   tier_journal_bench --dir=/var/tmp [--large=64M] [--large-count=16] [--small=64K]
//                      [--small-count=2048] [--runs=3] [--json=FILE]
//
// Prints a table of GB/s (10^9 bytes per second; the best of --runs) and each row's fraction of
// dd's, and writes the same as JSON.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/tiers/tier_manager.h"
#include "journal_bench_open.h"
#include "storage/host_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using tier::daemon::Object;
using tier::daemon::ObjectSlot;
using tier::daemon::ObjectWaiter;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

uint64_t ParseBytes(const std::string& text) {
  uint64_t n = std::strtoull(text.c_str(), nullptr, 10);
  switch (text.empty() ? ' ' : text.back()) {
    case 'K': return n << 10;
    case 'M': return n << 20;
    case 'G': return n << 30;
    default: return n;
  }
}

struct Options {
  std::string dir = "/var/tmp";
  uint64_t large = 64 << 20;
  uint64_t large_count = 16;
  uint64_t small = 64 << 10;
  uint64_t small_count = 2048;
  int runs = 3;
  std::string json;
};

// Seconds from handing `count` objects of `len` bytes to the store until the last is durable.
double StoreRun(const Options& o, uint64_t len, uint64_t count) {
  const std::string dir = absl::StrCat(o.dir, "/tier-journal-bench");
  (void)!std::system(absl::StrCat("rm -rf '", dir, "' '", dir, "-spill'").c_str());
  const uint64_t bytes = len * count;
  auto pool = tier::storage::HostPool::Create(
      {.bytes = bytes + (bytes >> 3) + (64 << 20), .lock = tier::storage::LockMode::kOff});
  if (!pool.ok()) return -1;
  double seconds = -1;
  {
    tier::daemon::TierManager tiers(**pool, nullptr, tier::daemon::SpillerOptions{});
    tiers.Start();
    tier::bench::JournalHandle handle = tier::bench::OpenJournal(dir);
    if (handle.journal == nullptr) return -1;
    tier::daemon::PersistentStore store(tiers, {2 * bytes, 2 * bytes, 1 << 20, 1 << 20},
                                        handle.journal.get());
    // Created and filled in host memory first; the timed part is what follows a fill.
    std::vector<std::pair<ObjectSlot, std::shared_ptr<Object>>> objects;
    for (uint64_t i = 0; i < count; ++i) {
      auto slot = store.Create(1000, absl::StrCat("bench/", i), 1, len);
      if (!slot.ok()) return -1;
      auto object = slot->table->Create(slot->id, len, 0, 1, tiers.Charge(len));
      std::optional<tier::storage::Extent> extent = (*pool)->Allocate(tiers.Charge(len));
      if (!object.ok() || !extent || !slot->table->Admit(**object, *extent, tiers.home()).ok()) {
        return -1;
      }
      std::memset((*pool)->At(*extent), static_cast<int>(i), len);
      objects.emplace_back(*slot, *object);
    }
    const auto start = Clock::now();
    for (auto& [slot, object] : objects) {
      std::vector<ObjectWaiter> waiters;
      slot.table->EndFill(*object, absl::OkStatus(), &waiters);
      store.Filled(slot.table, object);
    }
    const std::string last = absl::StrCat("bench/", count - 1);
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while (!store.Stat(1000, last)->durable) {  // durable in fill order: the last is the end
      if (Clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    seconds = Seconds(start);
    store.DropAll();
  }
  (void)!std::system(absl::StrCat("rm -rf '", dir, "' '", dir, "-spill'").c_str());
  return seconds;
}

double DdRun(const Options& o, uint64_t bytes) {
  const std::string path = absl::StrCat(o.dir, "/tier-journal-bench-dd");
  const uint64_t count = std::max<uint64_t>(1, bytes >> 23);
  const auto start = Clock::now();
  const int rc = std::system(absl::StrCat("dd if=/dev/zero of='", path, "' bs=8M count=", count,
                                          " oflag=direct conv=fsync status=none")
                                 .c_str());
  const double seconds = Seconds(start) * static_cast<double>(bytes) /
                         static_cast<double>(count << 23);
  ::unlink(path.c_str());
  return rc == 0 ? seconds : -1;
}

struct Row {
  std::string name;
  uint64_t bytes = 0;
  double store_gbps = 0;
  double dd_gbps = 0;
};

Row Measure(const Options& o, const std::string& name, uint64_t len, uint64_t count) {
  Row row{name, len * count, 0, 0};
  for (int run = 0; run < o.runs; ++run) {
    const double s = StoreRun(o, len, count);
    const double d = DdRun(o, row.bytes);
    if (s > 0) row.store_gbps = std::max(row.store_gbps, row.bytes / s / 1e9);
    if (d > 0) row.dd_gbps = std::max(row.dd_gbps, row.bytes / d / 1e9);
  }
  return row;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--dir") o->dir = value;
    else if (key == "--large") o->large = ParseBytes(value);
    else if (key == "--large-count") o->large_count = ParseBytes(value);
    else if (key == "--small") o->small = ParseBytes(value);
    else if (key == "--small-count") o->small_count = ParseBytes(value);
    else if (key == "--runs") o->runs = std::max(1, std::atoi(value.c_str()));
    else if (key == "--json") o->json = value;
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) return 2;
  std::vector<Row> rows = {
      Measure(o, absl::StrCat(o.large_count, " x ", o.large >> 10, " KiB"), o.large,
              o.large_count),
      Measure(o, absl::StrCat(o.small_count, " x ", o.small >> 10, " KiB"), o.small,
              o.small_count)};
  std::printf("%-18s %8s %13s %9s %7s\n", "objects", "MiB", "durable GB/s", "dd GB/s", "of dd");
  for (const Row& r : rows) {
    std::printf("%-18s %8.0f %13.2f %9.2f %7.2f\n", r.name.c_str(), r.bytes / 1048576.0,
                r.store_gbps, r.dd_gbps, r.dd_gbps > 0 ? r.store_gbps / r.dd_gbps : 0.0);
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << "{\"dir\": \"" << o.dir << "\", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? ", " : "") << "{\"name\": \"" << r.name << "\", \"bytes\": " << r.bytes
          << ", \"durable_gbps\": " << r.store_gbps << ", \"dd_gbps\": " << r.dd_gbps
          << ", \"of_dd\": " << (r.dd_gbps > 0 ? r.store_gbps / r.dd_gbps : 0.0) << "}";
    }
    out << "]}\n";
  }
  return 0;
}
