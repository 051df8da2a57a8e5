// bench/decode_sweep_context.cpp: the decode sweep's synthetic context (random fp8 pages and KDA
// slots, shuffled block tables), the device copy bandwidth, and the bytes of a step by spec §12's
// rules (bench/decode_sweep.cpp's file comment says how the sweep uses them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "bench/bundle.h"
#include "bench/decode_sweep_internal.h"
#include "checkpoint/param_inventory.h"
#include "core/bf16.h"
#include "core/rng.h"

namespace k3::bench::sweep_detail {

using clock_type = std::chrono::steady_clock;

// ------------------------------------------------------------------ synthetic context

// Random bytes for a tensor of `dtype`: f32 / bf16 values U(-amp, amp); fp8 e4m3 values of magnitude
// 0.25..3.75 (exponent field 5..8, any mantissa: never NaN). Filled on every hardware thread, each
// with its own stream, and copied to the device in chunks of at most 256 MiB.
void fill_random(core::DeviceMemory& memory, const core::TensorView& dst, float amp, uint64_t seed) {
  K3_CHECK(dst.is_contiguous(), "fill_random: the destination must be contiguous");
  const size_t unit = core::dtype_size(dst.dtype), total = static_cast<size_t>(dst.nbytes());
  const size_t chunk_bytes = std::min(total, (size_t{256} << 20) / unit * unit);
  std::vector<uint8_t> host(chunk_bytes);
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t off = 0, chunk = 0; off < total; off += chunk_bytes, ++chunk) {
    const size_t bytes = std::min(chunk_bytes, total - off), n = bytes / unit;
    auto work = [&](size_t t) {
      core::Rng rng = core::Rng(seed).fork(chunk * 1024 + t);
      for (size_t i = n * t / threads, end = n * (t + 1) / threads; i < end; ++i) {
        const uint64_t r = rng.next_u64();
        const float u = amp * (static_cast<float>(r >> 40) * 0x1p-23f - 1.0f);  // U(-amp, amp)
        if (dst.dtype == core::DType::f32) {
          std::memcpy(host.data() + 4 * i, &u, 4);
        } else if (dst.dtype == core::DType::bf16) {
          const uint16_t b = core::f32_to_bf16_bits(u);
          std::memcpy(host.data() + 2 * i, &b, 2);
        } else {
          K3_CHECK(dst.dtype == core::DType::f8_e4m3, "fill_random: unexpected dtype");
          host[i] = static_cast<uint8_t>(((r >> 8) & 0x80) | ((5 + ((r >> 3) & 3)) << 3) | (r & 7));
        }
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (std::thread& th : pool) th.join();
    const core::Shape shape{static_cast<int64_t>(n)};
    memory.copy_from_host(core::TensorView::contiguous(static_cast<char*>(dst.data) + off, dst.dtype, shape,
                                                       dst.device),
                          core::TensorView::contiguous(host.data(), dst.dtype, shape));
  }
}

// The context of one ctx (see the file comment) for every slot: random pages and slots (KDA slot i
// saved to checkpoint i), and sequence i's block table = pages_per_seq pages of one shuffle of all
// the pages. Seeds from (seed, layer, rank) only.
void build_context(core::DeviceMemory& memory, model::KvStorage& kv, const config::K3Config& c, uint64_t seed, int rank,
                   int64_t pages_per_seq, std::vector<model::SequenceState>& seqs, std::vector<int32_t>& pages) {
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const uint64_t s = seed ^ (static_cast<uint64_t>(l + 1) * 0x100000001b3ull) ^ (static_cast<uint64_t>(rank) << 56);
    if (c.attn_kind(l) == config::AttnKind::mla) {
      fill_random(memory, kv.mla_pages(l).view(), 0.0f, s);
    } else {
      fill_random(memory, kv.kda_states(l).view(), 0.05f, s);
      fill_random(memory, kv.conv_states(l).view(), 1.0f, s ^ 0xc0);
    }
  }
  pages.resize(static_cast<size_t>(kv.storage_config().num_blocks));  // shuffled: scattered pages
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  core::Rng shuffle(seed ^ 0x5eedull);
  for (size_t i = pages.size(); i > 1; --i) std::swap(pages[i - 1], pages[shuffle.next_u64() % i]);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].kda_slot = static_cast<int32_t>(i);
    seqs[i].block_table = std::span<const int32_t>(pages).subspan(i * static_cast<size_t>(pages_per_seq),
                                                                  static_cast<size_t>(pages_per_seq));
    kv.save_checkpoint(seqs[i].kda_slot, static_cast<int32_t>(i));
  }
  memory.synchronize();
}

