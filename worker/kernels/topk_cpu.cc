// CPU top-k by radix select on the bit patterns of |x|.
//
// For finite floats, clearing the sign bit gives a uint32 key whose order is
// the order of |x|, and zero keys are exactly the zeros (never selected).
// A key's top 11 bits are its bin (2048 bins, an eighth of an octave each).
//
//   guess   a sample of x (64 runs of 256 values) estimates the bin that
//           holds the k-th largest key, with a quarter more room than the
//           sample says; that bin's lower edge is the collection floor;
//   collect one branch-free scan over x keeps (position, key) of every key at
//           or above the floor, in index order: usually a little over k;
//   check   if fewer than k keys were collected, the guess was too high: an
//           exact histogram of x gives the true boundary bin and a second
//           scan collects from it;
//   resolve two histograms over the collected keys (16 + 15 bits) give the
//           exact k-th key T; every collected key above T is taken, and
//           the lowest-indexed ones equal to T fill the rest (ties to the
//           lower index). The output is in index order.
// So a selection usually reads x once, plus the sample. Scans split x into
// chunks over the machine's cores when x is large; chunk results are
// combined in chunk order, so the output never depends on the thread count.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/work_meter.h"
#include "worker/kernels/topk.h"

namespace gradmesh::kernels {
namespace {

constexpr int kTopShift = 20;  // bits 30..20 of the key: 2048 bins
constexpr size_t kBins = 2048;
constexpr size_t kParallelThreshold = 1 << 20;
constexpr size_t kSampleRuns = 64;
constexpr size_t kSampleRun = 256;
constexpr size_t kScanBlock = 4096;

using Histogram = std::array<uint64_t, kBins>;

uint32_t Key(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// Runs body(chunk, begin, end) over `chunks` equal parts of [0, n), on as
// many threads, and waits.
void ParallelChunks(size_t n, int chunks,
                    const std::function<void(int, size_t, size_t)>& body) {
  auto bound = [&](int c) { return n * c / chunks; };
  if (chunks == 1) {
    body(0, 0, n);
    return;
  }
  std::vector<std::thread> threads;
  for (int c = 1; c < chunks; ++c) {
    threads.emplace_back([&, c] { body(c, bound(c), bound(c + 1)); });
  }
  body(0, bound(0), bound(1));
  for (std::thread& t : threads) t.join();
}

int ChunksFor(size_t n) {
  if (n < kParallelThreshold) return 1;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 16);
}

// The bin where, counting from the top, the k-th key falls; `above` gets the
// count in higher bins. k must not exceed the histogram's total.
template <size_t kSize>
uint32_t BoundaryBin(const std::array<uint64_t, kSize>& hist, uint64_t k,
                     uint64_t* above) {
  uint64_t sum = 0;
  for (size_t b = kSize; b-- > 0;) {
    if (sum + hist[b] >= k) {
      *above = sum;
      return static_cast<uint32_t>(b);
    }
    sum += hist[b];
  }
  *above = sum;
  return 0;
}

// The collection floor, a key, from a sample: the key that a quarter more
// than the expected share of the sample reaches; 1 (every nonzero) when x is
// small or the sample says little.
uint32_t GuessFloor(absl::Span<const float> values, size_t k) {
  const size_t n = values.size();
  if (n <= 4 * kSampleRuns * kSampleRun) return 1;
  std::vector<uint32_t> sample;
  sample.reserve(kSampleRuns * kSampleRun);
  for (size_t r = 0; r < kSampleRuns; ++r) {
    const size_t begin = (n - kSampleRun) * r / (kSampleRuns - 1);
    for (size_t i = begin; i < begin + kSampleRun; ++i) {
      sample.push_back(Key(values[i]));
    }
  }
  const double expected =
      static_cast<double>(k) * sample.size() / static_cast<double>(n);
  const size_t rank = static_cast<size_t>(expected * 1.25) + 8;
  if (rank >= sample.size()) return 1;
  std::nth_element(sample.begin(), sample.begin() + rank, sample.end(),
                   std::greater<>());
  return std::max<uint32_t>(sample[rank], 1);
}

struct Candidate {
  uint32_t position;
  uint32_t key;
};

// Collects (position, key) of every key >= floor_key (>= 1, so zeros never)
// from values[begin, end), in index order. Groups of four with no such key,
// the common case, cost one vector compare (SSE2, part of x86-64).
void CollectRange(absl::Span<const float> values, size_t begin, size_t end,
                  uint32_t floor_key, std::vector<Candidate>* out) {
  std::array<Candidate, kScanBlock> block;
  size_t i = begin;
#if defined(__SSE2__)
  const __m128i mask = _mm_set1_epi32(0x7fffffff);
  const __m128i below = _mm_set1_epi32(static_cast<int>(floor_key - 1));
  while (i + 4 <= end) {
    const size_t stop = std::min(end, i + kScanBlock);
    size_t count = 0;
    for (; i + 4 <= stop; i += 4) {
      const __m128i keys = _mm_and_si128(
          _mm_castps_si128(_mm_loadu_ps(values.data() + i)), mask);
      // Keys are below 2^31, so the signed compare orders them.
      if (_mm_movemask_epi8(_mm_cmpgt_epi32(keys, below)) == 0) continue;
      for (size_t u = 0; u < 4; ++u) {
        const uint32_t key = Key(values[i + u]);
        block[count] = {static_cast<uint32_t>(i + u), key};
        count += key >= floor_key;
      }
    }
    out->insert(out->end(), block.begin(), block.begin() + count);
  }
#endif
  for (; i < end; ++i) {
    const uint32_t key = Key(values[i]);
    if (key >= floor_key) out->push_back({static_cast<uint32_t>(i), key});
  }
}

// Every key >= floor_key, in index order, scanning in parallel chunks.
std::vector<Candidate> Collect(absl::Span<const float> values,
                               uint32_t floor_key) {
  const size_t n = values.size();
  const int chunks = ChunksFor(n);
  std::vector<std::vector<Candidate>> found(chunks);
  ParallelChunks(n, chunks, [&](int c, size_t begin, size_t end) {
    CollectRange(values, begin, end, floor_key, &found[c]);
  });
  if (chunks == 1) return std::move(found[0]);
  std::vector<Candidate> all;
  size_t total = 0;
  for (const auto& part : found) total += part.size();
  all.reserve(total);
  for (const auto& part : found)
    all.insert(all.end(), part.begin(), part.end());
  return all;
}

// The exact bin histogram of the nonzero keys of x (the fallback).
Histogram ExactHistogram(absl::Span<const float> values) {
  const size_t n = values.size();
  const int chunks = ChunksFor(n);
  std::vector<Histogram> partial(chunks);
  ParallelChunks(n, chunks, [&](int c, size_t begin, size_t end) {
    Histogram& h = partial[c];
    h.fill(0);
    for (size_t i = begin; i < end; ++i) {
      const uint32_t key = Key(values[i]);
      h[key >> kTopShift] += key != 0;
    }
  });
  Histogram hist = partial[0];
  for (int c = 1; c < chunks; ++c) {
    for (size_t b = 0; b < kBins; ++b) hist[b] += partial[c][b];
  }
  return hist;
}

// Positions of the top-k nonzero |values|, ascending.
std::vector<uint32_t> SelectPositions(absl::Span<const float> values,
                                      size_t k) {
  CountSelected(values.size());
  std::vector<uint32_t> selected;
  if (k == 0 || values.empty()) return selected;
  const uint32_t floor_key = GuessFloor(values, k);
  std::vector<Candidate> pool = Collect(values, floor_key);
  if (pool.size() < k && floor_key > 1) {
    // The guess was too high: collect from the exact boundary bin.
    const Histogram hist = ExactHistogram(values);
    uint64_t nonzero = 0;
    for (uint64_t count : hist) nonzero += count;
    uint64_t above = 0;
    const uint32_t bin = nonzero <= k ? 0 : BoundaryBin(hist, k, &above);
    pool = Collect(values, std::max<uint32_t>(bin << kTopShift, 1));
  }
  if (pool.size() <= k) {
    selected.reserve(pool.size());
    for (const Candidate& c : pool) selected.push_back(c.position);
    return selected;
  }

  // Two levels over the collected keys (16 + 15 bits) give the exact k-th.
  std::vector<uint64_t> high(1 << 16, 0);
  for (const Candidate& c : pool) ++high[c.key >> 15];
  uint64_t above = 0;
  uint32_t high_bin = 0;
  for (size_t b = high.size(); b-- > 0;) {
    if (above + high[b] >= k) {
      high_bin = static_cast<uint32_t>(b);
      break;
    }
    above += high[b];
  }
  std::vector<uint64_t> low(1 << 15, 0);
  for (const Candidate& c : pool) {
    if ((c.key >> 15) == high_bin) ++low[c.key & 0x7fff];
  }
  uint32_t kth = 0;
  for (size_t b = low.size(); b-- > 0;) {
    if (above + low[b] >= k) {
      kth = (high_bin << 15) | static_cast<uint32_t>(b);
      break;
    }
    above += low[b];
  }
  uint64_t ties = k - above;

  selected.reserve(k);
  for (const Candidate& c : pool) {
    if (c.key > kth) {
      selected.push_back(c.position);
    } else if (c.key == kth && ties > 0) {
      selected.push_back(c.position);
      --ties;
    }
  }
  return selected;
}

class CpuSelector final : public TopKSelector {
 public:
  std::vector<uint32_t> Positions(absl::Span<const float> x,
                                  size_t k) const override {
    return SelectPositions(x, k);
  }
};

}  // namespace

const TopKSelector& CpuTopK() {
  static const CpuSelector* const kCpu = new CpuSelector();
  return *kCpu;
}

sparse::SparseBlock TopKSelector::TopKAbs(absl::Span<const float> x, size_t k,
                                          uint32_t base_index) const {
  const std::vector<uint32_t> positions = Positions(x, k);
  sparse::SparseBlock out;
  out.indices.resize(positions.size());
  out.values.resize(positions.size());
  for (size_t j = 0; j < positions.size(); ++j) {
    out.indices[j] = base_index + positions[j];
    out.values[j] = x[positions[j]];
  }
  return out;
}

std::vector<sparse::SparseBlock> TopKSelector::SegmentedTopKAbs(
    absl::Span<const float> x, absl::Span<const sparse::IndexRange> segments,
    absl::Span<const uint64_t> quotas, uint32_t base_index) const {
  std::vector<sparse::SparseBlock> out;
  out.reserve(segments.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    out.push_back(
        TopKAbs(x.subspan(segments[s].begin, segments[s].size()), quotas[s],
                base_index + static_cast<uint32_t>(segments[s].begin)));
  }
  return out;
}

void TopKSelector::SplitTopKAbs(const sparse::SparseBlock& block, size_t k,
                                sparse::SparseBlock* kept,
                                sparse::SparseBlock* dropped) const {
  const std::vector<uint32_t> positions = Positions(block.values, k);
  kept->clear();
  dropped->clear();
  kept->reserve(positions.size());
  dropped->reserve(block.size() - positions.size());
  size_t next = 0;
  for (size_t i = 0; i < block.size(); ++i) {
    if (next < positions.size() && positions[next] == i) {
      kept->push_back(block.indices[i], block.values[i]);
      ++next;
    } else {
      dropped->push_back(block.indices[i], block.values[i]);
    }
  }
}

float TopKSelector::KthLargestAbs(absl::Span<const float> x, size_t k) const {
  float kth = std::numeric_limits<float>::infinity();
  for (uint32_t p : Positions(x, k)) kth = std::min(kth, std::fabs(x[p]));
  return kth;
}

sparse::SparseBlock TopKAbs(absl::Span<const float> x, size_t k,
                            uint32_t base_index) {
  return CpuTopK().TopKAbs(x, k, base_index);
}

std::vector<sparse::SparseBlock> SegmentedTopKAbs(
    absl::Span<const float> x, absl::Span<const sparse::IndexRange> segments,
    absl::Span<const uint64_t> quotas, uint32_t base_index) {
  return CpuTopK().SegmentedTopKAbs(x, segments, quotas, base_index);
}

void SplitTopKAbs(const sparse::SparseBlock& block, size_t k,
                  sparse::SparseBlock* kept, sparse::SparseBlock* dropped) {
  CpuTopK().SplitTopKAbs(block, k, kept, dropped);
}

float KthLargestAbs(absl::Span<const float> x, size_t k) {
  return CpuTopK().KthLargestAbs(x, k);
}

sparse::SparseBlock SelectAbsAtLeast(absl::Span<const float> x, float threshold,
                                     uint32_t base_index) {
  CountSelected(x.size());
  sparse::SparseBlock out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0.0f && std::fabs(x[i]) >= threshold) {
      out.push_back(base_index + static_cast<uint32_t>(i), x[i]);
    }
  }
  return out;
}

}  // namespace gradmesh::kernels
