// A prepared dataset directory (docs/design.md): metadata.json, train-* and
// eval-* record shards, and positives.bin, the per-user positive lists (CSR)
// that online negative sampling needs. DatasetWriter makes one from any source;
// DatasetMeta describes one; verify_dataset() walks one.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/string_list.h"

namespace ncf {

// 2: metadata.json carries its own crc32c and positives.bin is checked against
// its size and CRC whenever it is opened. Version 1 (the same shards and files,
// a metadata.json without its crc32c) still loads, with a warning.
// 3: a dataset made by ncf_prep --extend (data/extend.h): "lineage" in the
// metadata, id maps in lineage order, and eval records for only the users with
// a new held-out item (num_eval_users <= num_users; each record names its
// user, ascending). Plain datasets are still written as version 2.
constexpr uint32_t kFormatVersion = 3;
constexpr uint32_t kPlainFormatVersion = 2;
constexpr uint32_t kOldestFormatVersion = 1;
constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kPositivesFile = "positives.bin";
// The largest train record (positives) and eval list (E negatives) a dataset
// may have, ncf_prep's --record_rows and --eval_negatives ranges: readers and
// verify size their buffers from these fields before any shard is read, so
// metadata beyond them is refused rather than allocated for.
constexpr uint32_t kMaxRecordRows = uint32_t{1} << 24;
constexpr uint32_t kMaxEvalNegatives = uint32_t{1} << 20;

// An id map file gives the original id of each dense id, in one of two kinds:
//
//  int64 (user_ids.i64, item_ids.i64; MovieLens): entry d (int64,
//    little-endian) is the original id of dense id d, strictly ascending;
//    the file is count x 8 bytes.
//  string (user_ids.str, item_ids.str; CSV interaction logs, whose ids are
//    arbitrary non-empty byte strings):
//        uint64 offsets[count + 1]   little-endian; offsets[0] = 0
//        uint8  bytes[offsets[count]]
//    string d is bytes[offsets[d], offsets[d + 1]); the strings are non-empty
//    and strictly ascending bytewise (memcmp order, a prefix first), so a
//    lookup is a binary search. The file is 8 (count + 1) + offsets[count] bytes.
//
// metadata.json lists both maps under "id_maps" with their size and CRC-32C
// (and "kind": "string" for string maps; no kind means int64), and every
// reader checks them (id_map.h). The other sources' ids are dense already and
// have no map.
//
// A dataset extended by ncf_prep --extend lists its parent's ids first (in the
// parent's order), then the new ones (ascending): its maps are distinct but
// not ascending, and say so ("order": "lineage"); readers look them up through
// a sorted index.
struct IdMapInfo {
  std::string name;      // "user_ids.i64", "item_ids.str", ...
  bool strings = false;  // the string layout
  uint64_t count = 0;    // num_users or num_items
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  bool ascending = true;  // false: "order": "lineage"
};
// The JSON of one map entry (metadata.json's id_maps.user, a checkpoint's copy).
nlohmann::json id_map_json(const IdMapInfo& info);
// Parses one; errors name `path` and `field` (e.g. "id_maps.user").
IdMapInfo id_map_from_json(const nlohmann::json& e, const std::string& path,
                           const std::string& field);
constexpr const char* kUserIdsFile = "user_ids.i64";
constexpr const char* kItemIdsFile = "item_ids.i64";
constexpr const char* kUserIdsStrFile = "user_ids.str";
constexpr const char* kItemIdsStrFile = "item_ids.str";
constexpr const char* kUserActivityFile = "user_activity.i64";
constexpr const char* kItemActivityFile = "item_activity.i64";

// How a dataset's eval negatives were chosen ("eval_sampling" in metadata.json).
//  distinct:         E different items, uniform over the items the user never
//                    interacted with (draw_eval_negatives);
//  with_replacement: E independent uniform draws from those items, so a list
//                    may repeat an item; the eval record's duplicate mask
//                    leaves every repeat out of the ranking (TF Model Garden's
//                    and MLPerf's rule; draw_eval_negatives_with_replacement);
//  given:            the source carried its own (NCF-paper files, TF-MG shards);
//  auto:             ncf_prep's default, decided from the data before anything
//                    is drawn: distinct when every user leaves E items to draw
//                    from, else with_replacement. Never recorded.
enum class EvalSampling { kAuto, kDistinct, kWithReplacement, kGiven };
const char* eval_sampling_name(EvalSampling s);
// "auto", "distinct", "with_replacement" (the flag's values); throws otherwise.
EvalSampling parse_eval_sampling(const std::string& name);

struct ShardInfo {
  std::string name;  // file name inside the dataset directory
  std::string kind;  // "train" or "eval"
  uint64_t first_record = 0;
  uint64_t num_records = 0;
  uint64_t num_valid_rows = 0;
  uint64_t bytes = 0;   // file size
  uint32_t crc32c = 0;  // CRC-32C of the whole file
};

struct DatasetMeta {
  uint32_t format_version = kPlainFormatVersion;
  // Empty for a sealed metadata.json; for a version 1 dataset, the warning
  // that its metadata cannot be checked (each program prints it once).
  std::string unsealed_warning;
  std::string dataset_id;      // random-looking id tying shards to this metadata
  std::string source;          // "synthetic:ml-1m", "movielens:ml-20m", "ncf-paper:ml-1m", …
  uint64_t num_users = 0;      // U: user ids are 0 .. U-1
  uint64_t num_items = 0;      // I: item ids are 0 .. I-1
  uint64_t num_train = 0;      // positive training pairs
  uint64_t num_positives = 0;  // entries of positives.bin (train + test)
  // Eval records: one per user (user u is record u), or in an extended
  // dataset fewer, each naming its user (ascending).
  uint64_t num_eval_users = 0;
  bool every_user_evaluated() const { return num_eval_users == num_users; }
  uint32_t eval_negatives = 0;  // E
  // false: every eval mask is duplicate_mask() of its list (checked equal);
  // true ("eval_masks": "given"): a source's own masks (TF Model Garden's),
  // checked with given_mask_mismatch() instead.
  bool eval_masks_given = false;
  // eval_sampling_name() of the rule that chose the eval negatives; empty in a
  // dataset written before ncf_prep recorded it.
  std::string eval_sampling;
  uint32_t train_record_rows = 0;  // positives per train record
  uint64_t train_frame_bytes = 0;  // every train record frame has this size
  uint64_t eval_frame_bytes = 0;   // every eval record frame has this size
  uint64_t dropped_users = 0;      // users with too few interactions to split
  uint64_t seed = 0;
  nlohmann::json generator;  // generator / source parameters, free form
  std::vector<ShardInfo> shards;
  uint64_t positives_bytes = 0;
  uint32_t positives_crc32c = 0;
  // Original ids ("id_maps" in metadata.json): both or neither.
  std::vector<IdMapInfo> id_maps;  // [user, item] when the source had its own ids
  // Each id's latest activity ("activity": user_activity.i64, item_activity.i64,
  // [count x 2] int64: the generation, then the time of its latest interaction
  // in the source's unit, or its row in the file when the file has no times):
  // what ncf_prep --extend --max_users/--max_items keep by. [user, item] where
  // the dataset has id maps.
  std::vector<IdMapInfo> activity;
  // ncf_prep --extend (data/extend.h): the parent, the ancestors, what was
  // kept, added and dropped; null for a dataset made from scratch.
  nlohmann::json lineage;
  // The original ids an extension dropped ("lineage"."dropped_ids": the id
  // map layout, files dropped_user_ids.* and dropped_item_ids.*): [user, item].
  std::vector<IdMapInfo> dropped_ids;
  // The generation of the dataset: 0 from scratch, the parent's + 1 when extended.
  uint64_t generation() const;
  // The dataset ids of its ancestors, parent first (empty from scratch).
  std::vector<std::string> ancestors() const;

