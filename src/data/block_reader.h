// A file read front to back in blocks, plain or gzip-compressed, with bounded
// memory: a background thread reads (and inflates) the next blocks while the
// caller parses the current one, and at most kQueuedBlocks blocks wait. The
// whole file is never mapped, so the resident memory of a 5 GB input stays at a
// few blocks. It also keeps the byte count and CRC-32C of the content (after
// decompression), so a .gz file and its plain twin describe themselves alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ncf {

class BlockReader {
 public:
  static constexpr size_t kDefaultBlockBytes = size_t(32) << 20;
  static constexpr int kQueuedBlocks = 2;

  // Opens `path`; gzip when the file starts with the gzip magic (1f 8b), whatever
  // its name. Refuses a missing, unreadable or empty file or a directory, naming it.
  explicit BlockReader(const std::string& path, size_t block_bytes = kDefaultBlockBytes);
  ~BlockReader();
  BlockReader(const BlockReader&) = delete;
  BlockReader& operator=(const BlockReader&) = delete;

  // Appends the next block (up to block_bytes) to *out; returns the bytes
  // appended, 0 at the end of the content. Read or inflate errors (a truncated
  // .gz) are thrown here, naming the file.
  size_t append_next(std::vector<char>* out);

  bool gzip() const;
  uint64_t file_bytes() const;      // the size of the file on disk
  uint64_t content_bytes() const;   // bytes handed out so far
  uint32_t content_crc32c() const;  // CRC-32C of the bytes handed out so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ncf
