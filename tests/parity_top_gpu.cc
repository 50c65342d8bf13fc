// GPU parity of NeuMF's top (model/ops_top.h): the fused top against the unfused ops,
// reading item rows by id, and BCE-with-logits on padding, weights and extremes.
#include "parity_gpu.h"

namespace ncf {
namespace {

// The fused top of NeuMF (neumf_top_forward / neumf_top_backward, NeuMF's path
// where the widths allow) against the unfused ops it replaces, run on the
// GPU on the same inputs (repeat_rows, gmf_forward, concat_cols, head_forward,
// bce_with_logits_*, head_backward, split_cols, the last Linear's mask and bias
// sums in linear_backward, gmf_backward, group_sum_backward), and against its CPU
// twin. Every element it writes (logits, the masked dA, the items' and users' GMF
// gradients) is the same bits as the unfused GPU ops'; its sums (dw, dc, db, the
// loss) take another fixed order: within a double sum's rounding of theirs, and
// the same bits on a second run. Against the CPU: with dlogits given, the
// elements bit for bit; from labels, the logits' gradient goes through each
// device's expf, so within the element tolerance. Shapes: GMF and tower widths
// below, at and past 32 lanes, groups longer than the rows in flight and than a
// warp (S = 51: the forward's two pieces of a group), rows with a stride past mf, n = 0,
// the ml-20m MLPerf step's shapes and evaluation's groups of 1 + 999 (GPU only).
// The fused top's forward reading item rows by id (evaluation's candidates) on the
// device: the bits of its forward on the same rows gathered per sample, and the CPU
// twin's by id to a dot product's rounding; FP32 and BF16 A, a GMF width below one
// warp and one of two warps, groups of one piece (S = 11) and of many (S = 1001, the
// last piece shorter).
TEST_F(Parity, TopForwardReadsItemRowsByIdAsGatheredOnTheGpu) {
  const int64_t R = 97;
  const int last = 64, ldt = 192;
  struct Shape {
    int64_t n;
    int S;
  };
  for (const Shape& shape : {Shape{301, 11}, Shape{4, 1001}})
    for (int mf : {20, 64}) {
      const int64_t n = shape.n;
      const int S = shape.S;
      const int64_t B = n * S;
      const std::string what =
          "n " + std::to_string(n) + " S " + std::to_string(S) + " mf " + std::to_string(mf);
      const Vec U = random_vec(size_t(n) * ldt, gen_, -0.5f, 0.5f);
      const Vec T = random_vec(size_t(R) * ldt, gen_, -0.5f, 0.5f);
      const Vec A = random_vec(size_t(B) * last, gen_, 0.0f, 0.5f);
      const Vec w = random_vec(size_t(mf + last), gen_, -0.3f, 0.3f), c = {0.125f};
      const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
      const Vec rows = test::rows_by_id(T, ids, ldt);
      const Bits A16 = bf16_bits_of(A);
      Buffer<float> gU = up(U), gT = up(T), grows = up(rows), gA = up(A), gw = up(w), gc = up(c),
                    gby = up(Vec(size_t(B))), ggat = up(Vec(size_t(B)));
      Buffer<uint16_t> gA16 = up(A16);
      Buffer<int32_t> gids = up(ids);
      for (bool bf16 : {false, true}) {
        const std::string tag = what + (bf16 ? " BF16 A" : " FP32 A");
        Vec cpu_by_id(static_cast<size_t>(B));
        if (bf16) {
          neumf_top_forward_bf16(gpu_, gU.data(), ldt, gT.data(), ldt, gA16.data(), gw.data(),
                                 gc.data(), gby.data(), n, S, mf, last, gids.data());
          neumf_top_forward_bf16(gpu_, gU.data(), ldt, grows.data(), ldt, gA16.data(), gw.data(),
                                 gc.data(), ggat.data(), n, S, mf, last);
          neumf_top_forward_bf16(cpu_, U.data(), ldt, T.data(), ldt, A16.data(), w.data(), c.data(),
                                 cpu_by_id.data(), n, S, mf, last, ids.data());
        } else {
          neumf_top_forward(gpu_, gU.data(), ldt, gT.data(), ldt, gA.data(), gw.data(), gc.data(),
                            gby.data(), n, S, mf, last, gids.data());
          neumf_top_forward(gpu_, gU.data(), ldt, grows.data(), ldt, gA.data(), gw.data(),
                            gc.data(), ggat.data(), n, S, mf, last);
          neumf_top_forward(cpu_, U.data(), ldt, T.data(), ldt, A.data(), w.data(), c.data(),
                            cpu_by_id.data(), n, S, mf, last, ids.data());
        }
        expect_same(down(gby), down(ggat), tag + ": by id vs gathered");
        // The CPU twin sums the dot product in column order, the device in lane order.
        expect_close(down(gby), cpu_by_id, 1e-6 * (mf + last), kElemRtol,
                     tag + ": vs the CPU twin");
      }
    }
}

TEST_F(Parity, FusedTopIsTheUnfusedOpsOnTheGpu) {
  struct TopCase {
    int64_t n;
    int S, mf, last;
  };
  const TopCase cases[] = {{0, 5, 8, 8},      {1, 1, 3, 5},        {37, 5, 8, 8},
                           {3000, 5, 64, 64}, {777, 51, 40, 33},   {100, 9, 128, 128},
                           {2000, 5, 8, 100}, {209715, 5, 64, 64}, {3, 1000, 64, 64}};
  for (const TopCase& c : cases)
    for (bool from_labels : {true, false}) {
      const int64_t B = c.n * c.S;
      const int mf = c.mf, last = c.last, F = mf + last;
      const int64_t ld = mf + 17;  // the gathered rows: GMF columns, then others
      if (!on_gpu() && B * (ld + last) > (int64_t{1} << 24)) continue;
      const std::string what =
          shape({{"n", c.n}, {"S", c.S}, {"mf", mf}, {"last", last}, {"from_labels", from_labels}});
      Vec U = random_vec(size_t(c.n) * ld, gen_), I = random_vec(size_t(B) * ld, gen_);
      Vec A = random_vec(size_t(B) * last, gen_, -0.5f, 1.0f);
      for (float& a : A) a = std::max(a, 0.0f);  // a ReLU output: a third exactly 0
      Vec wc = random_vec(size_t(F) + 1, gen_), labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
      for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
      Vec dlogits = random_vec(size_t(B), gen_, -1.0f / 64, 1.0f / 64);
      const int64_t global_batch = B + 3;
      const float* dl = from_labels ? nullptr : dlogits.data();
      // CPU twin.
      Vec logits(size_t(B), 0.0f), dA(size_t(B) * last, 3.0f), dU(size_t(c.n) * ld, 4.0f),
          dI(size_t(B) * ld, 5.0f), dwc(size_t(F) + 1, 6.0f), db(size_t(last), 7.0f);
      double loss = -1.0;
      neumf_top_forward(cpu_, U.data(), ld, I.data(), ld, A.data(), wc.data(), wc.data() + F,
                        logits.data(), c.n, c.S, mf, last);
      neumf_top_backward(cpu_, U.data(), ld, I.data(), ld, A.data(), wc.data(), dl,
                         from_labels ? logits.data() : nullptr,
                         from_labels ? labels.data() : nullptr, global_batch,
                         from_labels ? &loss : nullptr, dA.data(), dU.data(), ld, dI.data(), ld,
                         dwc.data(), dwc.data() + F, db.data(), c.n, c.S, mf, last, true);
      // The fused ops on the device, twice.
      Buffer<float> gU = up(U), gI = up(I), gA = up(A), gwc = up(wc), glabels = up(labels),
                    gdl = up(dlogits);
      struct Fused {
        Vec logits, dA, dU, dI, dwc, db;
        double loss = -1.0;
      };
      auto fused = [&] {
        Buffer<float> glogits = up(Vec(size_t(B), 0.0f)), gdA = up(Vec(dA.size(), 3.0f)),
                      gdU = up(Vec(dU.size(), 4.0f)), gdI = up(Vec(dI.size(), 5.0f)),
                      gdwc = up(Vec(dwc.size(), 6.0f)), gdb = up(Vec(db.size(), 7.0f));
        Buffer<double> gloss = up(std::vector<double>{-1.0});
        neumf_top_forward(gpu_, gU.data(), ld, gI.data(), ld, gA.data(), gwc.data(), gwc.data() + F,
                          glogits.data(), c.n, c.S, mf, last);
        neumf_top_backward(
            gpu_, gU.data(), ld, gI.data(), ld, gA.data(), gwc.data(),
            from_labels ? nullptr : gdl.data(), from_labels ? glogits.data() : nullptr,
            from_labels ? glabels.data() : nullptr, global_batch,
            from_labels ? gloss.data() : nullptr, gdA.data(), gdU.data(), ld, gdI.data(), ld,
            gdwc.data(), gdwc.data() + F, gdb.data(), c.n, c.S, mf, last, true);
        return Fused{down(glogits), down(gdA), down(gdU),     down(gdI),
                     down(gdwc),    down(gdb), down(gloss)[0]};
      };
      const Fused f = fused();
      // The unfused ops on the device.
      Buffer<float> gug = up(Vec(size_t(B) * mf, 0.0f)), gG = up(Vec(size_t(B) * mf, 0.0f)),
                    gH = up(Vec(size_t(B) * F, 0.0f)), gdH = up(Vec(size_t(B) * F, 0.0f)),
                    gdG = up(Vec(size_t(B) * mf, 0.0f)), gdug = up(Vec(size_t(B) * mf, 0.0f));
      Buffer<float> glogits = up(Vec(size_t(B), 0.0f)), ggrad = up(Vec(size_t(B), 0.0f)),
                    gdA = up(Vec(dA.size(), 3.0f)), gdU = up(Vec(dU.size(), 4.0f)),
                    gdI = up(Vec(dI.size(), 5.0f)), gdwc = up(Vec(dwc.size(), 6.0f)),
                    gdb = up(Vec(db.size(), 7.0f));
      Buffer<float> gX = up(Vec(size_t(B), 1.0f)), gW = up(Vec(size_t(last), 1.0f)),
                    gdW = up(Vec(size_t(last), 0.0f));
      Buffer<double> gloss = up(std::vector<double>{-1.0});
      repeat_rows(gpu_, gU.data(), ld, mf, gug.data(), c.n, c.S);
      gmf_forward(gpu_, gug.data(), mf, gI.data(), ld, gG.data(), mf, B, mf);
      concat_cols(gpu_, gG.data(), mf, mf, gA.data(), last, last, gH.data(), B);
      head_forward(gpu_, gH.data(), gwc.data(), gwc.data() + F, glogits.data(), B, F);
      const float* grad = gdl.data();
      if (from_labels) {
        bce_with_logits_forward(gpu_, glogits.data(), glabels.data(), nullptr, gloss.data(), B, B,
                                global_batch);
        bce_with_logits_backward(gpu_, glogits.data(), glabels.data(), nullptr, ggrad.data(), B, B,
                                 global_batch);
        grad = ggrad.data();
      }
      head_backward(gpu_, gH.data(), gwc.data(), grad, gdH.data(), gdwc.data(), gdwc.data() + F, B,
                    F, GradMode::kOverwrite);
      split_cols(gpu_, gdH.data(), mf, last, gdG.data(), mf, gdA.data(), last, B);
      // The last Linear's backward masks dA and sums db (its product: in = 1).
      linear_backward(gpu_, gX.data(), gW.data(), gA.data(), gdA.data(), nullptr, gdW.data(),
                      gdb.data(), B, 1, last, true, GradMode::kOverwrite);
      gmf_backward(gpu_, gug.data(), mf, gI.data(), ld, gdG.data(), mf, gdug.data(), mf, gdI.data(),
                   ld, B, mf);
      group_sum_backward(gpu_, nullptr, gdug.data(), c.n, c.S, mf, gdU.data(), ld, nullptr, false);
      expect_same(f.logits, down(glogits), what + "logits, fused vs unfused");
      expect_same(f.dA, down(gdA), what + "masked dA, fused vs unfused");
      expect_same(f.dI, down(gdI), what + "item GMF gradients (other columns untouched)");
      expect_same(f.dU, down(gdU), what + "user GMF gradients (other columns untouched)");
      expect_close(f.dwc, down(gdwc), kDoubleSumAtol, kDoubleSumRtol, what + "dw, dc");
      expect_close(f.db, down(gdb), kDoubleSumAtol, kDoubleSumRtol, what + "db");
      if (from_labels)
        expect_close(std::vector<double>{f.loss}, down(gloss), kDoubleAtol, kDoubleRtol,
                     what + "loss");
      else
        EXPECT_EQ(f.loss, -1.0) << what << "no loss with dlogits given";
      const Fused again = fused();
      expect_same(again.logits, f.logits, what + "logits on a second run");
      expect_same(again.dwc, f.dwc, what + "dw, dc on a second run");
      expect_same(again.db, f.db, what + "db on a second run");
      expect_same(std::vector<double>{again.loss}, std::vector<double>{f.loss},
                  what + "loss on a second run");
      // Against the CPU twin.
      expect_close(f.logits, logits, 1e-6 * F, kElemRtol, what + "logits vs the CPU twin");
      if (!from_labels) {
        expect_same(f.dA, dA, what + "dA vs the CPU twin");
        expect_same(f.dI, dI, what + "dI vs the CPU twin");
        expect_same(f.dU, dU, what + "dU vs the CPU twin");
      } else {
        expect_close(f.dA, dA, kElemAtol, kElemRtol, what + "dA vs the CPU twin");
        expect_close(f.dI, dI, kElemAtol, kElemRtol, what + "dI vs the CPU twin");
        expect_close(f.dU, dU, kElemAtol, kElemRtol, what + "dU vs the CPU twin");
        expect_loss_close(f.loss, loss, f.logits, logits, kDoubleAtol, kDoubleRtol,
                          what + "loss vs the CPU twin");
      }
      expect_close(f.dwc, dwc, kDoubleSumAtol, kDoubleSumRtol, what + "dw, dc vs the CPU twin");
      expect_close(f.db, db, kDoubleSumAtol, kDoubleSumRtol, what + "db vs the CPU twin");
    }
}

TEST_F(Parity, BceWithLogitsPaddingWeightsAndExtremes) {
  for (int64_t B : kBatches)
    for (bool with_weights : {false, true})
      for (int64_t n_valid : {B, B / 2}) {
        const std::string what = shape({{"B", B}, {"n_valid", n_valid}, {"weights", with_weights}});
        Vec z = random_vec(B, gen_, -8.0f, 8.0f), y(B), wts(B);
        std::bernoulli_distribution coin(0.5), keep(0.8);
        for (int64_t b = 0; b < B; ++b) {
          y[b] = coin(gen_) ? 1.0f : 0.0f;
          wts[b] = keep(gen_) ? 1.0f : 0.0f;
          if (b % 97 == 3) z[b] = (b % 2 ? 1.0f : -1.0f) * (b % 3 ? 100.0f : 1e4f);
          if (with_weights && wts[b] == 0.0f && b % 5 == 0)
            z[b] = std::numeric_limits<float>::quiet_NaN();  // masked rows may hold garbage
          if (b >= n_valid && b % 7 == 0) z[b] = std::numeric_limits<float>::infinity();
        }
        const int64_t global = B + 5;
        Buffer<float> gz = up(z), gy = up(y), gw = up(wts);
        Buffer<double> gloss(g_dev, 1);
        double loss = -1.0;
        const float* cw = with_weights ? wts.data() : nullptr;
        const float* gwp = with_weights ? gw.data() : nullptr;
        bce_with_logits_forward(cpu_, z.data(), y.data(), cw, &loss, B, n_valid, global);
        bce_with_logits_forward(gpu_, gz.data(), gy.data(), gwp, gloss.data(), B, n_valid, global);
        expect_close(down(gloss), std::vector<double>{loss}, kDoubleAtol, kDoubleRtol,
                     what + "loss");
        Vec dz(B, 3.0f);
        Buffer<float> gdz = up(dz);
        bce_with_logits_backward(cpu_, z.data(), y.data(), cw, dz.data(), B, n_valid, global);
        bce_with_logits_backward(gpu_, gz.data(), gy.data(), gwp, gdz.data(), B, n_valid, global);
        // sigmoid(z) − y in float: where sigmoid(z) ≈ y the difference keeps only the
        // last bits of sigmoid, so a few ulp of 1 (1.2e-7 each), scaled by 1/global.
        expect_close(down(gdz), dz, 4 * 1.2e-7 / double(global), kElemRtol, what + "dlogits");
      }
}

}  // namespace
}  // namespace ncf
