// GPU parity of the dense ops (model/ops_*.h): fill, the FP32 and TF32 GEMMs and Linear
// layers, GMF, the group ops, the column copies, the head, the column sums at large
// batches and the streaming step kernels and BF16 operand copies against their CPU twins.
#include "parity_gpu.h"

namespace ncf {
namespace {

// ---- ops.h ------------------------------------------------------------------------------

TEST_F(Parity, Fill) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    Vec c(n, -1.0f);
    Buffer<float> g = up(c);
    fill(cpu_, c.data(), n, 2.5f);
    fill(gpu_, g.data(), n, 2.5f);
    expect_same(down(g), c, shape({{"n", n}}));
  }
}

// C = alpha·op(A)·op(B) + beta·C, both devices, padded leading dimensions.
void gemm_case(const ExecContext& cpu, const ExecContext& gpu, std::mt19937& gen, bool ta, bool tb,
               int M, int N, int K, float beta, double atol_per_sqrt_k, double rtol) {
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
  const int a_rows = ta ? K : M, b_rows = tb ? N : K;
  Vec A = random_vec(size_t(a_rows) * lda, gen), Bm = random_vec(size_t(b_rows) * ldb, gen);
  Vec C = random_vec(size_t(M) * ldc, gen);
  if (beta == 0.0f) std::fill(C.begin(), C.end(), std::numeric_limits<float>::quiet_NaN());
  Buffer<float> gA = up(A), gB = up(Bm), gC = up(C);
  gemm(cpu, ta, tb, M, N, K, 1.5f, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
  gemm(gpu, ta, tb, M, N, K, 1.5f, gA.data(), lda, gB.data(), ldb, beta, gC.data(), ldc);
  const double atol = atol_per_sqrt_k * 1.5 * std::sqrt(std::max(K, 1));
  expect_close(down(gC), C, atol, rtol,
               shape({{"ta", ta}, {"tb", tb}, {"M", M}, {"N", N}, {"K", K}}) +
                   "beta=" + std::to_string(beta));
}

TEST_F(Parity, GemmFp32AllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : kGemmShapes)
        for (float beta : {0.0f, 0.5f})
          gemm_case(cpu_, gpu_, gen_, ta, tb, s[0], s[1], s[2], beta, kGemmAtolPerSqrtK, kGemmRtol);
}

TEST_F(Parity, GemmTf32AllTransposes) {
  set_math_mode(MathMode::kTf32);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : kGemmShapes)
        gemm_case(cpu_, gpu_, gen_, ta, tb, s[0], s[1], s[2], 0.5f, kTf32AtolPerSqrtK, kTf32Rtol);
}

// weights and bias sit at float offset `offset` of a flat buffer, as in NeuMF's
// parameter buffer: offset 1 leaves them only 4-byte aligned.
void linear_forward_sweep(const ExecContext& cpu, const ExecContext& gpu, std::mt19937& gen,
                          double atol_per_sqrt_k, double rtol) {
  for (const auto& s : kLayerShapes)
    for (int64_t B : kBatches)
      for (int offset : {0, 1})
        for (bool with_bias : {false, true})
          for (bool relu : {false, true}) {
            const int in = s[0], out = s[1];
            Vec X = random_vec(size_t(B) * in, gen);
            Vec P = random_vec(size_t(offset) + size_t(out) * in + out, gen);
            Vec Y(size_t(B) * out, 7.0f);
            Buffer<float> gX = up(X), gP = up(P), gY = up(Y);
            const float* weights = P.data() + offset;
            const float* bias = with_bias ? weights + size_t(out) * in : nullptr;
            const float* gweights = gP.data() + offset;
            const float* gbias = with_bias ? gweights + size_t(out) * in : nullptr;
            linear_forward(cpu, X.data(), weights, bias, Y.data(), B, in, out, relu);
            linear_forward(gpu, gX.data(), gweights, gbias, gY.data(), B, in, out, relu);
            expect_close(down(gY), Y, atol_per_sqrt_k * std::sqrt(in), rtol,
                         shape({{"B", B},
                                {"in", in},
                                {"out", out},
                                {"offset", offset},
                                {"bias", with_bias},
                                {"relu", relu}}));
          }
}

