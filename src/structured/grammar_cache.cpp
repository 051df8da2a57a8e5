#include "structured/grammar_cache.h"

#include <chrono>

#include "core/error.h"
#include "structured/ebnf.h"

namespace k3::structured {

namespace {
constexpr size_t kMaxGrammarText = 4 << 20;
}

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity)
    : vocabulary_(std::move(vocabulary)), capacity_(capacity) {
  K3_CHECK(vocabulary_ != nullptr && capacity_ > 0, "GrammarCache: needs a vocabulary and a capacity");
}

GrammarCache::~GrammarCache() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (warmer_.joinable()) warmer_.join();
}

void GrammarCache::warm_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !to_warm_.empty(); });
    if (stop_) return;
    const std::shared_ptr<const CompiledGrammar> g = to_warm_.front().lock();
    to_warm_.pop_front();
    if (!g) continue;
    int64_t held = 0;
    for (const auto& [key, entry] : entries_) held += entry.grammar->cached_bytes();
    if (held >= kMaxWarmBytes) {
      ++stats_.unwarmed_grammars;
      cv_.notify_all();
      continue;
    }
    warming_ = true;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    size_t chains = 0;
    try {
      chains = g->warm(stop_);
    } catch (const std::exception&) {
      // A walk that failed fails again, with its error, for the request that reaches its chain.
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    warming_ = false;
    ++stats_.warmed_grammars;
    stats_.warmed_chains += static_cast<int64_t>(chains);
    stats_.warm_seconds += s;
    cv_.notify_all();
  }
}

bool GrammarCache::wait_warm(double max_seconds) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(max_seconds), [&] { return to_warm_.empty() && !warming_; });
}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& text, const std::string& root) {
  const std::string key = root + "\n" + text;
  {
    std::lock_guard lock(mu_);
    if (auto at = entries_.find(key); at != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, at->second.at);
      ++stats_.hits;
      return at->second.grammar;
    }
  }
  if (text.size() > kMaxGrammarText)
    throw core::Error("grammar: the grammar text is " + std::to_string(text.size()) + " bytes, more than " +
                      std::to_string(kMaxGrammarText));
  const auto t0 = std::chrono::steady_clock::now();
  auto resolver = [v = vocabulary_](std::string_view name) { return v->special(name); };
  auto compiled = std::make_shared<const CompiledGrammar>(parse_ebnf(text, resolver, root), vocabulary_);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lock(mu_);
  ++stats_.misses;
  stats_.compile_seconds += s;
  if (auto at = entries_.find(key); at != entries_.end()) return at->second.grammar;  // compiled meanwhile
  lru_.push_front(key);
  entries_.emplace(key, Entry{compiled, lru_.begin()});
  to_warm_.push_back(compiled);
  if (!warmer_.joinable()) warmer_ = std::thread([this] { warm_loop(); });
  cv_.notify_all();
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return compiled;
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace k3::structured
