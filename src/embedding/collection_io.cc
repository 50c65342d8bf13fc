// The collection's tables in global row order, for checkpoints: each rank
// hands over or takes the block of rows common/partition.h gives it, whatever
// the placement that holds them. One all-to-all per array moves the rows
// between the owners and the blocks, so any W writes a file that any W reads
// and no rank ever holds a whole routed table.
#include <algorithm>

#include "common/check.h"
#include "common/partition.h"
#include "embedding/collection.h"

namespace ncf {

int EmbeddingCollection::num_state_arrays() const {
  return 1 + optimizer_state_per_element(opt_.kind);
}

float* EmbeddingCollection::state_array(int array) {
  NCF_CHECK(array >= 0 && array < num_state_arrays(), "embedding state array ", array,
            " out of range [0, ", num_state_arrays(), ") for ", optimizer_name(opt_.kind));
  return array == 0 ? params_.data() : array == 1 ? m_.data() : v_.data();
}

namespace {

// Which of rank p's rows of a table fall into rank q's block, as the global
// row ids in ascending order: [first, first + count) of the block, and for a
// row-wise table only those with id ≡ p (mod W).
struct BlockSlice {
  int64_t first = 0;  // first global row of the slice
  int64_t count = 0;  // rows
  int64_t step = 1;   // id stride: W for row-wise, else 1
};

BlockSlice slice_of(Placement placement, int owner, int64_t N, int W, int p, int q) {
  int64_t first = 0, count = 0;
  block_range(N, W, q, &first, &count);
  BlockSlice s;
  switch (placement) {
    case Placement::kRowWise: {
      const int64_t g0 = first + ((p - first % W) % W + W) % W;  // first id ≡ p in the block
      s.first = g0;
      s.count = g0 < first + count ? (first + count - 1 - g0) / W + 1 : 0;
      s.step = W;
      break;
    }
    case Placement::kTableWise:
      if (p == owner) s = {first, count, 1};
      break;
    case Placement::kReplicated:
      if (p == q) s = {first, count, 1};
      break;
  }
  return s;
}

// The local row of global row g on the rank holding it (flat rows of the table).
int64_t local_row(Placement placement, int64_t g, int W) {
  return placement == Placement::kRowWise ? g / W : g;
}

}  // namespace

std::vector<float> EmbeddingCollection::export_block(int t, int array) {
  NCF_CHECK(t >= 0 && t < num_tables(), "export_block: table ", t);
  const int D = plan_.D;
  const TableSpec& spec = plan_.tables[t];
  const int64_t N = spec.num_rows;
  const int u = lt_[t];
  const int64_t R = layout_.rows_on(u, rank_), base = layout_.begin_on(u, rank_);
  // This rank's rows of the table on the host.
  std::vector<float> mine(size_t(R) * D);
  if (R > 0)
    device_copy(Device::kCpu, mine.data(), ctx_.device, state_array(array) + base * D,
                mine.size() * 4);
  int64_t first = 0, count = 0;
  block_range(N, W_, rank_, &first, &count);
  std::vector<float> block(size_t(count) * D);
  const Placement pl = local_ ? Placement::kReplicated : spec.placement;
  if (pl == Placement::kReplicated) {  // every rank holds all rows
    std::copy_n(mine.begin() + first * D, count * D, block.begin());
    return block;
  }
  // Send to each block's rank the rows of its block that this rank holds.
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  std::vector<float> send;
  for (int q = 0; q < W_; ++q) {
    const BlockSlice s = slice_of(pl, spec.owner, N, W_, rank_, q);
    sd[q] = int64_t(send.size());
    sc[q] = s.count * D;
    for (int64_t k = 0; k < s.count; ++k) {
      const int64_t row = local_row(pl, s.first + k * s.step, W_);
      send.insert(send.end(), mine.begin() + row * D, mine.begin() + (row + 1) * D);
    }
  }
  int64_t total = 0;
  for (int p = 0; p < W_; ++p) {
    rd[p] = total;
    rc[p] = slice_of(pl, spec.owner, N, W_, p, rank_).count * D;
    total += rc[p];
  }
  std::vector<float> recv(static_cast<size_t>(total));
  all_to_all_v_on(comm_, Device::kCpu, send.data(), sc.data(), sd.data(), recv.data(), rc.data(),
                  rd.data(), DType::kFloat32);
  for (int p = 0; p < W_; ++p) {
    const BlockSlice s = slice_of(pl, spec.owner, N, W_, p, rank_);
    for (int64_t k = 0; k < s.count; ++k)
      std::copy_n(recv.begin() + rd[p] + k * D, D,
                  block.begin() + (s.first + k * s.step - first) * D);
  }
  return block;
}

void EmbeddingCollection::import_block(int t, int array, const float* block) {
  NCF_CHECK(t >= 0 && t < num_tables(), "import_block: table ", t);
  const int D = plan_.D;
  const TableSpec& spec = plan_.tables[t];
  const int64_t N = spec.num_rows;
  const int u = lt_[t];
  const int64_t R = layout_.rows_on(u, rank_), base = layout_.begin_on(u, rank_);
  int64_t first = 0, count = 0;
  block_range(N, W_, rank_, &first, &count);
  std::vector<float> mine(size_t(R) * D);
  const Placement pl = local_ ? Placement::kReplicated : spec.placement;
  // Each block goes to the ranks that hold its rows: to a row's owner, or,
  // for a replicated table, to every rank.
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  std::vector<float> send;
  for (int p = 0; p < W_; ++p) {
    BlockSlice s = slice_of(pl, spec.owner, N, W_, p, rank_);
    if (pl == Placement::kReplicated) s = {first, count, 1};
    if (local_ && p != rank_) s = {};
    sd[p] = int64_t(send.size());
    sc[p] = s.count * D;
    for (int64_t k = 0; k < s.count; ++k) {
      const int64_t at = (s.first + k * s.step - first) * D;
      send.insert(send.end(), block + at, block + at + D);
    }
  }
  int64_t total = 0;
  std::vector<BlockSlice> from(W_);
  for (int q = 0; q < W_; ++q) {
    from[q] = slice_of(pl, spec.owner, N, W_, rank_, q);
    if (pl == Placement::kReplicated) block_range(N, W_, q, &from[q].first, &from[q].count);
    if (local_ && q != rank_) from[q] = {};
    rd[q] = total;
    rc[q] = from[q].count * D;
    total += rc[q];
  }
  std::vector<float> recv(static_cast<size_t>(total));
  if (local_)
    recv = send;
  else
    all_to_all_v_on(comm_, Device::kCpu, send.data(), sc.data(), sd.data(), recv.data(), rc.data(),
                    rd.data(), DType::kFloat32);
  for (int q = 0; q < W_; ++q)
    for (int64_t k = 0; k < from[q].count; ++k) {
      const int64_t row = local_row(pl, from[q].first + k * from[q].step, W_);
      std::copy_n(recv.begin() + rd[q] + k * D, D, mine.begin() + row * D);
    }
  if (R > 0)
    device_copy(ctx_.device, state_array(array) + base * D, Device::kCpu, mine.data(),
                mine.size() * 4);
}

}  // namespace ncf
