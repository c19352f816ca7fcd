#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/sparse/coo.h"
#include "worker/sparse/dense.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::sparse {
namespace {

using ::testing::ElementsAre;

SparseBlock Block(std::vector<uint32_t> indices, std::vector<float> values) {
  return SparseBlock{std::move(indices), std::move(values)};
}

TEST(SparseBlockTest, AddMergesAndSumsInOrder) {
  const SparseBlock a = Block({1, 4, 9}, {1.0f, 2.0f, 3.0f});
  const SparseBlock b = Block({0, 4, 10}, {5.0f, -2.0f, 7.0f});
  const SparseBlock sum = Add(a, b);
  EXPECT_THAT(sum.indices, ElementsAre(0, 1, 4, 9, 10));
  // A cancelled entry stays, with value zero.
  EXPECT_THAT(sum.values, ElementsAre(5.0f, 1.0f, 0.0f, 3.0f, 7.0f));
  EXPECT_EQ(Add(a, SparseBlock{}), a);
  EXPECT_EQ(Add(SparseBlock{}, b), b);
}

TEST(DenseWireTest, RoundTripsAndRejectsBadMessages) {
  const std::vector<float> x = {1.5f, -0.0f, 3e30f};
  std::vector<float> out(3);
  ASSERT_TRUE(DecodeDense(EncodeDense(x), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, x);
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeDense(EncodeDense({1.0f, 2.0f}), absl::MakeSpan(out))));
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeDense(
      EncodeDense({1.0f, std::nanf(""), 2.0f}), absl::MakeSpan(out))));
}

TEST(DenseWireTest, AddsAMessageInPlaceAndRejectsBadOnes) {
  std::vector<float> sum = {1.0f, 2.0f, 0.0f};
  ASSERT_TRUE(
      AddDense(EncodeDense({0.5f, -2.0f, 1e-45f}), absl::MakeSpan(sum)).ok());
  EXPECT_EQ(sum, (std::vector<float>{1.5f, 0.0f, 1e-45f}));
  const std::vector<float> before = sum;
  EXPECT_TRUE(absl::IsInvalidArgument(
      AddDense(EncodeDense({1.0f, 2.0f}), absl::MakeSpan(sum))));
  EXPECT_EQ(sum, before);  // a wrong length touches nothing
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::nanf(""), inf, -inf}) {
    EXPECT_TRUE(absl::IsInvalidArgument(
        AddDense(EncodeDense({1.0f, bad, 2.0f}), absl::MakeSpan(sum))));
  }
  EXPECT_TRUE(AddDense("", {}).ok());
  EXPECT_TRUE(EncodeDense({}).empty());
}

TEST(SparseBlockTest, ScatterAddAndDensify) {
  std::vector<float> dense(6, 1.0f);
  ScatterAdd(Block({0, 5}, {2.0f, -1.0f}), absl::MakeSpan(dense));
  EXPECT_THAT(dense, ElementsAre(3.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f));
  std::vector<float> window(3, 9.0f);
  Densify(Block({1, 3, 4, 8}, {1, 2, 3, 4}), {2, 5}, absl::MakeSpan(window));
  EXPECT_THAT(window, ElementsAre(0.0f, 2.0f, 3.0f));
}

TEST(SparseBlockTest, ValidateNamesTheViolation) {
  EXPECT_TRUE(Validate(Block({1, 2}, {1, 1}), {0, 3}).ok());
  EXPECT_TRUE(Validate(SparseBlock{}, {0, 0}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(Validate(Block({1}, {1, 2}), {0, 3})));
  EXPECT_TRUE(absl::IsInvalidArgument(Validate(Block({2, 2}, {1, 1}), {0, 3})));
  EXPECT_TRUE(absl::IsInvalidArgument(Validate(Block({3, 1}, {1, 1}), {0, 9})));
  const absl::Status out = Validate(Block({3}, {1}), {0, 3});
  EXPECT_TRUE(absl::IsInvalidArgument(out));
  EXPECT_THAT(out.message(), ::testing::HasSubstr("outside [0, 3)"));
}

TEST(CooTest, RoundTripsOneBlock) {
  const SparseBlock block = Block({3, 7, 4000000000u}, {1.5f, -0.0f, 1e-40f});
  const std::string bytes = EncodeCoo(block);
  EXPECT_EQ(bytes.size(), 3 * kCooEntryBytes);
  auto decoded = DecodeCoo(bytes, IndexRange{0, 4294967295ull});
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->indices, block.indices);
  for (size_t i = 0; i < block.size(); ++i) {
    EXPECT_EQ(std::memcmp(&decoded->values[i], &block.values[i], 4), 0);
  }
  auto empty = DecodeCoo("", IndexRange{0, 10});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

// A bag may wrap around: blocks 2, 0 (ranges [20,30) then [0,10)), with an
// empty block in between.
TEST(CooTest, SplitsABagByRanges) {
  const SparseBlock b2 = Block({21, 29}, {1, 2});
  const SparseBlock empty;
  const SparseBlock b0 = Block({0, 5}, {3, 4});
  const SparseBlock* bag[] = {&b2, &empty, &b0};
  const IndexRange ranges[] = {{20, 30}, {10, 20}, {0, 10}};
  auto decoded = DecodeCoo(EncodeCoo(bag), ranges);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 3u);
  EXPECT_EQ((*decoded)[0], b2);
  EXPECT_TRUE((*decoded)[1].empty());
  EXPECT_EQ((*decoded)[2], b0);
}

