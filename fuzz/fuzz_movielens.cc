// Fuzz target: MovieLens ratings files (u.data, ratings.dat, ratings.csv)
// through read_movielens and prepare_movielens (format detection, the
// rating-line parser, dense ids, duplicates, leave-one-out, eval negatives,
// the writer).
//
// Input: a mode byte, a knobs byte (fuzz::small_prep), then the file.
//   mode % 4: 0 u.data (--format ml-100k), 1 ratings.dat (ml-1m),
//             2 ratings.csv (ml-20m), 3 detected: the file is named by
//             (mode / 4) % 3 in a directory given as the input;
//   mode bit 4: also prepare a dataset from it.
// Property: a dataset prepared from it passes verify_dataset.
#include <filesystem>

#include "data/sources.h"
#include "fuzz_util.h"

using namespace ncf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size < 2) return 0;
  const uint8_t mode = data[0], knobs = data[1];
  const std::string_view file(reinterpret_cast<const char*>(data) + 2, size - 2);
  static const char* const kNames[3] = {"u.data", "ratings.dat", "ratings.csv"};
  static const InputFormat kFormats[3] = {InputFormat::kMl100k, InputFormat::kMlDat,
                                          InputFormat::kMlCsv};
  const int which = mode % 4 < 3 ? mode % 4 : (mode / 4) % 3;
  const std::string in_dir = fuzz::in_scratch("in");
  std::filesystem::create_directory(in_dir);
  const std::string path = in_dir + "/" + kNames[which];
  fuzz::write_file(path, file);
  const InputFormat fmt = mode % 4 < 3 ? kFormats[which] : InputFormat::kAuto;
  const std::string input = mode % 4 < 3 ? path : in_dir;

  if (!fuzz::refused_or_ran(in_dir, [&] { read_movielens(path, fmt); })) return 0;
  if (!(mode & 0x10)) return 0;
  const std::string out = fuzz::in_scratch("out");
  if (fuzz::refused_or_ran(in_dir,
                           [&] { prepare_movielens(input, fmt, out, fuzz::small_prep(knobs)); }))
    fuzz::check_prepared(out);
  return 0;
}
