// The shard planner, its cost model and the memory estimate: see plan.h.
#include "embedding/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/check.h"

namespace ncf {

namespace {

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", b / double(1ull << 30));
  return buf;
}

bool routed(Placement p, int W) { return W > 1 && p != Placement::kReplicated; }

}  // namespace

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kRowWise:
      return "row";
    case Placement::kTableWise:
      return "table";
    case Placement::kReplicated:
      return "replicated";
  }
  return "?";
}

Placement parse_placement(const std::string& s) {
  if (s == "row") return Placement::kRowWise;
  if (s == "table") return Placement::kTableWise;
  if (s == "replicated") return Placement::kReplicated;
  NCF_FAIL("unknown placement '", s, "' (expected row, table or replicated)");
}

double step_exchange_bytes(Placement p, int64_t N, int D, int64_t lookups_per_rank, int W,
                           int payload_bytes) {
  if (W == 1) return 0;
  const double f = double(W - 1) / W;
  const double per_key = 4.0 + 2.0 * D * payload_bytes;  // id, vector, gradient
  switch (p) {
    case Placement::kRowWise:
      return double(lookups_per_rank) * f * per_key;
    case Placement::kTableWise:
      return double(lookups_per_rank) * (W - 1) * per_key;
    case Placement::kReplicated:
      return 2.0 * f * double(N) * (D + 1) * 4;
  }
  return 0;
}

EmbeddingPlan plan_tables(const PlanRequest& req) {
  NCF_CHECK(!req.tables.empty() && int(req.tables.size()) <= kMaxTables,
            "plan: ", req.tables.size(), " tables outside [1, ", kMaxTables, "]");
  NCF_CHECK(req.D >= 1 && req.W >= 1, "plan: width D=", req.D, " world W=", req.W);
  EmbeddingPlan plan;
  plan.D = req.D;
  plan.W = req.W;
  plan.tables = req.tables;
  NCF_CHECK(req.payload_bytes == 2 || req.payload_bytes == 4, "plan: ", req.payload_bytes,
            " bytes per exchanged element (expected 2 or 4)");
  plan.payload_bytes = req.payload_bytes;
  NCF_CHECK(req.table_elem_bytes == 2 || req.table_elem_bytes == 4, "plan: ", req.table_elem_bytes,
            " bytes per stored element (expected 2 or 4)");
  plan.table_elem_bytes = req.table_elem_bytes;
  const int W = req.W;

  // --shard_plan: table name -> forced placement ("" = decide).
  std::map<std::string, std::string> forced;
  const std::string& f = req.forced;
  if (f != "auto" && f.find('=') == std::string::npos) {
    for (const TableSpec& t : req.tables) forced[t.name] = f;
  } else if (f != "auto") {
    std::stringstream ss(f);
    std::string part;
    while (std::getline(ss, part, ',')) {
      const auto eq = part.find('=');
      if (eq == std::string::npos)
        NCF_FAIL("flag --shard_plan: '", part, "' is not TABLE=PLACEMENT (in '", f, "')");
      const std::string name = part.substr(0, eq);
      bool known = false;
      std::string names;
      for (const TableSpec& t : req.tables) {
        known |= t.name == name;
        names += (names.empty() ? "" : " or ") + t.name;
      }
      if (!known) NCF_FAIL("flag --shard_plan: unknown table '", name, "' (expected ", names, ")");
      forced[name] = part.substr(eq + 1);
    }
  }

  std::ostringstream why;
  for (size_t k = 0; k < plan.tables.size(); ++k) {
    TableSpec& t = plan.tables[k];
    t.owner = int(k) % W;
    if (k) why << "; ";
    const auto it = forced.find(t.name);
    if (it != forced.end() && !it->second.empty()) {
      try {
        t.placement = parse_placement(it->second);
      } catch (const Error&) {
        NCF_FAIL("flag --shard_plan: unknown placement '", it->second, "' for table ", t.name,
                 " (expected row, table or replicated)");
      }
      why << t.name << ": forced";
      continue;
    }
    // Bytes per step on the busiest link; replicated also needs the whole
    // table (and its state) on every rank, so it must be small.
    const double row = step_exchange_bytes(Placement::kRowWise, t.num_rows, req.D,
                                           req.lookups_per_rank, W, req.payload_bytes);
    const double rep =
        step_exchange_bytes(Placement::kReplicated, t.num_rows, req.D, req.lookups_per_rank, W);
    TableSpec as_rep = t;
    as_rep.placement = Placement::kReplicated;
    const int64_t rep_bytes =
        table_rank_bytes(as_rep, req.D, 0, W, req.optimizer, req.table_elem_bytes);
    t.placement = Placement::kRowWise;
    if (W > 1 && rep < row && rep_bytes < req.replicated_limit_bytes) {
      t.placement = Placement::kReplicated;
      why << t.name << ": replicated (allreduce " << gib(rep) << "/step < exchange " << gib(row)
          << ")";
    } else if (W == 1) {
      why << t.name << ": row-wise (one rank, nothing to exchange)";
    } else {
      why << t.name << ": row-wise (exchange " << gib(row) << "/step vs allreduce " << gib(rep)
          << ")";
    }
  }
  // Dedup: only routed ids travel, so only they can be de-duplicated.
  double ids = 0, unique = 0;
  for (const TableSpec& t : plan.tables)
    if (routed(t.placement, W)) {
      ids += double(req.lookups_per_rank);
      unique += expected_unique(t.num_rows, req.lookups_per_rank);
    }
  const double share = ids > 0 ? unique / ids : 1.0;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * share);
  if (req.dedup == "node") {
    // Rank-level first, then the node's (its choice needs the nodes: the trainer's).
    plan.dedup = plan.node_dedup = ids > 0;
    why << "; dedup " << (plan.dedup ? "node" : "off") << " (forced)";
  } else if (req.dedup == "on" || req.dedup == "off") {
    plan.dedup = req.dedup == "on" && ids > 0;
    why << "; dedup " << (plan.dedup ? "on" : "off") << " (forced)";
  } else if (req.dedup == "auto") {
    plan.dedup = ids > 0 && share <= kDedupAutoShare;
    if (ids > 0)
      why << "; dedup " << (plan.dedup ? "on" : "off") << " (about " << pct
          << " of the routed ids of a step are unique)";
  } else {
    NCF_FAIL("flag --dedup: '", req.dedup, "' (expected auto, on, off or node)");
  }
  plan.reason = why.str();
  return plan;
}

