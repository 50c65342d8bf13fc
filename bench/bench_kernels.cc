// Time of each kernel of one training step, on one device, at the shapes of the
// ml-20m MLPerf setting: B samples per GPU (--batch, 1,048,576 by default), tables
// of 138,493 user and 26,744 item rows of width D = 64 + 256/2 = 192, tower
// 256,256,128,64, 4 negatives per positive, eval lists of 1 + 999 items.
//
// Per case: run once and verify the result against a host reference (exact where
// the op is exact, else with the tolerance written at the check), warm up, then
// time --repeats runs, each between two synchronizations of the device
// (check_device_errors waits for the stream), and report the median and the
// minimum. GB/s counts the logical bytes of the op: every input element read once
// and every output written once (what a perfect kernel would move), so a gather
// from a table that fits in the GPU's L2 may exceed the DRAM peak; %peak is
// against the DRAM bandwidth reported by the device. The tower's element-wise and
// masked passes on the GPU (layer 0's join and group sum, layers 1 and 2's backward)
// are checked against their CPU twins, NeuMF's fused top (the grouped tower, the top
// alone) against the unfused ops it replaced (set_fused_top(false), untimed); the
// kernel versions that lost are timed in bench/kernels/.
//
// Inputs are seeded: users drawn in proportion to the synthetic ml-20m activity
// counts (data/synthetic.h), positive items from a Zipf(1) popularity over a
// shuffled item order, negatives drawn by sample_negatives from per-user positive
// lists of those counts, as in the trainer's batches.
//
//   bench_kernels [--device cuda|cpu] [--gpu 0] [--batch 1048576] [--repeats 20]
//                 [--warmup 3] [--threads 0] [--eval_users 138493] [--filter NAME[,NAME...]]
//                 [--json FILE]
// A check that fails marks its row FAIL and the exit code 1; --device cuda without
// a usable GPU stops with the reason, exit code 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/blas_setup.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/device.h"
#include "common/parallel.h"
#include "data/negatives.h"
#include "data/synthetic.h"
#include "embedding/embedding_kernels.h"
#include "embedding/table_ops.h"
#include "model/metrics.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "model/optim.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

// The ml-20m MLPerf shapes.
constexpr int64_t kUsers = 138493;  // user table rows
constexpr int64_t kItems = 26744;   // item table rows
constexpr int kMf = 64;             // GMF factors
constexpr int kNumNeg = 4;          // negatives per positive
constexpr int kWorld = 8;           // W of the bucketize case
constexpr int kEvalList = 1000;     // L: 1 positive + 999 negatives
constexpr int kTopK = 10;
const std::vector<int> kLayers = {256, 256, 128, 64};

struct Options {
  std::string device = "cuda";
  int gpu = 0;
  int64_t batch = 1048576;
  int repeats = 20;
  int warmup = 3;
  int threads = 0;
  int64_t eval_users = kUsers;
  uint64_t seed = 1;
  std::string filter;
  std::string json;
};

// ---- host data ------------------------------------------------------------------

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) from (seed, stream, index): fills big arrays in parallel.
float hash_unit(uint64_t seed, uint64_t stream, uint64_t i) {
  return float(mix64(seed ^ mix64(stream * 0x100000001b3ull + i)) >> 40) * (1.0f / 16777216.0f);
}
// The same with 53 bits, for draws from cumulative sums of ~2·10^7.
double hash_unit53(uint64_t seed, uint64_t stream, uint64_t i) {
  return double(mix64(seed ^ mix64(stream * 0x100000001b3ull + i)) >> 11) * 0x1.0p-53;
}

std::vector<float> host_uniform(int threads, uint64_t seed, uint64_t stream, int64_t n, float lo,
                                float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  parallel_for(threads, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = lo + (hi - lo) * hash_unit(seed, stream, uint64_t(i));
  });
  return v;
}

// Integer-valued gradients in [-4, 4]: sums of up to 2^21 of them are exact in
// float in any order, so sort_reduce_rows is checked exactly.
std::vector<float> host_int_grads(int threads, uint64_t seed, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  parallel_for(threads, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[i] = float(int(mix64(seed ^ mix64(i)) % 9) - 4);
  });
  return v;
}

// A step's batch and the per-user positive lists (CSR) it is drawn against.
struct HostBatch {
  int64_t P = 0, B = 0;                       // positives, samples (B = P·(1 + kNumNeg))
  std::vector<int32_t> pos_users, pos_items;  // [P]
  std::vector<int32_t> users, items;          // [B]
  std::vector<float> labels;                  // [B]
  std::vector<int64_t> offsets;               // [kUsers + 1]
  std::vector<int32_t> lists;                 // [nnz] each user's items, ascending
};

// Index drawn with probability ∝ weight, by binary search on the cumulative sums.
int32_t draw_cdf(const std::vector<double>& cdf, double u) {
  const auto it = std::upper_bound(cdf.begin(), cdf.end(), u * cdf.back());
  return int32_t(std::min<ptrdiff_t>(it - cdf.begin(), ptrdiff_t(cdf.size()) - 1));
}

HostBatch make_batch(int64_t batch, uint64_t seed, int threads) {
  HostBatch h;
  h.P = batch / (1 + kNumNeg);
  h.B = h.P * (1 + kNumNeg);
  SyntheticParams sp;
  sp.shape = synthetic_shape("ml-20m");
  const std::vector<uint32_t> counts = synthetic_user_counts(sp, kEvalList - 1, seed, threads);
  NCF_CHECK(int64_t(counts.size()) == kUsers, "synthetic ml-20m has ", counts.size(), " users");

  // Positive lists: each user's count of distinct items, uniform (the cost of a
  // negative draw depends on the list's length only).
  h.offsets.assign(kUsers + 1, 0);
  for (int64_t u = 0; u < kUsers; ++u) h.offsets[u + 1] = h.offsets[u] + counts[u];
  h.lists.resize(size_t(h.offsets[kUsers]));
  parallel_for(threads, kUsers, 256, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> taken(kItems, 0);
    std::mt19937_64 rng(mix64(seed * 7919 + uint64_t(b)));
    for (int64_t u = b; u < e; ++u) {
      int32_t* out = &h.lists[h.offsets[u]];
      const int64_t c = counts[u];
      for (int64_t k = 0; k < c;) {
        const int32_t i = int32_t(rng() % kItems);
        if (!taken[i]) taken[i] = 1, out[k++] = i;
      }
      for (int64_t k = 0; k < c; ++k) taken[out[k]] = 0;
      std::sort(out, out + c);
    }
  });

  // Positives: users in proportion to their activity, items Zipf(1) over a
  // shuffled order (the popular items are not the low ids).
  std::vector<double> ucdf(kUsers), icdf(kItems);
  double acc = 0;
  for (int64_t u = 0; u < kUsers; ++u) ucdf[u] = acc += counts[u];
  acc = 0;
  for (int64_t r = 0; r < kItems; ++r) icdf[r] = acc += 1.0 / double(r + 1);
  std::vector<int32_t> order(kItems);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  h.pos_users.resize(h.P);
  h.pos_items.resize(h.P);
  parallel_for(threads, h.P, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      h.pos_users[k] = draw_cdf(ucdf, hash_unit53(seed, 11, uint64_t(k)));
      h.pos_items[k] = order[draw_cdf(icdf, hash_unit53(seed, 12, uint64_t(k)))];
    }
  });

  // The batch as the trainer builds it, by the CPU sampler.
  ExecContext cpu;
  cpu.threads = threads;
  DevicePositiveLists lists(Device::kCpu, h.offsets.data(), h.lists.data(), kUsers);
  h.users.resize(h.B);
  h.items.resize(h.B);
  h.labels.resize(h.B);
  sample_negatives(cpu, lists, kItems, h.pos_users.data(), h.pos_items.data(), 0, h.P, kNumNeg,
                   seed, 0, h.users.data(), h.items.data(), h.labels.data());
  return h;
}

// ---- device transfers -----------------------------------------------------------

template <typename T>
Buffer<T> to_device(Device d, const std::vector<T>& v) {
  Buffer<T> b(d, v.size());
  if (!v.empty()) device_copy(d, b.data(), Device::kCpu, v.data(), v.size() * sizeof(T));
  return b;
}
template <typename T>
std::vector<T> to_host(const Buffer<T>& b, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  if (n) device_copy(Device::kCpu, v.data(), b.device(), b.data(), size_t(n) * sizeof(T));
  return v;
}

