// Every check of the project: NCF_REQUIRE and NCF_FAIL for refusals of what a user
// gave (files, flags, sizes, the machine), NCF_CHECK for the program's own invariants,
// and the library checks MPI_CHECK, CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK. They throw
// ncf::Error with the MPI rank, so tests can expect them and mains can print one clear
// line before taking the job down. A refusal reads as a sentence about the input and
// carries no source location; an internal check and a library failure add the failed
// expression and file:line, which is what their reader (a developer) needs.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ncf {

// Rank shown in error messages; -1 until the communicator sets it.
int error_rank();
void set_error_rank(int rank);

class Error : public std::runtime_error {
 public:
  // An error whose text is taken whole (no rank is added, no kind is known).
  explicit Error(const std::string& what) : std::runtime_error(what), message_(what) {}
  // `what` is "[rank N] " + `message` once the rank is known; `located`: the message
  // ends with the file:line of an internal check or a failed library call.
  Error(const std::string& what, std::string message, bool located)
      : std::runtime_error(what), message_(std::move(message)), located_(located) {}
  // The text without the rank: what a message that passes this one on quotes.
  const std::string& message() const { return message_; }
  bool located() const { return located_; }

 private:
  std::string message_;
  bool located_ = false;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& what);
// A refusal: the rank and `what`, nothing else.
[[noreturn]] void throw_refusal(const std::string& what);
// Passes `e` on with `context` in front ("context: message"), as what it was: a
// refusal stays a refusal without a location; an internal check or a library
// failure keeps its one file:line and gets no second. The rank is said once.
[[noreturn]] void rethrow_in_context(const Error& e, const std::string& context);
// What an exception says, without the rank an ncf::Error carries: for a message
// that quotes it (a note, a reason, a refusal of its own).
std::string message_of(const std::exception& e);

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

// NCF_CHECK(cond, "message parts", value, ...): an invariant of the program; throws
// "check failed: cond: parts (file:line)" when cond is false.
#define NCF_CHECK(cond, ...)                                                                 \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::ncf::throw_error(__FILE__, __LINE__,                                                 \
                         ::ncf::detail::concat("check failed: " #cond ": ", ##__VA_ARGS__)); \
  } while (0)

// NCF_FAIL("message parts", ...): refuses what the user gave (a file, byte offset, flag or
// value, and what to do); throws the parts alone.
#define NCF_FAIL(...) ::ncf::throw_refusal(::ncf::detail::concat(__VA_ARGS__))

// NCF_REQUIRE(cond, "message parts", ...): NCF_FAIL unless cond.
#define NCF_REQUIRE(cond, ...)          \
  do {                                  \
    if (!(cond)) NCF_FAIL(__VA_ARGS__); \
  } while (0)

// NCF_RETHROW(e, "context parts", ...): rethrow_in_context(e, the parts), for a catch
// that adds what it knows (the table, the user, the file) to an ncf::Error `e`.
#define NCF_RETHROW(e, ...) ::ncf::rethrow_in_context(e, ::ncf::detail::concat(__VA_ARGS__))

// The library checks: each call's status, where 0 is success in every one of
// them (MPI_SUCCESS, cudaSuccess, CUBLAS_STATUS_SUCCESS, ncclSuccess; check.cc
// asserts it). The message names the library, its error text (CUDA builds),
// the status, the expression, file:line and the rank. They need no library
// header here, so any file may use them.
namespace ncf::detail {
enum class Library { kMpi, kCuda, kCublas, kNccl };
[[noreturn]] void library_failed(const char* file, int line, Library lib, int status,
                                 const char* expr);
}  // namespace ncf::detail

#define NCF_LIBRARY_CHECK(lib, expr)                                              \
  do {                                                                            \
    const int ncf_status_ = static_cast<int>(expr);                               \
    if (ncf_status_ != 0)                                                         \
      ::ncf::detail::library_failed(__FILE__, __LINE__, lib, ncf_status_, #expr); \
  } while (0)

#define MPI_CHECK(expr) NCF_LIBRARY_CHECK(::ncf::detail::Library::kMpi, expr)
#define CUDA_CHECK(expr) NCF_LIBRARY_CHECK(::ncf::detail::Library::kCuda, expr)
#define CUBLAS_CHECK(expr) NCF_LIBRARY_CHECK(::ncf::detail::Library::kCublas, expr)
#define NCCL_CHECK(expr) NCF_LIBRARY_CHECK(::ncf::detail::Library::kNccl, expr)
