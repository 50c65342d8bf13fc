// ncf_prep --format csv (data/source_csv.h, data/csv_reader.h): users'
// interaction logs with string ids.
//  - a hand-worked file (quoted ids holding separators, "" pairs and a line
//    break, CRLF, a BOM, ISO and integer timestamps with a tie, a repeated
//    pair, --min_rating, a dropped user) read back against the worked answer,
//    and the same rows under a TAB and a ';' separator, with the header named
//    by position, without a header, and gzip-compressed (byte-identical);
//  - a MovieLens-like file through both the MovieLens reader and the CSV
//    reader: the same users, items, positives and held-out items per id;
//  - thread-count and block-size invariance on a file cut into many chunks,
//    with quoted line breaks and stray quotes near the cuts;
//  - every bad-row kind, stopped with FILE:LINE: column NAME (C), or skipped
//    and counted with --skip_bad_rows; the header rule; the timestamp parser
//    against timegm; the string id maps checked on load.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/check.h"
#include "data/crc32c.h"
#include "data/csv_reader.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/id_map.h"
#include "data/ncf_record.pb.h"
#include "data/source_csv.h"
#include "data/sources.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::TempDir;
using test::write_file;

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

// Every file of a directory, by name.
std::map<std::string, std::string> dir_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out[e.path().filename().string()] = test::read_file(e.path().string());
  return out;
}

void expect_same_dirs(const std::string& a, const std::string& b, const std::string& what) {
  const auto fa = dir_files(a), fb = dir_files(b);
  ASSERT_EQ(fa.size(), fb.size()) << what;
  for (const auto& [name, bytes] : fa) {
    ASSERT_TRUE(fb.count(name)) << what << ": " << name << " missing";
    EXPECT_TRUE(bytes == fb.at(name)) << what << ": " << name << " differs";
  }
}

// What a dataset says about each user, by original ids: its items (sorted),
// its held-out item.
struct ById {
  std::map<std::string, std::set<std::string>> positives;
  std::map<std::string, std::string> held_out;
  std::vector<std::string> users, items;  // by dense id
  bool operator==(const ById& o) const {
    return positives == o.positives && held_out == o.held_out && users == o.users &&
           items == o.items;
  }
};

ById read_by_id(const std::string& dir) {
  const DatasetMeta meta = DatasetMeta::load(dir);
  const IdMaps maps = load_id_maps(dir, meta);
  ById b;
  for (int64_t u = 0; u < maps.user.size(); ++u) b.users.push_back(maps.user.text(u));
  for (int64_t i = 0; i < maps.item.size(); ++i) b.items.push_back(maps.item.text(i));
  PositiveLists pl(dir, meta);
  for (uint64_t u = 0; u < pl.num_users(); ++u)
    for (const int32_t* p = pl.begin(u); p != pl.end(u); ++p)
      b.positives[b.users[u]].insert(b.items[size_t(*p)]);
  const uint32_t shards = static_cast<uint32_t>(meta.shards_of("eval").size());
  for (uint32_t s = 0; s < shards; ++s) {
    ShardCursor cur(dir, meta, "eval", s);
    std::string payload;
    uint64_t off;
    while (cur.next(&payload, &off)) {
      proto::EvalRecord r;
      EXPECT_TRUE(r.ParseFromString(payload));
      int32_t first = 0;
      std::memcpy(&first, r.items().data(), 4);
      b.held_out[b.users[r.user()]] = b.items[size_t(first)];
    }
  }
  return b;
}

PrepOptions options(uint32_t E, int threads = 2) {
  PrepOptions o;
  o.eval_negatives = E;
  o.record_rows = 4;
  o.num_shards = 2;
  o.seed = 7;
  o.threads = threads;
  return o;
}

CsvOptions csv_options(const std::string& columns, char sep = ',') {
  CsvOptions c;
  c.columns = columns;
  c.separator = sep;
  return c;
}

void write_gzip(const std::string& path, const std::vector<std::string>& members) {
  std::string all;
  for (const std::string& m : members) {
    const std::string part = path + ".part";
    gzFile g = gzopen(part.c_str(), "wb");
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(gzwrite(g, m.data(), unsigned(m.size())), int(m.size()));
    ASSERT_EQ(gzclose(g), Z_OK);
    all += test::read_file(part);
    std::filesystem::remove(part);
  }
  write_file(path, all);
}

