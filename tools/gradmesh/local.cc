#include "tools/gradmesh/local.h"

#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "tools/gradmesh/synthetic.h"
#include "worker/collectives/mass_balance.h"

namespace gradmesh::tools {

namespace {

// One worker's process, as a trainer would hold it.
struct Trainer {
  int worker = 0;  // its worker's index in the cluster
  std::unique_ptr<Client> client;
  std::unique_ptr<TensorSet> set;
  std::vector<float> input;  // the gradient pushed (kept when verifying)
  absl::StatusOr<ReduceInfo> outcome = absl::UnknownError("not run");
  double call_seconds = 0;  // the client's view: push to result
};

// Runs `body(w)` on one thread per worker and waits for all.
template <typename Body>
void OnEveryWorker(int workers, Body body) {
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(body, w);
  for (std::thread& t : threads) t.join();
}

absl::Status Connect(LocalCluster* cluster, const LocalOptions& options,
                     std::vector<Trainer>* trainers) {
  const std::string job = absl::StrCat("local-", getpid());
  std::vector<absl::Status> status(trainers->size());
  OnEveryWorker(cluster->size(), [&](int w) {
    Trainer& t = (*trainers)[w];
    t.worker = w;
    auto client = Client::Connect({.worker = cluster->sdk_address(w),
                                   .job = job,
                                   .timeout = options.timeout});
    if (!client.ok()) {
      status[w] = client.status();
      return;
    }
    t.client = *std::move(client);
    auto set = t.client->Register("gradient", {{"gradient", options.n}});
    status[w] = set.status();
    if (set.ok()) t.set = *std::move(set);
  });
  for (size_t w = 0; w < status.size(); ++w) {
    if (!status[w].ok()) {
      return absl::Status(status[w].code(), absl::StrCat("worker ", w, ": ",
                                                         status[w].message()));
    }
  }
  return absl::OkStatus();
}

// One iteration on every worker: the gradient written in place, then summed,
// started on all workers at once so that a worker's time is the operation's
// and not the wait for a peer still writing its gradient.
void Step(std::vector<Trainer>& trainers, const LocalOptions& options,
          uint64_t it) {
  std::barrier<> written(static_cast<std::ptrdiff_t>(trainers.size()));
  OnEveryWorker(static_cast<int>(trainers.size()), [&](int w) {
    Trainer& t = trainers[w];
    SyntheticGradient(options.seed, t.worker, it, t.set->values());
    if (options.verify) {
      t.input.assign(t.set->values().begin(), t.set->values().end());
    }
    written.arrive_and_wait();
    const absl::Time start = absl::Now();
    t.outcome = t.client->AllReduce(
        *t.set, it,
        {.layout = ResultLayout::kSparse, .return_residual = options.verify});
    t.call_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  });
}

sparse::SparseBlock ResultOf(const Trainer& t) {
  sparse::SparseBlock block;
  const auto indices = t.set->sparse_indices(t.outcome->nonzeros);
  const auto values = t.set->sparse_values(t.outcome->nonzeros);
  block.indices.assign(indices.begin(), indices.end());
  block.values.assign(values.begin(), values.end());
  return block;
}

// One successful iteration, per worker, as JSON: the worker's time, the part
// of it spent waiting for peers, the client's call, bytes, rounds and the
// result's digest (sparse::Digest, to compare runs).
std::string IterationJson(uint64_t it, const std::vector<Trainer>& trainers) {
  std::string json = absl::StrCat("{\"iteration\":", it, ",\"workers\":[");
  for (size_t w = 0; w < trainers.size(); ++w) {
    const ReduceInfo& r = *trainers[w].outcome;
    absl::StrAppendFormat(
        &json,
        "%s{\"seconds\":%.6f,\"wait_seconds\":%.6f,\"call_seconds\":%.6f,"
        "\"bytes_sent\":%u,\"bytes_received\":%u,\"rounds\":%d,"
        "\"nonzeros\":%u,\"algorithm\":\"%s\",\"teams\":%d,"
        "\"result_digest\":\"%016x\"}",
        w == 0 ? "" : ",", r.seconds, r.wait_seconds, trainers[w].call_seconds,
        r.bytes_sent, r.bytes_received, r.rounds, r.nonzeros, r.algorithm,
        r.teams, sparse::Digest(ResultOf(trainers[w])));
  }
  return json + "]}";
}

absl::Status WriteJson(const LocalOptions& options,
                       const std::vector<std::string>& iterations) {
  std::ofstream out(options.json_path);
  out << absl::StrFormat(
      "{\"workers\":%d,\"n\":%u,\"seed\":%u,\"iterations\":[%s]}\n",
      options.cluster.workers, options.n, options.seed,
      absl::StrJoin(iterations, ","));
  out.close();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("cannot write ", options.json_path));
  }
  return absl::OkStatus();
}

