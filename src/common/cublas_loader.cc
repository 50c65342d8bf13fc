// cuBLAS and cuBLASLt, loaded when a GPU run first calls them, not when a program
// starts. The two libraries are about 600 MB, and loading them (relocations and
// static constructors) costs every process about 0.6 s of CPU before main: every
// CPU run of ncf_dist, every ncf_prep, ncf_recommend and ncf_export, and every test
// binary paid it although only a GPU rank ever calls cuBLAS.
//
// Each function the program calls is defined here under its own name with the
// header's exact signature (a different one does not compile: the header declares
// it extern "C"), and forwards to the real one, found by dlopen and dlsym on first
// use. The executable does not export these definitions, so the loaded libraries
// keep resolving their own symbols among themselves.
#ifdef NCF_WITH_CUDA

#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "common/check.h"

#define NCF_STRINGIFY_(x) #x
#define NCF_STRINGIFY(x) NCF_STRINGIFY_(x)

namespace ncf {
namespace {

// The library's soname, then the same file in the toolkit the program was built
// against (NCF_CUDA_LIBRARY_DIR), for a machine whose loader does not know that
// directory.
void* open_library(const char* soname) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first = dlerror();
#ifdef NCF_CUDA_LIBRARY_DIR
  const std::string path = std::string(NCF_CUDA_LIBRARY_DIR) + "/" + soname;
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
#endif
  NCF_FAIL("this run uses the GPU and cannot load ", soname, " (", first,
           "): install the CUDA Toolkit's cuBLAS or put its lib directory on LD_LIBRARY_PATH");
}

void* cublas_library() {
  static void* const h = open_library("libcublas.so." NCF_STRINGIFY(CUBLAS_VER_MAJOR));
  return h;
}

void* cublaslt_library() {
  static void* const h = open_library("libcublasLt.so." NCF_STRINGIFY(CUBLAS_VER_MAJOR));
  return h;
}

template <typename Fn>
Fn resolve(void* library, const char* name) {
  dlerror();
  void* f = dlsym(library, name);
  NCF_REQUIRE(f != nullptr, "the loaded cuBLAS has no ", name, " (", dlerror(),
              "): it is older than the CUDA Toolkit this program was built with");
  return reinterpret_cast<Fn>(f);
}

}  // namespace
}  // namespace ncf

// One forwarding definition: the real function, of type Fn, resolved once.
#define NCF_CUBLAS_REAL_AS(library, name, Fn) \
  static const auto real = ::ncf::resolve<Fn>(::ncf::library(), #name)
#define NCF_CUBLAS_REAL(library, name) NCF_CUBLAS_REAL_AS(library, name, decltype(&name))

extern "C" {

// ---- cuBLAS ----------------------------------------------------------------------
cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  NCF_CUBLAS_REAL(cublas_library, cublasCreate_v2);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  NCF_CUBLAS_REAL(cublas_library, cublasDestroy_v2);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  NCF_CUBLAS_REAL(cublas_library, cublasSetStream_v2);
  return real(handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t bytes) {
  NCF_CUBLAS_REAL(cublas_library, cublasSetWorkspace_v2);
  return real(handle, workspace, bytes);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  NCF_CUBLAS_REAL(cublas_library, cublasGetStatusString);
  return real(status);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb,
                                         const void* beta, void* C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  // C++ sees a second cublasGemmEx (an inline overload), so its type is spelled out.
  using Fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                const void*, const void*, cudaDataType, int, const void*,
                                cudaDataType, int, const void*, void*, cudaDataType, int,
                                cublasComputeType_t, cublasGemmAlgo_t);
  NCF_CUBLAS_REAL_AS(cublas_library, cublasGemmEx, Fn);
  return real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
              ldc, computeType, algo);
}

// ---- cuBLASLt --------------------------------------------------------------------
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtCreate);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtDestroy);
  return real(handle);
}

size_t CUBLASWINAPI cublasLtGetVersion(void) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtGetVersion);
  return real();
}

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtGetStatusString);
  return real(status);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulDescCreate);
  return real(desc, computeType, scaleType);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulDescDestroy);
  return real(desc);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t bytes) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulDescSetAttribute);
  return real(desc, attr, buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatrixLayoutCreate);
  return real(layout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatrixLayoutDestroy);
  return real(layout);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulPreferenceCreate);
  return real(pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulPreferenceDestroy);
  return real(pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t bytes) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulPreferenceSetAttribute);
  return real(pref, attr, buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmulAlgoGetHeuristic);
  return real(handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
              heuristicResultsArray, returnAlgoCount);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                           const void* alpha, const void* A,
                                           cublasLtMatrixLayout_t Adesc, const void* B,
                                           cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspaceSizeInBytes, cudaStream_t stream) {
  NCF_CUBLAS_REAL(cublaslt_library, cublasLtMatmul);
  return real(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
              workspaceSizeInBytes, stream);
}

}  // extern "C"

#endif  // NCF_WITH_CUDA
