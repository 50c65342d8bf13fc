// The two-level exchange model (embedding/exchange_model.h), in-process:
// hand-worked message, byte and time counts of the flat and the two-hop
// exchange, their limits, the node unique share, --topology parsing and its
// errors, the --exchange / --dedup choice, and agreement with
// launch/comm_model.py on the same shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "embedding/exchange_model.h"
#include "embedding/plan.h"
#include "test_util.h"

namespace ncf {
namespace {

// Round figures that make the hand-worked sums below exact.
LinkLevels toy_links(int nics = 2) {
  LinkLevels l;
  l.intra_bw = 8;    // bytes/s
  l.intra_lat = 1;   // s per message
  l.inter_bw = 4;    // bytes/s per NIC
  l.inter_lat = 10;  // s per message
  l.nics_per_node = nics;
  l.source = "toy";
  return l;
}

ExchangeShape shape(int N, int L, int D, int64_t k, double share = 1.0) {
  ExchangeShape s;
  s.nodes = N;
  s.per_node = L;
  s.D = D;
  s.keys_per_rank = k;
  s.node_unique_share = share;
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ExchangeModel, TwoNodesOfTwoRanksByHand) {
  // N = 2, L = 2, W = 4, D = 2, 8 keys per rank: 2 keys for every rank. Per key
  // ids 4 B, vectors 8 B, gradients 8 B; counts 8 B per block.
  const ExchangeShape s = shape(2, 2, 2, 8, 0.5);
  const ExchangeCost f = flat_cost(s, toy_links());
  // Flat: 1 local peer, 2 remote peers, in each of the 4 exchanges.
  EXPECT_EQ(f.intra_msgs, 4);
  EXPECT_EQ(f.inter_msgs, 8);
  EXPECT_DOUBLE_EQ(f.intra_bytes, 8 + 2 * 4 + 2 * 8 + 2 * 8);      // 48
  EXPECT_DOUBLE_EQ(f.inter_bytes, 2 * 8 + 4 * 4 + 4 * 8 + 4 * 8);  // 96
  // Per exchange max(intra, inter): counts max(1+1, 20+4), ids max(2, 20+4),
  // vectors max(1+2, 20+8), gradients the same: 24 + 24 + 28 + 28.
  EXPECT_DOUBLE_EQ(f.seconds, 104);

  const ExchangeCost h = two_hop_cost(s, toy_links(), false);
  EXPECT_EQ(h.intra_msgs, 4);
  EXPECT_EQ(h.inter_msgs, 4);
  // Hop 1 hands the local peer the 4 keys of the 2 ranks of its local index
  // (counts: 2 of them); hop 2 carries the node's 4 keys for the one remote rank.
  EXPECT_DOUBLE_EQ(h.intra_bytes, 16 + 4 * 4 + 4 * 8 + 4 * 8);  // 96
  EXPECT_DOUBLE_EQ(h.inter_bytes, 16 + 4 * 4 + 4 * 8 + 4 * 8);  // 96, as flat
  // Hop 1 then hop 2: counts (1 + 2) + (10 + 4), ids 3 + 14, vectors (1 + 4) + (10 + 8) x 2.
  EXPECT_DOUBLE_EQ(h.seconds, 17 + 17 + 23 + 23);

  // Node dedup keeps half the node's keys: hop 2 carries 2 keys instead of 4.
  const ExchangeCost d = two_hop_cost(s, toy_links(), true);
  EXPECT_DOUBLE_EQ(d.intra_bytes, h.intra_bytes);
  EXPECT_DOUBLE_EQ(d.inter_bytes, 16 + 2 * 4 + 2 * 8 + 2 * 8);  // 56
  EXPECT_DOUBLE_EQ(d.seconds, 17 + (3 + 10 + 2) + 2 * (5 + 10 + 4));

  // One NIC for the node's 2 ranks: each gets 2 B/s across. Flat: counts and
  // ids 20 + 8, vectors and gradients 20 + 16; two-hop: counts and ids
  // 3 + (10 + 8), vectors and gradients 5 + (10 + 16).
  EXPECT_DOUBLE_EQ(flat_cost(s, toy_links(1)).seconds, 28 + 28 + 36 + 36);
  EXPECT_DOUBLE_EQ(two_hop_cost(s, toy_links(1), false).seconds, 21 + 21 + 31 + 31);
}

TEST(ExchangeModel, MessageCountsFlatAgainstTwoHop) {
  for (int N : {1, 2, 3, 8, 16})
    for (int L : {1, 2, 4, 8}) {
      const ExchangeShape s = shape(N, L, 192, 100000);
      const ExchangeCost f = flat_cost(s, default_links(true));
      const ExchangeCost h = two_hop_cost(s, default_links(true), false);
      SCOPED_TRACE(std::to_string(N) + " nodes x " + std::to_string(L));
      EXPECT_EQ(f.intra_msgs, 4 * (L - 1));
      EXPECT_EQ(f.inter_msgs, 4 * int64_t(N - 1) * L);  // (N-1)·L per exchange
      EXPECT_EQ(h.intra_msgs, 4 * (L - 1));
      EXPECT_EQ(h.inter_msgs, 4 * (N - 1));  // one per remote node
      // What crosses the network is the same; hop 1 carries everything that
      // leaves the rank for another local index, N times flat's local share.
      EXPECT_NEAR(h.inter_bytes, f.inter_bytes, 1e-9 * f.inter_bytes);
      const double counts_f = 8.0 * 4 * (L - 1), counts_h = 8.0 * 4 * N * (L - 1);
      EXPECT_NEAR(h.intra_bytes - counts_h, N * (f.intra_bytes - counts_f), 1e-9 * h.intra_bytes);
    }
  // 16 nodes of 8: 480 messages across per step against 60.
  EXPECT_EQ(flat_cost(shape(16, 8, 192, 1), default_links(true)).inter_msgs, 480);
  EXPECT_EQ(two_hop_cost(shape(16, 8, 192, 1), default_links(true), true).inter_msgs, 60);
}

TEST(ExchangeModel, OneNodeOrOneRankPerNodeIsTheFlatExchange) {
  for (const ExchangeShape& s : {shape(1, 8, 64, 5000), shape(4, 1, 64, 5000)}) {
    const ExchangeCost f = flat_cost(s, toy_links());
    const ExchangeCost h = two_hop_cost(s, toy_links(), false);
    EXPECT_DOUBLE_EQ(h.seconds, f.seconds);
    EXPECT_EQ(h.intra_msgs, f.intra_msgs);
    EXPECT_EQ(h.inter_msgs, f.inter_msgs);
    EXPECT_DOUBLE_EQ(h.intra_bytes, f.intra_bytes);
    EXPECT_DOUBLE_EQ(h.inter_bytes, f.inter_bytes);
  }
  const ExchangeCost one = flat_cost(shape(1, 1, 64, 5000), toy_links());
  EXPECT_EQ(one.seconds, 0) << "one rank sends nothing";
  EXPECT_EQ(one.intra_msgs + one.inter_msgs, 0);
}

TEST(ExchangeModel, LimitsAndMonotonicity) {
  const LinkLevels c = default_links(true);
  // No keys: latency and the counts only. Flat pays (N-1)·L messages across in
  // each of the 4 exchanges, two-hop N-1 plus L-1 local ones; with a
  // per-message time above the local one, two-hop wins.
  const ExchangeShape empty = shape(16, 8, 192, 0);
  EXPECT_NEAR(flat_cost(empty, c).seconds, 4 * 120 * c.inter_lat + 120 * 8 / c.inter_bw, 1e-15);
  EXPECT_LT(two_hop_cost(empty, c, false).seconds, flat_cost(empty, c).seconds);
  // A free local level: two-hop is never slower than flat, and node dedup never
  // slower than two-hop.
  LinkLevels free_local = c;
  free_local.intra_bw = 1e300;
  free_local.intra_lat = 0;
  for (int N : {2, 4, 16})
    for (int64_t k : {int64_t{0}, int64_t{1000}, int64_t{10000000}}) {
      const ExchangeShape s = shape(N, 8, 192, k, 0.3);
      EXPECT_LE(two_hop_cost(s, free_local, false).seconds, flat_cost(s, free_local).seconds);
      EXPECT_LE(two_hop_cost(s, free_local, true).seconds,
                two_hop_cost(s, free_local, false).seconds);
    }
  // Huge payloads on a local level no faster than the NIC: the local hop's N-fold
  // bytes cost more than the messages saved, so flat is cheaper.
  LinkLevels slow_local = c;
  slow_local.intra_bw = c.inter_bw;
  EXPECT_GT(two_hop_cost(shape(4, 8, 192, 10000000), slow_local, false).seconds,
            flat_cost(shape(4, 8, 192, 10000000), slow_local).seconds);
  // More keys, a slower NIC or a higher per-message time never make a step shorter.
  double prev_f = -1, prev_h = -1;
  for (int64_t k = 0; k <= 4000000; k += 250000) {
    const double f = flat_cost(shape(8, 8, 192, k), c).seconds;
    const double h = two_hop_cost(shape(8, 8, 192, k), c, false).seconds;
    EXPECT_GT(f, prev_f);
    EXPECT_GT(h, prev_h);
    prev_f = f;
    prev_h = h;
  }
  LinkLevels slow_nic = c;
  slow_nic.inter_bw /= 2;
  slow_nic.inter_lat *= 2;
  const ExchangeShape s = shape(8, 8, 192, 200000, 0.5);
  EXPECT_GT(flat_cost(s, slow_nic).seconds, flat_cost(s, c).seconds);
  EXPECT_GT(two_hop_cost(s, slow_nic, true).seconds, two_hop_cost(s, c, true).seconds);
  // Node dedup: fewer unique keys, fewer bytes across, none saved at share 1.
  EXPECT_LT(two_hop_cost(shape(8, 8, 192, 200000, 0.2), c, true).inter_bytes,
            two_hop_cost(shape(8, 8, 192, 200000, 0.6), c, true).inter_bytes);
  EXPECT_DOUBLE_EQ(two_hop_cost(shape(8, 8, 192, 200000, 1.0), c, true).seconds,
                   two_hop_cost(shape(8, 8, 192, 200000, 1.0), c, false).seconds);
}

TEST(ExchangeModel, BadShapesAndLinksAreRefused) {
  EXPECT_NE(error_of([] { flat_cost(shape(0, 8, 192, 10), toy_links()); }).find("0 nodes x 8"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              two_hop_cost(shape(2, 2, 192, 10, 0), toy_links(), true);
            }).find("node unique share 0 outside (0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { flat_cost(shape(2, 2, 0, 10), toy_links()); }).find("width D=0"),
            std::string::npos);
  LinkLevels bad = toy_links();
  bad.inter_bw = 0;
  EXPECT_NE(error_of([&] { flat_cost(shape(2, 2, 8, 10), bad); }).find("must be positive (toy)"),
            std::string::npos);
}

TEST(ExchangeModel, NodeUniqueShare) {
  // 2 rows, 1 lookup per rank, 2 ranks: each rank sends 1 key; the node's 2
  // draws hit 2·(1 − 1/4) = 1.5 distinct rows on average: 1.5 / 2.
  EXPECT_DOUBLE_EQ(expected_node_unique_share(2, 1, 2), 0.75);
  EXPECT_DOUBLE_EQ(expected_node_unique_share(1000, 500, 1), 1.0) << "one rank: nothing to merge";
  // A table far smaller than a rank's draws: every rank sends every row once,
  // the node keeps one copy of each: 1/L.
  EXPECT_NEAR(expected_node_unique_share(100, 100000, 8), 1.0 / 8, 1e-9);
  // A table far larger than the draws: nothing repeats.
  EXPECT_NEAR(expected_node_unique_share(int64_t{1} << 40, 100000, 8), 1.0, 1e-5);
  double prev = 1.0;
  for (int L : {2, 4, 8, 16}) {
    const double s = expected_node_unique_share(26744, 131072, L);
    EXPECT_LT(s, prev) << L;
    EXPECT_GT(s, 0.0);
    prev = s;
  }
  // Several tables: the node's distinct rows over its ranks', summed over tables.
  const double u = 2 * expected_unique(1000, 300) + 2 * expected_unique(50, 300);
  const double n = expected_unique(1000, 600) + expected_unique(50, 600);
  EXPECT_NEAR(expected_node_unique_share(std::vector<int64_t>{1000, 50}, 300, 2), n / u, 1e-12);
}

TEST(ExchangeModel, DefaultsAndInlineTopology) {
  const LinkLevels cuda = default_links(true);
  EXPECT_DOUBLE_EQ(cuda.intra_bw, 370e9);
  EXPECT_DOUBLE_EQ(cuda.inter_bw, 48e9);
  EXPECT_EQ(cuda.nics_per_node, 8);
  EXPECT_NE(cuda.source.find("defaults for cuda"), std::string::npos);
  const LinkLevels cpu = default_links(false);
  EXPECT_DOUBLE_EQ(cpu.inter_bw, 1.25e9);
  EXPECT_EQ(cpu.nics_per_node, 1);
  EXPECT_EQ(parse_topology("", false).inter_bw, cpu.inter_bw);

  const LinkLevels l = parse_topology("inter_gbps=1, inter_us = 50,nics_per_node=2", false);
  EXPECT_DOUBLE_EQ(l.inter_bw, 1.25e8);
  EXPECT_DOUBLE_EQ(l.inter_lat, 50e-6);
  EXPECT_EQ(l.nics_per_node, 2);
  EXPECT_DOUBLE_EQ(l.intra_bw, cpu.intra_bw) << "keys not given keep their defaults";
  EXPECT_NE(l.source.find("--topology inter_gbps=1,inter_us=50,nics_per_node=2 over defaults "
                          "for cpu"),
            std::string::npos)
      << l.source;
  const std::string d = describe_links(l);
  EXPECT_NE(d.find("inter 0.125 GB/s x 2 NICs, 50 us/msg"), std::string::npos) << d;
}

TEST(ExchangeModel, TopologyFile) {
  test::TempDir dir;
  const std::string path = dir.file("links.topo");
  test::write_file(path,
                   "# two hosts on a shaped link\n"
                   "\n"
                   "intra_gbps = 20   # shared memory\n"
                   "intra_us=0.5\n"
                   "inter_gbps = 0.5\n"
                   "  inter_us = 200\n");
  const LinkLevels l = parse_topology(path, true);
  EXPECT_DOUBLE_EQ(l.intra_bw, 2.5e9);
  EXPECT_DOUBLE_EQ(l.intra_lat, 0.5e-6);
  EXPECT_DOUBLE_EQ(l.inter_bw, 0.5e9 / 8);
  EXPECT_DOUBLE_EQ(l.inter_lat, 200e-6);
  EXPECT_EQ(l.nics_per_node, 8) << "the cuda default";
  EXPECT_NE(l.source.find("file " + path), std::string::npos) << l.source;
}

TEST(ExchangeModel, TopologyErrorsNameWhereAndWhat) {
  test::TempDir dir;
  const std::string path = dir.file("bad.topo");
  auto file_error = [&](const std::string& text) {
    test::write_file(path, text);
    return error_of([&] { parse_topology(path, false); });
  };
  std::string e = file_error("intra_gbps = 10\n# fine\ninter_gbps = fast\n");
  EXPECT_NE(e.find("--topology file " + path + " line 3: key inter_gbps value 'fast'"),
            std::string::npos)
      << e;
  e = file_error("inter_gpbs = 10\n");
  EXPECT_NE(e.find("line 1: unknown key 'inter_gpbs' (value '10'"), std::string::npos) << e;
  e = file_error("inter_us = 5\ninter_us = 6\n");
  EXPECT_NE(e.find("line 2: key inter_us = '6' given again (first at 1)"), std::string::npos) << e;
  e = file_error("\n\ninter_us 5\n");
  EXPECT_NE(e.find("line 3: 'inter_us 5' is not key = value"), std::string::npos) << e;
  e = file_error("nics_per_node = 1.5\n");
  EXPECT_NE(e.find("line 1: key nics_per_node value '1.5': expected a whole number"),
            std::string::npos)
      << e;
  e = file_error("ranks_per_node = 0\n");
  EXPECT_NE(e.find("line 1: key ranks_per_node value '0': expected a whole number in [1, 65536]"),
            std::string::npos)
      << e;
  EXPECT_EQ(parse_topology("ranks_per_node=4", false).ranks_per_node, 4);
  EXPECT_EQ(parse_topology("", false).ranks_per_node, 0) << "MPI's nodes by default";
  e = file_error("intra_gbps = -3\n");
  EXPECT_NE(e.find("key intra_gbps value '-3': expected a rate in Gbit/s > 0"), std::string::npos)
      << e;
  e = file_error("inter_us = \n");
  EXPECT_NE(e.find("key inter_us value ''"), std::string::npos) << e;
  e = file_error("inter_gbps = 10x\n");
  EXPECT_NE(e.find("value '10x'"), std::string::npos) << e;
  e = file_error("inter_gbps = inf\n");
  EXPECT_NE(e.find("value 'inf'"), std::string::npos) << e;
  // A rate whose bytes per second overflow the doubles: refused as the value it
  // is, not left to the model's check of its own links (a failed check).
  e = file_error("intra_us = 1\ninter_gbps = 1e300\n");
  EXPECT_NE(e.find("--topology file " + path +
                   " line 2: key inter_gbps value '1e300': expected a rate in Gbit/s > 0"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("check failed"), std::string::npos) << e;

  e = error_of([] { parse_topology("inter_gbps=1,intra_us=x", false); });
  EXPECT_NE(e.find("flag --topology 'inter_gbps=1,intra_us=x' item 2: key intra_us value 'x'"),
            std::string::npos)
      << e;
  e = error_of([] { parse_topology("/no/such/file.topo", false); });
  EXPECT_NE(e.find("flag --topology: '/no/such/file.topo' is neither a file nor key=value"),
            std::string::npos)
      << e;
}

TEST(ExchangeModel, ChoiceAtOneNodeOrOneRankPerNodeIsFlat) {
  for (const char* x : {"flat", "two_hop", "auto"})
    for (const char* d : {"auto", "on", "off", "node"}) {
      const ExchangeChoice c = choose_exchange(shape(1, 8, 192, 100000), default_links(true), x, d);
      EXPECT_FALSE(c.two_hop) << x << " " << d;
      EXPECT_FALSE(c.node_dedup) << x << " " << d;
      EXPECT_EQ(c.reason.rfind("exchange flat (one node", 0), 0u) << c.reason;
    }
  const ExchangeChoice c =
      choose_exchange(shape(4, 1, 192, 100000), default_links(true), "two_hop", "node");
  EXPECT_FALSE(c.two_hop);
  EXPECT_FALSE(c.node_dedup);
  EXPECT_NE(c.reason.find("one rank per node"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("--dedup node keeps the rank-level dedup only"), std::string::npos);
}

// auto with a measurement keeps the route measured faster, against the model
// either way, and says both; only auto without node dedup on two routes measures.
TEST(ExchangeModel, AutoFollowsTheMeasurementAndPrintsTheModelBesideIt) {
  const LinkLevels c = default_links(true);
  const ExchangeShape small = shape(16, 8, 192, 2000, 0.4);  // the model: two-hop
  ASSERT_TRUE(choose_exchange(small, c, "auto", "auto").two_hop);
  ExchangeTiming flat_faster;
  flat_faster.flat_s = 0.0012;
  flat_faster.two_hop_s = 0.0015;
  flat_faster.rounds = 3;
  ExchangeChoice ch = choose_exchange(small, c, "auto", "auto", &flat_faster);
  EXPECT_FALSE(ch.two_hop) << ch.reason;
  EXPECT_EQ(ch.reason.rfind("exchange flat (auto: measured faster, 1.500 ms two-hop vs 1.200 ms "
                            "flat exchange per step, mean of 3 training steps each over the "
                            "ranks): predicted per step flat ",
                            0),
            0u)
      << ch.reason;
  ExchangeTiming hop_faster = flat_faster;
  std::swap(hop_faster.flat_s, hop_faster.two_hop_s);
  LinkLevels slow_local = c;
  slow_local.intra_bw = c.inter_bw;
  const ExchangeShape big = shape(2, 8, 192, 5000000);  // the model: flat
  ASSERT_FALSE(choose_exchange(big, slow_local, "auto", "on").two_hop);
  ch = choose_exchange(big, slow_local, "auto", "on", &hop_faster);
  EXPECT_TRUE(ch.two_hop) << ch.reason;
  EXPECT_NE(ch.reason.find("auto: measured faster, 1.200 ms two-hop vs 1.500 ms flat"),
            std::string::npos)
      << ch.reason;
  // Forced routes ignore a measurement; node dedup needs two-hop whatever it says.
  EXPECT_TRUE(choose_exchange(big, slow_local, "two_hop", "on", &flat_faster).two_hop);
  EXPECT_TRUE(choose_exchange(small, c, "auto", "node", &flat_faster).two_hop);
  EXPECT_TRUE(exchange_is_measured(small, "auto", "on"));
  EXPECT_FALSE(exchange_is_measured(small, "auto", "node"));
  EXPECT_FALSE(exchange_is_measured(small, "flat", "on"));
  EXPECT_FALSE(exchange_is_measured(shape(1, 8, 192, 2000), "auto", "on"));
  EXPECT_FALSE(exchange_is_measured(shape(4, 1, 192, 2000), "auto", "on"));
}

TEST(ExchangeModel, ChoiceFollowsTheModelAndTheFlags) {
  const LinkLevels c = default_links(true);
  // Latency-bound (few keys, 16 nodes): auto takes two-hop.
  const ExchangeShape small = shape(16, 8, 192, 2000, 0.4);
  ExchangeChoice ch = choose_exchange(small, c, "auto", "auto");
  EXPECT_TRUE(ch.two_hop) << ch.reason;
  EXPECT_FALSE(ch.node_dedup) << "node dedup only when asked";
  EXPECT_EQ(ch.reason.rfind("exchange two_hop (auto: the model's faster): predicted per step "
                            "flat ",
                            0),
            0u)
      << ch.reason;
  EXPECT_NE(ch.reason.find("inter-node messages/step 480 flat vs 60 two-hop"), std::string::npos)
      << ch.reason;
  // Bandwidth-bound on a local level as slow as the NIC: auto stays flat.
  LinkLevels slow_local = c;
  slow_local.intra_bw = c.inter_bw;
  ch = choose_exchange(shape(2, 8, 192, 5000000), slow_local, "auto", "on");
  EXPECT_FALSE(ch.two_hop) << ch.reason;
  EXPECT_NE(ch.reason.find("auto: two-hop is not faster here"), std::string::npos) << ch.reason;
  // Forced either way, whatever the model says.
  EXPECT_FALSE(choose_exchange(small, c, "flat", "auto").two_hop);
  EXPECT_TRUE(choose_exchange(shape(2, 8, 192, 5000000), slow_local, "two_hop", "off").two_hop);
  // --dedup node: two-hop with node dedup, under auto too.
  for (const char* x : {"auto", "two_hop"}) {
    ch = choose_exchange(shape(2, 8, 192, 5000000), slow_local, x, "node");
    EXPECT_TRUE(ch.two_hop && ch.node_dedup) << x << ": " << ch.reason;
    EXPECT_EQ(ch.reason.rfind("exchange two_hop + node dedup (", 0), 0u) << ch.reason;
  }
  // The reason says when node dedup would pay (here 40% of the keys are unique).
  const ExchangeShape big = shape(2, 8, 192, 2000000, 0.4);
  ch = choose_exchange(big, c, "two_hop", "auto");
  EXPECT_NE(ch.reason.find("; --dedup node would save"), std::string::npos) << ch.reason;
  ch = choose_exchange(big, c, "flat", "on");
  EXPECT_NE(ch.reason.find("; --exchange two_hop --dedup node would save"), std::string::npos)
      << ch.reason;
  ch = choose_exchange(shape(2, 8, 192, 2000000, 1.0), c, "two_hop", "auto");
  EXPECT_EQ(ch.reason.find("would save"), std::string::npos) << ch.reason;
}

TEST(ExchangeModel, ChoiceRefusesBadFlags) {
  const ExchangeShape s = shape(2, 4, 192, 1000);
  const LinkLevels c = default_links(false);
  EXPECT_NE(error_of([&] {
              choose_exchange(s, c, "hierarchical", "auto");
            }).find("flag --exchange: 'hierarchical' (expected flat, two_hop or auto)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              choose_exchange(s, c, "auto", "nodes");
            }).find("flag --dedup: 'nodes' (expected auto, on, off or node)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              choose_exchange(s, c, "flat", "node");
            }).find("flags --exchange flat and --dedup node contradict"),
            std::string::npos);
}

TEST(ExchangeModel, CudaDefaultsOnTheMl20mShape) {
  // ANCHORS.md: at 16 x 8 the flat exchange of a 2^20 batch moves ~98 KB of
  // vectors per pair, latency-bound; at 2 x 8 ~6.3 MB, where two hops save little.
  const LinkLevels c = default_links(true);
  auto ml20m = [](int N) {
    const int64_t b = (int64_t{1} << 20) / (N * 8);  // samples per rank
    return shape(N, 8, 192, 2 * b);                  // user and item ids, no dedup
  };
  const ExchangeCost f16 = flat_cost(ml20m(16), c), h16 = two_hop_cost(ml20m(16), c, false);
  // 16,384 keys over 128 ranks: 128 per pair, 98,304 B of vectors (and of
  // gradients) per pair, plus 512 B of ids and 8 B of counts, to 120 remote ranks.
  EXPECT_DOUBLE_EQ(f16.inter_bytes, 120.0 * (8 + 128 * 4 + 2 * 98304));
  EXPECT_LT(h16.seconds, 0.8 * f16.seconds) << "16 nodes: two-hop saves >20%";
  EXPECT_TRUE(choose_exchange(ml20m(16), c, "auto", "auto").two_hop);
  const ExchangeCost f2 = flat_cost(ml20m(2), c), h2 = two_hop_cost(ml20m(2), c, false);
  EXPECT_GT(h2.seconds, 0.9 * f2.seconds) << "2 nodes: two-hop saves <10%";
}

TEST(ExchangeModel, PythonModelAgrees) {
  // launch/comm_model.py carries the same formulas for the page's tables; it
  // prints its costs for a shape as JSON, compared here with this model's.
  if (test::run(test::python3() + " -c 'import json' 2>/dev/null").exit_code != 0)
    GTEST_SKIP() << "no python3";
  struct Case {
    ExchangeShape s;
    LinkLevels l;
  };
  std::vector<Case> cases = {{shape(2, 2, 2, 8, 0.5), toy_links()},
                             {shape(2, 2, 2, 8, 0.5), toy_links(1)},
                             {shape(16, 8, 192, 16384, 0.3), default_links(true)},
                             {shape(4, 2, 192, 250000, 0.8), default_links(false)},
                             {shape(1, 8, 64, 1000, 1.0), default_links(true)}};
  for (const Case& c : cases) {
    char arg[512];
    std::snprintf(arg, sizeof arg, "%d,%d,%d,%lld,%.17g,%.17g,%.17g,%.17g,%.17g,%d", c.s.nodes,
                  c.s.per_node, c.s.D, (long long)c.s.keys_per_rank, c.s.node_unique_share,
                  c.l.intra_bw, c.l.intra_lat, c.l.inter_bw, c.l.inter_lat, c.l.nics_per_node);
    const test::RunResult r = test::run(test::python3() + " " + std::string(NCF_SOURCE_DIR) +
                                        "/launch/comm_model.py --exchange_case " + arg);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // One line per mode: "flat|two_hop|two_hop_node seconds intra_msgs inter_msgs intra_bytes
    // inter_bytes"
    std::istringstream in(r.output);
    for (int mode = 0; mode < 3; ++mode) {
      std::string name;
      double sec, im, em, ib, eb;
      ASSERT_TRUE(in >> name >> sec >> im >> em >> ib >> eb) << r.output;
      const ExchangeCost m = mode == 0 ? flat_cost(c.s, c.l) : two_hop_cost(c.s, c.l, mode == 2);
      SCOPED_TRACE(name + " " + arg);
      EXPECT_NEAR(sec, m.seconds, 1e-12 * m.seconds + 1e-300);
      EXPECT_EQ(int64_t(im), m.intra_msgs);
      EXPECT_EQ(int64_t(em), m.inter_msgs);
      EXPECT_NEAR(ib, m.intra_bytes, 1e-12 * m.intra_bytes);
      EXPECT_NEAR(eb, m.inter_bytes, 1e-12 * m.inter_bytes);
    }
  }
}

}  // namespace
}  // namespace ncf
