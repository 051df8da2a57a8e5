// bench/op_tuner.cpp: timing every capable implementation of the calls a model makes, and the
// tuning table that follows from the times (bench/op_tuner.h).
#include "bench/op_tuner.h"

#include <algorithm>

#include "core/error.h"

namespace k3::bench {

double time_us_on(core::DeviceMemory& clock, const core::TensorView* flush, const std::function<void()>& run) {
  if (flush) clock.fill_bytes(*flush, 0);
  clock.mark();
  run();
  clock.mark();
  const std::vector<double> marks = clock.take_marks_ms();
  K3_CHECK(marks.size() == 2, "--tune: the device returned " + std::to_string(marks.size()) + " timing marks, not 2");
  return 1e3 * (marks[1] - marks[0]);
}

void OpTuningRecorder::observe(const std::string& op, const std::string& measure, int64_t size,
                               const std::vector<Candidate>& candidates) {
  for (const Candidate& c : candidates) c.run();  // warm-up: lazy module loading, plans, table uploads
  std::vector<std::vector<double>> samples(candidates.size());
  for (int r = 0; r < runs_; ++r)
    for (size_t i = 0; i < candidates.size(); ++i) samples[i].push_back(time_us_(candidates[i].run));
  Call call;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::vector<double>& us = samples[i];
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    call.us[candidates[i].name] = us[us.size() / 2];
  }
  OpCalls& calls = ops_[op];
  calls.measure = measure;
  calls.by_size[size].push_back(std::move(call));
}

std::vector<std::string> rank_implementations(const std::vector<std::map<std::string, double>>& calls,
                                              const std::vector<std::string>& stated, double margin) {
  std::vector<std::string> names;
  for (const std::string& n : stated)
    for (const auto& c : calls)
      if (c.count(n) && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  for (const auto& c : calls)
    for (const auto& [name, us] : c)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  // a before b: summed time over the calls both ran lower by more than the margin.
  const auto before = [&](const std::string& a, const std::string& b) {
    double ta = 0, tb = 0;
    for (const auto& c : calls) {
      const auto ia = c.find(a), ib = c.find(b);
      if (ia == c.end() || ib == c.end()) continue;
      ta += ia->second;
      tb += ib->second;
    }
    return ta < tb * (1 - margin);
  };
  std::vector<std::string> order;
  for (const std::string& n : names) {
    auto at = order.begin();
    while (at != order.end() && !before(n, *at)) ++at;
    order.insert(at, n);
  }
  return order;
}

nlohmann::json OpTuningRecorder::table(const std::string& gpu, const kernels::TuningTable& stated,
                                       double margin) const {
  nlohmann::json ops = nlohmann::json::object(), measured = nlohmann::json::object();
  for (const auto& [op, calls] : ops_) {
    nlohmann::json rules = nlohmann::json::array(), rows = nlohmann::json::array();
    int64_t lo = 0;
    for (const auto& [size, list] : calls.by_size) {
      std::vector<std::map<std::string, double>> times;
      std::map<std::string, double> sums;
      for (const Call& c : list) {
        times.push_back(c.us);
        for (const auto& [name, us] : c.us) sums[name] += us;
      }
      const kernels::TuningRule* rule = stated.find(op, size);
      const std::vector<std::string> order = rank_implementations(
          times, rule ? rule->order : std::vector<std::string>{}, margin);
      rows.push_back({{"size", size}, {"calls", list.size()}, {"us", sums}, {"order", order}});
      if (!rules.empty() && rules.back()["order"] == order)
        rules.back()["sizes"][1] = size;  // the same order as the size below: one rule
      else rules.push_back({{"sizes", {lo, size}}, {"order", order}});
      lo = size + 1;
    }
    ops[op] = {{"measure", calls.measure}, {"rules", rules}};
    measured[op] = rows;
  }
  return {{"gpu", gpu}, {"ops", ops}, {"measurements", measured}};
}

}  // namespace k3::bench
