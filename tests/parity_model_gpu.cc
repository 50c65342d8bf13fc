// GPU parity of NeuMF (model/neumf.h) on BF16 storage and with layer 0 by item, and of
// the ops it takes them from: gather_bias_act and the item-run ops.
#include "parity_gpu.h"

namespace ncf {
namespace {

// NeuMF's step on BF16 storage, on the device and on the CPU, from the same
// parameters, rows and labels. The two differ by the FP32 summation order of the
// products (about 1e-6 relative), which flips the BF16 rounding of some stored
// values by one ulp: at most 2^-8 relative per rounding of the top's input, its
// gradient and each layer's dX (the BF16 biases above layer 0 are the same values on
// both), so every tensor stays within (L + 2)·2^-8 in relative RMS.
// The device repeats itself bit for bit, and its per-GEMM copies (the unfused top's
// path, set_fused_top(false)) give other values: BF16 storage ran there.
TEST_F(Parity, NeuMFOnBf16StorageTracksTheCpuAndRepeatsItself) {
  set_math_mode(MathMode::kBf16);
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int64_t n = 700;
  const int S = 5, D = cfg.embedding_width();
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec I = random_vec(size_t(B) * D, gen_, -0.5f, 0.5f);
  Vec labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  struct Out {
    Vec logits, grads, dU, dI;
    double loss = 0;
  };
  Buffer<float> gU = up(U), gI = up(I), glabels = up(labels);
  auto run = [&](NeuMF& model, const ExecContext& ctx, bool dev) {
    Buffer<float> logits = up(Vec(size_t(B), 0.0f)), dlogits = up(Vec(size_t(B), 0.0f)),
                  dU = up(Vec(size_t(n) * D, 0.0f)), dI = up(Vec(size_t(B) * D, 0.0f));
    Buffer<double> loss = up(std::vector<double>{0.0});
    if (dev) {
      model.forward_backward(ctx, gU.data(), gI.data(), n, S, glabels.data(), B, logits.data(),
                             dlogits.data(), loss.data(), dU.data(), dI.data());
      return Out{down(logits), down(model.grads()), down(dU), down(dI), down(loss)[0]};
    }
    Out o{Vec(size_t(B)), Vec(), Vec(size_t(n) * D), Vec(size_t(B) * D), 0.0};
    Vec dl(static_cast<size_t>(B));
    model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), B, o.logits.data(),
                           dl.data(), &o.loss, o.dU.data(), o.dI.data());
    o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
    return o;
  };
  const Out c = run(cpu_model, cpu_, false), g = run(dev_model, gpu_, true);
  const Out again = run(dev_model, gpu_, true);
  set_fused_top(false);
  const Out copies = run(dev_model, gpu_, true);
  set_fused_top(true);
  const double bound = (double(cpu_model.tower().size()) + 2.0) / 256.0;
  auto check = [&](const Vec& dev, const Vec& cpu, const Vec& per_gemm, size_t off, size_t count,
                   const std::string& what) {
    const double e = test::relative_rms(dev.data() + off, cpu.data() + off, count);
    EXPECT_LE(e, bound) << what << ": device vs CPU, relative RMS " << e;
    EXPECT_GT(test::relative_rms(per_gemm.data() + off, dev.data() + off, count), 0.0)
        << what << ": the per-GEMM copies gave BF16 storage's values";
  };
  check(g.logits, c.logits, copies.logits, 0, size_t(B), "logits");
  for (const DenseLayerView& v : cpu_model.tower()) {
    const std::string l = "layer " + std::to_string(v.in) + "->" + std::to_string(v.out);
    check(g.grads, c.grads, copies.grads, size_t(v.w_offset), size_t(v.in) * v.out, l + " dW");
    check(g.grads, c.grads, copies.grads, size_t(v.b_offset), size_t(v.out), l + " db");
  }
  check(g.grads, c.grads, copies.grads, size_t(cpu_model.head_w_offset()), size_t(cfg.head_width()),
        "head dw");
  check(g.dU, c.dU, copies.dU, 0, c.dU.size(), "d_user_rows");
  check(g.dI, c.dI, copies.dI, 0, c.dI.size(), "d_item_rows");
  EXPECT_NEAR(g.loss, c.loss, bound * c.loss);
  expect_same(again.logits, g.logits, "logits on a second run");
  expect_same(again.grads, g.grads, "dense gradients on a second run");
  expect_same(again.dU, g.dU, "d_user_rows on a second run");
  expect_same(again.dI, g.dI, "d_item_rows on a second run");
}

