// Real processes on 127.0.0.1: a coordinator and P gradmesh-worker
// processes, driven through the worker service (LocalCluster).
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gradmesh/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tools/gradmesh/local.h"
#include "tools/gradmesh/local_cluster.h"
#include "tools/gradmesh/synthetic.h"
#include "worker/collectives/mass_balance.h"

namespace gradmesh::tools {
namespace {

using StepResults = std::vector<absl::StatusOr<client::Reduced>>;

// Step `step` on the given workers at once, with seeded gradients of n
// values; residuals come back.
StepResults RunStep(LocalCluster& cluster, const std::vector<int>& workers,
                    uint64_t step, uint64_t n, absl::Duration timeout,
                    std::vector<std::vector<float>>* inputs = nullptr) {
  StepResults results(workers.size(), absl::UnknownError("not run"));
  if (inputs != nullptr) inputs->assign(workers.size(), {});
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> gradient(n);
      SyntheticGradient(7, workers[i], step, absl::MakeSpan(gradient));
      if (inputs != nullptr) (*inputs)[i] = gradient;
      results[i] =
          cluster.client(workers[i])
              .AllReduce(step, {{"g", std::move(gradient)}}, true, timeout);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// GET http://127.0.0.1:port/metrics (curl, which scripts/setup.sh installs).
std::string FetchMetrics(int port) {
  const std::string command =
      absl::StrCat("curl -sf http://127.0.0.1:", port, "/metrics");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string body;
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    body.append(buffer, got);
  }
  pclose(pipe);
  return body;
}

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

// 50 iterations of every algorithm on 4 and 6 processes: RunLocal checks each
// iteration (bitwise-identical results on every worker, and the inputs equal
// the result plus the residuals, index by index).
class AlgorithmClusterTest
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(AlgorithmClusterTest, FiftyCheckedIterations) {
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
  options.iterations = 50;
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

// kill -9 of a worker in the middle of an iteration: the survivors' calls end
// in an error within the operation timeout, the coordinator publishes an
// epoch without it, and the next iteration succeeds on P - 1 workers.
TEST_F(ClusterTest, KillNineMidIterationThenContinueWithoutIt) {
  constexpr absl::Duration kTimeout = absl::Seconds(8);
  Start(4,
        {{"algo", "spardl"}, {"teams", "2"}, {"heartbeat_timeout_ms", "1500"}},
        {{"operation_timeout_s", "8"}, {"heartbeat_interval_ms", "250"}});
  for (uint64_t step = 0; step < 3; ++step) {
    for (const auto& r :
         RunStep(*cluster_, {0, 1, 2, 3}, step, 10000, kTimeout)) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  // Step 3 reaches the survivors; worker 2 dies while they wait on it.
  StepResults during;
  absl::Duration took;
  std::thread survivors([&] {
    const absl::Time start = absl::Now();
    during = RunStep(*cluster_, {0, 1, 3}, 3, 10000, absl::Seconds(30));
    took = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(300));
  cluster_->Kill(2, SIGKILL);
  survivors.join();
  for (const auto& r : during) {
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsUnavailable(r.status()) ||
                absl::IsAborted(r.status()) ||
                absl::IsDeadlineExceeded(r.status()))
        << r.status();
  }
  EXPECT_LT(took, kTimeout + absl::Seconds(2));

  ASSERT_TRUE(cluster_->WaitForView(3, absl::Seconds(20)).ok());
  std::vector<std::vector<float>> inputs;
  const StepResults after =
      RunStep(*cluster_, {0, 1, 3}, 4, 10000, kTimeout, &inputs);
  for (const auto& r : after) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->world_size, 3);
    EXPECT_EQ(r->tensors[0].indices, after[0]->tensors[0].indices);
    EXPECT_EQ(r->tensors[0].values, after[0]->tensors[0].values);
  }
  // The one after that conserves mass from the residuals now known.
  std::vector<std::vector<float>> residuals;
  for (const auto& r : after) residuals.push_back(r->tensors[0].residual);
  const StepResults next =
      RunStep(*cluster_, {0, 1, 3}, 5, 10000, kTimeout, &inputs);
  std::vector<std::vector<float>> left;
  for (const auto& r : next) {
    ASSERT_TRUE(r.ok()) << r.status();
    left.push_back(r->tensors[0].residual);
  }
  sparse::SparseBlock sum;
  sum.indices = next[0]->tensors[0].indices;
  sum.values = next[0]->tensors[0].values;
  const absl::Status balanced =
      collectives::MassBalance(inputs, residuals).Check(sum, left);
  EXPECT_TRUE(balanced.ok()) << balanced;
}

// d autotune settles on a d, and both binaries' /metrics answer with the
// documented series.
TEST_F(ClusterTest, AutotunePicksADAndMetricsAnswer) {
  Start(4, {{"algo", "spardl"}, {"teams", "0"}, {"autotune_window", "2"}});
  uint64_t step = 0;
  bool settled = false;
  for (; step < 40 && !settled; ++step) {
    for (const auto& r :
         RunStep(*cluster_, {0, 1, 2, 3}, step, 20000, absl::Seconds(30))) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
    auto status = cluster_->client(0).GetStatus(absl::Seconds(5));
    ASSERT_TRUE(status.ok());
    settled = absl::StartsWith(status->plan().note(), "autotune chose d=");
  }
  ASSERT_TRUE(settled) << "no choice after " << step << " steps";
  // The chosen d runs from its start step on every worker.
  for (int i = 0; i < 3; ++i, ++step) {
    for (const auto& r :
         RunStep(*cluster_, {0, 1, 2, 3}, step, 20000, absl::Seconds(30))) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  const std::string coordinator =
      FetchMetrics(cluster_->coordinator_metrics_port());
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
  const std::string worker = FetchMetrics(cluster_->worker_metrics_port(1));
  for (const char* series :
       {"gradmesh_worker_operation_seconds_count{algorithm=\"spardl\"}",
        "gradmesh_worker_topk_seconds_count{algorithm=\"spardl\"}",
        "gradmesh_worker_bytes_sent_total{peer=\"worker-00\"}",
        "gradmesh_worker_bytes_received_total{peer=\"worker-00\"}",
        "gradmesh_worker_nonzeros{phase=\"result\"}",
        "gradmesh_worker_nonzeros{phase=\"srs\"}",
        "gradmesh_worker_residual_norm{buffer=\"g:20000\"}",
        "gradmesh_worker_teams", "gradmesh_worker_epoch",
        "gradmesh_worker_rank 1", "gradmesh_worker_world_size 4",
        "gradmesh_worker_operations_total{code=\"OK\"}",
        "gradmesh_worker_frames_dropped_total{reason=\"old_epoch\"}",
        "gradmesh_worker_late_views_total 0"}) {
    EXPECT_TRUE(absl::StrContains(worker, series))
        << series << " missing from\n"
        << worker;
  }
}

// Makes a CA and a node certificate in a new directory.
TlsFiles MakeCertificates(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           absl::StrCat("gradmesh-certs-", getpid(), "-", name))
                              .string();
  const std::string command = absl::StrCat(
      GRADMESH_SOURCE_DIR, "/scripts/make-test-certs.sh ", dir, " >/dev/null");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return {.ca = dir + "/ca.pem",
          .cert = dir + "/node.pem",
          .key = dir + "/node.key"};
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
  options.n = 5000;
  options.iterations = 3;
  EXPECT_TRUE(RunLocal(options, nullptr).ok());

  auto cluster = LocalCluster::Start(options.cluster);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForView(3, absl::Seconds(30)).ok());
  const std::string worker = (*cluster)->worker_address(0);
  for (const TlsFiles& wrong : {TlsFiles{}, stranger}) {
    auto client = client::WorkerClient::Connect(worker, wrong);
    ASSERT_TRUE(client.ok());
    auto status = (*client)->GetStatus(absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(status.status())) << status.status();
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
  auto good = client::WorkerClient::Connect(worker, tls);
  ASSERT_TRUE(good.ok());
  auto status = (*good)->GetStatus(absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->world_size(), 3);
  EXPECT_TRUE((*cluster)->Stop().ok());
  for (const TlsFiles& set : {tls, stranger}) {
    std::filesystem::remove_all(std::filesystem::path(set.ca).parent_path());
  }
}

}  // namespace
}  // namespace gradmesh::tools
