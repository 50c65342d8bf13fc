// The embedding collection's lookup and update: see collection.h.
#include "embedding/collection.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/cuda_context.h"
#include "common/parallel.h"
#include "common/philox.h"
#include "embedding/tier_ops.h"
#include "model/ops.h"  // fill

namespace ncf {

const char* wire_dtype_name(WireDType d) { return d == WireDType::kBFloat16 ? "bf16" : "fp32"; }

WireDType parse_wire_dtype(const std::string& s) {
  if (s == "fp32") return WireDType::kFloat32;
  if (s == "bf16") return WireDType::kBFloat16;
  NCF_FAIL("exchange dtype '", s, "' is not one of fp32, bf16");
}

int wire_dtype_bytes(WireDType d) { return d == WireDType::kBFloat16 ? 2 : 4; }

EmbeddingCollection::EmbeddingCollection(const EmbeddingPlan& plan, Communicator& comm,
                                         const ExecContext& ctx,
                                         const EmbeddingOptimizerConfig& opt, bool dedup,
                                         int64_t cache_slots)
    : plan_(plan), comm_(comm), ctx_(ctx), opt_(opt), dedup_(dedup) {
  W_ = comm.world();
  rank_ = comm.rank();
  local_ = W_ == 1;
  NCF_CHECK(plan.W == W_, "embedding plan for ", plan.W, " ranks used with ", W_);
  NCF_CHECK(plan.D >= 1, "embedding width D=", plan.D);
  layout_ = make_key_layout(plan, &lt_);
  const int T = num_tables();
  R_ = layout_.total_rows_on(rank_);
  R_routed_ = routed_rows_on(rank_);
  rep_offset_.assign(T, 0);
  for (int t = 0; t < T; ++t)
    if (!local_ && plan.tables[t].placement == Placement::kReplicated) {
      rep_offset_[t] = rep_floats_;
      rep_floats_ += plan.tables[t].num_rows * (int64_t(plan.D) + 1);
    }
  NCF_CHECK(R_ <= INT32_MAX, "rank ", rank_, " would hold ", R_, " rows; row ids are int32");

  NCF_CHECK(cache_slots >= 0, "embedding cache of ", cache_slots, " rows");
  NCF_REQUIRE(cache_slots == 0 || opt.kind != EmbeddingOptimizer::kDenseAdam,
              "--device_table_budget: the host tier keeps only the rows a step touches on the "
              "device, and dense Adam updates every row every step; use --embedding_optimizer "
              "sgd, adagrad, rowwise_adagrad or lazy_adam with it");
  const Device dev = ctx.device;
  home_ = cache_slots > 0 ? Device::kCpu : dev;
  const size_t n = size_t(R_) * plan.D;
  const int state = optimizer_state_arrays(opt.kind);
  const size_t m_floats = size_t(R_) * state_width(1);
  bf16_rows_ = plan.table_elem_bytes == 2;
  try {
    params_ = Buffer<float>(home_, bf16_rows_ ? 0 : n);
    rows16_ = Buffer<uint16_t>(home_, bf16_rows_ ? n : 0);
    m_ = Buffer<float>(home_, state >= 1 ? m_floats : 0);
    v_ = Buffer<float>(home_, state >= 2 ? n : 0);
  } catch (const Error& e) {
    std::string names;
    for (const TableSpec& s : plan.tables)
      names += (names.empty() ? "" : ", ") + s.name + " " + placement_name(s.placement);
    NCF_RETHROW(e, "embedding tables (", names, "): ", R_, " rows x ", plan.D, " with ",
                optimizer_name(opt.kind), " state (", bytes_on_rank(),
                " bytes) do not fit on this ", device_name(home_),
                cache_slots > 0 ? "'s memory (the host tier's home)" : "");
  }
  m_.zero();
  v_.zero();
  if ((opt.kind == EmbeddingOptimizer::kAdagrad ||
       opt.kind == EmbeddingOptimizer::kRowwiseAdagrad) &&
      m_floats)
    fill(home_ctx(), m_.data(), int64_t(m_floats), opt.adagrad.initial_accumulator);
  for (Buffer<int32_t>* b : {&keys_, &unique_, &send_rows_, &recv_rows_, &reduced_rows_})
    *b = Buffer<int32_t>(dev, 0);
  for (Buffer<int64_t>* b : {&inverse_, &perm_}) *b = Buffer<int64_t>(dev, 0);
  for (Buffer<float>* b : {&rows_, &grads_, &send_vec_, &recv_vec_, &uvec_, &reduced_grads_})
    *b = Buffer<float>(dev, 0);
  for (Buffer<uint16_t>* b : {&wsend_, &wrecv_}) *b = Buffer<uint16_t>(dev, 0);
  for (Buffer<int32_t>* b : {&bur_, &brow_}) *b = Buffer<int32_t>(dev, 0);
  for (Buffer<float>* b : {&bug_, &bw_, &bm_, &bv_}) *b = Buffer<float>(dev, 0);
  for (auto* v :
       {&send_counts_, &send_displs_, &recv_counts_, &recv_displs_, &sc_, &sd_, &rc_, &rd_})
    v->assign(W_, 0);
  n_.assign(T, 0);
  off_.assign(T, 0);
  if (cache_slots > 0) allocate_cache(cache_slots);
}

int64_t EmbeddingCollection::routed_rows_on(int rank) const {
  int64_t rows = 0;
  for (int u = 0; u < num_tables(); ++u)
    if (layout_.placement[u] != Placement::kReplicated) rows += layout_.rows_on(u, rank);
  return rows;
}

bool EmbeddingCollection::is_routed(int t) const {
  return !local_ && plan_.tables[t].placement != Placement::kReplicated;
}

void EmbeddingCollection::set_node_dedup(bool on) {
  if (on && any_routed()) {
    NCF_CHECK(dedup_, "node-level de-duplication needs rank-level de-duplication on");
    NCF_CHECK(comm_.exchange() == ExchangeKind::kTwoHop,
              "node-level de-duplication needs the two-hop exchange");
    N_ = comm_.group_size(CommGroup::kRail);
    L_ = comm_.group_size(CommGroup::kNode);
    const Device dev = ctx_.device;
    for (Buffer<int32_t>* b : {&akeys_, &bkeys_, &kkeys_, &nunique_, &nrows_})
      *b = Buffer<int32_t>(dev, 0);
    ninv_ = Buffer<int64_t>(dev, 0);
    for (Buffer<float>* b : {&avec_, &bvec_, &kvec_, &nvec_}) *b = Buffer<float>(dev, 0);
    node_dedup_ = true;
    return;
  }
  node_dedup_ = false;
}

void EmbeddingCollection::copy_blocks(void* dst, const void* src,
                                      const std::vector<RowBlock>& blocks, size_t row_bytes,
                                      bool reverse) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (const RowBlock& b : blocks) {
    if (b.rows == 0) continue;
    const int64_t to = reverse ? b.src : b.dst, from = reverse ? b.dst : b.src;
    device_copy_async(ctx_, ctx_.device, d + size_t(to) * row_bytes, ctx_.device,
                      s + size_t(from) * row_bytes, size_t(b.rows) * row_bytes);
  }
}

