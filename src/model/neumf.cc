// NeuMF's flat parameter layout, its seeded init, and forward/backward as a
// sequence of ops.h calls (device-agnostic: the ops dispatch on ctx.device).
#include "model/neumf.h"

#include <cmath>

#include "common/check.h"
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

NeuMF::NeuMF(const NeuMFConfig& config, Device device) : config_(config) {
  config_.validate();
  int64_t off = 0;
  for (size_t l = 0; l + 1 < config_.layers.size(); ++l) {
    DenseLayerView v;
    v.in = config_.layers[l];
    v.out = config_.layers[l + 1];
    v.w_offset = off;
    off += static_cast<int64_t>(v.in) * v.out;
    v.b_offset = off;
    off += v.out;
    tower_.push_back(v);
  }
  head_w_offset_ = off;
  off += config_.head_width();
  head_c_offset_ = off;
  off += 1;
  num_params_ = off;
  params_ = Buffer<float>(device, static_cast<size_t>(num_params_));
  grads_ = Buffer<float>(device, static_cast<size_t>(num_params_));
  acts_.resize(tower_.size());
  dacts_.resize(tower_.size());
  for (size_t l = 0; l < tower_.size(); ++l) {
    acts_[l] = Buffer<float>(device, 0);
    dacts_[l] = Buffer<float>(device, 0);
  }
  for (Buffer<float>* b : {&x0_, &g_, &h_, &dx0_, &dg_, &dh_}) *b = Buffer<float>(device, 0);
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
  B_ = -1;
}

void NeuMF::forward(const ExecContext& ctx, const float* user_rows, const float* item_rows,
                    int64_t B, float* logits) {
  NCF_CHECK(ctx.device == params_.device(), "NeuMF::forward: context device ",
            device_name(ctx.device), " differs from the parameters' device ",
            device_name(params_.device()));
  NCF_CHECK(B >= 0, "NeuMF::forward: negative batch B=", B);
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const int F = config_.head_width();
  const size_t rows = static_cast<size_t>(B);
  x0_.reserve(rows * config_.layers[0]);
  g_.reserve(rows * mf);
  h_.reserve(rows * F);
  for (size_t l = 0; l < tower_.size(); ++l) acts_[l].reserve(rows * tower_[l].out);
  B_ = B;
  user_rows_ = user_rows;
  item_rows_ = item_rows;
  if (B == 0) return;

  const float* p = params_.data();
  gmf_forward(ctx, user_rows, D, item_rows, D, g_.data(), mf, B, mf);
  concat_cols(ctx, user_rows + mf, D, h, item_rows + mf, D, h, x0_.data(), B);
  const float* x = x0_.data();
  for (size_t l = 0; l < tower_.size(); ++l) {
    const DenseLayerView& v = tower_[l];
    linear_forward(ctx, x, p + v.w_offset, p + v.b_offset, acts_[l].data(), B, v.in, v.out, true);
    x = acts_[l].data();
  }
  concat_cols(ctx, g_.data(), mf, mf, x, config_.layers.back(), config_.layers.back(), h_.data(),
              B);
  head_forward(ctx, h_.data(), p + head_w_offset_, p + head_c_offset_, logits, B, F);
}

void NeuMF::backward(const ExecContext& ctx, const float* dlogits, float* d_user_rows,
                     float* d_item_rows) {
  NCF_CHECK(B_ >= 0, "NeuMF::backward called without a forward");
  NCF_CHECK(ctx.device == params_.device(), "NeuMF::backward: context device ",
            device_name(ctx.device), " differs from the parameters' device ",
            device_name(params_.device()));
  const int64_t B = B_;
  const int mf = config_.mf_dim, h = config_.mlp_half(), D = config_.embedding_width();
  const int F = config_.head_width(), last = config_.layers.back();
  const size_t rows = static_cast<size_t>(B);
  dx0_.reserve(rows * config_.layers[0]);
  dg_.reserve(rows * mf);
  dh_.reserve(rows * F);
  for (size_t l = 0; l < tower_.size(); ++l) dacts_[l].reserve(rows * tower_[l].out);

  const float* p = params_.data();
  float* gp = grads_.data();
  if (B == 0) {  // a rank with no rows still joins the allreduce, with zeros
    grads_.zero();
    return;
  }
  head_backward(ctx, h_.data(), p + head_w_offset_, dlogits, dh_.data(), gp + head_w_offset_,
                gp + head_c_offset_, B, F, GradMode::kOverwrite);
  // dH = [dgmf ; d(MLP output)]
  float* dtop = tower_.empty() ? dx0_.data() : dacts_.back().data();
  split_cols(ctx, dh_.data(), mf, last, dg_.data(), mf, dtop, last, B);
  for (size_t l = tower_.size(); l-- > 0;) {
    const DenseLayerView& v = tower_[l];
    const float* x = l == 0 ? x0_.data() : acts_[l - 1].data();
    float* dx = l == 0 ? dx0_.data() : dacts_[l - 1].data();
    linear_backward(ctx, x, p + v.w_offset, acts_[l].data(), dacts_[l].data(), dx, gp + v.w_offset,
                    gp + v.b_offset, B, v.in, v.out, true, GradMode::kOverwrite);
  }
  // dX0 → the mlp parts of the row gradients, dgmf → their mf parts.
  split_cols(ctx, dx0_.data(), h, h, d_user_rows + mf, D, d_item_rows + mf, D, B);
  gmf_backward(ctx, user_rows_, D, item_rows_, D, dg_.data(), mf, d_user_rows, D, d_item_rows, D, B,
               mf);
}

}  // namespace ncf
