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

void throw_refusal(const std::string& what) {
  if (error_rank() >= 0) throw Error("[rank " + std::to_string(error_rank()) + "] " + what);
  throw Error(what);
}

void throw_error(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  if (error_rank() >= 0) os << "[rank " << error_rank() << "] ";
  os << what << " (" << base << ":" << line << ")";
  throw Error(os.str());
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
