// Tests of the raw-input side of ncf_prep (data/sources.h): the MovieLens and
// NCF-paper parsers, format detection, error messages, and the prepared
// datasets read back record by record against hand-worked and naive answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/check.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/id_map.h"
#include "data/ncf_record.pb.h"
#include "data/source_csv.h"
#include "data/sources.h"
#include "data/synthetic.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::TempDir;
using test::write_file;

// The message of the ncf::Error that fn throws, or "" when it does not throw.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "expected an error";
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// ---------------------------------------------------------- shard readers ---
// Walked with the shard cursor and decoded straight from the protobuf messages,
// so these checks do not lean on the format's decoders or the training readers.

struct EvalList {
  uint32_t user;
  std::vector<int32_t> items;
  std::vector<uint8_t> mask;
};

std::vector<EvalList> read_eval(const std::string& dir, const DatasetMeta& meta) {
  std::vector<EvalList> out;
  const uint32_t num_shards = static_cast<uint32_t>(meta.shards_of("eval").size());
  for (uint32_t s = 0; s < num_shards; ++s) {
    ShardCursor cur(dir, meta, "eval", s);
    std::string payload;
    uint64_t off;
    while (cur.next(&payload, &off)) {
      proto::EvalRecord r;
      EXPECT_TRUE(r.ParseFromString(payload));
      EvalList e;
      e.user = r.user();
      e.items.resize(r.items().size() / 4);
      std::memcpy(e.items.data(), r.items().data(), e.items.size() * 4);
      e.mask.resize(e.items.size());
      for (size_t j = 0; j < e.mask.size(); ++j)
        e.mask[j] = (static_cast<unsigned char>(r.dup_mask()[j / 8]) >> (j % 8)) & 1;
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<std::pair<int32_t, int32_t>> read_train_pairs(const std::string& dir,
                                                          const DatasetMeta& meta) {
  std::vector<std::pair<int32_t, int32_t>> out;
  const uint32_t num_shards = static_cast<uint32_t>(meta.shards_of("train").size());
  for (uint32_t s = 0; s < num_shards; ++s) {
    ShardCursor cur(dir, meta, "train", s);
    std::string payload;
    uint64_t off;
    while (cur.next(&payload, &off)) {
      proto::TrainRecord r;
      EXPECT_TRUE(r.ParseFromString(payload));
      std::vector<int32_t> u(r.users().size() / 4), i(r.items().size() / 4);
      std::memcpy(u.data(), r.users().data(), u.size() * 4);
      std::memcpy(i.data(), r.items().data(), i.size() * 4);
      for (uint32_t k = 0; k < r.num_valid(); ++k) out.push_back({u[k], i[k]});
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<int32_t>> read_positives(const std::string& dir, const DatasetMeta& meta) {
  PositiveLists pl(dir, meta);
  std::vector<std::vector<int32_t>> out(pl.num_users());
  for (uint64_t u = 0; u < pl.num_users(); ++u) out[u].assign(pl.begin(u), pl.end(u));
  return out;
}

PrepOptions small_options(uint32_t E) {
  PrepOptions o;
  o.eval_negatives = E;
  o.record_rows = 4;
  o.num_shards = 2;
  o.seed = 7;
  o.threads = 2;
  return o;
}

// ----------------------------------------------------------------- names ---

TEST(Sources, FormatNames) {
  EXPECT_EQ(parse_input_format("auto"), InputFormat::kAuto);
  EXPECT_EQ(parse_input_format("ml-100k"), InputFormat::kMl100k);
  EXPECT_EQ(parse_input_format("ml-1m"), InputFormat::kMlDat);
  EXPECT_EQ(parse_input_format("ml-10m"), InputFormat::kMlDat);
  EXPECT_EQ(parse_input_format("ml-20m"), InputFormat::kMlCsv);
  EXPECT_EQ(parse_input_format("ml-25m"), InputFormat::kMlCsv);
  EXPECT_EQ(parse_input_format("ncf-paper"), InputFormat::kNcfPaper);
  for (InputFormat f : {InputFormat::kAuto, InputFormat::kMl100k, InputFormat::kMlDat,
                        InputFormat::kMlCsv, InputFormat::kNcfPaper})
    EXPECT_EQ(parse_input_format(format_name(f)), f);
  expect_has(error_of([] { parse_input_format("ml-30m"); }), {"ml-30m"});
}

// --------------------------------------------------------------- parsers ---

TEST(Sources, ReadsUDataWithCrlfAndNoFinalNewline) {
  TempDir d;
  write_file(d.file("u.data"),
             "196\t242\t3\t881250949\r\n186\t302\t3\t891717742\r\n22\t377\t1\t878887116");
  auto r = read_movielens(d.file("u.data"), InputFormat::kMl100k);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].user, 196);
  EXPECT_EQ(r[0].item, 242);
  EXPECT_EQ(r[0].timestamp, 881250949);
  EXPECT_EQ(r[0].line, 1u);
  EXPECT_EQ(r[2].user, 22);
  EXPECT_EQ(r[2].item, 377);
  EXPECT_EQ(r[2].timestamp, 878887116);
  EXPECT_EQ(r[2].line, 3u);
}

TEST(Sources, ReadsRatingsDatWithHalfStarsAndTrailingBlankLines) {
  TempDir d;
  write_file(d.file("ratings.dat"), "1::1193::5::978300760\n1::661::3.5::978302109\n\n\n");
  auto r = read_movielens(d.file("ratings.dat"), InputFormat::kMlDat);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].user, 1);
  EXPECT_EQ(r[1].item, 661);
  EXPECT_EQ(r[1].timestamp, 978302109);
  EXPECT_EQ(r[1].line, 2u);
}

TEST(Sources, ReadsRatingsCsvWithHeader) {
  TempDir d;
  write_file(d.file("ratings.csv"),
             "userId,movieId,rating,timestamp\r\n1,2,3.5,1112486027\r\n1,29,0.5,1112484676\r\n");
  auto r = read_movielens(d.file("ratings.csv"), InputFormat::kMlCsv);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].user, 1);
  EXPECT_EQ(r[0].item, 2);
  EXPECT_EQ(r[0].line, 2u);  // the header is line 1
  EXPECT_EQ(r[1].item, 29);
  EXPECT_EQ(r[1].timestamp, 1112484676);
  EXPECT_EQ(r[1].line, 3u);
  // auto-detection reaches the same reader
  EXPECT_EQ(read_movielens(d.path(), InputFormat::kAuto).size(), 2u);
}

