// The dense part of NeuMF (GMF + MLP tower + logit head), replicated on every
// rank. All dense parameters live in ONE flat buffer with a matching flat
// gradient buffer, so a step needs one allreduce and one optimizer call; the
// embedding tables are owned elsewhere (embedding/) and enter as gathered rows.
//
// Per sample (user u, item i), with the gathered rows u, i of width D = mf_dim + h, h = layers[0]/2
// (row layout [mf part | mlp part]):
//   G  = u[:mf] ⊙ i[:mf]                                  GMF, width mf_dim
//   X0 = [u[mf:] ; i[mf:]]                                 width layers[0]
//   X_{l+1} = ReLU(X_l · W_l^T + b_l), l = 0 .. L-2        width layers[l+1]
//   logit = w · [G ; X_{L-1}] + c                          head, width F = mf_dim + layers.back()
// (with layers = {256, 256, 128, 64} there are three Linear+ReLU layers.)
//
// Flat layout (floats, no padding): for each tower layer l, W_l [out×in] then
// b_l [out]; then the head w [F] and c [1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"

namespace ncf {

struct NeuMFConfig {
  int mf_dim = 8;                          // GMF factors
  std::vector<int> layers{64, 32, 16, 8};  // MLP widths; layers[0] is the concat input, even

  int embedding_width() const { return mf_dim + layers.at(0) / 2; }  // D
  int mlp_half() const { return layers.at(0) / 2; }                  // h
  int head_width() const { return mf_dim + layers.back(); }          // F
  // Throws naming the field and value: mf_dim >= 1, layers non-empty, all
  // widths >= 1, layers[0] even.
  void validate() const;
};

// Where one Linear layer's parameters sit in the flat buffer.
struct DenseLayerView {
  int in = 0, out = 0;
  int64_t w_offset = 0;  // W [out×in]
  int64_t b_offset = 0;  // b [out]
};

// NCF_EVAL_FUSED=1: NeuMF::score_items on BF16 storage on a GPU runs as the one kernel
// neumf_score_items_bf16 (model/ops.h) where the widths fit (score_items_fusable), instead of
// gather_bias_act_bf16, a cuBLASLt matmul per layer above and the fused top. Off by default
// until a GPU run has timed it beside them and held its logits to theirs: its products sum
// in the tensor cores' order, so a logit may differ from theirs in the rounding of one BF16
// activation. Read once; the setter (tests) overrides it.
bool score_items_fused_enabled();
void set_score_items_fused(bool on);

// Layer 0 by item in training: with the samples' item ids given (ItemKeys), NeuMF takes
// layer 0's items' half once per distinct item of the batch, P = X_items · W0[:, h:]^T
// on R = min(B, bound) rows (item_runs, gather_run_rows), and layer 0's output from
// P's rows by id (gather_bias_act); the backward sums layer 0's gradient per item
// (run_sums) and takes dW0[:, h:] from those R sums. Used where R ≤ B / 2 (the batch
// repeats its items: ml-20m's 26,744 items against 1,048,575 samples), and where the
// mode says: kAuto (the default) on GPU ranks only, where it replaces a GEMM writing
// 1 GB per step (on CPU ranks the products are cheap against the passes it adds: 0.92×
// for bf16 on an AMX core at batch 65,536); kOn on every device; kOff nowhere. The same
// values up to the order of the sums of dW0[:, h:] (and a GEMM row's bits in either
// shape). ncf_dist takes the mode from its flag --layer0_by_item.
enum class Layer0ByItem { kAuto, kOn, kOff };
void set_layer0_by_item(Layer0ByItem mode);
Layer0ByItem layer0_by_item_mode();
// "auto" | "on" | "off" (--layer0_by_item's values) → Layer0ByItem; anything else throws ncf::Error
// naming `what` and the value.
Layer0ByItem parse_layer0_by_item(const std::string& value, const std::string& what);

// The samples' item ids for layer 0 by item: ids [n·S] (on the parameters' device), each in
// [0, bound); ids null: per sample. table (optional, only where layer0_by_item says yes):
// the item table's rows (row i of item i, row stride ld = embedding_width()), from which
// layer 0 reads its runs' MLP columns; the item rows passed to forward then need to hold
// only their GMF columns (the lookup can skip the rest).
struct ItemKeys {
  const int32_t* ids = nullptr;
  int64_t bound = 0;
  const float* table = nullptr;
  int64_t ld = 0;
  // Optional with table: [bound × mlp_half()] rows by item id that the backward fills with
  // the batch's items' MLP gradient (put_run_rows: rows of items not in the batch left as
  // they were), instead of putting it on each item's first sample in d_item_rows, whose MLP
  // columns it then leaves unwritten.
  float* mlp_grads = nullptr;
};

class NeuMF {
 public:
  // Allocates parameters and gradients on `device` (contents undefined until init).
  NeuMF(const NeuMFConfig& config, Device device);

