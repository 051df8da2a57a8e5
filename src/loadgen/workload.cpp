// loadgen/workload.cpp: deterministic workload generators and the JSONL trace reader.
#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"

namespace k3::loadgen {

namespace {

using Json = nlohmann::json;

int64_t LengthLow(const LengthDist& d) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(d.mean) * (1 - d.range_ratio))));
}
int64_t LengthHigh(const LengthDist& d) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(d.mean) * (1 + d.range_ratio))));
}

int64_t draw(core::Rng& rng, const LengthDist& d) {
  const int64_t lo = d.low(), hi = d.high();
  return lo + static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(hi - lo + 1));
}

void append_tokens(core::Rng& rng, const WorkloadSpec& spec, int64_t n, std::vector<int32_t>& out) {
  const uint64_t span = static_cast<uint64_t>(spec.token_high - spec.token_low);
  for (int64_t i = 0; i < n; ++i) out.push_back(spec.token_low + static_cast<int32_t>(rng.next_u64() % span));
}

std::vector<int32_t> tokens(core::Rng rng, const WorkloadSpec& spec, int64_t n) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  append_tokens(rng, spec, n, out);
  return out;
}

Json dist_json(const LengthDist& d) { return {{"mean", d.mean}, {"range_ratio", d.range_ratio}}; }
LengthDist dist_from(const Json& j) { return {j.at("mean").get<int64_t>(), j.at("range_ratio").get<double>()}; }

double pause(core::Rng& rng, double mean) { return mean <= 0 ? 0 : rng.uniform(0.5 * mean, 1.5 * mean); }

// An agentic session (or a sub-agent, which has no sub-agents of its own).
Session agentic_session(const WorkloadSpec& spec, int64_t id, int64_t& next_id, bool subagent) {
  core::Rng rng = core::Rng(spec.seed).fork(static_cast<uint64_t>(id) * 2 + 1);
  Session s;
  s.id = id;
  const int64_t turns = subagent ? spec.subagent_turns
                                 : spec.turns_min +
                                       static_cast<int64_t>(rng.next_u64() %
                                                            static_cast<uint64_t>(spec.turns_max - spec.turns_min + 1));
  int64_t previous_output = 0;
  for (int64_t t = 0; t < turns; ++t) {
    Turn turn;
    // The previous reply (stand-in ids of its length), then this turn's new input.
    append_tokens(rng, spec, previous_output, turn.append);
    const LengthDist& grow = subagent ? spec.subagent_increment : spec.turn_increment;
    append_tokens(rng, spec, t == 0 && !subagent ? draw(rng, spec.first_turn) : draw(rng, grow), turn.append);
    turn.output_tokens = draw(rng, spec.agent_output);
    turn.delay_before_s = t == 0 ? 0 : pause(rng, spec.pause_mean_s);
    previous_output = turn.output_tokens;
    s.turns.push_back(std::move(turn));
  }
  if (!subagent && spec.subagents > 0 && !s.turns.empty()) {
    Turn& fork_turn = s.turns[static_cast<size_t>((turns - 1) / 2)];
    for (int64_t k = 0; k < spec.subagents; ++k) {
      const int64_t sub_id = next_id++;
      fork_turn.subagents.push_back(agentic_session(spec, sub_id, next_id, true));
    }
  }
  return s;
}

}  // namespace

int64_t LengthDist::low() const { return LengthLow(*this); }
int64_t LengthDist::high() const { return LengthHigh(*this); }

Json WorkloadSpec::to_json() const {
  return {{"kind", kind},
          {"seed", seed},
          {"num_sessions", num_sessions},
          {"token_low", token_low},
          {"token_high", token_high},
          {"input", dist_json(input)},
          {"output", dist_json(output)},
          {"prefix_len", prefix_len},
          {"num_prefixes", num_prefixes},
          {"first_turn", dist_json(first_turn)},
          {"turn_increment", dist_json(turn_increment)},
          {"agent_output", dist_json(agent_output)},
          {"turns_min", turns_min},
          {"turns_max", turns_max},
          {"pause_mean_s", pause_mean_s},
          {"subagents", subagents},
          {"subagent_turns", subagent_turns},
          {"subagent_increment", dist_json(subagent_increment)},
          {"trace_path", trace_path},
          {"trace_block_size", trace_block_size},
          {"trace_time_scale", trace_time_scale}};
}

