#include "worker/daemon/view_tracker.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradmesh::daemon {
namespace {

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) const override {
    return mu->AwaitWithDeadline(condition, deadline);
  }
};

// The same processes: node ids, incarnations (empty counts as all 0) and,
// where both views know it, the membership epoch. A node restarted within
// the heartbeat timeout keeps its id but not its incarnation.
bool SameMembers(const ViewInfo& a, const ViewInfo& b) {
  if (a.member_ids != b.member_ids) return false;
  if (a.membership_epoch != 0 && b.membership_epoch != 0 &&
      a.membership_epoch != b.membership_epoch) {
    return false;
  }
  auto incarnation = [](const ViewInfo& v, size_t i) -> uint64_t {
    return i < v.incarnations.size() ? v.incarnations[i] : 0;
  };
  for (size_t i = 0; i < a.member_ids.size(); ++i) {
    if (incarnation(a, i) != incarnation(b, i)) return false;
  }
  return true;
}

}  // namespace

Clock* RealClock() {
  static SystemClock* clock = new SystemClock();
  return clock;
}

ViewTracker::ViewTracker(GroupFactory make_group, Clock* clock)
    : make_group_(std::move(make_group)), clock_(clock) {}

std::optional<ViewTracker::Change> ViewTracker::Install(const ViewInfo& view) {
  absl::MutexLock installing(&install_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || view.epoch <= latest_epoch_) return std::nullopt;
  }
  // Built outside the lock: it may dial peers.
  std::shared_ptr<Group> group = make_group_(view);
  absl::MutexLock lock(&mu_);
  if (stopped_ || view.epoch <= latest_epoch_) return std::nullopt;
  latest_epoch_ = view.epoch;
  Change change{.group = group};
  const bool same_members =
      current_ != nullptr && SameMembers(current_->view, view);
  change.late =
      same_members && last_step_.has_value() && view.start_step <= *last_step_;
  if (same_members && !change.late) {
    RetireLocked(&pending_);
    pending_ = group;
    change.description = absl::StrCat("plan of epoch ", view.epoch,
                                      " from step ", view.start_step);
    return change;
  }
  if (!same_members) {
    for (const auto& g : {current_, previous_, pending_}) {
      if (g != nullptr) change.replaced.push_back(g);
    }
  }
  RetireLocked(&current_);
  RetireLocked(&previous_);
  RetireLocked(&pending_);
  current_ = group;
  change.description =
      absl::StrCat(change.late ? "late plan" : "membership", " of epoch ",
                   view.epoch, ", applied at once");
  return change;
}

absl::Status ViewTracker::Usable(const Group& group) const {
  if (group.rank < 0) {
    return absl::UnavailableError(
        absl::StrCat("not a member of epoch ", group.view.epoch));
  }
  if (!group.error.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan of epoch ", group.view.epoch,
                     " can't run: ", group.error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Group>> ViewTracker::Acquire(
    std::optional<uint64_t> step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || current_ != nullptr;
  };
  if (!clock_->AwaitWithDeadline(&mu_, absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError("no view from the coordinator yet");
  }
  if (stopped_) return absl::UnavailableError("the worker is shutting down");
  if (step.has_value()) {
    if (pending_ != nullptr && *step >= pending_->view.start_step) {
      RetireLocked(&previous_);
      previous_ = std::move(current_);
      current_ = std::move(pending_);
    }
    if (!last_step_.has_value() || *step > *last_step_) last_step_ = *step;
  }
  std::shared_ptr<Group> group = current_;
  if (step.has_value() && previous_ != nullptr &&
      *step < current_->view.start_step) {
    group = previous_;
  }
  if (absl::Status usable = Usable(*group); !usable.ok()) return usable;
  return group;
}

bool ViewTracker::AwaitNewer(uint64_t epoch, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || latest_epoch_ > epoch;
  };
  clock_->AwaitWithDeadline(&mu_, absl::Condition(&newer), deadline);
  return !stopped_ && latest_epoch_ > epoch;
}

std::shared_ptr<Group> ViewTracker::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::vector<std::shared_ptr<Group>> ViewTracker::groups() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Group>> all;
  for (const auto* g : {&current_, &pending_, &previous_}) {
    if (*g != nullptr) all.push_back(*g);
  }
  return all;
}

uint64_t ViewTracker::latest_epoch() const {
  absl::MutexLock lock(&mu_);
  return latest_epoch_;
}

void ViewTracker::RetireLocked(std::shared_ptr<Group>* group) {
  if (*group != nullptr) retired_.push_back(std::move(*group));
}

void ViewTracker::ReleaseRetired() {
  std::vector<std::shared_ptr<Group>> released;
  {
    absl::MutexLock lock(&mu_);
    // A retired group is out of Acquire's reach: once only retired_ holds
    // it, nothing can take it again.
    std::erase_if(retired_, [&](std::shared_ptr<Group>& group) {
      if (group.use_count() > 1) return false;
      released.push_back(std::move(group));
      return true;
    });
  }
  released.clear();  // here, outside the lock
}

std::vector<std::shared_ptr<Group>> ViewTracker::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  std::vector<std::shared_ptr<Group>> groups = std::move(retired_);
  retired_.clear();
  for (auto* g : {&current_, &previous_, &pending_}) {
    if (*g != nullptr) groups.push_back(std::move(*g));
  }
  return groups;
}

}  // namespace gradmesh::daemon
