// Coordinator: the coordinator's state machine (membership, epochs, the plan
// and SparDL's d autotune), without gRPC. The gRPC service is a thin layer
// over it; tests drive it with an explicit clock: every method where time
// matters takes `now`, and nothing reads the wall clock.
//
// Membership and epochs. Workers Join (with a node_id), Heartbeat and Leave.
// Every change of the member set, and every change of the plan, publishes a
// new epoch (epoch + 1). A view lists the members sorted by node_id: a
// member's index is its rank. Tick(now) removes the members whose last join
// or heartbeat is more than heartbeat_timeout before `now` (exactly
// heartbeat_timeout old still counts as alive), in one epoch; or else the
// member that others cannot reach, as their heartbeats report it
// (link_reports.h), keeping it out for the quarantine. A removed
// worker learns it from Heartbeat's NotFound and joins again, into a later
// epoch. Workers run each step with the plan of the newest view whose
// start_step it has reached (a membership change applies at once).
//
// The plan. Algorithm, density, encodings and chunk size come from the
// PlanConfig (the coordinator's flags). The algorithm and SparDL's d:
//   - other algorithms, or a single member: d = 1 (`auto` alone: dense);
//   - a fixed config.teams: that d if it divides P, else d = 1 with a note;
//   - SparDL with config.teams == 0, or `auto`, and P >= 2: an autotune
//     round (autotune.h; Section III-D, "the selection of the optimal d":
//     try each d, keep the fastest or the largest d within
//     config.teams_margin of it; `auto` tries the dense ring too, and
//     chooses per bucket size).
//
// Autotune round. Each membership change starts a round for the new P (a
// change in the middle of a round restarts it), and so does a chosen plan
// that stops fitting the link (RetuneWatch, retune.h; config.retune_factor).
// The SparDL candidates are ValidTeamCounts(P) (or the fixed d), ranked by
// RankTeamCounts (cost_model.h, the ranking `gradmesh sim` reports) with the
// `values` n of the latest accepted report and link(); before n is known the
// rounds alone rank, and the untried candidates are ranked again when the first
// trial ends. Each trial is an epoch whose plan names its candidate with
// autotuning = true; its operations are counted as autotune.h says. After
// the last, the choice is published in a new epoch with autotuning = false
// and the round's note (e.g. "autotune chose d=2 (12.300 ms) over d=1
// (20.100 ms), d=4 (15.000 ms)"), and the link model is refitted
// (FitLinkModel) from the (rounds, bytes_received, seconds) of the accepted
// reports, so the next round ranks with measured figures.
//
// Thread-safety: all methods may be called concurrently (one internal mutex).
// WaitForView blocks; nothing else does.
//
//   Coordinator coordinator(PlanConfig{}, absl::Seconds(10));
//   GM_ASSIGN_OR_RETURN(View view, coordinator.Join(
//       {.node_id = "node-a", .address = "10.0.0.1:7000"}, absl::Now()));
//   // ... a watcher thread:
//   View next = coordinator.WaitForView(view.epoch, deadline);
#ifndef GRADMESH_SERVER_COORDINATOR_H_
#define GRADMESH_SERVER_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/autotune.h"
#include "server/cost_model.h"
#include "server/link_reports.h"
#include "server/retune.h"
#include "worker/collectives/plan.h"

