// CRC-32C against published vectors and across its two code paths; TFRecord
// framing round trips; every corruption names the file and the record's offset,
// in the frame primitive and in the ShardCursor that every reader walks with.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "data/format.h"
#include "test_util.h"

namespace ncf {
namespace {

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

// Runs f, expecting ncf::Error; returns its message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ncf::Error";
  return "";
}

bool has(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos;
}

// The independent reference: bit at a time, straight from the reflected polynomial.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
  }
  return ~c;
}

// ---- CRC-32C ----------------------------------------------------------------

// Published CRC-32C check values (the "123456789" check and the iSCSI vectors
// of RFC 3720 B.4), on both code paths.
TEST(Crc32c, PublishedVectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, 0), down(32, 0);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  struct Case {
    std::string data;
    uint32_t crc;
  } cases[] = {{"123456789", 0xE3069283u}, {zeros, 0x8A9136AAu}, {ones, 0x62A8AB43u},
               {up, 0x46DD794Eu},          {down, 0x113FDB5Cu},  {"", 0u}};
  for (const Case& c : cases) {
    EXPECT_EQ(crc_of(c.data), c.crc) << c.data.size() << " bytes";
    EXPECT_EQ(crc32c_extend_portable(0, c.data.data(), c.data.size()), c.crc);
    EXPECT_EQ(crc32c_bitwise(reinterpret_cast<const unsigned char*>(c.data.data()), c.data.size()),
              c.crc);
  }
}

TEST(Crc32c, IncrementalEqualsOneShot) {
  std::mt19937 rng(7);
  std::string s(1000, 0);
  for (char& ch : s) ch = static_cast<char>(rng());
  const uint32_t whole = crc_of(s);
  for (size_t a = 0; a <= s.size(); a += 37) {
    for (size_t b = a; b <= s.size(); b += 101) {
      uint32_t c = crc32c_extend(0, s.data(), a);
      c = crc32c_extend(c, s.data() + a, b - a);
      c = crc32c_extend(c, s.data() + b, s.size() - b);
      ASSERT_EQ(c, whole) << "splits at " << a << ", " << b;
      uint32_t p = crc32c_extend_portable(0, s.data(), a);
      p = crc32c_extend_portable(p, s.data() + a, s.size() - a);
      ASSERT_EQ(p, whole) << "portable split at " << a;
    }
  }
  // Byte by byte, the longest chain of extends.
  uint32_t c = 0;
  for (char ch : s) c = crc32c_extend(c, &ch, 1);
  EXPECT_EQ(c, whole);
}

// Every length 0..300 at every alignment 0..15, then some long buffers: the
// dispatching path (SSE4.2 here when the CPU has it), the table path and the
// bitwise reference agree.
TEST(Crc32c, PathsAgreeOnRandomData) {
  std::mt19937_64 rng(11);
  std::vector<unsigned char> buf(70000 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t align = 0; align < 16; ++align) {
    for (size_t n = 0; n <= 300; ++n) {
      const unsigned char* p = buf.data() + align;
      const uint32_t ref = crc32c_bitwise(p, n);
      ASSERT_EQ(crc32c(p, n), ref) << "n " << n << " align " << align;
      ASSERT_EQ(crc32c_extend_portable(0, p, n), ref) << "n " << n << " align " << align;
    }
  }
  for (size_t n : {4095u, 4096u, 65537u, 70000u}) {
    const uint32_t ref = crc32c_bitwise(buf.data() + 3, n);
    EXPECT_EQ(crc32c(buf.data() + 3, n), ref) << n;
    EXPECT_EQ(crc32c_extend_portable(0, buf.data() + 3, n), ref) << n;
  }
  if (!crc32c_hardware_available())
    GTEST_SKIP() << "no SSE4.2 on this CPU: only the table path was checked";
}

