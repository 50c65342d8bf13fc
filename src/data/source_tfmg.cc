// TF Model Garden NCF shards → dataset directory (see source_tfmg.h). The input
// is walked in three passes, each streaming record by record over the shard
// files on the pool: training cycle 0 (the positives, kept as per-user sorted
// lists), the eval shards (every user's candidates and masks, held against
// TF-MG's own mask rule), then the other cycles (each must hold cycle 0's
// positives). Memory holds the positives and the eval lists, never a shard.
// The shared prep stages then write the dataset with the eval lists and masks
// given, as the NCF-paper source gives its negatives.
#include "data/source_tfmg.h"

#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/check.h"
#include "data/extend.h"
#include "data/format.h"
#include "data/prep_stages.h"
#include "data/tf_example.pb.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Int64s = google::protobuf::RepeatedField<int64_t>;

constexpr const char* kMetaFile = "meta_data.json";
constexpr const char* kEvalDir = "eval_data";
constexpr const char* kCycleDir = "training_cycle_";
constexpr const char* kShardPrefix = "shard_";
constexpr const char* kShardSuffix = ".tfrecords";
constexpr uint64_t kMaxPrebatch = 1ull << 24;       // rows per record (keeps a frame < 2 GiB)
constexpr uint64_t kMaxListLen = (1ull << 20) + 1;  // 1 + E, E as ncf_prep --eval_negatives
constexpr uint64_t kMaxOffset = 1ull << 48;         // byte offsets packed with a file index

// Each kind's features, in the order they are checked.
constexpr int kTrainFeatureCount = 4, kEvalFeatureCount = 3;
const char* const kTrainFeatures[kTrainFeatureCount] = {"user_id", "item_id", "labels",
                                                        "valid_point_mask"};
const char* const kEvalFeatures[kEvalFeatureCount] = {"user_id", "item_id", "duplicate_mask"};

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

std::string where(const std::string& path, uint64_t offset) {
  return detail::concat(path, " at byte offset ", offset);
}

// ----------------------------------------------------------- meta_data.json ---

struct TfmgMeta {
  std::string path;  // DIR/meta_data.json
  uint64_t num_users = 0, num_items = 0;
  std::string constructor_type;
  uint64_t num_train_elements = 0, num_eval_elements = 0, num_train_epochs = 0;
  uint64_t train_prebatch_size = 0, eval_prebatch_size = 0;
  uint64_t num_train_steps = 0, num_eval_steps = 0;
  uint64_t list_len = 0;  // L = 1 + E = num_eval_elements / num_users
};

uint64_t meta_uint(const nlohmann::json& j, const char* key, uint64_t lo, uint64_t hi,
                   const std::string& path) {
  if (!j.contains(key)) NCF_FAIL(path, ": field '", key, "' is missing");
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned())
    NCF_FAIL(path, ": field '", key, "' must be a non-negative integer, got ", v.dump());
  const uint64_t x = v.get<uint64_t>();
  if (x < lo || x > hi)
    NCF_FAIL(path, ": field '", key, "' is ", x, ", outside [", lo, ", ", hi, "]");
  return x;
}