namespace gradmesh::server {

struct MemberInfo {
  std::string node_id;  // stable name of the worker, e.g. its host name
  std::string address;  // where peers reach its exchange service
  std::string host;
  int gpus = 0;
  std::string gpu_name;
  uint64_t incarnation = 0;  // NodeInfo.incarnation
};

// The coordinator's flags for the plan.
struct PlanConfig {
  // A collectives::AlgorithmNames() entry, or kAutoAlgorithm.
  std::string algorithm = "spardl";
  double density = 0.01;         // k / n, in (0, 1]
  std::string encoding = "coo";  // collectives::WireFormat::Parse names
  std::string values = "fp32";
  int quantize_bits = 0;  // collectives::Plan's fields of the same names
  int oktopk_tau = 64;
  int oktopk_tau_prime = 32;
  uint64_t seed = 1;
  // Buckets of fewer values are summed exactly: metrics, biases and norms
  // (64 KiB of fp32, as BytePS's smallest compressed tensor).
  uint64_t exact_below = 16384;
  // Steps below this of every bucket are summed exactly (Plan::warmup_steps);
  // workers report no exact step to the autotune (Daemon::Report).
  uint64_t warmup_steps = 0;
  std::string fusion = "per_tensor";  // collectives::Plan::fusion
  uint64_t chunk_bytes = 1 << 20;     // > 0
  int teams = 0;                      // SparDL's d: 0 = autotune, else fixed
  int autotune_window = 5;            // counted operations per candidate (>= 1)
  double skip_factor = 3.0;           // skip d modeled > this x the best (>= 1)
  // With `auto`: SparDL only for the bucket sizes where it makes the training
  // step this many times shorter than the dense ring (>= 1; autotune.h).
  double sparse_margin = 1.5;
  // SparDL's d: the largest whose trial is within this x the fastest's
  // (>= 1; autotune.h).
  double teams_margin = 1.25;
  // After a round, a bucket size whose all-reduce takes more than this x its
  // trial's time over retune_steps steps (the median) starts a new round on
  // the same members (retune.h); 0: only a membership change does (else >
  // 1).
  double retune_factor = 2.0;
  int retune_steps = 20;      // 1 to 100000
  int switch_lead_steps = 3;  // see View::start_step (>= 1)
  LinkModel link;             // used until reports allow a fit
};

using Plan = collectives::Plan;

struct View {
  uint64_t epoch = 0;               // 0 until the first join
  std::vector<MemberInfo> members;  // index = rank, sorted by node_id
  Plan plan;
  // First step (the clients' step numbers) the view applies to. A view that
  // changes membership applies at once (0). A plan change within the same
  // membership starts switch_lead_steps past the highest step reported, so
  // every member switches at the same step without a pause.
  uint64_t start_step = 0;
  // The epoch at which these members first formed a view (View proto).
  uint64_t membership_epoch = 0;
  // The nodes kept out for a link that dropped their packets, as of the
  // coordinator's latest clock reading (LinkReports::Quarantines).
  std::vector<LinkReports::Quarantine> kept_out;
  // The coordinator that published it (Coordinator::incarnation()).
  uint64_t incarnation = 0;
};

// One worker's figures for one operation of one epoch.
struct IterationReport {
  std::string node_id;
  uint64_t epoch = 0;
  uint64_t operation = 0;  // the step; the first one done in a trial warms up
  double seconds = 0;      // wall time of the all-reduce
  double period_seconds = 0;  // since the step before began (0: not known)
  int rounds = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t values = 0;  // n, the length of the (dense) gradient reduced
};

// PlanConfig::algorithm's choice of the dense ring or SparDL per bucket.
inline constexpr absl::string_view kAutoAlgorithm = "auto";

class Coordinator {
 public:
  // heartbeat_timeout and quarantine (LinkReports) must be positive, and
  // the config valid; otherwise every Join fails with InvalidArgument.
  Coordinator(PlanConfig config, absl::Duration heartbeat_timeout,
              absl::Duration quarantine = absl::Seconds(30));

  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // This coordinator, among all that serve a cluster over time: its start in
  // microseconds since the Unix epoch, past every earlier one in this
  // process. Its views carry it.
  uint64_t incarnation() const { return incarnation_; }

