// ops_modes.h's modes and switches: process-wide atomics, set by the programs and tests.
#include "model/ops_modes.h"

#include <atomic>
#include <string>

#include "common/check.h"

namespace ncf {

namespace {
std::atomic<MathMode> g_math_mode{MathMode::kTf32};
std::atomic<bool> g_fused_top{true};
}  // namespace

void set_fused_top(bool on) { g_fused_top.store(on); }
bool fused_top_enabled() { return g_fused_top.load(); }

namespace {
std::atomic<bool> g_lt_bf16_out{true};
}  // namespace

bool lt_bf16_out_enabled() { return g_lt_bf16_out.load(); }
void set_lt_bf16_out(bool on) { g_lt_bf16_out.store(on); }

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
