// The collectives a rank needs — all-to-all-v for the embedding exchanges, allreduce
// for the dense gradients and eval sums, the count exchange and a barrier — behind one
// interface with three implementations: SingleCommunicator (W = 1, no MPI),
// MpiCommunicator (host buffers) and the NCCL one (device buffers, CUDA builds).
//
// Conventions shared by every implementation:
//  - Data pointers live on device(); counts and displacements are HOST arrays of W
//    entries, in elements (not bytes), because they steer host-side calls.
//  - Calls are collective: every rank makes the same calls in the same order.
//  - On the MPI and single communicators a call has completed when it returns. On
//    NCCL it is enqueued on the communicator's own stream, after the work already on
//    the rank's compute stream (an event), and the compute stream is made to wait for
//    it (another event): later kernels see the result, the host sees it after
//    synchronize(). The *_async variants skip that last wait until join(ticket), so
//    the collective overlaps the compute work issued in between.
//  - Public methods validate their arguments (throwing ncf::Error naming the bad
//    value) and then dispatch once to the implementation's do_* method.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"

namespace ncf {

// kBFloat16: BF16 bit patterns (common/bf16.h), moved by the all-to-alls only;
// no allreduce sums them.
enum class DType { kFloat32, kInt32, kInt64, kFloat64, kUInt8, kBFloat16 };

// Names a collective started by an *_async call; 0 names nothing to wait for.
using CommTicket = int64_t;

size_t dtype_size(DType t);
const char* dtype_name(DType t);

// dtype_of<float>() == DType::kFloat32 etc., so callers need not spell the tag.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kUInt8;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::kBFloat16;
}

// What a rank's collectives did since the communicator started: calls and
// payload bytes this rank sent to other ranks (a ring allreduce counts 2(W-1)/W
// of its buffer), by kind. The step log prints the per-step difference.
// The messages of the count and all-to-all exchanges (both hops of a two-hop one)
// are also split by where their peer is: a message is a non-empty payload to one
// other rank in one exchange (a two-hop exchange's hop-1 counts included), intra
// when the peer is on this rank's node, inter when not. The allreduce is not
// split: how its bytes cross nodes is the MPI or NCCL algorithm's choice.
enum class CollectiveKind { kCounts, kAllToAll, kAllReduce, kOther };
constexpr int kCollectiveKinds = 4;
struct CommCounters {
  int64_t calls[kCollectiveKinds] = {};
  int64_t bytes[kCollectiveKinds] = {};
  int64_t intra_msgs = 0, intra_bytes = 0;  // to ranks of this node
  int64_t inter_msgs = 0, inter_bytes = 0;  // to ranks of other nodes
  int64_t total_calls() const;
  int64_t total_bytes() const;
};

// How all_to_all_v and exchange_counts move data between nodes.
//   kFlat    one message per peer rank: (N-1)·L of a rank's W-1 cross the network.
//   kTwoHop  N nodes of L ranks, numbered node by node (rank = n·L + l). Hop 1,
//            inside the node: rank (n,l) hands local peer (n,j) the blocks it has
//            for (m,j) on every node m (L-1 messages). Hop 2, across nodes: (n,j)
//            sends (m,j) one message holding its node's blocks for (m,j), in
//            source-rank order (N-1 messages). Every block lands where the flat
//            exchange puts it, so the receive buffers are byte-identical to flat.
enum class ExchangeKind { kFlat, kTwoHop };
const char* exchange_name(ExchangeKind k);  // "flat" | "two_hop"

// The groups a two-hop exchange talks in. kNode: the L ranks of this node, in
// local order (index l). kRail: the N ranks with this rank's local index, one per
// node, in node order (index n). kWorld: all W ranks.
enum class CommGroup { kWorld, kNode, kRail };

// Which node each rank is on, nodes numbered in the order of their lowest rank.
// two_hop_unavailable() is "" when the map is N > 1 nodes of the same L > 1 ranks
// numbered node by node, else the reason the exchange must stay flat.
struct NodeMap {
  std::vector<int> node_of;  // [W]
  int nodes() const;
  int ranks_on(int node) const;
  std::string two_hop_unavailable() const;
};
// A map from a list of node identities (any value per rank; equal = same node).
NodeMap node_map_from_ids(const std::vector<int64_t>& node_id);

// A block copy for the exchanges' packing: bytes from src+src_off to dst+dst_off.
struct CopyBlock {
  int64_t dst_off, src_off, bytes;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual const char* name() const = 0;  // "single" | "mpi" | "nccl"
  int rank() const { return rank_; }
  int world() const { return world_; }              // W
  int local_rank() const { return local_rank_; }    // rank among the ranks of this node
  int local_world() const { return local_world_; }  // ranks on this node
  // Where the data buffers of every collective must live.
  virtual Device device() const = 0;