TableRows EmbeddingCollection::rows_of(Buffer<float>& p, Buffer<float>& m, Buffer<float>& v,
                                       int64_t first, int64_t count) {
  const int64_t at = first * plan_.D;
  return TableRows{bf16_rows_ ? nullptr : p.data() + at,
                   m.size() ? m.data() + first * state_width(1) : nullptr,
                   v.size() ? v.data() + at : nullptr, count, plan_.D};
}

TableRows EmbeddingCollection::all_rows(int64_t first, int64_t count) {
  return rows_of(params_, m_, v_, first, count);
}

TableRows EmbeddingCollection::step_rows(int64_t first, int64_t count) {
  return mirrored() ? rows_of(cparams_, cm_, cv_, first, count) : all_rows(first, count);
}

int64_t EmbeddingCollection::bytes_on_rank() const {
  return R_ * (int64_t(plan_.table_elem_bytes) * plan_.D +
               4 * optimizer_state_floats_per_row(opt_.kind, plan_.D)) +
         rep_floats_ * 4;
}

int64_t EmbeddingCollection::step_buffer_bytes() const {
  int64_t b = 0;
  for (const Buffer<int32_t>* x : {&keys_, &unique_, &send_rows_, &recv_rows_, &reduced_rows_,
                                   &akeys_, &bkeys_, &kkeys_, &nunique_, &nrows_})
    b += int64_t(x->bytes());
  for (const Buffer<int64_t>* x : {&inverse_, &perm_, &ninv_}) b += int64_t(x->bytes());
  for (const Buffer<float>* x : {&rows_, &grads_, &send_vec_, &recv_vec_, &uvec_, &reduced_grads_,
                                 &avec_, &bvec_, &kvec_, &nvec_})
    b += int64_t(x->bytes());
  for (const Buffer<uint16_t>* x : {&wsend_, &wrecv_}) b += int64_t(x->bytes());
  for (const Buffer<int32_t>* x : {&bur_, &brow_}) b += int64_t(x->bytes());
  for (const Buffer<float>* x : {&bug_, &bw_, &bm_, &bv_}) b += int64_t(x->bytes());
  return b;
}

void EmbeddingCollection::init_rows(uint64_t seed, int64_t k0, int64_t k1, float* dst) const {
  const int D = plan_.D;
  std::vector<int> table_of_layout(num_tables());
  for (int t = 0; t < num_tables(); ++t) table_of_layout[lt_[t]] = t;
  for (int64_t k = k0; k < k1; ++k) {
    int u = 0;
    const int64_t id = layout_.id_of_row(k, rank_, &u);
    const TableSpec& s = plan_.tables[table_of_layout[u]];
    CounterRng rng{seed, kStreamInit, (uint64_t(s.init_tag) << 40) | uint64_t(id)};
    float* row = dst + (k - k0) * D;
    for (int j = 0; j < D; j += 2) {
      // Box-Muller on two 53-bit uniforms: a pair of normals per draw.
      double u1 = 1.0 - rng.uniform_double(uint64_t(j)), u2 = rng.uniform_double(uint64_t(j) + 1);
      double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
      row[j] = float(s.init_stddev * r * std::cos(a));
      if (j + 1 < D) row[j + 1] = float(s.init_stddev * r * std::sin(a));
    }
  }
}

