// kernels/kda/cases.h: the shapes of the fused KDA decode op (kda_decode), declared once for its
// three users: the CPU test against the standard op sequence (kda_decode_test.cpp), the comparison
// of every backend with the CPU reference (kernels/kda/kda_decode_ops_test.cpp) and the op benchmark
// (kda_op_bench.cpp). A new shape added here is tested on the CPU and on every backend at once.
#pragma once

namespace k3::kernels {

struct KdaDecodeShape {
  const char* name;
  int H, D;  // heads, head dim (P = H * D)
  int R;     // f_b's rank (the low-rank decay projection)
  int K;     // short-conv width
};

// Odd shapes: no dimension a power of two where it can be avoided, one head, one-element dims,
// ranks above and below the head dim, conv widths 2 to 4.
inline constexpr KdaDecodeShape kKdaDecodeOddShapes[] = {
    {"H3 D17 R54 K4", 3, 17, 54, 4}, {"H2 D54 R97 K3", 2, 54, 97, 3},   {"H5 D97 R17 K4", 5, 97, 17, 4},
    {"H1 D1 R1 K2", 1, 1, 1, 2},     {"H1 D128 R97 K4", 1, 128, 97, 4}, {"H2 D32 R64 K2", 2, 32, 64, 2},
};

// One TP8 rank of K3 (spec §11, §14.2 k3-layer-tp8): 12 heads of 128, P = 1536, R = 128, K = 4.
inline constexpr KdaDecodeShape kKdaDecodeK3Tp8{"k3 tp8", 12, 128, 128, 4};
// One head of K3 (a TP96-like shard), and the same with a long rank (f_b chunks beyond the cache).
inline constexpr KdaDecodeShape kKdaDecodeK3OneHead{"k3 one head", 1, 128, 128, 4};
inline constexpr KdaDecodeShape kKdaDecodeK3OneHeadR1024{"k3 one head R1024", 1, 128, 1024, 4};

}  // namespace k3::kernels
