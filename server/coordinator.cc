#include "server/coordinator.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/collectives/registry.h"
#include "worker/transport/transport.h"

namespace gradmesh::server {
namespace {

constexpr absl::string_view kSparDl = "spardl";

// The link model is fitted from at most this many recent reports.
constexpr size_t kMaxLinkSamples = 4096;

// Epochs stay exact in the metrics' doubles.
constexpr uint64_t kMaxEpoch = uint64_t{1} << 53;

// An operation still missing reports from a member that never reported a
// later one, when a step this many later is reported, has lost them anyway
// (that member's reports do not arrive): it counts with the reports it has.
constexpr uint64_t kStepsBeforeReportsAreLost = 8;

std::string Milliseconds(double seconds) {
  return absl::StrFormat("%.3f ms", seconds * 1e3);
}

// The plan `config` names, with d = 1.
Plan PlanOfConfig(const PlanConfig& config) {
  return Plan{.algorithm = config.algorithm,
              .density = config.density,
              .teams = 1,
              .encoding = config.encoding,
              .values = config.values,
              .quantize_bits = config.quantize_bits,
              .oktopk_tau = config.oktopk_tau,
              .oktopk_tau_prime = config.oktopk_tau_prime,
              .seed = config.seed,
              .exact_below = config.exact_below,
              .fusion = config.fusion,
              .chunk_bytes = config.chunk_bytes};
}

}  // namespace

struct Coordinator::Round {
  std::vector<Trial> trials;
  size_t current = 0;            // index of the trial in progress
  bool ranked_by_model = false;  // ranked with a known n
  double sum_of_max = 0;         // over the current trial's counted operations
  // The current trial's incomplete operations: operation -> node -> seconds.
  std::map<uint64_t, absl::flat_hash_map<std::string, double>> pending;
  absl::flat_hash_set<uint64_t> completed;  // of the current trial
  // The highest step each member has reported in the current trial: its
  // reports come in order, so one missing below it was lost.
  absl::flat_hash_map<std::string, uint64_t> latest;
  bool warmed_up = false;  // the trial's first completed operation is done
};

absl::Status ValidatePlanConfig(const PlanConfig& config) {
  const std::vector<std::string> names = collectives::AlgorithmNames();
  if (std::find(names.begin(), names.end(), config.algorithm) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown algorithm '", config.algorithm,
                     "'; known: ", absl::StrJoin(names, ", ")));
  }
  if (!(config.density > 0 && config.density <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("density must lie in (0, 1], got ", config.density));
  }
  // The algorithm's own checks of every plan field but d (one worker).
  absl::StatusOr<collectives::AlgorithmOptions> options =
      collectives::AlgorithmOptionsOf(PlanOfConfig(config));
  if (!options.ok()) return options.status();
  GM_RETURN_IF_ERROR(collectives::CreateCollective(*options, 1, 0, 0).status());
  if (config.chunk_bytes == 0 ||
      config.chunk_bytes > transport::kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must lie in [1, ", transport::kMaxChunkBytes,
                     "], got ", config.chunk_bytes));
  }
  if (config.teams < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("teams must be 0 (auto) or positive, got ", config.teams));
  }
  if (config.autotune_window < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "autotune_window must be at least 1, got ", config.autotune_window));
  }
  if (config.switch_lead_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("switch_lead_steps must be at least 1, got ",
                     config.switch_lead_steps));
  }
  if (config.fusion != collectives::kPerTensor &&
      config.fusion != collectives::kAfterFusion) {
    return absl::InvalidArgumentError(
        absl::StrCat("fusion must be per_tensor or after_fusion, got '",
                     config.fusion, "'"));
  }
  if (!(config.skip_factor >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skip_factor must be at least 1, got ", config.skip_factor));
  }
  if (!(config.link.alpha_s >= 0 && config.link.beta_s_per_byte >= 0 &&
        std::isfinite(config.link.alpha_s) &&
        std::isfinite(config.link.beta_s_per_byte))) {
    return absl::InvalidArgumentError(
        "link alpha and beta must be finite and non-negative");
  }
  return absl::OkStatus();
}

Coordinator::Coordinator(PlanConfig config, absl::Duration heartbeat_timeout)
    : config_(std::move(config)),
      heartbeat_timeout_(heartbeat_timeout),
      config_status_(heartbeat_timeout > absl::ZeroDuration()
                         ? ValidatePlanConfig(config_)
                         : absl::InvalidArgumentError(
                               "heartbeat_timeout must be positive")),
      plan_(BasePlan()),
      link_(config_.link) {}

