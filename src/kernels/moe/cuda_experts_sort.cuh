// kernels/moe/cuda_experts_sort.cuh: the routed experts' device counting sort of the T * k routes
// by expert id (sort_routes_kernel, defined in cuda_experts.cu), launchable from the other CUDA
// strategies of moe_experts (cuda_experts_grouped.cu) so that there is one sort.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace k3::kernels::cuda_detail {

// The sort keeps one counter per expert in shared memory: at most this many experts.
constexpr int kSortMaxExperts = 8192;

// One block on `stream`. ids: [T, k] global expert ids, rows ids_ld apart; the caller holds experts
// [e_begin, e_begin + E) of e_total (expert parallelism; e_begin 0 and e_total E without it), and
// "expert" below is the held index id - e_begin. Writes (all device memory):
//   offsets [E + 1]  exclusive prefix sums of the per-expert route counts;
//   order   [T * k]  route indices (t * k + j) grouped by expert (in no fixed order within one);
//   bad     [T]      1 for a token with an id outside [0, e_total), else 0;
//   active  [E]      active[0 .. *n_active) = the experts with routes (in no fixed order);
//   n_active [1]     the number of such experts;
//   groups  [E]      when not null: groups[g] = {active[g], its first index into order, its route
//                    count, 0} for g < *n_active.
// Bad ids and routes to experts another rank holds are in no group. A grid and scratch fixed by
// (T, k, E): graph-capturable.
void launch_sort_routes(const int32_t* ids, int64_t ids_ld, int64_t T, int k, int E, int e_begin, int e_total,
                        int* offsets, int* order, int* bad, int* active, int* n_active, int4* groups,
                        cudaStream_t stream);

}  // namespace k3::kernels::cuda_detail