TEST(Crc32c, MaskByHandAndRoundTrip) {
  // c = 0xE3069283 ("123456789"):
  //   c >> 15            = 0x0001C60D
  //   c << 17 (32 bits)  = 0x25060000
  //   rotate             = 0x2507C60D
  //   + 0xA282EAD8 mod 2^32 = 0xC78AB0E5
  EXPECT_EQ(mask_crc(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(mask_crc(0), 0xA282EAD8u);
  EXPECT_EQ(unmask_crc(0xC78AB0E5u), 0xE3069283u);
  std::mt19937 rng(3);
  for (int i = 0; i < 10000; ++i) {
    uint32_t c = rng();
    ASSERT_EQ(unmask_crc(mask_crc(c)), c);
    ASSERT_EQ(mask_crc(unmask_crc(c)), c);
  }
}

// ---- framing ----------------------------------------------------------------

std::string random_payload(std::mt19937& rng, size_t n) {
  std::string s(n, 0);
  for (char& ch : s) ch = static_cast<char>(rng());
  return s;
}

TEST(RecordIo, FrameLayoutByHand) {
  test::TempDir dir;
  const std::string path = dir.file("one.rec");
  {
    RecordWriter w(path);
    w.write(std::string("abc"));
    w.close();
    EXPECT_EQ(w.bytes_written(), frame_bytes(3));
  }
  std::string expect;
  // length 3 as uint64 LE
  expect += std::string("\x03\0\0\0\0\0\0\0", 8);
  auto le32 = [](uint32_t v) {
    std::string s(4, 0);
    for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
    return s;
  };
  const unsigned char len_bytes[8] = {3, 0, 0, 0, 0, 0, 0, 0};
  expect += le32(mask_crc(crc32c_bitwise(len_bytes, 8)));
  expect += "abc";
  expect += le32(mask_crc(crc32c_bitwise(reinterpret_cast<const unsigned char*>("abc"), 3)));
  EXPECT_EQ(test::read_file(path), expect);
}

TEST(RecordIo, RoundTripAndSeek) {
  test::TempDir dir;
  const std::string path = dir.file("data.rec");
  std::mt19937 rng(5);
  std::vector<std::string> payloads;
  std::vector<uint64_t> offsets;
  uint64_t expect_bytes = 0;
  {
    RecordWriter w(path);
    EXPECT_EQ(w.path(), path);
    for (int i = 0; i < 200; ++i) {
      size_t n = (i % 10 == 0) ? 0 : (rng() % (i % 7 == 0 ? 100000 : 300));
      payloads.push_back(random_payload(rng, n));
      offsets.push_back(w.bytes_written());
      w.write(payloads.back());
      expect_bytes += frame_bytes(n);
      ASSERT_EQ(w.bytes_written(), expect_bytes);
    }
    w.close();
    w.close();  // second close is a no-op
    const std::string file = test::read_file(path);
    ASSERT_EQ(file.size(), expect_bytes);
    EXPECT_EQ(w.file_crc(),
              crc32c_bitwise(reinterpret_cast<const unsigned char*>(file.data()), file.size()));
    EXPECT_THROW(w.write("x", 1), Error);
  }

  RecordReader r(path);
  EXPECT_EQ(r.file_size(), expect_bytes);
  EXPECT_EQ(r.path(), path);
  std::string got;
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_EQ(r.offset(), offsets[i]);
    ASSERT_TRUE(r.read(&got)) << i;
    ASSERT_EQ(got, payloads[i]) << i;
  }
  EXPECT_EQ(r.offset(), expect_bytes);
  EXPECT_FALSE(r.read(&got));
  EXPECT_FALSE(r.read(&got));  // stays at a clean end

  for (size_t i : {size_t{137}, size_t{0}, size_t{70}, size_t{199}, size_t{1}}) {
    r.seek(offsets[i]);
    EXPECT_EQ(r.offset(), offsets[i]);
    ASSERT_TRUE(r.read(&got));
    EXPECT_EQ(got, payloads[i]) << i;
    EXPECT_EQ(r.offset(), offsets[i] + frame_bytes(payloads[i].size()));
  }
  r.seek(expect_bytes);
  EXPECT_FALSE(r.read(&got));
  std::string msg = error_of([&] { r.seek(expect_bytes + 1); });
  EXPECT_TRUE(has(msg, path) && has(msg, std::to_string(expect_bytes + 1))) << msg;
}

TEST(RecordIo, EmptyFileAndDestructorCloses) {
  test::TempDir dir;
  { RecordWriter w(dir.file("empty.rec")); }
  RecordReader e(dir.file("empty.rec"));
  std::string got = "stale";
  EXPECT_EQ(e.file_size(), 0u);
  EXPECT_FALSE(e.read(&got));

  {
    RecordWriter w(dir.file("noclose.rec"));
    w.write(std::string("payload"));
  }  // no close(): the destructor still flushes
  RecordReader r(dir.file("noclose.rec"));
  ASSERT_TRUE(r.read(&got));
  EXPECT_EQ(got, "payload");
}

TEST(RecordIo, OpenErrorsNamePath) {
  test::TempDir dir;
  const std::string missing = dir.file("no/such/dir/x.rec");
  std::string msg = error_of([&] { RecordWriter w(missing); });
  EXPECT_TRUE(has(msg, missing) && has(msg, std::strerror(ENOENT))) << msg;
  msg = error_of([&] { RecordReader r(dir.file("absent.rec")); });
  EXPECT_TRUE(has(msg, dir.file("absent.rec")) && has(msg, std::strerror(ENOENT))) << msg;
  EXPECT_FALSE(has(msg, "format.cc:")) << "a refusal names the file, not our source: " << msg;
  msg = error_of([&] { RecordReader r(dir.path()); });
  EXPECT_TRUE(has(msg, dir.path()) && has(msg, "not a regular file")) << msg;
}

// /dev/full accepts the open and fails every write with ENOSPC: the buffered
// bytes only fail when close() flushes them.
TEST(RecordIo, CloseReportsDiskFull) {
  RecordWriter w("/dev/full");
  w.write(std::string(100, 'x'));
  std::string msg = error_of([&] { w.close(); });
  EXPECT_TRUE(has(msg, "/dev/full") && has(msg, std::strerror(ENOSPC))) << msg;
}

// ---- corruption -------------------------------------------------------------

// Three records; the corruption tests damage the third (at offset kBad).
class Corrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("bad.rec");
    RecordWriter w(path_);
    w.write(std::string(10, 'a'));
    w.write(std::string(20, 'b'));
    bad_ = w.bytes_written();
    w.write(std::string(30, 'c'));
    w.close();
    bytes_ = test::read_file(path_);
    ASSERT_EQ(bad_, frame_bytes(10) + frame_bytes(20));
  }
  // Writes the damaged file, reads the first two records, returns the third's error.
  std::string third_record_error(uint64_t max_len = 1ull << 31) {
    test::write_file(path_, bytes_);
    RecordReader r(path_);
    std::string got;
    EXPECT_TRUE(r.read(&got, max_len));
    EXPECT_TRUE(r.read(&got, max_len));
    EXPECT_EQ(got, std::string(20, 'b'));
    return error_of([&] { r.read(&got, max_len); });
  }
  void expect_names_bad_record(const std::string& msg) {
    EXPECT_TRUE(has(msg, path_)) << msg;
    EXPECT_TRUE(has(msg, "offset " + std::to_string(bad_))) << msg;
    EXPECT_FALSE(has(msg, "format.cc:")) << "a refusal names the file, not our source: " << msg;
  }

  test::TempDir dir_;
  std::string path_, bytes_;
  uint64_t bad_ = 0;
};

