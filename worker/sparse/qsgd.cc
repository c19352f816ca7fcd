#include "worker/sparse/qsgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradmesh::sparse {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int Levels(int bits) { return (1 << (bits - 1)) - 1; }

size_t PackedBytes(size_t count, int bits) { return (count * bits + 7) / 8; }

}  // namespace

bool IsQsgdBits(int bits) { return bits == 2 || bits == 4 || bits == 8; }

size_t QsgdBytes(size_t count, int bits) {
  size_t total = 0;
  for (size_t begin = 0; begin < count; begin += kQsgdBucket) {
    total +=
        sizeof(float) + PackedBytes(std::min(kQsgdBucket, count - begin), bits);
  }
  return total;
}

void EncodeQsgd(absl::Span<const float> values, int bits, uint64_t seed,
                std::string* out, absl::Span<float> decoded) {
  GM_CHECK(IsQsgdBits(bits) && decoded.size() == values.size());
  const int s = Levels(bits);
  const uint32_t mask = (1u << bits) - 1;
  for (size_t begin = 0, bucket = 0; begin < values.size();
       begin += kQsgdBucket, ++bucket) {
    const size_t len = std::min(kQsgdBucket, values.size() - begin);
    float scale = 0;
    for (size_t i = 0; i < len; ++i) {
      scale = std::max(scale, std::fabs(values[begin + i]));
    }
    GM_CHECK(std::isfinite(scale)) << "EncodeQsgd needs finite values";
    char scale_bytes[sizeof(float)];
    std::memcpy(scale_bytes, &scale, sizeof(float));
    out->append(scale_bytes, sizeof(float));
    std::string packed(PackedBytes(len, bits), '\0');
    uint64_t state = seed ^ (bucket * 0xd1b54a32d192ed03ULL);
    for (size_t i = 0; i < len; ++i) {
      int level = 0;
      if (scale > 0) {
        const double y = std::fabs(values[begin + i]) / scale * s;
        const double floor_y = std::floor(y);
        const double u =
            static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
        level = static_cast<int>(floor_y) + (u < y - floor_y ? 1 : 0);
        level = std::min(level, s);
        if (values[begin + i] < 0) level = -level;
      }
      decoded[begin + i] =
          scale > 0 ? static_cast<float>(level) * scale / static_cast<float>(s)
                    : 0.0f;
      const size_t bit = i * bits;
      packed[bit / 8] |=
          static_cast<char>((static_cast<uint32_t>(level) & mask) << (bit % 8));
    }
    out->append(packed);
  }
}

absl::Status DecodeQsgd(absl::string_view bytes, int bits,
                        absl::Span<float> out) {
  if (!IsQsgdBits(bits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported quantization width ", bits));
  }
  if (bytes.size() != QsgdBytes(out.size(), bits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized message of ", bytes.size(), " bytes; ",
                     out.size(), " values need ", QsgdBytes(out.size(), bits)));
  }
  const int s = Levels(bits);
  const uint32_t mask = (1u << bits) - 1;
  const uint32_t sign = 1u << (bits - 1);
  size_t at = 0;
  for (size_t begin = 0; begin < out.size(); begin += kQsgdBucket) {
    const size_t len = std::min(kQsgdBucket, out.size() - begin);
    float scale;
    std::memcpy(&scale, bytes.data() + at, sizeof(float));
    at += sizeof(float);
    if (!std::isfinite(scale) || scale < 0) {
      return absl::InvalidArgumentError("quantization scale is not finite");
    }
    for (size_t i = 0; i < len; ++i) {
      const size_t bit = i * bits;
      uint32_t raw =
          (static_cast<unsigned char>(bytes[at + bit / 8]) >> (bit % 8)) & mask;
      const int level = (raw & sign) ? static_cast<int>(raw) - (1 << bits)
                                     : static_cast<int>(raw);
      if (level < -s) {
        return absl::InvalidArgumentError("quantized level out of range");
      }
      out[begin + i] =
          scale > 0 ? static_cast<float>(level) * scale / static_cast<float>(s)
                    : 0.0f;
    }
    at += PackedBytes(len, bits);
  }
  return absl::OkStatus();
}

}  // namespace gradmesh::sparse
