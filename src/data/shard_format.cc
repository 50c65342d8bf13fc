// Record decoding and checks shared by the per-rank readers and --verify, so a
// record is validated the same way wherever it is read.
#include "data/shard_format.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "data/record_io.h"

namespace ncf {

void file_crc32c(const std::string& path, uint64_t* bytes, uint32_t* crc) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) NCF_FAIL("cannot open ", path, ": ", std::strerror(errno));
  std::vector<char> buf(4 << 20);
  uint32_t c = 0;
  uint64_t n = 0;
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    c = crc32c_extend(c, buf.data(), got);
    n += got;
  }
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) NCF_FAIL("read error on ", path);
  *bytes = n;
  *crc = c;
}

proto::ShardHeader check_shard_header(const std::string& payload, const DatasetMeta& meta,
                                      const ShardInfo& si, uint32_t index, uint32_t count,
                                      const std::string& path, uint64_t offset) {
  proto::ShardHeader h;
  if (!h.ParseFromString(payload))
    NCF_FAIL(path, " at byte offset ", offset, ": shard header does not parse");
  if (h.format_version() != kFormatVersion)
    NCF_FAIL(path, " at byte offset ", offset, ": format version ", h.format_version(),
             " is not supported (expected ", kFormatVersion, ")");
  const bool train = si.kind == "train";
  if (h.kind() != (train ? proto::TRAIN : proto::EVAL))
    NCF_FAIL(path, " at byte offset ", offset, ": shard kind ", proto::ShardKind_Name(h.kind()),
             " but the metadata lists it as ", si.kind);
  if (h.dataset_id() != meta.dataset_id)
    NCF_FAIL(path, " at byte offset ", offset, ": dataset id '", h.dataset_id(),
             "' does not match the metadata's '", meta.dataset_id, "'");
  const uint32_t rows = train ? meta.train_record_rows : meta.eval_negatives + 1;
  auto mismatch = [&](const char* field, uint64_t got, uint64_t want) {
    NCF_FAIL(path, " at byte offset ", offset, ": header ", field, " is ", got,
             " but the metadata says ", want);
  };
  if (h.shard_index() != index) mismatch("shard_index", h.shard_index(), index);
  if (h.num_shards() != count) mismatch("num_shards", h.num_shards(), count);
  if (h.num_records() != si.num_records) mismatch("num_records", h.num_records(), si.num_records);
  if (h.first_record() != si.first_record)
    mismatch("first_record", h.first_record(), si.first_record);
  if (h.record_rows() != rows) mismatch("record_rows", h.record_rows(), rows);
  if (h.num_users() != meta.num_users) mismatch("num_users", h.num_users(), meta.num_users);
  if (h.num_items() != meta.num_items) mismatch("num_items", h.num_items(), meta.num_items);
  if (h.num_valid_rows() != si.num_valid_rows)
    mismatch("num_valid_rows", h.num_valid_rows(), si.num_valid_rows);
  return h;
}

void decode_train_record(const std::string& payload, const DatasetMeta& meta,
                         uint64_t expected_valid, const std::string& path, uint64_t offset,
                         int32_t* users, int32_t* items) {
  thread_local proto::TrainRecord rec;
  if (!rec.ParseFromString(payload))
    NCF_FAIL(path, " at byte offset ", offset, ": train record does not parse");
  const uint64_t R = meta.train_record_rows;
  if (!rec.has_num_valid() || rec.num_valid() != expected_valid)
    NCF_FAIL(path, " at byte offset ", offset, ": train record has ", rec.num_valid(),
             " valid rows, expected ", expected_valid);
  if (rec.users().size() != R * 4 || rec.items().size() != R * 4)
    NCF_FAIL(path, " at byte offset ", offset, ": train record arrays hold ", rec.users().size(),
             "/", rec.items().size(), " bytes, expected ", R * 4);
  std::memcpy(users, rec.users().data(), expected_valid * 4);
  std::memcpy(items, rec.items().data(), expected_valid * 4);
  const int64_t U = static_cast<int64_t>(meta.num_users), I = static_cast<int64_t>(meta.num_items);
  for (uint64_t k = 0; k < expected_valid; ++k) {
    if (users[k] < 0 || users[k] >= U)
      NCF_FAIL(path, " at byte offset ", offset, ": row ", k, " user id ", users[k],
               " out of range [0, ", U, ")");
    if (items[k] < 0 || items[k] >= I)
      NCF_FAIL(path, " at byte offset ", offset, ": row ", k, " item id ", items[k],
               " out of range [0, ", I, ")");
  }
}

void pack_mask(const uint8_t* mask, size_t n, char* bits) {
  std::memset(bits, 0, (n + 7) / 8);
  for (size_t j = 0; j < n; ++j)
    if (mask[j]) bits[j >> 3] = char(uint8_t(bits[j >> 3]) | (1u << (j & 7)));
}

