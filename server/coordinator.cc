#include "server/coordinator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/collectives/registry.h"
#include "worker/transport/transport.h"

namespace gradmesh::server {
namespace {

// The link model is fitted from at most this many recent reports.
constexpr size_t kMaxLinkSamples = 4096;

// Epochs stay exact in the metrics' doubles.

// The plan `config` names, with d = 1.
// (`auto` reads as SparDL: its plans are SparDL's or the dense ring's.)
Plan PlanOfConfig(const PlanConfig& config) {
  return Plan{.algorithm = config.algorithm == kAutoAlgorithm
                               ? std::string(kSparDl)
                               : config.algorithm,
              .density = config.density,
              .teams = 1,
              .encoding = config.encoding,
              .values = config.values,
              .quantize_bits = config.quantize_bits,
              .oktopk_tau = config.oktopk_tau,
              .oktopk_tau_prime = config.oktopk_tau_prime,
              .seed = config.seed,
              .exact_below = config.exact_below,
              .warmup_steps = config.warmup_steps,
              .fusion = config.fusion,
              .chunk_bytes = config.chunk_bytes};
}

// The autotune's part of ValidatePlanConfig.
absl::Status ValidateAutotuneConfig(const PlanConfig& config) {
  if (config.autotune_window < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "autotune_window must be at least 1, got ", config.autotune_window));
  }
  if (!(config.sparse_margin >= 1 && std::isfinite(config.sparse_margin))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse_margin must be at least 1, got ", config.sparse_margin));
  }
  if (!(config.teams_margin >= 1 && std::isfinite(config.teams_margin))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "teams_margin must be at least 1, got ", config.teams_margin));
  }
  if (!(config.retune_factor == 0 ||
        (config.retune_factor > 1 && std::isfinite(config.retune_factor)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("retune_factor must be 0 (off) or more than 1, got ",
                     config.retune_factor));
  }
  if (config.retune_steps < 1 || config.retune_steps > 100000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retune_steps must be 1 to 100000, got ", config.retune_steps));
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

}  // namespace

absl::Status ValidatePlanConfig(const PlanConfig& config) {
  std::vector<std::string> names = collectives::AlgorithmNames();
  names.emplace_back(kAutoAlgorithm);
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
  return ValidateAutotuneConfig(config);
}

namespace {

// The time in microseconds, past every incarnation handed out before in this
// process (coordinators made in the same microsecond differ).
uint64_t NextIncarnation() {
  static std::atomic<uint64_t> last{0};
  uint64_t next = absl::ToUnixMicros(absl::Now());
  uint64_t prev = last.load();
  do {
    next = std::max(next, prev + 1);
  } while (!last.compare_exchange_weak(prev, next));
  return next;
}

}  // namespace

Coordinator::Coordinator(PlanConfig config, absl::Duration heartbeat_timeout,
                         absl::Duration quarantine)
    : config_(std::move(config)),
      heartbeat_timeout_(heartbeat_timeout),
      incarnation_(NextIncarnation()),
      config_status_(
          heartbeat_timeout <= absl::ZeroDuration()
              ? absl::InvalidArgumentError("heartbeat_timeout must be positive")
          : quarantine <= absl::ZeroDuration()
              ? absl::InvalidArgumentError("quarantine must be positive")
              : ValidatePlanConfig(config_)),
      links_(std::max(heartbeat_timeout, absl::Milliseconds(1)),
             std::max(quarantine, absl::Milliseconds(1))),
      plan_(BasePlan()),
      link_(config_.link) {}

Coordinator::~Coordinator() = default;

absl::StatusOr<View> Coordinator::Join(
    const MemberInfo& member, absl::Time now, const View* known,
    const std::optional<std::vector<std::string>>& unreachable) {
  if (!config_status_.ok()) return config_status_;
  GM_RETURN_IF_ERROR(CheckJoin(member, known, unreachable));
  absl::MutexLock lock(&mu_);
  now_ = std::max(now_, now);
  // A known epoch past `limit` that would raise this one is refused.
  auto check = [&](uint64_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (known == nullptr || known->epoch <= epoch_ || known->epoch <= limit) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("a known epoch of ", known->epoch, " is past ", limit,
                     ", which leaves no room for the epochs after it"));
  };
  GM_RETURN_IF_ERROR(check(kMaxAdoptedEpoch));
  const bool brings_quarantines =
      known != nullptr && known->incarnation != incarnation_ &&
      known->epoch >= epoch_ &&
      std::pair(known->incarnation, known->epoch) != quarantines_from_;
  if (known != nullptr && epoch_ == 0 && AdoptLocked(*known, member, now)) {
    if (brings_quarantines) AdoptQuarantinesLocked(*known, now);
    GM_RETURN_IF_ERROR(links_.MayJoin(member.node_id, now));
    return ViewLocked();
  }
  GM_RETURN_IF_ERROR(check(kMaxRaisedEpoch));  // not adopted: a raise
  if (brings_quarantines) AdoptQuarantinesLocked(*known, now);
  auto present = members_.find(member.node_id);
  if (known != nullptr && known->epoch == epoch_ && epoch_ > 0 &&
      present != members_.end() &&
      present->second.info.address == member.address &&
      present->second.info.incarnation == member.incarnation) {
    present->second.last_seen = std::max(present->second.last_seen, now);
    return ViewLocked();
  }
  GM_RETURN_IF_ERROR(links_.MayJoin(member.node_id, now));
  GM_RETURN_IF_ERROR(
      CheckReachesMembersLocked(member.node_id, known, unreachable, now));
  if (known != nullptr) epoch_ = std::max(epoch_, known->epoch);
  // A previous incarnation's figures do not describe the new one.
  last_seconds_.erase(member.node_id);
  members_.insert_or_assign(member.node_id,
                            Member{.info = member, .last_seen = now});
  DropKeptOutLocked(now);
  MembershipChangedLocked();
  return ViewLocked();
}

