// Backend parity (docs/design.md): every CUDA op against its CPU twin on the
// same seeded random inputs, over a sweep of shapes (empty, one row, duplicate-
// heavy ids, widths 1, 3, 5, 8, 64, 192, misaligned rows), then train_step itself
// (lookup, forward, loss, backward, Adam on the dense net and the tables) for a
// few steps on both devices. A value passes when |gpu − cpu| ≤ atol + rtol·|cpu|
// with the tolerances written at each test (the BF16 GEMMs: relative to the sum
// of |products|); ids, counts, copies, the sort-and-reduce sums, sampled
// negatives and single BF16 products must match bit for bit.
//
// Without a usable GPU only the device half is skipped: every test still makes
// its inputs and calls the CPU reference, so an input the reference refuses, or
// a reference that throws, fails in CI on machines without a GPU. The device
// calls then run on a one-thread CPU context standing in for the GPU (the
// reference runs on two threads), so the comparisons check the test's own
// plumbing and the CPU ops' thread-count invariance within the same
// tolerances; the test ends as skipped, with the reason, since nothing ran on
// a GPU. Sizes that are there to fill a GPU (2^20 rows and more) are smaller
// on the stand-in (Parity::gpu_scale). Tests of what only the GPU does (errors recorded by kernels
// and raised by a later check) skip after their CPU half.
#include "parity_gpu.h"

namespace ncf {
namespace {

// ---- negatives.h ---------------------------------------------------------------------------

// A small dataset whose users hold from one item to all items but one, so the
// rejection loop sometimes runs long; the CPU samples from the memory-mapped
// lists, the GPU from their device copy.
TEST_F(Parity, NegativesBitIdenticalToCpu) {
  const uint64_t U = 40, I = 30;
  test::TempDir dir;
  DatasetPlan plan;
  plan.source = "test";
  plan.num_users = U;
  plan.num_items = I;
  plan.eval_negatives = 1;
  plan.record_rows = 7;
  plan.num_shards = 1;
  std::vector<IVec> pos(U);
  for (uint64_t u = 0; u < U; ++u) {
    IVec all(I);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen_);
    const size_t count = u == 0 ? I - 1 : 2 + (u * 7) % (I - 3);  // user 0: one free item
    pos[u].assign(all.begin(), all.begin() + count);
    plan.num_positives += count;
    plan.num_train += count - 1;
  }
  {
    DatasetWriter w(dir.path(), plan);
    for (uint64_t u = 0; u < U; ++u) {
      IVec sorted = pos[u];
      std::sort(sorted.begin(), sorted.end());
      IVec train(pos[u].begin(), pos[u].end() - 1);
      IVec eval = {pos[u].back(), -1};
      for (int32_t i = 0; i < int32_t(I); ++i)
        if (!std::binary_search(sorted.begin(), sorted.end(), i)) eval[1] = i;
      w.add_user(u, sorted.data(), sorted.size(), train.data(), train.size(), eval.data(),
                 eval.size());
    }
    w.finish();
  }
  DatasetMeta meta = DatasetMeta::load(dir.path());
  PositiveLists lists(dir.path(), meta);
  DevicePositiveLists dlists(lists, g_dev);
  // The kernel's lock-step rounds (of 4, and of 8) against the CPU's draws one at a time;
  // 9 negatives take two rounds, and user 0's one free item many.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int num_neg : {0, 1, 4, 9}) {
      const std::string what = shape({{"n", n}, {"num_neg", num_neg}}) + " ";
      IVec users = random_ids(n, 0, int32_t(U), gen_), items = random_ids(n, 0, int32_t(I), gen_);
      const size_t S = size_t(n) * (1 + num_neg);
      IVec ou(S, -5), oi(S, -5);
      Vec ol(S, -5.0f);
      Buffer<int32_t> gusers = up(users), gitems = up(items), gou = up(ou), goi = up(oi);
      Buffer<float> gol = up(ol);
      sample_negatives(cpu_, lists, I, users.data(), items.data(), 12345, n, num_neg, 99, 3,
                       ou.data(), oi.data(), ol.data());
      sample_negatives(gpu_, dlists, I, gusers.data(), gitems.data(), 12345, n, num_neg, 99, 3,
                       gou.data(), goi.data(), gol.data());
      expect_same(down(gou), ou, what + "users");
      expect_same(down(goi), oi, what + "items");
      expect_same(down(gol), ol, what + "labels");
    }
}

// ---- one whole training step: train_step on both devices -----------------------------------

