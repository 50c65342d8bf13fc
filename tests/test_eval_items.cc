// Evaluation against the item table (NeuMF::prepare_items / score_items, model/ops.h
// gather_bias_act), on the CPU:
//   - gather_bias_act is group_bias_act on the gathered rows, and gather_bias_act_bf16
//     group_linear_forward_bf16's epilogue on them: bit for bit against loops written
//     here, at 1 and 3 threads; an id outside the table is refused, named;
//   - score_items gives forward()'s logits for the same rows: under FP32 within the
//     rounding of the layer-0 product (its rows come from a GEMM of another shape),
//     under BF16 storage within the bound test_bf16_storage.cc derives;
//   - ncf_dist's evaluation by items ends with the per-sample evaluation's metrics, at
//     1 rank and at 2 (where the item table is gathered from both).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "test_util.h"

namespace ncf {
namespace {

using Vec = std::vector<float>;
using Bits = std::vector<uint16_t>;
using test::bin;
using test::run;
using test::TempDir;

constexpr double kU16 = 1.0 / 256.0;

using test::cpu;

using test::random_vec;

std::vector<int32_t> random_ids(size_t n, int32_t R, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, R - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& x : ids) x = dist(gen);
  return ids;
}

using test::ScopedMathMode;

TEST(GatherBiasAct, IsGroupBiasActAndTheBf16EpilogueOnTheGatheredRows) {
  const int64_t R = 37, n = 53;
  const int S = 7, out = 24;
  const int64_t B = n * S;
  const Vec P = random_vec(size_t(R) * out, 1), Yg = random_vec(size_t(n) * out, 2),
            bias = random_vec(size_t(out), 3);
  const std::vector<int32_t> ids = random_ids(size_t(B), int32_t(R), 4);
  for (bool relu : {true, false})
    for (bool with_bias : {true, false}) {
      const float* b = with_bias ? bias.data() : nullptr;
      const std::string what =
          std::string(relu ? "relu" : "identity") + (with_bias ? ", bias" : ", no bias");
      // FP32: the rows gathered by a loop, then group_bias_act.
      Vec want = test::rows_by_id(P, ids, out);
      group_bias_act(cpu(1), want.data(), Yg.data(), b, n, S, out, relu);
      // BF16: (z + bias) + Yg, ReLU, rounded, written out per element.
      Bits want16(size_t(B) * out);
      for (int64_t r = 0; r < B; ++r)
        for (int j = 0; j < out; ++j) {
          float z = P[size_t(ids[size_t(r)]) * out + j];
          if (b) z = z + b[j];
          z = z + Yg[size_t(r / S) * out + j];
          if (relu) z = z > 0.0f ? z : 0.0f;
          want16[size_t(r) * out + j] = float_to_bf16_bits(z);
        }
      for (int threads : {1, 3}) {
        Vec got(size_t(B) * out, -7.0f);
        gather_bias_act(cpu(threads), P.data(), R, ids.data(), Yg.data(), b, got.data(), n, S, out,
                        relu);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << what << ", " << threads << " threads";
        Bits got16(size_t(B) * out, 0xFFFF);
        gather_bias_act_bf16(cpu(threads), P.data(), R, ids.data(), Yg.data(), b, got16.data(), n,
                             S, out, relu);
        EXPECT_EQ(got16, want16) << what << ", " << threads << " threads";
      }
    }
}

TEST(GatherBiasAct, RefusesAnIdOutsideTheTable) {
  const int64_t R = 5, n = 2;
  const int S = 3, out = 4;
  const Vec P(size_t(R) * out, 1.0f), Yg(size_t(n) * out, 0.0f);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 0};
  ids[4] = int32_t(R);
  Vec Y(size_t(n) * S * out);
  Bits Y16(Y.size());
  for (bool bf16 : {false, true}) {
    try {
      if (bf16)
        gather_bias_act_bf16(cpu(1), P.data(), R, ids.data(), Yg.data(), nullptr, Y16.data(), n, S,
                             out, true);
      else
        gather_bias_act(cpu(1), P.data(), R, ids.data(), Yg.data(), nullptr, Y.data(), n, S, out,
                        true);
      ADD_FAILURE() << "id " << R << " of a table of " << R << " rows accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ids[4] = 5 is outside [0, 5)"), std::string::npos)
          << e.what();
    }
  }
}