  // Adds `member` (last seen at `now`) and publishes a new epoch; returns its
  // view. A node_id already present is replaced: its old incarnation leaves.
  // InvalidArgument for an empty node_id or address, or an unusable config;
  // Unavailable, nothing changed, while the node is kept out (LinkReports).
  //
  // `known` is the view the worker runs now, if any (it keeps it across a
  // coordinator restart). So that a restart loses nothing:
  //   - a coordinator that has published nothing yet adopts the first known
  //     view that lists its sender: its epoch, members (each last seen at
  //     `now`) and plan, publishing nothing new (a new epoch only if its plan
  //     is not one this config would run); the other members go on with
  //     their heartbeats, and those that never come back are removed by Tick;
  //   - a member that joins again knowing the current epoch is the same
  //     process (it lost contact): it is marked alive, no new epoch;
  //   - the nodes a known view keeps out (View::kept_out) are kept out here
  //     too, for their whole quarantine from `now`, when another coordinator
  //     published that view, at or past the current epoch (once per such
  //     view): a member among them is removed, in a new epoch; so a restart
  //     does not let a node removed for its link back in, whichever member
  //     joins first (see Heartbeat). They stay adopted even if this Join is
  //     refused. At most kMaxKeptOut (InvalidArgument past that, nothing
  //     changed);
  //   - a known epoch above the current one raises it, and a new epoch is
  //     published past it, so epochs only grow across restarts. It may
  //     raise it to kMaxRaisedEpoch, or be adopted up to kMaxAdoptedEpoch
  //     (InvalidArgument past that, nothing changed); a known epoch not
  //     above the current one is always accepted. So the epochs published
  //     later (2^31 between the two limits, 2^31 more to 2^53, the largest
  //     that a double holds exactly) stay ones that Joins may carry.
  //   - a node that LinkReports has on probation (removed for its link)
  //     and that is not a member joins only having probed a `known` view
  //     that lists every current member (FailedPrecondition otherwise: join
  //     again with the current view), and naming none of them in
  //     `unreachable` (the members of `known` it could not reach as it
  //     joined; nullopt: it did not probe; at most as many as `known` has):
  //     Unavailable otherwise. Nothing changes on either refusal.
  absl::StatusOr<View> Join(const MemberInfo& member, absl::Time now,
                            const View* known = nullptr,
                            const std::optional<std::vector<std::string>>&
                                unreachable = std::nullopt);
  static constexpr uint64_t kMaxRaisedEpoch =
      (uint64_t{1} << 53) - (uint64_t{1} << 32);
  static constexpr uint64_t kMaxAdoptedEpoch =
      (uint64_t{1} << 53) - (uint64_t{1} << 31);
  static constexpr size_t kMaxKeptOut = 4096;

  // Marks the member alive at `now`, and notes the members it cannot reach
  // (node ids; LinkReports::Update). NotFound if it is not a member (it was
  // removed and must join again), or if it runs a view (`epoch`, 0: not
  // told; of the coordinator `incarnation`, 0: not told) above the current
  // epoch, or another coordinator's at it: this coordinator adopted another
  // view after a restart, and the member's Join brings its own (with its
  // quarantines). InvalidArgument, the reports ignored, for more names than
  // members.
  absl::Status Heartbeat(absl::string_view node_id, absl::Time now,
                         const std::vector<std::string>& unreachable = {},
                         uint64_t epoch = 0, uint64_t incarnation = 0);

  // Removes the member and publishes a new epoch; NotFound if not a member.
  absl::Status Leave(absl::string_view node_id);

  // A member removed because others could not reach it.
  struct LinkRemoval {
    std::string node_id;
    std::vector<std::string> reporters;
    absl::Duration kept_out;
  };
  // Removes the members silent for more than heartbeat_timeout before `now`;
  // if none, the one LinkReports chooses (returned). One new epoch if any
  // was removed.
  std::optional<LinkRemoval> Tick(absl::Time now);

  // The coordinator could not watch for `unobserved` before `now` (its
  // process was paused or starved): that silence is no member's. Moves every
  // member's last sign of life, and every link report, forward by it, to
  // `now` at most.
  void Excuse(absl::Duration unobserved, absl::Time now);

  // Feeds the autotune, the link model and last_iteration_seconds().
  // InvalidArgument for negative or non-finite seconds (or period). Reports for
  // another epoch than the current one, or from non-members, are ignored (OK).
  absl::Status Report(const IterationReport& report);

  View view() const;

  // Blocks until the epoch exceeds `after_epoch` or `deadline` passes, and
  // returns the current view either way.
  View WaitForView(uint64_t after_epoch, absl::Time deadline) const;