// A file large enough to be cut into several parse chunks: values and line
// numbers must match a line-by-line expectation, blank lines included.
TEST(Sources, ParallelParseKeepsOrderAndLineNumbers) {
  TempDir d;
  std::string text;
  std::vector<std::tuple<int64_t, int64_t, int64_t, uint64_t>> want;
  uint64_t line = 0;
  for (int k = 0; k < 800000; ++k) {
    ++line;
    if (k % 100000 == 50000) {  // a blank line in the middle
      text += "\n";
      ++line;
    }
    int64_t u = k / 7, i = (k * 31) % 5000, t = 900000000 + k;
    text += std::to_string(u) + "::" + std::to_string(i) + "::4::" + std::to_string(t) + "\n";
    want.emplace_back(u, i, t, line);
  }
  ASSERT_GT(text.size(), 17u << 20);  // three 8 MB parse chunks with 3+ threads
  write_file(d.file("ratings.dat"), text);
  auto r = read_movielens(d.file("ratings.dat"), InputFormat::kMlDat);
  ASSERT_EQ(r.size(), want.size());
  for (size_t k = 0; k < r.size(); ++k) {
    auto [u, i, t, l] = want[k];
    if (r[k].user != u || r[k].item != i || r[k].timestamp != t || r[k].line != l) {
      ADD_FAILURE() << "rating " << k << ": got " << r[k].user << "," << r[k].item << ","
                    << r[k].timestamp << " line " << r[k].line << ", want line " << l;
      break;
    }
  }
  // An error far into the file names its exact line.
  const uint64_t bad_line = std::get<3>(want[555555]);
  size_t at = 0;
  for (uint64_t l = 1; l < bad_line; ++l) at = text.find('\n', at) + 1;
  text.replace(at, text.find('\n', at) - at, "12::x::4::5");
  write_file(d.file("ratings.dat"), text);
  expect_has(error_of([&] { read_movielens(d.file("ratings.dat"), InputFormat::kMlDat); }),
             {d.file("ratings.dat") + ":" + std::to_string(bad_line) + ":", "12::x::4::5"});
}

TEST(Sources, MalformedLinesNameFileLineAndText) {
  TempDir d;
  struct Case {
    std::string name, content;
    InputFormat fmt;
    uint64_t line;
    std::string text, why;
  };
  const std::vector<Case> cases = {
      {"u.data", "1\t2\t3\t4\n1\t2\t3\n", InputFormat::kMl100k, 2, "1\\t2\\t3", "found 3"},
      {"u.data", "1\t2\t3\t4\n\n1\tabc\t3\t4\n", InputFormat::kMl100k, 3, "1\\tabc\\t3\\t4",
       "not an integer"},
      {"u.data", "-1\t2\t3\t4\n", InputFormat::kMl100k, 1, "-1\\t2\\t3\\t4", "negative user id"},
      {"u.data", "1\t2\t3\t4\t5\n", InputFormat::kMl100k, 1, "1\\t2\\t3\\t4\\t5", "more than 4"},
      {"ratings.dat", "1::2::3::4\n1::2::6::4\n", InputFormat::kMlDat, 2, "1::2::6::4",
       "outside [0, 5]"},
      {"ratings.dat", "1::2::3::4\r\n1::2::3::-4\r\n", InputFormat::kMlDat, 2, "1::2::3::-4",
       "negative timestamp"},
      {"ratings.dat", "1:2:3:4\n", InputFormat::kMlDat, 1, "1:2:3:4", "'::'"},
      {"ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n1,,3,4\n", InputFormat::kMlCsv,
       3, "1,,3,4", "empty item id"},
      {"ratings.csv", "user,movie,rating,time\n1,2,3.5,4\n", InputFormat::kMlCsv, 1,
       "user,movie,rating,time", "header"},
      {"ratings.csv", "1,2,x,4\n", InputFormat::kMlCsv, 1, "1,2,x,4", "not a number"},
  };
  for (const auto& c : cases) {
    write_file(d.file(c.name), c.content);
    std::string msg = error_of([&] { read_movielens(d.file(c.name), c.fmt); });
    SCOPED_TRACE(c.content);
    expect_has(msg,
               {d.file(c.name) + ":" + std::to_string(c.line) + ":", "\"" + c.text + "\"", c.why});
  }
  // Long lines are cut in the message.
  write_file(d.file("u.data"), "1\t2\t3\t" + std::string(500, '9') + "x\n");
  std::string msg = error_of([&] { read_movielens(d.file("u.data"), InputFormat::kMl100k); });
  expect_has(msg, {"...", ":1:"});
  EXPECT_LT(msg.size(), 400u);
}

TEST(Sources, EmptyAndMissingFiles) {
  TempDir d;
  write_file(d.file("u.data"), "");
  expect_has(error_of([&] { read_movielens(d.file("u.data"), InputFormat::kMl100k); }),
             {d.file("u.data"), "empty file"});
  std::string resolved;
  expect_has(error_of([&] { detect_format(d.file("u.data"), InputFormat::kAuto, &resolved); }),
             {d.file("u.data"), "empty file"});
  write_file(d.file("ratings.csv"), "userId,movieId,rating,timestamp\n\n");
  expect_has(error_of([&] { read_movielens(d.file("ratings.csv"), InputFormat::kMlCsv); }),
             {d.file("ratings.csv"), "empty file"});
  expect_has(error_of([&] { read_movielens(d.file("nope.dat"), InputFormat::kMlDat); }),
             {d.file("nope.dat"), "No such file or directory"});
  expect_has(error_of([&] { detect_format(d.file("nope"), InputFormat::kAuto, &resolved); }),
             {d.file("nope"), "No such file or directory"});
}

// ------------------------------------------------------------- detection ---

void write_ncf(const std::string& prefix, const std::string& train, const std::string& test,
               const std::string& neg) {
  write_file(prefix + ".train.rating", train);
  write_file(prefix + ".test.rating", test);
  write_file(prefix + ".test.negative", neg);
}

