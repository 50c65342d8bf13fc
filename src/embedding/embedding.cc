// Sharded embedding lookup and update: see embedding.h.
#include "embedding/embedding.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"
#include "common/cuda_context.h"
#include "common/parallel.h"
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

int64_t table_exchange_bytes(const TableSpec& t, int64_t n, int W, bool dedup) {
  const int64_t D = t.D;
  const bool routed = W > 1 && t.placement != Placement::kReplicated;
  // Rows the backward reduces: the received ids when routed, the batch otherwise;
  // a replicated table also compacts its touched rows (up to N).
  const int64_t reduce_n = t.placement == Placement::kReplicated && W > 1 ? std::max(n, t.num_rows) : n;
  int64_t b = n * 4;                               // ids_
  b += reduce_n * (4 + D * 4);                     // reduced_rows_, reduced_grads_
  b += reduce_n * 24;                              // sort-reduce scratch (keys, positions, runs)
  if (routed) {
    b += n * (8 + 4 + 4);                          // perm_, send_local_, recv_local_
    b += 2 * n * D * 4;                            // send_vec_, recv_vec_
    if (dedup) b += n * (4 + 8) + n * D * 4;       // unique_, inverse_, uvec_
  }
  return b;
}

ShardedEmbedding::ShardedEmbedding(const TableSpec& spec, Communicator& comm,
                                   const ExecContext& ctx, const EmbeddingOptimizerConfig& opt,
                                   bool dedup)
    : spec_(spec), comm_(comm), ctx_(ctx), opt_(opt), dedup_(dedup) {
  W_ = comm.world();
  rank_ = comm.rank();
  local_ = W_ == 1;
  NCF_CHECK(spec.num_rows > 0 && spec.num_rows <= INT32_MAX, "table ", spec.name, " has ",
            spec.num_rows, " rows");
  NCF_CHECK(spec.D > 0, "table ", spec.name, " width ", spec.D);
  NCF_CHECK(spec.owner >= 0 && spec.owner < W_, "table ", spec.name, " owner ", spec.owner,
            " outside [0, ", W_, ")");
  rule_ = spec.placement == Placement::kTableWise ? OwnerRule::single(W_, spec.owner)
                                                   : OwnerRule::rows(W_);
  local_rows_ = table_rank_rows(spec, rank_, W_);
  const Device dev = ctx.device;
  const size_t n = size_t(local_rows_) * spec.D;
  const int state = optimizer_state_per_element(opt.kind);
  try {
    table_ = Buffer<float>(dev, n);
    if (state >= 1) m_ = Buffer<float>(dev, n);
    if (state >= 2) v_ = Buffer<float>(dev, n);
  } catch (const Error& e) {
    NCF_FAIL("table ", spec.name, ": ", local_rows_, " rows x ", spec.D, " with ",
             optimizer_name(opt.kind), " state (", bytes_on_rank(), " bytes) do not fit on this ",
             device_name(dev), ": ", e.what());
  }
  m_.zero();
  v_.zero();
  if (opt.kind == EmbeddingOptimizer::kAdagrad && n)
    adagrad_init(ctx_, m_.data(), int64_t(n), opt.adagrad);
  for (Buffer<int32_t>* b : {&ids_, &unique_, &send_local_, &recv_local_, &reduced_rows_})
    *b = Buffer<int32_t>(dev, 0);
  for (Buffer<int64_t>* b : {&inverse_, &perm_}) *b = Buffer<int64_t>(dev, 0);
  for (Buffer<float>* b : {&send_vec_, &recv_vec_, &uvec_, &reduced_grads_, &dense_})
    *b = Buffer<float>(dev, 0);
  for (auto* v : {&send_counts_, &send_displs_, &recv_counts_, &recv_displs_, &sc_, &sd_, &rc_,
                  &rd_})
    v->assign(W_, 0);
}

int64_t ShardedEmbedding::global_row(int64_t k) const {
  return spec_.placement == Placement::kRowWise ? k * W_ + rank_ : k;
}

int64_t ShardedEmbedding::bytes_on_rank() const {
  return table_rank_bytes(spec_, rank_, W_, opt_.kind);
}

int64_t ShardedEmbedding::step_buffer_bytes() const {
  int64_t b = 0;
  for (const Buffer<int32_t>* x : {&ids_, &unique_, &send_local_, &recv_local_, &reduced_rows_})
    b += int64_t(x->bytes());
  for (const Buffer<int64_t>* x : {&inverse_, &perm_}) b += int64_t(x->bytes());
  for (const Buffer<float>* x : {&send_vec_, &recv_vec_, &uvec_, &reduced_grads_})
    b += int64_t(x->bytes());
  return b;
}

