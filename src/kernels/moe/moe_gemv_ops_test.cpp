// kernels/moe/moe_gemv_ops_test.cpp: the branches of the small-batch expert GEMV ("cuda_expert_gemv",
// src/kernels/moe/cuda_experts_gemv.cu) that moe_ops_test.cpp's shapes do not pick on their own,
// each side checked against the CPU reference in the three activation modes, on cases.h
// kMoeExpertsGemvScaleShapes at every batch the GEMV takes:
//   - the staged E8M0 scales read 4 bytes at a time (scale rows of whole steps, 4-byte aligned)
//     or byte by byte (odd chunk counts, or a scale tensor at an odd address), separately for
//     gate/up (w1, w3) and down (w2);
//   - the tensor-core walk's slow path: a scale of 2 or more (E8M0 >= 128) or a NaN scale (255) in a
//     block takes two multiplies; NaN scales must give exactly the reference's NaN entries.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/moe/moe_ops_test_util.h"

namespace k3::ops_test {
namespace {

constexpr const char* kGemv = "cuda_expert_gemv";

// A device copy of a CPU MXFP4 weight whose scale tensor starts at an odd address (one byte into
// its buffer): still a contiguous [rows, in/32] u8 view, so the kernel must read it bytewise.
kernels::LinearWeight upload_odd_scales(Device* dev, const kernels::LinearWeight& w) {
  kernels::LinearWeight d;
  d.weight = dev->upload(w.weight);
  const int64_t n = w.scale.numel();
  Tensor shifted = Tensor::zeros(DType::u8, {n + 16});
  std::copy(w.scale.data<const uint8_t>(), w.scale.data<const uint8_t>() + n, shifted.data<uint8_t>() + 1);
  const Tensor buf = dev->upload(shifted);
  char* data = static_cast<char*>(buf.view().data) + 1;
  d.scale = Tensor(core::TensorView::contiguous(data, DType::u8, w.scale.shape(), buf.view().device),
                   std::shared_ptr<void>(data, [buf](void*) {}));
  return d;
}

// E experts, each its own random MXFP4 weights; `edit` may change a CPU weight's scale bytes
// (matrix m: 0 w1, 1 w3, 2 w2) before the upload; odd_scales[m] uploads matrix m's scales at an
// odd address.
struct ScaledExperts {
  std::vector<kernels::LinearWeight> w1, w3, w2, dw1, dw3, dw2;
  template <class Edit>
  ScaledExperts(Device* dev, core::Rng& rng, int64_t E, int64_t L, int64_t I, Edit edit, const bool (&odd_scales)[3]) {
    for (int64_t e = 0; e < E; ++e) {
      kernels::LinearWeight w[3] = {random_mxfp4_weight(rng, I, L), random_mxfp4_weight(rng, I, L),
                                    random_mxfp4_weight(rng, L, I)};
      for (int m = 0; m < 3; ++m) edit(e, m, w[m].scale);
      std::vector<kernels::LinearWeight>* cpu[3] = {&w1, &w3, &w2};
      std::vector<kernels::LinearWeight>* gpu[3] = {&dw1, &dw3, &dw2};
      for (int m = 0; m < 3; ++m) {
        cpu[m]->push_back(w[m]);
        gpu[m]->push_back(odd_scales[m] ? upload_odd_scales(dev, w[m]) : dev->upload(w[m]));
      }
    }
  }
  int64_t E() const { return static_cast<int64_t>(w1.size()); }
  int64_t L() const { return w1[0].in_features(); }
  int64_t I() const { return w1[0].out_features(); }
};

// Token t takes experts (t + j * step) % E, j = 0..k-1 with step = E / k (distinct); weights positive,
// summing to 1.
void fixed_routes(core::Rng& rng, int64_t T, int64_t E, int64_t k, Tensor& ids, Tensor& weights) {
  const int64_t step = std::max<int64_t>(1, E / k);
  ids = Tensor::zeros(DType::i32, {T, k});
  weights = f32_tensor({T, k});
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      ids.data<int32_t>()[t * k + j] = static_cast<int32_t>((t + j * step) % E);
      sum += weights.data<float>()[t * k + j] = static_cast<float>(rng.uniform(0.1, 1.0));
    }
    for (int64_t j = 0; j < k; ++j) weights.data<float>()[t * k + j] /= sum;
  }
}

