// gradmesh: the command-line front end.
//
//   gradmesh replay --algo=spardl --workers=4 --teams=2 --density=0.01
//                   --input-dir=IN --output-dir=OUT
//   gradmesh local --workers=4
//   gradmesh run --workers=4 -- python3 train.py --epochs=3
//   gradmesh health --address=127.0.0.1:7709 --service=ready
//   gradmesh sim --algo=spardl --workers=512 --teams=all --n=25000000
//
// Flag names take '-' or '_' alike (--input-dir == --input_dir).
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cli.h"
#include "common/grpc/health_server.h"
#include "common/grpc/tls_flags.h"
#include "common/status_macros.h"
#include "tools/gradmesh/local.h"
#include "tools/gradmesh/replay.h"
#include "tools/gradmesh/run.h"
#include "tools/gradmesh/sim_report.h"
#include "worker/kernels/topk_choice.h"

ABSL_FLAG(std::string, algo, "spardl",
          "all-reduce algorithm: spardl, dense, topka, topkdsa, gtopk, oktopk "
          "or gaussiank; local and run also take auto (the dense ring or "
          "SparDL per bucket size, from a trial of each)");
ABSL_FLAG(int, workers, 4,
          "number of workers P: in-process for replay (1..1024) and sim "
          "(1..4096), processes for local and run (1..64)");
ABSL_FLAG(std::string, teams, "",
          "SparDL team count d, dividing --workers; empty: 1 for replay and "
          "sim, auto (tuned by the coordinator) for local and run; sim also "
          "takes all (every d, beside the coordinator's model)");
ABSL_FLAG(int, oktopk_tau, 64, "Ok-Topk: region re-balancing period");
ABSL_FLAG(int, oktopk_tau_prime, 32, "Ok-Topk: threshold re-evaluation period");
ABSL_FLAG(int, quantize_bits, 0,
          "TopkDSA: quantize the dense phase to 2, 4 or 8 bits (0: off)");
ABSL_FLAG(std::string, encoding, "coo",
          "how sparse blocks travel: coo (plain, 8 bytes a value), auto (the "
          "smallest per block), coo-tagged, delta, runs, bitmap or dense");
ABSL_FLAG(std::string, values, "fp32",
          "wire value type: fp32, fp16 or bf16 (16-bit needs a tagged "
          "encoding; rounding losses stay in the residuals)");
ABSL_FLAG(double, density, 0.01, "k / n, in (0, 1]");
ABSL_FLAG(std::string, input_dir, "",
          "directory of rank{r}.npy files, float32 [n] or [T, n]; empty: "
          "generate seeded gradients");
ABSL_FLAG(std::string, output_dir, "replay-out",
          "directory for rank{r}.result.npy, rank{r}.residual.npy, stats.json");
ABSL_FLAG(bool, overwrite, false, "replace a non-empty --output-dir");
ABSL_FLAG(uint64_t, n, 1 << 20,
          "generated gradients: values per worker (sim: the gradient "
          "modeled, which may run smaller: --max-values)");
ABSL_FLAG(uint64_t, iterations, 5,
          "generated gradients (replay, local, sim): iterations");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of generated gradients and of randomized rounding");
ABSL_FLAG(std::string, exact_below, "",
          "buckets of fewer values are summed exactly (dense), so that "
          "metrics, biases and norms are not sparsified; 0: none; empty: "
          "the coordinator's (16384) for run, 0 for local (its one bucket "
          "runs --algo)");
ABSL_FLAG(uint64_t, warmup_steps, 0,
          "local, run: the first this many steps of every bucket are summed "
          "exactly (a warm-up: top-k costs the most accuracy in the first "
          "steps); the autotune times the steps after them");
ABSL_FLAG(std::string, fusion, "per_tensor",
          "local, run: how top-k selections treat a bucket's tensors: "
          "per_tensor (each its quota, unless the bucket was registered "
          "after_fusion) or after_fusion (every bucket one vector)");
ABSL_FLAG(int, timeout_s, 600, "per-operation timeout in seconds");
ABSL_FLAG(std::string, bin_dir, "",
          "local, run: where gradmesh-coordinator and gradmesh-worker are "
          "(empty: next to this program, the build tree, or PATH)");
ABSL_FLAG(std::string, work_dir, "",
          "local, run: directory for the processes' logs (empty: a new "
          "temporary one)");
ABSL_FLAG(uint64_t, chunk_bytes, 1 << 20,
          "local, run: largest frame on peer streams (at most 3 MiB)");
ABSL_FLAG(int, autotune_window, 5,
          "local, run: iterations measured per candidate d when d is auto "
          "(with --algo=auto, at least 3 so that a paused step does not "
          "count; 1 weighs the all-reduce alone)");
ABSL_FLAG(double, sparse_margin, 1.5,
          "local, run with --algo=auto: SparDL only for the bucket sizes where "
          "it made the training step (its sum and the rest of the step) this "
          "many times shorter than the dense ring did");
