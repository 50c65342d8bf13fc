// GPU parity of the optimizers (model/optim.h) and the embedding tables' ops
// (embedding/table_ops.h, embedding/collection.h): gathers, sort-and-reduce, the fused
// table update with every optimizer, and bad input found by kernels.
#include "parity_gpu.h"

namespace ncf {
namespace {

// ---- optim.h ------------------------------------------------------------------------------

TEST_F(Parity, DenseAdamOverSteps) {
  AdamHyper adam;
  adam.l2 = 1e-3f;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    Vec p = random_vec(n, gen_), m(n, 0.0f), v(n, 0.0f);
    Buffer<float> gp = up(p), gm = up(m), gv = up(v);
    for (int64_t t = 1; t <= 3; ++t) {
      Vec g = random_vec(n, gen_, -0.1f, 0.1f);
      Buffer<float> gg = up(g);
      dense_adam_step(cpu_, p.data(), g.data(), m.data(), v.data(), n, t, adam);
      dense_adam_step(gpu_, gp.data(), gg.data(), gm.data(), gv.data(), n, t, adam);
    }
    const std::string what = shape({{"n", n}});
    expect_close(down(gp), p, kElemAtol, kElemRtol, what + "adam p");
    expect_close(down(gm), m, kElemAtol, kElemRtol, what + "adam m");
    expect_close(down(gv), v, kElemAtol, kElemRtol, what + "adam v");
  }
}

// All four table optimizers over two steps; offset 1 shifts every array by one
// float, so D % 4 == 0 widths take the scalar path too.
TEST_F(Parity, EmbeddingOptimizersOverSteps) {
  AdamHyper adam;
  adam.l2 = 1e-3f;
  AdagradHyper adagrad;
  SgdHyper sgd;
  sgd.l2 = 1e-3f;
  for (int64_t R : {int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int D : kWidths)
      for (int64_t n : {int64_t{0}, int64_t{1}, R / 3, R})
        for (int offset : {0, 1}) {
          if (R == 1000 && D == 192 && offset == 1 && n != R) continue;  // keep the test fast
          const std::string what = shape({{"R", R}, {"D", D}, {"n", n}, {"offset", offset}});
          const size_t sz = size_t(R) * D + offset;
          // [0] dense Adam, [1] lazy Adam, [2] SGD, [3] Adagrad, [4] row-wise Adagrad
          // (its accumulators: the first R of state 1): table and two states each.
          std::vector<Vec> tab(5), s1(5), s2(5);
          std::vector<Buffer<float>> gtab, gs1, gs2;
          for (int o = 0; o < 5; ++o) {
            tab[o] = random_vec(sz, gen_);
            s1[o] = Vec(sz, o >= 3 ? adagrad.initial_accumulator : 0.0f);
            s2[o] = Vec(sz, 0.0f);
            gtab.push_back(up(tab[o]));
            gs1.push_back(up(s1[o]));
            gs2.push_back(up(s2[o]));
          }
          auto cp = [&](std::vector<Vec>& v, int o) { return v[o].data() + offset; };
          auto gp = [&](std::vector<Buffer<float>>& v, int o) { return v[o].data() + offset; };
          for (int64_t t = 1; t <= 2; ++t) {
            IVec rows = random_unique_rows(R, n, gen_);
            Vec grads = random_vec(size_t(n) * D + offset, gen_, -0.1f, 0.1f);
            Buffer<RowId> grows = up(rows);
            Buffer<float> ggrads = up(grads);
            const float* cg = grads.data() + offset;
            const float* gg = ggrads.data() + offset;
            embedding_dense_adam(cpu_, cp(tab, 0), cp(s1, 0), cp(s2, 0), rows.data(), cg, R, n, D,
                                 t, adam);
            embedding_dense_adam(gpu_, gp(gtab, 0), gp(gs1, 0), gp(gs2, 0), grows.data(), gg, R, n,
                                 D, t, adam);
            embedding_lazy_adam(cpu_, cp(tab, 1), cp(s1, 1), cp(s2, 1), rows.data(), cg, R, n, D, t,
                                adam);
            embedding_lazy_adam(gpu_, gp(gtab, 1), gp(gs1, 1), gp(gs2, 1), grows.data(), gg, R, n,
                                D, t, adam);
            embedding_sgd(cpu_, cp(tab, 2), rows.data(), cg, R, n, D, sgd);
            embedding_sgd(gpu_, gp(gtab, 2), grows.data(), gg, R, n, D, sgd);
            embedding_adagrad(cpu_, cp(tab, 3), cp(s1, 3), rows.data(), cg, R, n, D, adagrad);
            embedding_adagrad(gpu_, gp(gtab, 3), gp(gs1, 3), grows.data(), gg, R, n, D, adagrad);
            embedding_rowwise_adagrad(cpu_, cp(tab, 4), cp(s1, 4), rows.data(), cg, R, n, D,
                                      adagrad);
            embedding_rowwise_adagrad(gpu_, gp(gtab, 4), gp(gs1, 4), grows.data(), gg, R, n, D,
                                      adagrad);
          }
          const char* names[] = {"dense_adam", "lazy_adam", "sgd", "adagrad", "rowwise_adagrad"};
          for (int o = 0; o < 5; ++o) {
            expect_close(down(gtab[o]), tab[o], kElemAtol, kElemRtol, what + names[o] + " table");
            expect_close(down(gs1[o]), s1[o], kElemAtol, kElemRtol, what + names[o] + " state 1");
            expect_close(down(gs2[o]), s2[o], kElemAtol, kElemRtol, what + names[o] + " state 2");
          }
        }
}

TEST_F(Parity, GatherRowsExactWithDuplicates) {
  for (int64_t R : {int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int D : kWidths)
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}})
        for (int offset : {0, 1}) {
          Vec table = random_vec(size_t(R) * D, gen_);
          IVec ids = random_ids(n, 0, int32_t(std::min<int64_t>(R, 5)), gen_);  // many repeats
          if (n > 10) ids[n / 2] = int32_t(R - 1);
          Vec out(size_t(n) * D + offset, 1.0f);
          Buffer<float> gtable = up(table), gout = up(out);
          Buffer<RowId> gids = up(ids);
          gather_rows(cpu_, table.data(), ids.data(), out.data() + offset, R, n, D);
          gather_rows(gpu_, gtable.data(), gids.data(), gout.data() + offset, R, n, D);
          expect_same(down(gout), out, shape({{"R", R}, {"D", D}, {"n", n}, {"offset", offset}}));
          // The first columns only (a narrow lookup), the others left as they were.
          for (int width : {1, D / 2, D - 1}) {
            if (width < 1) continue;
            Vec part(size_t(n) * D + offset, 2.0f);
            Buffer<float> gpart = up(part);
            gather_rows(cpu_, table.data(), ids.data(), part.data() + offset, R, n, D, width);
            gather_rows(gpu_, gtable.data(), gids.data(), gpart.data() + offset, R, n, D, width);
            expect_same(
                down(gpart), part,
                shape({{"R", R}, {"D", D}, {"n", n}, {"offset", offset}, {"width", width}}));
          }
        }
}

