// The two-hop exchange (comm/communicator.h) against the flat one, on real MPI
// ranks: for node maps declared over the ranks of one host (2 nodes x 2 ranks,
// 3 x 2, 2 x 3), every all_to_all_v and exchange_counts must leave the receive
// buffers byte for byte as the flat exchange does, gaps between blocks
// included, and the counters must show one message per remote node. The same
// exchange across real hosts runs in tests/cluster/.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "common/check.h"
#include "embedding/collection.h"
#include "embedding/plan.h"
#include "test_util.h"

namespace ncf {
namespace {

NodeMap map_of(std::vector<int> node_of) {
  NodeMap m;
  m.node_of = std::move(node_of);
  return m;
}

TEST(NodeMap, TwoHopNeedsEqualNodesNumberedNodeByNode) {
  EXPECT_EQ(map_of({0, 0, 1, 1}).two_hop_unavailable(), "");
  EXPECT_EQ(map_of({0, 0, 1, 1, 2, 2}).two_hop_unavailable(), "");
  EXPECT_EQ(map_of({0, 0, 0, 0}).two_hop_unavailable(), "one node");
  EXPECT_EQ(map_of({0, 1, 2}).two_hop_unavailable(),
            "one rank per node (flat already sends one message per remote node)");
  EXPECT_EQ(map_of({0, 0, 0, 1, 1}).two_hop_unavailable(),
            "unequal ranks per node (node 0 has 3, node 1 has 2)");
  const std::string cyclic = map_of({0, 1, 0, 1}).two_hop_unavailable();
  EXPECT_NE(cyclic.find("ranks are not numbered node by node (rank 1 is on node 1, not 0"),
            std::string::npos)
      << cyclic;
  EXPECT_EQ(map_of({0, 0, 1, 1}).nodes(), 2);
  EXPECT_EQ(map_of({0, 0, 1, 1, 1}).ranks_on(1), 3);
}

TEST(NodeMap, FromIdsNumbersNodesByFirstRank) {
  EXPECT_EQ(node_map_from_ids({7, 7, 3, 3, 9}).node_of, (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_EQ(node_map_from_ids({5, 2, 5, 2}).node_of, (std::vector<int>{0, 1, 0, 1}));
}

// ---- ncf_dist over nodes declared on one host ----------------------------------------

// --topology ranks_per_node=2 declares 2 nodes of 2 ranks over 4 ranks of this
// host: ncf_dist says so at start-up, takes the two-hop route when asked and
// ends with the flat route's parameters byte for byte (row-wise and mixed
// placements, dedup on and off); --dedup node takes two-hop with node dedup,
// repeats itself bit for bit and ends within the trajectory tolerance of flat
// (loss 1e-5 relative, HR and NDCG 0.005, as across real hosts in
// tests/cluster/test_two_hop.sh). A ranks_per_node that does not divide W is
// refused on every rank, naming the flag and both values. The same runs over
// NCCL ranks sharing one GPU: test_train_gpu.cc.
TEST(DeclaredNodes, TwoHopOverDeclaredNodesEndsWithFlatsParameters) {
  test::TempDir dir;
  auto prep = test::run(test::bin("ncf_prep") +
                        " --synthetic custom --users 300 --items 200 --interactions 9000 "
                        "--eval_negatives 50 --record_rows 512 --num_shards 2 --progress off "
                        "--output " +
                        dir.file("data"));
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  auto train = [&](const std::string& tag, const std::string& flags) {
    auto r = test::run("timeout -k 5 300 " + test::mpirun(4) + " " + test::bin("ncf_dist") +
                       " --device cpu --threads 1 --data_dir " + dir.file("data") +
                       " --batch_size 2000 --train_epochs 2 --topology ranks_per_node=2 " + flags +
                       " --save_params " + dir.file(tag + ".bin") + " --metrics_json " +
                       dir.file(tag + ".jsonl"));
    EXPECT_EQ(r.exit_code, 0) << tag << ": " << r.output;
    EXPECT_NE(r.output.find("ncf_dist: nodes: 2 nodes x 2 ranks, declared by --topology "
                            "ranks_per_node=2 (MPI finds 1 node)"),
              std::string::npos)
        << tag << ": " << r.output;
    return r.output;
  };
  auto params = [&](const std::string& tag) { return test::read_file(dir.file(tag + ".bin")); };
  for (const std::string plan : {"row", "user=row,item=table"})
    for (const std::string dedup : {"on", "off"}) {
      const std::string tag = (plan == "row" ? "row_" : "mixed_") + dedup;
      const std::string flags = "--shard_plan " + plan + " --dedup " + dedup;
      const std::string flat = train(tag + "_flat", flags + " --exchange flat");
      const std::string two = train(tag + "_two", flags + " --exchange two_hop");
      EXPECT_NE(two.find("ncf_dist: exchange: two_hop"), std::string::npos) << tag << two;
      EXPECT_NE(flat.find("ncf_dist: exchange: flat"), std::string::npos) << tag << flat;
      EXPECT_FALSE(params(tag + "_flat").empty()) << tag;
      EXPECT_EQ(params(tag + "_flat"), params(tag + "_two"))
          << tag << ": two-hop's parameters differ from flat's";
    }
  const std::string node = train("node_a", "--shard_plan row --dedup node --exchange two_hop");
  train("node_b", "--shard_plan row --dedup node --exchange two_hop");
  EXPECT_NE(node.find("ncf_dist: exchange: two_hop + node dedup"), std::string::npos) << node;
  EXPECT_EQ(params("node_a"), params("node_b")) << "two --dedup node runs differ";
  auto last = [&](const std::string& tag) {
    std::istringstream in(test::read_file(dir.file(tag + ".jsonl")));
    std::string line, final_line;
    while (std::getline(in, line))
      if (!line.empty()) final_line = line;
    return nlohmann::json::parse(final_line);
  };
  const nlohmann::json a = last("row_on_flat"), b = last("node_a");
  EXPECT_NEAR(double(a["loss"]), double(b["loss"]), 1e-5 * std::fabs(double(a["loss"])));
  EXPECT_NEAR(double(a["hr"]), double(b["hr"]), 0.005);
  EXPECT_NEAR(double(a["ndcg"]), double(b["ndcg"]), 0.005);
  EXPECT_NE(params("row_on_flat"), params("node_a")) << "node dedup changed nothing: not used?";

  auto bad = test::run("timeout -k 5 120 " + test::mpirun(4) + " " + test::bin("ncf_dist") +
                       " --device cpu --data_dir " + dir.file("data") +
                       " --train_epochs 1 --topology ranks_per_node=3");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("flag --topology ranks_per_node=3: the job's 4 ranks do not fill "
                            "nodes of 3 ranks"),
            std::string::npos)
      << bad.output;
}

// ---- multi-process: this binary again, under mpirun ------------------------------

class TwoHopMpi : public ::testing::TestWithParam<int> {
 protected:
  // This binary's worker tests `worker`.* on np ranks under mpirun: they must all
  // pass; returns how many times `line` appears in the job's output.
  static int run_workers(int np, const std::string& worker, const std::string& line) {
    test::RunResult r = test::run("NCF_TWO_HOP_WORKER=1 timeout -k 5 120 env " + test::mpirun(np) +
                                  " " + test::self_exe() + " --gtest_filter=" + worker + ".*");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("[  FAILED  ]"), std::string::npos) << r.output;
    int n = 0;
    for (size_t p = r.output.find(line); p != std::string::npos; p = r.output.find(line, p + 1))
      ++n;
    if (n == 0) ADD_FAILURE() << "no '" << line << "' in:\n" << r.output;
    return n;
  }
};

TEST_P(TwoHopMpi, ReceiveBuffersMatchFlatByteForByte) {
  const int np = GetParam();
  // Every declared map ran on every rank.
  EXPECT_EQ(run_workers(np, "TwoHopWorker", "two-hop worker: map done"), np == 4 ? 4 : 2 * 6);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TwoHopMpi, ::testing::Values(4, 6));

// The embedding collection's steps (lookup, gradients, owners' update) with the
// two-hop exchange equal the flat exchange's bit for bit, for row-wise,
// table-wise and mixed plans with and without dedup; node-level dedup stays
// within float tolerance of them and repeats itself bit for bit.
TEST_P(TwoHopMpi, CollectionStepsMatchFlat) {
  const int np = GetParam();
  EXPECT_EQ(run_workers(np, "TwoHopCollectionWorker", "collection worker: done"), np);
}

// NCF_TWO_HOP_REAL_NODES=1: the workers use the nodes MPI found (ranks on several
// hosts) instead of declaring nodes over the ranks of one host.
bool real_nodes() {
  const char* e = std::getenv("NCF_TWO_HOP_REAL_NODES");
  return e && std::string(e) == "1";
}

// The element every exchange carries from rank s to rank d at position k, so a
// misplaced element shows where it came from.
uint32_t payload(int s, int d, int64_t k, int round) {
  return uint32_t(s) * 1000003u + uint32_t(d) * 7919u + uint32_t(k) * 31u + uint32_t(round);
}

struct Layout {
  std::vector<int64_t> sc, sd, rc, rd;  // this rank's counts and displacements
  int64_t send_n = 0, recv_n = 0;
};

// counts[s][d] drawn from one seed on every rank; with gaps, displacements
// leave holes and go in reverse peer order (any layout is legal).
Layout make_layout(int W, int rank, uint64_t seed, bool zeros, bool gaps) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> c(size_t(W) * W);
  for (int64_t& x : c) {
    x = int64_t(rng() % 40);
    if (!zeros && x == 0) x = 1;
    if (zeros && rng() % 4 == 0) x = 0;
  }
  Layout l;
  for (auto* v : {&l.sc, &l.sd, &l.rc, &l.rd}) v->assign(size_t(W), 0);
  for (int p = 0; p < W; ++p) {
    l.sc[size_t(p)] = c[size_t(rank) * W + p];
    l.rc[size_t(p)] = c[size_t(p) * W + rank];
  }
  for (int i = 0; i < W; ++i) {
    const int p = gaps ? W - 1 - i : i;
    l.sd[size_t(p)] = l.send_n + (gaps ? 3 : 0);
    l.send_n = l.sd[size_t(p)] + l.sc[size_t(p)];
    l.rd[size_t(p)] = l.recv_n + (gaps ? 2 : 0);
    l.recv_n = l.rd[size_t(p)] + l.rc[size_t(p)];
  }
  return l;
}

template <typename T>
std::vector<T> send_buffer(const Layout& l, int W, int rank, int round) {
  std::vector<T> s(size_t(l.send_n), T(0));
  for (int d = 0; d < W; ++d)
    for (int64_t k = 0; k < l.sc[size_t(d)]; ++k)
      s[size_t(l.sd[size_t(d)] + k)] = T(payload(rank, d, k, round) % 100000);
  return s;
}

template <typename T>
void compare_exchange(Communicator& flat, Communicator& two, const Layout& l, int round) {
  const int W = flat.world(), rank = flat.rank();
  std::vector<T> send = send_buffer<T>(l, W, rank, round);
  // Gaps hold a pattern neither exchange may touch.
  std::vector<T> a(size_t(l.recv_n) + 1), b(size_t(l.recv_n) + 1);
  std::memset(a.data(), 0xA5, a.size() * sizeof(T));
  std::memset(b.data(), 0xA5, b.size() * sizeof(T));
  flat.all_to_all_v(send.data(), l.sc.data(), l.sd.data(), a.data(), l.rc.data(), l.rd.data(),
                    dtype_of<T>());
  two.all_to_all_v(send.data(), l.sc.data(), l.sd.data(), b.data(), l.rc.data(), l.rd.data(),
                   dtype_of<T>());
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0)
      << "rank " << rank << " round " << round << ": two-hop receive buffer differs from flat";
  // And flat is right: each block holds what its source sent.
  for (int s = 0; s < W; ++s)
    for (int64_t k = 0; k < l.rc[size_t(s)]; ++k)
      ASSERT_EQ(a[size_t(l.rd[size_t(s)] + k)], T(payload(s, rank, k, round) % 100000))
          << "rank " << rank << " from " << s << " at " << k;
}