absl::Status Coordinator::CheckReachesMembersLocked(
    absl::string_view node_id, const View* known,
    const std::optional<std::vector<std::string>>& unreachable,
    absl::Time now) const {
  if (!links_.OnProbation(node_id, now)) return absl::OkStatus();
  const bool lists_everyone =
      known != nullptr &&
      std::all_of(members_.begin(), members_.end(), [&](const auto& m) {
        return m.first == node_id ||
               std::any_of(
                   known->members.begin(), known->members.end(),
                   [&](const MemberInfo& k) { return k.node_id == m.first; });
      });
  if (!unreachable.has_value() || !lists_everyone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", node_id,
        "' was removed because members could not reach it: it joins again "
        "once it has called every member of the current view"));
  }
  std::vector<std::string> cut_off;
  for (const std::string& id : *unreachable) {
    if (id != node_id && members_.contains(id)) cut_off.push_back(id);
  }
  if (cut_off.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "'", node_id,
      "' was removed because members could not reach it, and it still "
      "cannot reach ",
      absl::StrJoin(cut_off, ", "), ": it stays out until it can"));
}

absl::Status Coordinator::CheckJoin(
    const MemberInfo& member, const View* known,
    const std::optional<std::vector<std::string>>& unreachable) {
  if (member.node_id.empty() || member.address.empty()) {
    return absl::InvalidArgumentError("node_id and address must be set");
  }
  if (unreachable.has_value() &&
      unreachable->size() > (known == nullptr ? 0 : known->members.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", member.node_id, "' names ", unreachable->size(),
                     " members it cannot reach, more than its view has"));
  }
  if (known != nullptr && known->kept_out.size() > kMaxKeptOut) {
    return absl::InvalidArgumentError(
        absl::StrCat("the known view keeps ", known->kept_out.size(),
                     " nodes out; at most ", kMaxKeptOut));
  }
  return absl::OkStatus();
}

void Coordinator::AdoptQuarantinesLocked(const View& known, absl::Time now) {
  quarantines_from_ = {known.incarnation, known.epoch};
  for (const LinkReports::Quarantine& q : known.kept_out) links_.Adopt(q, now);
  if (!DropKeptOutLocked(now)) return;
  // Past every epoch the members run (the caller checked the raise).
  epoch_ = std::max(epoch_, known.epoch);
  MembershipChangedLocked();
}