TEST(Sources, DetectsFilesDirectoriesAndPrefixes) {
  TempDir d;
  std::string r;
  write_file(d.file("u.data"), "1\t2\t3\t4\n");
  EXPECT_EQ(detect_format(d.file("u.data"), InputFormat::kAuto, &r), InputFormat::kMl100k);
  EXPECT_EQ(r, d.file("u.data"));
  EXPECT_EQ(detect_format(d.path(), InputFormat::kAuto, &r), InputFormat::kMl100k);
  EXPECT_EQ(r, d.path() + "/u.data");
  EXPECT_EQ(detect_format(d.path(), InputFormat::kMl100k, &r), InputFormat::kMl100k);

  TempDir dat;
  write_file(dat.file("ratings.dat"), "1::2::3::4\n");
  write_file(dat.file("movies.dat"), "1::Toy Story (1995)::Animation\n");
  EXPECT_EQ(detect_format(dat.path(), InputFormat::kAuto, &r), InputFormat::kMlDat);
  EXPECT_EQ(r, dat.path() + "/ratings.dat");
  EXPECT_EQ(detect_format(dat.path(), parse_input_format("ml-10m"), &r), InputFormat::kMlDat);

  TempDir csv;
  write_file(csv.file("ratings.csv"), "userId,movieId,rating,timestamp\n1,2,3.5,4\n");
  EXPECT_EQ(detect_format(csv.path(), InputFormat::kAuto, &r), InputFormat::kMlCsv);
  EXPECT_EQ(r, csv.path() + "/ratings.csv");
  // Decided by the first line when the name says nothing.
  write_file(csv.file("mine.txt"), "1,2,3.5,4\n");
  EXPECT_EQ(detect_format(csv.file("mine.txt"), InputFormat::kAuto, &r), InputFormat::kMlCsv);

  TempDir ncf;
  write_ncf(ncf.file("ml-1m"), "0\t1\t5\t10\n", "0\t2\t5\t11\n", "(0,2)\t3\t4\n");
  EXPECT_EQ(detect_format(ncf.file("ml-1m"), InputFormat::kAuto, &r), InputFormat::kNcfPaper);
  EXPECT_EQ(r, ncf.file("ml-1m"));
  EXPECT_EQ(detect_format(ncf.path(), InputFormat::kAuto, &r), InputFormat::kNcfPaper);
  EXPECT_EQ(r, ncf.path() + "/ml-1m");
  EXPECT_EQ(detect_format(ncf.file("ml-1m.train.rating"), InputFormat::kNcfPaper, &r),
            InputFormat::kNcfPaper);
  EXPECT_EQ(r, ncf.file("ml-1m"));
}

TEST(Sources, DetectionErrors) {
  TempDir d;
  std::string r;
  // --format ml-20m on a '::' file: names the file, the format and the line.
  write_file(d.file("ratings.csv"), "1::2::3::978300760\n");
  expect_has(error_of([&] { detect_format(d.file("ratings.csv"), InputFormat::kMlCsv, &r); }),
             {d.file("ratings.csv"), "ml-20m", "'::'", "1::2::3::978300760"});
  expect_has(error_of([&] { detect_format(d.path(), InputFormat::kMlCsv, &r); }),
             {d.file("ratings.csv"), "ml-20m", "1::2::3::978300760"});
  expect_has(error_of([&] { detect_format(d.file("ratings.csv"), InputFormat::kNcfPaper, &r); }),
             {d.file("ratings.csv"), "ncf-paper"});
  // Unknown content, unknown directory.
  TempDir u;
  write_file(u.file("notes.txt"), "hello world\n");
  expect_has(error_of([&] { detect_format(u.file("notes.txt"), InputFormat::kAuto, &r); }),
             {u.file("notes.txt"), "unknown input format", "hello world"});
  expect_has(error_of([&] { detect_format(u.path(), InputFormat::kAuto, &r); }),
             {u.path(), "unknown input format"});
  // Two inputs in one directory.
  write_file(u.file("u.data"), "1\t2\t3\t4\n");
  write_file(u.file("ratings.dat"), "1::2::3::4\n");
  expect_has(error_of([&] { detect_format(u.path(), InputFormat::kAuto, &r); }),
             {u.path(), "u.data", "ratings.dat"});
  EXPECT_EQ(detect_format(u.path(), InputFormat::kMlDat, &r), InputFormat::kMlDat);
  // An NCF-paper prefix missing one of its files.
  TempDir n;
  write_file(n.file("x.train.rating"), "0\t1\t5\t10\n");
  write_file(n.file("x.test.rating"), "0\t2\t5\t11\n");
  expect_has(error_of([&] { detect_format(n.file("x"), InputFormat::kAuto, &r); }),
             {n.file("x.test.negative"), "No such file or directory"});
  expect_has(error_of([&] { detect_format(n.file("x"), InputFormat::kMlDat, &r); }),
             {n.file("x"), "NCF-paper"});
}

// ------------------------------------------------------ prepare_movielens ---