void EmbeddingCollection::init(uint64_t seed) {
  const int D = plan_.D;
  seed_ = seed;
  if (cache_) drop_cache();  // the home rows are replaced
  if (R_ == 0) return;
  // Rows are independent (keyed by table and global row), so the host threads
  // split them.
  const int64_t grain = std::max<int64_t>(1, 4096 / D);
  auto fill = [&](int64_t k0, int64_t k1, float* dst) {
    parallel_for(ctx_.threads, k1 - k0, grain,
                 [&](int64_t a, int64_t b) { init_rows(seed, k0 + a, k0 + b, dst + a * D); });
  };
  if (home_ == Device::kCpu && !bf16_rows_) {
    fill(0, R_, params_.data());
    return;
  }
  // A GPU shard goes up in chunks of about 64 MiB through two pinned buffers:
  // the host fills one while the previous chunk's copy runs, so host memory stays
  // bounded by two chunks whatever the tables' size. BF16 rows are the draws
  // rounded to nearest-even, on either device (on a CPU rank through chunks of
  // 4 MiB, which nothing overlaps).
  const int64_t chunk_bytes = home_ == Device::kCpu ? int64_t{4} << 20 : int64_t{64} << 20;
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes / (int64_t(D) * 4));
  const size_t most = size_t(std::min(chunk, R_)) * D;
  PinnedBuffer<float> stage[2];
  PinnedBuffer<uint16_t> stage16[2];
  for (int s = 0; s < 2; ++s) {
    stage[s].reserve(most);
    if (bf16_rows_) stage16[s].reserve(most);
  }
  ExecContext host_ctx;
  host_ctx.threads = ctx_.threads;
  for (int64_t c = 0, k0 = 0; k0 < R_; ++c, k0 += chunk) {
    const int64_t k1 = std::min(R_, k0 + chunk);
    float* host = stage[c % 2].data();
    fill(k0, k1, host);  // free: the previous round's wait covered copy c - 2
    const void* src = host;
    void* dst = bf16_rows_ ? static_cast<void*>(rows16_.data() + k0 * D)
                           : static_cast<void*>(params_.data() + k0 * D);
    if (bf16_rows_) {
      pack_bf16(host_ctx, host, stage16[c % 2].data(), (k1 - k0) * D);
      src = stage16[c % 2].data();
    }
    const size_t bytes = size_t(k1 - k0) * D * size_t(plan_.table_elem_bytes);
    if (home_ == Device::kCpu) {
      std::memcpy(dst, src, bytes);
      continue;
    }
    check_device_errors(ctx_);  // waits for copy c - 1 (no kernel ran to record errors)
    device_copy_async(ctx_, ctx_.device, dst, Device::kCpu, src, bytes);
  }
  if (home_ != Device::kCpu) check_device_errors(ctx_);  // the stage buffers go away
}

const float* EmbeddingCollection::rows(int t) const { return rows_.data() + off_[t] * plan_.D; }
float* EmbeddingCollection::row_grads(int t) { return grads_.data() + off_[t] * plan_.D; }

bool EmbeddingCollection::narrow_lookups() const {
  return local_ && !bf16_rows_ && wire_ == WireDType::kFloat32 &&
         (!cache_ || (cache_->mirrors() && (staged_ || step_open_)));
}

const float* EmbeddingCollection::local_rows(int t) const {
  if (!narrow_lookups()) return nullptr;
  return (cache_ ? cparams_ : params_).data() + layout_.key_begin[lt_[t]] * plan_.D;
}

void EmbeddingCollection::lookup(const std::vector<TableIds>& ids) {
  lookup_start(ids);
  lookup_gather();
  lookup_finish();
}

void EmbeddingCollection::lookup_start(const std::vector<TableIds>& ids) {
  const int T = num_tables();
  const int D = plan_.D;
  NCF_CHECK(int(ids.size()) == T, "embedding lookup: ", ids.size(), " id lists for ", T, " tables");
  if (cache_) begin_lookup();  // this step's rows in the cache
  // Batch order: layout order (routed tables first).
  std::vector<int> table_of_layout(T);
  for (int t = 0; t < T; ++t) table_of_layout[lt_[t]] = t;
  n_total_ = n_routed_ = 0;
  width_.assign(size_t(T), 0);
  given_ = GivenColumns{};  // a step that ended before its update leaves none to the next
  for (int u = 0; u < T; ++u) {
    const int t = table_of_layout[u];
    NCF_CHECK(ids[t].n >= 0, "embedding lookup: table ", plan_.tables[t].name, " n=", ids[t].n);
    NCF_CHECK(ids[t].width >= 0 && ids[t].width <= D, "embedding lookup: table ",
              plan_.tables[t].name, " width=", ids[t].width, " outside [0, D=", D, "]");
    NCF_CHECK(ids[t].width == 0 || ids[t].width == D || narrow_lookups(),
              "embedding lookup: table ", plan_.tables[t].name, " width=", ids[t].width,
              ": only a one-rank lookup of FP32 rows over an FP32 wire writes part of a row");
    width_[t] = ids[t].width == D ? 0 : ids[t].width;
    off_[t] = n_total_;
    n_[t] = ids[t].n;
    n_total_ += ids[t].n;
    if (is_routed(t)) n_routed_ += ids[t].n;
  }
  keys_.reserve(size_t(n_total_));
  rows_.reserve(size_t(n_total_) * D);
  grads_.reserve(size_t(n_total_) * D);
  for (int t = 0; t < T; ++t) {
    // Routed (and W = 1): keys, which at W = 1 are the flat rows; replicated:
    // rows of the table. Ids outside the table stop here, naming it.
    const int64_t offset = local_ || is_routed(t) ? layout_.key_begin[lt_[t]] : 0;
    try {
      ids_to_keys(ctx_, ids[t].ids, ids[t].n, offset, plan_.tables[t].num_rows,
                  keys_.data() + off_[t]);
    } catch (const Error& e) {
      NCF_RETHROW(e, "table ", plan_.tables[t].name);
    }
  }
  if (local_) return;
  if (!any_routed()) return;
  if (!home_mode_ && routes_ahead()) {  // announced: its keys were routed then
    take_routing();
    return;
  }

  // The keys that travel: the unique ones (ascending) with --dedup, else all.
  const int32_t* travel = keys_.data();
  nu_ = n_routed_;
  if (dedup_) {
    unique_.reserve(size_t(n_routed_));
    inverse_.reserve(size_t(n_routed_));
    unique_ids(ctx_, keys_.data(), n_routed_, unique_.data(), inverse_.data(), &nu_,
               layout_.num_keys());
    travel = unique_.data();
  }
  perm_.reserve(size_t(nu_));
  send_rows_.reserve(size_t(nu_));
  bucketize_by_owner(ctx_, travel, nu_, layout_, perm_.data(), send_rows_.data(),
                     send_counts_.data());
  for (int p = 1; p < W_; ++p) send_displs_[p] = send_displs_[p - 1] + send_counts_[p - 1];
  if (node_dedup_) {
    node_lookup_start();
    return;
  }
  comm_.exchange_counts(send_counts_.data(), recv_counts_.data());
  nr_ = 0;
  for (int p = 0; p < W_; ++p) {
    recv_displs_[p] = nr_;
    nr_ += recv_counts_[p];
  }
  recv_rows_.reserve(size_t(nr_));
  all_to_all_v_on(comm_, ctx_.device, send_rows_.data(), send_counts_.data(), send_displs_.data(),
                  recv_rows_.data(), recv_counts_.data(), recv_displs_.data(), DType::kInt32,
                  &ticket_);
}

