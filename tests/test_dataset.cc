// Dataset writer, --verify and the per-rank readers: round trips on a small
// hand-built dataset, every corruption the format must catch, and the step
// coverage of W = 1..4 readers.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "common/check.h"
#include "data/crc32c.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/ncf_record.pb.h"
#include "data/reader.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::TempDir;

// A small dataset: user u has 3 + u % 8 distinct positives; the last one drawn
// is the test item. Returned so tests can compare what they read back.
struct Truth {
  uint64_t U = 50, I = 40;
  uint32_t E = 5;
  std::vector<std::vector<int32_t>> positives;  // sorted
  std::vector<int32_t> test_item;
  std::multiset<std::pair<int32_t, int32_t>> train;
};

Truth write_small(const std::string& dir, uint32_t record_rows = 7, uint32_t shards = 3,
                  uint64_t shuffle_bytes = 256ull << 20, uint64_t seed = 5) {
  Truth t;
  std::mt19937 gen(1234);
  DatasetPlan plan;
  plan.source = "test";
  plan.num_users = t.U;
  plan.num_items = t.I;
  plan.eval_negatives = t.E;
  plan.record_rows = record_rows;
  plan.num_shards = shards;
  plan.seed = seed;
  plan.shuffle_buffer_bytes = shuffle_bytes;
  std::vector<std::vector<int32_t>> drawn(t.U);
  for (uint64_t u = 0; u < t.U; ++u) {
    std::vector<int32_t> all(t.I);
    for (uint64_t i = 0; i < t.I; ++i) all[i] = int32_t(i);
    std::shuffle(all.begin(), all.end(), gen);
    drawn[u].assign(all.begin(), all.begin() + 3 + u % 8);
    plan.num_positives += drawn[u].size();
    plan.num_train += drawn[u].size() - 1;
  }
  DatasetWriter w(dir, plan);
  std::vector<uint64_t> scratch;
  for (uint64_t u = 0; u < t.U; ++u) {
    std::vector<int32_t> pos = drawn[u];
    std::sort(pos.begin(), pos.end());
    std::vector<int32_t> train(drawn[u].begin(), drawn[u].end() - 1);
    std::vector<int32_t> eval(1 + t.E);
    eval[0] = drawn[u].back();
    draw_eval_negatives(u, pos.data(), pos.size(), t.I, t.E, seed, scratch, eval.data() + 1);
    w.add_user(u, pos.data(), pos.size(), train.data(), train.size(), eval.data(), eval.size());
    t.positives.push_back(pos);
    t.test_item.push_back(eval[0]);
    for (int32_t i : train) t.train.insert({int32_t(u), i});
  }
  w.finish();
  return t;
}

std::string first_shard(const std::string& dir, const std::string& kind) {
  DatasetMeta m = DatasetMeta::load(dir);
  return dir + "/" + m.shards_of(kind)[0]->name;
}

// Rewrites record `index` (0 = header) of a shard file through `edit`, with
// valid framing, so only the content is wrong.
void rewrite_record(const std::string& path, int index,
                    const std::function<std::string(const std::string&)>& edit) {
  std::vector<std::string> recs;
  {
    RecordReader r(path);
    std::string p;
    while (r.read(&p)) recs.push_back(p);
  }
  recs.at(index) = edit(recs.at(index));
  RecordWriter w(path);
  for (const auto& p : recs) w.write(p);
  w.close();
}

std::string verify_error(const std::string& dir) {
  try {
    verify_dataset(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EvalNegatives, DistinctNeverPositiveDeterministic) {
  std::vector<int32_t> pos = {0, 3, 4, 9, 17};
  std::vector<uint64_t> scratch;
  std::vector<int32_t> a(12), b(12), c(12);
  draw_eval_negatives(7, pos.data(), pos.size(), 20, 12, 99, scratch, a.data());
  draw_eval_negatives(7, pos.data(), pos.size(), 20, 12, 99, scratch, b.data());
  draw_eval_negatives(7, pos.data(), pos.size(), 20, 12, 100, scratch, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::set<int32_t> seen(a.begin(), a.end());
  EXPECT_EQ(seen.size(), a.size());
  for (int32_t x : a) {
    EXPECT_FALSE(std::binary_search(pos.begin(), pos.end(), x)) << x;
    EXPECT_TRUE(x >= 0 && x < 20);
  }
  for (uint64_t w : scratch) EXPECT_EQ(w, 0u);  // scratch left clean
  // Exactly as many free items as asked: all of them, each once.
  std::vector<int32_t> all(15);
  draw_eval_negatives(7, pos.data(), pos.size(), 20, 15, 99, scratch, all.data());
  EXPECT_EQ(std::set<int32_t>(all.begin(), all.end()).size(), 15u);
  EXPECT_THROW(draw_eval_negatives(7, pos.data(), pos.size(), 20, 16, 99, scratch, all.data()),
               Error);
}

TEST(DuplicateMask, MarksLaterRepeatsOnly) {
  std::vector<int32_t> items = {5, 3, 5, 8, 3, 3, 9};
  std::vector<uint8_t> m(items.size());
  duplicate_mask(items.data(), items.size(), m.data());
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 1, 0, 1, 0, 0, 1}));
}

