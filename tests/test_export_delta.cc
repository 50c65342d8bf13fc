// ncf_export --since / --apply against the full NumPy export and against an
// independent reading of the checkpoints: the delta applied to the older
// export gives the newer export byte for byte (two checkpoints of one run; two
// datasets of string ids whose dense ids shift; the newer rows in another
// order); the delta holds exactly the rows whose bits differ from the older
// row of the same original id, computed here from the checkpoints' raw rows
// and id map files; a delta short of one changed row is caught; touched-row
// optimizers give small deltas where dense Adam moves nearly every row; the
// docs' NumPy recipe rebuilds the tables; and wrong bases, changed base files, damaged deltas and
// checkpoints that cannot be compared are refused, naming the file or flag and the values, leaving
// no output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/crc32c.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;
using test::bin;
using test::run;
using test::RunResult;
using test::TempDir;

// ---- reading what the programs wrote, without their code ----------------------

// A .npy file: its dtype, its shape and its data bytes (version 1.0 only).
struct Npy {
  std::string descr;
  std::vector<int64_t> shape;
  std::string data;
};

Npy read_npy(const std::string& path) {
  const std::string b = test::read_file(path);
  Npy n;
  if (b.size() < 10 || b.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) != 0) {
    ADD_FAILURE() << path << ": not a .npy 1.0 file";
    return n;
  }
  const size_t header = 10 + size_t(uint8_t(b[8])) + 256 * size_t(uint8_t(b[9]));
  const std::string dict = b.substr(10, header - 10);
  const size_t d = dict.find("'descr': '") + 10;
  n.descr = dict.substr(d, dict.find('\'', d) - d);
  const size_t s = dict.find("'shape': (") + 10;
  std::string dims = dict.substr(s, dict.find(')', s) - s);
  for (size_t at = 0; at < dims.size();) {
    const size_t comma = dims.find(',', at);
    const std::string part = dims.substr(at, comma == std::string::npos ? comma : comma - at);
    if (part.find_first_not_of(' ') != std::string::npos) n.shape.push_back(std::stoll(part));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  n.data = b.substr(header);
  return n;
}

std::vector<int64_t> int64s(const Npy& n) {
  std::vector<int64_t> v(n.data.size() / 8);
  std::memcpy(v.data(), n.data.data(), v.size() * 8);
  return v;
}

// The .npy bytes NumPy's own writer gives (version 1.0, the header padded with
// spaces and a newline to a multiple of 64 bytes).
std::string npy_bytes(const std::string& descr, const std::vector<int64_t>& shape,
                      const std::string& data) {
  std::string dims;
  for (size_t k = 0; k < shape.size(); ++k) dims += (k ? ", " : "") + std::to_string(shape[k]);
  if (shape.size() == 1) dims += ",";
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string b("\x93NUMPY\x01\x00", 8);
  b += char(dict.size() & 0xff);
  b += char(dict.size() >> 8);
  return b + dict + data;
}

// Every file of a directory by name.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> f;
  for (const auto& e : fs::directory_iterator(dir))
    f[e.path().filename().string()] = test::read_file(e.path().string());
  return f;
}

// Both directories hold the same file names with the same bytes.
void expect_same_files(const std::string& got, const std::string& want) {
  const auto a = files_of(got), b = files_of(want);
  std::set<std::string> names_a, names_b;
  for (const auto& [k, v] : a) names_a.insert(k);
  for (const auto& [k, v] : b) names_b.insert(k);
  ASSERT_EQ(names_a, names_b) << got << " against " << want;
  for (const auto& [name, bytes] : b)
    EXPECT_TRUE(a.at(name) == bytes) << name << " of " << got << " differs from " << want << "'s ("
                                     << a.at(name).size() << " and " << bytes.size() << " bytes)";
}

// The original id of each row of a checkpoint's table, as text, from the id map
// file the checkpoint holds: <t>_ids.str (uint64 offsets [n + 1], then the
// bytes), <t>_ids.i64 (int64 [n]), or none (dense ids: the row itself).
std::vector<std::string> row_ids(const std::string& ck, const std::string& t, int64_t rows) {
  std::vector<std::string> ids;
  if (fs::exists(ck + "/" + t + "_ids.str")) {
    const std::string b = test::read_file(ck + "/" + t + "_ids.str");
    std::vector<uint64_t> off(size_t(rows) + 1);
    std::memcpy(off.data(), b.data(), off.size() * 8);
    const std::string bytes = b.substr(off.size() * 8);
    for (int64_t d = 0; d < rows; ++d)
      ids.push_back("s:" + bytes.substr(off[size_t(d)], off[size_t(d) + 1] - off[size_t(d)]));
  } else if (fs::exists(ck + "/" + t + "_ids.i64")) {
    const std::string b = test::read_file(ck + "/" + t + "_ids.i64");
    std::vector<int64_t> v(static_cast<size_t>(rows));
    std::memcpy(v.data(), b.data(), v.size() * 8);
    for (int64_t x : v) ids.push_back("i:" + std::to_string(x));
  } else {
    for (int64_t d = 0; d < rows; ++d) ids.push_back("i:" + std::to_string(d));
  }
  return ids;
}