TfmgMeta read_meta(const std::string& dir) {
  TfmgMeta m;
  m.path = dir + "/" + kMetaFile;
  std::ifstream f(m.path);
  if (!f)
    NCF_FAIL("cannot open ", m.path, ": ", std::strerror(errno),
             " (a TF Model Garden NCF data directory holds meta_data.json, training_cycle_<e>/ "
             "and eval_data/)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    NCF_FAIL(m.path, ": not valid JSON at byte ", e.byte, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {
    // The parser throws more than parse_error: a number beyond every JSON
    // number type (1e999) is an out_of_range error.
    NCF_FAIL(m.path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) NCF_FAIL(m.path, ": not a JSON object");
  const uint64_t kIds = INT32_MAX, kBig = 1ull << 62;
  m.num_users = meta_uint(j, "num_users", 1, kIds, m.path);
  m.num_items = meta_uint(j, "num_items", 1, kIds, m.path);
  if (!j.contains("constructor_type") || !j["constructor_type"].is_string())
    NCF_FAIL(m.path, ": field 'constructor_type' is missing or not a string");
  m.constructor_type = j["constructor_type"].get<std::string>();
  m.num_train_elements = meta_uint(j, "num_train_elements", 1, kBig, m.path);
  m.num_eval_elements = meta_uint(j, "num_eval_elements", 1, kBig, m.path);
  m.num_train_epochs = meta_uint(j, "num_train_epochs", 1, 100000, m.path);
  m.train_prebatch_size = meta_uint(j, "train_prebatch_size", 1, kMaxPrebatch, m.path);
  m.eval_prebatch_size = meta_uint(j, "eval_prebatch_size", 1, kMaxPrebatch, m.path);
  m.num_train_steps = meta_uint(j, "num_train_steps", 1, kBig, m.path);
  m.num_eval_steps = meta_uint(j, "num_eval_steps", 1, kBig, m.path);

  if (m.num_eval_elements % m.num_users != 0)
    NCF_FAIL(m.path, ": num_eval_elements ", m.num_eval_elements,
             " is not a multiple of num_users ", m.num_users,
             " (every user has the same 1 + E eval candidates)");
  m.list_len = m.num_eval_elements / m.num_users;
  if (m.list_len < 2 || m.list_len > kMaxListLen)
    NCF_FAIL(m.path, ": num_eval_elements / num_users = ", m.list_len,
             " eval candidates per user, outside [2, ", kMaxListLen, "]");
  if (m.eval_prebatch_size % m.list_len != 0)
    NCF_FAIL(m.path, ": eval_prebatch_size ", m.eval_prebatch_size, " is not a multiple of ",
             m.list_len, " (num_eval_elements / num_users, the candidates of one user)");
  const uint64_t train_steps = ceil_div(m.num_train_elements, m.train_prebatch_size);
  if (m.num_train_steps != train_steps)
    NCF_FAIL(m.path, ": num_train_steps is ", m.num_train_steps, " but ceil(num_train_elements ",
             m.num_train_elements, " / train_prebatch_size ", m.train_prebatch_size,
             ") = ", train_steps);
  const uint64_t eval_steps = ceil_div(m.num_eval_elements, m.eval_prebatch_size);
  if (m.num_eval_steps != eval_steps)
    NCF_FAIL(m.path, ": num_eval_steps is ", m.num_eval_steps, " but ceil(num_eval_elements ",
             m.num_eval_elements, " / eval_prebatch_size ", m.eval_prebatch_size,
             ") = ", eval_steps);
  return m;
}

// ------------------------------------------------------------ the layout ---

// "shard_<k>.tfrecords" → k (decimal, no sign, no leading zero but "0").
bool parse_shard_name(const std::string& name, uint64_t* k) {
  const size_t p = std::strlen(kShardPrefix), s = std::strlen(kShardSuffix);
  if (name.size() <= p + s || name.compare(0, p, kShardPrefix) != 0 ||
      name.compare(name.size() - s, s, kShardSuffix) != 0)
    return false;
  const std::string digits = name.substr(p, name.size() - p - s);
  if (digits.size() > 9 || (digits.size() > 1 && digits[0] == '0')) return false;
  *k = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    *k = *k * 10 + uint64_t(c - '0');
  }
  return true;
}

// DIR/sub/shard_0 .. shard_{n-1}.tfrecords, in order: refuses a missing
// directory, no shard at all, a gap in the numbering or a shard that is not a
// regular file (an empty one is fine: with few batches some shards get none).
std::vector<std::string> list_shards(const std::string& subdir) {
  std::error_code ec;
  if (!fs::is_directory(subdir, ec))
    NCF_FAIL(subdir,
             ": directory is missing (TF Model Garden NCF data holds training_cycle_<e>/ "
             "for every epoch and eval_data/, each with shard_<k>.tfrecords files)");
  std::vector<std::pair<uint64_t, std::string>> found;
  fs::directory_iterator it(subdir, ec), end;
  if (ec) NCF_FAIL("cannot list ", subdir, ": ", ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) NCF_FAIL("cannot list ", subdir, ": ", ec.message());
    const std::string name = it->path().filename().string();
    uint64_t k = 0;
    if (!parse_shard_name(name, &k)) continue;
    if (!it->is_regular_file(ec)) NCF_FAIL(subdir, "/", name, ": not a regular file");
    found.emplace_back(k, it->path().string());
  }
  if (found.empty()) NCF_FAIL(subdir, ": no shard_<k>.tfrecords files");
  std::sort(found.begin(), found.end());
  for (uint64_t k = 0; k < found.size(); ++k)
    if (found[k].first != k)
      NCF_FAIL(subdir, "/", kShardPrefix, k, kShardSuffix, ": missing (found ", found.size(),
               " shard files numbered up to ", found.back().first,
               "; they must be shard_0 .. shard_{n-1})");
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

// Every cycle's shard files, and eval_data's; refuses cycles beyond the
// meta's num_train_epochs and cycles whose shard count differs from cycle 0's.
struct Layout {
  std::vector<std::vector<std::string>> cycles;  // num_train_epochs lists
  std::vector<std::string> eval;
};

Layout find_layout(const std::string& dir, const TfmgMeta& m) {
  Layout lay;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) NCF_FAIL("cannot list ", dir, ": ", ec.message());
  const size_t p = std::strlen(kCycleDir);
  for (; it != end; it.increment(ec)) {
    if (ec) NCF_FAIL("cannot list ", dir, ": ", ec.message());
    const std::string name = it->path().filename().string();
    if (name.compare(0, p, kCycleDir) != 0) continue;
    const std::string digits = name.substr(p);
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const uint64_t e = std::stoull(digits);
    if (e >= m.num_train_epochs)
      NCF_FAIL(dir, "/", name, " exists but ", m.path, " says num_train_epochs ",
               m.num_train_epochs, " (cycles 0 .. ", m.num_train_epochs - 1, ")");
  }
  for (uint64_t e = 0; e < m.num_train_epochs; ++e) {
    lay.cycles.push_back(list_shards(detail::concat(dir, "/", kCycleDir, e)));
    if (lay.cycles[e].size() != lay.cycles[0].size())
      NCF_FAIL(dir, "/", kCycleDir, e, ": ", lay.cycles[e].size(), " shard files but ", dir, "/",
               kCycleDir, "0 has ", lay.cycles[0].size());
  }
  lay.eval = list_shards(dir + "/" + kEvalDir);
  return lay;
}