TEST(Dataset, RoundTripThroughReaders) {
  TempDir d;
  Truth t = write_small(d.path());
  VerifySummary s = verify_dataset(d.path());
  EXPECT_EQ(s.train_rows, t.train.size());
  EXPECT_EQ(s.eval_records, t.U);
  DatasetMeta m = DatasetMeta::load(d.path());
  EXPECT_EQ(m.num_train, t.train.size());
  EXPECT_EQ(m.shards_of("train").size(), 3u);

  // Eval records: the positive first, negatives outside the user's positives.
  EvalReader er(d.path(), m, 0, 1, 8);
  er.start();
  EvalBatch eb;
  uint64_t users = 0;
  while (er.next(&eb)) {
    for (int64_t k = 0; k < eb.num_users; ++k) {
      uint64_t u = uint64_t(eb.users[size_t(k)]);
      const int32_t* it = &eb.items[k * (t.E + 1)];
      EXPECT_EQ(it[0], t.test_item[u]);
      for (uint32_t j = 1; j <= t.E; ++j)
        EXPECT_FALSE(std::binary_search(t.positives[u].begin(), t.positives[u].end(), it[j]));
      ++users;
    }
  }
  EXPECT_EQ(users, t.U);

  PositiveLists pl(d.path(), m);
  for (uint64_t u = 0; u < t.U; ++u)
    EXPECT_EQ(std::vector<int32_t>(pl.begin(u), pl.end(u)), t.positives[u]);

  // The train stream of one epoch holds every pair exactly once.
  TrainReader tr(d.path(), m, 0, 1, 10, 3);
  tr.start_epoch(0);
  std::multiset<std::pair<int32_t, int32_t>> got;
  TrainBatch b;
  while (tr.next(&b))
    for (size_t k = 0; k < b.users.size(); ++k) got.insert({b.users[k], b.items[k]});
  EXPECT_EQ(got, t.train);
}

TEST(Dataset, ExternalShuffleKeepsEveryPairAndIsDeterministic) {
  TempDir a, b, c;
  Truth t = write_small(a.path(), 7, 2, 64);  // 64-byte buffer: many spill buckets
  write_small(b.path(), 7, 2, 64);
  write_small(c.path(), 7, 2, 256ull << 20);
  verify_dataset(a.path());
  for (const char* f : {"train-00000-of-00002.tfrecord", "eval-00001-of-00002.tfrecord",
                        "positives.bin", "metadata.json"})
    EXPECT_EQ(test::read_file(a.file(f)), test::read_file(b.file(f))) << f;
  // The in-memory path shuffles differently but holds the same pairs.
  DatasetMeta m = DatasetMeta::load(a.path());
  TrainReader tr(a.path(), m, 0, 1, 1000, 1, false);
  tr.start_epoch(0);
  TrainBatch batch;
  ASSERT_TRUE(tr.next(&batch));
  std::multiset<std::pair<int32_t, int32_t>> got;
  for (size_t k = 0; k < batch.users.size(); ++k) got.insert({batch.users[k], batch.items[k]});
  EXPECT_EQ(got, t.train);
  // No temporary bucket left behind.
  for (const auto& e : std::filesystem::directory_iterator(a.path()))
    EXPECT_EQ(e.path().filename().string().find(".shuffle"), std::string::npos);
}

// Every global step holds the same positives for any W, and the W slices of a
// step cover it exactly once.
TEST(TrainReader, StepsCoveredExactlyOnceForAnyWorld) {
  TempDir d;
  write_small(d.path(), 7, 3);
  DatasetMeta m = DatasetMeta::load(d.path());
  const int64_t P = 23;
  for (int64_t epoch : {0, 1}) {
    std::vector<std::vector<std::pair<int32_t, int32_t>>> reference;
    for (int W = 1; W <= 4; ++W) {
      std::vector<std::vector<std::pair<int32_t, int32_t>>> steps;
      for (int r = 0; r < W; ++r) {
        TrainReader tr(d.path(), m, r, W, P, 77, true, 2);
        tr.start_epoch(epoch);
        TrainBatch b;
        int64_t t = 0;
        while (tr.next(&b)) {
          ASSERT_EQ(b.step, t);
          if (r == 0) steps.emplace_back();
          auto& s = steps.at(t);
          EXPECT_EQ(b.slice_begin, b.step_begin + int64_t(s.size()));
          for (size_t k = 0; k < b.users.size(); ++k) s.push_back({b.users[k], b.items[k]});
          ++t;
        }
        EXPECT_EQ(t, tr.steps_per_epoch());
      }
      if (W == 1) {
        reference = steps;
        int64_t total = 0;
        for (auto& s : steps) total += s.size();
        EXPECT_EQ(uint64_t(total), m.num_train);
      } else {
        EXPECT_EQ(steps, reference) << "W=" << W << " epoch " << epoch;
      }
    }
  }
  // Epochs visit records in different orders.
  TrainReader tr(d.path(), m, 0, 1, P, 77);
  EXPECT_NE(tr.record_order(0), tr.record_order(1));
}

