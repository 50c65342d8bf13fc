// Built into test_common at -O3 with the project's flags (tests/CMakeLists.txt), apart from
// the tests' own -O1: a loop GCC 12.2's loop distribution compiles wrongly at -O3, which
// CMakeLists.txt's -fno-tree-loop-distribution keeps right (Toolchain.* in test_common.cc).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ncf {
namespace probe {

struct Counts {
  std::vector<int64_t> sc, rc, sd, rd;
};

// sc and rc take a and b; sd and rd their running sums before each entry, in the same pass.
__attribute__((noinline)) void counts_and_offsets(Counts* c, const std::vector<int64_t>& a,
                                                  const std::vector<int64_t>& b, int W) {
  for (int p = 0; p < W; ++p) {
    c->sc[size_t(p)] = a[size_t(p)];
    c->rc[size_t(p)] = b[size_t(p)];
    c->sd[size_t(p)] = p ? c->sd[size_t(p) - 1] + c->sc[size_t(p) - 1] : 0;
    c->rd[size_t(p)] = p ? c->rd[size_t(p) - 1] + c->rc[size_t(p) - 1] : 0;
  }
}

}  // namespace probe
}  // namespace ncf
