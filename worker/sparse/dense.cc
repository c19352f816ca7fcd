#include "worker/sparse/dense.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradmesh::sparse {

static_assert(std::endian::native == std::endian::little);

std::string EncodeDense(absl::Span<const float> values) {
  std::string out(values.size() * kDenseValueBytes, '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

absl::Status DecodeDense(absl::string_view bytes, absl::Span<float> out) {
  if (bytes.size() != out.size() * kDenseValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense message of ", bytes.size(), " bytes; expected ",
                     out.size(), " float32 values"));
  }
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  for (float v : out) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          "dense message holds a non-finite value");
    }
  }
  return absl::OkStatus();
}

}  // namespace gradmesh::sparse
