// kernels/sampling/sampling.h: the `sample` op — token sampling on the logits' device.
//
// One call samples R rows of a step's f32 logits [rows, V] with the processing of
// runner::Sampler (runner/sampler.h, steps 4-9; the oracle) for rows WITHOUT logit_bias or
// penalties (the caller routes those rows to the host Sampler): greedy argmax (ties -> lowest id),
// or for temperature T > 0: p = exp((x - max) / T), top-k (ties -> lower ids), top-p (shortest
// most-likely-first prefix reaching top_p * mass after top-k), min-p (p >= min_p * max p), then
// one draw with the row's uniform u over the survivors in ascending id order; plus the token's
// logprob and the N most likely (id, logprob), log_softmax of the logits BEFORE temperature.
//
// Every filter keeps a prefix of the total order "logit desc, id asc", so the kept set is
// {i : i at or before its last kept token} and the draw is the first id (ascending) at which the
// running mass exceeds u * total: a threshold search plus an ordered scan, no sort of the row.
//
// Numerics (see cuda.cu for the device side): the CPU reference computes everything as the host
// Sampler does (libm expf, double sums), so its tokens equal Sampler::sample's for the same u. The
// CUDA kernel takes p from CUDA's expf (<= 2 ulp from libm's) and sums masses in 64-bit fixed point
// (2^-45 units; error <= V * 2^-46 <= 2.4e-9 of a mass >= 1), so its token can differ only when
// u * total lies within ~1e-6 (relative) of a CDF boundary, the top-p target within that of a
// prefix mass, or a p within 2 ulp of min_p (kernels/sampling/sampling_ops_test.cpp checks each
// disagreement is such a case, and that they are < 0.1% of draws); greedy tokens and the top-N ids
// are exact, logprobs agree within 1e-6 * max(1, |logprob|).
//
// Layouts are packed so a decode step moves one small upload and one small download:
//   params  i32 [R, kSampleParamCols]: per row, the columns of SampleParamCol (floats bit-cast);
//   out     f32 [R, 2 + 2N], N in [0, kMaxTopLogprobs]: token, logprob, N ids, N logprobs (ids as
//           exact f32 values: V <= 2^24; core::DeviceMemory downloads f32 only).
#pragma once
#include <cstdint>
#include <span>

#include "core/error.h"
#include "core/tensor.h"

namespace k3::kernels {

inline constexpr int kMaxTopLogprobs = 20;           // = runner::kMaxLogprobs
inline constexpr int64_t kMaxSampleVocab = 1 << 19;  // fixed-point masses: V * 2^45 < 2^64

// Columns of the params tensor, one row per sampled row.
enum SampleParamCol : int {
  kParamLogitsRow = 0,  // which row of `logits` this row samples
  kParamTemperature,    // f32 bits: finite >= 0; 0 = greedy (no draw; filters have no effect)
  kParamTopP,           // f32 bits: (0, 1]; 1 = off
  kParamMinP,           // f32 bits: [0, 1]; 0 = off
  kParamTopK,           // <= 0 or >= V = off
  kParamNumTop,         // top logprobs wanted: [0, N] and <= V
  kParamWantLogprob,    // nonzero: the token's logprob (implied by NumTop > 0)
  kParamUniformLo,      // the draw u = n * 2^-53 (n < 2^53, core::Rng::uniform's bits): low 32 bits of n
  kParamUniformHi,      // high 21 bits of n
  kSampleParamCols
};

// Columns of the out tensor [R, 2 + 2N].
inline constexpr int kOutToken = 0;    // the id as an f32 value; -1: the row's logits hold NaN or
                                       // +inf or are all -inf (the host Sampler says which)
inline constexpr int kOutLogprob = 1;  // NaN unless wanted
inline constexpr int kOutTopIds = 2;   // [2, 2 + N): most likely first, ties -> lower id; -1 beyond NumTop
inline int64_t out_top_logprobs_col(int64_t n) { return 2 + n; }  // [2 + N, 2 + 2N): NaN beyond NumTop

// One row's parameters as the host writes them (pack_sample_params turns them into `params`).
struct SampleRowParams {
  int32_t logits_row = 0;
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_k = 0;
  int32_t num_top = 0;
  bool want_logprob = false;
  double uniform = 0.0;  // in [0, 1), a multiple of 2^-53 (core::Rng::uniform()); ignored when greedy
};

struct SampleArgs {
  core::TensorView logits;  // f32 [rows, V], rows contiguous (inner stride 1)
  core::TensorView params;  // i32 [R, kSampleParamCols], contiguous, on the logits' device
  core::TensorView out;     // f32 [R, 2 + 2N], contiguous, N in [0, kMaxTopLogprobs]
};

// Shapes and dtypes; for host params also every value (range, logits row, NumTop <= N).
core::Status sample_check(const SampleArgs& a);
void sample_reference(const SampleArgs& a);

// The `token_mask` op: a constrained row's grammar mask applied to its logits where they live, in
// place: logits[rows[r], t] = -inf for every t whose bit (bit t % 32 of word t / 32) is clear in
// masks[r]. Run before `sample`, so a constrained row samples on the device like any other
// (structured/matcher.h computes the masks on the host).
struct TokenMaskArgs {
  core::TensorView logits;  // f32 [rows, V], rows contiguous; written in place
  core::TensorView masks;   // i32 [R, ceil(V / 32)] (the bits as stored), contiguous, on the logits' device
  core::TensorView rows;    // i32 [R]: the logits row of each mask row, distinct, in [0, rows)
};
core::Status token_mask_check(const TokenMaskArgs& a);
void token_mask_reference(const TokenMaskArgs& a);

// Host packing: a contiguous CPU i32 [rows.size(), kSampleParamCols] tensor; throws core::Error
// naming the row and the field when a uniform is not a multiple of 2^-53 in [0, 1).
core::Tensor pack_sample_params(std::span<const SampleRowParams> rows);
SampleRowParams unpack_sample_params(const int32_t* row);

}  // namespace k3::kernels
