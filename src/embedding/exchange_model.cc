// The two-level exchange model, --topology and the exchange choice: see exchange_model.h.
#include "embedding/exchange_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/check.h"
#include "embedding/plan.h"  // expected_unique

namespace ncf {

namespace {

constexpr double kCountBytes = 8;  // the counts exchange: one int64 per block
// The reason names node dedup's predicted gain when it would save this share.
constexpr double kNodeDedupHint = 0.10;

double gbps(double v) { return v * 1e9 / 8; }  // Gbit/s -> bytes/s
double us(double v) { return v * 1e-6; }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

void check_links(const LinkLevels& l) {
  NCF_CHECK(
      std::isfinite(l.intra_bw) && l.intra_bw > 0 && std::isfinite(l.inter_bw) && l.inter_bw > 0,
      "exchange model: bandwidths intra ", l.intra_bw, " inter ", l.inter_bw,
      " B/s must be positive (", l.source, ")");
  NCF_CHECK(std::isfinite(l.intra_lat) && l.intra_lat >= 0 && std::isfinite(l.inter_lat) &&
                l.inter_lat >= 0,
            "exchange model: per-message times intra ", l.intra_lat, " inter ", l.inter_lat,
            " s must be >= 0 (", l.source, ")");
  NCF_CHECK(l.nics_per_node >= 1, "exchange model: nics_per_node ", l.nics_per_node, " (", l.source,
            ")");
}

void check_shape(const ExchangeShape& s) {
  NCF_CHECK(s.nodes >= 1 && s.per_node >= 1, "exchange model: ", s.nodes, " nodes x ", s.per_node,
            " ranks");
  NCF_CHECK(s.D >= 1 && s.keys_per_rank >= 0, "exchange model: width D=", s.D, ", ",
            s.keys_per_rank, " keys per rank");
  NCF_CHECK(s.node_unique_share > 0 && s.node_unique_share <= 1,
            "exchange model: node unique share ", s.node_unique_share, " outside (0, 1]");
}

// One rank's share of its node's NICs: an all-to-all cannot spread one
// rank's traffic over several NICs, and L ranks share nics_per_node of them.
double rank_nic_bw(const LinkLevels& l, int L) {
  return l.inter_bw * std::min(1.0, double(l.nics_per_node) / L);
}

// m messages of bytes in all, one after another on one level.
double level_seconds(int64_t m, double bytes, double lat, double bw) {
  return m > 0 ? double(m) * lat + bytes / bw : 0.0;
}

// Bytes per key of the four exchanges; 0 marks the counts exchange.
std::vector<double> per_key_bytes(const ExchangeShape& s) {
  return {0.0, 4.0, double(s.payload_bytes) * s.D, double(s.payload_bytes) * s.D};
}

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f ms", s * 1e3);
  return b;
}

std::string pct(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100 * f);
  return b;
}

std::string rate(double bytes_per_s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g GB/s", bytes_per_s / 1e9);
  return b;
}

}  // namespace

LinkLevels default_links(bool cuda) {
  LinkLevels l;
  if (cuda) {
    l.intra_bw = 370e9;  // NCCL all-to-all bus bandwidth on H100 NVLink (ANCHORS.md)
    l.intra_lat = us(2);
    l.inter_bw = 48e9;  // NDR 400 Gb/s, effective (ANCHORS.md)
    l.inter_lat = us(4);
    l.nics_per_node = 8;  // one NIC per GPU
    l.source = "defaults for cuda (8xH100 nodes: NVLink, one NDR 400 Gb/s NIC per GPU)";
  } else {
    l.intra_bw = gbps(16);  // shared-memory copies between processes
    l.intra_lat = us(2);
    l.inter_bw = gbps(10);  // one 10 Gb/s Ethernet port
    l.inter_lat = us(20);   // TCP through the kernel, per message
    l.nics_per_node = 1;
    l.source = "defaults for cpu (shared memory, one 10 Gb/s Ethernet port per node)";
  }
  return l;
}

