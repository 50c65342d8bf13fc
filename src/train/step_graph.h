// The training step as one CUDA graph (ncf_dist --cuda_graph on).
//
// Each step is captured from the compute stream while train_step enqueues it, as it
// would be enqueued eagerly: the host code runs as usual (the step count, the buffers'
// sizes, the Adam scalars), the kernels, copies and memsets are recorded instead of
// launched. The executable graph of the previous step takes the new step's parameters
// (cudaGraphExecUpdate: the same kernels in the same order, other pointers and
// scalars) and is launched whole: the GPU runs the same kernels with the same
// arguments as eagerly, so the results are the same bits, with less time between
// kernels. Where an update is refused (another sequence of kernels), the step's graph
// is instantiated anew.
//
// Only a step that never waits on the host can be captured: one GPU rank (the
// exchanges of several ranks read their message sizes on the host) with FP32 table
// rows (the BF16 rows' update sums duplicates with a host-sized reduction).
// The first step of a run and the first of each new batch size run eagerly: they grow
// the step's buffers and the scratch arena to their sizes, which a capture cannot do.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/device.h"

namespace ncf {

// Why a step of this configuration cannot be captured ("" when it can).
std::string step_graph_refusal(Device device, int world, bool bf16_table_rows);

class StepGraph {
 public:
  // ctx: a CUDA context (make_cuda_context); its stream is the one captured.
  explicit StepGraph(const ExecContext& ctx);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Whether the step of n positives that comes now is to be captured: when the
  // step before it had the same n (it ran eagerly and sized everything). Call
  // once per step.
  bool capture_next(int64_t n);

  // Captures the work `enqueue` puts on the stream, brings the executable graph
  // up to it and launches it. What enqueue throws ends the capture and is thrown
  // on, naming the capture; so is a call the capture refused (a host wait, an
  // allocation).
  void launch(const std::function<void()>& enqueue);

  int64_t launches() const { return launches_; }
  int64_t instantiations() const { return instantiations_; }

 private:
  ExecContext ctx_;
  void* exec_ = nullptr;  // cudaGraphExec_t
  int64_t last_n_ = -1;
  int64_t launches_ = 0, instantiations_ = 0;
};

}  // namespace ncf
