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

namespace {

// Grows v to at least n elements (never shrinks: the pages stay mapped from
// one checkpoint to the next, and faulting in fresh pages is what costs).
float* at_least(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

}  // namespace

const float* EmbeddingCollection::host_rows(int t, int array) {
  const int u = lt_[t];
  const int64_t R = layout_.rows_on(u, rank_), base = layout_.begin_on(u, rank_);
  const float* rows = state_array(array) + base * plan_.D;
  if (ctx_.device == Device::kCpu) return rows;
  float* host = at_least(io_mine_, R * plan_.D);
  if (R > 0) device_copy(Device::kCpu, host, ctx_.device, rows, size_t(R) * plan_.D * 4);
  return host;
}

const float* EmbeddingCollection::export_block(int t, int array) {
  NCF_CHECK(t >= 0 && t < num_tables(), "export_block: table ", t);
  const int D = plan_.D;
  const TableSpec& spec = plan_.tables[t];
  const int64_t N = spec.num_rows;
  const float* mine = host_rows(t, array);  // this rank's rows of the table, on the host
  int64_t first = 0, count = 0;
  block_range(N, W_, rank_, &first, &count);
  const Placement pl = local_ ? Placement::kReplicated : spec.placement;
  if (pl == Placement::kReplicated) return mine + first * D;  // every rank holds all rows
  // Send to each block's rank the rows of its block that this rank holds.
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  int64_t total = 0;
  for (int q = 0; q < W_; ++q) {
    sd[q] = total;
    sc[q] = slice_of(pl, spec.owner, N, W_, rank_, q).count * D;
    total += sc[q];
  }
  float* send = at_least(io_send_, total);
  for (int q = 0; q < W_; ++q) {
    const BlockSlice s = slice_of(pl, spec.owner, N, W_, rank_, q);
    for (int64_t k = 0; k < s.count; ++k)
      std::copy_n(mine + local_row(pl, s.first + k * s.step, W_) * D, D, send + sd[q] + k * D);
  }
  total = 0;
  for (int p = 0; p < W_; ++p) {
    rd[p] = total;
    rc[p] = slice_of(pl, spec.owner, N, W_, p, rank_).count * D;
    total += rc[p];
  }
  float* recv = at_least(io_recv_, total);
  all_to_all_v_on(comm_, Device::kCpu, send, sc.data(), sd.data(), recv, rc.data(), rd.data(),
                  DType::kFloat32);
  float* block = at_least(io_block_, count * D);
  for (int p = 0; p < W_; ++p) {
    const BlockSlice s = slice_of(pl, spec.owner, N, W_, p, rank_);
    for (int64_t k = 0; k < s.count; ++k)
      std::copy_n(recv + rd[p] + k * D, D, block + (s.first + k * s.step - first) * D);
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
  // The rank's rows are written in place on a CPU rank, staged on a GPU rank.
  float* mine =
      ctx_.device == Device::kCpu ? state_array(array) + base * D : at_least(io_mine_, R * D);
  const Placement pl = local_ ? Placement::kReplicated : spec.placement;
  // Each block goes to the ranks that hold its rows: to a row's owner, or,
  // for a replicated table, to every rank.
  std::vector<BlockSlice> to(W_), from(W_);
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  int64_t sent = 0, received = 0;
  for (int p = 0; p < W_; ++p) {
    to[p] = slice_of(pl, spec.owner, N, W_, p, rank_);
    if (pl == Placement::kReplicated) to[p] = {first, count, 1};
    from[p] = slice_of(pl, spec.owner, N, W_, rank_, p);
    if (pl == Placement::kReplicated) block_range(N, W_, p, &from[p].first, &from[p].count);
    if (local_ && p != rank_) to[p] = from[p] = {};
    sd[p] = sent;
    sc[p] = to[p].count * D;
    sent += sc[p];
    rd[p] = received;
    rc[p] = from[p].count * D;
    received += rc[p];
  }
  const float* recv = block;  // W = 1: the block is all this rank's rows
  if (!local_) {
    float* send = at_least(io_send_, sent);
    for (int p = 0; p < W_; ++p)
      for (int64_t k = 0; k < to[p].count; ++k)
        std::copy_n(block + (to[p].first + k * to[p].step - first) * D, D, send + sd[p] + k * D);
    float* r = at_least(io_recv_, received);
    all_to_all_v_on(comm_, Device::kCpu, send, sc.data(), sd.data(), r, rc.data(), rd.data(),
                    DType::kFloat32);
    recv = r;
  }
  for (int q = 0; q < W_; ++q)
    for (int64_t k = 0; k < from[q].count; ++k) {
      const int64_t row = local_row(pl, from[q].first + k * from[q].step, W_);
      std::copy_n(recv + rd[q] + k * D, D, mine + row * D);
    }
  if (ctx_.device != Device::kCpu && R > 0)
    device_copy(ctx_.device, state_array(array) + base * D, Device::kCpu, mine, size_t(R) * D * 4);
}

}  // namespace ncf
