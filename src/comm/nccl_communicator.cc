// The NCCL communicator: collectives on device buffers, one GPU per rank. Compiled
// only in CUDA builds.
//
// Streams: the communicator owns a communication stream. Each collective first
// makes that stream wait for the work already queued on the rank's compute stream
// (the stream given at construction; an event, no host wait), runs there, and
// records a completion event from a ring of kEvents; the compute stream then waits
// for that event, except inside *_async calls, where join(ticket) does it later.
// The communication stream is serial, so waiting for one ticket also covers every
// earlier one, and a ticket whose ring slot was reused by a later collective is
// covered by that later event.
//
// Choices:
//  - all_to_all_v is a group of ncclSend/ncclRecv, one pair per peer with a non-zero
//    count; the rank's own block is a cudaMemcpyAsync on the same stream instead of a
//    send to itself.
//  - exchange_counts goes over MPI on host arrays, not NCCL: the counts steer the
//    host-side ncclSend/ncclRecv calls and size the receive buffers, so they must reach
//    the host anyway; an NCCL exchange would add a device round trip and a stream sync
//    for W int64s. barrier is MPI too (after the stream drains).
//  - all_reduce_sum is ncclAllReduce: for a fixed W, node topology, NCCL version and
//    algorithm/protocol choice the float sums are reproducible and identical on every
//    rank; pin NCCL_ALGO / NCCL_PROTO to keep them so across machines.
//  - A dead or failed peer leaves NCCL kernels spinning on this rank. With W > 1 the
//    communicator registers a wait poller (cuda_context.h): every host wait of the
//    CUDA path checks ncclCommGetAsyncError, and on an error aborts the communicator
//    (its kernels then end, so the streams drain) and throws ncf::Error naming it;
//    run_main then takes the job down. A peer that is stopped or cut off raises no
//    error: with --peer_timeout, the same poller ends this rank (the host-side
//    watchdog's line and exit) once a collective has not completed within the limit
//    of its enqueueing.
#ifdef NCF_WITH_CUDA

#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/collective_watch.h"
#include "comm/copy_blocks.h"
#include "comm/mpi_communicator.h"  // MpiGroups, mpi_all_to_all_v
#include "comm/peer_watch.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/gpu_identity.h"

namespace ncf {
namespace {

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kBFloat16:
      return ncclBfloat16;
  }
  NCF_CHECK(false, "unknown DType ", static_cast<int>(dtype));
}

