// backends/cuda/graph.cpp: Graph capture, instantiation, replay and node counting.
#include "backends/cuda/graph.h"

#include <exception>
#include <string>
#include <vector>

#include "backends/cuda/check.h"

namespace k3::backends::cuda {

namespace {

constexpr const char* kCaptureHint =
    " (an operation that cannot be captured ran on the capturing thread: a synchronous copy such as "
    "cudaMemcpy or an upload from pageable host memory, cudaMalloc/cudaFree outside the pool, a stream or "
    "device synchronize, an event query; do such work before the capture)";

std::string end_capture_problem(cudaError_t err) {
  switch (err) {
    case cudaErrorStreamCaptureInvalidated:
      return std::string("the capture was invalidated") + kCaptureHint +
             ", or a call failed during the capture and its error was ignored";
    case cudaErrorStreamCaptureUnjoined:
      return "work forked onto another stream during the capture was not joined back to the capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "the capture was ended on another thread than the one that began it";
    default:
      return std::string("cudaStreamEndCapture failed: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
             ")";
  }
}

void count_into(cudaGraph_t graph, GraphNodeCounts& c) {
  size_t n = 0;
  K3_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) K3_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType type{};
    K3_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
    switch (type) {
      case cudaGraphNodeTypeKernel: ++c.kernels; break;
      case cudaGraphNodeTypeMemcpy: ++c.memcpys; break;
      case cudaGraphNodeTypeMemset: ++c.memsets; break;
      case cudaGraphNodeTypeGraph: {
        cudaGraph_t child = nullptr;
        K3_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(nodes[i], &child));
        count_into(child, c);
        break;
      }
      default: ++c.other; break;
    }
  }
}

}  // namespace

GraphNodeCounts count_graph_nodes(cudaGraph_t graph) {
  GraphNodeCounts c;
  count_into(graph, c);
  return c;
}

Graph Graph::capture(Context& ctx, const std::function<void()>& body) {
  const cudaStream_t stream = ctx.stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  K3_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  K3_CHECK(status == cudaStreamCaptureStatusNone,
           "Graph::capture: the context's stream is already capturing (nested captures are not supported)");
  Graph g;  // from here on its destructor releases whatever the pool tagged for it
  g.stream_ = stream;
  g.pool_ = ctx.pool_ptr();
  g.owner_ = g.pool_->new_graph_owner();
  g.pool_->begin_capture(g.owner_);
  if (const cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal); err != cudaSuccess) {
    (void)cudaGetLastError();
    g.pool_->end_capture();
    throw_cuda_error(err, "cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal)", __FILE__, __LINE__);
  }

  std::string body_error;
  bool body_failed = false;
  try {
    body();
  } catch (const std::exception& e) {
    body_failed = true;
    body_error = e.what();
  } catch (...) {
    body_failed = true;
    body_error = "an exception that is not a std::exception";
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  g.pool_->end_capture();
  if (body_failed || end != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // capture errors are not sticky: leave the thread's error state clean
    if (body_failed) {
      const bool violation = body_error.find("StreamCapture") != std::string::npos;
      throw core::Error("CUDA graph capture failed: the captured work threw: " + body_error +
                        (violation ? kCaptureHint : ""));
    }
    throw core::Error("CUDA graph capture failed: " + end_capture_problem(end));
  }
  g.graph_ = graph;
  g.nodes_ = count_graph_nodes(graph);
  if (const cudaError_t err = cudaGraphInstantiateWithFlags(&g.exec_, graph, 0); err != cudaSuccess) {
    (void)cudaGetLastError();
    throw core::Error(std::string("CUDA graph instantiation failed (") + std::to_string(g.nodes_.total()) +
                      " nodes): " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  // Uploads the executable now, so the first replay costs what the others cost.
  K3_CUDA_CHECK(cudaGraphUpload(g.exec_, stream));
  return g;
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    reset();
    graph_ = o.graph_;
    exec_ = o.exec_;
    stream_ = o.stream_;
    pool_ = std::move(o.pool_);
    owner_ = o.owner_;
    nodes_ = o.nodes_;
    o.graph_ = nullptr;
    o.exec_ = nullptr;
    o.stream_ = nullptr;
    o.owner_ = 0;
    o.nodes_ = {};
  }
  return *this;
}

Graph::~Graph() { reset(); }

void Graph::reset() noexcept {
  // An executable still running is freed by CUDA when it completes; the blocks go back to the pool
  // in stream order (the replays were queued on the pool's stream), so later work cannot overtake.
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  if (pool_ && owner_ != 0) pool_->release_graph(owner_);
  exec_ = nullptr;
  graph_ = nullptr;
  owner_ = 0;
  pool_.reset();
}

void Graph::replay() {
  K3_CHECK(exec_ != nullptr, "Graph::replay: this graph is empty (moved from, or its capture failed)");
  K3_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
}

}  // namespace k3::backends::cuda