ABSL_FLAG(double, teams_margin, 1.25,
          "local, run with d autotuned: the largest d whose trial was within "
          "this x the fastest's (a larger d selects closer to the global "
          "top-k; 1: the fastest)");
ABSL_FLAG(double, retune_factor, 2.0,
          "local, run with an autotune: once it chose, a bucket size whose "
          "all-reduce takes more than this x its trial's time over "
          "--retune-steps steps (the median) starts a new round: the link "
          "slowed (a round that chooses what the last one "
          "had doubles the steps watched next, to 16x); 0: only a membership "
          "change does");
ABSL_FLAG(int, retune_steps, 20,
          "local, run: the steps whose median --retune-factor weighs");
ABSL_FLAG(bool, verify, true,
          "local: check that every worker gets the same result and that "
          "inputs = result + residuals, every iteration");
ABSL_FLAG(std::string, json, "",
          "local: also write every iteration's figures per worker to this "
          "JSON file; sim: write its figures as JSON to this file (- or a "
          "bare --json: on stdout, instead of the text)");
ABSL_FLAG(std::vector<std::string>, netns, {},
          "local: emulated hosts, one network namespace per worker (as `ip "
          "netns add` names them; needs root); with --hosts");
ABSL_FLAG(std::vector<std::string>, hosts, {},
          "local: with --netns, the address each worker binds to in its "
          "namespace");
ABSL_FLAG(std::string, coordinator_host, "127.0.0.1",
          "local: the coordinator's listen address (with --netns, one every "
          "namespace reaches)");
ABSL_FLAG(std::string, address, "127.0.0.1:7709",
          "health: the health port (--health-listen) of a worker or "
          "coordinator, host:port");
ABSL_FLAG(std::string, service, "",
          "health: \"\" asks whether the daemon lives, \"ready\" whether it "
          "is ready (a worker: a member of the current view)");
ABSL_FLAG(int, probe_timeout_ms, 3000,
          "health: how long to wait for the answer");
ABSL_FLAG(std::string, nnodes, "1",
          "run: the nodes of the job, each running `gradmesh run` with its "
          "--node_rank, as torchrun's --nnodes: N, or MIN:MAX (as N=MAX with "
          "--min-nodes=MIN: the job starts with MIN nodes or more, and nodes "
          "that come later join it)");
ABSL_FLAG(int, node_rank, 0, "run: this node's rank, 0..nnodes-1");
ABSL_FLAG(int, nproc_per_node, 0,
          "run: workers and copies on this node (0: --workers)");
ABSL_FLAG(std::string, coordinator, "",
          "run with --nnodes > 1: HOST:PORT of the job's coordinator, on "
          "node 0 (which starts it unless one answers there); node 0's "
          "launcher also uses PORT+1, and MASTER_PORT is PORT+2");
ABSL_FLAG(std::string, host, "",
          "run with --nnodes > 1: this node's address for peer traffic "
          "(empty: the interface toward the coordinator)");
ABSL_FLAG(int, master_port, 0,
          "run with --nnodes > 1: MASTER_PORT for torch.distributed (0: the "
          "coordinator's port + 2)");
ABSL_FLAG(int, start_timeout_s, 30,
          "run: how long the workers (every node's) may take to form the "
          "job's first view");
ABSL_FLAG(int, max_restarts, 0,
          "run: a copy that fails is started again (same rank and "
          "environment), after its worker when that is gone too (a copy whose "
          "worker dies is stopped at once for that), up to this "
          "many times in all on this node, as torchrun's --max-restarts; "
          "train under gradmesh.torch.elastic so that the new process "
          "rejoins; with none left, a failure stops the job, and a copy whose "
          "worker is gone is lost: the others go on without it");
ABSL_FLAG(int, min_np, 0,
          "run: the fewest processes (each with its worker, a node of the "
          "group) the job goes on with, every node's together: once copies "
          "lost with their workers leave fewer, the job stops on every node "
          "with status 1 at once (Horovod's --min-np waits for hosts to come "
          "back first; 0: no minimum, the job goes on while each node has a "
          "copy, or see --min-nodes)");
ABSL_FLAG(int, min_nodes, 0,
          "run with --nnodes > 1: the fewest nodes the job goes on with "
          "(0: --nnodes, every node, as torchrun's --nnodes=N). With fewer "
          "than --nnodes, a node whose processes are all lost with their "
          "workers, whose launcher node 0 no longer reaches (its host "
          "died), or whose launcher gets SIGTERM or SIGINT (its host drained; "
          "not node 0's), leaves the job instead of failing it, and the "
          "others go on "
          "(train under gradmesh.torch.elastic); below this many nodes the "
          "job stops on every node with status 1. The job starts once this "
          "many nodes joined and --last_call_s passed with no more joining "
          "(or every node joined); the others, and a lost node whose "
          "launcher is started again, join the running job (torchrun's "
          "--nnodes=MIN:MAX)");
ABSL_FLAG(int, last_call_s, 10,
          "run with --min-nodes below --nnodes: once --min-nodes nodes "
          "joined, node 0 starts the job when this long passed with no other "
          "joining (as torchrun's last_call_timeout), or at "
          "--start-timeout-s");