// ------------------------------------------------------------ bad input ---

TEST(DatasetErrors, TruncatedShard) {
  TempDir d;
  write_small(d.path());
  std::string path = first_shard(d.path(), "train");
  std::string bytes = test::read_file(path);
  test::write_file(path, bytes.substr(0, bytes.size() - 10));
  std::string e = verify_error(d.path());
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("byte offset"), std::string::npos) << e;
  // The reader refuses it too, before training starts.
  DatasetMeta m = DatasetMeta::load(d.path());
  EXPECT_THROW(TrainReader(d.path(), m, 0, 1, 10, 1), Error);
}

TEST(DatasetErrors, FlippedByteIsACrcFailureAtItsRecord) {
  TempDir d;
  write_small(d.path());
  DatasetMeta m = DatasetMeta::load(d.path());
  std::string path = first_shard(d.path(), "eval");
  std::string bytes = test::read_file(path);
  // Second data record: header frame, one eval frame, then 20 bytes in.
  RecordReader r(path);
  std::string p;
  r.read(&p);
  uint64_t header_end = r.offset();
  uint64_t rec2 = header_end + m.eval_frame_bytes;
  bytes[rec2 + 20] ^= 0x40;
  test::write_file(path, bytes);
  std::string e = verify_error(d.path());
  EXPECT_NE(e.find("byte offset " + std::to_string(rec2)), std::string::npos) << e;
  EXPECT_NE(e.find("CRC"), std::string::npos) << e;
  EvalReader er(d.path(), m, 0, 1, 100);
  er.start();
  EvalBatch b;
  try {
    while (er.next(&b)) {
    }
    FAIL() << "reader accepted a corrupt record";
  } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("byte offset " + std::to_string(rec2)), std::string::npos)
        << ex.what();
  }
}

// Every batch of an EvalReader, flattened, or the message of the error it ends with.
struct EvalPass {
  std::vector<int64_t> firsts;
  std::vector<int32_t> users, items;
  std::vector<uint8_t> mask;
  std::string error;
};
EvalPass read_eval(const std::string& dir, const DatasetMeta& m, int W, int r, int64_t batch,
                   int threads) {
  EvalPass out;
  EvalReader er(dir, m, r, W, batch, 2, threads);
  er.start();
  EvalBatch b;
  try {
    while (er.next(&b)) {
      out.firsts.push_back(b.first_record);
      out.users.insert(out.users.end(), b.users.begin(), b.users.end());
      out.items.insert(out.items.end(), b.items.begin(), b.items.end());
      out.mask.insert(out.mask.end(), b.mask.begin(), b.mask.end());
    }
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

// Records decoded by several threads, each over its own files: the batches of one
// thread, whatever the thread count, batch size and rank.
TEST(EvalReaderThreads, GiveTheBatchesOfOneThread) {
  TempDir d;
  Truth t = write_small(d.path());
  DatasetMeta m = DatasetMeta::load(d.path());
  for (int W : {1, 2})
    for (int64_t batch : {int64_t{1}, int64_t{5}, int64_t{8}, int64_t{1000}}) {
      const EvalPass one = read_eval(d.path(), m, W, W - 1, batch, 1);
      ASSERT_EQ(one.error, "");
      EXPECT_EQ(one.users.size(), W == 1 ? t.U : t.U - t.U / 2);
      for (int threads : {2, 3, 7}) {
        const std::string what = "W=" + std::to_string(W) + " batch " + std::to_string(batch) +
                                 " threads " + std::to_string(threads);
        const EvalPass many = read_eval(d.path(), m, W, W - 1, batch, threads);
        EXPECT_EQ(many.error, "") << what;
        EXPECT_EQ(many.firsts, one.firsts) << what;
        EXPECT_EQ(many.users, one.users) << what;
        EXPECT_EQ(many.items, one.items) << what;
        EXPECT_EQ(many.mask, one.mask) << what;
      }
    }
}

// Two damaged records in one batch: every thread count names the first one, as
// one thread does, even when a later part of the batch fails first.
TEST(EvalReaderThreads, NameTheFirstDamagedRecord) {
  TempDir d;
  write_small(d.path());
  DatasetMeta m = DatasetMeta::load(d.path());
  // Record 1 (frame 2 of the first eval shard: frame 0 is its header) and the last
  // record (the last frame of the last shard): in different parts at 2, 3 and 7 threads.
  const auto* last = m.shards_of("eval").back();
  ASSERT_GT(m.shards_of("eval").size(), 1u);
  auto damage = [](const std::string& s) {
    proto::EvalRecord r;
    r.ParseFromString(s);
    r.set_user(r.user() + 100);
    return r.SerializeAsString();
  };
  rewrite_record(d.path() + "/" + last->name, int(last->num_records), damage);
  rewrite_record(first_shard(d.path(), "eval"), 2, damage);
  const EvalPass one = read_eval(d.path(), m, 1, 0, 1000, 1);
  ASSERT_NE(one.error.find("expected 1"), std::string::npos) << one.error;
  for (int threads : {2, 3, 7}) {
    const EvalPass many = read_eval(d.path(), m, 1, 0, 1000, threads);
    EXPECT_EQ(many.error, one.error) << threads << " threads";
  }
}

TEST(DatasetErrors, WrongFormatVersion) {
  TempDir d;
  write_small(d.path());
  std::string path = first_shard(d.path(), "train");
  rewrite_record(path, 0, [](const std::string& s) {
    proto::ShardHeader h;
    h.ParseFromString(s);
    h.set_format_version(7);
    return h.SerializeAsString();
  });
  std::string e = verify_error(d.path());
  EXPECT_NE(e.find("format version 7"), std::string::npos) << e;
  EXPECT_NE(e.find(path + " at byte offset 0"), std::string::npos) << e;
}

// A damaged dataset id (bytes that are no UTF-8) is refused by the id check,
// the bytes shown escaped, with no log line of protobuf's before it.
TEST(DatasetErrors, ADamagedDatasetIdIsRefusedByNameAndShownEscaped) {
  TempDir d;
  write_small(d.path());
  std::string path = first_shard(d.path(), "train");
  rewrite_record(path, 0, [](const std::string& s) {
    proto::ShardHeader h;
    h.ParseFromString(s);
    // Same length, so the file's size still matches the metadata.
    std::string id = h.dataset_id();
    id.replace(0, 3, "\xff\xfe\n");
    h.set_dataset_id(id);
    return h.SerializeAsString();
  });
  testing::internal::CaptureStderr();
  std::string e = verify_error(d.path());
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_NE(e.find(path + " at byte offset 0: dataset id '\\xff\\xfe\\x0a"), std::string::npos)
      << e;
  EXPECT_NE(e.find("' does not match the metadata's"), std::string::npos) << e;
  EXPECT_EQ(logged.find("libprotobuf"), std::string::npos) << logged;
}

TEST(DatasetErrors, IdOutOfRange) {
  TempDir d;
  Truth t = write_small(d.path());
  std::string path = first_shard(d.path(), "train");
  rewrite_record(path, 2, [&](const std::string& s) {
    proto::TrainRecord r;
    r.ParseFromString(s);
    std::string items = r.items();
    int32_t bad = int32_t(t.I) + 3;
    std::memcpy(&items[4 * 1], &bad, 4);
    r.set_items(items);
    return r.SerializeAsString();
  });
  std::string e = verify_error(d.path());
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("item id " + std::to_string(t.I + 3) + " out of range"), std::string::npos) << e;
  DatasetMeta m = DatasetMeta::load(d.path());
  TrainReader tr(d.path(), m, 0, 1, 1000, 1, false);
  tr.start_epoch(0);
  TrainBatch b;
  EXPECT_THROW(tr.next(&b), Error);
}

// CRC-32C of text, bit by bit from the polynomial: an independent check of the
// checksums ncf_prep writes.
uint32_t slow_crc32c(const std::string& text) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : text) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

