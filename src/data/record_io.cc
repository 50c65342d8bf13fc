// CRC-32C (SSE4.2 instruction with a slicing-by-8 table fallback) and the
// TFRecord-framed RecordWriter / RecordReader over buffered stdio.
#include "data/record_io.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "common/check.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ncf {
namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli, bit-reflected
// Shard files are written once, front to back: a big buffer turns many small
// frame pieces into few large write(2) calls.
constexpr size_t kWriteBuffer = size_t{4} << 20;
// Reads are mostly sequential, but seek() followed by a small read refills the
// whole buffer, so it is kept smaller than the writer's.
constexpr size_t kReadBuffer = size_t{1} << 20;
constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of it

// kTables[0] is the byte-at-a-time table; kTables[k][b] is the CRC of byte b
// followed by k zero bytes, which lets 8 input bytes be folded with 8 lookups.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;
constexpr CrcTables make_tables() {
  CrcTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr CrcTables kTables = make_tables();

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // compiles to one load on LE hosts
  return v;
}
inline uint32_t load_le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline void store_le64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void store_le32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_extend_sse42(uint32_t crc, const void* data,
                                                               size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  // Byte steps up to an 8-byte boundary so the main loop's loads never split a line.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n) c = _mm_crc32_u8(c, *p++);
  return ~c;
}

bool detect_sse42() {
  __builtin_cpu_init();  // we may run before the runtime's own constructors
  return __builtin_cpu_supports("sse4.2");
}
const bool kHaveSse42 = detect_sse42();
#else
const bool kHaveSse42 = false;
#endif

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w = load_le64(p) ^ c;
    c = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
        kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^ kTables[2][(w >> 40) & 0xff] ^
        kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
  }
  for (; n > 0; --n) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xff];
  return ~c;
}

bool crc32c_hardware_available() { return kHaveSse42; }

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_extend_sse42(crc, data, n);
#endif
  return crc32c_extend_portable(crc, data, n);
}

// ---- RecordWriter -----------------------------------------------------------

RecordWriter::RecordWriter(const std::string& path) : path_(path), buf_(new char[kWriteBuffer]) {
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) NCF_FAIL("cannot create record file ", path, ": ", errno_text(errno));
  std::setvbuf(f_, buf_.get(), _IOFBF, kWriteBuffer);
}

RecordWriter::~RecordWriter() {
  // Destructors must not throw; a caller that cares about write errors calls close().
  if (f_) std::fclose(f_);
}

void RecordWriter::put(const void* p, size_t n) {
  if (n == 0) return;
  if (std::fwrite(p, 1, n, f_) != n)
    NCF_FAIL("write to record file ", path_, " failed at byte offset ", bytes_, ": ",
             errno_text(errno));
  file_crc_ = crc32c_extend(file_crc_, p, n);
  bytes_ += n;
}

void RecordWriter::write(const void* payload, size_t n) {
  NCF_CHECK(f_ != nullptr, "write to closed record file ", path_);
  unsigned char header[kHeaderBytes];
  store_le64(header, n);
  store_le32(header + 8, masked_crc32c(header, 8));
  unsigned char trailer[4];
  store_le32(trailer, masked_crc32c(payload, n));
  put(header, sizeof header);
  put(payload, n);
  put(trailer, sizeof trailer);
}

void RecordWriter::close() {
  if (!f_) return;
  std::FILE* f = f_;
  f_ = nullptr;
  // fflush first so errno names the failing write (ENOSPC, EIO) rather than
  // whatever fclose leaves behind.
  errno = 0;
  bool failed = std::fflush(f) != 0 || std::ferror(f) != 0;
  int err = errno;
  if (std::fclose(f) != 0 && !failed) {
    failed = true;
    err = errno;
  }
  if (failed)
    NCF_FAIL("error closing record file ", path_, " after ", bytes_,
             " bytes: ", err ? errno_text(err) : std::string("I/O error"));
}

// ---- RecordReader -----------------------------------------------------------

RecordReader::RecordReader(const std::string& path) : path_(path), buf_(new char[kReadBuffer]) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) NCF_FAIL("cannot open record file ", path, ": ", errno_text(errno));
  struct stat st;
  if (fstat(fileno(f_), &st) != 0) {
    int err = errno;
    std::fclose(f_);
    f_ = nullptr;
    NCF_FAIL("cannot stat record file ", path, ": ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    std::fclose(f_);
    f_ = nullptr;
    NCF_FAIL("record file ", path, " is not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  std::setvbuf(f_, buf_.get(), _IOFBF, kReadBuffer);
}

RecordReader::~RecordReader() {
  if (f_) std::fclose(f_);
}

void RecordReader::seek(uint64_t offset) {
  if (offset > size_)
    NCF_FAIL("record file ", path_, ": seek to byte offset ", offset, " is past the end (", size_,
             " bytes)");
  if (fseeko(f_, static_cast<off_t>(offset), SEEK_SET) != 0)
    NCF_FAIL("record file ", path_, ": seek to byte offset ", offset,
             " failed: ", errno_text(errno));
  offset_ = offset;
}

bool RecordReader::read(std::string* payload, uint64_t max_len) {
  unsigned char header[kHeaderBytes];
  size_t got = std::fread(header, 1, sizeof header, f_);
  if (got < sizeof header) {
    if (std::ferror(f_))
      NCF_FAIL("record file ", path_, ": read error at byte offset ", offset_, ": ",
               errno_text(errno));
    if (got == 0) return false;  // clean end, exactly at a record boundary
    NCF_FAIL("record file ", path_, ": truncated record header at byte offset ", offset_, " (", got,
             " of ", kHeaderBytes, " bytes before end of file)");
  }
  const uint64_t len = load_le64(header);
  const uint32_t stored_len_crc = load_le32(header + 8);
  const uint32_t len_crc = masked_crc32c(header, 8);
  if (stored_len_crc != len_crc)
    NCF_FAIL("record file ", path_, ": bad length CRC in record at byte offset ", offset_,
             " (length field ", len, ", stored masked CRC 0x", std::hex, stored_len_crc,
             ", computed 0x", len_crc, ")");
  if (len > max_len)
    NCF_FAIL("record file ", path_, ": record at byte offset ", offset_, " has length ", len,
             ", above the limit of ", max_len, " bytes");
  // size_ >= offset_ + 12 here unless the file shrank under us; guard anyway.
  const uint64_t left = size_ > offset_ ? size_ - offset_ : 0;
  if (left < frame_bytes(0) || len > left - frame_bytes(0))
    NCF_FAIL("record file ", path_, ": record at byte offset ", offset_, " has length ", len,
             ", which runs past the end of the file (", size_,
             " bytes): truncated or corrupt length");

  payload->resize(len);
  unsigned char trailer[4];
  if ((len > 0 && std::fread(&(*payload)[0], 1, len, f_) != len) ||
      std::fread(trailer, 1, sizeof trailer, f_) != sizeof trailer)
    NCF_FAIL("record file ", path_, ": short read in record at byte offset ", offset_, " (length ",
             len, "): ", std::ferror(f_) ? errno_text(errno) : "file shrank");
  const uint32_t stored_crc = load_le32(trailer);
  const uint32_t crc = masked_crc32c(payload->data(), len);
  if (stored_crc != crc)
    NCF_FAIL("record file ", path_, ": bad payload CRC in record at byte offset ", offset_,
             " (length ", len, ", stored masked CRC 0x", std::hex, stored_crc, ", computed 0x", crc,
             ")");
  offset_ += frame_bytes(len);
  return true;
}

}  // namespace ncf