TEST_F(Parity, LinearForwardFp32) {
  linear_forward_sweep(cpu_, gpu_, gen_, kGemmAtolPerSqrtK, kGemmRtol);
}

TEST_F(Parity, LinearForwardTf32) {
  set_math_mode(MathMode::kTf32);
  linear_forward_sweep(cpu_, gpu_, gen_, kTf32AtolPerSqrtK, kTf32Rtol);
}

TEST_F(Parity, LinearBackwardFp32) {
  for (const auto& s : kLayerShapes)
    for (int64_t B : kBatches)
      for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate})
        for (int variant = 0; variant < 4; ++variant) {
          // 0: relu, dX and db; 1: no relu (Y null); 2: relu, no db (mask kernel); 3: relu, no dX.
          const bool relu = variant != 1, with_db = variant != 2, with_dx = variant != 3;
          const int in = s[0], out = s[1];
          const std::string what = shape({{"B", B},
                                          {"in", in},
                                          {"out", out},
                                          {"variant", variant},
                                          {"accumulate", mode == GradMode::kAccumulate}});
          Vec X = random_vec(size_t(B) * in, gen_), weights = random_vec(size_t(out) * in, gen_);
          Vec Y = random_vec(size_t(B) * out, gen_);  // a post-ReLU output: about half zeros
          for (float& y : Y) y = std::max(y, 0.0f);
          Vec dY = random_vec(size_t(B) * out, gen_), dX(size_t(B) * in, 9.0f);
          Vec dweights = random_vec(size_t(out) * in, gen_), db = random_vec(out, gen_);
          Buffer<float> gX = up(X), gweights = up(weights), gY = up(Y), gdY = up(dY), gdX = up(dX),
                        gdweights = up(dweights), gdb = up(db);
          linear_backward(cpu_, X.data(), weights.data(), relu ? Y.data() : nullptr, dY.data(),
                          with_dx ? dX.data() : nullptr, dweights.data(),
                          with_db ? db.data() : nullptr, B, in, out, relu, mode);
          linear_backward(gpu_, gX.data(), gweights.data(), relu ? gY.data() : nullptr, gdY.data(),
                          with_dx ? gdX.data() : nullptr, gdweights.data(),
                          with_db ? gdb.data() : nullptr, B, in, out, relu, mode);
          expect_same(down(gdY), dY, what + "dZ (masked dY)");
          expect_close(down(gdX), dX, kGemmAtolPerSqrtK * std::sqrt(out), kGemmRtol, what + "dX");
          expect_close(down(gdweights), dweights,
                       kGemmAtolPerSqrtK * std::sqrt(std::max<int64_t>(B, 1)), kGemmRtol,
                       what + "dweights");
          expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol, what + "db");
        }
}

TEST_F(Parity, GmfForwardBackwardOnStridedRows) {
  for (int64_t B : kBatches)
    for (int mf : kWidths) {
      const int64_t ld = mf + 3;  // rows carry more columns than the GMF part
      const std::string what = shape({{"B", B}, {"mf", mf}});
      Vec urows = random_vec(size_t(B) * ld, gen_), irows = random_vec(size_t(B) * ld, gen_);
      Vec G(size_t(B) * mf, 5.0f), dG = random_vec(size_t(B) * mf, gen_);
      Vec durows(size_t(B) * ld, 5.0f), dirows(size_t(B) * ld, 6.0f);
      Buffer<float> gurows = up(urows), girows = up(irows), gG = up(G), gdG = up(dG),
                    gdurows = up(durows), gdirows = up(dirows);
      gmf_forward(cpu_, urows.data(), ld, irows.data(), ld, G.data(), mf, B, mf);
      gmf_forward(gpu_, gurows.data(), ld, girows.data(), ld, gG.data(), mf, B, mf);
      gmf_backward(cpu_, urows.data(), ld, irows.data(), ld, dG.data(), mf, durows.data(), ld,
                   dirows.data(), ld, B, mf);
      gmf_backward(gpu_, gurows.data(), ld, girows.data(), ld, gdG.data(), mf, gdurows.data(), ld,
                   gdirows.data(), ld, B, mf);
      // One product per element: no rounding difference is possible.
      expect_same(down(gG), G, what + "G");
      expect_same(down(gdurows), durows, what + "durows (columns >= mf untouched)");
      expect_same(down(gdirows), dirows, what + "dirows");
    }
}