constexpr int kEvents = 64;

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const RankInfo& info, cudaStream_t compute)
      : Communicator(info.rank, info.world, info.local_rank, info.local_world), compute_(compute) {
    if (info.world > 1) {
      NCF_CHECK(info.mpi, "NCCL with W = ", info.world, " needs MPI (bootstrap_mpi)");
      MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &mpi_));
      MPI_CHECK(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN));
    }
    set_node_map(info.nodes);
    // NCCL refuses two ranks of one communicator on one GPU; say which and what to do
    // instead. The node's bus ids decide it (select_local_gpu gathered them): how many
    // GPUs a rank sees says nothing when the launcher gives each rank its own.
    if (info.local_world > 1) {
      const LocalGpu gpu = local_gpu();
      NCF_CHECK(gpu.device >= 0,
                "NCCL communicator: this rank's GPU was not chosen with "
                "select_local_gpu, so its sharing is unknown");
      NCF_REQUIRE(gpu.nccl_sharing.exclusive(), "NCCL needs one GPU per rank, but on this node ",
                  describe_gpu_sharing(gpu.nccl_sharing, gpu.world_ranks),
                  "; use --comm mpi (host-staged) to share GPUs");
      // Ranks on one GPU, each with its own NCCL_HOSTID: NCCL takes them for ranks
      // of different hosts. A way to run NCCL's path on a machine with one GPU.
      if (!gpu.sharing.exclusive() && info.local_rank == 0)
        std::fprintf(stderr,
                     "ncf_dist: note: %s, and each gives NCCL a host id of its own "
                     "(NCCL_HOSTID): NCCL takes them for ranks of different hosts and "
                     "connects them through its network transport, slowly; a way to run "
                     "NCCL's path on one GPU, not to train fast\n",
                     describe_gpu_sharing(gpu.sharing, gpu.world_ranks).c_str());
    }
    ncclUniqueId id;
    if (info.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    if (info.world > 1) MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_));
    NCCL_CHECK(ncclCommInitRank(&comm_, info.world, id, info.rank));
    // Non-blocking: the legacy default stream's copies must not serialize with it.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    // Only a peer can fail asynchronously; one rank keeps the plain waits.
    if (info.world > 1) register_wait_poller(this, [this] { poll_async_error(); });
  }

  ~NcclCommunicator() override {
    unregister_wait_poller(this);
    if (comm_) {
      // While unwinding after an error the peers may never reach the matching calls;
      // abort drops the in-flight work instead of waiting for it.
      if (std::uncaught_exceptions() > 0)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  }

  const char* name() const override { return "nccl"; }
  Device device() const override { return Device::kCuda; }
  void synchronize() override { wait_stream(stream_); }

  void join(CommTicket ticket) override {
    if (ticket <= 0) return;
    NCF_CHECK(ticket <= seq_, "join: ticket ", ticket, " was never issued (last ", seq_, ")");
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_[ticket % kEvents], 0));
  }

 protected:
  void do_all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                       void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                       DType dtype) override {
    check_self_block(send_counts, recv_counts, rank());
    begin_collective();
    enqueue_all_to_all(CommGroup::kWorld, send, send_counts, send_displs, recv, recv_counts,
                       recv_displs, dtype);
    end_collective("NCCL all_to_all_v");
  }

  void do_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) override {
    if (world() == 1) {
      recv_counts[0] = send_counts[0];
      return;
    }
    MPI_CHECK(MPI_Alltoall(send_counts, 1, MPI_INT64_T, recv_counts, 1, MPI_INT64_T, mpi_));
  }

  // Host buffers (the host tier's announced ids, checkpoint chunks): MPI_Alltoallv on the
  // host, no stream involved.
  bool has_host_all_to_all_v() const override { return mpi_ != MPI_COMM_NULL; }
  void do_host_all_to_all_v(const void* send, const int64_t* send_counts,
                            const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                            const int64_t* recv_displs, DType dtype) override {
    mpi_all_to_all_v(mpi_, world(), send, send_counts, send_displs, recv, recv_counts, recv_displs,
                     dtype, &host_ints_);
  }

  void do_all_reduce_sum(void* buf, size_t n, DType dtype) override {
    begin_collective();
    NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_dtype(dtype), ncclSum, comm_, stream_));
    end_collective("NCCL all_reduce_sum");
  }

  // Two-hop: the groups' counts go over MPI like exchange_counts; their data is
  // a group of ncclSend/ncclRecv with the group's members on the world
  // communicator (no NCCL sub-communicators), and the packing copies are
  // copy_blocks kernels on the communication stream, all between one
  // begin_collective and end_collective.
  void do_setup_groups() override { groups_.setup(mpi_, rank(), world() / node_map().nodes()); }

  void do_group_exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k) override {
    groups_.exchange_counts(g, send, recv, k);
  }

  void do_group_all_to_all_v(CommGroup g, const void* send, const int64_t* send_counts,
                             const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                             const int64_t* recv_displs, DType dtype) override {
    check_self_block(send_counts, recv_counts, group_index(g));
    enqueue_all_to_all(g, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
  }

  void do_copy_blocks(void* dst, const void* src, const CopyBlock* blocks, int64_t n) override {
    copy_blocks_cuda(stream_, dst, src, blocks, n);
  }

  void exchange_begin() override { begin_collective(); }
  void exchange_end() override { end_collective("NCCL two-hop exchange"); }

  void do_barrier() override {
    wait_stream(compute_);
    synchronize();
    if (world() > 1) MPI_CHECK(MPI_Barrier(mpi_));
  }

 private:
  // Member `me` of a group is this rank: its block to itself is a copy, so both
  // sides must agree on its size.
  void check_self_block(const int64_t* send_counts, const int64_t* recv_counts, int me) const {
    NCF_CHECK(send_counts[me] == recv_counts[me], "all_to_all_v: rank ", rank(), " sends ",
              send_counts[me], " elements to itself but expects to receive ", recv_counts[me]);
  }

  // A group of ncclSend/ncclRecv, one pair per member of g with a non-zero count
  // (world ranks from group_rank), and this rank's own block as a
  // cudaMemcpyAsync, all on the communication stream.
  void enqueue_all_to_all(CommGroup g, const void* send, const int64_t* send_counts,
                          const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                          const int64_t* recv_displs, DType dtype) {
    const int G = group_size(g), me = group_index(g);
    const size_t es = dtype_size(dtype);
    const ncclDataType_t nt = nccl_dtype(dtype);
    const char* s = static_cast<const char*>(send);
    char* d = static_cast<char*>(recv);
    ncclResult_t rc = ncclGroupStart();
    // The group must be closed whatever happens inside it, so errors are collected
    // and raised after ncclGroupEnd.
    for (int i = 0; i < G && rc == ncclSuccess; ++i) {
      if (i == me) continue;
      const int peer = group_rank(g, i);
      if (send_counts[i] > 0)
        rc = ncclSend(s + send_displs[i] * es, static_cast<size_t>(send_counts[i]), nt, peer, comm_,
                      stream_);
      if (rc == ncclSuccess && recv_counts[i] > 0)
        rc = ncclRecv(d + recv_displs[i] * es, static_cast<size_t>(recv_counts[i]), nt, peer, comm_,
                      stream_);
    }
    const ncclResult_t end = ncclGroupEnd();
    NCCL_CHECK(rc);
    NCCL_CHECK(end);
    if (send_counts[me] > 0)
      CUDA_CHECK(cudaMemcpyAsync(d + recv_displs[me] * es, s + send_displs[me] * es,
                                 send_counts[me] * es, cudaMemcpyDeviceToDevice, stream_));
  }

  // The wait poller (any thread that waits on a stream): on an asynchronous NCCL
  // error, abort the communicator once and throw. Later calls throw the same error.
  void poll_async_error() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!async_error_.empty()) NCF_FAIL(async_error_);
    if (!comm_) return;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
    if (rc != ncclSuccess) async = rc;
    if (async == ncclSuccess || async == ncclInProgress) {
      check_stalled_collective();
      return;
    }
    const char* detail = ncclGetLastError(comm_);
    // Which peer, when the peer watch knows (it names rank and host); else NCCL's words.
    const std::string lost = peer_watch_lost();
    async_error_ =
        std::string("NCCL asynchronous error '") + ncclGetErrorString(async) + "' (" +
        (detail ? detail : "") + ") on the communicator: " +
        (lost.empty() ? std::string("a peer rank failed or the network broke") : "lost " + lost) +
        "; the communicator was aborted";
    ncclCommAbort(comm_);  // ends this rank's NCCL kernels, so the streams drain
    comm_ = nullptr;
    NCF_FAIL(async_error_);
  }

  // The GPU side of --peer_timeout: a collective enqueued longer ago than the
  // limit and still not complete (its peers never joined: stopped, lost, cut off)
  // aborts the communicator and ends this rank as the host-side watchdog does.
  // Called from poll_async_error, so while this rank's host waits on a stream.
  void check_stalled_collective() {
    const double limit = collective_timeout();
    if (limit <= 0 || !comm_ || completed_ == seq_) return;
    // Slots older than the ring were recorded again by later collectives: the
    // stream is serial, so the oldest slot still held answers for them.
    if (seq_ - completed_ > kEvents) completed_ = seq_ - kEvents;
    while (completed_ < seq_ && cudaEventQuery(done_[(completed_ + 1) % kEvents]) == cudaSuccess)
      ++completed_;
    if (completed_ == seq_) return;
    const int slot = static_cast<int>((completed_ + 1) % kEvents);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - enqueued_[slot]).count();
    if (waited <= limit) return;
    ncclCommAbort(comm_);  // this rank's NCCL kernels end; nothing waits for the peers
    comm_ = nullptr;
    give_up_waiting(waited, what_[slot] ? what_[slot] : "an NCCL collective");
  }

  // The communication stream starts after the compute stream's queued work.
  void begin_collective() {
    NCF_CHECK(comm_ != nullptr,
              "NCCL collective after the communicator was aborted: ", async_error_);
    CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  // Records the collective's completion; the compute stream waits for it unless
  // the call is deferred (then the ticket goes back to the *_async caller).
  void end_collective(const char* what) {
    ++seq_;
    CUDA_CHECK(cudaEventRecord(done_[seq_ % kEvents], stream_));
    what_[seq_ % kEvents] = what;
    enqueued_[seq_ % kEvents] = std::chrono::steady_clock::now();
    if (deferred())
      last_ticket_ = seq_;
    else
      CUDA_CHECK(cudaStreamWaitEvent(compute_, done_[seq_ % kEvents], 0));
  }

  cudaStream_t compute_;           // the rank's compute stream (not owned)
  cudaStream_t stream_ = nullptr;  // communication stream (owned)
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_[kEvents] = {};
  CommTicket seq_ = 0;
  // The watchdog's view of the ring: each slot's collective and when it was
  // enqueued, and the last collective known complete.
  const char* what_[kEvents] = {};
  std::chrono::steady_clock::time_point enqueued_[kEvents] = {};
  CommTicket completed_ = 0;
  ncclComm_t comm_ = nullptr;  // nullptr once aborted
  // Collectives and host waits run on the rank's main thread; the lock keeps the
  // abort single should a wait on another thread poll at the same time.
  std::mutex abort_mu_;
  std::string async_error_;       // the asynchronous error that aborted comm_
  MPI_Comm mpi_ = MPI_COMM_NULL;  // W > 1: counts, barrier
  std::vector<int> host_ints_;    // mpi_all_to_all_v's int copies (host buffers)
  MpiGroups groups_;              // two-hop: the node and rail groups' counts
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo& info, void* stream) {
  return std::make_unique<NcclCommunicator>(info, static_cast<cudaStream_t>(stream));
}

}  // namespace ncf

#endif  // NCF_WITH_CUDA
