// The dataset format, in one place for the writer, the readers and --verify:
// the shard header message, the positives.bin layout, the valid rows of each
// train record, the shard cursor every reader walks shards with, and record
// decoding with the checks every reader applies (sizes, counts, id ranges).
// The framing itself (length, CRCs) is record_io.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/ncf_record.pb.h"
#include "data/record_io.h"

namespace ncf {

// positives.bin = Header | offsets[U + 1] (int64 LE) | items[nnz] (int32 LE).
struct PositivesLayout {
  static constexpr char kMagic[8] = {'N', 'C', 'F', 'P', 'O', 'S', '0', '1'};
  struct Header {
    char magic[8];
    uint64_t num_users;
    uint64_t nnz;
    uint64_t reserved;
  };
  static uint64_t items_offset(uint64_t U) { return sizeof(Header) + (U + 1) * 8; }
  static uint64_t file_bytes(uint64_t U, uint64_t nnz) { return items_offset(U) + nnz * 4; }
};

// Valid rows of train record g: train_record_rows, except the last record's.
uint64_t train_record_valid_rows(const DatasetMeta& meta, uint64_t g);

// One shard file of a dataset, opened for reading: its size is checked against
// the metadata and its header record against the metadata and its place among
// the shards; then its records, all `frame()` bytes, are read by index or in
// file order, each frame checked. Every error names the file and byte offset.
class ShardCursor {
 public:
  // Shard `index` of the shards of `kind` ("train" or "eval").
  ShardCursor(const std::string& dir, const DatasetMeta& meta, const std::string& kind,
              uint32_t index);
  const ShardInfo& info() const { return *info_; }
  const std::string& path() const { return reader_.path(); }
  uint64_t frame() const { return frame_; }
  // Reads record k of this shard (0-based) into *payload; returns its offset.
  uint64_t read(uint64_t k, std::string* payload);
  // The record after the last one read (the first after the header at the
  // start); false once all the header's records are read, after checking that
  // nothing follows them. *offset receives the record's byte offset.
  bool next(std::string* payload, uint64_t* offset);

 private:
  uint64_t read_at(uint64_t offset, uint64_t k, std::string* payload);
  const ShardInfo* info_;
  RecordReader reader_;
  uint64_t frame_ = 0, data_offset_ = 0, next_ = 0;
};

proto::ShardHeader shard_header(const DatasetMeta& meta, proto::ShardKind kind, uint32_t s,
                                uint32_t S, const ShardInfo& si, uint32_t rows);

// Size and CRC-32C of a whole file.
void file_crc32c(const std::string& path, uint64_t* bytes, uint32_t* crc);

// Parses and checks a shard's header record against the metadata.
proto::ShardHeader check_shard_header(const std::string& payload, const DatasetMeta& meta,
                                      const ShardInfo& si, uint32_t index, uint32_t count,
                                      const std::string& path, uint64_t offset);

// Decodes a train record: checks num_valid against `expected_valid`, array
// sizes, and every valid id's range. Copies valid rows to users/items.
void decode_train_record(const std::string& payload, const DatasetMeta& meta,
                         uint64_t expected_valid, const std::string& path, uint64_t offset,
                         int32_t* users, int32_t* items);

// Duplicate masks are stored one bit per list entry, least significant first.
void pack_mask(const uint8_t* mask, size_t n, char* bits);
void unpack_mask(const char* bits, size_t n, uint8_t* mask);

// Decodes an eval record of global index `expected_user`: sizes, user id, item
// ranges and that the duplicate mask matches the items.
void decode_eval_record(const std::string& payload, const DatasetMeta& meta, uint64_t expected_user,
                        const std::string& path, uint64_t offset, int32_t* items, uint8_t* mask);

}  // namespace ncf
