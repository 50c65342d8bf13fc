// GPU parity of the host tier (embedding/tier_ops.h, embedding/collection.h with a cache):
// its copy, map and rounding kernels against their CPU twins, bit for bit, reading and
// writing host memory registered with the GPU as the home arrays are; and a GPU
// collection with a cache of 30% of its rows, its steps announced ahead, against the same
// collection with every row on the GPU: the same bits.
#include "embedding/tier_ops.h"
#include "parity_gpu.h"

namespace ncf {
namespace {

// Host memory that the GPU's kernels use directly (the home arrays' kind), or on the CPU
// stand-in plain host memory.
template <typename T>
struct Home {
  std::vector<T> v;
  explicit Home(std::vector<T> init) : v(std::move(init)) {
    if (g_dev == Device::kCuda) host_register(v.data(), v.size() * sizeof(T));
  }
  ~Home() {
    if (g_dev == Device::kCuda) host_unregister(v.data());
  }
};

TEST_F(Parity, TierOpsExact) {
  for (int width : {1, 3, 8, 33}) {
    const int64_t R = 500, C = 120, n = 100;
    const std::string what = shape({{"width", width}});
    // Rows home -> cache slots (FP32 and 2-byte rows), then back into other home rows.
    const IVec rows = random_unique_rows(R, n, gen_);
    IVec slots = random_unique_rows(C, n, gen_);
    std::shuffle(slots.begin(), slots.end(), gen_);
    const Vec home = random_vec(R * width, gen_);
    std::vector<uint16_t> home16(size_t(R * width));
    for (size_t k = 0; k < home16.size(); ++k) home16[k] = uint16_t(gen_());
    Vec cache(size_t(C * width), -1.0f);
    std::vector<uint16_t> cache16(size_t(C * width), 7);
    copy_rows(cpu_, home.data(), rows.data(), R, cache.data(), slots.data(), C, n, width, 4);
    copy_rows(cpu_, home16.data(), rows.data(), R, cache16.data(), slots.data(), C, n, width, 2);
    Home<float> ghome(home);
    Home<uint16_t> ghome16(home16);
    Buffer<float> gcache = up(Vec(size_t(C * width), -1.0f));
    Buffer<uint16_t> gcache16 = up(std::vector<uint16_t>(size_t(C * width), 7));
    Buffer<int32_t> grows = up(rows), gslots = up(slots);
    copy_rows(gpu_, ghome.v.data(), grows.data(), R, gcache.data(), gslots.data(), C, n, width, 4);
    copy_rows(gpu_, ghome16.v.data(), grows.data(), R, gcache16.data(), gslots.data(), C, n, width,
              2);
    EXPECT_EQ(down(gcache), cache) << what << "home -> cache, 4-byte elements";
    EXPECT_EQ(down(gcache16), cache16) << what << "home -> cache, 2-byte elements";
    // Back: the cache's slots into rows of a zeroed home.
    Home<float> gback(Vec(size_t(R * width), 0.0f));
    Vec back(size_t(R * width), 0.0f);
    copy_rows(cpu_, cache.data(), slots.data(), C, back.data(), rows.data(), R, n, width, 4);
    copy_rows(gpu_, gcache.data(), gslots.data(), C, gback.v.data(), grows.data(), R, n, width, 4);
    check_device_errors(gpu_);  // the host reads gback next
    EXPECT_EQ(gback.v, back) << what << "cache -> home";
  }
  // The slot map: assigned, read back, and a row without a slot recorded.
  const int64_t R = 300;
  const IVec rows = random_unique_rows(R, 80, gen_);
  IVec slots(rows.size());
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), gen_);
  IVec map(size_t(R), -1);
  assign_map(cpu_, map.data(), rows.data(), slots.data(), 0, 80, R);
  Buffer<int32_t> gmap = up(IVec(size_t(R), -1)), grows = up(rows), gslots = up(slots);
  assign_map(gpu_, gmap.data(), grows.data(), gslots.data(), 0, 80, R);
  EXPECT_EQ(down(gmap), map);
  IVec out(rows.size());
  Buffer<int32_t> gout = up(out);
  map_rows(cpu_, map.data(), rows.data(), R, 80, out.data());
  map_rows(gpu_, gmap.data(), grows.data(), R, 80, gout.data());
  EXPECT_EQ(down(gout), out);
  assign_map(gpu_, gmap.data(), grows.data(), nullptr, -1, 1, R);  // rows[0] leaves the cache
  if (on_gpu()) {  // recorded by the kernel, raised by the next check
    map_rows(gpu_, gmap.data(), grows.data(), R, 80, gout.data());
    EXPECT_THROW(check_device_errors(gpu_), Error) << "a row without a slot is an error";
  } else {
    EXPECT_THROW(map_rows(gpu_, gmap.data(), grows.data(), R, 80, gout.data()), Error);
  }
}

