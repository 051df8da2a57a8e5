// kernels/multi_linear/multi_linear.h: several linears y_i = x W_i^T over ONE input x in one call
// (fastpath/ fused op; spec §2 "Linear", §5.1, §6.1, §7).
//
// Contract: for every output i < num_outputs the op computes exactly what
//   linear_reference({x, outputs[i].w, outputs[i].out, outputs[i].round_output, precision})
// computes (kernels/linear/linear.h): y_i[t][o] = sum_k x[t][k] * W_i[o][k], fp32 accumulation
// sequential over k from 0 (no FMA) in the CPU reference, then ONE rounding on store:
//   round_output = true  -> round_act(sum, precision) (bf16 in Precision::bf16, none in fp32);
//   round_output = false -> the f32 sum unrounded (router logits, spec §2 "Router logits").
// On the CPU the result equals the per-weight linear op sequence BIT FOR BIT in both precisions.
// CUDA sums in another order (tensor-core / warp-tree partial sums): linear's tolerances apply.
//
// Shapes and dtypes (T rows = sequences x tokens per sequence; decode: 1..64, any T works):
//   x            f32 [T, in] (bf16 on CUDA in Precision::bf16), unit inner stride, any row stride;
//                read only.
//   outputs[i].w LinearWeight [out_i, in]: bf16 or f32 (MXFP4 passes the check and runs on the CPU;
//                the CUDA implementations reject it in supports()). Every weight has the same `in`.
//   outputs[i].out f32 [T, out_i] (bf16 on CUDA), unit inner stride, any row stride: outputs may be
//                column slices of one wider buffer (e.g. [q | k | v | g] side by side). Written
//                completely, nothing else is written. Outputs must not overlap x or each other.
//   On CUDA a bf16 out always rounds, so round_output = false needs an f32 out (as linear).
//
// Groups the fastpath uses (one TP8 rank, spec §11/§14.2, in = 7168, bf16 weights):
//   KDA  [q, k, v, g, f_a, b]: out 1536 x4, 128, 12   -> 6284 rows
//   MLA  [q_a, kv_a, g_proj] : out 1536, 576, 1536    -> 3648 rows
//   MoE  [router (f32 logits, round_output = false), latent_down, shared_gate, shared_up]:
//                              out 896, 3584, 768, 768 -> 6016 rows
// Bytes per call (bf16 weights dominate; bf16 x and outputs, router logits f32):
//   KDA: W 6284*7168*2 = 90,087,424 B + x 14,336 B/row + out 12,568 B/row
//        -> 90,114,328 B at T = 1 (floor 20.96 us at 4.3 TB/s), 91,809,280 B at T = 64;
//   MLA: W 3648*7168*2 = 52,297,728 B + x 14,336 B/row + out 7,296 B/row
//        -> 52,319,360 B at T = 1 (floor 12.17 us), 53,682,176 B at T = 64;
//   MoE: W 6016*7168*2 = 86,245,376 B + x 14,336 B/row + out 13,824 B/row (router 896*4)
//        -> 86,273,536 B at T = 1 (floor 20.06 us), 88,047,616 B at T = 64.
// The standard path (model/layers/*.cpp) launches one linear per weight for the same work: 6 (KDA),
// 3 (MLA), 4 (MoE front) cuBLASLt GEMMs in engine mode (bf16 x bf16; the router bf16 -> f32), or
// 6/3/4 cuda_rowdot launches in exact mode (f32 x, bf16 W).
//
// CUDA design (cuda.cu): ONE launch over the concatenation of all outputs' weight rows.
//   cuda_multi_mma (bf16 x, bf16 W, in % 8 == 0, 16-byte aligned rows): a CTA of 8
//     warps owns a 16-row tile of one output and all T (<= 64 per grid.y slice); the 8 warps split
//     `in` into interleaved 32-wide k-blocks (in-CTA split-K: deterministic, no workspace); each
//     lane streams 16-byte weight loads (2 rows x 8 values per k-block, several k-blocks in flight)
//     and x from L2, and feeds mma.sync m16n8k16 bf16 -> f32 (16 weight rows x 8 tokens per mma,
//     the k order permuted identically in A and B so both load 16 bytes per lane). Partial sums
//     meet in shared memory in warp order 0..7 and are stored once (rounded as above). Grid:
//     (sum_i ceil(out_i / 16), ceil(T / 64)): 393 CTAs for KDA (~3 per SM, one wave), each weight
//     byte read once per 64 tokens.
//   cuda_multi_cublaslt (every output cuBLASLt-able; tuning/*.json: above 16 rows): one cuBLASLt
//     GEMM per output, as the standard path: cuda_multi_mma re-reads x from L2 in every CTA
//     (T x in x 2 B per 16 weight rows), which past 16 rows costs more than the launches it saves.
//   cuda_multi_rowdot (any bf16/f32 mix of x and W dtypes, odd widths): the standard
//     row-dot kernel (kernels/cuda_rowdot.cuh) with every output's rows in one grid, 8 tokens per
//     pass over a weight row.
//   Router epilogue: cuda_multi_mma up to kMultiLinearRouterInKernelRows rows (<= 1024 experts,
//     k <= 32): every CTA of a router tile takes a ticket after its stores, and the one that draws
//     the last runs the selection of kernels/moe/cuda_router_select.cuh with the whole CTA on the
//     logits the others wrote (fenced, read through L2): the MoE loses the router launch (and its
//     drain) for the selection's time at the end of the front GEMM. Otherwise, and in the other
//     strategies, the router kernel (kernels/moe/cuda_router.h) runs after the GEMMs.
#pragma once
#include <array>