// Layer 0 against a table of per-item products (evaluation by items, and layer 0 by item
// in training): the same adds in the same order on both devices, so the same bits, on the
// vector paths (out % 4 for FP32, out % 8 for the BF16 octets) and the scalar ones; with
// ReLU the layer-0 bit mask too, written in passing (out % 128 FP32, % 256 BF16) or after;
// a bias that is 16-byte aligned (vector loads) and one that is not (n = 7).
TEST_F(Parity, GatherBiasActIsTheCpuTwinBitForBit) {
  const int64_t R = 97;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3000}})
    for (int S : {1, 5, 51})
      for (int out : {1, 8, 13, 64, 128, 256})
        for (bool relu : {false, true}) {
          const std::string what = shape({{"n", n}, {"S", S}, {"out", out}, {"relu", relu}});
          const int64_t B = n * S;
          if (out >= 128 && B > 20000) continue;  // the mask widths at the smaller batches
          // At n = 7 the bias starts one float into its buffer: the kernels' scalar loads
          // of a bias that is not 16-byte aligned.
          const size_t shift = n == 7 ? 1 : 0;
          const Vec P = random_vec(size_t(R) * out, gen_), Yg = random_vec(size_t(n) * out, gen_),
                    bias_buf = random_vec(size_t(out) + shift, gen_);
          const Vec bias(bias_buf.begin() + std::ptrdiff_t(shift), bias_buf.end());
          const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
          Buffer<float> gP = up(P), gYg = up(Yg), gb_buf = up(bias_buf),
                        gY = up(Vec(size_t(B) * out));
          Buffer<int32_t> gids = up(ids);
          Buffer<uint16_t> gY16 = up(Bits(size_t(B) * out));
          Vec Y(size_t(B) * out);
          Bits Y16(size_t(B) * out);
          const float* b = relu ? bias.data() : nullptr;  // with and without a bias
          const float* gbp = relu ? gb_buf.data() + shift : nullptr;
          const std::vector<uint32_t> junk(size_t(B * relu_mask_words(out)), 0xDEADBEEFu);
          std::vector<uint32_t> m = junk, m16 = junk;
          Buffer<uint32_t> gm = up(junk), gm16 = up(junk);
          uint32_t* mp = relu ? m.data() : nullptr;  // a mask with ReLU only
          uint32_t* gmp = relu ? gm.data() : nullptr;
          gather_bias_act(cpu_, P.data(), R, ids.data(), Yg.data(), b, Y.data(), n, S, out, relu,
                          mp);
          gather_bias_act(gpu_, gP.data(), R, gids.data(), gYg.data(), gbp, gY.data(), n, S, out,
                          relu, gmp);
          expect_same(down(gY), Y, what + " gather_bias_act");
          gather_bias_act_bf16(cpu_, P.data(), R, ids.data(), Yg.data(), b, Y16.data(), n, S, out,
                               relu, relu ? m16.data() : nullptr);
          gather_bias_act_bf16(gpu_, gP.data(), R, gids.data(), gYg.data(), gbp, gY16.data(), n, S,
                               out, relu, relu ? gm16.data() : nullptr);
          expect_same(down(gY16), Y16, what + " gather_bias_act_bf16");
          EXPECT_EQ(down(gm), m) << what << " gather_bias_act's mask";
          EXPECT_EQ(down(gm16), m16) << what << " gather_bias_act_bf16's mask";
        }
}