// Elements where |got − want| > atol + rtol·|want| (NaN counts).
int64_t mismatches(const std::vector<float>& got, const std::vector<float>& want, double atol,
                   double rtol) {
  if (got.size() != want.size()) return int64_t(std::max(got.size(), want.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += !(std::fabs(double(got[i]) - want[i]) <= atol + rtol * std::fabs(double(want[i])));
  return bad;
}

// ---- harness --------------------------------------------------------------------

struct Result {
  std::string name, shape;
  std::vector<double> ms;  // each timed run
  double median_ms = 0, min_ms = 0;
  double bytes = 0;   // logical bytes per run (0: not a bandwidth case)
  double items = 0;   // units of `unit` per run
  std::string unit;   // "rows", "ids", "samples", "users"
  double flops = 0;   // per run, GEMM cases only
  std::string check;  // "ok", "FAIL: ...", or "-" (not verified)
};

class Bench {
 public:
  Bench(const ExecContext& ctx, const Options& o, double peak_gbs)
      : ctx_(ctx), o_(o), peak_gbs_(peak_gbs) {}

  // --filter: comma-separated parts, a case runs when its name contains one of them.
  bool selected(const std::string& name) const {
    if (o_.filter.empty()) return true;
    size_t from = 0;
    while (from <= o_.filter.size()) {
      const size_t comma = std::min(o_.filter.find(',', from), o_.filter.size());
      const std::string part = o_.filter.substr(from, comma - from);
      if (!part.empty() && name.find(part) != std::string::npos) return true;
      from = comma + 1;
    }
    return false;
  }

  // verify() returns "" when the result is right, else what is wrong; it runs the
  // op itself (once). Then warm-up and the timed runs of op().
  void run(const std::string& name, const std::string& shape, double bytes, double items,
           const std::string& unit, double flops, const std::function<void()>& op,
           const std::function<std::string()>& verify) {
    if (!selected(name)) return;
    Result r;
    r.name = name, r.shape = shape, r.bytes = bytes, r.items = items, r.unit = unit;
    r.flops = flops;
    if (verify) {
      const std::string why = verify();
      r.check = why.empty() ? "ok" : "FAIL: " + why;
    } else {
      r.check = "-";
    }
    for (int i = 0; i < o_.warmup; ++i) op();
    check_device_errors(ctx_);
    for (int i = 0; i < o_.repeats; ++i) {
      check_device_errors(ctx_);  // nothing queued before the clock starts
      const auto t0 = Clock::now();
      op();
      check_device_errors(ctx_);  // everything of this run has finished
      r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::vector<double> s = r.ms;
    std::sort(s.begin(), s.end());
    r.median_ms = s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
    r.min_ms = s.front();
    print(r);
    results_.push_back(std::move(r));
  }

  void print_header() const {
    std::printf("%-26s %-38s %10s %10s %9s %6s %18s  %s\n", "case", "shape", "median_ms", "min_ms",
                "GB/s", "%peak", "rate", "check");
  }

  // x with a k/M/G/T prefix, e.g. "38.2 M".
  static std::string si(double x) {
    const char* p[] = {"", "k", "M", "G", "T"};
    int k = 0;
    while (k < 4 && std::fabs(x) >= 1000) x /= 1000, ++k;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f %s", x < 10 ? 2 : 1, x, p[k]);
    return buf;
  }

  void print(const Result& r) const {
    char gbs[32] = "-", pct[16] = "-", rate[48];
    const double s = r.median_ms / 1e3;
    if (r.bytes > 0) {
      std::snprintf(gbs, sizeof gbs, "%.1f", r.bytes / s / 1e9);
      if (peak_gbs_ > 0)
        std::snprintf(pct, sizeof pct, "%.0f%%", 100 * r.bytes / s / 1e9 / peak_gbs_);
    }
    std::snprintf(rate, sizeof rate, "%s%s/s", si(r.items / s).c_str(), r.unit.c_str());
    std::string check = r.check;
    if (r.flops > 0) check += "  (GEMMs " + si(r.flops / s) + "FLOP/s)";
    std::printf("%-26s %-38s %10.3f %10.3f %9s %6s %18s  %s\n", r.name.c_str(), r.shape.c_str(),
                r.median_ms, r.min_ms, gbs, pct, rate, check.c_str());
    std::fflush(stdout);
  }

  int failures() const {
    int n = 0;
    for (const Result& r : results_) n += r.check.rfind("FAIL", 0) == 0;
    return n;
  }
  const std::vector<Result>& results() const { return results_; }

 private:
  ExecContext ctx_;
  Options o_;
  double peak_gbs_;
  std::vector<Result> results_;
};

std::string shape_str(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string shape_str(const char* fmt, ...) {
  char buf[128];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// ---- embedding-side cases ---------------------------------------------------------

struct TableCase {
  const char* name;                 // "user" or "item"
  int64_t R;                        // rows
  const std::vector<int32_t>* ids;  // host batch ids [B]
};

// gather, unique, permute, bucketize, unpermute, sort_reduce, dense and lazy Adam
// on one table, with the batch's ids of that table.
void table_cases(Bench& bench, const ExecContext& ctx, const Options& o, const TableCase& tc,
                 int64_t B, int D) {
  bool any = false;
  for (const char* c :
       {"gather_rows", "unique_ids", "permute_rows", "bucketize_by_owner", "unpermute_rows",
        "sort_reduce_rows", "embedding_dense_adam", "embedding_lazy_adam",
        "reduce_update_rows dense", "reduce_update_rows lazy"})
    any = any || bench.selected(std::string(c) + " " + tc.name);
  if (!any) return;
  const Device dev = ctx.device;
  const int64_t R = tc.R;
  const std::vector<int32_t>& hid = *tc.ids;
  const uint64_t tag = tc.R;  // separates the tables' random streams
  const int threads = std::max(1, ctx.threads);
  const double F = sizeof(float);

  // Table [R×D] ~ U(-0.02, 0.02) (the init is N(0, 0.01²); values do not change
  // the timing), Adam moments m [R×D] and v [R×D] >= 0 as after some steps.
  const std::vector<float> h_table = host_uniform(threads, o.seed, tag + 1, R * D, -0.02f, 0.02f);
  const std::vector<float> h_m = host_uniform(threads, o.seed, tag + 2, R * D, -1e-3f, 1e-3f);
  const std::vector<float> h_v = host_uniform(threads, o.seed, tag + 3, R * D, 0.0f, 1e-5f);
  Buffer<float> table = to_device(dev, h_table), m = to_device(dev, h_m), v = to_device(dev, h_v);
  Buffer<int32_t> ids = to_device(dev, hid);
  Buffer<float> rows_a(dev, B * D), rows_b(dev, B * D), rows_c(dev, B * D);  // [B×D] each
  Buffer<int32_t> unique(dev, B), local(dev, B);                             // [B]
  Buffer<int64_t> inverse(dev, B), perm(dev, B);                             // [B]
  std::vector<int64_t> counts(kWorld);                                       // host [W]

  // Host facts the checks use: distinct ids ascending, and rows in batch order.
  std::vector<int32_t> h_sorted = hid;
  std::sort(h_sorted.begin(), h_sorted.end());
  std::vector<int32_t> h_unique = h_sorted;
  h_unique.erase(std::unique(h_unique.begin(), h_unique.end()), h_unique.end());
  const int64_t NU = int64_t(h_unique.size());
  std::vector<float> h_rows(static_cast<size_t>(B * D));
  parallel_for(threads, B, 4096, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k)
      std::copy_n(&h_table[size_t(hid[k]) * D], D, &h_rows[size_t(k) * D]);
  });
  const std::string t = tc.name;

  bench.run(
      "gather_rows " + t, shape_str("n=%lld R=%lld D=%d", (long long)B, (long long)R, D),
      2 * B * D * F + B * 4.0, double(B), "rows", 0,
      [&] { gather_rows(ctx, table.data(), ids.data(), rows_a.data(), R, B, D); },
      [&]() -> std::string {
        gather_rows(ctx, table.data(), ids.data(), rows_a.data(), R, B, D);
        const int64_t bad = mismatches(to_host(rows_a, B * D), h_rows, 0, 0);
        return bad ? std::to_string(bad) + " elements differ" : "";
      });

  int64_t nu = 0;
  bench.run(
      "unique_ids " + t, shape_str("n=%lld -> %lld unique", (long long)B, (long long)NU),
      B * 4.0 + B * 8.0 + NU * 4.0, double(B), "ids", 0,
      [&] { unique_ids(ctx, ids.data(), B, unique.data(), inverse.data(), &nu); },
      [&]() -> std::string {
        unique_ids(ctx, ids.data(), B, unique.data(), inverse.data(), &nu);
        if (nu != NU) return "n_unique " + std::to_string(nu) + ", want " + std::to_string(NU);
        const std::vector<int32_t> u = to_host(unique, nu);
        const std::vector<int64_t> inv = to_host(inverse, B);
        if (u != h_unique) return "unique ids differ";
        for (int64_t k = 0; k < B; ++k)
          if (inv[k] < 0 || inv[k] >= nu || u[inv[k]] != hid[k])
            return "inverse[" + std::to_string(k) + "] wrong";
        return "";
      });
  if (nu != NU) unique_ids(ctx, ids.data(), B, unique.data(), inverse.data(), &nu);

  // The de-duplicated lookup's last move: rows of the unique ids [nu×D] to batch order.
  gather_rows(ctx, table.data(), unique.data(), rows_b.data(), R, nu, D);
  bench.run(
      "permute_rows " + t, shape_str("%lld -> n=%lld D=%d", (long long)nu, (long long)B, D),
      2 * B * D * F + B * 8.0, double(B), "rows", 0,
      [&] { permute_rows(ctx, rows_b.data(), nu, inverse.data(), rows_c.data(), B, D); },
      [&]() -> std::string {
        permute_rows(ctx, rows_b.data(), nu, inverse.data(), rows_c.data(), B, D);
        const int64_t bad = mismatches(to_host(rows_c, B * D), h_rows, 0, 0);
        return bad ? std::to_string(bad) + " elements differ" : "";
      });

  // One row-wise table: the key of an id is the id, its row on the owner id / W.
  KeyLayout layout;
  layout.W = kWorld;
  layout.T = 1;
  layout.key_begin[1] = R;
  layout.placement[0] = Placement::kRowWise;
  bench.run(
      "bucketize_by_owner " + t, shape_str("n=%lld W=%d", (long long)B, kWorld),
      B * 4.0 + B * 8.0 + B * 4.0, double(B), "ids", 0,
      [&] {
        bucketize_by_owner(ctx, ids.data(), B, layout, perm.data(), local.data(), counts.data());
      },
      [&]() -> std::string {
        bucketize_by_owner(ctx, ids.data(), B, layout, perm.data(), local.data(), counts.data());
        std::vector<int64_t> want(kWorld, 0);
        for (int32_t x : hid) ++want[x % kWorld];
        if (counts != want) return "counts differ";
        const std::vector<int64_t> p = to_host(perm, B);
        const std::vector<int32_t> l = to_host(local, B);
        for (int64_t k = 0; k < B; ++k) {
          if (p[k] < 0 || p[k] >= B) return "perm[" + std::to_string(k) + "] out of range";
          const int32_t x = hid[p[k]];
          if (l[k] != x / kWorld) return "local[" + std::to_string(k) + "] wrong";
          // Owner order, and input order within an owner (stable).
          if (k && (hid[p[k - 1]] % kWorld > x % kWorld ||
                    (hid[p[k - 1]] % kWorld == x % kWorld && p[k - 1] >= p[k])))
            return "not in stable owner order at " + std::to_string(k);
        }
        return "";
      });

  // Rows arriving in owner order go back to batch order: rows_c[perm[k]] = rows_a[k].
  gather_rows(ctx, table.data(), ids.data(), rows_a.data(), R, B, D);
  bench.run(
      "unpermute_rows " + t, shape_str("n=%lld D=%d", (long long)B, D), 2 * B * D * F + B * 8.0,
      double(B), "rows", 0,
      [&] { unpermute_rows(ctx, rows_a.data(), perm.data(), rows_c.data(), B, D); },
      [&]() -> std::string {
        unpermute_rows(ctx, rows_a.data(), perm.data(), rows_c.data(), B, D);
        const std::vector<int64_t> p = to_host(perm, B);
        const std::vector<float> got = to_host(rows_c, B * D);
        int64_t bad = 0;
        for (int64_t k = 0; k < B; ++k)
          bad += !std::equal(&got[size_t(p[k]) * D], &got[size_t(p[k]) * D] + D,
                             &h_rows[size_t(k) * D]);
        return bad ? std::to_string(bad) + " rows differ" : "";
      });

  // The owner side of the backward: batch gradient rows summed per row id.
  const std::vector<float> h_grads = host_int_grads(threads, o.seed + tag, B * D);
  device_copy(dev, rows_b.data(), Device::kCpu, h_grads.data(), h_grads.size() * sizeof(float));
  Buffer<int32_t> red_rows(dev, B);
  Buffer<float> red_grads(dev, B * D);
  int64_t nr = 0;
  // The longest run of one id: the item table's hottest item (~2·10^4 rows at
  // B = 2^20) is what the sub-run split of sort_reduce_rows is for.
  int64_t longest = 0;
  for (size_t k = 0, j = 0; k < h_sorted.size(); k = j) {
    for (j = k; j < h_sorted.size() && h_sorted[j] == h_sorted[k];) ++j;
    longest = std::max<int64_t>(longest, int64_t(j - k));
  }
  bench.run(
      "sort_reduce_rows " + t,
      shape_str("n=%lld -> %lld D=%d, max run %lld", (long long)B, (long long)NU, D,
                (long long)longest),
      B * 4.0 + B * D * F + NU * 4.0 + NU * D * F, double(B), "rows", 0,
      [&] {
        sort_reduce_rows(ctx, ids.data(), rows_b.data(), B, D, red_rows.data(), red_grads.data(),
                         &nr);
      },
      [&]() -> std::string {
        sort_reduce_rows(ctx, ids.data(), rows_b.data(), B, D, red_rows.data(), red_grads.data(),
                         &nr);
        if (nr != NU) return "n_unique " + std::to_string(nr) + ", want " + std::to_string(NU);
        if (to_host(red_rows, nr) != h_unique) return "row ids differ";
        std::vector<float> want(size_t(NU * D), 0.0f);
        for (int64_t k = 0; k < B; ++k) {
          const int64_t j =
              std::lower_bound(h_unique.begin(), h_unique.end(), hid[k]) - h_unique.begin();
          for (int d = 0; d < D; ++d) want[size_t(j) * D + d] += h_grads[size_t(k) * D + d];
        }
        const int64_t bad = mismatches(to_host(red_grads, nr * D), want, 0, 0);
        return bad ? std::to_string(bad) + " sums differ (integer data: exact)" : "";
      });
  if (nr != NU)
    sort_reduce_rows(ctx, ids.data(), rows_b.data(), B, D, red_rows.data(), red_grads.data(), &nr);

  // The table update with the MLPerf Adam settings. Timed runs keep t = 1: the
  // step only changes two host scalars.
  AdamHyper hyper;
  hyper.lr = 0.0045f, hyper.beta1 = 0.25f, hyper.beta2 = 0.5f, hyper.eps = 1e-8f;
  // Host reference of one update from the initial state; GPU FMA contraction
  // and sqrtf/division rounding differ by a few ulps: atol 1e-9, rtol 1e-5.
  auto check_adam = [&](bool lazy) -> std::string {
    device_copy(dev, table.data(), Device::kCpu, h_table.data(), h_table.size() * sizeof(float));
    device_copy(dev, m.data(), Device::kCpu, h_m.data(), h_m.size() * sizeof(float));
    device_copy(dev, v.data(), Device::kCpu, h_v.data(), h_v.size() * sizeof(float));
    (lazy ? embedding_lazy_adam : embedding_dense_adam)(ctx, table.data(), m.data(), v.data(),
                                                        red_rows.data(), red_grads.data(), R, nr, D,
                                                        1, hyper);
    std::vector<float> p = h_table, mm = h_m, vv = h_v;
    const std::vector<float> g = to_host(red_grads, nr * D);
    const AdamStepScalars s = adam_step_scalars(hyper, 1);
    std::vector<int64_t> slot(size_t(R), -1);
    for (int64_t j = 0; j < nr; ++j) slot[h_unique[j]] = j;
    for (int64_t r = 0; r < R; ++r) {
      if (lazy && slot[r] < 0) continue;
      for (int d = 0; d < D; ++d) {
        const size_t e = size_t(r) * D + d;
        adam_update(&p[e], &mm[e], &vv[e], slot[r] < 0 ? 0.0f : g[size_t(slot[r]) * D + d], s);
      }
    }
    const int64_t bad = mismatches(to_host(table, R * D), p, 1e-9, 1e-5) +
                        mismatches(to_host(m, R * D), mm, 1e-9, 1e-5) +
                        mismatches(to_host(v, R * D), vv, 1e-9, 1e-5);
    return bad ? std::to_string(bad) + " elements of table/m/v differ" : "";
  };
  bench.run(
      "embedding_dense_adam " + t,
      shape_str("R=%lld D=%d, %lld rows of grads", (long long)R, D, (long long)nr),
      6 * R * D * F + nr * D * F + nr * 4.0, double(R), "rows", 0,
      [&] {
        embedding_dense_adam(ctx, table.data(), m.data(), v.data(), red_rows.data(),
                             red_grads.data(), R, nr, D, 1, hyper);
      },
      [&] { return check_adam(false); });
  bench.run(
      "embedding_lazy_adam " + t,
      shape_str("%lld of R=%lld rows, D=%d", (long long)nr, (long long)R, D),
      7 * nr * D * F + nr * 4.0, double(nr), "rows", 0,
      [&] {
        embedding_lazy_adam(ctx, table.data(), m.data(), v.data(), red_rows.data(),
                            red_grads.data(), R, nr, D, 1, hyper);
      },
      [&] { return check_adam(true); });

  // The fused reduce-and-update from the batch's ids, against the separate
  // sort_reduce_rows + embedding_dense_adam (lazy) on the same start: the same
  // bits on the CPU; within the Adam tolerance above on a GPU.
  for (bool lazy : {false, true}) {
    EmbeddingOptimizerConfig fused_opt;
    fused_opt.kind = lazy ? EmbeddingOptimizer::kLazyAdam : EmbeddingOptimizer::kDenseAdam;
    fused_opt.adam = hyper;
    auto reset = [&] {
      device_copy(dev, table.data(), Device::kCpu, h_table.data(), h_table.size() * sizeof(float));
      device_copy(dev, m.data(), Device::kCpu, h_m.data(), h_m.size() * sizeof(float));
      device_copy(dev, v.data(), Device::kCpu, h_v.data(), h_v.size() * sizeof(float));
    };
    const TableRows rows{table.data(), m.data(), v.data(), R, D};
    bench.run(
        std::string("reduce_update_rows ") + (lazy ? "lazy " : "dense ") + t,
        shape_str("n=%lld -> %lld of R=%lld rows, D=%d", (long long)B, (long long)NU, (long long)R,
                  D),
        B * 4.0 + B * D * F + (lazy ? 7 * NU * D * F : 6 * R * D * F), double(B), "rows", 0,
        [&] { reduce_update_rows(ctx, ids.data(), rows_b.data(), B, rows, fused_opt, 1); },
        [&]() -> std::string {
          reset();
          int64_t fused_nu = 0;
          reduce_update_rows(ctx, ids.data(), rows_b.data(), B, rows, fused_opt, 1, &fused_nu);
          if (fused_nu != NU) return "n_unique " + std::to_string(fused_nu);
          const std::vector<float> got[3] = {to_host(table, R * D), to_host(m, R * D),
                                             to_host(v, R * D)};
          reset();
          sort_reduce_rows(ctx, ids.data(), rows_b.data(), B, D, red_rows.data(), red_grads.data(),
                           &nr);
          (lazy ? embedding_lazy_adam : embedding_dense_adam)(ctx, table.data(), m.data(), v.data(),
                                                              red_rows.data(), red_grads.data(), R,
                                                              nr, D, 1, hyper);
          const double atol = dev == Device::kCpu ? 0 : 1e-9, rtol = dev == Device::kCpu ? 0 : 1e-5;
          const int64_t bad = mismatches(got[0], to_host(table, R * D), atol, rtol) +
                              mismatches(got[1], to_host(m, R * D), atol, rtol) +
                              mismatches(got[2], to_host(v, R * D), atol, rtol);
          return bad ? std::to_string(bad) + " elements differ from the separate ops" : "";
        });
  }
}

// ---- dense cases ------------------------------------------------------------------

// The ml-20m MLPerf NeuMF, initialised from the seed.
NeuMF make_tower(Device dev, uint64_t seed) {
  NeuMFConfig cfg;
  cfg.mf_dim = kMf;
  cfg.layers = kLayers;
  NeuMF model(cfg, dev);
  model.init(seed);
  return model;
}

// GEMM FLOPs of one sample's tower forward + backward: Y = X·weights^T forward, dX
// and dweights backward, per layer.
double tower_flops_per_sample() {
  double macs = 0;
  for (size_t l = 0; l + 1 < kLayers.size(); ++l) macs += double(kLayers[l]) * kLayers[l + 1];
  return 3 * 2 * macs;
}

// The NeuMF tower forward + backward (GMF, MLP, head) under each math mode.
void tower_cases(Bench& bench, const ExecContext& ctx, const Options& o, const HostBatch& hb,
                 int D) {
  const Device dev = ctx.device;
  const int64_t B = hb.B;
  const int threads = std::max(1, ctx.threads);
  NeuMF model = make_tower(dev, o.seed);
  // Gathered rows ~ U(-0.02, 0.02) and a loss gradient of the size BCE gives.
  Buffer<float> urows = to_device(dev, host_uniform(threads, o.seed, 21, B * D, -0.02f, 0.02f));
  Buffer<float> irows = to_device(dev, host_uniform(threads, o.seed, 22, B * D, -0.02f, 0.02f));
  Buffer<float> dlogits =
      to_device(dev, host_uniform(threads, o.seed, 23, B, -1.0f / float(B), 1.0f / float(B)));
  Buffer<float> logits(dev, B), du(dev, B * D), di(dev, B * D);  // [B], [B×D], [B×D]
  const double flops = tower_flops_per_sample() * double(B);

  // bf16 exists in ops.h (MathMode::kBf16); on the CPU tf32 computes plain fp32.
  for (const MathMode mode : {MathMode::kTf32, MathMode::kFp32, MathMode::kBf16}) {
    const std::string name = std::string("neumf_fwd_bwd ") + math_mode_name(mode);
    if (!bench.selected(name)) continue;
    set_math_mode(mode);
    auto step = [&] {
      model.forward(ctx, urows.data(), irows.data(), B, 1, logits.data());
      model.backward(ctx, dlogits.data(), du.data(), di.data());
    };
    bench.run(name, shape_str("B=%lld D=%d layers 256,256,128,64", (long long)B, D), 0, double(B),
              "samples", flops, step, [&]() -> std::string {
                step();
                check_device_errors(ctx);
                const std::vector<float> z = to_host(logits, B);
                const std::vector<float> g = to_host(model.grads(), model.num_params());
                for (float x : z)
                  if (!std::isfinite(x)) return "non-finite logit";
                for (float x : g)
                  if (!std::isfinite(x)) return "non-finite gradient";
                return "";  // values: tests/test_parity_gpu.cc
              });
  }
  set_math_mode(MathMode::kTf32);
}

// Outputs got against want: output k within rtols[k] relative (0 or absent: the same
// bits), or, with rms > 0, each output within that relative RMS. "" or what differs from
// `ref`.
std::string compare_outputs(const std::vector<std::vector<float>>& got,
                            const std::vector<std::vector<float>>& want,
                            const std::vector<double>& rtols, double rms, const std::string& ref) {
  if (got.size() != want.size()) return "not the outputs of " + ref;
  for (size_t k = 0; rms > 0 && k < got.size(); ++k) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got[k].size(); ++i) {
      const double d = double(got[k][i]) - want[k][i];
      num += d * d;
      den += double(want[k][i]) * want[k][i];
    }
    const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (!(e <= rms))
      return "output " + std::to_string(k) + " at relative RMS " + std::to_string(e) + " from " +
             ref + " (bound " + std::to_string(rms) + ")";
  }
  if (rms > 0) return "";
  int64_t bad = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k].size() != want[k].size()) return "output " + std::to_string(k) + " of another size";
    if (k < rtols.size() && rtols[k] > 0) {
      bad += mismatches(got[k], want[k], 1e-12, rtols[k]);
      continue;
    }
    for (size_t i = 0; i < got[k].size(); ++i)
      bad += std::memcmp(&got[k][i], &want[k][i], sizeof(float)) != 0;
  }
  return bad ? std::to_string(bad) + " values differ from " + ref : "";
}

