// Error construction for check.h: one place decides how a failure message looks.
#include "common/check.h"

#include <atomic>

#ifdef NCF_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif
#include <mpi.h>

namespace ncf {
namespace {
std::atomic<int> g_rank{-1};
}

int error_rank() { return g_rank.load(); }
void set_error_rank(int rank) { g_rank.store(rank); }

namespace {
[[noreturn]] void throw_with_rank(const std::string& message, bool located) {
  if (error_rank() < 0) throw Error(message, message, located);
  throw Error("[rank " + std::to_string(error_rank()) + "] " + message, message, located);
}
}  // namespace

void throw_refusal(const std::string& what) { throw_with_rank(what, false); }

void throw_error(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  os << what << " (" << base << ":" << line << ")";
  throw_with_rank(os.str(), true);
}

void rethrow_in_context(const Error& e, const std::string& context) {
  throw_with_rank(context + ": " + e.message(), e.located());
}

std::string message_of(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->message();
  return e.what();
}

namespace detail {

static_assert(MPI_SUCCESS == 0, "MPI_CHECK treats 0 as success");
#ifdef NCF_WITH_CUDA
static_assert(cudaSuccess == 0 && CUBLAS_STATUS_SUCCESS == 0 && ncclSuccess == 0,
              "CUDA_CHECK, CUBLAS_CHECK and NCCL_CHECK treat 0 as success");
#endif

void library_failed(const char* file, int line, Library lib, int status, const char* expr) {
  std::string what;
  switch (lib) {
    case Library::kMpi: {
      char text[MPI_MAX_ERROR_STRING] = "";
      int len = 0;
      int initialized = 0, finalized = 0;
      MPI_Initialized(&initialized);
      MPI_Finalized(&finalized);
      if (initialized && !finalized) MPI_Error_string(status, text, &len);
      what = concat("MPI call failed (", status, len ? std::string(": ") + text : "", ")");
      break;
    }
#ifdef NCF_WITH_CUDA
    case Library::kCuda:
      what = concat("CUDA error ", cudaGetErrorString(static_cast<cudaError_t>(status)));
      break;
    case Library::kCublas:
      what = concat("cuBLAS error ", cublasGetStatusString(static_cast<cublasStatus_t>(status)));
      break;
    case Library::kNccl:
      what = concat("NCCL error '", ncclGetErrorString(static_cast<ncclResult_t>(status)), "' (",
                    ncclGetLastError(nullptr), ")");
      break;
#else
    case Library::kCuda:
      what = concat("CUDA error ", status);
      break;
    case Library::kCublas:
      what = concat("cuBLAS error ", status);
      break;
    case Library::kNccl:
      what = concat("NCCL error ", status);
      break;
#endif
  }
  throw_error(file, line, concat(what, ": ", expr));
}

}  // namespace detail

}  // namespace ncf
