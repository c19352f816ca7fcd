#include "worker/sparse/codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::sparse {
namespace {

constexpr Encoding kEncodings[] = {Encoding::kCoo, Encoding::kDeltaVarint,
                                   Encoding::kRuns, Encoding::kBitmap,
                                   Encoding::kDense};
constexpr ValueType kTypes[] = {ValueType::kFloat32, ValueType::kFloat16,
                                ValueType::kBfloat16};

// Blocks over [begin, begin + size): random, clustered, empty, full, single.
std::vector<SparseBlock> Blocks(uint64_t begin, uint64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<SparseBlock> out(5);
  for (uint64_t i = 0; i < size; ++i) {
    if (rng() % 20 == 0) out[0].push_back(begin + i, normal(rng));
    if ((i / 7) % 5 == 0 && rng() % 4 != 0)
      out[1].push_back(begin + i, normal(rng));
    out[3].push_back(begin + i, normal(rng) + 0.5f);
  }
  out[4].push_back(begin + size / 2, -3.25f);
  return out;
}

// What a block decodes to: values rounded, zeros gone.
SparseBlock Expected(const SparseBlock& block, ValueType type) {
  SparseBlock out;
  for (size_t i = 0; i < block.size(); ++i) {
    const float r = RoundTo(type, block.values[i]);
    if (r != 0.0f) out.push_back(block.indices[i], r);
  }
  return out;
}

TEST(CodecTest, EveryEncodingRoundTripsEveryKindOfBlock) {
  const IndexRange range{1000, 1000 + 3000};
  int case_number = 0;
  for (const SparseBlock& block : Blocks(range.begin, range.size(), 3)) {
    for (Encoding encoding : kEncodings) {
      for (ValueType type : kTypes) {
        SCOPED_TRACE(absl::StrCat("case ", case_number, " encoding ",
                                  static_cast<int>(encoding), " type ",
                                  static_cast<int>(type)));
        std::string bytes = "prefix";
        EncodeBlock(block, range, encoding, type, &bytes);
        EXPECT_EQ(bytes.size() - 6, EncodedSize(block, range, encoding, type));
        bytes += "next";  // the decoder stops at the block's end
        absl::string_view in(bytes);
        in.remove_prefix(6);
        auto decoded = DecodeBlock(&in, range);
        ASSERT_TRUE(decoded.ok()) << decoded.status();
        EXPECT_EQ(*decoded, Expected(block, type));
        EXPECT_EQ(in, "next");
      }
    }
    ++case_number;
  }
}

TEST(CodecTest, AutoPicksTheSmallest) {
  const IndexRange range{0, 5000};
  for (const SparseBlock& block : Blocks(0, 5000, 8)) {
    for (ValueType type : kTypes) {
      const Encoding best = SmallestEncoding(block, range, type);
      for (Encoding e : kEncodings) {
        EXPECT_LE(EncodedSize(block, range, best, type),
                  EncodedSize(block, range, e, type));
      }
    }
  }
  // Clustered values favour runs, scattered ones delta-varint, full ones
  // dense.
  const auto blocks = Blocks(0, 5000, 9);
  EXPECT_EQ(SmallestEncoding(blocks[0], range, ValueType::kFloat32),
            Encoding::kDeltaVarint);
  EXPECT_EQ(SmallestEncoding(blocks[3], range, ValueType::kFloat32),
            Encoding::kDense);
  SparseBlock run;
  for (uint32_t i = 100; i < 400; ++i) run.push_back(i, 1.0f);
  EXPECT_EQ(SmallestEncoding(run, range, ValueType::kFloat32), Encoding::kRuns);
}

TEST(CodecTest, RunsAbsorbGapsUpToTheBreakEven) {
  const IndexRange range{0, 100};
  // Gaps of 2 zeros join a float32 run; gaps of 3 split it.
  const SparseBlock joined{{10, 13, 16}, {1, 2, 3}};
  const SparseBlock split{{10, 14, 18}, {1, 2, 3}};
  const size_t header = 1 + 1;  // tag + varint run count
  EXPECT_EQ(EncodedSize(joined, range, Encoding::kRuns, ValueType::kFloat32),
            header + 8 + 7 * 4);
  EXPECT_EQ(EncodedSize(split, range, Encoding::kRuns, ValueType::kFloat32),
            header + 3 * (8 + 4));
  // 16-bit values: gaps of up to 4 zeros join.
  EXPECT_EQ(EncodedSize(split, range, Encoding::kRuns, ValueType::kFloat16),
            header + 8 + 9 * 2);
}

TEST(CodecTest, SixteenBitValuesRoundAndSaturate) {
  EXPECT_EQ(RoundTo(ValueType::kFloat16, 1.0f), 1.0f);
  EXPECT_EQ(RoundTo(ValueType::kFloat16, 1e6f), 65504.0f);
  EXPECT_EQ(RoundTo(ValueType::kFloat16, -1e6f), -65504.0f);
  EXPECT_EQ(RoundTo(ValueType::kFloat16, 1e-9f), 0.0f);
  EXPECT_EQ(RoundTo(ValueType::kFloat16, 1.0f + 1.0f / 4096), 1.0f);  // even
  EXPECT_EQ(RoundTo(ValueType::kBfloat16, 3.4e38f),
            std::bit_cast<float>(0x7f7f0000u));
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1000, 1000);
  for (int i = 0; i < 10000; ++i) {
    const float x = u(rng);
    EXPECT_LE(std::fabs(RoundTo(ValueType::kFloat16, x) - x),
              std::fabs(x) * 0x1.0p-11f + 0x1.0p-25f);
    EXPECT_LE(std::fabs(RoundTo(ValueType::kBfloat16, x) - x),
              std::fabs(x) * 0x1.0p-8f);
  }
  // Subnormal halves.
  EXPECT_EQ(RoundTo(ValueType::kFloat16, 0x1.0p-24f), 0x1.0p-24f);
  EXPECT_EQ(RoundTo(ValueType::kFloat16, 3 * 0x1.0p-24f), 3 * 0x1.0p-24f);
}