// Runs the GEMV (asserting it is the strategy picked) and the CPU reference on the same inputs.
// NaN entries must match exactly (same positions); the rest is compared within tolerance.
void check(Device* dev, const ExpertsMode& gm, const ScaledExperts& ex, int64_t T, int64_t k, uint64_t seed,
           const std::string& what) {
  core::Rng rng(seed);
  const int64_t L = ex.L();
  const Tensor z = random_act(rng, {T, L}, gm.act, 0.0, 2.0);
  Tensor ids, weights;
  fixed_routes(rng, T, ex.E(), k, ids, weights);
  Tensor want = nan_tensor({T, L});
  cpu_registry().moe_experts.run({z.view(), ids.view(), weights.view(), ex.w1, ex.w3, ex.w2, want.view(), 4.0f, 25.0f,
                                  gm.precision},
                                 core::Device::cpu);
  Tensor dz = dev->upload(z, act_dtype(gm.act)), d_ids = dev->upload(ids), d_w = dev->upload(weights);
  Tensor out = dev->poisoned(act_dtype(gm.act), {T, L});
  const kernels::MoeExpertsArgs args{dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3,
                                     ex.dw2,    out.view(),   4.0f,       25.0f,  gm.precision};
  const std::string shape = shape_str({T, ex.E(), k, L, ex.I()});
  ASSERT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, kGemv)
      << shape << " " << gm.name << " " << what;
  dev->registry().moe_experts.run(args, dev->kind());
  Tensor got = dev->to_host_f32(out.view());
  int64_t nan_want = 0, nan_mismatch = 0;
  for (int64_t i = 0; i < T * L; ++i) {
    float& g = got.data<float>()[i];
    float& w = want.data<float>()[i];
    nan_want += std::isnan(w);
    nan_mismatch += std::isnan(g) != std::isnan(w);
    if (std::isnan(w)) g = w = 0.0f;  // out of the comparison
  }
  EXPECT_EQ(nan_mismatch, 0) << shape << " " << gm.name << " " << what << ": NaN entries differ from the reference ("
                             << nan_want << " NaN in the reference)";
  expect_close("moe_experts", shape, gm.tol, std::string(gm.name) + "_" + what, got, want, tol_reduction(gm.tol));
}

const auto kNoEdit = [](int64_t, int, Tensor&) {};

// Every scale shape with its scales where the upload put them, then the first with scale tensors at an
// odd address (read bytewise): w1's alone (gate/up bytewise), then w3's and w2's.
TEST(OpsOdd, MoeExpertsGemvScaleLoadsWordAndByte) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9000);
  struct Case {
    const kernels::MoeExpertsShape* shape;
    bool odd[3];
    std::string what;
  };
  std::vector<Case> cases;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsGemvScaleShapes)
    cases.push_back({&s, {false, false, false}, s.name});
  const kernels::MoeExpertsShape& first = kernels::kMoeExpertsGemvScaleShapes[0];
  cases.push_back({&first, {true, false, false}, "odd_w1"});  // w1 scales 1 byte off: gate/up bytewise
  cases.push_back({&first, {false, true, true}, "odd_w3_w2"});
  uint64_t seed = 9100;
  for (const Case& c : cases) {
    const kernels::MoeExpertsShape& s = *c.shape;
    const ScaledExperts ex(dev, rng, s.E, s.L, s.I, kNoEdit, c.odd);
    for (const ExpertsMode& gm : kExpertsModes)
      for (int64_t T : kernels::kMoeExpertsGemvTokens)
        for (int64_t k : s.topk) check(dev, gm, ex, T, k, ++seed, c.what);
  }
}

// Scales of 2 and more (E8M0 128..131) in some chunks of some rows of every matrix: the blocks
// holding them take the slow path (two multiplies), the others the one-multiply path; tiny scales
// (E8M0 0, 2^-127) ride along. The weights stay finite and exact: the outputs match the reference.
TEST(OpsOdd, MoeExpertsGemvLargeScalesTakeTheSlowPath) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9200);
  const bool plain[3] = {false, false, false};  // every scale tensor where the upload put it
  const auto edit = [](int64_t e, int m, Tensor& scale) {
    if (e % 2 == 1) return;  // odd experts keep their ordinary scales
    uint8_t* s = scale.data<uint8_t>();
    const int64_t rows = scale.dim(0), cols = scale.dim(1);
    for (int64_t r = 0; r < rows; r += 5)
      for (int64_t q = (r + m) % 3; q < cols; q += 3) s[r * cols + q] = static_cast<uint8_t>(128 + (r + q) % 4);
    s[(rows - 1) * cols] = 0;  // 2^-127
  };
  uint64_t seed = 9300;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsGemvScaleShapes) {
    const ScaledExperts ex(dev, rng, s.E, s.L, s.I, edit, plain);
    for (const ExpertsMode& gm : kExpertsModes)
      for (int64_t T : kernels::kMoeExpertsGemvTokens)
        for (int64_t k : s.topk) check(dev, gm, ex, T, k, ++seed, "large_scales");
  }
}

// A NaN scale (255) in a gate row of expert 0 makes every token routed to expert 0 a NaN row; one
// in a down row of expert 3 makes that latent column NaN for the tokens routed to expert 3; every
// other entry stays finite and right (the NaN does not leak into other rows of its block).
TEST(OpsOdd, MoeExpertsGemvNanScaleGivesTheReferenceNans) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9400);
  const bool plain[3] = {false, false, false};  // every scale tensor where the upload put it
  const auto edit = [](int64_t e, int m, Tensor& scale) {
    if (e == 0 && m == 0) scale.data<uint8_t>()[5 * scale.dim(1) + 1] = 255;   // w1 row 5, chunk 1
    if (e == 3 && m == 2) scale.data<uint8_t>()[37 * scale.dim(1) + 2] = 255;  // w2 row 37, chunk 2
  };
  uint64_t seed = 9500;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsGemvScaleShapes) {
    const ScaledExperts ex(dev, rng, s.E, s.L, s.I, edit, plain);
    for (const ExpertsMode& gm : kExpertsModes)
      for (int64_t T : kernels::kMoeExpertsGemvTokens)
        for (int64_t k : s.topk) check(dev, gm, ex, T, k, ++seed, "nan_scales");
  }
}

}  // namespace
}  // namespace k3::ops_test