// Groups of S rows sharing a per-group row: the copy and the forward add are
// exact on both devices, and so are the group sums (double, s order); only the
// bias column sums may differ in summation order.
TEST_F(Parity, GroupOpsForwardAndBackward) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3000}})
    for (int S : {1, 5, 51})
      for (int w : {1, 8, 64}) {
        const std::string what = shape({{"n", n}, {"S", S}, {"w", w}});
        const int64_t B = n * S, ldx = w + 3;
        Vec X = random_vec(size_t(n) * ldx, gen_), R(size_t(B) * w, 9.0f);
        Buffer<float> gX = up(X), gR = up(R);
        repeat_rows(cpu_, X.data(), ldx, w, R.data(), n, S);
        repeat_rows(gpu_, gX.data(), ldx, w, gR.data(), n, S);
        expect_same(down(gR), R, what + " repeat_rows");
        Vec Y = random_vec(size_t(B) * w, gen_), U = random_vec(size_t(n) * w, gen_),
            bias = random_vec(size_t(w), gen_);
        Buffer<float> gY = up(Y), gU = up(U), gb = up(bias);
        group_bias_act(cpu_, Y.data(), U.data(), bias.data(), n, S, w, true);
        group_bias_act(gpu_, gY.data(), gU.data(), gb.data(), n, S, w, true);
        expect_same(down(gY), Y, what + " group_bias_act");
        Vec dY = random_vec(size_t(B) * w, gen_), dU(size_t(n) * (w + 2), 7.0f),
            db(static_cast<size_t>(w));
        Buffer<float> gdY = up(dY), gdU = up(dU), gdb = up(db);
        group_sum_backward(cpu_, Y.data(), dY.data(), n, S, w, dU.data(), w + 2, db.data(), true);
        group_sum_backward(gpu_, gY.data(), gdY.data(), n, S, w, gdU.data(), w + 2, gdb.data(),
                           true);
        expect_same(down(gdY), dY, what + " masked dY");
        expect_same(down(gdU), dU, what + " group sums (padding untouched)");
        const Vec gpu_db = down(gdb);
        for (int j = 0; j < w; ++j)
          EXPECT_NEAR(gpu_db[size_t(j)], db[size_t(j)], 1e-5 + 1e-5 * std::fabs(db[size_t(j)]))
              << what << " db[" << j << "]";
      }
}

// The users'/items' join of layer 0 in one op: the CPU adds the group rows and
// the bias inside each block's product, the GPU after its GEMM; FP32 products
// on both, so they agree to the GEMM tolerance, over strided inputs and a
// weight slice of a wider layer, across several of the CPU's row blocks.
TEST_F(Parity, GroupLinearForwardFp32) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{450}})
    for (int S : {1, 5})
      for (bool relu : {false, true}) {
        const int in = 48, out = 40, ldx = in + 16, ldw = 2 * in;
        const std::string what = shape({{"n", n}, {"S", S}, {"relu", relu}});
        const int64_t B = n * S;
        Vec X = random_vec(size_t(B) * ldx, gen_), W = random_vec(size_t(out) * ldw, gen_),
            U = random_vec(size_t(n) * out, gen_), bias = random_vec(size_t(out), gen_),
            Y(size_t(B) * out, 7.0f);
        Buffer<float> gX = up(X), gW = up(W), gU = up(U), gb = up(bias), gY = up(Y);
        group_linear_forward(cpu_, X.data(), ldx, W.data() + in, ldw, U.data(), bias.data(),
                             Y.data(), n, S, in, out, relu);
        group_linear_forward(gpu_, gX.data(), ldx, gW.data() + in, ldw, gU.data(), gb.data(),
                             gY.data(), n, S, in, out, relu);
        expect_close(down(gY), Y, kGemmAtolPerSqrtK * std::sqrt(in), kGemmRtol, what);
      }
}

