#include "worker/sparse/codec.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradmesh::sparse {
namespace {

static_assert(std::endian::native == std::endian::little);

constexpr size_t kRunHeaderBytes = 8;  // uint32 start + uint32 length

uint16_t FloatToHalf(float value) {
  uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  f &= 0x7fffffffu;
  uint32_t h;
  if (f >= (127u + 16u) << 23) {
    h = 0x7bff;  // saturate: at or above 2^16
  } else if (f < 113u << 23) {
    // Below 2^-14: a half subnormal, rounded by a float addition.
    const float magic =
        std::bit_cast<float>(((127u - 15u) + (23u - 10u) + 1u) << 23);
    h = std::bit_cast<uint32_t>(std::bit_cast<float>(f) + magic) -
        std::bit_cast<uint32_t>(magic);
  } else {
    const uint32_t mantissa_odd = (f >> 13) & 1u;
    f += ((15u - 127u) << 23) + 0xfffu + mantissa_odd;
    h = f >> 13;
    if (h >= 0x7c00) h = 0x7bff;  // rounded past the largest finite half
  }
  return static_cast<uint16_t>(h | sign);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::numeric_limits<float>::infinity();
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) |
                              (mantissa << 13));
}

uint16_t FloatToBfloat(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
  if ((rounded & 0x7f80u) == 0x7f80u) {
    return static_cast<uint16_t>((rounded & 0x8000u) | 0x7f7fu);  // saturate
  }
  return static_cast<uint16_t>(rounded);
}

float BfloatToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

size_t VarintBytes(uint64_t v) {
  size_t bytes = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++bytes;
  }
  return bytes;
}

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutU32(uint32_t v, std::string* out) {
  char bytes[4];
  std::memcpy(bytes, &v, 4);
  out->append(bytes, 4);
}

void PutValue(ValueType type, float v, std::string* out) {
  if (type == ValueType::kFloat32) {
    char bytes[4];
    std::memcpy(bytes, &v, 4);
    out->append(bytes, 4);
    return;
  }
  const uint16_t h =
      type == ValueType::kFloat16 ? FloatToHalf(v) : FloatToBfloat(v);
  char bytes[2];
  std::memcpy(bytes, &h, 2);
  out->append(bytes, 2);
}

// The entries that travel: nonzero after rounding, with their rounded value.
struct Entry {
  uint32_t index;
  float value;
};

std::vector<Entry> Travelling(const SparseBlock& block, ValueType type) {
  std::vector<Entry> entries;
  entries.reserve(block.size());
  for (size_t i = 0; i < block.size(); ++i) {
    const float r = RoundTo(type, block.values[i]);
    if (r != 0.0f) entries.push_back({block.indices[i], r});
  }
  return entries;
}

// Runs of `entries` under the break-even gap: [first, last] entry positions.
template <typename F>
void ForEachRun(const std::vector<Entry>& entries, ValueType type, F&& f) {
  const uint64_t max_gap = kRunHeaderBytes / ValueBytes(type);
  size_t first = 0;
  for (size_t i = 1; i <= entries.size(); ++i) {
    if (i == entries.size() ||
        uint64_t{entries[i].index} - entries[i - 1].index - 1 > max_gap) {
      if (!entries.empty()) f(first, i - 1);
      first = i;
    }
  }
}