// A step's ReLU kinks may fall on opposite sides on the two devices (a
// pre-activation within rounding of 0), which changes whole gradient rows; an
// element they touch moves by at most lr per step either way. So: every
// element within steps · 2 · lr, and all but kKinkShare of them within the
// element tolerance.
constexpr double kKinkShare = 0.01;

void expect_mostly_close(const Vec& gpu, const Vec& cpu, double bound, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t loose = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    const double d = std::fabs(double(gpu[k]) - cpu[k]);
    ASSERT_LE(d, bound) << what << " [" << k << "]: gpu " << gpu[k] << ", cpu " << cpu[k];
    loose += d > kElemAtol + kElemRtol * std::fabs(cpu[k]);
  }
  EXPECT_LE(double(loose), kKinkShare * double(gpu.size()) + 1)
      << what << ": " << loose << " elements past the tolerance";
}

// The training steps' small set (300 users, 200 items) at `data`.
void prepare_step_data(const std::string& data) {
  auto r = test::run(test::bin("ncf_prep") +
                     " --synthetic custom --users 300 --items 200 "
                     "--interactions 8000 --eval_negatives 20 --record_rows 256 --num_shards 2 "
                     "--seed 5 --output " +
                     data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// On the GPU, the step whose item lookup writes the GMF columns only (layer 0 reading its
// runs' MLP columns from the item table) gives the bits of the one that writes whole rows.
TEST_F(Parity, NarrowItemLookupStepIsTheWholeRowStepBitForBit) {
  test::TempDir dir;
  const std::string data = dir.file("data");
  ASSERT_NO_FATAL_FAILURE(prepare_step_data(data));
  const DatasetMeta meta = DatasetMeta::load(data);
  const PositiveLists lists(data, meta);
  const DevicePositiveLists dlists(lists, g_dev);
  NeuMFConfig cfg;
  cfg.mf_dim = 8;
  cfg.layers = {64, 32, 16, 8};
  EmbeddingPlan plan;
  plan.D = cfg.embedding_width();
  plan.W = 1;
  plan.tables = {{"user", int64_t(meta.num_users), Placement::kRowWise, 0, 1, 0.05f},
                 {"item", int64_t(meta.num_items), Placement::kRowWise, 0, 2, 0.05f}};
  EmbeddingOptimizerConfig eopt;
  eopt.kind = EmbeddingOptimizer::kDenseAdam;
  eopt.adam = {0.002f, 0.9f, 0.999f, 1e-7f, 0.0f};
  SingleCommunicator comm;
  set_layer0_by_item(Layer0ByItem::kOn);  // by item on the CPU stand-in too
  for (MathMode mode : {MathMode::kTf32, MathMode::kBf16}) {
    set_math_mode(mode);
    std::vector<float> params[2], tables[2][2];
    for (int narrow = 0; narrow < 2; ++narrow) {
      set_narrow_item_lookups(narrow == 1);
      EmbeddingCollection coll(plan, comm, gpu_, eopt, false);
      coll.init(3);
      NeuMF model(cfg, g_dev);
      model.init(3);
      TrainState st;
      st.positives = &lists;
      st.device_positives = &dlists;
      st.num_items = int64_t(meta.num_items);
      st.num_neg = 4;
      st.seed = 3;
      st.dense_hyper = {0.002f, 0.9f, 0.999f, 1e-8f, 0.0f};
      st.tables = &coll;
      st.model = &model;
      st.allocate(gpu_);
      Buffer<double> loss(g_dev, 1);
      TrainReader reader(data, meta, 0, 1, 400, 3, false);
      reader.start_epoch(0);
      TrainBatch b;
      for (int step = 0; step < 3; ++step) {
        ASSERT_TRUE(reader.next(&b));
        const int64_t n = int64_t(b.users.size());
        ASSERT_TRUE(coll.narrow_lookups());
        ASSERT_TRUE(model.layer0_by_item(n * 5, ItemKeys{b.items.data(), st.num_items}));
        Buffer<int32_t> gu = up(b.users), gi = up(b.items);
        train_step(st, {gu.data(), gi.data(), n, b.slice_begin, b.epoch, b.step_count}, comm, gpu_,
                   loss.data());
      }
      params[narrow] = down(model.params(), size_t(model.num_params()));
      for (int t = 0; t < 2; ++t) tables[narrow][t] = coll.gather_table(t);
    }
    const std::string what = mode == MathMode::kTf32 ? "tf32 " : "bf16 ";
    expect_same(params[1], params[0], what + "tower");
    for (int t = 0; t < 2; ++t)
      expect_same(tables[1][t], tables[0][t], what + "table " + std::to_string(t));
  }
}

TEST_F(Parity, TrainStepOnBothDevices) {
  test::TempDir dir;
  const std::string data = dir.file("data");
  ASSERT_NO_FATAL_FAILURE(prepare_step_data(data));
  const DatasetMeta meta = DatasetMeta::load(data);
  const PositiveLists lists(data, meta);
  const DevicePositiveLists dlists(lists, g_dev);
  NeuMFConfig wide;  // D = 8 + 32 = 40: float4 paths
  wide.mf_dim = 8;
  wide.layers = {64, 32, 16, 8};
  NeuMFConfig odd;  // D = 3 + 2 = 5: scalar paths
  odd.mf_dim = 3;
  odd.layers = {4, 5, 3};
  // Placements: both row-wise (the exchange path), or a table-wise user table and
  // a replicated item table (the dense-gradient path: scatter, allreduce, compact).
  const Placement placements[2][2] = {{Placement::kRowWise, Placement::kRowWise},
                                      {Placement::kTableWise, Placement::kReplicated}};
  for (const NeuMFConfig& cfg : {wide, odd})
    for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam})
      for (const auto& place : placements)
        for (bool dedup : {false, true}) {
          const std::string what = shape({{"D", cfg.embedding_width()}, {"dedup", dedup}}) +
                                   optimizer_name(kind) + " " + placement_name(place[0]) + "/" +
                                   placement_name(place[1]) + " ";
          EmbeddingPlan plan;
          plan.D = cfg.embedding_width();
          plan.W = 1;
          plan.tables = {{"user", int64_t(meta.num_users), place[0], 0, 1, 0.05f},
                         {"item", int64_t(meta.num_items), place[1], 0, 2, 0.05f}};
          EmbeddingOptimizerConfig eopt;
          eopt.kind = kind;
          eopt.adam = {0.002f, 0.9f, 0.999f, 1e-7f, 0.0f};
          SingleCommunicator comm;
          struct Side {
            std::unique_ptr<EmbeddingCollection> tables;
            std::unique_ptr<NeuMF> model;
            TrainState st;
            Buffer<double> loss;
          } side[2];
          const ExecContext* ctx[2] = {&cpu_, &gpu_};
          for (int d = 0; d < 2; ++d) {
            side[d].tables =
                std::make_unique<EmbeddingCollection>(plan, comm, *ctx[d], eopt, dedup);
            side[d].tables->init(3);
            side[d].model = std::make_unique<NeuMF>(cfg, ctx[d]->device);
            side[d].model->init(3);
            TrainState& st = side[d].st;
            st.positives = &lists;
            st.device_positives = &dlists;
            st.num_items = int64_t(meta.num_items);
            st.num_neg = 4;
            st.seed = 3;
            st.dense_hyper = {0.002f, 0.9f, 0.999f, 1e-8f, 0.0f};
            st.tables = side[d].tables.get();
            st.model = side[d].model.get();
            st.allocate(*ctx[d]);
            side[d].loss = Buffer<double>(ctx[d]->device, 1);
          }
          TrainReader reader(data, meta, 0, 1, 400, 3, false);
          reader.start_epoch(0);
          TrainBatch b;
          const int kSteps = 3;
          for (int step = 0; step < kSteps; ++step) {
            ASSERT_TRUE(reader.next(&b));
            const int64_t n = int64_t(b.users.size());
            Buffer<int32_t> gu = up(b.users), gi = up(b.items);
            double loss[2];
            for (int d = 0; d < 2; ++d) {
              const StepBatch batch{d ? gu.data() : b.users.data(),
                                    d ? gi.data() : b.items.data(),
                                    n,
                                    b.slice_begin,
                                    b.epoch,
                                    b.step_count};
              train_step(side[d].st, batch, comm, *ctx[d], side[d].loss.data());
              loss[d] = down(side[d].loss)[0];
            }
            // The loss share: a double sum of per-sample losses whose logits carry
            // the FP32 GEMM differences (~1e-5 relative).
            EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0])) << what << "step " << step;
          }
          const double bound = kSteps * 2.0 * 0.002 + 1e-5;
          const size_t n_params = size_t(side[0].model->num_params());
          expect_mostly_close(down(side[1].model->params(), n_params),
                              down(side[0].model->params(), n_params), bound, what + "tower");
          for (int table = 0; table < 2; ++table)
            expect_mostly_close(side[1].tables->gather_table(table),
                                side[0].tables->gather_table(table), bound,
                                what + "table " + std::to_string(table));
        }
}

}  // namespace
}  // namespace ncf
