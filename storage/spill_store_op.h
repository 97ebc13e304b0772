// One operation of the SpillStore's I/O thread (storage/spill_store.h): a record's write or read
// in chunks, or one request of an attached file. Private to the store's sources.
#ifndef TIER_STORAGE_SPILL_STORE_OP_H_
#define TIER_STORAGE_SPILL_STORE_OP_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "storage/spill_store.h"

namespace tier::storage {

struct SpillStore::Op {
  IoOp kind = IoOp::kWrite;
  SpillRecord record;
  char* buf = nullptr;
  uint64_t io_len = 0;   // record.extent.bytes: whole blocks
  uint64_t issued = 0;   // bytes of io_len handed to the queue
  uint32_t in_flight = 0;
  // Writes: the CRC of each chunk issued so far. Reads: the CRCs the chunks must match.
  std::vector<uint32_t> chunk_crcs;
  uint32_t crc_chunks = 0;       // writes: chunks checksummed; reads: chunks verified, in order
  std::vector<bool> chunk_done;  // reads: which chunks arrived
  bool checksum_failed = false;  // reads: a chunk did not match
  absl::Status status;
  WriteDone write_done;
  ReadDone read_done;
  ReadProgress progress;
  // Attached files' requests: one request each, at file_offset of the queue's file queue_file
  // (looked up on the I/O thread).
  bool attached = false;
  int queue_file = -1;
  uint64_t file_offset = 0;
  FileDone file_done;
  std::list<std::unique_ptr<Op>>::iterator where;
};

}  // namespace tier::storage

#endif  // TIER_STORAGE_SPILL_STORE_OP_H_