void EmbeddingCollection::lookup_gather() {
  if (!any_routed()) return;
  if (node_dedup_) {
    node_lookup_gather();
    return;
  }
  const int D = plan_.D;
  comm_.join(ticket_);
  // Owners gather the asked rows and send them back.
  send_vec_.reserve(size_t(nr_) * D);
  gather_own(recv_rows_.data(), 0, R_routed_, nr_, send_vec_.data());
  for (int p = 0; p < W_; ++p) {
    sc_[p] = recv_counts_[p] * D;
    sd_[p] = recv_displs_[p] * D;
    rc_[p] = send_counts_[p] * D;
    rd_[p] = send_displs_[p] * D;
  }
  recv_vec_.reserve(size_t(nu_) * D);
  start_rows(send_vec_.data(), recv_vec_.data());
}

void EmbeddingCollection::lookup_finish() {
  const int D = plan_.D;
  if (local_) {
    if (std::all_of(width_.begin(), width_.end(), [](int w) { return w == 0; })) {
      gather_own(keys_.data(), 0, R_, n_total_, rows_.data());
    } else {  // narrow_lookups(): FP32 rows, nothing to round
      const float* own = (mirrored() ? cparams_ : params_).data();
      for (int t = 0; t < num_tables(); ++t)
        gather_rows(ctx_, own, keys_.data() + off_[t], rows_.data() + off_[t] * D, R_, n_[t], D,
                    width_[t]);
    }
    round_kept_rows(rows_.data());
    return;
  }
  if (any_routed()) {
    if (node_dedup_) node_lookup_finish();  // this rank's rows in owner order in recv_vec_
    comm_.join(ticket_);
    ticket_ = 0;
    finish_rows(recv_vec_.data());
    // Back to batch order: owner order -> (unique) key order -> batch positions.
    if (dedup_) {
      uvec_.reserve(size_t(nu_) * D);
      unpermute_rows(ctx_, recv_vec_.data(), perm_.data(), uvec_.data(), nu_, D);
      permute_rows(ctx_, uvec_.data(), nu_, inverse_.data(), rows_.data(), n_routed_, D);
    } else {
      unpermute_rows(ctx_, recv_vec_.data(), perm_.data(), rows_.data(), n_routed_, D);
    }
  }
  // Replicated tables: straight from this rank's copy.
  for (int t = 0; t < num_tables(); ++t)
    if (!is_routed(t)) {
      const int64_t b = layout_.begin_on(lt_[t], rank_);
      gather_own(keys_.data() + off_[t], b, plan_.tables[t].num_rows, n_[t],
                 rows_.data() + off_[t] * D);
    }
}

