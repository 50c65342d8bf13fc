// Dataset directories: metadata, the streaming writer (eval records and positive
// lists as users arrive, train pairs through a bounded external shuffle), eval
// negatives, duplicate masks, positives.bin mapping and the full verification.
#include "data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/check.h"
#include "common/philox.h"
#include "data/ncf_record.pb.h"
#include "data/record_io.h"
#include "data/shard_format.h"

namespace fs = std::filesystem;

namespace ncf {

// ---------------------------------------------------------------- metadata ---

uint64_t DatasetMeta::num_train_records() const {
  return train_record_rows ? (num_train + train_record_rows - 1) / train_record_rows : 0;
}

std::vector<const ShardInfo*> DatasetMeta::shards_of(const std::string& kind) const {
  std::vector<const ShardInfo*> out;
  for (const auto& s : shards)
    if (s.kind == kind) out.push_back(&s);
  return out;
}

nlohmann::json DatasetMeta::to_json() const {
  nlohmann::json j;
  j["format_version"] = format_version;
  j["dataset_id"] = dataset_id;
  j["source"] = source;
  j["num_users"] = num_users;
  j["num_items"] = num_items;
  j["num_train"] = num_train;
  j["num_positives"] = num_positives;
  j["num_eval_users"] = num_eval_users;
  j["eval_negatives"] = eval_negatives;
  j["train_record_rows"] = train_record_rows;
  j["train_frame_bytes"] = train_frame_bytes;
  j["eval_frame_bytes"] = eval_frame_bytes;
  j["dropped_users"] = dropped_users;
  j["seed"] = seed;
  j["generator"] = generator;
  nlohmann::json sh = nlohmann::json::array();
  for (const auto& s : shards)
    sh.push_back({{"name", s.name},
                  {"kind", s.kind},
                  {"first_record", s.first_record},
                  {"num_records", s.num_records},
                  {"num_valid_rows", s.num_valid_rows},
                  {"bytes", s.bytes},
                  {"crc32c", s.crc32c}});
  j["shards"] = sh;
  j["positives"] = {
      {"name", kPositivesFile}, {"bytes", positives_bytes}, {"crc32c", positives_crc32c}};
  return j;
}

namespace {

template <typename T>
T get_field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.is_object() || !j.contains(key)) NCF_FAIL(path, ": metadata field '", key, "' is missing");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    NCF_FAIL(path, ": metadata field '", key, "' has the wrong type (", j.at(key).dump(), ")");
  }
}

}  // namespace