LinkLevels parse_topology(const std::string& spec, bool cuda) {
  LinkLevels l = default_links(cuda);
  if (trim(spec).empty()) return l;
  // Items with their line (file) or position (inline) number.
  std::vector<std::pair<int, std::string>> items;
  std::string where;  // "--topology file F line" or "flag --topology item"
  std::error_code ec;
  if (std::filesystem::is_regular_file(spec, ec)) {
    std::ifstream in(spec);
    NCF_REQUIRE(in.good(), "flag --topology: cannot read the file ", spec, ": ",
                std::strerror(errno));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const auto hash = line.find('#');
      if (hash != std::string::npos) line.resize(hash);
      if (!trim(line).empty()) items.push_back({n, trim(line)});
    }
    where = "--topology file " + spec + " line ";
  } else if (spec.find('=') != std::string::npos) {
    std::stringstream ss(spec);
    std::string part;
    for (int n = 1; std::getline(ss, part, ','); ++n) items.push_back({n, trim(part)});
    where = "flag --topology '" + spec + "' item ";
  } else {
    NCF_FAIL("flag --topology: '", spec,
             "' is neither a file nor key=value pairs (keys: intra_gbps, intra_us, inter_gbps, "
             "inter_us, nics_per_node, ranks_per_node)");
  }
  std::map<std::string, int> seen;  // key -> its line
  std::string given;
  for (const auto& [n, item] : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) NCF_FAIL(where, n, ": '", item, "' is not key = value");
    const std::string key = trim(item.substr(0, eq));
    const std::string value = trim(item.substr(eq + 1));
    if (seen.count(key))
      NCF_FAIL(where, n, ": key ", key, " = '", value, "' given again (first at ", seen[key], ")");
    seen[key] = n;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    const bool number = !value.empty() && end && *end == '\0' && errno == 0 && std::isfinite(v);
    auto bad = [&](const char* expected) {
      NCF_FAIL(where, n, ": key ", key, " value '", value, "': expected ", expected);
    };
    if (key == "intra_gbps" || key == "inter_gbps") {
      // A rate whose bytes per second pass the doubles is no rate either.
      if (!number || v <= 0 || !std::isfinite(gbps(v))) bad("a rate in Gbit/s > 0");
      (key == "intra_gbps" ? l.intra_bw : l.inter_bw) = gbps(v);
    } else if (key == "intra_us" || key == "inter_us") {
      if (!number || v < 0) bad("microseconds per message >= 0");
      (key == "intra_us" ? l.intra_lat : l.inter_lat) = us(v);
    } else if (key == "nics_per_node") {
      if (!number || v < 1 || v != std::floor(v) || v > 1024) bad("a whole number in [1, 1024]");
      l.nics_per_node = int(v);
    } else if (key == "ranks_per_node") {
      if (!number || v < 1 || v != std::floor(v) || v > 65536) bad("a whole number in [1, 65536]");
      l.ranks_per_node = int(v);
    } else {
      NCF_FAIL(where, n, ": unknown key '", key, "' (value '", value,
               "'; keys: intra_gbps, intra_us, inter_gbps, inter_us, nics_per_node, "
               "ranks_per_node)");
    }
    given += (given.empty() ? "" : ",") + key + "=" + value;
  }
  const bool file = where.rfind("--topology file", 0) == 0;
  l.source = (file ? "file " + spec + " (" + given + ")" : "--topology " + given) + " over " +
             l.source.substr(0, l.source.find(" ("));
  return l;
}

std::string describe_links(const LinkLevels& l) {
  char b[256];
  std::snprintf(b, sizeof b, "intra %s, %.3g us/msg; inter %s x %d NIC%s, %.3g us/msg",
                rate(l.intra_bw).c_str(), l.intra_lat * 1e6, rate(l.inter_bw).c_str(),
                l.nics_per_node, l.nics_per_node == 1 ? "" : "s", l.inter_lat * 1e6);
  return std::string(b) + " (" + l.source + ")";
}

ExchangeCost flat_cost(const ExchangeShape& s, const LinkLevels& l) {
  check_shape(s);
  check_links(l);
  const int N = s.nodes, L = s.per_node;
  const double W = double(N) * L, k = double(s.keys_per_rank);
  const int64_t mi = L - 1, me = int64_t(N - 1) * L;
  const double be = rank_nic_bw(l, L);
  ExchangeCost c;
  for (double pk : per_key_bytes(s)) {
    const double bi = pk > 0 ? double(mi) * k / W * pk : kCountBytes * double(mi);
    const double be_bytes = pk > 0 ? double(me) * k / W * pk : kCountBytes * double(me);
    // Every block is posted at once: the two levels drain side by side.
    c.seconds += std::max(level_seconds(mi, bi, l.intra_lat, l.intra_bw),
                          level_seconds(me, be_bytes, l.inter_lat, be));
    c.intra_msgs += mi;
    c.inter_msgs += me;
    c.intra_bytes += bi;
    c.inter_bytes += be_bytes;
  }
  return c;
}

ExchangeCost two_hop_cost(const ExchangeShape& s, const LinkLevels& l, bool node_dedup) {
  check_shape(s);
  check_links(l);
  const int N = s.nodes, L = s.per_node;
  const double k = double(s.keys_per_rank);
  const double share = node_dedup ? s.node_unique_share : 1.0;
  const int64_t m1 = L - 1, m2 = N - 1;
  const double be = rank_nic_bw(l, L);
  ExchangeCost c;
  for (double pk : per_key_bytes(s)) {
    // Hop 1 hands local peer l' the blocks of the N ranks with local index l';
    // hop 2 carries, per remote node, the node's L blocks for one rank there.
    const double b1 = pk > 0 ? double(m1) * k / L * pk : kCountBytes * N * double(m1);
    const double b2 = pk > 0 ? double(m2) * k / N * share * pk : kCountBytes * L * double(m2);
    c.seconds +=
        level_seconds(m1, b1, l.intra_lat, l.intra_bw) + level_seconds(m2, b2, l.inter_lat, be);
    c.intra_msgs += m1;
    c.inter_msgs += m2;
    c.intra_bytes += b1;
    c.inter_bytes += b2;
  }
  return c;
}

