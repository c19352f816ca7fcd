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

uint64_t RotatedBlockQuota(uint64_t k, int parts, int b, uint64_t block_size,
                           uint64_t round) {
  GM_CHECK(parts >= 1 && b >= 0 && b < parts) << parts << " " << b;
  const uint64_t p = static_cast<uint64_t>(parts);
  if (k >= p) return BlockQuota(k, parts, b, block_size);
  const uint64_t shift = round % p;
  const int rotated =
      static_cast<int>((static_cast<uint64_t>(b) + p - shift) % p);
  return BlockQuota(k, parts, rotated, block_size);
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

uint32_t PhaseStep(int phase, uint32_t step) {
  GM_CHECK(phase >= 0 &&
           static_cast<uint32_t>(phase) < kPartSteps / kPhaseSteps &&
           step < kPhaseSteps)
      << phase << " " << step;
  return static_cast<uint32_t>(phase) * kPhaseSteps + step;
}

std::vector<TreeStep> PlanTreeReduce(int p, int w) {
  GM_CHECK(p >= 1 && w >= 0 && w < p) << p << " " << w;
  std::vector<TreeStep> steps;
  for (int t = 0; t < CeilLog2(p); ++t) {
    const int bit = 1 << t;
    if (w % (2 * bit) == bit) {
      steps.push_back({.level = t, .peer = w - bit, .send = true});
      break;
    }
    if (w + bit < p) steps.push_back({.level = t, .peer = w + bit});
  }
  return steps;
}

std::vector<TreeStep> PlanTreeBroadcast(int p, int w) {
  GM_CHECK(p >= 1 && w >= 0 && w < p) << p << " " << w;
  std::vector<TreeStep> steps;
  for (int t = CeilLog2(p) - 1; t >= 0; --t) {
    const int bit = 1 << t;
    if (w % (2 * bit) == 0) {
      if (w + bit < p) {
        steps.push_back({.level = t, .peer = w + bit, .send = true});
      }
    } else if (w % (2 * bit) == bit) {
      steps.push_back({.level = t, .peer = w - bit});
    }
  }
  return steps;
}

namespace {

// Ring steps s = 0..p-2: send block `first_send - s`, receive the one before.
std::vector<Step> PlanRing(int p, int w, int first_send) {
  GM_CHECK(p >= 1 && w >= 0 && w < p) << p << " " << w;
  std::vector<Step> steps;
  for (int s = 0; s + 1 < p; ++s) {
    steps.push_back({.send_to = Mod(w + 1, p),
                     .recv_from = Mod(w - 1, p),
                     .send = {Mod(first_send - s, p), 1},
                     .recv = {Mod(first_send - s - 1, p), 1}});
  }
  return steps;
}

}  // namespace

std::vector<Step> PlanRingReduceScatter(int p, int w) {
  return PlanRing(p, w, w);
}

std::vector<Step> PlanRingAllGather(int p, int w) {
  return PlanRing(p, w, w + 1);
}

std::vector<Step> PlanRotation(int p, int w) {
  GM_CHECK(p >= 1 && w >= 0 && w < p) << p << " " << w;
  std::vector<Step> steps;
  for (int s = 1; s < p; ++s) {
    steps.push_back({.send_to = Mod(w + s, p),
                     .recv_from = Mod(w - s, p),
                     .send = {Mod(w + s, p), 1},
                     .recv = {w, 1}});
  }
  return steps;
}

Balance PlanBalance(const std::vector<uint64_t>& counts) {
  GM_CHECK(!counts.empty());
  Balance balance;
  balance.offsets.assign(counts.size() + 1, 0);
  uint64_t largest = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    balance.offsets[r + 1] = balance.offsets[r] + counts[r];
    largest = std::max(largest, counts[r]);
  }
  const uint64_t total = balance.total();
  balance.needed = total > 0 && largest * counts.size() > 4 * total;
  return balance;
}

PositionRange Balance::Transfer(int from, int to) const {
  GM_CHECK(offsets.size() >= 2) << "a Balance from PlanBalance";
  const uint64_t p = offsets.size() - 1;
  GM_CHECK(from >= 0 && to >= 0 &&
           static_cast<uint64_t>(std::max(from, to)) < p)
      << from << " " << to;
  const auto target = [&](uint64_t j) { return j * total() / p; };
  const uint64_t lo = std::max(offsets[from], target(to));
  const uint64_t hi = std::min(offsets[from + 1], target(to + 1));
  return {lo, std::max(lo, hi)};
}

}  // namespace gradmesh::collectives