// Post-ReLU activations (about half zeros).
std::vector<float> post_relu(int threads, uint64_t seed, uint64_t stream, int64_t count) {
  std::vector<float> v = host_uniform(threads, seed, stream, count, -1.0f, 1.0f);
  for (float& x : v) x = std::max(x, 0.0f);
  return v;
}

// The tower step's element-wise and masked passes on the GPU, at the step's shapes: layer
// 0's forward join (group_bias_act) and group sum (n = B / S users, S = 1 + kNumNeg, out
// 256, the ReLU mask and the bias gradient), and the backward of layers 1 and 2 (mask,
// bias gradient, dX and dweights GEMMs). The checks: the CPU twins on the same inputs
// (linear_backward's dZ and db: a host loop, as its twin would multiply the GEMMs too),
// every element the same bits, the bias gradients within a double sum's rounding. The
// kernels these replaced are timed beside them in bench/kernels/. The byte counts are
// the logical bytes of the op (each array read or written once).
void step_pass_cases(Bench& bench, const ExecContext& ctx, const Options& o, const HostBatch& hb) {
  const Device dev = ctx.device;
  if (dev != Device::kCuda) return;
  const int threads = std::max(1, ctx.threads);
  ExecContext cpu;  // the CPU twins'
  cpu.threads = threads;
  const int S = 1 + kNumNeg;
  const int64_t n = hb.B / S, B = n * S;
  const double dsum_rtol = 1e-6;           // two orders of double sums, each rounded to float once
  if (bench.selected("group_bias_act")) {  // Y = ReLU(Y + U0[b / S] + b0), after the items' GEMM
    const int out = kLayers[1];
    const std::vector<float> hY = host_uniform(threads, o.seed, 58, B * out, -1.0f, 1.0f);
    const std::vector<float> hU0 = host_uniform(threads, o.seed, 59, n * out, -1.0f, 1.0f);
    const std::vector<float> hb0 = host_uniform(threads, o.seed, 60, out, -0.1f, 0.1f);
    Buffer<float> Y = to_device(dev, hY), U0 = to_device(dev, hU0), b0 = to_device(dev, hb0);
    auto op = [&] { group_bias_act(ctx, Y.data(), U0.data(), b0.data(), n, S, out, true); };
    bench.run("group_bias_act", shape_str("n=%lld S=%d out=%d, + bias, ReLU", (long long)n, S, out),
              4.0 * (2.0 * B * out + n * out), double(B), "samples", 0, op, [&]() -> std::string {
                device_copy(dev, Y.data(), Device::kCpu, hY.data(), hY.size() * sizeof(float));
                op();
                check_device_errors(ctx);
                std::vector<float> want = hY;
                group_bias_act(cpu, want.data(), hU0.data(), hb0.data(), n, S, out, true);
                return compare_outputs({to_host(Y, B * out)}, {want}, {}, 0, "the CPU twin's");
              });
  }
  if (bench.selected("group_sum_backward")) {  // layer 0's group sum, mask and bias gradient
    const int out = kLayers[1];
    const std::vector<float> hY = post_relu(threads, o.seed, 61, B * out);
    const std::vector<float> hdY = host_uniform(threads, o.seed, 62, B * out, -1e-3f, 1e-3f);
    Buffer<float> Y = to_device(dev, hY), dY = to_device(dev, hdY);
    Buffer<float> dU(dev, n * out), db(dev, out);
    auto op = [&] {
      group_sum_backward(ctx, Y.data(), dY.data(), n, S, out, dU.data(), out, db.data(), true);
    };
    bench.run(
        "group_sum_backward", shape_str("n=%lld S=%d out=%d, mask + db", (long long)n, S, out),
        4.0 * (3.0 * B * out + 2.0 * n * out), double(B), "samples", 0, op, [&]() -> std::string {
          device_copy(dev, dY.data(), Device::kCpu, hdY.data(), hdY.size() * sizeof(float));
          op();
          check_device_errors(ctx);
          std::vector<float> wdY = hdY, wdU(size_t(n * out)), wdb(static_cast<size_t>(out));
          group_sum_backward(cpu, hY.data(), wdY.data(), n, S, out, wdU.data(), out, wdb.data(),
                             true);
          return compare_outputs({to_host(dY, B * out), to_host(dU, n * out), to_host(db, out)},
                                 {wdY, wdU, wdb}, {0, 0, dsum_rtol}, 0, "the CPU twin's");
        });
  }
  for (size_t l = 1; l + 1 < kLayers.size(); ++l) {  // layers 1 and 2
    const std::string name = "linear_backward L" + std::to_string(l);
    if (!bench.selected(name)) continue;
    const int in = kLayers[l], out = kLayers[l + 1];
    const std::vector<float> hY = post_relu(threads, o.seed, 63 + l, B * out);
    const std::vector<float> hdY = host_uniform(threads, o.seed, 66 + l, B * out, -1e-3f, 1e-3f);
    Buffer<float> X = to_device(dev, post_relu(threads, o.seed, 69 + l, B * in));
    Buffer<float> W =
        to_device(dev, host_uniform(threads, o.seed, 72 + l, int64_t(out) * in, -0.1f, 0.1f));
    Buffer<float> Y = to_device(dev, hY), dY = to_device(dev, hdY);
    Buffer<float> dX(dev, B * in), dW(dev, int64_t(out) * in), db(dev, out);
    auto op = [&] {
      linear_backward(ctx, X.data(), W.data(), Y.data(), dY.data(), dX.data(), dW.data(), db.data(),
                      B, in, out, true, GradMode::kOverwrite);
    };
    bench.run(name, shape_str("B=%lld in=%d out=%d, mask + db + GEMMs", (long long)B, in, out),
              4.0 * (5.0 * B * out + 2.0 * B * in), double(B), "samples",
              2.0 * 2.0 * double(B) * in * out, op, [&]() -> std::string {
                device_copy(dev, dY.data(), Device::kCpu, hdY.data(), hdY.size() * sizeof(float));
                op();
                check_device_errors(ctx);
                std::vector<float> dz = hdY, wdb(static_cast<size_t>(out));
                std::vector<double> sums(size_t(out), 0.0);
                for (int64_t b = 0; b < B; ++b)
                  for (int j = 0; j < out; ++j) {
                    float& g = dz[size_t(b * out + j)];
                    if (!(hY[size_t(b * out + j)] > 0.0f)) g = 0.0f;
                    sums[size_t(j)] += g;
                  }
                for (int j = 0; j < out; ++j) wdb[size_t(j)] = float(sums[size_t(j)]);
                return compare_outputs({to_host(dY, B * out), to_host(db, out)}, {dz, wdb},
                                       {0, dsum_rtol}, 0, "the host's mask and sums");
              });
  }
}

