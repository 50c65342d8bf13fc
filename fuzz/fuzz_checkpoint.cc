// Fuzz target: a checkpoint directory through open_checkpoint (what
// ncf_dist --resume, ncf_recommend and ncf_export call): the manifest (its own
// crc32c, then CheckpointManifest::from_json's types, ranges and file names),
// every listed file's size and CRC-32C (check_checkpoint, on a
// SingleCommunicator), then CheckpointReader's reads.
//
// Input: files separated by fuzz::kFileSep:
//   0: a mode byte, then manifest.json's text;
//   1 ..: the files the manifest lists, in its order.
// Mode bits (all clear: every check behind a checksum is reached):
//   1: the manifest is written as given (not re-sealed with
//      checkpoint_manifest_crc32c);
//   2: the sizes and CRC-32Cs it lists are kept (not set to the files' own);
//   4: open_checkpoint is given the directory that holds the checkpoint
//      (step-000000000007/), so it looks for the newest whole one.
// Property: a checkpoint that opens reads back every byte written.
#include "comm/single_communicator.h"
#include "fuzz_util.h"
#include "train/checkpoint.h"

using namespace ncf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool reseal = !(mode & 1), fix = !(mode & 2);
  const std::vector<std::string> parts = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), fuzz::kFileSep);
  const std::string dir = fuzz::in_scratch("ck");
  const std::string path = dir + "/" + checkpoint_name(7);
  const std::vector<std::pair<std::string, std::string>> written =
      fuzz::write_checkpoint(path, parts, reseal, fix);

  SingleCommunicator comm;
  std::vector<std::string> log;
  fuzz::refused_or_ran(dir, [&] {
    const CheckpointReader ck = open_checkpoint(comm, mode & 4 ? dir : path, &log);
    for (const auto& [name, bytes] : written) {
      if (ck.bytes(name) != int64_t(bytes.size())) continue;  // a repeated name: the last wins
      std::string back(bytes.size(), '\0');
      ck.read(name, 0, back.data(), back.size());
      if (back != bytes) fuzz::property_failed("checkpoint file " + name + " reads back changed");
      if (!bytes.empty()) {
        char last = 0;
        ck.read(name, int64_t(bytes.size()) - 1, &last, 1);
        if (last != bytes.back()) fuzz::property_failed("a read at an offset of " + name);
      }
    }
  });
  return 0;
}
