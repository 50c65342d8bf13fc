// ncf_prep --extend and ncf_dist --init_from (data/extend.h, Trainer::warm_start)
// with the real programs: a CSV log with string ids and times, cut into two
// days by scripts/make_log.py. Ids are checked against the parent's maps, the
// warm-started rows against the checkpoint's files, and the new rows against
// the same warm start at another W.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/id_map.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace ncf {
namespace {

using namespace ::ncf::test;

const std::string kCsv = " --format csv --columns user=user,item=item,timestamp=ts";
const std::string kModel = " --layers 16,8 --num_factors 4 --batch_size 512 --seed 3";

class Extend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string d = dir_->path();
    auto must = [](const std::string& cmd) {
      const RunResult r = run(cmd);
      if (r.exit_code != 0) throw std::runtime_error(cmd + "\n" + r.output);
    };
    must(test::python3() + " " + std::string(NCF_SOURCE_DIR) +
         "/scripts/make_log.py --users 400 --items 120 --rows 8000 --days 2 --out " + d + "/logs");
    must(bin("ncf_prep") + " --input " + d + "/logs/day-1.csv" + kCsv +
         " --eval_negatives 20 --output " + d + "/day1");
    must(bin("ncf_dist") + " --data_dir " + d + "/day1" + kModel +
         " --train_epochs 1 --checkpoint_dir " + d + "/ck1");
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& p) { return dir_->path() + "/" + p; }
  static std::string prep_day2(const std::string& out, const std::string& extra = "") {
    return bin("ncf_prep") + " --input " + path("logs/day-2.csv") + kCsv +
           " --eval_negatives 20 --extend " + path("day1") + " --output " + path(out) + extra;
  }
  // The checkpoint's rows of table t ("user", "item") by original id.
  static std::map<std::string, std::vector<float>> rows_by_id(const std::string& ck_dir,
                                                              const std::string& t) {
    const CheckpointManifest m = CheckpointManifest::load(ck_dir + "/manifest.json");
    const CheckpointReader ck(ck_dir, m);
    const IdMaps maps = ck.id_maps();
    const IdMap& map = t == "user" ? maps.user : maps.item;
    const std::string raw = read_file(ck_dir + "/" + t + ".rows.f32");
    const size_t D = raw.size() / 4 / size_t(map.size());
    std::map<std::string, std::vector<float>> out;
    for (int64_t d = 0; d < map.size(); ++d) {
      std::vector<float> row(D);
      std::memcpy(row.data(), raw.data() + size_t(d) * D * 4, D * 4);
      out[map.text(d)] = row;
    }
    return out;
  }
  static TempDir* dir_;
};
TempDir* Extend::dir_ = nullptr;

std::string newest(const std::string& ck_dir) {
  const RunResult r = run("ls -d " + ck_dir + "/step-* | tail -1");
  return r.output.substr(0, r.output.find('\n'));
}

