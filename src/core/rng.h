// core/rng.h: a deterministic, platform-independent random generator for weights and tests.
//
// std::normal_distribution is implementation-defined, so checkpoints and golden files
// would differ across standard libraries; this one is specified here bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

namespace k3::core {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed ^ 0x9e3779b97f4a7c15ull) {}
  // Independent stream for a named sub-object (e.g. hash of a tensor name).
  Rng fork(uint64_t salt) const { return Rng(mix(state_ ^ mix(salt))); }

  uint64_t next_u64() {  // splitmix64
    state_ += 0x9e3779b97f4a7c15ull;
    return mix(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal by Box-Muller (one value per call, no caching: simpler to reproduce).
  double normal() {
    double u1 = uniform();
    const double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double normal(double mean, double std) { return mean + std * normal(); }

  static uint64_t hash(const char* s) {  // FNV-1a, for fork() salts from names
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
    return h;
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace k3::core
