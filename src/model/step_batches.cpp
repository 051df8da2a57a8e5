// model/step_batches.cpp: StepTables.
#include "model/step_batches.h"

#include <algorithm>

namespace k3::model {

namespace {

// Where one group's tables sit in the shared i32 buffer (element offsets).
struct GroupLayout {
  std::vector<const Segment*> seqs;
  int64_t row_begin = 0, num_rows = 0, position = 0, slot = 0, block_table = 0;
  int64_t width = 0;
};

constexpr int kGroups = 6;  // all, prefill, decode, kda_all, kda_decode, verify

struct Layout {
  GroupLayout groups[kGroups];
  int64_t cache_rows = 0, total_rows = 0;
  // Decode context parallelism's prefill gather (StepBatches::DcpPrefill): its tables' offsets and sizes.
  int64_t dcp_table = 0, dcp_width = 0, dcp_pack = 0, dcp_place = 0, dcp_slots = 0, dcp_blocks = 0;
};

// Under decode context parallelism with prefill sequences: appends the temporary cache's block
// tables [S, width], pack_rows [slots] and place_rows [blocks * block_size] of the prefill group
// (kernels::mla_gather_plan over each sequence's context, new tokens included).
void lay_out_dcp_prefill(Layout& L, int32_t block_size, const ContextSplit& split, std::vector<int32_t>& host) {
  const GroupLayout& prefill = L.groups[1];
  if (split.size == 1 || prefill.seqs.empty()) return;
  std::vector<int64_t> tokens;
  std::vector<std::span<const int32_t>> tables;
  for (const Segment* s : prefill.seqs) {
    tokens.push_back(s->state->num_tokens + s->rows());
    tables.emplace_back(s->state->block_table);
  }
  const kernels::MlaGatherPlan plan = kernels::mla_gather_plan(tokens, tables, split.size, split.rank, block_size);
  L.dcp_width = plan.table_width;
  L.dcp_slots = plan.slots;
  L.dcp_blocks = plan.blocks;
  L.dcp_table = static_cast<int64_t>(host.size());
  host.insert(host.end(), plan.block_table.begin(), plan.block_table.end());
  L.dcp_pack = static_cast<int64_t>(host.size());
  host.insert(host.end(), plan.pack_rows.begin(), plan.pack_rows.end());
  L.dcp_place = static_cast<int64_t>(host.size());
  host.insert(host.end(), plan.place_rows.begin(), plan.place_rows.end());
}

// Fills `host` and returns the layout; `shape` fixes the table width when set.
Layout lay_out(std::span<const Segment> segments, int32_t block_size, const StepTableShape& shape,
               const ContextSplit& split, std::vector<int32_t>& host) {
  Layout L;
  for (const Segment& s : segments) {
    L.groups[0].seqs.push_back(&s);
    L.groups[s.kind == StepKind::prefill ? 1 : 2].seqs.push_back(&s);
    K3_CHECK(!s.verify || s.kind == StepKind::decode, "StepTables: a verify sequence must be of the decode kind");
    if (s.verify) {
      L.groups[5].seqs.push_back(&s);
    } else {
      L.groups[3].seqs.push_back(&s);
      if (s.kind == StepKind::decode) L.groups[4].seqs.push_back(&s);
    }
  }
  host.clear();
  for (GroupLayout& g : L.groups) {
    for (const Segment* s : g.seqs)
      g.width = std::max<int64_t>(g.width, static_cast<int64_t>(s->state->block_table.size()));
    if (shape.block_table_width > 0) {
      K3_CHECK(g.width <= shape.block_table_width, "StepTables: a block table has " + std::to_string(g.width) +
                                                       " blocks, the fixed width is " +
                                                       std::to_string(shape.block_table_width));
      g.width = shape.block_table_width;
    }
    g.row_begin = static_cast<int64_t>(host.size());
    for (const Segment* s : g.seqs) host.push_back(static_cast<int32_t>(s->row_begin));
    g.num_rows = static_cast<int64_t>(host.size());
    for (const Segment* s : g.seqs) host.push_back(static_cast<int32_t>(s->rows()));
    g.position = static_cast<int64_t>(host.size());
    for (const Segment* s : g.seqs) host.push_back(static_cast<int32_t>(s->state->num_tokens));
    g.slot = static_cast<int64_t>(host.size());
    for (const Segment* s : g.seqs) host.push_back(s->state->kda_slot);
    g.block_table = static_cast<int64_t>(host.size());
    for (const Segment* s : g.seqs) {
      const auto& t = s->state->block_table;
      host.insert(host.end(), t.begin(), t.end());
      host.insert(host.end(), static_cast<size_t>(g.width) - t.size(), -1);  // never read
    }
  }
  for (const Segment& s : segments) L.total_rows = std::max(L.total_rows, s.row_end);
  L.cache_rows = static_cast<int64_t>(host.size());
  host.resize(host.size() + static_cast<size_t>(L.total_rows), -1);
  for (const Segment& s : segments)
    for (int64_t r = s.row_begin; r < s.row_end; ++r) {
      const int64_t pos = s.state->num_tokens + (r - s.row_begin);
      if (!split.owns(pos)) continue;  // decode context parallelism: another rank stores it (-1)
      const int64_t local = split.local(pos);
      const auto page = static_cast<size_t>(local / block_size);
      K3_CHECK(page < s.state->block_table.size(),
               "StepTables: a block table does not cover position " + std::to_string(pos) +
                   (split.size > 1 ? " (local " + std::to_string(local) + ")" : ""));
      host[static_cast<size_t>(L.cache_rows + r)] = static_cast<int32_t>(
          int64_t{s.state->block_table[page]} * block_size + local % block_size);
    }
  lay_out_dcp_prefill(L, block_size, split, host);
  return L;
}

// Everything the device views depend on: group sizes, row counts, widths, total rows.
std::vector<int64_t> signature(const Layout& L) {
  std::vector<int64_t> sig;
  for (const GroupLayout& g : L.groups) {
    sig.push_back(static_cast<int64_t>(g.seqs.size()));
    sig.push_back(g.width);
    for (const Segment* s : g.seqs) sig.push_back(s->rows());
  }
  sig.push_back(L.total_rows);
  for (const int64_t n : {L.dcp_width, L.dcp_slots, L.dcp_blocks}) sig.push_back(n);
  return sig;
}

}  // namespace

StepTables::StepTables(std::span<const Segment> segments, int32_t block_size, core::DeviceMemory& memory,
                       StepTableShape shape, ContextSplit split)
    : block_size_(block_size), shape_(shape), split_(split), memory_(memory) {
  std::vector<int32_t> host;
  const Layout L = lay_out(segments, block_size_, shape_, split_, host);
  layout_ = signature(L);
  storage_ = memory.upload(
      core::TensorView::contiguous(host.data(), core::DType::i32, {static_cast<int64_t>(host.size())}));
  auto* base = storage_.data<int32_t>();
  const core::Device dev = memory.device();
  auto vec = [&](int64_t off, int64_t n) {
    return core::TensorView::contiguous(base + off, core::DType::i32, {n}, dev);
  };
  kernels::SeqBatch* out[kGroups] = {&batches_.all,     &batches_.prefill,    &batches_.decode,
                                     &batches_.kda_all, &batches_.kda_decode, &batches_.verify};
  for (int i = 0; i < kGroups; ++i) {
    const GroupLayout& g = L.groups[i];
    const auto n = static_cast<int64_t>(g.seqs.size());
    kernels::SeqBatch& b = *out[i];
    b.row_begin = vec(g.row_begin, n);
    b.num_rows = vec(g.num_rows, n);
    b.position = vec(g.position, n);
    b.slot = vec(g.slot, n);
    b.block_table = core::TensorView::contiguous(base + g.block_table, core::DType::i32, {n, g.width}, dev);
    b.num_seqs = static_cast<int>(n);
    for (const Segment* s : g.seqs) {
      b.max_rows = std::max<int>(b.max_rows, static_cast<int>(s->rows()));
      b.max_tokens = std::max<int64_t>(b.max_tokens, split_.local_tokens(s->state->num_tokens + s->rows()));
    }
    if (shape_.max_tokens > 0) {
      K3_CHECK(b.max_tokens <= shape_.max_tokens, "StepTables: a sequence reaches " + std::to_string(b.max_tokens) +
                                                      " tokens, the fixed capacity is " +
                                                      std::to_string(shape_.max_tokens));
      b.max_tokens = shape_.max_tokens;
    }
  }
  batches_.cache_rows = vec(L.cache_rows, L.total_rows);
  if (L.dcp_slots > 0) {  // the prefill sequences over the temporary cache: global positions
    StepBatches::DcpPrefill& d = batches_.dcp_prefill;
    d.seqs = batches_.prefill;
    d.seqs.block_table = core::TensorView::contiguous(base + L.dcp_table, core::DType::i32,
                                                      {d.seqs.num_seqs, L.dcp_width}, dev);
    d.seqs.max_tokens = 0;
    for (const Segment* s : L.groups[1].seqs)
      d.seqs.max_tokens = std::max(d.seqs.max_tokens, s->state->num_tokens + s->rows());
    d.pack_rows = vec(L.dcp_pack, L.dcp_slots);
    d.place_rows = vec(L.dcp_place, L.dcp_blocks * block_size_);
    d.slots = L.dcp_slots;
    d.blocks = L.dcp_blocks;
  }
}

void StepTables::refill(std::span<const Segment> segments) {
  std::vector<int32_t> host;
  const Layout L = lay_out(segments, block_size_, shape_, split_, host);
  K3_CHECK(signature(L) == layout_, "StepTables::refill: the batch does not have the tables' layout");
  const kernels::SeqBatch* groups[kGroups] = {&batches_.all,     &batches_.prefill,    &batches_.decode,
                                              &batches_.kda_all, &batches_.kda_decode, &batches_.verify};
  for (int i = 0; i < kGroups; ++i)
    for (const Segment* s : L.groups[i].seqs)
      K3_CHECK(split_.local_tokens(s->state->num_tokens + s->rows()) <= groups[i]->max_tokens,
               "StepTables::refill: a sequence reaches past the fixed capacity " +
                   std::to_string(groups[i]->max_tokens));
  memory_.copy_from_host(storage_.view(), core::TensorView::contiguous(host.data(), core::DType::i32,
                                                                       {static_cast<int64_t>(host.size())}));
}

}  // namespace k3::model