WorkloadSpec WorkloadSpec::from_json(const Json& j) {
  WorkloadSpec s;
  s.kind = j.at("kind").get<std::string>();
  s.seed = j.at("seed").get<uint64_t>();
  s.num_sessions = j.at("num_sessions").get<int64_t>();
  s.token_low = j.at("token_low").get<int32_t>();
  s.token_high = j.at("token_high").get<int32_t>();
  s.input = dist_from(j.at("input"));
  s.output = dist_from(j.at("output"));
  s.prefix_len = j.at("prefix_len").get<int64_t>();
  s.num_prefixes = j.at("num_prefixes").get<int64_t>();
  s.first_turn = dist_from(j.at("first_turn"));
  s.turn_increment = dist_from(j.at("turn_increment"));
  s.agent_output = dist_from(j.at("agent_output"));
  s.turns_min = j.at("turns_min").get<int64_t>();
  s.turns_max = j.at("turns_max").get<int64_t>();
  s.pause_mean_s = j.at("pause_mean_s").get<double>();
  s.subagents = j.at("subagents").get<int64_t>();
  s.subagent_turns = j.at("subagent_turns").get<int64_t>();
  s.subagent_increment = dist_from(j.at("subagent_increment"));
  s.trace_path = j.at("trace_path").get<std::string>();
  s.trace_block_size = j.at("trace_block_size").get<int64_t>();
  s.trace_time_scale = j.at("trace_time_scale").get<double>();
  return s;
}

void WorkloadSpec::validate() const {
  auto need = [](bool ok, const std::string& what) { K3_CHECK(ok, "workload: " + what); };
  need(kind == "random" || kind == "shared_prefix" || kind == "agentic" || kind == "trace",
       "kind must be random, shared_prefix, agentic or trace, got '" + kind + "'");
  need(num_sessions >= 1, "num_sessions must be >= 1, got " + std::to_string(num_sessions));
  need(token_low >= 0 && token_high > token_low,
       "token id range [" + std::to_string(token_low) + ", " + std::to_string(token_high) + ") is empty");
  for (const auto& [name, d] : {std::pair<const char*, const LengthDist*>{"input", &input},
                                {"output", &output},
                                {"first_turn", &first_turn},
                                {"turn_increment", &turn_increment},
                                {"agent_output", &agent_output},
                                {"subagent_increment", &subagent_increment}}) {
    need(d->mean >= 1, std::string(name) + " length must be >= 1, got " + std::to_string(d->mean));
    need(d->range_ratio >= 0 && d->range_ratio < 1,
         std::string(name) + " range ratio must be in [0, 1), got " + std::to_string(d->range_ratio));
  }
  need(prefix_len >= 0, "prefix_len must be >= 0");
  need(num_prefixes >= 1, "num_prefixes must be >= 1");
  need(turns_min >= 1 && turns_max >= turns_min,
       "turns must satisfy 1 <= min <= max, got " + std::to_string(turns_min) + ".." + std::to_string(turns_max));
  need(pause_mean_s >= 0, "pause_mean_s must be >= 0");
  need(subagents >= 0 && subagent_turns >= 1, "subagents must be >= 0 and subagent_turns >= 1");
  if (kind == "trace") {
    need(!trace_path.empty(), "the trace kind needs a trace file (--trace FILE)");
    need(trace_block_size >= 1, "trace_block_size must be >= 1");
    need(trace_time_scale >= 0, "trace_time_scale must be >= 0");
  }
}

