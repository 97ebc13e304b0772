#include "daemon/persistent/journal_format.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/crc32c.h"

namespace tier::daemon::journal {
namespace {

static_assert(std::endian::native == std::endian::little, "the journal is little-endian");

constexpr char kFileMagic[8] = {'T', 'I', 'E', 'R', 'D', 'J', 'N', 'L'};
constexpr uint32_t kFormat = 1;
constexpr char kLegacyHeader[] = "tierd-persistent 1\n";

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T Get(absl::string_view bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(value));
  return value;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
}

}  // namespace

std::string EncodeFileHeader(uint64_t generation) {
  std::string out(kFileMagic, sizeof(kFileMagic));
  Put<uint32_t>(&out, kFormat);
  Put<uint32_t>(&out, 0);
  Put<uint64_t>(&out, generation);
  Put<uint32_t>(&out, 0);
  Put<uint32_t>(&out, storage::Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<uint64_t> DecodeFileHeader(absl::string_view bytes) {
  if (bytes.size() < kFileHeaderBytes) return absl::DataLossError("journal file header is short");
  if (std::memcmp(bytes.data(), kFileMagic, sizeof(kFileMagic)) != 0) {
    return absl::DataLossError("not a tierd journal (bad magic)");
  }
  if (Get<uint32_t>(bytes, 28) != storage::Crc32c(bytes.data(), 28)) {
    return absl::DataLossError("journal file header checksum mismatch");
  }
  if (Get<uint32_t>(bytes, 8) != kFormat) {
    return absl::DataLossError(
        absl::StrCat("journal format ", Get<uint32_t>(bytes, 8), "; this tierd reads ", kFormat));
  }
  return Get<uint64_t>(bytes, 16);
}

std::string EncodeRecordHead(RecordType type, uid_t uid, absl::string_view name, uint64_t data_len,
                             uint32_t data_crc, uint64_t seq) {
  std::string out;
  out.reserve(kRecordHeaderBytes + name.size());
  Put<uint32_t>(&out, kRecordMagic);
  Put<uint16_t>(&out, static_cast<uint16_t>(type));
  Put<uint16_t>(&out, static_cast<uint16_t>(name.size()));
  Put<uint32_t>(&out, static_cast<uint32_t>(uid));
  Put<uint32_t>(&out, data_crc);
  Put<uint64_t>(&out, data_len);
  Put<uint64_t>(&out, seq);
  Put<uint32_t>(&out, 0);
  uint32_t crc = storage::Crc32c(out.data(), out.size());
  crc = storage::Crc32cExtend(crc, name.data(), name.size());
  Put<uint32_t>(&out, crc);
  out.append(name.data(), name.size());
  return out;
}

absl::StatusOr<size_t> DecodeRecordNameLength(absl::string_view header) {
  if (header.size() < kRecordHeaderBytes) return absl::DataLossError("record header is short");
  if (Get<uint32_t>(header, 0) != kRecordMagic) return absl::DataLossError("no record magic");
  const uint16_t type = Get<uint16_t>(header, 4);
  const size_t name_len = Get<uint16_t>(header, 6);
  if (type != static_cast<uint16_t>(RecordType::kPut) &&
      type != static_cast<uint16_t>(RecordType::kDelete)) {
    return absl::DataLossError(absl::StrCat("record type ", type));
  }
  if (name_len == 0 || name_len > kMaxNameBytes) {
    return absl::DataLossError(absl::StrCat("record name of ", name_len, " bytes"));
  }
  if (Get<uint32_t>(header, 32) != 0) return absl::DataLossError("record header reserved field");
  if (type == static_cast<uint16_t>(RecordType::kDelete) &&
      (Get<uint64_t>(header, 16) != 0 || Get<uint32_t>(header, 12) != 0)) {
    return absl::DataLossError("delete record with data");
  }
  return name_len;
}

absl::StatusOr<RecordHead> DecodeRecordHead(absl::string_view bytes) {
  absl::StatusOr<size_t> name_len = DecodeRecordNameLength(bytes);
  if (!name_len.ok()) return name_len.status();
  if (bytes.size() < kRecordHeaderBytes + *name_len) {
    return absl::DataLossError("record name is short");
  }
  uint32_t crc = storage::Crc32c(bytes.data(), 36);
  crc = storage::Crc32cExtend(crc, bytes.data() + kRecordHeaderBytes, *name_len);
  if (crc != Get<uint32_t>(bytes, 36)) return absl::DataLossError("record header checksum mismatch");
  RecordHead head;
  head.type = static_cast<RecordType>(Get<uint16_t>(bytes, 4));
  head.uid = Get<uint32_t>(bytes, 8);
  head.data_crc = Get<uint32_t>(bytes, 12);
  head.data_len = Get<uint64_t>(bytes, 16);
  head.seq = Get<uint64_t>(bytes, 24);
  head.name.assign(bytes.data() + kRecordHeaderBytes, *name_len);
  if (!ValidName(head.name)) return absl::DataLossError("record name is not a valid name");
  return head;
}

absl::Status MemorySource::Read(uint64_t offset, uint64_t len, char* out) const {
  if (offset > bytes_.size() || len > bytes_.size() - offset) {
    return absl::OutOfRangeError("read past the end");
  }
  if (len > 0) std::memcpy(out, bytes_.data() + offset, len);
  return absl::OkStatus();
}

namespace {

// The record head at `offset`, if one that checks out fits there (and its data too).
absl::StatusOr<RecordHead> HeadAt(const Source& source, uint64_t offset) {
  const uint64_t size = source.size();
  if (offset > size || size - offset < kRecordHeaderBytes) {
    return absl::DataLossError("short record header");
  }
  char buf[kRecordHeaderBytes + kMaxNameBytes];
  const uint64_t want = std::min<uint64_t>(sizeof(buf), size - offset);
  if (absl::Status s = source.Read(offset, want, buf); !s.ok()) return s;
  absl::StatusOr<RecordHead> head = DecodeRecordHead(absl::string_view(buf, want));
  if (!head.ok()) return head.status();
  if (head->data_len > size - offset - head->head_bytes()) {
    return absl::DataLossError("record data runs past the end of the file");
  }
  return head;
}

// Whether a record that checks out starts anywhere in (from, size): the sign of damage in the
// middle rather than a torn tail.
bool ValidRecordAfter(const Source& source, uint64_t from) {
  const uint64_t size = source.size();
  constexpr uint64_t kChunk = 1 << 20;
  std::string chunk;
  for (uint64_t base = from + 1; base + sizeof(uint32_t) <= size; base += kChunk) {
    const uint64_t n = std::min<uint64_t>(kChunk + sizeof(uint32_t) - 1, size - base);
    chunk.resize(n);
    if (!source.Read(base, n, chunk.data()).ok()) return false;
    for (uint64_t i = 0; i + sizeof(uint32_t) <= n && i < kChunk; ++i) {
      if (Get<uint32_t>(chunk, i) == kRecordMagic && HeadAt(source, base + i).ok()) return true;
    }
  }
  return false;
}

// Whether [from, size) is the zero padding of the file's last block: appends are written in whole
// 4096-byte blocks (daemon/persistent/journal_file.h), and the bytes after the last record to its
// block's end are zero.
bool IsPadding(const Source& source, uint64_t from) {
  const uint64_t size = source.size();
  if (size % kBlockBytes != 0 || size - from >= kBlockBytes) return false;
  std::string bytes(size - from, '\0');
  if (!source.Read(from, bytes.size(), bytes.data()).ok()) return false;
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
}

}  // namespace

absl::StatusOr<Scan> ScanJournal(const Source& source) {
  char header[kFileHeaderBytes];
  if (source.size() < kFileHeaderBytes) return absl::DataLossError("journal file header is short");
  if (absl::Status s = source.Read(0, kFileHeaderBytes, header); !s.ok()) return s;
  absl::StatusOr<uint64_t> generation = DecodeFileHeader(absl::string_view(header, sizeof(header)));
  if (!generation.ok()) return generation.status();
  Scan scan;
  scan.generation = *generation;
  uint64_t offset = kFileHeaderBytes;
  const uint64_t size = source.size();
  while (offset < size) {
    absl::StatusOr<RecordHead> head = HeadAt(source, offset);
    if (!head.ok() && IsPadding(source, offset)) break;  // the end, padded
    if (!head.ok()) {
      const bool damaged = ValidRecordAfter(source, offset);
      scan.tail = damaged ? Scan::Tail::kDamaged : Scan::Tail::kTorn;
      scan.problem = absl::StrCat(damaged ? "damaged record at offset " : "torn record at offset ",
                                  offset, " (", head.status().message(), "); ", size - offset,
                                  " bytes from there ", damaged ? "not read" : "dropped");
      break;
    }
    Key key{head->uid, head->name};
    if (auto it = scan.live.find(key); it != scan.live.end()) {
      scan.live_bytes -= it->second.record_bytes();
      scan.live.erase(it);
    }
    if (head->type == RecordType::kPut) {
      LiveRecord record{head->uid, head->name, head->data_len, head->data_crc,
                        head->seq, offset,     head->head_bytes()};
      scan.live_bytes += record.record_bytes();
      scan.live.emplace(std::move(key), std::move(record));
    }
    scan.next_seq = std::max(scan.next_seq, head->seq + 1);
    offset += head->head_bytes() + head->data_len;
  }
  scan.end = offset;  // (every record counted fits in the file)
  return scan;
}

absl::StatusOr<std::vector<LegacyRecord>> ParseLegacyManifest(absl::string_view text) {
  // The last line is "crc <hex>" over every byte before it.
  const size_t end = text.rfind("crc ");
  if (end == absl::string_view::npos || !absl::StartsWith(text, kLegacyHeader) ||
      text.back() != '\n' || end < sizeof(kLegacyHeader) - 1) {
    return absl::DataLossError("torn or not a manifest");
  }
  uint32_t crc = 0;
  if (!absl::SimpleHexAtoi(text.substr(end + 4, text.size() - end - 5), &crc) ||
      crc != storage::Crc32c(text.data(), end)) {
    return absl::DataLossError("manifest checksum mismatch (torn or damaged)");
  }
  absl::string_view body = text.substr(sizeof(kLegacyHeader) - 1, end - (sizeof(kLegacyHeader) - 1));
  std::vector<LegacyRecord> records;
  for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    LegacyRecord r;
    uint32_t uid = 0;
    uint64_t number = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &uid) || !absl::SimpleAtoi(f[1], &r.len) ||
        !absl::SimpleHexAtoi(f[2], &r.crc) || !absl::StartsWith(f[3], "obj-") ||
        !absl::SimpleAtoi(f[3].substr(4), &number) || !ValidName(f[4])) {
      return absl::DataLossError(absl::StrCat("manifest: bad line \"", line.substr(0, 200), "\""));
    }
    r.uid = uid;
    r.file = absl::StrCat("obj-", number);  // (as a number: never a path)
    r.name = std::string(f[4]);
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace tier::daemon::journal