// Every eval row is three Int64List values of at least a byte each, so shard
// files of fewer than 3 x num_eval_elements bytes cannot hold the rows the meta
// announces. Checked before anything is sized by num_users (cycle 0's
// per-user offsets, the eval lists): meta_data.json's counts are otherwise
// only held to the records once they are read, and 2 x 10^9 users with a few
// small shards asked for 16 GB first.
void check_eval_bytes(const std::string& dir, const Layout& lay, const TfmgMeta& m) {
  uint64_t bytes = 0;
  for (const std::string& path : lay.eval) {
    std::error_code ec;
    const uint64_t n = fs::file_size(path, ec);
    if (ec) NCF_FAIL("cannot read the size of ", path, ": ", ec.message());
    bytes += n;
  }
  if (m.num_eval_elements > bytes / 3)
    NCF_FAIL(dir, "/", kEvalDir, ": its ", lay.eval.size(), " shard files hold ", bytes,
             " bytes, too few for the ", m.num_eval_elements, " eval rows ", m.path,
             " announces (num_eval_elements; a row takes at least 3 bytes)");
}

// ------------------------------------------------------------- records ---

// A bound on a record's size: Int64List values take at most 10 bytes each.
uint64_t max_record_bytes(uint64_t rows, int features) {
  return uint64_t(features) * (rows * 10 + 64) + 1024;
}

const char* kind_name(const tfexample::Feature& f) {
  switch (f.kind_case()) {
    case tfexample::Feature::kBytesList:
      return "BytesList";
    case tfexample::Feature::kFloatList:
      return "FloatList";
    case tfexample::Feature::kInt64List:
      return "Int64List";
    default:
      return "Feature with no list";
  }
}

// Parses one record and finds its features: exactly `names`, each an
// Int64List of `len` values (lists[k] = names[k]'s values). A BytesList is the
// pre-2019 layout, refused as such before anything else.
template <int N>
void decode_features(const std::string& payload, const char* const (&names)[N], uint64_t len,
                     const char* len_field, const std::string& at, tfexample::Example* ex,
                     const Int64s* (&lists)[N]) {
  bool parsed;
  {
    // A feature name that is no UTF-8 fails the parse, which is refused below
    // naming the record; protobuf's own ERROR line would come first.
    google::protobuf::LogSilencer quiet;
    parsed = ex->ParseFromArray(payload.data(), static_cast<int>(payload.size()));
  }
  if (!parsed)
    NCF_FAIL(at,
             ": record is not a tf.train.Example (it does not parse; a feature name must be "
             "UTF-8)");
  const auto& fmap = ex->features().feature();
  std::vector<std::string> keys;
  for (const auto& kv : fmap) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys)
    if (fmap.at(k).kind_case() == tfexample::Feature::kBytesList)
      NCF_FAIL(at, ": feature '", k,
               "' is a BytesList: this is the pre-2019 TF Model Garden layout (arrays stored as "
               "raw bytes), which ncf_prep does not read; write the data again with a current "
               "create_ncf_data.py (Int64List features)");
  for (const auto& k : keys)
    if (std::find_if(std::begin(names), std::end(names), [&](const char* n) { return k == n; }) ==
        std::end(names)) {
      std::string expected;
      for (const char* n : names) expected += (expected.empty() ? "" : ", ") + std::string(n);
      NCF_FAIL(at, ": unknown feature '", k, "' (a record holds ", expected, ")");
    }
  for (int k = 0; k < N; ++k) {
    const auto f = fmap.find(names[k]);
    if (f == fmap.end()) NCF_FAIL(at, ": feature '", names[k], "' is missing");
    if (f->second.kind_case() != tfexample::Feature::kInt64List)
      NCF_FAIL(at, ": feature '", names[k], "' is a ", kind_name(f->second),
               ", expected an Int64List");
    const Int64s& v = f->second.int64_list().value();
    if (static_cast<uint64_t>(v.size()) != len)
      NCF_FAIL(at, ": feature '", names[k], "' holds ", v.size(), " values, expected ", len, " (",
               len_field, ")");
    lists[k] = &v;
  }
}

inline void check_id(int64_t v, uint64_t bound, const char* feature, uint64_t row,
                     const char* bound_field, const std::string& at) {
  if (v < 0 || static_cast<uint64_t>(v) >= bound)
    NCF_FAIL(at, ": feature '", feature, "' value [", row, "] = ", v, " is out of range [0, ",
             bound, ") (", bound_field, ")");
}

inline void check_bit(int64_t v, const char* feature, uint64_t row, const std::string& at) {
  if (v != 0 && v != 1)
    NCF_FAIL(at, ": feature '", feature, "' value [", row, "] = ", v, ", expected 0 or 1");
}

