// Error construction for check.h: one place decides how a failure message looks.
#include "common/check.h"

#include <atomic>

namespace ncf {
namespace {
std::atomic<int> g_rank{-1};
}

int error_rank() { return g_rank.load(); }
void set_error_rank(int rank) { g_rank.store(rank); }

void throw_error(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  if (error_rank() >= 0) os << "[rank " << error_rank() << "] ";
  os << what << " (" << base << ":" << line << ")";
  throw Error(os.str());
}

}  // namespace ncf