double expected_unique(int64_t N, int64_t n) {
  if (N <= 0 || n <= 0) return 0;
  return double(N) * -std::expm1(double(n) * std::log1p(-1.0 / double(N)));
}

KeyLayout make_key_layout(const EmbeddingPlan& plan, std::vector<int>* layout_index) {
  const int T = int(plan.tables.size());
  NCF_CHECK(T >= 1 && T <= kMaxTables, "key layout: ", T, " tables outside [1, ", kMaxTables, "]");
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass)
    for (int t = 0; t < T; ++t)
      if ((plan.tables[t].placement == Placement::kReplicated) == (pass == 1)) order.push_back(t);
  KeyLayout l;
  l.W = plan.W;
  l.T = T;
  layout_index->assign(T, 0);
  for (int u = 0; u < T; ++u) {
    const TableSpec& s = plan.tables[order[u]];
    NCF_CHECK(s.num_rows > 0, "table ", s.name, " has ", s.num_rows, " rows");
    NCF_CHECK(s.owner >= 0 && s.owner < plan.W, "table ", s.name, " owner ", s.owner,
              " outside [0, ", plan.W, ")");
    (*layout_index)[order[u]] = u;
    l.key_begin[u + 1] = l.key_begin[u] + s.num_rows;
    l.placement[u] = s.placement;
    l.owner[u] = s.owner;
  }
  NCF_REQUIRE(l.num_keys() <= INT32_MAX, "the embedding tables would hold ", l.num_keys(),
              " rows in all (the dataset's users and items), more than the ", INT32_MAX,
              " that int32 ids can address: this dataset is too large for ncf_dist");
  return l;
}

