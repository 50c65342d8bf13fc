// The training step as one CUDA graph: see step_graph.h.
#include "train/step_graph.h"

#include "common/check.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>

#include "common/cuda_context.h"  // CUDA_CHECK, wait_stream
#endif

namespace ncf {

std::string step_graph_refusal(Device device, int world, bool bf16_table_rows) {
  if (device != Device::kCuda) return "CPU ranks launch no kernels";
#ifndef NCF_WITH_CUDA
  return "this build has no CUDA";
#endif
  if (world > 1)
    return detail::concat(world,
                          " ranks: the embedding exchange waits on the host for its message sizes");
  if (bf16_table_rows)
    return "--table_dtype bf16: the update of BF16 rows waits on the host for its unique rows";
  return "";
}

#ifdef NCF_WITH_CUDA

namespace {
cudaStream_t stream_of(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }
cudaGraphExec_t as_exec(void* p) { return static_cast<cudaGraphExec_t>(p); }
}  // namespace

StepGraph::StepGraph(const ExecContext& ctx) : ctx_(ctx) {
  NCF_CHECK(ctx.device == Device::kCuda && ctx.stream != nullptr,
            "StepGraph: needs a CUDA context with a stream");
}

StepGraph::~StepGraph() {
  if (exec_ == nullptr) return;
  // The last launch may still run: the device drains first (destructors cannot throw).
  wait_device_nothrow();
  cudaGraphExecDestroy(as_exec(exec_));
}

bool StepGraph::capture_next(int64_t n) {
  const bool warm = n == last_n_;
  last_n_ = n;
  return warm;
}

void StepGraph::launch(const std::function<void()>& enqueue) {
  cudaStream_t stream = stream_of(ctx_);
  // Thread-local: a call of this thread that the capture cannot hold (a host wait, an
  // allocation) fails at once instead of passing unrecorded.
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    // Leave capture mode (the stream is usable again) and drop what was recorded.
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr)
      cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's own error, if any, is not a later launch's
    try {
      throw;
    } catch (const Error& e) {
      NCF_RETHROW(e, "--cuda_graph on: capturing the training step");
    }
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    NCF_FAIL("--cuda_graph on: the training step could not be captured as a CUDA graph (",
             cudaGetErrorString(ended),
             "): a call in it waits on the host or allocates; run with --cuda_graph off");
  }
  if (exec_ != nullptr) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(as_exec(exec_), graph, &info) != cudaSuccess) {
      cudaGetLastError();  // a refused update is not an error of the next launch
      // Another sequence of kernels: the old executable graph goes once its last
      // launch has run.
      try {
        wait_stream(stream);
      } catch (...) {
        cudaGraphDestroy(graph);
        throw;
      }
      cudaGraphExecDestroy(as_exec(exec_));
      exec_ = nullptr;
    }
  }
  if (exec_ == nullptr) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    if (made != cudaSuccess) {
      cudaGraphDestroy(graph);
      CUDA_CHECK(made);
    }
    exec_ = exec;
    ++instantiations_;
  }
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  CUDA_CHECK(cudaGraphLaunch(as_exec(exec_), stream));
  ++launches_;
}

#else

StepGraph::StepGraph(const ExecContext&) { NCF_FAIL("--cuda_graph on: this build has no CUDA"); }
StepGraph::~StepGraph() = default;
bool StepGraph::capture_next(int64_t) { return false; }
void StepGraph::launch(const std::function<void()>& enqueue) { enqueue(); }

#endif

}  // namespace ncf