// Hand-worked example. Raw users 10, 3, 7, 5; user 5 has one rating (dropped).
//   user 3:  items 50 (t=5), 20 (t=9), 50 again (t=7: duplicate), 70 (t=9, later line)
//            → latest is (t=9, later line) = item 70; positives {20, 50, 70}
//   user 7:  items 20 (t=3), 90 (t=4), 20 again (t=8) → latest = 20 (t=8); positives {20, 90}
//   user 10: items 30 (t=1), 20 (t=2) → test 20; positives {20, 30}
//   user 5:  item 99 (t=1) → dropped, so item 99 gets no id
// Items over the kept users, ascending: 20→0, 30→1, 50→2, 70→3, 90→4, and
// filler items 200..214 (rated by user 10 at t=0) → 5..19. With E = 3, user 10
// has exactly 3 items left to be its negatives.
TEST(Sources, PrepareMovielensHandWorked) {
  TempDir in, out;
  std::string text =
      "3::50::4::5\n"    // line 1
      "10::30::4::1\n"   // 2
      "3::20::4::9\n"    // 3
      "7::20::4::3\n"    // 4
      "5::99::4::1\n"    // 5
      "3::50::3::7\n"    // 6 duplicate of (3, 50)
      "7::90::4::4\n"    // 7
      "3::70::4::9\n"    // 8 ties line 3 at t=9: the later line wins
      "7::20::2.5::8\n"  // 9 duplicate of (7, 20), now latest
      "10::20::4::2\n";  // 10
  for (int k = 0; k < 15; ++k) text += "10::" + std::to_string(200 + k) + "::1::0\n";
  write_file(in.file("ratings.dat"), text);
  PrepOptions opt = small_options(3);
  DatasetMeta meta = prepare_movielens(in.path(), InputFormat::kAuto, out.path(), opt);

  // Dense items: 20,30,50,70,90 → 0..4, 200..214 → 5..19.
  EXPECT_EQ(meta.num_users, 3u);
  EXPECT_EQ(meta.num_items, 20u);
  EXPECT_EQ(meta.dropped_users, 1u);
  EXPECT_EQ(meta.num_positives, 3u + 2u + 17u);
  EXPECT_EQ(meta.num_train, meta.num_positives - 3);
  EXPECT_EQ(meta.eval_negatives, 3u);
  EXPECT_EQ(meta.generator["duplicates_removed"].get<uint64_t>(), 2u);
  EXPECT_EQ(meta.generator["ratings"].get<uint64_t>(), 25u);
  EXPECT_EQ(meta.source, "movielens:ratings.dat");
  verify_dataset(out.path());

  std::vector<std::vector<int32_t>> want_pos = {{0, 2, 3}, {0, 4}, {0, 1}};
  for (int32_t i = 5; i < 20; ++i) want_pos[2].push_back(i);
  const std::vector<int32_t> want_test = {3, 0, 0};
  EXPECT_EQ(read_positives(out.path(), meta), want_pos);

  auto eval = read_eval(out.path(), meta);
  ASSERT_EQ(eval.size(), 3u);
  for (uint32_t u = 0; u < 3; ++u) {
    EXPECT_EQ(eval[u].user, u);
    ASSERT_EQ(eval[u].items.size(), 4u);
    EXPECT_EQ(eval[u].items[0], want_test[u]) << "user " << u;
    std::set<int32_t> seen;
    for (size_t j = 1; j < eval[u].items.size(); ++j) {
      int32_t it = eval[u].items[j];
      EXPECT_GE(it, 0);
      EXPECT_LT(it, 20);
      EXPECT_FALSE(std::binary_search(want_pos[u].begin(), want_pos[u].end(), it))
          << "user " << u << " negative " << it << " is a positive";
      EXPECT_TRUE(seen.insert(it).second) << "repeated negative " << it;
    }
    EXPECT_EQ(eval[u].mask, std::vector<uint8_t>(4, 1));
  }
  // User 2 has 17 positives among 20 items: its 3 negatives are the 3 free items.
  EXPECT_EQ(std::set<int32_t>(eval[2].items.begin() + 1, eval[2].items.end()),
            (std::set<int32_t>{2, 3, 4}));

  std::vector<std::pair<int32_t, int32_t>> want_train;
  for (int32_t u = 0; u < 3; ++u)
    for (int32_t i : want_pos[u])
      if (i != want_test[u]) want_train.push_back({u, i});
  std::sort(want_train.begin(), want_train.end());
  EXPECT_EQ(read_train_pairs(out.path(), meta), want_train);
}

// The original ids survive as user_ids.i64 and item_ids.i64: the kept users
// (5 dropped) and items (99 only rated by user 5) in ascending order.
TEST(Sources, PrepareMovielensKeepsTheOriginalIds) {
  TempDir in, out;
  std::string text =
      "3::50::4::5\n10::30::4::1\n3::20::4::9\n7::20::4::3\n5::99::4::1\n"
      "7::90::4::4\n3::70::4::9\n10::20::4::2\n";
  for (int k = 0; k < 15; ++k) text += "10::" + std::to_string(200 + k) + "::1::0\n";
  write_file(in.file("ratings.dat"), text);
  const DatasetMeta meta =
      prepare_movielens(in.path(), InputFormat::kAuto, out.path(), small_options(3));
  ASSERT_EQ(meta.id_maps.size(), 2u);
  EXPECT_EQ(meta.id_maps[0].name, "user_ids.i64");
  EXPECT_EQ(meta.id_maps[1].count, 20u);
  const IdMaps maps = load_id_maps(out.path(), DatasetMeta::load(out.path()));
  EXPECT_FALSE(maps.user.identity());
  ASSERT_EQ(maps.user.size(), 3);
  EXPECT_EQ(maps.user.raw(0), 3);
  EXPECT_EQ(maps.user.raw(1), 7);
  EXPECT_EQ(maps.user.raw(2), 10);
  std::vector<int64_t> items;
  for (int64_t d = 0; d < maps.item.size(); ++d) items.push_back(maps.item.raw(d));
  std::vector<int64_t> want = {20, 30, 50, 70, 90};
  for (int k = 0; k < 15; ++k) want.push_back(200 + k);
  EXPECT_EQ(items, want);
  EXPECT_EQ(maps.item.dense(50), std::optional<int64_t>(2));
  EXPECT_EQ(maps.item.dense(214), std::optional<int64_t>(19));
  EXPECT_EQ(maps.item.dense(99), std::nullopt);
  EXPECT_EQ(maps.user.dense(5), std::nullopt);
  EXPECT_EQ(maps.user.dense(-1), std::nullopt);
  EXPECT_EQ(maps.item.dense(25), std::nullopt);  // a gap between raw ids 20 and 30
  for (int64_t d = 0; d < maps.user.size(); ++d)
    EXPECT_EQ(maps.user.dense(maps.user.raw(d)), std::optional<int64_t>(d)) << "user " << d;
  for (int64_t d = 0; d < maps.item.size(); ++d)
    EXPECT_EQ(maps.item.dense(maps.item.raw(d)), std::optional<int64_t>(d)) << "item " << d;
  EXPECT_EQ(test::read_file(out.file("user_ids.i64")).size(), 3u * 8u);
  verify_dataset(out.path());

  // One byte changed, then a short file: refused by name, by the loader and
  // by --verify.
  const std::string path = out.file("item_ids.i64");
  std::string bytes = test::read_file(path);
  std::string bad = bytes;
  bad[17] ^= 1;
  write_file(path, bad);
  expect_has(error_of([&] { load_id_maps(out.path(), meta); }), {path, "CRC-32C"});
  expect_has(error_of([&] { verify_dataset(out.path()); }), {path, "CRC-32C"});
  write_file(path, bytes.substr(0, 80));
  expect_has(error_of([&] { load_id_maps(out.path(), meta); }),
             {path, "80 bytes but the metadata says 160"});
}

