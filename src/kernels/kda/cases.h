// kernels/kda/cases.h: the shapes of the KDA family's ops, declared once for their users. The fused
// decode op (kda_decode): the CPU test against the standard op sequence (kda_decode_test.cpp), the
// comparison of every backend with the CPU reference (kda_decode_ops_test.cpp) and the op benchmark
// (kda_op_bench.cpp). The attention ops (kda_recurrent, kda_chunked): the CPU tests against naive
// and recurrent forms (recurrent_test.cpp, chunked_test.cpp), the comparison of every backend with
// the CPU reference (kda_ops_test.cpp) and the op benchmark. A shape added here is tested on the
// CPU and on every backend at once.
#pragma once
#include <cstdint>

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

// ---------------------------------------------------------------- kda_recurrent, kda_chunked

// The heads of one attention call (spec §5.3-5.7); a state slot is [H, D, D] fp32.
struct KdaAttnShape {
  const char* name;
  int H, D;  // heads, head dim (P = H * D)
};

// One sequence of a batched call: its rows in the call and its position (the tokens before them).
struct KdaAttnSeq {
  int64_t rows, position;
};

// A step of `seqs` sequences of `rows` rows each, all at `position`: a decode step (one row each),
// a speculative verify step (K + 1 rows each) or a batch of prefills.
struct KdaAttnStep {
  const char* name;
  int seqs;
  int64_t rows, position;
};

// Odd shapes: head dims 17, 54 and 97 (no power of two, no multiple of 4: the CUDA kernels' scalar
// state path), 100 (a multiple of 4 that is no power of two: their vector path), one head, a
// one-element head, K3's head dim on one head; then power-of-two head dims (32 and K3's 128) at one
// to four heads.
inline constexpr KdaAttnShape kKdaAttnOddShapes[] = {{"H3 D17", 3, 17},  {"H2 D54", 2, 54},   {"H5 D97", 5, 97},
                                                     {"H1 D1", 1, 1},    {"H3 D100", 3, 100}, {"H1 D128", 1, 128},
                                                     {"H1 D32", 1, 32},  {"H2 D32", 2, 32},   {"H3 D32", 3, 32},
                                                     {"H4 D32", 4, 32},  {"H2 D128", 2, 128}, {"H3 D128", 3, 128},
                                                     {"H4 D128", 4, 128}};

// One sequence's token counts at odd shapes: one token, and counts that leave an uneven last chunk
// at both chunk sizes below (17 = 16 + 1, 54 = 3 x 16 + 6, 97 = 64 + 33, 150 = 2 x 64 + 22).
inline constexpr int64_t kKdaAttnOddTokens[] = {1, 17, 54, 97, 150};
// The chunk sizes of the golden test (spec §5.7, §15.1): FlashKDA's 16 and FLA's (and K3's) 64.
inline constexpr int kKdaChunkSizes[] = {16, 64};
// Odd chunk sizes against one sequence of kKdaOddChunkTokens tokens: one token a chunk, an odd size,
// one short of the count, the count itself, larger than the count.
inline constexpr int64_t kKdaOddChunkTokens = 37;
inline constexpr int kKdaOddChunkSizes[] = {1, 7, 36, 37, 100};
// A mixed batch at odd shapes: one row, position 0, a full chunk's rows, positions off the chunk
// grid (each sequence's first chunk ends at the next multiple of the chunk size).
inline constexpr KdaAttnSeq kKdaAttnOddBatch[] = {{1, 5}, {3, 0}, {17, 70}, {64, 13}};
// Decode and verify steps at odd shapes.
inline constexpr KdaAttnStep kKdaRecurrentOddSteps[] = {{"decode", 7, 1, 9}, {"verify", 3, 4, 21}};

// One TP8 rank of K3 (spec §11, §14.2 k3-layer-tp8): 12 heads of 128, P = 1536, a 768 KiB state slot.
inline constexpr KdaAttnShape kKdaAttnK3Tp8{"k3 tp8", 12, 128};
// K3 prefill token counts of one sequence (chunk 64): short of a chunk, around one chunk, several
// chunks with a partial last one (150 = 2 x 64 + 22, 1000 = 15 x 64 + 40).
inline constexpr int64_t kKdaChunkedK3Tokens[] = {20, 63, 64, 65, 150, 1000};
// A K3 chunked prefill batch: sequences of several chunks, one chunk, one row, positions on and off
// the chunk grid.
inline constexpr KdaAttnSeq kKdaChunkedK3Batch[] = {{150, 0}, {37, 37}, {64, 100}, {1, 64}};
// K3 decode and verify steps (spec §14.2: verify rows B x (K + 1) with K in {3, 7}), a decode step
// of 64 at an 8K position (spec §12's batch 64 at 8K context).
inline constexpr KdaAttnStep kKdaRecurrentK3Steps[] = {
    {"decode", 64, 1, 8191}, {"verify K=3", 8, 4, 100}, {"verify K=7", 8, 8, 100}};
// A K3 recurrent batch of mixed row counts (decode and verify rows), one at position 0.
inline constexpr KdaAttnSeq kKdaRecurrentK3Batch[] = {{1, 0}, {4, 7}, {8, 300}};
// The op benchmark's verify rows per sequence (K + 1, K in {3, 7}) at each decode batch, and its
// prefills: one 512-token block (spec §5.8's checkpoint interval), one 8K prompt, 8 sequences of 512.
inline constexpr int64_t kKdaBenchVerifyRows[] = {4, 8};
inline constexpr KdaAttnStep kKdaChunkedBenchSteps[] = {
    {"1x512", 1, 512, 0}, {"1x8192", 1, 8192, 0}, {"8x512", 8, 512, 0}};

}  // namespace k3::kernels