// Bounds-checked reading of a payload.
class Reader {
 public:
  explicit Reader(absl::string_view* in) : in_(in) {}

  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in_->empty()) return Truncated();
      const uint8_t byte = static_cast<uint8_t>(in_->front());
      in_->remove_prefix(1);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    return absl::InvalidArgumentError("varint longer than 64 bits");
  }

  absl::StatusOr<uint32_t> U32() {
    if (in_->size() < 4) return Truncated();
    uint32_t v;
    std::memcpy(&v, in_->data(), 4);
    in_->remove_prefix(4);
    return v;
  }

  absl::StatusOr<float> Value(ValueType type) {
    float v;
    if (type == ValueType::kFloat32) {
      if (in_->size() < 4) return Truncated();
      std::memcpy(&v, in_->data(), 4);
      in_->remove_prefix(4);
    } else {
      if (in_->size() < 2) return Truncated();
      uint16_t h;
      std::memcpy(&h, in_->data(), 2);
      in_->remove_prefix(2);
      v = type == ValueType::kFloat16 ? HalfToFloat(h) : BfloatToFloat(h);
    }
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError("encoded value is not finite");
    }
    return v;
  }

  absl::StatusOr<absl::string_view> Bytes(size_t n) {
    if (in_->size() < n) return Truncated();
    const absl::string_view out = in_->substr(0, n);
    in_->remove_prefix(n);
    return out;
  }

  // Fails unless at least n more bytes remain (cheap guard against huge
  // counts before any allocation).
  absl::Status Need(uint64_t n) const {
    return in_->size() < n ? Truncated() : absl::OkStatus();
  }

 private:
  static absl::Status Truncated() {
    return absl::InvalidArgumentError("encoded block is truncated");
  }
  absl::string_view* in_;
};

using Sizes = std::array<size_t, kEncodingCount>;

// The encoded size of `entries` in every encoding, in one pass.
Sizes AllSizes(const std::vector<Entry>& entries, IndexRange range,
               ValueType type) {
  const size_t k = ValueBytes(type);
  const size_t m = entries.size();
  size_t gaps = 0;
  uint64_t next = range.begin;
  for (const Entry& e : entries) {
    gaps += VarintBytes(e.index - next);
    next = uint64_t{e.index} + 1;
  }
  size_t runs = 0, run_values = 0;
  ForEachRun(entries, type, [&](size_t first, size_t last) {
    ++runs;
    run_values += entries[last].index - entries[first].index + 1;
  });
  Sizes sizes;
  sizes[static_cast<int>(Encoding::kCoo)] = 1 + VarintBytes(m) + (4 + k) * m;
  sizes[static_cast<int>(Encoding::kDeltaVarint)] =
      1 + VarintBytes(m) + gaps + k * m;
  sizes[static_cast<int>(Encoding::kRuns)] =
      1 + VarintBytes(runs) + runs * kRunHeaderBytes + run_values * k;
  sizes[static_cast<int>(Encoding::kBitmap)] =
      1 + (range.size() + 7) / 8 + k * m;
  sizes[static_cast<int>(Encoding::kDense)] = 1 + k * range.size();
  return sizes;
}

// The smallest of `sizes` (ties: the lower tag).
Encoding Smallest(const Sizes& sizes) {
  int best = 0;
  for (int e = 1; e < kEncodingCount; ++e) {
    if (sizes[e] < sizes[best]) best = e;
  }
  return static_cast<Encoding>(best);
}

void EncodeEntries(const std::vector<Entry>& entries, IndexRange range,
                   Encoding encoding, ValueType type, std::string* out) {
  out->push_back(static_cast<char>(static_cast<uint8_t>(encoding) |
                                   (static_cast<uint8_t>(type) << 4)));
  switch (encoding) {
    case Encoding::kCoo:
      PutVarint(entries.size(), out);
      for (const Entry& e : entries) PutU32(e.index, out);
      for (const Entry& e : entries) PutValue(type, e.value, out);
      return;
    case Encoding::kDeltaVarint: {
      PutVarint(entries.size(), out);
      uint64_t next = range.begin;
      for (const Entry& e : entries) {
        PutVarint(e.index - next, out);
        next = uint64_t{e.index} + 1;
      }
      for (const Entry& e : entries) PutValue(type, e.value, out);
      return;
    }
    case Encoding::kRuns: {
      std::vector<std::pair<size_t, size_t>> runs;
      ForEachRun(entries, type, [&](size_t first, size_t last) {
        runs.emplace_back(first, last);
      });
      PutVarint(runs.size(), out);
      for (const auto& [first, last] : runs) {
        PutU32(entries[first].index, out);
        PutU32(entries[last].index - entries[first].index + 1, out);
        size_t e = first;
        for (uint32_t i = entries[first].index; i <= entries[last].index; ++i) {
          const bool present = entries[e].index == i;
          PutValue(type, present ? entries[e].value : 0.0f, out);
          e += present;
        }
      }
      return;
    }
    case Encoding::kBitmap: {
      std::string bits((range.size() + 7) / 8, '\0');
      for (const Entry& e : entries) {
        const uint64_t bit = e.index - range.begin;
        bits[bit / 8] |= static_cast<char>(1u << (bit % 8));
      }
      out->append(bits);
      for (const Entry& e : entries) PutValue(type, e.value, out);
      return;
    }
    case Encoding::kDense: {
      size_t e = 0;
      for (uint64_t i = range.begin; i < range.end; ++i) {
        const bool present = e < entries.size() && entries[e].index == i;
        PutValue(type, present ? entries[e].value : 0.0f, out);
        e += present;
      }
      return;
    }
  }
  GM_CHECK(false) << "unknown encoding";
}

}  // namespace

