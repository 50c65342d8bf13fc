// What the bench/kernels programs share (include from their .cu files only): the size
// flags, the exit when there is no CUDA device, seeded inputs, device arrays, and the
// run of one case: every numbered version checked against the CPU reference, then each
// timed (warmup, then repeats each between two CUDA events on the library's stream).
//
// Exit status of a program: 0 when every check passed, 1 when a check failed or
// something threw, kExitNoDevice (77) when there is no usable CUDA device (nothing ran).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_context.h"
#include "common/device.h"

namespace ncf::kernel_bench {

// No usable CUDA device: the program says why and runs nothing (77: the "skipped" status of
// automake's test driver and of CTest's SKIP_RETURN_CODE).
constexpr int kExitNoDevice = 77;

// --name VALUE integer flags with defaults, plus --gpu, --warmup, --repeats and --seed;
// anything else (or --help) prints the flags and exits 2.
class Flags {
 public:
  Flags(const char* prog, std::vector<std::pair<std::string, int64_t>> sizes, int argc, char** argv)
      : prog_(prog), values_(std::move(sizes)) {
    values_.insert(values_.end(), {{"gpu", 0}, {"warmup", 3}, {"repeats", 20}, {"seed", 1}});
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      int64_t* v = a.rfind("--", 0) == 0 ? find(a.substr(2)) : nullptr;
      char* end = nullptr;
      if (v && i + 1 < argc) *v = std::strtoll(argv[i + 1], &end, 10);
      if (!v || i + 1 >= argc || end == argv[i + 1] || *end != '\0') usage(a);
      ++i;
    }
    if (get("repeats") < 1 || get("warmup") < 0) usage("--repeats/--warmup");
  }
  int64_t get(const std::string& name) const {
    for (const auto& [n, v] : values_)
      if (n == name) return v;
    std::fprintf(stderr, "%s: no flag --%s\n", prog_, name.c_str());
    std::exit(2);
  }
  const char* prog() const { return prog_; }