#include "core/error.h"
#include "kernels/common.h"
#include "kernels/moe/router.h"

namespace k3::kernels {

// The most outputs one call takes (KDA uses 6); fixed so the Args need no heap and a CUDA launch
// takes every descriptor by value.
inline constexpr int kMultiLinearMaxOutputs = 8;
// Rows up to which the tensor-core kernel runs the router epilogue itself: its last router CTA selects
// token after token (each selection a latency-bound pass), while the router kernel after the GEMM runs a
// CTA per token (measurements: docs/perf/kernel-notes.md, multi_linear).
inline constexpr int64_t kMultiLinearRouterInKernelRows = 1;

struct MultiLinearOutput {
  const LinearWeight* w = nullptr;  // [out_i, in] bf16 / f32 (/ MXFP4 on the CPU)
  core::TensorView out;             // f32 [T, out_i] (bf16 on CUDA), row stride allowed
  bool round_output = true;         // false: keep the f32 sum (router logits)
};

// Optional epilogue of the MoE front (spec §7): the router's top-k over the logits of output
// `output`, exactly router_topk({outputs[output].out, bias, ids, weights, renormalize, scaling})
// (kernels/moe/router.h), so the experts can start without a router launch.
struct MultiLinearRouter {
  int output = -1;           // the logits output (f32 out, round_output = false); -1: no epilogue
  core::TensorView bias;     // f32 / bf16 [E] e_score_correction_bias
  core::TensorView ids;      // i32 [T, k] out, in descending biased-score order
  core::TensorView weights;  // f32 [T, k] out
  bool renormalize = true;
  float scaling = 1.0f;
};

struct MultiLinearArgs {
  core::TensorView x;  // f32 [T, in] (bf16 on CUDA), row stride allowed, shared by every output
  std::array<MultiLinearOutput, kMultiLinearMaxOutputs> outputs{};  // [0, num_outputs) are used
  int num_outputs = 0;                                              // 1..kMultiLinearMaxOutputs
  Precision precision = Precision::bf16;
  MultiLinearRouter router;  // router.output < 0: none

  // Appends one output (throws core::Error past kMultiLinearMaxOutputs); returns *this to chain.
  MultiLinearArgs& add(const LinearWeight* w, core::TensorView out, bool round_output = true);
  // The router epilogue's arguments as router_topk's (requires router.output in range).
  RouterTopkArgs router_topk_args() const;
};

// Fails naming the bad output ("outputs[3].out ...") or x: num_outputs out of range, a null or
// malformed weight, a weight whose `in` differs from x's width, an out whose shape is not
// [T, out_i], an out overlapping x or another out; with a router epilogue ("router: ..."), an
// output index out of range, logits that are rounded, or what router_topk_check names.
core::Status multi_linear_check(const MultiLinearArgs& a);
// linear_reference for each output in turn (bit for bit the standard op sequence), then the router
// epilogue as router_topk_reference.
void multi_linear_reference(const MultiLinearArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
