// The two-level cost model of the embedding exchange across nodes: what one
// rank pays per step for the flat all-to-all and for the two-hop exchange
// (with and without node-level de-duplication) on links described by
// LinkLevels, the --topology parser that fills them, and the choice that
// --exchange auto and --dedup node make from it. Pure functions of sizes and
// flags, so every rank takes the same decision; docs/comm_cost_model.md
// derives the formulas and launch/comm_model.py computes the same ones.
//
// W = N·L ranks, rank = n·L + l. A rank sends k keys per step (all routed
// tables, after rank-level dedup), k/W of them to each rank by uniform
// ownership. Each step makes four exchanges: counts (8 B per peer), ids
// (4 B per key), vectors (4D B per key, from owners; 2D with BF16 payloads)
// and gradients (the same); by symmetry a rank sends in each as much as it receives. Per exchange:
//
//   flat     intra: L−1 messages, (L−1)·k/W keys   inter: (N−1)·L messages, (N−1)·k/N keys
//            t = max(a_i·(L−1) + B_intra/b_i, a_e·(N−1)·L + B_inter/b_e)      (in parallel)
//   two-hop  hop 1: L−1 messages, (L−1)·k/L keys   hop 2: N−1 messages, s·(N−1)·k/N keys
//            t = a_i·(L−1) + B_hop1/b_i + a_e·(N−1) + B_hop2/b_e             (one after the other)
//
// with a_i, b_i the intra-node per-message time and bandwidth, a_e the
// inter-node per-message time, b_e = inter_bw · min(1, nics_per_node / L) the
// NIC share of one rank, and s the node's unique share with node dedup (1
// without). Counts: 8 B per flat peer; 8·N B per hop-1 peer, 8·L B per hop-2
// peer. The step's time is the sum over the four exchanges.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ncf {

// The links one rank sees.
struct LinkLevels {
  double intra_bw = 0;    // bytes/s one rank sends to its node's peers (NVLink, shared memory)
  double intra_lat = 0;   // seconds per message inside a node
  double inter_bw = 0;    // bytes/s of one NIC across nodes
  double inter_lat = 0;   // seconds per message across nodes
  int nics_per_node = 1;  // rails; the node's ranks share them, one rank uses at most one
  // Nodes declared instead of the ones MPI finds: ranks r·L .. r·L + L − 1 form
  // node r (0: MPI's nodes). What the exchanges, node dedup and this model take
  // for nodes; GPU choice and CPU shares still follow the real hosts.
  int ranks_per_node = 0;
  std::string source;  // where the figures come from: defaults, file, flag
};

// CPU ranks: shared memory inside a node, one 10 Gb/s Ethernet port per node.
// CUDA ranks: 8xH100 nodes, NVLink (NCCL all-to-all bus bandwidth) and one NDR
// 400 Gb/s NIC per GPU. Per-message times are assumptions (docs/comm_cost_model.md).
LinkLevels default_links(bool cuda);

// --topology: empty (the defaults), the path of a file of `key = value` lines
// (`#` starts a comment), or inline `key=value,key=value`. Keys: intra_gbps,
// inter_gbps (Gbit/s), intra_us, inter_us (microseconds per message),
// nics_per_node, ranks_per_node (declared nodes, see LinkLevels); each
// overrides the default once. A bad line, key or value
// throws ncf::Error naming the file (or --topology), the line (or item)
// number, the key and the value.
LinkLevels parse_topology(const std::string& spec_or_path, bool cuda);

// "intra 370 GB/s, 2 us/msg; inter 48 GB/s x 8 NICs, 6 us/msg (defaults for ...)"
std::string describe_links(const LinkLevels& links);

struct ExchangeShape {
  int nodes = 1;              // N
  int per_node = 1;           // L: ranks per node
  int D = 0;                  // embedding width (floats per vector)
  int64_t keys_per_rank = 0;  // k: keys a rank sends per step (routed tables, after rank dedup)
  double node_unique_share = 1.0;  // s in (0, 1]: the node's keys left after node dedup
  int payload_bytes = 4;           // bytes per vector element (--exchange_dtype: 4 or 2)
};

// Per rank per step, all four exchanges: the modelled seconds, the messages
// and bytes this rank sends inside its node and across nodes.
struct ExchangeCost {
  double seconds = 0;
  int64_t intra_msgs = 0, inter_msgs = 0;
  double intra_bytes = 0, inter_bytes = 0;
};

ExchangeCost flat_cost(const ExchangeShape& shape, const LinkLevels& links);
ExchangeCost two_hop_cost(const ExchangeShape& shape, const LinkLevels& links, bool node_dedup);

// s for a table of table_rows rows that each rank looks up lookups_per_rank
// times (uniform draws), with rank-level dedup: the node's distinct rows
// expected_unique(R, L·n) over its ranks' L·expected_unique(R, n). 1 at L = 1.
double expected_node_unique_share(int64_t table_rows, int64_t lookups_per_rank, int per_node);
// The same over several tables, each looked up lookups_per_rank times per rank.
double expected_node_unique_share(const std::vector<int64_t>& table_rows, int64_t lookups_per_rank,
                                  int per_node);

// What --exchange auto measured: the mean exchange seconds per training step
// on each route (over `rounds` steps of each, and over the ranks).
struct ExchangeTiming {
  double flat_s = 0;
  double two_hop_s = 0;
  int rounds = 0;
};

struct ExchangeChoice {
  bool two_hop = false;
  bool node_dedup = false;
  std::string reason;  // one line for the startup output: what, why, predicted times
};

// exchange: "flat", "two_hop" or "auto"; dedup: "auto", "on", "off" or "node".
// Two-hop needs nodes > 1 and per_node > 1; otherwise it is the flat exchange
// under another route, and flat is chosen (with node dedup asked, the
// rank-level dedup remains). auto takes the route `measured` found faster
// (the trainer times its first steps on both routes where exchange_is_measured
// says so), or without a measurement the one the model predicts faster; the
// reason gives both. Node dedup is taken only when asked: it changes the summation order
// of gradients, while the exchange choice alone never changes a number; the
// reason says when the model predicts it would pay. "--exchange flat" with
// "--dedup node" on a shape where two-hop exists throws (they contradict).
ExchangeChoice choose_exchange(const ExchangeShape& shape, const LinkLevels& links,
                               const std::string& exchange, const std::string& dedup,
                               const ExchangeTiming* measured = nullptr);
// Whether --exchange auto decides by measuring: both routes exist (nodes > 1,
// per_node > 1) and node dedup, which needs two-hop, is not asked.
bool exchange_is_measured(const ExchangeShape& shape, const std::string& exchange,
                          const std::string& dedup);

}  // namespace ncf