// Layer 0 by item's ops on the device (the batch's runs of items from CUB's radix sort,
// the runs' rows, the per-run sums in double, the runs' rows put back on their first
// samples, the BF16 and TF32 splits): the same arrays and the same bits as the CPU twins,
// on the vector paths (out % 4) and the scalar ones, with hot ids (long runs) and bounds
// that leave runs empty. (gather_bias_act's masks: GatherBiasActIsTheCpuTwinBitForBit.)
TEST_F(Parity, Layer0ByItemOpsAreTheCpuTwinsBitForBit) {
  for (int64_t B : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3000}, gpu_scale(200003, 20011)})
    for (int64_t bound : {int64_t{1}, int64_t{50}, int64_t{30011}}) {
      IVec ids = random_ids(size_t(B), 0, int32_t(bound), gen_);
      for (size_t b = 0; b < ids.size(); b += 3) ids[b] = int32_t(b % 4) % int32_t(bound);
      const int64_t R = std::min(B, bound) + 1;
      const std::string what = shape({{"B", B}, {"bound", bound}});
      IVec order(static_cast<size_t>(B)), starts(static_cast<size_t>(R) + 1),
          inv(static_cast<size_t>(B)), first(static_cast<size_t>(R));
      item_runs(cpu_, ids.data(), B, bound, R, order.data(), starts.data(), inv.data(),
                first.data());
      Buffer<int32_t> gids = up(ids), gorder = up(IVec(size_t(B), -9)),
                      gstarts = up(IVec(size_t(R) + 1, -9)), ginv = up(IVec(size_t(B), -9)),
                      gfirst = up(IVec(size_t(R), -9));
      item_runs(gpu_, gids.data(), B, bound, R, gorder.data(), gstarts.data(), ginv.data(),
                gfirst.data());
      EXPECT_EQ(down(gorder), order) << what << " order";
      EXPECT_EQ(down(gstarts), starts) << what << " starts";
      EXPECT_EQ(down(ginv), inv) << what << " inv";
      EXPECT_EQ(down(gfirst), first) << what << " first";
      const int w = 13, ldx = 17;
      const Vec X = random_vec(size_t(B) * ldx, gen_);
      Buffer<float> gX = up(X), gXr = up(Vec(size_t(R) * w, -1.0f));
      Vec Xr(size_t(R) * w);
      gather_run_rows(cpu_, X.data(), ldx, w, first.data(), R, Xr.data());
      gather_run_rows(gpu_, gX.data(), ldx, w, gfirst.data(), R, gXr.data());
      expect_same(down(gXr), Xr, what + " gather_run_rows");
      // The runs' rows by item id (put_run_rows), two parts.
      if (B > 0) {
        const int pw = 6;
        const Vec Yr = random_vec(size_t(2 * R) * pw, gen_);
        Vec Y(size_t(bound) * pw, 3.0f);
        Buffer<float> gYr = up(Yr), gY = up(Y);
        put_run_rows(cpu_, Yr.data(), R, 2, pw, ids.data(), first.data(), bound, Y.data(), pw);
        put_run_rows(gpu_, gYr.data(), R, 2, pw, gids.data(), gfirst.data(), bound, gY.data(), pw);
        expect_same(down(gY), Y, what + " put_run_rows");
      }
      // The same rows from a table by the samples' ids.
      if (B > 0) {
        const Vec T = random_vec(size_t(bound) * ldx, gen_);
        Buffer<float> gT = up(T), gTr = up(Vec(size_t(R) * w, -1.0f));
        Vec Tr(size_t(R) * w);
        gather_run_rows(cpu_, T.data(), ldx, w, first.data(), R, Tr.data(), ids.data());
        gather_run_rows(gpu_, gT.data(), ldx, w, gfirst.data(), R, gTr.data(), gids.data());
        expect_same(down(gTr), Tr, what + " gather_run_rows by id");
      }
      for (int out : {1, 8, 13, 64, 128, 256}) {
        if (B > 3000 && out < 64) continue;  // the large batch on the vector paths only
        Vec dZ = random_vec(size_t(B) * out, gen_);
        for (size_t i = 0; i < dZ.size(); i += 7) dZ[i] *= 4096.0f;
        const Bits dZ16 = bf16_bits_of(dZ);
        Buffer<float> gdZ = up(dZ), gdP = up(Vec(size_t(R) * out, -1.0f)),
                      gdP16 = up(Vec(size_t(R) * out, -1.0f));
        Buffer<uint16_t> gdZ16 = up(dZ16);
        Vec dP(size_t(R) * out), dP16(size_t(R) * out);
        run_sums(cpu_, dZ.data(), order.data(), starts.data(), R, out, dP.data());
        run_sums_bf16(cpu_, dZ16.data(), order.data(), starts.data(), R, out, dP16.data());
        const std::string o = what + "out=" + std::to_string(out);
        // Every kernel: by warp (out = 128, 256) or by thread, FP32 and BF16 rows.
        {
          const std::string k = out % 128 == 0 ? " by warp" : " by thread";
          gdP = up(Vec(size_t(R) * out, -1.0f));
          run_sums(gpu_, gdZ.data(), gorder.data(), gstarts.data(), R, out, gdP.data());
          expect_same(down(gdP), dP, o + " run_sums," + k);
          gdP16 = up(Vec(size_t(R) * out, -1.0f));
          run_sums_bf16(gpu_, gdZ16.data(), gorder.data(), gstarts.data(), R, out, gdP16.data());
          expect_same(down(gdP16), dP16, o + " run_sums_bf16," + k);
        }
      }
    }
  // scatter_run_rows: each run's parts (2) on its first sample, the row stride of d_item_rows,
  // four samples per thread (B not a multiple of four).
  {
    const int64_t B = 20011, bound = 3001, R = bound, ld = 192;
    const int w = 128;
    const IVec ids = random_ids(size_t(B), 0, int32_t(bound), gen_);
    IVec order(static_cast<size_t>(B)), starts(static_cast<size_t>(R) + 1),
        inv(static_cast<size_t>(B)), first(static_cast<size_t>(R));
    item_runs(cpu_, ids.data(), B, bound, R, order.data(), starts.data(), inv.data(), first.data());
    const Vec Yr = random_vec(size_t(2 * R) * w, gen_);
    for (int64_t offset : {int64_t{64}, int64_t{1}}) {  // 1: the scalar path
      Vec Y(size_t(B) * ld, 5.0f);
      scatter_run_rows(cpu_, Yr.data(), R, 2, w, inv.data(), first.data(), B, Y.data() + offset,
                       ld);
      Buffer<float> gYr = up(Yr), gY = up(Vec(size_t(B) * ld, 5.0f));
      Buffer<int32_t> ginv = up(inv), gfirst = up(first);
      scatter_run_rows(gpu_, gYr.data(), R, 2, w, ginv.data(), gfirst.data(), B, gY.data() + offset,
                       ld);
      expect_same(down(gY), Y, "scatter_run_rows, offset " + std::to_string(offset));
    }
  }
  // split_bf16's and split_tf32's two parts.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{100003}}) {
    {
      const Vec X = random_vec(size_t(n), gen_, -3.0f, 3.0f);
      Vec hi(static_cast<size_t>(n)), lo(static_cast<size_t>(n));
      split_tf32(cpu_, X.data(), n, hi.data(), lo.data());
      Buffer<float> gX = up(X), ghi = up(Vec(size_t(n))), glo = up(Vec(size_t(n)));
      split_tf32(gpu_, gX.data(), n, ghi.data(), glo.data());
      expect_same(down(ghi), hi, "split_tf32 hi, n=" + std::to_string(n));
      expect_same(down(glo), lo, "split_tf32 lo, n=" + std::to_string(n));
    }
    const Vec X = random_vec(size_t(n), gen_, -3.0f, 3.0f);
    Bits hi(static_cast<size_t>(n)), lo(static_cast<size_t>(n));
    split_bf16(cpu_, X.data(), n, hi.data(), lo.data());
    Buffer<float> gX = up(X);
    Buffer<uint16_t> ghi = up(Bits(size_t(n))), glo = up(Bits(size_t(n)));
    split_bf16(gpu_, gX.data(), n, ghi.data(), glo.data());
    EXPECT_EQ(down(ghi), hi) << "split_bf16 hi, n=" << n;
    EXPECT_EQ(down(glo), lo) << "split_bf16 lo, n=" << n;
  }
}