// ----------------------------------------------------------- train shards ---

// What one walk over training shard files found.
struct TrainTally {
  uint64_t records = 0, valid = 0, positives = 0;
  void add(const TrainTally& o) {
    records += o.records, valid += o.valid, positives += o.positives;
  }
};

// Walks one training shard, checking every record; calls
// on_positive(user, item, offset) for each valid row of label 1.
template <typename OnPositive>
void scan_train_file(const std::string& path, const TfmgMeta& m, TrainTally* t,
                     OnPositive&& on_positive) {
  RecordReader in(path);
  std::string payload;
  tfexample::Example ex;
  const uint64_t P = m.train_prebatch_size;
  const uint64_t max_len = max_record_bytes(P, kTrainFeatureCount);
  for (uint64_t off = in.offset(); in.read(&payload, max_len); off = in.offset()) {
    const std::string at = where(path, off);
    const Int64s* f[kTrainFeatureCount];
    decode_features(payload, kTrainFeatures, P, "meta_data.json train_prebatch_size", at, &ex, f);
    const int64_t *user = f[0]->data(), *item = f[1]->data(), *label = f[2]->data(),
                  *valid = f[3]->data();
    uint64_t v = 0;
    while (v < P && valid[v] == 1) ++v;
    for (uint64_t r = 0; r < P; ++r) {
      check_id(user[r], m.num_users, "user_id", r, "meta_data.json num_users", at);
      check_id(item[r], m.num_items, "item_id", r, "meta_data.json num_items", at);
      check_bit(label[r], "labels", r, at);
      if (r >= v && valid[r] != 0) {
        check_bit(valid[r], "valid_point_mask", r, at);
        NCF_FAIL(at, ": feature 'valid_point_mask' value [", r, "] = 1 after a 0 at [", v,
                 "]: the valid rows must come first");
      }
      if (r < v && label[r] == 1) {
        on_positive(static_cast<int32_t>(user[r]), static_cast<int32_t>(item[r]), off);
        ++t->positives;
      }
    }
    ++t->records;
    t->valid += v;
  }
}

// A cycle's totals against the meta.
void check_cycle_totals(const std::string& cycle_dir, size_t num_files, const TrainTally& t,
                        const TfmgMeta& m) {
  if (t.records != m.num_train_steps)
    NCF_FAIL(cycle_dir, ": ", t.records, " records in its ", num_files, " shard files, but ",
             m.path, " says num_train_steps ", m.num_train_steps);
  if (t.valid != m.num_train_elements)
    NCF_FAIL(cycle_dir, ": ", t.valid, " valid rows (valid_point_mask 1), but ", m.path,
             " says num_train_elements ", m.num_train_elements);
}

// Cycle 0's positives, per user sorted ascending (CSR).
struct Positives {
  std::vector<uint64_t> off;  // U + 1
  std::vector<int32_t> items;
  TrainTally tally;
  uint64_t count(uint64_t u) const { return off[u + 1] - off[u]; }
  const int32_t* begin(uint64_t u) const { return items.data() + off[u]; }
  const int32_t* end(uint64_t u) const { return items.data() + off[u + 1]; }
  bool has(int32_t u, int32_t i) const {
    return std::binary_search(begin(uint64_t(u)), end(uint64_t(u)), i);
  }
};

// The records of cycle 0 that hold positive (user, item): named when it repeats.
std::string locate_positive(const std::vector<std::string>& files, const TfmgMeta& m, int32_t user,
                            int32_t item) {
  std::string found;
  int hits = 0;
  for (const auto& path : files) {
    TrainTally t;
    scan_train_file(path, m, &t, [&](int32_t u, int32_t i, uint64_t off) {
      if (u != user || i != item || hits >= 2) return;
      found += (hits++ ? " and " : "") + where(path, off);
    });
  }
  return found;
}

