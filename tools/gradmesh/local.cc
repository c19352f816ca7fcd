#include "tools/gradmesh/local.h"

#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "tools/gradmesh/synthetic.h"
#include "worker/collectives/mass_balance.h"

namespace gradmesh::tools {

namespace {

// Whether every worker got worker 0's result, bitwise.
absl::Status CheckIdentical(const std::vector<client::Reduced>& runs) {
  const client::ReducedTensor& first = runs[0].tensors[0];
  for (size_t w = 1; w < runs.size(); ++w) {
    const client::ReducedTensor& other = runs[w].tensors[0];
    if (other.indices != first.indices || other.values != first.values) {
      return absl::DataLossError(
          absl::StrCat("worker ", w, "'s result differs from worker 0's"));
    }
  }
  return absl::OkStatus();
}

// The job on a started cluster, up to its stop.
absl::Status Drive(LocalCluster* cluster, const LocalOptions& options,
                   const std::atomic<bool>* interrupted) {
  const int P = options.cluster.workers;
  GM_RETURN_IF_ERROR(cluster->WaitForView(P, options.cluster.start_timeout));
  std::printf(
      "gradmesh local: %d workers joined; %llu iterations of %llu "
      "values\n",
      P, static_cast<unsigned long long>(options.iterations),
      static_cast<unsigned long long>(options.n));
  std::fflush(stdout);

  // residuals[w]: worker w's residual as of its last successful iteration
  // (zeros at first); known = they are up to date.
  std::vector<std::vector<float>> residuals(P,
                                            std::vector<float>(options.n, 0));
  bool known = true;
  int failures = 0;
  double total_seconds = 0;
  int timed = 0;
  for (uint64_t it = 0; it < options.iterations; ++it) {
    if (interrupted != nullptr && interrupted->load()) {
      std::printf("gradmesh local: interrupted after %llu iterations\n",
                  static_cast<unsigned long long>(it));
      break;
    }
    std::vector<std::vector<float>> inputs(P);
    std::vector<absl::StatusOr<client::Reduced>> runs(
        P, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int w = 0; w < P; ++w) {
      threads.emplace_back([&, w] {
        std::vector<float> gradient(options.n);
        SyntheticGradient(options.seed, w, it, absl::MakeSpan(gradient));
        inputs[w] = gradient;
        runs[w] = cluster->client(w).AllReduce(
            it, {{"gradient", std::move(gradient)}}, options.verify,
            options.timeout);
      });
    }
    for (std::thread& t : threads) t.join();
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);

    std::string error;
    for (int w = 0; w < P && error.empty(); ++w) {
      if (!runs[w].ok()) {
        error = absl::StrCat("worker ", w, ": ", runs[w].status().ToString());
      }
    }
    if (!error.empty()) {
      ++failures;
      known = false;  // some residuals moved without telling us
      std::printf("iter %3llu  FAILED  %s (gradients kept in residuals)\n",
                  static_cast<unsigned long long>(it), error.c_str());
      std::fflush(stdout);
      continue;
    }
    std::vector<client::Reduced> ok;
    double slowest = 0, sent = 0;
    for (int w = 0; w < P; ++w) {
      ok.push_back(*std::move(runs[w]));
      slowest = std::max(slowest, ok.back().seconds);
      sent += static_cast<double>(ok.back().bytes_sent);
    }
    std::string check = "unchecked";
    if (options.verify) {
      if (absl::Status same = CheckIdentical(ok); !same.ok()) {
        return absl::DataLossError(
            absl::StrCat("iteration ", it, ": ", same.message()));
      }
      std::vector<std::vector<float>> after;
      for (int w = 0; w < P; ++w) after.push_back(ok[w].tensors[0].residual);
      check = "identical";
      if (known) {
        sparse::SparseBlock result;
        result.indices = ok[0].tensors[0].indices;
        result.values = ok[0].tensors[0].values;
        if (absl::Status balanced = collectives::MassBalance(inputs, residuals)
                                        .Check(result, after);
            !balanced.ok()) {
          return absl::DataLossError(
              absl::StrCat("iteration ", it, ": ", balanced.message()));
        }
        check = "checked";
      }
      residuals = std::move(after);
      known = true;
    }
    if (it > 0) {
      total_seconds += slowest;
      ++timed;
    }
    std::printf(
        "iter %3llu  %8.2f ms  (call %7.2f ms)  %10.0f B sent/worker  "
        "%6zu nonzeros  %s d=%d  epoch %llu  %s\n",
        static_cast<unsigned long long>(it), slowest * 1e3, wall * 1e3,
        sent / P, ok[0].tensors[0].indices.size(), ok[0].algorithm.c_str(),
        ok[0].teams, static_cast<unsigned long long>(ok[0].epoch),
        check.c_str());
    std::fflush(stdout);
  }
  auto status = cluster->client(0).GetStatus(absl::Seconds(5));
  if (status.ok()) {
    std::printf("gradmesh local: plan %s d=%d%s\n",
                status->plan().algorithm().c_str(), status->plan().teams(),
                status->plan().note().empty()
                    ? ""
                    : absl::StrCat(" (", status->plan().note(), ")").c_str());
  }
  if (timed > 0) {
    std::printf(
        "gradmesh local: mean iteration %.2f ms over %d iterations "
        "(the first excluded)\n",
        total_seconds / timed * 1e3, timed);
  }
  const absl::Status stopped = cluster->Stop();
  std::printf(
      "gradmesh local: cluster stopped%s\n",
      stopped.ok() ? "" : absl::StrCat(" (", stopped.message(), ")").c_str());
  if (failures > 0) {
    return absl::UnavailableError(absl::StrCat(failures, " iterations failed"));
  }
  return stopped;
}

}  // namespace

absl::Status RunLocal(const LocalOptions& options,
                      const std::atomic<bool>* interrupted) {
  std::printf("gradmesh local: starting a coordinator and %d workers\n",
              options.cluster.workers);
  std::fflush(stdout);
  GM_ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster,
                      LocalCluster::Start(options.cluster));
  std::printf(
      "gradmesh local: coordinator %s (/metrics on port %d), logs in %s\n",
      cluster->coordinator_address().c_str(),
      cluster->coordinator_metrics_port(), cluster->work_dir().c_str());
  const absl::Status status = Drive(cluster.get(), options, interrupted);
  if (!status.ok()) {
    cluster->KeepWorkDir();
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; logs in ", cluster->work_dir()));
  }
  return status;
}

}  // namespace gradmesh::tools
