// The training step: see step.h. Read it top to bottom; each block is one
// stage of the step in docs/design.md.
#include "train/step.h"

#include <algorithm>

#include "common/check.h"
#include "common/env_switch.h"
#include "model/ops.h"

namespace ncf {

namespace {
std::atomic<int> g_narrow_item_lookups{-1};  // -1: not read from the environment yet
}  // namespace

bool narrow_item_lookups() { return env_switch(g_narrow_item_lookups, "NCF_NARROW_ITEM_LOOKUP"); }
void set_narrow_item_lookups(bool on) { g_narrow_item_lookups.store(on ? 1 : 0); }

void TrainState::allocate(const ExecContext& ctx) {
  NCF_CHECK(model && tables, "train state: model or tables missing");
  adam_m = Buffer<float>(ctx.device, size_t(model->num_params()));
  adam_v = Buffer<float>(ctx.device, size_t(model->num_params()));
  adam_m.zero();
  adam_v.zero();
  for (Buffer<int32_t>* b : {&users, &items}) *b = Buffer<int32_t>(ctx.device, 0);
  for (Buffer<float>* b : {&labels, &logits, &dlogits, &item_mlp_grads})
    *b = Buffer<float>(ctx.device, 0);
  const int64_t rep = tables->replicated_grad_floats();
  dense_grads = Buffer<float>(ctx.device, size_t(model->num_params() + rep + kStepRequests));
}

StepReport train_step(TrainState& s, const StepBatch& batch, Communicator& comm,
                      const ExecContext& ctx, double* loss_share, StepTimer* timer,
                      StepControl* control) {
  auto mark = [&](StepPhase p) {
    if (timer) timer->mark(p);
  };
  const int S = s.num_neg + 1;  // samples per positive
  const int64_t n = batch.n;
  const int64_t B = n * S;                       // this rank's samples
  const int64_t G = batch.global_positives * S;  // the global step's samples
  EmbeddingCollection& tables = *s.tables;
  NeuMF& model = *s.model;
  const CommCounters before = comm.counters();

  // 1. Negatives: each positive expands to S samples, keyed by (seed, epoch,
  //    global sample index), so they do not depend on W.
  s.users.reserve(size_t(B));
  s.items.reserve(size_t(B));
  s.labels.reserve(size_t(B));
  if (ctx.device == Device::kCpu && batch.drawn_items != nullptr) {
    std::copy_n(batch.drawn_users, B, s.users.data());
    std::copy_n(batch.drawn_items, B, s.items.data());
    std::copy_n(batch.drawn_labels, B, s.labels.data());
  } else if (ctx.device == Device::kCpu)
    sample_negatives(ctx, *s.positives, uint64_t(s.num_items), batch.users, batch.items,
                     batch.slice_begin, n, s.num_neg, s.seed, batch.epoch, s.users.data(),
                     s.items.data(), s.labels.data());
  else
    sample_negatives(ctx, *s.device_positives, uint64_t(s.num_items), batch.users, batch.items,
                     batch.slice_begin, n, s.num_neg, s.seed, batch.epoch, s.users.data(),
                     s.items.data(), s.labels.data());
  mark(StepPhase::kCompute);

  // 2. Lookup: both tables in one exchange per phase; one user row per
  //    positive (its S samples share it), one item row per sample. Where layer 0
  //    takes its items' half by item from this rank's own item table, the samples'
  //    item rows need their GMF columns only.
  ItemKeys keys{s.items.data(), s.num_items};
  const int mf = model.config().mf_dim;
  const bool narrow =
      narrow_item_lookups() && tables.narrow_lookups() && model.layer0_by_item(B, keys);
  if (narrow) {
    keys.table = tables.local_rows(1);
    keys.ld = tables.plan().D;
    if (tables.given_columns_ok()) {
      s.item_mlp_grads.reserve(size_t(s.num_items) * size_t(model.config().mlp_half()));
      keys.mlp_grads = s.item_mlp_grads.data();
    }
  }
  tables.lookup({{batch.users, n}, {s.items.data(), B, narrow ? mf : 0}});
  mark(StepPhase::kExchange);

  // 3. Tower forward and backward: the loss share, the tower's gradient, and
  //    the gradient of every looked-up row (into the collection's buffers).
  s.logits.reserve(size_t(B));
  s.dlogits.reserve(size_t(B));
  if (B > 0) {
    // The samples' item ids let layer 0 take its items' half once per distinct item.
    model.forward_backward(ctx, tables.rows(0), tables.rows(1), n, S, s.labels.data(), G,
                           s.logits.data(), s.dlogits.data(), loss_share, tables.row_grads(0),
                           tables.row_grads(1), keys);
    if (keys.mlp_grads != nullptr) tables.give_columns(1, mf, keys.mlp_grads);
  } else {
    model.grads().zero();  // no samples: no loss share, a zero gradient
  }
  mark(StepPhase::kCompute);

  // 4. The table gradients start towards their owners; the replicated tables'
  //    dense gradients join the tower's, and one allreduce sums them all. It
  //    runs while the owners update (a host communicator completes it here).
  //    The step's requests (StepControl) ride at its end.
  const int64_t params = model.num_params();
  const int64_t rep = tables.replicated_grad_floats();
  const int64_t requests = control && comm.world() > 1 ? kStepRequests : 0;
  float* dense = model.grads().data();
  if (rep > 0 || requests > 0) {
    dense = s.dense_grads.data();
    device_copy_async(ctx, ctx.device, dense, ctx.device, model.grads().data(), size_t(params) * 4);
  }
  if (requests > 0)
    device_copy_async(ctx, ctx.device, dense + params + rep, Device::kCpu, control->requests,
                      sizeof control->requests);
  tables.gradients_start(rep > 0 ? dense + params : nullptr);
  mark(StepPhase::kExchange);
  CommTicket allreduce = 0;
  if (comm.world() > 1)
    all_reduce_sum_on(comm, ctx.device, dense, size_t(params + rep + requests), DType::kFloat32,
                      &allreduce);
  mark(StepPhase::kAllreduce);

  // 5. Table update: the owners' fused reduce-and-update; then, once the
  //    allreduce is in, the replicated tables.
  ++s.t;
  tables.gradients_finish(s.t);
  mark(StepPhase::kExchange);
  comm.join(allreduce);  // on a stream-ordered communicator, the wait for the allreduce
  mark(StepPhase::kAllreduce);
  tables.update_replicated(dense + params, s.t);
  if (requests > 0)  // the host waits for the allreduce here
    device_copy(Device::kCpu, control->sums, ctx.device, dense + params + rep,
                sizeof control->sums);
  else if (control)
    std::copy_n(control->requests, kStepRequests, control->sums);

  // 6. Dense Adam: the same step on every rank.
  dense_adam_step(ctx, model.params().data(), dense, s.adam_m.data(), s.adam_v.data(), params, s.t,
                  s.dense_hyper);
  mark(StepPhase::kCompute);

  const CommCounters& after = comm.counters();
  StepReport report;
  report.samples = G;
  report.collectives = after.total_calls() - before.total_calls();
  report.bytes_sent = after.total_bytes() - before.total_bytes();
  report.intra_msgs = after.intra_msgs - before.intra_msgs;
  report.intra_bytes = after.intra_bytes - before.intra_bytes;
  report.inter_msgs = after.inter_msgs - before.inter_msgs;
  report.inter_bytes = after.inter_bytes - before.inter_bytes;
  return report;
}

}  // namespace ncf