// neumf_top_forward(_bf16) reading item rows by id from a table gives, bit for bit,
// its logits on those rows gathered per sample (FP32 and BF16 A; mf of 20 and 64).
TEST(ScoreItems, TheTopReadsItemRowsByIdAsItReadsThemGathered) {
  const int64_t n = 37, R = 53;
  const int S = 7, last = 24, ldt = 90;
  const int64_t B = n * S;
  for (int mf : {20, 64}) {
    const Vec U = random_vec(size_t(n) * ldt, 31, -0.5f, 0.5f);
    const Vec T = random_vec(size_t(R) * ldt, 32, -0.5f, 0.5f);
    const Vec A = random_vec(size_t(B) * last, 33, 0.0f, 0.5f);
    const Vec w = random_vec(size_t(mf + last), 34, -0.3f, 0.3f), c = {0.125f};
    const std::vector<int32_t> ids = random_ids(size_t(B), int32_t(R), 35);
    const Vec rows = test::rows_by_id(T, ids, ldt);
    Vec by_id(static_cast<size_t>(B)), gathered(static_cast<size_t>(B));
    auto same_bits = [&](const std::string& what) {
      EXPECT_EQ(std::memcmp(by_id.data(), gathered.data(), by_id.size() * 4), 0) << what;
    };
    neumf_top_forward(cpu(2), U.data(), ldt, T.data(), ldt, A.data(), w.data(), c.data(),
                      by_id.data(), n, S, mf, last, ids.data());
    neumf_top_forward(cpu(2), U.data(), ldt, rows.data(), ldt, A.data(), w.data(), c.data(),
                      gathered.data(), n, S, mf, last);
    same_bits("FP32 A, mf " + std::to_string(mf));
    const Bits A16 = test::bf16_bits_of(A);
    neumf_top_forward_bf16(cpu(2), U.data(), ldt, T.data(), ldt, A16.data(), w.data(), c.data(),
                           by_id.data(), n, S, mf, last, ids.data());
    neumf_top_forward_bf16(cpu(2), U.data(), ldt, rows.data(), ldt, A16.data(), w.data(), c.data(),
                           gathered.data(), n, S, mf, last);
    same_bits("BF16 A, mf " + std::to_string(mf));
  }
}

// The logits of forward() on gathered rows and of score_items on the item table.
struct Scores {
  Vec forward, items;
};
Scores score_both(NeuMF& model, const ExecContext& ctx, const Vec& U, const Vec& T,
                  const std::vector<int32_t>& ids, int64_t n, int S) {
  const NeuMFConfig& c = model.config();
  const int D = c.embedding_width(), mf = c.mf_dim;
  const int64_t R = int64_t(T.size()) / D, B = n * S;
  const Vec rows = test::rows_by_id(T, ids, D);
  Scores s{Vec(size_t(B)), Vec(size_t(B))};
  model.forward(ctx, U.data(), rows.data(), n, S, s.forward.data());
  model.prepare_items(ctx, T.data() + mf, D, R);
  // The GMF columns straight from the table's rows (stride D), by id.
  model.score_items(ctx, U.data(), T.data(), D, ids.data(), n, S, s.items.data());
  return s;
}