  uint64_t num_train_records() const;
  std::vector<const ShardInfo*> shards_of(const std::string& kind) const;

  nlohmann::json to_json() const;
  // Parses and checks types/ranges; errors name the file and the field.
  static DatasetMeta from_json(const nlohmann::json& j, const std::string& path);
  // Reads metadata.json and checks its crc32c field (metadata_crc32c) before
  // anything else: a value changed anywhere in the file is refused. A file
  // without the field loads only as format version 1 (unsealed_warning set);
  // any other version without it is refused, asking for ncf_prep again.
  static DatasetMeta load(const std::string& dir);
  // Writes metadata.json (atomically: temporary file, fsync, rename) with its crc32c.
  void save(const std::string& dir) const;
};

// CRC-32C of the compact dump (sorted keys, no whitespace) of metadata JSON
// without its top-level "crc32c" field: the value metadata.json carries in that
// field. It covers every parsed value, so only whitespace and number spellings
// that parse to the same value can change without changing it.
uint32_t metadata_crc32c(const nlohmann::json& j);

// What a source tells the writer before the first user.
struct DatasetPlan {
  std::string source;
  uint64_t num_users = 0;  // users that will be added (after drops)
  uint64_t num_items = 0;
  uint64_t num_train = 0;      // total training pairs that will be added
  uint64_t num_positives = 0;  // total positives (train + test) that will be added
  uint32_t eval_negatives = 999;
  bool eval_masks_given = false;  // add_user receives each list's mask
  uint32_t record_rows = 65536;   // positives per train record
  uint32_t num_shards = 4;
  uint64_t seed = 0;
  uint64_t dropped_users = 0;
  uint64_t shuffle_buffer_bytes = 256ull << 20;  // external shuffle bucket bound
  nlohmann::json generator;
  // The original id of each dense user and item id (ascending), written as
  // user_ids.i64 and item_ids.i64; null when the dense ids are the original ones.
  const std::vector<int64_t>* raw_users = nullptr;
  const std::vector<int64_t>* raw_items = nullptr;
  // Or string ids (ascending bytewise, non-empty), written as user_ids.str and
  // item_ids.str.
  const StringList* user_strings = nullptr;
  const StringList* item_strings = nullptr;
  // How the eval lists were chosen; the writer refuses kAuto (assemble_dataset
  // decides it from the users before the writer opens).
  EvalSampling eval_sampling = EvalSampling::kDistinct;
  // Users with an eval record (0: every user). Fewer only in an extension.
  uint64_t num_eval_users = 0;
  // The id maps list the parent's ids first (not ascending): an extension.
  bool ids_in_lineage_order = false;
  // [2 x num_users] and [2 x num_items]: each id's (generation, latest time),
  // written as user_activity.i64 / item_activity.i64; null: none.
  const std::vector<int64_t>* user_activity = nullptr;
  const std::vector<int64_t>* item_activity = nullptr;
  // An extension's lineage (DatasetMeta::lineage), part of the dataset id;
  // its dropped ids, in the id maps' kind (null: none dropped).
  nlohmann::json lineage;
  const std::vector<int64_t>* dropped_user_ids = nullptr;
  const std::vector<int64_t>* dropped_item_ids = nullptr;
  const StringList* dropped_user_strings = nullptr;
  const StringList* dropped_item_strings = nullptr;
};

// Streams a dataset to disk with memory bounded by the shuffle buffer, not by
// the number of interactions: eval records and positive lists are written as
// users arrive; train pairs are spread over shuffle buckets (temporary files
// when they exceed the buffer), each shuffled in memory at finish().
class DatasetWriter {
 public:
  DatasetWriter(const std::string& dir, const DatasetPlan& plan);
  ~DatasetWriter();

