// kernels/mla/mla_gather_ops_test.cpp: mla_cache_gather (kernels/mla/mla.h: whole cache entries between
// page layouts, the decode-context-parallel prefill's pack and place) on every device backend against
// the CPU reference, BIT FOR BIT (it copies bytes), asserting "cuda_warp_copy" ran:
//   * odd shapes: widths whose rows take each copy word (1, 4 and 16 bytes), strided pages (a page
//     stride past block_size * width), rows in any order, repeated, and -1 (that dst row must keep its
//     bytes);
//   * the whole DCP prefill gather at real shapes (576-wide entries, pages of 16 and 64, cp 2 / 4 / 8,
//     f32 / bf16 / fp8 caches, sequences whose lengths are not multiples of cp or of the page): every
//     rank's split cache packed on the device into its slice of one buffer (what all_gather(first)
//     leaves), then placed; the temporary cache must hold the unsplit cache's bytes at every position.
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

constexpr const char* kGather = "cuda_warp_copy";

Tensor random_bytes(DType dtype, Shape shape, uint64_t seed) {
  Tensor t = Tensor::zeros(dtype, shape);
  core::Rng rng(seed);
  for (uint8_t& b : std::span(t.data<uint8_t>(), static_cast<size_t>(t.nbytes())))
    b = static_cast<uint8_t>(rng.next_u64());
  return t;
}
Tensor filled(DType dtype, Shape shape, uint8_t byte) {
  Tensor t = Tensor::zeros(dtype, shape);
  std::memset(t.view().data, byte, static_cast<size_t>(t.nbytes()));
  return t;
}
Tensor i32_host(const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DType::i32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
// The first `bs` rows of every page of a [blocks, bs + extra, width] tensor: pages with a longer stride.
TensorView strided_pages(const Tensor& t, int64_t bs) {
  TensorView v = t.view();
  v.shape = {t.dim(0), bs, t.dim(2)};
  return v;
}
// Byte pointer of cache row `row` of a pages view (dense rows, any page stride).
const char* row_ptr(const TensorView& v, int64_t row) {
  const int64_t bs = v.dim(1), es = static_cast<int64_t>(core::dtype_size(v.dtype));
  return static_cast<const char*>(v.data) + ((row / bs) * v.strides[0] + (row % bs) * v.strides[1]) * es;
}

// One call on the CPU and on the device from the same bytes: the whole dst tensors must match.
void expect_gather_matches(Device* dev, const Tensor& src_t, const TensorView& src, const std::vector<int32_t>& rows,
                           const Tensor& dst_t, const TensorView& dst, const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor rows_h = i32_host(rows);
  Tensor want = copy(dst_t);
  TensorView want_v = dst;
  want_v.data = static_cast<char*>(want.view().data) +
                (static_cast<const char*>(dst.data) - static_cast<const char*>(dst_t.view().data));
  cpu_registry().mla_cache_gather.run({src, rows_h.view(), want_v}, core::Device::cpu);

  const Tensor src_d = dev->upload(src_t), rows_d = dev->upload(rows_h), dst_d = dev->upload(dst_t);
  const auto on_device = [](const Tensor& whole_d, const Tensor& whole, const TensorView& part) {
    TensorView v = part;
    v.data = static_cast<char*>(whole_d.view().data) +
             (static_cast<const char*>(part.data) - static_cast<const char*>(whole.view().data));
    v.device = core::Device::cuda;
    return v;
  };
  const kernels::MlaCacheGatherArgs a{on_device(src_d, src_t, src), rows_d.view(), on_device(dst_d, dst_t, dst)};
  expect_device_impl(dev->registry().mla_cache_gather, a, dev);
  EXPECT_EQ(dev->registry().mla_cache_gather.select(a, core::Device::cuda).name, kGather);
  dev->registry().mla_cache_gather.run(a, core::Device::cuda);
  const Tensor got = dev->to_host(dst_d.view());
  ASSERT_EQ(got.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(got.view().data, want.view().data, static_cast<size_t>(want.nbytes())), 0)
      << "the device's dst differs from the reference's";
}

TEST(MlaCacheGatherOps, OddShapesEveryWordSizeStridedPagesAndSkippedRows) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 1;
  // (dtype, width): fp8 13 -> 1-byte words, f32 13 -> 4-byte, bf16 24 -> 16-byte, fp8 576 -> 16-byte.
  const std::vector<std::pair<DType, int64_t>> cases = {{DType::f8_e4m3, 13}, {DType::f32, 13},      {DType::bf16, 24},
                                                        {DType::bf16, 11},    {DType::f8_e4m3, 576}, {DType::f32, 576}};
  for (const auto& [dtype, width] : cases)
    for (bool strided : {false, true}) {
      const int64_t bs = 7, blocks = 5, extra = strided ? 1 : 0;
      const Tensor src_t = random_bytes(dtype, {blocks, bs + extra, width}, ++seed);
      const TensorView src = strided_pages(src_t, bs);
      const Tensor dst_t = filled(dtype, {3, 3 + extra, width}, 0x5d);
      const TensorView dst = strided_pages(dst_t, 3);
      core::Rng rng(++seed);
      std::vector<int32_t> rows;
      for (int i = 0; i < 9; ++i)
        rows.push_back(i % 4 == 1 ? -1 : static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(blocks * bs)));
      rows[8] = rows[0];  // a row twice
      expect_gather_matches(dev, src_t, src, rows, dst_t, dst,
                            std::string(core::dtype_name(dtype)) + " width " + std::to_string(width) +
                                (strided ? " strided pages" : ""));
      // The skipped rows kept their bytes on the device too (the comparison covers it: the
      // reference's dst started from the same 0x5d bytes).
    }
}