TEST(ScoreItems, GivesForwardsLogitsForTheSameRows) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int64_t n = 300, R = 211;
  const int S = 21, D = cfg.embedding_width();
  NeuMF model(cfg, Device::kCpu);
  test::init_with_biases(model, 5, 6, 0.1f);
  ASSERT_TRUE(model.can_score_items());
  const Vec U = random_vec(size_t(n) * D, 21, -0.5f, 0.5f);
  const Vec T = random_vec(size_t(R) * D, 22, -0.5f, 0.5f);
  const std::vector<int32_t> ids = random_ids(size_t(n) * S, int32_t(R), 23);
  {
    // FP32: a layer-0 product row in FP32 differs between GEMM shapes by its own
    // summation order at most (h products of O(1) terms); through the tower the
    // logits move by a few units in the last place of their size.
    ScopedMathMode m(MathMode::kFp32);
    const Scores s = score_both(model, cpu(2), U, T, ids, n, S);
    double scale = 0.0;
    for (float x : s.forward) scale = std::max(scale, double(std::fabs(x)));
    for (size_t b = 0; b < s.forward.size(); ++b)
      ASSERT_NEAR(s.items[b], s.forward[b], 1e-5 * scale) << "logit " << b;
    for (int threads : {1, 3}) {
      const Scores again = score_both(model, cpu(threads), U, T, ids, n, S);
      EXPECT_EQ(std::memcmp(again.items.data(), s.items.data(), s.items.size() * 4), 0)
          << threads << " threads";
    }
  }
  {
    ScopedMathMode m(MathMode::kBf16);
    const Scores s = score_both(model, cpu(2), U, T, ids, n, S);
    const double bound = (double(model.tower().size()) + 2.0) * kU16;
    const double d = test::relative_rms(s.items.data(), s.forward.data(), s.forward.size());
    EXPECT_LE(d, bound) << "BF16 storage: score_items vs forward, relative RMS";
    for (int threads : {1, 3}) {
      const Scores again = score_both(model, cpu(threads), U, T, ids, n, S);
      EXPECT_EQ(std::memcmp(again.items.data(), s.items.data(), s.items.size() * 4), 0)
          << "BF16, " << threads << " threads";
    }
  }
}

