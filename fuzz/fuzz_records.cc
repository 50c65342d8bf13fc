// Fuzz target: the shard framing and the record decoders of data/format.h,
// without a dataset around them (fuzz_dataset walks whole directories).
//
// Input: a mode byte, four parameter bytes, then the body.
//   mode % 4 == 0: the body is a record file, walked with RecordReader::read
//     (length limit from parameter byte 0), then read again from an offset;
//   mode % 4 == 1: the body is payloads separated by fuzz::kRecordSep, framed
//     here with correct CRCs and read back (each must come back unchanged);
//   mode % 4 == 2: the body is one train record payload for
//     decode_train_record, with record_rows, ids and the expected valid rows
//     from the parameter bytes;
//   mode % 4 == 3: the body is one eval record payload for
//     decode_eval_record, with E, items, the expected user and whether masks
//     are given from the parameter bytes.
// Property: a decoded record encodes again to a payload that decodes the same.
#include <cstring>

#include "data/dataset.h"
#include "data/format.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

void walk_file(const std::string& path, uint64_t max_len, uint64_t reseek) {
  RecordReader in(path);
  std::string payload;
  while (in.read(&payload, max_len)) {
  }
  // A second walk from an offset inside the file, as readers seek to records.
  in.seek(reseek % (in.file_size() + 1));
  while (in.read(&payload, max_len)) {
  }
}

void framed_round_trip(const std::string& path, const std::string& body) {
  const std::vector<std::string> payloads = fuzz::split(body, fuzz::kRecordSep);
  fuzz::write_file(path, fuzz::frame_records(payloads));
  RecordReader in(path);
  std::string payload;
  for (const std::string& want : payloads) {
    if (!in.read(&payload) || payload != want)
      fuzz::property_failed("a framed record does not read back as written");
  }
  if (in.read(&payload)) fuzz::property_failed("a record after the last one written");
}

DatasetMeta small_meta(uint64_t users, uint64_t items, uint32_t record_rows, uint32_t E,
                       bool masks_given) {
  DatasetMeta m;
  m.num_users = users;
  m.num_items = items;
  m.train_record_rows = record_rows;
  m.eval_negatives = E;
  m.eval_masks_given = masks_given;
  return m;
}

void train_record(const std::string& path, const uint8_t* p, const std::string& body) {
  const uint32_t rows = 1 + p[0] % 16;
  const DatasetMeta meta = small_meta(1 + p[1], 1 + p[2], rows, 0, false);
  const uint64_t valid = p[3] % (rows + 1);
  std::vector<int32_t> users(rows), items(rows);
  decode_train_record(body, meta, valid, path, 12, users.data(), items.data());
  std::string again;
  encode_train_record(users.data(), items.data(), uint32_t(valid), rows, &again);
  std::vector<int32_t> u2(rows), i2(rows);
  decode_train_record(again, meta, valid, path, 12, u2.data(), i2.data());
  if (std::memcmp(users.data(), u2.data(), valid * 4) != 0 ||
      std::memcmp(items.data(), i2.data(), valid * 4) != 0)
    fuzz::property_failed("a train record changed when encoded again");
}

void eval_record(const std::string& path, const uint8_t* p, const std::string& body) {
  const uint32_t E = p[0] % 24;
  const size_t L = size_t(E) + 1;
  const DatasetMeta meta = small_meta(1 + p[1], 1 + p[2], 1, E, p[3] & 1);
  const uint64_t user = p[3] >> 1;
  std::vector<int32_t> items(L);
  std::vector<uint8_t> mask(L);
  decode_eval_record(body, meta, user, -1, path, 12, items.data(), mask.data());
  std::string again;
  encode_eval_record(user, items.data(), L, &again, meta.eval_masks_given ? mask.data() : nullptr);
  std::vector<int32_t> items2(L);
  std::vector<uint8_t> mask2(L);
  decode_eval_record(again, meta, user, -1, path, 12, items2.data(), mask2.data());
  if (items != items2 || mask != mask2)
    fuzz::property_failed("an eval record changed when encoded again");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size < 5) return 0;
  const uint8_t mode = data[0];
  const uint8_t* p = data + 1;
  const std::string body(reinterpret_cast<const char*>(data) + 5, size - 5);
  const std::string path = fuzz::in_scratch("records.tfrecord");
  switch (mode % 4) {
    case 0:
      fuzz::write_file(path, body);
      fuzz::refused_or_ran(path, [&] {
        const uint64_t max_len = p[0] < 128 ? (1ull << 31) : uint64_t(p[0] - 128);
        walk_file(path, max_len, uint64_t(p[1]) | uint64_t(p[2]) << 8);
      });
      break;
    case 1:
      framed_round_trip(path, body);
      break;
    case 2:
      fuzz::refused_or_ran(path, [&] { train_record(path, p, body); });
      break;
    case 3:
      fuzz::refused_or_ran(path, [&] { eval_record(path, p, body); });
      break;
  }
  return 0;
}
