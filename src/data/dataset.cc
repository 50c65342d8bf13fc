// Dataset directories: metadata, the streaming writer (eval records and positive
// lists as users arrive, train pairs through a bounded external shuffle), eval
// negatives and duplicate masks. Every byte it writes is encoded by format.h.
#include "data/dataset.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <tuple>
#include <type_traits>

#include "common/check.h"
#include "common/file_io.h"
#include "common/philox.h"
#include "data/crc32c.h"
#include "data/format.h"

namespace fs = std::filesystem;

namespace ncf {

// ---------------------------------------------------------- eval negatives ---

const char* eval_sampling_name(EvalSampling s) {
  switch (s) {
    case EvalSampling::kAuto:
      return "auto";
    case EvalSampling::kDistinct:
      return "distinct";
    case EvalSampling::kWithReplacement:
      return "with_replacement";
    case EvalSampling::kGiven:
      return "given";
  }
  return "?";
}

EvalSampling parse_eval_sampling(const std::string& name) {
  if (name == "auto") return EvalSampling::kAuto;
  if (name == "distinct") return EvalSampling::kDistinct;
  if (name == "with_replacement") return EvalSampling::kWithReplacement;
  NCF_FAIL("--eval_sampling must be auto, distinct or with_replacement, got '", name, "'");
}

void draw_eval_negatives(uint64_t user, const int32_t* positives, size_t num_positives,
                         uint64_t num_items, uint32_t E, uint64_t seed,
                         std::vector<uint64_t>& scratch, int32_t* out) {
  if (E == 0) return;
  if (num_positives >= num_items || num_items - num_positives < E)
    NCF_FAIL("user ", user, " has ", num_positives, " positives among ", num_items,
             " items: fewer than the ", E, " eval negatives requested remain");
  const size_t words = (num_items + 63) / 64;
  if (scratch.size() < words) scratch.assign(words, 0);
  auto test = [&](uint64_t i) { return (scratch[i >> 6] >> (i & 63)) & 1; };
  auto set = [&](uint64_t i) { scratch[i >> 6] |= 1ull << (i & 63); };
  auto clear = [&](uint64_t i) { scratch[i >> 6] &= ~(1ull << (i & 63)); };
  for (size_t k = 0; k < num_positives; ++k) set(static_cast<uint64_t>(positives[k]));
  const uint64_t free_items = num_items - num_positives;
  CounterRng rng{seed, kStreamEvalNegatives, user};
  if (free_items >= 2ull * E) {
    // Rejection: each try succeeds with probability >= 1/2.
    uint64_t d = 0;
    for (uint32_t k = 0; k < E;) {
      uint64_t c = rng.below(d++, num_items);
      if (test(c)) continue;
      set(c);
      out[k++] = static_cast<int32_t>(c);
    }
  } else {
    // Dense case: list the free items, then a partial Fisher-Yates shuffle.
    std::vector<int32_t> pool;
    pool.reserve(free_items);
    for (uint64_t i = 0; i < num_items; ++i)
      if (!test(i)) pool.push_back(static_cast<int32_t>(i));
    for (uint32_t k = 0; k < E; ++k) {
      uint64_t j = k + rng.below(k, pool.size() - k);
      std::swap(pool[k], pool[j]);
      out[k] = pool[k];
      set(static_cast<uint64_t>(pool[k]));
    }
  }
  for (size_t k = 0; k < num_positives; ++k) clear(static_cast<uint64_t>(positives[k]));
  for (uint32_t k = 0; k < E; ++k) clear(static_cast<uint64_t>(out[k]));
}

void draw_eval_negatives_with_replacement(uint64_t user, const int32_t* positives,
                                          size_t num_positives, uint64_t num_items, uint32_t E,
                                          uint64_t seed, std::vector<uint64_t>& scratch,
                                          int32_t* out) {
  if (E == 0) return;
  if (num_positives >= num_items)
    NCF_FAIL("user ", user, " has ", num_positives, " positives among ", num_items,
             " items: no item remains to draw eval negatives from");
  const size_t words = (num_items + 63) / 64;
  if (scratch.size() < words) scratch.assign(words, 0);
  auto test = [&](uint64_t i) { return (scratch[i >> 6] >> (i & 63)) & 1; };
  for (size_t k = 0; k < num_positives; ++k) {
    const uint64_t i = static_cast<uint64_t>(positives[k]);
    scratch[i >> 6] |= 1ull << (i & 63);
  }
  const uint64_t free_items = num_items - num_positives;
  CounterRng rng{seed, kStreamEvalNegativesWithReplacement, user};
  if (2 * free_items >= num_items) {
    // Rejection over all items: each try succeeds with probability >= 1/2.
    uint64_t d = 0;
    for (uint32_t k = 0; k < E; ++k) {
      uint64_t c = rng.below(d++, num_items);
      while (test(c)) c = rng.below(d++, num_items);
      out[k] = static_cast<int32_t>(c);
    }
  } else {
    // Few items left: list them, then draw positions in the list.
    std::vector<int32_t> pool;
    pool.reserve(free_items);
    for (uint64_t i = 0; i < num_items; ++i)
      if (!test(i)) pool.push_back(static_cast<int32_t>(i));
    for (uint32_t k = 0; k < E; ++k) out[k] = pool[rng.below(k, pool.size())];
  }
  for (size_t k = 0; k < num_positives; ++k) {
    const uint64_t i = static_cast<uint64_t>(positives[k]);
    scratch[i >> 6] &= ~(1ull << (i & 63));
  }
}

void duplicate_mask(const int32_t* items, size_t n, uint8_t* mask) {
  // A bitmap over the ids present (set, test, then cleared): O(n) per list.
  thread_local std::vector<uint64_t> seen;
  int64_t top = 0;
  for (size_t j = 0; j < n; ++j) {
    NCF_CHECK(items[j] >= 0, "duplicate_mask: negative item id ", items[j], " at position ", j);
    top = std::max<int64_t>(top, items[j]);
  }
  if (seen.size() < size_t(top / 64 + 1)) seen.resize(size_t(top / 64 + 1), 0);
  for (size_t j = 0; j < n; ++j) {
    const uint64_t i = uint64_t(uint32_t(items[j]));
    const uint64_t bit = 1ull << (i & 63);
    mask[j] = (seen[i >> 6] & bit) ? 0 : 1;
    seen[i >> 6] |= bit;
  }
  for (size_t j = 0; j < n; ++j) seen[uint64_t(uint32_t(items[j])) >> 6] = 0;
}

size_t given_mask_mismatch(const int32_t* items, size_t n, const uint8_t* mask) {
  if (n == 0) return 0;
  if (mask[0] != 1) return 0;
  // Bitmap of the items whose counting entry was seen, as in duplicate_mask.
  thread_local std::vector<uint64_t> counted;
  int64_t top = 0;
  for (size_t j = 0; j < n; ++j) {
    if (items[j] < 0 || mask[j] > 1) return j;
    top = std::max<int64_t>(top, items[j]);
  }
  if (counted.size() < size_t(top / 64 + 1)) counted.resize(size_t(top / 64 + 1), 0);
  auto bit = [](int32_t i) { return 1ull << (uint32_t(i) & 63); };
  auto word = [&](int32_t i) -> uint64_t& { return counted[uint32_t(i) >> 6]; };
  size_t bad = n;
  for (size_t j = 0; j < n && bad == n; ++j) {
    if (!mask[j]) continue;
    if (word(items[j]) & bit(items[j])) bad = j;  // a second counting entry
    word(items[j]) |= bit(items[j]);
  }
  for (size_t j = 0; j < n && bad == n; ++j)
    if (!mask[j] && !(word(items[j]) & bit(items[j]))) bad = j;  // no entry of it counts
  for (size_t j = 0; j < n; ++j) word(items[j]) = 0;
  return bad;
}

// ------------------------------------------------------------------ writer ---

namespace {

// A bucket of packed (user << 32 | item) pairs, spilled to a file when the
// plan does not fit the shuffle buffer.
struct Bucket {
  std::vector<uint64_t> pending;
  std::FILE* file = nullptr;
  std::string path;
  uint64_t count = 0;
};

// Creates `dir` and removes an earlier dataset's files from it.
void clear_dataset_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) NCF_FAIL("cannot create dataset directory ", dir, ": ", ec.message());
  // Old shards of another layout would confuse readers globbing the directory:
  // the files of an earlier dataset go, by their exact names. Anything else in
  // the directory stays; a link by such a name stops the run (the new file
  // would be written through it, outside the directory).
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (!is_shard_file_name(n) && n != kMetadataFile && n != kPositivesFile) continue;
    const fs::file_status st = e.symlink_status();
    if (fs::is_symlink(st))
      NCF_FAIL("output directory ", dir, ": ", n,
               " is a symbolic link; ncf_prep writes its files only inside the directory: move "
               "it away or choose another --output");
    if (!fs::is_regular_file(st))
      NCF_FAIL("output directory ", dir, ": ", n,
               " is in the way (not a regular file): move it away or choose another --output");
    fs::remove(e.path());
  }
}

