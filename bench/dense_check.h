// What the dense all-reduce harnesses (gloo_allreduce, mpi_allreduce) share:
// the input pattern, the check of the sum and the JSON line they print.
#ifndef GRADMESH_BENCH_DENSE_CHECK_H_
#define GRADMESH_BENCH_DENSE_CHECK_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gradmesh::bench {

// Value i on rank r is (r + 1) * ((i % 7) + 1) * 0.5: halves of small
// integers, so every partial sum is exact in float32 (up to 2000 ranks).
inline float Pattern(int rank, int64_t i) {
  return static_cast<float>(rank + 1) * static_cast<float>((i % 7) + 1) * 0.5f;
}

inline float Expected(int size, int64_t i) {
  return static_cast<float>(size * (size + 1) / 2) *
         static_cast<float>((i % 7) + 1) * 0.5f;
}

// Checks 513 evenly spaced values of the sum (the first and the last among
// them); empty if all are exact, else what differs.
inline std::string CheckSum(const std::vector<float>& data, int rank,
                            int size) {
  constexpr int64_t kChecks = 512;
  const int64_t n = static_cast<int64_t>(data.size());
  for (int64_t k = 0; k <= kChecks; ++k) {
    const int64_t i = k * (n - 1) / kChecks;
    if (data[i] != Expected(size, i)) {
      return "rank " + std::to_string(rank) + ": value " + std::to_string(i) +
             " is " + std::to_string(data[i]) + ", expected " +
             std::to_string(Expected(size, i));
    }
  }
  return "";
}

// Prints the rank's one line of JSON: {"system":...,<fields>"rank":...,
// "size":...,"n":...,"seconds":[...],"checked":true}. `fields` is empty or
// ends with a comma.
inline void PrintResult(const std::string& system, const std::string& fields,
                        int rank, int size, int64_t n,
                        const std::vector<double>& seconds) {
  std::string line = "{\"system\":\"" + system + "\"," + fields +
                     "\"rank\":" + std::to_string(rank) +
                     ",\"size\":" + std::to_string(size) +
                     ",\"n\":" + std::to_string(n) + ",\"seconds\":[";
  for (size_t k = 0; k < seconds.size(); ++k) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%s%.9f", k ? "," : "", seconds[k]);
    line += buffer;
  }
  line += "],\"checked\":true}";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace gradmesh::bench

#endif  // GRADMESH_BENCH_DENSE_CHECK_H_