TEST_F(Corrupt, IntactFileReadsCleanly) {
  test::write_file(path_, bytes_);
  RecordReader r(path_);
  std::string got;
  int n = 0;
  while (r.read(&got)) ++n;
  EXPECT_EQ(n, 3);
}

TEST_F(Corrupt, CutInHeader) {
  bytes_.resize(bad_ + 5);
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "truncated record header")) << msg;
}

TEST_F(Corrupt, CutInPayload) {
  bytes_.resize(bad_ + 12 + 7);
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "length 30")) << msg;
}

TEST_F(Corrupt, CutInPayloadCrc) {
  bytes_.resize(bytes_.size() - 2);
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "length 30")) << msg;
}

TEST_F(Corrupt, FlippedPayloadByte) {
  bytes_[bad_ + 12 + 17] ^= 0x04;
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "payload CRC")) << msg;
}

TEST_F(Corrupt, FlippedPayloadCrcByte) {
  bytes_[bytes_.size() - 1] ^= 0x80;
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "payload CRC")) << msg;
}

TEST_F(Corrupt, FlippedLengthByte) {
  bytes_[bad_ + 0] ^= 0x01;  // 30 -> 31
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "length CRC")) << msg;
}

TEST_F(Corrupt, FlippedLengthCrcByte) {
  bytes_[bad_ + 9] ^= 0x10;
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "length CRC")) << msg;
}

