// The dataset's byte layouts (see format.h): frames, shard headers, train and
// eval records, positives.bin, and the ShardCursor that walks shard files.
#include "data/format.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/check.h"
#include "data/ncf_record.pb.h"

namespace ncf {
namespace {

#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
// Shard files are written once, front to back: a big buffer turns many small
// frame pieces into few large write(2) calls.
constexpr size_t kWriteBuffer = size_t{4} << 20;
// Reads are mostly sequential, but seek() followed by a small read refills the
// whole buffer, so it is kept smaller than the writer's.
constexpr size_t kReadBuffer = size_t{1} << 20;
// file_crc32c reads whole files in pieces of this size.
constexpr size_t kCrcChunk = size_t{4} << 20;
#else
// The fuzz targets' build (fuzz/CMakeLists.txt): AddressSanitizer poisons and
// unpoisons every byte of an allocation this large when it is made and freed,
// which made each small file the targets write cost milliseconds. Only the
// sizes of the buffers differ; the bytes written and read are the same.
constexpr size_t kWriteBuffer = size_t{64} << 10;
constexpr size_t kReadBuffer = size_t{64} << 10;
constexpr size_t kCrcChunk = size_t{64} << 10;
#endif
constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of it
// A shard header is a few dozen bytes; a larger length field is corruption.
constexpr uint64_t kMaxHeaderBytes = 1 << 20;

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
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

std::string errno_text(int err) { return std::strerror(err); }

// positives.bin's fixed-size header.
constexpr char kPositivesMagic[8] = {'N', 'C', 'F', 'P', 'O', 'S', '0', '1'};
struct PositivesHeader {
  char magic[8];
  uint64_t num_users;
  uint64_t nnz;
  uint64_t reserved;
};
uint64_t positives_items_offset(uint64_t num_users) {
  return sizeof(PositivesHeader) + (num_users + 1) * 8;
}
uint64_t positives_file_bytes(uint64_t num_users, uint64_t nnz) {
  return positives_items_offset(num_users) + nnz * 4;
}

std::string encode_shard_header(const DatasetMeta& meta, const ShardInfo& si, uint32_t index,
                                uint32_t count) {
  const bool train = si.kind == "train";
  proto::ShardHeader h;
  h.set_format_version(meta.format_version);
  h.set_kind(train ? proto::TRAIN : proto::EVAL);
  h.set_shard_index(index);
  h.set_num_shards(count);
  h.set_num_records(si.num_records);
  h.set_record_rows(train ? meta.train_record_rows : meta.eval_negatives + 1);
  h.set_first_record(si.first_record);
  h.set_num_users(meta.num_users);
  h.set_num_items(meta.num_items);
  h.set_num_valid_rows(si.num_valid_rows);
  h.set_dataset_id(meta.dataset_id);
  return h.SerializeAsString();
}

// The first 64 bytes of s for a message, each byte outside printable ASCII as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t k = 0; k < s.size() && k < 64; ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

// Parses and checks a shard's header record against the metadata.
void check_shard_header(const std::string& payload, const DatasetMeta& meta, const ShardInfo& si,
                        uint32_t index, uint32_t count, const std::string& path, uint64_t offset) {
  proto::ShardHeader h;
  if (!h.ParseFromString(payload))
    NCF_FAIL(path, " at byte offset ", offset, ": shard header does not parse");
  if (h.format_version() != meta.format_version)
    NCF_FAIL(path, " at byte offset ", offset, ": format version ", h.format_version(),
             " but the metadata's is ", meta.format_version, ": re-run ncf_prep");
  const bool train = si.kind == "train";
  if (h.kind() != (train ? proto::TRAIN : proto::EVAL))
    NCF_FAIL(path, " at byte offset ", offset, ": shard kind ", proto::ShardKind_Name(h.kind()),
             " but the metadata lists it as ", si.kind);
  if (h.dataset_id() != meta.dataset_id)
    NCF_FAIL(path, " at byte offset ", offset, ": dataset id '", printable(h.dataset_id()),
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
}

}  // namespace

// ---------------------------------------------------------------- framing ---

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

void RecordWriter::flush() {
  NCF_CHECK(f_, "record file ", path_, " is closed");
  errno = 0;
  if (std::fflush(f_) != 0 || std::ferror(f_) != 0) {
    const int err = errno;
    NCF_FAIL("error writing record file ", path_, " after ", bytes_,
             " bytes: ", err ? errno_text(err) : std::string("I/O error"));
  }
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

// ------------------------------------------------------------ shard files ---

std::string shard_file_name(const std::string& kind, uint32_t index, uint32_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05u-of-%05u.tfrecord", index, count);
  return kind + buf;
}

bool is_shard_file_name(const std::string& name) {
  // Parsed by hand: sscanf's %u would also take signs and spaces.
  size_t at = 0;
  if (name.rfind("train-", 0) == 0)
    at = 6;
  else if (name.rfind("eval-", 0) == 0)
    at = 5;
  else
    return false;
  auto digits = [&]() {
    const size_t from = at;
    while (at < name.size() && name[at] >= '0' && name[at] <= '9') ++at;
    return at > from;
  };
  if (!digits() || name.compare(at, 4, "-of-") != 0) return false;
  at += 4;
  return digits() && name.compare(at, std::string::npos, ".tfrecord") == 0;
}

uint64_t train_frame_bytes(uint32_t record_rows) {
  proto::TrainRecord r;
  r.set_num_valid(record_rows);
  r.set_users(std::string(size_t(record_rows) * 4, '\0'));
  r.set_items(std::string(size_t(record_rows) * 4, '\0'));
  return frame_bytes(r.ByteSizeLong());
}

uint64_t eval_frame_bytes(uint32_t list_len) {
  proto::EvalRecord e;
  e.set_user(0);
  e.set_items(std::string(size_t(list_len) * 4, '\0'));
  e.set_dup_mask(std::string((size_t(list_len) + 7) / 8, '\0'));
  return frame_bytes(e.ByteSizeLong());
}

uint64_t train_record_valid_rows(const DatasetMeta& meta, uint64_t g) {
  const uint64_t num_records = meta.num_train_records(), rows = meta.train_record_rows;
  return g + 1 < num_records ? rows : meta.num_train - (num_records - 1) * rows;
}

ShardCursor::ShardCursor(const std::string& dir, const DatasetMeta& meta, const std::string& kind,
                         uint32_t index)
    : info_(*meta.shards_of(kind).at(index)), path_(dir + "/" + info_.name) {
  in_ = std::make_unique<RecordReader>(path_);
  const uint32_t count = static_cast<uint32_t>(meta.shards_of(kind).size());
  frame_ = kind == "train" ? meta.train_frame_bytes : meta.eval_frame_bytes;
  const uint64_t size = in_->file_size();
  if (size != info_.bytes)
    NCF_FAIL(path_, " at byte offset ", std::min(size, info_.bytes), ": file has ", size,
             " bytes but the metadata says ", info_.bytes);
  std::string payload;
  if (!in_->read(&payload, kMaxHeaderBytes))
    NCF_FAIL(path_, ": empty shard file (no header record)");
  check_shard_header(payload, meta, info_, index, count, path_, 0);
  data_offset_ = in_->offset();
  if (offset_of(info_.num_records) != info_.bytes)
    NCF_FAIL(path_, ": ", info_.num_records, " records of ", frame_, " bytes after a ",
             data_offset_, "-byte header do not fill the file's ", info_.bytes, " bytes");
}

ShardCursor::ShardCursor(const std::string& dir, const DatasetMeta& meta, const ShardInfo& info,
                         uint32_t index, uint32_t count)
    : info_(info), path_(dir + "/" + info.name) {
  NCF_CHECK(info.kind == "train" || info.kind == "eval", "shard kind '", info.kind, "'");
  frame_ = info.kind == "train" ? meta.train_frame_bytes : meta.eval_frame_bytes;
  out_ = std::make_unique<RecordWriter>(path_);
  out_->write(encode_shard_header(meta, info_, index, count));
  data_offset_ = out_->bytes_written();
}

ShardCursor::~ShardCursor() = default;

uint64_t ShardCursor::read_at(uint64_t offset, uint64_t k, std::string* payload) {
  NCF_CHECK(in_ != nullptr, path_, ": shard opened for writing is read");
  in_->seek(offset);
  if (!in_->read(payload, frame_))
    NCF_FAIL(path_, " at byte offset ", offset, ": file ends after ", k, " of ", info_.num_records,
             " records");
  if (frame_bytes(payload->size()) != frame_)
    NCF_FAIL(path_, " at byte offset ", offset, ": record frame is ", frame_bytes(payload->size()),
             " bytes, expected ", frame_);
  return offset;
}

uint64_t ShardCursor::read(uint64_t k, std::string* payload) {
  NCF_CHECK(k < info_.num_records, path_, ": record ", k, " of ", info_.num_records);
  next_ = k + 1;
  return read_at(offset_of(k), k, payload);
}

bool ShardCursor::next(std::string* payload, uint64_t* offset) {
  const uint64_t at = offset_of(next_);
  if (next_ == info_.num_records) {
    if (at != in_->file_size())
      NCF_FAIL(path_, " at byte offset ", at, ": extra bytes after the ", info_.num_records,
               " records the header announces");
    return false;
  }
  *offset = read_at(at, next_, payload);
  ++next_;
  return true;
}

uint64_t ShardCursor::append(const std::string& payload) {
  NCF_CHECK(out_ != nullptr, path_, ": shard opened for reading is appended to");
  const uint64_t at = offset_of(next_);
  if (next_ == info_.num_records)
    NCF_FAIL(path_, " at byte offset ", at, ": record ", next_ + 1, " appended to a shard of ",
             info_.num_records, " records");
  if (frame_bytes(payload.size()) != frame_)
    NCF_FAIL(path_, " at byte offset ", at, ": record frame is ", frame_bytes(payload.size()),
             " bytes, expected ", frame_);
  out_->write(payload);
  ++next_;
  return at;
}

const ShardInfo& ShardCursor::close() {
  NCF_CHECK(out_ != nullptr, path_, ": shard opened for reading is closed for writing");
  if (next_ != info_.num_records)
    NCF_FAIL(path_, " at byte offset ", offset_of(next_), ": ", next_, " records written, the ",
             "header announces ", info_.num_records);
  out_->close();
  info_.bytes = out_->bytes_written();
  info_.crc32c = out_->file_crc();
  out_.reset();
  return info_;
}

// ---------------------------------------------------------------- records ---

void encode_train_record(const int32_t* users, const int32_t* items, uint32_t valid,
                         uint32_t record_rows, std::string* payload) {
  NCF_CHECK(valid <= record_rows, "train record of ", record_rows, " rows with ", valid, " valid");
  thread_local proto::TrainRecord rec;
  const size_t bytes = size_t(record_rows) * 4;
  rec.set_num_valid(valid);
  std::string* u = rec.mutable_users();
  std::string* i = rec.mutable_items();
  u->assign(bytes, '\0');
  i->assign(bytes, '\0');
  if (valid) {
    std::memcpy(&(*u)[0], users, size_t(valid) * 4);
    std::memcpy(&(*i)[0], items, size_t(valid) * 4);
  }
  rec.SerializeToString(payload);
}

void decode_train_record(const std::string& payload, const DatasetMeta& meta,
                         uint64_t expected_valid, const std::string& path, uint64_t offset,
                         int32_t* users, int32_t* items) {
  thread_local proto::TrainRecord rec;
  if (!rec.ParseFromString(payload))
    NCF_FAIL(path, " at byte offset ", offset, ": train record does not parse");
  const uint64_t rows = meta.train_record_rows;
  if (!rec.has_num_valid() || rec.num_valid() != expected_valid)
    NCF_FAIL(path, " at byte offset ", offset, ": train record has ", rec.num_valid(),
             " valid rows, expected ", expected_valid);
  if (rec.users().size() != rows * 4 || rec.items().size() != rows * 4)
    NCF_FAIL(path, " at byte offset ", offset, ": train record arrays hold ", rec.users().size(),
             "/", rec.items().size(), " bytes, expected ", rows * 4);
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

void encode_eval_record(uint64_t user, const int32_t* items, size_t n, std::string* payload,
                        const uint8_t* given_mask) {
  thread_local proto::EvalRecord rec;
  thread_local std::vector<uint8_t> mask;
  thread_local std::string bits;
  bits.resize((n + 7) / 8);
  if (given_mask) {
    pack_mask(given_mask, n, bits.data());
  } else {
    mask.resize(n);
    duplicate_mask(items, n, mask.data());
    pack_mask(mask.data(), n, bits.data());
  }
  rec.set_user(static_cast<uint32_t>(user));
  rec.set_items(reinterpret_cast<const char*>(items), n * 4);
  rec.set_dup_mask(bits);
  rec.SerializeToString(payload);
}

int64_t decode_eval_record(const std::string& payload, const DatasetMeta& meta, uint64_t record,
                           int64_t after, const std::string& path, uint64_t offset, int32_t* items,
                           uint8_t* mask) {
  thread_local proto::EvalRecord rec;
  thread_local std::vector<uint8_t> want;
  if (!rec.ParseFromString(payload))
    NCF_FAIL(path, " at byte offset ", offset, ": eval record does not parse");
  const uint64_t L = uint64_t(meta.eval_negatives) + 1;
  if (meta.every_user_evaluated()) {
    if (!rec.has_user() || rec.user() != record)
      NCF_FAIL(path, " at byte offset ", offset, ": eval record is for user ", rec.user(),
               ", expected ", record);
  } else if (!rec.has_user() || int64_t(rec.user()) <= after || rec.user() >= meta.num_users) {
    NCF_FAIL(path, " at byte offset ", offset, ": eval record ", record, " is for user ",
             rec.user(), ", expected one in (", after, ", ", meta.num_users,
             ") (records name ascending users)");
  }
  const uint64_t expected_user = rec.user();
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
  if (meta.eval_masks_given) {
    const size_t bad = given_mask_mismatch(items, L, mask);
    if (bad != L)
      NCF_FAIL(path, " at byte offset ", offset, ": duplicate mask of user ", expected_user,
               " does not match its items at position ", bad, " (item ", items[bad], ", mask ",
               int(mask[bad]), ")");
    return int64_t(expected_user);
  }
  want.resize(L);
  duplicate_mask(items, L, want.data());
  if (std::memcmp(want.data(), mask, L) != 0)
    NCF_FAIL(path, " at byte offset ", offset, ": duplicate mask of user ", expected_user,
             " does not match its items");
  return int64_t(expected_user);
}

void pack_mask(const uint8_t* mask, size_t n, char* bits) {
  std::memset(bits, 0, (n + 7) / 8);
  for (size_t j = 0; j < n; ++j)
    if (mask[j]) bits[j >> 3] = char(uint8_t(bits[j >> 3]) | (1u << (j & 7)));
}

void unpack_mask(const char* bits, size_t n, uint8_t* mask) {
  for (size_t j = 0; j < n; ++j) mask[j] = (uint8_t(bits[j >> 3]) >> (j & 7)) & 1;
}

// ----------------------------------------------------------- positives.bin ---

PositivesWriter::PositivesWriter(const std::string& path, uint64_t num_users)
    : path_(path), offsets_(num_users + 1, 0) {
  f_ = std::fopen(path.c_str(), "w+b");
  if (!f_) NCF_FAIL("cannot create ", path, ": ", errno_text(errno));
  if (fseeko(f_, static_cast<off_t>(positives_items_offset(num_users)), SEEK_SET) != 0)
    NCF_FAIL("seek failed on ", path);
}

PositivesWriter::~PositivesWriter() {
  if (f_) std::fclose(f_);
}

void PositivesWriter::add(const int32_t* items, size_t n) {
  NCF_CHECK(users_ + 1 < offsets_.size(), path_, ": more users than the ", offsets_.size() - 1,
            " planned");
  if (n && std::fwrite(items, 4, n, f_) != n) NCF_FAIL("write failed on ", path_, " (disk full?)");
  nnz_ += n;
  offsets_[++users_] = static_cast<int64_t>(nnz_);
}

void PositivesWriter::finish(uint64_t* bytes, uint32_t* crc) {
  PositivesHeader h{};
  std::memcpy(h.magic, kPositivesMagic, 8);
  h.num_users = offsets_.size() - 1;
  h.nnz = nnz_;
  if (fseeko(f_, 0, SEEK_SET) != 0 || std::fwrite(&h, sizeof h, 1, f_) != 1 ||
      std::fwrite(offsets_.data(), 8, offsets_.size(), f_) != offsets_.size())
    NCF_FAIL("write failed on ", path_, " (disk full?)");
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) NCF_FAIL("close failed on ", path_);
  std::vector<int64_t>().swap(offsets_);
  file_crc32c(path_, bytes, crc);
}

PositiveLists::PositiveLists(const std::string& dir, const DatasetMeta& meta) {
  std::string path = dir + "/" + kPositivesFile;
  // The layout fixes the size from the counts; a metadata whose recorded size
  // disagrees was not written by ncf_prep. Counted without wrapping: 2^62 + k
  // positives would make the size of k and pass, and every list would then be
  // read past the end of the file.
  if (meta.num_positives > (UINT64_MAX - positives_items_offset(meta.num_users)) / 4)
    NCF_FAIL(dir, "/", kMetadataFile, ": num_positives ", meta.num_positives, " with ",
             meta.num_users, " users is more than a positives.bin can hold; re-run ncf_prep");
  const uint64_t want = positives_file_bytes(meta.num_users, meta.num_positives);
  if (meta.positives_bytes != want)
    NCF_FAIL(dir, "/", kMetadataFile, ": positives.bytes is ", meta.positives_bytes, " but ",
             meta.num_users, " users and ", meta.num_positives, " positives make ", want,
             " bytes; re-run ncf_prep");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) NCF_FAIL("cannot open ", path, ": ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    NCF_FAIL("cannot stat ", path, ": ", std::strerror(err));
  }
  if (static_cast<uint64_t>(st.st_size) != want) {
    ::close(fd);
    NCF_FAIL(path, ": file has ", st.st_size, " bytes, the metadata says ", want,
             ": truncated or replaced after ncf_prep wrote it; re-run ncf_prep");
  }
  map_bytes_ = want;
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    NCF_FAIL("mmap failed on ", path, ": ", std::strerror(errno));
  }
  // The destructor does not run when the constructor throws: unmap here.
  try {
    // The whole file against the metadata's CRC before anything in it is
    // trusted (tens of MB take milliseconds): the negative sampler reads it
    // with no other check, so a flipped byte would silently change training.
    const uint32_t crc = crc32c(map_, map_bytes_);
    if (crc != meta.positives_crc32c) {
      char msg[96];
      std::snprintf(msg, sizeof msg, "CRC-32C 0x%08x, the metadata says 0x%08x", crc,
                    meta.positives_crc32c);
      NCF_FAIL(path, ": ", msg, " (", want,
               " bytes): the file changed after ncf_prep wrote it; re-run ncf_prep "
               "(ncf_prep --verify shows what is wrong)");
    }
    const auto* h = static_cast<const PositivesHeader*>(map_);
    if (std::memcmp(h->magic, kPositivesMagic, 8) != 0)
      NCF_FAIL(path, " at byte 0: bad magic (not a positives file)");
    if (h->num_users != meta.num_users || h->nnz != meta.num_positives)
      NCF_FAIL(path, " at byte 8: header says ", h->num_users, " users / ", h->nnz,
               " positives, the metadata ", meta.num_users, " / ", meta.num_positives);
    num_users_ = h->num_users;
    nnz_ = h->nnz;
    offsets_ = reinterpret_cast<const int64_t*>(static_cast<const char*>(map_) + sizeof(*h));
    items_ = reinterpret_cast<const int32_t*>(static_cast<const char*>(map_) +
                                              positives_items_offset(num_users_));
    if (offsets_[0] != 0 || offsets_[num_users_] != static_cast<int64_t>(nnz_))
      NCF_FAIL(path, ": offsets run from ", offsets_[0], " to ", offsets_[num_users_],
               ", expected 0 to ", nnz_);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

PositiveLists::~PositiveLists() {
  if (map_) ::munmap(map_, map_bytes_);
}

void check_positive_lists(const PositiveLists& pos, const DatasetMeta& meta,
                          const std::string& pos_path) {
  for (uint64_t u = 0; u < pos.num_users(); ++u) {
    int64_t a = pos.offsets()[u], b = pos.offsets()[u + 1];
    if (a > b || b > static_cast<int64_t>(pos.nnz()))
      NCF_FAIL(pos_path, ": offsets of user ", u, " are [", a, ", ", b, ")");
    if (a == b) NCF_FAIL(pos_path, ": user ", u, " has no positives");
    for (int64_t k = a; k < b; ++k) {
      int32_t it = pos.items()[k];
      if (it < 0 || static_cast<uint64_t>(it) >= meta.num_items)
        NCF_FAIL(pos_path, " at byte offset ", positives_items_offset(meta.num_users) + 4 * k,
                 ": item id ", it, " of user ", u, " out of range [0, ", meta.num_items, ")");
      if (k > a && it <= pos.items()[k - 1])
        NCF_FAIL(pos_path, " at byte offset ", positives_items_offset(meta.num_users) + 4 * k,
                 ": positives of user ", u, " are not sorted and distinct");
    }
  }
}

// ------------------------------------------------------------- whole files ---

void file_crc32c(const std::string& path, uint64_t* bytes, uint32_t* crc) {
  // Not zero-filled: fread fills what is used, and most files checksummed are
  // far smaller than the buffer.
  std::unique_ptr<char[]> buf(new char[kCrcChunk]);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) NCF_FAIL("cannot open ", path, ": ", std::strerror(errno));
  uint32_t c = 0;
  uint64_t n = 0;
  size_t got;
  while ((got = std::fread(buf.get(), 1, kCrcChunk, f)) > 0) {
    c = crc32c_extend(c, buf.get(), got);
    n += got;
  }
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) NCF_FAIL("read error on ", path);
  *bytes = n;
  *crc = c;
}

}  // namespace ncf