// Sums of equal ids are taken in optim.h's order (input order within sub-runs of
// kSubRun rows, then the sub-run sums in order) on both devices: bit-identical.
TEST_F(Parity, SortReduceRowsBitExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20000}})
    for (int D : kWidths)
      for (int32_t range : {1, 5, 1000000})
        for (int offset : {0, 1}) {
          if (n == 20000 && D == 192) continue;  // keep the test fast
          const std::string what =
              shape({{"n", n}, {"D", D}, {"id range", range}, {"offset", offset}});
          // Rows of a table: [0, range). The reference refuses negative rows.
          IVec ids = random_ids(n, 0, range, gen_);
          Vec grads = random_vec(size_t(n) * D + offset, gen_);
          IVec urows(n, -7);
          Vec rgrads(size_t(n) * D + offset, 0.0f);
          Buffer<RowId> gids = up(ids), gurows = up(urows);
          Buffer<float> ggrads = up(grads), grgrads = up(rgrads);
          for (int64_t bound : {int64_t{0}, int64_t{range}}) {  // 0: no bound, all 32 bits
            const std::string w = what + "bound=" + std::to_string(bound) + " ";
            int64_t nu_cpu = -1, nu_gpu = -1;
            sort_reduce_rows(cpu_, ids.data(), grads.data() + offset, n, D, urows.data(),
                             rgrads.data() + offset, &nu_cpu, bound);
            sort_reduce_rows(gpu_, gids.data(), ggrads.data() + offset, n, D, gurows.data(),
                             grgrads.data() + offset, &nu_gpu, bound);
            ASSERT_EQ(nu_gpu, nu_cpu) << w;
            IVec gu = down(gurows, nu_cpu);
            expect_same(gu, IVec(urows.begin(), urows.begin() + nu_cpu), w + "unique rows");
            Vec gr = down(grgrads, size_t(nu_cpu) * D + offset);
            expect_same(gr, Vec(rgrads.begin(), rgrads.begin() + nu_cpu * D + offset),
                        w + "row sums");
          }
        }
}