// NeuMF's fused top, on both devices: the whole tower as ncf_dist runs it (n users of S
// samples, tf32 and bf16) and the top alone (GMF, head, BCE forward and backward, the last
// layer's mask and db). The checks: the unfused ops the fused top replaced, which the
// library keeps for wider models (set_fused_top(false)), run untimed on the same inputs:
// every element the same bits, the fused top's sums (dw, dc, the last bias gradient, the
// loss) in another fixed order, within 1e-6 relative; on BF16 storage (bf16) against the
// unfused top's per-GEMM copies, each output within (L + 2)·2^-8 in relative RMS
// (tests/test_bf16_storage.cc).
void fused_top_cases(Bench& bench, const ExecContext& ctx, const Options& o, const HostBatch& hb,
                     int D) {
  const Device dev = ctx.device;
  const int threads = std::max(1, ctx.threads);
  const int S = 1 + kNumNeg;
  const int64_t n = hb.B / S, B = n * S;
  // run op (fused) and reference (the unfused ops: set_fused_top(false)), compare outputs.
  auto against_unfused = [&](const std::function<void()>& op,
                             const std::function<std::vector<std::vector<float>>()>& outputs,
                             const std::vector<double>& rtols, double rms) -> std::string {
    set_fused_top(false);
    op();
    check_device_errors(ctx);
    const std::vector<std::vector<float>> unfused = outputs();
    set_fused_top(true);
    op();
    check_device_errors(ctx);
    return compare_outputs(outputs(), unfused, rtols, rms, "the unfused ops'");
  };
  // the tower as ncf_dist runs it: n users of S samples
  if (bench.selected("neumf_fwd_bwd_grouped tf32") ||
      bench.selected("neumf_fwd_bwd_grouped bf16")) {
    NeuMF model = make_tower(dev, o.seed);
    Buffer<float> urows = to_device(dev, host_uniform(threads, o.seed, 81, n * D, -0.02f, 0.02f));
    Buffer<float> irows = to_device(dev, host_uniform(threads, o.seed, 82, B * D, -0.02f, 0.02f));
    Buffer<float> dlogits =
        to_device(dev, host_uniform(threads, o.seed, 83, B, -1.0f / float(B), 1.0f / float(B)));
    Buffer<float> logits(dev, B), du(dev, n * D), di(dev, B * D);
    auto op = [&] {
      model.forward(ctx, urows.data(), irows.data(), n, S, logits.data());
      model.backward(ctx, dlogits.data(), du.data(), di.data());
    };
    auto outputs = [&] {
      return std::vector<std::vector<float>>{to_host(logits, B),
                                             to_host(model.grads(), model.num_params()),
                                             to_host(du, n * D), to_host(di, B * D)};
    };
    for (const MathMode mode : {MathMode::kTf32, MathMode::kBf16}) {
      set_math_mode(mode);
      // the fused top's dw, dc and last bias gradient: another order of double sums;
      // bf16: BF16 storage, within (L + 2)·2^-8 (tests/test_bf16_storage.cc)
      const double rms = mode == MathMode::kBf16 ? (kLayers.size() - 1 + 2) / 256.0 : 0.0;
      bench.run(std::string("neumf_fwd_bwd_grouped ") + math_mode_name(mode),
                shape_str("n=%lld S=%d D=%d layers 256,256,128,64", (long long)n, S, D), 0,
                double(B), "samples", tower_flops_per_sample() * double(B), op, [&] {
                  return against_unfused(op, outputs, {0, 1e-6, 0, 0}, rms);
                });
    }
    set_math_mode(MathMode::kTf32);
  }
  const std::string name = "neumf_top";
  if (!bench.selected(name)) return;
  const int mf = kMf, last = kLayers.back(), F = mf + last;
  Buffer<float> urows = to_device(dev, host_uniform(threads, o.seed, 84, n * D, -0.02f, 0.02f));
  Buffer<float> irows = to_device(dev, host_uniform(threads, o.seed, 85, B * D, -0.02f, 0.02f));
  Buffer<float> A = to_device(dev, post_relu(threads, o.seed, 86, B * last));
  Buffer<float> wc = to_device(dev, host_uniform(threads, o.seed, 87, F + 1, -0.1f, 0.1f));
  std::vector<float> hy = host_uniform(threads, o.seed, 88, B, 0.0f, 1.0f);
  for (float& y : hy) y = y < 0.2f ? 1.0f : 0.0f;
  Buffer<float> labels = to_device(dev, hy);
  Buffer<float> logits(dev, B), g(dev, B), ug(dev, B * mf), G(dev, B * mf), H(dev, B * F),
      dH(dev, B * F), dG(dev, B * mf), dug(dev, B * mf), dA(dev, B * last), du(dev, n * D),
      di(dev, B * D), dwc(dev, F + 1), db(dev, last);
  Buffer<double> loss(dev, 1);
  // Logical bytes of the fused pair: the users' and items' GMF columns and A read
  // twice, the logits and labels, dA and both GMF gradients written.
  const double bytes =
      4.0 * (2.0 * (n * mf + B * mf + B * last) + 3.0 * B + B * last + B * mf + n * mf);
  auto op = [&] {
    if (fused_top_enabled()) {
      neumf_top_forward(ctx, urows.data(), D, irows.data(), D, A.data(), wc.data(), wc.data() + F,
                        logits.data(), n, S, mf, last);
      neumf_top_backward(ctx, urows.data(), D, irows.data(), D, A.data(), wc.data(), nullptr,
                         logits.data(), labels.data(), B, loss.data(), dA.data(), du.data(), D,
                         di.data(), D, dwc.data(), dwc.data() + F, db.data(), n, S, mf, last, true);
      return;
    }
    // The unfused ops NeuMF runs for wider models (the mask and db are linear_backward's:
    // a mask pass and column sums, here group_sum_backward's with S = 1).
    repeat_rows(ctx, urows.data(), D, mf, ug.data(), n, S);
    gmf_forward(ctx, ug.data(), mf, irows.data(), D, G.data(), mf, B, mf);
    concat_cols(ctx, G.data(), mf, mf, A.data(), last, last, H.data(), B);
    head_forward(ctx, H.data(), wc.data(), wc.data() + F, logits.data(), B, F);
    bce_with_logits_forward(ctx, logits.data(), labels.data(), nullptr, loss.data(), B, B, B);
    bce_with_logits_backward(ctx, logits.data(), labels.data(), nullptr, g.data(), B, B, B);
    head_backward(ctx, H.data(), wc.data(), g.data(), dH.data(), dwc.data(), dwc.data() + F, B, F,
                  GradMode::kOverwrite);
    split_cols(ctx, dH.data(), mf, last, dG.data(), mf, dA.data(), last, B);
    group_sum_backward(ctx, A.data(), dA.data(), B, 1, last, dug.data(), mf, db.data(), true);
    gmf_backward(ctx, ug.data(), mf, irows.data(), D, dG.data(), mf, dug.data(), mf, di.data(), D,
                 B, mf);
    group_sum_backward(ctx, nullptr, dug.data(), n, S, mf, du.data(), D, nullptr, false);
  };
  auto outputs = [&] {
    std::vector<double> l = to_host(loss, 1);
    return std::vector<std::vector<float>>{
        to_host(logits, B),  to_host(dA, B * last), to_host(du, n * D), to_host(di, B * D),
        to_host(dwc, F + 1), to_host(db, last),     {float(l[0])}};
  };
  bench.run(name,
            shape_str("n=%lld S=%d mf=%d last=%d, fwd + loss + bwd", (long long)n, S, mf, last),
            bytes, double(B), "samples", 0, op, [&] {
              return against_unfused(op, outputs, {0, 0, 0, 0, 1e-6, 1e-6, 1e-6}, 0);
            });
}

