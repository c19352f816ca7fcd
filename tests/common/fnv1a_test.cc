// The digests processes compare: deterministic, and sensitive to every bit
// and to the length.
#include "common/fnv1a.h"

#include <string>

#include "gtest/gtest.h"

namespace gradmesh {
namespace {

TEST(Fnv1aTest, ByteWiseMatchesTheReferenceValues) {
  EXPECT_EQ(Fnv1a(""), kFnv1aBasis);
  EXPECT_EQ(Fnv1a("a"), 0xaf63dc4c8601ec8cu);  // FNV-1a 64 of "a"
}

TEST(Fnv1aTest, WordsHashIsTheSameEveryTimeAndSeesEveryBit) {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
  const uint64_t base = Fnv1aWords(bytes);
  EXPECT_EQ(Fnv1aWords(bytes), base);
  // Every bit of the 32-byte blocks and of the tail (1000 = 31 x 32 + 8).
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      ASSERT_NE(Fnv1aWords(flipped), base) << "byte " << i << " bit " << bit;
    }
  }
  // Trailing zeros change the length, and the digest.
  EXPECT_NE(Fnv1aWords(bytes + std::string(32, '\0')), base);
  EXPECT_NE(Fnv1aWords(bytes, 1), base);  // the seed counts
}

}  // namespace
}  // namespace gradmesh