// Writes metadata JSON with a valid crc32c for its (edited) content, so that
// the consistency checks behind the checksum are what a test meets.
void write_sealed(const std::string& path, nlohmann::json j) {
  j.erase("crc32c");
  j["crc32c"] = slow_crc32c(j.dump());
  test::write_file(path, j.dump());
}

TEST(DatasetErrors, MetadataDisagreesWithShards) {
  TempDir d;
  write_small(d.path());
  std::string mp = d.file("metadata.json");
  nlohmann::json j = nlohmann::json::parse(test::read_file(mp));
  const auto write_file = [](const std::string& path, const std::string& text) {
    write_sealed(path, nlohmann::json::parse(text));
  };
  j["num_items"] = 39;
  write_file(mp, j.dump());
  std::string e = verify_error(d.path());
  EXPECT_NE(e.find("num_items is 40 but the metadata says 39"), std::string::npos) << e;

  j["num_items"] = 40;
  j["num_train"] = j["num_train"].get<uint64_t>() + 1;
  write_file(mp, j.dump());
  e = verify_error(d.path());
  EXPECT_NE(e.find("metadata.json"), std::string::npos) << e;
  EXPECT_NE(e.find("num_train"), std::string::npos) << e;

  j["num_train"] = j["num_train"].get<uint64_t>() - 1;
  j["shards"][0]["bytes"] = j["shards"][0]["bytes"].get<uint64_t>() + 16;
  write_file(mp, j.dump());
  e = verify_error(d.path());
  EXPECT_NE(e.find("bytes but the metadata says"), std::string::npos) << e;

  j = nlohmann::json{{"format_version", kFormatVersion}};
  write_file(mp, j.dump());
  e = verify_error(d.path());
  EXPECT_NE(e.find("'dataset_id' is missing"), std::string::npos) << e;
  test::write_file(mp, "{ not json");
  e = verify_error(d.path());
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
}