void ShardedEmbedding::init_rows(uint64_t seed, int64_t k0, int64_t k1, float* dst) const {
  const int D = spec_.D;
  for (int64_t k = k0; k < k1; ++k) {
    CounterRng rng{seed, kStreamInit, (uint64_t(spec_.init_tag) << 40) | uint64_t(global_row(k))};
    float* row = dst + (k - k0) * D;
    for (int j = 0; j < D; j += 2) {
      // Box-Muller on two 53-bit uniforms: a pair of normals per draw.
      double u1 = 1.0 - rng.uniform_double(uint64_t(j)), u2 = rng.uniform_double(uint64_t(j) + 1);
      double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
      row[j] = float(spec_.init_stddev * r * std::cos(a));
      if (j + 1 < D) row[j + 1] = float(spec_.init_stddev * r * std::sin(a));
    }
  }
}

void ShardedEmbedding::init(uint64_t seed) {
  const int D = spec_.D;
  if (local_rows_ == 0) return;
  // Rows are independent (keyed by global row), so the host threads split them.
  const int64_t grain = std::max<int64_t>(1, 4096 / D);
  auto fill = [&](int64_t k0, int64_t k1, float* dst) {
    parallel_for(ctx_.threads, k1 - k0, grain, [&](int64_t a, int64_t b) {
      init_rows(seed, k0 + a, k0 + b, dst + a * D);
    });
  };
  if (ctx_.device == Device::kCpu) {
    fill(0, local_rows_, table_.data());
    return;
  }
  // A GPU shard goes up in chunks of about 64 MiB through two pinned buffers:
  // the host fills one while the previous chunk's copy runs, so host memory stays
  // bounded by two chunks whatever the table's size.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / (int64_t(D) * 4));
  PinnedBuffer<float> stage[2];
  for (PinnedBuffer<float>& b : stage) b.reserve(size_t(std::min(chunk, local_rows_)) * D);
  for (int64_t c = 0, k0 = 0; k0 < local_rows_; ++c, k0 += chunk) {
    const int64_t k1 = std::min(local_rows_, k0 + chunk);
    float* host = stage[c % 2].data();
    fill(k0, k1, host);  // free: the previous round's wait covered copy c - 2
    check_device_errors(ctx_);  // waits for copy c - 1 (no kernel ran to record errors)
    device_copy_async(ctx_, ctx_.device, table_.data() + k0 * D, Device::kCpu, host,
                      size_t(k1 - k0) * D * 4);
  }
  check_device_errors(ctx_);  // the stage buffers go away with this function
}

void ShardedEmbedding::lookup(const int32_t* ids, int64_t n, float* out) {
  lookup_start(ids, n);
  lookup_gather();
  lookup_finish(out);
}

void ShardedEmbedding::lookup_start(const int32_t* ids, int64_t n) {
  n_ = n;
  stats_ = ExchangeStats{};
  ids_.reserve(size_t(n));
  device_copy_async(ctx_, ctx_.device, ids_.data(), ctx_.device, ids, size_t(n) * 4);
  if (spec_.placement == Placement::kReplicated) return;
  // Owners index their shard with local rows: an id past the table must stop
  // here, where the table and the id are known. (CUDA kernels record bad ids
  // and report them at the next synchronizing op instead.)
  if (ctx_.device == Device::kCpu)
    for (int64_t k = 0; k < n; ++k)
      if (ids[k] < 0 || ids[k] >= spec_.num_rows)
        NCF_FAIL("table ", spec_.name, ": id ", ids[k], " at batch position ", k,
                 " out of range [0, ", spec_.num_rows, ")");
  if (local_) {
    stats_.unique_ids = n;  // one rank: nothing to route (lookup_finish gathers)
    return;
  }

  // The ids that travel: the unique ones (ascending) with --dedup, else all.
  const int32_t* travel = ids_.data();
  nu_ = n;
  if (dedup_) {
    unique_.reserve(size_t(n));
    inverse_.reserve(size_t(n));
    unique_ids(ctx_, ids_.data(), n, unique_.data(), inverse_.data(), &nu_);
    travel = unique_.data();
  }
  stats_.unique_ids = nu_;

  // Bucketize by owner (stable), then exchange counts and local row ids.
  perm_.reserve(size_t(nu_));
  send_local_.reserve(size_t(nu_));
  bucketize_by_owner(ctx_, travel, nu_, rule_, perm_.data(), send_local_.data(),
                     send_counts_.data());
  for (int p = 1; p < W_; ++p) send_displs_[p] = send_displs_[p - 1] + send_counts_[p - 1];
  comm_.exchange_counts(send_counts_.data(), recv_counts_.data());
  nr_ = 0;
  for (int p = 0; p < W_; ++p) {
    recv_displs_[p] = nr_;
    nr_ += recv_counts_[p];
  }
  recv_local_.reserve(size_t(nr_));
  all_to_all_v_on(comm_, ctx_.device, send_local_.data(), send_counts_.data(),
                  send_displs_.data(), recv_local_.data(), recv_counts_.data(),
                  recv_displs_.data(), DType::kInt32, &ticket_);
}