Positives read_cycle0(const std::string& cycle_dir, const std::vector<std::string>& files,
                      const TfmgMeta& m, int threads) {
  std::vector<std::vector<uint64_t>> pairs(files.size());  // user << 32 | item, per file
  std::vector<TrainTally> tallies(files.size());
  parallel_ranges(threads, files.size(), [&](uint64_t b, uint64_t e) {
    for (uint64_t f = b; f < e; ++f)
      scan_train_file(files[f], m, &tallies[f], [&](int32_t u, int32_t i, uint64_t) {
        pairs[f].push_back(uint64_t(uint32_t(u)) << 32 | uint32_t(i));
      });
  });
  Positives p;
  for (const auto& t : tallies) p.tally.add(t);
  check_cycle_totals(cycle_dir, files.size(), p.tally, m);
  const uint64_t U = m.num_users;
  p.off.assign(U + 1, 0);
  for (const auto& v : pairs)
    for (uint64_t x : v) ++p.off[(x >> 32) + 1];
  for (uint64_t u = 0; u < U; ++u) p.off[u + 1] += p.off[u];
  p.items.resize(p.off[U]);
  {
    std::vector<uint64_t> cursor(p.off.begin(), p.off.end() - 1);
    for (auto& v : pairs) {
      for (uint64_t x : v) p.items[cursor[x >> 32]++] = static_cast<int32_t>(x & 0xffffffffu);
      std::vector<uint64_t>().swap(v);
    }
  }
  // Sorted per user; a repeated pair is refused, naming both records.
  std::atomic<uint64_t> repeat_user{UINT64_MAX};
  parallel_ranges(threads, U, [&](uint64_t b, uint64_t e) {
    for (uint64_t u = b; u < e; ++u) {
      int32_t* first = p.items.data() + p.off[u];
      int32_t* last = p.items.data() + p.off[u + 1];
      std::sort(first, last);
      if (std::adjacent_find(first, last) != last) {
        uint64_t cur = repeat_user.load();
        while (u < cur && !repeat_user.compare_exchange_weak(cur, u)) {
        }
        return;
      }
    }
  });
  if (repeat_user.load() != UINT64_MAX) {
    const uint64_t u = repeat_user.load();
    const int32_t* first = p.begin(u);
    const int32_t item = *std::adjacent_find(first, p.end(u));
    NCF_FAIL(cycle_dir, ": positive (user ", u, ", item ", item,
             ") appears twice (label 1 in valid rows of ",
             locate_positive(files, m, static_cast<int32_t>(u), item),
             "); TF Model Garden writes each training positive once per cycle");
  }
  if (p.tally.positives == 0) NCF_FAIL(cycle_dir, ": no positive (label 1) in any valid row");
  if (m.num_train_elements % p.tally.positives != 0)
    NCF_FAIL(cycle_dir, ": ", p.tally.positives, " positives (label 1) among ", p.tally.valid,
             " valid rows: not (1 + num_neg) x positives for an integer num_neg");
  return p;
}

// The other cycles: every record checked, and every cycle holding each of
// cycle 0's positives exactly once. A bit per positive and cycle (P/8 bytes a
// cycle) marks the ones seen, so a positive that is not cycle 0's, or that
// repeats, is refused at its record; a missing one is named after the walk.
void check_other_cycles(const std::string& dir, const Layout& lay, const Positives& p,
                        const TfmgMeta& m, int threads) {
  const uint64_t cycles = lay.cycles.size(), per = lay.cycles[0].size();
  if (cycles < 2) return;
  const uint64_t words = (p.items.size() + 63) / 64;
  std::vector<std::vector<std::atomic<uint64_t>>> seen(cycles - 1);
  for (auto& s : seen) {
    s = std::vector<std::atomic<uint64_t>>(words);
    for (auto& w : s) w.store(0, std::memory_order_relaxed);
  }
  const uint64_t tasks = (cycles - 1) * per;  // (cycle, file) pairs of cycles 1 ..
  std::vector<TrainTally> tallies(tasks);
  parallel_ranges(threads, tasks, [&](uint64_t b, uint64_t e) {
    for (uint64_t t = b; t < e; ++t) {
      const uint64_t c = 1 + t / per;
      const std::string& path = lay.cycles[c][t % per];
      std::vector<std::atomic<uint64_t>>& bits = seen[c - 1];
      scan_train_file(path, m, &tallies[t], [&](int32_t u, int32_t i, uint64_t off) {
        const int32_t* at = std::lower_bound(p.begin(uint64_t(u)), p.end(uint64_t(u)), i);
        if (at == p.end(uint64_t(u)) || *at != i)
          NCF_FAIL(where(path, off), ": positive (user ", u, ", item ", i, ") is not one of ",
                   kCycleDir, "0's positives (every cycle holds the same positives)");
        const uint64_t k = uint64_t(at - p.items.data());
        const uint64_t bit = 1ull << (k & 63);
        if (bits[k >> 6].fetch_or(bit, std::memory_order_relaxed) & bit)
          NCF_FAIL(where(path, off), ": positive (user ", u, ", item ", i,
                   ") appears a second time in ", kCycleDir, c,
                   " (every cycle holds each positive once)");
      });
    }
  });
  for (uint64_t c = 1; c < cycles; ++c) {
    TrainTally t;
    for (uint64_t f = 0; f < per; ++f) t.add(tallies[(c - 1) * per + f]);
    const std::string cycle_dir = detail::concat(dir, "/", kCycleDir, c);
    check_cycle_totals(cycle_dir, per, t, m);
    if (t.positives == p.tally.positives) continue;
    uint64_t k = 0;
    while (seen[c - 1][k >> 6].load(std::memory_order_relaxed) >> (k & 63) & 1) ++k;
    const uint64_t u =
        uint64_t(std::upper_bound(p.off.begin(), p.off.end(), k) - p.off.begin()) - 1;
    NCF_FAIL(cycle_dir, ": ", t.positives, " positives but ", kCycleDir, "0 has ",
             p.tally.positives, "; positive (user ", u, ", item ", p.items[k],
             ") is missing (every cycle holds the same positives)");
  }
}

// ------------------------------------------------------------ eval shards ---

