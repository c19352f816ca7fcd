#include "tools/gradmesh/replay.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "tools/gradmesh/npy.h"

namespace gradmesh::tools {
namespace {

namespace fs = std::filesystem;
using ::gradmesh::testing::RandomVector;
using ::testing::HasSubstr;

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::path(::testing::TempDir()) /
        absl::StrCat(
            "replay_test_", getpid(), "_",
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(in());
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path in() const { return root_ / "in"; }
  fs::path out() const { return root_ / "out"; }

  void WriteRank(int rank, std::vector<uint64_t> shape,
                 const std::vector<float>& values) {
    auto writer = NpyWriter::Create(
        (in() / absl::StrCat("rank", rank, ".npy")).string(), shape);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(writer->Append(values).ok());
    ASSERT_TRUE(writer->Close().ok());
  }

  // Writes P ranks of [T, n] random values; returns them.
  std::vector<std::vector<float>> WriteInputs(int world, uint64_t t,
                                              uint64_t n) {
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back(RandomVector(t * n, 17 + r));
      WriteRank(r, {t, n}, inputs.back());
    }
    return inputs;
  }

  // A version 1.0 .npy file with the given header dictionary and data bytes,
  // for inputs NpyWriter would never write.
  static void WriteRawNpy(const fs::path& path, std::string dict,
                          const std::string& data) {
    dict.append(128 - 10 - dict.size() - 1, ' ');
    dict.push_back('\n');
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const uint16_t len = dict.size();
    f.write("\x93NUMPY\x01\x00", 8);
    f.write(reinterpret_cast<const char*>(&len), 2);
    f << dict << data;
  }

  ReplayOptions Options(int world, int teams, double density) const {
    ReplayOptions options;
    options.algorithm = {
        .algorithm = "spardl", .density = density, .teams = teams};
    options.workers = world;
    options.input_dir = in().string();
    options.output_dir = out().string();
    options.progress = false;
    return options;
  }

  std::vector<float> ReadAll(const fs::path& path) {
    auto reader = NpyReader::Open(path.string());
    EXPECT_TRUE(reader.ok()) << reader.status();
    std::vector<float> all;
    std::vector<float> row(reader->columns());
    for (uint64_t t = 0; t < reader->rows(); ++t) {
      EXPECT_TRUE(reader->ReadRow(t, absl::MakeSpan(row)).ok());
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  }

  // Runs a replay expected to fail with InvalidArgument mentioning `what`,
  // and checks that no output (not even a partial one) was left.
  void ExpectRejected(const ReplayOptions& options, const std::string& what) {
    const absl::Status status = RunReplay(options);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr(what));
    EXPECT_FALSE(fs::exists(out()) && !fs::is_empty(out()));
    for (const auto& entry : fs::directory_iterator(root_)) {
      EXPECT_THAT(entry.path().filename().string(),
                  ::testing::Not(HasSubstr("partial")));
    }
  }

  fs::path root_;
};

TEST_F(ReplayTest, WritesIdenticalResultsThatConserveMass) {
  constexpr int kWorld = 6;
  constexpr uint64_t kT = 3;
  constexpr uint64_t kN = 500;
  const auto inputs = WriteInputs(kWorld, kT, kN);
  ASSERT_TRUE(RunReplay(Options(kWorld, 3, 0.05)).ok());

  const std::vector<float> result0 = ReadAll(out() / "rank0.result.npy");
  ASSERT_EQ(result0.size(), kT * kN);
  std::vector<double> lhs(kN, 0.0), rhs(kN, 0.0), scale(kN, 0.0);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ReadAll(out() / absl::StrCat("rank", r, ".result.npy")), result0);
    const std::vector<float> residual =
        ReadAll(out() / absl::StrCat("rank", r, ".residual.npy"));
    ASSERT_EQ(residual.size(), kN);
    for (uint64_t i = 0; i < kN; ++i) {
      rhs[i] += residual[i];
      for (uint64_t t = 0; t < kT; ++t) {
        lhs[i] += inputs[r][t * kN + i];
        scale[i] += std::fabs(inputs[r][t * kN + i]);
      }
    }
  }
  for (uint64_t t = 0; t < kT; ++t) {
    int nonzeros = 0;
    for (uint64_t i = 0; i < kN; ++i) {
      rhs[i] += result0[t * kN + i];
      nonzeros += result0[t * kN + i] != 0.0f;
    }
    EXPECT_LE(nonzeros, 25);  // k = 0.05 * 500
  }
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(lhs[i], rhs[i], 1e-5 * scale[i]) << "index " << i;
  }

  std::ifstream stats(out() / "stats.json");
  const std::string json((std::istreambuf_iterator<char>(stats)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(json, HasSubstr("\"workers\": 6"));
  EXPECT_THAT(json, HasSubstr("\"bsag_h\""));
  EXPECT_THAT(json, HasSubstr("\"bytes_received\""));
  EXPECT_THAT(json, HasSubstr("{\"rank\": 5,"));
}

// Every algorithm writes the same outputs from the same inputs, so that they
// can be compared from outside.
TEST_F(ReplayTest, EveryAlgorithmWritesTheSameOutputs) {
  constexpr int kWorld = 5;
  constexpr uint64_t kN = 300;
  const auto inputs = WriteInputs(kWorld, 2, kN);
  for (const std::string& algorithm : collectives::AlgorithmNames()) {
    SCOPED_TRACE(algorithm);
    ReplayOptions options = Options(kWorld, 1, 0.05);
    options.algorithm.algorithm = algorithm;
    options.overwrite = true;
    ASSERT_TRUE(RunReplay(options).ok());
    double lhs = 0, rhs = 0, scale = 0;
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> result =
          ReadAll(out() / absl::StrCat("rank", r, ".result.npy"));
      ASSERT_EQ(result.size(), 2 * kN);
      EXPECT_EQ(result, ReadAll(out() / "rank0.result.npy"));
      for (float x :
           ReadAll(out() / absl::StrCat("rank", r, ".residual.npy"))) {
        rhs += x;
      }
      for (float x : inputs[r]) {
        lhs += x;
        scale += std::fabs(x);
      }
      if (r == 0) {
        for (float x : result) rhs += x;
      }
    }
    EXPECT_NEAR(lhs, rhs, 1e-5 * scale);
    std::ifstream stats(out() / "stats.json");
    const std::string json((std::istreambuf_iterator<char>(stats)),
                           std::istreambuf_iterator<char>());
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\"algorithm\": \"", algorithm)));
  }
}

