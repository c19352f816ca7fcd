// FNV-1a, 64-bit: a hash that is the same in every process and on every
// machine (absl::Hash is seeded per process), for digests that processes
// compare. Not for security.
#ifndef GRADMESH_COMMON_FNV1A_H_
#define GRADMESH_COMMON_FNV1A_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace gradmesh {

inline constexpr uint64_t kFnv1aBasis = 14695981039346656037u;

// Continues `hash` over `bytes` (start from kFnv1aBasis).
inline uint64_t Fnv1a(absl::string_view bytes, uint64_t hash = kFnv1aBasis) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211u;
  }
  return hash;
}

// The same idea for large buffers, about 20x faster than Fnv1a (16 against
// 0.8 GB/s on one core of the 2-core VM, -O2): four lanes of xor-multiply over
// 8-byte words in the machine's byte order (independent multiply chains, which
// the CPU overlaps), each folded with a shift so that high bits reach low ones,
// the tail byte-wise, the length mixed in. The same in every process on
// machines of one byte order (every one gradmesh runs on is little-endian); not
// equal to Fnv1a of the same bytes.
inline uint64_t Fnv1aWords(absl::string_view bytes,
                           uint64_t hash = kFnv1aBasis) {
  constexpr uint64_t kPrime = 1099511628211u;
  auto mix = [](uint64_t lane, const char* at) {
    uint64_t word;
    std::memcpy(&word, at, sizeof(word));
    lane = (lane ^ word) * kPrime;
    return lane ^ (lane >> 29);
  };
  // Four named lanes, not an array: kept in registers (an array indexed in
  // a loop stayed in memory at -O2, 4x slower).
  uint64_t lane0 = hash, lane1 = hash + 1, lane2 = hash + 2, lane3 = hash + 3;
  const char* data = bytes.data();
  size_t i = 0;
  for (; i + 4 * sizeof(uint64_t) <= bytes.size(); i += 4 * sizeof(uint64_t)) {
    lane0 = mix(lane0, data + i);
    lane1 = mix(lane1, data + i + 8);
    lane2 = mix(lane2, data + i + 16);
    lane3 = mix(lane3, data + i + 24);
  }
  for (uint64_t lane : {lane0, lane1, lane2, lane3}) {
    hash = (hash ^ lane) * kPrime;
  }
  hash = (hash ^ bytes.size()) * kPrime;
  bytes.remove_prefix(i);
  return Fnv1a(bytes, hash);
}

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_FNV1A_H_