// neumf_score_items_bf16's CPU twin (the reference of its GPU kernel) against a loop over
// each candidate written here: layer 0 from the product row by id, each layer's dot
// products in double, every activation rounded to BF16 after its bias and ReLU, the top's
// GMF products rounded to float. The twin sums each product in FP32, so an activation lying
// within that sum's rounding of a BF16 midpoint may round the other way: the logits are held
// to the BF16 storage bound, and nine in ten to 1e-5 of their size. An id outside the
// table and widths the kernel does not take are refused, named.
TEST(ScoreItems, FusedOpsCpuTwinIsALoopOverEachCandidate) {
  const int w0 = 64, mf = 24, D = mf + 5;
  const std::vector<int> outs = {48, 32};
  const int L = int(outs.size()), last = outs.back();
  const int64_t n = 9, R = 41;
  const int S = 13;
  const int64_t B = n * S;
  const Vec P = random_vec(size_t(R) * w0, 11, -0.5f, 0.5f),
            U0 = random_vec(size_t(n) * w0, 12, -0.5f, 0.5f),
            b0 = random_vec(size_t(w0), 13, -0.1f, 0.1f),
            urows = random_vec(size_t(n) * D, 14, -0.5f, 0.5f),
            irows = random_vec(size_t(R) * D, 15, -0.5f, 0.5f),
            head = random_vec(size_t(mf + last), 16, -0.3f, 0.3f), c = {0.05f};
  const std::vector<int32_t> ids = random_ids(size_t(B), int32_t(R), 17);
  std::vector<Bits> W(static_cast<size_t>(L)), Bb(static_cast<size_t>(L));
  ScoreLayerBf16 layers[kScoreMaxLayers];
  for (int l = 0, in = w0; l < L; in = outs[size_t(l)], ++l) {
    const int out = outs[size_t(l)];
    for (float x : random_vec(size_t(out) * in, uint32_t(20 + l), -0.3f, 0.3f))
      W[size_t(l)].push_back(float_to_bf16_bits(x));
    for (float x : random_vec(size_t(out), uint32_t(30 + l), -0.1f, 0.1f))
      Bb[size_t(l)].push_back(float_to_bf16_bits(x));
    layers[l] = {W[size_t(l)].data(), Bb[size_t(l)].data(), in, out};
  }
  Vec logits(static_cast<size_t>(B));
  neumf_score_items_bf16(cpu(3), P.data(), R, ids.data(), U0.data(), b0.data(), w0, layers, L,
                         urows.data(), D, irows.data(), D, head.data(), c.data(), logits.data(), n,
                         S, mf);
  Vec want(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t u = b / S, id = ids[size_t(b)];
    std::vector<float> h(static_cast<size_t>(w0));
    for (int j = 0; j < w0; ++j) {
      const float v = (P[size_t(id * w0 + j)] + b0[size_t(j)]) + U0[size_t(u * w0 + j)];
      h[size_t(j)] = round_to_bf16(v > 0.0f ? v : 0.0f);
    }
    for (int l = 0; l < L; ++l) {
      std::vector<float> y(size_t(layers[l].out));
      for (int j = 0; j < layers[l].out; ++j) {
        double acc = 0.0;
        for (int k = 0; k < layers[l].in; ++k)
          acc += double(h[size_t(k)]) *
                 double(bf16_bits_to_float(W[size_t(l)][size_t(j) * layers[l].in + size_t(k)]));
        const float v = float(acc) + bf16_bits_to_float(Bb[size_t(l)][size_t(j)]);
        y[size_t(j)] = round_to_bf16(v > 0.0f ? v : 0.0f);
      }
      h.swap(y);
    }
    double z = c[0];
    for (int k = 0; k < mf; ++k)
      z += double(urows[size_t(u * D + k)] * irows[size_t(id * D + k)]) * head[size_t(k)];
    for (int k = 0; k < last; ++k) z += double(h[size_t(k)]) * head[size_t(mf + k)];
    want[size_t(b)] = float(z);
  }
  const double e = test::relative_rms(logits.data(), want.data(), want.size());
  EXPECT_LE(e, (L + 2) * kU16) << "relative RMS against the loop";
  int64_t close = 0;
  double scale = 0.0;
  for (float x : want) scale = std::max(scale, double(std::fabs(x)));
  for (int64_t b = 0; b < B; ++b)
    close += std::fabs(double(logits[size_t(b)]) - want[size_t(b)]) <= 1e-5 * scale;
  EXPECT_GE(double(close), 0.9 * double(B)) << close << " of " << B << " logits within 1e-5";

  // The message of the op's refusal of these ids and layers ("" where it accepts them).
  auto refusal = [&](const std::vector<int32_t>& with_ids, const ScoreLayerBf16* with_layers,
                     int with_L) -> std::string {
    try {
      neumf_score_items_bf16(cpu(1), P.data(), R, with_ids.data(), U0.data(), b0.data(), w0,
                             with_layers, with_L, urows.data(), D, irows.data(), D, head.data(),
                             c.data(), logits.data(), n, S, mf);
    } catch (const Error& err) {
      return err.what();
    }
    return "";
  };
  // An id outside the table, named.
  std::vector<int32_t> bad = ids;
  bad[7] = int32_t(R);
  const std::string bad_id = refusal(bad, layers, L);
  EXPECT_NE(bad_id.find("ids[7] = 41 is outside [0, 41)"), std::string::npos)
      << "an id outside the table: '" << bad_id << "'";
  // Widths that do not fit one kernel: a layer of 8.
  ScoreLayerBf16 narrow[2] = {layers[0], {W[1].data(), Bb[1].data(), 48, 8}};
  EXPECT_FALSE(score_items_fusable(cpu(1), w0, narrow, 2, mf));
  const std::string too_narrow = refusal(ids, narrow, 2);
  EXPECT_NE(too_narrow.find("do not fit one kernel"), std::string::npos)
      << "a layer 8 wide: '" << too_narrow << "'";
}