// A length with a valid CRC that points past the end must fail before any
// allocation of that size.
TEST_F(Corrupt, LengthPastEndOfFile) {
  const uint64_t len = 1000000;
  unsigned char hdr[8];
  for (int i = 0; i < 8; ++i) hdr[i] = static_cast<unsigned char>(len >> (8 * i));
  const uint32_t m = mask_crc(crc32c_bitwise(hdr, 8));
  std::memcpy(&bytes_[bad_], hdr, 8);
  for (int i = 0; i < 4; ++i) bytes_[bad_ + 8 + i] = static_cast<char>(m >> (8 * i));
  std::string msg = third_record_error();
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "length 1000000")) << msg;
  EXPECT_TRUE(has(msg, "past the end")) << msg;
}

TEST_F(Corrupt, LengthAboveLimit) {
  std::string msg = third_record_error(/*max_len=*/25);
  expect_names_bad_record(msg);
  EXPECT_TRUE(has(msg, "length 30") && has(msg, "25")) << msg;
}

// ---- shard cursor -------------------------------------------------------------

// One train shard of 6 two-row records (4 users x 3 train pairs) and one eval
// shard of 4 lists of 3 items.
class Cursor : public ::testing::Test {
 protected:
  void SetUp() override {
    DatasetPlan plan;
    plan.source = "cursor-test";
    plan.num_users = 4;
    plan.num_items = 10;
    plan.num_train = 12;
    plan.num_positives = 16;
    plan.eval_negatives = 2;
    plan.record_rows = 2;
    plan.num_shards = 1;
    plan.seed = 3;
    DatasetWriter w(dir_.path(), plan);
    for (int32_t u = 0; u < 4; ++u) {
      const int32_t pos[4] = {u, u + 1, u + 2, u + 3};
      const int32_t eval[3] = {u + 3, 8, 9};
      w.add_user(uint64_t(u), pos, 4, pos, 3, eval, 3);
    }
    meta_ = w.finish();
    path_ = dir_.path() + "/train-00000-of-00001.tfrecord";
    bytes_ = test::read_file(path_);
    // The header frame: its length field, then 12 + length + 4 bytes.
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes_[i]);
    first_ = len + 16;
  }
  // Byte offset of train record k, worked out from the layout.
  uint64_t record_offset(uint64_t k) const { return first_ + k * 41; }
  std::string error_reading(uint64_t k) {
    test::write_file(path_, bytes_);
    ShardCursor cur(dir_.path(), meta_, "train", 0);
    std::string payload;
    return error_of([&] { cur.read(k, &payload); });
  }
  std::string error_walking() {
    test::write_file(path_, bytes_);
    ShardCursor cur(dir_.path(), meta_, "train", 0);
    std::string payload;
    uint64_t off;
    return error_of([&] {
      while (cur.next(&payload, &off)) {
      }
    });
  }
  void expect_names(const std::string& msg, uint64_t offset) {
    EXPECT_TRUE(has(msg, path_)) << msg;
    EXPECT_TRUE(has(msg, "byte offset " + std::to_string(offset))) << msg;
  }

  test::TempDir dir_;
  DatasetMeta meta_;
  std::string path_, bytes_;
  uint64_t first_ = 0;
};

