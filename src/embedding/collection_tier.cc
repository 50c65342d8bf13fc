// The collection's host tier (collection.h, --device_table_budget): the home arrays in
// host memory, the device cache of C rows, the ids of later steps announced to the rows'
// owners, and the gather and update of cached rows. The residency itself is row_cache.h's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "common/check.h"
#include "common/cuda_context.h"
#include "embedding/collection.h"
#include "embedding/tier_ops.h"

namespace ncf {

EmbeddingCollection::~EmbeddingCollection() {
  for (void* p : registered_) host_unregister(p);
}

ExecContext EmbeddingCollection::home_ctx() const {
  if (home_ == ctx_.device) return ctx_;
  ExecContext host;
  host.threads = ctx_.threads;
  return host;
}

int64_t EmbeddingCollection::cache_row_bytes(int D, int elem_bytes, EmbeddingOptimizer o) {
  return int64_t(elem_bytes) * D + 4 * optimizer_state_floats_per_row(o, D) + 4;
}

void EmbeddingCollection::allocate_cache(int64_t slots) {
  const int D = plan_.D;
  const int64_t C = std::min(slots, std::max<int64_t>(R_, 1));
  const Device dev = ctx_.device;
  try {
    cparams_ = Buffer<float>(dev, bf16_rows_ ? 0 : size_t(C) * D);
    crows16_ = Buffer<uint16_t>(dev, bf16_rows_ ? size_t(C) * D : 0);
    cm_ = Buffer<float>(dev, m_.size() ? size_t(C) * state_width(1) : 0);
    cv_ = Buffer<float>(dev, v_.size() ? size_t(C) * D : 0);
    slot_map_ = Buffer<int32_t>(dev, size_t(std::max<int64_t>(R_, 1)));
  } catch (const Error& e) {
    NCF_RETHROW(e, "the device table cache (", C, " rows x ", cached_row_bytes(),
                " bytes) does not fit on this ", device_name(dev));
  }
  // Zeroed once now: on CPU ranks that maps the arena's pages at start-up, as cudaMalloc
  // maps device memory, instead of one page fault at a time under the first steps' loads.
  cparams_.zero();
  crows16_.zero();
  cm_.zero();
  cv_.zero();
  tslot_ = Buffer<int32_t>(dev, 0);
  moves_dev_ = Buffer<int32_t>(dev, 0);
  side_moves_dev_ = Buffer<int32_t>(dev, 0);
  cache_ = std::make_unique<RowCache>(R_, C);
  cache_->set_threads(ctx_.threads);
  tier_stream_ = std::make_unique<TierStream>(ctx_);
  const std::vector<int32_t> none(slot_map_.size(), -1);
  device_copy(dev, slot_map_.data(), Device::kCpu, none.data(), none.size() * 4);
  // A GPU's kernels copy rows to and from the home arrays directly.
  if (dev != Device::kCpu)
    for (auto [p, bytes] : {std::pair<void*, size_t>{params_.data(), params_.bytes()},
                            {rows16_.data(), rows16_.bytes()},
                            {m_.data(), m_.bytes()},
                            {v_.data(), v_.bytes()}})
      if (p && bytes) {
        host_register(p, bytes);
        registered_.push_back(p);
      }
}

void EmbeddingCollection::drop_cache() {
  NCF_CHECK(announced_ == looked_, "embedding cache dropped with ", announced_ - looked_,
            " steps announced");
  retire_looked();
  step_open_ = false;
  // The rows of other tables than the one replaced stay current at home; flush_cache also
  // waits for the side stream, so nothing is copying when the map is rewritten below.
  flush_cache();
  if (cache_->num_resident() == 0) return;
  if (ctx_.device != Device::kCpu) check_device_errors(ctx_);  // no kernel reads the map now
  cache_->drop_all();
  const std::vector<int32_t> none(slot_map_.size(), -1);
  device_copy(ctx_.device, slot_map_.data(), Device::kCpu, none.data(), none.size() * 4);
}

// ---- the rows of a step at their owners -------------------------------------------

std::vector<int32_t> EmbeddingCollection::owner_rows(const std::vector<TableIds>& host_ids) {
  const int T = num_tables();
  NCF_CHECK(int(host_ids.size()) == T, "embedding announce: ", host_ids.size(), " id lists for ", T,
            " tables");
  ExecContext host;
  host.threads = ctx_.threads;
  std::vector<int32_t> mine = cache_->spare_rows();  // memory a retired step's list held
  if (routes_ahead()) {
    route_ahead(host_ids, &mine);
    return mine;
  }
  std::vector<int32_t>& routed = ann_routed_;
  std::vector<int32_t>& keys = ann_keys_;
  routed.clear();
  ann_shared_.clear();
  ann_shared_n_.assign(size_t(T), 0);
  for (int t = 0; t < T; ++t) {
    const int64_t n = host_ids[t].n;
    const size_t n0 = mine.size();
    // On one rank the keys are the flat rows: written in place.
    if (local_) mine.resize(n0 + size_t(std::max<int64_t>(n, 0)));
    keys.resize(size_t(std::max<int64_t>(n, 0)));
    const bool flat = local_ || is_routed(t);
    try {
      ids_to_keys(host, host_ids[t].ids, n, flat ? layout_.key_begin[lt_[t]] : 0,
                  plan_.tables[t].num_rows, local_ ? mine.data() + n0 : keys.data());
    } catch (const Error& e) {
      NCF_RETHROW(e, "table ", plan_.tables[t].name);
    }
    if (local_) {
      // An item table's ids repeat its rows many times over: dropped here, through a bit
      // set of the table's rows, rather than by the cache's pass over every id's state.
      const int64_t kept =
          drop_repeats_where_dense(mine.data() + n0, std::max<int64_t>(n, 0),
                                   layout_.key_begin[lt_[t]], layout_.num_rows(lt_[t]), &ann_bits_);
      mine.resize(n0 + size_t(kept));
      continue;
    }
    if (!is_routed(t)) {
      share_replicated(t, &keys, &mine);
    } else {
      routed.insert(routed.end(), keys.begin(), keys.end());
    }
  }
  if (local_) return mine;
  // Each distinct routed key once to its owner, which learns the flat rows asked of it;
  // each replicated table's distinct rows to every other rank, as its copy's flat rows.
  unique_in_order(&routed, layout_.num_keys(), &ann_bits_);
  const int64_t nu = int64_t(routed.size());
  std::vector<int64_t> oc(size_t(W_), 0), rc, rd;
  std::vector<int64_t>& perm = ann_perm_;
  std::vector<int32_t>& owned = ann_owned_;
  perm.resize(static_cast<size_t>(nu));
  owned.resize(static_cast<size_t>(nu));
  if (nu > 0)
    bucketize_by_owner(host, routed.data(), nu, layout_, perm.data(), owned.data(), oc.data());
  send_to_owners(owned.data(), oc.data(), false, &rc, &rd);
  mine.insert(mine.end(), ann_recv_.begin(), ann_recv_.end());
  return mine;  // with repeats (a row asked by several ranks, or a local id listed twice)
}

void EmbeddingCollection::share_replicated(int t, std::vector<int32_t>* keys,
                                           std::vector<int32_t>* mine) {
  // This rank's own copy. Every rank's copy takes the update of the rows any rank's batch
  // touched (the allreduced gradient), so each rank's rows of the table go to every other
  // rank too (send_to_owners), once each.
  const int64_t b = layout_.begin_on(lt_[t], rank_);
  for (int32_t r : *keys) mine->push_back(int32_t(b + r));
  unique_in_order(keys, plan_.tables[t].num_rows, &ann_bits_);
  ann_shared_.insert(ann_shared_.end(), keys->begin(), keys->end());
  ann_shared_n_[size_t(t)] = int64_t(keys->size());
}

void EmbeddingCollection::send_to_owners(const int32_t* owned, const int64_t* counts, bool header,
                                         std::vector<int64_t>* rc, std::vector<int64_t>* rd) {
  const int T = num_tables();
  const size_t W = static_cast<size_t>(W_);
  int64_t nu = 0;
  for (size_t p = 0; p < W; ++p) nu += counts[p];
  const int64_t ns = int64_t(ann_shared_.size());
  std::vector<int64_t> sc(W), sd(W);
  rc->assign(W, 0);
  rd->assign(W, 0);
  std::vector<int32_t>& send = ann_send_;
  send.resize(size_t(nu + (header ? W_ : 0) + (W_ - 1) * ns));
  int64_t at = 0, from = 0;
  for (int p = 0; p < W_; ++p) {
    const int64_t h = counts[p];
    sd[size_t(p)] = at;
    if (header) send[size_t(at++)] = int32_t(h);
    std::copy_n(owned + from, h, send.data() + at);
    at += h;
    from += h;
    if (p != rank_ && ns > 0) {
      const int32_t* x = ann_shared_.data();
      for (int t = 0; t < T; ++t) {
        const int64_t b = layout_.begin_on(lt_[t], p);
        for (int64_t k = 0; k < ann_shared_n_[size_t(t)]; ++k)
          send[size_t(at++)] = int32_t(b + *x++);
      }
    }
    sc[size_t(p)] = at - sd[size_t(p)];
  }
  comm_.exchange_counts(sc.data(), rc->data());
  int64_t nr = 0;
  for (size_t p = 0; p < W; ++p) {
    (*rd)[p] = nr;
    nr += (*rc)[p];
  }
  std::vector<int32_t>& recv = ann_recv_;
  recv.resize(static_cast<size_t>(nr));
  all_to_all_v_on(comm_, Device::kCpu, send.data(), sc.data(), sd.data(), recv.data(), rc->data(),
                  rd->data(), DType::kInt32);
}

bool EmbeddingCollection::routes_ahead() const {
  // On a GPU the lookup's keys are made and exchanged on the device, beside the host's
  // announcements, and node-level de-duplication routes keys through the node.
  return cache_ && ctx_.device == Device::kCpu && any_routed() && !node_dedup_;
}

void EmbeddingCollection::route_ahead(const std::vector<TableIds>& host_ids,
                                      std::vector<int32_t>* mine) {
  const int T = num_tables();
  ExecContext host;
  host.threads = ctx_.threads;
  Routing r;
  if (!spare_routings_.empty()) {
    r = std::move(spare_routings_.back());
    spare_routings_.pop_back();
  } else {
    for (Buffer<int32_t>* b : {&r.keys, &r.unique, &r.send_rows, &r.recv_rows})
      *b = Buffer<int32_t>(Device::kCpu, 0);
    for (Buffer<int64_t>* b : {&r.inverse, &r.perm}) *b = Buffer<int64_t>(Device::kCpu, 0);
  }
  // The batch as lookup_start lays it out: layout order, the routed tables first.
  std::vector<int64_t> off(size_t(T), 0);
  {
    std::vector<int> table_of_layout(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) table_of_layout[size_t(lt_[t])] = t;
    r.n_total = r.n_routed = 0;
    for (int u = 0; u < T; ++u) {
      const int t = table_of_layout[size_t(u)];
      NCF_CHECK(host_ids[t].n >= 0, "embedding announce: table ", plan_.tables[t].name,
                " n=", host_ids[t].n);
      off[size_t(t)] = r.n_total;
      r.n_total += host_ids[t].n;
      if (is_routed(t)) r.n_routed += host_ids[t].n;
    }
  }
  r.keys.reserve(size_t(r.n_total));
  ann_shared_.clear();
  ann_shared_n_.assign(size_t(T), 0);
  for (int t = 0; t < T; ++t) {
    const int64_t n = host_ids[t].n;
    int32_t* keys = r.keys.data() + off[size_t(t)];
    try {
      ids_to_keys(host, host_ids[t].ids, n, is_routed(t) ? layout_.key_begin[lt_[t]] : 0,
                  plan_.tables[t].num_rows, keys);
    } catch (const Error& e) {
      NCF_RETHROW(e, "table ", plan_.tables[t].name);
    }
    if (is_routed(t)) continue;
    ann_keys_.assign(keys, keys + n);
    share_replicated(t, &ann_keys_, mine);
  }
  // What the lookup would do with the routed keys (the same ops on the same host memory).
  const int32_t* travel = r.keys.data();
  r.nu = r.n_routed;
  if (dedup_) {
    r.unique.reserve(size_t(r.n_routed));
    r.inverse.reserve(size_t(r.n_routed));
    unique_ids(host, r.keys.data(), r.n_routed, r.unique.data(), r.inverse.data(), &r.nu,
               layout_.num_keys());
    travel = r.unique.data();
  }
  r.perm.reserve(size_t(r.nu));
  r.send_rows.reserve(size_t(r.nu));
  r.send_counts.assign(size_t(W_), 0);
  bucketize_by_owner(host, travel, r.nu, layout_, r.perm.data(), r.send_rows.data(),
                     r.send_counts.data());
  // To each rank: how many routed rows, those rows, then the replicated tables' rows.
  std::vector<int64_t> rc, rd;
  send_to_owners(r.send_rows.data(), r.send_counts.data(), true, &rc, &rd);
  const std::vector<int32_t>& recv = ann_recv_;
  r.recv_counts.assign(size_t(W_), 0);
  r.nr = 0;
  for (int p = 0; p < W_; ++p) {
    const int64_t h = rc[size_t(p)] > 0 ? recv[size_t(rd[size_t(p)])] : -1;
    NCF_CHECK(h >= 0 && h < rc[size_t(p)], "embedding announce: rank ", p, " sent ", rc[size_t(p)],
              " keys, of which ", h, " routed");
    r.recv_counts[size_t(p)] = h;
    r.nr += h;
  }
  r.recv_rows.reserve(size_t(r.nr));
  int64_t to = 0;
  for (int p = 0; p < W_; ++p) {
    const int32_t* m = recv.data() + rd[size_t(p)] + 1;
    std::copy_n(m, r.recv_counts[size_t(p)], r.recv_rows.data() + to);
    to += r.recv_counts[size_t(p)];
    mine->insert(mine->end(), m, m + rc[size_t(p)] - 1);  // routed, then replicated rows
  }
  routings_.push_back(std::move(r));
}

void EmbeddingCollection::take_routing() {
  NCF_CHECK(!routings_.empty(), "embedding lookup: step ", looked_ - 1,
            " was announced without its keys' routing");
  Routing& r = routings_.front();
  NCF_CHECK(r.n_total == n_total_ && r.n_routed == n_routed_ &&
                std::equal(keys_.data(), keys_.data() + n_total_, r.keys.data()),
            "embedding lookup: step ", looked_ - 1, "'s ids are not the ", r.n_total,
            " announced for it (", n_total_, " ids)");
  std::swap(unique_, r.unique);
  std::swap(inverse_, r.inverse);
  std::swap(perm_, r.perm);
  std::swap(send_rows_, r.send_rows);
  std::swap(recv_rows_, r.recv_rows);
  nu_ = r.nu;
  nr_ = r.nr;
  send_counts_ = r.send_counts;
  recv_counts_ = r.recv_counts;
  int64_t s = 0, v = 0;
  for (int p = 0; p < W_; ++p) {
    send_displs_[size_t(p)] = s;
    recv_displs_[size_t(p)] = v;
    s += send_counts_[size_t(p)];
    v += recv_counts_[size_t(p)];
  }
  ticket_ = 0;
  spare_routings_.push_back(std::move(r));
  routings_.pop_front();
}

void EmbeddingCollection::retire_looked() {
  if (!retire_due_) return;
  cache_->retire(looked_ - 1);
  retire_due_ = false;
}

void EmbeddingCollection::announce(const std::vector<TableIds>& host_ids) {
  if (!cache_) return;
  retire_looked();  // the last step's work is queued before anything announced now
  std::vector<int32_t> rows = owner_rows(host_ids);
  RowCache::Moves& m = moves_;
  m.clear();
  cache_->announce(announced_, std::move(rows), &m);
  ++announced_;
  apply_moves(m, true);
  tier_stream_->copies_done(cache_->loaded_through());
}

void EmbeddingCollection::forget_announced() {
  if (!cache_) return;
  retire_looked();
  cache_->forget_window();  // a staged step's rows stay resident, outside any window
  for (Routing& r : routings_) spare_routings_.push_back(std::move(r));
  routings_.clear();
  staged_ = false;
  step_open_ = false;
  announced_ = looked_;
  tier_stream_->limit(looked_ - 1);  // the step numbers from looked_ on are announced anew
}

bool EmbeddingCollection::stage_step() {
  if (!cache_ || staged_) return false;
  retire_looked();
  if (announced_ == looked_) return false;
  // On a GPU the step's stream waits for the side stream's loads of its rows; where it
  // loads or evicts rows itself, for every copy ordered so far (a row it evicts may be
  // one the side stream is loading for a later step).
  tier_stream_->compute_waits(looked_);
  const int64_t forced = cache_->counters().evicted_in_window;
  RowCache::Moves& m = moves_;
  m.clear();
  cache_->begin(looked_, &m);
  staged_ = true;
  if (!m.empty()) tier_stream_->compute_waits(INT64_MAX);
  if (cache_->counters().evicted_in_window > forced) tier_stream_->limit(looked_);
  apply_moves(m, false);
  return !m.load_rows.empty() || ctx_.device != Device::kCpu;
}

void EmbeddingCollection::begin_lookup() {
  stage_step();
  home_mode_ = !staged_;
  if (home_mode_) {
    // Not announced (an evaluation, a test): the cache goes home, and this lookup and its
    // update read and write the home arrays themselves (on a GPU host memory, over the
    // bus), whatever the batch's size.
    drop_cache();
    return;
  }
  staged_ = false;
  step_open_ = true;
  ++looked_;
  retire_due_ = true;
  cache_dirty_ = true;
}

// ---- moving rows between home and the cache ----------------------------------------

void EmbeddingCollection::move_rows(const ExecContext& c, const int32_t* slots, const int32_t* rows,
                                    int64_t n, bool to_home) {
  if (n == 0) return;
  const int D = plan_.D;
  const int64_t C = cache_->slots();
  struct Array {
    void* home;
    void* cache;
    int width, bytes;
  };
  const Array arrays[] = {
      {params_.data(), cparams_.data(), D, 4},
      {rows16_.data(), crows16_.data(), D, 2},
      {m_.data(), cm_.data(), state_width(1), 4},
      {v_.data(), cv_.data(), D, 4},
  };
  for (const Array& a : arrays) {
    if (!a.home || !a.cache) continue;
    if (to_home)
      copy_rows(c, a.cache, slots, C, a.home, rows, R_, n, a.width, a.bytes);
    else
      copy_rows(c, a.home, rows, R_, a.cache, slots, C, n, a.width, a.bytes);
  }
}

void EmbeddingCollection::apply_moves(const RowCache::Moves& m, bool side) {
  if (m.empty()) return;
  // An announcement's moves wait for the steps enqueued before it: the rows it writes back
  // left the window when the last of those steps retired.
  if (side) tier_stream_->after_compute();
  const ExecContext& c = side ? tier_stream_->ctx() : ctx_;
  const int64_t ne = int64_t(m.evict_slots.size()), nl = int64_t(m.load_rows.size());
  const int32_t* lists[4] = {m.evict_slots.data(), m.evict_rows.data(), m.load_rows.data(),
                             m.load_slots.data()};
  if (ctx_.device != Device::kCpu) {
    // The lists go up on the stream from pageable memory: cudaMemcpyAsync copies such a
    // source into the driver's staging before it returns, without waiting for the stream,
    // so the host goes on announcing while the device runs the steps before. Each stream
    // has its own lists (growing one drains the device first: device.h).
    const size_t total = size_t(2 * ne + 2 * nl);
    Buffer<int32_t>& lists_dev = side ? side_moves_dev_ : moves_dev_;
    lists_dev.reserve(total);
    int32_t* d = lists_dev.data();
    const std::vector<int32_t>* parts[4] = {&m.evict_slots, &m.evict_rows, &m.load_rows,
                                            &m.load_slots};
    int64_t at = 0;
    for (int k = 0; k < 4; ++k) {
      lists[k] = d + at;
      if (!parts[k]->empty())
        device_copy_async(c, ctx_.device, d + at, Device::kCpu, parts[k]->data(),
                          parts[k]->size() * 4);
      at += int64_t(parts[k]->size());
    }
  }
  // Write-backs first: a slot's old row goes home before its new row arrives.
  move_rows(c, lists[0], lists[1], ne, true);
  assign_map(c, slot_map_.data(), lists[1], nullptr, -1, ne, R_);
  move_rows(c, lists[3], lists[2], nl, false);
  assign_map(c, slot_map_.data(), lists[2], lists[3], 0, nl, R_);
}

void EmbeddingCollection::flush_cache() {
  if (!cache_) return;
  tier_stream_->join();  // the side stream's copies are done before the host or a stream reads
  if (!cache_dirty_) return;
  std::vector<int32_t> rows, slots;
  cache_->resident(&rows, &slots);
  const int64_t n = int64_t(rows.size());
  const int32_t* r = rows.data();
  const int32_t* s = slots.data();
  if (ctx_.device != Device::kCpu && n > 0) {
    check_device_errors(ctx_);
    moves_host_.reserve(size_t(2 * n));
    moves_dev_.reserve(size_t(2 * n));
    std::copy(rows.begin(), rows.end(), moves_host_.data());
    std::copy(slots.begin(), slots.end(), moves_host_.data() + n);
    device_copy_async(ctx_, ctx_.device, moves_dev_.data(), Device::kCpu, moves_host_.data(),
                      size_t(2 * n) * 4);
    r = moves_dev_.data();
    s = moves_dev_.data() + n;
  }
  move_rows(ctx_, s, r, n, true);
  if (ctx_.device != Device::kCpu) check_device_errors(ctx_);  // the host reads home next
  cache_dirty_ = false;
}

void EmbeddingCollection::probe_copies(double* in, double* out) {
  *in = *out = 0;
  if (!cache_) return;
  NCF_CHECK(cache_->num_resident() == 0 && announced_ == looked_,
            "host tier: the copy probe needs an empty cache");
  const int64_t row_bytes = cached_row_bytes() - 4;  // the map entry does not travel
  const int64_t n = std::min({cache_->slots(), R_, int64_t{1} << 20,
                              std::max<int64_t>(1, (int64_t{256} << 20) / row_bytes)});
  if (n <= 0) return;
  std::vector<int32_t> idx(size_t(2 * n));
  for (int64_t k = 0; k < n; ++k) idx[size_t(k)] = idx[size_t(n + k)] = int32_t(k);
  const int32_t* rows = idx.data();
  const int32_t* slots = idx.data() + n;
  if (ctx_.device != Device::kCpu) {
    moves_dev_.reserve(idx.size());
    device_copy(ctx_.device, moves_dev_.data(), Device::kCpu, idx.data(), idx.size() * 4);
    rows = moves_dev_.data();
    slots = moves_dev_.data() + n;
  }
  auto timed = [&](bool to_home) {
    if (ctx_.device != Device::kCpu) check_device_errors(ctx_);  // nothing else in the time
    const auto t0 = std::chrono::steady_clock::now();
    move_rows(ctx_, slots, rows, n, to_home);
    if (ctx_.device != Device::kCpu) check_device_errors(ctx_);  // the copy done
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double best_in = 0, best_out = 0;
  for (int k = 0; k < 3; ++k) {
    const double a = timed(false), b = timed(true);  // home -> slots, then back unchanged
    best_in = k ? std::min(best_in, a) : a;
    best_out = k ? std::min(best_out, b) : b;
  }
  const double bytes = double(n) * double(row_bytes);
  *in = best_in > 0 ? bytes / best_in / 1e9 : 0;
  *out = best_out > 0 ? bytes / best_out / 1e9 : 0;
}

// ---- the rows of an op through the cache --------------------------------------------

void EmbeddingCollection::tier_gather(const RowId* ids, int64_t first, int64_t R, int64_t n,
                                      float* out) {
  if (n == 0) return;
  const int D = plan_.D;
  const int64_t C = cache_->slots();
  tslot_.reserve(size_t(n));
  map_rows(ctx_, slot_map_.data() + first, ids, R, n, tslot_.data());
  if (bf16_rows_)
    gather_rows_bf16(ctx_, crows16_.data(), tslot_.data(), out, C, n, D);
  else
    gather_rows(ctx_, cparams_.data(), tslot_.data(), out, C, n, D);
}

// The update of cached FP32 rows: the fused update over the cache, its rows named by slot.
// It sums each row's gradients in input order whatever the row's number, and the
// optimizer's arithmetic does not depend on it: the all-on-device values (a unique row's
// sum is its one gradient row, exactly). BF16 rows take update_rows' compact path, at
// their slots.
void EmbeddingCollection::tier_update_fp32(const RowId* rows, const float* grads, int64_t n,
                                           int64_t first, int64_t count, int64_t t) {
  if (n == 0) return;
  tslot_.reserve(size_t(n));
  map_rows(ctx_, slot_map_.data() + first, rows, count, n, tslot_.data());
  const TableRows cache{cparams_.data(), cm_.size() ? cm_.data() : nullptr,
                        cv_.size() ? cv_.data() : nullptr, cache_->slots(), plan_.D};
  reduce_update_rows(ctx_, tslot_.data(), grads, n, cache, opt_, t);
}

}  // namespace ncf
