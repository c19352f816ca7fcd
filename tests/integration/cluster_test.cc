// Real processes on 127.0.0.1: a coordinator and P gradmesh-worker
// processes (LocalCluster), driven through the SDK over shared memory.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc/grpc_util.h"
#include "common/grpc/health_server.h"
#include "common/shm_segment.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gradmesh/v1/coordinator.grpc.pb.h"
#include "gradmesh/v1/peer.grpc.pb.h"
#include "gradmesh/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/protocol_version.h"
#include "tests/support/free_port.h"
#include "tests/support/scrape.h"
#include "tools/gradmesh/local.h"
#include "tools/gradmesh/local_cluster.h"
#include "tools/gradmesh/synthetic.h"
#include "worker/collectives/mass_balance.h"

namespace gradmesh::tools {
namespace {

// A training process per worker, as the SDK's user holds it: a client and
// one registered bucket "g" of n values.
struct Trainer {
  std::unique_ptr<Client> client;
  std::unique_ptr<TensorSet> set;
};

// What one worker's step returned.
struct StepResult {
  absl::Status status;
  ReduceInfo info;
  sparse::SparseBlock result;
  std::vector<float> residual;
};
using StepResults = std::vector<StepResult>;

// Connects to and registers bucket "g" on every worker at once.
std::vector<Trainer> ConnectAll(LocalCluster& cluster, const std::string& job,
                                uint64_t n, absl::Duration timeout) {
  std::vector<Trainer> trainers(cluster.size());
  std::vector<std::thread> threads;
  for (int w = 0; w < cluster.size(); ++w) {
    threads.emplace_back([&, w] {
      auto client = Client::Connect(
          {.worker = cluster.sdk_address(w), .job = job, .timeout = timeout});
      ASSERT_TRUE(client.ok()) << client.status();
      auto set = (*client)->Register("g", {{"g", n}});
      ASSERT_TRUE(set.ok()) << set.status();
      trainers[w] = {*std::move(client), *std::move(set)};
    });
  }
  for (std::thread& t : threads) t.join();
  return trainers;
}

// Step `step` on the given workers at once, with seeded gradients written
// into the shared buckets; the sparse result and residual come back.
StepResults RunStep(std::vector<Trainer>& trainers,
                    const std::vector<int>& workers, uint64_t step,
                    std::vector<std::vector<float>>* inputs = nullptr) {
  StepResults results(workers.size());
  if (inputs != nullptr) inputs->assign(workers.size(), {});
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] {
      Trainer& t = trainers[workers[i]];
      SyntheticGradient(7, workers[i], step, t.set->values());
      if (inputs != nullptr) {
        (*inputs)[i].assign(t.set->values().begin(), t.set->values().end());
      }
      auto info = t.client->AllReduce(
          *t.set, step,
          {.layout = ResultLayout::kSparse, .return_residual = true});
      StepResult& r = results[i];
      r.status = info.status();
      if (!info.ok()) return;
      r.info = *info;
      const auto indices = t.set->sparse_indices(info->nonzeros);
      const auto values = t.set->sparse_values(info->nonzeros);
      r.result.indices.assign(indices.begin(), indices.end());
      r.result.values.assign(values.begin(), values.end());
      r.residual.assign(t.set->residual().begin(), t.set->residual().end());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Every trainer fills its bucket with its worker's index + 1 and takes
// root's through Broadcast.
void ExpectBroadcastReachesAll(std::vector<Trainer>& trainers, int root) {
  std::vector<std::thread> threads;
  for (int w = 0; w < static_cast<int>(trainers.size()); ++w) {
    threads.emplace_back([&, w] {
      Trainer& t = trainers[w];
      std::fill(t.set->values().begin(), t.set->values().end(), float(w + 1));
      ASSERT_TRUE(t.client->Broadcast(*t.set, root).ok());
      for (float v : t.set->values()) ASSERT_EQ(v, float(root + 1));
    });
  }
  for (auto& t : threads) t.join();
}

// Worker `behind` is back in the group as the same process after the others
// went on without it: step `step` fails alike on every trainer with
// DataLoss naming its replica, and a Broadcast from rank 0 (whole) makes
// every replica whole again.
void ExpectBehindUntilBroadcast(std::vector<Trainer>& trainers, uint64_t step,
                                int behind) {
  std::vector<int> all(trainers.size());
  for (int w = 0; w < static_cast<int>(all.size()); ++w) all[w] = w;
  for (const StepResult& r : RunStep(trainers, all, step)) {
    EXPECT_TRUE(absl::IsDataLoss(r.status)) << r.status;
    EXPECT_THAT(std::string(r.status.message()),
                ::testing::HasSubstr(
                    absl::StrCat("rank ", behind, "'s replica differs")));
  }
  ExpectBroadcastReachesAll(trainers, /*root=*/0);
}

// The status of coordinator `method` called with `request`.
template <typename Request, typename Response>
grpc::StatusCode CallCoordinator(
    gradmesh::v1::Coordinator::Stub& stub,
    grpc::Status (gradmesh::v1::Coordinator::Stub::*method)(
        grpc::ClientContext*, const Request&, Response*),
    const Request& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  Response response;
  return (stub.*method)(&context, request, &response).error_code();
}

using ::gradmesh::testing::Scrape;

class ClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && cluster_ != nullptr) {
      cluster_->KeepWorkDir();
      std::printf("logs kept in %s\n", cluster_->work_dir().c_str());
    }
  }
  void Start(
      int workers,
      std::vector<std::pair<std::string, std::string>> coordinator_flags,
      std::vector<std::pair<std::string, std::string>> worker_flags = {}) {
    auto cluster =
        LocalCluster::Start({.workers = workers,
                             .coordinator_flags = std::move(coordinator_flags),
                             .worker_flags = std::move(worker_flags)});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_TRUE(cluster_->WaitForView(workers, absl::Seconds(30)).ok());
  }
  std::unique_ptr<LocalCluster> cluster_;
};

// Worker 2 stalls (SIGSTOP) before a step: the survivors run the step
// without it once the coordinator drops it, and its own trainer's call ends
// at its deadline. Resumed (SIGCONT), it rejoins at a newer epoch; the next
// step fails with DataLoss on all four (its replica lacks the step the
// others ran; before, it ran, and the replicas differed for good), a
// Broadcast from a survivor brings its trainer the current parameters, and
// the next step runs on all four.
TEST_F(ClusterTest, AStalledWorkerIsDroppedThenRejoins) {
  constexpr absl::Duration kTimeout = absl::Seconds(6);
  Start(4,
        {{"algo", "spardl"}, {"teams", "2"}, {"heartbeat_timeout_ms", "1500"}},
        {{"operation_timeout_s", "6"}, {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "stall", 10000, kTimeout);
  const StepResults warm = RunStep(trainers, {0, 1, 2, 3}, 0);
  for (const auto& r : warm) ASSERT_TRUE(r.status.ok()) << r.status;

  ASSERT_TRUE(cluster_->Kill(2, SIGSTOP));
  const absl::Time start = absl::Now();
  const StepResults during = RunStep(trainers, {0, 1, 2, 3}, 1);
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(3));
  for (int w : {0, 1, 3}) {
    ASSERT_TRUE(during[w].status.ok()) << w << ": " << during[w].status;
    EXPECT_EQ(during[w].info.world_size, 3);
    EXPECT_GT(during[w].info.epoch, warm[0].info.epoch);
    EXPECT_EQ(during[w].result.values, during[0].result.values);
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(during[2].status)) << during[2].status;

  cluster_->Kill(2, SIGCONT);
  ASSERT_TRUE(cluster_->WaitForView(4, absl::Seconds(20)).ok());
  ExpectBehindUntilBroadcast(trainers, 2, /*behind=*/2);
  const StepResults after = RunStep(trainers, {0, 1, 2, 3}, 3);
  for (const auto& r : after) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 4);
    EXPECT_GT(r.info.epoch, during[0].info.epoch);
    EXPECT_EQ(r.result.values, after[0].result.values);
  }
}

// Four emulated hosts: network namespaces gmf0..3 (10.78.0.1-4), each
// joined to bridge gmfbr0 (10.78.0.254, where the coordinator listens) by a
// veth pair whose outer end is gmfv<i>. Skipped where namespaces can't be
// made (they need root).
class LinkCutTest : public ::testing::Test {
 protected:
  static constexpr int kHosts = 4;
  using Flags = std::vector<std::pair<std::string, std::string>>;

