// backends/cuda/blas_lt.h: cuBLASLt GEMMs in the layout of every linear layer of the model:
//   y[T, out] = x[T, in] · W[out, in]^T      (row-major, fp32 accumulation)
// x and W both bf16 (y bf16, rounded once, or fp32: logits) or both f32 (y f32). Rows of x and y
// may be strided (ld >= width). Plans (descriptors + the heuristic's algorithm) are cached per
// shape, layout and pointer alignment, so a replayed step costs one cublasLtMatmul per GEMM.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace k3::backends::cuda {

// Throws core::Error("cuBLASLt error at FILE:LINE: EXPR: CUBLAS_STATUS_...").
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line);

#define K3_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                    \
    const cublasStatus_t k3_cublas_st_ = (expr);                                          \
    if (k3_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::k3::backends::cuda::throw_cublas_error(k3_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

enum class GemmType : uint8_t { bf16, f32 };

struct GemmArgs {
  int64_t tokens = 0, in = 0, out = 0;  // T, in, out
  const void* x = nullptr;              // [T, in], row stride x_ld elements
  int64_t x_ld = 0;
  const void* w = nullptr;  // [out, in], row stride w_ld elements
  int64_t w_ld = 0;
  void* y = nullptr;  // [T, out], row stride y_ld elements
  int64_t y_ld = 0;
  GemmType in_type = GemmType::bf16;   // x and W
  GemmType out_type = GemmType::bf16;  // y (bf16 only with bf16 inputs)
};

class BlasLt {
 public:
  // One handle and one device workspace (used in stream order by every GEMM of this object).
  explicit BlasLt(size_t workspace_bytes = size_t{32} << 20);
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;

  // True when cuBLASLt has an algorithm for this problem (plans it and caches the plan).
  bool supports(const GemmArgs& a);
  // Runs the GEMM on `stream`; throws core::Error when cuBLASLt has no algorithm for it.
  void gemm(const GemmArgs& a, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  // (in_type, out_type, T, in, out, x_ld, w_ld, y_ld, alignment of x, w, y)
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>;
  Plan& plan_for(const GemmArgs& a);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::mutex mu_;
  std::map<Key, Plan> plans_;
};

}  // namespace k3::backends::cuda