// Hot ids, as under the ml-20m batch's item popularity: n = 2^20 ids, one fifth
// Zipf(1) over 26,744 items (the hottest ~1.9·10^4 times), the rest uniform.
// Runs longer than kSubRun take the GPU's sub-run path (partials, then their
// sum in sub-run order); the CPU sums in that same order: bit-identical.
TEST_F(Parity, SortReduceRowsHotIdsBitExact) {
  const int64_t n = gpu_scale(int64_t{1} << 20, int64_t{1} << 17);
  const int32_t items = 26744;
  std::vector<double> cdf(items);
  double acc = 0;
  for (int32_t r = 0; r < items; ++r) cdf[r] = acc += 1.0 / double(r + 1);
  std::vector<int32_t> order(items);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen_);  // the hot items are not the low ids
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int32_t> any(0, items - 1);
  IVec ids(n);
  for (int64_t k = 0; k < n; ++k) {
    if (k % 5 == 0) {
      const auto it = std::upper_bound(cdf.begin(), cdf.end(), unit(gen_) * cdf.back());
      ids[k] = order[std::min<ptrdiff_t>(it - cdf.begin(), items - 1)];
    } else {
      ids[k] = any(gen_);
    }
  }
  std::vector<int64_t> count(items, 0);
  for (int32_t id : ids) ++count[id];
  const int64_t hottest = *std::max_element(count.begin(), count.end());
  EXPECT_GT(hottest, n / 100) << "the case needs a hot id";  // about 1.9% of the ids

  for (int D : {192, 7}) {
    const std::string what = shape({{"n", n}, {"D", D}, {"hottest", hottest}});
    Vec grads = random_vec(size_t(n) * D, gen_);
    IVec urows(n, -7);
    Vec rgrads(size_t(n) * D, 0.0f);
    Buffer<RowId> gids = up(ids), gurows = up(urows);
    Buffer<float> ggrads = up(grads), grgrads = up(rgrads);
    int64_t nu_cpu = -1, nu_gpu = -1;
    sort_reduce_rows(cpu_, ids.data(), grads.data(), n, D, urows.data(), rgrads.data(), &nu_cpu);
    sort_reduce_rows(gpu_, gids.data(), ggrads.data(), n, D, gurows.data(), grgrads.data(),
                     &nu_gpu);
    ASSERT_EQ(nu_gpu, nu_cpu) << what;
    expect_same(down(gurows, nu_cpu), IVec(urows.begin(), urows.begin() + nu_cpu),
                what + "unique rows");
    expect_same(down(grgrads, size_t(nu_cpu) * D), Vec(rgrads.begin(), rgrads.begin() + nu_cpu * D),
                what + "row sums");
  }
}

// ---- bad input found by kernels -----------------------------------------------------------