// Every user's eval list, in our order: true item, then TF-MG candidates 0 .. L-2.
struct EvalLists {
  uint64_t E = 0, L = 0;
  std::vector<int32_t> true_item;           // U
  std::vector<int32_t> negatives;           // U x E
  std::vector<uint8_t> mask;                // U x L, ours (1 = counts)
  std::vector<std::atomic<uint64_t>> seen;  // U: (file + 1) << 48 | offset, 0 = not yet
  uint64_t records = 0, padding_users = 0, negatives_equal_to_test = 0, masked = 0;
};

struct EvalTally {
  uint64_t records = 0, padding_users = 0, negatives_equal_to_test = 0, masked = 0;
};

std::string seen_at(const std::vector<std::string>& files, uint64_t loc) {
  return where(files[(loc >> 48) - 1], loc & (kMaxOffset - 1));
}

// Walks one eval shard: checks each user's L rows (one user id, ids in range,
// TF-MG's mask) and stores real users' lists; padding users are counted.
void scan_eval_file(const std::vector<std::string>& files, uint64_t fi, const TfmgMeta& m,
                    EvalLists* out, EvalTally* t) {
  const std::string& path = files[fi];
  RecordReader in(path);
  std::string payload;
  tfexample::Example ex;
  const uint64_t Q = m.eval_prebatch_size, L = m.list_len, E = L - 1, G = Q / L;
  std::vector<int32_t> pre(L);       // the list in TF-MG's order before its swap
  std::vector<uint8_t> pre_mask(L);  // its first-occurrence mask (1 = first)
  for (uint64_t off = in.offset(); in.read(&payload, max_record_bytes(Q, kEvalFeatureCount));
       off = in.offset()) {
    NCF_REQUIRE(off < kMaxOffset, path, " at byte offset ", off,
                ": the file passes 2^48 bytes, more than an eval shard may hold");
    const std::string at = where(path, off);
    const Int64s* f[kEvalFeatureCount];
    decode_features(payload, kEvalFeatures, Q, "meta_data.json eval_prebatch_size", at, &ex, f);
    for (uint64_t g = 0; g < G; ++g) {
      const uint64_t r0 = g * L;
      const int64_t* user = f[0]->data() + r0;
      const int64_t* item = f[1]->data() + r0;
      const int64_t* mask = f[2]->data() + r0;
      uint64_t mask_sum = 0;
      for (uint64_t j = 0; j < L; ++j) {
        check_id(user[j], m.num_users, "user_id", r0 + j, "meta_data.json num_users", at);
        check_id(item[j], m.num_items, "item_id", r0 + j, "meta_data.json num_items", at);
        check_bit(mask[j], "duplicate_mask", r0 + j, at);
        if (user[j] != user[0])
          NCF_FAIL(at, ": feature 'user_id' value [", r0 + j, "] = ", user[j], " but value [", r0,
                   "] = ", user[0], ": each block of ", L,
                   " rows (1 + E candidates) belongs to one user");
        mask_sum += uint64_t(mask[j]);
      }
      const std::string who =
          detail::concat("user ", user[0], " (rows ", r0, " .. ", r0 + L - 1, " of the record)");
      if (mask[L - 1] != 0)
        NCF_FAIL(at, ": ", who, ": feature 'duplicate_mask' value [", r0 + L - 1,
                 "] = 1 for the true item (the last candidate); TF-MG's is 0");
      // TF-MG's mask is taken on [true, n_1 .. n_E] (the true item first), then
      // positions 0 and L-1 of items and mask are swapped: undo the swap,
      // recompute, and hold the file's mask to it.
      pre[0] = static_cast<int32_t>(item[L - 1]);
      for (uint64_t j = 1; j + 1 < L; ++j) pre[j] = static_cast<int32_t>(item[j]);
      pre[L - 1] = static_cast<int32_t>(item[0]);
      duplicate_mask(pre.data(), L, pre_mask.data());
      for (uint64_t j = 0; j < L; ++j) {
        const uint64_t q = j == 0 ? L - 1 : (j == L - 1 ? 0 : j);
        const int64_t want = 1 - pre_mask[q];
        if (mask[j] != want)
          NCF_FAIL(at, ": ", who, ": feature 'duplicate_mask' value [", r0 + j, "] = ", mask[j],
                   " for item ", item[j], ", but TF-MG's rule gives ", want,
                   " (1 = the item already appeared in [true item, candidates 1 .. ", L - 2,
                   ", candidate 0])");
      }
      if (mask_sum == E) {
        // What TF-MG takes for a padding user (and leaves out of its metrics).
        for (uint64_t j = 0; j < L; ++j)
          if (user[j] != 0 || item[j] != 0)
            NCF_FAIL(at, ": ", who, ": its duplicate_mask marks all ", E,
                     " negatives as repeats, which TF-MG takes for a padding user, but padding "
                     "users are user 0 with item 0 everywhere (item_id value [",
                     r0 + j, "] = ", item[j], ")");
        ++t->padding_users;
        continue;
      }
      const uint64_t u = static_cast<uint64_t>(user[0]);
      uint64_t expected = 0;
      if (!out->seen[u].compare_exchange_strong(expected, ((fi + 1) << 48) | off))
        NCF_FAIL(at, ": ", who, ": a second eval list for this user (another is in ",
                 seen_at(files, expected), "); every user has one");
      out->true_item[u] = static_cast<int32_t>(item[L - 1]);
      uint8_t* our_mask = out->mask.data() + u * L;
      int32_t* negs = out->negatives.data() + u * E;
      our_mask[0] = 1;
      for (uint64_t j = 0; j < E; ++j) {
        negs[j] = static_cast<int32_t>(item[j]);
        our_mask[1 + j] = static_cast<uint8_t>(1 - mask[j]);
        t->negatives_equal_to_test += item[j] == item[L - 1];
      }
      t->masked += mask_sum;
    }
    ++t->records;
  }
}