ABSL_FLAG(double, step_join_timeout_s, 10,
          "local, run: a worker whose trainer has not joined a step its "
          "peers started for this long steps out of the group, and the others "
          "go on (0: never; see gradmesh-worker --help)");
ABSL_FLAG(double, link_timeout_s, 10,
          "local, run: a worker reports a member its frames have gone "
          "unacknowledged to, or that has refused its connections, for this "
          "long, and the coordinator removes the member most members name "
          "(0: never; see gradmesh-worker --help)");
ABSL_FLAG(int, quarantine_s, 30,
          "local, run: a worker removed for unreachable links may not rejoin "
          "for this long, doubled at each removal of the node, to 16x (at "
          "least 1; see gradmesh-coordinator --help)");
ABSL_FLAG(std::string, job, "",
          "run: the job name the commands get as GRADMESH_JOB (empty: "
          "run-<pid>-<unix seconds>)");
ABSL_FLAG(std::string, topk, "auto",
          std::string("replay, and local and run's workers: ") +
              gradmesh::kernels::kTopKFlagHelp);

ABSL_FLAG(double, alpha_us, 50,
          "sim: latency of a message on a link, microseconds");
ABSL_FLAG(double, gbit, 10, "sim: bandwidth of each worker's link, Gbit/s");
ABSL_FLAG(double, select_ns, 0.98,
          "sim: compute cost of top-k selection, ns a value scanned (the "
          "defaults: --calibrate on a 2-core 2.6 GHz Xeon VM)");
ABSL_FLAG(double, merge_ns, 4.8,
          "sim: compute cost of merging sparse blocks, ns an entry");
ABSL_FLAG(double, accumulate_ns, 0.89,
          "sim: compute cost of adding into dense arrays, ns a value");
ABSL_FLAG(bool, calibrate, false,
          "sim: measure this machine's compute costs (per core, every core "
          "busy; a few seconds) and use them instead of --select-ns, "
          "--merge-ns, --accumulate-ns");
ABSL_FLAG(double, compute_scale, 1,
          "sim: multiplies the compute costs: P/C when P workers share C "
          "cores (an emulated cluster), or for a slower CPU");
ABSL_FLAG(uint64_t, max_values, uint64_t{1} << 29,
          "sim: values held across all in-process workers, at most (about 4 "
          "bytes each); a larger P x n runs at a smaller n, its bytes and "
          "work scaled back");
ABSL_FLAG(double, skip_factor, 3.0,
          "sim: the coordinator's --skip-factor, for the d its autotune "
          "would skip");

