// Sharded embedding lookup and update: see embedding.h.
#include "embedding/embedding.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"
#include "common/philox.h"

namespace ncf {

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kRowWise: return "row";
    case Placement::kTableWise: return "table";
    case Placement::kReplicated: return "replicated";
  }
  return "?";
}

Placement parse_placement(const std::string& s) {
  if (s == "row") return Placement::kRowWise;
  if (s == "table") return Placement::kTableWise;
  if (s == "replicated") return Placement::kReplicated;
  NCF_FAIL("unknown placement '", s, "' (expected row, table or replicated)");
}

const char* optimizer_name(EmbeddingOptimizer o) {
  switch (o) {
    case EmbeddingOptimizer::kDenseAdam: return "dense_adam";
    case EmbeddingOptimizer::kLazyAdam: return "lazy_adam";
    case EmbeddingOptimizer::kSgd: return "sgd";
    case EmbeddingOptimizer::kAdagrad: return "adagrad";
  }
  return "?";
}

EmbeddingOptimizer parse_embedding_optimizer(const std::string& s) {
  if (s == "dense_adam") return EmbeddingOptimizer::kDenseAdam;
  if (s == "lazy_adam") return EmbeddingOptimizer::kLazyAdam;
  if (s == "sgd") return EmbeddingOptimizer::kSgd;
  if (s == "adagrad") return EmbeddingOptimizer::kAdagrad;
  NCF_FAIL("unknown embedding optimizer '", s, "' (expected dense_adam, lazy_adam, sgd, adagrad)");
}

int optimizer_state_per_element(EmbeddingOptimizer o) {
  switch (o) {
    case EmbeddingOptimizer::kDenseAdam:
    case EmbeddingOptimizer::kLazyAdam: return 2;
    case EmbeddingOptimizer::kAdagrad: return 1;
    case EmbeddingOptimizer::kSgd: return 0;
  }
  return 0;
}

int64_t table_rank_rows(const TableSpec& t, int rank, int W) {
  switch (t.placement) {
    case Placement::kRowWise: return t.num_rows > rank ? (t.num_rows - rank + W - 1) / W : 0;
    case Placement::kTableWise: return rank == t.owner ? t.num_rows : 0;
    case Placement::kReplicated: return t.num_rows;
  }
  return 0;
}

int64_t table_rank_bytes(const TableSpec& t, int rank, int W, EmbeddingOptimizer o) {
  int64_t b = table_rank_rows(t, rank, W) * t.D * 4 * (1 + optimizer_state_per_element(o));
  // A replicated table also needs a dense gradient for the allreduce.
  if (t.placement == Placement::kReplicated) b += t.num_rows * (int64_t(t.D) + 1) * 4;
  return b;
}

ShardedEmbedding::ShardedEmbedding(const TableSpec& spec, Communicator& comm,
                                   const ExecContext& ctx, const EmbeddingOptimizerConfig& opt,
                                   bool dedup)
    : spec_(spec), comm_(comm), ctx_(ctx), opt_(opt), dedup_(dedup) {
  W_ = comm.world();
  rank_ = comm.rank();
  NCF_CHECK(spec.num_rows > 0 && spec.num_rows <= INT32_MAX, "table ", spec.name, " has ",
            spec.num_rows, " rows");
  NCF_CHECK(spec.D > 0, "table ", spec.name, " width ", spec.D);
  NCF_CHECK(spec.owner >= 0 && spec.owner < W_, "table ", spec.name, " owner ", spec.owner,
            " outside [0, ", W_, ")");
  local_rows_ = table_rank_rows(spec, rank_, W_);
  const size_t n = size_t(local_rows_) * spec.D;
  table_ = Buffer<float>(Device::kCpu, n);
  int state = optimizer_state_per_element(opt.kind);
  if (state >= 1) m_ = Buffer<float>(Device::kCpu, n);
  if (state >= 2) v_ = Buffer<float>(Device::kCpu, n);
  m_.zero();
  v_.zero();
  if (opt.kind == EmbeddingOptimizer::kAdagrad && n)
    adagrad_init(ctx_, m_.data(), int64_t(n), opt.adagrad);
  send_counts_.assign(W_, 0);
  send_displs_.assign(W_, 0);
  recv_counts_.assign(W_, 0);
  recv_displs_.assign(W_, 0);
}

int64_t ShardedEmbedding::global_row(int64_t k) const {
  return spec_.placement == Placement::kRowWise ? k * W_ + rank_ : k;
}

int ShardedEmbedding::owner_of(int64_t id) const {
  return spec_.placement == Placement::kRowWise ? int(id % W_) : spec_.owner;
}

int32_t ShardedEmbedding::local_of(int64_t id) const {
  return int32_t(spec_.placement == Placement::kRowWise ? id / W_ : id);
}

int64_t ShardedEmbedding::bytes_on_rank() const {
  return table_rank_bytes(spec_, rank_, W_, opt_.kind);
}