  void SetUp() override {
    // One test at a time may own the namespaces' names (ctest runs tests
    // side by side); the lock goes with the process.
    lock_ = open("/tmp/gradmesh-link-cut.lock", O_CREAT | O_RDWR, 0600);
    ASSERT_GE(lock_, 0);
    ASSERT_EQ(flock(lock_, LOCK_EX), 0);
    RemoveAll();
    if (!Run("ip link add gmfbr0 type bridge")) {
      GTEST_SKIP() << "cannot create network namespaces here (needs root)";
    }
    ASSERT_TRUE(Run("ip addr add 10.78.0.254/24 dev gmfbr0"));
    ASSERT_TRUE(Run("ip link set gmfbr0 up"));
    for (int i = 0; i < kHosts; ++i) {
      const std::string ns = absl::StrCat("gmf", i);
      ASSERT_TRUE(Run(absl::StrCat("ip netns add ", ns)));
      ASSERT_TRUE(Run(absl::StrCat("ip link add gmfv", i,
                                   " type veth peer name eth0 netns ", ns)));
      ASSERT_TRUE(
          Run(absl::StrCat("ip link set gmfv", i, " master gmfbr0 up")));
      ASSERT_TRUE(Run(absl::StrCat("ip -n ", ns, " addr add 10.78.0.", i + 1,
                                   "/24 dev eth0")));
      ASSERT_TRUE(Run(absl::StrCat("ip -n ", ns, " link set eth0 up")));
      ASSERT_TRUE(Run(absl::StrCat("ip -n ", ns, " link set lo up")));
      hosts_.push_back({.netns = ns, .ip = absl::StrCat("10.78.0.", i + 1)});
    }
  }
  void TearDown() override {
    if (HasFailure() && cluster_ != nullptr) {
      cluster_->KeepWorkDir();
      std::printf("logs kept in %s\n", cluster_->work_dir().c_str());
    }
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop().ok());
    }
    cluster_.reset();
    RemoveAll();
    if (lock_ >= 0) close(lock_);
  }

  static bool Run(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  static void RemoveAll() {
    for (int i = 0; i < kHosts; ++i) {
      Run(absl::StrCat("ip netns del gmf", i));
      Run(absl::StrCat("ip link del gmfv", i));
    }
    Run("ip link del gmfbr0");
  }
  // Sets host `host`'s link down or up.
  static void Link(int host, bool up) {
    ASSERT_TRUE(
        Run(absl::StrCat("ip link set gmfv", host, up ? " up" : " down")));
  }

  // Starts a worker on each host and the coordinator on the bridge (SparDL,
  // d = 2, heartbeats every 250 ms, plus the flags given); waits for the
  // view of all of them.
  void StartOnHosts(Flags coordinator_flags, Flags worker_flags) {
    coordinator_flags.insert(coordinator_flags.begin(),
                             {{"algo", "spardl"}, {"teams", "2"}});
    worker_flags.push_back({"heartbeat_interval_ms", "250"});
    auto cluster =
        LocalCluster::Start({.workers = kHosts,
                             .coordinator_flags = std::move(coordinator_flags),
                             .worker_flags = std::move(worker_flags),
                             .hosts = hosts_,
                             .coordinator_host = "10.78.0.254"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_TRUE(cluster_->WaitForView(kHosts, absl::Seconds(30)).ok());
  }

  // Drops every packet between hosts a and b, both ways, or stops dropping
  // them: each sends the other's frames to an address nobody has (the
  // connections stay open, as on a black-holed route).
  static void BlackHole(int a, int b, bool on) {
    for (auto [from, to] : {std::pair(a, b), std::pair(b, a)}) {
      const std::string entry =
          absl::StrCat("ip -n gmf", from, " neigh ", on ? "replace" : "del",
                       " 10.78.0.", to + 1, " dev eth0");
      ASSERT_TRUE(Run(on ? absl::StrCat(entry,
                                        " lladdr 02:00:00:00:00:99 nud "
                                        "permanent")
                         : entry));
    }
  }

  std::vector<LocalClusterOptions::Host> hosts_;
  std::unique_ptr<LocalCluster> cluster_;
  int lock_ = -1;
};

// A link cut shorter than the heartbeat timeout: the step in flight ends
// (OK or an error) within the operation timeout and the next one succeeds
// on the same members. One longer than it: worker 2 is dropped, the others
// run the step without it; back, it rejoins, its replica counts as behind
// until a Broadcast brings its trainer the current parameters, and steps run
// on all four.
TEST_F(LinkCutTest, ABriefCutHealsAndALongOneDropsThenRejoins) {
  constexpr absl::Duration kTimeout = absl::Seconds(8);
  StartOnHosts({{"heartbeat_timeout_ms", "2000"}},
               {{"operation_timeout_s", "8"}});
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Trainer> trainers = ConnectAll(*cluster_, "cut", 10000, kTimeout);
  const StepResults warm = RunStep(trainers, {0, 1, 2, 3}, 0);
  for (const auto& r : warm) ASSERT_TRUE(r.status.ok()) << r.status;

  // Brief: 500 ms down during a step.
  Link(2, false);
  std::thread restore([] {
    absl::SleepFor(absl::Milliseconds(500));
    Link(2, true);
  });
  absl::Time start = absl::Now();
  const StepResults brief = RunStep(trainers, {0, 1, 2, 3}, 1);
  restore.join();
  // TCP retransmits what the cut lost: the step completes everywhere.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  for (const auto& r : brief) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 4);
  }
  const StepResults healed = RunStep(trainers, {0, 1, 2, 3}, 2);
  for (const auto& r : healed) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 4);
    EXPECT_EQ(r.result.values, healed[0].result.values);
  }

  // Long: 4 s down, past the heartbeat timeout.
  Link(2, false);
  std::thread restore_later([] {
    absl::SleepFor(absl::Seconds(4));
    Link(2, true);
  });
  start = absl::Now();
  const StepResults cut = RunStep(trainers, {0, 1, 2, 3}, 3);
  restore_later.join();
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(2));
  for (int w : {0, 1, 3}) {
    ASSERT_TRUE(cut[w].status.ok()) << w << ": " << cut[w].status;
    EXPECT_EQ(cut[w].info.world_size, 3);
    EXPECT_EQ(cut[w].result.values, cut[0].result.values);
  }
  EXPECT_FALSE(cut[2].status.ok());
  ASSERT_TRUE(cluster_->WaitForView(kHosts, absl::Seconds(20)).ok());
  // A peer connection that the cut left with data unacknowledged past TCP's
  // user timeout (gRPC sets it to the keepalive timeout, 5 s) dies now, and
  // may take the first step with it: an error within the operation timeout,
  // no hang. The next fails with DataLoss on all four until a Broadcast
  // (worker 2's replica lacks step 3), and the one after succeeds.
  start = absl::Now();
  RunStep(trainers, {0, 1, 2, 3}, 4);  // errors in time
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(2));
  ExpectBehindUntilBroadcast(trainers, 5, /*behind=*/2);
  const StepResults back = RunStep(trainers, {0, 1, 2, 3}, 6);
  for (const auto& r : back) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 4);
    EXPECT_EQ(r.result.values, back[0].result.values);
  }
}

// The link between hosts 1 and 2 drops every packet while both heartbeat:
// the worker whose messages stop moving reports its peer, the coordinator
// removes one end, and the other three go on (before, every step waited out
// the operation timeout, and the next ones too). Through a restart of the
// coordinator and while the link stays bad past its quarantine the removed
// worker stays out; healed, it rejoins, and a Broadcast brings its trainer the
// parameters.
TEST_F(LinkCutTest, ABlackHoledLinkRemovesOneEndAndTheOthersGoOn) {
  constexpr absl::Duration kTimeout = absl::Seconds(20);
  StartOnHosts({{"heartbeat_timeout_ms", "1500"}, {"quarantine_s", "10"}},
               {{"operation_timeout_s", "20"}, {"link_timeout_s", "1"}});
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "hole", 200000, kTimeout);
  const StepResults warm = RunStep(trainers, {0, 1, 2, 3}, 0);
  for (const auto& r : warm) ASSERT_TRUE(r.status.ok()) << r.status;

  BlackHole(1, 2, true);
  absl::Time start = absl::Now();
  const StepResults hit = RunStep(trainers, {0, 1, 2, 3}, 1);
  // The survivors rerun it without the removed end (or, where the dead
  // connection failed it first, fail it): no wait for the timeout.
  EXPECT_LT(absl::Now() - start, kTimeout / 2);
  const int removed = hit[1].status.ok() ? 2 : 1;
  EXPECT_FALSE(hit[removed].status.ok());
  std::vector<int> survivors;
  for (int w = 0; w < kHosts; ++w) {
    if (w != removed) survivors.push_back(w);
  }
  start = absl::Now();
  const StepResults after = RunStep(trainers, survivors, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const auto& r : after) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, kHosts - 1);
    EXPECT_EQ(r.result.values, after[0].result.values);
  }

  // The coordinator restarts: it learns the quarantine from the survivors'
  // views (before, it forgot it and let the removed worker in at once).
  // The quarantine (10 s) ends with the link still bad: the removed worker
  // cannot reach its peer as it joins, so it stays out and the others' steps
  // go on (before, it rejoined and cut them again until reported once more).
  ASSERT_TRUE(cluster_->RestartCoordinator().ok());
  EXPECT_FALSE(cluster_->WaitForView(kHosts, absl::Seconds(14)).ok())
      << cluster_->coordinator_log();
  for (const auto& r : RunStep(trainers, survivors, 3)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, kHosts - 1);
  }

  BlackHole(1, 2, false);
  ASSERT_TRUE(cluster_->WaitForView(kHosts, absl::Seconds(30)).ok());
  RunStep(trainers, {0, 1, 2, 3}, 4);  // fails, in time (see above)
  ExpectBehindUntilBroadcast(trainers, 5, /*behind=*/1);
  const StepResults back = RunStep(trainers, {0, 1, 2, 3}, 6);
  for (const auto& r : back) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, kHosts);
  }
}

