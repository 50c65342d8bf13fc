// train_step in one process at W = 1 against the same step composed by hand
// from the separate ops: negatives, one gather per table, the tower, the loss,
// then per table sort_reduce_rows + embedding_dense_adam (not the fused
// update, not the flat buffer) and the tower's Adam. Both run on the CPU and
// must agree bit for bit after every step: the loss share, the tower and both
// tables. (The GPU parity test runs the same function on a CUDA context.)
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/single_communicator.h"
#include "data/dataset.h"
#include "data/negatives.h"
#include "data/reader.h"
#include "embedding/collection.h"
#include "embedding/table_ops.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "model/optim.h"
#include "test_util.h"
#include "train/step.h"
#include "train/step_graph.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

bool same_bits(const std::vector<float>& a, const float* b) {
  return std::memcmp(a.data(), b, a.size() * 4) == 0;
}

// mode: layer 0 by item or per sample on this CPU; narrow: the step's item lookup writes
// only the GMF columns where it may (the reference always gathers whole rows).
void expect_train_step_is_the_composed_step(Layer0ByItem mode, bool narrow) {
  set_layer0_by_item(mode);
  set_narrow_item_lookups(narrow);
  TempDir dir;
  const std::string data = dir.file("data");
  auto r = run(bin("ncf_prep") +
               " --synthetic custom --users 120 --items 70 --interactions 3000 "
               "--eval_negatives 20 --record_rows 256 --num_shards 2 --seed 5 --output " +
               data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const DatasetMeta meta = DatasetMeta::load(data);
  const PositiveLists positives(data, meta);
  ExecContext ctx;
  ctx.threads = 2;
  SingleCommunicator comm;
  const int64_t U = int64_t(meta.num_users), I = int64_t(meta.num_items);
  NeuMFConfig mc;
  mc.mf_dim = 4;
  mc.layers = {16, 8};
  const int D = mc.embedding_width();
  const int num_neg = 3, S = num_neg + 1;
  const uint64_t seed = 9;

  EmbeddingPlan plan;
  plan.D = D;
  plan.W = 1;
  plan.tables = {{"user", U, Placement::kRowWise, 0, 1, 0.05f},
                 {"item", I, Placement::kRowWise, 0, 2, 0.05f}};
  EmbeddingOptimizerConfig eopt;
  eopt.kind = EmbeddingOptimizer::kDenseAdam;
  eopt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.0f};
  EmbeddingCollection tables(plan, comm, ctx, eopt, false);
  tables.init(seed);
  NeuMF model(mc, Device::kCpu);
  model.init(seed);
  TrainState st;
  st.positives = &positives;
  st.num_items = I;
  st.num_neg = num_neg;
  st.seed = seed;
  st.dense_hyper = {0.02f, 0.9f, 0.999f, 1e-8f, 0.0f};
  st.tables = &tables;
  st.model = &model;
  st.allocate(ctx);

  // The reference: its own tables, tower and moments, from the same start.
  std::vector<float> ref_table[2] = {tables.gather_table(0), tables.gather_table(1)};
  std::vector<float> ref_m[2], ref_v[2];
  for (int t = 0; t < 2; ++t) {
    ref_m[t].assign(ref_table[t].size(), 0.0f);
    ref_v[t].assign(ref_table[t].size(), 0.0f);
  }
  NeuMF ref_model(mc, Device::kCpu);
  ref_model.init(seed);
  const int64_t P = int64_t(model.num_params());
  std::vector<float> ref_am(size_t(P), 0.0f), ref_av(size_t(P), 0.0f);

  TrainReader reader(data, meta, 0, 1, 200, seed, false);
  reader.start_epoch(0);
  TrainBatch b;
  int64_t steps = 0;
  for (; steps < 6 && reader.next(&b); ++steps) {
    const int64_t n = int64_t(b.users.size()), B = n * S, G = b.step_count * S;
    double loss = -1;
    train_step(st, {b.users.data(), b.items.data(), n, b.slice_begin, b.epoch, b.step_count}, comm,
               ctx, &loss);

    std::vector<int32_t> su(static_cast<size_t>(B)), si(static_cast<size_t>(B));
    std::vector<float> labels(static_cast<size_t>(B)), logits(static_cast<size_t>(B)),
        dlogits(static_cast<size_t>(B));
    sample_negatives(ctx, positives, uint64_t(I), b.users.data(), b.items.data(), b.slice_begin, n,
                     num_neg, seed, b.epoch, su.data(), si.data(), labels.data());
    // One user row per positive (its S samples share it), one item row per sample.
    std::vector<float> rows[2] = {std::vector<float>(size_t(n) * D),
                                  std::vector<float>(size_t(B) * D)};
    gather_rows(ctx, ref_table[0].data(), b.users.data(), rows[0].data(), U, n, D);
    gather_rows(ctx, ref_table[1].data(), si.data(), rows[1].data(), I, B, D);
    // Layer 0 by item, from the samples' item ids, as train_step runs it.
    // The step took layer 0 by item (and, with narrow, its narrow lookup) where this says so.
    ASSERT_TRUE(tables.narrow_lookups());
    ASSERT_EQ(ref_model.layer0_by_item(B, ItemKeys{si.data(), I}), mode == Layer0ByItem::kOn)
        << "step " << steps;
    ref_model.forward(ctx, rows[0].data(), rows[1].data(), n, S, logits.data(),
                      ItemKeys{si.data(), I});
    double ref_loss = 0;
    bce_with_logits_forward(ctx, logits.data(), labels.data(), nullptr, &ref_loss, B, B, G);
    bce_with_logits_backward(ctx, logits.data(), labels.data(), nullptr, dlogits.data(), B, B, G);
    std::vector<float> drows[2] = {std::vector<float>(size_t(n) * D),
                                   std::vector<float>(size_t(B) * D)};
    ref_model.backward(ctx, dlogits.data(), drows[0].data(), drows[1].data());
    const int64_t t = steps + 1;
    const int32_t* ids[2] = {b.users.data(), si.data()};
    const int64_t N[2] = {U, I}, count[2] = {n, B};
    for (int k = 0; k < 2; ++k) {
      std::vector<RowId> urows(static_cast<size_t>(count[k]));
      std::vector<float> ugrads(static_cast<size_t>(count[k]) * D);
      int64_t nu = 0;
      sort_reduce_rows(ctx, ids[k], drows[k].data(), count[k], D, urows.data(), ugrads.data(), &nu);
      embedding_dense_adam(ctx, ref_table[k].data(), ref_m[k].data(), ref_v[k].data(), urows.data(),
                           ugrads.data(), N[k], nu, D, t, eopt.adam);
    }
    dense_adam_step(ctx, ref_model.params().data(), ref_model.grads().data(), ref_am.data(),
                    ref_av.data(), P, t, st.dense_hyper);

    ASSERT_EQ(loss, ref_loss) << "step " << steps;
    std::vector<float> params(ref_model.params().data(), ref_model.params().data() + P);
    ASSERT_TRUE(same_bits(params, model.params().data())) << "tower, step " << steps;
    for (int k = 0; k < 2; ++k)
      ASSERT_TRUE(same_bits(ref_table[k], tables.gather_table(k).data()))
          << "table " << k << ", step " << steps;
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(st.t, 6);
}

TEST(StepOneRank, TrainStepEqualsTheStepComposedFromSeparateOps) {
  expect_train_step_is_the_composed_step(Layer0ByItem::kOff, true);
  set_layer0_by_item(Layer0ByItem::kAuto);
}

// 200 positives of 4 samples over 70 items: layer 0 by item, its runs' MLP columns read
// from the item table (the lookup writing the GMF columns only) or from the samples' rows.
TEST(StepOneRank, ByItemFromTheTableEqualsTheStepComposedFromSeparateOps) {
  expect_train_step_is_the_composed_step(Layer0ByItem::kOn, true);
  expect_train_step_is_the_composed_step(Layer0ByItem::kOn, false);
  set_layer0_by_item(Layer0ByItem::kAuto);
  set_narrow_item_lookups(true);
}

// Which steps --cuda_graph on can capture: one GPU rank with FP32 table rows. Elsewhere a
// step waits on the host (the exchange's sizes, the BF16 rows' unique count) and the reason
// says which wait; CPU ranks launch nothing.
TEST(StepGraph, CapturesOnlyStepsThatNeverWaitOnTheHost) {
  EXPECT_NE(step_graph_refusal(Device::kCpu, 1, false).find("CPU ranks"), std::string::npos);
  EXPECT_NE(step_graph_refusal(Device::kCuda, 2, false).find("2 ranks"), std::string::npos);
  EXPECT_NE(step_graph_refusal(Device::kCuda, 8, true).find("8 ranks"), std::string::npos);
  EXPECT_NE(step_graph_refusal(Device::kCuda, 1, true).find("--table_dtype bf16"),
            std::string::npos);
#ifdef NCF_WITH_CUDA
  EXPECT_EQ(step_graph_refusal(Device::kCuda, 1, false), "");
#else
  EXPECT_NE(step_graph_refusal(Device::kCuda, 1, false).find("no CUDA"), std::string::npos);
#endif
}

}  // namespace
}  // namespace ncf