TEST(CodecTest, RejectsMalformedInput) {
  const IndexRange range{100, 200};
  const SparseBlock block{{101, 150, 199}, {1, 2, 3}};
  for (Encoding encoding : kEncodings) {
    std::string bytes;
    EncodeBlock(block, range, encoding, ValueType::kFloat32, &bytes);
    // Every truncation fails cleanly.
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      absl::string_view in(bytes.data(), cut);
      EXPECT_FALSE(DecodeBlock(&in, range).ok())
          << static_cast<int>(encoding) << " cut " << cut;
    }
    // A narrower range puts indices outside it (a dense block has no
    // indices: it reads as the first values of the narrower range).
    absl::string_view in(bytes);
    if (encoding != Encoding::kDense) {
      EXPECT_FALSE(DecodeBlock(&in, IndexRange{100, 150}).ok());
    }
  }
  auto fails = [&](std::string bytes) {
    absl::string_view in(bytes);
    return !DecodeBlock(&in, range).ok();
  };
  EXPECT_TRUE(fails(std::string(1, '\x07')));  // unknown encoding
  EXPECT_TRUE(fails(std::string(1, '\x30')));  // unknown value type
  // COO with indices out of order.
  std::string coo;
  EncodeBlock(SparseBlock{{150, 120}, {1, 2}}, range, Encoding::kCoo,
              ValueType::kFloat32, &coo);
  EXPECT_TRUE(fails(coo));
  // A count larger than the range.
  EXPECT_TRUE(fails(std::string("\x00\xff\x01", 3)));
  // A run past the end: start 190, length 20.
  std::string runs = std::string("\x02\x01", 2);
  runs += std::string("\xbe\x00\x00\x00\x14\x00\x00\x00", 8);
  runs += std::string(80, '\0');
  EXPECT_TRUE(fails(runs));
  // Bitmap padding bits set (range of 100 bits: 13 bytes, bits 100..103).
  std::string bitmap(1, '\x03');
  bitmap += std::string(12, '\0') + std::string(1, '\x80');
  bitmap += std::string(4, '\0');
  EXPECT_TRUE(fails(bitmap));
  // A non-finite value.
  std::string nan;
  EncodeBlock(SparseBlock{{120}, {1}}, range, Encoding::kCoo,
              ValueType::kFloat32, &nan);
  const float bad = std::nanf("");
  std::memcpy(nan.data() + nan.size() - 4, &bad, 4);
  EXPECT_TRUE(fails(nan));
}

// Random bytes never crash the decoder (the fuzz target explores further).
TEST(CodecTest, SurvivesRandomBytes) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (!bytes.empty()) bytes[0] = static_cast<char>(rng() % 0x30);
    absl::string_view in(bytes);
    const IndexRange range{rng() % 50, 50 + rng() % 200};
    auto decoded = DecodeBlock(&in, range);
    if (decoded.ok()) {
      EXPECT_TRUE(Validate(*decoded, range).ok());
    }
  }
}

}  // namespace
}  // namespace gradmesh::sparse
