// Dense float32 all-reduce (sum) with Gloo over TCP: the peer that gradmesh
// is measured against in the same run. One process per rank:
//
//   build/bench/gloo_allreduce --rank=R --size=S --store_dir=DIR
//       [--host=127.0.0.1] [--n=1048576] [--iterations=5] [--warmup=1]
//       [--algorithm=halving_doubling|ring_chunked] [--timeout_s=300]
//
// The ranks meet through a gloo::rendezvous::FileStore in DIR (shared by all
// of them, empty at the start). Before every iteration the ranks pass a
// barrier, so the times leave out start skew; each time is one in-place
// all-reduce. After the last iteration the ranks meet once more in the
// store (not over their connections, so that none leaves while a peer still
// uses its pair), and a few hundred evenly spaced values are checked against
// the exact sum. Prints one line of JSON on stdout;
// errors go to stderr with exit status 1.
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/dense_check.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

ABSL_FLAG(int, rank, -1, "this process's rank, 0 .. size-1");
ABSL_FLAG(int, size, 0, "number of ranks");
ABSL_FLAG(std::string, store_dir, "",
          "directory shared by all ranks for the Gloo FileStore rendezvous");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "IP address to bind the TCP device to");
ABSL_FLAG(int64_t, n, 1048576, "float32 values per all-reduce");
ABSL_FLAG(int, iterations, 5, "timed all-reduces");
ABSL_FLAG(int, warmup, 1, "untimed all-reduces before the timed ones");
ABSL_FLAG(std::string, algorithm, "halving_doubling",
          "halving_doubling or ring_chunked");
ABSL_FLAG(int, timeout_s, 300,
          "timeout in seconds for the rendezvous and every operation");

namespace {

using ::gradmesh::bench::Pattern;

// The rendezvous waits on the store with the store's default timeout (30 s)
// unless told otherwise; this one waits as long as --timeout_s.
class PatientFileStore : public gloo::rendezvous::FileStore {
 public:
  PatientFileStore(const std::string& path, std::chrono::milliseconds timeout)
      : FileStore(path), timeout_(timeout) {}

  using FileStore::wait;
  void wait(const std::vector<std::string>& keys) override {
    FileStore::wait(keys, timeout_);
  }

 private:
  const std::chrono::milliseconds timeout_;
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "gloo_allreduce: %s\n", message.c_str());
  return 1;
}

int Run() {
  const int rank = absl::GetFlag(FLAGS_rank);
  const int size = absl::GetFlag(FLAGS_size);
  const std::string store_dir = absl::GetFlag(FLAGS_store_dir);
  const int64_t n = absl::GetFlag(FLAGS_n);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const std::string algorithm = absl::GetFlag(FLAGS_algorithm);
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (size < 1) return Fail("--size must be at least 1");
  if (rank < 0 || rank >= size) return Fail("--rank must be in [0, size)");
  if (store_dir.empty()) return Fail("--store_dir is required");
  if (n < 1 || n > INT_MAX) return Fail("--n must be in [1, 2^31 - 1]");
  // The expected sums stay exact in float32 while they fit in 24 bits.
  if (size > 2000) return Fail("--size must be at most 2000");
  if (iterations < 1) return Fail("--iterations must be at least 1");
  if (warmup < 0) return Fail("--warmup must not be negative");
  if (algorithm != "halving_doubling" && algorithm != "ring_chunked") {
    return Fail("--algorithm must be halving_doubling or ring_chunked");
  }
  if (timeout_s < 1) return Fail("--timeout_s must be at least 1");
  const std::chrono::milliseconds timeout = std::chrono::seconds(timeout_s);

  gloo::transport::tcp::attr attr;
  attr.hostname = absl::GetFlag(FLAGS_host);
  auto device = gloo::transport::tcp::CreateDevice(attr);
  PatientFileStore store(store_dir, timeout);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  context->connectFullMesh(store, device);

  std::vector<float> data(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) data[i] = Pattern(rank, i);
  const std::vector<float*> ptrs = {data.data()};
  const int count = static_cast<int>(n);
  std::unique_ptr<gloo::Algorithm> allreduce;
  if (algorithm == "halving_doubling") {
    allreduce = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
        context, ptrs, count);
  } else {
    allreduce = std::make_unique<gloo::AllreduceRingChunked<float>>(
        context, ptrs, count);
  }
  gloo::BarrierAllToAll barrier(context);

  // Every all-reduce sums in place, so the buffer is refilled before each;
  // the refill is outside the timed region.
  std::vector<double> seconds;
  for (int it = 0; it < warmup + iterations; ++it) {
    if (it > 0) {
      for (int64_t i = 0; i < n; ++i) data[i] = Pattern(rank, i);
    }
    barrier.run();
    const auto start = std::chrono::steady_clock::now();
    allreduce->run();
    const auto end = std::chrono::steady_clock::now();
    if (it >= warmup) {
      seconds.push_back(std::chrono::duration<double>(end - start).count());
    }
  }

  // No rank leaves while a peer may still use its connection to it (a pair
  // closed early fails the peer: "connection closed by peer", even inside a
  // closing barrier of Gloo's own): the ranks meet in the store instead.
  store.set("done-" + std::to_string(rank), {'1'});
  std::vector<std::string> done;
  for (int r = 0; r < size; ++r) done.push_back("done-" + std::to_string(r));
  store.wait(done);

  if (const std::string wrong = gradmesh::bench::CheckSum(data, rank, size);
      !wrong.empty()) {
    return Fail(wrong);
  }
  gradmesh::bench::PrintResult("gloo", "\"algorithm\":\"" + algorithm + "\",",
                               rank, size, n, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  try {
    return Run();
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}
