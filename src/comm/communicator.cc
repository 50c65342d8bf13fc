// Argument checks shared by every Communicator, done once here so that the MPI,
// NCCL and single implementations only move data.
#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "comm/collective_watch.h"
#include "comm/copy_blocks.h"
#include "common/check.h"

namespace ncf {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kFloat64:
      return 8;
    case DType::kUInt8:
      return 1;
    case DType::kBFloat16:
      return 2;
  }
  NCF_CHECK(false, "unknown DType ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat64:
      return "float64";
    case DType::kUInt8:
      return "uint8";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

const char* exchange_name(ExchangeKind k) {
  return k == ExchangeKind::kTwoHop ? "two_hop" : "flat";
}

int NodeMap::nodes() const {
  int n = 0;
  for (int x : node_of) n = std::max(n, x + 1);
  return n;
}

int NodeMap::ranks_on(int node) const {
  return int(std::count(node_of.begin(), node_of.end(), node));
}

std::string NodeMap::two_hop_unavailable() const {
  const int N = nodes(), W = int(node_of.size());
  if (N <= 1) return "one node";
  const int L = ranks_on(0);
  for (int n = 1; n < N; ++n)
    if (ranks_on(n) != L)
      return "unequal ranks per node (node 0 has " + std::to_string(L) + ", node " +
             std::to_string(n) + " has " + std::to_string(ranks_on(n)) + ")";
  if (L == 1) return "one rank per node (flat already sends one message per remote node)";
  for (int r = 0; r < W; ++r)
    if (node_of[size_t(r)] != r / L)
      return "ranks are not numbered node by node (rank " + std::to_string(r) + " is on node " +
             std::to_string(node_of[size_t(r)]) + ", not " + std::to_string(r / L) +
             "; launch with a by-node block mapping, e.g. mpirun --map-by core)";
  return "";
}

NodeMap node_map_from_ids(const std::vector<int64_t>& node_id) {
  NodeMap m;
  std::vector<int64_t> seen;
  for (int64_t id : node_id) {
    auto it = std::find(seen.begin(), seen.end(), id);
    if (it == seen.end()) {
      seen.push_back(id);
      it = seen.end() - 1;
    }
    m.node_of.push_back(int(it - seen.begin()));
  }
  return m;
}

Communicator::Communicator(int rank, int world, int local_rank, int local_world)
    : rank_(rank), world_(world), local_rank_(local_rank), local_world_(local_world) {
  NCF_CHECK(world >= 1 && rank >= 0 && rank < world, "bad rank ", rank, " of world ", world);
  NCF_CHECK(local_world >= 1 && local_rank >= 0 && local_rank < local_world, "bad local rank ",
            local_rank, " of local world ", local_world);
  nodes_.node_of.assign(size_t(world), 0);
}

void Communicator::set_node_map(const NodeMap& m) {
  if (m.node_of.empty()) return;  // no map: one node
  NCF_CHECK(int(m.node_of.size()) == world_, "node map of ", m.node_of.size(),
            " ranks for W = ", world_);
  for (int x : m.node_of) NCF_CHECK(x >= 0 && x < world_, "node map: node ", x);
  nodes_ = m;
}

void Communicator::set_exchange(ExchangeKind k) {
  if (k == exchange_) return;
  if (k == ExchangeKind::kTwoHop) {
    const std::string why = nodes_.two_hop_unavailable();
    NCF_CHECK(why.empty(), "two-hop exchange impossible: ", why);
    N_ = nodes_.nodes();
    L_ = world_ / N_;
    do_setup_groups();
  }
  exchange_ = k;
}

int Communicator::group_size(CommGroup g) const {
  switch (g) {
    case CommGroup::kWorld:
      return world_;
    case CommGroup::kNode:
      return L_;
    case CommGroup::kRail:
      return N_;
  }
  return 0;
}

int Communicator::group_index(CommGroup g) const {
  switch (g) {
    case CommGroup::kWorld:
      return rank_;
    case CommGroup::kNode:
      return rank_ % L_;
    case CommGroup::kRail:
      return rank_ / L_;
  }
  return 0;
}

int Communicator::group_rank(CommGroup g, int i) const {
  switch (g) {
    case CommGroup::kWorld:
      return i;
    case CommGroup::kNode:
      return (rank_ / L_) * L_ + i;
    case CommGroup::kRail:
      return i * L_ + rank_ % L_;
  }
  return 0;
}

// The exchange choice never gives a communicator what it lacks: reaching these is a bug.
void Communicator::do_setup_groups() {
  NCF_CHECK(false, name(), " communicator has no two-hop exchange");
}

void Communicator::do_group_all_to_all_v(CommGroup, const void*, const int64_t*, const int64_t*,
                                         void*, const int64_t*, const int64_t*, DType) {
  NCF_CHECK(false, name(), " communicator has no group exchange");
}

void Communicator::do_group_exchange_counts(CommGroup, const int64_t*, int64_t*, int) {
  NCF_CHECK(false, name(), " communicator has no group exchange");
}

void Communicator::do_copy_blocks(void* dst, const void* src, const CopyBlock* blocks, int64_t n) {
  NCF_CHECK(device() == Device::kCpu, name(), " communicator copies blocks on ",
            device_name(device()), " without a device copy");
  copy_blocks_host(dst, src, blocks, n);
}

namespace {

// Counts and displacements come from bucketing code; a negative one is a bug there,
// and passing it on would let MPI or NCCL read or write outside the buffers.
void check_layout(const char* side, const int64_t* counts, const int64_t* displs, int W,
                  const void* data) {
  NCF_CHECK(counts != nullptr && displs != nullptr, "all_to_all_v: null ", side,
            " counts or displacements");
  for (int p = 0; p < W; ++p) {
    NCF_CHECK(counts[p] >= 0, "all_to_all_v: ", side, "_counts[", p, "] = ", counts[p],
              " is negative");
    NCF_CHECK(displs[p] >= 0, "all_to_all_v: ", side, "_displs[", p, "] = ", displs[p],
              " is negative");
    NCF_CHECK(counts[p] == 0 || data != nullptr, "all_to_all_v: ", side, "_counts[", p,
              "] = ", counts[p], " but the ", side, " buffer is null");
  }
}

}  // namespace

void Communicator::all_to_all_v(const void* send, const int64_t* send_counts,
                                const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                                const int64_t* recv_displs, DType t) {
  CollectiveWatch watch("all_to_all_v");
  check_layout("send", send_counts, send_displs, world_, send);
  check_layout("recv", recv_counts, recv_displs, world_, recv);
  if (exchange_ == ExchangeKind::kTwoHop) {
    two_hop_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    return;
  }
  count_flat_all_to_all_v(send_counts, t);
  do_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
}

void Communicator::count_flat_all_to_all_v(const int64_t* send_counts, DType t) {
  const int64_t es = int64_t(dtype_size(t));
  int64_t out = 0;
  for (int p = 0; p < world_; ++p)
    if (p != rank_) {
      out += send_counts[p];
      count_message(p, send_counts[p] * es);
    }
  count(CollectiveKind::kAllToAll, out * es);
}

bool Communicator::host_all_to_all_v(const void* send, const int64_t* send_counts,
                                     const int64_t* send_displs, void* recv,
                                     const int64_t* recv_counts, const int64_t* recv_displs,
                                     DType t) {
  if (!has_host_all_to_all_v() || world_ == 1 || exchange_ == ExchangeKind::kTwoHop) return false;
  const int64_t* arrays[4] = {send_counts, send_displs, recv_counts, recv_displs};
  for (const int64_t* a : arrays)
    for (int p = 0; p < world_; ++p)
      if (a[p] > INT32_MAX) return false;
  CollectiveWatch watch("all_to_all_v (host)");
  check_layout("send", send_counts, send_displs, world_, send);
  check_layout("recv", recv_counts, recv_displs, world_, recv);
  count_flat_all_to_all_v(send_counts, t);
  do_host_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  return true;
}

void Communicator::do_host_all_to_all_v(const void*, const int64_t*, const int64_t*, void*,
                                        const int64_t*, const int64_t*, DType) {
  NCF_CHECK(false, "host_all_to_all_v: ", name(), " has no host path");
}

void Communicator::group_all_to_all_v(CommGroup g, const void* send, const int64_t* send_counts,
                                      const int64_t* send_displs, void* recv,
                                      const int64_t* recv_counts, const int64_t* recv_displs,
                                      DType t) {
  CollectiveWatch watch("all_to_all_v (group)");
  NCF_CHECK(g == CommGroup::kWorld || exchange_ == ExchangeKind::kTwoHop,
            "group_all_to_all_v: node and rail groups need the two-hop exchange");
  const int G = group_size(g), me = group_index(g);
  check_layout("send", send_counts, send_displs, G, send);
  check_layout("recv", recv_counts, recv_displs, G, recv);
  const int64_t es = int64_t(dtype_size(t));
  int64_t out = 0;
  for (int i = 0; i < G; ++i)
    if (i != me) {
      out += send_counts[i];
      count_message(group_rank(g, i), send_counts[i] * es);
    }
  count(CollectiveKind::kAllToAll, out * es);
  if (g == CommGroup::kWorld) {
    do_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    return;
  }
  exchange_begin();
  do_group_all_to_all_v(g, send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  exchange_end();
}

void Communicator::group_exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k) {
  CollectiveWatch watch("exchange_counts (group)");
  NCF_CHECK(g != CommGroup::kWorld && exchange_ == ExchangeKind::kTwoHop,
            "group_exchange_counts: node and rail groups need the two-hop exchange");
  NCF_CHECK(send != nullptr && recv != nullptr && k >= 1, "group_exchange_counts: k = ", k);
  const int G = group_size(g), me = group_index(g);
  for (int i = 0; i < G * k; ++i)
    NCF_CHECK(send[i] >= 0, "group_exchange_counts: send[", i, "] = ", send[i], " is negative");
  for (int i = 0; i < G; ++i)
    if (i != me) count_message(group_rank(g, i), int64_t(k) * 8);
  count(CollectiveKind::kCounts, int64_t(G - 1) * k * 8);
  do_group_exchange_counts(g, send, recv, k);
}

void* Communicator::scratch(int slot, size_t bytes) {
  Buffer<char>& b = scratch_[slot];
  if (!b.placed() || b.device() != device()) b = Buffer<char>(device(), 0);
  b.reserve(std::max<size_t>(bytes, 1));
  return b.data();
}

const std::vector<int64_t>& Communicator::hop1_counts(const int64_t* send_counts) {
  NCF_CHECK(exchange_ == ExchangeKind::kTwoHop, "hop1_counts needs the two-hop exchange");
  const int N = N_, L = L_;
  // Local peer j gets N counts, what this rank sends to (m, j) for every node m;
  // h1r_[i·N + m] is then what (n, i) sends to (m, l).
  h1s_.resize(size_t(L) * N);
  h1r_.resize(size_t(L) * N);
  for (int j = 0; j < L; ++j)
    for (int m = 0; m < N; ++m) h1s_[size_t(j) * N + m] = send_counts[m * L + j];
  group_exchange_counts(CommGroup::kNode, h1s_.data(), h1r_.data(), N);
  return h1r_;
}

void Communicator::two_hop_all_to_all_v(const void* send, const int64_t* sc, const int64_t* sd,
                                        void* recv, const int64_t* rc, const int64_t* rd, DType t) {
  const int N = N_, L = L_, n = rank_ / L, l = rank_ % L;
  const int64_t es = int64_t(dtype_size(t));
  hop1_counts(sc);
  for (auto* v : {&ac_, &ad_, &bc_, &bd_}) v->assign(size_t(L), 0);
  for (auto* v : {&cc_, &cd_, &xc_, &xd_}) v->assign(size_t(N), 0);
  // A: hop 1's send buffer, [peer j][node m]; B: its receive buffer, [source i][node m];
  // C: hop 2's send buffer, [node m][source i], with this node's own blocks left out
  // (they go straight to recv); X: hop 2's receive layout, [node m][source i].
  int64_t a = 0, b = 0, c = 0;
  for (int j = 0; j < L; ++j) {
    ad_[size_t(j)] = a;
    bd_[size_t(j)] = b;
    for (int m = 0; m < N; ++m) {
      ac_[size_t(j)] += sc[m * L + j];
      bc_[size_t(j)] += h1r_[size_t(j) * N + m];
    }
    a += ac_[size_t(j)];
    b += bc_[size_t(j)];
  }
  bool direct = true;  // each node's blocks contiguous and in order in recv
  int64_t x = 0;
  for (int m = 0; m < N; ++m) {
    cd_[size_t(m)] = c;
    xd_[size_t(m)] = m == n ? 0 : rd[m * L];
    if (m != n)
      for (int i = 0; i < L; ++i) {
        cc_[size_t(m)] += h1r_[size_t(i) * N + m];
        xc_[size_t(m)] += rc[m * L + i];
        if (i > 0 && rd[m * L + i] != rd[m * L + i - 1] + rc[m * L + i - 1]) direct = false;
      }
    c += cc_[size_t(m)];
  }
  if (!direct)
    for (int m = 0; m < N; ++m) {
      xd_[size_t(m)] = x;
      x += xc_[size_t(m)];
    }
  // What this rank sends, for the counters: hop 1 to the local peers, hop 2 to
  // the rail's ranks on other nodes.
  int64_t out = 0;
  for (int j = 0; j < L; ++j)
    if (j != l) {
      out += ac_[size_t(j)];
      count_message(group_rank(CommGroup::kNode, j), ac_[size_t(j)] * es);
    }
  for (int m = 0; m < N; ++m)
    if (m != n) {
      out += cc_[size_t(m)];
      count_message(group_rank(CommGroup::kRail, m), cc_[size_t(m)] * es);
    }
  count(CollectiveKind::kAllToAll, out * es);

  // X reuses A's slot: hop 1 is done with A when hop 2 writes X.
  char* A = static_cast<char*>(scratch(0, size_t(std::max(a, x) * es)));
  char* B = static_cast<char*>(scratch(1, size_t(b * es)));
  char* C = static_cast<char*>(scratch(2, size_t(c * es)));
  char* X = direct ? static_cast<char*>(recv) : A;
  exchange_begin();
  // Pack: send's blocks into A, peer-major.
  blocks_.clear();
  for (int j = 0; j < L; ++j) {
    int64_t at = ad_[size_t(j)];
    for (int m = 0; m < N; ++m) {
      const int64_t k = sc[m * L + j];
      blocks_.push_back({at * es, sd[m * L + j] * es, k * es});
      at += k;
    }
  }
  do_copy_blocks(A, send, blocks_.data(), int64_t(blocks_.size()));
  do_group_all_to_all_v(CommGroup::kNode, A, ac_.data(), ad_.data(), B, bc_.data(), bd_.data(), t);
  // Regroup by destination node; this node's blocks are final.
  blocks_.clear();
  own_.clear();
  std::vector<int64_t>& at = xat_;
  at = cd_;
  for (int i = 0; i < L; ++i) {
    int64_t from = bd_[size_t(i)];
    for (int m = 0; m < N; ++m) {
      const int64_t k = h1r_[size_t(i) * N + m];
      if (m == n) {
        NCF_CHECK(k == rc[n * L + i], "all_to_all_v (two-hop): rank ", n * L + i, " sends ", k,
                  " elements to rank ", rank_, ", which expects ", rc[n * L + i]);
        own_.push_back({rd[n * L + i] * es, from * es, k * es});
      } else {
        blocks_.push_back({at[size_t(m)] * es, from * es, k * es});
        at[size_t(m)] += k;
      }
      from += k;
    }
  }
  do_copy_blocks(recv, B, own_.data(), int64_t(own_.size()));
  do_copy_blocks(C, B, blocks_.data(), int64_t(blocks_.size()));
  do_group_all_to_all_v(CommGroup::kRail, C, cc_.data(), cd_.data(), X, xc_.data(), xd_.data(), t);
  if (!direct) {
    blocks_.clear();
    for (int m = 0; m < N; ++m) {
      if (m == n) continue;
      int64_t from = xd_[size_t(m)];
      for (int i = 0; i < L; ++i) {
        blocks_.push_back({rd[m * L + i] * es, from * es, rc[m * L + i] * es});
        from += rc[m * L + i];
      }
    }
    do_copy_blocks(recv, X, blocks_.data(), int64_t(blocks_.size()));
  }
  exchange_end();
}

void Communicator::two_hop_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) {
  const int N = N_, L = L_;
  // Hop 1 as in all_to_all_v. Hop 2: rail peer m gets the L values h1r_ holds for
  // (m, l); what arrives from node m is recv_counts[m·L + i].
  hop1_counts(send_counts);
  h2s_.resize(size_t(N) * L);
  for (int m = 0; m < N; ++m)
    for (int i = 0; i < L; ++i) h2s_[size_t(m) * L + i] = h1r_[size_t(i) * N + m];
  group_exchange_counts(CommGroup::kRail, h2s_.data(), recv_counts, L);
}

