// kernels/mla/cases.h: the shapes of the MLA family (absorbed and naive attention, the fused decode
// op, the decode context parallel ops), declared once for their users: the CPU tests against the
// standard op sequence and the absorbed form, the comparison of every backend with the CPU reference
// (kernels/mla/*_ops_test.cpp) and the op benchmark (mla_op_bench.cpp). A shape added here is tested
// on the CPU and on every backend at once.
#pragma once
#include <cstdint>

namespace k3::kernels {

// One rank's attention dims: heads, the q/k head's no-rope and rope parts, the value head, the
// latent (kv_lora) width. The cache row is kv_lora + rope wide.
struct MlaShape {
  int heads, nope, rope, v, kv_lora;
};

// A sequence of a batch: cache tokens after the step, rows this step (positions S-T .. S-1).
struct MlaSeq {
  int64_t S, T;
};

// Odd dims: no dimension a power of two, rope odd, latent not a multiple of 16.
inline constexpr MlaShape kMlaOdd{3, 17, 9, 13, 54};
// Narrower odd dims (a latent below 64, one head fewer than rope's width) and a rope of 64 (K3's) on
// odd heads: the CPU attention and paged-cache tests run both.
inline constexpr MlaShape kMlaOddNarrow{3, 13, 7, 11, 37};
inline constexpr MlaShape kMlaOddRope64{2, 32, 64, 24, 97};
// One TP8 rank of K3 (spec §11, §14.2 k3-layer-tp8): 12 heads, 128 + 64 q/k, 128 v, latent 512.
inline constexpr MlaShape kMlaK3Tp8{12, 128, 64, 128, 512};
// One head of K3 (a TP96-like shard).
inline constexpr MlaShape kMlaK3OneHead{1, 128, 64, 128, 512};

// A decode / verify batch on odd dims: plain decode rows and verify rows (3, 4) at different
// positions, including a 1-token context.
inline constexpr MlaSeq kMlaDecodeOddBatch[] = {{1, 1}, {17, 4}, {54, 1}, {97, 3}, {40, 1}, {3, 3}};
// Decode contexts at K3 dims: 1, 17, 97 and 1000+ positions (an uneven last tile and split), decode
// and verify rows.
inline constexpr MlaSeq kMlaDecodeK3Batch[] = {{1, 1}, {17, 1}, {97, 2}, {1000, 1}, {1537, 4}};

// ---- Decode context parallelism (mla_cp.h) ------------------------------------------------------
// The latent cache of every sequence is split over the cp ranks of a group by position (p on rank
// p % cp, at local position p / cp). A shape's heads are ONE rank's (the owner's H): the group attends
// with cp * H heads, every rank over its own tokens. mla_cp_test.cpp runs the group in one process
// against the absorbed form over the whole cache; mla_cp_*ops_test.cpp compare each op, and the four
// chained, on every backend with the CPU reference; mla_op_bench.cpp times each op at the K3 group.

// A group of cp ranks, each owning shape.heads heads.
struct MlaCpGroup {
  MlaShape shape;
  int cp;
};

// CP world sizes on odd dims: 1 (the absorbed form: every rescale weight is exactly 1), 2, 3 (not a
// power of two) and 4.
inline constexpr int kMlaCpOddSizes[] = {1, 2, 3, 4};
// One rank's odd shapes: 1, 3 and 12 heads (12: a TP8 rank's count, 48 in a group of 4) on kMlaOdd's
// dims, 1, 2 and 3 heads on kMlaOddNarrow's (a latent below 64), and 4 heads with a latent of 56 (a
// multiple of 8 that is not one of 16: the CUDA kernels' 8-column paths).
inline constexpr MlaShape kMlaCpOddShapes[] = {{1, 17, 9, 13, 54},  kMlaOdd,
                                               {12, 17, 9, 13, 54}, {1, 13, 7, 11, 37},
                                               {2, 13, 7, 11, 37},  kMlaOddNarrow,
                                               {4, 17, 9, 13, 56}};
// Contexts split over the ranks (S tokens after the step, T rows): a 1-token context (only rank 0
// holds a token), 3 tokens with 1 and with 3 rows (rank 3 of 4 holds none; the rows at positions
// 0 and 1 see nothing on the ranks above them), splits that are uneven over 2, 3 and 4 ranks (18,
// 20, 55, 98, 100), verify rows of 3 and 4 that cross page boundaries, and contexts of 301 and
// 1004 tokens that end mid-page and mid-stage of the tensor-core strategy's 64 positions.
inline constexpr MlaSeq kMlaCpOddBatch[] = {{1, 1},  {3, 1},  {3, 3},   {18, 1},  {20, 3},
                                            {55, 4}, {98, 1}, {100, 3}, {301, 1}, {1004, 4}};
// Contexts that leave ranks without any token of the batch: 2 tokens (2 rows) and 1 token, so in a
// group of 3 or 4 the ranks from 2 up hold nothing at all (every row's lse there is -inf), and rank
// 1 one token that the row at position 0 does not see.
inline constexpr MlaSeq kMlaCpNoTokenBatch[] = {{2, 2}, {1, 1}};
// Page sizes of the odd cases: 7 (no power of two) and 16 (the engine's default block size).
inline constexpr int64_t kMlaCpOddBlockSizes[] = {7, 16};

// The tensor-core partial attention ("cuda_partial_splitkv_mma": latent % 64 == 0, (latent + rope)
// % 16 == 0) on odd nope / v: G * H = 12 (one head group of 12), 24 (two of 12), 17 (9 + 8) and 48
// (three of 16) heads over 1 to 4 ranks, latent 64 with rope 16 and latent 128 with rope 64.
inline constexpr MlaCpGroup kMlaCpMmaOddGroups[] = {
    {{12, 17, 16, 13, 64}, 1}, {{24, 17, 16, 13, 64}, 1},  {{17, 17, 64, 13, 128}, 1}, {{48, 17, 64, 13, 128}, 1},
    {{6, 17, 16, 13, 64}, 2},  {{12, 17, 16, 13, 64}, 2},  {{24, 17, 64, 13, 128}, 2}, {{4, 17, 16, 13, 64}, 3},
    {{8, 17, 16, 13, 64}, 3},  {{16, 17, 64, 13, 128}, 3}, {{3, 17, 16, 13, 64}, 4},   {{6, 17, 16, 13, 64}, 4},
    {{12, 17, 64, 13, 128}, 4}};

// One TP8 rank of K3 under DCP. The engine splits the cache over the whole tensor-parallel group (dcp
// is 1 or the TP size, model::check_dcp_size): 8 ranks of kMlaK3Tp8, all 96 heads in every rank's
// partial attention (6 head groups of 16 on the tensor cores). The group of 2 at the same rank shape
// (24 heads, 2 head groups of 12) is no K3 configuration (a TP2 rank holds 48 heads): the tests'
// smaller group, where every rank holds half of each context.
inline constexpr MlaCpGroup kMlaCpK3Dcp8{kMlaK3Tp8, 8};
inline constexpr MlaCpGroup kMlaCpK3Dcp2{kMlaK3Tp8, 2};
inline constexpr MlaCpGroup kMlaCpK3Groups[] = {kMlaCpK3Dcp8, kMlaCpK3Dcp2};
// The per-rank ops at K3 dims: contexts of 24K (3000 local positions at DCP 8: many splits per
// query) and 16K with 3 verify rows, 3004 with 4, 6 tokens (ranks 6 and 7 of 8 hold none) and 1.
inline constexpr MlaSeq kMlaCpK3Batch[] = {{24000, 1}, {16000, 3}, {3004, 4}, {6, 1}, {1, 1}};
// The four ops chained at K3 dims, against the absorbed form over the WHOLE cache (the CPU reference
// attends with every head of the group, so shorter): 1500 tokens, 903 with 3 verify rows, 64 with 2
// (a context that ends on a page boundary of 16 and 64), 3 (ranks 3 to 7 of 8 hold none).
inline constexpr MlaSeq kMlaCpK3ChainBatch[] = {{1500, 1}, {903, 3}, {64, 2}, {3, 1}};
// Page sizes at K3 dims: 16 (the engine's default block size) and 64 (one tensor-core stage).
inline constexpr int64_t kMlaCpK3BlockSizes[] = {16, 64};

// mla_w_uv (the last DCP step: W_UV and the output gate; rope unused) at odd shapes, with kv_b's
// dtype: kMlaOdd, latents that take the CUDA kernel's scalar path (37, 54, 511; 60 with a bf16 kv_b:
// 60 % 8 != 0) and its 16-byte loads (60 with an f32 kv_b, 64, 512, and 8: one chunk per row), v
// below 8 (warps without a W_UV row) and 9 (a partial block of rows), 1 to 5 heads.
struct MlaCpWUvCase {
  MlaShape shape;
  bool kv_b_f32;  // else bf16
};
inline constexpr MlaCpWUvCase kMlaCpWUvOddCases[] = {{kMlaOdd, false},
                                                     {{1, 17, 9, 13, 37}, false},
                                                     {{3, 17, 9, 7, 54}, false},
                                                     {{3, 17, 9, 13, 60}, false},
                                                     {{5, 17, 9, 9, 60}, true},
                                                     {{3, 17, 9, 13, 64}, false},
                                                     {{2, 17, 9, 17, 64}, true},
                                                     {{2, 11, 9, 11, 8}, false},
                                                     {{1, 17, 9, 9, 511}, false},
                                                     {{1, 17, 9, 9, 512}, true}};
// Rows per sequence of the odd mla_w_uv batch (each sequence followed by a row of no sequence, two
// unused slots per sequence: 6 x 7 = 42 slots in 6 chunks of 8 that cut through sequences).
inline constexpr int64_t kMlaCpWUvOddRows[] = {1, 3, 1, 5, 2, 4};
// mla_w_uv at K3 dims: decode steps of 1, 8 and 64 rows, and a verify step of 16 sequences of 4 rows.
inline constexpr int64_t kMlaCpK3DecodeRows[] = {1, 8, 64};
inline constexpr int64_t kMlaCpK3VerifySeqs = 16, kMlaCpK3VerifyRows = 4;

// The benchmark's decode context per sequence and page size (the engine's default block size).
inline constexpr int64_t kMlaBenchContext = 8192;
inline constexpr int64_t kMlaBenchBlockSize = 16;

}  // namespace k3::kernels
