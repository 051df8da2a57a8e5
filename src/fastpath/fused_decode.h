// fastpath/fused_decode.h: the latency_specialized decode path (design.md "Two decode paths, one
// contract"; design: docs/architecture.md, "The latency_specialized decode path").
//
// Scope: pure-decode steps (every sequence of the step decodes: one token, or K+1
// speculative-verify rows) of 1..kMaxRows rows in all, on the CPU (the fused ops' reference
// implementations: how CI proves this path computes the standard path's function; not faster)
// or on an sm_90 GPU. The scheduler routes each step by that scope (scheduler/step_route.h);
// every other step runs the standard path, and the reason (scheduler's kNotPureDecode and
// too_many_rows, or the problems below) is counted per reason by the engine (the server's
// k3:decode_fallbacks_total) and logged once per reason.
//
// Per layer the fused path runs (x: the sublayer input, P: the running AttnRes prefix):
//   KDA:  multi_linear x -> [q, k, v, g, f_a, b]; kda_decode (conv, SiLU, L2 norms, f_b, decay,
//         delta rule, o_norm, gate); multi_linear o_proj
//   MLA:  multi_linear x -> [q_a, kv_a, g]; mla_prep (q_a norm, kv_a norm, cache write); multi_linear
//         q_b; mla_decode (split-KV, W_UV and the gate in the combine); multi_linear o_proj
//   MoE:  multi_linear x -> [router, latent_down, shared gate, shared up]; the standard tail
//   each sublayer ends in attn_res_merge: P += out, the next Mix from the bank partials, RMSNorm
//   once per bank block: attn_res_bank (the bank part of the block's 24 Mix operators)
// An op whose fused kernel does not support its arguments (say MXFP4 projections, or more than
// 16 local MLA heads on CUDA) runs as the standard ops instead (for kda_decode / mla_decode: the
// whole standard attention sublayer); --explain shows the skip and its reason.
#pragma once
#include <memory>
#include <span>
#include <string>

#include "core/step_route.h"
#include "kernels/registry.h"
#include "model/model.h"

namespace k3::fastpath {

inline constexpr int64_t kMaxRows = 64;

// Why it serves no step of a model (metric labels: short and fixed).
inline constexpr const char* kUnsupportedGpu = "gpu_not_sm90";
// More bank rows or Mix operators per bank than the fused AttnRes ops take (a config whose
// attn_res_block_size is small for its depth, or above 16).
inline constexpr const char* kUnsupportedAttnRes = "attn_res_schedule_unsupported";

// `device_problem`: empty when the model's device is served (the CPU, or a GPU of compute
// capability 9.0); else the reason every step falls back (kUnsupportedGpu). See gpu_problem().
std::unique_ptr<model::FusedDecode> make_fused_decode(const model::Model& model, std::string device_problem = "");

// Why CUDA device `index` cannot run the fused kernels, or "" (sm_90). "" in builds without CUDA.
std::string gpu_problem(int index);

// Attaches the fused path to a model built with decode_backend = latency_specialized (no-op for
// auto). The runners call this once per model (per TP rank).
void attach(model::Model& model, int cuda_device);

// The plan of one step, from its route and the ops an OpRecorder saw run: the path and why, then
// each op with the implementation that ran and how many calls (launches on a GPU: one per call
// for the fused ops), per layer on average.
std::string explain_step(const core::StepRoute& route, std::span<const kernels::OpRecorder::Call> calls,
                         int num_layers);

}  // namespace k3::fastpath