size_t ValueBytes(ValueType type) {
  return type == ValueType::kFloat32 ? 4 : 2;
}

float RoundTo(ValueType type, float value) {
  switch (type) {
    case ValueType::kFloat32:
      return value;
    case ValueType::kFloat16:
      return HalfToFloat(FloatToHalf(value));
    case ValueType::kBfloat16:
      return BfloatToFloat(FloatToBfloat(value));
  }
  return value;
}

size_t EncodedSize(const SparseBlock& block, IndexRange range,
                   Encoding encoding, ValueType type) {
  return AllSizes(Travelling(block, type), range,
                  type)[static_cast<int>(encoding)];
}

Encoding SmallestEncoding(const SparseBlock& block, IndexRange range,
                          ValueType type) {
  return Smallest(AllSizes(Travelling(block, type), range, type));
}

Encoding EncodeSmallest(const SparseBlock& block, IndexRange range,
                        ValueType type, std::string* out) {
  const std::vector<Entry> entries = Travelling(block, type);
  const Encoding best = Smallest(AllSizes(entries, range, type));
  EncodeEntries(entries, range, best, type, out);
  return best;
}

void EncodeBlock(const SparseBlock& block, IndexRange range, Encoding encoding,
                 ValueType type, std::string* out) {
  EncodeEntries(Travelling(block, type), range, encoding, type, out);
}