TEST_F(Cursor, FramesSitWhereTheLayoutSays) {
  // num_valid (1 + 4 bytes) and two 8-byte arrays (1 + 1 + 8 each), framed.
  EXPECT_EQ(meta_.train_frame_bytes, 41u);
  EXPECT_EQ(bytes_.size(), record_offset(6));
  ShardCursor cur(dir_.path(), meta_, "train", 0);
  std::string payload;
  uint64_t off = 0;
  std::vector<uint64_t> offsets;
  while (cur.next(&payload, &off)) offsets.push_back(off);
  ASSERT_EQ(offsets.size(), 6u);
  for (uint64_t k = 0; k < 6; ++k) EXPECT_EQ(offsets[k], record_offset(k));
  EXPECT_EQ(cur.read(4, &payload), record_offset(4));
  // The payload is the frame's bytes after its 12-byte length header.
  EXPECT_EQ(payload, bytes_.substr(record_offset(4) + 12, 25));
}

TEST_F(Cursor, TruncatedFrame) {
  bytes_.resize(record_offset(3) + 20);
  test::write_file(path_, bytes_);
  std::string msg = error_of([&] { ShardCursor cur(dir_.path(), meta_, "train", 0); });
  expect_names(msg, bytes_.size());
  EXPECT_TRUE(has(msg, std::to_string(bytes_.size()) + " bytes")) << msg;
}

TEST_F(Cursor, BadCrc) {
  bytes_[record_offset(2) + 12 + 7] ^= 0x20;
  std::string msg = error_reading(2);
  expect_names(msg, record_offset(2));
  EXPECT_TRUE(has(msg, "payload CRC")) << msg;
  msg = error_walking();
  expect_names(msg, record_offset(2));
  EXPECT_TRUE(has(msg, "payload CRC")) << msg;
}

TEST_F(Cursor, WrongLength) {
  // Record 1 four bytes short and record 2 four bytes long, each validly framed,
  // so the file keeps its size and only the frame lengths are wrong.
  std::string header = bytes_.substr(12, first_ - 16);
  std::vector<std::string> recs;
  {
    ShardCursor cur(dir_.path(), meta_, "train", 0);
    std::string p;
    uint64_t off;
    while (cur.next(&p, &off)) recs.push_back(p);
  }
  recs[1] = recs[1].substr(0, 21);
  recs[2] += std::string(4, '\0');
  {
    RecordWriter w(path_);
    w.write(header);
    for (const auto& r : recs) w.write(r);
    w.close();
    ASSERT_EQ(w.bytes_written(), bytes_.size());
  }
  bytes_ = test::read_file(path_);
  std::string msg = error_reading(1);
  expect_names(msg, record_offset(1));
  EXPECT_TRUE(has(msg, "record frame is 37 bytes, expected 41")) << msg;
  msg = error_walking();
  expect_names(msg, record_offset(1));
  EXPECT_TRUE(has(msg, "record frame is 37 bytes")) << msg;
}

TEST_F(Cursor, WriterChecksFramesAndCount) {
  ShardInfo si = *meta_.shards_of("train")[0];
  si.name = "again.tfrecord";
  const std::string path = dir_.path() + "/again.tfrecord";
  ShardCursor out(dir_.path(), meta_, si, 0, 1);
  std::string payload;
  const int32_t users[2] = {0, 1}, items[2] = {2, 3};
  encode_train_record(users, items, 2, 2, &payload);
  EXPECT_EQ(out.append(payload), first_);
  std::string msg = error_of([&] { out.append(payload + "x"); });
  EXPECT_TRUE(has(msg, path) && has(msg, "byte offset " + std::to_string(record_offset(1)))) << msg;
  EXPECT_TRUE(has(msg, "record frame is 42 bytes, expected 41")) << msg;
  msg = error_of([&] { out.close(); });
  EXPECT_TRUE(has(msg, path) && has(msg, "byte offset " + std::to_string(record_offset(1)))) << msg;
  EXPECT_TRUE(has(msg, "1 records written")) << msg;
}

}  // namespace
}  // namespace ncf