// NCF_EVAL_FUSED asks for the one kernel on GPU ranks only: on the CPU score_items runs the
// ops one by one, the same bits.
TEST(ScoreItems, EvalFusedLeavesTheCpuAlone) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  NeuMF model(cfg, Device::kCpu);
  model.init(3);
  const int64_t n = 4, R = 19;
  const int S = 11, D = cfg.embedding_width();
  const Vec U = random_vec(size_t(n) * D, 41), T = random_vec(size_t(R) * D, 42);
  const std::vector<int32_t> ids = random_ids(size_t(n * S), int32_t(R), 43);
  ScopedMathMode bf16(MathMode::kBf16);
  auto score = [&](bool fused) {
    set_score_items_fused(fused);
    Vec out(static_cast<size_t>(n * S));
    model.prepare_items(cpu(2), T.data() + cfg.mf_dim, D, R);
    model.score_items(cpu(2), U.data(), T.data(), D, ids.data(), n, S, out.data());
    EXPECT_FALSE(model.last_score_fused());
    return out;
  };
  const Vec off = score(false), on = score(true);
  set_score_items_fused(false);
  EXPECT_EQ(std::memcmp(off.data(), on.data(), off.size() * 4), 0);
}

TEST(ScoreItems, NeedsPrepareItems) {
  NeuMFConfig cfg;
  cfg.mf_dim = 8;
  cfg.layers = {16, 8};
  NeuMF model(cfg, Device::kCpu);
  model.init(1);
  Vec U(size_t(cfg.embedding_width())), g(size_t(cfg.mf_dim)), logits(1);
  const int32_t id = 0;
  EXPECT_THROW(model.score_items(cpu(1), U.data(), g.data(), cfg.mf_dim, &id, 1, 1, logits.data()),
               Error);
}

