// Spill bandwidth benchmark: sequential spill and fill through tierd (offloads of more than its
// host pool holds, reloaded back; see RunTierd), and the SpillStore alone (the real io queue,
// O_DIRECT, registered host-pool buffers, CRC-32C computed on write and verified on read), against
// fio (io_uring, O_DIRECT, same block size and queue depth) and dd (O_DIRECT, queue depth 1) on
// the same directory, in one run. Each engine gets a fresh file preallocated to the same size.
//
//   tier_spill_bench --dir=/var/tmp [--size=1G] [--bs=1M] [--qd=16] [--record=8M]
//                    [--io=auto|io_uring|thread_pool] [--runs=1] [--fio=on|off] [--dd=on|off]
//                    [--tierd=auto|off|PATH] [--tierd-pool=256M] [--json=FILE] [--verbose]
//
// Prints an aligned table of MB/s (10^6 bytes per second) with ratios to the baseline (fio where it
// is on PATH, else dd). Virtual and shared disks are noisy: with several runs each figure is the
// best run, and every other run goes in the reverse order (dd, fio, store) so that no engine always
// follows the same neighbour; --verbose prints every run.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_session.h"
#include "common/log.h"
#include "storage/crc32c.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"
#include "private_daemon.h"
#include "tier/ring.h"

namespace {

using Clock = std::chrono::steady_clock;
using tier::storage::HostPool;
using tier::storage::SpillRecord;
using tier::storage::SpillStore;

struct Flags {
  std::string dir = "/var/tmp";
  uint64_t size = uint64_t{1} << 30;
  uint64_t bs = 1 << 20;
  uint32_t qd = 16;
  uint64_t record = 8 << 20;
  std::string io = "auto";
  int runs = 1;
  bool fio = true;
  bool dd = true;
  std::string json;
  bool verbose = false;
  std::string tierd = "auto";      // auto: the tierd built beside this program; off; or a path
  uint64_t tierd_pool = 256 << 20;  // its host pool (the data is --size, so most of it spills)
};

bool ParseBytes(const std::string& text, uint64_t* out) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v <= 0) return false;
  std::string suffix(end);
  double mult = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) return false;
  *out = static_cast<uint64_t>(v * mult);
  return true;
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq), value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = true;
    if (name == "--dir") f->dir = value;
    else if (name == "--size") ok = ParseBytes(value, &f->size);
    else if (name == "--tierd") f->tierd = value;
    else if (name == "--tierd-pool") ok = ParseBytes(value, &f->tierd_pool);
    else if (name == "--bs") ok = ParseBytes(value, &f->bs);
    else if (name == "--record") ok = ParseBytes(value, &f->record);
    else if (name == "--qd") f->qd = static_cast<uint32_t>(std::atoi(value.c_str()));
    else if (name == "--runs") f->runs = std::max(1, std::atoi(value.c_str()));
    else if (name == "--io") f->io = value;
    else if (name == "--fio") f->fio = value != "off";
    else if (name == "--dd") f->dd = value != "off";
    else if (name == "--json") f->json = value;
    else if (name == "--verbose") f->verbose = true;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "bad flag: %s\n", arg.c_str());
      return false;
    }
  }
  if (f->bs % 4096 != 0 || f->record % 4096 != 0 || f->qd == 0 || f->size < f->record) {
    std::fprintf(stderr, "--bs and --record must be multiples of 4096, --size >= --record\n");
    return false;
  }
  f->size -= f->size % f->record;
  return true;
}

struct Result {
  std::string name;
  std::optional<double> write_mbps;
  std::optional<double> read_mbps;
  std::string note;
};

double Mbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e6 : 0; }