// The head's backward on its own: dH = dlogits·w^T and the F + 1 column sums
// dw = H^T·dlogits, dc = Σ dlogits over all B rows (at B = 2^20: 4096 row chunks
// whose partials the deterministic column sums combine).
void head_case(Bench& bench, const ExecContext& ctx, const Options& o, const HostBatch& hb) {
  if (!bench.selected("head_backward")) return;
  const Device dev = ctx.device;
  const int64_t B = hb.B;
  const int F = kMf + kLayers.back();  // GMF output ++ last MLP layer
  const int threads = std::max(1, ctx.threads);
  const std::vector<float> hH = host_uniform(threads, o.seed, 51, B * F, -1.0f, 1.0f);
  const std::vector<float> hw = host_uniform(threads, o.seed, 52, F + 1, -0.1f, 0.1f);
  const std::vector<float> hg =
      host_uniform(threads, o.seed, 53, B, -1.0f / float(B), 1.0f / float(B));
  Buffer<float> H = to_device(dev, hH), wc = to_device(dev, hw), g = to_device(dev, hg);
  Buffer<float> dH(dev, B * F), dwc(dev, F + 1);  // [B×F], dw [F] then dc
  auto op = [&] {
    head_backward(ctx, H.data(), wc.data(), g.data(), dH.data(), dwc.data(), dwc.data() + F, B, F,
                  GradMode::kOverwrite);
  };
  bench.run("head_backward", shape_str("B=%lld F=%d (%d column sums)", (long long)B, F, F + 1),
            B * F * 8.0 + B * 4.0 + (F + 1) * 8.0, double(B), "samples", 0, op,
            [&]() -> std::string {
              op();
              std::vector<double> want(size_t(F) + 1, 0.0);
              for (int64_t b = 0; b < B; ++b) {
                for (int k = 0; k < F; ++k) want[k] += double(hg[b]) * hH[size_t(b) * F + k];
                want[F] += hg[b];
              }
              std::vector<float> want_f(want.begin(), want.end());
              // Sums in double, rounded to float once: 1 ulp apart at most (rtol 1e-6).
              int64_t bad = mismatches(to_host(dwc, F + 1), want_f, 1e-12, 1e-6);
              const std::vector<float> got_dh = to_host(dH, B * F);
              for (int64_t b = 0; b < B && !bad; ++b)
                for (int k = 0; k < F; ++k) bad += got_dh[size_t(b) * F + k] != hg[b] * hw[k];
              return bad ? std::to_string(bad) + " of dw, dc, dH differ" : "";
            });
}