// ncf_dist's metrics lines (--metrics_json) of one run.
std::vector<nlohmann::json> metrics_of(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A small synthetic set at `dir`: 301 users, 157 items, 60 eval negatives.
void prepare_small_set(const std::string& dir) {
  auto prep = run(bin("ncf_prep") +
                  " --synthetic custom --users 301 --items 157 --interactions 12000 "
                  "--eval_negatives 60 --record_rows 300 --progress off --output " +
                  dir);
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
}

TEST(EvalByItems, EndsWithThePerSampleEvaluationsMetrics) {
  TempDir d;
  ASSERT_NO_FATAL_FAILURE(prepare_small_set(d.file("data")));
  for (const char* precision : {"fp32", "bf16"})
    for (int W : {1, 2}) {
      std::vector<nlohmann::json> m[2];
      for (int by_items : {0, 1}) {
        const std::string json = d.file("m" + std::to_string(by_items) + ".jsonl");
        std::remove(json.c_str());  // --metrics_json appends
        auto r = run((W > 1 ? test::mpirun(W) + " " : std::string()) + bin("ncf_dist") +
                     " --eval_scoring " + (by_items ? "auto" : "per_sample") + " --data_dir " +
                     d.file("data") +
                     " --batch_size 1005 --train_epochs 2 --threads 1 --progress off "
                     "--eval_batch_size 1000 --precision " +
                     precision + " --metrics_json " + json);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const std::string said = by_items ? "candidates scored from the item table"
                                          : "candidates' rows looked up per sample";
        EXPECT_NE(r.output.find("ncf_dist: evaluation: " + said), std::string::npos) << r.output;
        m[by_items] = metrics_of(json);
      }
      const std::string what = std::string(precision) + ", W=" + std::to_string(W);
      ASSERT_EQ(m[0].size(), 2u) << what;
      ASSERT_EQ(m[1].size(), 2u) << what;
      for (size_t e = 0; e < 2; ++e) {
        // Training is the same run: the same loss to the last digit printed.
        EXPECT_EQ(m[0][e]["loss"], m[1][e]["loss"]) << what << " epoch " << e + 1;
        // A candidate's score may move by a rounding; a tie that flips moves one
        // user's hit (1 / 301 of HR).
        EXPECT_NEAR(double(m[0][e]["hr"]), double(m[1][e]["hr"]), 1.5 / 301) << what;
        EXPECT_NEAR(double(m[0][e]["ndcg"]), double(m[1][e]["ndcg"]), 1.5 / 301) << what;
      }
    }
}

// --eval_phases prints where one evaluation's time went, once per evaluation on
// rank 0, and changes no metric: the same lines as the run without it.
TEST(EvalByItems, PhasesAreReportedAndChangeNothing) {
  TempDir d;
  ASSERT_NO_FATAL_FAILURE(prepare_small_set(d.file("data")));
  std::vector<nlohmann::json> m[2];
  for (int phases : {0, 1}) {
    const std::string json = d.file("p" + std::to_string(phases) + ".jsonl");
    auto r = run(test::mpirun(2) + " " + bin("ncf_dist") + (phases ? " --eval_phases" : "") +
                 " --data_dir " + d.file("data") +
                 " --batch_size 1005 --train_epochs 2 --threads 1 --progress off "
                 "--eval_batch_size 1000 --metrics_json " +
                 json);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    size_t lines = 0;
    for (size_t at = r.output.find("ncf_dist: eval phases"); at != std::string::npos;
         at = r.output.find("ncf_dist: eval phases", at + 1))
      ++lines;
    EXPECT_EQ(lines, phases ? 2u : 0u) << r.output;  // one per epoch's evaluation, rank 0 only
    if (phases) {
      for (const char* p : {" prepare ", " read ", " upload ", " lookup ", " score ", " metrics ",
                            " full ranking "})
        EXPECT_NE(r.output.find(p), std::string::npos) << p << "\n" << r.output;
    }
    m[phases] = metrics_of(json);
  }
  ASSERT_EQ(m[0].size(), 2u);
  ASSERT_EQ(m[1].size(), 2u);
  for (size_t e = 0; e < 2; ++e)
    for (const char* k : {"loss", "hr", "ndcg"}) EXPECT_EQ(m[0][e][k], m[1][e][k]) << k;
}

// --eval_lists_cache on keeps the lists (on the CPU here, as a GPU rank does on its device) after
// the first evaluation, which ncf_dist says once: every metric is the run's without it, per
// rank count, evaluation by items or per sample, and with an --eval_users subset.
TEST(EvalListsCache, KeptListsChangeNoMetric) {
  TempDir d;
  ASSERT_NO_FATAL_FAILURE(prepare_small_set(d.file("data")));
  const std::string note = "ncf_dist: evaluation: the lists stay on the device after the first";
  for (int W : {1, 2})
    for (const char* extra : {"", " --eval_users 150"})
      for (int by_items : {0, 1}) {
        std::vector<nlohmann::json> m[2];
        for (int cache : {0, 1}) {
          const std::string json = d.file("c" + std::to_string(cache) + ".jsonl");
          std::remove(json.c_str());  // --metrics_json appends
          auto r = run((W > 1 ? test::mpirun(W) + " " : std::string()) + bin("ncf_dist") +
                       " --eval_lists_cache " + (cache ? "on" : "off") + " --eval_scoring " +
                       (by_items ? "auto" : "per_sample") + " --data_dir " + d.file("data") +
                       " --batch_size 1005 --train_epochs 3 --threads 1 --progress off "
                       "--eval_batch_size 1000 --metrics_json " +
                       json + extra);
          ASSERT_EQ(r.exit_code, 0) << r.output;
          const size_t at = r.output.find(note);
          EXPECT_EQ(at != std::string::npos, cache == 1) << r.output;
          if (at != std::string::npos) {
            EXPECT_EQ(r.output.find(note, at + 1), std::string::npos) << "said once\n" << r.output;
          }
          m[cache] = metrics_of(json);
        }
        const std::string what =
            "W=" + std::to_string(W) + extra + (by_items ? ", by items" : ", per sample");
        ASSERT_EQ(m[0].size(), 3u) << what;
        ASSERT_EQ(m[1].size(), 3u) << what;
        for (size_t e = 0; e < 3; ++e)
          for (const char* k : {"loss", "hr", "ndcg"})
            EXPECT_EQ(m[0][e][k], m[1][e][k]) << what << " epoch " << e + 1 << " " << k;
      }
}

}  // namespace
}  // namespace ncf
