// backends/cuda/blas_lt.cpp: cuBLASLt plans and GEMM calls.
//
// cuBLASLt is column-major. A row-major [R, C] matrix with row stride ld is the column-major
// [C, R] matrix with leading dimension ld, so y[T, out] = x[T, in] W[out, in]^T is, column-major,
//   Y (out x T, ld y_ld) = op_T(Wc) (out x in) * Xc (in x T)
// with Wc = W as column-major (in x out, ld w_ld) transposed, and Xc = x as column-major
// (in x T, ld x_ld) untransposed: m = out, n = T, k = in, transa = T, transb = N.
#include "backends/cuda/blas_lt.h"

#include <string>

#include "backends/cuda/check.h"

namespace k3::backends::cuda {

void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw core::Error("cuBLASLt error at " + std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                    cublasLtGetStatusName(st) + " (" + cublasLtGetStatusString(st) + ")");
}

namespace {

cudaDataType_t data_type(GemmType t) { return t == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (at most 256) dividing the address: cuBLASLt excludes kernels that need
// more alignment than the preference says the buffers have.
int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v % static_cast<uintptr_t>(2 * a)) == 0) a *= 2;
  return a;
}

}  // namespace

BlasLt::BlasLt(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  K3_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) K3_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

BlasLt::~BlasLt() {
  for (auto& [key, p] : plans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
  }
  if (workspace_) (void)cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

BlasLt::Plan& BlasLt::plan_for(const GemmArgs& a) {
  K3_CHECK(a.tokens > 0 && a.in > 0 && a.out > 0, "BlasLt: T, in and out must be positive");
  K3_CHECK(a.x_ld >= a.in && a.w_ld >= a.in && a.y_ld >= a.out, "BlasLt: row strides must be at least the row widths");
  K3_CHECK(!(a.in_type == GemmType::f32 && a.out_type == GemmType::bf16), "BlasLt: f32 inputs give f32 outputs only");
  const Key key{static_cast<int>(a.in_type),
                static_cast<int>(a.out_type),
                a.tokens,
                a.in,
                a.out,
                a.x_ld,
                a.w_ld,
                a.y_ld,
                alignment(a.x),
                alignment(a.w),
                alignment(a.y)};
  auto [it, inserted] = plans_.try_emplace(key);
  Plan& p = it->second;
  if (!inserted) return p;

  const cudaDataType_t in_t = data_type(a.in_type), out_t = data_type(a.out_type);
  // fp32 accumulation in both cases; with f32 inputs plain FP32 (no TF32: it would lose bits the
  // fp32 mode promises).
  K3_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  K3_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  K3_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  K3_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_t, a.in, a.out, a.w_ld));
  K3_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_t, a.in, a.tokens, a.x_ld));
  K3_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_t, a.out, a.tokens, a.y_ld));

  cublasLtMatmulPreference_t pref = nullptr;
  K3_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  const uint32_t align_w = static_cast<uint32_t>(std::get<9>(key)), align_x = static_cast<uint32_t>(std::get<8>(key)),
                 align_y = static_cast<uint32_t>(std::get<10>(key));
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w,
                                              sizeof(align_w));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x,
                                              sizeof(align_x));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y,
                                              sizeof(align_y));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y,
                                              sizeof(align_y));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // "No algorithm" is an answer (the caller falls back), not an error.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return p;
  K3_CUBLAS_CHECK(st);
  p.algo = result.algo;
  p.ok = true;
  return p;
}

bool BlasLt::supports(const GemmArgs& a) {
  std::lock_guard<std::mutex> lk(mu_);
  return plan_for(a).ok;
}

void BlasLt::gemm(const GemmArgs& a, cudaStream_t stream) {
  std::lock_guard<std::mutex> lk(mu_);
  Plan& p = plan_for(a);
  K3_CHECK(p.ok, "BlasLt: cuBLASLt has no algorithm for y[" + std::to_string(a.tokens) + ", " + std::to_string(a.out) +
                     "] = x[" + std::to_string(a.tokens) + ", " + std::to_string(a.in) +
                     "] W^T with these strides/alignments");
  const float alpha = 1.0f, beta = 0.0f;  // beta = 0: y is not read (it may hold NaN poison)
  K3_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, a.w, p.a, a.x, p.b, &beta, a.y, p.c, a.y, p.c, &p.algo,
                                 workspace_, workspace_bytes_, stream));
}

}  // namespace k3::backends::cuda