TEST_F(Parity, ConcatSplitScalarAndVectorPaths) {
  // (wa, wc, pad): {4, 8, 0} and {64, 192, 4} take the float4 path.
  const int cases[][3] = {{1, 1, 0}, {3, 5, 1}, {4, 8, 0}, {8, 3, 2}, {64, 192, 4}, {5, 64, 3}};
  for (int64_t B : kBatches)
    for (const auto& c : cases) {
      const int wa = c[0], wc = c[1], pad = c[2];
      const int64_t lda = wa + pad, ldc = wc + pad, w = wa + wc;
      const std::string what = shape({{"B", B}, {"wa", wa}, {"wc", wc}, {"pad", pad}});
      Vec A = random_vec(size_t(B) * lda, gen_), C = random_vec(size_t(B) * ldc, gen_);
      Vec Y(size_t(B) * w, 0.0f), dA(size_t(B) * lda, 3.0f), dC(size_t(B) * ldc, 4.0f);
      Buffer<float> gA = up(A), gC = up(C), gY = up(Y), gdA = up(dA), gdC = up(dC);
      concat_cols(cpu_, A.data(), lda, wa, C.data(), ldc, wc, Y.data(), B);
      concat_cols(gpu_, gA.data(), lda, wa, gC.data(), ldc, wc, gY.data(), B);
      expect_same(down(gY), Y, what + "concat");
      split_cols(cpu_, Y.data(), wa, wc, dA.data(), lda, dC.data(), ldc, B);
      split_cols(gpu_, gY.data(), wa, wc, gdA.data(), lda, gdC.data(), ldc, B);
      expect_same(down(gdA), dA, what + "split A");
      expect_same(down(gdC), dC, what + "split C");
    }
}

TEST_F(Parity, HeadForwardBackward) {
  for (int64_t B : kBatches)
    for (int F : kWidths)
      for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate}) {
        const std::string what =
            shape({{"B", B}, {"F", F}, {"accumulate", mode == GradMode::kAccumulate}});
        Vec H = random_vec(size_t(B) * F, gen_), wc = random_vec(size_t(F) + 1, gen_);
        Vec logits(B, 0.0f), dlogits = random_vec(B, gen_), dH(size_t(B) * F, 2.0f);
        Vec dwc = random_vec(size_t(F) + 1, gen_);  // dw [F] then dc, as in NeuMF's layout
        Buffer<float> gH = up(H), gwc = up(wc), glogits = up(logits), gdlogits = up(dlogits),
                      gdH = up(dH), gdwc = up(dwc);
        head_forward(cpu_, H.data(), wc.data(), wc.data() + F, logits.data(), B, F);
        head_forward(gpu_, gH.data(), gwc.data(), gwc.data() + F, glogits.data(), B, F);
        // CPU: one sequential float sum; GPU: 32 lane sums and a butterfly.
        expect_close(down(glogits), logits, 1e-6 * F, kElemRtol, what + "logits");
        head_backward(cpu_, H.data(), wc.data(), dlogits.data(), dH.data(), dwc.data(),
                      dwc.data() + F, B, F, mode);
        head_backward(gpu_, gH.data(), gwc.data(), gdlogits.data(), gdH.data(), gdwc.data(),
                      gdwc.data() + F, B, F, mode);
        expect_same(down(gdH), dH, what + "dH");
        expect_close(down(gdwc), dwc, kDoubleSumAtol, kDoubleSumRtol, what + "dw, dc");
      }
}