// NeuMF's step with layer 0 by item on the device against the CPU twin by item (FP32:
// within the GEMMs' summation order; BF16 storage: within the bound of
// NeuMFOnBf16StorageTracksTheCpuAndRepeatsItself plus the per-item sums' rounding), against
// the device's own per-sample step within test_layer0_items.cc's bounds, and the same bits
// twice.
TEST_F(Parity, NeuMFLayer0ByItemTracksTheCpuAndRepeatsItself) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 256, 32, 16};
  const int64_t n = 700, items = 301;
  const int S = 5, D = cfg.embedding_width();
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  set_layer0_by_item(Layer0ByItem::kOn);  // the CPU twin by item too
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec table = random_vec(size_t(items) * D, gen_, -0.5f, 0.5f);
  const IVec ids = random_ids(size_t(B), 0, int32_t(items), gen_);
  const Vec I = test::rows_by_id(table, ids, D);
  Vec labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  struct Out {
    Vec logits, grads, dU, dI;
    double loss = 0;
    bool by_item = false;
  };
  Buffer<float> gU = up(U), gI = up(I), glabels = up(labels);
  Buffer<int32_t> gids = up(ids);
  auto run = [&](NeuMF& model, const ExecContext& ctx, bool dev, bool by_item) {
    Buffer<float> logits = up(Vec(size_t(B), 0.0f)), dlogits = up(Vec(size_t(B), 0.0f)),
                  dU = up(Vec(size_t(n) * D, 0.0f)), dI = up(Vec(size_t(B) * D, 0.0f));
    Buffer<double> loss = up(std::vector<double>{0.0});
    if (dev) {
      model.forward_backward(ctx, gU.data(), gI.data(), n, S, glabels.data(), B, logits.data(),
                             dlogits.data(), loss.data(), dU.data(), dI.data(),
                             by_item ? ItemKeys{gids.data(), items} : ItemKeys{});
      return Out{down(logits), down(model.grads()), down(dU),
                 down(dI),     down(loss)[0],       model.layer0_by_item()};
    }
    Out o{Vec(size_t(B)), Vec(), Vec(size_t(n) * D), Vec(size_t(B) * D), 0.0, false};
    Vec dl(static_cast<size_t>(B));
    model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), B, o.logits.data(),
                           dl.data(), &o.loss, o.dU.data(), o.dI.data(),
                           by_item ? ItemKeys{ids.data(), items} : ItemKeys{});
    o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
    o.by_item = model.layer0_by_item();
    return o;
  };
  for (MathMode mode : {MathMode::kFp32, MathMode::kBf16}) {
    set_math_mode(mode);
    const bool bf16 = mode == MathMode::kBf16;
    const std::string m = bf16 ? "BF16 storage" : "FP32";
    const Out c = run(cpu_model, cpu_, false, true), g = run(dev_model, gpu_, true, true);
    const Out again = run(dev_model, gpu_, true, true);
    const Out per_sample = run(dev_model, gpu_, true, false);
    ASSERT_TRUE(c.by_item && g.by_item) << m;
    ASSERT_FALSE(per_sample.by_item) << m;
    const double L = double(cpu_model.tower().size());
    const double vs_cpu = bf16 ? (2.0 * L + 1.0) / 256.0 : 1e-5;
    const double vs_sample = bf16 ? (2.0 * L + 1.0) / 256.0 : 1e-5;
    auto check = [&](const Vec& dev, const Vec& cpu, const Vec& ps, size_t off, size_t count,
                     const std::string& what) {
      const double e = test::relative_rms(dev.data() + off, cpu.data() + off, count);
      EXPECT_LE(e, vs_cpu) << m << ", " << what << ": device vs CPU, relative RMS";
      const double p = test::relative_rms(dev.data() + off, ps.data() + off, count);
      EXPECT_LE(p, vs_sample) << m << ", " << what << ": by item vs per sample, relative RMS";
    };
    check(g.logits, c.logits, per_sample.logits, 0, size_t(B), "logits");
    for (const DenseLayerView& v : cpu_model.tower()) {
      const std::string l = "layer " + std::to_string(v.in) + "->" + std::to_string(v.out);
      check(g.grads, c.grads, per_sample.grads, size_t(v.w_offset), size_t(v.in) * v.out,
            l + " dW");
      check(g.grads, c.grads, per_sample.grads, size_t(v.b_offset), size_t(v.out), l + " db");
    }
    check(g.dU, c.dU, per_sample.dU, 0, c.dU.size(), "d_user_rows");
    {  // d_item_rows: the device against the CPU per sample (both by item); against the
       // per-sample step as each item's sum over its samples
      const double e = test::relative_rms(g.dI.data(), c.dI.data(), c.dI.size());
      EXPECT_LE(e, vs_cpu) << m << ", d_item_rows: device vs CPU, relative RMS";
      const Vec gi = test::sum_rows_by_id(g.dI, ids, items, D),
                pi = test::sum_rows_by_id(per_sample.dI, ids, items, D);
      const double p = test::relative_rms(gi.data(), pi.data(), gi.size());
      EXPECT_LE(p, vs_sample) << m << ", d_item_rows summed per item: by item vs per sample";
    }
    EXPECT_NEAR(g.loss, c.loss, vs_cpu * c.loss) << m;
    expect_same(again.logits, g.logits, m + " logits on a second run");
    expect_same(again.grads, g.grads, m + " dense gradients on a second run");
    expect_same(again.dI, g.dI, m + " d_item_rows on a second run");
  }
}

}  // namespace
}  // namespace ncf
