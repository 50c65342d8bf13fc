// Bandwidth of the two collectives a training step pays for: all_to_all_v (embedding
// ids and rows, equal counts here) and all_reduce_sum (dense gradients), over the
// sizes a step sees, in the manner of nccl-tests. Per size: verify once with exactly
// predictable integer data, warm up, time, and report algbw = bytes / time and busbw,
// the bandwidth each rank's link must carry, comparable across W:
//   all-to-all  busbw = algbw * (W-1)/W        (the own block does not travel)
//   allreduce   busbw = algbw * 2(W-1)/W       (reduce-scatter + all-gather)
// "bytes" is one rank's send buffer; time is the slowest rank's mean per call.
//
//   mpirun -np 2 bench_comm [--comm mpi|nccl] [--min_bytes 8] [--max_bytes 64M]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "common/check.h"
#include "common/device.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string comm = "auto";
  std::string op = "all";
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{64} << 20;
  int factor = 2;
  int warmup = 5;
  int iters = 20;
};

// One value reduced over ranks through the communicator itself (its buffers may be
// on the device), so the bench needs nothing beyond the Communicator interface.
double sum_over_ranks(Communicator& comm, double v) {
  Buffer<double> b(comm.device(), 1);
  device_copy(comm.device(), b.data(), Device::kCpu, &v, sizeof v);
  comm.all_reduce_sum(b.data(), 1, DType::kFloat64);
  comm.synchronize();
  device_copy(Device::kCpu, &v, comm.device(), b.data(), sizeof v);
  return v;
}

// Every rank's v, gathered by a sum in which rank r fills only slot r.
double max_over_ranks(Communicator& comm, double v) {
  const int W = comm.world();
  std::vector<double> h(size_t(W), 0.0);
  h[size_t(comm.rank())] = v;
  Buffer<double> all(comm.device(), W);
  device_copy(comm.device(), all.data(), Device::kCpu, h.data(), W * sizeof(double));
  comm.all_reduce_sum(all.data(), W, DType::kFloat64);
  comm.synchronize();
  device_copy(Device::kCpu, h.data(), comm.device(), all.data(), W * sizeof(double));
  return *std::max_element(h.begin(), h.end());
}

// Exactly representable floats, unique enough to catch a misplaced block.
float a2a_value(int src, int dst, int64_t idx) {
  return static_cast<float>((src * 131 + dst * 31 + idx) % 65521);
}
float reduce_value(int r, int64_t i) { return static_cast<float>((r + i) % 7 + 1); }

// A collective as the harness sees it: how many float elements a size holds, how to
// run it once, and how many of this rank's results are wrong after one run.
struct Op {
  const char* name;
  double bus_factor;  // busbw / algbw
  int64_t (*elements)(uint64_t bytes, int W);
  void (*run)(Communicator& comm, float* send, float* recv, int64_t n,
              std::vector<int64_t>* layout);
  int64_t (*verify)(Communicator& comm, float* send, float* recv, int64_t n,
                    std::vector<int64_t>* layout);
};

// Equal counts: n/W elements per peer, blocks in peer order. layout holds the host
// counts and displacements [4W], built once per size outside the timed loop.
int64_t a2a_elements(uint64_t bytes, int W) {
  return std::max<int64_t>(1, static_cast<int64_t>(bytes / sizeof(float)) / W) * W;
}

void a2a_layout(int W, int64_t n, std::vector<int64_t>* l) {
  l->assign(4 * W, 0);
  for (int p = 0; p < W; ++p) {
    (*l)[p] = (*l)[2 * W + p] = n / W;
    (*l)[W + p] = (*l)[3 * W + p] = p * (n / W);
  }
}

void a2a_run(Communicator& comm, float* send, float* recv, int64_t n, std::vector<int64_t>* l) {
  const int W = comm.world();
  comm.all_to_all_v(send, l->data(), l->data() + W, recv, l->data() + 2 * W, l->data() + 3 * W,
                    DType::kFloat32);
}

int64_t a2a_verify(Communicator& comm, float* send, float* recv, int64_t n,
                   std::vector<int64_t>* l) {
  const int W = comm.world(), r = comm.rank();
  const int64_t m = n / W;
  std::vector<float> h(n);
  for (int p = 0; p < W; ++p)
    for (int64_t j = 0; j < m; ++j) h[p * m + j] = a2a_value(r, p, j);
  device_copy(comm.device(), send, Device::kCpu, h.data(), n * sizeof(float));
  std::fill(h.begin(), h.end(), -1.0f);
  device_copy(comm.device(), recv, Device::kCpu, h.data(), n * sizeof(float));
  a2a_layout(W, n, l);
  a2a_run(comm, send, recv, n, l);
  comm.synchronize();
  device_copy(Device::kCpu, h.data(), comm.device(), recv, n * sizeof(float));
  int64_t wrong = 0;
  for (int p = 0; p < W; ++p)
    for (int64_t j = 0; j < m; ++j) wrong += h[p * m + j] != a2a_value(p, r, j);
  return wrong;
}

int64_t ar_elements(uint64_t bytes, int) {
  return std::max<int64_t>(1, static_cast<int64_t>(bytes / sizeof(float)));
}

// In place on recv, as the trainer does with its gradient buffer.
void ar_run(Communicator& comm, float*, float* recv, int64_t n, std::vector<int64_t>*) {
  comm.all_reduce_sum(recv, n, DType::kFloat32);
}

