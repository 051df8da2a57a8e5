// kernels/multi_linear/reference.cpp: CPU reference of multi_linear: linear_reference once per
// output (so it is the standard per-weight op sequence bit for bit), plus the argument check.
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/linear/linear.h"
#include "kernels/moe/router.h"
#include "kernels/multi_linear/multi_linear.h"

namespace k3::kernels {

namespace {

std::string output_name(int i) { return "outputs[" + std::to_string(i) + "]"; }

LinearArgs linear_args(const MultiLinearArgs& a, int i) {
  const MultiLinearOutput& o = a.outputs[static_cast<size_t>(i)];
  return LinearArgs{a.x, o.w, o.out, o.round_output, a.precision};
}

// Byte range [first, last) spanned by a rank-2 view with unit inner stride.
std::pair<const char*, const char*> byte_span(const core::TensorView& v) {
  const auto* p = static_cast<const char*>(v.data);
  const int64_t elems = (v.dim(0) - 1) * v.strides[0] + v.dim(1);
  return {p, p + elems * static_cast<int64_t>(core::dtype_size(v.dtype))};
}

// Whether two rank-2 row views (unit inner stride, already shape-checked) share any element.
// Column slices of one buffer (same dtype and row stride, disjoint column ranges) do not, though
// their spans interleave; any other interleaving is treated as an overlap (conservative).
bool views_overlap(const core::TensorView& a, const core::TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = byte_span(a);
  const auto [b0, b1] = byte_span(b);
  if (a1 <= b0 || b1 <= a0) return false;  // disjoint spans
  const bool multi_row = a.dim(0) > 1 || b.dim(0) > 1;
  if (!multi_row || a.dtype != b.dtype || a.strides[0] != b.strides[0]) return true;
  // Same row pitch P (bytes): element columns of a occupy [oa, oa + wa) modulo P, those of b
  // [ob, ob + wb); every row is shorter than P, so disjoint residue intervals never meet.
  const int64_t elem = static_cast<int64_t>(core::dtype_size(a.dtype));
  const int64_t pitch = a.strides[0] * elem;
  if (pitch <= 0) return true;
  const int64_t delta = static_cast<int64_t>(b0 - a0);  // b's start relative to a's
  int64_t ob = delta % pitch;
  if (ob < 0) ob += pitch;
  const int64_t wa = a.dim(1) * elem, wb = b.dim(1) * elem;
  // Intervals on a circle of length `pitch`: a = [0, wa), b = [ob, ob + wb).
  const bool b_starts_in_a = ob < wa;
  const bool a_starts_in_b = ob + wb > pitch;  // b wraps around past 0
  return b_starts_in_a || a_starts_in_b;
}

}  // namespace

MultiLinearArgs& MultiLinearArgs::add(const LinearWeight* w, core::TensorView out, bool round_output) {
  if (num_outputs >= kMultiLinearMaxOutputs)
    throw core::Error("multi_linear: at most " + std::to_string(kMultiLinearMaxOutputs) +
                      " outputs per call, adding one more");
  outputs[static_cast<size_t>(num_outputs++)] = MultiLinearOutput{w, out, round_output};
  return *this;
}

RouterTopkArgs MultiLinearArgs::router_topk_args() const {
  return {outputs[static_cast<size_t>(router.output)].out,
          router.bias,
          router.ids,
          router.weights,
          router.renormalize,
          router.scaling};
}

namespace {

core::Status router_epilogue_check(const MultiLinearArgs& a) {
  const MultiLinearRouter& r = a.router;
  if (r.output >= a.num_outputs)
    return core::Status::fail("router: output " + std::to_string(r.output) + " out of range (" +
                              std::to_string(a.num_outputs) + " outputs)");
  if (a.outputs[static_cast<size_t>(r.output)].round_output)
    return core::Status::fail("router: " + output_name(r.output) + " must keep its f32 logits (round_output = false)");
  if (core::Status s = router_topk_check(a.router_topk_args()); !s) return core::Status::fail("router: " + s.reason());
  for (const auto& [name, v] : {std::pair{"ids", &r.ids}, std::pair{"weights", &r.weights}}) {
    if (views_overlap(*v, a.x)) return core::Status::fail(std::string("router: ") + name + " overlaps x");
    for (int i = 0; i < a.num_outputs; ++i)
      if (views_overlap(*v, a.outputs[static_cast<size_t>(i)].out))
        return core::Status::fail(std::string("router: ") + name + " overlaps " + output_name(i) + ".out");
  }
  if (views_overlap(r.ids, r.weights)) return core::Status::fail("router: ids overlap weights");
  return core::Status::ok();
}

}  // namespace

core::Status multi_linear_check(const MultiLinearArgs& a) {
  if (a.num_outputs < 1 || a.num_outputs > kMultiLinearMaxOutputs)
    return core::Status::fail("num_outputs must be 1.." + std::to_string(kMultiLinearMaxOutputs) + ", got " +
                              std::to_string(a.num_outputs));
  int64_t in = -1;
  for (int i = 0; i < a.num_outputs; ++i) {
    const MultiLinearOutput& o = a.outputs[static_cast<size_t>(i)];
    if (o.w == nullptr) return core::Status::fail(output_name(i) + ".w is null");
    if (in >= 0 && o.w->weight.defined() && o.w->weight.view().rank() == 2 && o.w->in_features() != in)
      return core::Status::fail(output_name(i) + ".w has in = " + std::to_string(o.w->in_features()) +
                                " but outputs[0].w has in = " + std::to_string(in) + ": every weight reads the same x");
    // linear's own check names w / x / out; prefix it with the output index.
    if (core::Status s = linear_check(linear_args(a, i)); !s)
      return core::Status::fail(output_name(i) + ": " + s.reason());
    if (in < 0) in = o.w->in_features();
    if (views_overlap(o.out, a.x)) return core::Status::fail(output_name(i) + ".out overlaps x");
    for (int j = 0; j < i; ++j)
      if (views_overlap(o.out, a.outputs[static_cast<size_t>(j)].out))
        return core::Status::fail(output_name(i) + ".out overlaps " + output_name(j) + ".out");
  }
  return a.router.output >= 0 ? router_epilogue_check(a) : core::Status::ok();
}

void multi_linear_reference(const MultiLinearArgs& a, backends::cpu::ThreadPool* pool) {
  for (int i = 0; i < a.num_outputs; ++i) linear_reference(linear_args(a, i), pool);
  if (a.router.output >= 0) router_topk_reference(a.router_topk_args());
}

}  // namespace k3::kernels
