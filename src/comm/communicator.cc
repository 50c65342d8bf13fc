// Argument checks shared by every Communicator, done once here so that the MPI,
// NCCL and single implementations only move data.
#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/check.h"

namespace ncf {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kFloat64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  NCF_FAIL("unknown DType ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat64:
      return "float64";
    case DType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

Communicator::Communicator(int rank, int world, int local_rank, int local_world)
    : rank_(rank), world_(world), local_rank_(local_rank), local_world_(local_world) {
  NCF_CHECK(world >= 1 && rank >= 0 && rank < world, "bad rank ", rank, " of world ", world);
  NCF_CHECK(local_world >= 1 && local_rank >= 0 && local_rank < local_world, "bad local rank ",
            local_rank, " of local world ", local_world);
}

namespace {

// Counts and displacements come from bucketing code; a negative one is a bug there,
// and passing it on would let MPI or NCCL read or write outside the buffers.
void check_layout(const char* side, const int64_t* counts, const int64_t* displs, int W,
                  const void* data) {
  NCF_CHECK(counts != nullptr && displs != nullptr, "all_to_all_v: null ", side,
            " counts or displacements");
  for (int p = 0; p < W; ++p) {
    NCF_CHECK(counts[p] >= 0, "all_to_all_v: ", side, "_counts[", p, "] = ", counts[p],
              " is negative");
    NCF_CHECK(displs[p] >= 0, "all_to_all_v: ", side, "_displs[", p, "] = ", displs[p],
              " is negative");
    NCF_CHECK(counts[p] == 0 || data != nullptr, "all_to_all_v: ", side, "_counts[", p,
              "] = ", counts[p], " but the ", side, " buffer is null");
  }
}

}  // namespace

void Communicator::all_to_all_v(const void* send, const int64_t* send_counts,
                                const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                                const int64_t* recv_displs, DType t) {
  check_layout("send", send_counts, send_displs, world_, send);
  check_layout("recv", recv_counts, recv_displs, world_, recv);
  int64_t out = 0;
  for (int p = 0; p < world_; ++p)
    if (p != rank_) out += send_counts[p];
  count(CollectiveKind::kAllToAll, out * int64_t(dtype_size(t)));
  do_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
}

void Communicator::exchange_counts(const int64_t* send_counts, int64_t* recv_counts) {
  NCF_CHECK(send_counts != nullptr && recv_counts != nullptr, "exchange_counts: null array");
  for (int p = 0; p < world_; ++p)
    NCF_CHECK(send_counts[p] >= 0, "exchange_counts: send_counts[", p, "] = ", send_counts[p],
              " is negative");
  count(CollectiveKind::kCounts, int64_t(world_ - 1) * 8);
  do_exchange_counts(send_counts, recv_counts);
}

void Communicator::all_reduce_sum(void* buf, size_t n, DType t) {
  if (n == 0) return;
  NCF_CHECK(buf != nullptr, "all_reduce_sum: null buffer for ", n, " elements");
  // A ring allreduce sends 2(W-1)/W of the buffer from every rank.
  count(CollectiveKind::kAllReduce,
        int64_t(n * dtype_size(t)) * 2 * (world_ - 1) / std::max(1, world_));
  do_all_reduce_sum(buf, n, t);
}

void Communicator::barrier() {
  count(CollectiveKind::kOther, 0);
  do_barrier();
}

void Communicator::count(CollectiveKind k, int64_t bytes) {
  ++counters_.calls[int(k)];
  counters_.bytes[int(k)] += bytes;
}

int64_t CommCounters::total_calls() const {
  int64_t c = 0;
  for (int64_t x : calls) c += x;
  return c;
}

int64_t CommCounters::total_bytes() const {
  int64_t b = 0;
  for (int64_t x : bytes) b += x;
  return b;
}

void* Communicator::host_staging(int slot, size_t bytes) {
  NCF_CHECK(slot == 0 || slot == 1, "host_staging: slot ", slot, " (0 or 1)");
  staging_[slot].reserve(std::max<size_t>(bytes, 1));
  return staging_[slot].data();
}

void* Communicator::device_staging(int slot, size_t bytes) {
  NCF_CHECK(slot == 0 || slot == 1, "device_staging: slot ", slot, " (0 or 1)");
  Buffer<char>& b = device_staging_[slot];
  if (b.device() != device()) b = Buffer<char>(device(), 0);
  b.reserve(std::max<size_t>(bytes, 1));
  return b.data();
}

namespace {
// Sets the deferred flag for one call, also when the call throws.
struct DeferScope {
  bool& flag;
  explicit DeferScope(bool& f) : flag(f) { flag = true; }
  ~DeferScope() { flag = false; }
};
}  // namespace

CommTicket Communicator::all_to_all_v_async(const void* send, const int64_t* send_counts,
                                            const int64_t* send_displs, void* recv,
                                            const int64_t* recv_counts, const int64_t* recv_displs,
                                            DType t) {
  last_ticket_ = 0;
  DeferScope d(deferred_);
  all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  return last_ticket_;
}

CommTicket Communicator::all_reduce_sum_async(void* buf, size_t n, DType t) {
  last_ticket_ = 0;
  DeferScope d(deferred_);
  all_reduce_sum(buf, n, t);
  return last_ticket_;
}

void all_reduce_sum_on(Communicator& comm, Device buf_device, void* buf, size_t n, DType t,
                       CommTicket* ticket) {
  if (ticket) *ticket = 0;
  if (buf_device == comm.device()) {
    if (ticket)
      *ticket = comm.all_reduce_sum_async(buf, n, t);
    else
      comm.all_reduce_sum(buf, n, t);
    return;
  }
  const size_t bytes = n * dtype_size(t);
  if (comm.device() == Device::kCpu) {
    // Device data, host communicator: through pinned memory (DMA copies).
    void* stage = comm.host_staging(0, bytes);
    device_copy(Device::kCpu, stage, buf_device, buf, bytes);
    comm.all_reduce_sum(stage, n, t);
    device_copy(buf_device, buf, Device::kCpu, stage, bytes);
    return;
  }
  // Host data, device communicator (scalars under NCCL): through device staging.
  // Every use of the slot has finished when this returns (synchronize, then a
  // blocking copy), so the next call may reuse it.
  void* stage = comm.device_staging(0, bytes);
  device_copy(comm.device(), stage, buf_device, buf, bytes);
  comm.all_reduce_sum(stage, n, t);
  comm.synchronize();
  device_copy(buf_device, buf, comm.device(), stage, bytes);
}

void all_to_all_v_on(Communicator& comm, Device buf_device, const void* send,
                     const int64_t* send_counts, const int64_t* send_displs, void* recv,
                     const int64_t* recv_counts, const int64_t* recv_displs, DType t,
                     CommTicket* ticket) {
  if (ticket) *ticket = 0;
  if (buf_device == comm.device()) {
    if (ticket)
      *ticket = comm.all_to_all_v_async(send, send_counts, send_displs, recv, recv_counts,
                                        recv_displs, t);
    else
      comm.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    return;
  }
  // Staged buffers span [0, max(displ + count)) on each side.
  const int W = comm.world();
  int64_t send_n = 0, recv_n = 0;
  for (int p = 0; p < W; ++p) {
    send_n = std::max(send_n, send_displs[p] + send_counts[p]);
    recv_n = std::max(recv_n, recv_displs[p] + recv_counts[p]);
  }
  const size_t es = dtype_size(t);
  const size_t sb = size_t(send_n) * es, rb = size_t(recv_n) * es;
  if (comm.device() == Device::kCpu) {
    // Device data, host communicator (GPU ranks sharing a GPU): pinned staging.
    void* s = comm.host_staging(0, sb);
    void* r = comm.host_staging(1, rb);
    device_copy(Device::kCpu, s, buf_device, send, sb);
    comm.all_to_all_v(s, send_counts, send_displs, r, recv_counts, recv_displs, t);
    device_copy(buf_device, recv, Device::kCpu, r, rb);
    return;
  }
  void* s = comm.device_staging(0, sb);
  void* r = comm.device_staging(1, rb);
  device_copy(comm.device(), s, buf_device, send, sb);
  comm.all_to_all_v(s, send_counts, send_displs, r, recv_counts, recv_displs, t);
  comm.synchronize();
  device_copy(buf_device, recv, comm.device(), r, rb);
}

}  // namespace ncf
