// gradmesh-coordinator: membership, plans, d autotune and cluster metrics.
//
//   gradmesh-coordinator --listen=0.0.0.0:7700 --metrics-listen=0.0.0.0:9100
//       --algo=spardl --density=0.01 --teams=0
//
// Every flag may also come from GRADMESH_COORDINATOR_<FLAG> in the
// environment. SIGTERM or SIGINT: stop cleanly.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "common/cli.h"
#include "common/grpc/tls_flags.h"
#include "server/service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7700",
          "address of the coordinator service (port 0: any free port)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus /metrics on host:port (empty: off)");
ABSL_FLAG(std::string, health_listen, "",
          "serve the gRPC health service in plaintext on host:port, for "
          "probes (empty: off)");
ABSL_FLAG(std::string, algo, "spardl",
          "all-reduce algorithm: spardl, dense, topka, topkdsa, gtopk, oktopk "
          "or gaussiank; auto tries the dense ring and SparDL and keeps, for "
          "each bucket size, the dense ring unless SparDL makes the step "
          "--sparse_margin times shorter");
ABSL_FLAG(double, density, 0.01, "k / n, in (0, 1]");
ABSL_FLAG(int, teams, 0,
          "SparDL's d: 0 tunes it (each valid d is tried, the fastest kept); "
          "otherwise fixed (d = 1 when it does not divide the worker count)");
ABSL_FLAG(std::string, encoding, "coo",
          "wire encoding of sparse blocks: coo, auto, coo-tagged, delta, runs, "
          "bitmap or dense");
ABSL_FLAG(std::string, values, "fp32", "wire value type: fp32, fp16 or bf16");
ABSL_FLAG(int, quantize_bits, 0,
          "TopkDSA: quantize the dense phase to 2, 4 or 8 bits (0: off)");
ABSL_FLAG(int, oktopk_tau, 64, "Ok-Topk: region re-balancing period");
ABSL_FLAG(int, oktopk_tau_prime, 32, "Ok-Topk: threshold re-evaluation period");
ABSL_FLAG(uint64_t, seed, 1, "seed of randomized rounding (TopkDSA's QSGD)");
ABSL_FLAG(std::string, fusion, "per_tensor",
          "how top-k selections treat a bucket's tensors: per_tensor (each "
          "its quota, unless the bucket was registered after_fusion) or "
          "after_fusion (every bucket one vector)");
ABSL_FLAG(uint64_t, exact_below, gradmesh::server::PlanConfig().exact_below,
          "buckets of fewer values are summed exactly (dense), so that "
          "metrics, biases and norms are not sparsified; 0: none");
ABSL_FLAG(uint64_t, warmup_steps, 0,
          "the first this many steps of every bucket are summed exactly (a "
          "warm-up: top-k costs the most accuracy in the first steps); the "
          "autotune times the steps after them");
ABSL_FLAG(uint64_t, chunk_bytes, 1 << 20,
          "largest frame on peer streams (at most 3 MiB)");
ABSL_FLAG(int, autotune_window, 5,
          "iterations measured per candidate d (after one warm-up)");
ABSL_FLAG(double, sparse_margin, 1.5,
          "with --algo=auto, SparDL only for the bucket sizes where it made "
          "the training step (its sum and the rest of the step) this many "
          "times shorter than the dense ring did (top-k needs more steps than "
          "dense to the same accuracy)");
ABSL_FLAG(double, teams_margin, 1.25,
          "the autotune keeps the largest SparDL d whose trial was within "
          "this x the fastest's: a larger d selects from larger blocks, "
          "closer to the global top-k (it ended an epoch higher in every run "
          "of docs/benchmarks.md; 1: the fastest)");
ABSL_FLAG(double, skip_factor, 3.0,
          "skip candidates the alpha-beta model puts over this x the best");
ABSL_FLAG(double, retune_factor, gradmesh::server::PlanConfig().retune_factor,
          "after an autotune round, a bucket size whose all-reduce takes "
          "more than this x its trial's time over --retune_steps steps (the "
          "median) starts a new round: the link slowed (a round that chooses "
          "what the last one had doubles the "
          "steps watched next, to 16x); 0: only a membership change does");