TEST_F(Extend, KnownIdsKeepTheirPlacesAndNewOnesFollow) {
  const RunResult r = run(prep_day2("day2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("users: "), std::string::npos) << r.output;
  const DatasetMeta m1 = DatasetMeta::load(path("day1")), m2 = DatasetMeta::load(path("day2"));
  const IdMaps a = load_id_maps(path("day1"), m1), b = load_id_maps(path("day2"), m2);
  ASSERT_GT(b.user.size(), a.user.size()) << "the log adds users";
  for (int64_t d = 0; d < a.user.size(); ++d) ASSERT_EQ(a.user.text(d), b.user.text(d)) << d;
  for (int64_t d = 0; d < a.item.size(); ++d) ASSERT_EQ(a.item.text(d), b.item.text(d)) << d;
  for (int64_t d = a.user.size(); d < b.user.size(); ++d) {
    EXPECT_FALSE(a.user.find(b.user.string(d)).has_value()) << "new user " << b.user.text(d);
    if (d > a.user.size()) {
      EXPECT_LT(b.user.string(d - 1), b.user.string(d)) << "ascending";
    }
  }
  EXPECT_EQ(m2.format_version, kFormatVersion);
  EXPECT_EQ(m2.ancestors(), std::vector<std::string>{m1.dataset_id});
  EXPECT_LT(m2.num_eval_users, m2.num_users);
  const RunResult v = run(bin("ncf_prep") + " --verify " + path("day2"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("lineage checked against the parent"), std::string::npos) << v.output;
  // Each user's history stays among its positives: day 1's positives are a
  // subset of day 2's for every user day 1 knows.
  const PositiveLists p1(path("day1"), m1), p2(path("day2"), m2);
  for (uint64_t u = 0; u < m1.num_users; ++u) {
    std::vector<int32_t> now(p2.begin(u), p2.end(u));
    for (const int32_t* it = p1.begin(u); it != p1.end(u); ++it)
      ASSERT_TRUE(std::binary_search(now.begin(), now.end(), *it)) << "user " << u;
  }
}

TEST_F(Extend, ABoundKeepsTheMostRecentAndDropsTheRestVisibly) {
  const DatasetMeta m1 = DatasetMeta::load(path("day1"));
  const uint64_t bound = m1.num_users * 3 / 4;
  const RunResult r = run(prep_day2("bounded", " --max_users " + std::to_string(bound)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(--max_users " + std::to_string(bound) + "), renumbered"),
            std::string::npos)
      << r.output;
  const DatasetMeta m = DatasetMeta::load(path("bounded"));
  EXPECT_EQ(m.num_users, bound);
  const IdMaps now = load_id_maps(path("bounded"), m);
  const IdMaps before = load_id_maps(path("day1"), m1);
  // The dropped ids are listed and absent; every kept id keeps its original id.
  ASSERT_EQ(m.dropped_ids.size(), 2u);
  const uint64_t dropped = m.lineage.at("users").at("dropped").get<uint64_t>();
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(m.dropped_ids[0].count,
            dropped + m.lineage.at("users").at("new_dropped").get<uint64_t>());
  int64_t kept = 0;
  for (int64_t d = 0; d < before.user.size(); ++d) kept += now.user.find_same(before.user, d) >= 0;
  EXPECT_EQ(uint64_t(kept), m1.num_users - dropped);
  // Recency from the logs, computed here: (1, latest time) for a user of day
  // 2's log, else (0, its latest time on day 1). No kept user is less recent
  // than a dropped one.
  std::map<std::string, std::pair<int, int64_t>> recency;
  for (int day = 1; day <= 2; ++day) {
    const auto rows = csv_rows(read_file(path("logs/day-" + std::to_string(day) + ".csv")));
    for (size_t k = 1; k < rows.size(); ++k) {
      if (rows[k].size() < 3) continue;
      auto& r = recency[rows[k][0]];
      const std::pair<int, int64_t> now{day - 1, std::stoll(rows[k][2])};
      r = std::max(r, now);
    }
  }
  std::pair<int, int64_t> least_kept{9, 0}, most_dropped{-1, 0};
  for (int64_t d = 0; d < before.user.size(); ++d) {
    const std::pair<int, int64_t> r = recency.at(std::string(before.user.string(d)));
    if (now.user.find_same(before.user, d) >= 0)
      least_kept = std::min(least_kept, r);
    else
      most_dropped = std::max(most_dropped, r);
  }
  EXPECT_GE(least_kept, most_dropped);
  const RunResult v = run(bin("ncf_prep") + " --verify " + path("bounded"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  // --verify checks the activity and dropped-id files too.
  for (const std::string f : {"user_activity.i64", "dropped_user_ids.str"}) {
    ASSERT_EQ(
        run("rm -rf " + path("damaged") + " && cp -r " + path("bounded") + " " + path("damaged"))
            .exit_code,
        0);
    std::string bytes = read_file(path("damaged/" + f));
    bytes[bytes.size() - 1] ^= 1;
    write_file(path("damaged/" + f), bytes);
    const RunResult bad = run(bin("ncf_prep") + " --verify " + path("damaged"));
    EXPECT_NE(bad.exit_code, 0) << f;
    EXPECT_NE(bad.output.find(path("damaged/" + f) + ": file CRC-32C"), std::string::npos)
        << bad.output;
  }
}

TEST_F(Extend, AWarmStartHoldsTheCheckpointsRowsAndTheSameNewRowsAtAnyW) {
  ASSERT_EQ(run(prep_day2("warm", " --max_users 380 --max_items 110")).exit_code, 0);
  const std::string ck1 = newest(path("ck1"));
  std::string out[2];
  const int worlds[2] = {1, 3};
  for (int k = 0; k < 2; ++k) {
    out[k] = path("warm_w" + std::to_string(worlds[k]) + ".bin");
    const RunResult r =
        run(mpirun(worlds[k]) + " " + bin("ncf_dist") + " --data_dir " + path("warm") + kModel +
            " --init_from " + ck1 + " --eval_only --save_params " + out[k]);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("warm start from"), std::string::npos) << r.output;
  }
  // Every row, new ones included, is the same at W = 1 and W = 3.
  EXPECT_EQ(read_file(out[0]), read_file(out[1]));
  // Rows of ids on both sides are the checkpoint's, bit for bit; the params
  // file is the tower, then the user and item tables in dense order.
  const DatasetMeta m = DatasetMeta::load(path("warm"));
  const IdMaps maps = load_id_maps(path("warm"), m);
  const std::string params = read_file(out[0]);
  const auto users = rows_by_id(ck1, "user"), items = rows_by_id(ck1, "item");
  const size_t D = users.begin()->second.size();
  const size_t tables = (m.num_users + m.num_items) * D * 4;
  ASSERT_GT(params.size(), tables);
  const size_t base = params.size() - tables;
  int64_t found = 0, fresh = 0;
  for (int k = 0; k < 2; ++k) {
    const IdMap& map = k == 0 ? maps.user : maps.item;
    const auto& old = k == 0 ? users : items;
    const size_t off = base + (k == 0 ? 0 : m.num_users * D * 4);
    for (int64_t d = 0; d < map.size(); ++d) {
      const auto it = old.find(map.text(d));
      const char* row = params.data() + off + size_t(d) * D * 4;
      if (it == old.end()) {
        ++fresh;
        continue;
      }
      ++found;
      ASSERT_EQ(std::memcmp(row, it->second.data(), D * 4), 0) << map.text(d);
    }
  }
  EXPECT_GT(found, 0);
  EXPECT_GT(fresh, 0) << "the log brings new ids";
  // Dropped ids have no row: the tables hold exactly the dataset's ids.
  EXPECT_EQ(params.size(), base + tables);
}

TEST_F(Extend, TrainingGoesOnFromTheWarmStartAndResumesAsItself) {
  ASSERT_EQ(run(prep_day2("train2")).exit_code, 0);
  const std::string cmd = bin("ncf_dist") + " --data_dir " + path("train2") + kModel +
                          " --init_from " + newest(path("ck1")) + " --train_epochs 2";
  const RunResult a =
      run(cmd + " --checkpoint_dir " + path("ck2") + " --save_params " + path("a.bin"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // The manifest says where the run began; the step count went on.
  const std::string ck2 = newest(path("ck2"));
  const CheckpointManifest m2 = CheckpointManifest::load(ck2 + "/manifest.json");
  const CheckpointManifest m1 = CheckpointManifest::load(newest(path("ck1")) + "/manifest.json");
  EXPECT_EQ(m2.init_from.at("dataset_id"), m1.dataset_id);
  EXPECT_GT(m2.step, m1.step);
  // With reset, the optimizer's state and step count start afresh: another trajectory.
  const RunResult b = run(cmd + " --init_optimizer_state reset --save_params " + path("b.bin"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(read_file(path("a.bin")), read_file(path("b.bin")));
  // Run again with --resume auto and a checkpoint there: the run's own wins.
  const RunResult c = run(cmd + " --checkpoint_dir " + path("ck2") + " --resume auto");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("not used: resumed from this run's own checkpoint"), std::string::npos)
      << c.output;
}

TEST_F(Extend, HostileInputIsRefusedNamingFilesAndIds) {
  ASSERT_EQ(run(prep_day2("hostile")).exit_code, 0);
  const DatasetMeta m1 = DatasetMeta::load(path("day1"));
  const DatasetMeta m2 = DatasetMeta::load(path("hostile"));
  // A checkpoint of another lineage: a dataset made from scratch of day 2 alone.
  ASSERT_EQ(run(bin("ncf_prep") + " --input " + path("logs/day-2.csv") + kCsv +
                " --eval_negatives 20 --output " + path("other"))
                .exit_code,
            0);
  const RunResult o = run(bin("ncf_dist") + " --data_dir " + path("other") + kModel +
                          " --init_from " + path("ck1") + " --eval_only");
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.output.find("belongs to dataset " + m1.dataset_id), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("nor one it extends"), std::string::npos) << o.output;
  // Backwards: day 1 does not extend day 2.
  ASSERT_EQ(run(bin("ncf_dist") + " --data_dir " + path("hostile") + kModel +
                " --train_epochs 1 --max_steps 2 --checkpoint_dir " + path("ck_h"))
                .exit_code,
            0);
  const RunResult back = run(bin("ncf_dist") + " --data_dir " + path("day1") + kModel +
                             " --init_from " + path("ck_h") + " --eval_only");
  EXPECT_NE(back.exit_code, 0);
  EXPECT_NE(back.output.find(m2.dataset_id), std::string::npos) << back.output;
  // Another shape.
  const RunResult shape = run(bin("ncf_dist") + " --data_dir " + path("hostile") +
                              " --layers 32,16 --num_factors 4 --batch_size 512 --init_from " +
                              path("ck1") + " --eval_only");
  EXPECT_NE(shape.exit_code, 0);
  EXPECT_NE(shape.output.find("--layers [16,8]"), std::string::npos) << shape.output;
  // PREV of another kind of ids, a bound without --extend, the output on the parent.
  const RunResult kind = run(bin("ncf_prep") + " --synthetic small --output " + path("syn") +
                             " && " + bin("ncf_prep") + " --input " + path("logs/day-2.csv") +
                             kCsv + " --extend " + path("syn") + " --output " + path("bad"));
  EXPECT_NE(kind.exit_code, 0);
  EXPECT_NE(kind.output.find("--extend " + path("syn") + ": the dataset has dense ids only"),
            std::string::npos)
      << kind.output;
  const RunResult bound = run(bin("ncf_prep") + " --input " + path("logs/day-2.csv") + kCsv +
                              " --max_users 5 --output " + path("bad2"));
  EXPECT_NE(bound.exit_code, 0);
  EXPECT_NE(bound.output.find("--max_users applies to --extend only"), std::string::npos)
      << bound.output;
  const RunResult same = run(prep_day2("day1"));
  EXPECT_NE(same.exit_code, 0);
  EXPECT_NE(same.output.find("are the same directory"), std::string::npos) << same.output;
}

}  // namespace
}  // namespace ncf