 private:
  int64_t* find(const std::string& name) {
    for (auto& [n, v] : values_)
      if (n == name) return &v;
    return nullptr;
  }
  [[noreturn]] void usage(const std::string& bad) const {
    std::fprintf(stderr, "%s: bad argument '%s'; flags (integers, defaults):", prog_, bad.c_str());
    for (const auto& [n, v] : values_) std::fprintf(stderr, " --%s %lld", n.c_str(), (long long)v);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  const char* prog_;
  std::vector<std::pair<std::string, int64_t>> values_;
};

// Seeded inputs: element i of stream s is a hash of (seed, s, i), so every program run
// with the same flags sees the same arrays.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline std::vector<float> uniform(uint64_t seed, uint64_t stream, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = mix64(seed ^ mix64(stream * 0x100000001b3ull + i));
    v[i] = lo + (hi - lo) * float(h >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

template <typename T>
Buffer<T> upload(const std::vector<T>& h) {
  Buffer<T> d(Device::kCuda, h.size());
  device_copy(Device::kCuda, d.data(), Device::kCpu, h.data(), h.size() * sizeof(T));
  return d;
}
template <typename T>
void upload_into(Buffer<T>& d, const std::vector<T>& h) {
  device_copy(Device::kCuda, d.data(), Device::kCpu, h.data(), h.size() * sizeof(T));
}
template <typename T>
std::vector<T> download(const Buffer<T>& d, size_t n) {
  std::vector<T> h(n);
  device_copy(Device::kCpu, h.data(), Device::kCuda, d.data(), n * sizeof(T));
  return h;
}

// Elements of got that differ from want in bits, and the first of them in `first`.
template <typename T>
int64_t bit_mismatches(const std::vector<T>& got, const std::vector<T>& want, size_t* first) {
  if (got.size() != want.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) *first = i;
  return bad;
}
// "" when got is want bit for bit, else what differs ("what: 12 of 4096 elements differ, the
// first [7]: 0.25 against 0.5").
template <typename T>
std::string same_bits(const std::string& what, const std::vector<T>& got,
                      const std::vector<T>& want) {
  size_t first = 0;
  const int64_t bad = bit_mismatches(got, want, &first);
  if (bad == 0) return "";
  if (bad < 0) return what + ": wrong size";
  char buf[200];
  std::snprintf(buf, sizeof buf,
                ": %lld of %zu elements differ, the first [%zu]: %.9g against %.9g", (long long)bad,
                got.size(), first, double(got[first]), double(want[first]));
  return what + buf;
}

// One numbered version of a case: its name (v1, v2, ...) and what it runs, enqueued on
// the library's stream.
struct Version {
  std::string name;
  std::string what;
  std::function<void()> run;
};

// A case: the versions of one op on one shape. reset restores the inputs a version
// changes in place (before each check, not between timed runs: each timed run does the
// same work on what the last one left); check reads the outputs after one version
// and returns "" or what is wrong. bytes: the logical bytes of one run (every array
// read or written once), for the GB/s column. baseline (optional): work every version
// runs besides the op, timed alone so that its share shows.
struct Case {
  std::string name;
  double bytes = 0;
  std::vector<Version> versions;
  std::function<void()> reset;
  std::function<std::string(const Version&)> check;
  Version baseline;
};

class Program {
 public:
  // Exits with kExitNoDevice when there is no usable CUDA device.
  Program(const Flags& flags, const std::string& what) : flags_(flags) {
    std::string why;
    if (!cuda_available(&why)) {
      std::printf("%s: no CUDA device (%s): nothing run, exit %d\n", flags.prog(), why.c_str(),
                  kExitNoDevice);
      std::exit(kExitNoDevice);
    }
    const int gpu = static_cast<int>(flags.get("gpu"));
    ctx_ = make_cuda_context(gpu);
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, gpu);
    std::printf("# %s: %s; %s (sm_%d%d); warmup %lld, median of %lld runs, seed %lld\n",
                flags.prog(), what.c_str(), p.name, p.major, p.minor,
                (long long)flags.get("warmup"), (long long)flags.get("repeats"),
                (long long)flags.get("seed"));
  }
  ~Program() { destroy_cuda_context(ctx_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  const ExecContext& ctx() const { return ctx_; }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(ctx_.stream); }

  // Checks every version of c, then times those that passed; one line per version
  // for each, then the case's summary line ("= NAME: v1 X ms, v2 Y ms").
  void run(const Case& c) {
    std::vector<bool> ok;
    for (const Version& v : c.versions) {
      c.reset();
      v.run();
      check_cuda(cudaStreamSynchronize(stream()), v);
      const std::string bad = c.check(v);
      ok.push_back(bad.empty());
      if (!bad.empty()) ++failures_;
      std::printf("%s: %s check %s (%s)\n", c.name.c_str(), v.name.c_str(),
                  bad.empty() ? "ok" : ("FAIL: " + bad).c_str(), v.what.c_str());
    }
    std::string summary = "= " + c.name + ":";
    for (size_t k = 0; k < c.versions.size(); ++k) {
      const Version& v = c.versions[k];
      if (!ok[k]) {
        summary += " " + v.name + " FAIL,";
        continue;
      }
      summary += " " + v.name + " " + fmt("%.3f", time(c, v)) + " ms,";
    }
    if (c.baseline.run)
      summary += " " + c.baseline.name + " " + fmt("%.3f", time(c, c.baseline)) + " ms,";
    summary.back() = '\n';
    std::fputs(summary.c_str(), stdout);
    std::fflush(stdout);
  }

  // The exit status: 0, or 1 after a failed check.
  int finish() const {
    std::printf(
        "# %s: %s\n", flags_.prog(),
        failures_ ? (std::to_string(failures_) + " checks FAILED").c_str() : "every check passed");
    return failures_ ? 1 : 0;
  }

 private:
  static std::string fmt(const char* f, double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, x);
    return buf;
  }
  static void check_cuda(cudaError_t e, const Version& v) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "%s (%s): %s\n", v.name.c_str(), v.what.c_str(), cudaGetErrorString(e));
    std::exit(1);
  }
  // The median ms of v over the repeats, its line printed.
  double time(const Case& c, const Version& v) {
    for (int64_t i = 0; i < flags_.get("warmup"); ++i) v.run();
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    std::vector<double> ms;
    for (int64_t i = 0; i < flags_.get("repeats"); ++i) {
      cudaEventRecord(start, stream());
      v.run();
      cudaEventRecord(stop, stream());
      check_cuda(cudaEventSynchronize(stop), v);
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("%s: %s median %.3f ms, min %.3f ms", c.name.c_str(), v.name.c_str(), med,
                ms.front());
    if (c.bytes > 0 && v.name != c.baseline.name)
      std::printf(", %.0f GB/s", c.bytes / (med * 1e-3) / 1e9);
    std::printf(" (%s)\n", v.what.c_str());
    return med;
  }

  const Flags& flags_;
  ExecContext ctx_;
  int failures_ = 0;
};

// main's body: runs body(), turning an exception into a message and exit 1.
inline int guarded(const char* prog, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
    return 1;
  }
}

}  // namespace ncf::kernel_bench
