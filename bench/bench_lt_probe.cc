// What cuBLASLt offers for the tower's products: for each layer of an ml-20m-mlperf
// tower at one batch, each input/output type and each epilogue the GPU step could
// fuse into its GEMMs, whether cuBLASLt's heuristic returns an algorithm (and its
// workspace), or the status it refuses with. Nothing is timed or run: the table
// says which fused paths exist on this GPU and cuBLASLt build before a kernel is
// written for them.
//   bench_lt_probe [--batch B] [--layers 256,256,128,64] [--json FILE]
// The products, in cuBLASLt's column-major view of our row-major arrays (B rows):
//   fwd    Y[B×out] = X[B×in]·W^T: D[out×B] = W(op T)·X, epilogues BIAS, RELU_BIAS,
//          RELU_AUX_BIAS (the ReLU mask kept as a bit mask for the backward);
//   dgrad  dX[B×in] = dZ[B×out]·W: D[in×B] = W·dZ, epilogues DEFAULT, DRELU (the layer
//          below's mask only: linear_backward's dx_mask) and DRELU_BGRAD
//          (the layer below's mask applied and its bias gradient summed);
//   wgrad  dW[out×in] = dZ^T·X: D[in×out] = X·dZ(op T), epilogues DEFAULT, BGRADA and
//          BGRADB (this layer's bias gradient from one of the operands).
// Types: tf32 (FP32 in and out, TF32 compute), fp32, bf16 -> fp32 and bf16 -> bf16
// (BF16 storage), the bias of D's type; for bf16 -> bf16 also an FP32 bias
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), which cublasLt.h documents as D's type.
// Exit 0 when the table was made (whatever it says), 1 without a GPU.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#ifdef NCF_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

namespace {

struct Options {
  long long batch = 1048575;
  std::vector<int> layers{256, 256, 128, 64};
  std::string json;
};

#ifdef NCF_WITH_CUDA

struct Types {
  const char* name;
  cudaDataType_t in, out;
  cublasComputeType_t compute;
  bool fp32_bias;  // bias CUDA_R_32F set explicitly (D is not FP32)
};

struct Case {
  std::string product, types, epilogue, shape;
  bool offered = false;
  size_t workspace = 0;
  std::string status;
};

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
      return "RELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DRELU:
      return "DRELU";
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
      return "DRELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    default:
      return "other";
  }
}

// One heuristic query: D[m×n] = op(A)·op(B), A stored [ka×ma] etc. in column-major
// with leading dimensions lda, ldb, ldd; `vec` is the bias / bias-gradient vector
// and `aux` the ReLU bit mask (device memory large enough for either), given to
// the epilogues that take them.
Case query(cublasLtHandle_t lt, const Types& t, cublasLtEpilogue_t epi, cublasOperation_t ta,
           cublasOperation_t tb, uint64_t m, uint64_t n, uint64_t k, void* vec, void* aux,
           size_t workspace_bytes) {
  Case c;
  c.epilogue = epilogue_name(epi);
  c.types = t.name;
  std::ostringstream sh;
  sh << "m=" << m << " n=" << n << " k=" << k;
  c.shape = sh.str();
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto fail = [&](const char* what, cublasStatus_t st) {
    c.status = std::string(what) + ": " + cublasLtGetStatusString(st);
  };
  cublasStatus_t st = cublasLtMatmulDescCreate(&desc, t.compute, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) {
    fail("cublasLtMatmulDescCreate", st);
    return c;
  }
  const uint64_t a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const uint64_t b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  const bool aux_epi = epi == CUBLASLT_EPILOGUE_RELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DRELU ||
                       epi == CUBLASLT_EPILOGUE_DRELU_BGRAD;
  const bool vec_epi = epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_DRELU;
  // The ReLU bit mask: one bit per element of D, its leading dimension a multiple of 128.
  const int64_t aux_ld = int64_t((m + 127) / 128 * 128);
  struct Attr {
    cublasLtMatmulDescAttributes_t a;
    const void* v;
    size_t n;
  };
  std::vector<Attr> attrs = {{CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)},
                             {CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)},
                             {CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)}};
  const cudaDataType_t bias_type = CUDA_R_32F;
  if (vec_epi) {
    attrs.push_back({CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)});
    if (t.fp32_bias)
      attrs.push_back({CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)});
  }
  if (aux_epi) {
    attrs.push_back({CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)});
    attrs.push_back({CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)});
  }
  for (const Attr& a : attrs) {
    st = cublasLtMatmulDescSetAttribute(desc, a.a, a.v, a.n);
    if (st != CUBLAS_STATUS_SUCCESS) {
      fail("cublasLtMatmulDescSetAttribute", st);
      break;
    }
  }
  if (c.status.empty()) {
    st = cublasLtMatrixLayoutCreate(&la, t.in, a_rows, a_cols, int64_t(a_rows));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatrixLayoutCreate(&lb, t.in, b_rows, b_cols, int64_t(b_rows));
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&ld, t.out, m, n, int64_t(m));
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_bytes, sizeof(workspace_bytes));
    if (st != CUBLAS_STATUS_SUCCESS) fail("layouts", st);
  }
  if (c.status.empty()) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS) {
      fail("no algorithm", st);
    } else if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
      fail("no algorithm", result.state);
    } else {
      c.offered = true;
      c.workspace = result.workspaceSize;
      c.status = "offered";
    }
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return c;
}

