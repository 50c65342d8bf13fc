// NeuMF's flat parameter layout, its seeded init, and forward/backward as a
// sequence of ops.h calls (device-agnostic: the ops dispatch on ctx.device).
#include "model/neumf.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/check.h"
#include "common/env_switch.h"
#include "common/philox.h"
#include "model/ops.h"

namespace ncf {

void NeuMFConfig::validate() const {
  NCF_CHECK(mf_dim >= 1, "NeuMF config: mf_dim=", mf_dim, " must be >= 1");
  NCF_CHECK(!layers.empty(), "NeuMF config: layers is empty (need at least the input width)");
  for (size_t l = 0; l < layers.size(); ++l)
    NCF_CHECK(layers[l] >= 1, "NeuMF config: layers[", l, "]=", layers[l], " must be >= 1");
  NCF_CHECK(layers[0] % 2 == 0, "NeuMF config: layers[0]=", layers[0],
            " must be even (it is the concat of the user and item MLP parts)");
}

namespace {

// The flat layout (see neumf.h): each tower layer's W then b, then the head's
// w and c. Returns the floats in all; fills the views and offsets when given.
int64_t flat_layout(const NeuMFConfig& config, std::vector<DenseLayerView>* tower,
                    int64_t* head_w_offset, int64_t* head_c_offset) {
  int64_t off = 0;
  for (size_t l = 0; l + 1 < config.layers.size(); ++l) {
    DenseLayerView v;
    v.in = config.layers[l];
    v.out = config.layers[l + 1];
    v.w_offset = off;
    off += static_cast<int64_t>(v.in) * v.out;
    v.b_offset = off;
    off += v.out;
    if (tower) tower->push_back(v);
  }
  if (head_w_offset) *head_w_offset = off;
  off += config.head_width();
  if (head_c_offset) *head_c_offset = off;
  return off + 1;
}

}  // namespace

int64_t NeuMF::param_count(const NeuMFConfig& config) {
  config.validate();
  return flat_layout(config, nullptr, nullptr, nullptr);
}

NeuMF::NeuMF(const NeuMFConfig& config, Device device) : config_(config) {
  config_.validate();
  num_params_ = flat_layout(config_, &tower_, &head_w_offset_, &head_c_offset_);
  params_ = Buffer<float>(device, static_cast<size_t>(num_params_));
  grads_ = Buffer<float>(device, static_cast<size_t>(num_params_));
  acts_.resize(tower_.size());
  dacts_.resize(tower_.size());
  a16_.resize(tower_.size());
  d16_.resize(tower_.size());
  for (size_t l = 0; l < tower_.size(); ++l) {
    acts_[l] = Buffer<float>(device, 0);
    dacts_[l] = Buffer<float>(device, 0);
    a16_[l] = Buffer<uint16_t>(device, 0);
    d16_[l] = Buffer<uint16_t>(device, 0);
  }
  for (Buffer<uint16_t>* b : {&wb_, &ub_, &ib_, &du0b_, &xrb_, &dprb_})
    *b = Buffer<uint16_t>(device, 0);
  m0_ = Buffer<uint32_t>(device, 0);
  for (Buffer<int32_t>* b : {&order_, &starts_, &inv_, &first_}) *b = Buffer<int32_t>(device, 0);
  for (Buffer<float>* b : {&x0_, &g_, &h_, &dx0_, &dg_, &dh_, &u0_, &du0_, &ug_, &dug_, &ux_, &dux_,
                           &pi_, &xr_, &pr_, &dpr_, &drun_})
    *b = Buffer<float>(device, 0);
}

void NeuMF::init(uint64_t seed) {
  // Drawn on the host, then copied: init runs once, and one code path keeps
  // CPU and CUDA models identical for the same seed.
  std::vector<float> host(static_cast<size_t>(num_params_), 0.0f);
  uint64_t tensor = 0;
  auto uniform = [&](int64_t offset, int64_t n, double limit) {
    CounterRng rng{seed, kStreamInit, kInitIndexBase + tensor++};
    for (int64_t k = 0; k < n; ++k)
      host[offset + k] = static_cast<float>((2.0 * rng.uniform(k) - 1.0) * limit);
  };
  for (const DenseLayerView& v : tower_)
    uniform(v.w_offset, static_cast<int64_t>(v.in) * v.out, std::sqrt(6.0 / (v.in + v.out)));
  const int F = config_.head_width();
  uniform(head_w_offset_, F, std::sqrt(3.0 / F));
  device_copy(params_.device(), params_.data(), Device::kCpu, host.data(),
              host.size() * sizeof(float));
  grads_.zero();
  n_ = -1;
}

void NeuMF::forward(const ExecContext& ctx, const float* user_rows, const float* item_rows,
                    int64_t n, int S, float* logits, ItemKeys keys) {
  NCF_CHECK(ctx.device == params_.device(), "NeuMF::forward: context device ",
            device_name(ctx.device), " differs from the parameters' device ",
            device_name(params_.device()));
  NCF_CHECK(n >= 0 && S >= 1, "NeuMF::forward: n=", n, " groups of S=", S);
  const int64_t B = n * S;
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const int F = config_.head_width();
  const size_t rows = static_cast<size_t>(B);
  const bool tower = !tower_.empty();
  fused_ = fused_top();
  bf16_ = bf16_storage();
  n_ = n;
  S_ = S;
  user_rows_ = user_rows;
  item_rows_ = item_rows;
  by_item_ = layer0_by_item(B, keys);
  keys_ = keys;
  NCF_CHECK(keys.mlp_grads == nullptr || keys.table != nullptr,
            "NeuMF::forward: the items' MLP gradient by id needs the item table too");
  NCF_CHECK(by_item_ || keys.table == nullptr,
            "NeuMF::forward: the item table was passed for layer 0 by item, which this batch "
            "of ",
            B, " samples does not take: its item rows lack their MLP columns");
  if (by_item_) {
    NCF_CHECK(keys.bound >= 1, "NeuMF::forward: item id bound ", keys.bound, " must be >= 1");
    runs_ = std::min(B, keys.bound);
  }
  if (bf16_) {
    forward_bf16(ctx, n, S, logits, keys);
    return;
  }
  if (!fused_) {
    g_.reserve(rows * mf);
    h_.reserve(rows * F);
    ug_.reserve(S > 1 ? rows * mf : 0);
  }
  if (tower) {
    u0_.reserve(static_cast<size_t>(n) * tower_[0].out);
  } else {
    x0_.reserve(rows * config_.layers[0]);
    ux_.reserve(S > 1 ? rows * h : 0);
  }
  for (size_t l = 0; l < tower_.size(); ++l) acts_[l].reserve(rows * tower_[l].out);
  if (B == 0) return;

  const float* p = params_.data();
  const float* x = nullptr;
  if (tower) {
    // Layer 0 without the concatenated input: Z0 = u_mlp · W0[:, :h]^T, once per
    // user, plus i_mlp · W0[:, h:]^T per sample, plus the bias, then ReLU.
    const DenseLayerView& v = tower_[0];
    const float* w0 = p + v.w_offset;
    gemm(ctx, false, true, static_cast<int>(n), v.out, h, 1.0f, user_rows + mf, D, w0, v.in, 0.0f,
         u0_.data(), v.out);
    if (by_item_) {
      layer0_items(ctx, keys, B, false);
      gather_bias_act(ctx, pr_.data(), runs_, inv_.data(), u0_.data(), p + v.b_offset,
                      acts_[0].data(), n, S, v.out, true, layer0_mask(B));
    } else {
      group_linear_forward(ctx, item_rows + mf, D, w0 + h, v.in, u0_.data(), p + v.b_offset,
                           acts_[0].data(), n, S, h, v.out, true, layer0_mask(B));
    }
    x = acts_[0].data();
    layers_above_first(ctx, B, false);
    x = acts_.back().data();
  } else {
    // No hidden layer: the MLP output is X0 = [u_mlp ; i_mlp] itself.
    const float* um = user_rows + mf;
    int64_t ldum = D;
    if (S > 1) {
      repeat_rows(ctx, user_rows + mf, D, h, ux_.data(), n, S);
      um = ux_.data();
      ldum = h;
    }
    concat_cols(ctx, um, ldum, h, item_rows + mf, D, h, x0_.data(), B);
    x = x0_.data();
  }
  const int last = config_.layers.back();
  if (fused_) {
    neumf_top_forward(ctx, user_rows, D, item_rows, D, x, p + head_w_offset_, p + head_c_offset_,
                      logits, n, S, mf, last);
    return;
  }
  // GMF: the users' GMF columns, repeated over their S samples when S > 1.
  const float* ug = user_rows;
  int64_t ldug = D;
  if (S > 1) {
    repeat_rows(ctx, user_rows, D, mf, ug_.data(), n, S);
    ug = ug_.data();
    ldug = mf;
  }
  gmf_forward(ctx, ug, ldug, item_rows, D, g_.data(), mf, B, mf);
  concat_cols(ctx, g_.data(), mf, mf, x, last, last, h_.data(), B);
  head_forward(ctx, h_.data(), p + head_w_offset_, p + head_c_offset_, logits, B, F);
}

bool NeuMF::layer0_by_item(int64_t B, ItemKeys keys) const {
  const Layer0ByItem mode = layer0_by_item_mode();
  return keys.ids != nullptr && can_score_items() && 2 * std::min(B, keys.bound) <= B &&
         (mode == Layer0ByItem::kOn ||
          (mode == Layer0ByItem::kAuto && params_.device() == Device::kCuda));
}

namespace {
std::atomic<Layer0ByItem> g_layer0_by_item{Layer0ByItem::kAuto};
}  // namespace

void set_layer0_by_item(Layer0ByItem mode) { g_layer0_by_item.store(mode); }
Layer0ByItem layer0_by_item_mode() { return g_layer0_by_item.load(); }

Layer0ByItem parse_layer0_by_item(const std::string& value, const std::string& what) {
  if (value == "auto") return Layer0ByItem::kAuto;
  if (value == "on") return Layer0ByItem::kOn;
  if (value == "off") return Layer0ByItem::kOff;
  NCF_FAIL(what, " ", value, ": expected auto, on or off");
}

void NeuMF::layer0_items(const ExecContext& ctx, ItemKeys keys, int64_t B, bool bf16) {
  const DenseLayerView& v = tower_[0];
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const int64_t R = runs_;
  const size_t rows = static_cast<size_t>(B), runs = static_cast<size_t>(R);
  order_.reserve(rows);
  inv_.reserve(rows);
  starts_.reserve(runs + 1);
  first_.reserve(runs);
  xr_.reserve(2 * runs * h);
  pr_.reserve(runs * v.out);
  item_runs(ctx, keys.ids, B, keys.bound, R, order_.data(), starts_.data(), inv_.data(),
            first_.data());
  // The runs' MLP columns from their first samples' rows, or, with the table, from the
  // table's rows of their items (the same values).
  const float* src = keys.table != nullptr ? keys.table + mf : item_rows_ + mf;
  const int64_t ld = keys.table != nullptr ? keys.ld : D;
  const int32_t* by_id = keys.table != nullptr ? keys.ids : nullptr;
  gather_run_rows(ctx, src, ld, h, first_.data(), R, xr_.data(), by_id);
  if (!bf16 && math_mode() == MathMode::kTf32)  // [X ; X]: the backward's TF32 product
    gather_run_rows(ctx, src, ld, h, first_.data(), R, xr_.data() + R * h, by_id);
  if (bf16) {  // [X ; X] in BF16: the backward's product takes dP as two BF16 parts
    xrb_.reserve(2 * runs * h);
    to_bf16_rows(ctx, xr_.data(), h, h, xrb_.data(), h, R);
    to_bf16_rows(ctx, xr_.data(), h, h, xrb_.data() + R * h, h, R);
    gemm_bf16(ctx, false, true, static_cast<int>(R), v.out, h, xrb_.data(), h,
              wb_.data() + v.w_offset + h, v.in, pr_.data(), v.out);
  } else {
    gemm(ctx, false, true, static_cast<int>(R), v.out, h, 1.0f, xr_.data(), h,
         params_.data() + v.w_offset + h, v.in, 0.0f, pr_.data(), v.out);
  }
}

namespace {
std::atomic<int> g_score_fused{-1};  // -1: the environment not read yet
}  // namespace

bool score_items_fused_enabled() { return env_opt_in(g_score_fused, "NCF_EVAL_FUSED"); }
void set_score_items_fused(bool on) { g_score_fused.store(on ? 1 : 0); }

uint32_t* NeuMF::layer0_mask(int64_t B) {
  m0_ptr_ = nullptr;
  if (!fused_ || tower_.size() < 2) return nullptr;
  m0_.reserve(static_cast<size_t>(B * relu_mask_words(tower_[0].out)));
  m0_ptr_ = m0_.data();
  return m0_ptr_;
}

void NeuMF::prepare_items(const ExecContext& ctx, const float* item_mlp, int64_t ld, int64_t R) {
  NCF_CHECK(can_score_items(), "NeuMF::prepare_items: needs a hidden layer and the fused top");
  NCF_CHECK(R >= 0 && R <= INT_MAX, "NeuMF::prepare_items: R=", R, " items");
  const DenseLayerView& v = tower_[0];
  const int h = config_.mlp_half();
  pi_.reserve(static_cast<size_t>(R) * v.out);
  pi_rows_ = R;
  pi_bf16_ = bf16_storage();
  if (R == 0) return;
  const float* p = params_.data();
  if (pi_bf16_) {
    // The BF16 copies forward_bf16 makes: every parameter, the items' MLP columns.
    wb_.reserve(static_cast<size_t>(num_params_));
    ib_.reserve(static_cast<size_t>(R) * h);
    to_bf16_rows(ctx, p, num_params_, static_cast<int>(num_params_), wb_.data(), num_params_, 1);
    to_bf16_rows(ctx, item_mlp, ld, h, ib_.data(), h, R);
    gemm_bf16(ctx, false, true, static_cast<int>(R), v.out, h, ib_.data(), h,
              wb_.data() + v.w_offset + h, v.in, pi_.data(), v.out);
  } else {
    gemm(ctx, false, true, static_cast<int>(R), v.out, h, 1.0f, item_mlp, static_cast<int>(ld),
         p + v.w_offset + h, v.in, 0.0f, pi_.data(), v.out);
  }
}

void NeuMF::score_items(const ExecContext& ctx, const float* user_rows, const float* item_gmf,
                        int64_t ldg, const int32_t* ids, int64_t n, int S, float* logits) {
  NCF_CHECK(pi_rows_ >= 0, "NeuMF::score_items before prepare_items");
  NCF_CHECK(pi_bf16_ == bf16_storage(),
            "NeuMF::score_items: the math mode changed since "
            "prepare_items");
  NCF_CHECK(n >= 0 && S >= 1, "NeuMF::score_items: n=", n, " groups of S=", S);
  const int64_t B = n * S;
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const int last = config_.layers.back();
  const DenseLayerView& v = tower_[0];
  const size_t rows = static_cast<size_t>(B);
  // The layers above layer 0 on the BF16 copy of the parameters, for the fused kernel.
  ScoreLayerBf16 above[kScoreMaxLayers];
  const int L = static_cast<int>(tower_.size()) - 1;
  score_fused_ = pi_bf16_ && ctx.device == Device::kCuda && score_items_fused_enabled() && L >= 1 &&
                 L <= kScoreMaxLayers;
  if (score_fused_) {
    for (int l = 0; l < L; ++l) {
      const DenseLayerView& vl = tower_[size_t(l) + 1];
      above[l] = {wb_.data() + vl.w_offset, wb_.data() + vl.b_offset, vl.in, vl.out};
    }
    score_fused_ = score_items_fusable(ctx, v.out, above, L, mf);
  }
  u0_.reserve(static_cast<size_t>(n) * v.out);
  if (pi_bf16_) {
    ub_.reserve(static_cast<size_t>(n) * h);
    if (!score_fused_)
      for (size_t l = 0; l < tower_.size(); ++l) a16_[l].reserve(rows * tower_[l].out);
  } else {
    for (size_t l = 0; l < tower_.size(); ++l) acts_[l].reserve(rows * tower_[l].out);
  }
  if (B == 0) return;
  const float* p = params_.data();
  if (pi_bf16_) {
    to_bf16_rows(ctx, user_rows + mf, D, h, ub_.data(), h, n);
    gemm_bf16(ctx, false, true, static_cast<int>(n), v.out, h, ub_.data(), h,
              wb_.data() + v.w_offset, v.in, u0_.data(), v.out);
    if (score_fused_) {
      neumf_score_items_bf16(ctx, pi_.data(), pi_rows_, ids, u0_.data(), p + v.b_offset, v.out,
                             above, L, user_rows, D, item_gmf, ldg, p + head_w_offset_,
                             p + head_c_offset_, logits, n, S, mf);
      return;
    }
    gather_bias_act_bf16(ctx, pi_.data(), pi_rows_, ids, u0_.data(), p + v.b_offset, a16_[0].data(),
                         n, S, v.out, true);
    layers_above_first(ctx, B, true);
    neumf_top_forward_bf16(ctx, user_rows, D, item_gmf, ldg, a16_.back().data(), p + head_w_offset_,
                           p + head_c_offset_, logits, n, S, mf, last, ids);
    return;
  }
  gemm(ctx, false, true, static_cast<int>(n), v.out, h, 1.0f, user_rows + mf, D, p + v.w_offset,
       v.in, 0.0f, u0_.data(), v.out);
  gather_bias_act(ctx, pi_.data(), pi_rows_, ids, u0_.data(), p + v.b_offset, acts_[0].data(), n, S,
                  v.out, true);
  layers_above_first(ctx, B, false);
  neumf_top_forward(ctx, user_rows, D, item_gmf, ldg, acts_.back().data(), p + head_w_offset_,
                    p + head_c_offset_, logits, n, S, mf, last, ids);
}

void NeuMF::layers_above_first(const ExecContext& ctx, int64_t B, bool bf16) {
  const float* p = params_.data();
  for (size_t l = 1; l < tower_.size(); ++l) {
    const DenseLayerView& vl = tower_[l];
    if (bf16) {
      linear_forward_bf16(ctx, a16_[l - 1].data(), wb_.data() + vl.w_offset,
                          wb_.data() + vl.b_offset, a16_[l].data(), B, vl.in, vl.out, true);
    } else {
      linear_forward(ctx, acts_[l - 1].data(), p + vl.w_offset, p + vl.b_offset, acts_[l].data(), B,
                     vl.in, vl.out, true);
    }
  }
}

bool NeuMF::bf16_storage() const {
  return math_mode() == MathMode::kBf16 && fused_top() && !tower_.empty();
}

void NeuMF::forward_bf16(const ExecContext& ctx, int64_t n, int S, float* logits, ItemKeys keys) {
  const int64_t B = n * S;
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const size_t rows = static_cast<size_t>(B);
  wb_.reserve(static_cast<size_t>(num_params_));
  ub_.reserve(static_cast<size_t>(n) * h);
  if (!by_item_) ib_.reserve(rows * h);
  u0_.reserve(static_cast<size_t>(n) * tower_[0].out);
  for (size_t l = 0; l < tower_.size(); ++l) a16_[l].reserve(rows * tower_[l].out);
  if (B == 0) return;
  const float* p = params_.data();
  // The BF16 copies read by every product of the step: the weights, the biases of
  // the layers above layer 0 (their matmul epilogues add BF16 biases; layer 0's and
  // the head come along, unread), the users' MLP columns, and the items' (once per
  // sample, or once per run by item).
  to_bf16_rows(ctx, p, num_params_, static_cast<int>(num_params_), wb_.data(), num_params_, 1);
  to_bf16_rows(ctx, user_rows_ + mf, D, h, ub_.data(), h, n);
  const DenseLayerView& v = tower_[0];
  const uint16_t* w0 = wb_.data() + v.w_offset;
  gemm_bf16(ctx, false, true, static_cast<int>(n), v.out, h, ub_.data(), h, w0, v.in, u0_.data(),
            v.out);
  if (by_item_) {
    layer0_items(ctx, keys, B, true);
    gather_bias_act_bf16(ctx, pr_.data(), runs_, inv_.data(), u0_.data(), p + v.b_offset,
                         a16_[0].data(), n, S, v.out, true, layer0_mask(B));
  } else {
    to_bf16_rows(ctx, item_rows_ + mf, D, h, ib_.data(), h, B);
    group_linear_forward_bf16(ctx, ib_.data(), h, w0 + h, v.in, u0_.data(), p + v.b_offset,
                              a16_[0].data(), n, S, h, v.out, true, layer0_mask(B));
  }
  layers_above_first(ctx, B, true);
  neumf_top_forward_bf16(ctx, user_rows_, D, item_rows_, D, a16_.back().data(), p + head_w_offset_,
                         p + head_c_offset_, logits, n, S, mf, config_.layers.back());
}

void NeuMF::backward_bf16(const ExecContext& ctx, const float* dlogits, const float* logits,
                          const float* labels, int64_t global_batch, double* loss,
                          float* d_user_rows, float* d_item_rows) {
  const int64_t n = n_, B = n_ * S_;
  const int S = S_;
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const size_t rows = static_cast<size_t>(B);
  du0_.reserve(static_cast<size_t>(n) * tower_[0].out);
  du0b_.reserve(static_cast<size_t>(n) * tower_[0].out);
  for (size_t l = 0; l < tower_.size(); ++l) d16_[l].reserve(rows * tower_[l].out);
  float* gp = grads_.data();
  if (B == 0) {  // a rank with no rows still joins the allreduce, with zeros
    grads_.zero();
    return;
  }
  const float* p = params_.data();
  const size_t L = tower_.size();
  // The top: the last layer's mask and (above layer 0) its bias gradient.
  float* db_top = L > 1 ? gp + tower_.back().b_offset : nullptr;
  neumf_top_backward_bf16(ctx, user_rows_, D, item_rows_, D, a16_.back().data(), p + head_w_offset_,
                          dlogits, logits, labels, global_batch, loss, d16_.back().data(),
                          d_user_rows, D, d_item_rows, D, gp + head_w_offset_, gp + head_c_offset_,
                          db_top, n, S, mf, config_.layers.back(), true);
  for (size_t l = L; l-- > 1;) {
    const DenseLayerView& v = tower_[l];
    const bool top = l + 1 == L;  // masked, and its bias gradient taken, by the top
    linear_backward_bf16(ctx, a16_[l - 1].data(), wb_.data() + v.w_offset, a16_[l].data(),
                         d16_[l].data(), d16_[l - 1].data(), gp + v.w_offset,
                         top ? nullptr : gp + v.b_offset, B, v.in, v.out, !top);
  }
  const DenseLayerView& v = tower_[0];
  const uint16_t* w0 = wb_.data() + v.w_offset;
  uint16_t* dz = d16_[0].data();
  const bool top = L == 1;
  group_sum_backward_bf16(ctx, top ? nullptr : a16_[0].data(), dz, n, S, v.out, du0_.data(), v.out,
                          gp + v.b_offset, !top, top ? nullptr : m0_ptr_);
  to_bf16_rows(ctx, du0_.data(), v.out, v.out, du0b_.data(), v.out, n);
  gemm_bf16(ctx, true, false, v.out, h, static_cast<int>(n), du0b_.data(), v.out, ub_.data(), h,
            gp + v.w_offset, v.in);
  if (by_item_) {
    // dW0's items' half from the per-item sums of dZ0: dP as BF16 hi and lo parts against
    // the runs' rows twice ([hi ; lo]^T · [X ; X]), so the product sees dP to about 16 bits.
    // One BF16 rounding of dP would round a sum over the rank's own samples: other values
    // at another world size, where the per-sample product's BF16 inputs are the same.
    const size_t runs = static_cast<size_t>(runs_);
    dpr_.reserve(runs * v.out);
    dprb_.reserve(2 * runs * v.out);
    run_sums_bf16(ctx, dz, order_.data(), starts_.data(), runs_, v.out, dpr_.data());
    split_bf16(ctx, dpr_.data(), runs_ * v.out, dprb_.data(), dprb_.data() + runs_ * v.out);
    gemm_bf16(ctx, true, false, v.out, h, static_cast<int>(2 * runs_), dprb_.data(), v.out,
              xrb_.data(), h, gp + v.w_offset + h, v.in);
    // The items' MLP gradient once per run, [hi ; lo] · W0[:, h:] (2R rows), put on each
    // run's first sample (the parts added), zeros on its other samples.
    drun_.reserve(2 * runs * h);
    gemm_bf16(ctx, false, false, static_cast<int>(2 * runs_), h, v.out, dprb_.data(), v.out, w0 + h,
              v.in, drun_.data(), h);
    put_item_mlp_gradient(ctx, 2, d_item_rows + mf, D);
  } else {
    gemm_bf16(ctx, true, false, v.out, h, static_cast<int>(B), dz, v.out, ib_.data(), h,
              gp + v.w_offset + h, v.in);
    gemm_bf16(ctx, false, false, static_cast<int>(B), h, v.out, dz, v.out, w0 + h, v.in,
              d_item_rows + mf, D);
  }
  gemm_bf16(ctx, false, false, static_cast<int>(n), h, v.out, du0b_.data(), v.out, w0, v.in,
            d_user_rows + mf, D);
}

void NeuMF::item_rows_gradient(const ExecContext& ctx, const float* parts, int count,
                               const float* w0i, int64_t ldw, float* d_item_mlp, int64_t ld) {
  // The items' MLP gradient once per run from the parts of its layer-0 gradient sum
  // ([parts·R × out] · W0[:, h:]), put on each run's first sample, zeros on its others.
  const DenseLayerView& v = tower_[0];
  const int h = config_.mlp_half();
  drun_.reserve(static_cast<size_t>(count) * runs_ * h);
  gemm(ctx, false, false, static_cast<int>(count * runs_), h, v.out, 1.0f, parts, v.out, w0i,
       static_cast<int>(ldw), 0.0f, drun_.data(), h);
  put_item_mlp_gradient(ctx, count, d_item_mlp, ld);
}

void NeuMF::put_item_mlp_gradient(const ExecContext& ctx, int count, float* d_item_mlp,
                                  int64_t ld) {
  const int h = config_.mlp_half();
  if (keys_.mlp_grads != nullptr)
    put_run_rows(ctx, drun_.data(), runs_, count, h, keys_.ids, first_.data(), keys_.bound,
                 keys_.mlp_grads, h);
  else
    scatter_run_rows(ctx, drun_.data(), runs_, count, h, inv_.data(), first_.data(), n_ * S_,
                     d_item_mlp, ld);
}

bool NeuMF::fused_top() const {
  return fused_top_enabled() && config_.mf_dim <= kNeumfTopMaxWidth &&
         config_.layers.back() <= kNeumfTopMaxWidth;
}

void NeuMF::forward_backward(const ExecContext& ctx, const float* user_rows, const float* item_rows,
                             int64_t n, int S, const float* labels, int64_t global_batch,
                             float* logits, float* dlogits, double* loss, float* d_user_rows,
                             float* d_item_rows, ItemKeys keys) {
  forward(ctx, user_rows, item_rows, n, S, logits, keys);
  const int64_t B = n * S;
  if (B == 0) {
    backward_from(ctx, nullptr, nullptr, nullptr, global_batch, nullptr, d_user_rows, d_item_rows);
    return;
  }
  if (fused_) {
    backward_from(ctx, nullptr, logits, labels, global_batch, loss, d_user_rows, d_item_rows);
    return;
  }
  bce_with_logits_forward(ctx, logits, labels, nullptr, loss, B, B, global_batch);
  bce_with_logits_backward(ctx, logits, labels, nullptr, dlogits, B, B, global_batch);
  backward_from(ctx, dlogits, nullptr, nullptr, 0, nullptr, d_user_rows, d_item_rows);
}

void NeuMF::backward(const ExecContext& ctx, const float* dlogits, float* d_user_rows,
                     float* d_item_rows) {
  backward_from(ctx, dlogits, nullptr, nullptr, 0, nullptr, d_user_rows, d_item_rows);
}

void NeuMF::backward_from(const ExecContext& ctx, const float* dlogits, const float* logits,
                          const float* labels, int64_t global_batch, double* loss,
                          float* d_user_rows, float* d_item_rows) {
  NCF_CHECK(n_ >= 0, "NeuMF::backward called without a forward");
  NCF_CHECK(ctx.device == params_.device(), "NeuMF::backward: context device ",
            device_name(ctx.device), " differs from the parameters' device ",
            device_name(params_.device()));
  if (bf16_) {
    backward_bf16(ctx, dlogits, logits, labels, global_batch, loss, d_user_rows, d_item_rows);
    return;
  }
  const int64_t n = n_, B = n_ * S_;
  const int S = S_;
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const int F = config_.head_width(), last = config_.layers.back();
  const size_t rows = static_cast<size_t>(B);
  const bool tower = !tower_.empty();
  if (!fused_) {
    dg_.reserve(rows * mf);
    dh_.reserve(rows * F);
    dug_.reserve(S > 1 ? rows * mf : 0);
  }
  if (tower) {
    du0_.reserve(static_cast<size_t>(n) * tower_[0].out);
  } else {
    dx0_.reserve(rows * config_.layers[0]);
    dux_.reserve(S > 1 ? rows * h : 0);
  }
  for (size_t l = 0; l < tower_.size(); ++l) dacts_[l].reserve(rows * tower_[l].out);

  const float* p = params_.data();
  float* gp = grads_.data();
  if (B == 0) {  // a rank with no rows still joins the allreduce, with zeros
    grads_.zero();
    return;
  }
  float* dtop = tower ? dacts_.back().data() : dx0_.data();
  // The top layer's ReLU mask (and, above layer 0, its bias gradient) is the
  // fused top's when it runs: the layer's own backward then neither masks nor sums.
  bool top_masked = false;
  if (fused_) {
    const float* a = tower ? acts_.back().data() : x0_.data();
    float* db = tower && tower_.size() > 1 ? gp + tower_.back().b_offset : nullptr;
    neumf_top_backward(ctx, user_rows_, D, item_rows_, D, a, p + head_w_offset_, dlogits, logits,
                       labels, global_batch, loss, dtop, d_user_rows, D, d_item_rows, D,
                       gp + head_w_offset_, gp + head_c_offset_, db, n, S, mf, last, tower);
    top_masked = tower;
  } else {
    head_backward(ctx, h_.data(), p + head_w_offset_, dlogits, dh_.data(), gp + head_w_offset_,
                  gp + head_c_offset_, B, F, GradMode::kOverwrite);
    // dH = [dgmf ; d(MLP output)]
    split_cols(ctx, dh_.data(), mf, last, dg_.data(), mf, dtop, last, B);
  }
  if (tower) {
    for (size_t l = tower_.size(); l-- > 1;) {
      const DenseLayerView& v = tower_[l];
      const bool top = top_masked && l + 1 == tower_.size();
      linear_backward(ctx, acts_[l - 1].data(), p + v.w_offset, acts_[l].data(), dacts_[l].data(),
                      dacts_[l - 1].data(), gp + v.w_offset, top ? nullptr : gp + v.b_offset, B,
                      v.in, v.out, !top, GradMode::kOverwrite);
    }
    // Layer 0: dZ0 (masked in place), its sum over each
    // user's samples dU0, the bias gradient, then both halves of dW0 and of the input
    // gradient.
    const DenseLayerView& v = tower_[0];
    const float* w0 = p + v.w_offset;
    float* dz = dacts_[0].data();
    const bool top = top_masked && tower_.size() == 1;
    const bool masked = top;
    group_sum_backward(ctx, masked ? nullptr : acts_[0].data(), dz, n, S, v.out, du0_.data(), v.out,
                       gp + v.b_offset, !masked, masked ? nullptr : m0_ptr_);
    gemm(ctx, true, false, v.out, h, static_cast<int>(n), 1.0f, du0_.data(), v.out, user_rows_ + mf,
         D, 0.0f, gp + v.w_offset, v.in);
    if (by_item_ && math_mode() == MathMode::kTf32) {
      // dW0's items' half from the per-item sums of dZ0, as TF32 hi and lo parts against
      // the runs' rows twice: one TF32 rounding of a sum over the rank's own samples would
      // differ between world sizes (as under bf16, backward_bf16).
      const size_t cells = static_cast<size_t>(runs_) * v.out;
      dpr_.reserve(3 * cells);
      float* sums = dpr_.data() + 2 * cells;
      run_sums(ctx, dz, order_.data(), starts_.data(), runs_, v.out, sums);
      split_tf32(ctx, sums, runs_ * v.out, dpr_.data(), dpr_.data() + cells);
      gemm(ctx, true, false, v.out, h, static_cast<int>(2 * runs_), 1.0f, dpr_.data(), v.out,
           xr_.data(), h, 0.0f, gp + v.w_offset + h, v.in);
      item_rows_gradient(ctx, dpr_.data(), 2, w0 + h, v.in, d_item_rows + mf, D);
    } else if (by_item_) {  // dW0's items' half from the per-item sums of dZ0
      dpr_.reserve(static_cast<size_t>(runs_) * v.out);
      run_sums(ctx, dz, order_.data(), starts_.data(), runs_, v.out, dpr_.data());
      gemm(ctx, true, false, v.out, h, static_cast<int>(runs_), 1.0f, dpr_.data(), v.out,
           xr_.data(), h, 0.0f, gp + v.w_offset + h, v.in);
      item_rows_gradient(ctx, dpr_.data(), 1, w0 + h, v.in, d_item_rows + mf, D);
    } else {
      gemm(ctx, true, false, v.out, h, static_cast<int>(B), 1.0f, dz, v.out, item_rows_ + mf, D,
           0.0f, gp + v.w_offset + h, v.in);
      gemm(ctx, false, false, static_cast<int>(B), h, v.out, 1.0f, dz, v.out, w0 + h, v.in, 0.0f,
           d_item_rows + mf, D);
    }
    gemm(ctx, false, false, static_cast<int>(n), h, v.out, 1.0f, du0_.data(), v.out, w0, v.in, 0.0f,
         d_user_rows + mf, D);
  } else if (S > 1) {
    split_cols(ctx, dx0_.data(), h, h, dux_.data(), h, d_item_rows + mf, D, B);
    group_sum_backward(ctx, nullptr, dux_.data(), n, S, h, d_user_rows + mf, D, nullptr, false);
  } else {
    split_cols(ctx, dx0_.data(), h, h, d_user_rows + mf, D, d_item_rows + mf, D, B);
  }
  if (fused_) return;  // the GMF columns' gradients are the fused top's
  // dgmf → the GMF columns: per sample for items, summed over the S samples for users.
  if (S > 1) {
    gmf_backward(ctx, ug_.data(), mf, item_rows_, D, dg_.data(), mf, dug_.data(), mf, d_item_rows,
                 D, B, mf);
    group_sum_backward(ctx, nullptr, dug_.data(), n, S, mf, d_user_rows, D, nullptr, false);
  } else {
    gmf_backward(ctx, user_rows_, D, item_rows_, D, dg_.data(), mf, d_user_rows, D, d_item_rows, D,
                 B, mf);
  }
}

}  // namespace ncf
