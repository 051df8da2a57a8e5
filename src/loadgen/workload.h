// loadgen/workload.h: what a benchmark sends: sessions of turns with exact token-id prompts,
// generated deterministically from a seed (or read from a JSONL trace).
//
// Kinds:
//   random         one turn per session; input and output lengths uniform in
//                  [len * (1 - range_ratio), len * (1 + range_ratio)] (vLLM's random dataset)
//   shared_prefix  one turn per session; num_prefixes shared prefixes of prefix_len tokens,
//                  session i uses prefix i % num_prefixes, then its own random input
//   agentic        multi-turn sessions: a long first turn, then each turn re-sends the whole
//                  context plus the previous reply plus turn_increment new tokens (tool results,
//                  user text), after a pause (the tool call); optionally sub-agent sessions that
//                  fork from the parent's context and run in parallel while the parent waits
//   trace          replay of a JSONL trace (see parse_trace)
//
// The previous reply is re-sent as stand-in token ids of the same length (the server does not
// return generated ids), so every prompt length is exact and the server's prefix cache sees the
// earlier prompt as a shared prefix; the reply's own tokens differ from what was generated.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::loadgen {

// A token count drawn uniformly from [mean * (1 - range_ratio), mean * (1 + range_ratio)], >= 1.
struct LengthDist {
  int64_t mean = 1;
  double range_ratio = 0;
  int64_t low() const;
  int64_t high() const;
};

struct WorkloadSpec {
  std::string kind = "random";  // random | shared_prefix | agentic | trace
  uint64_t seed = 0;
  int64_t num_sessions = 16;
  // Prompt token ids are drawn from [token_low, token_high): ordinary ids (K3 and k3-tiny keep
  // their 256 special tokens at the top of the vocabulary).
  int32_t token_low = 0, token_high = 768;
  // random and shared_prefix
  LengthDist input{256, 0}, output{64, 0};
  int64_t prefix_len = 128, num_prefixes = 1;
  // agentic (defaults: a long agentic session: a large first turn, then many shorter turns)
  LengthDist first_turn{50000, 0.1}, turn_increment{800, 0.25}, agent_output{500, 0};
  int64_t turns_min = 10, turns_max = 15;
  double pause_mean_s = 1.0;  // pause before each later turn: uniform in [0.5, 1.5] x mean
  int64_t subagents = 0;      // sub-agent sessions each session forks (after its middle turn)
  int64_t subagent_turns = 2;
  LengthDist subagent_increment{400, 0.25};
  // trace
  std::string trace_path;
  int64_t trace_block_size = 512;  // tokens per hash id
  double trace_time_scale = 1.0;   // multiplies trace timestamps and delays

  nlohmann::json to_json() const;
  static WorkloadSpec from_json(const nlohmann::json& j);
  // Throws core::Error naming the first bad field.
  void validate() const;
};

struct Session;

struct Turn {
  std::vector<int32_t> append;     // tokens appended to the session's context before this request
  bool reset_context = false;      // the context is replaced by `append` (trace turns)
  int64_t output_tokens = 1;       // max_tokens with ignore_eos: the exact reply length
  double delay_before_s = 0;       // pause before this turn is sent (the tool call)
  std::vector<Session> subagents;  // forked after this turn's reply, from the context so far;
                                   // the next turn waits for all of them
};

struct Session {
  int64_t id = 0;
  double arrival_s = -1;  // trace: start offset in the run; -1: the runner decides
  std::vector<Turn> turns;
};

// The sessions of a workload (trace: read from spec.trace_path). Same spec, same sessions.
std::vector<Session> build_workload(const WorkloadSpec& spec);

// Trace lines (JSON objects, one per request; blank lines and lines starting with '#' skipped):
//   input_length   int > 0, required: prompt tokens
//   output_length  int > 0, required: reply tokens
//   session_id     string or int: lines with the same id are that session's turns, in file order
//                  (absent: every line is its own session)
//   hash_ids       [int]: the prompt starts with one block of trace_block_size tokens per id, the
//                  same tokens wherever the id appears (shared prefixes); the rest is unique
//   timestamp      seconds (or timestamp_ms): when the session starts (its first line's value)
//   delay          seconds before this turn (later turns of a session)
// Errors name the file, the line number and the field.
std::vector<Session> parse_trace(const std::string& text, const WorkloadSpec& spec, const std::string& source);

// Total requests of sessions (sub-agents included).
int64_t count_requests(const std::vector<Session>& sessions);

}  // namespace k3::loadgen
