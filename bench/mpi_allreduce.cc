// Dense float32 all-reduce (sum) with MPI_Allreduce: the peer that gradmesh
// is measured against in the same run. Started by mpirun, one process per
// rank:
//
//   mpirun -np S build/bench/mpi_allreduce [--n=1048576] [--iterations=5]
//       [--warmup=1]
//
// Before every iteration the ranks pass MPI_Barrier, so the times leave out
// start skew; each time is one in-place MPI_Allreduce. After the last
// iteration a few hundred evenly spaced values are checked against the exact
// sum. Each rank prints one line of JSON on stdout; errors go to stderr with
// exit status 1.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/dense_check.h"

ABSL_FLAG(int64_t, n, 1048576, "float32 values per all-reduce");
ABSL_FLAG(int, iterations, 5, "timed all-reduces");
ABSL_FLAG(int, warmup, 1, "untimed all-reduces before the timed ones");

namespace {

using ::gradmesh::bench::Pattern;

void Complain(const std::string& message) {
  std::fprintf(stderr, "mpi_allreduce: %s\n", message.c_str());
}

// Runs the benchmark between MPI_Init and MPI_Finalize; returns the exit
// status. Every rank takes the same path through the collectives.
int Run(int64_t n, int iterations, int warmup) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The expected sums stay exact in float32 while they fit in 24 bits.
  if (size > 2000) {
    if (rank == 0) Complain("at most 2000 ranks");
    return 1;
  }

  std::vector<float> data(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) data[i] = Pattern(rank, i);
  const int count = static_cast<int>(n);

  // Every all-reduce sums in place, so the buffer is refilled before each;
  // the refill is outside the timed region.
  std::vector<double> seconds;
  for (int it = 0; it < warmup + iterations; ++it) {
    if (it > 0) {
      for (int64_t i = 0; i < n; ++i) data[i] = Pattern(rank, i);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    const double end = MPI_Wtime();
    if (it >= warmup) seconds.push_back(end - start);
  }

  if (const std::string wrong = gradmesh::bench::CheckSum(data, rank, size);
      !wrong.empty()) {
    Complain(wrong);
    return 1;
  }
  gradmesh::bench::PrintResult("mpi", "", rank, size, n, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The flags are parsed before MPI_Init, so --help and bad flags end the
  // process before it joins the job. mpirun passes the program's arguments
  // through unchanged, and MPI_Init does not need them.
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_n);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (n < 1 || n > INT_MAX) {
    Complain("--n must be in [1, 2^31 - 1]");
    return 1;
  }
  if (iterations < 1) {
    Complain("--iterations must be at least 1");
    return 1;
  }
  if (warmup < 0) {
    Complain("--warmup must not be negative");
    return 1;
  }

  MPI_Init(&argc, &argv);
  const int status = Run(n, iterations, warmup);
  MPI_Finalize();
  return status;
}