void Communicator::exchange_counts(const int64_t* send_counts, int64_t* recv_counts) {
  CollectiveWatch watch("exchange_counts");
  NCF_CHECK(send_counts != nullptr && recv_counts != nullptr, "exchange_counts: null array");
  for (int p = 0; p < world_; ++p)
    NCF_CHECK(send_counts[p] >= 0, "exchange_counts: send_counts[", p, "] = ", send_counts[p],
              " is negative");
  if (exchange_ == ExchangeKind::kTwoHop) {
    two_hop_exchange_counts(send_counts, recv_counts);
    return;
  }
  for (int p = 0; p < world_; ++p)
    if (p != rank_) count_message(p, 8);
  count(CollectiveKind::kCounts, int64_t(world_ - 1) * 8);
  do_exchange_counts(send_counts, recv_counts);
}

void Communicator::all_reduce_sum(void* buf, size_t n, DType t) {
  CollectiveWatch watch("all_reduce_sum");
  if (n == 0) return;
  NCF_CHECK(buf != nullptr, "all_reduce_sum: null buffer for ", n, " elements");
  NCF_CHECK(t != DType::kBFloat16, "all_reduce_sum: ", dtype_name(t),
            " payloads are moved, never summed");
  // A ring allreduce sends 2(W-1)/W of the buffer from every rank.
  count(CollectiveKind::kAllReduce,
        int64_t(n * dtype_size(t)) * 2 * (world_ - 1) / std::max(1, world_));
  do_all_reduce_sum(buf, n, t);
}

