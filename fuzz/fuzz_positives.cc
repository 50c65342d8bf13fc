// Fuzz target: positives.bin through PositiveLists (size and CRC-32C against
// the metadata, header, offsets) and check_positive_lists (every list sorted,
// distinct, in range), what every program that samples negatives opens.
//
// Input: a mode byte, a uint32 item count (little-endian), then the file.
// The metadata is built here and goes through DatasetMeta::from_json, so it is
// one a sealed metadata.json could hold: its user and positive counts are the
// file header's (bytes 8 .. 23) unless mode bit 0 is set (then the next eight
// bytes of the header's reserved field give them), its positives size and CRC
// the file's own unless mode bit 1 is set (then the CRC is 0).
// Properties: a file that passes is exactly its header, offsets and nnz items
// long, its lists hold exactly nnz items and every user's list lies inside them.
#include <cstring>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/format.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

uint64_t le64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | fuzz::byte_at(s, at + size_t(i));
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size < 5) return 0;
  const uint8_t mode = data[0];
  const uint32_t items = uint32_t(data[1]) | uint32_t(data[2]) << 8 | uint32_t(data[3]) << 16 |
                         uint32_t(data[4]) << 24;
  const std::string_view file(reinterpret_cast<const char*>(data) + 5, size - 5);
  const std::string& dir = fuzz::scratch();
  fuzz::write_file(fuzz::in_scratch(kPositivesFile), file);

  uint64_t users = le64(file, 8), nnz = le64(file, 16);
  if (mode & 1) {
    users = le64(file, 24) & 0xffffffffu;
    nnz = le64(file, 24) >> 32;
  }
  // No shards: only the counts positives.bin is checked against matter here.
  const nlohmann::json j = {{"format_version", kFormatVersion},
                            {"dataset_id", "fuzz"},
                            {"source", "fuzz"},
                            {"num_users", users},
                            {"num_items", items},
                            {"num_train", 0},
                            {"num_positives", nnz},
                            {"num_eval_users", 0},
                            {"eval_negatives", 1},
                            {"train_record_rows", 1},
                            {"train_frame_bytes", 0},
                            {"eval_frame_bytes", 0},
                            {"dropped_users", 0},
                            {"seed", 0},
                            {"shards", nlohmann::json::array()},
                            {"positives",
                             {{"name", kPositivesFile},
                              {"bytes", file.size()},
                              {"crc32c", mode & 2 ? 0u : fuzz::crc_of(file)}}}};
  DatasetMeta meta;
  try {
    meta = DatasetMeta::from_json(j, dir + "/" + kMetadataFile);
  } catch (const Error&) {
    return 0;  // not metadata ncf_prep could have sealed; fuzz_metadata covers those
  }
  const std::string path = fuzz::in_scratch(kPositivesFile);
  fuzz::refused_or_ran(dir, [&] {
    PositiveLists lists(dir, meta);
    // The header, U + 1 offsets and nnz items fill the file exactly (counted
    // without wrapping): lists that run past its end are read past the map.
    const unsigned __int128 layout = (unsigned __int128)(32) +
                                     (unsigned __int128)(lists.num_users() + 1) * 8 +
                                     (unsigned __int128)(lists.nnz()) * 4;
    if (layout != file.size())
      fuzz::property_failed("positives.bin accepted with " + std::to_string(lists.nnz()) +
                            " positives, which do not fit its " + std::to_string(file.size()) +
                            " bytes");
    check_positive_lists(lists, meta, path);
    if (lists.num_users() != meta.num_users || lists.nnz() != meta.num_positives)
      fuzz::property_failed("positives.bin counts differ from the metadata's");
    uint64_t total = 0;
    for (uint64_t u = 0; u < lists.num_users(); ++u) {
      if (lists.begin(u) < lists.items() || lists.end(u) > lists.items() + lists.nnz())
        fuzz::property_failed("a user's positives lie outside the file's items");
      total += uint64_t(lists.end(u) - lists.begin(u));
    }
    if (total != lists.nnz()) fuzz::property_failed("the users' lists do not hold nnz items");
  });
  return 0;
}