void bce_cases(Bench& bench, const ExecContext& ctx, const Options& o, const HostBatch& hb) {
  const Device dev = ctx.device;
  const int64_t B = hb.B;
  const std::vector<float> hz = host_uniform(std::max(1, ctx.threads), o.seed, 31, B, -4.0f, 4.0f);
  Buffer<float> z = to_device(dev, hz), y = to_device(dev, hb.labels), dz(dev, B);
  Buffer<double> loss(dev, 1);
  auto row_loss = [&](int64_t b) {
    const double x = hz[b];
    return std::max(x, 0.0) - x * hb.labels[b] + std::log1p(std::exp(-std::fabs(x)));
  };
  bench.run(
      "bce_forward", shape_str("B=%lld", (long long)B), B * 8.0, double(B), "samples", 0,
      [&] { bce_with_logits_forward(ctx, z.data(), y.data(), nullptr, loss.data(), B, B, B); },
      [&]() -> std::string {
        bce_with_logits_forward(ctx, z.data(), y.data(), nullptr, loss.data(), B, B, B);
        double want = 0;
        for (int64_t b = 0; b < B; ++b) want += row_loss(b);
        want /= double(B);
        const double got = to_host(loss, 1)[0];
        // float log/exp per row, summed in blocks: rtol 1e-5.
        return std::fabs(got - want) <= 1e-5 * std::fabs(want)
                   ? ""
                   : "loss " + std::to_string(got) + ", want " + std::to_string(want);
      });
  bench.run(
      "bce_backward", shape_str("B=%lld", (long long)B), B * 12.0, double(B), "samples", 0,
      [&] { bce_with_logits_backward(ctx, z.data(), y.data(), nullptr, dz.data(), B, B, B); },
      [&]() -> std::string {
        bce_with_logits_backward(ctx, z.data(), y.data(), nullptr, dz.data(), B, B, B);
        std::vector<float> want(static_cast<size_t>(B));
        for (int64_t b = 0; b < B; ++b)
          want[b] = float((1.0 / (1.0 + std::exp(-double(hz[b]))) - hb.labels[b]) / double(B));
        // expf vs exp: rtol 1e-5, atol 1e-6 of the 1/B scale.
        const int64_t bad = mismatches(to_host(dz, B), want, 1e-6 / double(B), 1e-5);
        return bad ? std::to_string(bad) + " gradients differ" : "";
      });
}

