// kernels/mla/cases.h: the shapes of the MLA family (absorbed and naive attention, the fused decode
// op), declared once for their users: the CPU tests against the standard op sequence, the comparison
// of every backend with the CPU reference (kernels/mla/*_ops_test.cpp) and the op benchmark
// (mla_op_bench.cpp). A shape added here is tested on the CPU and on every backend at once.
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

// The benchmark's decode context per sequence and page size (the engine's default block size).
inline constexpr int64_t kMlaBenchContext = 8192;
inline constexpr int64_t kMlaBenchBlockSize = 16;

}  // namespace k3::kernels
