// Can NCCL ranks share one GPU? A standalone check for machines with a single GPU,
// before ncf_dist's own NCCL path is run on them: W MPI ranks all on GPU 0, each
// giving NCCL a host identity of its own (NCCL_HOSTID=ncf-share-<rank>, set by this
// program before its first NCCL call, unless --same_host), so that NCCL's duplicate-
// GPU check (same host hash and same PCI bus id) does not fire and the ranks talk
// through NCCL's network transport, sockets on loopback (NCCL_SOCKET_IFNAME=lo and
// NCCL_IB_DISABLE=1 unless already set). Then one ncclAllReduce and one grouped ring
// of ncclSend/ncclRecv, each checked element by element, and the allreduce timed.
//
//   mpirun -np 2 bench_nccl_share [--floats 16777216] [--repeats 5] [--same_host]
//
// One line per rank: what NCCL answered (its error string and last error text when
// the communicator or a collective fails) or what the checks found; rank 0 adds the
// NCCL version and the allreduce's median time. NCCL_DEBUG=INFO shows the transport
// it chose ("via NET/Socket"). Exit code 0 only when every rank passed every check.
// --same_host leaves NCCL_HOSTID alone: the duplicate-GPU refusal, for the record.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace {

struct Options {
  long long floats = 1 << 24;
  int repeats = 5;
  bool same_host = false;
};

// 0: parsed; else the exit code (--help: 0 after the text, a bad flag: 2).
int parse(int argc, char** argv, Options* o, bool lead) {
  CLI::App app{"Whether NCCL ranks can share one GPU (see the file's header)"};
  app.add_option("--floats", o->floats, "floats per allreduce and per send/recv")
      ->check(CLI::Range(1LL, 1LL << 30))
      ->capture_default_str();
  app.add_option("--repeats", o->repeats, "timed allreduces (the median is reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_flag("--same_host", o->same_host,
               "leave NCCL_HOSTID alone (NCCL's duplicate-GPU refusal, for the record)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (!lead) return e.get_exit_code() == 0 ? -1 : 2;
    const int code = app.exit(e);
    return code == 0 ? -1 : 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Options o;
  const int parsed = parse(argc, argv, &o, rank == 0);
  if (parsed != 0) {  // every rank parses the same arguments: all stop alike
    MPI_Finalize();
    return parsed < 0 ? 0 : parsed;
  }
#ifndef NCF_WITH_CUDA
  if (rank == 0) std::printf("bench_nccl_share: built without CUDA and NCCL: nothing to check\n");
  MPI_Finalize();
  return 1;
#else
  int ok = 1, all_ok = 0;
  std::string line;
  auto fail = [&](const std::string& what) {
    if (line.empty()) line = what;
    ok = 0;
  };
  if (!o.same_host) {
    const std::string id = "ncf-share-" + std::to_string(rank);
    setenv("NCCL_HOSTID", id.c_str(), 1);
  }
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    fail("no usable GPU");
  } else if (cudaSetDevice(0) != cudaSuccess) {
    fail("cudaSetDevice(0) failed");
  }
  ncclUniqueId id{};
  if (rank == 0 && ok) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  }
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  const size_t n = static_cast<size_t>(o.floats);
  float* buf = nullptr;
  float* recv = nullptr;
  double median_ms = 0;
  if (all_ok) {
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    const ncclResult_t r = ncclCommInitRank(&comm, world, id, rank);
    if (r != ncclSuccess) {
      fail(std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + ": " +
           ncclGetLastError(nullptr));
      comm = nullptr;
    }
  }
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_ok) {
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cudaMalloc(&buf, n * sizeof(float));
    cudaMalloc(&recv, n * sizeof(float));
    std::vector<float> host(n), got(n);
    // Allreduce: rank r contributes r + 1 + (i % 7); the sum is exact in float.
    auto fill = [&] {
      for (size_t i = 0; i < n; ++i) host[i] = float(rank + 1 + int(i % 7));
      cudaMemcpy(buf, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    };
    std::vector<double> ms;
    for (int k = 0; k <= o.repeats && ok; ++k) {  // k == 0: the checked, untimed run
      fill();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      const ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, stream);
      if (r != ncclSuccess) fail(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
      if (cudaStreamSynchronize(stream) != cudaSuccess) fail("allreduce: stream error");
      const auto t1 = std::chrono::steady_clock::now();
      if (k > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (k == 0 && ok) {
        cudaMemcpy(got.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost);
        const double base = double(world) * (world + 1) / 2;
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += got[i] != float(base + double(world) * (i % 7));
        if (bad)
          fail("allreduce: " + std::to_string(bad) + " of " + std::to_string(n) + " sums wrong");
      }
    }
    if (!ms.empty()) {
      std::sort(ms.begin(), ms.end());
      median_ms = ms[ms.size() / 2];
    }
    // A ring of grouped sends and receives: rank r sends its values to r + 1.
    if (ok) {
      fill();
      const int to = (rank + 1) % world, from = (rank + world - 1) % world;
      ncclGroupStart();
      ncclResult_t r1 = ncclSend(buf, n, ncclFloat, to, comm, stream);
      ncclResult_t r2 = ncclRecv(recv, n, ncclFloat, from, comm, stream);
      const ncclResult_t r3 = ncclGroupEnd();
      if (r1 != ncclSuccess || r2 != ncclSuccess || r3 != ncclSuccess)
        fail(std::string("ncclSend/ncclRecv group: ") + ncclGetErrorString(r1 != ncclSuccess ? r1
                                                                           : r2 != ncclSuccess
                                                                               ? r2
                                                                               : r3));
      if (cudaStreamSynchronize(stream) != cudaSuccess) fail("send/recv: stream error");
      if (ok) {
        cudaMemcpy(got.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += got[i] != float(from + 1 + int(i % 7));
        if (bad) fail("send/recv: " + std::to_string(bad) + " values wrong");
      }
    }
    cudaFree(buf);
    cudaFree(recv);
    cudaStreamDestroy(stream);
  }
  if (comm) ncclCommDestroy(comm);
  if (ok) line = "allreduce and send/recv ring correct";
  std::printf("bench_nccl_share: rank %d of %d (NCCL_HOSTID %s): %s\n", rank, world,
              o.same_host ? "unset" : ("ncf-share-" + std::to_string(rank)).c_str(), line.c_str());
  std::fflush(stdout);
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    int version = 0;
    ncclGetVersion(&version);
    std::printf("bench_nccl_share: NCCL %d, %d ranks on GPU 0: %s", version, world,
                all_ok ? "every check passed" : "FAILED (lines above)");
    if (all_ok)
      std::printf("; allreduce of %lld floats median %.3f ms over %d runs", o.floats, median_ms,
                  o.repeats);
    std::printf("\n");
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
#endif
}
