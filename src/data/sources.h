// Raw inputs for ncf_prep: the input formats, their detection, and the
// MovieLens and NCF-paper sources (source_movielens.cc, source_ncf_paper.cc).
// Parsing errors name the file, the line and the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace ncf {

enum class InputFormat {
  kAuto,
  kMl100k,    // u.data: user TAB item TAB rating TAB timestamp
  kMlDat,     // ml-1m / ml-10m ratings.dat: user::item::rating::timestamp
  kMlCsv,     // ml-20m / ml-25m ratings.csv, header userId,movieId,rating,timestamp
  kNcfPaper,  // NAME.train.rating / NAME.test.rating / NAME.test.negative
  kCsv,       // users' own interaction logs (source_csv.h); only when named, never detected
};

// "auto", "ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ncf-paper", "csv".
InputFormat parse_input_format(const std::string& name);
const char* format_name(InputFormat f);
bool is_movielens(InputFormat f);

// The NCF paper's three files are PREFIX + these.
constexpr const char* kNcfTrain = ".train.rating";
constexpr const char* kNcfTest = ".test.rating";
constexpr const char* kNcfNegative = ".test.negative";

// ncf_prep --extend PREV (data/extend.h).
struct ExtendOptions {
  std::string prev;        // the parent dataset's directory; empty: from scratch
  uint64_t max_users = 0;  // keep this many most recently active users (0: all)
  uint64_t max_items = 0;
};

// Options shared by every source.
struct PrepOptions {
  uint32_t eval_negatives = 999;  // E
  uint32_t record_rows = 65536;   // positives per train record
  uint32_t num_shards = 4;        // files per kind
  uint64_t seed = 1;
  uint64_t shuffle_buffer_bytes = 256ull << 20;
  uint32_t min_interactions = 2;  // users with fewer are dropped (need 1 train + 1 test)
  int threads = 0;                // 0: hardware concurrency
  bool progress = false;          // progress lines on stderr
  // How drawn eval negatives are drawn (dataset.h); the sources that carry
  // their own (NCF-paper, TF-MG) do not read it.
  EvalSampling eval_sampling = EvalSampling::kAuto;
  ExtendOptions extend;
};

// Finds the format of `path` (a file, or a directory holding one known file, or
// an NCF-paper prefix such as dir/ml-1m). Throws naming the path when unknown.
// When `want` is not kAuto, checks that the file matches it and says so if not.
// kCsv is never detected (a MovieLens ratings.csv stays MovieLens): with
// want = kCsv the path must be a file, taken as it is.
InputFormat detect_format(const std::string& path, InputFormat want, std::string* resolved);

struct Rating {
  int64_t user;  // raw id from the file
  int64_t item;  // raw id from the file
  int64_t timestamp;
  uint64_t line;  // 1-based line in the file (the tie-break rule uses it)
};

// Reads one MovieLens ratings file (u.data, ratings.dat or ratings.csv).
std::vector<Rating> read_movielens(const std::string& file, InputFormat fmt);

// MovieLens → dataset directory: ids made dense in ascending raw-id order,
// duplicate (user, item) pairs kept once at their latest timestamp, each user's
// latest interaction held out (ties: the later line in the file), users with
// fewer than min_interactions dropped and counted, E eval negatives drawn.
DatasetMeta prepare_movielens(const std::string& path, InputFormat fmt, const std::string& out_dir,
                              const PrepOptions& opt);

// NCF paper files → dataset directory, keeping the given split and 99 negatives
// exactly (including negatives equal to the user's own test item).
DatasetMeta prepare_ncf_paper(const std::string& prefix, const std::string& out_dir,
                              const PrepOptions& opt);

}  // namespace ncf