DatasetMeta DatasetMeta::from_json(const nlohmann::json& j, const std::string& path) {
  DatasetMeta m;
  m.format_version = get_field<uint32_t>(j, "format_version", path);
  if (m.format_version != kFormatVersion)
    NCF_FAIL(path, ": format_version ", m.format_version, " is not supported (this build reads ",
             kFormatVersion, ")");
  m.dataset_id = get_field<std::string>(j, "dataset_id", path);
  m.source = get_field<std::string>(j, "source", path);
  m.num_users = get_field<uint64_t>(j, "num_users", path);
  m.num_items = get_field<uint64_t>(j, "num_items", path);
  m.num_train = get_field<uint64_t>(j, "num_train", path);
  m.num_positives = get_field<uint64_t>(j, "num_positives", path);
  m.num_eval_users = get_field<uint64_t>(j, "num_eval_users", path);
  m.eval_negatives = get_field<uint32_t>(j, "eval_negatives", path);
  m.train_record_rows = get_field<uint32_t>(j, "train_record_rows", path);
  m.train_frame_bytes = get_field<uint64_t>(j, "train_frame_bytes", path);
  m.eval_frame_bytes = get_field<uint64_t>(j, "eval_frame_bytes", path);
  m.dropped_users = get_field<uint64_t>(j, "dropped_users", path);
  m.seed = get_field<uint64_t>(j, "seed", path);
  if (j.contains("generator")) m.generator = j["generator"];
  const auto& sh = j.contains("shards") ? j["shards"] : nlohmann::json();
  if (!sh.is_array()) NCF_FAIL(path, ": metadata field 'shards' is missing or not a list");
  for (const auto& s : sh) {
    ShardInfo si;
    si.name = get_field<std::string>(s, "name", path);
    si.kind = get_field<std::string>(s, "kind", path);
    si.first_record = get_field<uint64_t>(s, "first_record", path);
    si.num_records = get_field<uint64_t>(s, "num_records", path);
    si.num_valid_rows = get_field<uint64_t>(s, "num_valid_rows", path);
    si.bytes = get_field<uint64_t>(s, "bytes", path);
    si.crc32c = get_field<uint32_t>(s, "crc32c", path);
    if (si.kind != "train" && si.kind != "eval")
      NCF_FAIL(path, ": shard '", si.name, "' has unknown kind '", si.kind, "'");
    if (si.name.find('/') != std::string::npos)
      NCF_FAIL(path, ": shard name '", si.name, "' must be a plain file name");
    m.shards.push_back(si);
  }
  const auto& pos = j.contains("positives") ? j["positives"] : nlohmann::json();
  m.positives_bytes = get_field<uint64_t>(pos, "bytes", path);
  m.positives_crc32c = get_field<uint32_t>(pos, "crc32c", path);

  // Internal consistency, so readers can trust the numbers.
  if (m.num_users == 0 || m.num_items == 0)
    NCF_FAIL(path, ": num_users ", m.num_users, " and num_items ", m.num_items, " must be > 0");
  if (m.num_users > INT32_MAX || m.num_items > INT32_MAX)
    NCF_FAIL(path, ": ids must fit int32 (num_users ", m.num_users, ", num_items ", m.num_items,
             ")");
  if (m.train_record_rows == 0) NCF_FAIL(path, ": train_record_rows is 0");
  uint64_t recs = 0, rows = 0;
  for (const ShardInfo* s : m.shards_of("train")) {
    if (s->first_record != recs)
      NCF_FAIL(path, ": shard ", s->name, " first_record ", s->first_record, ", expected ", recs);
    recs += s->num_records;
    rows += s->num_valid_rows;
  }
  if (recs != m.num_train_records() || rows != m.num_train)
    NCF_FAIL(path, ": train shards hold ", recs, " records / ", rows, " rows but num_train ",
             m.num_train, " with ", m.train_record_rows, " rows per record needs ",
             m.num_train_records(), " records");
  recs = 0;
  for (const ShardInfo* s : m.shards_of("eval")) {
    if (s->first_record != recs)
      NCF_FAIL(path, ": shard ", s->name, " first_record ", s->first_record, ", expected ", recs);
    recs += s->num_records;
  }
  if (recs != m.num_eval_users)
    NCF_FAIL(path, ": eval shards hold ", recs, " records but num_eval_users is ",
             m.num_eval_users);
  return m;
}

DatasetMeta DatasetMeta::load(const std::string& dir) {
  std::string path = dir + "/" + kMetadataFile;
  std::ifstream f(path);
  if (!f) NCF_FAIL("cannot open dataset metadata ", path, ": ", std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    NCF_FAIL(path, ": not valid JSON at byte ", e.byte, ": ", e.what());
  }
  return from_json(j, path);
}

void DatasetMeta::save(const std::string& dir) const {
  std::string path = dir + "/" + kMetadataFile;
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) NCF_FAIL("cannot write ", tmp, ": ", std::strerror(errno));
    f << to_json().dump(2) << "\n";
    if (!f) NCF_FAIL("write failed: ", tmp);
  }
  fs::rename(tmp, path);
}

// ---------------------------------------------------------- eval negatives ---

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

// ------------------------------------------------------------------ writer ---

namespace {

std::string shard_name(const char* kind, uint32_t s, uint32_t S) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%05u-of-%05u.tfrecord", kind, s, S);
  return buf;
}

// A bucket of packed (user << 32 | item) pairs, spilled to a file when the
// plan does not fit the shuffle buffer.
struct Bucket {
  std::vector<uint64_t> pending;
  std::FILE* file = nullptr;
  std::string path;
  uint64_t count = 0;
};

}  // namespace

struct DatasetWriter::Impl {
  std::string dir;
  DatasetPlan plan;
  DatasetMeta meta;
  uint32_t L = 0;  // eval list length 1 + E

  // eval
  uint32_t eval_shards = 0;
  uint32_t eval_shard = 0;
  std::unique_ptr<RecordWriter> eval_writer;
  proto::EvalRecord eval_rec;
  std::vector<uint8_t> mask;
  std::string mask_bits;
  std::string payload;

  // positives.bin
  std::FILE* pos_file = nullptr;
  std::vector<int64_t> offsets;
  uint64_t pos_written = 0;

  // train shuffle
  uint32_t K = 1;  // buckets
  std::vector<Bucket> buckets;
  uint64_t train_added = 0;