TEST_F(Parity, ReplicatedDenseGradientExact) {
  for (int64_t N : {int64_t{1}, int64_t{7}, int64_t{26744}})
    for (int D : kWidths)
      for (int every : {1, 3, 1000000}) {  // all rows touched, a third, (almost) none
        const std::string what = shape({{"N", N}, {"D", D}, {"every", every}});
        IVec rows;
        for (int32_t r = 0; r < N; r += every) rows.push_back(r);
        const int64_t n = int64_t(rows.size());
        Vec grads = random_vec(size_t(n) * D, gen_);
        Vec dense(size_t(N) * (D + 1), 9.0f);
        Buffer<int32_t> grows = up(rows);
        Buffer<float> ggrads = up(grads), gdense = up(dense);
        scatter_rows_dense(cpu_, rows.data(), grads.data(), n, D, N, dense.data());
        scatter_rows_dense(gpu_, grows.data(), ggrads.data(), n, D, N, gdense.data());
        expect_same(down(gdense), dense, what + "dense");
        IVec out_rows(size_t(N), -1);
        Vec out_grads(size_t(N) * D, -1.0f);
        Buffer<int32_t> gout_rows = up(out_rows);
        Buffer<float> gout_grads = up(out_grads);
        int64_t m = -1, gm = -1;
        compact_touched_rows(cpu_, dense.data(), N, D, out_rows.data(), out_grads.data(), &m);
        compact_touched_rows(gpu_, gdense.data(), N, D, gout_rows.data(), gout_grads.data(), &gm);
        ASSERT_EQ(gm, m) << what;
        expect_same(down(gout_rows, m), IVec(out_rows.begin(), out_rows.begin() + m),
                    what + "rows");
        expect_same(down(gout_grads, size_t(m) * D),
                    Vec(out_grads.begin(), out_grads.begin() + m * D), what + "grads");
      }
  // Unsorted rows are recorded and raised by the next check.
  DEVICE_HALF_NEEDS_A_GPU();
  IVec bad = {1, 0};
  Vec g(2 * 3, 1.0f);
  Buffer<int32_t> gbad = up(bad);
  Buffer<float> gg = up(g), gd(Device::kCuda, 2 * 4);
  scatter_rows_dense(gpu_, gbad.data(), gg.data(), 2, 3, 2, gd.data());
  try {
    check_device_errors(gpu_);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scatter_rows_dense"), std::string::npos) << e.what();
  }
}