void Communicator::barrier() {
  CollectiveWatch watch("barrier");
  count(CollectiveKind::kOther, 0);
  do_barrier();
}

void Communicator::count(CollectiveKind k, int64_t bytes) {
  ++counters_.calls[int(k)];
  counters_.bytes[int(k)] += bytes;
}

void Communicator::count_message(int peer, int64_t bytes) {
  if (peer == rank_ || bytes <= 0) return;
  if (nodes_.node_of[size_t(peer)] == nodes_.node_of[size_t(rank_)]) {
    ++counters_.intra_msgs;
    counters_.intra_bytes += bytes;
  } else {
    ++counters_.inter_msgs;
    counters_.inter_bytes += bytes;
  }
}

int64_t CommCounters::total_calls() const {
  int64_t c = 0;
  for (int64_t x : calls) c += x;
  return c;
}

int64_t CommCounters::total_bytes() const {
  int64_t b = 0;
  for (int64_t x : bytes) b += x;
  return b;
}

void* Communicator::host_staging(int slot, size_t bytes) {
  NCF_CHECK(slot == 0 || slot == 1, "host_staging: slot ", slot, " (0 or 1)");
  staging_[slot].reserve(std::max<size_t>(bytes, 1));
  return staging_[slot].data();
}

void* Communicator::device_staging(int slot, size_t bytes) {
  NCF_CHECK(slot == 0 || slot == 1, "device_staging: slot ", slot, " (0 or 1)");
  Buffer<char>& b = device_staging_[slot];
  if (!b.placed() || b.device() != device()) b = Buffer<char>(device(), 0);
  b.reserve(std::max<size_t>(bytes, 1));
  return b.data();
}

