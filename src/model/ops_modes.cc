// ops_modes.h's modes and switches: process-wide atomics; the switches read the
// environment at their first call.
#include "model/ops_modes.h"

#include <atomic>
#include <string>

#include "common/check.h"
#include "common/env_switch.h"

namespace ncf {

namespace {
std::atomic<MathMode> g_math_mode{MathMode::kTf32};
std::atomic<StepKernels> g_step_kernels{StepKernels::kStreaming};
}  // namespace

void set_step_kernels(StepKernels kernels) { g_step_kernels.store(kernels); }
StepKernels step_kernels() { return g_step_kernels.load(); }

StepKernels parse_step_kernels(const std::string& name, const std::string& what) {
  if (name == "streaming") return StepKernels::kStreaming;
  if (name == "legacy") return StepKernels::kLegacy;
  NCF_FAIL(what, "=", name, ": expected streaming or legacy");
}

const char* step_kernels_name(StepKernels kernels) {
  return kernels == StepKernels::kLegacy ? "legacy" : "streaming";
}

namespace {
std::atomic<int> g_lt_bf16_out{-1};  // -1: not read from the environment yet
}  // namespace

bool lt_bf16_out_enabled() { return env_switch(g_lt_bf16_out, "NCF_LT_BF16_OUT"); }
void set_lt_bf16_out(bool on) { g_lt_bf16_out.store(on ? 1 : 0); }

void set_math_mode(MathMode mode) { g_math_mode.store(mode); }
MathMode math_mode() { return g_math_mode.load(); }

MathMode parse_math_mode(const std::string& name) {
  if (name == "tf32") return MathMode::kTf32;
  if (name == "fp32") return MathMode::kFp32;
  if (name == "bf16") return MathMode::kBf16;
  NCF_FAIL("unknown precision '", name, "' (expected tf32, fp32 or bf16)");
}

const char* math_mode_name(MathMode mode) {
  switch (mode) {
    case MathMode::kTf32:
      return "tf32";
    case MathMode::kFp32:
      return "fp32";
    case MathMode::kBf16:
      return "bf16";
  }
  return "unknown";
}

}  // namespace ncf