TEST_F(Parity, KernelErrorsAreRaisedAndLeaveTablesAlone) {
  DEVICE_HALF_NEEDS_A_GPU();
  // An out-of-range id: recorded by the gather, raised by the check, then cleared.
  Vec table = random_vec(4 * 3, gen_);
  IVec ids = {0, 1, 2, 9, 3};
  Buffer<float> gtable = up(table), gout(Device::kCuda, 5 * 3);
  Buffer<RowId> gids = up(ids);
  gather_rows(gpu_, gtable.data(), gids.data(), gout.data(), 4, 5, 3);
  try {
    check_device_errors(gpu_);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gather_rows"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 3, value 9, bound 4"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(check_device_errors(gpu_));  // cleared

  // A pending error is raised by the next synchronizing op.
  gather_rows(gpu_, gtable.data(), gids.data(), gout.data(), 4, 5, 3);
  int64_t nu = 0;
  Buffer<RowId> gu(Device::kCuda, 5);
  Buffer<float> gg(Device::kCuda, 5 * 3);
  EXPECT_THROW(sort_reduce_rows(gpu_, gids.data(), gout.data(), 5, 3, gu.data(), gg.data(), &nu),
               Error);

  // Unsorted unique_rows: the update does nothing, the check names the problem.
  IVec rows = {2, 1};
  Vec grads(2 * 3, 0.5f);
  Buffer<RowId> grows = up(rows);
  Buffer<float> ggrads = up(grads);
  SgdHyper sgd;
  embedding_sgd(gpu_, gtable.data(), grows.data(), ggrads.data(), 4, 2, 3, sgd);
  EXPECT_THROW(check_device_errors(gpu_), Error);
  expect_same(down(gtable), table, "table after a rejected update");
}

// ---- the fused table update ------------------------------------------------------------

// A bad row in an update, for every table optimizer, fused or not: each device
// refuses it (at the call, or at the next check on the GPU) and leaves the
// table and its state exactly as they were. The fused update runs with its
// unique count (the GPU waits for it) and without (the whole update enqueued). The rows are sorted,
// so the bad one is first or last and the others are valid: an update that checked rows while it
// applied them would have changed some.
TEST_F(Parity, BadRowLeavesTablesAloneWithEveryOptimizer) {
  const int64_t R = 50;
  const int D = 8;
  EmbeddingOptimizerConfig opt;
  opt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.01f};
  opt.adagrad = {0.05f, 0.1f, 1e-7f, 0.01f};
  opt.sgd = {0.3f, 0.01f};
  auto refused = [](const ExecContext& ctx, const std::function<void()>& op,
                    const std::string& what) {
    try {
      op();
      check_device_errors(ctx);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error&) {
    }
    EXPECT_NO_THROW(check_device_errors(ctx)) << what << ": the record was not cleared";
  };
  for (int32_t bad : {-1, int32_t(R), int32_t(R) + 1000})
    for (size_t at : {size_t{0}, size_t{10}, size_t{19}}) {
      // Valid rows 0, 2, 4, ... with the one at `at` replaced by the bad row;
      // sorted, the bad row lands first (-1) or last (R and beyond).
      IVec rows;
      for (int32_t k = 0; k < 20; ++k) rows.push_back(2 * k);
      rows[at] = bad;
      std::sort(rows.begin(), rows.end());  // ascending and distinct, as the updates expect
      const int64_t n = int64_t(rows.size());
      const Vec grads = random_vec(size_t(n) * D, gen_, -0.1f, 0.1f);
      const Vec tab0 = random_vec(size_t(R) * D, gen_),
                m0 = random_vec(size_t(R) * D, gen_, 0, 0.1f),
                v0 = random_vec(size_t(R) * D, gen_, 0.0f, 0.01f);
      for (const ExecContext* ctx : {&cpu_, &gpu_}) {
        const bool dev = ctx == &gpu_;
        const std::string what =
            shape({{"bad", bad}, {"at", int64_t(at)}}) + (dev ? "device " : "cpu ");
        for (EmbeddingOptimizer kind :
             {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam,
              EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kAdagrad,
              EmbeddingOptimizer::kRowwiseAdagrad}) {
          opt.kind = kind;
          // reduce_update_rows (the trainer's fused path) with and without its
          // count, and the optimizer on already-unique rows, each on fresh
          // copies of the table and state.
          for (int fused = 0; fused < 3; ++fused) {
            const std::string w = what + optimizer_name(kind) +
                                  (fused == 2   ? " fused, no count"
                                   : fused == 1 ? " fused"
                                                : " unique");
            Vec tab = tab0, m = m0, v = v0;
            Buffer<RowId> grows = up(rows);
            Buffer<float> ggrads = up(grads), gtab = up(tab), gm = up(m), gv = up(v);
            const RowId* r = dev ? grows.data() : rows.data();
            const float* g = dev ? ggrads.data() : grads.data();
            float* pt = dev ? gtab.data() : tab.data();
            float* pm = dev ? gm.data() : m.data();
            float* pv = dev ? gv.data() : v.data();
            refused(
                *ctx,
                [&] {
                  if (fused) {
                    int64_t nu = 0;
                    reduce_update_rows(*ctx, r, g, n, TableRows{pt, pm, pv, R, D}, opt, 1,
                                       fused == 1 ? &nu : nullptr);
                    return;
                  }
                  switch (kind) {
                    case EmbeddingOptimizer::kDenseAdam:
                      embedding_dense_adam(*ctx, pt, pm, pv, r, g, R, n, D, 1, opt.adam);
                      break;
                    case EmbeddingOptimizer::kLazyAdam:
                      embedding_lazy_adam(*ctx, pt, pm, pv, r, g, R, n, D, 1, opt.adam);
                      break;
                    case EmbeddingOptimizer::kSgd:
                      embedding_sgd(*ctx, pt, r, g, R, n, D, opt.sgd);
                      break;
                    case EmbeddingOptimizer::kAdagrad:
                      embedding_adagrad(*ctx, pt, pm, r, g, R, n, D, opt.adagrad);
                      break;
                    case EmbeddingOptimizer::kRowwiseAdagrad:
                      embedding_rowwise_adagrad(*ctx, pt, pm, r, g, R, n, D, opt.adagrad);
                      break;
                  }
                },
                w);
            expect_same(dev ? down(gtab) : tab, tab0, w + " table");
            expect_same(dev ? down(gm) : m, m0, w + " state 1");
            expect_same(dev ? down(gv) : v, v0, w + " state 2");
          }
        }
      }
    }
}

