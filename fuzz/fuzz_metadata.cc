// Fuzz target: a dataset's metadata.json through DatasetMeta::load (its own
// crc32c first, then DatasetMeta::from_json's types, ranges and consistency).
//
// Input: a mode byte, then the file's text.
//   mode bit 0 clear: the text is parsed here and, when it is JSON, its crc32c
//     field is set to metadata_crc32c of the rest (re-sealed), so the checks
//     behind the checksum are reached; bit 0 set: the bytes are the file as is.
// Property: metadata that loads is saved and loaded again to the same JSON.
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "fuzz_util.h"

using namespace ncf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!(mode & 1)) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_discarded()) {
      if (j.is_object()) j["crc32c"] = metadata_crc32c(j);
      text = j.dump(2);
    }
  }
  const std::string& dir = fuzz::scratch();
  fuzz::write_file(fuzz::in_scratch(kMetadataFile), text);
  DatasetMeta meta;
  if (!fuzz::refused_or_ran(dir, [&] { meta = DatasetMeta::load(dir); })) return 0;

  // What loaded, saved again (sealed) and loaded, is the same metadata.
  const nlohmann::json first = meta.to_json();
  meta.save(dir);
  DatasetMeta again;
  try {
    again = DatasetMeta::load(dir);
  } catch (const Error& e) {
    fuzz::property_failed(std::string("metadata saved by DatasetMeta::save is refused: ") +
                          e.what());
  }
  if (again.to_json() != first)
    fuzz::property_failed("metadata changed when saved and loaded again:\n" + first.dump() + "\n" +
                          again.to_json().dump());
  // The accessors readers use on loaded metadata.
  (void)meta.num_train_records();
  (void)meta.shards_of("train");
  (void)meta.shards_of("eval");
  return 0;
}
