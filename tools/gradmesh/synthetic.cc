#include "tools/gradmesh/synthetic.h"

#include <cmath>
#include <numbers>

namespace gradmesh::tools {
namespace {

constexpr uint64_t kLayerSize = 1 << 16;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in (0, 1].
double Uniform(uint64_t& state) {
  return (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * 0x1.0p-53;
}

double Normal(uint64_t& state) {
  const double u = Uniform(state);
  const double v = Uniform(state);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
}

}  // namespace

void SyntheticGradient(uint64_t seed, int rank, uint64_t iteration,
                       absl::Span<float> out) {
  uint64_t state = seed * 0x632be59bd9b4e019ULL ^
                   (static_cast<uint64_t>(rank) << 40) ^ (iteration << 8);
  SplitMix64(state);
  // Layer scales depend on the seed only, as real layers keep their scale.
  uint64_t layer_state = seed ^ 0x5851f42d4c957f2dULL;
  double scale = 1.0;
  for (uint64_t i = 0; i < out.size(); ++i) {
    if (i % kLayerSize == 0) scale = std::exp(Normal(layer_state));
    out[i] = static_cast<float>(1e-3 * scale * Normal(state));
  }
}

}  // namespace gradmesh::tools
