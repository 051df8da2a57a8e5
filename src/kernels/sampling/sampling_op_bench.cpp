// kernels/sampling/sampling_op_bench.cpp: k3bench_ops_gpu's sampling rows: the `sample` op on a
// decode step's logits, vocabulary 20480 (a TP8 shard) and 163840 (K3's, what the sampler sees after
// the all-gather), logits N(0, 3), four settings. Bytes: the logits read once, params, the output.
#include "backends/cuda/device_tensor.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

using core::DType;
using core::Tensor;

void bench_sampling_ops(OpBench& b) {
  core::Rng& rng = b.rng();
  struct Setting {
    const char* name;
    float temperature, top_p;
    int top_k, num_top;
  };
  const Setting settings[] = {{"greedy", 0.0f, 1.0f, 0, 0},
                              {"greedy top20", 0.0f, 1.0f, 0, 20},
                              {"T0.7 top_p0.9", 0.7f, 0.9f, 0, 0},
                              {"T0.7 k50 p0.95 lp", 0.7f, 0.95f, 50, 1}};
  for (int64_t V : {int64_t{20480}, int64_t{163840}})
    for (int64_t R : b.batches()) {
      Tensor host = Tensor::zeros(DType::f32, {R, V});
      for (float& v : host.span<float>()) v = static_cast<float>(rng.normal() * 3.0);
      Tensor logits = b.upload(host);
      for (const Setting& s : settings) {
        std::vector<SampleRowParams> rows(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) {
          SampleRowParams& p = rows[static_cast<size_t>(r)];
          p.logits_row = static_cast<int32_t>(r), p.temperature = s.temperature, p.top_p = s.top_p;
          p.top_k = s.top_k, p.num_top = s.num_top, p.want_logprob = s.num_top > 0, p.uniform = rng.uniform();
        }
        const Tensor params_h = pack_sample_params(rows);
        Tensor params = b.upload(params_h);
        Tensor out = b.empty(DType::f32, {R, 2 + 2 * int64_t{s.num_top}});
        const SampleArgs a{logits.view(), params.view(), out.view()};
        b.row("sample", std::string("sample ") + s.name, "V=" + std::to_string(V), R,
              static_cast<double>(logits.nbytes() + params.nbytes() + out.nbytes()),
              [&] { b.reg().sample.run(a, core::Device::cuda); });
      }
    }
}

}  // namespace k3::kernels