namespace {
// Sets the deferred flag for one call, also when the call throws.
struct DeferScope {
  bool& flag;
  explicit DeferScope(bool& f) : flag(f) { flag = true; }
  ~DeferScope() { flag = false; }
};
}  // namespace

CommTicket Communicator::all_to_all_v_async(const void* send, const int64_t* send_counts,
                                            const int64_t* send_displs, void* recv,
                                            const int64_t* recv_counts, const int64_t* recv_displs,
                                            DType t) {
  last_ticket_ = 0;
  DeferScope d(deferred_);
  all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  return last_ticket_;
}

CommTicket Communicator::all_reduce_sum_async(void* buf, size_t n, DType t) {
  last_ticket_ = 0;
  DeferScope d(deferred_);
  all_reduce_sum(buf, n, t);
  return last_ticket_;
}

void all_reduce_sum_on(Communicator& comm, Device buf_device, void* buf, size_t n, DType t,
                       CommTicket* ticket) {
  if (ticket) *ticket = 0;
  if (buf_device == comm.device()) {
    if (ticket)
      *ticket = comm.all_reduce_sum_async(buf, n, t);
    else
      comm.all_reduce_sum(buf, n, t);
    return;
  }
  const size_t bytes = n * dtype_size(t);
  if (comm.device() == Device::kCpu) {
    // Device data, host communicator: through pinned memory (DMA copies).
    void* stage = comm.host_staging(0, bytes);
    device_copy(Device::kCpu, stage, buf_device, buf, bytes);
    comm.all_reduce_sum(stage, n, t);
    device_copy(buf_device, buf, Device::kCpu, stage, bytes);
    return;
  }
  // Host data, device communicator (scalars under NCCL): through device staging.
  // Every use of the slot has finished when this returns (synchronize, then a
  // blocking copy), so the next call may reuse it.
  void* stage = comm.device_staging(0, bytes);
  device_copy(comm.device(), stage, buf_device, buf, bytes);
  comm.all_reduce_sum(stage, n, t);
  comm.synchronize();
  device_copy(buf_device, buf, comm.device(), stage, bytes);
}