// What a delta of table `t` must hold, from the two checkpoints' files.
struct ExpectedTable {
  std::vector<int64_t> changed_rows;  // NEWER rows whose id OLDER lacks or whose bits differ
  std::string changed_values;         // their rows' bytes
  std::vector<int64_t> base_row;      // per NEWER row: OLDER's row of the id, or -1
  int64_t changed = 0, added = 0, dropped = 0;
  std::set<std::string> changed_ids;
};

ExpectedTable expected_table(const std::string& older, const std::string& newer,
                             const std::string& t, int D) {
  const std::string a = test::read_file(older + "/" + t + ".rows.f32");
  const std::string b = test::read_file(newer + "/" + t + ".rows.f32");
  const size_t row = size_t(D) * 4;
  const int64_t na = int64_t(a.size() / row), nb = int64_t(b.size() / row);
  const std::vector<std::string> ida = row_ids(older, t, na), idb = row_ids(newer, t, nb);
  std::map<std::string, int64_t> where;
  for (int64_t d = 0; d < na; ++d) where[ida[size_t(d)]] = d;
  ExpectedTable e;
  for (int64_t d = 0; d < nb; ++d) {
    const auto it = where.find(idb[size_t(d)]);
    const int64_t base = it == where.end() ? -1 : it->second;
    e.base_row.push_back(base);
    const bool differs =
        base >= 0 && std::memcmp(a.data() + size_t(base) * row, b.data() + size_t(d) * row, row);
    if (base < 0 || differs) {
      e.changed_rows.push_back(d);
      e.changed_values += b.substr(size_t(d) * row, row);
      e.changed_ids.insert(idb[size_t(d)]);
      (base < 0 ? e.added : e.changed)++;
    }
  }
  e.dropped = na - (nb - e.added);
  return e;
}

// "" when the delta's files for table `t` hold exactly `e`, else what differs.
std::string delta_mismatch(const std::string& delta, const std::string& t, const ExpectedTable& e) {
  std::string why;
  const Npy rows = read_npy(delta + "/" + t + "_changed_rows.npy");
  const Npy values = read_npy(delta + "/" + t + "_changed_values.npy");
  const Npy base = read_npy(delta + "/" + t + "_base_rows.npy");
  const std::vector<int64_t> got_rows = int64s(rows);
  if (rows.descr != "<i8" || values.descr != "<f4" || base.descr != "<i8")
    why += t + ": dtypes " + rows.descr + ", " + values.descr + ", " + base.descr + "; ";
  if (got_rows != e.changed_rows) {
    std::vector<int64_t> missing, extra;
    std::set_difference(e.changed_rows.begin(), e.changed_rows.end(), got_rows.begin(),
                        got_rows.end(), std::back_inserter(missing));
    std::set_difference(got_rows.begin(), got_rows.end(), e.changed_rows.begin(),
                        e.changed_rows.end(), std::back_inserter(extra));
    why += t + ": " + std::to_string(got_rows.size()) + " changed rows, expected " +
           std::to_string(e.changed_rows.size()) + " (" + std::to_string(missing.size()) +
           " missing" + (missing.empty() ? "" : ", the first " + std::to_string(missing[0])) +
           ", " + std::to_string(extra.size()) + " extra); ";
  }
  if (values.data != e.changed_values) why += t + ": the changed values differ; ";
  const nlohmann::json m = nlohmann::json::parse(test::read_file(delta + "/manifest.json"));
  const nlohmann::json& c = m["tables"][t];
  const int64_t prefix = c.value("same_prefix", int64_t(-1));
  std::vector<int64_t> full;
  for (int64_t r = 0; r < prefix; ++r) full.push_back(r);
  for (int64_t b : int64s(base)) full.push_back(b);
  if (full != e.base_row) why += t + ": the base rows differ; ";
  for (int64_t r = 0; r < prefix && r < int64_t(e.base_row.size()); ++r)
    if (e.base_row[size_t(r)] != r) {
      why += t + ": same_prefix " + std::to_string(prefix) + " but row " + std::to_string(r) +
             " is not the base's row " + std::to_string(r) + "; ";
      break;
    }
  if (c.value("changed", int64_t(-1)) != e.changed || c.value("new", int64_t(-1)) != e.added ||
      c.value("dropped", int64_t(-1)) != e.dropped)
    why += t + ": manifest counts " + c.dump() + ", expected changed " + std::to_string(e.changed) +
           ", new " + std::to_string(e.added) + ", dropped " + std::to_string(e.dropped) + "; ";
  return why;
}