// Waits for n callbacks from the store's I/O thread.
class Latch {
 public:
  explicit Latch(uint64_t n) : left_(n) {}
  void Done() {
    std::lock_guard lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t left_;
};

// ---- SpillStore ----

bool RunStore(const Flags& f, HostPool& pool, Result* result, std::string* queue_name,
              bool* direct) {
  tier::storage::IoQueueKind kind;
  if (!tier::storage::ParseIoQueueKind(f.io, &kind)) {
    std::fprintf(stderr, "--io must be auto, io_uring or thread_pool\n");
    return false;
  }
  auto store = SpillStore::Create({.directories = {f.dir},
                                   .file_bytes = f.size,
                                   .io_bytes = f.bs,
                                   .queue_depth = f.qd,
                                   .io_queue = kind,
                                   .registered_buffers = {{pool.base(), pool.bytes()}},
                                   .file_name = "spill-bench-store.dat"});
  if (!store.ok()) {
    std::fprintf(stderr, "SpillStore: %s\n", std::string(store.status().message()).c_str());
    return false;
  }
  *queue_name = std::string((*store)->io_queue_name());
  *direct = (*store)->Usage()[0].direct_io;
  uint64_t n = f.size / f.record;
  std::vector<SpillRecord> records(n);
  std::vector<absl::Status> errors(n);

  // Every record posted at once: the store keeps qd requests of bs bytes in flight.
  Latch written(n);
  auto start = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    absl::Status s = (*store)->Write(pool.base() + i * f.record, f.record,
                                     [&, i](absl::StatusOr<SpillRecord> r) {
                                       if (r.ok()) records[i] = *r;
                                       errors[i] = r.status();
                                       written.Done();
                                     });
    if (!s.ok()) {
      std::fprintf(stderr, "write: %s\n", std::string(s.message()).c_str());
      return false;
    }
  }
  written.Wait();
  double write_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (const absl::Status& s : errors) {
    if (!s.ok()) {
      std::fprintf(stderr, "write failed: %s\n", std::string(s.message()).c_str());
      return false;
    }
  }

  // Read back into the same memory: the store verifies every record's CRC before reporting OK.
  Latch read(n);
  start = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    absl::Status s = (*store)->Read(records[i], pool.base() + i * f.record, [&, i](absl::Status st) {
      errors[i] = std::move(st);
      read.Done();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "read: %s\n", std::string(s.message()).c_str());
      return false;
    }
  }
  read.Wait();
  double read_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (const absl::Status& s : errors) {
    if (!s.ok()) {
      std::fprintf(stderr, "read failed: %s\n", std::string(s.message()).c_str());
      return false;
    }
  }
  for (const SpillRecord& r : records) (void)(*store)->Free(r);
  double w = Mbps(f.size, write_s), r = Mbps(f.size, read_s);
  if (f.verbose) std::fprintf(stderr, "  SpillStore: write %.1f MB/s, read %.1f MB/s\n", w, r);
  result->write_mbps = std::max(result->write_mbps.value_or(0), w);
  result->read_mbps = std::max(result->read_mbps.value_or(0), r);
  return true;
}