// Batches past kColGroup · 256 rows take the column sums' middle pass (group
// sums of 64 chunk partials): B = 64·256 + 1 (65 chunks: a group of one) and the
// ml-20m batch 2^20 (4096 chunks). Same tolerance as above, and the GPU result
// must be the same bits on a second run (fixed order, no atomics).
TEST_F(Parity, ColumnSumsAtLargeBatches) {
  for (int64_t B : {int64_t{64 * 256 + 1}, gpu_scale(int64_t{1} << 20, int64_t{1} << 16)}) {
    for (int F : {1, 128}) {  // head: dw [F] and dc
      const std::string what = shape({{"B", B}, {"F", F}});
      Vec H = random_vec(size_t(B) * F, gen_), wc = random_vec(size_t(F) + 1, gen_);
      Vec dlogits = random_vec(B, gen_, -1.0f / 1024, 1.0f / 1024), dH(size_t(B) * F, 0.0f);
      Vec dwc(size_t(F) + 1, 0.0f);
      Buffer<float> gH = up(H), gwc = up(wc), gdlogits = up(dlogits), gdH = up(dH), gdwc = up(dwc);
      head_backward(cpu_, H.data(), wc.data(), dlogits.data(), dH.data(), dwc.data(),
                    dwc.data() + F, B, F, GradMode::kOverwrite);
      head_backward(gpu_, gH.data(), gwc.data(), gdlogits.data(), gdH.data(), gdwc.data(),
                    gdwc.data() + F, B, F, GradMode::kOverwrite);
      const Vec first = down(gdwc);
      expect_close(first, dwc, kDoubleSumAtol, kDoubleSumRtol, what + "head dw, dc");
      head_backward(gpu_, gH.data(), gwc.data(), gdlogits.data(), gdH.data(), gdwc.data(),
                    gdwc.data() + F, B, F, GradMode::kOverwrite);
      expect_same(down(gdwc), first, what + "head dw, dc on a second run");
    }
    // Linear bias gradients: db = column sums of the masked dY (out = 256, the
    // widest MLPerf layer); in = 8 keeps the GEMMs small.
    const int in = 8, out = 256;
    const std::string what = shape({{"B", B}, {"in", in}, {"out", out}});
    Vec X = random_vec(size_t(B) * in, gen_), W = random_vec(size_t(out) * in, gen_);
    Vec Y = random_vec(size_t(B) * out, gen_);
    for (float& y : Y) y = std::max(y, 0.0f);
    Vec dY = random_vec(size_t(B) * out, gen_, -1.0f / 1024, 1.0f / 1024);
    Vec dW(size_t(out) * in, 0.0f), db(out, 0.0f);
    Buffer<float> gX = up(X), gW = up(W), gY = up(Y), gdW = up(dW), gdb = up(db);
    Buffer<float> gdY = up(dY);
    linear_backward(cpu_, X.data(), W.data(), Y.data(), dY.data(), nullptr, dW.data(), db.data(), B,
                    in, out, true, GradMode::kOverwrite);
    linear_backward(gpu_, gX.data(), gW.data(), gY.data(), gdY.data(), nullptr, gdW.data(),
                    gdb.data(), B, in, out, true, GradMode::kOverwrite);
    const Vec first = down(gdb);
    expect_close(first, db, kDoubleSumAtol, kDoubleSumRtol, what + "db");
    // dY is masked in place already; masking again changes nothing.
    linear_backward(gpu_, gX.data(), gW.data(), gY.data(), gdY.data(), nullptr, gdW.data(),
                    gdb.data(), B, in, out, true, GradMode::kOverwrite);
    expect_same(down(gdb), first, what + "db on a second run");
  }
}