void EmbeddingCollection::gradients_start(float* replicated_grads) {
  if (local_) return;
  const int D = plan_.D;
  NCF_CHECK(rep_floats_ == 0 || replicated_grads, "gradients_start: ", rep_floats_,
            " replicated gradient floats and no buffer");
  if (any_routed()) {
    // Gradients per travelling key: with --dedup, duplicates are summed by key
    // (ascending, the order of unique_); then put in owner order.
    const float* per_key = grads_.data();
    if (dedup_) {
      reduced_rows_.reserve(size_t(n_routed_));
      reduced_grads_.reserve(size_t(n_routed_) * D);
      int64_t nu = 0;
      sort_reduce_rows(ctx_, keys_.data(), grads_.data(), n_routed_, D, reduced_rows_.data(),
                       reduced_grads_.data(), &nu, layout_.num_keys());
      NCF_CHECK(nu == nu_, "embedding backward: ", nu, " unique keys, ", nu_, " in the forward");
      per_key = reduced_grads_.data();
    }
    recv_vec_.reserve(size_t(nu_) * D);  // reused: gradients in owner order
    permute_rows(ctx_, per_key, nu_, perm_.data(), recv_vec_.data(), nu_, D);
    if (node_dedup_) {
      node_gradients_start();
    } else {
      for (int p = 0; p < W_; ++p) {
        sc_[p] = send_counts_[p] * D;
        sd_[p] = send_displs_[p] * D;
        rc_[p] = recv_counts_[p] * D;
        rd_[p] = recv_displs_[p] * D;
      }
      send_vec_.reserve(size_t(nr_) * D);  // reused: gradients this rank owns
      start_rows(recv_vec_.data(), send_vec_.data());
    }
  }
  // Replicated tables: this rank's sum per row, as a dense gradient with a
  // touch count per row, for the caller's allreduce.
  for (int t = 0; t < num_tables(); ++t)
    if (!is_routed(t)) {
      const int64_t n = n_[t], N = plan_.tables[t].num_rows;
      reduced_rows_.reserve(size_t(std::max(n, N)));
      reduced_grads_.reserve(size_t(std::max(n, N)) * D);
      int64_t nu = 0;
      sort_reduce_rows(ctx_, keys_.data() + off_[t], grads_.data() + off_[t] * D, n, D,
                       reduced_rows_.data(), reduced_grads_.data(), &nu, N);
      scatter_rows_dense(ctx_, reduced_rows_.data(), reduced_grads_.data(), nu, D, N,
                         replicated_grads + rep_offset_[t]);
    }
}

bool EmbeddingCollection::given_columns_ok() const {
  return narrow_lookups() && opt_.kind == EmbeddingOptimizer::kDenseAdam;
}

void EmbeddingCollection::give_columns(int t, int col, const float* rows) {
  NCF_CHECK(given_columns_ok(),
            "give_columns: only one rank's dense Adam update of FP32 rows "
            "takes given gradient columns");
  NCF_CHECK(t >= 0 && t < num_tables() && col >= 0 && col < plan_.D && rows != nullptr,
            "give_columns: table ", t, " columns from ", col, " of D=", plan_.D);
  given_.rows = rows;
  given_.begin = layout_.key_begin[lt_[t]];
  given_.end = given_.begin + plan_.tables[t].num_rows;
  given_.col = col;
}

void EmbeddingCollection::gradients_finish(int64_t t) {
  const GivenColumns given = given_;
  given_ = GivenColumns{};
  if (local_) {
    // One rank: the batch's rows are the flat rows; one fused update over all.
    round_kept_rows(grads_.data());
    if (given.rows != nullptr)
      reduce_update_rows(ctx_, keys_.data(), grads_.data(), n_total_, all_rows(0, R_), opt_, t,
                         nullptr, given);
    else
      update_rows(keys_.data(), grads_.data(), n_total_, 0, R_, false, t);
    step_open_ = false;
    return;
  }
  if (!any_routed()) return;
  comm_.join(ticket_);
  ticket_ = 0;
  finish_rows(send_vec_.data());
  update_rows(recv_rows_.data(), send_vec_.data(), nr_, 0, R_routed_, false, t);
}

void EmbeddingCollection::update_replicated(const float* replicated_grads, int64_t t) {
  if (local_) return;
  const int D = plan_.D;
  for (int k = 0; k < num_tables(); ++k)
    if (!is_routed(k)) {
      const int64_t N = plan_.tables[k].num_rows;
      reduced_rows_.reserve(size_t(N));
      reduced_grads_.reserve(size_t(N) * D);
      int64_t nu = 0;
      compact_touched_rows(ctx_, replicated_grads + rep_offset_[k], N, D, reduced_rows_.data(),
                           reduced_grads_.data(), &nu);
      update_rows(reduced_rows_.data(), reduced_grads_.data(), nu, layout_.begin_on(lt_[k], rank_),
                  N, true, t);
    }
}

// ---- the rows: gather and update, FP32 or BF16 --------------------------------

void EmbeddingCollection::gather_own(const RowId* ids, int64_t first, int64_t R, int64_t n,
                                     float* out) {
  if (cache_ && !home_mode_ && !mirrored()) {
    tier_gather(ids, first, R, n, out);
    return;
  }
  const int D = plan_.D;
  const bool c = mirrored();
  if (bf16_rows_)
    gather_rows_bf16(ctx_, (c ? crows16_ : rows16_).data() + first * D, ids, out, R, n, D);
  else
    gather_rows(ctx_, (c ? cparams_ : params_).data() + first * D, ids, out, R, n, D);
}

RowRounding EmbeddingCollection::rounding(int64_t first, int64_t t) const {
  RowRounding key;
  key.seed = seed_;
  key.step = t;
  key.first = first;
  key.rank = rank_;
  key.layout = layout_;
  for (int k = 0; k < num_tables(); ++k) key.tag[lt_[k]] = plan_.tables[k].init_tag;
  return key;
}

