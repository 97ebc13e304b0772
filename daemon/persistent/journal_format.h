// The bytes of the persistent-object journal (daemon/persistent/persistent_journal.h), as pure functions of
// what is read back, so that a fuzz target (tests/fuzz/journal_fuzzer.cc) can feed them anything
// a crash, a bad disk or a person with an editor could leave.
//
// A journal file is a 32-byte file header, then records appended one after another:
//   file header: "TIERDJNL", u32 format (1), u32 0, u64 generation, u32 0, u32 CRC-32C of the
//                28 bytes before it
//   record:      u32 magic, u16 type (1 put, 2 delete), u16 name bytes (1..127), u32 uid,
//                u32 CRC-32C of the data, u64 data bytes (0 for a delete), u64 sequence,
//                u32 0, u32 CRC-32C of the 36 bytes before it and the name; then the name, then
//                the data
// All integers little-endian. A record's header and name carry their own checksum, so its
// lengths are trusted only once that checks out; its data has another, checked when the data is
// loaded (a damaged object is refused alone, by name). Replaying the records in order gives the
// live objects: a put of a (uid, name) replaces an earlier one, a delete ends it.
//
// Appends are written in whole 4096-byte blocks: zero bytes from the end of the last record to
// the end of its block (and of the file) are padding, the clean end of the file.
//
// Scanning stops at the first record that does not check out. If nothing valid follows, that is
// a torn tail (a crash while appending): everything before it stands. If a valid record follows,
// the file is damaged in the middle: what follows is not served, since a delete lost in the
// damage would bring a deleted object back.
//
// The issue-17 format (a text manifest naming one data file per object) is still read, once, to
// import it (ParseLegacyManifest).
#ifndef TIER_DAEMON_PERSISTENT_JOURNAL_FORMAT_H_
#define TIER_DAEMON_PERSISTENT_JOURNAL_FORMAT_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tier::daemon::journal {

inline constexpr size_t kFileHeaderBytes = 32;
inline constexpr uint64_t kBlockBytes = 4096;  // appends' unit (padding: see above)
inline constexpr size_t kRecordHeaderBytes = 40;
inline constexpr size_t kMaxNameBytes = 127;
inline constexpr uint32_t kRecordMagic = 0x4c52544a;  // "JTRL"

enum class RecordType : uint16_t { kPut = 1, kDelete = 2 };

std::string EncodeFileHeader(uint64_t generation);
// The generation of a file header; DATA_LOSS when it is not one.
absl::StatusOr<uint64_t> DecodeFileHeader(absl::string_view bytes);

// A record's header and name (the data follows it).
std::string EncodeRecordHead(RecordType type, uid_t uid, absl::string_view name, uint64_t data_len,
                             uint32_t data_crc, uint64_t seq);

struct RecordHead {
  RecordType type = RecordType::kPut;
  uid_t uid = 0;
  std::string name;
  uint64_t data_len = 0;
  uint32_t data_crc = 0;
  uint64_t seq = 0;
  uint64_t head_bytes() const { return kRecordHeaderBytes + name.size(); }
};
// The fixed part of a record header: its name's length, when it checks as far as it can without
// the name (magic, type, name length, zero fields). DATA_LOSS otherwise.
absl::StatusOr<size_t> DecodeRecordNameLength(absl::string_view header);
// A whole header followed by its name (`bytes` holds at least kRecordHeaderBytes + the name):
// DATA_LOSS unless every field and the checksum check out.
absl::StatusOr<RecordHead> DecodeRecordHead(absl::string_view bytes);

// Where a scan reads from: a file, or memory (tests, the fuzzer).
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  // Exactly `len` bytes at `offset` into `out` (the caller keeps within size()).
  virtual absl::Status Read(uint64_t offset, uint64_t len, char* out) const = 0;
};

class MemorySource : public Source {
 public:
  explicit MemorySource(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::Status Read(uint64_t offset, uint64_t len, char* out) const override;

 private:
  absl::string_view bytes_;
};

// A live object as the scan found it.
struct LiveRecord {
  uid_t uid = 0;
  std::string name;
  uint64_t len = 0;
  uint32_t crc = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;       // of its record header
  uint64_t head_bytes = 0;   // header and name
  uint64_t data_offset() const { return offset + head_bytes; }
  uint64_t record_bytes() const { return head_bytes + len; }
};

struct Key {
  uid_t uid = 0;
  std::string name;
  friend bool operator==(const Key&, const Key&) = default;
};
struct KeyHash {
  size_t operator()(const Key& key) const {
    return std::hash<std::string>()(key.name) * 31 + key.uid;
  }
};

struct Scan {
  uint64_t generation = 0;
  std::unordered_map<Key, LiveRecord, KeyHash> live;
  uint64_t end = 0;         // bytes that checked out, from the start: appends go here
  uint64_t live_bytes = 0;  // record bytes (headers, names, data) of the live records
  uint64_t next_seq = 1;
  enum class Tail { kClean, kTorn, kDamaged } tail = Tail::kClean;
  std::string problem;  // for kTorn and kDamaged: what was found where
};
// Reads a journal file's header and records (headers and names only: data is checked when it is
// loaded). DATA_LOSS when the file header is bad (nothing in it is trusted).
absl::StatusOr<Scan> ScanJournal(const Source& source);

// The issue-17 manifest: "tierd-persistent 1\n", then "uid len crc-hex obj-N name" lines, then
// "crc <hex>\n" over every byte before it.
struct LegacyRecord {
  uid_t uid = 0;
  uint64_t len = 0;
  uint32_t crc = 0;
  std::string file;  // "obj-N"
  std::string name;
};
absl::StatusOr<std::vector<LegacyRecord>> ParseLegacyManifest(absl::string_view text);

}  // namespace tier::daemon::journal

#endif  // TIER_DAEMON_PERSISTENT_JOURNAL_FORMAT_H_
