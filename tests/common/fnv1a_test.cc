// The digests processes compare: deterministic, and sensitive to every bit
// and to the length.
#include "common/fnv1a.h"

#include <string>

#include "gtest/gtest.h"

namespace gradmesh {
namespace {

// Fnv1aWords of bytes 0, 1, 2, ... (mod 256), recorded.
constexpr uint64_t kWordsOf1000Bytes = 0x2213beaeaac3037fu;
constexpr uint64_t kWordsOfNothing = 0xc435b33dcdec41bfu;
constexpr uint64_t kWordsOf31Bytes = 0x93dbe1007511ca45u;
constexpr uint64_t kWordsOf64Bytes = 0xf18eadafadc9ea3eu;

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
  // Pinned, so that a change of the function (which would make workers of
  // two builds refuse each other's votes) cannot pass unnoticed.
  EXPECT_EQ(base, kWordsOf1000Bytes);
  EXPECT_EQ(Fnv1aWords(""), kWordsOfNothing);
  EXPECT_EQ(Fnv1aWords(bytes.substr(0, 31)), kWordsOf31Bytes);
  EXPECT_EQ(Fnv1aWords(bytes.substr(0, 64)), kWordsOf64Bytes);
  // Trailing zeros change the length, and the digest.
  EXPECT_NE(Fnv1aWords(bytes + std::string(32, '\0')), base);
  EXPECT_NE(Fnv1aWords(bytes, 1), base);  // the seed counts
}

}  // namespace
}  // namespace gradmesh