void EmbeddingCollection::update_rows(const RowId* rows, const float* grads, int64_t n,
                                      int64_t first, int64_t count, bool unique, int64_t t) {
  // Through the slot map (a cache of fewer slots than rows), or at the rows themselves.
  const bool cached = cache_ && !home_mode_ && !mirrored();
  if (!bf16_rows_) {
    if (cached)
      tier_update_fp32(rows, grads, n, first, count, t);
    else if (unique)
      apply_table_optimizer(ctx_, step_rows(first, count), rows, grads, n, opt_, t);
    else
      reduce_update_rows(ctx_, rows, grads, n, step_rows(first, count), opt_, t);
    return;
  }
  const int D = plan_.D;
  // Duplicates summed as the fused FP32 update sums them (the same order).
  const RowId* ur = rows;
  const float* ug = grads;
  int64_t nu = n;
  if (!unique && n > 0) {
    bur_.reserve(size_t(n));
    bug_.reserve(size_t(n) * D);
    sort_reduce_rows(ctx_, rows, grads, n, D, bur_.data(), bug_.data(), &nu, count);
    ur = bur_.data();
    ug = bug_.data();
  }
  const TableRows state = step_rows(first, count);
  uint16_t* tab = (mirrored() ? crows16_ : rows16_).data() + first * D;
  if (opt_.kind == EmbeddingOptimizer::kDenseAdam) {
    // Every row moves: widened, updated and rounded back chunk by chunk, so
    // the FP32 copy stays small whatever the table's size. Where the rows are
    // more than one chunk, the host splits the unique rows between chunks (a
    // wait for them on a GPU); one chunk takes them all, as they are.
    const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / (int64_t(D) * 4));
    const bool split = count > chunk;
    if (split) {
      host_ur_.resize(size_t(nu));
      if (nu > 0) device_copy(Device::kCpu, host_ur_.data(), ctx_.device, ur, size_t(nu) * 4);
    }
    for (int64_t c0 = 0; c0 < count; c0 += chunk) {
      const int64_t c1 = std::min(count, c0 + chunk);
      int64_t k0 = 0, k1 = nu;
      const RowId* rows_in = ur;
      if (split) {
        k0 = std::lower_bound(host_ur_.begin(), host_ur_.end(), c0) - host_ur_.begin();
        k1 = std::lower_bound(host_ur_.begin(), host_ur_.end(), c1) - host_ur_.begin();
        brow_.reserve(size_t(k1 - k0));
        offset_rows(ctx_, ur + k0, k1 - k0, RowId(-c0), brow_.data());
        rows_in = brow_.data();
      }
      bw_.reserve(size_t(c1 - c0) * D);
      unpack_bf16(ctx_, tab + c0 * D, bw_.data(), (c1 - c0) * D);
      embedding_dense_adam(ctx_, bw_.data(), state.m + c0 * D, state.v + c0 * D, rows_in,
                           ug + k0 * D, c1 - c0, k1 - k0, D, t, opt_.adam);
      store_rows_bf16(ctx_, bw_.data(), nullptr, tab + c0 * D, c1 - c0, c1 - c0, D,
                      rounding(first + c0, t));
    }
    return;
  }
  if (nu == 0) return;
  // Touched rows: an FP32 copy of them and their state, updated as a compact
  // table, the state put back and the rows rounded back, each with the key of its
  // flat row. They are stored at `at` of the arrays: at home their flat rows
  // (ascending), in the host tier's cache their slots.
  const RowId* at = ur;
  TableRows store = state;
  int64_t R = count;
  if (cached) {
    R = cache_->slots();
    tslot_.reserve(size_t(nu));
    map_rows(ctx_, slot_map_.data() + first, ur, count, nu, tslot_.data());
    at = tslot_.data();
    store = TableRows{nullptr, cm_.size() ? cm_.data() : nullptr, cv_.size() ? cv_.data() : nullptr,
                      R, D};
    tab = crows16_.data();
  }
  const int sw = state_width(1);
  bw_.reserve(size_t(nu) * D);
  brow_.reserve(size_t(nu));
  gather_rows_bf16(ctx_, tab, at, bw_.data(), R, nu, D);
  offset_rows(ctx_, nullptr, nu, 0, brow_.data());
  float* m = nullptr;
  float* v = nullptr;
  if (store.m) {
    bm_.reserve(size_t(nu) * sw);
    gather_rows(ctx_, store.m, at, bm_.data(), R, nu, sw);
    m = bm_.data();
  }
  if (store.v) {
    bv_.reserve(size_t(nu) * D);
    gather_rows(ctx_, store.v, at, bv_.data(), R, nu, D);
    v = bv_.data();
  }
  apply_table_optimizer(ctx_, TableRows{bw_.data(), m, v, nu, D}, brow_.data(), ug, nu, opt_, t);
  if (!cached) {  // ascending rows, checked as such
    if (m) scatter_rows(ctx_, m, ur, store.m, R, nu, sw);
    if (v) scatter_rows(ctx_, v, ur, store.v, R, nu, D);
    store_rows_bf16(ctx_, bw_.data(), ur, tab, R, nu, D, rounding(first, t));
    return;
  }
  if (m) copy_rows(ctx_, m, nullptr, nu, store.m, at, R, nu, sw, 4);
  if (v) copy_rows(ctx_, v, nullptr, nu, store.v, at, R, nu, D, 4);
  store_rows_bf16_at(ctx_, bw_.data(), ur, at, tab, R, nu, D, rounding(first, t));
}

// ---- node-level de-duplication (set_node_dedup) ------------------------------