TEST_F(Parity, StoreRowsBf16AtExact) {
  for (int D : {1, 5, 16}) {
    const int64_t C = 64, n = 40;
    RowRounding key;
    key.seed = 9;
    key.step = 3;
    key.layout.placement[0] = Placement::kRowWise;
    const IVec key_rows = random_unique_rows(1000, n, gen_);
    IVec slots = random_unique_rows(C, n, gen_);
    std::shuffle(slots.begin(), slots.end(), gen_);
    const Vec src = random_vec(n * D, gen_);
    std::vector<uint16_t> dst(size_t(C * D), 0);
    store_rows_bf16_at(cpu_, src.data(), key_rows.data(), slots.data(), dst.data(), C, n, D, key);
    Buffer<float> gsrc = up(src);
    Buffer<int32_t> gkeys = up(key_rows), gslots = up(slots);
    Buffer<uint16_t> gdst = up(std::vector<uint16_t>(size_t(C * D), 0));
    store_rows_bf16_at(gpu_, gsrc.data(), gkeys.data(), gslots.data(), gdst.data(), C, n, D, key);
    EXPECT_EQ(down(gdst), dst) << shape({{"D", D}});
  }
}

// A collection on the device with a cache of every row (its slots mirror the rows: no slot
// map), of 30% of its rows, and of a step's rows (smaller than the window: steps evict
// rows of later steps, which load again), against the same collection with every row
// there, over steps announced two ahead: the same rows looked up, the same tables after,
// for FP32 rows with row-wise Adagrad and BF16 rows with lazy Adam. The announcements' copies run
// on the side stream, the steps' own on the compute stream (tier_stream.h).
TEST_F(Parity, HostTierCollectionIsTheAllOnDeviceOneBitForBit) {
  SingleCommunicator comm;
  for (const int64_t slots : {int64_t{400 + 250}, int64_t{(400 + 250) * 3 / 10}, int64_t{150}})
    for (bool bf16 : {false, true}) {
      EmbeddingPlan plan;
      plan.D = 12;
      plan.W = 1;
      plan.tables = {{"user", 400, Placement::kRowWise, 0, 1, 0.01f},
                     {"item", 250, Placement::kRowWise, 0, 2, 0.01f}};
      plan.table_elem_bytes = bf16 ? 2 : 4;
      EmbeddingOptimizerConfig o;
      o.kind = bf16 ? EmbeddingOptimizer::kLazyAdam : EmbeddingOptimizer::kRowwiseAdagrad;
      o.adagrad.lr = 0.2f;
      o.adam.lr = 0.05f;
      EmbeddingCollection all(plan, comm, gpu_, o, false);
      EmbeddingCollection tier(plan, comm, gpu_, o, false, slots);
      all.init(4);
      tier.init(4);
      const int steps = 16;
      std::vector<IVec> users, items;
      for (int s = 0; s < steps; ++s) {
        users.push_back(random_ids(60, 0, 400, gen_));
        items.push_back(random_ids(90, 0, 250, gen_));
      }
      int announced = 0;
      for (int s = 0; s < steps; ++s) {
        for (; announced <= std::min(steps - 1, s + 2); ++announced)
          tier.announce(
              {{users[size_t(announced)].data(), 60}, {items[size_t(announced)].data(), 90}});
        Buffer<int32_t> gu = up(users[size_t(s)]), gi = up(items[size_t(s)]);
        const Vec grads = random_vec(150 * plan.D, gen_);
        for (EmbeddingCollection* e : {&all, &tier}) {
          e->lookup({{gu.data(), 60}, {gi.data(), 90}});
          device_copy(g_dev, e->row_grads(0), Device::kCpu, grads.data(), grads.size() * 4);
          e->gradients_start(nullptr);
          e->gradients_finish(s + 1);
        }
        Vec a(size_t(150 * plan.D)), b(a.size());
        device_copy(Device::kCpu, a.data(), g_dev, all.rows(0), a.size() * 4);
        device_copy(Device::kCpu, b.data(), g_dev, tier.rows(0), b.size() * 4);
        ASSERT_EQ(a, b) << (bf16 ? "bf16" : "fp32") << ", " << slots << " slots, step " << s
                        << ": rows looked up";
      }
      for (int t = 0; t < 2; ++t)
        EXPECT_EQ(all.gather_table(t), tier.gather_table(t))
            << (bf16 ? "bf16" : "fp32") << ", " << slots << " slots, table " << t;
      ASSERT_NE(tier.cache_counters(), nullptr);
      if (slots < 650) {
        EXPECT_GT(tier.cache_counters()->evictions, 0) << slots << " slots: rows left the cache";
      }
      if (slots == 150) {
        EXPECT_GT(tier.cache_counters()->evicted_in_window, 0) << "a step's rows: below the window";
      }
    }
}

}  // namespace
}  // namespace ncf
