// On-disk details shared by the dataset writer, the readers and --verify: the
// shard header message, the positives.bin layout and record decoding with the
// checks every reader applies (sizes, counts, id ranges).
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "data/ncf_record.pb.h"

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
void decode_eval_record(const std::string& payload, const DatasetMeta& meta,
                        uint64_t expected_user, const std::string& path, uint64_t offset,
                        int32_t* items, uint8_t* mask);

}  // namespace ncf
