// kernels/moe/cases.h: the shapes of the MoE family's ops (router_topk, moe_experts, the fused tail
// moe_tail_combine), declared once for their users: the CPU tests against naive loops and the
// standard op sequence (router_test.cpp, experts_test.cpp, moe_tail_test.cpp), the comparison of
// every backend with the CPU reference (moe_*ops_test.cpp) and the op benchmark (moe_op_bench.cpp).
// A shape added here is tested on the CPU and on every backend at once.
#pragma once
#include <cstdint>
#include <span>

namespace k3::kernels {

// ---------------------------------------------------------------- router_topk

struct MoeRouterShape {
  const char* name;
  int64_t E;  // experts: logits [T, E], bias [E]
  int64_t k;  // top-k: ids and weights [T, k]
};

// Odd: one expert, k = 1, k = E, expert counts not powers of two. The CUDA ranking form takes up to
// top-32 of 1024 experts (cuda_router_select.cuh), the radix form the rest: k = E = 37 is beyond its
// k, 1025 experts beyond its E, E 1100 k 40 beyond both; E 97 k 32 is its largest k.
inline constexpr MoeRouterShape kMoeRouterOddShapes[] = {
    {"E1 k1", 1, 1},     {"E16 k1", 16, 1},     {"E16 k4", 16, 4},       {"E16 k9", 16, 9},   {"E16 k16", 16, 16},
    {"E37 k1", 37, 1},   {"E37 k4", 37, 4},     {"E37 k9", 37, 9},       {"E37 k37", 37, 37}, {"E97 k5", 97, 5},
    {"E97 k32", 97, 32}, {"E1025 k3", 1025, 3}, {"E1100 k40", 1100, 40},
};
// The router has no token bound (one block per token): 1, small and odd counts.
inline constexpr int64_t kMoeRouterOddTokens[] = {1, 3, 8, 17, 54, 97};

// K3 (spec §1.1, §7): top-16 of 896 experts; the router is replicated under TP and EP (spec §11).
inline constexpr MoeRouterShape kMoeRouterK3{"k3", 896, 16};

// ---------------------------------------------------------------- moe_experts

struct MoeExpertsShape {
  const char* name;
  int64_t E;                      // experts: ids index [0, E)
  int64_t L;                      // latent width: z and out [T, L]; w1/w3 [I, L], w2 [L, I]
  int64_t I;                      // each expert's intermediate width on this rank
  bool mxfp4;                     // MXFP4 experts (else bf16)
  std::span<const int64_t> topk;  // the routes per token (k) run on these experts
  // The tests' random weight sets: expert e takes set e % sets() (896 K3 experts need not all differ;
  // the kernels see E separate pointers all the same). 0: every expert its own.
  int64_t weight_sets = 0;
  constexpr int64_t sets() const { return weight_sets > 0 ? weight_sets : E; }
};

inline constexpr int64_t kMoeTopk1[] = {1}, kMoeTopk2[] = {2}, kMoeTopk3[] = {3}, kMoeTopk4[] = {4},
                         kMoeTopk16[] = {16}, kMoeTopk64[] = {64};
inline constexpr int64_t kMoeTopk1And2[] = {1, 2}, kMoeTopk1And4[] = {1, 4}, kMoeTopk1And5[] = {1, 5},
                         kMoeTopk1And16[] = {1, 16}, kMoeTopk3And5[] = {3, 5}, kMoeTopk3And12[] = {3, 12},
                         kMoeTopk3And16[] = {3, 16};
inline constexpr int64_t kMoeTopk2To4[] = {2, 3, 4}, kMoeTopk1_3_16[] = {1, 3, 16},
                         kMoeTopkRouteBounds[] = {3, 16, 64, 65};

// Any format and width (the CPU reference; on CUDA the rowdot strategy's generic kernels take the
// bf16 experts, the MXFP4 strategies the rest): bf16 experts at odd widths, MXFP4 at multiples of 32
// that are not powers of two; one expert (k = E = 1), k = 1 and k = E.
inline constexpr MoeExpertsShape kMoeExpertsOddShapes[] = {
    {"E6 L53 I37 bf16", 6, 53, 37, false, kMoeTopk3}, {"E7 L54 I17 bf16", 7, 54, 17, false, kMoeTopk3},
    {"E1 L17 I54 bf16", 1, 17, 54, false, kMoeTopk1}, {"E5 L97 I17 bf16", 5, 97, 17, false, kMoeTopk1And5},
    {"E5 L96 I64 mxfp4", 5, 96, 64, true, kMoeTopk4}, {"E7 L64 I96 mxfp4", 7, 64, 96, true, kMoeTopk3},
    {"E1 L32 I96 mxfp4", 1, 32, 96, true, kMoeTopk1}, {"E4 L160 I96 mxfp4", 4, 160, 96, true, kMoeTopk1And4},
};
// 1 and odd token counts (97 x 3 routes is past the MXFP4 kernels' route form: the sorted form).
inline constexpr int64_t kMoeExpertsOddTokens[] = {1, 17, 54, 97};
// One past the rowdot and MXFP4 strategies' piece of 2048 tokens (their scratch bound): two pieces.
inline constexpr int64_t kMoeExpertsTwoPieceTokens = 2049;

// The CUDA strategies' bounds (their supports() and tuning/default.json): the GEMV takes 1..16
// tokens, the grouped kernels (bf16 activations) 1..64, both 1..64 routes per token.
inline constexpr int64_t kMoeExpertsGemvMaxTokens = 16;
inline constexpr int64_t kMoeExpertsGroupedMaxTokens = 64;
inline constexpr int64_t kMoeExpertsMaxTopk = 64;
// The token counts the GEMV's tests run (every batch it takes) and the grouped kernels' (every kind
// of batch: up to 16 the GEMV is picked, so they run by name; 17..64 through the registry).
inline constexpr int64_t kMoeExpertsGemvTokens[] = {1, 2, 3, 5, 8, 16};
inline constexpr int64_t kMoeExpertsGroupedTokens[] = {1, 2, 5, 7, 9, 16, 17, 20, 33, 40, 64};
// Each token bound and one past it: the refusal tests.
inline constexpr int64_t kMoeExpertsBoundTokens[] = {1, 16, 17, 64, 65};

// The MXFP4 strategies' odd widths (multiples of 32 that leave lanes, steps and warp slices idle: L 96
// is 3 chunks, 2080 is 65, 32 one; I 32 is one chunk, 160 five), k = E, one expert.
inline constexpr MoeExpertsShape kMoeExpertsMxfp4OddShapes[] = {
    {"E20 L96 I160", 20, 96, 160, true, kMoeTopk1_3_16},
    {"E20 L2080 I32", 20, 2080, 32, true, kMoeTopk1_3_16, 10},
    {"E5 L32 I96", 5, 32, 96, true, kMoeTopk3And5},
    {"E1 L96 I96", 1, 96, 96, true, kMoeTopk1},
};
// Few experts, so the grouped kernels' groups hold many routes and take several passes of 8: E 5 at
// k 3 (~38 routes a group at 64 tokens) and k 5 (every token on every expert: 64-route groups), E 2
// (one or two groups of ~32), E 70 at the largest k.
inline constexpr MoeExpertsShape kMoeExpertsLargeGroupShapes[] = {
    {"E5 L224 I64", 5, 224, 64, true, kMoeTopk3And5},
    {"E2 L96 I96", 2, 96, 96, true, kMoeTopk1And2},
    {"E70 L96 I64", 70, 96, 64, true, kMoeTopk64, 10},
};
// Strided z and out rows (the tests pick the row pads; 7 chunks of L), k 3 and k = E.
inline constexpr MoeExpertsShape kMoeExpertsStridedShape{"E12 L224 I96", 12, 224, 96, true, kMoeTopk3And12};
// Unrounded f32 partial sums (a TP rank's) into the latent block of a [T, L | hidden] buffer.
inline constexpr MoeExpertsShape kMoeExpertsPartialShape{"E18 L160 I64", 18, 160, 64, true, kMoeTopk1And16};
// Route ids outside [0, E) (the tests overwrite some): NaN rows.
inline constexpr MoeExpertsShape kMoeExpertsBadIdShape{"E9 L96 I64", 9, 96, 64, true, kMoeTopk2To4};
// k around the GEMV's and the grouped kernels' route bound (64 taken, 65 not).
inline constexpr MoeExpertsShape kMoeExpertsRouteBoundShape{"E70 L96 I64", 70, 96, 64, true, kMoeTopkRouteBounds, 10};

// A tensor-parallel split of every expert's intermediate (I 128: MXFP4 shards of whole 32-chunks up
// to 4 ways), both formats.
inline constexpr MoeExpertsShape kMoeExpertsTpSplitShapes[] = {
    {"E8 L96 I128 bf16", 8, 96, 128, false, kMoeTopk3},
    {"E8 L96 I128 mxfp4", 8, 96, 128, true, kMoeTopk3},
    {"E6 L64 I128 bf16", 6, 64, 128, false, kMoeTopk3},
    {"E6 L64 I128 mxfp4", 6, 64, 128, true, kMoeTopk3},
};
inline constexpr int kMoeExpertsTpSplits[] = {2, 4};

// The GEMV's staged E8M0 scales (moe_gemv_ops_test.cpp): a scale row of whole steps (4 chunks) is read
// 4 bytes at a time, others byte by byte, for gate/up (L / 32 chunks a row) and down (I / 32) apart:
// 8 and 4 chunks, 8 and 3, 7 and 4, 7 and 5, 3 and 3.
inline constexpr MoeExpertsShape kMoeExpertsGemvScaleShapes[] = {
    {"words_both", 6, 256, 128, true, kMoeTopk3},        {"words_gu_bytes_dn", 6, 256, 96, true, kMoeTopk3},
    {"bytes_gu_words_dn", 6, 224, 128, true, kMoeTopk3}, {"bytes_both_L224", 6, 224, 160, true, kMoeTopk3},
    {"bytes_both_L96", 8, 96, 96, true, kMoeTopk2},
};

// Expert parallelism (MoeExpertsArgs::expert_begin / num_experts): each split of kMoeExpertsEpSplits
// that divides E (24: 12, 6, 3 experts a rank; 8: down to one); MXFP4 and bf16 experts (the rowdot
// strategy's generic kernels on CUDA) at odd widths, and 16 experts for the bad ids.
inline constexpr MoeExpertsShape kMoeExpertsEpOddShapes[] = {
    {"E24 L96 I160", 24, 96, 160, true, kMoeTopk3And16},
    {"E12 L54 I17 bf16", 12, 54, 17, false, kMoeTopk3},
    {"E8 L64 I96 mxfp4", 8, 64, 96, true, kMoeTopk3},
    {"E8 L64 I96 bf16", 8, 64, 96, false, kMoeTopk3},
};
inline constexpr MoeExpertsShape kMoeExpertsEpBadIdShape{"E16 L96 I64", 16, 96, 64, true, kMoeTopk3};
inline constexpr int kMoeExpertsEpSplits[] = {2, 4, 8};

// One TP8 rank of K3 (spec §11, §14.2 k3-layer-tp8): all 896 experts sharded, top-16, L 3584,
// I = 3072 / 8 = 384, MXFP4.
inline constexpr MoeExpertsShape kMoeExpertsK3Tp8{"k3 tp8", 896, 3584, 384, true, kMoeTopk16, 16};
// One EP8 rank of K3 (spec §11 "EP variant", §14.2 "MoE variant EP8"): whole experts (I 3072), 112 of 896.
inline constexpr MoeExpertsShape kMoeExpertsK3Ep8{"k3 ep8", 896, 3584, 3072, true, kMoeTopk16, 4};
inline constexpr int kMoeExpertsK3EpRanks = 8;
static_assert(kMoeRouterK3.E == kMoeExpertsK3Tp8.E && kMoeRouterK3.k == kMoeExpertsK3Tp8.topk[0] &&
                  kMoeExpertsK3Ep8.E % kMoeExpertsK3EpRanks == 0,
              "the router picks the experts' routes");

// The token counts of one step at K3 shapes (router and experts): decode and verify rows 1, 2, 8;
// the GEMV's bound 16 and 17; 33 (spec §14.2's batch 32, odd); the grouped kernels' bound 64; 128
// (spec §14.2's largest batch: the MXFP4 kernels' sorted form).
inline constexpr int64_t kMoeK3Tokens[] = {1, 2, 8, 16, 17, 33, 64, 128};

// ---------------------------------------------------------------- moe_tail_combine

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
