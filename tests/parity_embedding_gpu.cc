// GPU parity of the embedding exchange's kernels (embedding/embedding_kernels.h):
// bucketize, keys, unique ids, permutations and the BF16 payloads.
#include "parity_gpu.h"

namespace ncf {
namespace {

// ---- embedding_kernels.h ---------------------------------------------------------------------

TEST_F(Parity, BucketizeByOwnerExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int W : {1, 2, 3, 5, 8})
      for (int32_t range : {3, 1000000}) {
        const std::string what = shape({{"n", n}, {"W", W}, {"rows of table 0", range}});
        const KeyLayout layout = parity_layout(W, range);
        IVec keys = random_ids(n, 0, int32_t(layout.key_begin[2]), gen_);  // routed tables
        LVec perm(n, -1);
        IVec rows(n, -1);
        std::vector<int64_t> counts(W, -1), gcounts(W, -1);
        Buffer<int32_t> gkeys = up(keys), grows = up(rows);
        Buffer<int64_t> gperm = up(perm);
        bucketize_by_owner(cpu_, keys.data(), n, layout, perm.data(), rows.data(), counts.data());
        bucketize_by_owner(gpu_, gkeys.data(), n, layout, gperm.data(), grows.data(),
                           gcounts.data());
        expect_same(gcounts, counts, what + "counts");
        expect_same(down(gperm), perm, what + "perm");
        expect_same(down(grows), rows, what + "flat rows");
      }
}

TEST_F(Parity, IdsToKeysExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}})
    for (int64_t offset : {int64_t{0}, int64_t{138493}}) {
      const std::string what = shape({{"n", n}, {"offset", offset}});
      IVec ids = random_ids(n, 0, 26744, gen_), keys(n, -1);
      Buffer<int32_t> gids = up(ids), gkeys = up(keys);
      ids_to_keys(cpu_, ids.data(), n, offset, 26744, keys.data());
      ids_to_keys(gpu_, gids.data(), n, offset, 26744, gkeys.data());
      expect_same(down(gkeys), keys, what + "keys");
    }
}

TEST_F(Parity, UniqueIdsExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20000}})
    for (int32_t range : {1, 5, 1000000}) {
      const std::string what = shape({{"n", n}, {"id range", range}});
      IVec ids = random_ids(n, 0, range, gen_);
      IVec uniq(n, -1);
      LVec inv(n, -1);
      Buffer<int32_t> gids = up(ids), guniq = up(uniq);
      Buffer<int64_t> ginv = up(inv);
      int64_t nu = -1, gnu = -1;
      unique_ids(cpu_, ids.data(), n, uniq.data(), inv.data(), &nu);
      unique_ids(gpu_, gids.data(), n, guniq.data(), ginv.data(), &gnu);
      ASSERT_EQ(gnu, nu) << what;
      expect_same(down(guniq, nu), IVec(uniq.begin(), uniq.begin() + nu), what + "unique");
      expect_same(down(ginv), inv, what + "inverse");
      // With the ids' bound the GPU sorts fewer bits: the same result.
      Buffer<int32_t> guniq_b = up(IVec(n, -1));
      Buffer<int64_t> ginv_b = up(LVec(n, -1));
      int64_t gnu_b = -1;
      unique_ids(gpu_, gids.data(), n, guniq_b.data(), ginv_b.data(), &gnu_b, range);
      ASSERT_EQ(gnu_b, nu) << what << "bounded";
      expect_same(down(guniq_b, nu), IVec(uniq.begin(), uniq.begin() + nu),
                  what + "bounded unique");
      expect_same(down(ginv_b), inv, what + "bounded inverse");
    }
}

TEST_F(Parity, PermuteAndUnpermuteRowsExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int D : kWidths)
      for (int offset : {0, 1}) {
        const std::string what = shape({{"n", n}, {"D", D}, {"offset", offset}});
        const int64_t n_src = std::max<int64_t>(1, n / 3);
        Vec src = random_vec(size_t(std::max(n, n_src)) * D + offset, gen_);
        LVec idx(n), perm(n);
        std::uniform_int_distribution<int64_t> pick(0, n_src - 1);
        for (int64_t k = 0; k < n; ++k) idx[k] = pick(gen_);  // repeats: a gather
        std::iota(perm.begin(), perm.end(), int64_t{0});
        std::shuffle(perm.begin(), perm.end(), gen_);
        Vec out(size_t(n) * D + offset, 2.0f), back(size_t(n) * D + offset, 3.0f);
        Buffer<float> gsrc = up(src), gout = up(out), gback = up(back);
        Buffer<int64_t> gidx = up(idx), gperm = up(perm);
        permute_rows(cpu_, src.data() + offset, n_src, idx.data(), out.data() + offset, n, D);
        permute_rows(gpu_, gsrc.data() + offset, n_src, gidx.data(), gout.data() + offset, n, D);
        expect_same(down(gout), out, what + "permute");
        unpermute_rows(cpu_, src.data() + offset, perm.data(), back.data() + offset, n, D);
        unpermute_rows(gpu_, gsrc.data() + offset, gperm.data(), gback.data() + offset, n, D);
        expect_same(down(gback), back, what + "unpermute");
      }
}

