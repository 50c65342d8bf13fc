// GPU parity of evaluation: scoring the candidates (score_items, the fused scoring
// kernel), the metrics (model/metrics.h) and the top-k selection (model/topk.h).
#include "parity_gpu.h"

namespace ncf {
namespace {

// NeuMF scoring against the item table on the device: FP32 products, so the logits
// of the CPU twin to the GEMM tolerance and the device's own forward() on the
// gathered rows to the rounding of layer 0's product rows; under BF16 storage
// within the bound of BF16 storage's other parity tests; the same bits twice.
TEST_F(Parity, ScoreItemsTracksTheCpuTwinAndForward) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int64_t n = 300, R = 211;
  const int S = 21, D = cfg.embedding_width(), mf = cfg.mf_dim;
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec T = random_vec(size_t(R) * D, gen_, -0.5f, 0.5f);
  const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
  const Vec rows = test::rows_by_id(T, ids, D);
  Buffer<float> gU = up(U), gT = up(T), grows = up(rows);
  Buffer<int32_t> gids = up(ids);
  // The candidates' GMF columns are read from the table's rows (stride D) by id.
  auto score = [&](NeuMF& model, const ExecContext& ctx, bool dev) {
    Vec out(static_cast<size_t>(B));
    if (!dev) {
      model.prepare_items(ctx, T.data() + mf, D, R);
      model.score_items(ctx, U.data(), T.data(), D, ids.data(), n, S, out.data());
      return out;
    }
    Buffer<float> logits = up(out);
    model.prepare_items(ctx, gT.data() + mf, D, R);
    model.score_items(ctx, gU.data(), gT.data(), D, gids.data(), n, S, logits.data());
    return down(logits);
  };
  auto forward = [&](NeuMF& model, const ExecContext& ctx) {
    Buffer<float> logits = up(Vec(static_cast<size_t>(B)));
    model.forward(ctx, gU.data(), grows.data(), n, S, logits.data());
    return down(logits);
  };
  set_math_mode(MathMode::kFp32);
  const Vec c = score(cpu_model, cpu_, false), g = score(dev_model, gpu_, true);
  expect_close(g, c, kGemmAtolPerSqrtK * std::sqrt(double(D)), kGemmRtol, "FP32 logits vs CPU");
  const Vec f = forward(dev_model, gpu_);
  double scale = 0.0;
  for (float x : f) scale = std::max(scale, double(std::fabs(x)));
  expect_close(g, f, 1e-5 * scale, 0.0, "FP32 logits vs the device's forward()");
  expect_same(score(dev_model, gpu_, true), g, "FP32 logits on a second run");
  set_math_mode(MathMode::kBf16);
  const Vec c16 = score(cpu_model, cpu_, false), g16 = score(dev_model, gpu_, true);
  const double bound = (double(cpu_model.tower().size()) + 2.0) / 256.0;
  const double e = test::relative_rms(g16.data(), c16.data(), c16.size());
  EXPECT_LE(e, bound) << "BF16 storage: device vs CPU, relative RMS " << e;
  expect_same(score(dev_model, gpu_, true), g16, "BF16 logits on a second run");
}

// The share of equal bits in two sets of logits (1 for two empty sets).
double same_share(const Vec& a, const Vec& b) {
  if (a.empty()) return 1.0;
  size_t same = 0;
  for (size_t k = 0; k < a.size(); ++k) same += std::memcmp(&a[k], &b[k], sizeof(float)) == 0;
  return double(same) / double(a.size());
}

// The fused op's logits against the same ops run one by one on the device and against the
// CPU twin. ops: the layers above layer 0 as the FP32 product and the epilogue kernel
// (set_lt_bf16_out(false)), the fused kernel's expressions: a product's FP32 sum in the tensor
// cores' order moves a BF16 activation by one step only where that sum lies within its
// rounding error of a step's midpoint, a small share of them, so at least half of the logits
// must keep every bit (a misread tile, weight or row keeps almost none), the rest within the
// BF16 storage bound. ops_lt: as ncf_dist runs them, cuBLASLt's epilogue writing BF16, whose
// rounding cuBLASLt does not document: its share is printed, the logits held to the bound.
void expect_fused_logits(const Vec& fused, const Vec& ops, const Vec& ops_lt, const Vec& cpu, int L,
                         const std::string& what) {
  ASSERT_EQ(fused.size(), ops.size()) << what;
  ASSERT_EQ(fused.size(), ops_lt.size()) << what;
  const double share = same_share(fused, ops), share_lt = same_share(fused, ops_lt);
  std::printf(
      "[   info   ] %s: %.4f of %zu logits the bits of the ops one by one, %.4f of them with "
      "cuBLASLt's BF16 epilogue\n",
      what.c_str(), share, fused.size(), share_lt);
  EXPECT_GE(share, 0.5) << what << ": logits equal to the ops' one by one";
  const double bound = (double(L) + 2.0) / 256.0;
  if (!fused.empty()) {
    EXPECT_LE(test::relative_rms(fused.data(), ops.data(), ops.size()), bound)
        << what << ": against the ops one by one, relative RMS";
    EXPECT_LE(test::relative_rms(fused.data(), ops_lt.data(), ops_lt.size()), bound)
        << what << ": against the ops with cuBLASLt's BF16 epilogue, relative RMS";
    EXPECT_LE(test::relative_rms(fused.data(), cpu.data(), cpu.size()), bound)
        << what << ": against the CPU twin, relative RMS";
  }
}

// neumf_score_items_bf16 (evaluation's scoring in one kernel) on the device against the
// ops it fuses run one by one there (gather_bias_act_bf16, linear_forward_bf16 per layer,
// neumf_top_forward_bf16 by id) and against its CPU twin, on the same inputs; the same bits
// on a second run. Shapes: ml-20m's MLPerf tower (w0 256, layers of 128 and 64: 2 x 2
// fragments a warp, F = 128) with users whose 1,000 candidates span tiles and a batch ending
// inside a tile, and with groups of 21; a narrow tower (64, 32, 16; F = 32); three layers
// above layer 0, one 48 wide (single-fragment units; F = 72), rows of stride past mf; n = 0.
TEST_F(Parity, FusedScoreItemsTracksTheOpsItFuses) {
  struct Shape {
    int w0;
    std::vector<int> outs;
    int mf;
    int64_t n;
    int S;
    int64_t R;
  };
  const Shape shapes[] = {{256, {128, 64}, 64, 7, 1000, 977},
                          {256, {128, 64}, 64, 300, 21, 501},
                          {64, {32, 16}, 16, 300, 21, 211},
                          {128, {64, 48, 32}, 40, 5, 999, 300},
                          {64, {32, 16}, 16, 0, 21, 10}};
  set_math_mode(MathMode::kBf16);
  for (const Shape& sh : shapes) {
    const int L = static_cast<int>(sh.outs.size()), mf = sh.mf, D = mf + 7, w0 = sh.w0;
    const int last = sh.outs.back();
    const int64_t n = sh.n, R = sh.R, B = n * sh.S;
    const std::string what = shape({{"w0", w0}, {"L", L}, {"mf", mf}, {"n", n}, {"S", sh.S}});
    const Vec P = random_vec(size_t(R) * w0, gen_, -0.5f, 0.5f);
    const Vec U0 = random_vec(size_t(n) * w0, gen_, -0.5f, 0.5f);
    const Vec b0 = random_vec(size_t(w0), gen_, -0.1f, 0.1f);
    const Vec urows = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
    const Vec irows = random_vec(size_t(R) * D, gen_, -0.5f, 0.5f);
    const Vec head = random_vec(size_t(mf + last), gen_, -0.3f, 0.3f);
    const Vec c = random_vec(1, gen_, -0.1f, 0.1f);
    const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
    std::vector<std::vector<uint16_t>> W(static_cast<size_t>(L)), Bias(static_cast<size_t>(L));
    ScoreLayerBf16 host[kScoreMaxLayers];
    for (int l = 0, in = w0; l < L; in = sh.outs[size_t(l)], ++l) {
      const int out = sh.outs[size_t(l)];
      const float a = std::sqrt(6.0f / float(in + out));  // Glorot, as NeuMF::init
      for (float x : random_vec(size_t(out) * in, gen_, -a, a))
        W[size_t(l)].push_back(float_to_bf16_bits(x));
      for (float x : random_vec(size_t(out), gen_, -0.1f, 0.1f))
        Bias[size_t(l)].push_back(float_to_bf16_bits(x));
      host[l] = {W[size_t(l)].data(), Bias[size_t(l)].data(), in, out};
    }
    Vec cpu(static_cast<size_t>(B));
    ASSERT_TRUE(score_items_fusable(cpu_, w0, host, L, mf)) << what;
    neumf_score_items_bf16(cpu_, P.data(), R, ids.data(), U0.data(), b0.data(), w0, host, L,
                           urows.data(), D, irows.data(), D, head.data(), c.data(), cpu.data(), n,
                           sh.S, mf);
    Buffer<float> gP = up(P), gU0 = up(U0), gb0 = up(b0), gu = up(urows), gi = up(irows),
                  gh = up(head), gc = up(c);
    Buffer<int32_t> gids = up(ids);
    std::vector<Buffer<uint16_t>> gW, gB;
    ScoreLayerBf16 dev[kScoreMaxLayers];
    for (int l = 0; l < L; ++l) {
      gW.push_back(up(W[size_t(l)]));
      gB.push_back(up(Bias[size_t(l)]));
      dev[l] = {gW.back().data(), gB.back().data(), host[l].in, host[l].out};
    }
    ASSERT_TRUE(score_items_fusable(gpu_, w0, dev, L, mf)) << what;
    auto fused = [&] {
      Buffer<float> logits = up(Vec(size_t(B), -7.0f));
      neumf_score_items_bf16(gpu_, gP.data(), R, gids.data(), gU0.data(), gb0.data(), w0, dev, L,
                             gu.data(), D, gi.data(), D, gh.data(), gc.data(), logits.data(), n,
                             sh.S, mf);
      return down(logits);
    };
    // The ops one by one on the device, the layers above layer 0 with and without
    // cuBLASLt's BF16 epilogue.
    auto one_by_one = [&](bool lt_out) {
      set_lt_bf16_out(lt_out);
      Buffer<uint16_t> x(g_dev, size_t(B) * w0);
      gather_bias_act_bf16(gpu_, gP.data(), R, gids.data(), gU0.data(), gb0.data(), x.data(), n,
                           sh.S, w0, true);
      for (int l = 0; l < L; ++l) {
        Buffer<uint16_t> y(g_dev, size_t(B) * dev[l].out);
        linear_forward_bf16(gpu_, x.data(), dev[l].w, dev[l].b, y.data(), B, dev[l].in, dev[l].out,
                            true);
        x = std::move(y);
      }
      Buffer<float> logits = up(Vec(static_cast<size_t>(B)));
      neumf_top_forward_bf16(gpu_, gu.data(), D, gi.data(), D, x.data(), gh.data(), gc.data(),
                             logits.data(), n, sh.S, mf, last, gids.data());
      set_lt_bf16_out(true);
      return down(logits);
    };
    const Vec ops = one_by_one(false), ops_lt = one_by_one(true);
    const Vec g = fused();
    expect_fused_logits(g, ops, ops_lt, cpu, L, what);
    expect_same(fused(), g, what + "logits on a second run");
  }
  // Widths it does not take: the ops stay on their own.
  const std::vector<uint16_t> w(64 * 64);
  auto fits = [&](int w0, std::vector<std::pair<int, int>> io, int mf) {
    std::vector<ScoreLayerBf16> v;
    for (auto [in, out] : io) v.push_back({w.data(), nullptr, in, out});
    return score_items_fusable(cpu_, w0, v.data(), int(v.size()), mf);
  };
  EXPECT_TRUE(fits(64, {{64, 32}, {32, 16}}, 16));
  EXPECT_FALSE(fits(64, {{64, 32}, {32, 8}}, 16)) << "a width of 8";
  EXPECT_FALSE(fits(64, {{64, 32}, {16, 16}}, 16)) << "layers not chained";
  EXPECT_FALSE(fits(40, {{40, 32}}, 16)) << "w0 of 40";
  EXPECT_FALSE(fits(64, {{64, 32}}, 129)) << "mf past kNeumfTopMaxWidth";
  EXPECT_FALSE(fits(64, {}, 16)) << "no layer above layer 0";
  EXPECT_FALSE(fits(64, {{64, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}}, 16))
      << "five layers above layer 0";
}

// NeuMF::score_items with NCF_EVAL_FUSED (set_score_items_fused): on a GPU under BF16
// storage the one kernel runs (last_score_fused) and its logits follow the ops one by one,
// held as above; elsewhere (FP32, or the CPU stand-in) nothing changes, to the bit.
TEST_F(Parity, NeuMFScoresItemsInOneKernelWhereAsked) {
  NeuMFConfig cfg;
  cfg.mf_dim = 64;
  cfg.layers = {256, 256, 128, 64};  // ml-20m-mlperf
  const int64_t n = 6, R = 777;
  const int S = 1000, D = cfg.embedding_width(), mf = cfg.mf_dim;
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec T = random_vec(size_t(R) * D, gen_, -0.5f, 0.5f);
  const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
  Buffer<float> gU = up(U), gT = up(T);
  Buffer<int32_t> gids = up(ids);
  auto score = [&](bool fused, bool lt_out = true) {
    set_score_items_fused(fused);
    set_lt_bf16_out(lt_out);
    Buffer<float> logits = up(Vec(size_t(B)));
    dev_model.prepare_items(gpu_, gT.data() + mf, D, R);
    dev_model.score_items(gpu_, gU.data(), gT.data(), D, gids.data(), n, S, logits.data());
    return down(logits);
  };
  for (MathMode mode : {MathMode::kBf16, MathMode::kFp32}) {
    set_math_mode(mode);
    const bool bf16 = mode == MathMode::kBf16;
    const std::string what = bf16 ? "BF16 storage" : "FP32";
    Vec cpu(static_cast<size_t>(B));
    cpu_model.prepare_items(cpu_, T.data() + mf, D, R);
    cpu_model.score_items(cpu_, U.data(), T.data(), D, ids.data(), n, S, cpu.data());
    const Vec ops = score(false, false), ops_lt = score(false);
    EXPECT_FALSE(dev_model.last_score_fused()) << what;
    const Vec fused = score(true);
    EXPECT_EQ(dev_model.last_score_fused(), bf16 && g_dev == Device::kCuda) << what;
    if (dev_model.last_score_fused()) {
      expect_fused_logits(fused, ops, ops_lt, cpu, int(dev_model.tower().size()) - 1, what);
      expect_same(score(true), fused, what + " fused logits on a second run");
    } else {
      expect_same(fused, ops, what + ": NCF_EVAL_FUSED changes nothing here");
    }
  }
  set_score_items_fused(false);
}

// ---- metrics.h ------------------------------------------------------------------------------

TEST_F(Parity, HitNdcgWithTiesNaNsAndMasks) {
  for (int64_t U : kBatches)
    for (int L : {1, 2, 33, 101})
      for (int K : {1, 10})
        for (bool with_mask : {false, true}) {
          const std::string what = shape({{"U", U}, {"L", L}, {"K", K}, {"mask", with_mask}});
          // Small integer scores: many ties with the positive.
          std::uniform_int_distribution<int> score(0, 4);
          std::bernoulli_distribution keep(0.8);
          Vec s(size_t(U) * L);
          std::vector<uint8_t> mask(size_t(U) * L);
          for (size_t i = 0; i < s.size(); ++i) {
            s[i] = float(score(gen_));
            if (i % 53 == 7) s[i] = std::numeric_limits<float>::quiet_NaN();
            mask[i] = keep(gen_) ? 1 : 0;
          }
          Buffer<float> gs = up(s);
          Buffer<uint8_t> gm = up(mask);
          double hr_c = -1, nd_c = -1, hr_g = -1, nd_g = -1;
          hit_ndcg(cpu_, s.data(), with_mask ? mask.data() : nullptr, U, L, K, &hr_c, &nd_c);
          hit_ndcg(gpu_, gs.data(), with_mask ? gm.data() : nullptr, U, L, K, &hr_g, &nd_g);
          EXPECT_EQ(hr_g, hr_c) << what << "hits";  // a count: exact
          expect_close(std::vector<double>{nd_g}, std::vector<double>{nd_c}, kDoubleAtol,
                       kDoubleRtol, what + "ndcg");
        }
}

// hit_ndcg_accumulate on the device: after each batch the running sums (starting
// from non-zero values) are those sums plus the batch's device hit_ndcg sums, added
// on the host in the same order: the same bits. No wait per batch.
TEST_F(Parity, HitNdcgAccumulateAddsEachBatchsSumsOnTheDevice) {
  std::uniform_int_distribution<int> score(0, 4);
  const int L = 101, K = 10;
  std::vector<double> want = {0.5, 0.25};
  Buffer<double> gsums = up(want);
  for (int64_t U : kBatches) {
    Vec s(size_t(U) * L);
    std::vector<uint8_t> mask(size_t(U) * L);
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = float(score(gen_));
      mask[i] = i % 7 != 2;
    }
    Buffer<float> gs = up(s);
    Buffer<uint8_t> gm = up(mask);
    double hr = -1, nd = -1;
    hit_ndcg(gpu_, gs.data(), gm.data(), U, L, K, &hr, &nd);
    want[0] += hr;
    want[1] += nd;
    hit_ndcg_accumulate(gpu_, gs.data(), gm.data(), U, L, K, gsums.data());
    const std::vector<double> got = down(gsums);
    EXPECT_EQ(got[0], want[0]) << "U " << U;
    EXPECT_EQ(got[1], want[1]) << "U " << U;
  }
}