namespace {

constexpr char kUsage[] =
    "usage: gradmesh <command> [flags]\n"
    "\n"
    "commands:\n"
    "  local    start a coordinator and P worker processes on 127.0.0.1\n"
    "           (or one per network namespace: --netns, --hosts),\n"
    "           run iterations of seeded gradients through them, check and\n"
    "           report each one, then shut the cluster down\n"
    "  replay   run an all-reduce algorithm on P in-process workers over\n"
    "           gradients from .npy files (or generated ones) and write every\n"
    "           rank's results, residuals and stats.json\n"
    "  run      the launcher: start a coordinator and P workers on 127.0.0.1,\n"
    "           then P copies of a command, copy r with GRADMESH_WORKER (its\n"
    "           worker's address), GRADMESH_JOB, GRADMESH_RANK=r,\n"
    "           GRADMESH_LOCAL_RANK=r, GRADMESH_WORLD_SIZE=P (and\n"
    "           GRADMESH_TLS_CA/CERT/KEY with the TLS flags), and torchrun's\n"
    "           RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR\n"
    "           and MASTER_PORT in its environment; their output comes out\n"
    "           as \"[r] line\". When one fails, or on Ctrl-C, the others get\n"
    "           SIGTERM (SIGKILL 10 s later); exits with the first failure's\n"
    "           status (128 + signal), 130 on Ctrl-C, else 0. Everything after "
    "-- is the command:\n"
    "             gradmesh run --workers=4 --density=0.01 -- \\\n"
    "                 python3 train.py --epochs=3\n"
    "  health   ask a daemon's health service (--health-listen) whether\n"
    "           it serves: exit 0 if so, else 1 with the answer; for\n"
    "           container health checks:\n"
    "             gradmesh health --address=127.0.0.1:7709 --service=ready\n"
    "  sim      predict an all-reduce on a simulated network: the real\n"
    "           algorithms and schedules on P in-process workers (up to\n"
    "           4096), each link alpha + bytes x beta, compute per value\n"
    "           (--calibrate measures this machine's); prints time,\n"
    "           rounds and bytes beside Table I; --teams=all runs every d\n"
    "           beside the coordinator's model; --json for JSON:\n"
    "             gradmesh sim --algo=spardl --workers=512 --teams=all \\\n"
    "                 --n=25000000 --density=0.01 --gbit=25\n"
    "\n"
    "`gradmesh <command> --help` lists the command's flags.";

// Each command's --help: its line of the usage and the flags it reads.
const std::vector<std::string> kAlgorithmFlags = {
    "algo",          "density",  "teams",  "oktopk_tau", "oktopk_tau_prime",
    "quantize_bits", "encoding", "values", "seed"};
const std::vector<std::string> kClusterFlags = {
    "algo",           "density",       "teams",         "encoding",
    "values",         "quantize_bits", "oktopk_tau",    "oktopk_tau_prime",
    "seed",           "exact_below",   "fusion",        "workers",
    "bin_dir",        "work_dir",      "chunk_bytes",   "autotune_window",
    "timeout_s",      "topk",          "tls_ca",        "tls_cert",
    "tls_key",        "sparse_margin", "teams_margin",  "step_join_timeout_s",
    "link_timeout_s", "quarantine_s",  "retune_factor", "retune_steps",
    "warmup_steps"};

std::vector<std::string> Plus(std::vector<std::string> flags,
                              std::initializer_list<const char*> more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

gradmesh::FlagsHelp CommandHelp(absl::string_view usage,
                                std::vector<std::string> flags) {
  return {.usage = std::string(usage), .flags = std::move(flags)};
}

// The algorithm flags (--algo, --density, --encoding...), with d = teams.
absl::StatusOr<gradmesh::collectives::AlgorithmOptions> AlgorithmFromFlags(
    int teams) {
  const auto wire = gradmesh::collectives::WireFormat::Parse(
      absl::GetFlag(FLAGS_encoding), absl::GetFlag(FLAGS_values));
  if (!wire.ok()) return wire.status();
  return gradmesh::collectives::AlgorithmOptions{
      .algorithm = absl::GetFlag(FLAGS_algo),
      .density = absl::GetFlag(FLAGS_density),
      .teams = teams,
      .oktopk_tau = absl::GetFlag(FLAGS_oktopk_tau),
      .oktopk_tau_prime = absl::GetFlag(FLAGS_oktopk_tau_prime),
      .quantize_bits = absl::GetFlag(FLAGS_quantize_bits),
      .seed = absl::GetFlag(FLAGS_seed),
      .wire = *wire};
}

int Replay(int argc, char** argv) {
  const std::vector<std::string> positional = gradmesh::ParseFlags(
      argc, argv, "GRADMESH_",
      CommandHelp("usage: gradmesh replay [flags]\n\n"
                  "Runs an all-reduce algorithm on P in-process workers over\n"
                  "gradients from .npy files (or generated ones) and writes\n"
                  "every rank's results, residuals and stats.json.",
                  Plus(kAlgorithmFlags,
                       {"workers", "input_dir", "output_dir", "overwrite", "n",
                        "iterations", "timeout_s", "topk"})));
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradmesh replay: unexpected argument '%s'\n",
                 positional[1].c_str());
    return 2;
  }
  const absl::StatusOr<const gradmesh::kernels::TopKSelector*> topk =
      gradmesh::kernels::TopKNamed(absl::GetFlag(FLAGS_topk));
  if (!topk.ok()) {
    std::fprintf(stderr, "gradmesh replay: %s\n",
                 std::string(topk.status().message()).c_str());
    return 1;
  }
  int teams = 1;
  if (const std::string t = absl::GetFlag(FLAGS_teams);
      !t.empty() && !absl::SimpleAtoi(t, &teams)) {
    std::fprintf(stderr, "gradmesh replay: --teams=%s is not a number\n",
                 t.c_str());
    return 1;
  }
  const auto algorithm = AlgorithmFromFlags(teams);
  if (!algorithm.ok()) {
    std::fprintf(stderr, "gradmesh replay: %s\n",
                 std::string(algorithm.status().message()).c_str());
    return 1;
  }
  gradmesh::tools::ReplayOptions options;
  options.algorithm = *algorithm;
  options.algorithm.topk = *topk;
  options.workers = absl::GetFlag(FLAGS_workers);
  options.input_dir = absl::GetFlag(FLAGS_input_dir);
  options.output_dir = absl::GetFlag(FLAGS_output_dir);
  options.overwrite = absl::GetFlag(FLAGS_overwrite);
  options.n = absl::GetFlag(FLAGS_n);
  options.iterations = absl::GetFlag(FLAGS_iterations);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  const absl::Status status = gradmesh::tools::RunReplay(options);
  if (!status.ok()) {
    std::fprintf(stderr, "gradmesh replay: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  std::printf("gradmesh replay: wrote %s\n", options.output_dir.c_str());
  return 0;
}

// The workers' flags of `gradmesh local` and `gradmesh run`.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
WorkerFlagsFromFlags() {
  if (absl::GetFlag(FLAGS_step_join_timeout_s) < 0) {
    return absl::InvalidArgumentError("--step_join_timeout_s is negative");
  }
  if (!(absl::GetFlag(FLAGS_link_timeout_s) >= 0)) {  // NaN too
    return absl::InvalidArgumentError("--link_timeout_s is not 0 or more");
  }
  const std::string topk = absl::GetFlag(FLAGS_topk);
  GM_RETURN_IF_ERROR(gradmesh::kernels::CheckTopKName(topk));
  std::vector<std::pair<std::string, std::string>> flags = {
      {"operation_timeout_s", absl::StrCat(absl::GetFlag(FLAGS_timeout_s))},
      {"heartbeat_interval_ms", "250"},
      {"step_join_timeout_s",
       absl::StrCat(absl::GetFlag(FLAGS_step_join_timeout_s))},
      {"link_timeout_s", absl::StrCat(absl::GetFlag(FLAGS_link_timeout_s))}};
  if (topk != "auto") flags.push_back({"topk", topk});
  return flags;
}

// The cluster of `gradmesh local` and `gradmesh run`, from the flags.
// `exact_below`: the command's default of --exact_below (empty: the
// coordinator's).
absl::StatusOr<gradmesh::tools::LocalClusterOptions> ClusterOptionsFromFlags(
    absl::string_view exact_below) {
  std::string exact_flag = absl::GetFlag(FLAGS_exact_below);
  if (exact_flag.empty()) exact_flag = std::string(exact_below);
  if (uint64_t values;
      !exact_flag.empty() && !absl::SimpleAtoi(exact_flag, &values)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exact_below=", exact_flag, " is not a number of values"));
  }
  // The coordinator's --teams: 0 tunes d.
  const std::string teams_flag = absl::GetFlag(FLAGS_teams);
  int teams = 0;
  if (teams_flag != "auto" && !teams_flag.empty() &&
      (!absl::SimpleAtoi(teams_flag, &teams) || teams < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--teams=", teams_flag, " is not auto or a positive number"));
  }
  gradmesh::tools::LocalClusterOptions cluster;
  cluster.workers = absl::GetFlag(FLAGS_workers);
  cluster.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  cluster.work_dir = absl::GetFlag(FLAGS_work_dir);
  cluster.tls = gradmesh::TlsFilesFromFlags();
  cluster.coordinator_flags = {
      {"algo", absl::GetFlag(FLAGS_algo)},
      {"density", absl::StrCat(absl::GetFlag(FLAGS_density))},
      {"teams", absl::StrCat(teams)},
      {"encoding", absl::GetFlag(FLAGS_encoding)},
      {"values", absl::GetFlag(FLAGS_values)},
      {"quantize_bits", absl::StrCat(absl::GetFlag(FLAGS_quantize_bits))},
      {"oktopk_tau", absl::StrCat(absl::GetFlag(FLAGS_oktopk_tau))},
      {"oktopk_tau_prime", absl::StrCat(absl::GetFlag(FLAGS_oktopk_tau_prime))},
      {"seed", absl::StrCat(absl::GetFlag(FLAGS_seed))},
      {"fusion", absl::GetFlag(FLAGS_fusion)},
      {"chunk_bytes", absl::StrCat(absl::GetFlag(FLAGS_chunk_bytes))},
      {"autotune_window", absl::StrCat(absl::GetFlag(FLAGS_autotune_window))},
      {"sparse_margin", absl::StrCat(absl::GetFlag(FLAGS_sparse_margin))},
      {"teams_margin", absl::StrCat(absl::GetFlag(FLAGS_teams_margin))},
      {"retune_factor", absl::StrCat(absl::GetFlag(FLAGS_retune_factor))},
      {"retune_steps", absl::StrCat(absl::GetFlag(FLAGS_retune_steps))},
      {"warmup_steps", absl::StrCat(absl::GetFlag(FLAGS_warmup_steps))},
      {"heartbeat_timeout_ms", "2000"}};
  if (!exact_flag.empty()) {
    cluster.coordinator_flags.push_back({"exact_below", exact_flag});
  }
  if (absl::GetFlag(FLAGS_quarantine_s) < 1) {
    return absl::InvalidArgumentError("--quarantine_s must be at least 1");
  }
  cluster.coordinator_flags.push_back(
      {"quarantine_s", absl::StrCat(absl::GetFlag(FLAGS_quarantine_s))});
  GM_ASSIGN_OR_RETURN(cluster.worker_flags, WorkerFlagsFromFlags());
  return cluster;
}

// Stops `gradmesh local` after the iteration in flight.
std::atomic<bool> interrupted{false};

int Local(int argc, char** argv) {
  const std::vector<std::string> positional = gradmesh::ParseFlags(
      argc, argv, "GRADMESH_",
      CommandHelp("usage: gradmesh local [flags]\n\n"
                  "Starts a coordinator and P worker processes on 127.0.0.1\n"
                  "(or one per network namespace: --netns, --hosts), runs\n"
                  "iterations of seeded gradients through them, checks and\n"
                  "reports each one, then shuts the cluster down.",
                  Plus(kClusterFlags, {"netns", "hosts", "coordinator_host",
                                       "json", "n", "iterations", "verify"})));
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradmesh local: unexpected argument '%s'\n",
                 positional[1].c_str());
    return 2;
  }
  absl::StatusOr<gradmesh::tools::LocalClusterOptions> cluster =
      ClusterOptionsFromFlags(/*exact_below=*/"0");
  if (!cluster.ok()) {
    std::fprintf(stderr, "gradmesh local: %s\n",
                 std::string(cluster.status().message()).c_str());
    return 2;
  }
  const std::vector<std::string> netns = absl::GetFlag(FLAGS_netns);
  const std::vector<std::string> hosts = absl::GetFlag(FLAGS_hosts);
  if (netns.size() != hosts.size()) {
    std::fprintf(stderr,
                 "gradmesh local: --netns names %zu namespaces, --hosts %zu "
                 "addresses; give one of each per worker\n",
                 netns.size(), hosts.size());
    return 2;
  }
  for (size_t w = 0; w < netns.size(); ++w) {
    cluster->hosts.push_back({netns[w], hosts[w]});
  }
  cluster->coordinator_host = absl::GetFlag(FLAGS_coordinator_host);
  gradmesh::tools::LocalOptions options;
  options.cluster = *std::move(cluster);
  options.json_path = absl::GetFlag(FLAGS_json);
  options.n = absl::GetFlag(FLAGS_n);
  options.iterations = absl::GetFlag(FLAGS_iterations);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.verify = absl::GetFlag(FLAGS_verify);

  struct sigaction action = {};
  action.sa_handler = [](int) { interrupted = true; };
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  const absl::Status status = gradmesh::tools::RunLocal(options, &interrupted);
  if (!status.ok()) {
    std::fprintf(stderr, "gradmesh local: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  return interrupted ? 130 : 0;
}

// The launcher's options from the flags; InvalidArgument naming a bad one.
// --nnodes: "N" or "MIN:MAX", as torchrun's.
struct NodeRange {
  int min = 1;
  int max = 1;
  bool ranged = false;  // given as MIN:MAX
};

absl::StatusOr<NodeRange> ParseNodes(const std::string& text) {
  const std::pair<std::string, std::string> parts =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  NodeRange range = {.ranged = text.find(':') != std::string::npos};
  const bool read =
      absl::SimpleAtoi(parts.first, &range.min) &&
      absl::SimpleAtoi(parts.second.empty() ? parts.first : parts.second,
                       &range.max);
  if (!read || range.min < 1 || range.min > range.max ||
      (range.ranged && parts.second.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes=", text, " is not N or MIN:MAX (1 <= MIN <= MAX)"));
  }
  return range;
}

// The flags of a job on several nodes, into `options` (whose
// cluster.workers is set).
absl::Status NodeFlagsInto(gradmesh::tools::RunOptions& options) {
  GM_ASSIGN_OR_RETURN(const NodeRange nodes,
                      ParseNodes(absl::GetFlag(FLAGS_nnodes)));
  options.nodes = nodes.max;
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  if (options.node_rank < 0 || options.node_rank >= options.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank=", options.node_rank, " is not in 0..",
                     options.nodes - 1, " (--nnodes=", options.nodes, ")"));
  }
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (options.nodes > 1 && options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--nnodes > 1 needs --coordinator=HOST:PORT (an address of node 0 "
        "that every node reaches)");
  }
  if (options.nodes > 999) {
    return absl::InvalidArgumentError("--nnodes is at most 999");
  }
  options.host = absl::GetFlag(FLAGS_host);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  if (options.master_port < 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_port=", options.master_port, " is not a port"));
  }
  options.min_nodes = absl::GetFlag(FLAGS_min_nodes);
  if (options.min_nodes < 0 || options.min_nodes > options.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-nodes=", options.min_nodes, " is not in 0..",
                     options.nodes, " (--nnodes)"));
  }
  if (nodes.ranged) {
    if (options.min_nodes != 0 && options.min_nodes != nodes.min) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes=", nodes.min, ":", nodes.max,
          " and --min-nodes=", options.min_nodes, " disagree: give one"));
    }
    options.min_nodes = nodes.min;
  }
  if (absl::GetFlag(FLAGS_last_call_s) < 0) {
    return absl::InvalidArgumentError("--last_call_s is negative");
  }
  options.last_call = absl::Seconds(absl::GetFlag(FLAGS_last_call_s));
  return absl::OkStatus();
}