  // Rank r sends send_counts[p] elements starting at send + send_displs[p] to peer p,
  // and receives recv_counts[p] elements from peer p at recv + recv_displs[p].
  // send_counts[p] on rank r must equal recv_counts[r] on rank p (exchange_counts
  // tells each side). Zero counts are allowed; send and recv must not overlap.
  // Flat or two-hop as set_exchange chose; the result is the same either way.
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_displs, DType t);
  // All-to-all of one int64 per peer, host arrays of W entries:
  // recv_counts[p] on rank r = send_counts[r] on rank p. Two-hop like all_to_all_v.
  void exchange_counts(const int64_t* send_counts, int64_t* recv_counts);

  // The nodes (from the launcher's view of shared memory, bootstrap.h).
  const NodeMap& node_map() const { return nodes_; }
  int node() const { return nodes_.node_of[size_t(rank_)]; }
  // Collective (every rank, same k): kTwoHop sets up the node and rail groups and
  // throws, naming the reason, where node_map().two_hop_unavailable() is not "".
  void set_exchange(ExchangeKind k);
  ExchangeKind exchange() const { return exchange_; }
  // Group members (two-hop only for kNode and kRail): size, this rank's index,
  // and the world rank of member i.
  int group_size(CommGroup g) const;
  int group_index(CommGroup g) const;
  int group_rank(CommGroup g, int i) const;
  // all_to_all_v among a group's members (counts and displacements of
  // group_size(g) entries, indexed by member), and exchange_counts of k int64 per
  // member (host arrays of group_size(g)·k). Node-level de-duplication talks in
  // these; they count like the world calls.
  void group_all_to_all_v(CommGroup g, const void* send, const int64_t* send_counts,
                          const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                          const int64_t* recv_displs, DType t);
  void group_exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k);
  // Hop 1's sizes for send counts send_counts [W] (two-hop only; collective over
  // the node): element i·N + m of the result is what local rank i sends to rank
  // (m, this rank's local index). Valid until the next exchange.
  const std::vector<int64_t>& hop1_counts(const int64_t* send_counts);
  // In place: buf[i] = sum over ranks of buf[i]. For a fixed W and implementation the
  // float result is reproducible run to run and identical on every rank (see the
  // implementation notes); it does depend on W, like any change of summation order.
  void all_reduce_sum(void* buf, size_t n, DType t);
  // The same collectives, started: on a stream-ordered communicator (NCCL) the
  // compute stream does not wait for the result until join(ticket), so work issued
  // in between overlaps the transfer. Until then the compute stream must not write
  // the input nor touch the output. Host communicators complete the call before
  // returning and hand back ticket 0.
  CommTicket all_to_all_v_async(const void* send, const int64_t* send_counts,
                                const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                                const int64_t* recv_displs, DType t);
  CommTicket all_reduce_sum_async(void* buf, size_t n, DType t);
  // Makes the compute stream wait (on the device; the host goes on) for the
  // collective `ticket` and every collective started before it. No-op for 0.
  virtual void join(CommTicket ticket) { (void)ticket; }
  // Returns once every rank has entered it (after this rank's queued work finished).
  void barrier();
  // Waits until the collectives issued so far have completed (no-op on host).
  virtual void synchronize() {}
  // all_to_all_v of HOST buffers on a communicator whose device() is a GPU, moved by the
  // host beside it (NCCL: over its MPI communicator, one message per peer) and complete on
  // return, without waiting for the device's queued work as a staged call does. False,
  // having done nothing, where there is no such path (a host communicator, W = 1, the
  // two-hop exchange, or a count or displacement past MPI's int): the caller stages.
  // Counted like all_to_all_v. The *_on helpers take it for host buffers.
  bool host_all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                         void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                         DType t);

  const CommCounters& counters() const { return counters_; }

  // Page-locked host memory (two slots, grow-only) through which the *_on helpers
  // stage device buffers for a host communicator.
  void* host_staging(int slot, size_t bytes);
  // Memory on device() (two slots, grow-only: the same pointer while `bytes` does not
  // exceed what a slot already holds) through which the *_on helpers stage host
  // buffers for a device communicator, so a staged call allocates nothing in the
  // steady state. The caller must know that no queued work still uses the slot.
  void* device_staging(int slot, size_t bytes);

 protected:
  Communicator(int rank, int world, int local_rank, int local_world);

  // True inside an *_async call: a stream-ordered implementation skips making the
  // compute stream wait and stores the collective's ticket in last_ticket_.
  bool deferred() const { return deferred_; }
  CommTicket last_ticket_ = 0;

  virtual void do_all_to_all_v(const void* send, const int64_t* send_counts,
                               const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                               const int64_t* recv_displs, DType t) = 0;
  virtual void do_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) = 0;
  virtual void do_all_reduce_sum(void* buf, size_t n, DType t) = 0;
  virtual void do_barrier() = 0;
  // host_all_to_all_v's path, where the implementation has one (counts and displacements
  // known to fit an int).
  virtual bool has_host_all_to_all_v() const { return false; }
  virtual void do_host_all_to_all_v(const void* send, const int64_t* send_counts,
                                    const int64_t* send_displs, void* recv,
                                    const int64_t* recv_counts, const int64_t* recv_displs,
                                    DType t);

  // The node map the implementation was started with (its constructor calls it;
  // W entries).
  void set_node_map(const NodeMap& m);
  // Two-hop support. do_setup_groups builds the kNode and kRail groups
  // (collective); do_group_* act within one, enqueued like do_all_to_all_v but
  // without the begin/end of a collective, which exchange_begin/exchange_end put
  // around a whole exchange (a stream-ordered implementation orders it with the
  // compute stream there and issues its ticket). do_copy_blocks copies within
  // buffers on device(), ordered with the group calls.
  virtual void do_setup_groups();
  virtual void do_group_all_to_all_v(CommGroup g, const void* send, const int64_t* send_counts,
                                     const int64_t* send_displs, void* recv,
                                     const int64_t* recv_counts, const int64_t* recv_displs,
                                     DType t);
  virtual void do_group_exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k);
  virtual void do_copy_blocks(void* dst, const void* src, const CopyBlock* blocks, int64_t n);
  virtual void exchange_begin() {}
  virtual void exchange_end() {}

 private:
  void count(CollectiveKind k, int64_t bytes);
  // One payload to world rank `peer` (self and empty ones are not messages).
  void count_message(int peer, int64_t bytes);
  // A flat all-to-all-v's messages and bytes (all_to_all_v, host_all_to_all_v).
  void count_flat_all_to_all_v(const int64_t* send_counts, DType t);
  void two_hop_all_to_all_v(const void* send, const int64_t* send_counts,
                            const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                            const int64_t* recv_displs, DType t);
  void two_hop_exchange_counts(const int64_t* send_counts, int64_t* recv_counts);
  void* scratch(int slot, size_t bytes);
  CommCounters counters_;
  int rank_, world_, local_rank_, local_world_;
  bool deferred_ = false;
  PinnedBuffer<char> staging_[2];
  Buffer<char> device_staging_[2];
  NodeMap nodes_;
  ExchangeKind exchange_ = ExchangeKind::kFlat;
  int N_ = 1, L_ = 1;        // two-hop: nodes, ranks per node
  Buffer<char> scratch_[3];  // two-hop packing, on device()
  std::vector<int64_t> h1s_, h1r_, h2s_, ac_, ad_, bc_, bd_, cc_, cd_, xc_, xd_, xat_;
  std::vector<CopyBlock> blocks_, own_;
};