std::vector<Session> build_workload(const WorkloadSpec& spec) {
  spec.validate();
  std::vector<Session> out;
  if (spec.kind == "trace") {
    std::ifstream f(spec.trace_path);
    K3_CHECK(f.good(), "workload: cannot read the trace file '" + spec.trace_path + "'");
    std::stringstream text;
    text << f.rdbuf();
    return parse_trace(text.str(), spec, spec.trace_path);
  }
  const core::Rng root(spec.seed);
  if (spec.kind == "agentic") {
    int64_t next_id = spec.num_sessions;  // sub-agents are numbered after the main sessions
    for (int64_t i = 0; i < spec.num_sessions; ++i) out.push_back(agentic_session(spec, i, next_id, false));
    return out;
  }
  std::vector<std::vector<int32_t>> prefixes;
  if (spec.kind == "shared_prefix")
    for (int64_t g = 0; g < spec.num_prefixes; ++g)
      prefixes.push_back(tokens(root.fork(0x5052454649580000ull + static_cast<uint64_t>(g)), spec, spec.prefix_len));
  for (int64_t i = 0; i < spec.num_sessions; ++i) {
    core::Rng rng = root.fork(static_cast<uint64_t>(i) * 2 + 1);
    Turn turn;
    if (!prefixes.empty()) turn.append = prefixes[static_cast<size_t>(i % spec.num_prefixes)];
    append_tokens(rng, spec, draw(rng, spec.input), turn.append);
    turn.output_tokens = draw(rng, spec.output);
    Session s;
    s.id = i;
    s.turns.push_back(std::move(turn));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Session> parse_trace(const std::string& text, const WorkloadSpec& spec, const std::string& source) {
  std::vector<Session> sessions;
  std::map<std::string, size_t> by_id;  // session_id -> index in sessions
  const core::Rng root(spec.seed);
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = source + " line " + std::to_string(line_no);
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::parse_error& e) {
      throw core::Error("trace " + where + ": not valid JSON (" + e.what() + ")");
    }
    K3_CHECK(j.is_object(), "trace " + where + ": expected a JSON object, got " + std::string(j.type_name()));
    auto positive_int = [&](const char* field, bool required) -> int64_t {
      if (!j.contains(field)) {
        K3_CHECK(!required, "trace " + where + ": field '" + field + "' is missing");
        return 0;
      }
      const Json& v = j[field];
      K3_CHECK(v.is_number_integer() && v.get<int64_t>() > 0,
               "trace " + where + ": field '" + field + "' must be a positive integer, got " + v.dump());
      return v.get<int64_t>();
    };
    auto seconds = [&](const char* field, double scale) -> double {
      if (!j.contains(field)) return -1;
      const Json& v = j[field];
      K3_CHECK(v.is_number() && v.get<double>() >= 0,
               "trace " + where + ": field '" + field + "' must be a number >= 0, got " + v.dump());
      return v.get<double>() * scale;
    };
    const int64_t input_length = positive_int("input_length", true);
    const int64_t output_length = positive_int("output_length", true);
    std::string sid = "#line" + std::to_string(line_no);
    if (j.contains("session_id")) {
      const Json& v = j["session_id"];
      K3_CHECK(v.is_string() || v.is_number_integer(),
               "trace " + where + ": field 'session_id' must be a string or an integer, got " + v.dump());
      sid = v.is_string() ? v.get<std::string>() : std::to_string(v.get<int64_t>());
    }
    Turn turn;
    turn.reset_context = true;
    turn.output_tokens = output_length;
    if (j.contains("hash_ids")) {
      const Json& ids = j["hash_ids"];
      K3_CHECK(ids.is_array(), "trace " + where + ": field 'hash_ids' must be an array of integers, got " + ids.dump());
      for (size_t k = 0; k < ids.size(); ++k)
        K3_CHECK(ids[k].is_number_integer(), "trace " + where + ": field 'hash_ids[" + std::to_string(k) +
                                                 "]' must be an integer, got " + ids[k].dump());
      for (size_t k = 0; k < ids.size() && static_cast<int64_t>(turn.append.size()) < input_length; ++k) {
        const std::vector<int32_t> block = tokens(
            root.fork(0x484153480000ull ^ static_cast<uint64_t>(ids[k].get<int64_t>()) * 0x9e3779b1ull), spec,
            spec.trace_block_size);
        turn.append.insert(turn.append.end(), block.begin(), block.end());
      }
    }
    if (static_cast<int64_t>(turn.append.size()) > input_length) turn.append.resize(static_cast<size_t>(input_length));
    core::Rng own = root.fork(0x4c494e4500000000ull + static_cast<uint64_t>(line_no));
    append_tokens(own, spec, input_length - static_cast<int64_t>(turn.append.size()), turn.append);
    double ts = seconds("timestamp", spec.trace_time_scale);
    if (ts < 0) {
      const double ms = seconds("timestamp_ms", spec.trace_time_scale);
      if (ms >= 0) ts = ms / 1000;
    }
    const double delay = seconds("delay", spec.trace_time_scale);
    auto it = by_id.find(sid);
    if (it == by_id.end()) {
      Session s;
      s.id = static_cast<int64_t>(sessions.size());
      s.arrival_s = ts;
      by_id.emplace(sid, sessions.size());
      sessions.push_back(std::move(s));
      it = by_id.find(sid);
    } else {
      turn.delay_before_s = std::max(0.0, delay);
    }
    sessions[it->second].turns.push_back(std::move(turn));
  }
  K3_CHECK(!sessions.empty(), "trace " + source + ": no requests in the file");
  // Sessions without timestamps start when the runner decides (-1); with them, relative to the first.
  double t0 = -1;
  for (const Session& s : sessions)
    if (s.arrival_s >= 0) t0 = t0 < 0 ? s.arrival_s : std::min(t0, s.arrival_s);
  if (t0 > 0)
    for (Session& s : sessions)
      if (s.arrival_s >= 0) s.arrival_s -= t0;
  return sessions;
}

int64_t count_requests(const std::vector<Session>& sessions) {
  int64_t n = 0;
  for (const Session& s : sessions) {
    n += static_cast<int64_t>(s.turns.size());
    for (const Turn& t : s.turns) n += count_requests(t.subagents);
  }
  return n;
}

}  // namespace k3::loadgen