// An extension whose dense ids are the original ones (identity_lineage in
// extend.h): the lineage's user and item counts.
void count_identity_lineage(const DatasetPlan& plan, nlohmann::json& lineage) {
  // Dense ids that are the original ones: the parent's ids are the first of these.
  const nlohmann::json& parent = lineage.at("parent");
  const uint64_t pu = parent.at("num_users").get<uint64_t>();
  const uint64_t pi = parent.at("num_items").get<uint64_t>();
  if (plan.num_users < pu || plan.num_items < pi)
    NCF_FAIL("--extend ", parent.at("path").get<std::string>(), ": the parent has ", pu,
             " users and ", pi, " items, this input ", plan.num_users, " and ", plan.num_items,
             ": its ids are dense, so an extension holds at least the parent's users and items");
  auto counts = [](uint64_t p, uint64_t now) {
    return nlohmann::json{{"parent", p},      {"kept", p}, {"new", now - p},     {"dropped", 0},
                          {"new_dropped", 0}, {"max", 0},  {"renumbered", false}};
  };
  lineage["users"] = counts(pu, plan.num_users);
  lineage["items"] = counts(pi, plan.num_items);
}

std::string dataset_id_of(const DatasetPlan& plan, const nlohmann::json& lineage) {
  // The id ties shards to this metadata; derived from the content plan so the
  // same inputs give byte-identical output.
  nlohmann::json id = {{"source", plan.source},   {"users", plan.num_users},
                       {"items", plan.num_items}, {"train", plan.num_train},
                       {"seed", plan.seed},       {"E", plan.eval_negatives},
                       {"R", plan.record_rows},   {"gen", plan.generator}};
  // Lists drawn with replacement differ from distinct ones of the same
  // ratings and seed; the id says so (distinct ids stay as they were).
  if (plan.eval_sampling == EvalSampling::kWithReplacement)
    id["eval_sampling"] = eval_sampling_name(plan.eval_sampling);
  // An extension's parent and what it kept make it another dataset (where
  // the parent lies does not).
  if (!lineage.is_null()) {
    id["lineage"] = lineage;
    id["lineage"]["parent"].erase("path");
  }
  std::string s = id.dump();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08x%08x", crc32c(s.data(), s.size()),
                crc32c_extend(0x5eed, s.data(), s.size()));
  return buf;
}

}  // namespace