// The collectives for buffers that live on `buf_device`, which may differ from
// comm.device() (MPI between GPU ranks, host scalars under NCCL): the data is
// staged through pinned host memory (comm.host_staging) or a buffer on the
// communicator's device (comm.device_staging), and the call completes before
// returning. Otherwise the direct call. With a non-null `ticket` the direct call
// is the *_async variant and *ticket names it (0 when staged: already complete).
void all_reduce_sum_on(Communicator& comm, Device buf_device, void* buf, size_t n, DType t,
                       CommTicket* ticket = nullptr);
// Every rank's values (the same count k on every rank), in rank order, on every rank:
// rank p's at [p * k, (p + 1) * k). A collective in host memory: each rank's values in
// its own slots of one array, summed over the ranks, so each arrives exactly.
template <typename T>
std::vector<T> gather_all(Communicator& comm, const std::vector<T>& mine) {
  const size_t k = mine.size();
  std::vector<T> all(k * size_t(comm.world()), T(0));
  std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(k * size_t(comm.rank())));
  all_reduce_sum_on(comm, Device::kCpu, all.data(), all.size(), dtype_of<T>());
  return all;
}
void all_to_all_v_on(Communicator& comm, Device buf_device, const void* send,
                     const int64_t* send_counts, const int64_t* send_displs, void* recv,
                     const int64_t* recv_counts, const int64_t* recv_displs, DType t,
                     CommTicket* ticket = nullptr);
// group_all_to_all_v for buffers on buf_device, staged like all_to_all_v_on;
// completes (on a stream-ordered communicator: the compute stream waits for it).
void group_all_to_all_v_on(Communicator& comm, CommGroup g, Device buf_device, const void* send,
                           const int64_t* send_counts, const int64_t* send_displs, void* recv,
                           const int64_t* recv_counts, const int64_t* recv_displs, DType t);

}  // namespace ncf
