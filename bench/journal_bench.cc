// Persistent-journal write bandwidth: PersistentJournal appends made durable (Sync per batch)
// against dd (O_DIRECT, 8 MiB blocks, conv=fsync) of the same bytes in the same directory, in one
// run. Two shapes: large records (checkpoint tensors) and small ones (many small objects).
//
//   tier_journal_bench --dir=/var/tmp [--large=64M] [--large-count=16] [--small=64K]
//                      [--small-count=2048] [--batch-bytes=64M] [--runs=3] [--json=FILE]
//
// Prints a table of GB/s (10^9 bytes per second; the best of --runs) and each journal row's
// fraction of dd's, and writes the same as JSON.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/persistent/persistent_journal.h"
#include "journal_bench_open.h"

namespace {

using Clock = std::chrono::steady_clock;

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
  uint64_t batch_bytes = 64 << 20;
  int runs = 3;
  std::string json;
};

// Seconds to append `count` records of `len` bytes, syncing every batch_bytes and at the end.
double JournalRun(const Options& o, uint64_t len, uint64_t count) {
  const std::string dir = absl::StrCat(o.dir, "/tier-journal-bench");
  (void)!std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  std::vector<char> data(len);
  for (uint64_t i = 0; i < len; ++i) data[i] = static_cast<char>(i * 131 + 7);
  double seconds = -1;
  {
    tier::bench::JournalHandle handle = tier::bench::OpenJournal(dir, o.batch_bytes);
    if (handle.journal == nullptr) return -1;
    const auto start = Clock::now();
    uint64_t in_batch = 0;
    for (uint64_t i = 0; i < count; ++i) {
      absl::Status s = handle.journal->AppendPut(1000, absl::StrCat("bench/", i), data.data(), len);
      in_batch += len;
      if (s.ok() && (in_batch >= o.batch_bytes || i + 1 == count)) {
        s = handle.journal->Sync();
        in_batch = 0;
      }
      if (!s.ok()) {
        std::fprintf(stderr, "journal: %s\n", s.ToString().c_str());
        return -1;
      }
    }
    seconds = Seconds(start);
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
  double journal_gbps = 0;
  double dd_gbps = 0;
};

Row Measure(const Options& o, const std::string& name, uint64_t len, uint64_t count) {
  Row row{name, len * count, 0, 0};
  for (int run = 0; run < o.runs; ++run) {
    const double j = JournalRun(o, len, count);
    const double d = DdRun(o, row.bytes);
    if (j > 0) row.journal_gbps = std::max(row.journal_gbps, row.bytes / j / 1e9);
    if (d > 0) row.dd_gbps = std::max(row.dd_gbps, row.bytes / d / 1e9);
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* key) -> const char* {
      const std::string prefix = absl::StrCat("--", key, "=");
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("dir")) o.dir = v;
    else if (const char* v = value("large")) o.large = ParseBytes(v);
    else if (const char* v = value("large-count")) o.large_count = ParseBytes(v);
    else if (const char* v = value("small")) o.small = ParseBytes(v);
    else if (const char* v = value("small-count")) o.small_count = ParseBytes(v);
    else if (const char* v = value("batch-bytes")) o.batch_bytes = ParseBytes(v);
    else if (const char* v = value("runs")) o.runs = std::max(1, std::atoi(v));
    else if (const char* v = value("json")) o.json = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  std::vector<Row> rows = {Measure(o, "large records", o.large, o.large_count),
                           Measure(o, "small records", o.small, o.small_count)};
  std::printf("%-16s %10s %12s %10s %8s\n", "", "MiB", "journal GB/s", "dd GB/s", "of dd");
  for (const Row& r : rows) {
    std::printf("%-16s %10.0f %12.2f %10.2f %8.2f\n", r.name.c_str(), r.bytes / 1048576.0,
                r.journal_gbps, r.dd_gbps, r.dd_gbps > 0 ? r.journal_gbps / r.dd_gbps : 0.0);
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << "{\"dir\": \"" << o.dir << "\", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? ", " : "") << "{\"name\": \"" << r.name << "\", \"bytes\": " << r.bytes
          << ", \"journal_gbps\": " << r.journal_gbps << ", \"dd_gbps\": " << r.dd_gbps
          << ", \"of_dd\": " << (r.dd_gbps > 0 ? r.journal_gbps / r.dd_gbps : 0.0) << "}";
    }
    out << "]}\n";
  }
  return 0;
}
