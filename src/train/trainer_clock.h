// The clock the trainer's files share (trainer.cc, trainer_eval.cc,
// trainer_checkpoint.cc); included by those only.
#pragma once

#include <chrono>

namespace ncf {
namespace trainer_detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace trainer_detail
}  // namespace ncf