// Worker 2 is killed and started again: a new process, without the
// bucket. Either the survivors first run a step without it (it was out of
// the view when it came back) or it comes back within the heartbeat timeout
// (the same node id, a new incarnation: still a membership change). Once it
// is back in the view, the survivors' next step fails at once with
// FailedPrecondition (its gradient kept); every trainer registers again
// (worker 2's is a new one), the survivors carry their residuals over, a
// Broadcast brings everyone rank 0's parameters, and the next step runs on
// all four, conserving what the survivors held.
class RestartTest : public ClusterTest,
                    public ::testing::WithParamInterface<bool> {
 protected:
  static constexpr absl::Duration kTimeout = absl::Seconds(8);
  static constexpr uint64_t kN = 10000;

  // Kills and restarts worker 2; returns the survivors' (0, 1, 3) residuals
  // once the restarted worker is in the view.
  std::vector<std::vector<float>> KillAndRestart(std::vector<Trainer>& trainers,
                                                 bool evicted_first) {
    std::vector<std::vector<float>> residuals;
    for (const auto& r : RunStep(trainers, {0, 1, 2, 3}, 0)) {
      EXPECT_TRUE(r.status.ok()) << r.status;
      residuals.push_back(r.residual);
    }
    residuals.erase(residuals.begin() + 2);  // worker 2's
    const absl::StatusOr<Plan> plan = cluster_->GetPlan(0);
    EXPECT_TRUE(plan.ok()) << plan.status();
    cluster_->Kill(2, SIGKILL);
    trainers[2] = {};
    if (evicted_first) {
      const StepResults lost = RunStep(trainers, {0, 1, 3}, 1);
      for (size_t i = 0; i < lost.size(); ++i) {
        EXPECT_TRUE(lost[i].status.ok()) << lost[i].status;
        EXPECT_EQ(lost[i].info.world_size, 3);
        residuals[i] = lost[i].residual;
      }
    }
    EXPECT_TRUE(cluster_->RestartWorker(2).ok());
    EXPECT_TRUE(cluster_->WaitForView(4, absl::Seconds(20)).ok());
    if (!evicted_first && plan.ok()) {
      // One change, the new process's join: it was never evicted.
      const absl::StatusOr<Plan> now = cluster_->GetPlan(0);
      EXPECT_TRUE(now.ok() && now->epoch == plan->epoch + 1)
          << plan->epoch << " then " << (now.ok() ? now->epoch : 0);
    }
    return residuals;
  }
};

TEST_P(RestartTest, ARestartedWorkerRejoinsThroughRegisterAndBroadcast) {
  const bool evicted_first = GetParam();
  // Within the timeout: long enough that the restart beats it.
  Start(4,
        {{"algo", "spardl"},
         {"teams", "2"},
         {"heartbeat_timeout_ms", evicted_first ? "1500" : "6000"}},
        {{"operation_timeout_s", "8"}, {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "restart", kN, kTimeout);
  // The usual start: rank 0's parameters everywhere (so the survivors'
  // broadcast counters are ahead of a new trainer's).
  ExpectBroadcastReachesAll(trainers, /*root=*/0);
  const std::vector<std::vector<float>> held =
      KillAndRestart(trainers, evicted_first);
  ASSERT_FALSE(HasFailure());

  const absl::Time start = absl::Now();
  std::vector<std::vector<float>> refused_inputs;
  for (const auto& r : RunStep(trainers, {0, 1, 3}, 2, &refused_inputs)) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status)) << r.status;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  // Everyone registers again; the survivors keep their residuals, which
  // hold the refused step's gradient.
  std::vector<std::vector<float>> kept(4);
  for (int i = 0; i < 3; ++i) {
    const int w = std::vector<int>{0, 1, 3}[i];
    Trainer& t = trainers[w];
    ASSERT_TRUE(t.client->SaveResidual(*t.set).ok());
    kept[w].assign(t.set->residual().begin(), t.set->residual().end());
    for (uint64_t j = 0; j < kN; ++j) {
      ASSERT_FLOAT_EQ(kept[w][j], held[i][j] + refused_inputs[i][j])
          << w << " " << j;
    }
    t.set.reset();
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      Trainer& t = trainers[w];
      if (t.client == nullptr) {
        auto client = Client::Connect({.worker = cluster_->sdk_address(w),
                                       .job = "restart",
                                       .timeout = kTimeout});
        ASSERT_TRUE(client.ok()) << client.status();
        t.client = *std::move(client);
      }
      auto set = t.client->Register("g", {{"g", kN}});
      ASSERT_TRUE(set.ok()) << set.status();
      t.set = *std::move(set);
      if (!kept[w].empty()) {
        ASSERT_TRUE(t.client->LoadResidual(*t.set, kept[w]).ok());
      } else {
        kept[w].assign(kN, 0.0f);
      }
    });
  }
  for (auto& t : threads) t.join();
  ExpectBroadcastReachesAll(trainers, /*root=*/0);

  std::vector<std::vector<float>> pushed;
  const StepResults after = RunStep(trainers, {0, 1, 2, 3}, 0, &pushed);
  std::vector<std::vector<float>> left;
  for (const auto& r : after) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 4);
    EXPECT_EQ(r.result.values, after[0].result.values);
    left.push_back(r.residual);
  }
  const absl::Status conserved =
      collectives::MassBalance(pushed, kept).Check(after[0].result, left);
  EXPECT_TRUE(conserved.ok()) << conserved;
}

INSTANTIATE_TEST_SUITE_P(EvictedFirstOrWithinTheTimeout, RestartTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "AfterEviction"
                                              : "WithinTheHeartbeatTimeout";
                         });

// Trainer 2 stops taking part (it hangs, or is stopped) while its worker
// lives on and heartbeats. The others' step would wait out the operation
// timeout at every step; instead, once they have waited the step-join
// timeout (2 s), worker 2 steps out of the group and they run the step
// without it. Trainer 2's next call rejoins the worker as a new member and
// fails with FailedPrecondition saying why; the others' next step fails
// the same way (a member restarted); all register again, a broadcast from
// a survivor brings trainer 2 the parameters, and steps run on all three.
TEST_F(ClusterTest, ATrainerThatStopsJoiningStepsOutAndTheOthersGoOn) {
  constexpr absl::Duration kTimeout = absl::Seconds(20);
  constexpr uint64_t kN = 5000;
  Start(3, {{"algo", "spardl"}, {"heartbeat_timeout_ms", "1500"}},
        {{"operation_timeout_s", "20"},
         {"step_join_timeout_s", "2"},
         {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers = ConnectAll(*cluster_, "stall", kN, kTimeout);
  for (const auto& r : RunStep(trainers, {0, 1, 2}, 0)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
  }

  absl::Time start = absl::Now();
  const StepResults without = RunStep(trainers, {0, 1}, 1);
  const absl::Duration waited = absl::Now() - start;
  for (const auto& r : without) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 2);
    EXPECT_EQ(r.result.values, without[0].result.values);
  }
  EXPECT_GE(waited, absl::Seconds(2));
  EXPECT_LT(waited, absl::Seconds(8)) << "not the 20 s operation timeout";

  // Trainer 2 comes back at the step it missed.
  start = absl::Now();
  const StepResults late = RunStep(trainers, {2}, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(late[0].status)) << late[0].status;
  EXPECT_THAT(late[0].status.message(),
              ::testing::HasSubstr("stepped out of the group"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  ASSERT_TRUE(cluster_->WaitForView(3, absl::Seconds(10)).ok());
  for (const auto& r : RunStep(trainers, {0, 1}, 2)) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status)) << r.status;
  }

  // Every process registers again; rank 0's parameters go everywhere.
  for (Trainer& t : trainers) t.set.reset();
  std::vector<std::thread> threads;
  for (Trainer& t : trainers) {
    threads.emplace_back([&t] {
      auto set = t.client->Register("g", {{"g", kN}});
      ASSERT_TRUE(set.ok()) << set.status();
      t.set = *std::move(set);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(HasFailure());
  ExpectBroadcastReachesAll(trainers, /*root=*/0);
  const StepResults back = RunStep(trainers, {0, 1, 2}, 0);
  for (const auto& r : back) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 3);
    EXPECT_EQ(r.result.values, back[0].result.values);
  }
}

// A trainer process as its worker sees it, spoken to without the SDK, so
// that it can end without the SDK's goodbye: bucket "g" of n values in a
// segment it holds locked, and the Worker service's stub.
struct BareTrainer {
  SharedSegment segment;
  std::unique_ptr<gradmesh::v1::Worker::Stub> stub;
  std::string job;
};

absl::Status RegisterBare(BareTrainer& t, const std::string& sdk_address,
                          uint64_t n) {
  t.stub = gradmesh::v1::Worker::NewStub(
      grpc::CreateChannel(sdk_address, grpc::InsecureChannelCredentials()));
  const std::string name = SharedSegment::UniqueName("bare");
  GM_ASSIGN_OR_RETURN(t.segment,
                      SharedSegment::Create(name, SegmentLayout(n).bytes));
  GM_RETURN_IF_ERROR(t.segment.HoldLock());
  gradmesh::v1::RegisterRequest request;
  request.set_job(t.job);
  request.set_bucket("g");
  gradmesh::v1::TensorSpec* spec = request.add_tensors();
  spec->set_name("g");
  spec->set_size(n);
  request.set_shm_name(name);
  request.set_client_id("bare");
  request.set_segment_locked(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  gradmesh::v1::RegisterResponse response;
  const grpc::Status status = t.stub->Register(&context, request, &response);
  GM_RETURN_IF_ERROR(SharedSegment::Unlink(name));
  return ToAbsl(status);
}

// Step `step` of bucket "g" (its values as they are); the world size.
absl::StatusOr<int> StepBare(BareTrainer& t, uint64_t step) {
  gradmesh::v1::AllReduceRequest request;
  request.set_job(t.job);
  request.set_bucket("g");
  request.set_step(step);
  request.set_layout(gradmesh::v1::RESULT_SPARSE);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  gradmesh::v1::AllReduceResponse response;
  GM_RETURN_IF_ERROR(ToAbsl(t.stub->AllReduce(&context, request, &response)));
  return response.world_size();
}

// Step `step` on the given bare trainers at once; each must succeed on
// `world_size` members.
void StepBareAll(std::vector<BareTrainer>& trainers,
                 const std::vector<int>& which, uint64_t step, int world_size) {
  std::vector<std::thread> threads;
  for (int w : which) {
    threads.emplace_back([&, w] {
      const absl::StatusOr<int> size = StepBare(trainers[w], step);
      ASSERT_TRUE(size.ok()) << w << ": " << size.status();
      EXPECT_EQ(*size, world_size) << w;
    });
  }
  for (std::thread& t : threads) t.join();
}

// The text of file `path` ("" if it cannot be read).
std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Trainer 2's process exits after a step without unregistering (kill -9, a
// crash): the kernel drops its lock on the segment, and its worker forgets
// the bucket. As soon as the others start the next step, worker 2 steps out,
// and they run the step without it well inside the step-join timeout (15 s
// here) rather than after it. Then the other two exit the same way at the
// job's end: nobody starts another step, and their workers stay members.
TEST_F(ClusterTest, ATrainerThatExitsStepsItsWorkerOutAtOnce) {
  constexpr uint64_t kN = 5000;
  Start(3, {{"algo", "spardl"}, {"heartbeat_timeout_ms", "1500"}},
        {{"operation_timeout_s", "30"},
         {"step_join_timeout_s", "15"},
         {"heartbeat_interval_ms", "250"}});
  std::vector<BareTrainer> trainers(3);
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      trainers[w].job = "exits";
      const absl::Status registered =
          RegisterBare(trainers[w], cluster_->sdk_address(w), kN);
      ASSERT_TRUE(registered.ok()) << w << ": " << registered;
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_FALSE(HasFailure());
  StepBareAll(trainers, {0, 1, 2}, 0, 3);
  ASSERT_FALSE(HasFailure());

  trainers[2].segment = SharedSegment();  // its process ends, no word said
  const absl::Time start = absl::Now();
  StepBareAll(trainers, {0, 1}, 1, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8))
      << "not the 15 s step-join timeout";
  EXPECT_THAT(ReadText(cluster_->worker_log(2)),
              ::testing::HasSubstr("exited without unregistering"));

  trainers[0].segment = SharedSegment();  // the job ends
  trainers[1].segment = SharedSegment();
  absl::SleepFor(absl::Seconds(2));
  for (int w : {0, 1}) {
    const std::string log = ReadText(cluster_->worker_log(w));
    EXPECT_THAT(log, ::testing::HasSubstr("forgot bucket 'g' of job 'exits'"));
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("stepping out")));
  }
}

