// Test helpers: see test_util.h.
#include "test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "common/bf16.h"

namespace ncf::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ncf_test_XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << content;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream ss(text);
  std::string line, cell;
  while (std::getline(ss, line)) {
    rows.emplace_back();
    std::stringstream ls(line);
    while (std::getline(ls, cell, ',')) rows.back().push_back(cell);
  }
  return rows;
}

namespace {
constexpr const char* kSkipMarker = "[  SKIPPED ]";

// Every refusal a test triggers through one of our programs: a line
// "<program>: error: ..." must read as a sentence about the input, without a source
// location such as "(dataset.cc:301)" and without the words of a failed internal
// check ("check failed: <expression>"). Only a failed library call (MPI, CUDA, cuBLAS,
// NCCL: the machine, not the input) may carry a location. An error passed on with
// more context names its rank once: "[rank 0] ... [rank 0] ..." is a catch that quoted
// what() where it meant message().
void check_refusals_name_no_source(const std::string& command, const std::string& output) {
  static const std::regex error_line(R"(^(ncf_[a-z_]+|ncf_dist): error: .*)");
  static const std::regex location(R"(\([A-Za-z0-9_]+\.(cc|cu|cuh|h):[0-9]+\))");
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!std::regex_match(line, error_line)) continue;
    const size_t rank = line.find("[rank ");
    if (rank != std::string::npos && line.find("[rank ", rank + 1) != std::string::npos)
      ADD_FAILURE() << "an error names its rank twice:\n  " << line << "\nfrom: " << command;
    if (!std::regex_search(line, location) && line.find("check failed:") == std::string::npos)
      continue;
    bool library = false;
    for (const char* mark : {"MPI call failed", "CUDA error", "cuBLAS error", "NCCL error"})
      library = library || line.find(mark) != std::string::npos;
    if (!library)
      ADD_FAILURE() << "a refusal names a source location instead of only the input:\n  " << line
                    << "\nfrom: " << command;
  }
}
}  // namespace

RunResult run(const std::string& command) {
  RunResult r;
  std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + command);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // A worker run of a test binary (this binary again under mpirun, with a filter)
  // prints GoogleTest's skip marker for the workers it does not select. Shown in a
  // failing test's message, that marker makes ctest (SKIP_REGULAR_EXPRESSION) report
  // the failure as a skip; the marker is defused here, for every captured output.
  for (size_t at = r.output.find(kSkipMarker); at != std::string::npos;
       at = r.output.find(kSkipMarker, at))
    r.output.replace(at, std::strlen(kSkipMarker), "[  skipped ]");
  check_refusals_name_no_source(command, r.output);
  return r;
}

std::string bin(const std::string& name) { return std::string(NCF_BIN_DIR) + "/" + name; }

namespace {

// Single quotes for the shell.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string signal_script() { return std::string(NCF_SOURCE_DIR) + "/tests/signal_after.py"; }

}  // namespace

const std::string& python3() {
  static const std::string p = NCF_TEST_PYTHON3;  // chosen by tests/CMakeLists.txt
  return p;
}

std::string signal_after(const std::string& command, const std::string& log,
                         const std::string& after, const std::string& sig, int times, double delay,
                         int ranks, const std::string& send) {
  std::ostringstream d;
  d << delay;
  std::string cmd = python3() + " " + signal_script() + " --log " + quoted(log) + " --after " +
                    quoted(after) + " --signal " + sig + " --times " + std::to_string(times) +
                    " --delay " + d.str();
  if (ranks > 0) cmd += " --ranks " + std::to_string(ranks);
  if (!send.empty()) cmd += " --send " + quoted(send);
  return cmd + " -- " + command;
}

std::string signal_rank() { return python3() + " " + signal_script() + " rank "; }

namespace {

// Open MPI's launcher creates its session directory under the temporary
// directory with a plain mkdir; two launchers starting at once (tests in
// parallel) can race on it and one fails with "File exists". Each test process
// gets a session base of its own.
struct MpiSessionBase {
  std::string dir;
  MpiSessionBase() {
    char tmpl[] = "/tmp/ncf-mpi-XXXXXX";
    if (mkdtemp(tmpl)) dir = tmpl;
  }
  ~MpiSessionBase() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  return std::string(buf, size_t(n));
}

EmbeddingPlan user_item_plan(int64_t users, int64_t items, int D, int W, const std::string& forced,
                             bool dedup) {
  PlanRequest req;
  req.D = D;
  req.W = W;
  req.tables = {{"user", users, Placement::kRowWise, 0, 1, 0.01f},
                {"item", items, Placement::kRowWise, 0, 2, 0.01f}};
  req.lookups_per_rank = 64;
  req.forced = forced;
  req.dedup = dedup ? "on" : "off";
  return plan_tables(req);
}

std::string mpirun(int np, const std::string& bind) {
  static const MpiSessionBase base;
  // HWLOC_COMPONENTS: no PCI or I/O devices in the topology hwloc loads in mpirun and
  // each rank: reading PCI config space traps to the hypervisor in a VM (a fifth of a
  // bare 4-rank start's CPU here); binding and shared memory need the CPUs only, and
  // NCCL finds its devices itself. A 4-rank ncf_dist job: 12% less wall time and CPU.
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 HWLOC_COMPONENTS=-pci,-linuxio " +
         (base.dir.empty() ? std::string() : "OMPI_MCA_orte_tmpdir_base=" + base.dir + " ") +
         std::string(MPIEXEC) + " -np " + std::to_string(np) + " --oversubscribe --bind-to " +
         bind +
         " --mca btl ^openib,ofi --mca pml ob1 --mca "
         "btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1";
}

bool gpu_required() {
  const char* v = std::getenv("NCF_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

ExecContext cpu(int threads) {
  ExecContext ctx;
  ctx.device = Device::kCpu;
  ctx.threads = threads;
  return ctx;
}

std::vector<float> random_vec(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

double relative_rms(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t k = 0; k < n; ++k) {
    const double d = double(got[k]) - want[k];
    num += d * d;
    den += double(want[k]) * want[k];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<uint16_t> bf16_bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t k = 0; k < v.size(); ++k) b[k] = float_to_bf16_bits(v[k]);
  return b;
}

std::vector<float> widen_bf16(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t k = 0; k < bits.size(); ++k) v[k] = bf16_bits_to_float(bits[k]);
  return v;
}

void init_with_biases(NeuMF& model, uint64_t seed, uint32_t noise_seed, float scale) {
  model.init(seed);
  const std::vector<float> noise =
      random_vec(size_t(model.num_params()), noise_seed, -scale, scale);
  for (const DenseLayerView& v : model.tower())
    for (int j = 0; j < v.out; ++j) model.params().data()[v.b_offset + j] = noise[size_t(j)];
}

std::vector<float> rows_by_id(const std::vector<float>& table, const std::vector<int32_t>& ids,
                              int width) {
  std::vector<float> rows(ids.size() * size_t(width));
  for (size_t b = 0; b < ids.size(); ++b)
    std::copy_n(&table[size_t(ids[b]) * width], width, &rows[b * width]);
  return rows;
}

std::vector<float> sum_rows_by_id(const std::vector<float>& rows, const std::vector<int32_t>& ids,
                                  int64_t groups, int width) {
  std::vector<double> acc(size_t(groups) * width, 0.0);
  for (size_t b = 0; b < ids.size(); ++b)
    for (int c = 0; c < width; ++c) acc[size_t(ids[b]) * width + c] += double(rows[b * width + c]);
  return std::vector<float>(acc.begin(), acc.end());
}

}  // namespace ncf::test
