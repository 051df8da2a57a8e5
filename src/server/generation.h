// server/generation.h: the engine requests of one HTTP request (its choices: prompts x n),
// submitted together and read back through one queue, so a handler thread can serve any
// number of choices, streaming or not, and wait with a timeout (to notice a client that
// left, or a server that is draining).
//
// Events are pushed by the engine's step thread (GenerateRequest::on_event) into a queue the
// Generation shares with the callbacks, so the queue outlives the Generation: the engine may
// still deliver an abort's final event after the handler has gone. The same callback times
// each choice for /metrics (first token, gaps between tokens, end to end), hands it the
// engine's stats of each finished choice, and, when the last of a prompt's n choices has
// finished, that prompt's n and the most tokens any of its choices made. The destructor
// aborts every choice whose final event has not arrived, so no HTTP path can leak an engine
// request, its KV pages or its KDA state slot.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace k3::server {

class Generation {
 public:
  struct Event {
    int choice = 0;
    engine::TokenEvent event;
  };

  Generation(engine::Engine& engine, std::shared_ptr<Metrics> metrics);  // metrics may be null
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits the choices in order. When the engine refuses one (core::Error), aborts those
  // already in and rethrows the error. n: choices per prompt (choice c samples prompt c / n, as
  // GenerationParams::choice lays them out); 0: all the choices are one prompt's.
  void submit(std::vector<engine::GenerateRequest> choices, int n = 0);

  // Moves every queued event into `out`, waiting up to `timeout` for the first; false when
  // none came.
  bool wait(std::chrono::milliseconds timeout, std::vector<Event>& out);

  void abort(int choice);
  void abort_all();
  // Aborts a choice the server finished itself (a stop string matched): /metrics counts it as
  // finished_reason "stop", as vLLM does, not as an abort.
  void stop_early(int choice);
  // Aborts everything and records why (the server is draining); handlers report it as the
  // error of the choices that did not finish on their own.
  void shut_down(const std::string& reason);
  std::string shutdown_reason() const;

  int num_choices() const { return static_cast<int>(ids_.size()); }
  // Every choice's final event has been delivered by the engine (not necessarily taken).
  bool engine_done() const;

 private:
  struct Shared;
  engine::Engine& engine_;
  std::shared_ptr<Shared> shared_;
  std::vector<engine::RequestId> ids_;
};

}  // namespace k3::server