namespace {

// The staged path of *_on: buffers on buf_device, the communicator on another
// device. Staged buffers span [0, max(displ + count)) on each side.
void staged_all_to_all_v(Communicator& comm, CommGroup g, Device buf_device, const void* send,
                         const int64_t* send_counts, const int64_t* send_displs, void* recv,
                         const int64_t* recv_counts, const int64_t* recv_displs, DType t) {
  const int G = comm.group_size(g);
  int64_t send_n = 0, recv_n = 0;
  for (int p = 0; p < G; ++p) {
    send_n = std::max(send_n, send_displs[p] + send_counts[p]);
    recv_n = std::max(recv_n, recv_displs[p] + recv_counts[p]);
  }
  const size_t es = dtype_size(t);
  const size_t sb = size_t(send_n) * es, rb = size_t(recv_n) * es;
  auto call = [&](const void* s, void* r) {
    if (g == CommGroup::kWorld)
      comm.all_to_all_v(s, send_counts, send_displs, r, recv_counts, recv_displs, t);
    else
      comm.group_all_to_all_v(g, s, send_counts, send_displs, r, recv_counts, recv_displs, t);
  };
  if (comm.device() == Device::kCpu) {
    // Device data, host communicator (GPU ranks sharing a GPU): pinned staging.
    void* s = comm.host_staging(0, sb);
    void* r = comm.host_staging(1, rb);
    device_copy(Device::kCpu, s, buf_device, send, sb);
    call(s, r);
    device_copy(buf_device, recv, Device::kCpu, r, rb);
    return;
  }
  // Host data, device communicator: by the host where the communicator can (no wait for
  // the device's queued work), else through device staging.
  if (g == CommGroup::kWorld && buf_device == Device::kCpu &&
      comm.host_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t))
    return;
  void* s = comm.device_staging(0, sb);
  void* r = comm.device_staging(1, rb);
  device_copy(comm.device(), s, buf_device, send, sb);
  call(s, r);
  comm.synchronize();
  device_copy(buf_device, recv, comm.device(), r, rb);
}

}  // namespace

void all_to_all_v_on(Communicator& comm, Device buf_device, const void* send,
                     const int64_t* send_counts, const int64_t* send_displs, void* recv,
                     const int64_t* recv_counts, const int64_t* recv_displs, DType t,
                     CommTicket* ticket) {
  if (ticket) *ticket = 0;
  if (buf_device == comm.device()) {
    if (ticket)
      *ticket = comm.all_to_all_v_async(send, send_counts, send_displs, recv, recv_counts,
                                        recv_displs, t);
    else
      comm.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    return;
  }
  staged_all_to_all_v(comm, CommGroup::kWorld, buf_device, send, send_counts, send_displs, recv,
                      recv_counts, recv_displs, t);
}

void group_all_to_all_v_on(Communicator& comm, CommGroup g, Device buf_device, const void* send,
                           const int64_t* send_counts, const int64_t* send_displs, void* recv,
                           const int64_t* recv_counts, const int64_t* recv_displs, DType t) {
  if (buf_device == comm.device()) {
    comm.group_all_to_all_v(g, send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    return;
  }
  staged_all_to_all_v(comm, g, buf_device, send, send_counts, send_displs, recv, recv_counts,
                      recv_displs, t);
}

}  // namespace ncf
