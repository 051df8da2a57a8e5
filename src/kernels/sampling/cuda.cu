// kernels/sampling/cuda.cu: CUDA `sample` op (sampling.h), one CTA of 1024 threads per sampled row.
//
// The row's logits x[V] stay in global memory (640 KB at K3's 163840: L2-resident across the
// passes) and are re-read by each pass; nothing is sorted. Every filter keeps a prefix of the total
// order (x desc, id asc), represented as a threshold (key, id): token i is "at or before" it when
// key_i > key || (key_i == key && i <= id), with key = an order-preserving u32 of x.
//   1. max / argmax (ties -> lowest id) / bad-row flag (NaN, +inf, all -inf -> token -1);
//   2. logprobs: log z = log sum exp(x - max) in double (a fixed-order block reduction);
//   3. top-k: radix select of the k-th best key (4 passes of 8 bits over a shared histogram of
//      counts), then the tie id among equal keys by an ordered count (ids ascending);
//   4. top-p: the same radix walk over masses p = exp((x - max) / T) of the top-k / min-p
//      survivors, in 64-bit fixed point (2^-45 units: integer sums are exact and deterministic),
//      finds the last token whose prefix mass reaches ceil(top_p * mass);
//   5. draw: the first id (ascending) whose running kept mass exceeds floor(u * total), by one
//      ordered scan (each thread sums a contiguous chunk of ids, a block scan, one thread walks);
//   6. top-N: radix select of the N-th best key, the N picks ranked by (x desc, id asc).
// Passes over the row: greedy 1 (+1 for the logprob, +6 for top-N); top-p alone 7 (its target
// comes from the radix walk's first pass, the draw's total from its own scan); top-k + top-p 12;
// +1 when min-p is combined with top-p. One CTA per row leaves most SMs idle at batch 1: splitting a
// row over a cluster, or compacting the top-k / top-p candidates into shared memory after the first
// radix pass, are the next steps if the bench shows it matters.
// Differences from the CPU reference (the host Sampler's arithmetic): CUDA expf (<= 2 ulp) for p
// and for the log-sum-exp terms, fixed-point masses (<= V * 2^-46 absolute on masses >= 1) and a
// different summation order; so logprobs agree to a few f32 ulp, greedy tokens and top-N ids
// exactly, and a drawn token differs only when its uniform lies within ~1e-6 (relative) of a CDF
// boundary, a top-p target as close to a prefix mass, or a p within 2 ulp of min_p.
#include <climits>
#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/sampling/ops.h"
#include "kernels/sampling/sampling.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

using u64 = unsigned long long;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr float kFixScale = 0x1.0p45f;  // masses in units of 2^-45: V * 2^45 < 2^64 for V <= 2^19

// A position in the total order (x desc, id asc): everything at or before it passes.
struct Thr {
  uint32_t key = 0;  // key 0 is below every real logit's key (-inf maps to 0x007fffff)
  int id = INT_MAX;  // so the default threshold lets everything pass
};

struct Shared {
  u64 hist[256];
  u64 sel_target;
  u64 warp_u64[kWarps];
  double warp_f64[kWarps];
  float warp_val[kWarps];
  int warp_id[kWarps];
  u64 sel_above;
  int sel_digit;
  int found;
  int n_picked;
  uint32_t pick_key[kMaxTopLogprobs];
  int pick_id[kMaxTopLogprobs];
};