int64_t table_rank_rows(const TableSpec& t, int rank, int W) {
  switch (t.placement) {
    case Placement::kRowWise:
      return t.num_rows > rank ? (t.num_rows - rank + W - 1) / W : 0;
    case Placement::kTableWise:
      return rank == t.owner ? t.num_rows : 0;
    case Placement::kReplicated:
      return t.num_rows;
  }
  return 0;
}

int64_t table_rank_bytes(const TableSpec& t, int D, int rank, int W, EmbeddingOptimizer o,
                         int elem_bytes) {
  int64_t b = table_rank_rows(t, rank, W) *
              (int64_t(elem_bytes) * D + 4 * optimizer_state_floats_per_row(o, D));
  if (t.placement == Placement::kReplicated && W > 1) b += t.num_rows * (int64_t(D) + 1) * 4;
  return b;
}

int64_t exchange_buffer_bytes(const EmbeddingPlan& plan, const std::vector<int64_t>& lookups,
                              bool dedup) {
  NCF_CHECK(lookups.size() == plan.tables.size(), "exchange_buffer_bytes: ", lookups.size(),
            " lookup counts for ", plan.tables.size(), " tables");
  const int64_t D = plan.D;
  int64_t n = 0, nr = 0, rep_reduce = 0;
  for (size_t t = 0; t < lookups.size(); ++t) {
    n += lookups[t];
    if (routed(plan.tables[t].placement, plan.W))
      nr += lookups[t];
    else if (plan.W > 1)
      rep_reduce = std::max({rep_reduce, lookups[t], plan.tables[t].num_rows});
  }
  // BF16 rows' update of `touched` rows: the summed rows and gradients, FP32
  // copies of the rows and two state arrays, and dense Adam's FP32 chunk of at
  // most 64 MiB.
  auto bf16_rows = [&](int64_t touched) -> int64_t {
    if (plan.table_elem_bytes == 4) return 0;
    int64_t rank_rows = 0;
    for (const TableSpec& t : plan.tables) rank_rows += table_rank_rows(t, 0, plan.W);
    return touched * (8 + 4 * D * 4) + std::min<int64_t>(int64_t{64} << 20, rank_rows * D * 4);
  };
  int64_t b = n * 4 + 2 * n * D * 4;                  // keys_, rows_, grads_
  if (plan.W == 1) return b + n * 16 + bf16_rows(n);  // the fused update's sort scratch
  b += nr * (8 + 4 + 4);                              // perm_, send_rows_, recv_rows_
  b += 2 * nr * D * 4;                                // send_vec_, recv_vec_
  if (plan.payload_bytes < 4) b += 2 * nr * D * plan.payload_bytes;  // wsend_, wrecv_
  b += nr * 16;  // the owners' fused update: sort scratch
  if (dedup) b += nr * (4 + 8) + nr * D * 4 + nr * (4 + D * 4);  // unique_, inverse_, uvec_, sums
  // Node dedup: the keys this rank carries for its node (about as many as it
  // sends) in three layouts, their unique rows and inverse, and four row buffers.
  if (dedup && plan.node_dedup) b += nr * (5 * 4 + 8) + 4 * nr * D * 4;
  b += rep_reduce * (4 + D * 4 + 24);  // replicated: reduced rows and grads, scratch
  return b + bf16_rows(std::max(nr, rep_reduce));
}

std::string describe_rank_tables(const EmbeddingPlan& plan, const std::vector<int64_t>& bytes) {
  std::string s;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s%s table %s (%.1f MiB)", t ? ", " : "",
                  plan.tables[t].name.c_str(), placement_name(plan.tables[t].placement),
                  t < bytes.size() ? bytes[t] / 1048576.0 : 0.0);
    s += buf;
  }
  return s;
}

}  // namespace ncf