// What the loader throws, or "" when it accepts the directory.
std::string load_error(const std::string& dir) {
  try {
    DatasetMeta::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// What opening positives.bin the way the trainer does throws, or "".
std::string positives_error(const std::string& dir) {
  try {
    const DatasetMeta meta = DatasetMeta::load(dir);
    PositiveLists lists(dir, meta);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The checksums ncf_prep writes, recomputed bit by bit: metadata.json's own
// crc32c covers its compact dump (sorted keys) without that field, and the
// positives entry holds the file's size and CRC.
TEST(DatasetIntegrity, MetadataRecordsItsOwnAndThePositivesChecksums) {
  TempDir d;
  write_small(d.path());
  nlohmann::json j = nlohmann::json::parse(test::read_file(d.file("metadata.json")));
  EXPECT_EQ(j.at("format_version").get<uint32_t>(), 2u);
  const uint32_t stored = j.at("crc32c").get<uint32_t>();
  j.erase("crc32c");
  EXPECT_EQ(stored, slow_crc32c(j.dump()));
  const std::string positives = test::read_file(d.file("positives.bin"));
  EXPECT_EQ(j.at("positives").at("bytes").get<uint64_t>(), positives.size());
  EXPECT_EQ(j.at("positives").at("crc32c").get<uint32_t>(), slow_crc32c(positives));
}

// A changed digit anywhere in metadata.json is refused by the loader (so by
// the trainer), by verify_dataset and by both programs; whitespace is not
// content.
TEST(DatasetIntegrity, MetadataWithAChangedDigitIsRefused) {
  TempDir d;
  write_small(d.path());
  const std::string mp = d.file("metadata.json");
  const std::string good = test::read_file(mp);
  EXPECT_EQ(load_error(d.path()), "");
  EXPECT_EQ(verify_error(d.path()), "");

  // The seed: the loader, verify, ncf_prep --verify and ncf_dist all refuse it.
  const size_t at = good.find("\"seed\": ");
  ASSERT_NE(at, std::string::npos) << good;
  std::string bad = good;
  char& digit = bad[at + 8];
  ASSERT_TRUE(digit >= '0' && digit <= '9') << good.substr(at, 20);
  digit = digit == '9' ? '8' : char(digit + 1);
  test::write_file(mp, bad);
  const std::string refused = mp + ": the content does not match its crc32c";
  std::string e = load_error(d.path());
  EXPECT_TRUE(has(e, refused)) << e;
  EXPECT_TRUE(has(e, "re-run ncf_prep")) << e;
  e = verify_error(d.path());
  EXPECT_TRUE(has(e, refused)) << e;
  test::RunResult r = test::run(test::bin("ncf_prep") + " --verify " + d.path());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, refused)) << r.output;
  r = test::run(test::bin("ncf_dist") + " --device cpu --data_dir " + d.path() +
                " --batch_size 50 --train_epochs 1 --threads 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, refused)) << r.output;

  // Every digit of the file, one at a time.
  size_t digits = 0;
  for (size_t k = 0; k < good.size(); ++k) {
    if (good[k] < '0' || good[k] > '9') continue;
    ++digits;
    bad = good;
    bad[k] = char('0' + (good[k] - '0' + 1) % 10);
    test::write_file(mp, bad);
    e = load_error(d.path());
    EXPECT_TRUE(has(e, mp)) << "digit at byte " << k << " (" << good.substr(k > 20 ? k - 20 : 0, 40)
                            << "): " << e;
  }
  EXPECT_GT(digits, 100u);

  // Whitespace is not content: the same JSON re-indented still loads.
  test::write_file(mp, nlohmann::json::parse(good).dump(4));
  EXPECT_EQ(load_error(d.path()), "");
  EXPECT_EQ(verify_error(d.path()), "");
}

// Rewrites a dataset the way ncf_prep's format version 1 wrote it: every
// shard header says format_version 1 (the shards' sizes and CRCs in the
// metadata follow), and metadata.json says format_version 1 and has no
// crc32c of its own. Records, positives.bin and the dataset id are the same.
void make_format_1(const std::string& dir) {
  const std::string mp = dir + "/metadata.json";
  nlohmann::json j = nlohmann::json::parse(test::read_file(mp));
  for (auto& s : j.at("shards")) {
    const std::string path = dir + "/" + s.at("name").get<std::string>();
    rewrite_record(path, 0, [](const std::string& payload) {
      proto::ShardHeader h;
      EXPECT_TRUE(h.ParseFromString(payload));
      EXPECT_EQ(h.format_version(), 2u);
      h.set_format_version(1);
      return h.SerializeAsString();
    });
    const std::string bytes = test::read_file(path);
    s["bytes"] = bytes.size();
    s["crc32c"] = slow_crc32c(bytes);
  }
  j.erase("crc32c");
  j["format_version"] = 1;
  test::write_file(mp, j.dump(2));
}

// The loss, HR and NDCG columns of ncf_dist's epoch lines.
std::vector<std::string> epoch_metrics(const std::string& output) {
  std::vector<std::string> rows;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string epoch, loss, hr, ndcg;
    if (f >> epoch >> loss >> hr >> ndcg && !epoch.empty() &&
        std::all_of(epoch.begin(), epoch.end(), ::isdigit))
      rows.push_back(epoch + " " + loss + " " + hr + " " + ndcg);
  }
  return rows;
}

// A dataset from format version 1 (no crc32c in metadata.json) still loads
// and trains exactly as the same dataset in version 2, with a warning that
// names the file; its shards and positives.bin are still checked. A version 2
// file without its checksum, or whose version changed, is refused: one
// damaged byte cannot pass as an older dataset.
TEST(DatasetIntegrity, OlderFormatLoadsWithAWarningAndTrainsTheSame) {
  TempDir d2, d1;
  write_small(d2.path());
  std::filesystem::copy(d2.path(), d1.path(), std::filesystem::copy_options::recursive);
  make_format_1(d1.path());
  const std::string mp = d1.file("metadata.json");
  const std::string warning =
      mp + ": dataset format version 1 (an older ncf_prep): its metadata has no checksum";
  EXPECT_EQ(load_error(d1.path()), "");
  EXPECT_EQ(verify_error(d1.path()), "");
  const DatasetMeta m1 = DatasetMeta::load(d1.path()), m2 = DatasetMeta::load(d2.path());
  EXPECT_EQ(m1.format_version, 1u);
  EXPECT_TRUE(has(m1.unsealed_warning, warning)) << m1.unsealed_warning;
  EXPECT_EQ(m2.unsealed_warning, "");
  EXPECT_EQ(m1.dataset_id, m2.dataset_id);

  test::RunResult r = test::run(test::bin("ncf_prep") + " --verify " + d1.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "ncf_prep: warning: " + warning)) << r.output;
  const std::string train = " --batch_size 50 --train_epochs 2 --threads 1 --progress off";
  const test::RunResult r1 =
      test::run(test::bin("ncf_dist") + " --device cpu --data_dir " + d1.path() + train);
  const test::RunResult r2 =
      test::run(test::bin("ncf_dist") + " --device cpu --data_dir " + d2.path() + train);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_TRUE(has(r1.output, "warning: " + warning)) << r1.output;
  EXPECT_FALSE(has(r2.output, "warning")) << r2.output;
  EXPECT_EQ(epoch_metrics(r1.output).size(), 2u) << r1.output;
  EXPECT_EQ(epoch_metrics(r1.output), epoch_metrics(r2.output));

  // A version 1 dataset's positives.bin and shards are still checked.
  const std::string pp = d1.file("positives.bin");
  const std::string positives = test::read_file(pp);
  std::string bad = positives;
  bad[bad.size() - 3] ^= 4;
  test::write_file(pp, bad);
  r = test::run(test::bin("ncf_dist") + " --device cpu --data_dir " + d1.path() + train);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, pp + ": CRC-32C ")) << r.output;
  test::write_file(pp, positives);
  const std::string shard = first_shard(d1.path(), "train");
  const std::string shard_bytes = test::read_file(shard);
  bad = shard_bytes;
  bad[bad.size() / 2] ^= 1;
  test::write_file(shard, bad);
  EXPECT_TRUE(has(verify_error(d1.path()), shard)) << verify_error(d1.path());
  test::write_file(shard, shard_bytes);
  EXPECT_EQ(verify_error(d1.path()), "");

  // Not version 1: the current version without its checksum, a version that
  // never existed, and a version 2 metadata sealed over version 1 shards.
  nlohmann::json j = nlohmann::json::parse(test::read_file(mp));
  for (int v : {2, 0, 3}) {
    j["format_version"] = v;
    test::write_file(mp, j.dump(2));
    EXPECT_TRUE(has(load_error(d1.path()), mp + ": no crc32c field")) << load_error(d1.path());
    r = test::run(test::bin("ncf_dist") + " --device cpu --data_dir " + d1.path() + train);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(has(r.output, mp + ": no crc32c field")) << r.output;
  }
  j["format_version"] = 2;
  write_sealed(mp, j);
  EXPECT_TRUE(has(verify_error(d1.path()), ": format version 1 but the metadata's is 2"))
      << verify_error(d1.path());
  j["format_version"] = 7;
  write_sealed(mp, j);
  EXPECT_TRUE(has(load_error(d1.path()), mp + ": format_version 7 is not supported"))
      << load_error(d1.path());
}