// Sources whose ids are dense already keep none: identity maps.
TEST(Sources, DenseSourcesHaveIdentityMaps) {
  TempDir out;
  SyntheticParams p;
  p.shape = {"custom", 50, 40, 600};
  p.min_per_user = 5;
  const DatasetMeta meta = generate_synthetic(p, out.path(), small_options(5));
  EXPECT_TRUE(meta.id_maps.empty());
  const IdMaps maps = load_id_maps(out.path(), meta);
  EXPECT_TRUE(maps.user.identity() && maps.item.identity());
  EXPECT_EQ(maps.item.size(), 40);
  EXPECT_EQ(maps.user.raw(7), 7);
  EXPECT_EQ(maps.item.dense(39), std::optional<int64_t>(39));
  EXPECT_EQ(maps.item.dense(40), std::nullopt);
}

TEST(Sources, PrepareMovielensErrors) {
  TempDir in, out;
  // Every user has one rating: nothing to split.
  write_file(in.file("u.data"), "1\t10\t4\t100\n2\t11\t4\t100\n3\t10\t4\t100\n");
  PrepOptions opt = small_options(1);
  expect_has(error_of([&] {
               prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.path(), opt);
             }),
             {in.file("u.data"), "no usable user"});
  // Duplicates do not count as interactions.
  write_file(in.file("u.data"), "1\t10\t4\t100\n1\t10\t4\t101\n");
  expect_has(error_of([&] {
               prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.path(), opt);
             }),
             {in.file("u.data"), "no usable user"});
  // Too few items for E negatives: the message names the input and the user.
  write_file(in.file("u.data"), "1\t10\t4\t100\n1\t11\t4\t101\n1\t12\t4\t102\n");
  opt.eval_negatives = 1;
  expect_has(error_of([&] {
               prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.path(), opt);
             }),
             {in.file("u.data"), "user 1 (dense id 0)", "eval negatives"});
  // A NCF-paper input is not MovieLens.
  TempDir n;
  write_ncf(n.file("p"), "0\t1\t5\t10\n", "0\t2\t5\t11\n", "(0,2)\t3\n");
  expect_has(error_of([&] { prepare_movielens(n.file("p"), InputFormat::kAuto, out.path(), opt); }),
             {n.file("p"), "ncf-paper"});
}

// Random ratings checked against a naive std::map reference of the remap, the
// duplicate rule, the latest-interaction split and the drop rule; and the
// eval lists must not depend on the thread count (more users than one block).
TEST(Sources, PrepareMovielensMatchesNaiveReference) {
  TempDir in, out1, out4;
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  std::string text = "userId,movieId,rating,timestamp\n";
  struct Row {
    int64_t u, i, t;
  };
  std::vector<Row> rows;
  for (int k = 0; k < 30000; ++k) {
    int64_t u = 1 + static_cast<int64_t>(next() % 9000) * 3;  // sparse raw ids
    int64_t i = 5 + static_cast<int64_t>(next() % 400) * 7;
    int64_t t = static_cast<int64_t>(next() % 50);  // many timestamp ties
    rows.push_back({u, i, t});
    text += std::to_string(u) + "," + std::to_string(i) + ",3.5," + std::to_string(t) + "\r\n";
  }
  write_file(in.file("ratings.csv"), text);

  // Naive reference.
  std::map<int64_t, std::map<int64_t, int>> items_of;    // user → item → count
  std::map<int64_t, std::pair<int64_t, size_t>> latest;  // user → (t, row) of the latest
  for (size_t k = 0; k < rows.size(); ++k) {
    items_of[rows[k].u][rows[k].i]++;
    auto it = latest.find(rows[k].u);
    if (it == latest.end() || rows[k].t >= it->second.first) latest[rows[k].u] = {rows[k].t, k};
  }
  std::vector<int64_t> kept_users;
  std::set<int64_t> kept_items;
  uint64_t dups = 0, dropped = 0;
  for (const auto& [u, m] : items_of) {
    for (const auto& [i, c] : m) dups += c - 1;
    if (m.size() >= 2) {
      kept_users.push_back(u);
      for (const auto& [i, c] : m) kept_items.insert(i);
    } else {
      ++dropped;
    }
  }
  std::map<int64_t, int32_t> item_id;
  for (int64_t i : kept_items) item_id[i] = static_cast<int32_t>(item_id.size());

  PrepOptions opt = small_options(20);
  opt.record_rows = 64;
  opt.threads = 1;
  DatasetMeta m1 = prepare_movielens(in.file("ratings.csv"), InputFormat::kMlCsv, out1.path(), opt);
  opt.threads = 4;
  DatasetMeta m4 = prepare_movielens(in.file("ratings.csv"), InputFormat::kAuto, out4.path(), opt);
  ASSERT_GT(kept_users.size(), 4096u);  // more than one draw block
  EXPECT_EQ(m1.num_users, kept_users.size());
  EXPECT_EQ(m1.num_items, kept_items.size());
  EXPECT_EQ(m1.dropped_users, dropped);
  EXPECT_EQ(m1.generator["duplicates_removed"].get<uint64_t>(), dups);
  verify_dataset(out1.path());
  verify_dataset(out4.path());

  auto pos = read_positives(out1.path(), m1);
  auto ev1 = read_eval(out1.path(), m1);
  auto ev4 = read_eval(out4.path(), m4);
  ASSERT_EQ(pos.size(), kept_users.size());
  ASSERT_EQ(ev1.size(), kept_users.size());
  for (size_t u = 0; u < kept_users.size(); ++u) {
    const int64_t raw = kept_users[u];
    std::vector<int32_t> want;
    for (const auto& [i, c] : items_of[raw]) want.push_back(item_id[i]);
    ASSERT_EQ(pos[u], want) << "user " << u;
    ASSERT_EQ(ev1[u].items[0], item_id[rows[latest[raw].second].i]) << "user " << u;
    std::set<int32_t> negs(ev1[u].items.begin() + 1, ev1[u].items.end());
    ASSERT_EQ(negs.size(), 20u);
    for (int32_t n : negs) ASSERT_FALSE(std::binary_search(want.begin(), want.end(), n));
    ASSERT_EQ(ev1[u].items, ev4[u].items) << "thread count changed user " << u;
  }
  EXPECT_EQ(read_train_pairs(out1.path(), m1).size(), m1.num_train);
}

