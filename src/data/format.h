// The byte layouts of a dataset directory, in one place (docs/design.md,
// "Record shards"): TFRecord framing with masked CRC-32C, the protobuf
// payloads of ncf_record.proto (shard header, train record, eval record), the
// frame sizes and valid-row counts they imply, the ShardCursor that the writer,
// the readers and --verify all walk shard files with, and the positives.bin
// layout. No other file encodes or decodes these bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/crc32c.h"
#include "data/dataset.h"

namespace ncf {

// ---------------------------------------------------------------- framing ---
//   uint64 length (LE) | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)

inline uint32_t mask_crc(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
inline uint32_t unmask_crc(uint32_t m) {
  uint32_t r = m - 0xa282ead8u;
  return (r >> 17) | (r << 15);
}
inline uint32_t masked_crc32c(const void* data, size_t n) { return mask_crc(crc32c(data, n)); }

// Bytes a payload of n bytes occupies in a file.
inline uint64_t frame_bytes(uint64_t n) { return n + 16; }

// Appends frames to a new file, tracking bytes written and a CRC-32C of the
// whole file (recorded in the dataset metadata). The frame primitive under
// ShardCursor; tests use it to build damaged files.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  void write(const void* payload, size_t n);
  void write(const std::string& payload) { write(payload.data(), payload.size()); }
  // Hands what is buffered to the kernel, so readers see whole frames while the
  // file stays open; errors throw naming the file.
  void flush();
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

// Reads one frame at a time, at the current position or after a seek, checking
// both CRCs and that the frame lies wholly inside the file. The frame primitive
// under ShardCursor, which is what walks shard files.
class RecordReader {
 public:
  explicit RecordReader(const std::string& path);
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // Reads the frame at the current position into *payload and advances.
  // Returns false at a clean end of file; throws ncf::Error naming the file and
  // byte offset on truncation, bad length CRC or bad payload CRC.
  // max_len bounds the length field (a corrupt length must not allocate GBs).
  // After a throw, seek() before reading again.
  bool read(std::string* payload, uint64_t max_len = (1ull << 31));
  // Positions the reader at a frame boundary (offset <= file_size()).
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

// ----------------------------------------------------------- shard files ---

// "train-00001-of-00004.tfrecord".
std::string shard_file_name(const std::string& kind, uint32_t index, uint32_t count);
// True for the names shard_file_name writes: train- or eval-, digits, -of-,
// digits, .tfrecord.
bool is_shard_file_name(const std::string& name);

// Frame sizes, the same for every record of a kind in a dataset, so readers
// seek to record k directly.
uint64_t train_frame_bytes(uint32_t record_rows);
uint64_t eval_frame_bytes(uint32_t list_len);  // list_len = L = 1 + E

// Valid rows of train record g: train_record_rows, except the last record's.
uint64_t train_record_valid_rows(const DatasetMeta& meta, uint64_t g);

// One shard file of a dataset, walked frame by frame: a header record, then
// info().num_records records of exactly frame() bytes each. Writing appends
// records after the header; reading checks the file's size and header against
// the metadata and reads records by index or in file order. Every error names
// the file and the byte offset.
class ShardCursor {
 public:
  // Reads shard `index` of the shards of `kind` ("train" or "eval").
  ShardCursor(const std::string& dir, const DatasetMeta& meta, const std::string& kind,
              uint32_t index);
  // Creates dir/info.name, shard `index` of `count` of info.kind, and writes its
  // header; meta's counts, dataset id and frame sizes must be final.
  ShardCursor(const std::string& dir, const DatasetMeta& meta, const ShardInfo& info,
              uint32_t index, uint32_t count);
  ~ShardCursor();

  const ShardInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  uint64_t frame() const { return frame_; }

  // Reading: record k of this shard (0-based) into *payload; returns its offset.
  uint64_t read(uint64_t k, std::string* payload);
  // Reading: the record after the last one read (the first after the header at
  // the start); false once all the header's records are read, after checking
  // that nothing follows them. *offset receives the record's byte offset.
  bool next(std::string* payload, uint64_t* offset);

  // Writing: appends the next record (it must fill frame() bytes); returns its offset.
  uint64_t append(const std::string& payload);
  // Writing: checks that every announced record was appended, closes the file
  // and returns info() with the file's size and CRC-32C filled in.
  const ShardInfo& close();

 private:
  uint64_t read_at(uint64_t offset, uint64_t k, std::string* payload);
  uint64_t offset_of(uint64_t k) const { return data_offset_ + k * frame_; }
  ShardInfo info_;
  std::string path_;
  std::unique_ptr<RecordReader> in_;
  std::unique_ptr<RecordWriter> out_;
  uint64_t frame_ = 0, data_offset_ = 0, next_ = 0;
};

// --------------------------------------------------------------- records ---

// A train record of record_rows rows whose first `valid` rows are users/items;
// the rest are zero padding.
void encode_train_record(const int32_t* users, const int32_t* items, uint32_t valid,
                         uint32_t record_rows, std::string* payload);

// Decodes a train record: checks num_valid against `expected_valid`, array
// sizes, and every valid id's range. Copies valid rows to users/items.
void decode_train_record(const std::string& payload, const DatasetMeta& meta,
                         uint64_t expected_valid, const std::string& path, uint64_t offset,
                         int32_t* users, int32_t* items);

// An eval record: the user's list of n = L items and its duplicate mask:
// `mask` when given (1 = counts), else duplicate_mask(items).
void encode_eval_record(uint64_t user, const int32_t* items, size_t n, std::string* payload,
                        const uint8_t* mask = nullptr);

// Decodes eval record `record` (its global index): sizes, user id, item ranges
// and that the duplicate mask matches the items (equal to
// duplicate_mask(items), or, when meta.eval_masks_given, accepted by
// given_mask_mismatch). The user must be `record` when every user has a
// record, else above `after` (the previous record's user, or -1) and below
// num_users. Returns the user.
int64_t decode_eval_record(const std::string& payload, const DatasetMeta& meta, uint64_t record,
                           int64_t after, const std::string& path, uint64_t offset, int32_t* items,
                           uint8_t* mask);

// Duplicate masks are stored one bit per list entry, least significant first.
void pack_mask(const uint8_t* mask, size_t n, char* bits);
void unpack_mask(const char* bits, size_t n, uint8_t* mask);

// ---------------------------------------------------------- positives.bin ---
// Header (magic, U, nnz, reserved) | offsets[U + 1] (int64 LE) | items[nnz] (int32 LE).

// Writes positives.bin as users arrive in id order; the header and offsets go
// in at finish().
class PositivesWriter {
 public:
  PositivesWriter(const std::string& path, uint64_t num_users);
  ~PositivesWriter();
  PositivesWriter(const PositivesWriter&) = delete;
  PositivesWriter& operator=(const PositivesWriter&) = delete;

  // The next user's sorted positives.
  void add(const int32_t* items, size_t n);
  uint64_t written() const { return nnz_; }
  // Writes header and offsets, closes, and returns the file's size and CRC-32C.
  void finish(uint64_t* bytes, uint32_t* crc);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<int64_t> offsets_;
  uint64_t users_ = 0, nnz_ = 0;
};

// Checks every list of an opened positives.bin: offsets in order, each user's
// items non-empty, sorted, distinct and below meta.num_items. Errors name the
// file and the byte offset of the bad entry.
void check_positive_lists(const PositiveLists& lists, const DatasetMeta& meta,
                          const std::string& path);

// -------------------------------------------------------------- whole files ---

// Size and CRC-32C of a whole file.
void file_crc32c(const std::string& path, uint64_t* bytes, uint32_t* crc);

}  // namespace ncf
