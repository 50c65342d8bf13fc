// ncf_export against the checkpoint it reads and against independent
// computations: the ONNX model parsed back (initializers equal the
// checkpoint's arrays, the checker passes, only the documented operators,
// external data where the limit puts it), run by a real ONNX Runtime
// (onnxruntime-node) on 10,000 random pairs and compared with ncf_recommend
// --pairs and with a naive double-precision loop over the checkpoint's files,
// inline and with external data; the NumPy files read back byte for byte and
// used by NumPy to recompute the scores; string ids of a CSV interaction log
// as NumPy bytes (or offsets and bytes), mapped back to rows by NumPy; bad
// input named by path or flag.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "test_util.h"
#include "train/checkpoint.h"

namespace ncf {
namespace {

using test::bin;
using test::csv_rows;
using test::run;
using test::TempDir;

std::vector<float> floats(const std::string& path, size_t skip = 0) {
  const std::string b = test::read_file(path);
  std::vector<float> v((b.size() - skip) / 4);
  std::memcpy(v.data(), b.data() + skip, v.size() * 4);
  return v;
}

// The model the fixture trains: mf_dim 6, layers 32,16,8 (D = 6 + 16 = 22),
// on 157 users and 211 items.
constexpr int kMf = 6, kD = 22, kUsers = 157, kItems = 211;
const std::vector<int> kLayers = {32, 16, 8};

// NeuMF's logit for each (user, item), in double, straight from the
// checkpoint's files and the flat layout written in model/neumf.h (per layer
// W [out×in] then b [out], then the head w [F] and c): no code of the program
// under test.
std::vector<double> reference_logits(const std::string& ck,
                                     const std::vector<std::pair<int, int>>& pairs) {
  const std::vector<float> p = floats(ck + "/tower.f32");
  const std::vector<float> users = floats(ck + "/user.rows.f32");
  const std::vector<float> items = floats(ck + "/item.rows.f32");
  EXPECT_EQ(users.size(), size_t(kUsers * kD));
  EXPECT_EQ(items.size(), size_t(kItems * kD));
  std::vector<double> logits;
  for (const auto& [u, i] : pairs) {
    const float* ur = &users[size_t(u * kD)];
    const float* ir = &items[size_t(i * kD)];
    std::vector<double> x;  // X0 = [u_mlp ; i_mlp]
    for (int k = kMf; k < kD; ++k) x.push_back(ur[k]);
    for (int k = kMf; k < kD; ++k) x.push_back(ir[k]);
    size_t at = 0;
    for (size_t l = 0; l + 1 < kLayers.size(); ++l) {
      const int in = kLayers[l], out = kLayers[l + 1];
      std::vector<double> y(static_cast<size_t>(out));
      for (int o = 0; o < out; ++o) {
        double acc = p[at + size_t(out * in + o)];
        for (int k = 0; k < in; ++k) acc += double(p[at + size_t(o * in + k)]) * x[size_t(k)];
        y[size_t(o)] = std::max(acc, 0.0);
      }
      at += size_t(out * in + out);
      x = y;
    }
    double logit = p[at + size_t(kMf + kLayers.back())];  // c
    for (int k = 0; k < kMf; ++k) logit += double(p[at + size_t(k)]) * ur[k] * ir[k];
    for (int k = 0; k < kLayers.back(); ++k)
      logit += double(p[at + size_t(kMf + k)]) * x[size_t(k)];
    logits.push_back(logit);
    at += size_t(kMf + kLayers.back() + 1);
    EXPECT_EQ(at, p.size() / 3);  // the parameters, then Adam's m and v
  }
  return logits;
}

// Installs onnxruntime-node (once per build tree) and returns its directory.
std::string onnx_runtime_dir() {
  const std::string ort = std::string(NCF_BIN_DIR) + "/../onnx-node";
  auto r = run("bash " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/install.sh " + ort);
  EXPECT_EQ(r.exit_code, 0) << "installing onnxruntime-node:\n" << r.output;
  return ort;
}

// tests/onnx/score_pairs.js: the model's 'user,item,score,logit' rows for a pairs file.
std::vector<std::vector<std::string>> onnx_runtime_scores(const std::string& ort,
                                                          const std::string& model,
                                                          const std::string& pairs,
                                                          const std::string& out) {
  auto r = run("NODE_PATH=" + ort + "/node_modules node " + std::string(NCF_SOURCE_DIR) +
               "/tests/onnx/score_pairs.js " + model + " " + pairs + " " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? csv_rows(test::read_file(out))
                          : std::vector<std::vector<std::string>>{};
}

class Export : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    for (const auto& [name, seed] : {std::pair{"data", 31}, std::pair{"other", 32}}) {
      auto r = run(bin("ncf_prep") +
                   " --synthetic custom --users 157 --items 211 --interactions 5000 "
                   "--eval_negatives 50 --seed " +
                   std::to_string(seed) + " --output " + dir_->file(name) + " --progress off");
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    auto r = run(bin("ncf_dist") + " --device cpu --data_dir " + dir_->file("data") +
                 " --batch_size 1000 --train_epochs 2 --threads 1 --learning_rate 0.01 "
                 "--layers 32,16,8 --num_factors 6 --progress off --checkpoint_dir " +
                 dir_->file("ck") +
                 // The compact table options, so that every export here reads a
                 // checkpoint of BF16 rows with row-wise Adagrad state.
                 " --table_dtype bf16 --embedding_optimizer rowwise_adagrad --embedding_lr 0.05");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& e : std::filesystem::directory_iterator(dir_->file("ck")))
      ck_ = new std::string(e.path().string());
    ASSERT_NE(test::read_file(*ck_ + "/manifest.json").find("\"table_dtype\": \"bf16\""),
              std::string::npos);
    ASSERT_TRUE(std::filesystem::exists(*ck_ + "/user.row_accumulator.f32"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete ck_;
  }
  static std::string ncf_export(const std::string& flags) {
    return bin("ncf_export") + " --checkpoint " + *ck_ + " " + flags;
  }
  static TempDir* dir_;
  static std::string* ck_;
};
TempDir* Export::dir_ = nullptr;
std::string* Export::ck_ = nullptr;

TEST_F(Export, OnnxHoldsTheCheckpointAndPassesTheChecker) {
  TempDir t;
  const std::string path = t.file("m.onnx");
  auto r = run(ncf_export("--format onnx --output " + path));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(path + ".data"));  // a small model stays whole
  onnx::ModelProto model;
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(model.ParseFromIstream(&in));
  EXPECT_NO_THROW(onnx::checker::check_model(model));
  EXPECT_EQ(model.ir_version(), 8);
  ASSERT_EQ(model.opset_import_size(), 1);
  EXPECT_EQ(model.opset_import(0).version(), 17);
  const onnx::GraphProto& g = model.graph();
  ASSERT_EQ(g.input_size(), 2);
  EXPECT_EQ(g.input(0).name(), "user");
  EXPECT_EQ(g.input(1).type().tensor_type().elem_type(), onnx::TensorProto::INT64);
  ASSERT_EQ(g.output_size(), 2);
  EXPECT_EQ(g.output(0).name(), "score");
  EXPECT_EQ(g.output(1).name(), "logit");
  const std::set<std::string> allowed = {"Gather", "Mul",    "Concat", "Gemm",
                                         "Relu",   "MatMul", "Add",    "Sigmoid"};
  for (const auto& n : g.node()) EXPECT_TRUE(allowed.count(n.op_type())) << n.op_type();

  // The initializers against the checkpoint's own files: D = 6 + 16 = 22.
  const std::vector<float> users = floats(*ck_ + "/user.rows.f32");
  const std::vector<float> tower = floats(*ck_ + "/tower.f32");
  const int D = 22;
  std::map<std::string, const onnx::TensorProto*> init;
  for (const auto& t0 : g.initializer()) init[t0.name()] = &t0;
  ASSERT_TRUE(init.count("user_gmf") && init.count("user_mlp") && init.count("mlp_0_weight"));
  const onnx::TensorProto& gmf = *init["user_gmf"];
  ASSERT_EQ(gmf.dims_size(), 2);
  EXPECT_EQ(gmf.dims(0), 157);
  EXPECT_EQ(gmf.dims(1), 6);
  std::vector<float> v(size_t(157 * 6));
  std::memcpy(v.data(), gmf.raw_data().data(), v.size() * 4);
  for (int u = 0; u < 157; ++u)
    for (int k = 0; k < 6; ++k) ASSERT_EQ(v[size_t(u * 6 + k)], users[size_t(u * D + k)]);
  const onnx::TensorProto& mlp = *init["user_mlp"];
  std::memcpy(v.data(), mlp.raw_data().data(), 4);
  EXPECT_EQ(v[0], users[6]);
  // The first tower layer's weight [16×32] opens the flat tower.
  const onnx::TensorProto& w0 = *init["mlp_0_weight"];
  EXPECT_EQ(w0.dims(0), 16);
  EXPECT_EQ(w0.dims(1), 32);
  EXPECT_EQ(0, std::memcmp(w0.raw_data().data(), tower.data(), 16 * 32 * 4));
}

TEST_F(Export, OnnxRuntimeScoresEqualNcfRecommend) {
  TempDir t;
  const std::string ort = onnx_runtime_dir();
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(std::filesystem::exists(bin("ncf_recommend")))
      << bin("ncf_recommend") << " is missing: build the ncf_recommend target";
  std::mt19937 gen(11);
  std::string pairs = "user,item\n";
  for (int k = 0; k < 10000; ++k)
    pairs += std::to_string(gen() % 157) + "," + std::to_string(gen() % 211) + "\n";
  test::write_file(t.file("pairs.csv"), pairs);
  auto r = run(bin("ncf_recommend") + " --device cpu --checkpoint " + *ck_ + " --data_dir " +
               dir_->file("data") + " --threads 1 --pairs " + t.file("pairs.csv") + " --output " +
               t.file("rec.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = csv_rows(test::read_file(t.file("rec.csv")));
  ASSERT_EQ(want.size(), 10001u);
  for (const char* external : {"never", "always"}) {
    const std::string model = t.file(std::string("m_") + external + ".onnx");
    r = run(ncf_export("--format onnx --external_data " + std::string(external) + " --output " +
                       model));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(std::filesystem::exists(model + ".data"), std::string(external) == "always");
    const auto got = onnx_runtime_scores(ort, model, t.file("pairs.csv"), t.file("ort.csv"));
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t k = 1; k < got.size(); ++k) {
      ASSERT_EQ(got[k][0], want[k][0]);
      ASSERT_EQ(got[k][1], want[k][1]);
      const double d = std::fabs(std::stod(got[k][2]) - std::stod(want[k][2]));
      worst = std::max(worst, d);
      ASSERT_LE(d, 1e-5) << external << " pair " << k << ": onnxruntime " << got[k][2]
                         << ", ncf_recommend " << want[k][2];
    }
    std::printf("external data %s: 10000 pairs, max |score difference| %.3g\n", external, worst);
  }
}

TEST_F(Export, OnnxExternalDataPastALoweredLimit) {
  // Table parts: item_mlp 13,504 bytes, user_mlp 10,048, item_gmf 5,064,
  // user_gmf 3,768; the tower 2,716. Under 20,000 bytes inline the two MLP
  // parts must go outside (the largest first) and the GMF parts stay.
  TempDir t;
  const std::string path = t.file("m.onnx");
  auto r = run(ncf_export("--format onnx --external_data_bytes 20000 --output " + path));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NO_THROW(onnx::checker::check_model(path));
  onnx::ModelProto model;
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(model.ParseFromIstream(&in));
  const std::string data = test::read_file(path + ".data");
  const std::vector<float> users = floats(*ck_ + "/user.rows.f32");
  const std::vector<float> items = floats(*ck_ + "/item.rows.f32");
  std::set<std::string> outside;
  for (const auto& init : model.graph().initializer()) {
    if (init.data_location() != onnx::TensorProto::EXTERNAL) {
      EXPECT_EQ(init.external_data_size(), 0) << init.name();
      continue;
    }
    outside.insert(init.name());
    std::map<std::string, std::string> kv;
    for (const auto& e : init.external_data()) kv[e.key()] = e.value();
    EXPECT_EQ(kv["location"], "m.onnx.data");
    const size_t offset = std::stoul(kv["offset"]), length = std::stoul(kv["length"]);
    EXPECT_EQ(offset % 4096, 0u);
    ASSERT_LE(offset + length, data.size());
    // The MLP columns [6, 22) of each row, from the checkpoint's own file.
    const bool user = init.name() == "user_mlp";
    const std::vector<float>& rows = user ? users : items;
    const int n = user ? kUsers : kItems;
    ASSERT_EQ(length, size_t(n * (kD - kMf) * 4)) << init.name();
    std::vector<float> got(size_t(n * (kD - kMf)));
    std::memcpy(got.data(), data.data() + offset, length);
    for (int row = 0; row < n; ++row)
      for (int k = kMf; k < kD; ++k)
        ASSERT_EQ(got[size_t(row * (kD - kMf) + k - kMf)], rows[size_t(row * kD + k)])
            << init.name() << " row " << row << " column " << k;
  }
  EXPECT_EQ(outside, (std::set<std::string>{"item_mlp", "user_mlp"}));

  // Exported again under the default limit: all inline, the stale .data gone.
  r = run(ncf_export("--format onnx --output " + path));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(path + ".data"));
  // A limit the tower alone passes is refused, naming the model's path.
  r = run(ncf_export("--format onnx --external_data_bytes 100 --output " + path));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(path + ": 2716 bytes of initializers"), std::string::npos) << r.output;
}

TEST_F(Export, OnnxRuntimeScoresEqualANaiveLoop) {
  // Needs no ncf_recommend: the reference is reference_logits above, and NumPy
  // (tests/onnx/check_npy.py) is held to the same reference.
  TempDir t;
  const std::string ort = onnx_runtime_dir();
  ASSERT_FALSE(HasFailure());
  std::mt19937 gen(13);
  std::vector<std::pair<int, int>> pairs;
  std::string text = "user,item\n";
  for (int k = 0; k < 10000; ++k) {
    pairs.emplace_back(int(gen() % kUsers), int(gen() % kItems));
    text += std::to_string(pairs.back().first) + "," + std::to_string(pairs.back().second) + "\n";
  }
  test::write_file(t.file("pairs.csv"), text);
  const std::vector<double> want = reference_logits(*ck_, pairs);
  ASSERT_FALSE(HasFailure());
  std::string ref = "user,item,score\n";
  for (size_t k = 0; k < pairs.size(); ++k) {
    char score[32];
    std::snprintf(score, sizeof score, "%.9g", 1 / (1 + std::exp(-want[k])));
    ref +=
        std::to_string(pairs[k].first) + "," + std::to_string(pairs[k].second) + "," + score + "\n";
  }
  test::write_file(t.file("ref.csv"), ref);

  // Inline (the default limit), and the MLP parts in external data.
  for (const std::string flags : {"", "--external_data_bytes 20000"}) {
    const std::string model = t.file(flags.empty() ? "inline.onnx" : "external.onnx");
    auto r = run(ncf_export("--format onnx " + flags + " --output " + model));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(std::filesystem::exists(model + ".data"), !flags.empty());
    const auto got = onnx_runtime_scores(ort, model, t.file("pairs.csv"), t.file("ort.csv"));
    ASSERT_EQ(got.size(), pairs.size() + 1);
    double worst = 0;
    for (size_t k = 0; k < pairs.size(); ++k) {
      const auto& row = got[k + 1];
      ASSERT_EQ(row.size(), 4u);
      ASSERT_EQ(row[0], std::to_string(pairs[k].first));
      ASSERT_EQ(row[1], std::to_string(pairs[k].second));
      const double score = 1 / (1 + std::exp(-want[k]));
      const double d = std::fabs(std::stod(row[2]) - score);
      worst = std::max(worst, d);
      ASSERT_LE(d, 1e-5) << flags << " pair " << k << ": onnxruntime " << row[2] << ", reference "
                         << score;
      ASSERT_LE(std::fabs(std::stod(row[3]) - want[k]), 1e-5 * std::max(1.0, std::fabs(want[k])))
          << flags << " pair " << k << ": onnxruntime logit " << row[3] << ", reference "
          << want[k];
    }
    std::printf("%s: 10000 pairs, max |score - naive loop| %.3g\n",
                flags.empty() ? "inline" : "external data", worst);
  }

  auto r = run(ncf_export("--format npy --output " + t.file("npy")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(test::python3() + " " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/check_npy.py " +
          t.file("npy") + " " + t.file("ref.csv"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(Export, NumpyFilesHoldTheArraysAndRecomputeTheScores) {
  TempDir t;
  auto r = run(
      ncf_export("--format npy --output " + t.file("npy") + " --data_dir " + dir_->file("data")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The header, then the checkpoint's rows byte for byte.
  const std::string npy = test::read_file(t.file("npy/item_embeddings.npy"));
  ASSERT_EQ(npy.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header = 10 + size_t(uint8_t(npy[8])) + 256 * size_t(uint8_t(npy[9]));
  EXPECT_EQ(header % 64, 0u);
  EXPECT_NE(npy.find("'shape': (211, 22)"), std::string::npos) << npy.substr(0, header);
  EXPECT_EQ(floats(t.file("npy/item_embeddings.npy"), header), floats(*ck_ + "/item.rows.f32"));
  // NumPy recomputes NeuMF from the files for pairs ncf_recommend scored.
  std::mt19937 gen(12);
  std::string pairs;
  for (int k = 0; k < 300; ++k)
    pairs += std::to_string(gen() % 157) + "," + std::to_string(gen() % 211) + "\n";
  test::write_file(t.file("pairs.csv"), pairs);
  r = run(bin("ncf_recommend") + " --device cpu --checkpoint " + *ck_ + " --data_dir " +
          dir_->file("data") + " --threads 1 --pairs " + t.file("pairs.csv") + " --output " +
          t.file("rec.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(test::python3() + " " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/check_npy.py " +
          t.file("npy") + " " + t.file("rec.csv"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A changed file is caught: the NumPy recomputation is not vacuous.
  std::string bad = test::read_file(t.file("npy/head_bias.npy"));
  bad[bad.size() - 2] ^= 0x10;
  test::write_file(t.file("npy/head_bias.npy"), bad);
  r = run(test::python3() + " " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/check_npy.py " +
          t.file("npy") + " " + t.file("rec.csv"));
  EXPECT_NE(r.exit_code, 0) << r.output;
}

TEST_F(Export, BadInputIsNamed) {
  TempDir t;
  auto expect_fail = [](const test::RunResult& r, const std::string& text) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(text), std::string::npos) << "expected '" << text << "' in\n"
                                                      << r.output;
  };
  expect_fail(run(bin("ncf_export") + " --checkpoint " + t.file("none") +
                  " --format onnx --output " + t.file("m.onnx")),
              "--checkpoint " + t.file("none") + ": no such checkpoint");
  expect_fail(run(ncf_export("--format tflite --output " + t.file("m"))), "--format");
  expect_fail(run(ncf_export("--format onnx --output " + t.file("no/such/dir/m.onnx"))),
              t.file("no/such/dir/m.onnx"));
  expect_fail(run(ncf_export("--format npy --output " + t.file("n") + " --data_dir " +
                             dir_->file("other"))),
              "belongs to dataset");
  // One flipped byte in a copy of the checkpoint: its CRC names the file.
  std::filesystem::copy(*ck_, t.file("ck"));
  std::string rows = test::read_file(t.file("ck/item.rows.f32"));
  rows[100] ^= 1;
  test::write_file(t.file("ck/item.rows.f32"), rows);
  expect_fail(run(bin("ncf_export") + " --checkpoint " + t.file("ck") + " --format onnx --output " +
                  t.file("m.onnx")),
              "item.rows.f32");
}

// Fuzzing found (fuzz/regressions/trained_model/): ncf_export built the
// model's shape, allocating its parameters and gradients, before holding
// tower.f32 to it, so a sealed manifest with layers 65536,65536 (each width
// within ncf_dist's range) asked for 2 x 17 GB for a file of a few hundred
// bytes. The file's size is checked first: under a 6 GB address-space limit
// the refusal names the file instead of running out of memory.
TEST_F(Export, ATowerLargerThanItsFileIsRefusedBeforeAllocating) {
  TempDir t;
  const std::string copy = t.file("ck");
  std::filesystem::copy(*ck_, copy);
  const std::string manifest = copy + "/" + kCheckpointManifestFile;
  nlohmann::json j = nlohmann::json::parse(test::read_file(manifest));
  j["config"]["layers"] = {65536, 65536};
  j["crc32c"] = checkpoint_manifest_crc32c(j);
  test::write_file(manifest, j.dump(1));
  // A 6 GB bound turns the allocation into a failure; AddressSanitizer, which
  // cannot start under ulimit -v (its shadow memory), has a bound of its own,
  // past which it reports and fails the sanitized run.
#if defined(__SANITIZE_ADDRESS__)
  const std::string bound =
      "ASAN_OPTIONS=\"$ASAN_OPTIONS:max_allocation_size_mb=6000:allocator_may_return_null=0\" ";
#else
  const std::string bound = "ulimit -v 6000000; ";
#endif
  const auto r = run(bound + bin("ncf_export") + " --checkpoint " + copy +
                     " --format npy --output " + t.file("npy"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(copy + ": tower.f32 has "), std::string::npos) << r.output;
}

// A CSV interaction log's string ids: user_ids.npy / item_ids.npy hold them as
// NumPy bytes, row by row as the dataset's maps; NumPy reads them back, maps
// the ids ncf_recommend wrote to rows and recomputes the scores. One very
// long id makes the fixed width wasteful: that map comes as offsets and bytes.
TEST(ExportIds, StringIdsAsNumpyArrays) {
  TempDir t;
  const std::string long_item = "sku-" + std::string(40000, 'L');
  std::string text = "user,item,time\n";
  std::mt19937 gen(4);
  for (int u = 0; u < 120; ++u)
    for (int k = 0; k < 6; ++k) {
      const int i = int(gen() % 40);
      text += "\"u," + std::to_string(u) + "\"," +
              (i == 7 ? long_item : "\"it\"\"em " + std::to_string(i) + "\"") + "," +
              std::to_string(k) + "\n";
    }
  test::write_file(t.file("log.csv"), text);
  auto r = run(bin("ncf_prep") + " --input " + t.file("log.csv") +
               " --format csv --columns user=user,item=item,timestamp=time --eval_negatives 5 "
               "--output " +
               t.file("data") + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_dist") + " --device cpu --data_dir " + t.file("data") +
          " --batch_size 100 --train_epochs 1 --threads 1 --layers 16,8 --num_factors 4 "
          "--progress off --checkpoint_dir " +
          t.file("ck"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_export") + " --checkpoint " + t.file("ck") + " --format npy --output " +
          t.file("npy") + " --data_dir " + t.file("data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(t.file("npy/user_ids.npy")));
  EXPECT_FALSE(std::filesystem::exists(t.file("npy/item_ids.npy")));
  EXPECT_TRUE(std::filesystem::exists(t.file("npy/item_ids_offsets.npy")));
  // The checkpoint carries a copy of the dataset's maps: without --data_dir
  // the export writes the same files, ids included.
  r = run(bin("ncf_export") + " --checkpoint " + t.file("ck") + " --format npy --output " +
          t.file("npy_ck"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(t.file("npy"))) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(test::read_file(t.file("npy_ck/" + name)), test::read_file(e.path().string()))
        << name;
    ++files;
  }
  EXPECT_EQ(files, size_t(std::distance(std::filesystem::directory_iterator(t.file("npy_ck")),
                                        std::filesystem::directory_iterator())));
  // NumPy's view of the ids equals the dataset's maps, in row order.
  r = run(test::python3() +
          " -c 'import numpy as np, sys; d = sys.argv[1]; "
          "u = np.load(d + \"/user_ids.npy\"); assert u.dtype.kind == \"S\", u.dtype; "
          "o = np.load(d + \"/item_ids_offsets.npy\"); b = np.load(d + \"/item_ids_bytes.npy\"); "
          "items = [b[o[k]:o[k + 1]].tobytes() for k in range(len(o) - 1)]; "
          "print(len(u), u[0].decode(), u[-1].decode(), len(items), items[0].decode(), "
          "max(len(x) for x in items))' " +
          t.file("npy"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Users "u,0" .. "u,119" in byte order: "u,0", "u,1", "u,10", ... "u,99".
  EXPECT_EQ(r.output, "120 u,0 u,99 40 it\"em 0 40004\n");
  // Pairs by string id, scored by ncf_recommend, recomputed by NumPy.
  std::string pairs = "user,item\n";
  for (int k = 0; k < 200; ++k) {
    const int i = int(gen() % 40);
    pairs += "\"u," + std::to_string(gen() % 120) + "\"," +
             (i == 7 ? long_item : "\"it\"\"em " + std::to_string(i) + "\"") + "\n";
  }
  test::write_file(t.file("pairs.csv"), pairs);
  r = run(bin("ncf_recommend") + " --device cpu --checkpoint " + t.file("ck") + " --data_dir " +
          t.file("data") + " --threads 1 --pairs " + t.file("pairs.csv") + " --output " +
          t.file("rec.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(test::python3() + " " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/check_npy.py " +
          t.file("npy") + " " + t.file("rec.csv"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("check_npy: 200 pairs"), std::string::npos) << r.output;
}

// ncf_export's peak resident memory, measured by the kernel (getrusage of the
// finished child, through Python's resource module), with a user table of
// 200,000 rows x D = 64 + 256 floats, 256,000,000 bytes: the tables are
// streamed from the checkpoint in 64 MiB pieces, so neither NumPy nor ONNX
// with external data holds a table (holding the user table alone would break
// both bounds). Measured here, 2,000 users -> 200,000: npy 13 -> 74 MiB and
// ONNX 17 -> 126 MiB in the CPU build; 226 -> 226 and 230 -> 278 MiB in the
// CUDA build, whose libraries alone take 226 MiB.
TEST(ExportMemory, TablesAreStreamedFromTheCheckpointNotHeld) {
  TempDir t;
  // The same model shape on 200,000 users and on 2,000: the small export's
  // peak is the program's own (its libraries, a CUDA build's included), and
  // the large one may exceed it by the streaming buffers, not by a table.
  for (const auto& [name, users, batch] :
       {std::tuple{"big", 200000, 65536}, std::tuple{"small", 2000, 1000}}) {
    const std::string data = t.file(std::string(name) + "-data");
    auto r =
        run(bin("ncf_prep") + " --synthetic custom --users " + std::to_string(users) +
            " --items 300 --interactions " + std::to_string(2 * users) +
            " --min_per_user 2 --eval_negatives 1 --seed 5 --output " + data + " --progress off");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run(bin("ncf_dist") + " --device cpu --data_dir " + data + " --batch_size " +
            std::to_string(batch) +
            " --max_steps 1 --train_epochs 1 --no_eval --threads 2 --num_factors 64 "
            "--layers 512,8 --embedding_optimizer sgd --progress off --checkpoint_dir " +
            t.file(name));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const int64_t table_bytes = int64_t{200000} * 320 * 4;
  // Runs an ncf_export of checkpoint `ck` and returns its peak RSS in bytes.
  // Under AddressSanitizer (scripts/sanitize.sh) freed blocks wait in a 256 MiB
  // quarantine before their pages can be reused, so a program that streams through
  // buffers peaks at up to that much more; without the quarantine the bounds hold.
#if defined(__SANITIZE_ADDRESS__)
  const std::string allocator = "ASAN_OPTIONS=\"$ASAN_OPTIONS:quarantine_size_mb=0\" ";
#else
  const std::string allocator;
#endif
  auto peak = [&](const std::string& ck, const std::string& flags) -> int64_t {
    const std::string report = t.file("maxrss");
    auto e = run(allocator + test::python3() +
                 " -c 'import resource, subprocess, sys; "
                 "c = subprocess.run(sys.argv[2:]).returncode; "
                 "open(sys.argv[1], \"w\").write(str(resource.getrusage("
                 "resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(c)' " +
                 report + " " + bin("ncf_export") + " --checkpoint " + t.file(ck) + " " + flags);
    EXPECT_EQ(e.exit_code, 0) << e.output;
    return e.exit_code == 0 ? std::stoll(test::read_file(report)) * 1024 : -1;
  };
  const int64_t npy_base = peak("small", "--format npy --output " + t.file("small-npy"));
  const std::string npy = t.file("npy");
  const int64_t npy_peak = peak("big", "--format npy --output " + npy);
  EXPECT_GT(npy_base, 0);
  EXPECT_LT(npy_peak - npy_base, table_bytes / 2) << "ncf_export --format npy: peak " << npy_peak
                                                  << " bytes, " << npy_base << " for 2,000 users";
  // The streamed file is the checkpoint's rows after the header, byte for byte.
  std::ifstream ck(
      std::filesystem::directory_iterator(t.file("big"))->path().string() + "/user.rows.f32",
      std::ios::binary);
  std::ifstream out(npy + "/user_embeddings.npy", std::ios::binary);
  char head[10];
  ASSERT_TRUE(out.read(head, 10));
  const int64_t header = 10 + int64_t(uint8_t(head[8])) + 256 * int64_t(uint8_t(head[9]));
  ASSERT_EQ(int64_t(std::filesystem::file_size(npy + "/user_embeddings.npy")),
            header + table_bytes);
  out.seekg(header);
  std::vector<char> x(size_t(1) << 20), y(size_t(1) << 20);
  for (int64_t at = 0; at < table_bytes; at += int64_t(x.size())) {
    const auto n = std::streamsize(std::min<int64_t>(int64_t(x.size()), table_bytes - at));
    ASSERT_TRUE(ck.read(x.data(), n)) << "checkpoint at byte " << at;
    ASSERT_TRUE(out.read(y.data(), n)) << "npy at byte " << header + at;
    ASSERT_EQ(std::memcmp(x.data(), y.data(), size_t(n)), 0) << "rows at byte " << at;
  }
  const std::string onnx = t.file("m.onnx");
  const int64_t onnx_base =
      peak("small", "--format onnx --external_data always --output " + t.file("small.onnx"));
  const int64_t onnx_peak = peak("big", "--format onnx --external_data always --output " + onnx);
  EXPECT_GT(onnx_base, 0);
  EXPECT_LT(onnx_peak - onnx_base, table_bytes * 3 / 4)
      << "ncf_export --format onnx --external_data always: peak " << onnx_peak << " bytes, "
      << onnx_base << " for 2,000 users";
  // The four table parts outside, each page-aligned: the users' 256,000,000
  // bytes and the items' 384,000.
  EXPECT_GE(int64_t(std::filesystem::file_size(onnx + ".data")), table_bytes + 300 * 320 * 4);
}

}  // namespace
}  // namespace ncf