bool Coordinator::DropKeptOutLocked(absl::Time now) {
  bool dropped = false;
  for (auto it = members_.begin(); it != members_.end();) {
    if (links_.MayJoin(it->first, now).ok()) {
      ++it;
      continue;
    }
    last_seconds_.erase(it->first);
    it = members_.erase(it);
    dropped = true;
  }
  return dropped;
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

bool Coordinator::Tunes(int world_size) const {
  return world_size >= 2 &&
         (config_.algorithm == kAutoAlgorithm ||
          (config_.algorithm == kSparDl && config_.teams == 0));
}

std::vector<int> Coordinator::TeamCandidates(int world_size) const {
  if (config_.teams == 0) return ValidTeamCounts(world_size);
  return {FixedPlan(world_size).teams};
}

Plan Coordinator::FixedPlan(int world_size) const {
  Plan plan = BasePlan();
  // One member has nothing to choose between: nothing is lost densely.
  if (config_.algorithm == kAutoAlgorithm && world_size < 2) {
    plan.algorithm = std::string(kDense);
    return plan;
  }
  if (plan.algorithm == kSparDl && config_.teams > 0) {
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
  const bool is_auto = config_.algorithm == kAutoAlgorithm;
  // `auto` runs SparDL with some sizes dense, or the dense ring.
  const bool algorithm_fits =
      is_auto ? plan.algorithm == kSparDl ||
                    (plan.algorithm == kDense && plan.dense_sizes.empty())
              : plan.algorithm == base.algorithm && plan.dense_sizes.empty();
  if (!algorithm_fits || plan.density != base.density ||
      plan.encoding != base.encoding || plan.values != base.values ||
      plan.quantize_bits != base.quantize_bits ||
      plan.oktopk_tau != base.oktopk_tau ||
      plan.oktopk_tau_prime != base.oktopk_tau_prime ||
      plan.seed != base.seed || plan.exact_below != base.exact_below ||
      plan.warmup_steps != base.warmup_steps || plan.fusion != base.fusion ||
      plan.chunk_bytes != base.chunk_bytes || plan.autotuning) {
    return false;
  }
  if (Tunes(world_size)) {
    if (plan.algorithm == kDense) return plan.teams == 1;
    const std::vector<int> valid = TeamCandidates(world_size);
    return std::find(valid.begin(), valid.end(), plan.teams) != valid.end();
  }
  const Plan fixed = FixedPlan(world_size);
  return plan.algorithm == fixed.algorithm && plan.teams == fixed.teams;
}

absl::Status Coordinator::Heartbeat(absl::string_view node_id, absl::Time now,
                                    const std::vector<std::string>& unreachable,
                                    uint64_t epoch, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  now_ = std::max(now_, now);
  auto it = members_.find(node_id);
  if (it == members_.end()) {
    return absl::NotFoundError(
        absl::StrCat("'", node_id, "' is not a member; join again"));
  }
  if (epoch > epoch_ ||
      (incarnation != 0 && incarnation != incarnation_ && epoch >= epoch_)) {
    return absl::NotFoundError(
        absl::StrCat("'", node_id, "' runs epoch ", epoch,
                     " of another coordinator; this "
                     "one adopted another view, at epoch ",
                     epoch_, ": join again with it"));
  }
  it->second.last_seen = std::max(it->second.last_seen, now);
  if (unreachable.size() > members_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", node_id, "' names ", unreachable.size(),
        " peers it cannot reach, of ", members_.size(), " members"));
  }
  std::vector<std::string> members;  // what is kept stays bounded
  for (const std::string& peer : unreachable) {
    if (members_.contains(peer)) members.push_back(peer);
  }
  links_.Update(node_id, members, now);
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

std::optional<Coordinator::LinkRemoval> Coordinator::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  now_ = std::max(now_, now);
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
  if (removed) {
    MembershipChangedLocked();
    return std::nullopt;
  }
  absl::flat_hash_set<std::string> ids;
  for (const auto& [id, member] : members_) ids.insert(id);
  std::optional<LinkReports::Verdict> verdict = links_.Choose(ids, now);
  if (!verdict.has_value()) return std::nullopt;
  auto it = members_.find(verdict->node_id);
  LinkRemoval removal{.node_id = verdict->node_id,
                      .reporters = std::move(verdict->reporters),
                      .kept_out = links_.KeepOut(it->first, now)};
  last_seconds_.erase(it->first);
  members_.erase(it);
  MembershipChangedLocked();
  return removal;
}

void Coordinator::Excuse(absl::Duration unobserved, absl::Time now) {
  absl::MutexLock lock(&mu_);
  now_ = std::max(now_, now);
  for (auto& [node_id, member] : members_) {
    member.last_seen = std::min(member.last_seen + unobserved, now);
  }
  links_.Excuse(unobserved, now);
}