TEST_F(Parity, ReduceUpdateRowsEveryOptimizer) {
  EmbeddingOptimizerConfig opt;
  opt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.01f};
  opt.adagrad = {0.05f, 0.1f, 1e-7f, 0.01f};
  opt.sgd = {0.3f, 0.01f};
  for (EmbeddingOptimizer kind :
       {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam, EmbeddingOptimizer::kSgd,
        EmbeddingOptimizer::kAdagrad, EmbeddingOptimizer::kRowwiseAdagrad}) {
    opt.kind = kind;
    for (int D : {1, 3, 4, 5, 8, 192})
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
        for (int64_t R : {int64_t{3}, int64_t{5000}}) {
          const std::string what =
              shape({{"D", D}, {"n", n}, {"R", R}}) + optimizer_name(kind) + " ";
          // Duplicates everywhere, and one row repeated past two sub-runs.
          IVec rows = random_ids(n, 0, int32_t(R), gen_);
          for (int64_t k = 0; k < n; k += 3) rows[k] = int32_t(R / 2);
          if (n == 1000) {
            ASSERT_GT(std::count(rows.begin(), rows.end(), int32_t(R / 2)), 2 * kSubRun) << what;
          }
          const Vec grads = random_vec(size_t(n) * D, gen_, -0.1f, 0.1f);
          // m is Adagrad's accumulator there, so it starts >= 0 like one.
          const bool acc =
              kind == EmbeddingOptimizer::kAdagrad || kind == EmbeddingOptimizer::kRowwiseAdagrad;
          const float m_lo = acc ? 0.0f : -0.1f;
          Vec tab = random_vec(size_t(R) * D, gen_),
              m = random_vec(size_t(R) * D, gen_, m_lo, 0.1f),
              v = random_vec(size_t(R) * D, gen_, 0.0f, 0.01f);
          Buffer<RowId> grows = up(rows);
          Buffer<float> ggrads = up(grads), gtab = up(tab), gm = up(m), gv = up(v);
          // And without the unique count: the counts stay on the GPU, no host wait.
          Buffer<float> qtab = up(tab), qm = up(m), qv = up(v);
          int64_t nu = -1, gnu = -1;
          for (int64_t t = 1; t <= 2; ++t) {
            reduce_update_rows(cpu_, rows.data(), grads.data(), n,
                               TableRows{tab.data(), m.data(), v.data(), R, D}, opt, t, &nu);
            reduce_update_rows(gpu_, grows.data(), ggrads.data(), n,
                               TableRows{gtab.data(), gm.data(), gv.data(), R, D}, opt, t, &gnu);
            reduce_update_rows(gpu_, grows.data(), ggrads.data(), n,
                               TableRows{qtab.data(), qm.data(), qv.data(), R, D}, opt, t);
          }
          ASSERT_EQ(gnu, nu) << what;
          expect_same(down(qtab), down(gtab), what + "table, counts on the device");
          expect_same(down(qm), down(gm), what + "state 1, counts on the device");
          expect_same(down(qv), down(gv), what + "state 2, counts on the device");
          IVec distinct = rows;
          std::sort(distinct.begin(), distinct.end());
          EXPECT_EQ(nu, std::unique(distinct.begin(), distinct.end()) - distinct.begin()) << what;
          // NaN meets NaN in expect_close: the reference must have none.
          ASSERT_TRUE(std::none_of(tab.begin(), tab.end(), [](float x) { return std::isnan(x); }))
              << what;
          // The run sums follow the same order on both devices; the update's
          // sqrt and division may differ by an ulp or two.
          expect_close(down(gtab), tab, kElemAtol, kElemRtol, what + "table");
          expect_close(down(gm), m, kElemAtol, kElemRtol, what + "state 1");
          expect_close(down(gv), v, kElemAtol, kElemRtol, what + "state 2");
        }
  }
}