// ---- topk.h ---------------------------------------------------------------------------

// Same items and scores bit for bit: scores from a few levels (many ties, -0
// and +0 among them), rows with many, none, or all items excluded, K past
// the items left, and blocks of rows larger than one CUB call sorts.
TEST_F(Parity, TopKEqualsTheCpuSelection) {
  const float levels[] = {-0.0f, 0.0f, 1.5f, -2.25f, 3.0f, 1e-3f, -1e-30f};
  for (const auto& [n, I, K] :
       {std::tuple{int64_t{0}, int64_t{5}, 3}, std::tuple{int64_t{1}, int64_t{1}, 1},
        std::tuple{int64_t{7}, int64_t{13}, 20}, std::tuple{int64_t{300}, int64_t{1000}, 10},
        std::tuple{int64_t{3}, gpu_scale((int64_t{1} << 25) + 7, (int64_t{1} << 20) + 7), 5}}) {
    Vec scores(size_t(n * I));
    std::uniform_int_distribution<int> pick(0, 6);
    std::uniform_real_distribution<float> real(-4.0f, 4.0f);
    for (size_t x = 0; x < scores.size(); ++x)
      scores[x] = x % 3 == 0 ? real(gen_) : levels[pick(gen_)];
    LVec offsets(size_t(n + 1), 0);
    IVec excluded;
    for (int64_t u = 0; u < n; ++u) {
      const int64_t every = u % 4 == 0 ? 1 : 2 + u % 5;  // row 0, 4, ...: everything
      if (u % 4 != 1)
        for (int64_t j = u % 3; j < std::min<int64_t>(I, 4096); j += every)
          excluded.push_back(int32_t(j));
      offsets[size_t(u + 1)] = int64_t(excluded.size());
    }
    const std::string what = shape({{"n", n}, {"I", I}, {"K", K}});
    for (bool with_excluded : {false, true}) {
      IVec c_items(size_t(n * K)), g_items_host;
      Vec c_scores(size_t(n * K));
      top_k(cpu_, scores.data(), n, I, with_excluded ? offsets.data() : nullptr,
            with_excluded ? excluded.data() : nullptr, K, c_items.data(), c_scores.data());
      Buffer<float> gs = up(scores);
      Buffer<int64_t> go = up(offsets);
      Buffer<int32_t> ge = up(excluded.empty() ? IVec{0} : excluded);
      Buffer<int32_t> gi(g_dev, size_t(std::max<int64_t>(1, n * K)));
      Buffer<float> gsc(g_dev, size_t(std::max<int64_t>(1, n * K)));
      top_k(gpu_, gs.data(), n, I, with_excluded ? go.data() : nullptr,
            with_excluded ? ge.data() : nullptr, K, gi.data(), gsc.data());
      IVec gi_host(size_t(n * K));
      Vec gs_host(size_t(n * K));
      device_copy(Device::kCpu, gi_host.data(), g_dev, gi.data(), gi_host.size() * 4);
      device_copy(Device::kCpu, gs_host.data(), g_dev, gsc.data(), gs_host.size() * 4);
      EXPECT_EQ(gi_host, c_items) << what << (with_excluded ? " excluded" : "");
      EXPECT_EQ(0, std::memcmp(gs_host.data(), c_scores.data(), c_scores.size() * 4))
          << what << (with_excluded ? " excluded" : "");
    }
  }
}