absl::StatusOr<gradmesh::tools::RunOptions> RunOptionsFromFlags() {
  gradmesh::tools::RunOptions options;
  GM_ASSIGN_OR_RETURN(options.cluster,
                      ClusterOptionsFromFlags(/*exact_below=*/""));
  if (const int g = absl::GetFlag(FLAGS_nproc_per_node); g != 0) {
    options.cluster.workers = g;
  }
  if (options.cluster.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers (--nproc_per_node)=", options.cluster.workers,
                     " is not positive"));
  }
  GM_RETURN_IF_ERROR(NodeFlagsInto(options));
  if (absl::GetFlag(FLAGS_start_timeout_s) <= 0) {
    return absl::InvalidArgumentError("--start_timeout_s must be positive");
  }
  options.start_timeout = absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s));
  options.job = absl::GetFlag(FLAGS_job);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (options.max_restarts < 0) {
    return absl::InvalidArgumentError("--max_restarts is negative");
  }
  options.min_np = absl::GetFlag(FLAGS_min_np);
  const int copies = options.nodes * options.cluster.workers;
  if (options.min_np < 0 || options.min_np > copies) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-np=", options.min_np, " is not in 0..", copies,
                     " (the job's processes: --nnodes x --nproc_per_node)"));
  }
  return options;
}

