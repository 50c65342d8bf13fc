// The remap and split stages that sources of raw interactions share (MovieLens
// ratings files, CSV interaction logs): interactions in file order, with user
// and item keys whose ascending order is the order the dense ids should follow,
// become dense users and items, each user's distinct items and its held-out
// latest one. The source keeps the meaning of a key (a MovieLens id, a string).
//
// Rules: a repeated (user, item) pair counts once (its latest time is the one
// that matters, and the latest interaction overall is also that item's latest);
// each user's latest interaction is held out, a tie of times going to the later
// one in the file; users with fewer than min_interactions distinct items are
// dropped and counted; items become dense over the kept users only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/prep_stages.h"

namespace ncf {

// Interactions in file order. Keys are below num_user_keys / num_item_keys.
struct Interactions {
  std::vector<uint32_t> user;
  std::vector<uint32_t> item;
  std::vector<int64_t> time;  // any unit; empty: the file order is the time
  uint64_t num_user_keys = 0;
  uint64_t num_item_keys = 0;
};

// Kept users 0 .. U-1 and items 0 .. I-1, both in ascending key order.
struct HeldOutUsers {
  uint64_t interactions = 0;       // rows in
  uint64_t raw_users = 0;          // users before the drop
  uint64_t duplicates = 0;         // repeated (user, item) rows removed
  uint64_t dropped = 0;            // users with fewer than min_interactions distinct items
  std::vector<uint32_t> user_key;  // U: the key of each kept user, ascending
  std::vector<uint32_t> item_key;  // I: the key of each kept item, ascending
  std::vector<uint64_t> pos_off;   // U + 1
  std::vector<int32_t> pos;        // each user's distinct items, ascending
  std::vector<int32_t> latest;     // U: the held-out item
  // The time of each kept user's and item's latest row in the log (the row's
  // index when the log has no times): the dataset's activity (dataset.h).
  std::vector<int64_t> user_time, item_time;
  uint64_t num_users() const { return latest.size(); }
  uint64_t num_items() const { return item_key.size(); }
};

// Consumes `in` (its arrays are freed as soon as they are used, to bound the
// memory of 10^8 rows). Errors (no usable user, too many ids) name `file`.
HeldOutUsers hold_out_latest(Interactions in, uint32_t min_interactions, int threads,
                             const std::string& file);

// Each kept user's and item's activity (dataset.h) as a dataset from scratch
// records it: generation 0 and the time of its latest row, [2 x U], [2 x I].
void activity_of(const HeldOutUsers& d, std::vector<int64_t>* users, std::vector<int64_t>* items);

// The split stage over the result: positives, train items (all but the latest),
// the held-out item.
SplitUsers leave_one_out(const HeldOutUsers& d);

}  // namespace ncf