Coordinator::~Coordinator() = default;

absl::StatusOr<View> Coordinator::Join(const MemberInfo& member, absl::Time now,
                                       const View* known) {
  if (!config_status_.ok()) return config_status_;
  if (member.node_id.empty() || member.address.empty()) {
    return absl::InvalidArgumentError("node_id and address must be set");
  }
  if (known != nullptr && known->epoch > kMaxEpoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("a known epoch of ", known->epoch, " is past 2^53"));
  }
  absl::MutexLock lock(&mu_);
  if (known != nullptr && epoch_ == 0 && AdoptLocked(*known, member, now)) {
    return ViewLocked();
  }
  auto present = members_.find(member.node_id);
  if (known != nullptr && known->epoch == epoch_ && epoch_ > 0 &&
      present != members_.end() &&
      present->second.info.address == member.address &&
      present->second.info.incarnation == member.incarnation) {
    present->second.last_seen = std::max(present->second.last_seen, now);
    return ViewLocked();
  }
  if (known != nullptr) epoch_ = std::max(epoch_, known->epoch);
  // A previous incarnation's figures do not describe the new one.
  last_seconds_.erase(member.node_id);
  members_.insert_or_assign(member.node_id,
                            Member{.info = member, .last_seen = now});
  MembershipChangedLocked();
  return ViewLocked();
}

bool Coordinator::AdoptLocked(const View& known, const MemberInfo& member,
                              absl::Time now) {
  const bool lists_sender = std::any_of(
      known.members.begin(), known.members.end(), [&](const MemberInfo& m) {
        return m.node_id == member.node_id && m.address == member.address;
      });
  if (known.epoch == 0 || !lists_sender || !members_.empty()) return false;
  for (const MemberInfo& m : known.members) {
    if (m.node_id.empty() || m.address.empty()) return false;
  }
  for (const MemberInfo& m : known.members) {
    members_.insert_or_assign(m.node_id, Member{.info = m, .last_seen = now});
  }
  members_.insert_or_assign(member.node_id,
                            Member{.info = member, .last_seen = now});
  epoch_ = known.epoch;
  membership_epoch_ =
      known.membership_epoch > 0 ? known.membership_epoch : known.epoch;
  start_step_ = known.start_step;
  plan_ = known.plan;
  round_.reset();
  if (!PlanFits(known.plan, static_cast<int>(members_.size()))) {
    MembershipChangedLocked();
  }
  return true;
}

Plan Coordinator::FixedPlan(int world_size) const {
  Plan plan = BasePlan();
  if (config_.algorithm == kSparDl && config_.teams > 0) {
    if (world_size % config_.teams == 0) {
      plan.teams = config_.teams;
    } else {
      plan.note = absl::StrFormat("teams=%d does not divide P=%d; using d=1",
                                  config_.teams, world_size);
    }
  }
  return plan;
}

bool Coordinator::PlanFits(const Plan& plan, int world_size) const {
  const Plan base = BasePlan();
  if (plan.algorithm != base.algorithm || plan.density != base.density ||
      plan.encoding != base.encoding || plan.values != base.values ||
      plan.quantize_bits != base.quantize_bits ||
      plan.oktopk_tau != base.oktopk_tau ||
      plan.oktopk_tau_prime != base.oktopk_tau_prime ||
      plan.seed != base.seed || plan.exact_below != base.exact_below ||
      plan.fusion != base.fusion || plan.chunk_bytes != base.chunk_bytes ||
      plan.autotuning) {
    return false;
  }
  if (config_.algorithm == kSparDl && config_.teams == 0 && world_size >= 2) {
    const std::vector<int> valid = ValidTeamCounts(world_size);
    return std::find(valid.begin(), valid.end(), plan.teams) != valid.end();
  }
  return plan.teams == FixedPlan(world_size).teams;
}

absl::Status Coordinator::Heartbeat(absl::string_view node_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(node_id);
  if (it == members_.end()) {
    return absl::NotFoundError(
        absl::StrCat("'", node_id, "' is not a member; join again"));
  }
  it->second.last_seen = std::max(it->second.last_seen, now);
  return absl::OkStatus();
}