// The streaming kernels (the masked reductions and group_bias_act; the kernels they
// replaced are timed beside them in bench/kernels/) against their CPU twins, on the
// same inputs: every element they write (the masked dZ, the group sums, the joined
// layer-0 rows) the same bits, the bias gradients within a double sum's rounding.
// Shapes take every path: float4 rows and scalar ones (a width not a multiple of 4,
// rows one float off 16-byte alignment), dYg rows that take float4 stores or not,
// groups longer than the rows loaded before the first store (S = 51), a bias slice
// off alignment, and the ml-20m MLPerf step's shapes (on a GPU only); Y carries NaN
// (masked to 0), dY -0 (kept where Y > 0), and Y + Yg is exactly 0 here and there.
// linear_backward's masked dZ and db are held to a host loop (its CPU twin would
// multiply the GEMMs too; dX and dweights: the LinearBackward tests).
// (No NaN in dY: a sum with a NaN gives the CPU's payload on the host and the
// canonical NaN on the GPU, so the twins would differ in bits, not in meaning.)
void set_specials(Vec& Y, Vec& dY) {
  for (size_t k = 0; k < Y.size(); k += 97) Y[k] = std::numeric_limits<float>::quiet_NaN();
  for (size_t k = 5; k < dY.size(); k += 89) dY[k] = -0.0f;
}