// Orders like the float (after -0 -> +0, which the Sampler's == treats as equal to +0).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ bool at_or_before(uint32_t key, int id, const Thr& t) {
  return key > t.key || (key == t.key && id <= t.id);
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Block sums in a fixed order (warps, then the warp partials by lane): deterministic. Every thread
// gets the total; the leading barrier makes back-to-back calls safe.
__device__ u64 block_sum_u64(u64 v, Shared& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) sm.warp_u64[warp] = v;
  __syncthreads();
  return warp_sum_u64(sm.warp_u64[lane]);
}
__device__ double block_sum_f64(double v, Shared& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_f64(v);
  __syncthreads();
  if (lane == 0) sm.warp_f64[warp] = v;
  __syncthreads();
  return warp_sum_f64(sm.warp_f64[lane]);
}
// Exclusive prefix of v over the threads in order; *total gets the sum.
__device__ u64 block_exclusive_scan_u64(u64 v, Shared& sm, u64* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 y = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();
  if (lane == 31) sm.warp_u64[warp] = incl;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? sm.warp_u64[w] : 0ull;
    all += sm.warp_u64[w];
  }
  *total = all;
  return before + incl - v;
}

// The row's view and its per-row parameters.
struct Row {
  const float* x;
  int V;
  float max_logit;
  float temperature;
  double inv_t;
  float min_p;
  // p = exp((x - max) / T) as the Sampler computes it (the exponent clamped at -150), with CUDA expf.
  __device__ float prob(int i) const {
    const double a = fmax(__dmul_rn(static_cast<double>(__fsub_rn(x[i], max_logit)), inv_t), -150.0);
    return expf(__double2float_rn(a));
  }
  __device__ static u64 fixed(float p) { return __float2ull_rn(p * kFixScale); }  // exact scaling, then rounding
};

// Radix walk over the keys of the tokens with weight(i) > 0 (weight(i) is asked only of tokens
// whose key matches the digits chosen so far): finds the key K with above < target <= above +
// (weight of key K), where above = the weight of keys > K. The target is target_of(total weight),
// known after the first pass (so top-p needs no separate pass for its mass) and returned in
// *target_out. False when the total is below the target.
template <class Weight, class TargetOf>
__device__ bool radix_select(const Row& row, Weight weight, TargetOf target_of, uint32_t* key_out, u64* above_out,
                             u64* target_out, Shared& sm) {
  const int tid = threadIdx.x, lane = tid & 31;
  uint32_t prefix = 0, mask = 0;
  u64 above = 0, target = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < 256) sm.hist[tid] = 0;
    __syncthreads();
    for (int base = 0; base < row.V; base += kThreads) {  // uniform trip count: whole warps below
      const int i = base + tid;
      unsigned digit = 256u;  // 256: nothing to add
      u64 w = 0;
      if (i < row.V) {
        const uint32_t key = order_key(row.x[i]);
        if ((key & mask) == prefix && (w = weight(i)) > 0) digit = (key >> shift) & 255u;
      }
      // Warp-aggregated adds: one shared atomic per distinct digit of the warp (logits share few
      // leading bytes, so per-lane atomics would serialise on a handful of bins).
      unsigned pending = __ballot_sync(kFullMask, digit < 256u);
      while (pending) {
        const int leader = __ffs(pending) - 1;
        const unsigned d = __shfl_sync(kFullMask, digit, leader);
        const bool mine = digit == d;
        pending &= ~__ballot_sync(kFullMask, mine);
        const u64 s = warp_sum_u64(mine ? w : 0ull);
        if (lane == leader) atomicAdd(&sm.hist[d], s);
      }
    }
    __syncthreads();
    if (tid < 32) {  // lane l: digits 255 - 8l .. 248 - 8l, highest first
      u64 cnt[8], sum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) sum += cnt[q] = sm.hist[255 - 8 * lane - q];
      u64 incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(kFullMask, incl, o);
        if (lane >= o) incl += y;
      }
      if (shift == 24) {  // the first pass saw every weight: lane 31's inclusive sum is the total
        target = target_of(__shfl_sync(kFullMask, incl, 31));
        if (lane == 0) sm.sel_target = target;
      }
      const unsigned hit = __ballot_sync(kFullMask, above + incl >= target);
      if (hit == 0) {
        if (lane == 0) sm.sel_digit = -1, sm.sel_above = 0;
      } else if (lane == __ffs(hit) - 1) {
        u64 before = above + incl - sum;
        for (int q = 0; q < 8; ++q) {
          if (before + cnt[q] >= target) {
            sm.sel_digit = 255 - 8 * lane - q;
            sm.sel_above = before;
            break;
          }
          before += cnt[q];
        }
      }
    }
    __syncthreads();
    const int digit = sm.sel_digit;
    above = sm.sel_above;
    target = sm.sel_target;
    *target_out = target;
    __syncthreads();  // sel_* are rewritten by the next round
    if (digit < 0) return false;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  *key_out = prefix;
  *above_out = above;
  return true;
}