#endif  // NCF_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"What cuBLASLt offers for the tower's products (see the file's header)"};
  app.add_option("--batch", o.batch, "rows of the batch (B)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "the tower's widths, layers[0] the concatenated input")
      ->delimiter(',')
      ->expected(2, 64);
  app.add_option("--json", o.json, "also write the table as JSON lines to this file");
  CLI11_PARSE(app, argc, argv);
#ifndef NCF_WITH_CUDA
  std::printf("bench_lt_probe: built without CUDA: nothing to probe\n");
  return 1;
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1 ||
      cudaSetDevice(0) != cudaSuccess) {
    std::printf("bench_lt_probe: no usable GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::printf("bench_lt_probe: cublasLtCreate failed\n");
    return 1;
  }
  int widest = 0;
  for (int w : o.layers) widest = std::max(widest, w);
  void *vec = nullptr, *aux = nullptr;
  const size_t aux_bytes = size_t(o.batch) * size_t((widest + 127) / 128 * 128) / 8 + 256;
  if (cudaMalloc(&vec, size_t(widest) * 4 + 256) != cudaSuccess ||
      cudaMalloc(&aux, aux_bytes) != cudaSuccess) {
    std::printf("bench_lt_probe: cudaMalloc failed\n");
    return 1;
  }
  const size_t workspace = size_t(32) << 20;  // the step's cuBLASLt workspace
  std::printf("# %s, cuBLASLt %zu, batch %lld, layers", prop.name, cublasLtGetVersion(), o.batch);
  for (int w : o.layers) std::printf(" %d", w);
  std::printf(", workspace %zu MiB\n", workspace >> 20);
  const Types types[] = {
      {"tf32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, false},
      {"fp32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, false},
      {"bf16->fp32", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, false},
      {"bf16->bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, false},
      {"bf16->bf16, fp32 bias", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, true}};
  std::vector<Case> cases;
  const uint64_t B = uint64_t(o.batch);
  for (size_t l = 0; l + 1 < o.layers.size(); ++l) {
    const uint64_t in =
        uint64_t(l == 0 ? o.layers[0] / 2 : o.layers[l]);  // layer 0: the items' half
    const uint64_t out = uint64_t(o.layers[l + 1]);
    const std::string layer = "L" + std::to_string(l);
    for (const Types& t : types) {
      for (cublasLtEpilogue_t e :
           {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_RELU_AUX_BIAS}) {
        Case c = query(lt, t, e, CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, vec, aux, workspace);
        c.product = layer + " fwd";
        cases.push_back(c);
      }
      for (cublasLtEpilogue_t e :
           {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_DRELU, CUBLASLT_EPILOGUE_DRELU_BGRAD}) {
        Case c = query(lt, t, e, CUBLAS_OP_N, CUBLAS_OP_N, in, B, out, vec, aux, workspace);
        c.product = layer + " dgrad";
        cases.push_back(c);
      }
      for (cublasLtEpilogue_t e :
           {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
        if (t.out == CUDA_R_16BF) continue;  // weight gradients stay FP32
        Case c = query(lt, t, e, CUBLAS_OP_N, CUBLAS_OP_T, in, out, B, vec, aux, workspace);
        c.product = layer + " wgrad";
        cases.push_back(c);
      }
    }
  }
  std::printf("%-10s %-22s %-14s %-24s %-8s %s\n", "product", "types", "epilogue", "shape",
              "ws KiB", "heuristic");
  int offered = 0;
  for (const Case& c : cases) {
    offered += c.offered;
    std::printf("%-10s %-22s %-14s %-24s %-8zu %s\n", c.product.c_str(), c.types.c_str(),
                c.epilogue.c_str(), c.shape.c_str(), c.workspace >> 10, c.status.c_str());
  }
  std::printf("# %d of %zu combinations offered\n", offered, cases.size());
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    for (const Case& c : cases)
      f << nlohmann::json{{"product", c.product},   {"types", c.types},
                          {"epilogue", c.epilogue}, {"shape", c.shape},
                          {"offered", c.offered},   {"workspace", c.workspace},
                          {"status", c.status}}
               .dump()
        << "\n";
    if (!f) {
      std::printf("bench_lt_probe: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  cudaFree(aux);
  cudaFree(vec);
  cublasLtDestroy(lt);
  return 0;
#endif
}