// positives.bin is checked against the metadata's size and CRC-32C when it is
// opened for training: a flipped or zeroed byte anywhere (header, offsets,
// items) and a short or long file are refused with the file's name.
TEST(DatasetIntegrity, PositivesWithFlippedZeroedOrMissingBytesAreRefusedOnLoad) {
  TempDir d;
  const Truth t = write_small(d.path());
  const std::string p = d.file("positives.bin");
  const std::string good = test::read_file(p);
  const DatasetMeta meta = DatasetMeta::load(d.path());
  {
    PositiveLists lists(d.path(), meta);
    for (uint64_t u = 0; u < t.U; ++u)
      EXPECT_EQ(std::vector<int32_t>(lists.begin(u), lists.end(u)), t.positives[u]);
  }
  // Layout: a 32-byte header (magic, U, nnz, reserved), U + 1 int64 offsets,
  // then the int32 items.
  const size_t offsets_at = 32, items_at = offsets_at + 8 * (t.U + 1);
  ASSERT_EQ(good.size(), items_at + 4 * meta.num_positives);
  const std::string crc_error = p + ": CRC-32C ";
  for (size_t offset : {size_t(0), size_t(9), size_t(17), size_t(26), offsets_at + 8, items_at - 3,
                        items_at, items_at + 5, good.size() - 1}) {
    std::string bad = good;
    bad[offset] = char(bad[offset] ^ 0x04);
    test::write_file(p, bad);
    const std::string e = positives_error(d.path());
    EXPECT_TRUE(has(e, crc_error)) << "offset " << offset << ": " << e;
    EXPECT_TRUE(has(e, "re-run ncf_prep")) << "offset " << offset << ": " << e;
  }
  // Zeroed ranges: in the offsets, and in the items.
  for (size_t begin : {offsets_at + 16, items_at + 8}) {
    std::string zeroed = good;
    std::fill(zeroed.begin() + ptrdiff_t(begin), zeroed.begin() + ptrdiff_t(begin) + 64, '\0');
    ASSERT_NE(zeroed, good);
    test::write_file(p, zeroed);
    const std::string e = positives_error(d.path());
    EXPECT_TRUE(has(e, crc_error)) << "zeroed from " << begin << ": " << e;
  }
  // Short and long files: the sizes are in the message.
  for (const std::string& other : {good.substr(0, good.size() - 4), good + std::string(4, '\0')}) {
    test::write_file(p, other);
    const std::string e = positives_error(d.path());
    EXPECT_TRUE(has(e, p + ": file has " + std::to_string(other.size()) +
                           " bytes, the metadata says " + std::to_string(good.size())))
        << e;
    EXPECT_TRUE(has(e, "re-run ncf_prep")) << e;
  }
  // A metadata whose recorded size disagrees with its own counts (sealed, so
  // only that check can catch it).
  test::write_file(p, good);
  const std::string mp = d.file("metadata.json");
  const std::string good_meta = test::read_file(mp);
  nlohmann::json j = nlohmann::json::parse(good_meta);
  j["positives"]["bytes"] = good.size() + 4;
  write_sealed(mp, j);
  EXPECT_TRUE(has(positives_error(d.path()),
                  mp + ": positives.bytes is " + std::to_string(good.size() + 4)))
      << positives_error(d.path());
  test::write_file(mp, good_meta);
  EXPECT_EQ(positives_error(d.path()), "");

  // verify_dataset, and the trainer itself: a non-zero exit with that message.
  std::string flipped = good;
  flipped[items_at + 1] = char(flipped[items_at + 1] ^ 0x10);
  test::write_file(p, flipped);
  EXPECT_TRUE(has(verify_error(d.path()), p)) << verify_error(d.path());
  const test::RunResult r = test::run(test::bin("ncf_dist") + " --device cpu --data_dir " +
                                      d.path() + " --batch_size 50 --train_epochs 1 --threads 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, crc_error)) << r.output;
  EXPECT_TRUE(has(r.output, "re-run ncf_prep")) << r.output;
}

// The untouched dataset trains: the checks above refuse only damage.
TEST(DatasetIntegrity, UntouchedDatasetTrains) {
  TempDir d;
  write_small(d.path());
  const test::RunResult r = test::run(test::bin("ncf_dist") + " --device cpu --data_dir " +
                                      d.path() + " --batch_size 50 --train_epochs 1 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Fuzzing found (fuzz/regressions/metadata/): the JSON parser throws more than
// parse_error, and a number too large for any JSON number type (1e999, or an
// integer past 2^64 written with an exponent) escaped the loader as a bare
// nlohmann exception whose message named no file. Every such file is refused
// as bad JSON, naming it.
TEST(DatasetErrors, MetadataWithAnUnrepresentableNumberIsRefusedNamingTheFile) {
  TempDir d;
  write_small(d.path());
  const std::string mp = d.file("metadata.json");
  for (const std::string text : {"{\"seed\": 1e999}", "{\"seed\": -1e86083626}", "[1E400]"}) {
    test::write_file(mp, text);
    std::string e;
    try {
      DatasetMeta::load(d.path());
    } catch (const Error& err) {
      e = err.what();
    } catch (const std::exception& err) {
      ADD_FAILURE() << text << ": not an ncf::Error: " << err.what();
    }
    EXPECT_TRUE(has(e, mp + ": not valid JSON")) << text << ": " << e;
    e = verify_error(d.path());
    EXPECT_TRUE(has(e, mp + ": not valid JSON")) << text << ": " << e;
  }
}

// Fuzzing found (fuzz/regressions/dataset/): integer fields were read with
// nlohmann's get<T>, which converts a float (undefined behaviour past the
// type's range: 1.1e73 as a count), wraps a negative and cuts a wide value,
// so a sealed metadata.json with "seed": -1 or "eval_negatives": 4294967297
// loaded as 2^64 - 1 or 1. Every integer field is now an integer its type
// holds, or the file is refused naming the field.
TEST(DatasetErrors, MetadataIntegersMustFitTheirFields) {
  TempDir d;
  write_small(d.path());
  const std::string mp = d.file("metadata.json");
  const nlohmann::json good = nlohmann::json::parse(test::read_file(mp));
  struct Case {
    std::string key;
    nlohmann::json value;
  };
  const std::vector<Case> cases = {{"seed", -1},
                                   {"eval_negatives", 4294967297ull},
                                   {"num_users", 50.0},
                                   {"train_frame_bytes", 1.1e73},
                                   {"dropped_users", "0"}};
  for (const Case& c : cases) {
    nlohmann::json j = good;
    j[c.key] = c.value;
    j["crc32c"] = metadata_crc32c(j);
    test::write_file(mp, j.dump(2));
    const std::string e = load_error(d.path());
    EXPECT_TRUE(has(e, mp + ": metadata field '" + c.key + "'")) << c.value.dump() << ": " << e;
  }
  // The CRCs of the files it lists, and its own, are below 2^32 too.
  nlohmann::json j = good;
  j["positives"]["crc32c"] = j["positives"]["crc32c"].get<uint64_t>() + (uint64_t{1} << 32);
  j["crc32c"] = metadata_crc32c(j);
  test::write_file(mp, j.dump(2));
  EXPECT_TRUE(has(load_error(d.path()), mp + ": metadata field 'crc32c'")) << load_error(d.path());
  j = good;
  j["crc32c"] = uint64_t(metadata_crc32c(j)) + (uint64_t{1} << 32);
  test::write_file(mp, j.dump(2));
  EXPECT_TRUE(has(load_error(d.path()), mp + ": metadata field 'crc32c'")) << load_error(d.path());
  test::write_file(mp, good.dump(2));
  EXPECT_EQ(load_error(d.path()), "");
}

// Found by reading the code behind fuzz_positives (reproducer in
// fuzz/regressions/positives/, where the target's layout property catches it):
// positives.bin's expected size was computed from the metadata's counts with
// wrapping arithmetic, so num_positives = 2^62 + 2 made the size of 2 and a
// 56-byte file whose header and last offset said 2^62 + 2 was accepted; every
// reader of the lists would then read past the end of the map. Such a count
// is refused, naming the metadata.
TEST(DatasetErrors, PositivesCountBeyondAnyFileIsRefused) {
  TempDir d;
  const uint64_t nnz = (uint64_t{1} << 62) + 2;
  std::string file = "NCFPOS01";
  auto put64 = [&](uint64_t v) { file.append(reinterpret_cast<const char*>(&v), 8); };
  put64(1);    // users
  put64(nnz);  // positives
  put64(0);
  put64(0);  // offsets: [0, nnz)
  put64(nnz);
  for (int32_t item : {1, 2}) file.append(reinterpret_cast<const char*>(&item), 4);
  ASSERT_EQ(file.size(), 56u);
  test::write_file(d.file("positives.bin"), file);
  DatasetMeta m;
  m.num_users = 1;
  m.num_items = 5;
  m.num_positives = nnz;
  m.positives_bytes = file.size();
  m.positives_crc32c = crc32c(file.data(), file.size());
  try {
    PositiveLists lists(d.path(), m);
    ADD_FAILURE() << "accepted " << lists.nnz() << " positives in a file of " << file.size()
                  << " bytes";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), d.file("metadata.json") + ": num_positives " + std::to_string(nnz)))
        << e.what();
  }
}

