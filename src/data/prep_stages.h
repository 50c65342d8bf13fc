// The stages every ncf_prep source ends with, one function each, so a dataset is
// assembled the same way whatever it came from. A source parses, remaps ids and
// splits each user's interactions its own way; from there users travel in
// blocks of consecutive ids: the split stage fills a block's positives, train
// items and held-out items, the eval-negatives stage completes its eval lists,
// and the write stage hands it to DatasetWriter in user order. Work inside a
// stage runs on the process-wide pool (common/parallel.h); every value depends
// on (seed, user) only, never on the thread count.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sources.h"

namespace ncf {

// threads, or when threads is 0 the CPUs this process may run on (its affinity mask).
int resolve_threads(int threads);

// Runs fn(begin, end) over contiguous ranges covering [0, n) on the pool. When
// ranges fail, rethrows the error of the lowest one: the error a serial loop
// would have hit first.
void parallel_ranges(int threads, uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn);

// A block of consecutive users between the stages. User j of the block is user
// first_user + j of the dataset.
struct UserBlock {
  uint64_t first_user = 0;
  uint64_t num_users = 0;
  uint64_t list_len = 0;               // L = 1 + E
  std::vector<uint64_t> positive_off;  // num_users + 1
  std::vector<uint64_t> train_off;     // num_users + 1
  std::vector<int32_t> positives;      // per user: sorted ascending, distinct
  std::vector<int32_t> train;          // per user: in the order they enter the shuffle
  std::vector<int32_t> eval;           // num_users x L: the held-out item, then E negatives
  std::vector<uint8_t> eval_mask;      // num_users x L when the source gives masks, else empty
  std::vector<uint8_t> has_eval;       // num_users: 1 for a user with an eval list (an
                                       // extension's); empty: every user has one
  bool evaluated(uint64_t j) const { return has_eval.empty() || has_eval[j] != 0; }

  int32_t* positives_of(uint64_t j) { return positives.data() + positive_off[j]; }
  int32_t* train_of(uint64_t j) { return train.data() + train_off[j]; }
  int32_t* eval_of(uint64_t j) { return eval.data() + j * list_len; }
  uint64_t num_positives(uint64_t j) const { return positive_off[j + 1] - positive_off[j]; }
  uint64_t num_train(uint64_t j) const { return train_off[j + 1] - train_off[j]; }
};

// A source's users after its own parse, remap and split stages.
struct SplitUsers {
  uint64_t num_users = 0;
  // How many positives and train items user u has.
  std::function<void(uint64_t u, uint64_t* num_positives, uint64_t* num_train)> sizes;
  // The split stage for block users [begin, end) (block-local indices): fills
  // their positives, train items and held-out item (eval_of(j)[0]). Runs on pool
  // threads, on disjoint ranges of one block at a time.
  std::function<void(UserBlock* block, uint64_t begin, uint64_t end)> split;
  // Whether user u has an eval list (a held-out item); null: every user has.
  // Users without one get no eval record (an extension: data/extend.h).
  std::function<bool(uint64_t u)> evaluated;
};

// Where eval negatives come from: drawn uniformly from the items the user never
// interacted with (distinct: draw_eval_negatives; with replacement:
// draw_eval_negatives_with_replacement), or given with the data (the NCF-paper
// files, TF-MG shards) and kept exactly.
struct EvalNegatives {
  uint64_t num_items = 0;
  uint32_t count = 0;  // E
  uint64_t seed = 0;
  const int32_t* given = nullptr;  // num_users x E when given, else drawn
  // Names user u in an error message (input file and raw id); may be empty.
  std::function<std::string(uint64_t u)> describe_user;
  // num_users x L (1 = counts) when the source gives each list's duplicate mask
  // too (TF Model Garden's), stored as is; else the writer computes them.
  const uint8_t* given_mask = nullptr;
  // How drawn lists are drawn: assemble_dataset sets it from its plan (sources
  // leave it); kDistinct or kWithReplacement.
  EvalSampling sampling = EvalSampling::kDistinct;
};

// Fills eval_of(j)[1 .. L) of every user of the block, and its eval_mask when
// the masks are given.
void eval_negatives_stage(const EvalNegatives& negatives, int threads, UserBlock* block);

// Hands the block's users to the writer in id order.
void write_stage(const UserBlock& block, DatasetWriter* writer);

// A plan with what every source takes from the options as it is (E, eval
// sampling, record rows, shards, seed, shuffle buffer) and `source`; the
// source fills in its counts, maps and generator.
DatasetPlan plan_of_options(const std::string& source, const PrepOptions& opt);

// How assemble_dataset reports progress.
struct PrepProgress {
  bool enabled = false;
  std::string label;  // "prep", "synthetic ml-1m"
  std::chrono::steady_clock::time_point start;
  double seconds() const;
};

// split → eval negatives → write over blocks of users, then the writer's train
// shuffle and metadata. Blocks hold up to 4,096 users and close early when their
// lists would pass 2^21 entries, which bounds memory whatever the interactions.
// Before anything is written, plan.eval_sampling is checked against every
// user's room for drawn negatives (num_items minus its positives), and kAuto
// is decided there (a note on stderr when it becomes with_replacement): a user
// without room for E distinct negatives under kDistinct, or without any item
// left to draw, is refused by a message naming the user and what would work.
// Given negatives need plan.eval_sampling kGiven.
DatasetMeta assemble_dataset(const std::string& out_dir, const DatasetPlan& plan,
                             const SplitUsers& users, const EvalNegatives& negatives, int threads,
                             const PrepProgress& progress);

}  // namespace ncf