// `gradmesh run [flags] -- CMD [ARGS...]`: argv[0] is "gradmesh run".
int Run(int argc, char** argv) {
  // Everything after the first "--" is the command, verbatim.
  int flags_end = 1;
  while (flags_end < argc && std::string_view(argv[flags_end]) != "--") {
    ++flags_end;
  }
  std::vector<std::string> command(argv + std::min(flags_end + 1, argc),
                                   argv + argc);
  const std::vector<std::string> positional = gradmesh::ParseFlags(
      flags_end, argv, "GRADMESH_",
      CommandHelp(
          "usage: gradmesh run [flags] -- CMD [ARGS...]\n\n"
          "Starts a coordinator and P workers on 127.0.0.1, then P\n"
          "copies of CMD, copy r with GRADMESH_WORKER, GRADMESH_JOB,\n"
          "GRADMESH_RANK=r, GRADMESH_LOCAL_RANK=r and\n"
          "GRADMESH_WORLD_SIZE=P in its environment, and torchrun's\n"
          "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR\n"
          "and MASTER_PORT. When one fails (after --max-restarts\n"
          "restarts of failed copies, under gradmesh.torch.elastic),\n"
          "or on Ctrl-C, the others get SIGTERM; exits with the first\n"
          "failure's status.\n\n"
          "On several nodes, as torchrun: on each node\n"
          "  gradmesh run --nnodes=N --node-rank=I --nproc-per-node=G \\\n"
          "      --coordinator=NODE0:7700 -- CMD [ARGS...]\n"
          "node 0 starts the coordinator, every node G workers and G\n"
          "copies (ranks I*G..I*G+G-1); a failure anywhere stops every\n"
          "node's copies, and every launcher exits with its status.\n"
          "With --nnodes=MIN:MAX (or --min-nodes=MIN), the job starts\n"
          "once MIN nodes joined and --last-call-s passed; nodes that\n"
          "come later join it while it runs, and a node that is lost\n"
          "(its processes lost with their workers, its host gone, or\n"
          "its launcher sent SIGTERM, node 0's excepted) leaves it while\n"
          "MIN nodes are left.",
          Plus(kClusterFlags,
               {"job", "nnodes", "node_rank", "nproc_per_node", "coordinator",
                "host", "master_port", "start_timeout_s", "max_restarts",
                "min_np", "min_nodes", "last_call_s"})));
  if (positional.size() > 1) {
    std::fprintf(stderr,
                 "gradmesh run: unexpected argument '%s' (the command goes "
                 "after --)\n",
                 positional[1].c_str());
    return 2;
  }
  if (command.empty()) {
    std::fprintf(stderr,
                 "gradmesh run: no command after --; usage: gradmesh run "
                 "--workers=P [flags] -- CMD [ARGS...]\n");
    return 2;
  }
  absl::StatusOr<gradmesh::tools::RunOptions> options = RunOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "gradmesh run: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  options->command = std::move(command);
  return gradmesh::tools::RunCommand(*options);
}