void ShardedEmbedding::init(uint64_t seed) {
  const int D = spec_.D;
  float* t = table_.data();
  for (int64_t k = 0; k < local_rows_; ++k) {
    CounterRng rng{seed, kStreamInit, (uint64_t(spec_.init_tag) << 40) | uint64_t(global_row(k))};
    for (int j = 0; j < D; j += 2) {
      // Box-Muller on two 53-bit uniforms: a pair of normals per draw.
      double u1 = 1.0 - rng.uniform_double(uint64_t(j)), u2 = rng.uniform_double(uint64_t(j) + 1);
      double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
      t[k * D + j] = float(spec_.init_stddev * r * std::cos(a));
      if (j + 1 < D) t[k * D + j + 1] = float(spec_.init_stddev * r * std::sin(a));
    }
  }
}

void ShardedEmbedding::lookup(const int32_t* ids, int64_t n, float* out) {
  const int D = spec_.D;
  n_ = n;
  stats_ = ExchangeStats{};
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(ids[k] >= 0 && ids[k] < spec_.num_rows, "table ", spec_.name, ": id ", ids[k],
              " at batch position ", k, " out of range [0, ", spec_.num_rows, ")");

  if (spec_.placement == Placement::kReplicated) {
    gather_rows(ctx_, table_.data(), ids, out, local_rows_, n, D);
    unique_ids_.assign(ids, ids + n);
    return;
  }

  // Unique ids (sorted) and each batch position's index among them.
  if (dedup_) {
    unique_ids_.assign(ids, ids + n);
    std::sort(unique_ids_.begin(), unique_ids_.end());
    unique_ids_.erase(std::unique(unique_ids_.begin(), unique_ids_.end()), unique_ids_.end());
    inverse_.resize(n);
    for (int64_t k = 0; k < n; ++k)
      inverse_[k] = std::lower_bound(unique_ids_.begin(), unique_ids_.end(), ids[k]) -
                    unique_ids_.begin();
  } else {
    unique_ids_.assign(ids, ids + n);
    inverse_.resize(n);
    std::iota(inverse_.begin(), inverse_.end(), 0);
  }
  const int64_t nu = int64_t(unique_ids_.size());
  stats_.unique_ids = nu;

  // Bucketize by owner: a stable counting sort.
  std::fill(send_counts_.begin(), send_counts_.end(), 0);
  for (int64_t k = 0; k < nu; ++k) ++send_counts_[owner_of(unique_ids_[k])];
  for (int p = 1; p < W_; ++p) send_displs_[p] = send_displs_[p - 1] + send_counts_[p - 1];
  perm_.resize(nu);
  std::vector<int32_t> send_local(nu);
  {
    std::vector<int64_t> fill(send_displs_);
    for (int64_t k = 0; k < nu; ++k) {
      int64_t pos = fill[owner_of(unique_ids_[k])]++;
      perm_[pos] = k;
      send_local[pos] = local_of(unique_ids_[k]);
    }
  }

  comm_.exchange_counts(send_counts_.data(), recv_counts_.data());
  int64_t nr = 0;
  for (int p = 0; p < W_; ++p) {
    recv_displs_[p] = nr;
    nr += recv_counts_[p];
  }
  recv_local_.resize(nr);
  comm_.all_to_all_v(send_local.data(), send_counts_.data(), send_displs_.data(),
                     recv_local_.data(), recv_counts_.data(), recv_displs_.data(),
                     DType::kInt32);

  // Owners gather the requested rows, then send them back.
  send_vec_.resize(size_t(nr) * D);
  gather_rows(ctx_, table_.data(), recv_local_.data(), send_vec_.data(), local_rows_, nr, D);
  recv_vec_.resize(size_t(nu) * D);
  std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
  for (int p = 0; p < W_; ++p) {
    sc[p] = recv_counts_[p] * D;
    sd[p] = recv_displs_[p] * D;
    rc[p] = send_counts_[p] * D;
    rd[p] = send_displs_[p] * D;
  }
  comm_.all_to_all_v(send_vec_.data(), sc.data(), sd.data(), recv_vec_.data(), rc.data(),
                     rd.data(), DType::kFloat32);

  // Un-permute: unique k sits at owner-sorted position pos where perm_[pos] = k.
  std::vector<int64_t> where(nu);
  for (int64_t pos = 0; pos < nu; ++pos) where[perm_[pos]] = pos;
  for (int64_t k = 0; k < n; ++k)
    std::copy_n(&recv_vec_[size_t(where[inverse_[k]]) * D], D, out + size_t(k) * D);

  for (int p = 0; p < W_; ++p)
    if (p != rank_) {
      stats_.ids_sent += send_counts_[p];
      stats_.bytes_sent += send_counts_[p] * 4 + recv_counts_[p] * D * 4;
    }
}

