#include "storage/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tier::storage {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // Castagnoli, bit-reflected

// Slicing-by-8 tables: kTables[0] is the classic byte table; kTables[k][b] is the register after
// feeding byte b followed by k zero bytes.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}
constexpr auto kTables = MakeTables();

inline uint64_t LoadLe64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --len;
  }
  while (len >= 8) {
    uint64_t v = LoadLe64(p) ^ c;
    c = kTables[7][v & 0xff] ^ kTables[6][(v >> 8) & 0xff] ^ kTables[5][(v >> 16) & 0xff] ^
        kTables[4][(v >> 24) & 0xff] ^ kTables[3][(v >> 32) & 0xff] ^
        kTables[2][(v >> 40) & 0xff] ^ kTables[1][(v >> 48) & 0xff] ^ kTables[0][v >> 56];
    p += 8;
    len -= 8;
  }
  while (len > 0) {
    c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --len;
  }
  return ~c;
}

#if defined(__x86_64__)
namespace {

// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so one
// dependent chain runs at a third of the unit's speed. We run three chains over three adjacent
// blocks of `kLong` (or `kShort`) bytes and recombine them: the CRC register is linear, so
//   reg(A || B) = Shift_|B|(reg(A)) xor reg_from_zero(B),
// where Shift_n is "feed n zero bytes", a fixed 32x32 GF(2) matrix we apply with four byte tables.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

struct ShiftTable {
  uint32_t t[4][256];
  uint32_t Apply(uint32_t reg) const {
    return t[0][reg & 0xff] ^ t[1][(reg >> 8) & 0xff] ^ t[2][(reg >> 16) & 0xff] ^ t[3][reg >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t FeedZeros(uint32_t reg, size_t len) {
  uint64_t c = reg;
  for (size_t i = 0; i < len / 8; ++i) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

__attribute__((target("sse4.2"))) ShiftTable MakeShiftTable(size_t len) {
  ShiftTable table;
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) table.t[k][b] = FeedZeros(b << (8 * k), len);
  }
  return table;
}

struct ShiftTables {
  ShiftTable long_shift = MakeShiftTable(kLong);
  ShiftTable short_shift = MakeShiftTable(kShort);
};

const ShiftTables& Shifts() {
  static const ShiftTables* tables = new ShiftTables();  // built once (about 1 ms), never freed
  return *tables;
}

template <size_t kBlock>
__attribute__((target("sse4.2"))) inline uint64_t ThreeWay(uint64_t c0, const unsigned char*& p,
                                                           size_t& len, const ShiftTable& shift) {
  while (len >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      c0 = _mm_crc32_u64(c0, LoadLe64(p + i));
      c1 = _mm_crc32_u64(c1, LoadLe64(p + kBlock + i));
      c2 = _mm_crc32_u64(c2, LoadLe64(p + 2 * kBlock + i));
    }
    c0 = shift.Apply(static_cast<uint32_t>(c0)) ^ c1;
    c0 = shift.Apply(static_cast<uint32_t>(c0)) ^ c2;
    p += 3 * kBlock;
    len -= 3 * kBlock;
  }
  return c0;
}

}  // namespace

__attribute__((target("sse4.2"))) uint32_t Crc32cExtendSse42(uint32_t crc, const void* data,
                                                             size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = static_cast<uint32_t>(~crc);
  while (len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --len;
  }
  if (len >= 3 * kShort) {
    const ShiftTables& shifts = Shifts();
    c = ThreeWay<kLong>(c, p, len, shifts.long_shift);
    c = ThreeWay<kShort>(c, p, len, shifts.short_shift);
  }
  while (len >= 8) {
    c = _mm_crc32_u64(c, LoadLe64(p));
    p += 8;
    len -= 8;
  }
  while (len > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --len;
  }
  return ~static_cast<uint32_t>(c);
}

bool Crc32cHasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

#else  // not x86-64: no hardware path

uint32_t Crc32cExtendSse42(uint32_t crc, const void* data, size_t len) {
  return Crc32cExtendPortable(crc, data, len);
}
bool Crc32cHasSse42() { return false; }

#endif

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t len) {
  return Crc32cHasSse42() ? Crc32cExtendSse42(crc, data, len)
                          : Crc32cExtendPortable(crc, data, len);
}

const char* Crc32cImplementation() { return Crc32cHasSse42() ? "sse4.2" : "table"; }

}  // namespace tier::storage