ABSL_FLAG(int, retune_steps, gradmesh::server::PlanConfig().retune_steps,
          "steps whose median --retune_factor weighs");
ABSL_FLAG(int, switch_lead_steps, 3,
          "a plan change starts this many steps after the last reported one");
ABSL_FLAG(int, heartbeat_timeout_ms, 3000,
          "a worker silent this long is removed (new epoch)");
ABSL_FLAG(int, quarantine_s, 30,
          "a worker removed because other members could not reach it may "
          "not join again for this long (doubled at each removal of the "
          "node, to 16x), nor after that while it cannot reach every "
          "member");
ABSL_FLAG(double, link_latency_us, 50,
          "alpha of the link model until workers' reports allow a fit");
ABSL_FLAG(double, link_gbps, 10,
          "bandwidth (Gbit/s) of the link model until a fit");
ABSL_FLAG(std::string, port_file, "",
          "write the bound address and metrics port here once serving");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gradmesh-coordinator: membership, plans and d autotune.");
  const auto args = gradmesh::ParseFlags(argc, argv, "GRADMESH_COORDINATOR_");
  if (args.size() > 1) {
    std::fprintf(stderr, "gradmesh-coordinator: unexpected argument '%s'\n",
                 args[1].c_str());
    return 2;
  }
  gradmesh::BlockTerminationSignals();

  const double gbps = absl::GetFlag(FLAGS_link_gbps);
  gradmesh::server::ServerOptions options{
      .listen = absl::GetFlag(FLAGS_listen),
      .metrics_listen = absl::GetFlag(FLAGS_metrics_listen),
      .health_listen = absl::GetFlag(FLAGS_health_listen),
      .tls = gradmesh::TlsFilesFromFlags(),
      .plan = {.algorithm = absl::GetFlag(FLAGS_algo),
               .density = absl::GetFlag(FLAGS_density),
               .encoding = absl::GetFlag(FLAGS_encoding),
               .values = absl::GetFlag(FLAGS_values),
               .quantize_bits = absl::GetFlag(FLAGS_quantize_bits),
               .oktopk_tau = absl::GetFlag(FLAGS_oktopk_tau),
               .oktopk_tau_prime = absl::GetFlag(FLAGS_oktopk_tau_prime),
               .seed = absl::GetFlag(FLAGS_seed),
               .exact_below = absl::GetFlag(FLAGS_exact_below),
               .warmup_steps = absl::GetFlag(FLAGS_warmup_steps),
               .fusion = absl::GetFlag(FLAGS_fusion),
               .chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes),
               .teams = absl::GetFlag(FLAGS_teams),
               .autotune_window = absl::GetFlag(FLAGS_autotune_window),
               .skip_factor = absl::GetFlag(FLAGS_skip_factor),
               .sparse_margin = absl::GetFlag(FLAGS_sparse_margin),
               .teams_margin = absl::GetFlag(FLAGS_teams_margin),
               .retune_factor = absl::GetFlag(FLAGS_retune_factor),
               .retune_steps = absl::GetFlag(FLAGS_retune_steps),
               .switch_lead_steps = absl::GetFlag(FLAGS_switch_lead_steps),
               .link = {.alpha_s = absl::GetFlag(FLAGS_link_latency_us) * 1e-6,
                        .beta_s_per_byte = gbps > 0 ? 8 / (gbps * 1e9) : -1}},
      .heartbeat_timeout =
          absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms)),
      .quarantine = absl::Seconds(absl::GetFlag(FLAGS_quarantine_s))};
  auto server = gradmesh::server::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "gradmesh-coordinator: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    gradmesh::WritePortFile(path, (*server)->address(),
                            (*server)->metrics_port());
  }
  gradmesh::AwaitTerminationSignal();
  (*server)->Stop();
  server->reset();
  gradmesh::ExitAfterShutdown(0);
}