void negatives_case(Bench& bench, const ExecContext& ctx, const Options& o, const HostBatch& hb) {
  if (!bench.selected("sample_negatives")) return;
  const Device dev = ctx.device;
  const int64_t P = hb.P, B = hb.B;
  DevicePositiveLists lists(dev, hb.offsets.data(), hb.lists.data(), kUsers);
  Buffer<int32_t> pu = to_device(dev, hb.pos_users), pi = to_device(dev, hb.pos_items);
  Buffer<int32_t> ou(dev, B), oi(dev, B);  // [B]
  Buffer<float> ol(dev, B);                // [B]
  auto op = [&] {
    sample_negatives(ctx, lists, kItems, pu.data(), pi.data(), 0, P, kNumNeg, o.seed, 0, ou.data(),
                     oi.data(), ol.data());
  };
  bench.run(
      "sample_negatives",
      shape_str("%lld positives x (1+%d), lists %lld", (long long)P, kNumNeg,
                (long long)hb.lists.size()),
      P * 8.0 + B * 12.0, double(B), "samples", 0, op, [&]() -> std::string {
        op();
        check_device_errors(ctx);
        // The same counter-based draws on every device: exact.
        if (to_host(ou, B) != hb.users || to_host(oi, B) != hb.items || to_host(ol, B) != hb.labels)
          return "samples differ from the CPU sampler";
        return "";
      });
}

// One batch of evaluation's scoring by items as ncf_dist runs it on a GPU rank (1,000 users
// x 1,000 candidates, ml-20m's item table, BF16 storage): NeuMF::score_items with the ops
// one by one, and in one kernel (NCF_EVAL_FUSED, neumf_score_items_bf16), the second only
// on a GPU. The bytes are the fused op's logical ones for both (per candidate: its id,
// layer 0's FP32 product row, the item's GMF row, the logit), so their GB/s compare like
// their times; the FLOPs are the products above layer 0. The one kernel's check: at least
// half of the logits the bits of the ops with its epilogue expressions (set_lt_bf16_out(false)),
// the rest within the BF16 storage bound (Parity.FusedScoreItemsTracksTheOpsItFuses).
void score_items_cases(Bench& bench, const ExecContext& ctx, const Options& o) {
  const Device dev = ctx.device;
  const int64_t n = 1000, R = kItems;
  const int S = kEvalList;
  const int64_t B = n * S;
  const int threads = std::max(1, ctx.threads);
  NeuMF model = make_tower(dev, o.seed);
  const int D = model.config().embedding_width();
  Buffer<float> users = to_device(dev, host_uniform(threads, o.seed, 61, n * D, -0.02f, 0.02f));
  Buffer<float> table = to_device(dev, host_uniform(threads, o.seed, 62, R * D, -0.02f, 0.02f));
  std::vector<int32_t> hids(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) hids[b] = int32_t(hash_unit53(o.seed, 63, uint64_t(b)) * R);
  Buffer<int32_t> ids = to_device(dev, hids);
  Buffer<float> logits(dev, B);
  double macs = 0;
  for (size_t l = 1; l + 1 < kLayers.size(); ++l) macs += double(kLayers[l]) * kLayers[l + 1];
  const double bytes = double(B) * (4.0 + 4.0 * kLayers[1] + 4.0 * kMf + 4.0);
  set_math_mode(MathMode::kBf16);
  model.prepare_items(ctx, table.data() + kMf, D, R);
  auto score = [&](bool fused) {
    set_score_items_fused(fused);
    model.score_items(ctx, users.data(), table.data(), D, ids.data(), n, S, logits.data());
  };
  const std::string shape = shape_str("%lld users x %d candidates of %lld items, bf16 storage",
                                      (long long)n, S, (long long)R);
  bench.run(
      "score_items bf16 ops", shape, bytes, double(B), "candidates", 2 * macs * double(B),
      [&] { score(false); },
      [&]() -> std::string {
        score(false);
        check_device_errors(ctx);
        for (float x : to_host(logits, B))
          if (!std::isfinite(x)) return "non-finite logit";
        return "";
      });
  if (dev == Device::kCuda) {
    bench.run(
        "score_items bf16 fused", shape, bytes, double(B), "candidates", 2 * macs * double(B),
        [&] { score(true); },
        [&]() -> std::string {
          score(true);
          check_device_errors(ctx);
          if (!model.last_score_fused()) return "the widths did not fit one kernel";
          const std::vector<float> z = to_host(logits, B);
          // The ops with the one kernel's epilogue expressions: the FP32 product and the
          // epilogue kernel (set_lt_bf16_out(false)).
          const bool lt = lt_bf16_out_enabled();
          set_lt_bf16_out(false);
          score(false);
          set_lt_bf16_out(lt);
          const std::vector<float> ops_logits = to_host(logits, B);
          int64_t same = 0;
          double d2 = 0, r2 = 0;
          for (int64_t b = 0; b < B; ++b) {
            same += std::memcmp(&z[b], &ops_logits[b], sizeof(float)) == 0;
            d2 += (double(z[b]) - ops_logits[b]) * (double(z[b]) - ops_logits[b]);
            r2 += double(ops_logits[b]) * ops_logits[b];
          }
          const double rms = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
          const int L = int(kLayers.size()) - 2;  // layers above layer 0
          if (2 * same < B || rms > (L + 2) / 256.0)
            return std::to_string(same) + " of " + std::to_string(B) +
                   " logits the ops' bits, relative RMS " + std::to_string(rms);
          return "";
        });
  }
  set_score_items_fused(false);
  set_math_mode(MathMode::kTf32);
}

