// FNV-1a, 64-bit: a hash that is the same in every process and on every
// machine (absl::Hash is seeded per process), for digests that processes
// compare. Not for security.
#ifndef GRADMESH_COMMON_FNV1A_H_
#define GRADMESH_COMMON_FNV1A_H_

#include <cstdint>

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

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_FNV1A_H_