// `gradmesh health [--address=HOST:PORT] [--service=NAME]`.
int Health(int argc, char** argv) {
  const std::vector<std::string> positional = gradmesh::ParseFlags(
      argc, argv, "GRADMESH_",
      CommandHelp("usage: gradmesh health [flags]\n\n"
                  "Asks a daemon's health service whether it serves: exit 0\n"
                  "if so, else 1 with the answer.",
                  {"address", "service", "probe_timeout_ms"}));
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradmesh health: unexpected argument '%s'\n",
                 positional[1].c_str());
    return 2;
  }
  const std::string address = absl::GetFlag(FLAGS_address);
  const std::string service = absl::GetFlag(FLAGS_service);
  const absl::Status status = gradmesh::CheckHealth(
      address, service, absl::GetFlag(FLAGS_probe_timeout_ms));
  if (!status.ok()) {
    std::fprintf(stderr, "gradmesh health: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  std::printf("%s: %s SERVING\n", address.c_str(),
              service.empty() ? "(live)" : service.c_str());
  return 0;
}

// `gradmesh sim`'s request from the flags, for `algorithm`.
absl::StatusOr<gradmesh::tools::SimRequest> SimRequestFromFlags(
    const gradmesh::collectives::AlgorithmOptions& algorithm, bool all_teams) {
  const double gbit = absl::GetFlag(FLAGS_gbit);
  if (!(gbit > 0)) {
    return absl::InvalidArgumentError("--gbit must be positive");
  }
  const uint64_t iterations = absl::GetFlag(FLAGS_iterations);
  return gradmesh::tools::SimRequest{
      .base = {.algorithm = algorithm,
               .workers = absl::GetFlag(FLAGS_workers),
               .n = absl::GetFlag(FLAGS_n),
               .max_values = absl::GetFlag(FLAGS_max_values),
               // Past the limit, still past it: ValidateCase says so.
               .iterations = static_cast<int>(std::min<uint64_t>(
                   iterations, gradmesh::tools::kMaxSimIterations + 1)),
               .seed = absl::GetFlag(FLAGS_seed),
               .timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s)),
               .link = {.alpha_s = absl::GetFlag(FLAGS_alpha_us) * 1e-6,
                        .beta_s_per_byte = 8e-9 / gbit},
               .compute = {.select_s_per_value =
                               absl::GetFlag(FLAGS_select_ns) * 1e-9,
                           .merge_s_per_value =
                               absl::GetFlag(FLAGS_merge_ns) * 1e-9,
                           .accumulate_s_per_value =
                               absl::GetFlag(FLAGS_accumulate_ns) * 1e-9}},
      .all_teams = all_teams,
      .calibrate = absl::GetFlag(FLAGS_calibrate),
      .compute_scale = absl::GetFlag(FLAGS_compute_scale),
      .skip_factor = absl::GetFlag(FLAGS_skip_factor),
      .json = absl::GetFlag(FLAGS_json)};
}

