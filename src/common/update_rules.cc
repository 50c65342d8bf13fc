// The per-step Adam scalars of update_rules.h, computed on the host in double.
#include "common/update_rules.h"

#include <cmath>

#include "common/check.h"

namespace ncf {

AdamStepScalars adam_step_scalars(const AdamHyper& h, int64_t t) {
  NCF_CHECK(t >= 1, "Adam step t=", t, " must be >= 1");
  NCF_CHECK(h.beta1 >= 0.0f && h.beta1 < 1.0f, "Adam beta1=", h.beta1, " outside [0, 1)");
  NCF_CHECK(h.beta2 >= 0.0f && h.beta2 < 1.0f, "Adam beta2=", h.beta2, " outside [0, 1)");
  double td = static_cast<double>(t);
  double lr_t = h.lr * std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), td)) /
                (1.0 - std::pow(static_cast<double>(h.beta1), td));
  return AdamStepScalars{static_cast<float>(lr_t), h.beta1, h.beta2, h.eps, h.l2};
}

}  // namespace ncf