void EmbeddingCollection::exchange_rows(CommGroup g, const float* send,
                                        const std::vector<int64_t>& send_rows,
                                        const std::vector<int64_t>& send_at, float* recv,
                                        const std::vector<int64_t>& recv_rows,
                                        const std::vector<int64_t>& recv_at) {
  const int64_t D = plan_.D;
  std::vector<int64_t>* out[4] = {&x1_, &x2_, &x3_, &x4_};
  const std::vector<int64_t>* in[4] = {&send_rows, &send_at, &recv_rows, &recv_at};
  for (int k = 0; k < 4; ++k) {
    out[k]->resize(in[k]->size());
    for (size_t i = 0; i < in[k]->size(); ++i) (*out[k])[i] = (*in[k])[i] * D;
  }
  if (wire_ == WireDType::kFloat32) {
    group_all_to_all_v_on(comm_, g, ctx_.device, send, x1_.data(), x2_.data(), recv, x3_.data(),
                          x4_.data(), DType::kFloat32);
    return;
  }
  const int64_t nr = pack_wire(send, x1_, x2_, x3_, x4_);
  group_all_to_all_v_on(comm_, g, ctx_.device, wsend_.data(), x1_.data(), x2_.data(), wrecv_.data(),
                        x3_.data(), x4_.data(), DType::kBFloat16);
  unpack_bf16(ctx_, wrecv_.data(), recv, nr);
}

void EmbeddingCollection::start_rows(const float* send, float* recv) {
  if (wire_ == WireDType::kFloat32) {
    all_to_all_v_on(comm_, ctx_.device, send, sc_.data(), sd_.data(), recv, rc_.data(), rd_.data(),
                    DType::kFloat32, &ticket_);
    return;
  }
  const int64_t nr = pack_wire(send, sc_, sd_, rc_, rd_);
  all_to_all_v_on(comm_, ctx_.device, wsend_.data(), sc_.data(), sd_.data(), wrecv_.data(),
                  rc_.data(), rd_.data(), DType::kBFloat16, &ticket_);
  widen_ = nr;
}

int64_t EmbeddingCollection::pack_wire(const float* send, const std::vector<int64_t>& sc,
                                       const std::vector<int64_t>& sd,
                                       const std::vector<int64_t>& rc,
                                       const std::vector<int64_t>& rd) {
  int64_t ns = 0, nr = 0;
  for (size_t i = 0; i < sc.size(); ++i) {
    ns = std::max(ns, sd[i] + sc[i]);
    nr = std::max(nr, rd[i] + rc[i]);
  }
  wsend_.reserve(size_t(ns));
  wrecv_.reserve(size_t(nr));
  pack_bf16(ctx_, send, wsend_.data(), ns);
  return nr;
}

void EmbeddingCollection::finish_rows(float* recv) {
  if (widen_ == 0) return;
  unpack_bf16(ctx_, wrecv_.data(), recv, widen_);
  widen_ = 0;
}

void EmbeddingCollection::round_kept_rows(float* rows) {
  if (wire_ == WireDType::kFloat32) return;
  for (int t = 0; t < num_tables(); ++t)
    if (plan_.tables[t].placement != Placement::kReplicated)
      round_bf16(ctx_, rows + off_[t] * plan_.D, n_[t] * plan_.D);
}

void EmbeddingCollection::node_lookup_start() {
  const int N = N_, L = L_, l = comm_.group_index(CommGroup::kNode);
  const Device dev = ctx_.device;
  // Hop 1's sizes, then the three layouts' blocks.
  h1r_ = comm_.hop1_counts(send_counts_.data());
  for (auto* v : {&ac_, &ad_, &bc_, &bd_}) v->assign(size_t(L), 0);
  for (auto* v : {&kc_, &kd_, &uc_, &urc_, &urd_}) v->assign(size_t(N), 0);
  pack_.clear();
  int64_t a = 0;
  for (int j = 0; j < L; ++j) {
    ad_[size_t(j)] = a;
    for (int m = 0; m < N; ++m) {
      const int64_t k = send_counts_[size_t(m) * L + j];
      pack_.push_back({a, send_displs_[size_t(m) * L + j], k});
      a += k;
    }
    ac_[size_t(j)] = a - ad_[size_t(j)];
  }
  int64_t k_total = 0;
  for (int m = 0; m < N; ++m) {
    kd_[size_t(m)] = k_total;
    for (int i = 0; i < L; ++i) kc_[size_t(m)] += h1r_[size_t(i) * N + m];
    k_total += kc_[size_t(m)];
  }
  regroup_.clear();
  x1_ = kd_;  // the next free row of each node's run in K
  int64_t b = 0;
  for (int i = 0; i < L; ++i) {
    bd_[size_t(i)] = b;
    for (int m = 0; m < N; ++m) {
      const int64_t k = h1r_[size_t(i) * N + m];
      regroup_.push_back({x1_[size_t(m)], b, k});
      x1_[size_t(m)] += k;
      b += k;
    }
    bc_[size_t(i)] = b - bd_[size_t(i)];
  }
  nb_ = b;

  // Hop 1: this rank's unique keys (flat rows on their owners), owner order
  // regrouped by local peer, to the ranks that carry them.
  akeys_.reserve(size_t(nu_));
  copy_blocks(akeys_.data(), send_rows_.data(), pack_, 4, false);
  bkeys_.reserve(size_t(nb_));
  group_all_to_all_v_on(comm_, CommGroup::kNode, dev, akeys_.data(), ac_.data(), ad_.data(),
                        bkeys_.data(), bc_.data(), bd_.data(), DType::kInt32);
  kkeys_.reserve(size_t(nb_));
  copy_blocks(kkeys_.data(), bkeys_.data(), regroup_, 4, false);
  // Each node's keys for its owner (m, l), unique and ascending: every row once.
  nunique_.reserve(size_t(nb_));
  ninv_.reserve(size_t(nb_));
  for (int m = 0; m < N; ++m) {
    const int64_t k = kc_[size_t(m)], d = kd_[size_t(m)];
    if (k == 0) continue;
    unique_ids(ctx_, kkeys_.data() + d, k, nunique_.data() + d, ninv_.data() + d, &uc_[size_t(m)],
               routed_rows_on(m * L + l));
  }
  // Hop 2: the unique rows to their owners, one message per node.
  comm_.group_exchange_counts(CommGroup::kRail, uc_.data(), urc_.data(), 1);
  nr_ = 0;
  for (int m = 0; m < N; ++m) {
    urd_[size_t(m)] = nr_;
    nr_ += urc_[size_t(m)];
  }
  recv_rows_.reserve(size_t(nr_));
  group_all_to_all_v_on(comm_, CommGroup::kRail, dev, nunique_.data(), uc_.data(), kd_.data(),
                        recv_rows_.data(), urc_.data(), urd_.data(), DType::kInt32);
}

