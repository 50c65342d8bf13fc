// TFRecord framing and CRC-32C (Castagnoli):
//   uint64 length (LE) | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)
// Every framing error names the file and the byte offset of the bad record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace ncf {

// CRC-32C of data, continuing from crc (0 for a fresh CRC). Uses SSE4.2 when the
// CPU has it, a table otherwise; both give the same value.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
// The table (slicing-by-8) path, always available; exposed so tests and
// bench_crc can hold the two paths against each other.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
// True when crc32c_extend runs on the SSE4.2 crc32 instruction.
bool crc32c_hardware_available();
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }
inline uint32_t mask_crc(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
inline uint32_t unmask_crc(uint32_t m) {
  uint32_t r = m - 0xa282ead8u;
  return (r >> 17) | (r << 15);
}
inline uint32_t masked_crc32c(const void* data, size_t n) { return mask_crc(crc32c(data, n)); }

// Bytes a payload of n bytes occupies in a file.
inline uint64_t frame_bytes(uint64_t n) { return n + 16; }

// Appends framed records to a new file. Tracks bytes written and a CRC-32C of
// the whole file (recorded in the dataset metadata).
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  void write(const void* payload, size_t n);
  void write(const std::string& payload) { write(payload.data(), payload.size()); }
  // Flushes and closes; errors (disk full…) throw naming the file.
  void close();

  uint64_t bytes_written() const { return bytes_; }
  uint32_t file_crc() const { return file_crc_; }
  const std::string& path() const { return path_; }

 private:
  void put(const void* p, size_t n);
  std::string path_;
  std::FILE* f_ = nullptr;
  std::unique_ptr<char[]> buf_;  // stdio buffer; must outlive f_
  uint64_t bytes_ = 0;
  uint32_t file_crc_ = 0;
};

// Reads framed records from a file, sequentially or at a byte offset, checking
// both CRCs and that the record lies wholly inside the file.
class RecordReader {
 public:
  explicit RecordReader(const std::string& path);
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // Reads the record at the current position into *payload and advances.
  // Returns false at a clean end of file; throws ncf::Error naming the file and
  // byte offset on truncation, bad length CRC or bad payload CRC.
  // max_len bounds the length field (a corrupt length must not allocate GBs).
  // After a throw, seek() before reading again.
  bool read(std::string* payload, uint64_t max_len = (1ull << 31));
  // Positions the reader at a record boundary (offset <= file_size()).
  void seek(uint64_t offset);
  uint64_t offset() const { return offset_; }
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::unique_ptr<char[]> buf_;  // stdio buffer; must outlive f_
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

}  // namespace ncf
