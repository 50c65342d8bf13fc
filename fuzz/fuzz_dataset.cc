// Fuzz target: a whole dataset directory through verify_dataset, the walk
// `ncf_prep --verify` makes with the readers' own pieces: metadata.json, every
// shard through ShardCursor (size, header record, frames) and
// decode_train_record / decode_eval_record, positives.bin through PositiveLists
// and check_positive_lists, and the id maps through load_id_maps.
//
// Input: files separated by fuzz::kFileSep:
//   0: a mode byte, then metadata.json's text;
//   1: positives.bin;
//   2 .. 1+S: the S shards metadata.json lists, in its order;
//   then the user and the item id map when it lists "id_maps".
// Mode bits (all clear: every check behind a checksum is reached):
//   1: metadata.json is written as given (not re-sealed with metadata_crc32c);
//   2: the sizes and CRC-32Cs it lists are kept (not set to the files' own);
//   4: shard files are written as given (not framed here: with framing, a
//      shard's part is its payloads separated by fuzz::kRecordSep).
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

// Writes `bytes` as the file an entry of the metadata names, and when asked
// makes the entry's size and CRC those of the file.
void place(nlohmann::json& entry, const std::string& bytes, bool fix) {
  if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) return;
  const std::string name = entry["name"].get<std::string>();
  if (!fuzz::safe_name(name) || name == kMetadataFile) return;
  fuzz::write_file(fuzz::in_scratch(name), bytes);
  if (fix) {
    entry["bytes"] = bytes.size();
    entry["crc32c"] = fuzz::crc_of(bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool reseal = !(mode & 1), fix = !(mode & 2), frame = !(mode & 4);
  const std::vector<std::string> parts = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), fuzz::kFileSep);
  const std::string& dir = fuzz::scratch();
  auto part = [&](size_t k) { return k < parts.size() ? parts[k] : std::string(); };

  nlohmann::json j = nlohmann::json::parse(parts[0], nullptr, false);
  std::string meta_text = parts[0];
  if (!j.is_discarded() && j.is_object()) {
    size_t next = 2;
    if (j.contains("shards") && j["shards"].is_array())
      for (nlohmann::json& s : j["shards"]) {
        const std::string bytes =
            frame ? fuzz::frame_records(fuzz::split(part(next), fuzz::kRecordSep)) : part(next);
        ++next;
        place(s, bytes, fix);
      }
    if (j.contains("positives")) place(j["positives"], part(1), fix);
    if (j.contains("id_maps") && j["id_maps"].is_object())
      for (const char* which : {"user", "item"})
        if (j["id_maps"].contains(which)) place(j["id_maps"][which], part(next++), fix);
    if (reseal) j["crc32c"] = metadata_crc32c(j);
    meta_text = j.dump(2);
  }
  fuzz::write_file(fuzz::in_scratch(kMetadataFile), meta_text);
  fuzz::refused_or_ran(dir, [&] { verify_dataset(dir); });
  return 0;
}
