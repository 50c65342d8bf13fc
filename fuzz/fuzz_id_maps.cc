// Fuzz target: a dataset's id maps (user_ids.i64 / item_ids.i64, integer ids;
// user_ids.str / item_ids.str, string ids) through load_id_maps, which every
// program that takes or prints original ids calls.
//
// Input: a mode byte, the user and the item count (uint16 little-endian
// each), then the user map file, fuzz::kFileSep, the item map file.
// Mode bit 0: the user map is a string map; bit 1: the item map is. An integer
// map's count is its file's size / 8 unless bit 2 is set (then the input's
// count, as string maps always use). The metadata lists each file with its
// size and CRC-32C (bit 3: a CRC of 0) and goes through DatasetMeta::from_json.
// Properties: in a map that loads, every dense id's original id finds that
// dense id again, and ids ascend.
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/id_map.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

void check_map(const IdMap& map, uint64_t count, const char* which) {
  if (uint64_t(map.size()) != count) fuzz::property_failed(std::string(which) + " map size");
  for (int64_t d = 0; d < map.size(); ++d) {
    const std::string text = map.text(d);
    if (map.strings()) {
      if (map.find(map.string(d)) != d)
        fuzz::property_failed(std::string(which) + " string id does not find its dense id");
      if (d > 0 && !(map.string(d - 1) < map.string(d)))
        fuzz::property_failed(std::string(which) + " string ids do not ascend");
    } else {
      if (map.dense(map.raw(d)) != d)
        fuzz::property_failed(std::string(which) + " integer id does not find its dense id");
      if (std::to_string(map.raw(d)) != text)
        fuzz::property_failed(std::string(which) + " integer id text");
    }
  }
  // Ids absent from the map are not found.
  if (map.strings() && map.find("") != std::nullopt)
    fuzz::property_failed(std::string(which) + " map finds the empty id");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size < 5) return 0;
  const uint8_t mode = data[0];
  const uint64_t given[2] = {uint64_t(data[1]) | uint64_t(data[2]) << 8,
                             uint64_t(data[3]) | uint64_t(data[4]) << 8};
  std::vector<std::string> files = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 5, size - 5), fuzz::kFileSep);
  files.resize(2);
  const std::string& dir = fuzz::scratch();
  nlohmann::json maps;
  uint64_t count[2];
  for (int k = 0; k < 2; ++k) {
    const bool strings = mode & (1 << k);
    count[k] = strings || (mode & 4) ? given[k] : files[size_t(k)].size() / 8;
    const std::string name =
        std::string(k == 0 ? "user_ids" : "item_ids") + (strings ? ".str" : ".i64");
    fuzz::write_file(fuzz::in_scratch(name), files[size_t(k)]);
    nlohmann::json e = {{"name", name},
                        {"count", count[k]},
                        {"bytes", files[size_t(k)].size()},
                        {"crc32c", mode & 8 ? 0u : fuzz::crc_of(files[size_t(k)])}};
    if (strings) e["kind"] = "string";
    maps[k == 0 ? "user" : "item"] = e;
  }
  const nlohmann::json j = {{"format_version", kFormatVersion},
                            {"dataset_id", "fuzz"},
                            {"source", "fuzz"},
                            {"num_users", count[0]},
                            {"num_items", count[1]},
                            {"num_train", 0},
                            {"num_positives", 0},
                            {"num_eval_users", 0},
                            {"eval_negatives", 1},
                            {"train_record_rows", 1},
                            {"train_frame_bytes", 0},
                            {"eval_frame_bytes", 0},
                            {"dropped_users", 0},
                            {"seed", 0},
                            {"shards", nlohmann::json::array()},
                            {"positives", {{"name", kPositivesFile}, {"bytes", 0}, {"crc32c", 0}}},
                            {"id_maps", maps}};
  DatasetMeta meta;
  try {
    meta = DatasetMeta::from_json(j, dir + "/" + kMetadataFile);
  } catch (const Error&) {
    return 0;  // not metadata ncf_prep could have sealed; fuzz_metadata covers those
  }
  fuzz::refused_or_ran(dir, [&] {
    const IdMaps loaded = load_id_maps(dir, meta);
    check_map(loaded.user, count[0], "user");
    check_map(loaded.item, count[1], "item");
  });
  return 0;
}