// An excluded item outside [0, I) would mark another row's item (or memory
// past the scores) on the GPU: both devices refuse it, naming the op.
TEST_F(Parity, TopKRefusesExcludedItemsOutsideTheRow) {
  const int64_t n = 3, I = 6;
  const int K = 8;  // more than the row: the tail is item -1
  const Vec scores = random_vec(size_t(n * I), gen_);
  for (int32_t bad : {-1, int32_t(I), int32_t(I) + 7}) {
    const LVec offsets = {0, 1, 3, 4};
    const IVec excluded = {2, 0, bad, 5};  // row 1 holds the bad entry
    for (const ExecContext* ctx : {&cpu_, &gpu_}) {
      const bool dev = ctx == &gpu_;
      const std::string what = shape({{"bad", bad}}) + (dev ? "device" : "cpu");
      Buffer<float> gs = up(scores);
      Buffer<int64_t> go = up(offsets);
      Buffer<int32_t> ge = up(excluded);
      Buffer<int32_t> gi(g_dev, size_t(n * K));
      Buffer<float> gsc(g_dev, size_t(n * K));
      IVec items(size_t(n * K));
      Vec top(size_t(n * K));
      try {
        top_k(*ctx, dev ? gs.data() : scores.data(), n, I, dev ? go.data() : offsets.data(),
              dev ? ge.data() : excluded.data(), K, dev ? gi.data() : items.data(),
              dev ? gsc.data() : top.data());
        check_device_errors(*ctx);
        ADD_FAILURE() << what << ": accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos) << what << e.what();
      }
    }
  }
}