// Dense Adam with columns given directly (GivenColumns) on the GPU: the bits of the same update
// over gradient rows carrying them on each row's first row and zeros on the others, on the
// vector (D = 192, columns from 64) and scalar (D = 9, from 3) paths, rows repeated past two
// sub-runs; and close to the CPU's.
TEST_F(Parity, DenseAdamGivenColumnsAreTheirFirstRowSums) {
  EmbeddingOptimizerConfig opt;
  opt.kind = EmbeddingOptimizer::kDenseAdam;
  opt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.0f};
  for (const auto& [D, col] : {std::pair<int, int>{192, 64}, std::pair<int, int>{9, 3}})
    for (int64_t n : {int64_t{1}, int64_t{1000}}) {
      const int64_t R = 700, lo = 100, hi = 650;
      const int w = D - col;
      const std::string what = shape({{"D", D}, {"col", col}, {"n", n}});
      IVec rows = random_ids(n, 0, int32_t(R), gen_);
      for (int64_t k = 0; k < n; k += 3) rows[k] = int32_t(R / 2);
      const Vec given = random_vec(size_t(hi - lo) * w, gen_, -0.1f, 0.1f);
      Vec grads = random_vec(size_t(n) * D, gen_, -0.1f, 0.1f), full = grads;
      std::vector<bool> seen(size_t(R), false);
      for (int64_t k = 0; k < n; ++k) {
        const int32_t r = rows[size_t(k)];
        if (r < lo || r >= hi) continue;
        for (int d = col; d < D; ++d) {
          full[size_t(k) * D + d] = seen[size_t(r)] ? 0.0f : given[size_t(r - lo) * w + d - col];
          grads[size_t(k) * D + d] = std::nanf("");
        }
        seen[size_t(r)] = true;
      }
      const Vec tab = random_vec(size_t(R) * D, gen_);
      const Vec zeros(size_t(R) * D, 0.0f);
      Buffer<RowId> grows = up(rows);
      Buffer<float> gfull = up(full), ggrads = up(grads), ggiven = up(given);
      Buffer<float> gtab[2] = {up(tab), up(tab)}, gm[2] = {up(zeros), up(zeros)},
                    gv[2] = {up(zeros), up(zeros)};
      Vec ctab = tab, cm = zeros, cv = zeros;
      for (int64_t t = 1; t <= 2; ++t) {
        reduce_update_rows(gpu_, grows.data(), gfull.data(), n,
                           TableRows{gtab[0].data(), gm[0].data(), gv[0].data(), R, D}, opt, t);
        reduce_update_rows(gpu_, grows.data(), ggrads.data(), n,
                           TableRows{gtab[1].data(), gm[1].data(), gv[1].data(), R, D}, opt, t,
                           nullptr, GivenColumns{ggiven.data(), lo, hi, col});
        reduce_update_rows(cpu_, rows.data(), grads.data(), n,
                           TableRows{ctab.data(), cm.data(), cv.data(), R, D}, opt, t, nullptr,
                           GivenColumns{given.data(), lo, hi, col});
      }
      expect_same(down(gtab[1]), down(gtab[0]), what + "table");
      expect_same(down(gm[1]), down(gm[0]), what + "first moments");
      expect_same(down(gv[1]), down(gv[0]), what + "second moments");
      expect_close(down(gtab[1]), ctab, kElemAtol, kElemRtol, what + "table against the CPU");
    }
}

TEST_F(Parity, RoutingErrorsNameTheOp) {
  DEVICE_HALF_NEEDS_A_GPU();
  IVec ids = {0, 7, 3}, keys(3);
  Buffer<int32_t> gids = up(ids), gkeys = up(keys);
  ids_to_keys(gpu_, gids.data(), 3, 10, 7, gkeys.data());
  try {
    check_device_errors(gpu_);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids_to_keys"), std::string::npos) << e.what();
  }
  const KeyLayout layout = parity_layout(2, 10);
  IVec routed = {0, int32_t(layout.key_begin[2]) + 1};  // the second: a replicated table's key
  Buffer<int32_t> groutes = up(routed), grows(Device::kCuda, 2);
  Buffer<int64_t> gperm(Device::kCuda, 2);
  std::vector<int64_t> counts(2);
  try {
    bucketize_by_owner(gpu_, groutes.data(), 2, layout, gperm.data(), grows.data(), counts.data());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucketize_by_owner"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ncf
