// kernels/moe/cases.h: the shapes of the fused MoE tail (moe_tail_combine), declared once for its
// users: the CPU test against the standard op sequence (moe_tail_test.cpp), the comparison of every
// backend with the CPU reference (moe_tail_ops_test.cpp) and the op benchmark (moe_op_bench.cpp).
#pragma once
#include <cstdint>

namespace k3::kernels {

struct MoeTailShape {
  const char* name;
  int64_t L;       // the latent width (moe_experts' output u, latent_up's input)
  int64_t SI;      // the shared experts' intermediate width on this rank (shared_down's input)
  int64_t hidden;  // the output width
};

// Odd widths: every one of L, SI, hidden the smallest, middle and largest; SI 1 (one shared column).
inline constexpr MoeTailShape kMoeTailOddShapes[] = {{"L17 SI97 h54", 17, 97, 54},
                                                     {"L97 SI54 h17", 97, 54, 17},
                                                     {"L54 SI1 h97", 54, 1, 97},
                                                     {"L17 SI54 h97", 17, 54, 97},
                                                     {"L97 SI1 h54", 97, 1, 54}};
inline constexpr int64_t kMoeTailOddRows[] = {1, 17, 54};

// One TP8 rank of K3 (spec §11, §14.2 k3-layer-tp8): L 3584 (replicated), SI = 2 x 3072 / 8 = 768,
// hidden 7168; decode rows 1 to 64 (9: two n8 tiles of the tensor-core strategy).
inline constexpr MoeTailShape kMoeTailK3Tp8{"k3 tp8", 3584, 768, 7168};
inline constexpr int64_t kMoeTailK3Rows[] = {1, 2, 3, 8, 9, 64};

}  // namespace k3::kernels