TEST_F(ReplayTest, OneDimensionalInputIsOneIteration) {
  for (int r = 0; r < 2; ++r) WriteRank(r, {40}, RandomVector(40, r));
  ASSERT_TRUE(RunReplay(Options(2, 1, 0.1)).ok());
  auto reader = NpyReader::Open((out() / "rank1.result.npy").string());
  ASSERT_TRUE(reader.ok());
  EXPECT_THAT(reader->shape(), ::testing::ElementsAre(1, 40));
}

TEST_F(ReplayTest, GeneratesInputsWhenNoInputDirIsGiven) {
  ReplayOptions options = Options(4, 2, 0.01);
  options.input_dir.clear();
  options.n = 3000;
  options.iterations = 2;
  ASSERT_TRUE(RunReplay(options).ok());
  EXPECT_EQ(ReadAll(out() / "rank3.result.npy").size(), 6000u);
}

TEST_F(ReplayTest, RejectsAMissingRankFile) {
  WriteInputs(2, 1, 10);
  ExpectRejected(Options(3, 1, 0.1), "rank2.npy");
}

TEST_F(ReplayTest, RejectsMismatchedSizes) {
  WriteRank(0, {2, 10}, RandomVector(20, 1));
  WriteRank(1, {2, 11}, RandomVector(22, 2));
  ExpectRejected(Options(2, 1, 0.1), "rank1.npy holds 2 iteration(s) of 11");
}

TEST_F(ReplayTest, RejectsAWrongDtype) {
  WriteInputs(2, 1, 4);
  // rank1.npy: a float64 array of 4 values.
  WriteRawNpy(in() / "rank1.npy",
              "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }",
              std::string(32, '\0'));
  ExpectRejected(Options(2, 1, 0.1), "not little-endian float32");
}

TEST_F(ReplayTest, RejectsATruncatedFile) {
  WriteInputs(2, 1, 100);
  fs::resize_file(in() / "rank0.npy", fs::file_size(in() / "rank0.npy") - 4);
  ExpectRejected(Options(2, 1, 0.1), "rank0.npy");
}

TEST_F(ReplayTest, RejectsNaNAndInf) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> values = RandomVector(3 * 20, 5);
    values[2 * 20 + 7] = bad;  // iteration 2, index 7
    WriteInputs(3, 3, 20);
    WriteRank(1, {3, 20}, values);
    ExpectRejected(Options(3, 1, 0.1),
                   absl::StrCat("rank 1 iteration 2 index 7: value is ",
                                std::isnan(bad) ? "NaN" : "Inf"));
  }
}

TEST_F(ReplayTest, RejectsBadOptions) {
  WriteInputs(6, 1, 30);
  ExpectRejected(Options(6, 1, 0.0), "density");
  ExpectRejected(Options(6, 1, 1.5), "density");
  ExpectRejected(Options(6, 4, 0.1), "teams d = 4");
  ReplayOptions unknown = Options(6, 1, 0.1);
  unknown.algorithm.algorithm = "allgather-magic";
  ExpectRejected(unknown, "unknown algorithm");
  ExpectRejected(Options(0, 1, 0.1), "--workers=0");
}

TEST_F(ReplayTest, AcceptsAnOutputDirWithATrailingSlash) {
  WriteInputs(2, 1, 10);
  ReplayOptions options = Options(2, 1, 0.1);
  options.output_dir = out().string() + "/";
  ASSERT_TRUE(RunReplay(options).ok());
  EXPECT_TRUE(fs::exists(out() / "stats.json"));
  options.overwrite = true;
  ASSERT_TRUE(RunReplay(options).ok());
  EXPECT_TRUE(fs::exists(out() / "rank1.result.npy"));
}

TEST_F(ReplayTest, RejectsAnAbsurdShape) {
  WriteInputs(2, 1, 4);
  WriteRawNpy(in() / "rank1.npy",
              "{'descr': '<f4', 'fortran_order': False, 'shape': "
              "(17179869184, 1073741824), }",
              "");
  ExpectRejected(Options(2, 1, 0.1), "too large");
}

TEST_F(ReplayTest, KeepsANonEmptyOutputDirUnlessTold) {
  WriteInputs(2, 1, 10);
  fs::create_directories(out());
  std::ofstream(out() / "keep.txt") << "precious";
  const absl::Status status = RunReplay(Options(2, 1, 0.1));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_TRUE(fs::exists(out() / "keep.txt"));
  ReplayOptions options = Options(2, 1, 0.1);
  options.overwrite = true;
  ASSERT_TRUE(RunReplay(options).ok());
  EXPECT_FALSE(fs::exists(out() / "keep.txt"));
  EXPECT_TRUE(fs::exists(out() / "stats.json"));
}

}  // namespace
}  // namespace gradmesh::tools