// BF16 payloads (--exchange_dtype bf16): pack, unpack and round in place give
// the same bits on both devices, ties, Inf, NaN and subnormals included.
TEST_F(Parity, Bf16PayloadConversionsExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
    Vec x = random_vec(size_t(n), gen_);
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f,
                             -0.0f,          0x1p-140f,
                             3.4e38f,        INFINITY,
                             -INFINITY,      NAN};
    for (size_t k = 0; k < x.size() && k < 8; ++k) x[k] = special[k];
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    Buffer<float> gx = up(x);
    Buffer<uint16_t> gbits(g_dev, size_t(n));
    pack_bf16(cpu_, x.data(), bits.data(), n);
    pack_bf16(gpu_, gx.data(), gbits.data(), n);
    expect_same(down(gbits), bits, shape({{"pack n", n}}));
    Vec wide(static_cast<size_t>(n));
    Buffer<float> gwide(g_dev, size_t(n));
    unpack_bf16(cpu_, bits.data(), wide.data(), n);
    unpack_bf16(gpu_, gbits.data(), gwide.data(), n);
    expect_same(down(gwide), wide, shape({{"unpack n", n}}));
    round_bf16(cpu_, x.data(), n);
    round_bf16(gpu_, gx.data(), n);
    expect_same(down(gx), x, shape({{"round n", n}}));
  }
}

// BF16 rows (--table_dtype bf16): the widening gather, the scatter, the row
// offsets and the stochastic store keyed by global row give the same bits on
// both devices.
TEST_F(Parity, Bf16RowOpsExact) {
  for (int D : {1, 5, 8, 192})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{300}}) {
      const int64_t R = 1000;
      const std::string what = shape({{"D", D}, {"n", n}});
      IVec rows = random_unique_rows(R, n, gen_);
      const Vec src = random_vec(size_t(n) * D, gen_);
      std::vector<uint16_t> table(size_t(R) * D);
      for (size_t k = 0; k < table.size(); ++k) table[k] = uint16_t(0x3C00 + k % 0x800);
      RowRounding key;
      key.seed = 99;
      key.step = 17;
      key.first = 5;
      key.rank = 2;
      key.layout.W = 4;
      key.layout.T = 2;
      key.layout.key_begin[1] = 4 * 700;
      key.layout.key_begin[2] = 4 * 700 + 4 * 400;
      key.tag[0] = 1;
      key.tag[1] = 2;
      Buffer<uint16_t> gtable = up(table);
      Buffer<RowId> grows = up(rows);
      Buffer<float> gsrc = up(src);
      store_rows_bf16(cpu_, src.data(), rows.data(), table.data(), R, n, D, key);
      store_rows_bf16(gpu_, gsrc.data(), grows.data(), gtable.data(), R, n, D, key);
      expect_same(down(gtable), table, what + "store by rows");
      store_rows_bf16(cpu_, src.data(), nullptr, table.data(), R, n, D, key);
      store_rows_bf16(gpu_, gsrc.data(), nullptr, gtable.data(), R, n, D, key);
      expect_same(down(gtable), table, what + "store in order");
      Vec out(size_t(n) * D);
      Buffer<float> gout(g_dev, size_t(n) * D);
      gather_rows_bf16(cpu_, table.data(), rows.data(), out.data(), R, n, D);
      gather_rows_bf16(gpu_, gtable.data(), grows.data(), gout.data(), R, n, D);
      expect_same(down(gout), out, what + "gather");
      Vec dense = random_vec(size_t(R) * D, gen_);
      Buffer<float> gdense = up(dense);
      scatter_rows(cpu_, src.data(), rows.data(), dense.data(), R, n, D);
      scatter_rows(gpu_, gsrc.data(), grows.data(), gdense.data(), R, n, D);
      expect_same(down(gdense), dense, what + "scatter");
      IVec shifted(static_cast<size_t>(n)), iota(static_cast<size_t>(n));
      Buffer<RowId> gshifted(g_dev, size_t(n)), giota(g_dev, size_t(n));
      offset_rows(cpu_, rows.data(), n, -3, shifted.data());
      offset_rows(gpu_, grows.data(), n, -3, gshifted.data());
      offset_rows(cpu_, nullptr, n, 0, iota.data());
      offset_rows(gpu_, nullptr, n, 0, giota.data());
      expect_same(down(gshifted), shifted, what + "offset");
      expect_same(down(giota), iota, what + "iota");
    }
}

}  // namespace
}  // namespace ncf