void ShardedEmbedding::lookup_gather() {
  if (spec_.placement == Placement::kReplicated || local_) return;
  const int D = spec_.D;
  comm_.join(ticket_);
  // Owners gather the requested rows and send them back.
  send_vec_.reserve(size_t(nr_) * D);
  gather_rows(ctx_, table_.data(), recv_local_.data(), send_vec_.data(), local_rows_, nr_, D);
  for (int p = 0; p < W_; ++p) {
    sc_[p] = recv_counts_[p] * D;
    sd_[p] = recv_displs_[p] * D;
    rc_[p] = send_counts_[p] * D;
    rd_[p] = send_displs_[p] * D;
  }
  recv_vec_.reserve(size_t(nu_) * D);
  all_to_all_v_on(comm_, ctx_.device, send_vec_.data(), sc_.data(), sd_.data(), recv_vec_.data(),
                  rc_.data(), rd_.data(), DType::kFloat32, &ticket_);
}

void ShardedEmbedding::lookup_finish(float* out) {
  const int D = spec_.D;
  if (spec_.placement == Placement::kReplicated || local_) {
    // Straight from the table into batch order; gather_rows checks every id.
    gather_rows(ctx_, table_.data(), ids_.data(), out, local_rows_, n_, D);
    return;
  }
  comm_.join(ticket_);
  ticket_ = 0;
  // Back to batch order: owner order -> (unique) id order -> batch positions.
  if (dedup_) {
    uvec_.reserve(size_t(nu_) * D);
    unpermute_rows(ctx_, recv_vec_.data(), perm_.data(), uvec_.data(), nu_, D);
    permute_rows(ctx_, uvec_.data(), nu_, inverse_.data(), out, n_, D);
  } else {
    unpermute_rows(ctx_, recv_vec_.data(), perm_.data(), out, n_, D);
  }

  for (int p = 0; p < W_; ++p)
    if (p != rank_) {
      stats_.ids_sent += send_counts_[p];
      stats_.bytes_sent += send_counts_[p] * 4 + recv_counts_[p] * D * 4;
    }
}

void ShardedEmbedding::apply_optimizer(const int32_t* rows, const float* grads, int64_t n,
                                       int64_t t) {
  const int D = spec_.D;
  float* tab = table_.data();
  switch (opt_.kind) {
    case EmbeddingOptimizer::kDenseAdam:
      if (local_rows_)
        embedding_dense_adam(ctx_, tab, m_.data(), v_.data(), rows, grads, local_rows_, n, D, t,
                             opt_.adam);
      break;
    case EmbeddingOptimizer::kLazyAdam:
      if (n)
        embedding_lazy_adam(ctx_, tab, m_.data(), v_.data(), rows, grads, local_rows_, n, D, t,
                            opt_.adam);
      break;
    case EmbeddingOptimizer::kSgd:
      if (n) embedding_sgd(ctx_, tab, rows, grads, local_rows_, n, D, opt_.sgd);
      break;
    case EmbeddingOptimizer::kAdagrad:
      if (n) embedding_adagrad(ctx_, tab, m_.data(), rows, grads, local_rows_, n, D, opt_.adagrad);
      break;
  }
}

void ShardedEmbedding::apply_replicated(const float* grads, int64_t t) {
  // Every rank sums its rows, then a dense gradient plus a touch count per row
  // is allreduced on the context's device: all ranks hold the same reduced
  // gradient and apply the same update to the touched rows.
  const int D = spec_.D;
  const int64_t N = spec_.num_rows;
  reduced_rows_.reserve(size_t(std::max(n_, N)));
  reduced_grads_.reserve(size_t(std::max(n_, N)) * D);
  int64_t nu = 0;
  sort_reduce_rows(ctx_, ids_.data(), grads, n_, D, reduced_rows_.data(), reduced_grads_.data(),
                   &nu);
  dense_.reserve(size_t(N) * (D + 1));
  scatter_rows_dense(ctx_, reduced_rows_.data(), reduced_grads_.data(), nu, D, N, dense_.data());
  all_reduce_sum_on(comm_, ctx_.device, dense_.data(), size_t(N) * (D + 1), DType::kFloat32);
  compact_touched_rows(ctx_, dense_.data(), N, D, reduced_rows_.data(), reduced_grads_.data(),
                       &nu);
  if (W_ > 1) stats_.bytes_sent += N * (int64_t(D) + 1) * 4 * 2 * (W_ - 1) / W_;
  apply_optimizer(reduced_rows_.data(), reduced_grads_.data(), nu, t);
}

