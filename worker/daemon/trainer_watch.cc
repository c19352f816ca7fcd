#include "worker/daemon/trainer_watch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradmesh::daemon {

TrainerWatch::TrainerWatch(absl::Duration join_timeout, Hooks hooks)
    : join_timeout_(join_timeout), hooks_(std::move(hooks)) {
  if (join_timeout_ > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

TrainerWatch::~TrainerWatch() { Stop(); }

void TrainerWatch::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.Notify();
  if (thread_.joinable()) thread_.join();
}

void TrainerWatch::Loop() {
  const absl::Duration period =
      std::clamp(join_timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  while (true) {
    {
      // Asked and acted on under the transition lock: not while a
      // returning trainer rejoins, and not again once out.
      absl::MutexLock transition(&transition_mu_);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      if (!out_flag_.load()) StepOutIfAbsent();
    }
    wake_.WaitFor(period);
  }
}

void TrainerWatch::StepOutIfAbsent() {
  const std::optional<std::string> why = hooks_.absent();
  if (!why.has_value()) return;
  {
    absl::MutexLock lock(&mu_);
    out_ = *why;
  }
  out_flag_.store(true);
  hooks_.log(absl::StrCat("stepping out of the group: ", *why));
  hooks_.step_out();
}

void TrainerWatch::NewTrainer(const std::string& why) {
  absl::MutexLock transition(&transition_mu_);
  {
    absl::MutexLock lock(&mu_);
    out_.reset();
  }
  out_flag_.store(false);
  hooks_.log(absl::StrCat(why, ": rejoining the group as a new member"));
  hooks_.rejoin();
}

absl::Status TrainerWatch::BeforeCall(bool step) {
  if (!out_flag_.load()) return absl::OkStatus();  // the usual case
  absl::MutexLock transition(&transition_mu_);
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    if (!out_.has_value()) return absl::OkStatus();
    why = *std::exchange(out_, std::nullopt);
  }
  out_flag_.store(false);
  hooks_.log("the trainer is back: rejoining the group as a new member");
  hooks_.rejoin();
  if (!step) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this worker stepped out of the group because ", why,
      "; the others went on without it. It has rejoined as a new member: "
      "register every bucket again on every process and broadcast the "
      "parameters from a survivor (gradmesh.torch.elastic does both)"));
}

}  // namespace gradmesh::daemon