// Device-to-device copy bandwidth (read + write) of a `bytes` DeviceMemory::copy, median of 10
// (wall time around copy + synchronize).
double measure_copy_bandwidth(core::DeviceMemory& memory, int64_t bytes) {
  const core::Shape shape{bytes >> 20, int64_t{1} << 20};
  core::Tensor src = memory.empty(core::DType::u8, shape), dst = memory.empty(core::DType::u8, shape);
  memory.fill_bytes(src.view(), 1);
  std::vector<double> s;
  for (int i = 0; i < 12; ++i) {
    memory.synchronize();
    const auto t0 = clock_type::now();
    memory.copy(dst.view(), src.view());
    memory.synchronize();
    if (i >= 2) s.push_back(seconds_since(t0));
  }
  return 2.0 * static_cast<double>(shape.numel()) / median(s);
}

// ------------------------------------------------------------------ bytes (spec §12 rules)

// dcp > 1: one rank's share of the latent cache (every dcp-th token read, a 1 / dcp chance of the write).
StepBytes step_bytes(const config::K3Config& c, const model::KvStorage& kv, int64_t batch, int64_t ctx, int dcp) {
  StepBytes b;
  const double B = static_cast<double>(batch);
  double per_expert = 0;  // one routed expert (w1 + w2 + w3) of one layer, as stored
  int moe_layers = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.ffn_kind(l) == config::FfnKind::moe;
  for (const checkpoint::ParamSpec& s : checkpoint::expected_params(c)) {
    const double n = static_cast<double>(s.shapes[0].numel() * static_cast<int64_t>(core::dtype_size(s.dtypes[0])));
    if (s.role == checkpoint::ParamRole::embedding) {
      b.embedding_rows = B * n / static_cast<double>(s.shapes[0][0]);
    } else if (s.role == checkpoint::ParamRole::expert_weight || s.role == checkpoint::ParamRole::expert_packed ||
               s.role == checkpoint::ParamRole::expert_scale) {
      per_expert += n;
    } else {
      b.weights += n;
    }
  }
  per_expert /= static_cast<double>(moe_layers) * c.moe.num_experts;
  const double E = c.moe.num_experts, k = c.moe.num_experts_per_token;
  b.expected_experts_per_layer = E * (1.0 - std::pow(1.0 - k / E, B));
  // Expert parallelism (the rank's config has whole experts, E / ep of them): a rank reads its share
  // of the touched experts, whole; in expectation 1 / ep of them (the busiest rank reads more).
  const int ep = std::max(c.moe.expert_parallel_size, 1);
  b.experts = moe_layers * b.expected_experts_per_layer / ep * per_expert;
  const int32_t slots = kv.storage_config().num_slots;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (c.attn_kind(l) == config::AttnKind::kda) {
      b.kda_state += 2.0 * B * static_cast<double>(kv.kda_states(l).nbytes() + kv.conv_states(l).nbytes()) / slots;
    } else {
      const double row = static_cast<double>(c.mla.cache_dim() * core::dtype_size(kv.mla_pages(l).dtype()));
      b.mla_kv += B * (static_cast<double>(ctx + 1) * row + row) / dcp;
    }
    // Both Mix sides read bank ++ [prefix]; bank rows before layer l: ceil(l / block).
    const double bank_rows = static_cast<double>((l + c.attn_res_block_size - 1) / c.attn_res_block_size);
    b.attn_res += B * 2.0 * (bank_rows + 1.0) * static_cast<double>(c.hidden_size) * 2.0;
  }
  return b;
}

}  // namespace k3::bench::sweep_detail
