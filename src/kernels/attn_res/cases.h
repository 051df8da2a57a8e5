// kernels/attn_res/cases.h: the shapes of the fused AttnRes ops (attn_res_bank, attn_res_merge),
// declared once for their users: the CPU tests against the direct computation and the standard
// add + attn_res_mix + rmsnorm (attn_res_fused_test.cpp), the comparison of every backend with the
// CPU reference (attn_res_fused_ops_test.cpp) and the op benchmark (attn_res_op_bench.cpp).
#pragma once
#include <cstdint>

namespace k3::kernels {

struct AttnResShape {
  const char* name;
  int64_t D;      // hidden width (AttnRes is replicated under TP)
  int bank_rows;  // n: completed blocks in the bank
  int mixes;      // M: mixes sharing the bank (one bank pass for all)
};

// Odd widths (the CUDA scalar path) and a multiple of 8 (its vector path), 1 to 9 bank rows, 1 to 5
// mixes, a one-element row.
inline constexpr AttnResShape kAttnResOddShapes[] = {{"D17 n1 M1", 17, 1, 1},   {"D97 n1 M1", 97, 1, 1},
                                                     {"D97 n3 M2", 97, 3, 2},   {"D54 n3 M5", 54, 3, 5},
                                                     {"D136 n9 M3", 136, 9, 3}, {"D1 n2 M5", 1, 2, 5}};
inline constexpr int64_t kAttnResOddRows[] = {1, 17, 54, 97};
// The merge's widths and bank sizes (0: the empty bank of the first block).
inline constexpr int64_t kAttnResMergeOddWidths[] = {17, 54, 97, 136};
inline constexpr int kAttnResMergeBankRows[] = {0, 1, 3, 9};

// One TP8 rank of K3: hidden 7168, 9 bank rows (the bank holds at most 8, spec §3: one more as a
// margin, kAttnResFusedMaxBankRows allows 16), the 24 mixes of a 12-layer block; decode rows 1 to 64.
inline constexpr AttnResShape kAttnResK3{"k3", 7168, 9, 24};
inline constexpr int64_t kAttnResK3Rows[] = {1, 8, 64};

}  // namespace k3::kernels
