// Kernel choices that are on by default and can be turned off from the environment, so
// that a new kernel and the one it replaced run in the same binary and are timed side by
// side until a GPU run has proved the new one.
#pragma once

#include <atomic>

namespace ncf {

// v: -1 until read. Returns false where the environment variable `name` is "0", true
// otherwise; the environment is read at the first call unless a setter (v.store) came
// first.
bool env_switch(std::atomic<int>& v, const char* name);
// The same for a choice that is off by default: true only where `name` is "1".
bool env_opt_in(std::atomic<int>& v, const char* name);

}  // namespace ncf