struct DatasetWriter::Impl {
  std::string dir;
  DatasetPlan plan;
  DatasetMeta meta;
  uint32_t L = 0;  // eval list length 1 + E

  // eval shards, written as users arrive
  uint32_t eval_shards = 0;
  uint32_t eval_shard = 0;
  std::unique_ptr<ShardCursor> eval_out;
  std::string payload;

  std::unique_ptr<PositivesWriter> positives;

  // train shuffle
  uint32_t num_buckets = 1;
  std::vector<Bucket> buckets;
  uint64_t train_added = 0;

  uint64_t next_user = 0;
  uint64_t eval_added = 0;  // eval records written
  bool finished = false;

  uint64_t eval_first(uint32_t s) const { return s * meta.num_eval_users / eval_shards; }

  void open_eval_shard(uint32_t s) {
    if (eval_out) close_eval_shard();
    eval_shard = s;
    ShardInfo si;
    si.name = shard_file_name("eval", s, eval_shards);
    si.kind = "eval";
    si.first_record = eval_first(s);
    si.num_records = eval_first(s + 1) - eval_first(s);
    si.num_valid_rows = si.num_records * L;
    eval_out = std::make_unique<ShardCursor>(dir, meta, si, s, eval_shards);
  }

  void close_eval_shard() {
    meta.shards.push_back(eval_out->close());
    eval_out.reset();
  }