  uint64_t next_user = 0;
  bool finished = false;

  uint64_t eval_first(uint32_t s) const { return s * plan.num_users / eval_shards; }

  void open_eval_shard(uint32_t s) {
    if (eval_writer) close_eval_shard();
    eval_shard = s;
    ShardInfo si;
    si.name = shard_name("eval", s, eval_shards);
    si.kind = "eval";
    si.first_record = eval_first(s);
    si.num_records = eval_first(s + 1) - eval_first(s);
    si.num_valid_rows = si.num_records * L;
    meta.shards.push_back(si);
    eval_writer = std::make_unique<RecordWriter>(dir + "/" + si.name);
    proto::ShardHeader h = shard_header(meta, proto::EVAL, s, eval_shards, si, L);
    eval_writer->write(h.SerializeAsString());
  }

  void close_eval_shard() {
    eval_writer->close();
    ShardInfo& si = meta.shards.back();
    si.bytes = eval_writer->bytes_written();
    si.crc32c = eval_writer->file_crc();
    eval_writer.reset();
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
};

proto::ShardHeader shard_header(const DatasetMeta& meta, proto::ShardKind kind, uint32_t s,
                                uint32_t S, const ShardInfo& si, uint32_t rows) {
  proto::ShardHeader h;
  h.set_format_version(kFormatVersion);
  h.set_kind(kind);
  h.set_shard_index(s);
  h.set_num_shards(S);
  h.set_num_records(si.num_records);
  h.set_record_rows(rows);
  h.set_first_record(si.first_record);
  h.set_num_users(meta.num_users);
  h.set_num_items(meta.num_items);
  h.set_num_valid_rows(si.num_valid_rows);
  h.set_dataset_id(meta.dataset_id);
  return h;
}

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
  NCF_CHECK(plan.record_rows > 0, "record_rows must be > 0, got ", plan.record_rows);
  NCF_CHECK(plan.num_shards > 0, "num_shards must be > 0, got ", plan.num_shards);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) NCF_FAIL("cannot create dataset directory ", dir, ": ", ec.message());
  // Old shards of another layout would confuse readers globbing the directory.
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("train-", 0) == 0 || n.rfind("eval-", 0) == 0 || n == kMetadataFile ||
        n == kPositivesFile)
      fs::remove(e.path());
  }

  DatasetMeta& m = w.meta;
  m.source = plan.source;
  m.num_users = plan.num_users;
  m.num_items = plan.num_items;
  m.num_train = plan.num_train;
  m.num_positives = plan.num_positives;
  m.num_eval_users = plan.num_users;
  m.eval_negatives = plan.eval_negatives;
  m.train_record_rows = plan.record_rows;
  m.dropped_users = plan.dropped_users;
  m.seed = plan.seed;
  m.generator = plan.generator;
  {
    // The id ties shards to this metadata; derived from the content plan so the
    // same inputs give byte-identical output.
    nlohmann::json id = {{"source", plan.source},   {"users", plan.num_users},
                         {"items", plan.num_items}, {"train", plan.num_train},
                         {"seed", plan.seed},       {"E", plan.eval_negatives},
                         {"R", plan.record_rows},   {"gen", plan.generator}};
    std::string s = id.dump();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%08x%08x", crc32c(s.data(), s.size()),
                  crc32c_extend(0x5eed, s.data(), s.size()));
    m.dataset_id = buf;
  }
  w.L = plan.eval_negatives + 1;
  w.mask.resize(w.L);
  w.mask_bits.resize((w.L + 7) / 8);

  // Frame sizes are fixed per dataset: readers seek to record k directly.
  {
    proto::TrainRecord r;
    r.set_num_valid(plan.record_rows);
    r.set_users(std::string(size_t(plan.record_rows) * 4, '\0'));
    r.set_items(std::string(size_t(plan.record_rows) * 4, '\0'));
    m.train_frame_bytes = frame_bytes(r.ByteSizeLong());
    proto::EvalRecord e;
    e.set_user(0);
    e.set_items(std::string(size_t(w.L) * 4, '\0'));
    e.set_dup_mask(std::string((w.L + 7) / 8, '\0'));
    m.eval_frame_bytes = frame_bytes(e.ByteSizeLong());
  }

  w.eval_shards = static_cast<uint32_t>(std::min<uint64_t>(plan.num_shards, plan.num_users));
  w.open_eval_shard(0);

  std::string pos_path = dir + "/" + kPositivesFile;
  w.pos_file = std::fopen(pos_path.c_str(), "w+b");
  if (!w.pos_file) NCF_FAIL("cannot create ", pos_path, ": ", std::strerror(errno));
  w.offsets.assign(plan.num_users + 1, 0);
  const uint64_t items_at = PositivesLayout::items_offset(plan.num_users);
  if (fseeko(w.pos_file, static_cast<off_t>(items_at), SEEK_SET) != 0)
    NCF_FAIL("seek failed on ", pos_path);

  const uint64_t pair_bytes = plan.num_train * 8;
  w.K = static_cast<uint32_t>(std::max<uint64_t>(
      1, (pair_bytes + plan.shuffle_buffer_bytes - 1) / plan.shuffle_buffer_bytes));
  w.buckets.resize(w.K);
  if (w.K == 1) w.buckets[0].pending.reserve(plan.num_train);
}

