// kernels/moe/moe_ops_test_util.h: what the routed-expert op tests share (moe_ops_test.cpp,
// moe_gemv_ops_test.cpp, moe_grouped_ops_test.cpp, moe_ep_ops_test.cpp): expert weight sets on the
// CPU and the device for a cases.h shape, random routes, the three activation modes, the strategy
// the registry picks, and one device run of moe_experts checked against the CPU reference.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/moe/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {

// E experts backed by `distinct` random weight sets (expert e uses set e % distinct): MXFP4, or
// bf16 with mxfp4 false. w* on the CPU, dw* the same weights on the device.
struct Experts {
  std::vector<kernels::LinearWeight> w1, w3, w2, dw1, dw3, dw2;
  Experts(Device* dev, core::Rng& rng, int64_t E, int64_t distinct, int64_t L, int64_t I, bool mxfp4 = true);
  // A cases.h shape: its E experts over its weight sets.
  Experts(Device* dev, core::Rng& rng, const kernels::MoeExpertsShape& s)
      : Experts(dev, rng, s.E, s.sets(), s.L, s.I, s.mxfp4) {}
  int64_t E() const { return static_cast<int64_t>(w1.size()); }
  int64_t L() const { return w1[0].in_features(); }
  int64_t I() const { return w1[0].out_features(); }
};

// ids: k distinct experts per token, uniformly at random; weights: positive, summing to 1.
void random_routes(core::Rng& rng, int64_t T, int64_t E, int64_t k, Tensor& ids, Tensor& weights);

// The activation storage and precision of one comparison: the engine's bf16, the exact fp32 mode,
// and f32 storage in bf16 precision (gate/up on CUDA cores, down on tensor cores over a bf16 h).
struct ExpertsMode {
  Mode act;  // device activation dtype (and whether random z is bf16-rounded)
  Precision precision;
  const char* name;
  Mode tol;  // tolerance class
};
inline constexpr ExpertsMode kExpertsModes[] = {{Mode::bf16, Precision::bf16, "bf16", Mode::bf16},
                                                {Mode::fp32, Precision::fp32, "fp32", Mode::fp32},
                                                {Mode::fp32, Precision::bf16, "f32_in_bf16", Mode::bf16}};

struct ExpertsCase {
  int64_t T, k;
  bool round_output = true;
  int64_t z_pad = 0, out_pad = 0;  // extra columns beside z / out: row-strided views
};

// (token, route, id): an id outside [0, E) written over the route's id.
struct BadId {
  int64_t t, j;
  int32_t id;
};

// Bad ids for T tokens of k routes over E experts, written in this order: 100 + E on the last token's
// second route (its first when k = 1), E on the middle token's first, the router's NaN marker -1 on
// the first token's last route.
std::vector<BadId> some_bad_ids(int64_t T, int64_t k, int64_t E);

// The device's moe_experts strategy named `name` (throws core::Error when none is registered).
const kernels::OpImpl<kernels::MoeExpertsArgs>& moe_impl_named(Device* dev, const std::string& name);
// The implementation selection must pick when a test expects `impl`: `impl` itself, except that
// "cuda_expert_rowdot" stands for the strategies the GEMV and the grouped form leave the call to:
// the first of "cuda_expert_fp4_mma", "cuda_expert_fp4", "cuda_expert_rowdot" that takes `args`
// (their order in tuning/default.json).
std::string expected_moe_impl(Device* dev, const kernels::MoeExpertsArgs& args, const std::string& impl);

// The strategy the registry picks for MXFP4 experts within the GEMV's shared-memory budget, z rows
// 16-byte aligned or not (tuning/default.json and the bounds in cases.h): "cuda_expert_gemv" up to
// 16 tokens, "cuda_expert_grouped" (bf16 activations) up to 64, both up to 64 routes per token and
// only on aligned rows; else "cuda_expert_rowdot" (which expected_moe_impl resolves to the MXFP4 form).
const char* mxfp4_strategy(const ExpertsMode& mode, int64_t T, int64_t k, bool aligned = true);

// How a case runs: through the registry, asserting that it picks `impl`, or `impl` by name
// (asserting that it supports the case) where the registry would pick another strategy.
enum class RunAs { selected, by_name };

// Runs moe_experts on the device for one case as `how` says, compares with the CPU reference and
// checks that the pad columns of out kept their NaN poison. `bad` entries are overwritten on the
// device's ids: those tokens must come back as NaN rows, the others as the reference computes them
// with the original ids.
void check_experts_case(Device* dev, const ExpertsMode& mode, const Experts& ex, const ExpertsCase& c, uint64_t seed,
                        const std::string& impl, const std::vector<BadId>& bad = {}, RunAs how = RunAs::selected);

}  // namespace k3::ops_test
