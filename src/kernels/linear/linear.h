// kernels/linear/linear.h: y = x W^T with fp32 accumulation (spec §2 "Linear").
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct LinearArgs {
  core::TensorView x;               // f32 [T, in]
  const LinearWeight* w = nullptr;  // [out, in], bf16 / f32 / MXFP4
  core::TensorView out;             // f32 [T, out]
  // true: round the fp32 sum once to bf16 in bf16 mode (every projection);
  // false: keep fp32 (router logits and lm_head logits).
  bool round_output = true;
  Precision precision = Precision::bf16;
};
core::Status linear_check(const LinearArgs& a);
// Sums sequentially over `in` for each output (the reference order), starting from 0, no FMA;
// the result does not depend on the thread count. x and out may have strided rows (unit inner
// stride); out must not alias x.
void linear_reference(const LinearArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