void EmbeddingCollection::node_lookup_gather() {
  const int D = plan_.D;
  send_vec_.reserve(size_t(nr_) * D);
  gather_own(recv_rows_.data(), 0, R_routed_, nr_, send_vec_.data());
  nvec_.reserve(size_t(nb_) * D);
  exchange_rows(CommGroup::kRail, send_vec_.data(), urc_, urd_, nvec_.data(), uc_, kd_);
}

void EmbeddingCollection::node_lookup_finish() {
  const int D = plan_.D;
  // Each node's unique rows expanded to the keys its ranks asked, then back to
  // each source through hop 1, and into the source's owner order.
  kvec_.reserve(size_t(nb_) * D);
  for (int m = 0; m < N_; ++m) {
    const int64_t k = kc_[size_t(m)], d = kd_[size_t(m)];
    if (k > 0)
      permute_rows(ctx_, nvec_.data() + d * D, uc_[size_t(m)], ninv_.data() + d,
                   kvec_.data() + d * D, k, D);
  }
  bvec_.reserve(size_t(nb_) * D);
  copy_blocks(bvec_.data(), kvec_.data(), regroup_, size_t(D) * 4, true);
  avec_.reserve(size_t(nu_) * D);
  exchange_rows(CommGroup::kNode, bvec_.data(), bc_, bd_, avec_.data(), ac_, ad_);
  recv_vec_.reserve(size_t(nu_) * D);
  copy_blocks(recv_vec_.data(), avec_.data(), pack_, size_t(D) * 4, true);
}

void EmbeddingCollection::node_gradients_start() {
  const int D = plan_.D;
  // recv_vec_: this rank's gradient per unique key, owner order. Hop 1 to the
  // carrying ranks, then each node's gradients summed per key before hop 2.
  avec_.reserve(size_t(nu_) * D);
  copy_blocks(avec_.data(), recv_vec_.data(), pack_, size_t(D) * 4, false);
  bvec_.reserve(size_t(nb_) * D);
  exchange_rows(CommGroup::kNode, avec_.data(), ac_, ad_, bvec_.data(), bc_, bd_);
  kvec_.reserve(size_t(nb_) * D);
  copy_blocks(kvec_.data(), bvec_.data(), regroup_, size_t(D) * 4, false);
  nvec_.reserve(size_t(nb_) * D);
  nrows_.reserve(size_t(nb_));
  const int l = comm_.group_index(CommGroup::kNode);
  for (int m = 0; m < N_; ++m) {
    const int64_t k = kc_[size_t(m)], d = kd_[size_t(m)];
    if (k == 0) continue;
    const int owner = m * L_ + l;
    int64_t nu = 0;
    sort_reduce_rows(ctx_, kkeys_.data() + d, kvec_.data() + d * D, k, D, nrows_.data() + d,
                     nvec_.data() + d * D, &nu, routed_rows_on(owner));
    NCF_CHECK(nu == uc_[size_t(m)], "embedding backward (node de-duplication): ", nu,
              " unique rows for rank ", owner, ", ", uc_[size_t(m)], " in the forward");
  }
  send_vec_.reserve(size_t(nr_) * D);  // gradients this rank owns
  exchange_rows(CommGroup::kRail, nvec_.data(), uc_, kd_, send_vec_.data(), urc_, urd_);
}

std::vector<float> EmbeddingCollection::gather_table(int t) {
  const int D = plan_.D;
  const TableSpec& s = plan_.tables[t];
  const int u = lt_[t];
  const int64_t R = layout_.rows_on(u, rank_), b = layout_.begin_on(u, rank_);
  std::vector<float> mine(size_t(R) * D);
  flush_cache();
  if (bf16_rows_) {
    std::vector<uint16_t> bits(mine.size());
    device_copy(Device::kCpu, bits.data(), home_, rows16_.data() + b * D, bits.size() * 2);
    for (size_t k = 0; k < bits.size(); ++k) mine[k] = bf16_bits_to_float(bits[k]);
  } else {
    device_copy(Device::kCpu, mine.data(), home_, params_.data() + b * D, mine.size() * 4);
  }
  if (s.placement == Placement::kReplicated || local_) return mine;
  // Each rank writes its rows into a zeroed full table; a sum assembles it.
  std::vector<float> full(size_t(s.num_rows) * D, 0.0f);
  for (int64_t j = 0; j < R; ++j) {
    const int64_t id = s.placement == Placement::kRowWise ? j * W_ + rank_ : j;
    std::copy_n(&mine[size_t(j) * D], D, &full[size_t(id) * D]);
  }
  all_reduce_sum_on(comm_, Device::kCpu, full.data(), full.size(), DType::kFloat32);
  return full;
}

}  // namespace ncf
