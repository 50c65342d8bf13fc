// Fuzz target: the NCF paper's three files (NAME.train.rating,
// NAME.test.rating, NAME.test.negative) through prepare_ncf_paper: detection,
// the rating lines, the "(user,item)\tneg\t..." lines and every cross-file
// check, then the writer.
//
// Input: a knobs byte (fuzz::small_prep; bit 7: E from knobs instead of from
// the negative file's first line), then the train, test and negative files
// separated by fuzz::kFileSep. E (--eval_negatives) is the number of TABs on
// the negative file's first line, so inputs get past that check.
// Property: a dataset prepared from them passes verify_dataset.
#include <algorithm>

#include "data/dataset.h"
#include "data/sources.h"
#include "fuzz_util.h"

using namespace ncf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size < 1) return 0;
  const uint8_t knobs = data[0];
  std::vector<std::string> files = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), fuzz::kFileSep);
  files.resize(3);
  const std::string prefix = fuzz::in_scratch("ml-1m");
  fuzz::write_file(prefix + kNcfTrain, files[0]);
  fuzz::write_file(prefix + kNcfTest, files[1]);
  fuzz::write_file(prefix + kNcfNegative, files[2]);
  PrepOptions opt = fuzz::small_prep(knobs);
  if (!(knobs & 0x80)) {
    const std::string& neg = files[2];
    const size_t line_end = std::min(neg.find('\n'), neg.size());
    // ncf_prep's --eval_negatives goes up to kMaxEvalNegatives.
    opt.eval_negatives = uint32_t(
        std::min<size_t>(std::count(neg.begin(), neg.begin() + line_end, '\t'), kMaxEvalNegatives));
  }
  const std::string out = fuzz::in_scratch("out");
  if (fuzz::refused_or_ran(prefix, [&] { prepare_ncf_paper(prefix, out, opt); }))
    fuzz::check_prepared(out);
  return 0;
}