  void flush_bucket(Bucket& b) {
    if (b.pending.empty()) return;
    if (!b.file) {
      b.path = dir + "/.shuffle-" + std::to_string(&b - buckets.data()) + ".tmp";
      b.file = std::fopen(b.path.c_str(), "w+b");
      if (!b.file) NCF_FAIL("cannot create shuffle file ", b.path, ": ", std::strerror(errno));
    }
    if (std::fwrite(b.pending.data(), 8, b.pending.size(), b.file) != b.pending.size())
      NCF_FAIL("write failed on shuffle file ", b.path, " (disk full?)");
    b.pending.clear();
  }

  // Reads back (or takes) bucket b's pairs and shuffles them.
  std::vector<uint64_t> shuffled_bucket(uint32_t b) {
    Bucket& bk = buckets[b];
    std::vector<uint64_t> pairs;
    if (bk.file) {
      flush_bucket(bk);
      pairs.resize(bk.count);
      if (fseeko(bk.file, 0, SEEK_SET) != 0 ||
          std::fread(pairs.data(), 8, pairs.size(), bk.file) != pairs.size())
        NCF_FAIL("read failed on shuffle file ", bk.path);
      std::fclose(bk.file);
      bk.file = nullptr;
      std::remove(bk.path.c_str());
    } else {
      pairs.swap(bk.pending);
    }
    CounterRng rng{plan.seed, kStreamShuffle, (1ull << 63) | b};
    for (uint64_t i = pairs.size(); i > 1; --i) {
      uint64_t j = rng.below(i, i);
      std::swap(pairs[i - 1], pairs[j]);
    }
    return pairs;
  }

  void write_train_shards();
};

DatasetWriter::DatasetWriter(const std::string& dir, const DatasetPlan& plan)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.dir = dir;
  w.plan = plan;
  NCF_CHECK(plan.num_users > 0, "dataset has no users");
  NCF_CHECK(plan.num_items > 0, "dataset has no items");
  NCF_CHECK(plan.num_train > 0, "dataset has no training pairs");
  NCF_CHECK(plan.num_users <= INT32_MAX && plan.num_items <= INT32_MAX,
            "ids must fit int32: num_users ", plan.num_users, ", num_items ", plan.num_items);
  NCF_CHECK(plan.record_rows > 0 && plan.record_rows <= kMaxRecordRows,
            "record_rows must be in [1, ", kMaxRecordRows, "], got ", plan.record_rows);
  NCF_CHECK(plan.eval_negatives <= kMaxEvalNegatives, "eval_negatives must be at most ",
            kMaxEvalNegatives, ", got ", plan.eval_negatives);
  NCF_CHECK(plan.num_shards > 0, "num_shards must be > 0, got ", plan.num_shards);
  NCF_CHECK(plan.eval_sampling != EvalSampling::kAuto,
            "the plan's eval sampling must be decided before the writer opens");
  NCF_CHECK(!plan.eval_masks_given || plan.eval_sampling == EvalSampling::kGiven,
            "given eval masks come only with given eval lists");
  clear_dataset_dir(dir);

  DatasetMeta& m = w.meta;
  m.source = plan.source;
  m.num_users = plan.num_users;
  m.num_items = plan.num_items;
  m.num_train = plan.num_train;
  m.num_positives = plan.num_positives;
  DatasetPlan& lp = w.plan;
  if (lp.lineage.is_object() && lp.lineage.value("ids", "") == "identity")
    count_identity_lineage(plan, lp.lineage);
  m.num_eval_users = plan.num_eval_users ? plan.num_eval_users : plan.num_users;
  NCF_CHECK(m.num_eval_users <= plan.num_users, plan.num_eval_users, " eval users of ",
            plan.num_users);
  if (!lp.lineage.is_null() || m.num_eval_users < plan.num_users) {
    NCF_CHECK(!lp.lineage.is_null(), "only an extension evaluates fewer users than it has");
    m.format_version = kFormatVersion;
    m.lineage = lp.lineage;
  }
  m.eval_negatives = plan.eval_negatives;
  m.eval_masks_given = plan.eval_masks_given;
  m.eval_sampling = eval_sampling_name(plan.eval_sampling);
  m.train_record_rows = plan.record_rows;
  m.dropped_users = plan.dropped_users;
  m.seed = plan.seed;
  m.generator = plan.generator;
  m.dataset_id = dataset_id_of(plan, lp.lineage);
  w.L = plan.eval_negatives + 1;
  m.train_frame_bytes = train_frame_bytes(plan.record_rows);
  m.eval_frame_bytes = eval_frame_bytes(w.L);

  w.eval_shards = static_cast<uint32_t>(std::min<uint64_t>(plan.num_shards, m.num_eval_users));
  NCF_CHECK(w.eval_shards > 0, "dataset has no eval users");
  w.open_eval_shard(0);
  w.positives = std::make_unique<PositivesWriter>(dir + "/" + kPositivesFile, plan.num_users);

  const uint64_t pair_bytes = plan.num_train * 8;
  w.num_buckets = static_cast<uint32_t>(std::max<uint64_t>(
      1, (pair_bytes + plan.shuffle_buffer_bytes - 1) / plan.shuffle_buffer_bytes));
  w.buckets.resize(w.num_buckets);
  if (w.num_buckets == 1) w.buckets[0].pending.reserve(plan.num_train);
}

