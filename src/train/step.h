// One training step of one rank, as one function (docs/design.md, steps 2–6):
//
//   negatives → lookup → tower forward/backward → dense allreduce
//             → table update → dense Adam
//
// train_step reads top to bottom in step.cc. The trainer (trainer.h) keeps the
// readers, the epoch loop, timing and logging around it; the in-process tests
// and the GPU parity test call the same function.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "common/device.h"
#include "common/step_timer.h"
#include "data/negatives.h"
#include "embedding/collection.h"
#include "model/neumf.h"
#include "model/optim.h"

namespace ncf {

// Where layer 0 takes its items' half by item and this rank holds the whole item table
// (W = 1, FP32 rows and wire: EmbeddingCollection::narrow_lookups), the step's lookup writes
// only the GMF columns of the samples' item rows and layer 0 reads its runs' MLP columns
// from the table (true, the default); with dense Adam the backward also hands the table
// update each item's MLP gradient by item (EmbeddingCollection::give_columns) instead of
// on its first sample with zeros on the others. The same values without writing or reading
// the MLP columns of every sample. With the environment variable NCF_NARROW_ITEM_LOOKUP=0 the
// lookup writes whole rows, as before (kept selectable to be timed beside it). Read at the first
// call; the setter (tests) overrides it.
bool narrow_item_lookups();
void set_narrow_item_lookups(bool on);

// What a step reads and writes. The trainer builds one per run.
struct TrainState {
  // Fixed for the run.
  const PositiveLists* positives = nullptr;               // CPU ranks: the CSR on the host
  const DevicePositiveLists* device_positives = nullptr;  // GPU ranks: the CSR on the device
  int64_t num_items = 0;
  int num_neg = 4;
  uint64_t seed = 0;
  AdamHyper dense_hyper;
  EmbeddingCollection* tables = nullptr;  // table 0 users, table 1 items
  NeuMF* model = nullptr;

  // Trained state besides the tables and the tower's parameters.
  Buffer<float> adam_m, adam_v;  // [params] the tower's Adam moments
  int64_t t = 0;                 // optimizer steps taken

  // Step buffers on the context's device (B samples of this rank's step).
  Buffer<int32_t> users, items;           // [B] positives and their negatives
  Buffer<float> item_mlp_grads;           // [items × mlp_half] by item (narrow_item_lookups)
  Buffer<float> labels, logits, dlogits;  // [B]
  // [params + replicated floats + kStepRequests]: the tower's gradient, the
  // replicated tables' dense gradients and the step's requests, allreduced as
  // one buffer (used when a table is replicated or requests ride along;
  // otherwise the tower's own gradient buffer is allreduced).
  Buffer<float> dense_grads;

  // Allocates the moments and step buffers on ctx's device.
  void allocate(const ExecContext& ctx);
};

// This rank's part of global step `step`: n positives (users[n], items[n] on
// the context's device) at global positive index slice_begin of the epoch's
// stream; global_positives of the whole step over all ranks.
struct StepBatch {
  const int32_t* users = nullptr;
  const int32_t* items = nullptr;
  int64_t n = 0;
  int64_t slice_begin = 0;
  int64_t epoch = 0;
  int64_t global_positives = 0;
  // CPU ranks with a host tier: the n·S samples (users, items, labels; host memory) the
  // trainer drew for this step when it announced it, taken instead of drawing them again
  // (the same draw). Null: the step draws them.
  const int32_t* drawn_users = nullptr;
  const int32_t* drawn_items = nullptr;
  const float* drawn_labels = nullptr;
};

// Requests that ride in the step's dense allreduce, so that every rank learns
// of any rank's request at the same step without a collective of its own:
// requests[k] is this rank's (0 or 1), sums[k] after the step is the number of
// ranks that made request k. With W = 1, sums = requests.
constexpr int kStepRequests = 2;
enum StepRequest { kRequestStop = 0, kRequestCheckpoint = 1 };
struct StepControl {
  float requests[kStepRequests] = {};
  float sums[kStepRequests] = {};
};

// What the step sent: the collectives and bytes this rank issued.
struct StepReport {
  int64_t samples = 0;      // global samples of the step
  int64_t collectives = 0;  // collective calls on this rank
  int64_t bytes_sent = 0;   // payload bytes to other ranks
  // The count and all-to-all exchanges' messages and bytes to ranks on this
  // node and on other nodes (comm/communicator.h CommCounters).
  int64_t intra_msgs = 0, intra_bytes = 0, inter_msgs = 0, inter_bytes = 0;
};

// One step. Collective: every rank calls it with its slice (n may be 0). The
// rank's share of the step's mean loss is written to *loss_share (a double on
// the context's device; left alone when n = 0). timer, if given, is between begin and end and gets
// the phase marks.
// control, if given, carries requests through the allreduce (see StepControl).
StepReport train_step(TrainState& s, const StepBatch& batch, Communicator& comm,
                      const ExecContext& ctx, double* loss_share, StepTimer* timer = nullptr,
                      StepControl* control = nullptr);

}  // namespace ncf