// The first id (ascending) at which the running sum of weight(i) over ids 0..i exceeds the target
// target_of(total weight); -1 when the total does not. Each thread sums a contiguous chunk, a block
// scan places the chunks (and gives the total, so the draw needs no separate pass for it), and the
// one thread whose chunk holds the crossing walks it.
template <class Weight, class TargetOf>
__device__ int find_crossing(const Row& row, Weight weight, TargetOf target_of, Shared& sm) {
  const int chunk = (row.V + kThreads - 1) / kThreads;
  const int lo = min(static_cast<int>(threadIdx.x) * chunk, row.V), hi = min(lo + chunk, row.V);
  u64 local = 0;
  for (int i = lo; i < hi; ++i) local += weight(i);
  u64 total;
  const u64 before = block_exclusive_scan_u64(local, sm, &total);
  const u64 target = target_of(total);
  if (threadIdx.x == 0) sm.found = -1;
  __syncthreads();
  if (before <= target && target < before + local) {
    u64 cum = before;
    for (int i = lo; i < hi; ++i) {
      cum += weight(i);
      if (cum > target) {
        sm.found = i;
        break;
      }
    }
  }
  __syncthreads();
  const int found = sm.found;
  __syncthreads();
  return found;
}

// The threshold of the n best tokens (1 <= n <= V) by (x desc, id asc).
__device__ Thr nth_best(const Row& row, int n, Shared& sm) {
  Thr t;
  u64 above = 0, target = 0;
  radix_select(
      row, [](int) { return 1ull; }, [n](u64) { return static_cast<u64>(n); }, &t.key, &above, &target,
      sm);  // n <= V: found
  const uint32_t key = t.key;
  const u64 remaining = static_cast<u64>(n) - above;  // >= 1 tokens of this key are among the n
  t.id = find_crossing(
      row, [&](int i) { return order_key(row.x[i]) == key ? 1ull : 0ull; }, [remaining](u64) { return remaining - 1; },
      sm);
  return t;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t logits_ld, int64_t logits_rows,
                                                          int V, const int32_t* params, float* out, int N) {
  __shared__ Shared sm;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t* pr = params + static_cast<int64_t>(blockIdx.x) * kSampleParamCols;
  const int width = 2 + 2 * N;
  float* o = out + static_cast<int64_t>(blockIdx.x) * width;
  for (int j = tid; j < width; j += kThreads)
    o[j] = (j == kOutToken || (j >= kOutTopIds && j < kOutTopIds + N)) ? -1.0f : NAN;
  const int64_t logits_row = pr[kParamLogitsRow];
  if (logits_row < 0 || logits_row >= logits_rows) return;  // the host checks first; never read past

  Row row;
  row.x = logits + logits_row * logits_ld;
  row.V = V;
  row.temperature = __int_as_float(pr[kParamTemperature]);
  row.min_p = __int_as_float(pr[kParamMinP]);
  const float top_p = __int_as_float(pr[kParamTopP]);
  const int top_k = pr[kParamTopK];
  const int num_top = max(0, min(pr[kParamNumTop], min(N, V)));
  const bool want_logprobs = pr[kParamWantLogprob] != 0 || num_top > 0;
  const u64 uniform_bits = static_cast<u64>(static_cast<uint32_t>(pr[kParamUniformLo])) |
                           (static_cast<u64>(static_cast<uint32_t>(pr[kParamUniformHi])) << 32);
  const double uniform = static_cast<double>(uniform_bits) * 0x1.0p-53;

  // 1. max, argmax (first maximum), bad logits.
  float best = -INFINITY;
  int best_id = INT_MAX;
  bool bad = false;
  for (int i = tid; i < V; i += kThreads) {
    const float v = row.x[i];
    bad = bad || !(v < INFINITY);
    if (v > best || (v == best && i < best_id)) best = v, best_id = i;
  }
  bad = __syncthreads_or(bad);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, best, off);
    const int oi = __shfl_xor_sync(kFullMask, best_id, off);
    if (ov > best || (ov == best && oi < best_id)) best = ov, best_id = oi;
  }
  if (lane == 0) sm.warp_val[warp] = best, sm.warp_id[warp] = best_id;
  __syncthreads();
  best = sm.warp_val[lane], best_id = sm.warp_id[lane];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, best, off);
    const int oi = __shfl_xor_sync(kFullMask, best_id, off);
    if (ov > best || (ov == best && oi < best_id)) best = ov, best_id = oi;
  }
  if (bad || !(best > -INFINITY)) return;  // uniform over the block: every thread saw the same
  row.max_logit = best;
  row.inv_t = row.temperature > 0.0f ? 1.0 / static_cast<double>(row.temperature) : 0.0;

  // 2. log z of log_softmax(x) (temperature 1, no filter).
  double log_z = 0.0;
  if (want_logprobs) {
    double z = 0.0;
    for (int i = tid; i < V; i += kThreads) z += static_cast<double>(expf(__fsub_rn(row.x[i], best)));
    log_z = log(block_sum_f64(z, sm));
  }

  // 3-5. the token.
  int token = best_id;
  if (row.temperature > 0.0f) {
    const int k = (top_k <= 0 || top_k >= V) ? V : top_k;
    Thr thr_k, thr_p;
    if (k < V) thr_k = nth_best(row, k, sm);
    const auto in_k = [&](int i) { return k == V || at_or_before(order_key(row.x[i]), i, thr_k); };
    const auto eligible_mass = [&](int i) -> u64 {  // top-k and min-p survivors
      if (!in_k(i)) return 0ull;
      const float p = row.prob(i);
      return p >= row.min_p ? Row::fixed(p) : 0ull;
    };
    if (top_p < 1.0f) {
      // target = ceil(top_p * mass after top-k). Without min-p that mass is the radix walk's own
      // total; with min-p (which drops some of it) one pass sums it first.
      const auto target_of = [top_p](u64 mass) {
        return static_cast<u64>(ceil(static_cast<double>(top_p) * static_cast<double>(mass)));
      };
      u64 target = 0;
      if (row.min_p > 0.0f) {
        u64 mass = 0;
        for (int i = tid; i < V; i += kThreads)
          if (in_k(i)) mass += Row::fixed(row.prob(i));
        target = target_of(block_sum_u64(mass, sm));
      }
      u64 above = 0;
      const bool cut = row.min_p > 0.0f ? radix_select(
                                              row, eligible_mass, [mass_target = target](u64) { return mass_target; },
                                              &thr_p.key, &above, &target, sm)
                                        : radix_select(row, eligible_mass, target_of, &thr_p.key, &above, &target, sm);
      if (cut) {  // else the survivors weigh less than the target: every one is kept
        const uint32_t key = thr_p.key;
        const u64 rest = target - above - 1;
        thr_p.id = find_crossing(
            row, [&](int i) { return order_key(row.x[i]) == key ? eligible_mass(i) : 0ull; },
            [rest](u64) { return rest; }, sm);
      }
    }
    const auto kept_mass = [&](int i) -> u64 {
      return at_or_before(order_key(row.x[i]), i, thr_p) ? eligible_mass(i) : 0ull;
    };
    // r = floor(u * total) < total; total >= 2^45: the argmax (p = 1) is always kept.
    token = find_crossing(
        row, kept_mass,
        [uniform](u64 total) {
          const u64 r = static_cast<u64>(floor(uniform * static_cast<double>(total)));
          return r < total ? r : total - 1;
        },
        sm);
  }
  const auto logprob = [&](int id) {
    return __double2float_rn((static_cast<double>(row.x[id]) - static_cast<double>(best)) - log_z);
  };

  // 6. top-N.
  if (num_top > 0) {
    const Thr t = nth_best(row, num_top, sm);
    if (tid == 0) sm.n_picked = 0;
    __syncthreads();
    for (int i = tid; i < V; i += kThreads) {
      const uint32_t key = order_key(row.x[i]);
      if (at_or_before(key, i, t)) {
        const int slot = atomicAdd(&sm.n_picked, 1);
        if (slot < kMaxTopLogprobs) sm.pick_key[slot] = key, sm.pick_id[slot] = i;
      }
    }
    __syncthreads();
    if (tid < num_top) {  // each pick's place is the number of picks better than it
      const uint32_t key = sm.pick_key[tid];
      const int id = sm.pick_id[tid];
      int place = 0;
      for (int j = 0; j < num_top; ++j) place += sm.pick_key[j] > key || (sm.pick_key[j] == key && sm.pick_id[j] < id);
      o[kOutTopIds + place] = static_cast<float>(id);
      o[kOutTopIds + N + place] = logprob(id);
    }
  }
  if (tid == 0) {
    o[kOutToken] = static_cast<float>(token);
    if (want_logprobs) o[kOutLogprob] = logprob(token);
  }
}

}  // namespace