// Identical results everywhere, and inputs = result + residuals.
absl::Status Verify(const std::vector<Trainer>& trainers,
                    std::vector<std::vector<float>>* residuals, bool known) {
  const sparse::SparseBlock first = ResultOf(trainers[0]);
  std::vector<std::vector<float>> inputs, after;
  for (size_t w = 0; w < trainers.size(); ++w) {
    const sparse::SparseBlock mine = ResultOf(trainers[w]);
    if (mine.indices != first.indices || mine.values != first.values) {
      return absl::DataLossError(
          absl::StrCat("worker ", w, "'s result differs from worker 0's"));
    }
    inputs.push_back(trainers[w].input);
    after.emplace_back(trainers[w].set->residual().begin(),
                       trainers[w].set->residual().end());
  }
  absl::Status balanced =
      known ? collectives::MassBalance(inputs, *residuals).Check(first, after)
            : absl::OkStatus();
  *residuals = std::move(after);
  return balanced;
}

// Removes the trainers whose worker process has exited (with their
// residuals), saying so. FailedPrecondition when none is left.
absl::Status DropOrphans(LocalCluster* cluster, std::vector<Trainer>* trainers,
                         std::vector<std::vector<float>>* residuals) {
  for (size_t i = trainers->size(); i-- > 0;) {
    const Trainer& t = (*trainers)[i];
    if (t.outcome.ok() || !cluster->Exited(t.worker)) continue;
    std::printf(
        "gradmesh local: worker %d is gone; its trainer stops, %zu go on\n",
        t.worker, trainers->size() - 1);
    trainers->erase(trainers->begin() + i);
    residuals->erase(residuals->begin() + i);
  }
  if (trainers->empty()) {
    return absl::FailedPreconditionError("every worker is gone");
  }
  return absl::OkStatus();
}

// The job on a started cluster, up to its stop.
// What the iterations of a run add up to.
struct Tally {
  // Each worker's residual as of its last successful iteration; known: up
  // to date (a failed iteration moves them without telling).
  std::vector<std::vector<float>> residuals;
  bool known = true;
  int failures = 0, timed = 0;
  double daemon = 0, call = 0;
  std::vector<std::string> json;  // per successful iteration
};

// The first failure among the trainers' outcomes, or "".
std::string FirstFailure(const std::vector<Trainer>& trainers) {
  for (const Trainer& t : trainers) {
    if (!t.outcome.ok()) {
      return absl::StrCat("worker ", t.worker, ": ",
                          t.outcome.status().ToString());
    }
  }
  return "";
}