void unpack_mask(const char* bits, size_t n, uint8_t* mask) {
  for (size_t j = 0; j < n; ++j) mask[j] = (uint8_t(bits[j >> 3]) >> (j & 7)) & 1;
}

void decode_eval_record(const std::string& payload, const DatasetMeta& meta, uint64_t expected_user,
                        const std::string& path, uint64_t offset, int32_t* items, uint8_t* mask) {
  thread_local proto::EvalRecord rec;
  thread_local std::vector<uint8_t> want;
  if (!rec.ParseFromString(payload))
    NCF_FAIL(path, " at byte offset ", offset, ": eval record does not parse");
  const uint64_t L = uint64_t(meta.eval_negatives) + 1;
  if (!rec.has_user() || rec.user() != expected_user)
    NCF_FAIL(path, " at byte offset ", offset, ": eval record is for user ", rec.user(),
             ", expected ", expected_user);
  if (rec.items().size() != L * 4 || rec.dup_mask().size() != (L + 7) / 8)
    NCF_FAIL(path, " at byte offset ", offset, ": eval record holds ", rec.items().size() / 4,
             " items and ", rec.dup_mask().size(), " mask bytes, expected ", L, " and ",
             (L + 7) / 8);
  std::memcpy(items, rec.items().data(), L * 4);
  unpack_mask(rec.dup_mask().data(), L, mask);
  const int64_t I = static_cast<int64_t>(meta.num_items);
  for (uint64_t k = 0; k < L; ++k)
    if (items[k] < 0 || items[k] >= I)
      NCF_FAIL(path, " at byte offset ", offset, ": eval item ", k, " id ", items[k],
               " out of range [0, ", I, ")");
  want.resize(L);
  duplicate_mask(items, L, want.data());
  if (std::memcmp(want.data(), mask, L) != 0)
    NCF_FAIL(path, " at byte offset ", offset, ": duplicate mask of user ", expected_user,
             " does not match its items");
}

uint64_t train_record_valid_rows(const DatasetMeta& meta, uint64_t g) {
  const uint64_t N = meta.num_train_records(), R = meta.train_record_rows;
  return g + 1 < N ? R : meta.num_train - (N - 1) * R;
}

ShardCursor::ShardCursor(const std::string& dir, const DatasetMeta& meta, const std::string& kind,
                         uint32_t index)
    : info_(meta.shards_of(kind).at(index)), reader_(dir + "/" + info_->name) {
  const auto shards = meta.shards_of(kind);
  frame_ = kind == "train" ? meta.train_frame_bytes : meta.eval_frame_bytes;
  const std::string& p = path();
  if (reader_.file_size() != info_->bytes)
    NCF_FAIL(p, " at byte offset ", std::min(reader_.file_size(), info_->bytes), ": file has ",
             reader_.file_size(), " bytes but the metadata says ", info_->bytes);
  std::string payload;
  if (!reader_.read(&payload, 1 << 20)) NCF_FAIL(p, ": empty shard file (no header record)");
  check_shard_header(payload, meta, *info_, index, static_cast<uint32_t>(shards.size()), p, 0);
  data_offset_ = reader_.offset();
  if (data_offset_ + info_->num_records * frame_ != info_->bytes)
    NCF_FAIL(p, ": ", info_->num_records, " records of ", frame_, " bytes after a ", data_offset_,
             "-byte header do not fill the file's ", info_->bytes, " bytes");
}

uint64_t ShardCursor::read_at(uint64_t offset, uint64_t k, std::string* payload) {
  reader_.seek(offset);
  if (!reader_.read(payload, frame_))
    NCF_FAIL(path(), " at byte offset ", offset, ": file ends after ", k, " of ",
             info_->num_records, " records");
  if (frame_bytes(payload->size()) != frame_)
    NCF_FAIL(path(), " at byte offset ", offset, ": record frame is ", frame_bytes(payload->size()),
             " bytes, expected ", frame_);
  return offset;
}

uint64_t ShardCursor::read(uint64_t k, std::string* payload) {
  NCF_CHECK(k < info_->num_records, path(), ": record ", k, " of ", info_->num_records);
  next_ = k + 1;
  return read_at(data_offset_ + k * frame_, k, payload);
}

bool ShardCursor::next(std::string* payload, uint64_t* offset) {
  const uint64_t at = data_offset_ + next_ * frame_;
  if (next_ == info_->num_records) {
    if (at != reader_.file_size())
      NCF_FAIL(path(), " at byte offset ", at, ": extra bytes after the ", info_->num_records,
               " records the header announces");
    return false;
  }
  *offset = read_at(at, next_, payload);
  ++next_;
  return true;
}

}  // namespace ncf