void ShardedEmbedding::apply_gradients(const float* grads, int64_t t) {
  const int D = spec_.D;
  const int64_t n = n_;
  int64_t rows = 0;
  const int32_t* urows = nullptr;
  const float* ugrads = nullptr;

  if (spec_.placement == Placement::kReplicated) {
    // Dense gradient plus a touch count per row, summed over ranks: every rank
    // then holds the same reduced gradient and applies the same update.
    std::vector<float> dense(size_t(spec_.num_rows) * (D + 1), 0.0f);
    reduced_rows_.resize(n);
    reduced_grads_.resize(size_t(n) * D);
    int64_t nu = 0;
    sort_reduce_rows(ctx_, unique_ids_.data(), grads, n, D, reduced_rows_.data(),
                     reduced_grads_.data(), &nu);
    for (int64_t k = 0; k < nu; ++k) {
      float* row = &dense[size_t(reduced_rows_[k]) * (D + 1)];
      std::copy_n(&reduced_grads_[size_t(k) * D], D, row);
      row[D] = 1.0f;
    }
    comm_.all_reduce_sum(dense.data(), dense.size(), DType::kFloat32);
    reduced_rows_.clear();
    reduced_grads_.clear();
    for (int64_t r = 0; r < spec_.num_rows; ++r) {
      const float* row = &dense[size_t(r) * (D + 1)];
      if (row[D] == 0.0f) continue;
      reduced_rows_.push_back(int32_t(r));
      reduced_grads_.insert(reduced_grads_.end(), row, row + D);
    }
    rows = int64_t(reduced_rows_.size());
    if (W_ > 1) stats_.bytes_sent += int64_t(dense.size()) * 4 * 2 * (W_ - 1) / W_;
  } else {
    const int64_t nu = int64_t(unique_ids_.size());
    // Sum the batch gradients of each unique id in batch order, then order by owner.
    grad_unique_.assign(size_t(nu) * D, 0.0f);
    for (int64_t k = 0; k < n; ++k) {
      float* dst = &grad_unique_[size_t(inverse_[k]) * D];
      const float* src = grads + size_t(k) * D;
      for (int j = 0; j < D; ++j) dst[j] += src[j];
    }
    recv_vec_.resize(size_t(nu) * D);  // reused as the send buffer, owner order
    for (int64_t pos = 0; pos < nu; ++pos)
      std::copy_n(&grad_unique_[size_t(perm_[pos]) * D], D, &recv_vec_[size_t(pos) * D]);
    int64_t nr = 0;
    for (int p = 0; p < W_; ++p) nr += recv_counts_[p];
    send_vec_.resize(size_t(nr) * D);  // reused as the receive buffer
    std::vector<int64_t> sc(W_), sd(W_), rc(W_), rd(W_);
    for (int p = 0; p < W_; ++p) {
      sc[p] = send_counts_[p] * D;
      sd[p] = send_displs_[p] * D;
      rc[p] = recv_counts_[p] * D;
      rd[p] = recv_displs_[p] * D;
    }
    comm_.all_to_all_v(recv_vec_.data(), sc.data(), sd.data(), send_vec_.data(), rc.data(),
                       rd.data(), DType::kFloat32);
    for (int p = 0; p < W_; ++p)
      if (p != rank_) stats_.bytes_sent += send_counts_[p] * D * 4;
    reduced_rows_.resize(nr);
    reduced_grads_.resize(size_t(nr) * D);
    sort_reduce_rows(ctx_, recv_local_.data(), send_vec_.data(), nr, D, reduced_rows_.data(),
                     reduced_grads_.data(), &rows);
  }
  urows = reduced_rows_.data();
  ugrads = reduced_grads_.data();

  float* tab = table_.data();
  switch (opt_.kind) {
    case EmbeddingOptimizer::kDenseAdam:
      if (local_rows_)
        embedding_dense_adam(ctx_, tab, m_.data(), v_.data(), urows, ugrads, local_rows_, rows, D, t,
                             opt_.adam);
      break;
    case EmbeddingOptimizer::kLazyAdam:
      if (rows)
        embedding_lazy_adam(ctx_, tab, m_.data(), v_.data(), urows, ugrads, local_rows_, rows, D, t,
                            opt_.adam);
      break;
    case EmbeddingOptimizer::kSgd:
      if (rows) embedding_sgd(ctx_, tab, urows, ugrads, local_rows_, rows, D, opt_.sgd);
      break;
    case EmbeddingOptimizer::kAdagrad:
      if (rows)
        embedding_adagrad(ctx_, tab, m_.data(), urows, ugrads, local_rows_, rows, D, opt_.adagrad);
      break;
  }
}

std::vector<float> ShardedEmbedding::gather_full() {
  const int D = spec_.D;
  const int64_t N = spec_.num_rows;
  std::vector<float> full(size_t(N) * D, 0.0f);
  if (spec_.placement == Placement::kReplicated) {
    std::copy_n(table_.data(), full.size(), full.data());
    return full;
  }
  // Each rank writes its rows into a zeroed full table; a sum assembles it.
  for (int64_t k = 0; k < local_rows_; ++k)
    std::copy_n(table_.data() + size_t(k) * D, D, &full[size_t(global_row(k)) * D]);
  comm_.all_reduce_sum(full.data(), full.size(), DType::kFloat32);
  return full;
}

}  // namespace ncf