// ------------------------------------------------------ prepare_ncf_paper ---

TEST(Sources, PrepareNcfPaperKeepsSplitAndNegatives) {
  TempDir in, out;
  // 3 users, E = 4. User 1's negatives hold its own test item (5) and a repeat
  // (7, 7); item 12 appears only among negatives, so I = 13.
  write_ncf(
      in.file("ml-1m"),
      "0\t1\t5\t100\n0\t3\t4\t101\n1\t0\t3\t100\n1\t2\t3\t102\n1\t2\t3\t103\n2\t4\t1\t100\r\n",
      "0\t2\t5\t200\n1\t5\t4\t201\n2\t0\t3\t202\n",
      "(0,2)\t4\t5\t6\t12\n(1,5)\t5\t7\t7\t8\n(2,0)\t9\t10\t11\t1\n\n");
  PrepOptions opt = small_options(4);
  DatasetMeta meta = prepare_ncf_paper(in.file("ml-1m"), out.path(), opt);
  EXPECT_EQ(meta.num_users, 3u);
  EXPECT_EQ(meta.num_items, 13u);
  EXPECT_EQ(meta.eval_negatives, 4u);
  EXPECT_EQ(meta.num_train, 2u + 2u + 1u);  // (1, 2) listed twice counts once
  EXPECT_EQ(meta.num_positives, 3u + 3u + 2u);
  EXPECT_EQ(meta.source, "ncf-paper:ml-1m");
  verify_dataset(out.path());

  std::vector<std::vector<int32_t>> want_pos = {{1, 2, 3}, {0, 2, 5}, {0, 4}};
  EXPECT_EQ(read_positives(out.path(), meta), want_pos);
  auto eval = read_eval(out.path(), meta);
  ASSERT_EQ(eval.size(), 3u);
  EXPECT_EQ(eval[0].items, (std::vector<int32_t>{2, 4, 5, 6, 12}));
  EXPECT_EQ(eval[1].items, (std::vector<int32_t>{5, 5, 7, 7, 8}));
  EXPECT_EQ(eval[2].items, (std::vector<int32_t>{0, 9, 10, 11, 1}));
  EXPECT_EQ(eval[0].mask, (std::vector<uint8_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(eval[1].mask, (std::vector<uint8_t>{1, 0, 1, 0, 1}));
  EXPECT_EQ(eval[2].mask, (std::vector<uint8_t>{1, 1, 1, 1, 1}));
  std::vector<std::pair<int32_t, int32_t>> want_train = {{0, 1}, {0, 3}, {1, 0}, {1, 2}, {2, 4}};
  EXPECT_EQ(read_train_pairs(out.path(), meta), want_train);
  EXPECT_EQ(meta.generator["negatives_equal_to_test"].get<uint64_t>(), 1u);
  // The paper's ids are dense already: no map files, identity maps.
  EXPECT_TRUE(meta.id_maps.empty());
  EXPECT_FALSE(std::filesystem::exists(out.file("user_ids.i64")));
  const IdMaps maps = load_id_maps(out.path(), meta);
  EXPECT_TRUE(maps.user.identity() && maps.item.identity());
  EXPECT_EQ(maps.user.size(), 3);
  EXPECT_EQ(maps.item.size(), 13);
  EXPECT_EQ(maps.item.raw(12), 12);

  // The directory holding the set and a file of the set work as inputs too.
  TempDir out2;
  EXPECT_EQ(prepare_ncf_paper(in.path(), out2.path(), opt).dataset_id, meta.dataset_id);
}

TEST(Sources, PrepareNcfPaperErrors) {
  TempDir in, out;
  const std::string train = "0\t1\t5\t100\n1\t0\t3\t100\n";
  const std::string test = "0\t2\t5\t200\n1\t5\t4\t201\n";
  const std::string neg = "(0,2)\t4\t5\n(1,5)\t6\t7\n";
  const std::string p = in.file("x");
  PrepOptions opt = small_options(2);
  auto prep = [&] { prepare_ncf_paper(p, out.path(), opt); };

  write_ncf(p, train, test, neg);
  EXPECT_EQ(error_of(prep), "");
  // E from the file against an explicit different count.
  opt.eval_negatives = 99;
  expect_has(error_of(prep), {p + ".test.negative", "2 negatives", "99"});
  opt.eval_negatives = 2;
  // Test users out of order.
  write_ncf(p, train, "1\t5\t4\t201\n0\t2\t5\t200\n", neg);
  expect_has(error_of(prep), {p + ".test.rating:1:", "user 1"});
  // Negatives file disagrees with the test file.
  write_ncf(p, train, test, "(0,2)\t4\t5\n(1,6)\t6\t7\n");
  expect_has(error_of(prep), {p + ".test.negative:2:", "test item 6"});
  write_ncf(p, train, test, "(0,2)\t4\t5\n");
  expect_has(error_of(prep), {p + ".test.negative", "user 1", "missing"});
  write_ncf(p, train, test, "(0,2)\t4\t5\n(1,5)\t6\t7\n(2,5)\t6\t7\n");
  expect_has(error_of(prep), {p + ".test.negative:3:", "user 2"});
  write_ncf(p, train, test, "(0,2)\t4\t5\n(1,5)\t6\n");
  expect_has(error_of(prep), {p + ".test.negative:2:", "1 negatives", "(1,5)\\t6"});
  write_ncf(p, train, test, "0,2\t4\t5\n(1,5)\t6\t7\n");
  expect_has(error_of(prep), {p + ".test.negative:1:", "(user,item)"});
  // Train users outside the test users, and test users without train pairs.
  write_ncf(p, train + "2\t3\t4\t5\n", test, neg);
  expect_has(error_of(prep), {p + ".train.rating:3:", "user 2"});
  write_ncf(p, "0\t1\t5\t100\n", test, neg);
  expect_has(error_of(prep), {p + ".train.rating", "user 1", "no training pairs"});
  // Malformed train line.
  write_ncf(p, "0\t1\t5\t100\n1\t-3\t3\t100\n", test, neg);
  expect_has(error_of(prep), {p + ".train.rating:2:", "1\\t-3\\t3\\t100", "negative item id"});
}

// ------------------------------------------------------- --eval_sampling ---

// Ratings where users differ in how much room they leave for eval negatives:
// 40 users (raw ids 101, 104, ...) over 60 items (raw ids 1 .. 60, each rated
// by someone); user k rates 5 + k items, so user 39 (raw 218) rates 44 and
// leaves 16, and users 36 .. 39 leave fewer than 20. Timestamps are distinct
// per user, the item with the largest raw id rated last (the held-out one).
struct RoomyRatings {
  static constexpr int kUsers = 40, kItems = 60;
  std::vector<std::set<int64_t>> items_of;  // per user (dense = k), raw item ids
  std::string text;                         // u.data
  RoomyRatings() {
    uint64_t x = 99;
    auto next = [&] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return x >> 33;
    };
    items_of.resize(kUsers);
    for (int k = 0; k < kUsers; ++k) {
      std::set<int64_t>& mine = items_of[size_t(k)];
      if (k < kItems / 2) mine = {2 * k + 1, 2 * k + 2};  // every item rated by someone
      while (int(mine.size()) < 5 + k) mine.insert(1 + int64_t(next() % kItems));
      int64_t t = 1000;
      for (int64_t i : mine)
        text += std::to_string(101 + 3 * k) + "\t" + std::to_string(i) + "\t4\t" +
                std::to_string(t++) + "\n";
    }
  }
};

// Mask by the definition: an entry counts unless an earlier entry has its item.
std::vector<uint8_t> naive_mask(const std::vector<int32_t>& items) {
  std::vector<uint8_t> m(items.size(), 1);
  for (size_t j = 0; j < items.size(); ++j)
    for (size_t k = 0; k < j; ++k)
      if (items[k] == items[j]) m[j] = 0;
  return m;
}

// A source location as check.h appends it: "(dataset.cc:301)".
bool has_source_location(const std::string& msg) {
  return std::regex_search(msg, std::regex(R"(\([A-Za-z0-9_]+\.(cc|h|cu|cuh):[0-9]+\))"));
}

TEST(SourcesEvalSampling, WithReplacementIsUniformOverTheItemsLeft) {
  // Both ways of drawing: rejection (most items left) and the list of the
  // items left (few left). Each free item is drawn about equally often over
  // many users; positives never; the same (seed, user) gives the same list.
  const std::vector<int32_t> few = {0, 3, 4, 9, 17, 20, 21, 22, 30, 39};  // 30 of 40 left
  const std::vector<int32_t> many = [] {                                  // 10 of 40 left
    std::vector<int32_t> v;
    for (int32_t i = 0; i < 40; ++i)
      if (i % 4 != 1) v.push_back(i);
    return v;
  }();
  for (const std::vector<int32_t>* pos : {&few, &many}) {
    const uint64_t free_items = 40 - pos->size();
    const uint32_t E = 30;
    const uint64_t users = 2000;
    std::vector<uint64_t> scratch, count(40, 0);
    std::vector<int32_t> out(E), again(E);
    uint64_t lists_with_repeats = 0;
    for (uint64_t u = 0; u < users; ++u) {
      draw_eval_negatives_with_replacement(u, pos->data(), pos->size(), 40, E, 5, scratch,
                                           out.data());
      for (int32_t i : out) {
        ASSERT_TRUE(i >= 0 && i < 40) << i;
        ASSERT_FALSE(std::binary_search(pos->begin(), pos->end(), i)) << "positive " << i;
        ++count[size_t(i)];
      }
      lists_with_repeats += std::set<int32_t>(out.begin(), out.end()).size() < E;
      if (u < 20) {
        draw_eval_negatives_with_replacement(u, pos->data(), pos->size(), 40, E, 5, scratch,
                                             again.data());
        EXPECT_EQ(out, again) << "user " << u;
      }
    }
    for (uint64_t w : scratch) EXPECT_EQ(w, 0u);  // scratch left clean
    // Binomial(users x E, 1 / free) per free item: within 6 standard deviations.
    const double n = double(users * E), p = 1.0 / double(free_items);
    const double sd = std::sqrt(n * p * (1 - p));
    for (int32_t i = 0; i < 40; ++i) {
      if (std::binary_search(pos->begin(), pos->end(), i)) continue;
      EXPECT_NEAR(double(count[size_t(i)]), n * p, 6 * sd) << "item " << i;
    }
    // With replacement, 30 draws from 30 or fewer items nearly always repeat.
    EXPECT_GT(lists_with_repeats, users * 9 / 10);
    // Another seed, other lists.
    std::vector<int32_t> a(E), b(E);
    draw_eval_negatives_with_replacement(3, pos->data(), pos->size(), 40, E, 5, scratch, a.data());
    draw_eval_negatives_with_replacement(3, pos->data(), pos->size(), 40, E, 6, scratch, b.data());
    EXPECT_NE(a, b);
  }
  // No item left: refused.
  std::vector<int32_t> all(40), out(3);
  for (int32_t i = 0; i < 40; ++i) all[size_t(i)] = i;
  std::vector<uint64_t> scratch;
  EXPECT_THROW(draw_eval_negatives_with_replacement(0, all.data(), all.size(), 40, 3, 5, scratch,
                                                    out.data()),
               Error);
}

// The prepared dataset, read raw: every list is the held-out item then E
// negatives outside everything the user rated (the held-out item included),
// and its mask equals the mask by definition; the metadata says how.
TEST(SourcesEvalSampling, WithReplacementListsAvoidPositivesAndMaskEveryRepeat) {
  const RoomyRatings r;
  TempDir in, out;
  write_file(in.file("u.data"), r.text);
  PrepOptions opt = small_options(20);
  opt.eval_sampling = EvalSampling::kWithReplacement;
  const DatasetMeta meta =
      prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.path(), opt);
  EXPECT_EQ(meta.eval_sampling, "with_replacement");
  EXPECT_EQ(DatasetMeta::load(out.path()).eval_sampling, "with_replacement");
  EXPECT_FALSE(meta.eval_masks_given);
  verify_dataset(out.path());
  const auto ev = read_eval(out.path(), meta);
  ASSERT_EQ(ev.size(), size_t(RoomyRatings::kUsers));
  uint64_t masked = 0;
  for (size_t k = 0; k < ev.size(); ++k) {
    const std::set<int64_t>& rated = r.items_of[k];
    ASSERT_EQ(ev[k].items.size(), 21u);
    // Raw item i is dense i - 1 (every item is rated); the held-out item is the latest.
    EXPECT_EQ(ev[k].items[0], int32_t(*rated.rbegin() - 1)) << "user " << k;
    for (size_t j = 1; j < ev[k].items.size(); ++j)
      ASSERT_EQ(rated.count(int64_t(ev[k].items[j]) + 1), 0u)
          << "user " << k << " negative " << j << " is an item it rated";
    ASSERT_EQ(ev[k].mask, naive_mask(ev[k].items)) << "user " << k;
    masked += uint64_t(std::count(ev[k].mask.begin(), ev[k].mask.end(), 0));
  }
  EXPECT_GT(masked, 0u);  // repeats happened, so the mask comparison has teeth
}

