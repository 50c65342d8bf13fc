// The collection's tables in global row order, for checkpoints: each rank
// hands over or takes the block of rows common/partition.h gives it, whatever
// the placement that holds them. One all-to-all per array moves the rows
// between the owners and the blocks, chunk by chunk so the staging stays
// small, and any W writes a file that any W reads; no rank ever holds a whole
// routed table.
#include <algorithm>

#include "common/bf16.h"
#include "common/check.h"
#include "common/partition.h"
#include "embedding/collection.h"

namespace ncf {

int EmbeddingCollection::num_state_arrays() const { return 1 + optimizer_state_arrays(opt_.kind); }

int EmbeddingCollection::state_width(int array) const {
  return array == 1 && opt_.kind == EmbeddingOptimizer::kRowwiseAdagrad ? 1 : plan_.D;
}

float* EmbeddingCollection::state_array(int array) {
  NCF_CHECK(array >= 0 && array < num_state_arrays(), "embedding state array ", array,
            " out of range [0, ", num_state_arrays(), ") for ", optimizer_name(opt_.kind));
  return array == 0 ? params_.data() : array == 1 ? m_.data() : v_.data();
}

namespace {

// The rows of global range [lo, lo + n) that rank p holds, in ascending order:
// for a row-wise table those with id ≡ p (mod W), for a table-wise table all
// of them on the owner.
struct Slice {
  int64_t first = 0;  // first global row
  int64_t count = 0;  // rows
  int64_t step = 1;   // id stride: W for row-wise, else 1
};

Slice slice_in(Placement placement, int owner, int W, int p, int64_t lo, int64_t n) {
  Slice s;
  if (placement == Placement::kRowWise) {
    const int64_t g0 = lo + ((p - lo % W) % W + W) % W;  // first id ≡ p in the range
    s = {g0, g0 < lo + n ? (lo + n - 1 - g0) / W + 1 : 0, W};
  } else if (placement == Placement::kTableWise && p == owner) {
    s = {lo, n, 1};
  }
  return s;
}

// The local row of global row g on the rank holding it (flat rows of the table).
int64_t local_row(Placement placement, int64_t g, int W) {
  return placement == Placement::kRowWise ? g / W : g;
}

// All-to-all counts and displacements (in floats) of sending to[p] and
// receiving from[p] rows of width D with each rank p; returns the totals.
void exchange_layout(const std::vector<Slice>& to, const std::vector<Slice>& from, int D,
                     std::vector<int64_t>& sc, std::vector<int64_t>& sd, std::vector<int64_t>& rc,
                     std::vector<int64_t>& rd, int64_t* sent, int64_t* received) {
  *sent = *received = 0;
  for (size_t p = 0; p < to.size(); ++p) {
    sd[p] = *sent;
    sc[p] = to[p].count * D;
    *sent += sc[p];
    rd[p] = *received;
    rc[p] = from[p].count * D;
    *received += rc[p];
  }
}

// Grows v to at least n elements (never shrinks: the pages stay mapped from
// one checkpoint to the next, and faulting in fresh pages is what costs).
float* at_least(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

}  // namespace

void EmbeddingCollection::set_chunk_bytes(int64_t bytes) {
  NCF_CHECK(bytes > 0, "checkpoint chunk size ", bytes, " bytes must be > 0");
  chunk_bytes_ = bytes;
}

int64_t EmbeddingCollection::chunk_rows() const {
  return std::max<int64_t>(1, chunk_bytes_ / (int64_t(plan_.D) * 4));
}

int64_t EmbeddingCollection::num_chunks(int t) const {
  const int64_t most = (plan_.tables[t].num_rows + W_ - 1) / W_;  // the largest block
  return std::max<int64_t>(1, (most + chunk_rows() - 1) / chunk_rows());
}

void EmbeddingCollection::chunk_range(int t, int rank, int64_t c, int64_t* lo, int64_t* n) const {
  int64_t first = 0, count = 0;
  block_range(plan_.tables[t].num_rows, W_, rank, &first, &count);
  const int64_t a = std::min(count, c * chunk_rows()), b = std::min(count, (c + 1) * chunk_rows());
  *lo = first + a;
  *n = b - a;
}

const float* EmbeddingCollection::export_chunk(int t, int array, int64_t c, int64_t* rows) {
  NCF_CHECK(t >= 0 && t < num_tables() && c >= 0 && c < num_chunks(t), "export_chunk: table ", t,
            " chunk ", c);
  const int D = state_width(array);  // floats per row of this array
  const TableSpec& spec = plan_.tables[t];
  const int u = lt_[t];
  if (c == 0) flush_cache();  // the cached rows home first
  if (c == 0) {               // this rank's rows of the array on the host, for all its chunks
    const int64_t R = layout_.rows_on(u, rank_), base = layout_.begin_on(u, rank_);
    if (array == 0 && bf16_rows_) {  // BF16 rows, widened (exact)
      io16_.resize(size_t(R) * D);
      float* host = at_least(io_mine_, R * D);
      if (R > 0)
        device_copy(Device::kCpu, io16_.data(), home_, rows16_.data() + base * D,
                    size_t(R) * D * 2);
      for (size_t k = 0; k < io16_.size(); ++k) host[k] = bf16_bits_to_float(io16_[k]);
      io_rows_ = host;
    }
  }
  if (c == 0 && !(array == 0 && bf16_rows_)) {
    const int64_t R = layout_.rows_on(u, rank_), base = layout_.begin_on(u, rank_);
    const float* src = state_array(array) + base * D;
    if (home_ != Device::kCpu) {
      float* host = at_least(io_mine_, R * D);
      if (R > 0) device_copy(Device::kCpu, host, home_, src, size_t(R) * D * 4);
      src = host;
    }
    io_rows_ = src;
  }
  const float* mine = io_rows_;
  int64_t lo = 0, n = 0;
  chunk_range(t, rank_, c, &lo, &n);
  *rows = n;
  const Placement pl = local_ ? Placement::kReplicated : spec.placement;
  if (pl == Placement::kReplicated) return mine + lo * D;  // every rank holds all rows
  // Send each rank the rows of its chunk that this rank holds.
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  std::vector<Slice> to(W_), from(W_);
  for (int p = 0; p < W_; ++p) {
    int64_t plo = 0, pn = 0;
    chunk_range(t, p, c, &plo, &pn);
    to[p] = slice_in(pl, spec.owner, W_, rank_, plo, pn);
    from[p] = slice_in(pl, spec.owner, W_, p, lo, n);
  }
  int64_t sent = 0, received = 0;
  exchange_layout(to, from, D, sc, sd, rc, rd, &sent, &received);
  float* send = at_least(io_send_, sent);
  for (int p = 0; p < W_; ++p)
    for (int64_t k = 0; k < to[p].count; ++k)
      std::copy_n(mine + local_row(pl, to[p].first + k * to[p].step, W_) * D, D,
                  send + sd[p] + k * D);
  float* recv = at_least(io_recv_, received);
  all_to_all_v_on(comm_, Device::kCpu, send, sc.data(), sd.data(), recv, rc.data(), rd.data(),
                  DType::kFloat32);
  float* chunk = at_least(io_block_, n * D);
  for (int p = 0; p < W_; ++p)
    for (int64_t k = 0; k < from[p].count; ++k)
      std::copy_n(recv + rd[p] + k * D, D, chunk + (from[p].first + k * from[p].step - lo) * D);
  return chunk;
}

void EmbeddingCollection::import_chunk(int t, int array, int64_t c, const float* rows) {
  NCF_CHECK(t >= 0 && t < num_tables() && c >= 0 && c < num_chunks(t), "import_chunk: table ", t,
            " chunk ", c);
  const int D = state_width(array);  // floats per row of this array
  const TableSpec& spec = plan_.tables[t];
  const int u = lt_[t];
  const int64_t R = layout_.rows_on(u, rank_), base = layout_.begin_on(u, rank_);
  // The cached rows are about to be replaced at home: the cache forgets them.
  if (cache_) drop_cache();
  // The rank's rows are written in place on a CPU rank, staged on a GPU rank
  // and copied to the device after the last chunk.
  const bool bf16 = array == 0 && bf16_rows_;  // staged, then rounded to nearest-even
  float* mine =
      home_ == Device::kCpu && !bf16 ? state_array(array) + base * D : at_least(io_mine_, R * D);
  int64_t lo = 0, n = 0;
  chunk_range(t, rank_, c, &lo, &n);
  const Placement pl = local_ ? Placement::kReplicated : spec.placement;
  // Each chunk goes to the ranks that hold its rows: to a row's owner, or,
  // for a replicated table, to every rank.
  std::vector<Slice> to(W_), from(W_);
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  for (int p = 0; p < W_; ++p) {
    int64_t plo = 0, pn = 0;
    chunk_range(t, p, c, &plo, &pn);
    if (pl == Placement::kReplicated) {
      to[p] = {lo, n, 1};
      from[p] = {plo, pn, 1};
    } else {
      to[p] = slice_in(pl, spec.owner, W_, p, lo, n);
      from[p] = slice_in(pl, spec.owner, W_, rank_, plo, pn);
    }
    if (local_ && p != rank_) to[p] = from[p] = {};
  }
  int64_t sent = 0, received = 0;
  exchange_layout(to, from, D, sc, sd, rc, rd, &sent, &received);
  const float* recv = rows;  // W = 1: the chunk is this rank's own
  if (!local_) {
    float* send = at_least(io_send_, sent);
    for (int p = 0; p < W_; ++p)
      for (int64_t k = 0; k < to[p].count; ++k)
        std::copy_n(rows + (to[p].first + k * to[p].step - lo) * D, D, send + sd[p] + k * D);
    float* r = at_least(io_recv_, received);
    all_to_all_v_on(comm_, Device::kCpu, send, sc.data(), sd.data(), r, rc.data(), rd.data(),
                    DType::kFloat32);
    recv = r;
  }
  for (int q = 0; q < W_; ++q)
    for (int64_t k = 0; k < from[q].count; ++k)
      std::copy_n(recv + rd[q] + k * D, D,
                  mine + local_row(pl, from[q].first + k * from[q].step, W_) * D);
  if (bf16 && R > 0 && c == num_chunks(t) - 1) {
    io16_.resize(size_t(R) * D);
    for (size_t k = 0; k < io16_.size(); ++k) io16_[k] = float_to_bf16_bits(mine[k]);
    device_copy(home_, rows16_.data() + base * D, Device::kCpu, io16_.data(), size_t(R) * D * 2);
  } else if (home_ != Device::kCpu && R > 0 && c == num_chunks(t) - 1) {
    device_copy(home_, state_array(array) + base * D, Device::kCpu, mine, size_t(R) * D * 4);
  }
}

}  // namespace ncf