// 50 iterations of every algorithm on 4 and 6 processes (15 under
// AddressSanitizer: the same code in a third of the time, though SparDL's
// autotune may not have chosen by then): RunLocal checks each iteration
// (bitwise-identical results on every worker, and the inputs equal the
// result plus the residuals, index by index).
class AlgorithmClusterTest
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

#ifdef __SANITIZE_ADDRESS__
constexpr int kCheckedIterations = 15;
#else
constexpr int kCheckedIterations = 50;
#endif

TEST_P(AlgorithmClusterTest, CheckedIterations) {
  const auto& [algorithm, workers] = GetParam();
  LocalOptions options;
  options.cluster.workers = workers;
  options.cluster.coordinator_flags = {
      {"algo", algorithm == "spardl-d2" ? "spardl" : algorithm},
      {"teams", algorithm == "spardl-d2" ? "2" : "0"},
      {"density", "0.02"},
      {"chunk_bytes", "4096"},  // messages cross chunk boundaries
      {"autotune_window", "2"}};
  options.n = 20000;
  options.iterations = kCheckedIterations;
  options.timeout = absl::Seconds(30);
  const absl::Status status = RunLocal(options, nullptr);
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(
    Processes, AlgorithmClusterTest,
    ::testing::Combine(::testing::Values("spardl", "spardl-d2", "dense",
                                         "topka", "gaussiank", "topkdsa",
                                         "gtopk", "oktopk"),
                       ::testing::Values(4, 6)),
    [](const auto& param_info) {
      std::string name = std::get<0>(param_info.param) + "_P" +
                         std::to_string(std::get<1>(param_info.param));
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

// kill -9 of a worker in the middle of an iteration: the coordinator
// publishes an epoch without it, the survivors run the step again there
// within the operation timeout (it succeeds on P - 1 workers, nothing
// lost), and the next iterations succeed too.
TEST_F(ClusterTest, KillNineMidIterationThenContinueWithoutIt) {
  constexpr absl::Duration kTimeout = absl::Seconds(8);
  Start(4,
        {{"algo", "spardl"}, {"teams", "2"}, {"heartbeat_timeout_ms", "1500"}},
        {{"operation_timeout_s", "8"}, {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "kill", 10000, kTimeout);
  StepResults warm;
  for (uint64_t step = 0; step < 3; ++step) {
    warm = RunStep(trainers, {0, 1, 2, 3}, step);
    for (const auto& r : warm) ASSERT_TRUE(r.status.ok()) << r.status;
  }
  // Step 3 reaches the survivors; worker 2 dies while they wait on it. They
  // run the step again on the new view: it succeeds without worker 2, and
  // nothing the survivors pushed is lost.
  StepResults during;
  std::vector<std::vector<float>> pushed;
  absl::Duration took;
  std::thread survivors([&] {
    const absl::Time start = absl::Now();
    during = RunStep(trainers, {0, 1, 3}, 3, &pushed);
    took = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(300));
  cluster_->Kill(2, SIGKILL);
  survivors.join();
  std::vector<std::vector<float>> carried, kept;
  for (const auto& r : during) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 3);
    EXPECT_GT(r.info.epoch, warm[0].info.epoch);
    EXPECT_EQ(r.result.values, during[0].result.values);
    kept.push_back(r.residual);
  }
  for (int w : {0, 1, 3}) carried.push_back(warm[w].residual);
  EXPECT_LT(took, kTimeout + absl::Seconds(2));
  // Worker 2's trainer learns at once that its worker is gone.
  {
    const absl::Time asked = absl::Now();
    auto gone = trainers[2].client->AllReduce(*trainers[2].set, 3);
    EXPECT_TRUE(IsWorkerGone(gone.status())) << gone.status();
    EXPECT_LT(absl::Now() - asked, absl::Seconds(3));
  }
  const absl::Status conserved =
      collectives::MassBalance(pushed, carried).Check(during[0].result, kept);
  EXPECT_TRUE(conserved.ok()) << conserved;

  ASSERT_TRUE(cluster_->WaitForView(3, absl::Seconds(20)).ok());
  std::vector<std::vector<float>> inputs;
  const StepResults after = RunStep(trainers, {0, 1, 3}, 4, &inputs);
  for (const auto& r : after) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 3);
    EXPECT_EQ(r.result.indices, after[0].result.indices);
    EXPECT_EQ(r.result.values, after[0].result.values);
  }
  // The one after that conserves mass from the residuals now known.
  std::vector<std::vector<float>> residuals;
  for (const auto& r : after) residuals.push_back(r.residual);
  const StepResults next = RunStep(trainers, {0, 1, 3}, 5, &inputs);
  std::vector<std::vector<float>> left;
  for (const auto& r : next) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    left.push_back(r.residual);
  }
  const absl::Status balanced =
      collectives::MassBalance(inputs, residuals).Check(next[0].result, left);
  EXPECT_TRUE(balanced.ok()) << balanced;
}

// Steps on `workers` until one succeeds on all of them (a view change may
// fail a few), for up to `timeout`; the last attempt's results.
StepResults StepUntilAllSucceed(std::vector<Trainer>& trainers,
                                const std::vector<int>& workers, uint64_t* step,
                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  StepResults results;
  do {
    results = RunStep(trainers, workers, (*step)++);
    if (std::all_of(results.begin(), results.end(),
                    [](const StepResult& r) { return r.status.ok(); })) {
      break;
    }
  } while (absl::Now() < deadline);
  return results;
}

// The coordinator is paused (SIGSTOP) for longer than the heartbeat timeout
// and resumed: the silence it could not watch counts against nobody, so the
// members keep their epoch and the next step runs on all three.
TEST_F(ClusterTest, APausedCoordinatorEvictsNobody) {
  Start(3,
        {{"algo", "spardl"}, {"teams", "1"}, {"heartbeat_timeout_ms", "2000"}},
        {{"operation_timeout_s", "8"}, {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "pause", 4000, absl::Seconds(20));
  const StepResults before = RunStep(trainers, {0, 1, 2}, 0);
  for (const auto& r : before) ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_TRUE(cluster_->SignalCoordinator(SIGSTOP));
  absl::SleepFor(absl::Seconds(5));
  cluster_->SignalCoordinator(SIGCONT);
  absl::SleepFor(absl::Seconds(1));
  for (const auto& r : RunStep(trainers, {0, 1, 2}, 1)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 3);
    EXPECT_EQ(r.info.epoch, before[0].info.epoch);
  }
}

// The coordinator is down long enough (30 s) for gRPC's default reconnect
// backoff to put a worker's next try many seconds after the restart, past
// the heartbeat timeout that an adopted member has to come back. Every
// worker must be back within that time, so that nobody is evicted and the
// next step runs on all three under the same epoch.
TEST_F(ClusterTest, EveryWorkerIsBackSoonAfterALongCoordinatorOutage) {
  Start(3,
        {{"algo", "spardl"}, {"teams", "1"}, {"heartbeat_timeout_ms", "3000"}},
        {{"operation_timeout_s", "8"}, {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "outage", 4000, absl::Seconds(20));
  const StepResults before = RunStep(trainers, {0, 1, 2}, 0);
  for (const auto& r : before) ASSERT_TRUE(r.status.ok()) << r.status;
  cluster_->SignalCoordinator(SIGKILL);
  absl::SleepFor(absl::Seconds(30));
  ASSERT_TRUE(cluster_->RestartCoordinator().ok());
  // Past the time an adopted member has to come back, the new coordinator
  // runs every member under the same epoch.
  absl::SleepFor(absl::Seconds(4.5));
  const std::string metrics = Scrape(cluster_->coordinator_metrics_port());
  EXPECT_TRUE(absl::StrContains(metrics, "gradmesh_coordinator_members 3"))
      << metrics;
  EXPECT_TRUE(absl::StrContains(
      metrics,
      absl::StrCat("gradmesh_coordinator_epoch ", before[0].info.epoch, "\n")))
      << metrics;
  for (const auto& r : RunStep(trainers, {0, 1, 2}, 1)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 3);
    EXPECT_EQ(r.info.epoch, before[0].info.epoch);
  }
}

// A worker restarted three times comes back on a new port each time: its
// peers keep channels to the addresses of the newest view only, not to
// every address a member ever had.
TEST_F(ClusterTest, ChannelsToAddressesNoViewHasAreDropped) {
  Start(3, {{"algo", "spardl"}, {"teams", "1"}},
        {{"heartbeat_interval_ms", "250"}});
  // A barrier on every worker: each sends to its peers.
  auto barrier = [&] {
    std::vector<std::thread> threads;
    for (int w = 0; w < 3; ++w) {
      threads.emplace_back([&, w] {
        auto client = Client::Connect({.worker = cluster_->sdk_address(w),
                                       .job = "prune",
                                       .timeout = absl::Seconds(20)});
        ASSERT_TRUE(client.ok()) << client.status();
        EXPECT_TRUE((*client)->Barrier().ok());
      });
    }
    for (auto& t : threads) t.join();
  };
  barrier();
  for (int restart = 0; restart < 3; ++restart) {
    ASSERT_TRUE(cluster_->RestartWorker(2).ok());
    ASSERT_TRUE(cluster_->WaitForView(3, absl::Seconds(20)).ok());
    barrier();
  }
  // Its coordinator and its two peers now.
  const std::string metrics = Scrape(cluster_->worker_metrics_port(0));
  EXPECT_TRUE(absl::StrContains(metrics, "gradmesh_worker_peer_channels 3\n"))
      << metrics;
}

// The SDK's unix socket is served by the same server as the peers (the
// default, and the Kubernetes one): a process that reaches that socket is a
// trainer, not a peer, and may neither send Exchange frames for a rank nor
// ask about (and so make a worker promise to refuse) a step. A member's
// question is bounded too.
TEST_F(ClusterTest, PeerCallsOverTheSdkSocketAreRefused) {
  Start(2, {{"algo", "spardl"}, {"teams", "1"}});
  const absl::StatusOr<Plan> plan = cluster_->GetPlan(0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto channel = grpc::CreateChannel(cluster_->sdk_address(0),
                                     grpc::InsecureChannelCredentials());
  auto peer = gradmesh::v1::Peer::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = peer->Exchange(&context);
  gradmesh::v1::Frame frame;
  frame.set_epoch(plan->epoch);
  frame.set_from_rank(1);
  frame.set_message_bytes(3);
  frame.set_data("abc");
  stream->Write(frame);
  stream->WritesDone();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);

  auto commit = gradmesh::v1::Commit::NewStub(channel);
  grpc::ClientContext ask;
  ask.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  gradmesh::v1::OutcomeRequest request;
  request.set_epoch(plan->epoch);
  request.set_step(1);
  gradmesh::v1::OutcomeResponse response;
  EXPECT_EQ(commit->Outcome(&ask, request, &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Over the peer port, a question naming more members gone than any group
  // has is refused before it is held.
  auto member = gradmesh::v1::Commit::NewStub(grpc::CreateChannel(
      cluster_->worker_address(0), grpc::InsecureChannelCredentials()));
  for (int i = 0; i <= 4096; ++i) {
    request.add_gone_member_ids(absl::StrCat("node-", i));
  }
  grpc::ClientContext too_many;
  too_many.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const grpc::Status refused = member->Outcome(&too_many, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << refused.error_message();
  request.clear_gone_member_ids();
  request.add_gone_member_ids(std::string(1025, 'x'));
  grpc::ClientContext too_long;
  too_long.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(member->Outcome(&too_long, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A worker of another protocol version (0: a gradmesh from before versions
// were named) is refused at Join, with both versions named, and nothing
// changes: no new epoch. Hello answers the coordinator's version to any
// worker.
TEST_F(ClusterTest, AJoinOfAnotherProtocolIsRefused) {
  Start(2, {{"algo", "dense"}});
  const absl::StatusOr<Plan> before = cluster_->GetPlan(0);
  ASSERT_TRUE(before.ok()) << before.status();
  auto coordinator = gradmesh::v1::Coordinator::NewStub(grpc::CreateChannel(
      cluster_->coordinator_address(), grpc::InsecureChannelCredentials()));
  auto deadline = [](grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  };
  for (const uint32_t protocol : {0u, kProtocolVersion + 1}) {
    gradmesh::v1::JoinRequest join;
    join.mutable_node()->set_node_id("worker-other-version");
    join.mutable_node()->set_address("127.0.0.1:1");
    join.set_protocol(protocol);
    grpc::ClientContext context;
    deadline(&context);
    gradmesh::v1::JoinResponse response;
    const grpc::Status status = coordinator->Join(&context, join, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(),
                ::testing::HasSubstr(absl::StrCat(
                    "worker worker-other-version speaks protocol ", protocol)));

    gradmesh::v1::HelloRequest hello;
    hello.set_node_id("worker-other-version");
    hello.set_protocol(protocol);
    grpc::ClientContext ask;
    deadline(&ask);
    gradmesh::v1::HelloResponse answer;
    EXPECT_TRUE(coordinator->Hello(&ask, hello, &answer).ok());
    EXPECT_EQ(answer.protocol(), kProtocolVersion);
  }
  gradmesh::v1::HelloRequest hello;
  hello.set_protocol(kProtocolVersion);
  grpc::ClientContext ask;
  deadline(&ask);
  gradmesh::v1::HelloResponse answer;
  EXPECT_TRUE(coordinator->Hello(&ask, hello, &answer).ok());
  EXPECT_EQ(answer.protocol(), kProtocolVersion);
  const absl::StatusOr<Plan> after = cluster_->GetPlan(0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->epoch, before->epoch);
}

// The coordinator dies and a new one takes its address: the members keep
// their view (no new epoch, steps go on), and epochs only grow, so the view
// after a later worker loss is newer than every view the workers ran, even
// when the old coordinator had published more epochs than the new one.
TEST_F(ClusterTest, CoordinatorRestartKeepsTheViewAndLaterLossesHeal) {
  Start(4,
        {{"algo", "spardl"}, {"teams", "1"}, {"heartbeat_timeout_ms", "1500"}},
        {{"operation_timeout_s", "8"}, {"heartbeat_interval_ms", "250"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "restart", 4000, absl::Seconds(20));
  for (const auto& r : RunStep(trainers, {0, 1, 2, 3}, 0)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  // Worker 3 leaves: the old coordinator's epochs go up to 5.
  cluster_->Kill(3, SIGTERM);
  uint64_t step = 1;
  StepResults before =
      StepUntilAllSucceed(trainers, {0, 1, 2}, &step, absl::Seconds(30));
  for (const auto& r : before) ASSERT_TRUE(r.status.ok()) << r.status;
  const uint64_t epoch = before[0].info.epoch;

  ASSERT_TRUE(cluster_->RestartCoordinator().ok());
  absl::SleepFor(absl::Seconds(2));  // heartbeats reach the new coordinator
  for (const auto& r : RunStep(trainers, {0, 1, 2}, step++)) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.epoch, epoch);
  }

  cluster_->Kill(2, SIGKILL);
  const StepResults after =
      StepUntilAllSucceed(trainers, {0, 1}, &step, absl::Seconds(40));
  for (const auto& r : after) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.info.world_size, 2);
    EXPECT_GT(r.info.epoch, epoch);
    EXPECT_EQ(r.result.values, after[0].result.values);
  }
}

// d autotune settles on a d, and both binaries' /metrics answer with the
// documented series.
TEST_F(ClusterTest, AutotunePicksADAndMetricsAnswer) {
  Start(4, {{"algo", "spardl"}, {"teams", "0"}, {"autotune_window", "2"}});
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "test", 20000, absl::Seconds(30));
  uint64_t step = 0;
  bool settled = false;
  for (; step < 40 && !settled; ++step) {
    for (const auto& r : RunStep(trainers, {0, 1, 2, 3}, step)) {
      ASSERT_TRUE(r.status.ok()) << r.status;
    }
    auto plan = trainers[0].client->GetPlan();
    ASSERT_TRUE(plan.ok());
    settled = absl::StartsWith(plan->note, "autotune chose d=");
  }
  ASSERT_TRUE(settled) << "no choice after " << step << " steps";
  // The chosen d runs from its start step on every worker.
  for (int i = 0; i < 3; ++i, ++step) {
    for (const auto& r : RunStep(trainers, {0, 1, 2, 3}, step)) {
      ASSERT_TRUE(r.status.ok()) << r.status;
    }
  }
  const std::string coordinator = Scrape(cluster_->coordinator_metrics_port());
  for (const char* series :
       {"gradmesh_coordinator_members 4", "gradmesh_coordinator_epoch",
        "gradmesh_coordinator_teams", "gradmesh_coordinator_autotuning 0",
        "gradmesh_coordinator_plan_info{algorithm=\"spardl\"",
        "gradmesh_coordinator_autotune_trial_seconds{d=\"1\"}",
        "gradmesh_coordinator_autotune_trial_seconds{d=\"2\"}",
        "gradmesh_coordinator_autotune_modeled_seconds{d=\"4\"}",
        "gradmesh_coordinator_iteration_seconds{node=\"worker-00\"}",
        "gradmesh_coordinator_link_alpha_seconds"}) {
    EXPECT_TRUE(absl::StrContains(coordinator, series))
        << series << " missing from\n"
        << coordinator;
  }
  const std::string worker = Scrape(cluster_->worker_metrics_port(1));
  for (const char* series :
       {"gradmesh_worker_operation_seconds_count{algorithm=\"spardl\"}",
        "gradmesh_worker_topk_seconds_count{algorithm=\"spardl\"}",
        "gradmesh_worker_bytes_sent_total{peer=\"worker-00\"}",
        "gradmesh_worker_bytes_received_total{peer=\"worker-00\"}",
        "gradmesh_worker_nonzeros{phase=\"result\"}",
        "gradmesh_worker_nonzeros{phase=\"srs\"}",
        "gradmesh_worker_residual_norm{buffer=\"test/g\"}",
        "gradmesh_worker_teams", "gradmesh_worker_epoch",
        "gradmesh_worker_rank 1", "gradmesh_worker_world_size 4",
        "gradmesh_worker_operations_total{code=\"OK\"}",
        "gradmesh_worker_frames_dropped_total{reason=\"old_epoch\"}",
        "gradmesh_worker_late_views_total 0"}) {
    EXPECT_TRUE(absl::StrContains(worker, series))
        << series << " missing from\n"
        << worker;
  }
  // An unregistered bucket's series goes (job names are new every run).
  trainers.clear();
  EXPECT_FALSE(absl::StrContains(Scrape(cluster_->worker_metrics_port(1)),
                                 "residual_norm{buffer=\"test/g\"}"));
}

// The SDK against real daemons: buckets in flight finish in any order and
// are matched by name; a second job on the same daemons; mismatched buckets
// and failed steps; the socket's permissions.
class SdkClusterTest : public ClusterTest {
 protected:
  void SetUp() override {
    Start(3, {{"algo", "spardl"}, {"teams", "1"}, {"density", "0.05"}},
          {{"operation_timeout_s", "20"}});
  }
  // Connects one client per worker (no bucket).
  std::vector<std::unique_ptr<Client>> Clients(const std::string& job) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int w = 0; w < cluster_->size(); ++w) {
      auto client = Client::Connect({.worker = cluster_->sdk_address(w),
                                     .job = job,
                                     .timeout = absl::Seconds(20)});
      EXPECT_TRUE(client.ok()) << client.status();
      if (client.ok()) clients.push_back(*std::move(client));
    }
    return clients;
  }
};

TEST_F(SdkClusterTest, BucketsInFlightFinishInAnyOrderMatchedByName) {
  constexpr uint64_t kN = 3000;
  const std::vector<std::string> names = {"a", "b", "c"};
  auto clients = Clients("inflight");
  ASSERT_EQ(clients.size(), 3u);
  // sets[w][b]; registered in the same order everywhere, at once.
  std::vector<std::vector<std::unique_ptr<TensorSet>>> sets(3);
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      for (const auto& name : names) {
        auto set = clients[w]->Register(name, {{"t", kN}});
        ASSERT_TRUE(set.ok()) << set.status();
        sets[w].push_back(*std::move(set));
      }
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (uint64_t step = 0; step < 3; ++step) {
    // got[b][w]: worker w starts bucket (w + i) % 3 i-th, waits in reverse.
    std::vector<std::vector<std::vector<float>>> got(
        3, std::vector<std::vector<float>>(3));
    for (int w = 0; w < 3; ++w) {
      threads.emplace_back([&, w] {
        std::vector<std::pair<int, Handle>> handles;
        for (int i = 0; i < 3; ++i) {
          const int b = (w + i) % 3;
          SyntheticGradient(b, w, step, sets[w][b]->values());
          handles.emplace_back(
              b, clients[w]->AllReduceAsync(*sets[w][b], step,
                                            {.op = ReduceOp::kMean}));
        }
        for (int i = 2; i >= 0; --i) {
          auto& [b, handle] = handles[i];
          auto info = handle.Wait();
          ASSERT_TRUE(info.ok()) << info.status();
          EXPECT_GT(info->nonzeros, 0u);
          got[b][w].assign(sets[w][b]->values().begin(),
                           sets[w][b]->values().end());
        }
      });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    for (int b = 0; b < 3; ++b) {
      EXPECT_EQ(got[b][1], got[b][0]) << "bucket " << b << " step " << step;
      EXPECT_EQ(got[b][2], got[b][0]) << "bucket " << b << " step " << step;
    }
  }
}

// What the SDK reports and refuses on a live worker.
TEST_F(SdkClusterTest, ReportsRankAndPlanAndRefusesBadInput) {
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "surface", 1000, absl::Seconds(20));
  for (int w = 0; w < 3; ++w) {
    Client& c = *trainers[w].client;
    EXPECT_EQ(c.rank(), w);  // worker-0w sorts w-th
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.job(), "surface");
    auto plan = c.GetPlan();
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->algorithm, "spardl");
    EXPECT_EQ(plan->world_size, 3);
    EXPECT_EQ(plan->fusion, "per_tensor");
  }
  TensorSet& set = *trainers[0].set;
  EXPECT_EQ(set.size(), 1000u);
  EXPECT_EQ(set.tensor(0).size(), 1000u);
  EXPECT_TRUE(
      absl::IsInvalidArgument(set.CopyFrom(std::vector<float>(999, 1.0f))));
  ASSERT_TRUE(set.CopyFrom(std::vector<float>(1000, 1.0f)).ok());
  EXPECT_EQ(set.values()[999], 1.0f);
  Client& c = *trainers[0].client;
  EXPECT_TRUE(absl::IsInvalidArgument(
      c.Register("huge", {{"a", 1ull << 31}, {"b", 1ull << 31}}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(c.Register("bad/name", {{"a", 10}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      c.Register("dup", {{"a", 10}, {"a", 10}}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(c.Register("empty", {{"a", 0}}).status()));
}

// The worker's port takes messages of gRPC's default 4 MiB at most, on the
// SDK service and on the peer exchange alike, and serves on after refusing.
TEST_F(SdkClusterTest, RefusesOversizedMessagesAndServesOn) {
  auto channel = grpc::CreateChannel(cluster_->worker_address(0),
                                     grpc::InsecureChannelCredentials());
  auto worker = gradmesh::v1::Worker::NewStub(channel);
  const std::string huge(5 << 20, 'j');
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    gradmesh::v1::RegisterRequest request;
    request.set_job(huge);
    gradmesh::v1::RegisterResponse response;
    EXPECT_EQ(worker->Register(&context, request, &response).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  {
    auto peer = gradmesh::v1::Peer::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto stream = peer->Exchange(&context);
    gradmesh::v1::Frame frame;
    frame.set_message_bytes(huge.size());
    frame.set_data(huge);
    stream->Write(frame);
    stream->WritesDone();
    EXPECT_EQ(stream->Finish().error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // It serves on (the SDK socket: over TCP the SDK needs a token).
  auto local = gradmesh::v1::Worker::NewStub(grpc::CreateChannel(
      cluster_->sdk_address(0), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  gradmesh::v1::StatusResponse status;
  ASSERT_TRUE(
      local->GetStatus(&context, gradmesh::v1::StatusRequest(), &status).ok());
  EXPECT_EQ(status.world_size(), 3);
}

// Residuals go into a training checkpoint and come back after a restart
// (here: a new job, which starts with none): nothing pushed before the
// checkpoint is lost. Bad residuals are refused and change nothing.
TEST_F(SdkClusterTest, ResidualsSurviveACheckpoint) {
  constexpr uint64_t kN = 2000;
  std::vector<Trainer> before =
      ConnectAll(*cluster_, "ckpt", kN, absl::Seconds(20));
  const StepResults first = RunStep(before, {0, 1, 2}, 0);
  std::vector<std::vector<float>> saved;
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(first[w].status.ok()) << first[w].status;
    Trainer& t = before[w];
    ASSERT_TRUE(t.client->SaveResidual(*t.set).ok());
    saved.emplace_back(t.set->residual().begin(), t.set->residual().end());
    EXPECT_EQ(saved[w], first[w].residual);
  }
  before.clear();

  std::vector<Trainer> after =
      ConnectAll(*cluster_, "ckpt-restored", kN, absl::Seconds(20));
  Trainer& t0 = after[0];
  EXPECT_TRUE(absl::IsInvalidArgument(
      t0.client->LoadResidual(*t0.set, std::vector<float>(kN - 1, 0.0f))));
  std::vector<float> bad = saved[0];
  bad[7] = std::nanf("");
  EXPECT_TRUE(absl::IsInvalidArgument(t0.client->LoadResidual(*t0.set, bad)));
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(after[w].client->LoadResidual(*after[w].set, saved[w]).ok());
  }
  std::vector<std::vector<float>> inputs;
  const StepResults next = RunStep(after, {0, 1, 2}, 0, &inputs);
  std::vector<std::vector<float>> left;
  for (const auto& r : next) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    left.push_back(r.residual);
  }
  const absl::Status conserved =
      collectives::MassBalance(inputs, saved).Check(next[0].result, left);
  EXPECT_TRUE(conserved.ok()) << conserved;
}

TEST_F(SdkClusterTest, SecondJobOnLiveDaemonsStartsClean) {
  for (const char* job : {"first", "second"}) {
    std::vector<Trainer> trainers =
        ConnectAll(*cluster_, job, 2000, absl::Seconds(20));
    // Steps start from 0 in every job.
    for (uint64_t step = 0; step < 3; ++step) {
      for (const auto& r : RunStep(trainers, {0, 1, 2}, step)) {
        ASSERT_TRUE(r.status.ok()) << job << ": " << r.status;
      }
    }
  }
}

TEST_F(SdkClusterTest, MismatchedSizesFailOnEveryWorkerWithoutAHang) {
  auto clients = Clients("mismatch");
  ASSERT_EQ(clients.size(), 3u);
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      status[w] =
          clients[w]->Register("g", {{"g", w == 2 ? 1001u : 1000u}}).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) {
    EXPECT_TRUE(absl::IsInvalidArgument(status[w])) << w << ": " << status[w];
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(SdkClusterTest, FailedStepKeepsEveryPushedGradientInTheResiduals) {
  constexpr uint64_t kN = 4000;
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "keep", kN, absl::Seconds(20));
  // Step 0 fails everywhere: worker 1's gradient holds an infinity.
  std::vector<std::vector<float>> pushed(3);
  std::vector<std::thread> threads;
  std::vector<absl::Status> failed(3);
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      Trainer& t = trainers[w];
      SyntheticGradient(3, w, 0, t.set->values());
      if (w == 1) t.set->values()[123] = std::numeric_limits<float>::infinity();
      pushed[w].assign(t.set->values().begin(), t.set->values().end());
      if (w == 1) pushed[w][123] = 0;  // dropped by policy
      failed[w] = t.client->AllReduce(*t.set, 0).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) {
    EXPECT_TRUE(absl::IsInvalidArgument(failed[w])) << failed[w];
  }
  // Step 1 carries step 0's gradients: inputs = both steps' gradients.
  std::vector<std::vector<float>> inputs;
  const StepResults next = RunStep(trainers, {0, 1, 2}, 1, &inputs);
  std::vector<std::vector<float>> residuals;
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(next[w].status.ok()) << next[w].status;
    for (uint64_t i = 0; i < kN; ++i) inputs[w][i] += pushed[w][i];
    residuals.push_back(next[w].residual);
  }
  const absl::Status balanced =
      collectives::MassBalance(
          inputs, std::vector<std::vector<float>>(3, std::vector<float>(kN)))
          .Check(next[0].result, residuals);
  EXPECT_TRUE(balanced.ok()) << balanced;
}

TEST_F(SdkClusterTest, SocketIsOwnerOnlyAndBroadcastReachesEveryone) {
  for (int w = 0; w < cluster_->size(); ++w) {
    const std::string path = cluster_->sdk_address(w).substr(5);  // "unix:"
    struct stat st = {};
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
  }
  std::vector<Trainer> trainers =
      ConnectAll(*cluster_, "broadcast", 5000, absl::Seconds(20));
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      Trainer& t = trainers[w];
      std::fill(t.set->values().begin(), t.set->values().end(), float(w));
      ASSERT_TRUE(t.client->Broadcast(*t.set, /*root=*/1).ok());
      ASSERT_TRUE(t.client->Barrier().ok());
      for (float v : t.set->values()) ASSERT_EQ(v, 1.0f);
    });
  }
  for (auto& t : threads) t.join();
}

// Makes a CA and a node certificate (127.0.0.1) in a new directory, and one
// certificate for each of `hosts` (CertificateFor).
TlsFiles MakeCertificates(const std::string& name,
                          const std::string& hosts = "") {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           absl::StrCat("gradmesh-certs-", getpid(), "-", name))
                              .string();
  const std::string command =
      absl::StrCat(GRADMESH_SOURCE_DIR, "/scripts/make-test-certs.sh ", dir,
                   " ", hosts, " >/dev/null");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return {.ca = dir + "/ca.pem",
          .cert = dir + "/node.pem",
          .key = dir + "/node.key"};
}

// The certificate MakeCertificates made for `host` beside `node`.
TlsFiles CertificateFor(const TlsFiles& node, const std::string& host) {
  const std::string dir = std::filesystem::path(node.ca).parent_path().string();
  return {.ca = node.ca,
          .cert = absl::StrCat(dir, "/", host, ".pem"),
          .key = absl::StrCat(dir, "/", host, ".key")};
}

// A file holding `token`, beside the certificates of `tls`.
std::string WriteToken(const std::string& dir, const std::string& token) {
  const std::string path = dir + "/sdk.token";
  std::ofstream(path) << token << "\n";
  return path;
}

// With mutual TLS the cluster works, and a peer without a valid certificate
// (none, or one from another CA) is refused by workers and coordinator.
TEST(TlsClusterTest, MembersTalkAndStrangersAreRefused) {
  const TlsFiles tls = MakeCertificates("cluster");
  const TlsFiles stranger = MakeCertificates("stranger");
  LocalOptions options;
  options.cluster.workers = 3;
  options.cluster.tls = tls;
  options.cluster.coordinator_flags = {{"algo", "spardl"}, {"teams", "1"}};
  options.cluster.worker_flags = {
      {"sdk_token_file",
       WriteToken(std::filesystem::path(tls.ca).parent_path(), "s3cret")}};
  options.n = 5000;
  options.iterations = 3;
  EXPECT_TRUE(RunLocal(options, nullptr).ok());

  auto cluster = LocalCluster::Start(options.cluster);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForView(3, absl::Seconds(30)).ok());
  const std::string worker = (*cluster)->worker_address(0);
  for (const TlsFiles& wrong : {TlsFiles{}, stranger}) {
    auto client = Client::Connect({.worker = worker,
                                   .tls_ca = wrong.ca,
                                   .tls_cert = wrong.cert,
                                   .tls_key = wrong.key,
                                   .timeout = absl::Seconds(3)});
    EXPECT_FALSE(client.ok());
    EXPECT_TRUE(absl::IsUnavailable(client.status()) ||
                absl::IsDeadlineExceeded(client.status()))
        << client.status();
  }
  // A TLS client with no certificate of its own, on the peer exchange.
  grpc::SslCredentialsOptions anonymous;
  {
    std::ifstream in(tls.ca);
    std::stringstream pem;
    pem << in.rdbuf();
    anonymous.pem_root_certs = pem.str();
  }
  auto channel = grpc::CreateChannel(worker, grpc::SslCredentials(anonymous));
  auto stub = gradmesh::v1::Peer::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  auto stream = stub->Exchange(&context);
  gradmesh::v1::Frame frame;
  frame.set_message_bytes(1);
  frame.set_data("x");
  stream->Write(frame);
  stream->WritesDone();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  // The members still agree: nothing got in.
  auto good = Client::Connect({.worker = worker,
                               .tls_ca = tls.ca,
                               .tls_cert = tls.cert,
                               .tls_key = tls.key,
                               .token = "s3cret",
                               .timeout = absl::Seconds(10)});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->size(), 3);
  good->reset();
  EXPECT_TRUE((*cluster)->Stop().ok());
  for (const TlsFiles& set : {tls, stranger}) {
    std::filesystem::remove_all(std::filesystem::path(set.ca).parent_path());
  }
}

// Workers on 127.0.0.2, .3 and .4, each with a certificate naming its own
// address only: a member's certificate cannot speak for another member, at
// the coordinator or at a peer, and a certificate of the same CA that names
// no member cannot ask a worker about a step's outcome. The cluster runs
// on after every refusal.
TEST(TlsClusterTest, AMemberCannotSpeakForAnotherOrAStrangerForAMember) {
  const std::vector<std::string> ips = {"127.0.0.2", "127.0.0.3", "127.0.0.4"};
  const TlsFiles tls = MakeCertificates("identity", absl::StrJoin(ips, " "));
  LocalClusterOptions cluster_options{
      .workers = 3,
      .coordinator_flags = {{"algo", "spardl"}, {"teams", "1"}},
      .tls = tls};
  for (const std::string& ip : ips) {
    cluster_options.hosts.push_back({.ip = ip, .tls = CertificateFor(tls, ip)});
  }
  auto cluster = LocalCluster::Start(cluster_options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForView(3, absl::Seconds(30)).ok());
  auto channel = [&](const std::string& address, const TlsFiles& as) {
    auto credentials = ChannelCredentials(as);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return grpc::CreateChannel(address, *credentials);
  };
  auto deadline = [](grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  };
  const TlsFiles worker2 = CertificateFor(tls, ips[2]);

  // At the coordinator: worker 2's certificate speaking for worker 0.
  auto coordinator = gradmesh::v1::Coordinator::NewStub(
      channel((*cluster)->coordinator_address(), worker2));
  auto call = [&](auto method, const auto& request) {
    return CallCoordinator(*coordinator, method, request);
  };
  gradmesh::v1::HeartbeatRequest heartbeat;
  heartbeat.set_node_id("worker-00");
  EXPECT_EQ(call(&gradmesh::v1::Coordinator::Stub::Heartbeat, heartbeat),
            grpc::StatusCode::PERMISSION_DENIED);
  gradmesh::v1::LeaveRequest leave;
  leave.set_node_id("worker-00");
  EXPECT_EQ(call(&gradmesh::v1::Coordinator::Stub::Leave, leave),
            grpc::StatusCode::PERMISSION_DENIED);
  // A new node id at worker 0's host, and worker 0's id at its own host.
  for (const auto& [id, ip] :
       {std::pair{"worker-impostor", ips[0]}, std::pair{"worker-00", ips[2]}}) {
    gradmesh::v1::JoinRequest join;
    join.mutable_node()->set_node_id(id);
    join.mutable_node()->set_address(absl::StrCat(ip, ":1"));
    EXPECT_EQ(call(&gradmesh::v1::Coordinator::Stub::Join, join),
              grpc::StatusCode::PERMISSION_DENIED)
        << id;
  }

  // At worker 0: worker 2's certificate claiming rank 1 on the peer exchange.
  gradmesh::Plan plan;
  {
    auto got = (*cluster)->GetPlan(0);
    ASSERT_TRUE(got.ok()) << got.status();
    plan = *got;
  }
  {
    auto peer = gradmesh::v1::Peer::NewStub(
        channel((*cluster)->worker_address(0), worker2));
    grpc::ClientContext context;
    deadline(&context);
    auto stream = peer->Exchange(&context);
    gradmesh::v1::Frame frame;
    frame.set_epoch(plan.epoch);
    frame.set_from_rank(1);
    frame.set_message_bytes(6);
    frame.set_data("forged");
    stream->Write(frame);
    stream->WritesDone();
    EXPECT_EQ(stream->Finish().error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }

  // At worker 0's Commit service: a stranger (127.0.0.1 is no member) and a
  // member asking about a step.
  auto ask = [&](const TlsFiles& as, uint64_t epoch) {
    auto commit = gradmesh::v1::Commit::NewStub(
        channel((*cluster)->worker_address(0), as));
    grpc::ClientContext context;
    deadline(&context);
    gradmesh::v1::OutcomeRequest request;
    request.set_epoch(epoch);
    request.set_bucket_id(1);
    request.set_step(1000000);
    gradmesh::v1::OutcomeResponse response;
    return commit->Outcome(&context, request, &response).error_code();
  };
  EXPECT_EQ(ask(tls, plan.epoch), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ask(worker2, plan.epoch), grpc::StatusCode::OK);
  // No promise for an epoch not installed there yet.
  EXPECT_EQ(ask(worker2, plan.epoch + 5), grpc::StatusCode::UNAVAILABLE);

  // Nothing got in: every member is still there, at the same epoch, and a
  // checked run passes.
  for (int w = 0; w < 3; ++w) {
    auto now = (*cluster)->GetPlan(w);
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_EQ(now->epoch, plan.epoch) << w;
    EXPECT_EQ(now->world_size, 3) << w;
  }
  EXPECT_TRUE((*cluster)->Stop().ok());
  LocalOptions options;
  options.cluster = cluster_options;
  options.n = 5000;
  options.iterations = 3;
  EXPECT_TRUE(RunLocal(options, nullptr).ok());
  std::filesystem::remove_all(std::filesystem::path(tls.ca).parent_path());
}

// SDK calls over TCP need the worker's token; over the unix socket they
// need none; a worker without a token takes none over TCP.
TEST(SdkTokenTest, CallsOverTcpNeedTheToken) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           absl::StrCat("gradmesh-token-", getpid()))
                              .string();
  std::filesystem::create_directories(dir);
  LocalClusterOptions options{.workers = 2};
  options.worker_flags = {{"sdk_token_file", WriteToken(dir, "s3cret")}};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForView(2, absl::Seconds(30)).ok());
  const std::string tcp = (*cluster)->worker_address(0);
  auto connect = [](const std::string& worker, const std::string& token) {
    return Client::Connect(
        {.worker = worker, .token = token, .timeout = absl::Seconds(10)});
  };
  unsetenv("GRADMESH_TOKEN");
  for (const std::string token : {"", "wrong", "s3cret-and-more"}) {
    auto client = connect(tcp, token);
    EXPECT_TRUE(absl::IsUnauthenticated(client.status()))
        << token << ": " << client.status();
  }
  auto good = connect(tcp, "s3cret");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->size(), 2);
  auto local = connect((*cluster)->sdk_address(0), "");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->size(), 2);
  // The refusals were counted.
  EXPECT_TRUE(absl::StrContains(
      Scrape((*cluster)->worker_metrics_port(0)),
      "gradmesh_worker_calls_refused_total{reason=\"token\"} 3"));
  good->reset();
  local->reset();
  EXPECT_TRUE((*cluster)->Stop().ok());

  auto untokened = LocalCluster::Start({.workers = 1});
  ASSERT_TRUE(untokened.ok()) << untokened.status();
  ASSERT_TRUE((*untokened)->WaitForView(1, absl::Seconds(30)).ok());
  auto refused = connect((*untokened)->worker_address(0), "s3cret");
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_TRUE((*untokened)->Stop().ok());
  std::filesystem::remove_all(dir);
}

