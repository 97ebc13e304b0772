// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every spilled record.
// Uses the SSE4.2 crc32 instruction (three interleaved streams, recombined) where the CPU has it,
// else a slicing-by-8 table. Both paths give identical results; the tests check them against the
// known answers of RFC 3720 and against each other.
#ifndef TIER_STORAGE_CRC32C_H_
#define TIER_STORAGE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tier::storage {

// Extends `crc` (the CRC-32C of some prefix, 0 for the empty prefix) over `len` more bytes:
// Crc32cExtend(Crc32cExtend(0, a), b) == Crc32c(a followed by b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t len);

inline uint32_t Crc32c(const void* data, size_t len) { return Crc32cExtend(0, data, len); }

// The two implementations behind Crc32cExtend, exposed so that tests exercise both on any CPU.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t len);
// Only call where Crc32cHasSse42() is true.
uint32_t Crc32cExtendSse42(uint32_t crc, const void* data, size_t len);

bool Crc32cHasSse42();
// "sse4.2" or "table": which one Crc32cExtend uses on this CPU.
const char* Crc32cImplementation();

}  // namespace tier::storage

#endif  // TIER_STORAGE_CRC32C_H_
