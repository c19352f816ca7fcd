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

// The same idea for large buffers, about 15x faster than Fnv1a at -O3: four
// lanes of xor-multiply over 8-byte words in the machine's byte order
// (independent multiply chains, which the CPU overlaps), each folded with a
// shift so that high bits reach low ones, the tail byte-wise, the length
// mixed in. The same in every process on machines of one byte order (every
// one gradmesh runs on is little-endian); not equal to Fnv1a of the same
// bytes.
inline uint64_t Fnv1aWords(absl::string_view bytes,
                           uint64_t hash = kFnv1aBasis) {
  constexpr uint64_t kPrime = 1099511628211u;
  uint64_t lanes[4] = {hash, hash + 1, hash + 2, hash + 3};
  const char* data = bytes.data();
  size_t i = 0;
  for (; i + sizeof(lanes) <= bytes.size(); i += sizeof(lanes)) {
    for (int l = 0; l < 4; ++l) {
      uint64_t word;
      std::memcpy(&word, data + i + l * sizeof(word), sizeof(word));
      lanes[l] = (lanes[l] ^ word) * kPrime;
      lanes[l] ^= lanes[l] >> 29;
    }
  }
  for (uint64_t lane : lanes) hash = (hash ^ lane) * kPrime;
  hash = (hash ^ bytes.size()) * kPrime;
  bytes.remove_prefix(i);
  return Fnv1a(bytes, hash);
}

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_FNV1A_H_
