// model/decode_graphs.cpp: DecodeGraphs.
#include "model/decode_graphs.h"

#include <algorithm>

namespace k3::model {

DecodeGraphs::DecodeGraphs(const Model& model, KvStorage& kv, int64_t max_blocks_per_seq, int max_graphs)
    : model_(model), kv_(kv), max_graphs_(max_graphs) {
  K3_CHECK(max_blocks_per_seq >= 1 && max_graphs >= 1, "DecodeGraphs: max_blocks_per_seq and max_graphs must be >= 1");
  shape_.block_table_width = max_blocks_per_seq;
  shape_.max_tokens = max_blocks_per_seq * kv.storage_config().block_size;
}

bool DecodeGraphs::fits(std::span<const SequenceInput> batch, GraphBucket bucket) const {
  if (batch.empty() || static_cast<int>(batch.size()) != bucket.batch || bucket.batch > kMaxBatch || bucket.rows < 1)
    return false;
  const auto rows = static_cast<size_t>(bucket.rows);
  const bool verify = rows > 1;
  if (verify && static_cast<int64_t>(rows * batch.size()) > kMaxRows) return false;
  for (const SequenceInput& in : batch)
    if (in.kind != StepKind::decode || in.verify != verify || in.tokens.size() != rows || in.state == nullptr ||
        static_cast<int64_t>(in.state->block_table.size()) > shape_.block_table_width ||
        model_.context_split().local_tokens(in.state->num_tokens + static_cast<int64_t>(rows)) > shape_.max_tokens)
      return false;
  return true;
}

std::vector<Segment> DecodeGraphs::segments(std::span<const SequenceInput> batch) const {
  std::vector<Segment> out;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto R = static_cast<int64_t>(batch[i].tokens.size()), r = static_cast<int64_t>(i) * R;
    out.push_back({r, r + R, batch[i].state, StepKind::decode, batch[i].verify, batch[i].all_rows_logits()});
  }
  return out;
}

void DecodeGraphs::describe_verify(std::span<const SequenceInput> batch, int rows, VerifyCapture& capture) const {
  capture.states.clear();
  capture.row_begin.clear();
  capture.rows.clear();
  capture.start.clear();
  capture.total_rows = 0;
  for (const SequenceInput& in : batch) {
    capture.states.push_back(in.state);
    capture.row_begin.push_back(capture.total_rows);
    capture.rows.push_back(rows);
    capture.start.push_back(in.state->num_tokens);
    capture.total_rows += rows;
  }
}

void DecodeGraphs::check_kernels(const core::StepRoute& route, Entry& e, const core::KernelList& graph) {
  // A plan names the kernels of the graph captured when it was routed: this one, or (routed before
  // the graph was dropped and captured again) an equal list, or another rank's equal list under
  // tensor parallelism (compared once, then remembered).
  if (!route.kernels || route.kernels == e.kernels || route.kernels == e.matched) return;
  const core::KernelList& plan = *route.kernels;
  for (size_t i = 0; i < std::max(plan.size(), graph.size()); ++i) {
    const auto name = [&](const core::KernelList& l) {
      return i < l.size() ? l[i].op + " -> " + l[i].impl : std::string("nothing");
    };
    K3_CHECK(i < plan.size() && i < graph.size() && plan[i] == graph[i],
             "DecodeGraphs: the plan's kernel " + std::to_string(i) + " is " + name(plan) + ", the graph of bucket " +
                 std::to_string(e.bucket.batch) + "x" + std::to_string(e.bucket.rows) + " runs " + name(graph));
  }
  e.matched = route.kernels;
}