TEST_F(Parity, StreamingStepKernelsAreTheCpuTwinsBitForBit) {
  struct GroupCase {
    int64_t n;
    int S, w;
    int64_t lddyg, out_offset, in_offset;
    bool relu;
  };
  const GroupCase groups[] = {
      {0, 5, 256, 256, 0, 0, true},      {1, 1, 4, 4, 0, 0, true},
      {3000, 5, 256, 256, 0, 0, true},   {3000, 5, 64, 192, 0, 0, false},
      {3000, 5, 128, 192, 64, 0, false}, {777, 51, 128, 130, 0, 0, true},
      {100, 5, 7, 7, 0, 0, true},        {100, 9, 64, 64, 1, 1, true},
      {209715, 5, 256, 256, 0, 0, true}};  // ml-20m-mlperf's layer 0 (GPU only)
  for (const GroupCase& c : groups) {
    const int64_t B = c.n * c.S;
    if (!on_gpu() && B * c.w > (int64_t{1} << 24)) continue;  // the stand-in skips the largest
    const std::string what = shape({{"n", c.n},
                                    {"S", c.S},
                                    {"w", c.w},
                                    {"lddyg", c.lddyg},
                                    {"offset", c.in_offset},
                                    {"relu", c.relu}});
    const size_t rows = size_t(B) * c.w + size_t(c.in_offset);
    Vec Y = random_vec(rows, gen_), dY = random_vec(rows, gen_, -1.0f / 64, 1.0f / 64);
    for (float& y : Y) y = std::max(y, 0.0f);
    set_specials(Y, dY);
    const size_t out_rows = size_t(c.n) * c.lddyg + size_t(c.out_offset);
    Vec dU(out_rows, 7.0f), db(size_t(c.w), 0.0f);
    Buffer<float> gY = up(Y), gdY = up(dY), gdU = up(dU), gdb = up(db);
    const int64_t off = c.in_offset;
    float* dbp = c.relu ? db.data() : nullptr;
    group_sum_backward(cpu_, Y.data() + off, dY.data() + off, c.n, c.S, c.w,
                       dU.data() + c.out_offset, c.lddyg, dbp, c.relu);
    group_sum_backward(gpu_, gY.data() + off, gdY.data() + off, c.n, c.S, c.w,
                       gdU.data() + c.out_offset, c.lddyg, c.relu ? gdb.data() : nullptr, c.relu);
    expect_same(down(gdY), dY, what + "masked dY vs the CPU twin");
    expect_same(down(gdU), dU, what + "group sums vs the CPU twin (padding untouched)");
    expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol, what + "db vs the CPU twin");
  }

  // group_bias_act: the forward join of layer 0 (rows of Y plus their group's row
  // of Yg plus the bias, then the ReLU).
  for (const GroupCase& c : groups)
    for (bool with_bias : {true, false}) {
      const int64_t B = c.n * c.S;
      if (!on_gpu() && B * c.w > (int64_t{1} << 24)) continue;
      const std::string what = shape({{"n", c.n},
                                      {"S", c.S},
                                      {"w", c.w},
                                      {"offset", c.in_offset},
                                      {"relu", c.relu},
                                      {"bias", with_bias}});
      const int64_t off = c.in_offset;
      Vec Y = random_vec(size_t(B) * c.w + size_t(off), gen_);
      Vec U = random_vec(size_t(c.n) * c.w + size_t(off), gen_),
          bias = random_vec(size_t(c.w) + 1, gen_);
      for (int64_t k = 3; k < B * c.w; k += 101) {  // Y + Yg exactly 0 here and there
        const int64_t b = k / c.w, j = k % c.w;
        Y[size_t(off + k)] = -U[size_t(off + (b / c.S) * c.w + j)];
      }
      Buffer<float> gY = up(Y), gU = up(U), gb = up(bias);
      // bias + 1: a bias slice that starts off 16-byte alignment, as a layer's may.
      group_bias_act(cpu_, Y.data() + off, U.data() + off, with_bias ? bias.data() + 1 : nullptr,
                     c.n, c.S, c.w, c.relu);
      group_bias_act(gpu_, gY.data() + off, gU.data() + off, with_bias ? gb.data() + 1 : nullptr,
                     c.n, c.S, c.w, c.relu);
      expect_same(down(gY), Y, what + "group_bias_act vs the CPU twin");
    }

  struct LinearCase {
    int64_t B;
    int in, out;
    int64_t offset;
  };
  const LinearCase linears[] = {
      {0, 8, 256, 0},         {1, 5, 3, 0},         {1000, 8, 256, 0},
      {1000, 5, 3, 1},        {1000, 64, 8, 1},     {64 * 256 + 1, 256, 128, 0},
      {1048575, 256, 128, 0}, {1048575, 128, 64, 0}};  // the last two: GPU only
  for (const LinearCase& c : linears)
    for (bool relu : {true, false})
      for (bool with_db : {true, false})
        for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate}) {
          if (!relu && !with_db) continue;  // nothing masked, nothing summed: no kernel of these
          if (!on_gpu() && c.B * std::max(c.in, c.out) > (int64_t{1} << 24)) continue;
          if (c.B > (int64_t{1} << 16) && mode == GradMode::kAccumulate) continue;  // time
          const std::string what = shape({{"B", c.B},
                                          {"in", c.in},
                                          {"out", c.out},
                                          {"offset", c.offset},
                                          {"relu", relu},
                                          {"db", with_db},
                                          {"accumulate", mode == GradMode::kAccumulate}});
          const int64_t off = c.offset;
          Vec X = random_vec(size_t(c.B) * c.in, gen_), W = random_vec(size_t(c.out) * c.in, gen_);
          Vec Y = random_vec(size_t(c.B) * c.out + size_t(off), gen_);
          for (float& y : Y) y = std::max(y, 0.0f);
          Vec dY = random_vec(Y.size(), gen_, -1.0f / 1024, 1.0f / 1024);
          set_specials(Y, dY);
          const Vec db0 = random_vec(size_t(c.out), gen_);
          Buffer<float> gX = up(X), gW = up(W), gY = up(Y), gdY = up(dY);
          Buffer<float> gdX = up(Vec(size_t(c.B) * c.in, 9.0f)),
                        gdW = up(random_vec(size_t(c.out) * c.in, gen_)), gdb = up(db0);
          linear_backward(gpu_, gX.data(), gW.data(), relu ? gY.data() + off : nullptr,
                          gdY.data() + off, gdX.data(), gdW.data(), with_db ? gdb.data() : nullptr,
                          c.B, c.in, c.out, relu, mode);
          // The host's dZ (the CPU twin's mask) and its column sums in double.
          Vec dz = dY;
          std::vector<double> sums(size_t(c.out), 0.0);
          for (int64_t b = 0; b < c.B; ++b)
            for (int j = 0; j < c.out; ++j) {
              float& g = dz[size_t(off + b * c.out + j)];
              if (relu && !(Y[size_t(off + b * c.out + j)] > 0.0f)) g = 0.0f;
              sums[size_t(j)] += g;
            }
          expect_same(down(gdY), dz, what + "dZ vs the host's mask");
          if (!with_db) continue;
          Vec want(size_t(c.out));
          for (int j = 0; j < c.out; ++j) {
            const float v = static_cast<float>(sums[size_t(j)]);
            want[size_t(j)] = mode == GradMode::kAccumulate ? db0[size_t(j)] + v : v;
          }
          expect_close(down(gdb), want, kDoubleSumAtol, kDoubleSumRtol, what + "db vs the host's");
        }
}