DatasetWriter::~DatasetWriter() {
  if (!impl_) return;
  for (auto& b : impl_->buckets)
    if (b.file) {
      std::fclose(b.file);
      std::remove(b.path.c_str());
    }
}

void DatasetWriter::add_user(uint64_t user, const int32_t* positives, size_t num_positives,
                             const int32_t* train, size_t num_train, const int32_t* eval,
                             size_t num_eval, const uint8_t* eval_mask) {
  Impl& w = *impl_;
  NCF_CHECK(!w.finished, "add_user after finish");
  NCF_CHECK(user == w.next_user, "users must arrive in order: got ", user, ", expected ",
            w.next_user);
  NCF_CHECK(user < w.plan.num_users, "user ", user, " beyond the planned ", w.plan.num_users);
  const bool evaluated = eval != nullptr;
  NCF_CHECK(num_eval == (evaluated ? w.L : 0), "user ", user, ": eval list has ", num_eval,
            " items, expected ", w.L);
  NCF_CHECK(evaluated || w.meta.num_eval_users < w.plan.num_users, "user ", user,
            " has no eval list, but every user needs one in this plan");
  const int64_t I = static_cast<int64_t>(w.plan.num_items);
  for (size_t k = 0; k < num_positives; ++k) {
    NCF_CHECK(positives[k] >= 0 && positives[k] < I, "user ", user, ": positive item ",
              positives[k], " out of range [0, ", I, ")");
    NCF_CHECK(k == 0 || positives[k] > positives[k - 1], "user ", user,
              ": positives must be sorted and distinct");
  }
  for (size_t k = 0; k < num_eval; ++k)
    NCF_CHECK(eval[k] >= 0 && eval[k] < I, "user ", user, ": eval item ", eval[k],
              " out of range [0, ", I, ")");
  NCF_CHECK(!evaluated || (eval_mask != nullptr) == w.plan.eval_masks_given, "user ", user,
            ": an eval mask must be given exactly when the plan says eval_masks_given");
  if (eval_mask) {
    const size_t bad = given_mask_mismatch(eval, num_eval, eval_mask);
    NCF_CHECK(bad == num_eval, "user ", user, ": given eval mask is inconsistent at position ", bad,
              " (item ", bad < num_eval ? eval[bad] : -1, ")");
  }
  ++w.next_user;

  if (evaluated) {
    NCF_CHECK(w.eval_added < w.meta.num_eval_users, "more eval users than planned (",
              w.meta.num_eval_users, ")");
    while (w.eval_shard + 1 < w.eval_shards && w.eval_added >= w.eval_first(w.eval_shard + 1))
      w.open_eval_shard(w.eval_shard + 1);
    encode_eval_record(user, eval, num_eval, &w.payload, eval_mask);
    w.eval_out->append(w.payload);
    ++w.eval_added;
  }

  w.positives->add(positives, num_positives);
  NCF_CHECK(w.positives->written() <= w.plan.num_positives, "more positives than planned (",
            w.plan.num_positives, ")");

  // train pairs into shuffle buckets
  for (size_t k = 0; k < num_train; ++k) {
    NCF_CHECK(train[k] >= 0 && train[k] < I, "user ", user, ": train item ", train[k],
              " out of range [0, ", I, ")");
    uint64_t packed = (user << 32) | static_cast<uint32_t>(train[k]);
    uint32_t b = 0;
    if (w.num_buckets > 1) {
      CounterRng rng{w.plan.seed, kStreamShuffle, w.train_added};
      b = static_cast<uint32_t>(rng.below(0, w.num_buckets));
    }
    Bucket& bk = w.buckets[b];
    bk.pending.push_back(packed);
    ++bk.count;
    if (w.num_buckets > 1 && bk.pending.size() >= (1u << 16)) w.flush_bucket(bk);
    ++w.train_added;
  }
  NCF_CHECK(w.train_added <= w.plan.num_train, "more train pairs than planned (", w.plan.num_train,
            ")");
}