absl::Status Coordinator::Leave(absl::string_view node_id) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(node_id);
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("'", node_id, "' is not a member"));
  }
  last_seconds_.erase(it->first);
  members_.erase(it);
  MembershipChangedLocked();
  return absl::OkStatus();
}

void Coordinator::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  bool removed = false;
  for (auto it = members_.begin(); it != members_.end();) {
    if (now - it->second.last_seen > heartbeat_timeout_) {
      last_seconds_.erase(it->first);
      it = members_.erase(it);
      removed = true;
    } else {
      ++it;
    }
  }
  if (removed) MembershipChangedLocked();
}

absl::Status Coordinator::Report(const IterationReport& report) {
  if (!std::isfinite(report.seconds) || report.seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seconds must be finite and non-negative, got ", report.seconds));
  }
  absl::MutexLock lock(&mu_);
  if (report.epoch != epoch_ || !members_.contains(report.node_id)) {
    return absl::OkStatus();
  }
  last_seconds_[report.node_id] = report.seconds;
  max_step_ = std::max(max_step_, report.operation);
  if (report.values > 0) n_ = report.values;
  if (report.rounds > 0) {
    samples_.push_back({.rounds = report.rounds,
                        .bytes = static_cast<double>(report.bytes_received),
                        .seconds = report.seconds});
    if (samples_.size() > kMaxLinkSamples) samples_.pop_front();
  }
  if (!plan_.autotuning) return absl::OkStatus();

  Round& round = *round_;
  if (round.completed.contains(report.operation)) return absl::OkStatus();
  round.pending[report.operation][report.node_id] = report.seconds;
  uint64_t& latest = round.latest[report.node_id];
  latest = std::max(latest, report.operation);
  ResolveOperationsLocked(report.operation);
  return absl::OkStatus();
}

void Coordinator::ResolveOperationsLocked(uint64_t latest) {
  Round& round = *round_;
  const size_t trial = round.current;
  // In step order, so that the warm-up is the earliest operation resolved.
  for (auto it = round.pending.begin();
       round.current == trial && it != round.pending.end();) {
    const auto& [operation, seconds] = *it;
    auto reported = [&](const std::string& node) {
      auto later = round.latest.find(node);
      return seconds.contains(node) ||
             (later != round.latest.end() && later->second > operation);
    };
    const bool complete =
        std::all_of(members_.begin(), members_.end(),
                    [&](const auto& m) { return reported(m.first); });
    const bool lost = operation + kStepsBeforeReportsAreLost <= latest;
    if (!complete && !lost) {
      ++it;
      continue;
    }
    double max_seconds = 0;
    for (const auto& [node, s] : seconds)
      max_seconds = std::max(max_seconds, s);
    round.completed.insert(operation);
    it = round.pending.erase(it);
    // The first operation of a trial warms up (connections, allocations).
    if (round.warmed_up) {
      CountOperationLocked(max_seconds);  // may start the next trial
    } else {
      round.warmed_up = true;
    }
  }
}

View Coordinator::view() const {
  absl::ReaderMutexLock lock(&mu_);
  return ViewLocked();
}

View Coordinator::WaitForView(uint64_t after_epoch, absl::Time deadline) const {
  absl::ReaderMutexLock lock(&mu_);
  auto changed = [this, after_epoch]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return epoch_ > after_epoch;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return ViewLocked();
}

std::vector<Trial> Coordinator::trials() const {
  absl::ReaderMutexLock lock(&mu_);
  return round_ != nullptr ? round_->trials : std::vector<Trial>{};
}

LinkModel Coordinator::link() const {
  absl::ReaderMutexLock lock(&mu_);
  return link_;
}

absl::flat_hash_map<std::string, double> Coordinator::last_iteration_seconds()
    const {
  absl::ReaderMutexLock lock(&mu_);
  return last_seconds_;
}

void Coordinator::PublishLocked(Plan plan, uint64_t start_step) {
  ++epoch_;
  plan_ = std::move(plan);
  start_step_ = start_step;
  // Waiters re-evaluate their conditions when the mutex is released.
}

Plan Coordinator::BasePlan() const { return PlanOfConfig(config_); }

void Coordinator::MembershipChangedLocked() {
  const int world_size = static_cast<int>(members_.size());
  round_.reset();
  if (config_.algorithm == kSparDl && config_.teams == 0 && world_size >= 2) {
    round_ = std::make_unique<Round>();
    for (int d : ValidTeamCounts(world_size)) {
      round_->trials.push_back({.teams = d});
    }
    RankLocked(0);
    PublishTrialOrResultLocked(0);
  } else {
    PublishLocked(FixedPlan(world_size), 0);
  }
  membership_epoch_ = epoch_;
}