absl::Status Coordinator::Report(const IterationReport& report) {
  for (const auto& [name, seconds] :
       {std::pair("seconds", report.seconds),
        std::pair("period_seconds", report.period_seconds)}) {
    if (!std::isfinite(seconds) || seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be finite and non-negative, got ", seconds));
    }
  }
  absl::MutexLock lock(&mu_);
  if (report.epoch != epoch_ || !members_.contains(report.node_id)) {
    return absl::OkStatus();
  }
  last_seconds_[report.node_id] = report.seconds;
  max_step_ = std::max(max_step_, report.operation);
  // n ranks the SparDL candidates: not a size `auto` sums densely.
  if (report.values > 0 &&
      !std::binary_search(plan_.dense_sizes.begin(), plan_.dense_sizes.end(),
                          report.values)) {
    n_ = report.values;
  }
  if (report.rounds > 0) {
    samples_.push_back({.rounds = report.rounds,
                        .bytes = static_cast<double>(report.bytes_received),
                        .seconds = report.seconds});
    if (samples_.size() > kMaxLinkSamples) samples_.pop_front();
  }
  if (!plan_.autotuning) {
    if (watch_ == nullptr) return absl::OkStatus();
    if (std::optional<std::string> why = watch_->Add(
            report.node_id, report.values, report.operation, report.seconds)) {
      retune_reason_ = *std::move(why);
      StartRoundLocked(max_step_ + config_.switch_lead_steps);
    }
    return absl::OkStatus();
  }
  if (round_->Add(report.node_id, report.operation, report.values,
                  report.seconds, report.period_seconds)) {
    // The first trial's reports tell n: rank the rest with the model now.
    if (!round_->ranked_by_model() && n_ > 0) {
      round_->Rank(n_, link_, round_->current_index());
    }
    PublishTrialOrResultLocked(max_step_ + config_.switch_lead_steps);
  }
  return absl::OkStatus();
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
  return round_ != nullptr ? round_->trials() : std::vector<Trial>{};
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
  links_.ForgetReports();  // they were about the old view's links
  round_.reset();
  retune_reason_.clear();
  retune_backoff_ = 1;
  if (Tunes(static_cast<int>(members_.size()))) {
    StartRoundLocked(0);
  } else {
    watch_.reset();
    PublishLocked(FixedPlan(static_cast<int>(members_.size())), 0);
  }
  membership_epoch_ = epoch_;
}

void Coordinator::StartRoundLocked(uint64_t start_step) {
  const int world_size = static_cast<int>(members_.size());
  std::vector<std::string> nodes;
  for (const auto& [node_id, member] : members_) nodes.push_back(node_id);
  watch_.reset();
  round_ = std::make_unique<AutotuneRound>(
      std::move(nodes), TeamCandidates(world_size),
      /*with_dense=*/config_.algorithm == kAutoAlgorithm,
      AutotuneRound::Options{.window = config_.autotune_window,
                             .skip_factor = config_.skip_factor,
                             .sparse_margin = config_.sparse_margin,
                             .teams_margin = config_.teams_margin,
                             .density = config_.density});
  if (!retune_reason_.empty()) {
    // The link changed: rank with what the latest reports say of it.
    link_ = FitLinkModel(
        std::vector<LinkSample>(samples_.begin(), samples_.end()), link_);
  }
  round_->Rank(n_, link_, 0);
  PublishTrialOrResultLocked(start_step);
}

void Coordinator::PublishTrialOrResultLocked(uint64_t start_step) {
  Plan plan = BasePlan();
  if (const Trial* trial = round_->current(); trial != nullptr) {
    plan.algorithm = trial->algorithm;
    plan.teams = trial->teams;
    plan.autotuning = true;
    plan.note = absl::StrCat("autotune trial of ", trial->Name());
    if (!retune_reason_.empty()) {
      absl::StrAppend(&plan.note, "; tuning again: ", retune_reason_);
    }
    PublishLocked(std::move(plan), start_step);
    return;
  }
  Choice choice = round_->Result();
  if (!retune_reason_.empty()) {
    absl::StrAppend(&choice.note, "; tuned again: ", retune_reason_);
  }
  if (config_.retune_factor > 0) {
    // A round started by the watch that chose what the last one had (a
    // choice that fits, timed differently): watch over twice the steps
    // next time, up to 16x, so that rounds do not follow one another.
    const bool same = last_choice_.algorithm == choice.algorithm &&
                      last_choice_.teams == choice.teams &&
                      last_choice_.dense_sizes == choice.dense_sizes;
    retune_backoff_ =
        !retune_reason_.empty() && same ? std::min(2 * retune_backoff_, 16) : 1;
    last_choice_ = choice;
    std::map<uint64_t, double> others;
    std::map<uint64_t, double> chosen =
        ChosenSeconds(round_->trials(), choice, &others);
    watch_ = std::make_unique<RetuneWatch>(
        std::move(chosen), static_cast<int>(members_.size()),
        RetuneWatch::Options{.factor = config_.retune_factor,
                             .steps = config_.retune_steps * retune_backoff_},
        std::move(others));
  }
  plan.algorithm = std::move(choice.algorithm);
  plan.teams = choice.teams;
  plan.dense_sizes = std::move(choice.dense_sizes);
  plan.note = std::move(choice.note);
  link_ = FitLinkModel(
      std::vector<LinkSample>(samples_.begin(), samples_.end()), link_);
  PublishLocked(std::move(plan), start_step);
}

View Coordinator::ViewLocked() const {
  View view{.epoch = epoch_,
            .plan = plan_,
            .start_step = start_step_,
            .membership_epoch = membership_epoch_,
            .kept_out = links_.Quarantines(now_),
            .incarnation = incarnation_};
  view.members.reserve(members_.size());
  for (const auto& [node_id, member] : members_) {
    view.members.push_back(member.info);
  }
  return view;
}

}  // namespace gradmesh::server