// The checkpoint's manifest with the files in `changed` re-listed at their new
// sizes and CRCs (and in its id_maps), sealed again: a checkpoint as ncf_dist
// could have written it.
void reseal_checkpoint(const std::string& ck, const std::set<std::string>& changed,
                       const std::set<std::string>& lineage = {}) {
  const std::string path = ck + "/" + kCheckpointManifestFile;
  nlohmann::json j = nlohmann::json::parse(test::read_file(path));
  auto update = [&](nlohmann::json& f) {
    const std::string name = f["name"];
    if (!changed.count(name)) return;
    const std::string b = test::read_file(ck + "/" + name);
    f["bytes"] = b.size();
    f["crc32c"] = crc32c(b.data(), b.size());
    if (lineage.count(name)) f["order"] = "lineage";
  };
  for (auto& f : j["files"]) update(f);
  if (j.contains("id_maps"))
    for (auto& f : j["id_maps"]) update(f);
  j.erase("crc32c");
  j["crc32c"] = checkpoint_manifest_crc32c(j);
  test::write_file(path, j.dump(1));
}

// The delta's manifest re-listing every file at its size and CRC, sealed again.
void reseal_delta(const std::string& delta, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(test::read_file(delta + "/manifest.json"));
  edit(j);
  for (auto& [name, f] : j["files"].items()) {
    const std::string b = test::read_file(delta + "/" + name);
    f["bytes"] = b.size();
    f["crc32c"] = crc32c(b.data(), b.size());
  }
  j.erase("crc32c");
  j["crc32c"] = checkpoint_manifest_crc32c(j);
  test::write_file(delta + "/manifest.json", j.dump(2) + "\n");
}

// ---- running the programs ------------------------------------------------------