  // Deterministic init from `seed` (CounterRng, stream kStreamInit, counter
  // indices from kInitIndexBase up, one per tensor): tower weights Glorot
  // uniform ±sqrt(6 / (in + out)), head w LeCun uniform ±sqrt(3 / F), biases and
  // c zero (the TF Model Garden choices). Gradients are zeroed.
  void init(uint64_t seed);
  static constexpr uint64_t kInitIndexBase = uint64_t{1} << 48;

  // logits[n·S] for n users with S samples each: sample b pairs user row
  // b / S of user_rows [n×D] with item row b of item_rows [n·S × D] (both
  // contiguous, on the parameters' device). The users' half of the first layer
  // and their GMF factors are read once per user, not once per sample.
  // Activations are kept in this object's workspace (grown to the largest batch
  // seen); the row pointers are kept too, so both must stay valid and unchanged
  // until backward.
  // With keys, layer 0 by item where it applies (layer0_by_item_mode()); keys.ids must stay
  // valid and unchanged until backward too.
  void forward(const ExecContext& ctx, const float* user_rows, const float* item_rows, int64_t n,
               int S, float* logits, ItemKeys keys = {});
  // Scores for evaluation and serving: the same computation as forward.
  void score(const ExecContext& ctx, const float* user_rows, const float* item_rows, int64_t n,
             int S, float* logits) {
    forward(ctx, user_rows, item_rows, n, S, logits);
  }
  // Evaluation against a table of items (Trainer::evaluate, where every candidate
  // is one of R items). prepare_items keeps P = i_mlp · W0[:, h:]^T [R × layers[1]],
  // the items' half of layer 0 for each item, from their MLP columns item_mlp
  // [R × h] (row stride ld) and the current parameters (BF16 operands under BF16
  // storage, as forward's product). score_items then gives forward's logits for n
  // users with S candidates each, given as item ids [n·S] in [0, R), and the R items'
  // GMF columns item_gmf [R × mf] (row stride ldg): layer 0 reads P[ids[b], :]
  // (gather_bias_act) instead of multiplying each sample's item columns, and the top
  // reads item_gmf[ids[b], :] (neumf_top_forward's irow_ids) instead of a copy. The same
  // arithmetic, with the items' products taken once per item rather than per sample:
  // equal to forward's wherever the GEMM gives a row the same bits in either shape.
  // Needs a hidden layer and the fused top (can_score_items()); the parameters and
  // the math mode must not change in between.
  bool can_score_items() const { return !tower_.empty() && fused_top(); }
  // Whether the last score_items ran as neumf_score_items_bf16 (score_items_fused_enabled()).
  bool last_score_fused() const { return score_fused_; }
  // Whether forward takes layer 0's items' half by item for a batch of B samples with
  // these keys (layer0_by_item_mode(), the device, and a batch that repeats its items).
  bool layer0_by_item(int64_t B, ItemKeys keys) const;
  void prepare_items(const ExecContext& ctx, const float* item_mlp, int64_t ld, int64_t R);
  void score_items(const ExecContext& ctx, const float* user_rows, const float* item_gmf,
                   int64_t ldg, const int32_t* ids, int64_t n, int S, float* logits);
  // Backward of the last forward: dlogits[n·S] → the dense gradients (overwritten
  // in grads()), d_user_rows [n×D] (each user's sum over its samples) and
  // d_item_rows [n·S × D] (overwritten), the gradients w.r.t. the gathered rows,
  // ready to be sent back to the owners. After a forward by item (layer0_by_item()) the
  // MLP columns of d_item_rows hold each item's whole gradient on the first of its
  // samples and zeros on the others: per item the same sum, which is what the owners add.
  void backward(const ExecContext& ctx, const float* dlogits, float* d_user_rows,
                float* d_item_rows);
  // A training batch in one call: forward (logits [n·S]), this rank's share of the
  // mean BCE loss over global_batch samples (*loss, a double on the device:
  // bce_with_logits_forward with every row valid and unweighted) and backward of
  // its gradient. The fused top (fused_top(), below) takes the logits'
  // gradient from the logits and labels without storing it; the unfused one
  // writes it to dlogits [n·S] first. The same values either way (ops_modes.h
  // set_fused_top). With n·S = 0: zero gradients, *loss left alone.
  void forward_backward(const ExecContext& ctx, const float* user_rows, const float* item_rows,
                        int64_t n, int S, const float* labels, int64_t global_batch, float* logits,
                        float* dlogits, double* loss, float* d_user_rows, float* d_item_rows,
                        ItemKeys keys = {});
  // Whether the last forward ran layer 0 by item.
  bool layer0_by_item() const { return by_item_; }