// MathMode::kBf16's operand copies (launch_to_bf16, shared by to_bf16_rows and the
// GEMMs' copies): four elements per thread, contiguous arrays as one range, strided
// rows by a 32-bit division, and one element per thread where a width, stride or
// pointer is off four floats (the one-per-thread kernel for every shape lost on a GPU:
// bench/kernels/to_bf16.cu times it beside these). Against the CPU twin's rounding bit
// for bit, the padding untouched; then the kBf16 GEMM, which copies its FP32 operands
// so, against gemm_bf16 on copies rounded on the host: the same cuBLAS product of the
// same BF16 operands (both in 256-byte aligned arrays), so the same bits. Shapes: the
// flat path, a slice of wider rows (layer 0's item half), a width not a multiple of 4,
// a pointer off 16-byte alignment, and layer 0's items at the step's batch (GPU only).
TEST_F(Parity, Bf16CopiesAreTheCpuRoundingBitForBit) {
  set_math_mode(MathMode::kBf16);
  struct Case {
    int M, N, K, lda, a_off;
  };
  const Case cases[] = {{1000, 64, 128, 128, 0},        // contiguous: the flat path
                        {1000, 64, 128, 192, 64},       // a slice of 192-wide rows
                        {1000, 64, 6, 6, 0},            // K % 4 != 0: the element kernel
                        {333, 64, 128, 128, 1},         // A off 16-byte alignment
                        {1048575, 256, 128, 192, 64}};  // layer 0's items (GPU only)
  for (const Case& c : cases) {
    if (!on_gpu() && int64_t(c.M) * c.lda > (int64_t{1} << 22)) continue;
    const std::string what =
        shape({{"M", c.M}, {"N", c.N}, {"K", c.K}, {"lda", c.lda}, {"offset", c.a_off}});
    Vec A = random_vec(size_t(c.M) * c.lda + size_t(c.a_off), gen_);
    Vec B = random_vec(size_t(c.N) * c.K, gen_);
    Buffer<float> gA = up(A), gB = up(B);
    // The copy of A as the GEMM makes it (rows of K at stride lda), from both devices.
    Bits a16(size_t(c.M - 1) * c.lda + size_t(c.K), 7), b16(size_t(c.N) * c.K, 7);
    Buffer<uint16_t> ga16 = up(a16);
    to_bf16_rows(cpu_, A.data() + c.a_off, c.lda, c.K, a16.data(), c.lda, c.M);
    to_bf16_rows(gpu_, gA.data() + c.a_off, c.lda, c.K, ga16.data(), c.lda, c.M);
    expect_same(down(ga16), a16, what + "BF16 copy of A vs the CPU twin (padding untouched)");
    to_bf16_rows(cpu_, B.data(), c.K, c.K, b16.data(), c.K, c.N);
    Buffer<uint16_t> ha16 = up(a16), hb16 = up(b16);
    Buffer<float> gC = up(Vec(size_t(c.M) * c.N, 0.0f)), gC16 = up(Vec(size_t(c.M) * c.N, 0.0f));
    gemm(gpu_, false, true, c.M, c.N, c.K, 1.0f, gA.data() + c.a_off, c.lda, gB.data(), c.K, 0.0f,
         gC.data(), c.N);
    gemm_bf16(gpu_, false, true, c.M, c.N, c.K, ha16.data(), c.lda, hb16.data(), c.K, gC16.data(),
              c.N);
    expect_same(down(gC), down(gC16), what + "kBf16 GEMM vs gemm_bf16 on the host's copies");
  }
}

}  // namespace
}  // namespace ncf