double expected_node_unique_share(int64_t table_rows, int64_t lookups_per_rank, int per_node) {
  return expected_node_unique_share(std::vector<int64_t>{table_rows}, lookups_per_rank, per_node);
}

double expected_node_unique_share(const std::vector<int64_t>& table_rows, int64_t lookups_per_rank,
                                  int per_node) {
  NCF_CHECK(per_node >= 1 && lookups_per_rank >= 0, "node unique share: ", per_node,
            " ranks per node, ", lookups_per_rank, " lookups per rank");
  double node = 0, ranks = 0;
  for (int64_t R : table_rows) {
    NCF_CHECK(R >= 0, "node unique share: a table of ", R, " rows");
    node += expected_unique(R, int64_t(per_node) * lookups_per_rank);
    ranks += per_node * expected_unique(R, lookups_per_rank);
  }
  if (per_node == 1 || ranks <= 0) return 1.0;
  return std::min(1.0, node / ranks);
}

bool exchange_is_measured(const ExchangeShape& s, const std::string& exchange,
                          const std::string& dedup) {
  return exchange == "auto" && dedup != "node" && s.nodes > 1 && s.per_node > 1;
}

ExchangeChoice choose_exchange(const ExchangeShape& s, const LinkLevels& l,
                               const std::string& exchange, const std::string& dedup,
                               const ExchangeTiming* measured) {
  if (exchange != "flat" && exchange != "two_hop" && exchange != "auto")
    NCF_FAIL("flag --exchange: '", exchange, "' (expected flat, two_hop or auto)");
  if (dedup != "auto" && dedup != "on" && dedup != "off" && dedup != "node")
    NCF_FAIL("flag --dedup: '", dedup, "' (expected auto, on, off or node)");
  const bool node_asked = dedup == "node";
  const ExchangeCost flat = flat_cost(s, l);
  std::ostringstream why;
  ExchangeChoice ch;
  if (s.nodes == 1 || s.per_node == 1) {
    why << "exchange flat ("
        << (s.nodes == 1 ? "one node: every peer is on it"
                         : "one rank per node: two-hop would take the flat route");
    if (exchange == "two_hop") why << "; --exchange two_hop has nothing to add";
    if (node_asked) why << "; --dedup node keeps the rank-level dedup only";
    why << "): predicted " << ms(flat.seconds) << "/step, " << s.nodes << " node"
        << (s.nodes == 1 ? "" : "s") << " x " << s.per_node << " rank"
        << (s.per_node == 1 ? "" : "s") << ", " << s.keys_per_rank << " keys/rank; " << l.source;
    ch.reason = why.str();
    return ch;
  }
  if (exchange == "flat" && node_asked)
    NCF_FAIL(
        "flags --exchange flat and --dedup node contradict: node dedup happens between the "
        "two hops (use --exchange two_hop or auto), here ",
        s.nodes, " nodes x ", s.per_node, " ranks");
  const ExchangeCost hop = two_hop_cost(s, l, false);
  const ExchangeCost node = two_hop_cost(s, l, true);
  ch.node_dedup = node_asked;
  std::string cause;
  if (exchange == "flat") {
    cause = "--exchange flat";
  } else if (exchange == "two_hop") {
    ch.two_hop = true;
    cause = "--exchange two_hop";
  } else if (node_asked) {
    ch.two_hop = true;
    cause = "auto: --dedup node needs it";
  } else if (measured) {
    ch.two_hop = measured->two_hop_s < measured->flat_s;
    cause = std::string("auto: measured faster, ") + ms(measured->two_hop_s) + " two-hop vs " +
            ms(measured->flat_s) + " flat exchange per step, mean of " +
            std::to_string(measured->rounds) + " training steps each over the ranks";
  } else {
    ch.two_hop = hop.seconds < flat.seconds;
    cause = ch.two_hop ? "auto: the model's faster" : "auto: two-hop is not faster here";
  }
  const double chosen = ch.node_dedup ? node.seconds : ch.two_hop ? hop.seconds : flat.seconds;
  why << "exchange " << (ch.two_hop ? "two_hop" : "flat") << (ch.node_dedup ? " + node dedup" : "")
      << " (" << cause << "): predicted per step flat " << ms(flat.seconds) << ", two-hop "
      << ms(hop.seconds) << ", two-hop + node dedup " << ms(node.seconds) << " ("
      << pct(s.node_unique_share) << " of the node's keys unique)";
  if (!ch.node_dedup && node.seconds <= (1 - kNodeDedupHint) * chosen)
    why << "; " << (exchange == "flat" ? "--exchange two_hop --dedup node" : "--dedup node")
        << " would save " << pct(1 - node.seconds / chosen);
  why << "; " << s.nodes << " nodes x " << s.per_node << " ranks, " << s.keys_per_rank
      << " keys/rank, inter-node messages/step " << flat.inter_msgs << " flat vs " << hop.inter_msgs
      << " two-hop; " << l.source;
  ch.reason = why.str();
  return ch;
}

}  // namespace ncf
