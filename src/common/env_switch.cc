#include "common/env_switch.h"

#include <cstdlib>
#include <string>

namespace ncf {

bool env_switch(std::atomic<int>& v, const char* name) {
  int x = v.load();
  if (x < 0) {
    const char* e = std::getenv(name);
    int expected = -1;
    v.compare_exchange_strong(expected, e == nullptr || std::string(e) != "0" ? 1 : 0);
    x = v.load();
  }
  return x == 1;
}

}  // namespace ncf