// One iteration on every trainer, checked and printed.
absl::Status Iterate(LocalCluster* cluster, const LocalOptions& options,
                     uint64_t it, std::vector<Trainer>& trainers,
                     Tally& tally) {
  Step(trainers, options, it);
  // A trainer whose worker is gone stops; the others go on without it
  // (its last step may have counted its gradient: check identity only).
  const size_t before = trainers.size();
  GM_RETURN_IF_ERROR(DropOrphans(cluster, &trainers, &tally.residuals));
  if (trainers.size() < before) tally.known = false;
  if (const std::string error = FirstFailure(trainers); !error.empty()) {
    ++tally.failures;
    tally.known = false;
    std::printf("iter %3llu  FAILED  %s (gradients kept in residuals)\n",
                static_cast<unsigned long long>(it), error.c_str());
    std::fflush(stdout);
    // Membership may be changing: go on once the survivors share a view.
    cluster->WaitForView(static_cast<int>(trainers.size()), options.timeout)
        .IgnoreError();
    return absl::OkStatus();
  }
  double daemon = 0, call = 0, sent = 0;
  for (const Trainer& t : trainers) {
    daemon = std::max(daemon, t.outcome->seconds);
    call = std::max(call, t.call_seconds);
    sent += static_cast<double>(t.outcome->bytes_sent);
  }
  std::string check = "unchecked";
  if (options.verify) {
    GM_RETURN_IF_ERROR(Verify(trainers, &tally.residuals, tally.known));
    check = tally.known ? "checked" : "identical";
    tally.known = true;
  }
  if (it > 0) {
    tally.daemon += daemon;
    tally.call += call;
    ++tally.timed;
  }
  if (!options.json_path.empty()) {
    tally.json.push_back(IterationJson(it, trainers));
  }
  const ReduceInfo& r = *trainers[0].outcome;
  std::printf(
      "iter %3llu  %8.2f ms  (call %7.2f ms)  %10.0f B sent/worker  "
      "%6llu nonzeros  %s d=%d  epoch %llu  %s\n",
      static_cast<unsigned long long>(it), daemon * 1e3, call * 1e3,
      sent / static_cast<double>(trainers.size()),
      static_cast<unsigned long long>(r.nonzeros), r.algorithm.c_str(), r.teams,
      static_cast<unsigned long long>(r.epoch), check.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// The plan the run ended on and its mean iteration.
void PrintSummary(const std::vector<Trainer>& trainers, const Tally& tally) {
  if (auto plan = trainers[0].client->GetPlan(); plan.ok()) {
    std::printf(
        "gradmesh local: plan %s d=%d%s\n", plan->algorithm.c_str(),
        plan->teams,
        plan->note.empty() ? "" : absl::StrCat(" (", plan->note, ")").c_str());
  }
  if (tally.timed > 0) {
    std::printf(
        "gradmesh local: mean iteration %.2f ms in the workers, %.2f ms "
        "seen by the clients (%.2fx) over %d iterations (the first "
        "excluded)\n",
        tally.daemon / tally.timed * 1e3, tally.call / tally.timed * 1e3,
        tally.call / tally.daemon, tally.timed);
  }
}

absl::Status Drive(LocalCluster* cluster, const LocalOptions& options,
                   const std::atomic<bool>* interrupted) {
  const int P = options.cluster.workers;
  GM_RETURN_IF_ERROR(cluster->WaitForView(P, options.cluster.start_timeout));
  std::vector<Trainer> trainers(P);
  GM_RETURN_IF_ERROR(Connect(cluster, options, &trainers));
  std::printf(
      "gradmesh local: %d workers joined; %llu iterations of %llu values "
      "through the SDK (shared memory)\n",
      P, static_cast<unsigned long long>(options.iterations),
      static_cast<unsigned long long>(options.n));
  std::fflush(stdout);
  Tally tally;
  tally.residuals.assign(P, std::vector<float>(options.n, 0));
  for (uint64_t it = 0; it < options.iterations; ++it) {
    if (interrupted != nullptr && interrupted->load()) {
      std::printf("gradmesh local: interrupted after %llu iterations\n",
                  static_cast<unsigned long long>(it));
      break;
    }
    GM_RETURN_IF_ERROR(Iterate(cluster, options, it, trainers, tally));
  }
  PrintSummary(trainers, tally);
  if (!options.json_path.empty()) {
    GM_RETURN_IF_ERROR(WriteJson(options, tally.json));
  }
  trainers.clear();  // unregister before the workers stop
  const absl::Status stopped = cluster->Stop();
  std::printf(
      "gradmesh local: cluster stopped%s\n",
      stopped.ok() ? "" : absl::StrCat(" (", stopped.message(), ")").c_str());
  if (tally.failures > 0) {
    return absl::UnavailableError(
        absl::StrCat(tally.failures, " iterations failed"));
  }
  return stopped;
}

}  // namespace

absl::Status RunLocal(const LocalOptions& options,
                      const std::atomic<bool>* interrupted) {
  // A --json path that can't be written fails now, not after the run.
  if (!options.json_path.empty() && !std::ofstream(options.json_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", options.json_path));
  }
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
