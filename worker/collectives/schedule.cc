#include "worker/collectives/schedule.h"

#include <algorithm>

#include "common/status_macros.h"

namespace gradmesh::collectives {
namespace {

int Mod(int a, int p) { return ((a % p) + p) % p; }

}  // namespace

int CeilLog2(int p) {
  GM_CHECK(p >= 1) << p;
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

bool IsPowerOfTwo(int p) { return p >= 1 && (p & (p - 1)) == 0; }

sparse::IndexRange BlockRange(uint64_t n, int parts, int b) {
  GM_CHECK(parts >= 1 && b >= 0 && b < parts) << parts << " " << b;
  const auto bound = [&](uint64_t i) {
    // n < 2^32 and parts <= 2^31, so the product fits in 64 bits.
    return i * n / static_cast<uint64_t>(parts);
  };
  return {bound(b), bound(b + 1)};
}

uint64_t BlockQuota(uint64_t k, int parts, int b, uint64_t block_size) {
  GM_CHECK(parts >= 1 && b >= 0 && b < parts) << parts << " " << b;
  const uint64_t p = static_cast<uint64_t>(parts);
  const uint64_t quota = k / p + (static_cast<uint64_t>(b) < k % p ? 1 : 0);
  return std::min(quota, block_size);
}

std::vector<Step> PlanSparReduceScatter(int p, int w) {
  GM_CHECK(p >= 1 && w >= 0 && w < p) << p << " " << w;
  const int l = CeilLog2(p);
  std::vector<Step> steps;
  for (int i = 1; i <= l; ++i) {
    const int distance = 1 << (l - i);
    // Bag B_(l-i+1) starts `distance` blocks after w; the last bag (step 1)
    // holds only the E = p - 2^(l-1) blocks that are left.
    const int count = (i == 1) ? p - (1 << (l - 1)) : distance;
    Step step;
    step.send_to = Mod(w + distance, p);
    step.recv_from = Mod(w - distance, p);
    step.send = {Mod(w + distance, p), count};
    step.recv = {w, count};
    steps.push_back(step);
  }
  return steps;
}

std::vector<Step> PlanBruckAllGather(int p, int w) {
  GM_CHECK(p >= 1 && w >= 0 && w < p) << p << " " << w;
  std::vector<Step> steps;
  for (int s = 0; (1 << s) < p; ++s) {
    const int distance = 1 << s;
    const int count = std::min(distance, p - distance);
    Step step;
    step.send_to = Mod(w - distance, p);
    step.recv_from = Mod(w + distance, p);
    step.send = {w, count};
    step.recv = {Mod(w + distance, p), count};
    steps.push_back(step);
  }
  return steps;
}

std::vector<int> PlanRecursiveDoubling(int p, int g) {
  GM_CHECK(IsPowerOfTwo(p) && g >= 0 && g < p) << p << " " << g;
  std::vector<int> partners;
  for (int t = 0; (1 << t) < p; ++t) partners.push_back(g ^ (1 << t));
  return partners;
}

}  // namespace gradmesh::collectives