// ---- Through tierd ----
//
// A private tierd (host copy engine, so only the NVMe path is measured) with a host pool of
// --tierd-pool bytes and watermarks 1%/0%: everything offloaded is spilled as soon as it lands.
// Spill: --size bytes offloaded as --record objects from one client buffer, all submitted at
// once (offloads that find the pool full wait in tierd for room); timed from the first submit
// until tierd reports every byte written to NVMe. Fill: every object reloaded into its place in
// the client buffer, all at once, each reload dropping its object; timed until the last
// completes (each one NVMe -> pool -> client buffer). Then every byte is checked.
bool RunTierd(const Flags& f, Result* result) {
  uint64_t n = f.size / f.record;
  auto daemon = tier::bench::PrivateDaemon::Start(
      f.tierd == "auto" ? "" : f.tierd,
      {"--engine=host", absl::StrCat("--pool_bytes=", f.tierd_pool),
       absl::StrCat("--spill_bytes=", f.size + f.tierd_pool), "--spill_dir=" + f.dir + "/tierd-spill-bench",
       "--spill_io=" + f.io, absl::StrCat("--spill_queue_depth=", f.qd),
       absl::StrCat("--spill_io_bytes=", f.bs), "--spill_high_pct=1", "--spill_low_pct=0",
       "--spill_prefetch=0", "--pool_lock=best-effort"});
  if (!daemon.ok()) {
    result->note = std::string(daemon.status().message());
    return false;
  }
  tier::client::SessionOptions options;
  options.socket_path = (*daemon)->socket();
  options.name = "spill-bench";
  auto session = tier::client::ClientSession::Open(options);
  if (!session.ok()) {
    result->note = std::string(session.status().message());
    return false;
  }
  void* data = nullptr;
  auto buffer = (*session)->AllocHostBuffer(n * f.record, &data);
  if (!buffer.ok()) {
    result->note = std::string(buffer.status().message());
    return false;
  }
  auto fill = [&](uint64_t seed) {
    auto* words = static_cast<uint64_t*>(data);
    uint64_t x = seed;
    for (uint64_t i = 0; i < n * f.record / 8; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      words[i] = x;
    }
  };
  fill(0x2545F4914F6CDD1Dull);
  auto fail = [&](const absl::Status& s) {
    result->note = absl::StrCat("tierd: ", s.message());
    return false;
  };

  std::vector<uint64_t> objects(n), jobs(n);
  // Submits record i's job, all of them first, then waits for every one.
  auto run_all = [&](tier::ring::Opcode opcode, bool reverse) -> absl::Status {
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t i = reverse ? n - 1 - k : k;
      tier::client::JobRequest request;
      request.opcode = static_cast<uint32_t>(opcode);
      if (opcode == tier::ring::Opcode::kOffload) {
        objects[i] = (*session)->NewObjectId();
      } else {
        request.flags = tier::ring::kFlagFreeAfterReload;
      }
      request.object_id = objects[i];
      request.buffer_id = *buffer;
      request.offset = i * f.record;
      request.len = f.record;
      auto job = (*session)->Submit(request);
      if (!job.ok()) return job.status();
      jobs[i] = *job;
    }
    for (uint64_t job : jobs) {
      if (absl::Status s = (*session)->Wait(job, 600000); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  auto start = Clock::now();
  if (absl::Status s = run_all(tier::ring::Opcode::kOffload, false); !s.ok()) return fail(s);
  for (;;) {
    auto status = (*daemon)->Status();
    if (!status.ok()) return fail(status.status());
    if (status->bytes_spilled() >= n * f.record) break;
    if (status->spill_write_errors() > 0) return fail(absl::DataLossError("spill write errors"));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  double spill_s = std::chrono::duration<double>(Clock::now() - start).count();

  std::memset(data, 0, n * f.record);
  start = Clock::now();
  // Reverse order, as activations come back.
  if (absl::Status s = run_all(tier::ring::Opcode::kReload, true); !s.ok()) return fail(s);
  double fill_s = std::chrono::duration<double>(Clock::now() - start).count();

  // Every byte back where it was.
  std::vector<uint64_t> got(static_cast<uint64_t*>(data),
                            static_cast<uint64_t*>(data) + n * f.record / 8);
  fill(0x2545F4914F6CDD1Dull);
  if (std::memcmp(got.data(), data, n * f.record) != 0) {
    return fail(absl::DataLossError("data came back different"));
  }
  auto status = (*daemon)->Status();
  if (status.ok() && f.verbose) {
    std::fprintf(stderr, "  tierd: spilled %" PRIu64 " B, fetched %" PRIu64 " B, io %s\n",
                 status->bytes_spilled(), status->bytes_fetched(), status->spill_io().c_str());
  }
  double w = Mbps(n * f.record, spill_s), r = Mbps(n * f.record, fill_s);
  if (f.verbose) std::fprintf(stderr, "  tierd: spill %.1f MB/s, fill %.1f MB/s\n", w, r);
  result->write_mbps = std::max(result->write_mbps.value_or(0), w);
  result->read_mbps = std::max(result->read_mbps.value_or(0), r);
  return true;
}

// ---- External baselines ----

std::string RunCommand(const std::string& command) {
  std::string output;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return output;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output.append(buf, n);
  ::pclose(p);
  return output;
}

bool OnPath(const std::string& tool) {
  return std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) == 0;
}

// A fresh file preallocated to `size`, as the SpillStore's is.
bool Preallocate(const std::string& path, uint64_t size) {
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0;
  ::close(fd);
  return ok;
}

// bw_bytes of the "read" or "write" section of fio's JSON output.
std::optional<double> FioBandwidth(const std::string& json, const std::string& section) {
  size_t at = json.find("\"" + section + "\" : {");
  if (at == std::string::npos) return std::nullopt;
  at = json.find("\"bw_bytes\" : ", at);
  if (at == std::string::npos) return std::nullopt;
  return std::strtod(json.c_str() + at + 13, nullptr) / 1e6;
}

void RunFio(const Flags& f, Result* result) {
  std::string file = f.dir + "/spill-bench-fio.dat";
  if (!Preallocate(file, f.size)) {
    result->note = "cannot create fio file";
    return;
  }
  for (const char* rw : {"write", "read"}) {
    std::string cmd = absl::StrCat(
        "fio --name=spill --filename=", file, " --size=", f.size, " --bs=", f.bs,
        " --iodepth=", f.qd, " --ioengine=io_uring --direct=1 --fixedbufs=1 --registerfiles=1",
        " --rw=", rw, " --output-format=json 2>/dev/null");
    std::optional<double> mbps = FioBandwidth(RunCommand(cmd), rw);
    if (!mbps) {
      result->note = "fio failed (io_uring engine unavailable?)";
      continue;
    }
    if (f.verbose) std::fprintf(stderr, "  fio: %s %.1f MB/s\n", rw, *mbps);
    auto& slot = std::string(rw) == "write" ? result->write_mbps : result->read_mbps;
    slot = std::max(slot.value_or(0), *mbps);
  }
  ::unlink(file.c_str());
}

// dd's own figure: "... copied, 0.345 s, 3.1 GB/s"; the wall clock if that line is missing.
double DdSeconds(const std::string& output, double wall) {
  size_t at = output.rfind("copied, ");
  if (at == std::string::npos) return wall;
  double s = std::strtod(output.c_str() + at + 8, nullptr);
  return s > 0 ? s : wall;
}

void RunDd(const Flags& f, Result* result) {
  std::string file = f.dir + "/spill-bench-dd.dat";
  if (!Preallocate(file, f.size)) {
    result->note = "cannot create dd file";
    return;
  }
  uint64_t count = f.size / f.bs;
  std::string write_cmd = absl::StrCat("dd if=/dev/zero of=", file, " bs=", f.bs, " count=", count,
                                       " oflag=direct conv=notrunc 2>&1");
  std::string read_cmd =
      absl::StrCat("dd if=", file, " of=/dev/null bs=", f.bs, " count=", count, " iflag=direct 2>&1");
  for (int pass = 0; pass < 2; ++pass) {
    auto start = Clock::now();
    std::string out = RunCommand(pass == 0 ? write_cmd : read_cmd);
    double wall = std::chrono::duration<double>(Clock::now() - start).count();
    if (out.find("copied") == std::string::npos) {
      result->note = "dd failed: " + out.substr(0, out.find('\n'));
      continue;
    }
    double mbps = Mbps(f.size, DdSeconds(out, wall));
    if (f.verbose) std::fprintf(stderr, "  dd: %s %.1f MB/s\n", pass == 0 ? "write" : "read", mbps);
    auto& slot = pass == 0 ? result->write_mbps : result->read_mbps;
    slot = std::max(slot.value_or(0), mbps);
  }
  ::unlink(file.c_str());
}

std::string Fmt(const std::optional<double>& v, const char* format) {
  if (!v) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, *v);
  return buf;
}

std::optional<double> Ratio(const std::optional<double>& v, const std::optional<double>& base) {
  if (!v || !base || *base <= 0) return std::nullopt;
  return *v / *base;
}

std::string JsonNumber(const std::optional<double>& v) {
  return v ? absl::StrCat(*v) : std::string("null");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  tier::SetMinLogSeverity(tier::Severity::kWarning);

  // The host pool the data lives in, registered with the io queue as the daemon's is.
  auto pool = HostPool::Create({.bytes = f.size, .lock = tier::storage::LockMode::kBestEffort});
  if (!pool.ok()) {
    std::fprintf(stderr, "host pool: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto* words = reinterpret_cast<uint64_t*>((*pool)->base());
  for (uint64_t i = 0; i < f.size / 8; ++i) {  // incompressible, position-dependent data
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    words[i] = x;
  }

  std::vector<Result> results;
  Result store{"SpillStore", {}, {}, ""};
  Result fio{absl::StrCat("fio io_uring O_DIRECT QD", f.qd), {}, {}, ""};
  Result dd{"dd O_DIRECT (QD1)", {}, {}, ""};
  Result tierd{"tierd (offload/reload, host engine)", {}, {}, ""};
  bool have_tierd = f.tierd != "off";
  std::string queue_name;
  bool direct = false;
  bool have_fio = f.fio && OnPath("fio");
  bool have_dd = f.dd && OnPath("dd");
  for (int run = 0; run < f.runs; ++run) {
    if (f.verbose) std::fprintf(stderr, "run %d\n", run + 1);
    bool reverse = run % 2 == 1;
    if (!reverse && !RunStore(f, **pool, &store, &queue_name, &direct)) return 1;
    if (reverse && have_dd) RunDd(f, &dd);
    if (have_fio) RunFio(f, &fio);
    if (!reverse && have_dd) RunDd(f, &dd);
    if (reverse && !RunStore(f, **pool, &store, &queue_name, &direct)) return 1;
    if (have_tierd && !RunTierd(f, &tierd)) {
      std::fprintf(stderr, "tierd row skipped: %s\n", tierd.note.c_str());
      have_tierd = false;
    }
  }
  store.name = absl::StrCat("SpillStore (", queue_name, ", crc32c ",
                            tier::storage::Crc32cImplementation(), ")");
  if (!direct) store.note = "buffered: the filesystem refused O_DIRECT";
  results.push_back(store);
  if (have_tierd) results.push_back(tierd);
  if (have_fio) results.push_back(fio);
  if (have_dd) results.push_back(dd);
  const Result* baseline = have_fio && fio.write_mbps ? &fio : have_dd ? &dd : &results[0];

  std::printf("spill bench: %s, %" PRIu64 " MiB, bs %" PRIu64 " KiB, qd %u, records %" PRIu64
              " KiB, %s, best of %d run(s); baseline: %s\n",
              f.dir.c_str(), f.size >> 20, f.bs >> 10, f.qd, f.record >> 10,
              direct ? "O_DIRECT" : "buffered", f.runs, baseline->name.c_str());
  if (!have_fio) std::printf("(fio not on PATH: no fio baseline)\n");
  size_t width = 10;
  for (const Result& r : results) width = std::max(width, r.name.size());
  std::printf("%-*s  %11s  %11s  %9s  %9s\n", static_cast<int>(width), "engine", "write MB/s",
              "read MB/s", "write/base", "read/base");
  for (const Result& r : results) {
    std::printf("%-*s  %11s  %11s  %9s  %9s%s%s\n", static_cast<int>(width), r.name.c_str(),
                Fmt(r.write_mbps, "%.1f").c_str(), Fmt(r.read_mbps, "%.1f").c_str(),
                Fmt(Ratio(r.write_mbps, baseline->write_mbps), "%.3f").c_str(),
                Fmt(Ratio(r.read_mbps, baseline->read_mbps), "%.3f").c_str(),
                r.note.empty() ? "" : "  ", r.note.c_str());
  }

  if (!f.json.empty()) {
    std::ofstream out(f.json);
    out << "{\n  \"benchmark\": \"spill\",\n  \"dir\": \"" << f.dir << "\",\n  \"bytes\": " << f.size
        << ",\n  \"bs\": " << f.bs << ",\n  \"qd\": " << f.qd << ",\n  \"record_bytes\": " << f.record
        << ",\n  \"runs\": " << f.runs << ",\n  \"io_queue\": \"" << queue_name
        << "\",\n  \"direct_io\": " << (direct ? "true" : "false") << ",\n  \"crc32c\": \""
        << tier::storage::Crc32cImplementation() << "\",\n  \"baseline\": \"" << baseline->name
        << "\",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      out << "    {\"name\": \"" << r.name << "\", \"write_MBps\": " << JsonNumber(r.write_mbps)
          << ", \"read_MBps\": " << JsonNumber(r.read_mbps)
          << ", \"write_ratio\": " << JsonNumber(Ratio(r.write_mbps, baseline->write_mbps))
          << ", \"read_ratio\": " << JsonNumber(Ratio(r.read_mbps, baseline->read_mbps))
          << ", \"note\": \"" << r.note << "\"}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", f.json.c_str());
      return 1;
    }
  }
  return 0;
}