  // The autotune round's candidates in trial order (skipped ones included):
  // the round in progress, or the last one while its result is in force;
  // empty when the current membership has no round.
  std::vector<Trial> trials() const;

  // The link model used for ranking: the configured one until a round's
  // reports allow a fit.
  LinkModel link() const;

  // The seconds of each member's latest accepted report.
  absl::flat_hash_map<std::string, double> last_iteration_seconds() const;

 private:
  struct Member {
    MemberInfo info;
    absl::Time last_seen;
  };

  // Publishes the next epoch with `plan`.
  void PublishLocked(Plan plan, uint64_t start_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new member set: new epoch, new plan, maybe a new autotune round.
  void MembershipChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a round on the current members, its first trial from
  // `start_step`.
  void StartRoundLocked(uint64_t start_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes over `known` (see Join); false if it can't (nothing changes).
  bool AdoptLocked(const View& known, const MemberInfo& member, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Join's checks of its arguments alone (InvalidArgument).
  static absl::Status CheckJoin(
      const MemberInfo& member, const View* known,
      const std::optional<std::vector<std::string>>& unreachable);
  // For a node on probation: see Join.
  absl::Status CheckReachesMembersLocked(
      absl::string_view node_id, const View* known,
      const std::optional<std::vector<std::string>>& unreachable,
      absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Keeps out the nodes `known` (another coordinator's view) keeps out, from
  // `now`; removes the members among them, in a new epoch past `known`'s.
  void AdoptQuarantinesLocked(const View& known, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the members kept out at `now`; returns whether any was.
  bool DropKeptOutLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether this config would run `plan` on `world_size` members as it is
  // (an autotuned d counts when no trial is in progress).
  bool PlanFits(const Plan& plan, int world_size) const;
  // The plan for `world_size` members when no autotune round runs.
  Plan FixedPlan(int world_size) const;
  // Whether `world_size` members get an autotune round, and its d's.
  bool Tunes(int world_size) const;
  std::vector<int> TeamCandidates(int world_size) const;
  Plan BasePlan() const;
  // Publishes round_'s current trial, or the result when all are done.
  void PublishTrialOrResultLocked(uint64_t start_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  View ViewLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const PlanConfig config_;
  const absl::Duration heartbeat_timeout_;
  const uint64_t incarnation_;
  const absl::Status config_status_;

  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t membership_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // View's
  uint64_t start_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_step_ ABSL_GUARDED_BY(mu_) = 0;  // highest step reported
  std::map<std::string, Member, std::less<>> members_ ABSL_GUARDED_BY(mu_);
  LinkReports links_ ABSL_GUARDED_BY(mu_);
  // The latest time a call passed in (what a view's kept_out is as of).
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The last earlier coordinator's view (incarnation, epoch) whose kept_out
  // was adopted: the members that bring it next add nothing.
  std::pair<uint64_t, uint64_t> quarantines_from_ ABSL_GUARDED_BY(mu_);
  Plan plan_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AutotuneRound> round_ ABSL_GUARDED_BY(mu_);  // null: none
  // Why the round in progress started on the same members ("" after a
  // membership change), and the watch over the last round's choice.
  std::string retune_reason_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RetuneWatch> watch_ ABSL_GUARDED_BY(mu_);  // null: none
  // The last round's choice, and the watch's steps over retune_steps (x2
  // for each round the watch started that chose the same, to 16).
  Choice last_choice_ ABSL_GUARDED_BY(mu_);
  int retune_backoff_ ABSL_GUARDED_BY(mu_) = 1;
  LinkModel link_ ABSL_GUARDED_BY(mu_);
  std::deque<LinkSample> samples_ ABSL_GUARDED_BY(mu_);  // newest last
  uint64_t n_ ABSL_GUARDED_BY(mu_) = 0;  // latest reported n; 0 = unknown
  absl::flat_hash_map<std::string, double> last_seconds_ ABSL_GUARDED_BY(mu_);
};

// InvalidArgument naming the first field of `config` the plan cannot use.
absl::Status ValidatePlanConfig(const PlanConfig& config);

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_COORDINATOR_H_