void read_eval(const std::string& dir, const std::vector<std::string>& files, const TfmgMeta& m,
               int threads, EvalLists* out) {
  const uint64_t U = m.num_users;
  out->L = m.list_len;
  out->E = m.list_len - 1;
  out->true_item.assign(U, -1);
  out->negatives.assign(U * out->E, 0);
  out->mask.assign(U * out->L, 0);
  out->seen = std::vector<std::atomic<uint64_t>>(U);
  for (auto& s : out->seen) s.store(0, std::memory_order_relaxed);
  std::vector<EvalTally> tallies(files.size());
  parallel_ranges(threads, files.size(), [&](uint64_t b, uint64_t e) {
    for (uint64_t f = b; f < e; ++f) scan_eval_file(files, f, m, out, &tallies[f]);
  });
  for (const auto& t : tallies) {
    out->records += t.records;
    out->padding_users += t.padding_users;
    out->negatives_equal_to_test += t.negatives_equal_to_test;
    out->masked += t.masked;
  }
  const std::string eval_dir = dir + "/" + kEvalDir;
  if (out->records != m.num_eval_steps)
    NCF_FAIL(eval_dir, ": ", out->records, " records in its ", files.size(), " shard files, but ",
             m.path, " says num_eval_steps ", m.num_eval_steps);
  for (uint64_t u = 0; u < U; ++u)
    if (out->seen[u].load(std::memory_order_relaxed) == 0)
      NCF_FAIL(eval_dir, ": user ", u, " has no eval list (", m.path, " says num_users ", U,
               ", and TF-MG writes one list for every user)");
}

// Per user: the true item among its training positives? its negatives in
// them? Refuses a user without training positives; warns of negatives that
// are positives.
struct TrainOverlap {
  std::vector<uint8_t> test_in_train;
  uint64_t num_test_in_train = 0, num_neg_in_train = 0, num_positives = 0;
};

TrainOverlap overlap_with_train(const std::string& dir, const std::string& cycle0,
                                const Layout& lay, const TfmgMeta& m, const Positives& pos,
                                const EvalLists& ev, int threads) {
  const uint64_t U = m.num_users, I = m.num_items, E = m.list_len - 1;
  TrainOverlap o;
  std::vector<uint8_t>& test_in_train = o.test_in_train;
  test_in_train.assign(U, 0);
  std::vector<uint64_t> neg_in_train_of(U, 0);
  parallel_ranges(threads, U, [&](uint64_t b, uint64_t e) {
    std::vector<uint64_t> bits((I + 63) / 64, 0);
    for (uint64_t u = b; u < e; ++u) {
      if (pos.count(u) == 0)
        NCF_FAIL(cycle0, ": user ", u, " has no training positive (its eval list is in ",
                 seen_at(lay.eval, ev.seen[u].load(std::memory_order_relaxed)),
                 "); TF Model Garden's data has none, so this is refused rather than dropped");
      for (const int32_t* i = pos.begin(u); i != pos.end(u); ++i)
        bits[uint32_t(*i) >> 6] |= 1ull << (*i & 63);
      auto in = [&](int32_t i) { return (bits[uint32_t(i) >> 6] >> (i & 63)) & 1; };
      test_in_train[u] = in(ev.true_item[u]);
      const int32_t* negs = ev.negatives.data() + u * E;
      for (uint64_t j = 0; j < E; ++j) neg_in_train_of[u] += in(negs[j]);
      for (const int32_t* i = pos.begin(u); i != pos.end(u); ++i) bits[uint32_t(*i) >> 6] = 0;
    }
  });
  for (uint64_t u = 0; u < U; ++u) {
    o.num_test_in_train += test_in_train[u];
    o.num_neg_in_train += neg_in_train_of[u];
    o.num_positives += pos.count(u) + (test_in_train[u] ? 0 : 1);
  }
  if (o.num_neg_in_train > 0)
    std::fprintf(stderr,
                 "ncf_prep: warning: %s: %llu eval negatives are training positives of their "
                 "user (TF-MG draws them from the other items); kept as they are\n",
                 dir.c_str(), static_cast<unsigned long long>(o.num_neg_in_train));
  return o;
}

}  // namespace