// `gradmesh sim`: a bare --json means JSON on stdout.
int Sim(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> pointers;
  for (std::string& arg : args) {
    if (arg == "--json") arg = "--json=-";
    pointers.push_back(arg.data());
  }
  const std::vector<std::string> positional = gradmesh::ParseFlags(
      static_cast<int>(pointers.size()), pointers.data(), "GRADMESH_",
      CommandHelp(
          "usage: gradmesh sim [flags]\n\n"
          "Predicts an all-reduce on a simulated network: the real\n"
          "algorithms on P in-process workers, each link alpha +\n"
          "bytes x beta, compute per value.",
          Plus(kAlgorithmFlags,
               {"workers", "n", "max_values", "iterations", "timeout_s",
                "alpha_us", "gbit", "select_ns", "merge_ns", "accumulate_ns",
                "calibrate", "compute_scale", "skip_factor", "json"})));
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradmesh sim: unexpected argument '%s'\n",
                 positional[1].c_str());
    return 2;
  }
  const std::string teams_flag = absl::GetFlag(FLAGS_teams);
  int teams = 1;
  const bool all_teams = teams_flag == "all";
  if (!all_teams && !teams_flag.empty() &&
      !absl::SimpleAtoi(teams_flag, &teams)) {
    std::fprintf(stderr, "gradmesh sim: --teams=%s is not a number or all\n",
                 teams_flag.c_str());
    return 2;
  }
  const auto algorithm = AlgorithmFromFlags(teams);
  if (!algorithm.ok()) {
    std::fprintf(stderr, "gradmesh sim: %s\n",
                 std::string(algorithm.status().message()).c_str());
    return 2;
  }
  const auto request = SimRequestFromFlags(*algorithm, all_teams);
  if (!request.ok()) {
    std::fprintf(stderr, "gradmesh sim: %s\n",
                 std::string(request.status().message()).c_str());
    return 2;
  }
  const absl::Status status = gradmesh::tools::RunSimCommand(*request);
  if (!status.ok()) {
    std::fprintf(stderr, "gradmesh sim: %s\n",
                 std::string(status.message()).c_str());
    return absl::IsInvalidArgument(status) ? 2 : 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "replay") {
    // Parse as "gradmesh replay" with the remaining flags.
    std::string name = absl::StrCat(argv[0], " replay");
    argv[1] = name.data();
    return Replay(argc - 1, argv + 1);
  }
  if (command == "local") {
    std::string name = absl::StrCat(argv[0], " local");
    argv[1] = name.data();
    gradmesh::ExitAfterShutdown(Local(argc - 1, argv + 1));
  }
  if (command == "run") {
    std::string name = absl::StrCat(argv[0], " run");
    argv[1] = name.data();
    gradmesh::ExitAfterShutdown(Run(argc - 1, argv + 1));
  }
  if (command == "sim") {
    std::string name = absl::StrCat(argv[0], " sim");
    argv[1] = name.data();
    return Sim(argc - 1, argv + 1);
  }
  if (command == "health") {
    std::string name = absl::StrCat(argv[0], " health");
    argv[1] = name.data();
    return Health(argc - 1, argv + 1);
  }
  if (command.empty() || command == "--help" || command == "-h" ||
      command == "help") {
    std::printf("%s\n", kUsage);
    return command.empty() ? 2 : 0;
  }
  std::fprintf(stderr, "gradmesh: unknown command '%s'\n%s\n", command.c_str(),
               kUsage);
  return 2;
}