// --------------------------------------------------------- hand-worked ---
// With --min_rating 3 and --min_interactions 2:
//   "u\n2": apple (t=100), banana (2019-01-01), apple again (t=50, a repeat)
//           → items {apple, banana}, held out banana (its latest)
//   "u,1":  apple (2019-03-04T00:00:00Z) and i"q (1551657600, the same second
//           on a later line) → held out i"q: a tie goes to the later line;
//           date is rated 1 (below 3): skipped
//   zed:    apple rated 2 (skipped), cherry → one item: dropped
// Users in byte order: "u\n2" (0x0a) before "u,1" (0x2c); items apple,
// banana, i"q (cherry only came from the dropped user).
const std::vector<std::vector<std::string>> kHandRows = {
    {"u,1", "apple", "2019-03-04T00:00:00Z", "5"},
    {"u,1", "i\"q", "1551657600", "4"},
    {"u\n2", "apple", "100", "3"},
    {"u\n2", "banana", "2019-01-01", "4.5"},
    {"u\n2", "apple", "50", "5"},
    {"zed", "apple", "10", "2"},
    {"zed", "cherry", "20", "5"},
    {"u,1", "date", "1000", "1"}};

std::string quote_if_needed(const std::string& s, char sep) {
  if (s.find_first_of(std::string("\"\r\n") + sep) == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string hand_file(char sep, bool header, const std::string& eol) {
  std::string text = "\xEF\xBB\xBF";
  if (header) text += std::string("user") + sep + "item" + sep + "when" + sep + "stars" + eol;
  for (const auto& r : kHandRows) {
    for (size_t k = 0; k < r.size(); ++k)
      text += (k ? std::string(1, sep) : "") + quote_if_needed(r[k], sep);
    text += eol;
  }
  return text;
}

TEST(Csv, HandWorkedFile) {
  TempDir in, out;
  const std::string text = hand_file(',', true, "\r\n");
  // The line break inside "u\n2" puts rows on lines 2, 3, 4, 6, 8, 10, 11, 12.
  write_file(in.file("log.csv"), text);
  CsvOptions c = csv_options("user=user,item=item,timestamp=when,rating=stars");
  c.min_rating = 3;
  const DatasetMeta meta = prepare_csv(in.file("log.csv"), c, out.path(), options(1));
  EXPECT_EQ(meta.num_users, 2u);
  EXPECT_EQ(meta.num_items, 3u);
  EXPECT_EQ(meta.dropped_users, 1u);
  EXPECT_EQ(meta.num_positives, 4u);
  EXPECT_EQ(meta.num_train, 2u);
  EXPECT_EQ(meta.source, "csv:log.csv");
  EXPECT_EQ(meta.generator["rows"].get<uint64_t>(), 8u);
  EXPECT_EQ(meta.generator["below_min_rating"].get<uint64_t>(), 2u);
  EXPECT_EQ(meta.generator["interactions"].get<uint64_t>(), 6u);
  EXPECT_EQ(meta.generator["duplicates_removed"].get<uint64_t>(), 1u);
  EXPECT_EQ(meta.generator["raw_users"].get<uint64_t>(), 3u);
  EXPECT_EQ(meta.generator["header"].get<bool>(), true);
  EXPECT_EQ(meta.generator["input_bytes"].get<uint64_t>(), text.size());
  verify_dataset(out.path());

  ASSERT_EQ(meta.id_maps.size(), 2u);
  EXPECT_EQ(meta.id_maps[0].name, "user_ids.str");
  EXPECT_TRUE(meta.id_maps[0].strings);
  const IdMaps maps = load_id_maps(out.path(), DatasetMeta::load(out.path()));
  ASSERT_TRUE(maps.user.strings());
  ASSERT_EQ(maps.user.size(), 2);
  EXPECT_EQ(maps.user.string(0), "u\n2");
  EXPECT_EQ(maps.user.string(1), "u,1");
  ASSERT_EQ(maps.item.size(), 3);
  EXPECT_EQ(maps.item.string(0), "apple");
  EXPECT_EQ(maps.item.string(1), "banana");
  EXPECT_EQ(maps.item.string(2), "i\"q");
  EXPECT_EQ(maps.item.find("i\"q"), std::optional<int64_t>(2));
  EXPECT_EQ(maps.item.find("cherry"), std::nullopt);
  EXPECT_EQ(maps.user.find("zed"), std::nullopt);
  EXPECT_EQ(maps.user.dense(0), std::nullopt) << "string maps take no integer ids";
  // The file layout of dataset.h: offsets[3] then the bytes.
  const std::string users_file = test::read_file(out.file("user_ids.str"));
  std::string want_users(24, '\0');
  want_users[8] = 3;
  want_users[16] = 6;
  want_users += "u\n2u,1";
  EXPECT_EQ(users_file, want_users);

  ById b = read_by_id(out.path());
  EXPECT_EQ(b.positives["u\n2"], (std::set<std::string>{"apple", "banana"}));
  EXPECT_EQ(b.positives["u,1"], (std::set<std::string>{"apple", "i\"q"}));
  EXPECT_EQ(b.held_out["u\n2"], "banana");
  EXPECT_EQ(b.held_out["u,1"], "i\"q") << "a timestamp tie goes to the later line";

  // The same rows: header named by position (auto: "when" is no timestamp),
  // no header, TAB and ';' separators, LF line ends: the same users, items,
  // positives and held-out items.
  struct Variant {
    char sep;
    bool header;
    std::string columns, header_mode;
  };
  for (const Variant& v :
       {Variant{',', true, "user=0,item=1,timestamp=2,rating=3", "auto"},
        Variant{',', false, "user=0,item=1,timestamp=2,rating=3", "auto"},
        Variant{'\t', true, "user=user,item=item,timestamp=when,rating=stars", "yes"},
        Variant{';', false, "user=0,item=1,timestamp=2,rating=3", "no"}}) {
    TempDir vin, vout;
    write_file(vin.file("log.csv"), hand_file(v.sep, v.header, "\n"));
    CsvOptions vc = csv_options(v.columns, v.sep);
    vc.min_rating = 3;
    vc.header = parse_csv_header(v.header_mode);
    const DatasetMeta vm = prepare_csv(vin.file("log.csv"), vc, vout.path(), options(1));
    EXPECT_EQ(vm.generator["header"].get<bool>(), v.header) << "separator " << int(v.sep);
    EXPECT_TRUE(read_by_id(vout.path()) == b)
        << "separator " << int(v.sep) << " header " << v.header;
  }
}

TEST(Csv, GzipGivesTheSameDataset) {
  TempDir in, a, z;
  const std::string text = hand_file(',', true, "\r\n");
  write_file(in.file("log.csv"), text);
  // Two gzip members: readers must take concatenated members as one stream.
  std::filesystem::create_directories(in.file("gz"));
  write_gzip(in.file("gz/log.csv.gz"), {text.substr(0, 40), text.substr(40)});
  CsvOptions c = csv_options("user=user,item=item,timestamp=when,rating=stars");
  c.min_rating = 3;
  prepare_csv(in.file("log.csv"), c, a.path(), options(1));
  const DatasetMeta zm = prepare_csv(in.file("gz/log.csv.gz"), c, z.path(), options(1));
  EXPECT_EQ(zm.source, "csv:log.csv");
  expect_same_dirs(a.path(), z.path(), ".gz vs plain");
  // A truncated .gz is an error naming the file.
  std::string gz = test::read_file(in.file("gz/log.csv.gz"));
  write_file(in.file("cut.csv.gz"), gz.substr(0, gz.size() - 12));
  expect_has(error_of([&] { prepare_csv(in.file("cut.csv.gz"), c, z.path(), options(1)); }),
             {in.file("cut.csv.gz")});
}

// ------------------------------------------------ against MovieLens ---

TEST(Csv, MatchesTheMovielensReaderById) {
  TempDir in, ml, cs;
  std::mt19937_64 gen(11);
  std::string udata, csv = "userId,movieId,rating,timestamp\n";
  for (int k = 0; k < 40000; ++k) {
    const int64_t u = 1 + int64_t(gen() % 3000) * 7, i = 3 + int64_t(gen() % 900) * 5;
    const int64_t t = int64_t(gen() % 40);  // many ties
    const std::string rating = std::to_string(1 + gen() % 5);
    udata += std::to_string(u) + "\t" + std::to_string(i) + "\t" + rating + "\t" +
             std::to_string(t) + "\n";
    csv +=
        std::to_string(u) + "," + std::to_string(i) + "," + rating + "," + std::to_string(t) + "\n";
  }
  write_file(in.file("u.data"), udata);
  write_file(in.file("log.csv"), csv);
  const DatasetMeta mm =
      prepare_movielens(in.file("u.data"), InputFormat::kMl100k, ml.path(), options(20));
  const DatasetMeta cm =
      prepare_csv(in.file("log.csv"), csv_options("user=userId,item=movieId,timestamp=timestamp"),
                  cs.path(), options(20));
  EXPECT_EQ(cm.num_users, mm.num_users);
  EXPECT_EQ(cm.num_items, mm.num_items);
  EXPECT_EQ(cm.num_train, mm.num_train);
  EXPECT_EQ(cm.dropped_users, mm.dropped_users);
  EXPECT_EQ(cm.generator["duplicates_removed"], mm.generator["duplicates_removed"]);
  ById a = read_by_id(ml.path()), b = read_by_id(cs.path());
  EXPECT_TRUE(a.positives == b.positives);
  EXPECT_TRUE(a.held_out == b.held_out);
  // Only the order differs: numeric there, bytewise here ("10" before "9").
  std::sort(a.users.begin(), a.users.end());
  EXPECT_EQ(a.users, b.users);
  EXPECT_NE(read_by_id(ml.path()).users, b.users);
}

// ------------------------------------------------------- invariance ---

// A file of quoted ids with line breaks, "" pairs and separators, stray
// quotes (skipped) among them; chunks of ~1 KiB put cuts everywhere.
std::string messy_file(int rows, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string text = "user,item,ts\n";
  for (int k = 0; k < rows; ++k) {
    const int u = int(gen() % 300), i = int(gen() % 80);
    std::string user = "u" + std::to_string(u);
    if (u % 3 == 0) user = "\"user\n" + std::to_string(u) + "\"";
    if (u % 7 == 0) user = "\"a,\"\"b\"\"\n" + std::to_string(u) + "\"";
    const std::string item =
        i % 4 == 0 ? "\"it,em\r\n" + std::to_string(i) + "\"" : "item" + std::to_string(i);
    text += user + "," + item + "," + std::to_string(gen() % 100) + (k % 5 ? "\n" : "\r\n");
    if (k % 397 == 5) text += "bad\"quote,x,1\n";  // a stray quote
  }
  return text;
}

TEST(Csv, ThreadsAndBlockSizesGiveTheSameBytes) {
  TempDir in;
  write_file(in.file("log.csv"), messy_file(6000, 5));
  CsvOptions c = csv_options("user=user,item=item,timestamp=ts");
  c.skip_bad_rows = true;
  TempDir base;
  const DatasetMeta m0 = prepare_csv(in.file("log.csv"), c, base.path(), options(10, 1));
  EXPECT_EQ(m0.generator["bad_rows_by_reason"]["stray_quote"].get<uint64_t>(), 16u);
  EXPECT_EQ(m0.generator["bad_rows"].get<uint64_t>(), 16u);
  struct Run {
    int threads;
    size_t block;  // 0: the default
  };
  for (const Run& r : {Run{2, 0}, Run{1, 4096}, Run{2, 4096}, Run{3, 4096}, Run{2, 777}}) {
    CsvOptions cr = c;
    if (r.block) cr.block_bytes = r.block;
    TempDir out;
    prepare_csv(in.file("log.csv"), cr, out.path(), options(10, r.threads));
    expect_same_dirs(base.path(), out.path(),
                     "threads " + std::to_string(r.threads) + " block " + std::to_string(r.block));
  }
}

// The chunk split directly: cuts that fall inside quoted fields, a stray
// quote that flips the quote parity for the rest of the block (the guesses
// after it are wrong and must be redone): the records and their lines are
// those of one sequential pass.
TEST(Csv, ChunksStartAtRecordsWhateverTheQuotes) {
  const std::string text = messy_file(3000, 9);
  CsvSyntax syntax;
  syntax.min_chunk_bytes = 64;
  auto records = [&](int threads) {
    std::vector<std::string> out;
    std::vector<std::vector<std::string>> slots(static_cast<size_t>(threads));
    const CsvBlockResult res = scan_csv_block(
        text.data(), 0, text.size(), true, 1, syntax, threads,
        [&](int slot, CsvScanner& sc) {
          auto& s = slots[size_t(slot)];
          s.clear();
          CsvRecord r;
          while (sc.next(&r))
            s.push_back(std::to_string(r.line) + ":" + std::string(r.begin, r.end));
        },
        [&](int slot, uint64_t first_line) {
          for (const std::string& s : slots[size_t(slot)]) {
            const size_t colon = s.find(':');
            out.push_back(std::to_string(first_line + std::stoull(s.substr(0, colon))) +
                          s.substr(colon));
          }
        });
    EXPECT_EQ(res.consumed, text.size());
    return out;
  };
  const std::vector<std::string> one = records(1);
  EXPECT_EQ(one.size(), 3000u + 8u + 1u);  // rows, stray-quote rows, the header
  EXPECT_EQ(one[1].substr(0, 2), "2:");
  for (int threads : {2, 3, 7, 16}) EXPECT_EQ(records(threads), one) << threads << " threads";
}

// ---------------------------------------------------------- bad rows ---

TEST(Csv, EveryBadRowIsNamedOrCounted) {
  TempDir in, out;
  const std::string head = "user,item,when,stars\n", good = "u0,i0,1,5\nu0,i1,2,5\nu1,i0,3,4\n";
  struct Case {
    std::string row, key, message;
  };
  const std::vector<Case> cases = {
      {"u1,i1\n", "missing_column", "column when (2): missing: the row has 2 fields"},
      {"u1,i1,5,3,extra\n", "extra_fields", "column #4 (4): more fields than the first row's 4"},
      {",i1,5,3\n", "empty_id", "column user (0): empty user id"},
      {"u1,\"\",5,3\n", "empty_id", "column item (1): empty item id"},
      {"u1,i1,2019-13-01,3\n", "bad_timestamp", "column when (2): timestamp out of range"},
      {"u1,i1,yesterday,3\n", "bad_timestamp", "column when (2): not a timestamp"},
      {"u1,i1,5,x\n", "bad_rating", "column stars (3): not a decimal number: \"x\""},
      {"u1,i\"1,5,3\n", "stray_quote", "column item (1): stray quote"},
      {"u1,\"i1\"x,5,3\n", "stray_quote", "column item (1): stray quote"},
      {"u1,\"i1,5,3\n", "unterminated_quote", "column item (1): unterminated quote"},
  };
  const CsvOptions stop = csv_options("user=user,item=item,timestamp=when,rating=stars");
  for (const Case& c : cases) {
    // The bad row is line 5, after the header and three good rows.
    write_file(in.file("log.csv"), head + good + c.row + "u1,i2,9,5\n");
    const std::string msg =
        error_of([&] { prepare_csv(in.file("log.csv"), stop, out.path(), options(1)); });
    expect_has(msg, {in.file("log.csv") + ":5: " + c.message});
    CsvOptions skip = stop;
    skip.skip_bad_rows = true;
    const DatasetMeta m = prepare_csv(in.file("log.csv"), skip, out.path(), options(1));
    EXPECT_EQ(m.generator["bad_rows"].get<uint64_t>(), 1u) << c.row;
    EXPECT_EQ(m.generator["bad_rows_by_reason"][c.key].get<uint64_t>(), 1u) << c.row;
    EXPECT_EQ(m.generator["first_bad_lines"], nlohmann::json::array({5})) << c.row;
    // The bad row ends with its line (an unterminated quote too: with the line
    // where the quote opened), so the row after it is read.
    EXPECT_EQ(m.generator["interactions"].get<uint64_t>(), 4u) << c.row;
  }
  // Through the program: non-zero exit, one message naming file, line, column.
  write_file(in.file("log.csv"), head + good + "u1,i1,5,x\nu1,i2,9,5\n");
  auto r = test::run(test::bin("ncf_prep") + " --input " + in.file("log.csv") +
                     " --format csv --columns user=user,item=item,timestamp=when,rating=stars "
                     "--eval_negatives 1 --output " +
                     out.file("cli"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("ncf_prep: error: " + in.file("log.csv") +
                          ":5: column stars (3): not a decimal number"),
            std::string::npos)
      << r.output;
  r = test::run(test::bin("ncf_prep") + " --input " + in.file("log.csv") +
                " --format csv --columns user=user,item=item,timestamp=when,rating=stars "
                "--skip_bad_rows --eval_negatives 1 --progress off --output " +
                out.file("cli"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipped 1 bad rows"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad_rating 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("first at lines 5"), std::string::npos) << r.output;
}

TEST(Csv, AnUnterminatedQuoteEndsAtItsLineAndLongRowsStop) {
  TempDir in, out;
  // The quote opened on line 3 does not close within 200 bytes: the bad row
  // ends with line 3, and the rows after it are read.
  std::string text = "user,item,ts\nu0,a,1\nu0,\"b,2\n";
  for (int k = 0; k < 40; ++k)
    text += "u" + std::to_string(k % 3) + ",i" + std::to_string(k) + ",3\n";
  text += "u9,\"x\"\"y\",4\n";
  write_file(in.file("log.csv"), text);
  CsvOptions c = csv_options("user=user,item=item,timestamp=ts");
  c.max_row_bytes = 200;
  expect_has(error_of([&] { prepare_csv(in.file("log.csv"), c, out.path(), options(1)); }),
             {in.file("log.csv") + ":3: column item (1): unterminated quote (no closing quote "
                                   "within 200 bytes"});
  c.skip_bad_rows = true;
  const DatasetMeta m = prepare_csv(in.file("log.csv"), c, out.path(), options(1));
  EXPECT_EQ(m.generator["bad_rows_by_reason"]["unterminated_quote"].get<uint64_t>(), 1u);
  EXPECT_EQ(m.generator["interactions"].get<uint64_t>(), 42u);
  // An unquoted line longer than the limit is no interaction file: it stops
  // prep even with --skip_bad_rows.
  write_file(in.file("long.csv"), "user,item,ts\nu0,a,1\nu0," + std::string(300, 'x') + ",2\n");
  expect_has(error_of([&] { prepare_csv(in.file("long.csv"), c, out.path(), options(1)); }),
             {in.file("long.csv") + ":3: a row longer than 200 bytes"});
  // A longer limit reads it (here with a second user, so that each has an
  // item left to draw its eval negative from).
  const std::string long_row = "u0," + std::string(300, 'x') + ",2\n";
  write_file(in.file("long.csv"), "user,item,ts\nu0,a,1\n" + long_row + "u1,a,1\nu1,b,2\n");
  c.max_row_bytes = 400;
  EXPECT_EQ(prepare_csv(in.file("long.csv"), c, out.path(), options(1))
                .generator["interactions"]
                .get<uint64_t>(),
            4u);
  // The sizes' range, named by their flags, also where prepare_csv is called directly.
  for (const auto& [flag, v] : {std::pair<std::string, size_t>{"max_row_bytes", 0},
                                {"max_row_bytes", kMaxCsvSizeFlag + 1},
                                {"block_bytes", 0},
                                {"block_bytes", kMaxCsvSizeFlag + 1}}) {
    CsvOptions bad = c;
    (flag == "block_bytes" ? bad.block_bytes : bad.max_row_bytes) = v;
    expect_has(error_of([&] { prepare_csv(in.file("log.csv"), bad, out.path(), options(1)); }),
               {"flag --csv_" + flag + " must be in [1, 1073741824], got " + std::to_string(v)});
  }
  // The program's flags: --csv_max_row_bytes reaches the reader, both need
  // --format csv.
  const std::string prep = test::bin("ncf_prep") + " --input " + in.file("long.csv") +
                           " --format csv --columns user=user,item=item,timestamp=ts " +
                           "--eval_negatives 1 --progress off --output " + out.file("cli");
  auto r = test::run(prep + " --csv_max_row_bytes 200");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(":3: a row longer than 200 bytes"), std::string::npos) << r.output;
  r = test::run(prep + " --csv_max_row_bytes 400 --csv_block_bytes 7");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run(prep + " --csv_block_bytes 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("flag --csv_block_bytes must be > 0, got 0"), std::string::npos)
      << r.output;
  r = test::run(test::bin("ncf_prep") + " --synthetic small --csv_max_row_bytes 400 --output " +
                out.file("syn"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--csv_max_row_bytes applies to --format csv only"), std::string::npos)
      << r.output;
}

// ------------------------------------------------------------ header ---

TEST(Csv, HeaderRuleAndColumnErrors) {
  TempDir in, out;
  const std::string file = in.file("log.csv");
  auto prep = [&](const std::string& columns, const std::string& header) {
    CsvOptions c = csv_options(columns);
    c.header = parse_csv_header(header);
    return prepare_csv(file, c, out.path(), options(1));
  };
  const std::string rows = "a,x,1,5\na,y,2,4\nb,x,3,3\nb,y,4,2\nc,z,5,1\nc,x,6,1\n";
  // auto with typed columns: a header when its typed fields do not parse.
  write_file(file, "u,i,t,r\n" + rows);
  EXPECT_TRUE(prep("user=0,item=1,timestamp=2,rating=3", "auto").generator["header"]);
  write_file(file, rows);
  EXPECT_FALSE(prep("user=0,item=1,timestamp=2,rating=3", "auto").generator["header"]);
  EXPECT_FALSE(prep("user=0,item=1,rating=3", "auto").generator["header"]);
  write_file(file, "u,i,1,r\n" + rows);
  expect_has(error_of([&] { prep("user=0,item=1,timestamp=2,rating=3", "auto"); }),
             {file + ":1: cannot tell whether the first row is a header", "--header yes"});
  // auto with ids only: integer ids on line 2 and not on line 1 make a header.
  write_file(file, "user,item\n1,2\n1,3\n4,2\n4,3\n6,7\n6,8\n");
  EXPECT_TRUE(prep("user=0,item=1", "auto").generator["header"]);
  write_file(file, "user,item\nab,cd\n");
  expect_has(error_of([&] { prep("user=0,item=1", "auto"); }),
             {file + ":1: cannot tell whether the first row is a header", "--header no"});
  // Names need a header; unknown names and positions are named.
  write_file(file, "u,i,t,r\n" + rows);
  expect_has(error_of([&] { prep("user=u,item=i", "no"); }), {"--header no"});
  expect_has(error_of([&] { prep("user=u,item=nope", "auto"); }),
             {"--columns item=nope: no such column in the header (" + file + ":1)"});
  expect_has(error_of([&] { prep("user=0,item=7", "yes"); }), {"--columns item=7", "4 columns"});
  expect_has(error_of([&] { prep("user=0", "yes"); }), {"user and item are required"});
  expect_has(error_of([&] { prep("user=0,item=1,color=2", "yes"); }), {"unknown key 'color'"});
  expect_has(error_of([&] { prep("user=0,item=0", "no"); }), {"the same column"});
  CsvOptions c = csv_options("user=0,item=1");
  c.min_rating = 3;
  expect_has(error_of([&] { prepare_csv(file, c, out.path(), options(1)); }),
             {"--min_rating needs a rating column"});
  // Without a timestamp column the file order is the time: the last row is held out.
  write_file(file, "u,i\na,x\na,z\na,y\nb,y\nb,x\nc,q\nc,w\n");
  prep("user=0,item=1", "yes");
  ById b = read_by_id(out.path());
  EXPECT_EQ(b.held_out["a"], "y");
  EXPECT_EQ(b.held_out["b"], "x");
}

// Fuzzing found (fuzz/regressions/csv/): the header rule reads the first two
// rows, and when a block of the file ended exactly where the first row did it
// stopped at one row, so where the blocks fell (--csv_block_bytes here, 32
// MiB of blank lines first in a real file) decided between a header, a
// request for --header and a too-long row. The rows are read on past a block
// boundary: the outcome is the same whatever the block size.
TEST(Csv, TheHeaderRuleSeesTwoRowsWhereverABlockEnds) {
  TempDir in;
  const std::string file = in.file("log.csv");
  const std::string text = "user,item\n1,2\n1,3\n4,2\n4,3\n6,7\n6,8\n";
  write_file(file, text);
  TempDir base;
  ASSERT_TRUE(
      prepare_csv(file, csv_options("user=0,item=1"), base.path(), options(1)).generator["header"]);
  // Every block size, the first row ("user,item\n", 10 bytes) ending a block
  // at 10 and 5, and the second row ending one at 7 and 14.
  for (size_t block = 1; block <= text.size() + 1; ++block) {
    CsvOptions c = csv_options("user=0,item=1");
    c.block_bytes = block;
    TempDir out;
    std::string e;
    try {
      prepare_csv(file, c, out.path(), options(1));
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_EQ(e, "") << "block " << block;
    if (e.empty()) expect_same_dirs(base.path(), out.path(), "block " + std::to_string(block));
  }
}

TEST(Csv, FlagsAndFormats) {
  EXPECT_EQ(parse_input_format("csv"), InputFormat::kCsv);
  EXPECT_EQ(parse_input_format(format_name(InputFormat::kCsv)), InputFormat::kCsv);
  EXPECT_EQ(parse_csv_separator("\\t"), '\t');
  EXPECT_EQ(parse_csv_separator("tab"), '\t');
  EXPECT_EQ(parse_csv_separator(";"), ';');
  expect_has(error_of([] { parse_csv_separator("\""); }), {"--separator"});
  expect_has(error_of([] { parse_csv_separator(";;"); }), {"one character"});
  // A MovieLens ratings.csv stays MovieLens: csv is named, never detected.
  TempDir d;
  write_file(d.file("ratings.csv"), "userId,movieId,rating,timestamp\n1,2,5,3\n");
  EXPECT_EQ(detect_format(d.file("ratings.csv"), InputFormat::kAuto, nullptr), InputFormat::kMlCsv);
  EXPECT_EQ(detect_format(d.path(), InputFormat::kAuto, nullptr), InputFormat::kMlCsv);
  EXPECT_EQ(detect_format(d.file("ratings.csv"), InputFormat::kCsv, nullptr), InputFormat::kCsv);
  expect_has(error_of([&] { detect_format(d.path(), InputFormat::kCsv, nullptr); }),
             {"not a directory"});
  // The program: csv flags need --format csv; TAB by name.
  write_file(d.file("t.tsv"), "u\ti\tt\na\tx\t1\na\ty\t2\nb\tx\t1\nb\ty\t2\nc\tz\t1\nc\tx\t2\n");
  auto r = test::run(test::bin("ncf_prep") + " --input " + d.file("ratings.csv") +
                     " --columns user=0,item=1 --output " + d.file("o"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--columns applies to --format csv only"), std::string::npos) << r.output;
  r = test::run(test::bin("ncf_prep") + " --input " + d.file("t.tsv") +
                " --format csv --separator tab --columns user=u,item=i,timestamp=t "
                "--eval_negatives 0 --output " +
                d.file("o"));
  EXPECT_NE(r.exit_code, 0) << "--eval_negatives 0 is out of range";
  r = test::run(test::bin("ncf_prep") + " --input " + d.file("t.tsv") +
                " --format csv --separator tab --columns user=u,item=i,timestamp=t "
                "--eval_negatives 1 --progress off --output " +
                d.file("o"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("users 3"), std::string::npos) << r.output;
  r = test::run(test::bin("ncf_prep") + " --verify " + d.file("o"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// ------------------------------------------------------- timestamps ---

TEST(Csv, TimestampsAgainstTimegm) {
  auto micros = [](const std::string& s) {
    int64_t v = 0;
    std::string why;
    EXPECT_TRUE(parse_csv_timestamp(s, &v, &why)) << s << ": " << why;
    return v;
  };
  EXPECT_EQ(micros("0"), 0);
  EXPECT_EQ(micros("1551657600"), int64_t(1551657600) * 1000000);
  EXPECT_EQ(micros(" -5 "), -5000000);
  EXPECT_EQ(micros("1970-01-01"), 0);
  EXPECT_EQ(micros("2019-03-04"), int64_t(1551657600) * 1000000);
  EXPECT_EQ(micros("2019-03-04T05:06:07"), int64_t(1551675967) * 1000000);
  EXPECT_EQ(micros("2019-03-04 05:06:07Z"), int64_t(1551675967) * 1000000);
  EXPECT_EQ(micros("2019-03-04T05:06:07.25Z"), int64_t(1551675967) * 1000000 + 250000);
  EXPECT_EQ(micros("2019-03-04T05:06:07,1234567"), int64_t(1551675967) * 1000000 + 123456);
  EXPECT_EQ(micros("2019-03-04T06:06:07+01:00"), int64_t(1551675967) * 1000000);
  EXPECT_EQ(micros("2019-03-04T00:06:07-0500"), int64_t(1551675967) * 1000000);
  EXPECT_EQ(micros("2019-03-04T07:06:07+02"), int64_t(1551675967) * 1000000);
  EXPECT_EQ(micros("2019-03-04T05:06"), int64_t(1551675960) * 1000000);
  EXPECT_EQ(micros("2000-02-29T23:59:59Z"), int64_t(951868799) * 1000000);
  EXPECT_EQ(micros("1969-12-31T23:00:00Z"), int64_t(-3600) * 1000000);
  EXPECT_EQ(micros("1900-03-01"), int64_t(-2203891200) * 1000000);
  for (const char* bad : {"", "2019-02-29", "2019-13-01", "2019-03-04T24:00:00", "2019-3-4",
                          "2019-03-04T05:06:07+25:00", "yesterday", "12abc", "2019-03-04T",
                          "2019-03-04T05:06:07.", "99999999999999999999"}) {
    int64_t v = 0;
    std::string why;
    EXPECT_FALSE(parse_csv_timestamp(bad, &v, &why)) << "'" << bad << "' parsed as " << v;
    EXPECT_FALSE(why.empty());
  }
  // Every day of 1899..2101 at a random time of day, against libc's timegm.
  std::mt19937 gen(3);
  for (int y = 1899; y <= 2101; ++y)
    for (int m = 1; m <= 12; ++m)
      for (int d = 1; d <= 31; ++d) {
        std::tm tm{};
        tm.tm_year = y - 1900;
        tm.tm_mon = m - 1;
        tm.tm_mday = d;
        tm.tm_hour = int(gen() % 24);
        tm.tm_min = int(gen() % 60);
        tm.tm_sec = int(gen() % 60);
        const time_t want = timegm(&tm);
        if (tm.tm_mday != d) continue;  // no such day: timegm normalized it
        char buf[32];
        std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", y, m, d, tm.tm_hour,
                      tm.tm_min, tm.tm_sec);
        ASSERT_EQ(micros(buf), int64_t(want) * 1000000) << buf;
      }
}

// ------------------------------------------------------------- id maps ---

TEST(Csv, StringMapsAreCheckedOnLoad) {
  TempDir in, out;
  write_file(in.file("log.csv"), "u,i\nb,x\nb,y\na,y\na,z\n");
  const DatasetMeta meta =
      prepare_csv(in.file("log.csv"), csv_options("user=u,item=i"), out.path(), options(1));
  const std::string path = out.file("item_ids.str");
  const std::string bytes = test::read_file(path);
  std::string bad = bytes;
  bad[bad.size() - 1] = 'q';
  write_file(path, bad);
  expect_has(error_of([&] { load_id_maps(out.path(), meta); }), {path, "CRC-32C"});
  expect_has(error_of([&] { verify_dataset(out.path()); }), {path, "CRC-32C"});
  write_file(path, bytes.substr(0, bytes.size() - 1));
  expect_has(error_of([&] { load_id_maps(out.path(), meta); }), {path, "bytes but the metadata"});
  write_file(path, bytes);
  // Offsets that disagree with the bytes (CRC made to match): named too.
  DatasetMeta forged = meta;
  std::string swapped = bytes;
  swapped[8] = 2;  // id 0 would be "xy", id 1 empty
  forged.id_maps[1].crc32c = crc32c(swapped.data(), swapped.size());
  write_file(path, swapped);
  expect_has(error_of([&] { load_id_maps(out.path(), forged); }), {path, "id 1 is empty"});
}

}  // namespace
}  // namespace ncf