void ShardedEmbedding::apply_local(const float* grads, int64_t t) {
  const int D = spec_.D;
  reduced_rows_.reserve(size_t(n_));
  reduced_grads_.reserve(size_t(n_) * D);
  int64_t nu = 0;
  sort_reduce_rows(ctx_, ids_.data(), grads, n_, D, reduced_rows_.data(), reduced_grads_.data(),
                   &nu);
  apply_optimizer(reduced_rows_.data(), reduced_grads_.data(), nu, t);
}

void ShardedEmbedding::apply_gradients(const float* grads, int64_t t) {
  gradients_start(grads);
  gradients_finish(t);
}

void ShardedEmbedding::gradients_start(const float* grads) {
  if (spec_.placement == Placement::kReplicated || local_) {
    pending_grads_ = grads;
    return;
  }
  const int D = spec_.D;
  // Gradients per travelling id: with --dedup, duplicates are summed by id in
  // batch order (ids ascending, the order of unique_); then put in owner order.
  const float* per_id = grads;
  if (dedup_) {
    reduced_rows_.reserve(size_t(n_));
    reduced_grads_.reserve(size_t(n_) * D);
    int64_t nu = 0;
    sort_reduce_rows(ctx_, ids_.data(), grads, n_, D, reduced_rows_.data(), reduced_grads_.data(),
                     &nu);
    NCF_CHECK(nu == nu_, "table ", spec_.name, ": ", nu, " unique ids in the backward, ", nu_,
              " in the forward");
    per_id = reduced_grads_.data();
  }
  recv_vec_.reserve(size_t(nu_) * D);  // reused: gradients in owner order
  permute_rows(ctx_, per_id, nu_, perm_.data(), recv_vec_.data(), nu_, D);
  for (int p = 0; p < W_; ++p) {
    sc_[p] = send_counts_[p] * D;
    sd_[p] = send_displs_[p] * D;
    rc_[p] = recv_counts_[p] * D;
    rd_[p] = recv_displs_[p] * D;
  }
  send_vec_.reserve(size_t(nr_) * D);  // reused: gradients this rank owns
  all_to_all_v_on(comm_, ctx_.device, recv_vec_.data(), sc_.data(), sd_.data(), send_vec_.data(),
                  rc_.data(), rd_.data(), DType::kFloat32, &ticket_);
  for (int p = 0; p < W_; ++p)
    if (p != rank_) stats_.bytes_sent += send_counts_[p] * D * 4;
}

void ShardedEmbedding::gradients_finish(int64_t t) {
  if (local_) {
    apply_local(pending_grads_, t);
    pending_grads_ = nullptr;
    return;
  }
  if (spec_.placement == Placement::kReplicated) {
    apply_replicated(pending_grads_, t);
    pending_grads_ = nullptr;
    return;
  }
  const int D = spec_.D;
  comm_.join(ticket_);
  ticket_ = 0;
  // Owners sum the rows asked for more than once (sorted, in arrival order).
  reduced_rows_.reserve(size_t(nr_));
  reduced_grads_.reserve(size_t(nr_) * D);
  int64_t rows = 0;
  sort_reduce_rows(ctx_, recv_local_.data(), send_vec_.data(), nr_, D, reduced_rows_.data(),
                   reduced_grads_.data(), &rows);
  apply_optimizer(reduced_rows_.data(), reduced_grads_.data(), rows, t);
}

std::vector<float> ShardedEmbedding::gather_full() {
  const int D = spec_.D;
  const int64_t N = spec_.num_rows;
  std::vector<float> local(size_t(local_rows_) * D);
  device_copy(Device::kCpu, local.data(), ctx_.device, table_.data(), local.size() * 4);
  if (spec_.placement == Placement::kReplicated) return local;
  // Each rank writes its rows into a zeroed full table; a sum assembles it.
  std::vector<float> full(size_t(N) * D, 0.0f);
  for (int64_t k = 0; k < local_rows_; ++k)
    std::copy_n(&local[size_t(k) * D], D, &full[size_t(global_row(k)) * D]);
  all_reduce_sum_on(comm_, Device::kCpu, full.data(), full.size(), DType::kFloat32);
  return full;
}

}  // namespace ncf
