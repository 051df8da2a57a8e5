// backends/cuda/graph.h: CUDA-graph capture and replay of work queued on a Context's stream
// (a decode step: kernels, cuBLASLt GEMMs, async device-to-device copies and memsets).
//
//   Graph g = Graph::capture(*ctx, [&] { out = layer_forward(...); });  // records, runs nothing
//   g.replay();                                                        // queues the whole step
//
// Capture mode: cudaStreamCaptureModeThreadLocal. Calls this thread makes during the capture that
// cannot be captured (a synchronous cudaMemcpy, cudaMalloc outside the pool, a stream or device
// synchronize, an event query) fail at once instead of silently running eagerly and missing from
// the graph, as they would in Relaxed mode; unlike Global mode, other threads (a loader, the
// server, a communicator) are not affected by this capture, and their mistakes do not invalidate
// it. The pool's own cudaMalloc for a new block switches this thread to Relaxed for that one call
// (memory_pool.cpp): new address space is what the capture needs, and the graph then owns it.
//
// Memory: while the capture runs the Context's DevicePool tags every block it hands out, and every
// block freed, as owned by this graph (memory_pool.h). A replay writes into those blocks, so they
// are reused only by this graph's own captured allocations until the Graph is destroyed; then they
// return to the pool. The pool cannot see blocks allocated before the capture that the captured
// work reads or writes (weights, KV/state storage, inputs, step tables, Context::device_table
// entries): the caller keeps those alive, at the same addresses, as long as the Graph.
//
// The Context must outlive the Graph. replay() queues on the Context's stream only, which is what
// makes returning the blocks to the pool at destruction safe (stream order).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "backends/cuda/context.h"
#include "backends/cuda/memory_pool.h"

namespace k3::backends::cuda {

// Nodes of a captured graph by type (child graphs counted through).
struct GraphNodeCounts {
  size_t kernels = 0;  // kernel launches, ours and cuBLASLt's
  size_t memcpys = 0;  // cudaMemcpy*Async nodes
  size_t memsets = 0;  // cudaMemset*Async nodes
  size_t other = 0;    // host, event, empty, allocation ... nodes
  size_t total() const { return kernels + memcpys + memsets + other; }
};

class Graph {
 public:
  // Captures everything `body` queues on ctx.stream() and instantiates it. Nothing runs on the
  // device during the capture. Throws core::Error when the stream is already capturing, when the
  // body throws (its message kept, with a hint when it is a capture violation), when the capture
  // was invalidated or left work on another stream unjoined, or when instantiation fails; the
  // stream and the pool are left usable (not capturing) in every case.
  static Graph capture(Context& ctx, const std::function<void()>& body);

  Graph(Graph&& o) noexcept { *this = std::move(o); }
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  // Queues one launch of the whole graph on the Context's stream (asynchronous).
  void replay();
  const GraphNodeCounts& nodes() const { return nodes_; }
  size_t kernel_nodes() const { return nodes_.kernels; }
  // The pool owner id of this graph's blocks (DevicePool::graph_cached_bytes).
  uint64_t owner() const { return owner_; }

 private:
  Graph() = default;
  void reset() noexcept;

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<DevicePool> pool_;
  uint64_t owner_ = 0;
  GraphNodeCounts nodes_;
};

// Counts the nodes of `graph` by type, descending into child-graph nodes.
GraphNodeCounts count_graph_nodes(cudaGraph_t graph);

}  // namespace k3::backends::cuda