// One block row-slice per (mask row, 1024 ids): each thread one id.
__global__ void token_mask_kernel(float* logits, int64_t logits_ld, int V, const uint32_t* masks, int words,
                                  const int32_t* rows) {
  const int r = blockIdx.y;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= V) return;
  if (!(masks[static_cast<int64_t>(r) * words + (t >> 5)] >> (t & 31) & 1u))
    logits[rows[r] * logits_ld + t] = -INFINITY;
}

void register_sampling_cuda(SamplingOps& r, const CudaOps& ops) {
  r.token_mask.add(
      {"cuda_token_mask", core::Device::cuda,
       [ops](const TokenMaskArgs& a) {
         return all_of({ops.usable(), on_cuda({{"logits", &a.logits}, {"masks", &a.masks}, {"rows", &a.rows}})});
       },
       [ops](const TokenMaskArgs& a) {
         const int64_t R = a.rows.dim(0), V = a.logits.dim(1);
         if (R == 0) return;
         const dim3 grid(static_cast<unsigned>((V + 255) / 256), static_cast<unsigned>(R));
         token_mask_kernel<<<grid, 256, 0, ops.ctx->stream()>>>(
             a.logits.as<float>(), a.logits.strides[0], static_cast<int>(V),
             reinterpret_cast<const uint32_t*>(a.masks.as<const int32_t>()), static_cast<int>(a.masks.dim(1)),
             a.rows.as<const int32_t>());
         K3_CUDA_CHECK_LAUNCH("token_mask_kernel");
       }});
  r.sample.add(
      {"cuda_radix_sample", core::Device::cuda,
       [ops](const SampleArgs& a) {
         return all_of({ops.usable(), on_cuda({{"logits", &a.logits}, {"params", &a.params}, {"out", &a.out}})});
       },
       [ops](const SampleArgs& a) {
         const int64_t R = a.params.dim(0);
         if (R == 0) return;
         sample_kernel<<<static_cast<unsigned>(R), kThreads, 0, ops.ctx->stream()>>>(
             a.logits.as<const float>(), a.logits.strides[0], a.logits.dim(0), static_cast<int>(a.logits.dim(1)),
             a.params.as<const int32_t>(), a.out.as<float>(), static_cast<int>((a.out.dim(1) - 2) / 2));
         K3_CUDA_CHECK_LAUNCH("sample_kernel");
       }});
}

}  // namespace k3::kernels