// Each bucket shuffled in memory, in bucket order, then cut into records of
// record_rows pairs spread over the train shards.
void DatasetWriter::Impl::write_train_shards() {
  const uint32_t rows = plan.record_rows;
  const uint64_t num_records = meta.num_train_records();
  const uint32_t num_shards =
      static_cast<uint32_t>(std::min<uint64_t>(plan.num_shards, num_records));
  auto first_of = [&](uint32_t s) { return s * num_records / num_shards; };
  uint32_t shard = 0;
  uint64_t record = 0;
  std::unique_ptr<ShardCursor> out;
  std::vector<ShardInfo> written;
  std::vector<int32_t> users(rows), items(rows);
  uint32_t fill = 0;
  auto open_shard = [&](uint32_t s) {
    ShardInfo si;
    si.name = shard_file_name("train", s, num_shards);
    si.kind = "train";
    si.first_record = first_of(s);
    si.num_records = first_of(s + 1) - first_of(s);
    const uint64_t last = first_of(s + 1);
    si.num_valid_rows = std::min<uint64_t>(last * rows, plan.num_train) - si.first_record * rows;
    out = std::make_unique<ShardCursor>(dir, meta, si, s, num_shards);
  };
  auto emit = [&]() {
    if (record == first_of(shard + 1)) {
      written.push_back(out->close());
      open_shard(++shard);
    }
    encode_train_record(users.data(), items.data(), fill, rows, &payload);
    out->append(payload);
    ++record;
    fill = 0;
  };
  open_shard(0);
  for (uint32_t b = 0; b < num_buckets; ++b) {
    for (uint64_t p : shuffled_bucket(b)) {
      users[fill] = static_cast<int32_t>(p >> 32);
      items[fill] = static_cast<int32_t>(p & 0xffffffffu);
      if (++fill == rows) emit();
    }
  }
  if (fill > 0) emit();
  written.push_back(out->close());
  NCF_CHECK(record == num_records, "wrote ", record, " train records, expected ", num_records);
  // Shards listed train first, then eval, each in index order.
  meta.shards.insert(meta.shards.begin(), written.begin(), written.end());
}

