#include "worker/sparse/dense.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradmesh::sparse {

static_assert(std::endian::native == std::endian::little);

namespace {

absl::Status CheckLength(absl::string_view bytes, size_t values) {
  if (bytes.size() == values * kDenseValueBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("dense message of ", bytes.size(), " bytes; expected ",
                   values, " float32 values"));
}

absl::Status NonFinite() {
  return absl::InvalidArgumentError("dense message holds a non-finite value");
}

}  // namespace

std::string EncodeDense(absl::Span<const float> values) {
  if (values.empty()) return {};
  // One copy, no zero fill first.
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * kDenseValueBytes);
}

absl::Status DecodeDense(absl::string_view bytes, absl::Span<float> out) {
  if (absl::Status status = CheckLength(bytes, out.size()); !status.ok()) {
    return status;
  }
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  for (float v : out) {
    if (!std::isfinite(v)) return NonFinite();
  }
  return absl::OkStatus();
}

absl::Status AddDense(absl::string_view bytes, absl::Span<float> target) {
  if (absl::Status status = CheckLength(bytes, target.size()); !status.ok()) {
    return status;
  }
  // A float is finite when its exponent bits are not all ones.
  uint32_t non_finite = 0;
  for (size_t i = 0; i < target.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, bytes.data() + i * kDenseValueBytes, sizeof(bits));
    non_finite |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    target[i] += std::bit_cast<float>(bits);
  }
  return non_finite != 0 ? NonFinite() : absl::OkStatus();
}

}  // namespace gradmesh::sparse