  // Users arrive in id order 0, 1, …, U-1, each exactly once.
  //  positives: every item of the user (train + test), sorted ascending, distinct;
  //             in an extension also its items of earlier generations, and
  //             possibly none;
  //  train:     the user's training items, any order;
  //  eval:      1 + E items, eval[0] the held-out positive; null (num_eval 0)
  //             for a user without one (an extension's plan.num_eval_users);
  //  eval_mask: null, and the writer stores duplicate_mask(eval); or, when the
  //             plan says eval_masks_given, the source's mask (1 = counts),
  //             stored as is once given_mask_mismatch() accepts it.
  void add_user(uint64_t user, const int32_t* positives, size_t num_positives, const int32_t* train,
                size_t num_train, const int32_t* eval, size_t num_eval,
                const uint8_t* eval_mask = nullptr);
  // Shuffles and writes the train shards, then metadata.json. Returns the metadata.
  DatasetMeta finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Eval negatives: E distinct items, uniform over the items not in `positives`
// (sorted ascending), drawn from a counter-based stream keyed by (seed, user),
// so the result depends on nothing else. Throws when fewer than E items remain.
// `scratch` is a per-thread bitmap of num_items bits, all zero on entry and exit.
void draw_eval_negatives(uint64_t user, const int32_t* positives, size_t num_positives,
                         uint64_t num_items, uint32_t E, uint64_t seed,
                         std::vector<uint64_t>& scratch, int32_t* out);

// Eval negatives with replacement: E independent draws, each uniform over the
// items not in `positives` (sorted ascending), from a counter-based stream
// keyed by (seed, user); the list's duplicate mask leaves the repeats out.
// Throws when no item remains. `scratch` as for draw_eval_negatives.
void draw_eval_negatives_with_replacement(uint64_t user, const int32_t* positives,
                                          size_t num_positives, uint64_t num_items, uint32_t E,
                                          uint64_t seed, std::vector<uint64_t>& scratch,
                                          int32_t* out);

// Duplicate mask of an eval list: mask[j] = 0 when items[j] equals an earlier item.
void duplicate_mask(const int32_t* items, size_t n, uint8_t* mask);

// Checks a mask a source gave with its list (items[0] the positive): the
// entries that count (mask 1) are distinct, every item of the list has one
// entry that counts, and the positive's is entry 0 — so each distinct negative
// counts once and a negative equal to the positive never does, whichever
// occurrence the source kept. Any such mask ranks exactly as duplicate_mask's.
// Returns the first position that breaks the rule, or n when none does.
size_t given_mask_mismatch(const int32_t* items, size_t n, const uint8_t* mask);

struct VerifySummary {
  uint64_t train_records = 0, train_rows = 0, eval_records = 0, bytes = 0;
  uint64_t num_shards = 0;
  double seconds = 0;
  std::string warning;  // DatasetMeta::unsealed_warning of a version 1 dataset
  std::string lineage;  // an extension: what was checked of its lineage
};

// Walks every record of every shard: framing, CRCs, headers, versions, counts,
// id ranges, whole-file CRCs and sizes against the metadata; checks positives.bin.
// Throws ncf::Error naming the file and byte offset of the first problem.
VerifySummary verify_dataset(const std::string& dir, bool show_progress = false);

// positives.bin, memory-mapped: offsets[U+1] (int64) and items[nnz] (int32),
// each user's items sorted ascending.
class PositiveLists {
 public:
  // Opens and checks the file's size and whole-file CRC-32C against the
  // metadata (reading every page once), then the header and offset bounds.
  // Every program that reads positives.bin goes through here.
  PositiveLists(const std::string& dir, const DatasetMeta& meta);
  ~PositiveLists();
  PositiveLists(const PositiveLists&) = delete;
  PositiveLists& operator=(const PositiveLists&) = delete;

  uint64_t num_users() const { return num_users_; }
  uint64_t nnz() const { return nnz_; }
  const int64_t* offsets() const { return offsets_; }
  const int32_t* items() const { return items_; }
  const int32_t* begin(uint64_t u) const { return items_ + offsets_[u]; }
  const int32_t* end(uint64_t u) const { return items_ + offsets_[u + 1]; }

 private:
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t num_users_ = 0, nnz_ = 0;
  const int64_t* offsets_ = nullptr;
  const int32_t* items_ = nullptr;
};

}  // namespace ncf