core::Tensor DecodeGraphs::forward(std::span<const SequenceInput> batch, const core::StepRoute& route, LogitsAt at,
                                   VerifyCapture* capture, HiddenTaps* taps) {
  const GraphBucket bucket = route.graph;
  const DecodePath path = route.path;
  K3_CHECK(fits(batch, bucket), "DecodeGraphs::forward: the step is not of its graph bucket " +
                                    std::to_string(bucket.batch) + "x" + std::to_string(bucket.rows) +
                                    " (pure decode of one token per sequence, or verify rows of equal counts, "
                                    "within the graphs' table width and capacity)");
  const bool verify = bucket.rows > 1;
  K3_CHECK(!verify || capture != nullptr, "DecodeGraphs::forward: a verify batch needs a VerifyCapture");
  model_.memory()->make_current();
  core::DeviceMemory& memory = *model_.memory();
  const auto B = static_cast<int>(batch.size()), R = static_cast<int>(batch[0].tokens.size());
  const LogitRows rows = verify ? LogitRows::requested : LogitRows::last;
  const std::vector<Segment> segs = segments(batch);
  std::vector<int32_t> ids;
  for (const SequenceInput& in : batch) ids.insert(ids.end(), in.tokens.begin(), in.tokens.end());
  const core::TensorView host_ids = core::TensorView::contiguous(ids.data(), core::DType::i32, {B * R});
  model_.check_step(kv_, batch);
  const auto advance = [&] {
    for (const Segment& s : segs) s.state->num_tokens += s.rows();
  };

  static const std::vector<int32_t> kNoTaps;
  const std::vector<int32_t>& tap_layers = taps ? taps->layers : kNoTaps;  // checked when a graph first taps them
  auto it = entries_.begin();
  while (it != entries_.end() && (it->bucket != bucket || it->path != path || it->tap_layers != tap_layers)) ++it;
  if (it != entries_.end()) {  // replay: rewrite the inputs in place
    entries_.splice(entries_.begin(), entries_, it);
    Entry& e = entries_.front();
    check_kernels(route, e, *e.kernels);
    e.tables->refill(segs);
    memory.copy_from_host(e.ids.view(), host_ids);
    if (verify) {  // this step's sequences around the graph's KDA buffers (which the replay rewrites)
      describe_verify(batch, R, *capture);
      capture->layers = e.capture.layers;
    }
    e.work->replay();
    ++replays_;
    advance();
    if (taps) taps->values = e.tap_values;
    return at == LogitsAt::device ? e.logits : memory.download_f32(e.logits.view());
  }

  // First step of this shape: run it eagerly on fixed-address inputs, then capture the same step.
  Entry e;
  e.bucket = bucket;
  e.path = path;
  e.tap_layers = tap_layers;
  HiddenTaps graph_taps{tap_layers, {}};
  model_.prepare_taps(graph_taps);
  if (taps) model_.prepare_taps(*taps);
  e.tables = std::make_unique<StepTables>(segs, kv_.storage_config().block_size, memory, shape_,
                                          model_.context_split());
  e.ids = memory.upload(host_ids);
  if (verify) {
    describe_verify(batch, R, *capture);
    capture->layers.assign(static_cast<size_t>(model_.config().num_hidden_layers), {});
    describe_verify(batch, R, e.capture);
    e.capture.layers.assign(static_cast<size_t>(model_.config().num_hidden_layers), {});
  }
  const core::Tensor eager = model_.run_step(kv_, segs, e.tables->batches(), e.ids.view(), rows, path, nullptr,
                                             verify ? capture : nullptr, taps);
  core::Tensor result = at == LogitsAt::device ? eager : memory.download_f32(eager.view());
  advance();
  kernels::OpTrace& trace = model_.ops().trace();
  trace.start();
  try {
    e.work = memory.capture([&] {
      e.logits = model_.run_step(kv_, segs, e.tables->batches(), e.ids.view(), rows, path, nullptr,
                                 verify ? &e.capture : nullptr, taps ? &graph_taps : nullptr);
    });
  } catch (...) {
    trace.stop();
    throw;
  }
  e.kernels = std::make_shared<const core::KernelList>(trace.stop());
  e.tap_values = std::move(graph_taps.values);
  if (!e.work) return result;  // the device cannot capture (the body did not run): nothing cached, every step eager
  check_kernels(route, e, *e.kernels);
  ++captures_;
  kernels_->publish(path, bucket, e.kernels);
  entries_.push_front(std::move(e));
  if (static_cast<int>(entries_.size()) > max_graphs_) {
    kernels_->erase(entries_.back().path, entries_.back().bucket);
    entries_.pop_back();
  }
  return result;
}

DecodeGraphs::Entry* DecodeGraphs::verify_entry_of(const VerifyCapture& capture) {
  for (Entry& e : entries_) {
    if (e.bucket.rows < 2 || e.capture.layers.size() != capture.layers.size()) continue;
    bool any = false, same = true;
    for (size_t l = 0; l < capture.layers.size() && same; ++l) {
      const void *mine = e.capture.layers[l].q_in.view().data, *theirs = capture.layers[l].q_in.view().data;
      if (!mine && !theirs) continue;  // an MLA layer
      same = mine == theirs;
      any = true;
    }
    if (any && same) return &e;
  }
  return nullptr;
}

void DecodeGraphs::commit_verified(VerifyCapture& capture, std::span<const int32_t> accepted_rows) {
  Entry* e = verify_entry_of(capture);
  if (!e) return model_.commit_verified(kv_, capture, accepted_rows);
  model_.memory()->make_current();
  const std::vector<Segment> segs = model_.begin_commit(capture, accepted_rows);
  if (segs.empty()) return;
  auto it = e->commits.begin();
  while (it != e->commits.end() &&
         !std::equal(it->accepted.begin(), it->accepted.end(), accepted_rows.begin(), accepted_rows.end()))
    ++it;
  if (it != e->commits.end()) {  // replay: this step's sequences in the tables, the KDA inputs already in place
    e->commits.splice(e->commits.begin(), e->commits, it);
    Commit& c = e->commits.front();
    c.tables->refill(segs);
    c.work->replay();
    ++commit_replays_;
  } else {  // first commit of this vector: eagerly on fixed tables, then the same queued work captured
    Commit c;
    c.accepted.assign(accepted_rows.begin(), accepted_rows.end());
    c.tables = std::make_unique<StepTables>(segs, kv_.storage_config().block_size, *model_.memory(), shape_,
                                            model_.context_split());
    model_.run_commit(kv_, segs, c.tables->batches(), capture);
    c.work = model_.memory()->capture([&] { model_.run_commit(kv_, segs, c.tables->batches(), capture); });
    if (c.work) {
      e->commits.push_front(std::move(c));
      if (static_cast<int>(e->commits.size()) > kMaxCommitGraphs) e->commits.pop_back();
    }
  }
  model_.end_commit(capture, accepted_rows);
}

size_t DecodeGraphs::kernels_per_step(int batch, int rows) const {
  for (const Entry& e : entries_)
    if (e.bucket == GraphBucket{batch, rows}) return e.work->kernel_launches();
  return 0;
}

}  // namespace k3::model