using ::gradmesh::testing::FreePort;

// Kubernetes' layout: probes on a plaintext health port, the SDK on a TCP
// port of its own (with the token), peers alone on the peer port.
TEST(PortsTest, HealthAndSdkPortsServeApartFromThePeers) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           absl::StrCat("gradmesh-ports-", getpid()))
                              .string();
  std::filesystem::create_directories(dir);
  const std::string coordinator_health = absl::StrCat("127.0.0.1:", FreePort());
  const std::string worker_health = absl::StrCat("127.0.0.1:", FreePort());
  const std::string sdk = absl::StrCat("127.0.0.1:", FreePort());
  auto cluster = LocalCluster::Start(
      {.workers = 1,
       .coordinator_flags = {{"health_listen", coordinator_health}},
       .worker_flags = {{"health_listen", worker_health},
                        {"sdk_listen", sdk},
                        {"sdk_token_file", WriteToken(dir, "s3cret")}}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForView(1, absl::Seconds(30)).ok());
  for (const std::string& health : {coordinator_health, worker_health}) {
    EXPECT_TRUE(CheckHealth(health, "", 5000).ok()) << health;
    EXPECT_TRUE(CheckHealth(health, kReadinessService, 5000).ok()) << health;
    EXPECT_TRUE(absl::IsNotFound(CheckHealth(health, "other", 5000)));
  }
  auto connect = [](const std::string& worker) {
    return Client::Connect(
        {.worker = worker, .token = "s3cret", .timeout = absl::Seconds(10)});
  };
  auto untokened = Client::Connect(
      {.worker = sdk, .token = "", .timeout = absl::Seconds(10)});
  EXPECT_TRUE(absl::IsUnauthenticated(untokened.status()))
      << untokened.status();
  auto client = connect(sdk);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->size(), 1);
  auto on_peer_port = connect((*cluster)->worker_address(0));
  EXPECT_TRUE(absl::IsUnimplemented(on_peer_port.status()))
      << on_peer_port.status();
  auto local = connect((*cluster)->sdk_address(0));  // the socket stays
  ASSERT_TRUE(local.ok()) << local.status();
  client->reset();
  local->reset();
  EXPECT_TRUE((*cluster)->Stop().ok());
  EXPECT_FALSE(CheckHealth(worker_health, "", 2000).ok());
  std::filesystem::remove_all(dir);
}

// A port that cannot be bound ends the worker with a clear error, after it
// had started its other servers (no crash on the way out).
TEST(PortsTest, AnOccupiedHealthPortIsAClearError) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), size), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  auto worker = FindBinary("gradmesh-worker", "");
  ASSERT_TRUE(worker.ok()) << worker.status();
  unsetenv("GRADMESH_TOKEN");
  const std::string command =
      absl::StrCat("timeout 30 ", *worker,
                   " --coordinator=127.0.0.1:1 --health_listen=127.0.0.1:",
                   ntohs(address.sin_port), " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    output.append(buffer, got);
  }
  const int status = pclose(pipe);
  close(fd);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 1) << output;
  EXPECT_TRUE(absl::StrContains(output, "cannot listen")) << output;
}

}  // namespace
}  // namespace gradmesh::tools
