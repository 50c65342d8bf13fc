// ncf_prep --extend PREV: a dataset of a new log (the next day's interactions)
// whose ids continue PREV's, so that a model trained on PREV can go on
// training on it (ncf_dist --init_from) and serving systems can match rows by
// original id.
//
// Ids. Every original id PREV knows keeps its place: PREV's ids first, in
// PREV's order, then the log's new ids in ascending original-id order (the
// order a dataset from scratch uses). With --max_users N / --max_items N the N
// most recently active ids stay (by the generation, then the time of their
// latest interaction; ties go to the lower id, PREV's before new ones), the
// others are dropped, and the kept ones are renumbered compactly in the same
// order. Without a bound nothing is dropped and PREV's dense ids stay as they
// are. New users with fewer than --min_interactions distinct items are
// dropped as from scratch; a user PREV knows never is.
//
// Records. positives.bin holds each user's whole history: PREV's positives
// (of the ids kept) and the log's items, so that neither the training
// negatives nor the eval negatives are drawn from an item the user already
// had. A user's held-out item is its latest interaction in the log with an
// item outside its history (ties: the later row); its other log items are its
// training pairs. A user without such an item has no eval record (format
// version 3: eval records name their users) and PREV's users absent from the
// log have no records at all; their rows stay in the tables.
//
// Every count (kept, new, dropped, and the interactions dropped with them) is
// printed by ncf_prep and recorded under "lineage" in metadata.json, the
// dropped ids in dropped_user_ids.* / dropped_item_ids.* (the id map layout).
// Nothing depends on the thread count.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/interactions.h"
#include "data/sources.h"
#include "data/string_list.h"

namespace ncf {

// A log from a source with its own ids: interactions by key, and each key's
// original id (keys ascend with the ids).
struct KeyedLog {
  Interactions in;
  bool strings = false;
  std::vector<int64_t> user_ids, item_ids;  // integer ids: key -> id
  StringList user_strings, item_strings;    // string ids: key -> id
};

// Writes the extension of opt.extend.prev by `log` to out_dir. `plan` holds
// what the source knows (source, generator, and the options' E, records,
// shards, seed, shuffle and eval sampling); the counts and maps are filled
// here. Errors name `file` or PREV.
DatasetMeta extend_dataset(KeyedLog log, DatasetPlan plan, const PrepOptions& opt,
                           const std::string& out_dir, const std::string& file);

// The lineage of a dataset whose ids are dense already (NCF-paper files, TF
// Model Garden shards, synthetic data): they extend PREV by identity, so the
// dataset must hold at least PREV's users and items (DatasetWriter checks it
// and counts them). Refuses a PREV with original ids.
nlohmann::json identity_lineage(const std::string& prev_dir);

}  // namespace ncf