TEST(CooTest, RejectsMalformedMessages) {
  const IndexRange range{10, 20};
  // Not a multiple of 8 bytes.
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeCoo("1234567", range).status()));
  // Index outside the range.
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeCoo(EncodeCoo(Block({25}, {1})), range).status()));
  // Not increasing.
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeCoo(EncodeCoo(Block({15, 12}, {1, 1})), range).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeCoo(EncodeCoo(Block({15, 15}, {1, 1})), range).status()));
  // Values must be finite.
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeCoo(EncodeCoo(Block({12}, {std::nanf("")})), range).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeCoo(EncodeCoo(Block({12}, {INFINITY})), range).status()));
  // Ranges are consumed in order: an entry of an earlier range after a later
  // one is rejected.
  const IndexRange two[] = {{0, 10}, {10, 20}};
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeCoo(EncodeCoo(Block({12, 3}, {1, 1})), two).status()));
}

}  // namespace
}  // namespace gradmesh::sparse

#include "worker/sparse/qsgd.h"

namespace gradmesh::sparse {
namespace {

TEST(QsgdTest, RoundTripsWithinOneLevelAndRepeats) {
  std::vector<float> x(2500);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(static_cast<float>(i)) * (i < 1024 ? 1.0f : 100.0f);
  }
  x[7] = 0.0f;
  for (int bits : {2, 4, 8}) {
    std::string bytes;
    std::vector<float> decoded(x.size());
    EncodeQsgd(x, bits, 42, &bytes, absl::MakeSpan(decoded));
    EXPECT_EQ(bytes.size(), QsgdBytes(x.size(), bits));
    // Buckets of 1024, 1024 and 452 values, each with a 4-byte scale.
    EXPECT_EQ(bytes.size(),
              3 * 4 + 2 * (1024 * bits / 8) + (452 * bits + 7) / 8);
    std::vector<float> received(x.size());
    ASSERT_TRUE(DecodeQsgd(bytes, bits, absl::MakeSpan(received)).ok());
    EXPECT_EQ(received, decoded);  // the sender knows what arrives
    const float levels = static_cast<float>((1 << (bits - 1)) - 1);
    for (size_t i = 0; i < x.size(); ++i) {
      const float scale = i < 1024 ? 1.0f : 100.0f;
      ASSERT_LE(std::fabs(received[i] - x[i]), scale / levels * 1.0001f)
          << "bits " << bits << " index " << i;
    }
    EXPECT_EQ(received[7], 0.0f);
    std::string again;
    EncodeQsgd(x, bits, 42, &again, absl::MakeSpan(decoded));
    EXPECT_EQ(again, bytes);  // seeded: runs repeat
    std::string other;
    EncodeQsgd(x, bits, 43, &other, absl::MakeSpan(decoded));
    EXPECT_NE(other, bytes);
  }
}

TEST(QsgdTest, IsUnbiased) {
  const std::vector<float> x(1024, 0.3f);
  std::vector<float> decoded(x.size());
  double mean = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::string bytes;
    EncodeQsgd(x, 2, seed, &bytes, absl::MakeSpan(decoded));
    for (float v : decoded) mean += v;
  }
  // With 2 bits every value rounds to 0 or 0.3's scale (0.3): mean 0.3.
  EXPECT_NEAR(mean / (50 * 1024), 0.3, 0.01);
}

TEST(QsgdTest, RejectsMalformedInput) {
  std::vector<float> out(10);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeQsgd("", 4, absl::MakeSpan(out))));
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodeQsgd(std::string(9, '\0'), 3, absl::MakeSpan(out))));
  // Level -8 of 4 bits is never written (levels are -7..7).
  std::string low(QsgdBytes(10, 4), '\0');
  const float one = 1.0f;
  std::memcpy(low.data(), &one, 4);
  low[4] = 0x08;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeQsgd(low, 4, absl::MakeSpan(out))));
  std::string bad(QsgdBytes(10, 4), '\0');
  const float nan = std::nanf("");
  std::memcpy(bad.data(), &nan, 4);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeQsgd(bad, 4, absl::MakeSpan(out))));
}

}  // namespace
}  // namespace gradmesh::sparse