// NCF_SCRATCH_DEBUG=separate (the sanitizer stages' mode: every scratch array an
// allocation of its own) changes where arrays live, not what the ops compute:
// the sort-reduce and top-K on a context made in that mode equal the CPU's bit
// for bit. Any other value is refused by name.
TEST_F(Parity, SeparateScratchModeComputesTheSame) {
  const int64_t n = 5000, D = 8, I = 300;
  const IVec ids = random_ids(n, 0, 700, gen_);
  const Vec grads = random_vec(size_t(n * D), gen_), scores = random_vec(size_t(4 * I), gen_);
  IVec urows(n, -1), items(size_t(4 * 10));
  Vec rgrads(size_t(n * D)), top(size_t(4 * 10));
  int64_t nu = -1;
  sort_reduce_rows(cpu_, ids.data(), grads.data(), n, D, urows.data(), rgrads.data(), &nu, 700);
  top_k(cpu_, scores.data(), 4, I, nullptr, nullptr, 10, items.data(), top.data());
  DEVICE_HALF_NEEDS_A_GPU();
  struct Env {
    explicit Env(const char* v) { setenv("NCF_SCRATCH_DEBUG", v, 1); }
    ~Env() { unsetenv("NCF_SCRATCH_DEBUG"); }
  };
  {
    Env bad("pad");
    try {
      make_cuda_context(0);
      ADD_FAILURE() << "NCF_SCRATCH_DEBUG=pad accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NCF_SCRATCH_DEBUG=pad"), std::string::npos) << e.what();
    }
  }
  Env separate("separate");
  ExecContext sep = make_cuda_context(0);
  {
    Buffer<RowId> gids = up(ids), gurows = up(IVec(n, -1));
    Buffer<float> ggrads = up(grads), grgrads = up(Vec(size_t(n * D))), gs = up(scores);
    Buffer<int32_t> gi(g_dev, items.size());
    Buffer<float> gt(g_dev, top.size());
    int64_t gnu = -1;
    sort_reduce_rows(sep, gids.data(), ggrads.data(), n, D, gurows.data(), grgrads.data(), &gnu,
                     700);
    top_k(sep, gs.data(), 4, I, nullptr, nullptr, 10, gi.data(), gt.data());
    check_device_errors(sep);
    ASSERT_EQ(gnu, nu);
    expect_same(down(gurows, size_t(nu)), IVec(urows.begin(), urows.begin() + nu), "unique rows");
    expect_same(down(grgrads, size_t(nu * D)), Vec(rgrads.begin(), rgrads.begin() + nu * D),
                "row sums");
    expect_same(down(gi), items, "top-K items");
    expect_same(down(gt), top, "top-K scores");
  }
  destroy_cuda_context(sep);
}

}  // namespace
}  // namespace ncf