DatasetWriter::~DatasetWriter() {
  if (!impl_) return;
  for (auto& b : impl_->buckets)
    if (b.file) {
      std::fclose(b.file);
      std::remove(b.path.c_str());
    }
  if (impl_->pos_file) std::fclose(impl_->pos_file);
}

void DatasetWriter::add_user(uint64_t user, const int32_t* positives, size_t num_positives,
                             const int32_t* train, size_t num_train, const int32_t* eval,
                             size_t num_eval) {
  Impl& w = *impl_;
  NCF_CHECK(!w.finished, "add_user after finish");
  NCF_CHECK(user == w.next_user, "users must arrive in order: got ", user, ", expected ",
            w.next_user);
  NCF_CHECK(user < w.plan.num_users, "user ", user, " beyond the planned ", w.plan.num_users);
  NCF_CHECK(num_eval == w.L, "user ", user, ": eval list has ", num_eval, " items, expected ", w.L);
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
  ++w.next_user;

  // eval record
  if (w.eval_shard + 1 < w.eval_shards && user >= w.eval_first(w.eval_shard + 1))
    w.open_eval_shard(w.eval_shard + 1);
  duplicate_mask(eval, num_eval, w.mask.data());
  pack_mask(w.mask.data(), num_eval, w.mask_bits.data());
  w.eval_rec.set_user(static_cast<uint32_t>(user));
  w.eval_rec.set_items(reinterpret_cast<const char*>(eval), num_eval * 4);
  w.eval_rec.set_dup_mask(w.mask_bits);
  w.eval_rec.SerializeToString(&w.payload);
  w.eval_writer->write(w.payload);

  // positives
  if (num_positives && std::fwrite(positives, 4, num_positives, w.pos_file) != num_positives)
    NCF_FAIL("write failed on ", w.dir, "/", kPositivesFile, " (disk full?)");
  w.pos_written += num_positives;
  w.offsets[user + 1] = static_cast<int64_t>(w.pos_written);
  NCF_CHECK(w.pos_written <= w.plan.num_positives, "more positives than planned (",
            w.plan.num_positives, ")");

  // train pairs into shuffle buckets
  for (size_t k = 0; k < num_train; ++k) {
    NCF_CHECK(train[k] >= 0 && train[k] < I, "user ", user, ": train item ", train[k],
              " out of range [0, ", I, ")");
    uint64_t packed = (user << 32) | static_cast<uint32_t>(train[k]);
    uint32_t b = 0;
    if (w.K > 1) {
      CounterRng rng{w.plan.seed, kStreamShuffle, w.train_added};
      b = static_cast<uint32_t>(rng.below(0, w.K));
    }
    Bucket& bk = w.buckets[b];
    bk.pending.push_back(packed);
    ++bk.count;
    if (w.K > 1 && bk.pending.size() >= (1u << 16)) w.flush_bucket(bk);
    ++w.train_added;
  }
  NCF_CHECK(w.train_added <= w.plan.num_train, "more train pairs than planned (", w.plan.num_train,
            ")");
}