int64_t ar_verify(Communicator& comm, float* send, float* recv, int64_t n,
                  std::vector<int64_t>* l) {
  const int W = comm.world(), r = comm.rank();
  std::vector<float> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = reduce_value(r, i);
  device_copy(comm.device(), recv, Device::kCpu, h.data(), n * sizeof(float));
  ar_run(comm, send, recv, n, l);
  comm.synchronize();
  device_copy(Device::kCpu, h.data(), comm.device(), recv, n * sizeof(float));
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int q = 0; q < W; ++q) want += reduce_value(q, i);
    wrong += h[i] != want;
  }
  return wrong;
}

int64_t sweep(Communicator& comm, const Op& op, const Options& o, float* send, float* recv) {
  const int W = comm.world();
  const bool root = comm.rank() == 0;
  if (root) {
    std::printf("#\n# %s\n", op.name);
    std::printf("# %12s %12s %11s %12s %12s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "#wrong");
  }
  int64_t total_wrong = 0;
  double bus_sum = 0;
  int sizes = 0;
  std::vector<int64_t> layout;
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const int64_t n = op.elements(bytes, W);
    const int64_t wrong = static_cast<int64_t>(
        sum_over_ranks(comm, static_cast<double>(op.verify(comm, send, recv, n, &layout))));
    total_wrong += wrong;
    for (int i = 0; i < o.warmup; ++i) op.run(comm, send, recv, n, &layout);
    comm.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < o.iters; ++i) op.run(comm, send, recv, n, &layout);
    comm.synchronize();
    const double mine = std::chrono::duration<double>(Clock::now() - t0).count() / o.iters;
    const double s = max_over_ranks(comm, mine);
    const double real_bytes = static_cast<double>(n) * sizeof(float);
    const double algbw = real_bytes / s / 1e9;
    const double busbw = algbw * op.bus_factor;
    bus_sum += busbw;
    ++sizes;
    if (root)
      std::printf("  %12.0f %12lld %11.2f %12.3f %12.3f %8lld\n", real_bytes,
                  static_cast<long long>(n), s * 1e6, algbw, busbw, static_cast<long long>(wrong));
    std::fflush(stdout);  // rows appear as they are measured, also through mpirun
  }
  if (root)
    std::printf("# %s: avg busbw %.3f GB/s over %d sizes, %lld wrong\n", op.name,
                sizes ? bus_sum / sizes : 0.0, sizes, static_cast<long long>(total_wrong));
  return total_wrong;
}

int bench_main(int& argc, char**& argv) {
  Options o;
  CLI::App app{"bench_comm: all_to_all_v and all_reduce_sum bandwidth over a size sweep"};
  app.add_option("--comm", o.comm, "communicator")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "single"}));
  app.add_option("--op", o.op, "collective to time")
      ->check(CLI::IsMember({"all", "alltoall", "allreduce"}));
  app.add_option("--min_bytes", o.min_bytes, "smallest send buffer per rank (8, 4K, 1M, ...)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max_bytes", o.max_bytes, "largest send buffer per rank")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--factor", o.factor, "size step factor")->check(CLI::Range(2, 1024));
  app.add_option("--warmup", o.warmup, "untimed calls per size")->check(CLI::NonNegativeNumber);
  app.add_option("--iters", o.iters, "timed calls per size")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  NCF_CHECK(o.min_bytes >= 1 && o.min_bytes <= o.max_bytes, "--min_bytes ", o.min_bytes,
            " must be in [1, --max_bytes ", o.max_bytes, "]");

  RankInfo info = bootstrap(&argc, &argv, o.comm == "mpi");
  const Device dev = o.comm == "nccl" ? Device::kCuda : Device::kCpu;
  void* stream = nullptr;
#ifdef NCF_WITH_CUDA
  if (dev == Device::kCuda) {
    select_local_gpu(info);
    cudaStream_t s;
    NCF_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess,
              "cudaStreamCreate failed");
    stream = s;
  }
#endif
  int64_t wrong = 0;
  {
    std::unique_ptr<Communicator> comm = make_communicator(info, dev, o.comm, stream);
    const int W = comm->world();
    if (comm->rank() == 0)
      std::printf(
          "# bench_comm: W=%d comm=%s device=%s dtype=float32 sizes %llu..%llu B x%d, "
          "warmup %d, iters %d\n",
          W, comm->name(), device_name(comm->device()),
          static_cast<unsigned long long>(o.min_bytes),
          static_cast<unsigned long long>(o.max_bytes), o.factor, o.warmup, o.iters);
    const int64_t max_n = std::max(a2a_elements(o.max_bytes, W), ar_elements(o.max_bytes, W));
    Buffer<float> send(comm->device(), max_n), recv(comm->device(), max_n);
    const Op ops[] = {
        {"alltoall", W > 1 ? (W - 1.0) / W : 0.0, a2a_elements, a2a_run, a2a_verify},
        {"allreduce", W > 1 ? 2.0 * (W - 1) / W : 0.0, ar_elements, ar_run, ar_verify},
    };
    for (const Op& op : ops)
      if (o.op == "all" || o.op == op.name) wrong += sweep(*comm, op, o, send.data(), recv.data());
    if (comm->rank() == 0) {
      std::printf("# %s\n", wrong ? "FAILED: wrong results" : "all results exact");
      std::fflush(stdout);
    }
    // A failed run ends in MPI_Abort (run_main), which would cut off rank 0's report.
    comm->barrier();
  }
#ifdef NCF_WITH_CUDA
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
#endif
  return wrong == 0 ? 0 : 1;  // rank 0 has said FAILED; every rank knows the same total
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) { return ncf::run_main(argc, argv, ncf::bench_main, "bench_comm"); }
