// Error checks used everywhere: NCF_CHECK and friends throw ncf::Error with the
// failed expression, file:line and the MPI rank, so tests can expect them and
// mains can print one clear line before taking the job down.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ncf {

// Rank shown in error messages; -1 until the communicator sets it.
int error_rank();
void set_error_rank(int rank);

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& what);

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  append(os, args...);
  return os.str();
}
}  // namespace detail

}  // namespace ncf

// NCF_CHECK(cond, "message parts", value, ...): throws when cond is false.
#define NCF_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::ncf::throw_error(__FILE__, __LINE__,                                                \
                         ::ncf::detail::concat("check failed: " #cond ": ", ##__VA_ARGS__)); \
  } while (0)

// NCF_FAIL("message parts", ...): throws unconditionally (bad input, user errors).
#define NCF_FAIL(...) ::ncf::throw_error(__FILE__, __LINE__, ::ncf::detail::concat(__VA_ARGS__))

#define MPI_CHECK(expr)                                                                    \
  do {                                                                                     \
    int ncf_mpi_rc_ = (expr);                                                              \
    if (ncf_mpi_rc_ != 0 /* MPI_SUCCESS */)                                                \
      ::ncf::throw_error(__FILE__, __LINE__,                                               \
                         ::ncf::detail::concat("MPI call failed (", ncf_mpi_rc_, "): " #expr)); \
  } while (0)
