// ncf_export against the checkpoint it reads and against independent
// computations: the ONNX model parsed back (initializers equal the
// checkpoint's arrays, the checker passes, only the documented operators),
// run by a real ONNX Runtime (onnxruntime-node) on 10,000 random pairs and
// compared with ncf_recommend --pairs, inline and with external data; the
// NumPy files read back byte for byte and used by NumPy to recompute the
// scores; bad input named by path or flag.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "test_util.h"

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
    auto r = run(bin("ncf_dist") + " --data_dir " + dir_->file("data") +
                 " --batch_size 1000 --train_epochs 2 --threads 1 --learning_rate 0.01 "
                 "--layers 32,16,8 --num_factors 6 --progress off --checkpoint_dir " +
                 dir_->file("ck"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& e : std::filesystem::directory_iterator(dir_->file("ck")))
      ck_ = new std::string(e.path().string());
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
  const std::string ort = std::string(NCF_BIN_DIR) + "/../onnx-node";
  auto r = run("bash " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/install.sh " + ort);
  ASSERT_EQ(r.exit_code, 0) << "installing onnxruntime-node:\n" << r.output;
  std::mt19937 gen(11);
  std::string pairs = "user,item\n";
  for (int k = 0; k < 10000; ++k)
    pairs += std::to_string(gen() % 157) + "," + std::to_string(gen() % 211) + "\n";
  test::write_file(t.file("pairs.csv"), pairs);
  r = run(bin("ncf_recommend") + " --checkpoint " + *ck_ + " --data_dir " + dir_->file("data") +
          " --threads 1 --pairs " + t.file("pairs.csv") + " --output " + t.file("rec.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = csv_rows(test::read_file(t.file("rec.csv")));
  ASSERT_EQ(want.size(), 10001u);
  for (const char* external : {"never", "always"}) {
    const std::string model = t.file(std::string("m_") + external + ".onnx");
    r = run(ncf_export("--format onnx --external_data " + std::string(external) + " --output " +
                       model));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(std::filesystem::exists(model + ".data"), std::string(external) == "always");
    r = run("NODE_PATH=" + ort + "/node_modules node " + std::string(NCF_SOURCE_DIR) +
            "/tests/onnx/score_pairs.js " + model + " " + t.file("pairs.csv") + " " +
            t.file("ort.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto got = csv_rows(test::read_file(t.file("ort.csv")));
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
  r = run(bin("ncf_recommend") + " --checkpoint " + *ck_ + " --data_dir " + dir_->file("data") +
          " --threads 1 --pairs " + t.file("pairs.csv") + " --output " + t.file("rec.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run("/usr/bin/python3 " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/check_npy.py " +
          t.file("npy") + " " + t.file("rec.csv"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A changed file is caught: the NumPy recomputation is not vacuous.
  std::string bad = test::read_file(t.file("npy/head_bias.npy"));
  bad[bad.size() - 2] ^= 0x10;
  test::write_file(t.file("npy/head_bias.npy"), bad);
  r = run("/usr/bin/python3 " + std::string(NCF_SOURCE_DIR) + "/tests/onnx/check_npy.py " +
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

}  // namespace
}  // namespace ncf