  const NeuMFConfig& config() const { return config_; }
  Device device() const { return params_.device(); }
  int64_t num_params() const { return num_params_; }
  // The floats of the flat buffer a model of this shape has, without building
  // it: readers of a checkpoint hold its files to the shape before allocating.
  static int64_t param_count(const NeuMFConfig& config);
  Buffer<float>& params() { return params_; }
  const Buffer<float>& params() const { return params_; }
  Buffer<float>& grads() { return grads_; }
  const Buffer<float>& grads() const { return grads_; }
  const std::vector<DenseLayerView>& tower() const { return tower_; }  // L-1 layers
  int64_t head_w_offset() const { return head_w_offset_; }             // w [F]
  int64_t head_c_offset() const { return head_c_offset_; }             // c [1]

 private:
  NeuMFConfig config_;
  std::vector<DenseLayerView> tower_;
  int64_t head_w_offset_ = 0, head_c_offset_ = 0, num_params_ = 0;
  Buffer<float> params_, grads_;

  // Workspace of the last forward (n users, B = n·S rows): acts_[l] [B×layers[l+1]],
  // U0 [n×layers[1]] (the users' half of layer 0); for the unfused top G [B×mf],
  // H [B×F] and, with S > 1, the users' GMF columns repeated [B×mf]; without a hidden layer X0
  // [B×layers[0]] (and the users' MLP columns repeated [B×h]); and their gradients. Whether the top
  // (GMF, head, loss, the last layer's mask) runs as the fused ops neumf_top_*: unless a
  // test turned them off (set_fused_top), at widths they take. Decided by forward, for its
  // backward.
  bool fused_top() const;
  // backward with the logits' gradient given (dlogits) or, on the fused top only,
  // from logits and labels (then the loss share too).
  void backward_from(const ExecContext& ctx, const float* dlogits, const float* logits,
                     const float* labels, int64_t global_batch, double* loss, float* d_user_rows,
                     float* d_item_rows);

