// The memory guard's estimate on a CUDA rank (train/memory_estimate.h), checked on
// the CPU: the CUB and scratch bounds against hand-worked layouts, and the whole
// estimate of the ml-20m MLPerf job, whose CUDA total must carry the scratch arena
// (1.5 x its largest carve) and the context's workspaces on top of the host total.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace ncf {
namespace {

TEST(MemoryGuard, CubBoundsByHand) {
  // 10^6 pairs of int32: alternate keys and values 8·10^6, look-back 10^6/4, 256 KiB.
  EXPECT_EQ(cub_sort_pairs_bytes(1000000, 4, 4), 8000000 + 250000 + 262144);
  EXPECT_EQ(cub_scan_bytes(1000000), 250000 + 4096);
  EXPECT_EQ(cub_segmented_sort_keys_bytes(1000, 8), 8000 + 512);
}

TEST(MemoryGuard, SortRunsScratchByHand) {
  // n = 1000 ids of width D = 8, unique ids in scratch, a 100-row map. Arrays start
  // on 256-byte boundaries (the running end, then the next start):
  //   5 × [1000] int32        0 → 4000, 4096 → 8096, 8192 → 12192, 12288 → 16288,
  //                           16384 → 20384
  //   2 × [1001] int32        20480 → 24484, 24576 → 28580
  //   owners [32] int32       28672 → 28800          (2·1000/64 + 1 = 32 partials)
  //   partials [32 × 8] f32   28928 → 29952
  //   run count               29952 → 29956
  //   CUB temporary 270394    30208 → 300602         (sort pairs: 8000 + 250 + 262144)
  //   unique [1000] int32     300800 → 304800
  //   map [100] int32         304896 → 305296
  EXPECT_EQ(sort_runs_scratch_bytes(1000, 8, true, 100), 305296);
  // Without its own unique ids and map the last two go.
  EXPECT_EQ(sort_runs_scratch_bytes(1000, 8, false, 0), 300602);
}

TrainConfig mlperf() {
  TrainConfig c;
  c.preset = "ml-20m-mlperf";
  c.batch_size = 1048576;
  c.num_factors = 64;
  c.layers = {256, 256, 128, 64};
  c.num_neg = 4;
  c.eval_batch_size = 100000;
  c.embedding_optimizer = "dense_adam";
  return c;
}

DatasetMeta ml20m() {
  DatasetMeta m;
  m.num_users = 138493;
  m.num_items = 26744;
  m.num_train = 20000263 - 138493;
  m.num_eval_users = 138493;
  m.eval_negatives = 999;
  return m;
}

// One rank (W = 1), TF32: the largest carve is the fused dense-Adam update over the
// step's n + n·S ids (n = 1048576/5 + 1 = 209716 users, 1048580 items) with its
// row map of all 165237 rows: 81926868 bytes, so the arena may reach 122890302.
TEST(MemoryGuard, CudaEstimateCountsScratchAndWorkspaces) {
  const TrainConfig cfg = mlperf();
  const DatasetMeta meta = ml20m();
  const EmbeddingPlan plan = plan_for_job(cfg, meta, 1);
  const ScratchShapes s = scratch_shapes(cfg, meta, plan, 0);
  EXPECT_EQ(s.positives, 209716);
  EXPECT_EQ(s.routed_rows, 138493 + 26744);
  const int64_t peak = cuda_scratch_peak_bytes(s);
  EXPECT_EQ(peak, sort_runs_scratch_bytes(209716 + 1048580, 192, true, 165237));
  EXPECT_EQ(peak, 81926868);
  EXPECT_EQ(cuda_scratch_arena_bytes(peak), 122890302);
  EXPECT_EQ(cuda_fixed_bytes(), int64_t{576} << 20);

  const MemoryEstimate host = estimate_rank_memory(cfg, meta, plan, 0, Device::kCpu);
  const MemoryEstimate gpu = estimate_rank_memory(cfg, meta, plan, 0, Device::kCuda);
  EXPECT_EQ(host.scratch, 0);
  EXPECT_EQ(host.workspaces, 0);
  EXPECT_EQ(gpu.scratch, 122890302);
  EXPECT_EQ(gpu.workspaces, int64_t{576} << 20);
  // The GPU also keeps the evaluation's lists: 138493 users of 1 + 999 entries, 5 bytes each
  // and 4 for the user.
  const int64_t lists = 138493 * (4 + 5 * 1000);
  EXPECT_EQ(eval_lists_cache_bytes(138493, 1000), lists);
  EXPECT_EQ(gpu.total() - host.total(), 122890302 + (int64_t{576} << 20) + lists);
  // The rest of the estimate is the same on both devices.
  EXPECT_EQ(gpu.tables, host.tables);
  EXPECT_EQ(gpu.exchange, host.exchange);
  EXPECT_EQ(gpu.step, host.step + lists);
  // Lists past the cap are read again for every evaluation instead.
  EXPECT_EQ(eval_lists_cache_bytes(1000000, 1000), 0);
}

// --precision bf16 carves FP32 products into the arena: on BF16 storage the largest
// is layer 0's product before its epilogue (which adds the users' rows), [1048580 ×
// 256] FP32, 1073745920 bytes; more than the per-GEMM copies' largest carve (the
// unfused top's path), the BF16 copies of layer 0's item GEMM in the backward (dZ
// [1048580 × 256] and the items' MLP halves [1048580 × 128, stride 192]: 536872960 +
// 402654592 bytes), which the estimate also covers.
TEST(MemoryGuard, Bf16ProductsDominateTheArena) {
  TrainConfig cfg = mlperf();
  cfg.precision = "bf16";
  const DatasetMeta meta = ml20m();
  const EmbeddingPlan plan = plan_for_job(cfg, meta, 1);
  const int64_t peak = cuda_scratch_peak_bytes(scratch_shapes(cfg, meta, plan, 0));
  EXPECT_EQ(peak, int64_t{1048580} * 256 * 4);
  EXPECT_GT(peak, 536872960 + 402654592);
  EXPECT_EQ(estimate_rank_memory(cfg, meta, plan, 0, Device::kCuda).scratch,
            cuda_scratch_arena_bytes(peak));
}

// Eight ranks: the planner replicates the item table (its allreduce moves fewer
// bytes than its exchange) and leaves dedup off. The largest carve is then the sum
// of this rank's n·S = 131075 item-gradient rows (sort_reduce_rows, ids not kept, no
// map), larger than the owners' update of the 26215 user ids with its row map.
TEST(MemoryGuard, EightRanksScaleDown) {
  const TrainConfig cfg = mlperf();
  const DatasetMeta meta = ml20m();
  const EmbeddingPlan plan = plan_for_job(cfg, meta, 8);
  ASSERT_EQ(plan.tables[1].placement, Placement::kReplicated) << plan.reason;
  ASSERT_FALSE(plan.dedup) << plan.reason;
  for (int r : {0, 7}) {
    const ScratchShapes s = scratch_shapes(cfg, meta, plan, r);
    EXPECT_EQ(s.positives, 209715 / 8 + 1);
    EXPECT_EQ(s.routed_rows, table_rank_rows(plan.tables[0], r, 8));
    EXPECT_EQ(s.replicated_rows, (std::vector<int64_t>{0, 26744}));
    const int64_t peak = cuda_scratch_peak_bytes(s);
    EXPECT_EQ(peak, sort_runs_scratch_bytes(26215 * 5, 192, false, 0)) << r;
    EXPECT_GT(peak, sort_runs_scratch_bytes(26215, 192, true, s.routed_rows)) << r;
    EXPECT_EQ(peak, 8178712) << r;
    EXPECT_EQ(estimate_rank_memory(cfg, meta, plan, r, Device::kCuda).scratch, 12268068) << r;
  }
}

// Evaluating a checkpoint and serving train nothing: no update carves, but the
// serving paths (top_k over a group of users against every item) are bounded.
TEST(MemoryGuard, RowsOnlyHasNoTrainingCarves) {
  TrainConfig cfg = mlperf();
  cfg.eval_only = true;
  const DatasetMeta meta = ml20m();
  const EmbeddingPlan plan = plan_for_job(cfg, meta, 1);
  const ScratchShapes s = scratch_shapes(cfg, meta, plan, 0);
  EXPECT_FALSE(s.train);
  EXPECT_EQ(s.positives, 0);
  EXPECT_EQ(s.score_users, 100000 / 26744);
  EXPECT_TRUE(s.top_k);
  // top_k over 3 users × 26744 items: keys, sorted keys, 4 segment offsets, CUB.
  const int64_t keys = 3 * 26744;
  const int64_t top_k = ((8 * keys + 255) / 256 * 256 + 8 * keys + 255) / 256 * 256 + 16;
  const int64_t expected = (top_k + 255) / 256 * 256 + keys * 8 + 512;
  EXPECT_EQ(cuda_scratch_peak_bytes(s), expected);
}

// --eval_batch_size's default follows the resolved device: 100,000 on CPU ranks, a
// million on GPU ranks; a value on the command line is kept on either, even the CPU's
// default.
TEST(DeviceDefaults, GpuRanksEvaluateInBatchesOfAMillionUnlessTheFlagIsGiven) {
  auto parsed = [](std::vector<std::string> args, bool gpu) {
    args.insert(args.begin(), {"ncf_dist", "--data_dir", "/nonexistent"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    TrainConfig c;
    int code = -1;
    EXPECT_TRUE(parse_train_flags(int(argv.size()), argv.data(), &c, &code));
    use_device_defaults(&c, gpu);
    return c.eval_batch_size;
  };
  EXPECT_EQ(parsed({}, false), 100000);
  EXPECT_EQ(parsed({}, true), kGpuEvalBatchSize);
  EXPECT_EQ(kGpuEvalBatchSize, 1000000);
  EXPECT_EQ(parsed({"--eval_batch_size", "5000"}, true), 5000);
  EXPECT_EQ(parsed({"--eval_batch_size", "100000"}, true), 100000);
  EXPECT_EQ(parsed({"--eval_batch_size", "2000000"}, false), 2000000);
}

}  // namespace
}  // namespace ncf