void Coordinator::RankLocked(size_t from) {
  const std::vector<TeamCountModel> ranked =
      RankTeamCounts(static_cast<int>(members_.size()), n_, config_.density,
                     link_, config_.skip_factor);
  round_->ranked_by_model = n_ > 0;
  absl::flat_hash_map<int, size_t> positions;  // in `ranked`, by d
  for (size_t i = 0; i < ranked.size(); ++i) positions[ranked[i].teams] = i;
  auto position = [&](const Trial& trial) {
    const auto it = positions.find(trial.teams);
    GM_CHECK(it != positions.end()) << "d=" << trial.teams;
    return it->second;
  };
  std::vector<Trial>& trials = round_->trials;
  for (Trial& trial : trials) {
    trial.modeled_seconds = ranked[position(trial)].seconds;
  }
  std::sort(trials.begin() + from, trials.end(),
            [&](const Trial& a, const Trial& b) {
              return position(a) < position(b);
            });
  for (size_t i = from; i < trials.size(); ++i) {
    trials[i].skipped = ranked[position(trials[i])].skipped;
  }
}

void Coordinator::CountOperationLocked(double max_seconds) {
  Round& round = *round_;
  Trial& trial = round.trials[round.current];
  round.sum_of_max += max_seconds;
  ++trial.iterations;
  if (trial.iterations < config_.autotune_window) return;
  trial.mean_seconds = round.sum_of_max / trial.iterations;
  round.sum_of_max = 0;
  round.pending.clear();
  round.completed.clear();
  round.latest.clear();
  round.warmed_up = false;
  ++round.current;
  // The first trial's reports tell n: rank the rest with the model now.
  if (!round.ranked_by_model && n_ > 0) RankLocked(round.current);
  PublishTrialOrResultLocked(max_step_ + config_.switch_lead_steps);
}

void Coordinator::PublishTrialOrResultLocked(uint64_t start_step) {
  Round& round = *round_;
  const std::vector<Trial>& trials = round.trials;
  while (round.current < trials.size() && trials[round.current].skipped) {
    ++round.current;
  }
  Plan plan = BasePlan();
  if (round.current < trials.size()) {
    plan.teams = trials[round.current].teams;
    plan.autotuning = true;
    plan.note = absl::StrFormat("autotune trial of d=%d", plan.teams);
    PublishLocked(std::move(plan), start_step);
    return;
  }

  // All trials done: the fastest wins, ties to the earlier trial.
  const Trial* best = nullptr;
  for (const Trial& trial : trials) {
    if (!trial.skipped &&
        (best == nullptr || trial.mean_seconds < best->mean_seconds)) {
      best = &trial;
    }
  }
  std::vector<std::string> others, skipped;
  for (const Trial& trial : trials) {
    if (trial.skipped) {
      skipped.push_back(absl::StrCat("d=", trial.teams));
    } else if (&trial != best) {
      others.push_back(absl::StrFormat("d=%d (%s)", trial.teams,
                                       Milliseconds(trial.mean_seconds)));
    }
  }
  plan.teams = best->teams;
  plan.note = absl::StrFormat("autotune chose d=%d (%s)", best->teams,
                              Milliseconds(best->mean_seconds));
  if (!others.empty()) {
    absl::StrAppend(&plan.note, " over ", absl::StrJoin(others, ", "));
  }
  if (!skipped.empty()) {
    absl::StrAppend(
        &plan.note, "; skipped ", absl::StrJoin(skipped, ", "),
        absl::StrFormat(" (modeled over %gx the best)", config_.skip_factor));
  }
  link_ = FitLinkModel(
      std::vector<LinkSample>(samples_.begin(), samples_.end()), link_);
  PublishLocked(std::move(plan), start_step);
}

View Coordinator::ViewLocked() const {
  View view{.epoch = epoch_,
            .plan = plan_,
            .start_step = start_step_,
            .membership_epoch = membership_epoch_};
  view.members.reserve(members_.size());
  for (const auto& [node_id, member] : members_) {
    view.members.push_back(member.info);
  }
  return view;
}

}  // namespace gradmesh::server
