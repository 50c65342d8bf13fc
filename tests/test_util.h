// Helpers shared by the tests: temporary directories, writing small files,
// running the built programs (also under mpirun) and capturing their output.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/cuda_context.h"
#include "common/device.h"
#include "embedding/plan.h"
#include "model/neumf.h"
#include "model/ops.h"

namespace ncf::test {

// A fresh directory under $TMPDIR, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// The cells of each line of comma-separated text (no quoting).
std::vector<std::vector<std::string>> csv_rows(const std::string& text);

// Runs a shell command, capturing its output.
RunResult run(const std::string& command);
// Path of a built program (ncf_prep, ncf_dist, …).
std::string bin(const std::string& name);
// "mpirun -np N --oversubscribe --bind-to BIND …" with the flags root needs. Its
// ranks yield the CPU while they wait (mpi_yield_when_idle): tests run side by side on
// few cores, where a spinning rank starves the one it waits for and a run that takes
// seconds took minutes, past its safety-net timeout (as tests/cluster/ does).
std::string mpirun(int np, const std::string& bind = "none");
// This test program's own path (/proc/self/exe): its worker tests run under mpirun.
std::string self_exe();
// Two tables of width D for W ranks, "user" (users rows, init tag 1) and "item" (items rows,
// tag 2), placed by `forced` (--shard_plan) and de-duplicated or not: the embedding
// collection tests across ranks.
EmbeddingPlan user_item_plan(int64_t users, int64_t items, int D, int W, const std::string& forced,
                             bool dedup);
// The tests' Python, as tests/CMakeLists.txt found it: Debian's /usr/bin/python3 where
// there is one, else python3 on PATH.
const std::string& python3();

// A command that runs `command` and sends it `sig` (USR1, TERM, KILL) once `times`
// lines of its output have matched the regular expression `after`, so that the run can
// neither have finished nor gone on far before the signal is there, however loaded the
// machine (tests/signal_after.py: the output comes through a one-page FIFO that is not
// read meanwhile). The output is appended to `log`; the exit code is the command's.
// `delay` seconds pass between the line and the signal. With `ranks` > 0, `command` is
// a launcher whose ranks start with signal_rank(): they are held until every one of
// them has the signal the launcher passes on. `send`, when given, replaces the kill: a
// shell command that sends the signal to $NCF_SIGNAL_PID.
std::string signal_after(const std::string& command, const std::string& log,
                         const std::string& after, const std::string& sig = "USR1", int times = 1,
                         double delay = 0, int ranks = 0, const std::string& send = "");
// The prefix of a rank's program under such a launcher: "PYTHON3 …/signal_after.py rank ".
std::string signal_rank();

// Seconds since t0 on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A wait poller (common/cuda_context.h) registered for one scope: unregistered
// also when a check throws, so no throwing poller outlives its test.
struct ScopedPoller {
  const void* key;
  ScopedPoller(const void* k, std::function<void()> f) : key(k) {
    register_wait_poller(k, std::move(f));
  }
  ~ScopedPoller() { unregister_wait_poller(key); }
};

// True when NCF_REQUIRE_GPU=1: a GPU test that finds no usable GPU fails
// instead of skipping (the GPU kit sets it, so a broken GPU path cannot pass as
// skipped).
bool gpu_required();

// A CPU context with `threads` threads for the ops (model/ops.h, table ops).
ExecContext cpu(int threads);
// n floats uniform in [lo, hi) from std::mt19937(seed): the same values on every machine
// with the same standard library.
std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// ‖got − want‖ / ‖want‖ over n floats, in double (‖got − want‖ when want is all
// zeros): how far a run or a tensor is from another as a whole.
double relative_rms(const float* got, const float* want, size_t n);

// BF16 bits of each float (common/bf16.h's rounding), and those bits widened back.
std::vector<uint16_t> bf16_bits_of(const std::vector<float>& v);
std::vector<float> widen_bf16(const std::vector<uint16_t>& bits);

// Sets the process-wide math mode for one scope, restoring the default (tf32) after.
class ScopedMathMode {
 public:
  explicit ScopedMathMode(MathMode m) { set_math_mode(m); }
  ~ScopedMathMode() { set_math_mode(MathMode::kTf32); }
  ScopedMathMode(const ScopedMathMode&) = delete;
  ScopedMathMode& operator=(const ScopedMathMode&) = delete;
};

// model.init(seed), then non-zero tower biases (so every ReLU cuts on both sides): bias j
// of each layer = noise[j], noise = random_vec(num_params, noise_seed, -scale, scale).
void init_with_biases(NeuMF& model, uint64_t seed, uint32_t noise_seed, float scale);

// Row b of the result = table's row ids[b] (table [rows × width]): each sample's row, as a
// lookup hands it over; result [ids.size() × width].
std::vector<float> rows_by_id(const std::vector<float>& table, const std::vector<int32_t>& ids,
                              int width);

// Row g of the result = Σ rows[b, :] over the b with ids[b] = g, added in b order in double
// and stored as float, g < groups; rows [ids.size() × width].
std::vector<float> sum_rows_by_id(const std::vector<float>& rows, const std::vector<int32_t>& ids,
                                  int64_t groups, int width);

}  // namespace ncf::test

// First statement of every GPU test (or its fixture's SetUp): without a usable
// GPU the test is skipped with the reason, or failed under NCF_REQUIRE_GPU=1.
#define NCF_GPU_OR_SKIP()                                                       \
  do {                                                                          \
    std::string ncf_why_;                                                       \
    if (!::ncf::cuda_available(&ncf_why_)) {                                    \
      if (::ncf::test::gpu_required())                                          \
        FAIL() << "NCF_REQUIRE_GPU=1 but there is no usable GPU: " << ncf_why_; \
      GTEST_SKIP() << "no usable GPU: " << ncf_why_;                            \
    }                                                                           \
  } while (0)
