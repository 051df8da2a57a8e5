// kernels/registry.h: every op of the model, each with its implementations per backend.
//
// The registry is the op tables of every family (kernels/<family>/ops.h: embedding, norm, linear,
// situ, elementwise, sampling, attn_res, moe, kda, mla, multi_linear, gqa, dspark), each a struct of its own;
// model code calls registry.<op>.run(args, device) and nothing branches on backends elsewhere
// (kernels/op_table.h says how a table chooses). A new op or implementation is written in its
// family's folder; only a new family is added here. The registry is an explicit object filled by
// register_reference_ops() and register_cuda_ops(): no globals, no static initialisers.
#pragma once
#include <memory>

#include "kernels/attn_res/ops.h"
#include "kernels/dspark/ops.h"
#include "kernels/elementwise/ops.h"
#include "kernels/embedding/ops.h"
#include "kernels/gqa/ops.h"
#include "kernels/kda/ops.h"
#include "kernels/linear/ops.h"
#include "kernels/mla/ops.h"
#include "kernels/moe/ops.h"
#include "kernels/multi_linear/ops.h"
#include "kernels/norm/ops.h"
#include "kernels/op_table.h"
#include "kernels/sampling/ops.h"
#include "kernels/situ/ops.h"

namespace k3::kernels {

struct Registry : EmbeddingOps,
                  NormOps,
                  LinearOps,
                  SituOps,
                  ElementwiseOps,
                  SamplingOps,
                  AttnResOps,
                  MoeOps,
                  KdaOps,
                  MlaOps,
                  MultiLinearOps,
                  GqaOps,
                  DsparkOps {
  Registry() {
    for_each([&](auto& t) { t.set_trace(&trace_); });
  }
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Calls fn(table) for every op table (tests use it to check coverage).
  template <class Fn>
  void for_each(Fn&& fn) {
    EmbeddingOps::for_each(fn);
    NormOps::for_each(fn);
    LinearOps::for_each(fn);
    SituOps::for_each(fn);
    ElementwiseOps::for_each(fn);
    SamplingOps::for_each(fn);
    AttnResOps::for_each(fn);
    MoeOps::for_each(fn);
    KdaOps::for_each(fn);
    MlaOps::for_each(fn);
    MultiLinearOps::for_each(fn);
    GqaOps::for_each(fn);
    DsparkOps::for_each(fn);
  }
  // Calls fn(family) for every family struct (registration).
  template <class Fn>
  void for_each_family(Fn&& fn) {
    fn(static_cast<EmbeddingOps&>(*this));
    fn(static_cast<NormOps&>(*this));
    fn(static_cast<LinearOps&>(*this));
    fn(static_cast<SituOps&>(*this));
    fn(static_cast<ElementwiseOps&>(*this));
    fn(static_cast<SamplingOps&>(*this));
    fn(static_cast<AttnResOps&>(*this));
    fn(static_cast<MoeOps&>(*this));
    fn(static_cast<KdaOps&>(*this));
    fn(static_cast<MlaOps&>(*this));
    fn(static_cast<MultiLinearOps&>(*this));
    fn(static_cast<GqaOps&>(*this));
    fn(static_cast<DsparkOps&>(*this));
  }
  void set_log(const LogFn& log) {
    for_each([&](auto& t) { t.set_log(log); });
  }
  void set_recorder(OpRecorder* recorder) {
    for_each([&](auto& t) { t.set_recorder(recorder); });
  }
  void set_tuner(OpTuner* tuner) {
    for_each([&](auto& t) { t.set_tuner(tuner); });
  }
  // Every table's selection on `device` reads `tuning` (register_cuda_ops sets the device's).
  void set_tuning(core::Device device, const Tuning& tuning) {
    for_each([&](auto& t) { t.set_tuning(device, tuning); });
  }
  // The trace of this registry's op calls (model::DecodeGraphs records each captured graph's
  // kernels with it). Reachable through a const registry: tracing the calls changes no table.
  OpTrace& trace() const { return trace_; }

 private:
  mutable OpTrace trace_;
};

// Registers the CPU reference implementation of every op (it supports everything its check
// accepts on CPU f32 activations); the references split their work over `pool` (null: a new pool
// of ThreadPool::machine_threads() for this registry; TP ranks on the CPU share one).
void register_reference_ops(Registry& r, std::shared_ptr<backends::cpu::ThreadPool> pool = nullptr);

// Registers the CUDA implementations of every op (Device::cuda) on `ctx`, with the tuning tables of
// its GPU (kernels/tuning.h). Without `ctx`: on device 0 when there is a usable GPU, else they are
// registered anyway and their supports() says why. In a build without CUDA (K3_HAVE_CUDA unset)
// this registers nothing.
void register_cuda_ops(Registry& r);
void register_cuda_ops(Registry& r, std::shared_ptr<backends::cuda::Context> ctx);

}  // namespace k3::kernels