void metrics_case(Bench& bench, const ExecContext& ctx, const Options& o) {
  if (!bench.selected("hit_ndcg")) return;
  const Device dev = ctx.device;
  const int64_t U = o.eval_users;
  const int L = kEvalList;
  const int threads = std::max(1, ctx.threads);
  // Scores on a coarse grid (ties happen), ~0.5% of negatives masked.
  std::vector<float> hs = host_uniform(threads, o.seed, 41, U * L, 0.0f, 1.0f);
  for (float& x : hs) x = std::floor(x * 4096.0f) / 4096.0f;
  std::vector<uint8_t> hm(static_cast<size_t>(U * L));
  for (int64_t k = 0; k < U * L; ++k) hm[k] = hash_unit(o.seed, 42, uint64_t(k)) >= 0.005f;
  Buffer<float> scores = to_device(dev, hs);
  Buffer<uint8_t> mask = to_device(dev, hm);
  double hr = 0, ndcg = 0;
  bench.run(
      "hit_ndcg", shape_str("U=%lld L=%d K=%d", (long long)U, L, kTopK), U * L * 5.0, double(U),
      "users", 0, [&] { hit_ndcg(ctx, scores.data(), mask.data(), U, L, kTopK, &hr, &ndcg); },
      [&]() -> std::string {
        hit_ndcg(ctx, scores.data(), mask.data(), U, L, kTopK, &hr, &ndcg);
        double want_hr = 0, want_ndcg = 0;
        for (int64_t u = 0; u < U; ++u) {
          const float* s = &hs[size_t(u) * L];
          const uint8_t* mk = &hm[size_t(u) * L];
          int64_t rank = 0;
          for (int j = 1; j < L; ++j) rank += mk[j] && !(s[j] < s[0]);
          if (rank < kTopK) want_hr += 1, want_ndcg += std::log(2.0) / std::log(rank + 2.0);
        }
        if (hr != want_hr || std::fabs(ndcg - want_ndcg) > 1e-9 * std::max(1.0, want_ndcg))
          return "hr " + std::to_string(hr) + " ndcg " + std::to_string(ndcg) + ", want " +
                 std::to_string(want_hr) + " " + std::to_string(want_ndcg);
        return "";
      });
}

// ---- device description -------------------------------------------------------------

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// Name of the device and its DRAM peak in GB/s (0 when unknown).
std::string describe_device(const ExecContext& ctx, const Options& o, double* peak_gbs) {
  *peak_gbs = 0;
#ifdef NCF_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    cudaDeviceProp p{};
    NCF_CHECK(cudaGetDeviceProperties(&p, o.gpu) == cudaSuccess, "cudaGetDeviceProperties(", o.gpu,
              ") failed");
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, o.gpu) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, o.gpu) == cudaSuccess)
      *peak_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
    else
      cudaGetLastError();
    return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) +
           ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB)";
  }
#endif
  return cpu_model() + ", " + std::to_string(ctx.threads) + " threads, OpenBLAS " +
         blas_core_name() + " kernels";
}

int bench_main(const Options& o) {
  const Device dev = parse_device(o.device);
  NCF_CHECK(o.batch >= 1 + kNumNeg, "flag --batch ", o.batch, " must be >= ", 1 + kNumNeg);
  NCF_CHECK(o.eval_users >= 1, "flag --eval_users must be >= 1, got ", o.eval_users);
  if (dev == Device::kCuda) {
    std::string why;
    if (!cuda_available(&why))
      NCF_FAIL("--device cuda: no usable GPU (", why, "); use --device cpu on this machine");
  }
  struct ContextOwner {
    ExecContext ctx;
    ~ContextOwner() { destroy_cuda_context(ctx); }
  } owner;
  ExecContext& ctx = owner.ctx;
  if (dev == Device::kCuda) ctx = make_cuda_context(o.gpu);
  ctx.threads = o.threads > 0 ? o.threads : std::max(1, int(std::thread::hardware_concurrency()));

  double peak_gbs = 0;
  const std::string desc = describe_device(ctx, o, &peak_gbs);
  const int D = kMf + kLayers[0] / 2;
  std::printf("# bench_kernels: device %s: %s", device_name(dev), desc.c_str());
  if (peak_gbs > 0) std::printf(", DRAM peak %.0f GB/s", peak_gbs);
  std::printf(
      "\n# batch %lld samples/GPU (%lld positives x (1 + %d)), D = %d, tables %lld x %lld "
      "rows, warmup %d, median of %d runs, seed %llu\n",
      (long long)(o.batch / (1 + kNumNeg) * (1 + kNumNeg)), (long long)(o.batch / (1 + kNumNeg)),
      kNumNeg, D, (long long)kUsers, (long long)kItems, o.warmup, o.repeats,
      (unsigned long long)o.seed);
  std::fflush(stdout);

  const auto t0 = Clock::now();
  const HostBatch hb = make_batch(o.batch, o.seed, ctx.threads);
  std::printf("# inputs made on the host in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - t0).count());

  Bench bench(ctx, o, peak_gbs);
  bench.print_header();
  table_cases(bench, ctx, o, {"user", kUsers, &hb.users}, hb.B, D);
  table_cases(bench, ctx, o, {"item", kItems, &hb.items}, hb.B, D);
  tower_cases(bench, ctx, o, hb, D);
  step_pass_cases(bench, ctx, o, hb);
  fused_top_cases(bench, ctx, o, hb, D);
  head_case(bench, ctx, o, hb);
  bce_cases(bench, ctx, o, hb);
  negatives_case(bench, ctx, o, hb);
  metrics_case(bench, ctx, o);
  if (bench.selected("score_items bf16 ops") || bench.selected("score_items bf16 fused"))
    score_items_cases(bench, ctx, o);
  const int failed = bench.failures();
  std::printf("# %zu cases, %s\n", bench.results().size(),
              failed ? (std::to_string(failed) + " FAILED their check").c_str()
                     : "all checks passed (\"-\": not checked here)");

  if (!o.json.empty()) {
    nlohmann::json cases = nlohmann::json::array();
    for (const Result& r : bench.results()) {
      const double s = r.median_ms / 1e3;
      nlohmann::json c = {{"name", r.name},
                          {"shape", r.shape},
                          {"median_ms", r.median_ms},
                          {"min_ms", r.min_ms},
                          {"times_ms", r.ms},
                          {"rate", r.items / s},
                          {"rate_unit", r.unit + "/s"},
                          {"check", r.check}};
      if (r.bytes > 0) {
        c["bytes"] = r.bytes;
        c["gb_per_s"] = r.bytes / s / 1e9;
        if (peak_gbs > 0) c["fraction_of_peak"] = r.bytes / s / 1e9 / peak_gbs;
      }
      if (r.flops > 0) c["tflop_per_s"] = r.flops / s / 1e12;
      cases.push_back(c);
    }
    nlohmann::json j = {{"bench", "bench_kernels"},
                        {"device", device_name(dev)},
                        {"device_name", desc},
                        {"dram_peak_gb_per_s", peak_gbs},
                        {"batch", hb.B},
                        {"positives", hb.P},
                        {"D", D},
                        {"users", kUsers},
                        {"items", kItems},
                        {"layers", kLayers},
                        {"threads", ctx.threads},
                        {"warmup", o.warmup},
                        {"repeats", o.repeats},
                        {"seed", o.seed},
                        {"cases", cases}};
    std::ofstream f(o.json);
    NCF_CHECK(bool(f), "flag --json: cannot open ", o.json, " for writing");
    f << j.dump(2) << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  // The tower's CPU GEMMs run on the kernels ncf_dist would pick (blas_setup.h).
  ncf::upgrade_blas_kernels(argv);
  ncf::Options o;
  CLI::App app{"bench_kernels: time of each step kernel at the ml-20m MLPerf shapes"};
  app.add_option("--device", o.device, "where the kernels run")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--gpu", o.gpu, "CUDA device index")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per GPU per step (B)")->capture_default_str();
  app.add_option("--repeats", o.repeats, "timed runs per case (the median is reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed runs per case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU kernel threads (0: all cores)")
      ->capture_default_str();
  app.add_option("--eval_users", o.eval_users, "users of the hit_ndcg case (lists of 1000)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of every input")->capture_default_str();
  app.add_option("--filter", o.filter,
                 "run only the cases whose name contains this (or one of these, comma-separated)");
  app.add_option("--json", o.json, "also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return ncf::bench_main(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: error: %s\n", e.what());
    return 1;
  }
}
