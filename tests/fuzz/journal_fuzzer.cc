// libFuzzer target: the persistent-object journal's parsers (daemon/persistent/journal_format.h) on bytes a
// crash, a bad disk or an edit could leave: the journal file scan and the issue-17 manifest it
// imports. Whatever the bytes, a scan must describe only what lies within what checked out, and
// replaying records made by the encoder must give back exactly what was encoded.
//
// First byte: 0 a journal file, 1 a legacy manifest, 2 a journal built from the rest as
// operations (the round trip).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "daemon/persistent/journal_format.h"

namespace {

namespace journal = tier::daemon::journal;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > journal::kMaxNameBytes) return false;
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

void CheckScan(absl::string_view bytes) {
  journal::MemorySource source(bytes);
  absl::StatusOr<journal::Scan> scan = journal::ScanJournal(source);
  if (!scan.ok()) return;
  if (scan->end < journal::kFileHeaderBytes || scan->end > bytes.size()) std::abort();
  if (scan->tail == journal::Scan::Tail::kClean && scan->end != bytes.size()) std::abort();
  if (scan->tail != journal::Scan::Tail::kClean && scan->problem.empty()) std::abort();
  uint64_t live = 0;
  for (const auto& [key, record] : scan->live) {
    if (key.uid != record.uid || key.name != record.name || !ValidName(record.name)) std::abort();
    // Every byte it names lies in what checked out, and after the file header.
    if (record.offset < journal::kFileHeaderBytes || record.data_offset() < record.offset ||
        record.len > scan->end || record.data_offset() > scan->end - record.len) {
      std::abort();
    }
    if (record.seq >= scan->next_seq) std::abort();
    live += record.record_bytes();
  }
  if (live != scan->live_bytes) std::abort();
}

void CheckLegacy(absl::string_view text) {
  absl::StatusOr<std::vector<journal::LegacyRecord>> records = journal::ParseLegacyManifest(text);
  if (!records.ok()) return;
  for (const journal::LegacyRecord& r : *records) {
    if (!ValidName(r.name) || r.file.rfind("obj-", 0) != 0 || r.file.size() < 5) std::abort();
    for (char c : r.file.substr(4)) {
      if (c < '0' || c > '9') std::abort();  // a number: never a path
    }
  }
}

// Operations: [op (put/delete), uid byte, name length, name bytes, data length byte, data].
void CheckRoundTrip(absl::string_view ops) {
  std::string file = journal::EncodeFileHeader(7);
  std::map<std::pair<uint32_t, std::string>, std::string> expect;
  uint64_t seq = 1;
  size_t i = 0;
  while (i + 3 <= ops.size()) {
    const bool put = (ops[i] & 1) == 0;
    const uint32_t uid = static_cast<uint8_t>(ops[i + 1]);
    size_t name_len = static_cast<uint8_t>(ops[i + 2]) % 8 + 1;
    i += 3;
    if (i + name_len > ops.size()) break;
    std::string name(ops.substr(i, name_len));
    i += name_len;
    for (char& c : name) c = static_cast<char>(0x21 + static_cast<uint8_t>(c) % 94);
    std::string data;
    if (put && i < ops.size()) {
      const size_t len = static_cast<uint8_t>(ops[i]) % 64;
      ++i;
      data = std::string(ops.substr(i, std::min(len, ops.size() - i)));
      i += data.size();
    }
    file += journal::EncodeRecordHead(put ? journal::RecordType::kPut : journal::RecordType::kDelete,
                                      uid, name, data.size(), 0, seq++);
    file += data;
    if (put) {
      expect[{uid, name}] = data;
    } else {
      expect.erase({uid, name});
    }
  }
  journal::MemorySource source(file);
  absl::StatusOr<journal::Scan> scan = journal::ScanJournal(source);
  if (!scan.ok() || scan->tail != journal::Scan::Tail::kClean || scan->generation != 7 ||
      scan->live.size() != expect.size() || scan->end != file.size()) {
    std::abort();
  }
  for (const auto& [key, data] : expect) {
    auto it = scan->live.find(journal::Key{key.first, key.second});
    if (it == scan->live.end() || it->second.len != data.size() ||
        file.compare(it->second.data_offset(), data.size(), data) != 0) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0) return 0;
  absl::string_view rest(reinterpret_cast<const char*>(bytes) + 1, size - 1);
  switch (bytes[0] % 3) {
    case 0:
      CheckScan(rest);
      break;
    case 1:
      CheckLegacy(rest);
      break;
    default:
      CheckRoundTrip(rest);
      break;
  }
  return 0;
}