namespace {

// Appends (index, value) to `block` unless the value is zero;
// InvalidArgument for an index outside `range` or not after the last.
absl::Status Append(IndexRange range, uint64_t index, float value,
                    SparseBlock* block) {
  if (!range.Contains(index) ||
      (!block->empty() && index <= block->indices.back())) {
    return absl::InvalidArgumentError(
        absl::StrCat("encoded index ", index, " out of order or outside [",
                     range.begin, ", ", range.end, ")"));
  }
  if (value != 0.0f) block->push_back(static_cast<uint32_t>(index), value);
  return absl::OkStatus();
}

// COO (uint32 indices) or delta-varint indices, then the values.
absl::StatusOr<SparseBlock> DecodeListed(Reader& reader, IndexRange range,
                                         ValueType type, bool delta) {
  GM_ASSIGN_OR_RETURN(const uint64_t count, reader.Varint());
  if (count > range.size()) {
    return absl::InvalidArgumentError("more entries than the range holds");
  }
  GM_RETURN_IF_ERROR(reader.Need(count * (ValueBytes(type) + 1)));
  std::vector<uint64_t> indices(count);
  uint64_t next = range.begin;
  for (uint64_t& index : indices) {
    if (!delta) {
      GM_ASSIGN_OR_RETURN(index, reader.U32());
    } else {
      GM_ASSIGN_OR_RETURN(const uint64_t gap, reader.Varint());
      if (gap > range.end - next) {
        return absl::InvalidArgumentError("index gap past the range");
      }
      index = next + gap;
      next = index + 1;
    }
  }
  SparseBlock block;
  for (uint64_t index : indices) {
    GM_ASSIGN_OR_RETURN(const float value, reader.Value(type));
    GM_RETURN_IF_ERROR(Append(range, index, value, &block));
  }
  return block;
}

absl::StatusOr<SparseBlock> DecodeRuns(Reader& reader, IndexRange range,
                                       ValueType type) {
  GM_ASSIGN_OR_RETURN(const uint64_t runs, reader.Varint());
  if (runs > range.size()) {
    return absl::InvalidArgumentError("more runs than the range holds");
  }
  SparseBlock block;
  for (uint64_t r = 0; r < runs; ++r) {
    GM_ASSIGN_OR_RETURN(const uint32_t start, reader.U32());
    GM_ASSIGN_OR_RETURN(const uint32_t length, reader.U32());
    if (start < range.begin || length == 0 ||
        uint64_t{start} + length > range.end) {
      return absl::InvalidArgumentError("run past the range");
    }
    GM_RETURN_IF_ERROR(reader.Need(uint64_t{length} * ValueBytes(type)));
    if (!block.empty() && start <= block.indices.back()) {
      return absl::InvalidArgumentError("runs out of order");
    }
    for (uint32_t i = 0; i < length; ++i) {
      GM_ASSIGN_OR_RETURN(const float value, reader.Value(type));
      if (value != 0.0f) block.push_back(start + i, value);
    }
  }
  return block;
}

absl::StatusOr<SparseBlock> DecodeBitmap(Reader& reader, IndexRange range,
                                         ValueType type) {
  GM_ASSIGN_OR_RETURN(const absl::string_view bits,
                      reader.Bytes((range.size() + 7) / 8));
  SparseBlock block;
  for (uint64_t bit = 0; bit < bits.size() * 8; ++bit) {
    if ((static_cast<uint8_t>(bits[bit / 8]) >> (bit % 8) & 1) == 0) {
      continue;
    }
    if (bit >= range.size()) {
      return absl::InvalidArgumentError("bitmap padding bits are set");
    }
    GM_ASSIGN_OR_RETURN(const float value, reader.Value(type));
    GM_RETURN_IF_ERROR(Append(range, range.begin + bit, value, &block));
  }
  return block;
}

absl::StatusOr<SparseBlock> DecodeDense(Reader& reader, IndexRange range,
                                        ValueType type) {
  GM_RETURN_IF_ERROR(reader.Need(range.size() * ValueBytes(type)));
  SparseBlock block;
  for (uint64_t i = range.begin; i < range.end; ++i) {
    GM_ASSIGN_OR_RETURN(const float value, reader.Value(type));
    GM_RETURN_IF_ERROR(Append(range, i, value, &block));
  }
  return block;
}

}  // namespace

absl::StatusOr<SparseBlock> DecodeBlock(absl::string_view* in,
                                        IndexRange range) {
  if (in->empty()) return absl::InvalidArgumentError("missing block tag");
  const uint8_t tag = static_cast<uint8_t>(in->front());
  in->remove_prefix(1);
  const uint8_t encoding = tag & 0x0f;
  const uint8_t type_bits = tag >> 4;
  if (encoding >= kEncodingCount || type_bits > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad block tag 0x", absl::Hex(tag)));
  }
  const ValueType type = static_cast<ValueType>(type_bits);
  Reader reader(in);
  switch (static_cast<Encoding>(encoding)) {
    case Encoding::kCoo:
      return DecodeListed(reader, range, type, /*delta=*/false);
    case Encoding::kDeltaVarint:
      return DecodeListed(reader, range, type, /*delta=*/true);
    case Encoding::kRuns:
      return DecodeRuns(reader, range, type);
    case Encoding::kBitmap:
      return DecodeBitmap(reader, range, type);
    case Encoding::kDense:
      return DecodeDense(reader, range, type);
  }
  return absl::InvalidArgumentError("bad block tag");
}

}  // namespace gradmesh::sparse