  // Whether the tower runs on BF16 storage (ops.h "BF16 storage"): MathMode kBf16
  // with the fused top and at least one hidden layer; decided by forward. Then
  // a16_[l] / d16_[l] replace acts_[l] / dacts_[l], wb_ is the BF16 copy of the
  // parameters, ub_ / ib_ the users' / items' MLP columns in BF16, du0b_ dU0.
  bool bf16_storage() const;
  // Layers 1 .. L-1 of the tower on B rows, after layer 0: acts_ (FP32) or, with bf16,
  // a16_ on wb_ (BF16 storage).
  void layers_above_first(const ExecContext& ctx, int64_t B, bool bf16);
  void forward_bf16(const ExecContext& ctx, int64_t n, int S, float* logits, ItemKeys keys);
  void backward_bf16(const ExecContext& ctx, const float* dlogits, const float* logits,
                     const float* labels, int64_t global_batch, double* loss, float* d_user_rows,
                     float* d_item_rows);

  bool fused_ = false;
  bool bf16_ = false;
  int64_t n_ = -1;
  int S_ = 1;
  const float* user_rows_ = nullptr;
  const float* item_rows_ = nullptr;
  Buffer<float> x0_, g_, h_, dx0_, dg_, dh_, u0_, du0_, ug_, dug_, ux_, dux_;
  std::vector<Buffer<float>> acts_, dacts_;
  Buffer<uint16_t> wb_, ub_, ib_, du0b_;
  std::vector<Buffer<uint16_t>> a16_, d16_;
  // Layer 0's ReLU bit mask (ops.h relu_mask_words), written by the forward and read
  // by the backward instead of layer 0's whole output: with the fused top and a layer
  // above layer 0 (whose backward then masks layer 0). layer0_mask(B) sizes it for B
  // rows and returns it, or null where unused; m0_ptr_ is what the last forward wrote.
  uint32_t* layer0_mask(int64_t B);
  Buffer<uint32_t> m0_;
  uint32_t* m0_ptr_ = nullptr;
  // Layer 0 by item (the last forward's, for its backward): R runs of the batch's items
  // (item_runs: order_, starts_, inv_, first_), their MLP columns xr_ [R × h; twice under
  // tf32, for the backward's hi and lo parts of dpr_] (xrb_ in
  // BF16, twice: [R × h ; R × h]), their products pr_ [R × layers[1]]; the backward's
  // per-item sums dpr_ (dprb_: their BF16 hi and lo parts, [2R × layers[1]]), and the items'
  // MLP gradient per run drun_ ([2R × h], the parts' products).
  bool by_item_ = false;
  ItemKeys keys_;  // the last forward's
  int64_t runs_ = 0;
  Buffer<int32_t> order_, starts_, inv_, first_;
  Buffer<float> xr_, pr_, dpr_, drun_;
  Buffer<uint16_t> xrb_, dprb_;
  // Decides by_item_ for a forward of B samples and sizes its buffers; then the runs and
  // P (products in BF16 with bf16).
  void layer0_items(const ExecContext& ctx, ItemKeys keys, int64_t B, bool bf16);
  // By item, the items' MLP gradient: drun_ = [count parts of R rows] · W0[:, h:]
  // (FP32 operands), scattered onto the runs' first samples of d_item_mlp (stride ld).
  void item_rows_gradient(const ExecContext& ctx, const float* parts, int count, const float* w0i,
                          int64_t ldw, float* d_item_mlp, int64_t ld);
  // drun_'s count parts summed per run: by item id into keys_.mlp_grads where the forward
  // had it, else onto the runs' first samples of d_item_mlp (stride ld).
  void put_item_mlp_gradient(const ExecContext& ctx, int count, float* d_item_mlp, int64_t ld);
  // prepare_items: P [pi_rows_ × layers[1]], made under BF16 storage or not.
  Buffer<float> pi_;
  int64_t pi_rows_ = -1;
  bool pi_bf16_ = false;
  bool score_fused_ = false;
};

}  // namespace ncf