// auto is distinct when every user leaves E items, else with replacement; an
// explicit distinct that cannot be met is refused before anything is written,
// naming the user by its id in the file and the flags that would work, as a
// sentence about the input (no source location).
TEST(SourcesEvalSampling, AutoDecidesAndDistinctIsRefusedNamingTheUser) {
  const RoomyRatings r;
  TempDir in, out;
  write_file(in.file("u.data"), r.text);
  PrepOptions opt = small_options(16);  // user 39 leaves exactly 16
  EXPECT_EQ(
      prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.file("a"), opt).eval_sampling,
      "distinct");
  for (const auto& e : read_eval(out.file("a"), DatasetMeta::load(out.file("a"))))
    EXPECT_EQ(std::count(e.mask.begin(), e.mask.end(), 0), 0);
  opt.eval_negatives = 20;
  EXPECT_EQ(
      prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.file("b"), opt).eval_sampling,
      "with_replacement");

  opt.eval_sampling = EvalSampling::kDistinct;
  const std::string msg = error_of(
      [&] { prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.file("c"), opt); });
  // User 39 (raw 218) leaves the fewest; users 36 .. 38 are short too.
  expect_has(msg, {in.file("u.data") + ": user 218 (dense id 39)", "44 positives", "60 items",
                   "leaves 16", "20 distinct eval negatives", "3 other users",
                   "--eval_negatives 16", "--eval_sampling with_replacement"});
  EXPECT_FALSE(has_source_location(msg)) << msg;
  EXPECT_FALSE(std::filesystem::exists(out.file("c")));

  // A user who rated every item leaves nothing to draw, whatever the sampling.
  std::string full;
  for (int i = 1; i <= RoomyRatings::kItems; ++i)
    full += "500\t" + std::to_string(i) + "\t4\t" + std::to_string(i) + "\n";
  write_file(in.file("u.data"), r.text + full);
  for (EvalSampling s : {EvalSampling::kAuto, EvalSampling::kWithReplacement}) {
    opt.eval_sampling = s;
    const std::string none = error_of(
        [&] { prepare_movielens(in.file("u.data"), InputFormat::kMl100k, out.file("d"), opt); });
    expect_has(none, {in.file("u.data") + ": user 500 (dense id 40)", "every one of the 60 items"});
    EXPECT_FALSE(has_source_location(none)) << none;
  }
}