DatasetMeta DatasetWriter::finish() {
  Impl& w = *impl_;
  NCF_CHECK(!w.finished, "finish called twice");
  w.finished = true;
  NCF_CHECK(w.next_user == w.plan.num_users, "only ", w.next_user, " of ", w.plan.num_users,
            " planned users were added");
  NCF_CHECK(w.train_added == w.plan.num_train, "added ", w.train_added, " train pairs, planned ",
            w.plan.num_train);
  NCF_CHECK(w.pos_written == w.plan.num_positives, "added ", w.pos_written, " positives, planned ",
            w.plan.num_positives);
  w.close_eval_shard();

  // positives.bin: header and offsets, then the whole-file CRC.
  {
    std::string path = w.dir + "/" + kPositivesFile;
    PositivesLayout::Header h{};
    std::memcpy(h.magic, PositivesLayout::kMagic, 8);
    h.num_users = w.plan.num_users;
    h.nnz = w.pos_written;
    if (fseeko(w.pos_file, 0, SEEK_SET) != 0 || std::fwrite(&h, sizeof h, 1, w.pos_file) != 1 ||
        std::fwrite(w.offsets.data(), 8, w.offsets.size(), w.pos_file) != w.offsets.size())
      NCF_FAIL("write failed on ", path, " (disk full?)");
    if (std::fclose(w.pos_file) != 0) NCF_FAIL("close failed on ", path);
    w.pos_file = nullptr;
    std::vector<int64_t>().swap(w.offsets);
    file_crc32c(path, &w.meta.positives_bytes, &w.meta.positives_crc32c);
  }

  // Train shards: each bucket shuffled in memory, then cut into records.
  const uint32_t R = w.plan.record_rows;
  const uint64_t N = w.meta.num_train_records();
  const uint32_t S = static_cast<uint32_t>(std::min<uint64_t>(w.plan.num_shards, N));
  auto first_of = [&](uint32_t s) { return s * N / S; };
  uint32_t shard = 0;
  uint64_t record = 0;
  std::unique_ptr<RecordWriter> out;
  std::vector<int32_t> users(R), items(R);
  uint32_t fill = 0;
  proto::TrainRecord rec;
  std::string payload;
  auto open_shard = [&](uint32_t s) {
    ShardInfo si;
    si.name = shard_name("train", s, S);
    si.kind = "train";
    si.first_record = first_of(s);
    si.num_records = first_of(s + 1) - first_of(s);
    uint64_t last = first_of(s + 1);
    si.num_valid_rows = std::min<uint64_t>(last * R, w.plan.num_train) - si.first_record * R;
    w.meta.shards.push_back(si);
    out = std::make_unique<RecordWriter>(w.dir + "/" + si.name);
    out->write(shard_header(w.meta, proto::TRAIN, s, S, si, R).SerializeAsString());
  };
  auto close_shard = [&]() {
    out->close();
    ShardInfo& si = w.meta.shards.back();
    si.bytes = out->bytes_written();
    si.crc32c = out->file_crc();
    out.reset();
  };
  auto emit = [&]() {
    if (record == first_of(shard + 1)) {
      close_shard();
      open_shard(++shard);
    }
    std::fill(users.begin() + fill, users.end(), 0);
    std::fill(items.begin() + fill, items.end(), 0);
    rec.set_num_valid(fill);
    rec.set_users(reinterpret_cast<const char*>(users.data()), size_t(R) * 4);
    rec.set_items(reinterpret_cast<const char*>(items.data()), size_t(R) * 4);
    rec.SerializeToString(&payload);
    NCF_CHECK(frame_bytes(payload.size()) == w.meta.train_frame_bytes, "train frame size changed");
    out->write(payload);
    ++record;
    fill = 0;
  };
  open_shard(0);
  for (uint32_t b = 0; b < w.K; ++b) {
    Bucket& bk = w.buckets[b];
    std::vector<uint64_t> pairs;
    if (bk.file) {
      w.flush_bucket(bk);
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
    CounterRng rng{w.plan.seed, kStreamShuffle, (1ull << 63) | b};
    for (uint64_t i = pairs.size(); i > 1; --i) {
      uint64_t j = rng.below(i, i);
      std::swap(pairs[i - 1], pairs[j]);
    }
    for (uint64_t p : pairs) {
      users[fill] = static_cast<int32_t>(p >> 32);
      items[fill] = static_cast<int32_t>(p & 0xffffffffu);
      if (++fill == R) emit();
    }
  }
  if (fill > 0) emit();
  close_shard();
  NCF_CHECK(record == N, "wrote ", record, " train records, expected ", N);

  // Shards listed train first, then eval, each in index order.
  std::stable_sort(
      w.meta.shards.begin(), w.meta.shards.end(),
      [](const ShardInfo& a, const ShardInfo& b) { return a.kind == "train" && b.kind == "eval"; });
  w.meta.save(w.dir);
  return w.meta;
}

}  // namespace ncf