TfmgCycles parse_tfmg_cycles(const std::string& name) {
  if (name == "all") return TfmgCycles::kAll;
  if (name == "first") return TfmgCycles::kFirst;
  NCF_FAIL("--tfmg_cycles must be 'all' or 'first', got '", name, "'");
}

bool is_tfmg_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(path + "/" + kMetaFile, ec) &&
         fs::is_directory(path + "/" + kCycleDir + "0", ec);
}

DatasetMeta prepare_tfmg(const std::string& dir_in, const std::string& out_dir,
                         const PrepOptions& opt, TfmgCycles cycles) {
  const PrepProgress progress{opt.progress, "prep", Clock::now()};
  const int threads = resolve_threads(opt.threads);
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const TfmgMeta m = read_meta(dir);
  const uint64_t U = m.num_users, I = m.num_items, L = m.list_len, E = L - 1;
  if (opt.eval_negatives != 0 && opt.eval_negatives != E)
    NCF_FAIL(m.path, ": the data has ", E, " eval negatives per user (num_eval_elements / ",
             "num_users - 1) but ", opt.eval_negatives, " were requested (pass --eval_negatives ",
             E, " or leave it unset)");
  const Layout lay = find_layout(dir, m);
  check_eval_bytes(dir, lay, m);
  auto say = [&](const std::string& what) {
    if (opt.progress) std::fprintf(stderr, "prep: %s (%.1f s)\n", what.c_str(), progress.seconds());
  };

  const std::string cycle0 = detail::concat(dir, "/", kCycleDir, 0);
  Positives pos = read_cycle0(cycle0, lay.cycles[0], m, threads);
  const uint64_t num_neg = m.num_train_elements / pos.tally.positives - 1;
  say(detail::concat("training_cycle_0: ", pos.tally.positives, " positives of ", U, " users, ",
                     num_neg, " negatives each"));

  EvalLists ev;
  read_eval(dir, lay.eval, m, threads, &ev);
  say(detail::concat("eval_data: ", U, " users x ", L, " candidates, ", ev.padding_users,
                     " padding users"));

  const TrainOverlap overlap = overlap_with_train(dir, cycle0, lay, m, pos, ev, threads);
  const std::vector<uint8_t>& test_in_train = overlap.test_in_train;

  if (cycles == TfmgCycles::kAll && m.num_train_epochs > 1) {
    check_other_cycles(dir, lay, pos, m, threads);
    say(detail::concat("training_cycle_1 .. ", m.num_train_epochs - 1,
                       ": same positives as cycle 0"));
  }

  DatasetPlan plan;
  // --extend: dense ids extend the parent's by identity (extend.h).
  if (!opt.extend.prev.empty()) plan.lineage = identity_lineage(opt.extend.prev);
  plan.source = "tfmg:" + fs::path(dir).filename().string();
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = pos.items.size();
  plan.num_positives = overlap.num_positives;
  plan.eval_negatives = static_cast<uint32_t>(E);
  plan.eval_masks_given = true;
  plan.eval_sampling = EvalSampling::kGiven;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = opt.seed;
  plan.dropped_users = 0;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.generator = {{"input", dir},
                    {"format", "tfmg"},
                    {"constructor_type", m.constructor_type},
                    {"num_train_epochs", m.num_train_epochs},
                    {"cycles_read", cycles == TfmgCycles::kAll ? "all" : "first"},
                    {"train_prebatch_size", m.train_prebatch_size},
                    {"eval_prebatch_size", m.eval_prebatch_size},
                    {"num_neg", num_neg},
                    {"shard_files_per_cycle", lay.cycles[0].size()},
                    {"eval_shard_files", lay.eval.size()},
                    {"padding_eval_users", ev.padding_users},
                    {"test_items_in_train", overlap.num_test_in_train},
                    {"negatives_equal_to_test", ev.negatives_equal_to_test},
                    {"negatives_in_train", overlap.num_neg_in_train},
                    {"masked_negatives", ev.masked}};

  SplitUsers split;
  split.num_users = U;
  split.sizes = [&](uint64_t u, uint64_t* np, uint64_t* nt) {
    *nt = pos.count(u);
    *np = *nt + (test_in_train[u] ? 0 : 1);
  };
  split.split = [&](UserBlock* b, uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = b->first_user + j;
      const int32_t t = ev.true_item[u];
      std::copy(pos.begin(u), pos.end(u), b->train_of(j));
      // Sorted merge of the training items and the true item.
      const int32_t* at = std::lower_bound(pos.begin(u), pos.end(u), t);
      int32_t* out = std::copy(pos.begin(u), at, b->positives_of(j));
      if (at == pos.end(u) || *at != t) *out++ = t;
      std::copy(at, pos.end(u), out);
      b->eval_of(j)[0] = t;
    }
  };
  EvalNegatives negatives;
  negatives.num_items = I;
  negatives.count = static_cast<uint32_t>(E);
  negatives.seed = opt.seed;
  negatives.given = ev.negatives.data();
  negatives.given_mask = ev.mask.data();
  return assemble_dataset(out_dir, plan, split, negatives, threads, progress);
}

}  // namespace ncf