void prep_synthetic(const std::string& out, int users, int items, int interactions, int seed) {
  const RunResult r =
      run(bin("ncf_prep") + " --synthetic custom --users " + std::to_string(users) + " --items " +
          std::to_string(items) + " --interactions " + std::to_string(interactions) +
          " --min_per_user 2 --eval_negatives 5 --seed " + std::to_string(seed) + " --output " +
          out + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// ncf_dist on one CPU rank, the model 4 GMF factors and layers 16,8 unless
// `flags` say otherwise, keeping every checkpoint.
void train(const std::string& data, const std::string& ck, const std::string& flags) {
  const RunResult r =
      run(bin("ncf_dist") + " --device cpu --threads 1 --progress off --no_eval --data_dir " +
          data + " --checkpoint_dir " + ck + " --keep_checkpoints 100 " + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

std::string step_dir(const std::string& ck, int step) { return ck + "/" + checkpoint_name(step); }

RunResult export_npy(const std::string& ck, const std::string& out, const std::string& more = "") {
  return run(bin("ncf_export") + " --checkpoint " + ck + " --format npy --output " + out + more);
}

RunResult apply(const std::string& delta, const std::string& base, const std::string& out) {
  return run(bin("ncf_export") + " --apply " + delta + " --base " + base + " --output " + out);
}

// A refusal: a non-zero exit whose message holds every one of `parts`, and no
// output left at `out` (nor its temporary directory beside it).
void expect_refused(const RunResult& r, const std::vector<std::string>& parts,
                    const std::string& out) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const std::string& p : parts)
    EXPECT_NE(r.output.find(p), std::string::npos) << "expected '" << p << "' in\n" << r.output;
  if (out.empty()) return;
  EXPECT_FALSE(fs::exists(out)) << out << " was left after\n" << r.output;
  const std::string stem = "." + fs::path(out).filename().string() + ".tmp-";
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_NE(e.path().filename().string().rfind(stem, 0), 0u) << e.path() << " was left";
}

// ---- two checkpoints of one run ------------------------------------------------

// The model of the one-run checkpoints: D = 4 + 8 = 12.
constexpr int kD = 12;

class ExportDelta : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    prep_synthetic(dir_->file("data"), 157, 211, 2000, 31);
    // Dense Adam, checkpoints at steps 10 and 20 (and the run's last).
    train(dir_->file("data"), dir_->file("ck"),
          "--batch_size 200 --train_epochs 1 --layers 16,8 --num_factors 4 "
          "--checkpoint_every_steps 10");
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string ck(int step) { return step_dir(dir_->file("ck"), step); }
  static TempDir* dir_;
};
TempDir* ExportDelta::dir_ = nullptr;

TEST_F(ExportDelta, AppliedToTheOlderExportGivesTheNewerExport) {
  TempDir t;
  for (const std::string& more :
       std::vector<std::string>{"", " --data_dir " + dir_->file("data")}) {
    SCOPED_TRACE(more.empty() ? "no --data_dir" : "--data_dir (identity id arrays)");
    fs::remove_all(t.path());
    fs::create_directories(t.path());
    ASSERT_EQ(export_npy(ck(10), t.file("old"), more).exit_code, 0);
    const RunResult full = export_npy(ck(20), t.file("new"), more);
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const RunResult d =
        run(bin("ncf_export") + " --checkpoint " + ck(20) + " --format npy --output " +
            t.file("delta") + " --since " + ck(10) + more);
    ASSERT_EQ(d.exit_code, 0) << d.output;
    EXPECT_NE(
        d.output.find("ncf_export: delta " + ck(20) + " (step 20) since " + ck(10) + " (step 10)"),
        std::string::npos)
        << d.output;
    const RunResult a = apply(t.file("delta"), t.file("old"), t.file("applied"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    expect_same_files(t.file("applied"), t.file("new"));
    EXPECT_EQ(fs::exists(t.file("applied/user_ids.npy")), !more.empty());
    // The delta's own accounting of the full export: every byte of it.
    int64_t full_bytes = 0;
    for (const auto& [name, bytes] : files_of(t.file("new"))) full_bytes += int64_t(bytes.size());
    const nlohmann::json m = nlohmann::json::parse(test::read_file(t.file("delta/manifest.json")));
    EXPECT_EQ(m["full_export_bytes"].get<int64_t>(), full_bytes);
    for (const char* table : {"user", "item"})
      EXPECT_EQ(delta_mismatch(t.file("delta"), table, expected_table(ck(10), ck(20), table, kD)),
                "");
  }
  // Since itself: nothing changed, nothing carried but the tower and manifests.
  const RunResult d = run(bin("ncf_export") + " --checkpoint " + ck(20) +
                          " --format npy --output " + t.file("none") + " --since " + ck(20));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("users 0 changed + 0 new of 157 (0 dropped), items 0 changed + 0 new "
                          "of 211 (0 dropped); 0 of 368 rows"),
            std::string::npos)
      << d.output;
  EXPECT_EQ(read_npy(t.file("none/user_changed_values.npy")).shape, (std::vector<int64_t>{0, kD}));
  ASSERT_EQ(export_npy(ck(20), t.file("plain")).exit_code, 0);
  const RunResult a = apply(t.file("none"), t.file("plain"), t.file("same"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  expect_same_files(t.file("same"), t.file("plain"));
}

// ---- refusals --------------------------------------------------------------------

TEST_F(ExportDelta, AWrongOrChangedBaseIsRefusedNamingTheFileAndBothIdentities) {
  TempDir t;
  ASSERT_EQ(export_npy(ck(10), t.file("e10")).exit_code, 0);
  ASSERT_EQ(export_npy(ck(20), t.file("e20")).exit_code, 0);
  ASSERT_EQ(run(bin("ncf_export") + " --checkpoint " + ck(20) + " --format npy --output " +
                t.file("delta") + " --since " + ck(10))
                .exit_code,
            0);
  // The export of another checkpoint.
  expect_refused(apply(t.file("delta"), t.file("e20"), t.file("out")),
                 {"--base " + t.file("e20"), t.file("e20/manifest.json"), "says step 20",
                  "needs step 10", ck(10), ck(20)},
                 t.file("out"));
  // The right export with one bit of a table changed.
  fs::copy(t.file("e10"), t.file("bad"));
  std::string rows = test::read_file(t.file("bad/item_embeddings.npy"));
  rows[rows.size() - 3] ^= 0x01;
  test::write_file(t.file("bad/item_embeddings.npy"), rows);
  const nlohmann::json m = nlohmann::json::parse(test::read_file(t.file("delta/manifest.json")));
  const uint32_t want = m["base"]["files"]["item_embeddings.npy"]["crc32c"];
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08x", want);
  const uint32_t got = crc32c(rows.data(), rows.size());
  char hex_got[16];
  std::snprintf(hex_got, sizeof hex_got, "0x%08x", got);
  expect_refused(apply(t.file("delta"), t.file("bad"), t.file("out")),
                 {t.file("bad/item_embeddings.npy"), hex, hex_got, "step 10"}, t.file("out"));
  // A base file the apply does not read (the tower comes from the delta) may differ.
  fs::remove_all(t.file("bad"));
  fs::copy(t.file("e10"), t.file("bad"));
  test::write_file(t.file("bad/head_bias.npy"), "x");
  const RunResult a = apply(t.file("delta"), t.file("bad"), t.file("out"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  expect_same_files(t.file("out"), t.file("e20"));
  // An output that exists and holds files is not written into.
  expect_refused(apply(t.file("delta"), t.file("e10"), t.file("e20")),
                 {"--output " + t.file("e20"), "not empty"}, "");
  expect_refused(run(bin("ncf_export") + " --checkpoint " + ck(20) + " --format npy --output " +
                     t.file("e10") + " --since " + ck(10)),
                 {"--output " + t.file("e10"), "not empty"}, "");
}

TEST_F(ExportDelta, ADamagedDeltaIsRefusedNamingTheFile) {
  TempDir t;
  ASSERT_EQ(export_npy(ck(10), t.file("e10")).exit_code, 0);
  ASSERT_EQ(run(bin("ncf_export") + " --checkpoint " + ck(20) + " --format npy --output " +
                t.file("delta") + " --since " + ck(10))
                .exit_code,
            0);
  auto damaged = [&](const std::string& name) {
    fs::remove_all(t.file("d"));
    fs::copy(t.file("delta"), t.file("d"));
    return t.file("d/" + name);
  };
  // One bit of a row, of the tower, of the row map; a truncated file; a removed one.
  for (const char* name : {"user_changed_values.npy", "mlp_0_weight.npy", "item_base_rows.npy",
                           "export_manifest.json"}) {
    const std::string path = damaged(name);
    std::string b = test::read_file(path);
    b[b.size() - 1] ^= 0x20;
    test::write_file(path, b);
    expect_refused(apply(t.file("d"), t.file("e10"), t.file("out")),
                   {"delta " + t.file("d"), "file " + std::string(name), "damaged"}, t.file("out"));
  }
  {
    const std::string path = damaged("item_changed_rows.npy");
    const std::string b = test::read_file(path);
    test::write_file(path, b.substr(0, b.size() - 8));
    expect_refused(apply(t.file("d"), t.file("e10"), t.file("out")),
                   {"file item_changed_rows.npy", "damaged"}, t.file("out"));
    fs::remove(damaged("head_weight.npy"));
    expect_refused(apply(t.file("d"), t.file("e10"), t.file("out")),
                   {"file head_weight.npy is missing"}, t.file("out"));
  }
  // The manifest itself: one digit of a count.
  const std::string path = damaged("manifest.json");
  std::string text = test::read_file(path);
  const size_t at = text.find("\"changed\": ");
  ASSERT_NE(at, std::string::npos);
  char& digit = text[at + 11];
  digit = digit == '9' ? '8' : char(digit + 1);
  test::write_file(path, text);
  expect_refused(apply(t.file("d"), t.file("e10"), t.file("out")),
                 {path, "does not match its crc32c", "damaged"}, t.file("out"));
  // Not a delta at all: an export.
  expect_refused(apply(t.file("e10"), t.file("e10"), t.file("out")),
                 {"--apply " + t.file("e10"), "not a delta"}, t.file("out"));
}

TEST_F(ExportDelta, FlagsAndCheckpointsThatCannotMakeADeltaAreRefused) {
  TempDir t;
  const std::string since =
      bin("ncf_export") + " --checkpoint " + ck(20) + " --output " + t.file("out") + " --since ";
  expect_refused(run(since + ck(10) + " --format onnx"), {"--since", "--format npy", "ONNX"},
                 t.file("out"));
  expect_refused(run(bin("ncf_export") + " --apply " + t.file("d") + " --output " + t.file("out")),
                 {"--apply needs --base"}, t.file("out"));
  expect_refused(run(bin("ncf_export") + " --apply " + t.file("d") + " --base " + t.file("b") +
                     " --checkpoint " + ck(20) + " --output " + t.file("out")),
                 {"--checkpoint does not go with --apply"}, t.file("out"));
  expect_refused(run(bin("ncf_export") + " --checkpoint " + ck(20) + " --format npy --base " +
                     t.file("b") + " --output " + t.file("out")),
                 {"--base goes with --apply only"}, t.file("out"));
  // Another tower: num_factors, then layers.
  for (const auto& [flags, theirs] :
       {std::pair<std::string, std::string>{"--num_factors 6 --layers 16,8",
                                            "num_factors 6 and layers 16,8"},
        {"--num_factors 4 --layers 32,16,8", "num_factors 4 and layers 32,16,8"}}) {
    const std::string other = t.file("other");
    fs::remove_all(other);
    train(dir_->file("data"), other, "--batch_size 200 --max_steps 2 --train_epochs 1 " + flags);
    const std::string older = step_dir(other, 2);
    expect_refused(run(since + older + " --format npy"),
                   {"--since " + older, theirs, ck(20), "num_factors 4 and layers 16,8"},
                   t.file("out"));
  }
}

// Dense ids (synthetic), string ids (a CSV log) and integer ids (MovieLens)
// cannot be matched with one another: the refusal names both checkpoints and kinds.
TEST_F(ExportDelta, CheckpointsWhoseIdsAreOfAnotherKindAreRefused) {
  TempDir t;
  std::string csv = "user,item,time\n", ml = "userId,movieId,rating,timestamp\n";
  std::mt19937 gen(5);
  for (int u = 0; u < 60; ++u)
    for (int k = 0; k < 6; ++k) {
      const int i = int(gen() % 40);
      csv += "u" + std::to_string(u) + ",i" + std::to_string(i) + "," + std::to_string(k) + "\n";
      ml += std::to_string(100 + u) + "," + std::to_string(7 * i) + ",4.0," + std::to_string(k) +
            "\n";
    }
  test::write_file(t.file("log.csv"), csv);
  test::write_file(t.file("ratings.csv"), ml);
  RunResult r = run(bin("ncf_prep") + " --input " + t.file("log.csv") +
                    " --format csv --columns user=user,item=item,timestamp=time "
                    "--eval_negatives 5 --output " +
                    t.file("s") + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_prep") + " --input " + t.file("ratings.csv") +
          " --format ml-20m --eval_negatives 5 --output " + t.file("i") + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* d : {"s", "i"})
    train(t.file(d), t.file(std::string("ck_") + d),
          "--batch_size 100 --max_steps 1 --train_epochs 1 --layers 16,8 --num_factors 4");
  const std::string s = step_dir(t.file("ck_s"), 1), i = step_dir(t.file("ck_i"), 1);
  auto since = [&](const std::string& newer, const std::string& older) {
    return run(bin("ncf_export") + " --checkpoint " + newer + " --format npy --output " +
               t.file("out") + " --since " + older);
  };
  expect_refused(since(s, i), {"--since " + i, "integer ids", s, "string ids"}, t.file("out"));
  expect_refused(since(i, s), {"--since " + s, "string ids", i, "integer ids"}, t.file("out"));
  expect_refused(since(s, ck(10)), {"--since " + ck(10), "dense ids", s, "string ids"},
                 t.file("out"));
  // Each kind with itself is a delta (its ids in the full export and the delta).
  r = since(i, i);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(t.file("out/user_ids.npy")));
}

// ---- two datasets of string ids -------------------------------------------------

// Two CSV logs whose ids overlap: the second drops some users and items of the
// first and adds others, so the same id has another dense row. The newer
// checkpoint is ck2 with the rows a warm start from ck1 would carry (ck1's row
// of each shared id), every fifth shared id then trained on (ck2's own row):
// built here from the two trained checkpoints' files and sealed as ncf_dist
// seals one. A variant holds the same rows and ids in reverse order, as an
// id map in lineage order.
class ExportDeltaIds : public ::testing::Test {
 protected:
  static constexpr int kW = 4 + 8;  // D of these models
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::mt19937 gen(17);
    for (const auto& [name, u0, u1, i0, i1] :
         {std::tuple{"log1.csv", 0, 100, 0, 60}, std::tuple{"log2.csv", 10, 120, 5, 70}}) {
      std::string text = "user,item,time\n";
      for (int u = u0; u < u1; ++u)
        for (int k = 0; k < 6; ++k)
          text += "user " + std::to_string(u) + ",sku-" +
                  std::to_string(i0 + int(gen() % uint32_t(i1 - i0))) + "," + std::to_string(k) +
                  "\n";
      test::write_file(dir_->file(name), text);
    }
    for (const char* n : {"1", "2"}) {
      const RunResult r =
          run(bin("ncf_prep") + " --input " + dir_->file(std::string("log") + n + ".csv") +
              " --format csv --columns user=user,item=item,timestamp=time --eval_negatives 5 "
              "--output " +
              dir_->file(std::string("d") + n) + " --progress off");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      train(dir_->file(std::string("d") + n), dir_->file(std::string("ck") + n),
            "--batch_size 100 --train_epochs 1 --layers 16,8 --num_factors 4 "
            "--embedding_optimizer lazy_adam");
    }
    ck1_ = new std::string(last_checkpoint(dir_->file("ck1")));
    const std::string ck2 = last_checkpoint(dir_->file("ck2"));
    // The warm-started checkpoint.
    const std::string warm = dir_->file("warm");
    fs::copy(ck2, warm);
    for (const std::string t : {"user", "item"}) {
      const std::string a = test::read_file(*ck1_ + "/" + t + ".rows.f32");
      std::string b = test::read_file(warm + "/" + t + ".rows.f32");
      const size_t row = size_t(kW) * 4;
      const auto ida = row_ids(*ck1_, t, int64_t(a.size() / row));
      const auto idb = row_ids(warm, t, int64_t(b.size() / row));
      std::map<std::string, size_t> where;
      for (size_t d = 0; d < ida.size(); ++d) where[ida[d]] = d;
      size_t shared = 0;
      for (size_t d = 0; d < idb.size(); ++d) {
        const auto it = where.find(idb[d]);
        if (it == where.end()) {
          built_[t].insert(idb[d]);  // new: ck2's row
        } else if (shared++ % 5 == 0) {
          built_[t].insert(idb[d]);  // trained since: ck2's row
        } else {
          b.replace(d * row, row, a.substr(it->second * row, row));
        }
      }
      test::write_file(warm + "/" + t + ".rows.f32", b);
    }
    reseal_checkpoint(warm, {"user.rows.f32", "item.rows.f32"});
    warm_ = new std::string(warm);
    // The same checkpoint with its rows and ids in reverse order.
    const std::string rev = dir_->file("reversed");
    fs::copy(warm, rev);
    for (const std::string t : {"user", "item"}) {
      const std::string b = test::read_file(rev + "/" + t + ".rows.f32");
      const size_t row = size_t(kW) * 4, n = b.size() / row;
      std::string rows;
      for (size_t d = n; d-- > 0;) rows += b.substr(d * row, row);
      test::write_file(rev + "/" + t + ".rows.f32", rows);
      const std::string ids = test::read_file(rev + "/" + t + "_ids.str");
      std::vector<uint64_t> off(n + 1), out{0};
      std::memcpy(off.data(), ids.data(), off.size() * 8);
      const std::string bytes = ids.substr(off.size() * 8);
      std::string rbytes;
      for (size_t d = n; d-- > 0;) {
        rbytes += bytes.substr(off[d], off[d + 1] - off[d]);
        out.push_back(rbytes.size());
      }
      std::string file(out.size() * 8, '\0');
      std::memcpy(file.data(), out.data(), file.size());
      test::write_file(rev + "/" + t + "_ids.str", file + rbytes);
    }
    reseal_checkpoint(rev, {"user.rows.f32", "item.rows.f32", "user_ids.str", "item_ids.str"},
                      {"user_ids.str", "item_ids.str"});
    reversed_ = new std::string(rev);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete ck1_;
    delete warm_;
    delete reversed_;
  }
  static std::string last_checkpoint(const std::string& dir) {
    std::string last;
    for (const auto& e : fs::directory_iterator(dir)) last = std::max(last, e.path().string());
    return last;
  }
  static TempDir* dir_;
  static std::string *ck1_, *warm_, *reversed_;
  static std::map<std::string, std::set<std::string>> built_;  // per table: ids given ck2's row
};
TempDir* ExportDeltaIds::dir_ = nullptr;
std::string* ExportDeltaIds::ck1_ = nullptr;
std::string* ExportDeltaIds::warm_ = nullptr;
std::string* ExportDeltaIds::reversed_ = nullptr;
std::map<std::string, std::set<std::string>> ExportDeltaIds::built_;

TEST_F(ExportDeltaIds, RowsAreMatchedByOriginalIdAndTheApplyGivesTheNewerExport) {
  TempDir t;
  ASSERT_EQ(export_npy(*ck1_, t.file("old")).exit_code, 0);
  for (const std::string* newer : {warm_, reversed_}) {
    SCOPED_TRACE(*newer);
    const std::string tag = fs::path(*newer).filename().string();
    const RunResult full = export_npy(*newer, t.file("new_" + tag));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    // The full export has the string ids from the checkpoint's copy, without --data_dir.
    ASSERT_TRUE(fs::exists(t.file("new_" + tag + "/user_ids.npy")));
    const std::string delta = t.file("delta_" + tag);
    const RunResult d = run(bin("ncf_export") + " --checkpoint " + *newer +
                            " --format npy --output " + delta + " --since " + *ck1_);
    ASSERT_EQ(d.exit_code, 0) << d.output;
    std::printf("%s\n", d.output.c_str());
    const RunResult a = apply(delta, t.file("old"), t.file("applied_" + tag));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    expect_same_files(t.file("applied_" + tag), t.file("new_" + tag));
    for (const std::string table : {"user", "item"}) {
      const ExpectedTable e = expected_table(*ck1_, *newer, table, kW);
      EXPECT_EQ(delta_mismatch(delta, table, e), "");
      // The rows the construction gave ck2's values, and no others.
      EXPECT_EQ(e.changed_ids, built_[table]) << table;
      EXPECT_GT(e.dropped, 0) << table;
      EXPECT_GT(e.added, 0) << table;
      EXPECT_GT(e.changed, 0) << table;
    }
  }
  // Matching by dense row instead would have changed other rows: the ids shift.
  const ExpectedTable by_id = expected_table(*ck1_, *warm_, "user", kW);
  int64_t shifted = 0;
  for (size_t r = 0; r < by_id.base_row.size(); ++r) shifted += by_id.base_row[r] != int64_t(r);
  EXPECT_GT(shifted, 50);
}

TEST_F(ExportDeltaIds, ADeltaShortOfOneChangedRowIsCaught) {
  TempDir t;
  ASSERT_EQ(export_npy(*ck1_, t.file("old")).exit_code, 0);
  const std::string delta = t.file("delta");
  ASSERT_EQ(run(bin("ncf_export") + " --checkpoint " + *warm_ + " --format npy --output " + delta +
                " --since " + *ck1_)
                .exit_code,
            0);
  const ExpectedTable e = expected_table(*ck1_, *warm_, "user", kW);
  ASSERT_EQ(delta_mismatch(delta, "user", e), "");
  // Drop the first changed row whose id the base has (the apply would take the
  // base's stale row there), with the counts and the manifest made consistent.
  const Npy rows = read_npy(delta + "/user_changed_rows.npy");
  const Npy values = read_npy(delta + "/user_changed_values.npy");
  std::vector<int64_t> r = int64s(rows);
  size_t k = 0;
  while (k < r.size() && e.base_row[size_t(r[k])] < 0) ++k;
  ASSERT_LT(k, r.size());
  const int64_t dropped_row = r[k];
  r.erase(r.begin() + std::ptrdiff_t(k));
  std::string v = values.data;
  v.erase(k * size_t(kW) * 4, size_t(kW) * 4);
  test::write_file(delta + "/user_changed_rows.npy",
                   npy_bytes("<i8", {int64_t(r.size())},
                             std::string(reinterpret_cast<const char*>(r.data()), r.size() * 8)));
  test::write_file(delta + "/user_changed_values.npy",
                   npy_bytes("<f4", {int64_t(r.size()), kW}, v));
  reseal_delta(delta, [](nlohmann::json& j) {
    j["tables"]["user"]["changed"] = j["tables"]["user"]["changed"].get<int64_t>() - 1;
  });
  // The independent reading finds the row missing...
  const std::string why = delta_mismatch(delta, "user", e);
  EXPECT_NE(why.find("1 missing, the first " + std::to_string(dropped_row)), std::string::npos)
      << why;
  // ...and the apply, whose result is not the newer export's table, refuses.
  expect_refused(apply(delta, t.file("old"), t.file("out")),
                 {"user_embeddings.npy", "the export of " + *warm_, "damaged"}, t.file("out"));
}

// docs/using_a_model.md's NumPy recipe, for a serving system that applies a
// delta itself: each table rebuilt from the base's rows and the delta's, equal
// to the newer export's bit for bit (the rows in reverse order here).
TEST_F(ExportDeltaIds, TheDocsNumpyRecipeRebuildsTheTables) {
  TempDir t;
  ASSERT_EQ(export_npy(*ck1_, t.file("old")).exit_code, 0);
  ASSERT_EQ(export_npy(*reversed_, t.file("new")).exit_code, 0);
  ASSERT_EQ(run(bin("ncf_export") + " --checkpoint " + *reversed_ + " --format npy --output " +
                t.file("delta") + " --since " + *ck1_)
                .exit_code,
            0);
  test::write_file(
      t.file("recipe.py"),
      "import json, sys, numpy as np\n"
      "delta, base, new = sys.argv[1:4]\n"
      "m = json.load(open(f\"{delta}/manifest.json\"))\n"
      "for t in (\"user\", \"item\"):\n"
      "    c = m[\"tables\"][t]\n"
      "    old = np.load(f\"{base}/{t}_embeddings.npy\", mmap_mode=\"r\")\n"
      "    src = np.concatenate([np.arange(c[\"same_prefix\"]),\n"
      "                          np.load(f\"{delta}/{t}_base_rows.npy\")])\n"
      "    rows = np.empty((c[\"rows\"], old.shape[1]), np.float32)\n"
      "    rows[src >= 0] = old[src[src >= 0]]\n"
      "    rows[np.load(f\"{delta}/{t}_changed_rows.npy\")] = \\\n"
      "        np.load(f\"{delta}/{t}_changed_values.npy\")\n"
      "    want = np.load(f\"{new}/{t}_embeddings.npy\")\n"
      "    assert rows.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), t\n"
      "    print(t, len(rows), \"rows equal\")\n");
  const RunResult r = run(test::python3() + " " + t.file("recipe.py") + " " + t.file("delta") +
                          " " + t.file("old") + " " + t.file("new"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("user 110 rows equal"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("item 65 rows equal"), std::string::npos) << r.output;
  // The recipe is not vacuous: without the changed rows it differs.
  std::string recipe = test::read_file(t.file("recipe.py"));
  const std::string assign = "rows[np.load(f\"{delta}/{t}_changed_rows.npy\")] =";
  ASSERT_NE(recipe.find(assign), std::string::npos);
  recipe.replace(recipe.find(assign), assign.size(), "_ =");
  test::write_file(t.file("recipe.py"), recipe);
  const RunResult bad = run(test::python3() + " " + t.file("recipe.py") + " " + t.file("delta") +
                            " " + t.file("old") + " " + t.file("new"));
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("AssertionError: user"), std::string::npos) << bad.output;
}

// ---- optimizers ----------------------------------------------------------------

// One step apart after 400 steps of batch 64 on 1,000 users and 300 items:
// lazy Adam and Adagrad move only the rows the step touched (a few users, the
// items of their positives and negatives); dense Adam moves every row whose
// moments are not zero, which by then is most of them.
TEST(ExportDeltaOptimizers, TouchedRowOptimizersGiveSmallDeltas) {
  TempDir t;
  prep_synthetic(t.file("data"), 1000, 300, 8000, 3);
  std::map<std::string, int64_t> rows;
  for (const char* opt : {"dense_adam", "lazy_adam", "adagrad"}) {
    const std::string ck = t.file(std::string("ck_") + opt);
    train(t.file("data"), ck,
          "--batch_size 64 --train_epochs 1 --max_steps 400 --checkpoint_every_steps 399 "
          "--layers 16,8 --num_factors 4 --embedding_optimizer " +
              std::string(opt));
    const std::string delta = t.file(std::string("delta_") + opt);
    const RunResult d = run(bin("ncf_export") + " --checkpoint " + step_dir(ck, 400) +
                            " --format npy --output " + delta + " --since " + step_dir(ck, 399));
    ASSERT_EQ(d.exit_code, 0) << d.output;
    std::printf("%s: %s", opt, d.output.c_str());
    for (const std::string table : {"user", "item"}) {
      const ExpectedTable e = expected_table(step_dir(ck, 399), step_dir(ck, 400), table, kD);
      EXPECT_EQ(delta_mismatch(delta, table, e), "") << opt;
      rows[opt] += int64_t(e.changed_rows.size());
    }
  }
  EXPECT_GT(rows["dense_adam"], 1300 / 2);
  for (const char* opt : {"lazy_adam", "adagrad"}) {
    EXPECT_GT(rows[opt], 0) << opt;
    EXPECT_LT(rows[opt] * 5, rows["dense_adam"])
        << opt << ": " << rows[opt] << " changed rows, dense_adam " << rows["dense_adam"];
  }
}

}  // namespace
}  // namespace ncf
