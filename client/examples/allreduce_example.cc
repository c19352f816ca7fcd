// A training loop's use of the gradmesh SDK, run by `gradmesh run`:
//
//   gradmesh run --workers=3 -- gradmesh-example --steps=5
//
// Every process registers two buckets, takes rank 0's initial parameters
// (Broadcast), then each step writes its gradients straight into the shared
// buckets, starts both all-reduces at once and waits for them in reverse
// order (they finish in any order), and applies the mean. It checks what it
// can see alone: the broadcast parameters, and that every rank holds the
// same parameters at the end (a second broadcast compares them).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradmesh/client.h"

namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

// A gradient that differs per rank, step and position.
void FillGradient(absl::Span<float> g, int rank, uint64_t step) {
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = std::sin(0.001f * static_cast<float>(i * (rank + 1) + step));
  }
}

// One training step: both buckets' gradients summed at once, waited for in
// reverse order, then SGD with their means; 0, or Fail's code.
int Step(gradmesh::Client& c, gradmesh::TensorSet& dense,
         gradmesh::TensorSet& conv, absl::Span<float> p, int step) {
  FillGradient(dense.values(), c.rank(), step);
  FillGradient(conv.values(), c.rank(), step + 100);
  const gradmesh::AllReduceOptions mean{.op = gradmesh::ReduceOp::kMean};
  gradmesh::Handle h_dense = c.AllReduceAsync(dense, step, mean);
  gradmesh::Handle h_conv = c.AllReduceAsync(conv, step, mean);
  auto r_conv = h_conv.Wait();
  auto r_dense = h_dense.Wait();
  if (!r_conv.ok()) return Fail("all-reduce conv", r_conv.status());
  if (!r_dense.ok()) return Fail("all-reduce dense", r_dense.status());
  // SGD on the fused parameters: dense buckets' means, lr 0.1.
  for (size_t i = 0; i < dense.size(); ++i) p[i] -= 0.1f * dense.values()[i];
  for (size_t i = 0; i < conv.size(); ++i) {
    p[dense.size() + i] -= 0.1f * conv.values()[i];
  }
  std::printf("step %d: %llu + %llu nonzeros, %s d=%d, %.2f ms\n", step,
              static_cast<unsigned long long>(r_dense->nonzeros),
              static_cast<unsigned long long>(r_conv->nonzeros),
              r_dense->algorithm.c_str(), r_dense->teams,
              (r_dense->seconds + r_conv->seconds) * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) {
      steps = std::atoi(argv[i] + 8);
    } else {
      std::fprintf(stderr, "usage: %s [--steps=N]\n", argv[0]);
      return 2;
    }
  }
  auto client = gradmesh::Client::Connect();
  if (!client.ok()) return Fail("connect", client.status());
  gradmesh::Client& c = **client;
  std::printf("rank %d of %d, job %s\n", c.rank(), c.size(), c.job().c_str());

  auto dense = c.Register("dense", {{"fc.weight", 20000}, {"fc.bias", 100}});
  if (!dense.ok()) return Fail("register dense", dense.status());
  auto conv = c.Register("conv", {{"conv.weight", 50000}});
  if (!conv.ok()) return Fail("register conv", conv.status());

  // Parameters: rank 0's initial values everywhere.
  auto params = c.Register("params", {{"all", 70100}});
  if (!params.ok()) return Fail("register params", params.status());
  absl::Span<float> p = (*params)->values();
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = c.rank() == 0 ? 0.5f : -1.0f;
  }
  if (auto s = c.Broadcast(**params, 0); !s.ok()) return Fail("broadcast", s);
  for (float v : p) {
    if (v != 0.5f) return Fail("broadcast", absl::DataLossError("wrong value"));
  }

  for (int step = 0; step < steps; ++step) {
    if (const int failed = Step(c, **dense, **conv, p, step); failed != 0) {
      return failed;
    }
  }

  // Every rank applied the same updates: rank 0's parameters equal ours.
  std::vector<float> mine(p.begin(), p.end());
  if (auto s = c.Broadcast(**params, 0); !s.ok()) return Fail("broadcast", s);
  if (std::memcmp(mine.data(), p.data(), mine.size() * sizeof(float)) != 0) {
    return Fail("check",
                absl::DataLossError("parameters diverged from rank 0"));
  }
  if (auto s = c.Barrier(); !s.ok()) return Fail("barrier", s);
  std::printf("rank %d: parameters identical to rank 0's after %d steps\n",
              c.rank(), steps);
  return 0;
}