// Fuzzing found (fuzz/regressions/dataset/): verify_dataset, and the readers,
// size buffers from train_record_rows and eval_negatives before reading a
// shard, and metadata.json took any uint32 for them, so a sealed file with
// "train_record_rows": 4000000000 (and no train shards) or "eval_negatives":
// 4000000000 made them allocate 16 GB. Both are bounded by what ncf_prep
// writes (--record_rows 2^24, --eval_negatives 2^20), naming the field.
TEST(DatasetErrors, MetadataRecordAndListSizesAreBounded) {
  TempDir d;
  write_small(d.path());
  const std::string mp = d.file("metadata.json");
  const nlohmann::json good = nlohmann::json::parse(test::read_file(mp));
  nlohmann::json j = good;
  nlohmann::json eval_only = nlohmann::json::array();
  for (const auto& s : j["shards"])
    if (s["kind"] == "eval") eval_only.push_back(s);
  j["shards"] = eval_only;
  j["num_train"] = 0;
  j["train_record_rows"] = 4000000000u;
  j["crc32c"] = metadata_crc32c(j);
  test::write_file(mp, j.dump(2));
  std::string e = load_error(d.path());
  EXPECT_TRUE(has(e, mp + ": train_record_rows 4000000000 is outside [1, 16777216]")) << e;
  j = good;
  j["eval_negatives"] = 4000000000u;
  j["crc32c"] = metadata_crc32c(j);
  test::write_file(mp, j.dump(2));
  e = load_error(d.path());
  EXPECT_TRUE(has(e, mp + ": eval_negatives 4000000000 is more than 1048576")) << e;
}

TEST(DatasetErrors, PositivesFileDamaged) {
  TempDir d;
  write_small(d.path());
  std::string p = d.file("positives.bin");
  std::string bytes = test::read_file(p);
  test::write_file(p, bytes.substr(0, bytes.size() - 4));
  std::string e = verify_error(d.path());
  EXPECT_NE(e.find(p + ": file has " + std::to_string(bytes.size() - 4) +
                   " bytes but the metadata says " + std::to_string(bytes.size())),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace ncf