namespace {

// An id map file in the string layout (dataset.h), written atomically.
// `ascending`: the strings must ascend (a map from scratch); else distinct
// (checked by the readers' IdMap) in lineage order.
IdMapInfo write_string_ids(const std::string& dir, const char* name, const StringList& ids,
                           uint64_t want, bool ascending) {
  NCF_CHECK(
      ids.size() == want && ids.offsets.front() == 0 && ids.offsets.back() == ids.bytes.size(),
      name, ": ", ids.size(), " ids for ", want);
  for (size_t d = 0; d < ids.size(); ++d)
    NCF_CHECK(!ids[d].empty() && (!ascending || d == 0 || ids[d - 1] < ids[d]), name,
              ": ids must be non-empty and strictly ascending (entry ", d, ")");
  // The offsets as they are in memory (little-endian hosts), then the bytes.
  const std::string path = dir + "/" + name, tmp = path + ".tmp";
  const size_t head = ids.offsets.size() * 8;
  {
    FileHandle f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    f.write_at(0, ids.offsets.data(), head);
    f.write_at(int64_t(head), ids.bytes.data(), ids.bytes.size());
    f.sync();
    f.close();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    NCF_FAIL("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  const uint32_t crc =
      crc32c_extend(crc32c(ids.offsets.data(), head), ids.bytes.data(), ids.bytes.size());
  IdMapInfo info{name, true, ids.size(), head + ids.bytes.size(), crc};
  info.ascending = ascending;
  return info;
}

IdMapInfo write_int_ids(const std::string& dir, const char* name, const std::vector<int64_t>& ids,
                        uint64_t want, bool ascending) {
  NCF_CHECK(ids.size() == want, name, ": ", ids.size(), " ids for ", want);
  if (ascending)
    for (size_t d = 1; d < ids.size(); ++d)
      NCF_CHECK(ids[d - 1] < ids[d], name, ": ids must be strictly ascending (entry ", d, ")");
  const std::string bytes(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
  write_file_atomic(dir + "/" + name, bytes);
  IdMapInfo info{name, false, ids.size(), bytes.size(), crc32c(bytes.data(), bytes.size())};
  info.ascending = ascending;
  return info;
}

}  // namespace

DatasetMeta DatasetWriter::finish() {
  Impl& w = *impl_;
  NCF_CHECK(!w.finished, "finish called twice");
  w.finished = true;
  NCF_CHECK(w.next_user == w.plan.num_users, "only ", w.next_user, " of ", w.plan.num_users,
            " planned users were added");
  NCF_CHECK(w.train_added == w.plan.num_train, "added ", w.train_added, " train pairs, planned ",
            w.plan.num_train);
  NCF_CHECK(w.positives->written() == w.plan.num_positives, "added ", w.positives->written(),
            " positives, planned ", w.plan.num_positives);
  NCF_CHECK(w.eval_added == w.meta.num_eval_users, "added ", w.eval_added, " eval users, planned ",
            w.meta.num_eval_users);
  w.close_eval_shard();
  w.positives->finish(&w.meta.positives_bytes, &w.meta.positives_crc32c);
  w.positives.reset();
  w.write_train_shards();
  const bool lineage_order = w.plan.ids_in_lineage_order;
  if (w.plan.user_strings || w.plan.item_strings) {
    NCF_CHECK(w.plan.user_strings && w.plan.item_strings && !w.plan.raw_users && !w.plan.raw_items,
              "string id maps: give both, and no int64 maps");
    w.meta.id_maps.push_back(write_string_ids(w.dir, kUserIdsStrFile, *w.plan.user_strings,
                                              w.plan.num_users, !lineage_order));
    w.meta.id_maps.push_back(write_string_ids(w.dir, kItemIdsStrFile, *w.plan.item_strings,
                                              w.plan.num_items, !lineage_order));
  }
  if (w.plan.raw_users || w.plan.raw_items) {
    NCF_CHECK(w.plan.raw_users && w.plan.raw_items, "id maps: give both or neither");
    w.meta.id_maps.push_back(
        write_int_ids(w.dir, kUserIdsFile, *w.plan.raw_users, w.plan.num_users, !lineage_order));
    w.meta.id_maps.push_back(
        write_int_ids(w.dir, kItemIdsFile, *w.plan.raw_items, w.plan.num_items, !lineage_order));
  }
  if (w.plan.user_activity || w.plan.item_activity) {
    NCF_CHECK(w.plan.user_activity && w.plan.item_activity, "activity: give both or neither");
    for (const auto& [name, act, n] :
         {std::tuple{kUserActivityFile, w.plan.user_activity, w.plan.num_users},
          std::tuple{kItemActivityFile, w.plan.item_activity, w.plan.num_items}}) {
      NCF_CHECK(act->size() == 2 * n, name, ": ", act->size(), " values for ", n, " ids");
      const std::string bytes(reinterpret_cast<const char*>(act->data()), act->size() * 8);
      write_file_atomic(w.dir + "/" + name, bytes);
      w.meta.activity.push_back({name, false, n, bytes.size(), crc32c(bytes.data(), bytes.size())});
    }
  }
  if (w.plan.dropped_user_ids || w.plan.dropped_user_strings) {
    NCF_CHECK(!w.plan.lineage.is_null(), "dropped ids without a lineage");
    if (w.plan.dropped_user_strings) {
      w.meta.dropped_ids.push_back(write_string_ids(w.dir, "dropped_user_ids.str",
                                                    *w.plan.dropped_user_strings,
                                                    w.plan.dropped_user_strings->size(), false));
      w.meta.dropped_ids.push_back(write_string_ids(w.dir, "dropped_item_ids.str",
                                                    *w.plan.dropped_item_strings,
                                                    w.plan.dropped_item_strings->size(), false));
    } else {
      w.meta.dropped_ids.push_back(write_int_ids(w.dir, "dropped_user_ids.i64",
                                                 *w.plan.dropped_user_ids,
                                                 w.plan.dropped_user_ids->size(), false));
      w.meta.dropped_ids.push_back(write_int_ids(w.dir, "dropped_item_ids.i64",
                                                 *w.plan.dropped_item_ids,
                                                 w.plan.dropped_item_ids->size(), false));
    }
  }
  sync_directory(w.dir);
  w.meta.save(w.dir);
  return w.meta;
}

}  // namespace ncf
