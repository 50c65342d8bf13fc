#include "common/env_switch.h"

#include <cstdlib>
#include <string>

namespace ncf {

namespace {

// v's value, the environment's (on(getenv(name))) stored at the first read unless a setter
// came first.
template <typename On>
bool read_once(std::atomic<int>& v, const char* name, On on) {
  int x = v.load();
  if (x < 0) {
    int expected = -1;
    v.compare_exchange_strong(expected, on(std::getenv(name)) ? 1 : 0);
    x = v.load();
  }
  return x == 1;
}

}  // namespace

bool env_switch(std::atomic<int>& v, const char* name) {
  return read_once(v, name, [](const char* e) { return e == nullptr || std::string(e) != "0"; });
}

bool env_opt_in(std::atomic<int>& v, const char* name) {
  return read_once(v, name, [](const char* e) { return e != nullptr && std::string(e) == "1"; });
}

}  // namespace ncf