// CSV logs draw as MovieLens files do; their refusal names the user by its
// string id.
TEST(SourcesEvalSampling, CsvLogsDrawAsAsked) {
  const RoomyRatings r;
  TempDir in, out;
  std::string csv = "who,what,when\n";
  {
    std::istringstream lines(r.text);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream f(line);
      std::string u, i, rating, t;
      f >> u >> i >> rating >> t;
      csv += "u" + u + "," + i + "," + t + "\n";
    }
  }
  write_file(in.file("log.csv"), csv);
  CsvOptions c;
  c.columns = "user=who,item=what,timestamp=when";
  PrepOptions opt = small_options(20);
  opt.eval_sampling = EvalSampling::kDistinct;
  const std::string msg = error_of([&] { prepare_csv(in.file("log.csv"), c, out.file("a"), opt); });
  expect_has(msg, {in.file("log.csv"), "user \"u218\"", "--eval_sampling with_replacement"});
  EXPECT_FALSE(has_source_location(msg)) << msg;
  opt.eval_sampling = EvalSampling::kAuto;
  const DatasetMeta m = prepare_csv(in.file("log.csv"), c, out.file("b"), opt);
  EXPECT_EQ(m.eval_sampling, "with_replacement");
  verify_dataset(out.file("b"));
  for (const auto& e : read_eval(out.file("b"), m)) ASSERT_EQ(e.mask, naive_mask(e.items));
}

// The synthetic generator caps each user's interactions so that E distinct
// negatives remain; with replacement they need not, so 1,000 items take 999
// eval negatives beside at least 20 interactions a user: auto draws them with
// replacement, distinct is refused saying so.
TEST(SourcesEvalSampling, SyntheticDrawsWithReplacementWhereDistinctCannotFit) {
  TempDir out;
  PrepOptions opt = small_options(999);
  SyntheticParams p;
  p.shape = {"custom", 300, 1000, 15000};
  opt.eval_sampling = EvalSampling::kDistinct;
  expect_has(error_of([&] { generate_synthetic(p, out.file("c"), opt); }),
             {"999 distinct eval negatives", "--eval_sampling with_replacement"});
  opt.eval_sampling = EvalSampling::kAuto;
  const DatasetMeta s = generate_synthetic(p, out.file("d"), opt);
  EXPECT_EQ(s.eval_sampling, "with_replacement");
  verify_dataset(out.file("d"));
  const auto pos = read_positives(out.file("d"), s);
  uint64_t masked = 0;
  for (const auto& e : read_eval(out.file("d"), s)) {
    ASSERT_EQ(e.mask, naive_mask(e.items));
    for (size_t j = 1; j < e.items.size(); ++j)
      ASSERT_FALSE(std::binary_search(pos[e.user].begin(), pos[e.user].end(), e.items[j]));
    masked += uint64_t(std::count(e.mask.begin(), e.mask.end(), 0));
  }
  EXPECT_GT(masked, 0u);
  // With room for distinct negatives, auto keeps them distinct.
  opt.eval_negatives = 99;
  EXPECT_EQ(generate_synthetic(p, out.file("e"), opt).eval_sampling, "distinct");
}

}  // namespace
}  // namespace ncf