TEST(TwoHopWorker, MatchesFlat) {
  if (!std::getenv("NCF_TWO_HOP_WORKER")) GTEST_SKIP() << "runs only inside TwoHopMpi.* jobs";
  int rc = run_main(0, nullptr, [](int& argc, char**& argv) {
    RankInfo info = bootstrap(&argc, &argv, true);
    const int W = info.world, rank = info.rank;
    // N nodes of L ranks declared over this host's ranks.
    // N nodes of L ranks declared over this host's ranks, or (on several hosts,
    // tests/cluster/test_two_hop.sh) the real nodes MPI reports.
    const bool real = real_nodes();
    std::vector<int> shapes_L = real     ? std::vector<int>{W / info.nodes.nodes()}
                                : W == 4 ? std::vector<int>{2}
                                         : std::vector<int>{2, 3};
    for (int L : shapes_L) {
      const int N = W / L;
      RankInfo declared = info;
      if (!real) {
        declared.nodes.node_of.clear();
        for (int r = 0; r < W; ++r) declared.nodes.node_of.push_back(r / L);
      }
      EXPECT_EQ(declared.nodes.two_hop_unavailable(), "");
      auto flat = make_communicator(declared, Device::kCpu, "mpi");
      auto two = make_communicator(declared, Device::kCpu, "mpi");
      two->set_exchange(ExchangeKind::kTwoHop);
      EXPECT_EQ(two->exchange(), ExchangeKind::kTwoHop);
      EXPECT_EQ(two->group_size(CommGroup::kNode), L);
      EXPECT_EQ(two->group_size(CommGroup::kRail), N);
      int round = 0;
      double crossing[2] = {0, 0};  // inter-node bytes this rank sent: flat, two-hop
      for (bool zeros : {false, true})
        for (bool gaps : {false, true}) {
          ++round;
          const Layout l = make_layout(W, rank, 1000 + round * 17 + L, zeros, gaps);
          // exchange_counts: the same answer both ways, and the answer is rc.
          std::vector<int64_t> fc(static_cast<size_t>(W)), tc(static_cast<size_t>(W));
          flat->exchange_counts(l.sc.data(), fc.data());
          const CommCounters before = two->counters();
          two->exchange_counts(l.sc.data(), tc.data());
          const CommCounters mid = two->counters();
          EXPECT_EQ(fc, l.rc);
          EXPECT_EQ(tc, l.rc);
          // Counts: hop 1 to the L-1 local peers, hop 2 to the N-1 remote rails.
          EXPECT_EQ(mid.intra_msgs - before.intra_msgs, L - 1);
          EXPECT_EQ(mid.inter_msgs - before.inter_msgs, N - 1);
          EXPECT_EQ(mid.intra_bytes - before.intra_bytes, int64_t(L - 1) * N * 8);
          EXPECT_EQ(mid.inter_bytes - before.inter_bytes, int64_t(N - 1) * L * 8);
          const CommCounters fb = flat->counters();
          compare_exchange<int32_t>(*flat, *two, l, round);
          const CommCounters fa = flat->counters(), ta = two->counters();
          crossing[0] += double(fa.inter_bytes - fb.inter_bytes);
          crossing[1] += double(ta.inter_bytes - mid.inter_bytes);
          if (!zeros) {
            // Every block non-empty: flat sends (N-1)·L messages across nodes and L-1
            // inside; two-hop N-1 across, and inside its hop-1 counts and data.
            EXPECT_EQ(fa.inter_msgs - fb.inter_msgs, (N - 1) * L);
            EXPECT_EQ(fa.intra_msgs - fb.intra_msgs, L - 1);
            EXPECT_EQ(ta.inter_msgs - mid.inter_msgs, N - 1);
            EXPECT_EQ(ta.intra_msgs - mid.intra_msgs, 2 * (L - 1));
            // Both move the same bytes across nodes: everything bound for other nodes.
            int64_t leaving = 0;
            for (int p = 0; p < W; ++p)
              if (p / L != rank / L) leaving += l.sc[size_t(p)];
            EXPECT_EQ(fa.inter_bytes - fb.inter_bytes, leaving * 4);
          }
          compare_exchange<float>(*flat, *two, l, round + 100);
          compare_exchange<int64_t>(*flat, *two, l, round + 200);
          compare_exchange<uint8_t>(*flat, *two, l, round + 300);
          compare_exchange<uint16_t>(*flat, *two, l, round + 400);  // BF16 payloads
        }
      // Per rank they differ (a rank carries its node's traffic for its rail), but
      // summed over the ranks both exchanges move the same bytes across nodes.
      flat->all_reduce_sum(crossing, 2, DType::kFloat64);
      EXPECT_EQ(crossing[0], crossing[1]);
      EXPECT_GT(crossing[0], 0.0);
      std::printf("two-hop worker: map done N=%d L=%d rank=%d%s\n", N, L, rank,
                  real ? " (real nodes)" : "");
      std::fflush(stdout);
    }
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  EXPECT_EQ(rc, 0);
}

// ---- the collection over declared nodes ------------------------------------------

constexpr int64_t kUsers = 157, kItems = 83;
constexpr int kD = 5, kSteps = 4;

EmbeddingPlan plan_for(const std::string& forced, int W, bool dedup) {
  return test::user_item_plan(kUsers, kItems, kD, W, forced, dedup);
}

// Both tables after kSteps steps of lookups with hot ids (shared across the
// ranks of a node and across nodes), gradients that depend on the rows, and
// Adam updates; the looked-up rows of every step are appended too.
std::vector<float> run_steps(const EmbeddingPlan& plan, Communicator& comm, bool node_dedup,
                             WireDType wire = WireDType::kFloat32) {
  ExecContext ctx;
  EmbeddingOptimizerConfig o;
  o.kind = EmbeddingOptimizer::kLazyAdam;
  o.adam = {0.05f, 0.9f, 0.999f, 1e-8f};
  EmbeddingCollection e(plan, comm, ctx, o, plan.dedup);
  e.set_node_dedup(node_dedup);
  e.set_exchange_dtype(wire);
  EXPECT_EQ(e.node_dedup(), node_dedup);
  e.init(11);
  std::vector<float> out;
  for (int step = 0; step < kSteps; ++step) {
    std::mt19937 g(uint32_t(1000 * step + 17 * comm.rank() + 3));
    const int64_t nu = 40 + comm.rank() * 3, ni = 90 - comm.rank() * 5;
    std::vector<int32_t> u(static_cast<size_t>(nu)), i(static_cast<size_t>(ni));
    for (auto& x : u) x = int32_t(g() % 3 == 0 ? g() % 6 : g() % kUsers);
    for (auto& x : i) x = int32_t(g() % 2 == 0 ? g() % 4 : g() % kItems);
    e.lookup({{u.data(), nu}, {i.data(), ni}});
    for (int t = 0; t < 2; ++t) {
      const int64_t n = t == 0 ? nu : ni;
      const float* rows = e.rows(t);
      out.insert(out.end(), rows, rows + n * kD);
      float* gr = e.row_grads(t);
      for (int64_t k = 0; k < n * kD; ++k) gr[k] = 0.3f * rows[k] + 0.001f * float(k % 7 - 3);
    }
    e.gradients_start(nullptr);
    e.gradients_finish(step + 1);
  }
  // The memory estimate covers what the steps held, where its balance
  // assumption holds (row-wise and de-duplicated: hot ids travel once).
  EmbeddingPlan estimated = plan;
  estimated.node_dedup = node_dedup;
  estimated.payload_bytes = wire_dtype_bytes(wire);
  const bool balanced = plan.dedup && plan.tables[0].placement == Placement::kRowWise &&
                        plan.tables[1].placement == Placement::kRowWise;
  if (balanced) {
    EXPECT_GE(exchange_buffer_bytes(estimated, {40 + 3 * comm.rank(), 90}, plan.dedup),
              e.step_buffer_bytes())
        << "node dedup " << node_dedup << " dedup " << plan.dedup;
  }
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> table = e.gather_table(t);
    out.insert(out.end(), table.begin(), table.end());
  }
  return out;
}

TEST(TwoHopCollectionWorker, MatchesFlat) {
  if (!std::getenv("NCF_TWO_HOP_WORKER")) GTEST_SKIP() << "runs only inside TwoHopMpi.* jobs";
  int rc = run_main(0, nullptr, [](int& argc, char**& argv) {
    RankInfo info = bootstrap(&argc, &argv, true);
    const int W = info.world;
    const bool real = real_nodes();
    const int L = real ? W / info.nodes.nodes() : 2, N = W / L;
    RankInfo declared = info;
    if (!real) {
      declared.nodes.node_of.clear();
      for (int r = 0; r < W; ++r) declared.nodes.node_of.push_back(r / L);
    }
    for (const std::string forced : {"row", "table", "user=row,item=table"})
      for (bool dedup : {false, true}) {
        const EmbeddingPlan plan = plan_for(forced, W, dedup);
        auto flat = make_communicator(declared, Device::kCpu, "mpi");
        auto two = make_communicator(declared, Device::kCpu, "mpi");
        two->set_exchange(ExchangeKind::kTwoHop);
        const CommCounters before = two->counters();
        const std::vector<float> a = run_steps(plan, *flat, false);
        const std::vector<float> b = run_steps(plan, *two, false);
        const std::string what = forced + (dedup ? " dedup" : "");
        EXPECT_EQ(a.size(), b.size()) << what;
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
            << what << ": two-hop differs from flat on rank " << info.rank;
        // Across nodes only along the rail: at most N-1 messages per exchange.
        const CommCounters after = two->counters();
        const int64_t exchanges = after.calls[int(CollectiveKind::kAllToAll)] +
                                  after.calls[int(CollectiveKind::kCounts)] -
                                  before.calls[int(CollectiveKind::kAllToAll)] -
                                  before.calls[int(CollectiveKind::kCounts)];
        EXPECT_LE(after.inter_msgs - before.inter_msgs, exchanges * (N - 1)) << what;
        if (!dedup) continue;
        // Node dedup: the same numbers up to the order of gradient sums.
        auto nd1 = make_communicator(declared, Device::kCpu, "mpi");
        auto nd2 = make_communicator(declared, Device::kCpu, "mpi");
        nd1->set_exchange(ExchangeKind::kTwoHop);
        nd2->set_exchange(ExchangeKind::kTwoHop);
        const std::vector<float> c = run_steps(plan, *nd1, true);
        const std::vector<float> d = run_steps(plan, *nd2, true);
        EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * 4), 0)
            << what << ": node dedup is not reproducible on rank " << info.rank;
        double worst = 0;
        for (size_t k = 0; k < a.size(); ++k)
          worst = std::max(worst, std::fabs(double(a[k]) - double(c[k])));
        EXPECT_LT(worst, 1e-6) << what << ": node dedup strays from flat on rank " << info.rank;
        // Summed over the ranks it sends fewer bytes across nodes than two-hop
        // without it (hot ids are shared by a node's ranks); per rank it need not,
        // since an owner's answers to a node all go to one rank.
        double crossing[2] = {double(nd1->counters().inter_bytes),
                              double(after.inter_bytes - before.inter_bytes)};
        flat->all_reduce_sum(crossing, 2, DType::kFloat64);
        EXPECT_LT(crossing[0], crossing[1]) << what;
        if (forced != "row") continue;
        // BF16 payloads: two-hop still equals flat bit for bit, node dedup (both
        // hops in BF16) stays near them and repeats itself, and the bytes that
        // cross nodes shrink as the rows' share of them halves.
        auto bflat = make_communicator(declared, Device::kCpu, "mpi");
        auto btwo = make_communicator(declared, Device::kCpu, "mpi");
        auto bnd = make_communicator(declared, Device::kCpu, "mpi");
        btwo->set_exchange(ExchangeKind::kTwoHop);
        bnd->set_exchange(ExchangeKind::kTwoHop);
        const WireDType bf = WireDType::kBFloat16;
        const std::vector<float> e = run_steps(plan, *bflat, false, bf);
        const std::vector<float> f = run_steps(plan, *btwo, false, bf);
        const std::vector<float> g = run_steps(plan, *bnd, true, bf);
        const std::vector<float> h = run_steps(plan, *bnd, true, bf);
        EXPECT_EQ(std::memcmp(e.data(), f.data(), e.size() * 4), 0)
            << what << " bf16: two-hop differs from flat on rank " << info.rank;
        EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * 4), 0)
            << what << " bf16: node dedup is not reproducible on rank " << info.rank;
        double bf_worst = 0, from_fp32 = 0;
        for (size_t k = 0; k < e.size(); ++k) {
          bf_worst = std::max(bf_worst, std::fabs(double(e[k]) - double(g[k])));
          from_fp32 = std::max(from_fp32, std::fabs(double(e[k]) - double(a[k])));
        }
        EXPECT_LT(bf_worst, 2e-3) << what << " bf16: node dedup strays from flat";
        EXPECT_GT(from_fp32, 1e-5) << what << ": bf16 payloads changed nothing";
        double bytes[2] = {double(btwo->counters().inter_bytes),
                           double(after.inter_bytes - before.inter_bytes)};
        flat->all_reduce_sum(bytes, 2, DType::kFloat64);
        // Per key: a 4-byte id, then a vector and a gradient of kD elements.
        const double per_key = (4.0 + 2 * 2 * kD) / (4.0 + 2 * 4 * kD);
        EXPECT_NEAR(bytes[0] / bytes[1], per_key, 0.01) << what << " bf16";
      }
    std::printf("collection worker: done rank=%d N=%d L=%d%s\n", info.rank, N, L,
                real ? " (real nodes)" : "");
    std::fflush(stdout);
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace ncf