// The DCP prefill gather at real shapes, on the device.
void expect_dcp_gather(Device* dev, DType dtype, const std::vector<int64_t>& tokens, int cp, int64_t bs,
                       uint64_t seed) {
  SCOPED_TRACE(std::string(core::dtype_name(dtype)) + " cp " + std::to_string(cp) + " bs " + std::to_string(bs));
  const int64_t width = 576;
  const size_t row_bytes = width * core::dtype_size(dtype);
  std::vector<int64_t> base;
  int64_t total = 0;
  for (const int64_t n : tokens) {
    base.push_back(total);
    total += n;
  }
  const Tensor whole = random_bytes(dtype, {total, 1, width}, seed);
  // Every rank's split cache (position p on rank p % cp at local p / cp), pages in reverse id order.
  std::vector<Tensor> pages;
  std::vector<std::vector<std::vector<int32_t>>> tables(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) {
    int64_t blocks = 1;
    for (const int64_t n : tokens) blocks += ((n + cp - 1) / cp + bs - 1) / bs;
    Tensor p = filled(dtype, {blocks, bs, width}, 0x7e);
    int32_t next = static_cast<int32_t>(blocks) - 1;
    for (size_t s = 0; s < tokens.size(); ++s) {
      auto& table = tables[r].emplace_back();
      for (int64_t b = 0; b < ((tokens[s] + cp - 1) / cp + bs - 1) / bs; ++b) table.push_back(next--);
      for (int64_t q = r; q < tokens[s]; q += cp)
        std::memcpy(const_cast<char*>(row_ptr(p.view(), table[(q / cp) / bs] * bs + (q / cp) % bs)),
                    row_ptr(whole.view(), base[s] + q), row_bytes);
    }
    pages.push_back(p);
  }
  std::vector<kernels::MlaGatherPlan> plans;
  for (int r = 0; r < cp; ++r) {
    const std::vector<std::span<const int32_t>> t(tables[r].begin(), tables[r].end());
    plans.push_back(kernels::mla_gather_plan(tokens, t, cp, r, bs));
  }
  const int64_t slots = plans[0].slots;
  auto& op = dev->registry().mla_cache_gather;
  const Tensor gathered = dev->poisoned(dtype, {cp * slots, 1, width});
  for (int r = 0; r < cp; ++r) {
    const Tensor src = dev->upload(pages[r]), rows = dev->upload(i32_host(plans[r].pack_rows));
    const TensorView part = TensorView::contiguous(static_cast<char*>(gathered.view().data) + r * slots * row_bytes,
                                                   dtype, {slots, 1, width}, core::Device::cuda);
    const kernels::MlaCacheGatherArgs a{src.view(), rows.view(), part};
    EXPECT_EQ(op.select(a, core::Device::cuda).name, kGather);
    op.run(a, core::Device::cuda);
    dev->synchronize();  // src and rows are freed at the end of this iteration
  }
  const kernels::MlaGatherPlan& plan = plans[0];
  const Tensor cache = dev->poisoned(dtype, {plan.blocks, bs, width}), place = dev->upload(i32_host(plan.place_rows));
  op.run({gathered.view(), place.view(), cache.view()}, core::Device::cuda);
  const Tensor got = dev->to_host(cache.view());
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int32_t* table = plan.block_table.data() + s * plan.table_width;
    for (int64_t q = 0; q < tokens[s]; ++q)
      ASSERT_EQ(std::memcmp(row_ptr(got.view(), int64_t{table[q / bs]} * bs + q % bs),
                            row_ptr(whole.view(), base[s] + q), row_bytes),
                0)
          << "sequence " << s << " position " << q;
  }
}

TEST(MlaCacheGatherOps, DcpPrefillGatherRealShapes) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 100;
  for (DType dtype : {DType::f8_e4m3, DType::bf16, DType::f32})
    for (int cp : {2, 4, 8})
      for (int64_t bs : {16, 64}) expect_dcp_gather(dev, dtype, {4099, 1, 333, 64 * 8 + 5}, cp, bs, ++seed);
}

}  // namespace
}  // namespace k3::ops_test
