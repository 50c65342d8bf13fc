// Fuzz target: TF Model Garden NCF shards (`ncf_prep --format tfmg`) through
// prepare_tfmg: meta_data.json, the directory layout, TFRecord frames, the
// tf.train.Example records and every check on them, then the writer.
//
// Input: files separated by fuzz::kFileSep:
//   0: a mode byte, then meta_data.json's text;
//   1: eval_data/shard_0.tfrecords;
//   2 ..: training_cycle_0/shard_0.tfrecords, training_cycle_1/..., one
//         cycle a file (at least cycle 0, empty when absent).
// A shard's part is its records' payloads separated by fuzz::kRecordSep,
// framed here with correct CRCs, unless mode bit 0 is set (the file as is).
// Mode bits: 1: meta_data.json as given, else num_train_epochs is set to the
// cycles present and num_train_steps / num_eval_steps to what the element
// counts and prebatch sizes make (so its own checks pass); 2: --tfmg_cycles
// first; 3: each directory also holds an empty shard_1.
// Property: a dataset prepared from them passes verify_dataset.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/source_tfmg.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

void shard_dir(const std::string& dir, const std::string& part, bool frame, bool extra) {
  std::filesystem::create_directory(dir);
  fuzz::write_file(dir + "/shard_0.tfrecords",
                   frame ? fuzz::frame_records(fuzz::split(part, fuzz::kRecordSep)) : part);
  if (extra) fuzz::write_file(dir + "/shard_1.tfrecords", "");
}

// ceil(a / b) of two positive JSON integers, or null.
nlohmann::json steps(const nlohmann::json& j, const char* elements, const char* prebatch) {
  if (!j.contains(elements) || !j.contains(prebatch) || !j[elements].is_number_unsigned() ||
      !j[prebatch].is_number_unsigned())
    return nullptr;
  const uint64_t a = j[elements].get<uint64_t>(), b = j[prebatch].get<uint64_t>();
  if (b == 0) return nullptr;
  return a / b + (a % b != 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool frame = !(mode & 1), fix = !(mode & 2), extra = mode & 8;
  std::vector<std::string> parts = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), fuzz::kFileSep);
  if (parts.size() < 3) parts.resize(3);
  const size_t cycles = parts.size() - 2;
  const std::string in = fuzz::in_scratch("ncf_data");
  std::filesystem::create_directory(in);
  std::string meta = parts[0];
  nlohmann::json j = nlohmann::json::parse(meta, nullptr, false);
  if (fix && !j.is_discarded() && j.is_object()) {
    j["num_train_epochs"] = cycles;
    const nlohmann::json train = steps(j, "num_train_elements", "train_prebatch_size");
    const nlohmann::json eval = steps(j, "num_eval_elements", "eval_prebatch_size");
    if (!train.is_null()) j["num_train_steps"] = train;
    if (!eval.is_null()) j["num_eval_steps"] = eval;
    meta = j.dump(1);
  }
  fuzz::write_file(in + "/meta_data.json", meta);
  shard_dir(in + "/eval_data", parts[1], frame, extra);
  for (size_t c = 0; c < cycles; ++c)
    shard_dir(in + "/training_cycle_" + std::to_string(c), parts[2 + c], frame, extra);

  PrepOptions opt = fuzz::small_prep(0);
  opt.eval_negatives = 0;  // as many as the data has
  const std::string out = fuzz::in_scratch("out");
  const TfmgCycles which = mode & 4 ? TfmgCycles::kFirst : TfmgCycles::kAll;
  if (fuzz::refused_or_ran(in, [&] { prepare_tfmg(in, out, opt, which); }))
    fuzz::check_prepared(out);
  return 0;
}
