#include "worker/daemon/step_protocol.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/daemon/worker_metrics.h"

namespace gradmesh::daemon {

StepProtocol::StepProtocol(StepPeers peers, Clock* clock,
                           WorkerMetrics* metrics, StepProtocolOptions options)
    : peers_(std::move(peers)),
      clock_(clock),
      metrics_(metrics),
      options_(options) {}

absl::Status StepProtocol::Agree(const Group& g, absl::string_view bucket,
                                 uint64_t operation, const StepRecord& mine,
                                 absl::Time deadline, double* waited) {
  std::string bytes(sizeof(mine), '\0');
  std::memcpy(bytes.data(), &mine, sizeof(mine));
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      peers_.gather(g, operation, std::move(bytes), deadline, waited));
  if (static_cast<int>(all.size()) != g.size()) {
    return absl::InternalError(absl::StrCat("the agreement gathered ",
                                            all.size(), " records of ",
                                            g.size(), " members"));
  }
  std::vector<std::string> nonfinite;
  std::vector<StepRecord> records(g.size());
  for (int r = 0; r < g.size(); ++r) {
    if (all[r].size() != sizeof(StepRecord)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " sent an agreement record of ",
                       all[r].size(), " bytes"));
    }
    StepRecord& theirs = records[r];
    std::memcpy(&theirs, all[r].data(), sizeof(theirs));
    if (theirs.fingerprint != mine.fingerprint || theirs.root != mine.root) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket '", bucket, "' differs between workers: rank ", g.rank,
          " has ", mine.values, " values (root ", mine.root, "), rank ", r,
          " has ", theirs.values, " (root ", theirs.root,
          "): tensor names, sizes or the broadcast root differ"));
    }
    if (theirs.nonfinite > 0) {
      nonfinite.push_back(absl::StrCat("rank ", r, ": ", theirs.nonfinite));
    }
  }
  GM_RETURN_IF_ERROR(CheckNoneBehind(bucket, records, mine.root));
  if (mine.root < 0) GM_RETURN_IF_ERROR(CheckSameLastStep(bucket, records));
  if (!nonfinite.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "non-finite values (NaN or Inf) in the gradient of bucket '", bucket,
        "' (", absl::StrJoin(nonfinite, ", "),
        "); the step is skipped on every worker and the finite values stay "
        "in the residuals"));
  }
  return absl::OkStatus();
}

absl::Status StepProtocol::CheckNoneBehind(
    absl::string_view bucket, const std::vector<StepRecord>& records,
    int64_t root) {
  const int size = static_cast<int>(records.size());
  int behind = -1;
  int whole = -1;  // a rank to broadcast from
  for (int r = 0; r < size; ++r) {
    (records[r].missed > 0 ? behind : whole) = r;
  }
  // A broadcast is the cure, unless its root is behind while another
  // replica is whole (with none whole, any root makes them equal again).
  if (root >= 0) {
    if (root >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " is not a rank of ", size));
    }
    behind = whole >= 0 ? static_cast<int>(root) : -1;
  }
  if (behind < 0 || records[behind].missed == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "rank ", behind, "'s replica is behind: it missed step ",
      records[behind].missed - 1,
      " of one of the job's buckets (applied on the others after its client "
      "had given up, or its outcome unknown there); every member refuses "
      "the job's steps (here of bucket '",
      bucket,
      "') until a Broadcast of the parameters from a rank whose "
      "replica is whole",
      whole >= 0 ? absl::StrCat(" (rank ", whole, ")") : "",
      "; the gradient is kept in the residual"));
}

absl::Status StepProtocol::CheckSameLastStep(
    absl::string_view bucket, const std::vector<StepRecord>& records) {
  // (epoch, 1 + step) -> how many members applied that one last.
  std::map<std::pair<uint64_t, uint64_t>, int> last;
  for (const StepRecord& r : records) {
    if (r.applied_step > 0) ++last[{r.applied_epoch, r.applied_step}];
  }
  if (last.size() <= 1) return absl::OkStatus();
  // Whole: the most common (ties: the newest); behind: any other.
  auto most = last.begin();
  for (auto it = last.begin(); it != last.end(); ++it) {
    if (it->second >= most->second) most = it;
  }
  int whole = -1;
  int behind = -1;
  for (int r = 0; r < static_cast<int>(records.size()); ++r) {
    const auto key =
        std::pair(records[r].applied_epoch, records[r].applied_step);
    if (records[r].applied_step == 0) continue;
    int& rank = key == most->first ? whole : behind;
    if (rank < 0) rank = r;
  }
  const StepRecord& b = records[behind];
  return absl::DataLossError(absl::StrCat(
      "rank ", behind,
      "'s replica differs from the others: its last step of "
      "bucket '",
      bucket, "' was step ", b.applied_step - 1, " in epoch ", b.applied_epoch,
      ", rank ", whole, "'s step ", most->first.second - 1, " in epoch ",
      most->first.first,
      " (it was out of the group while the others went on, or applied a step "
      "they gave up); every member refuses the bucket's steps until a "
      "Broadcast of the job's parameters from a rank whose replica is whole "
      "(rank ",
      whole, "); the gradient is kept in the residual"));
}

absl::Status StepProtocol::Vote(const Group& g, const OutcomeKey& key,
                                uint64_t operation, bool yes,
                                uint64_t result_digest, absl::Time deadline,
                                bool* refused_by_vote) {
  yes = RecordVote(key, yes);
  // A yes carries a hash of the result: members that would apply different
  // results (a corrupted message, a bug) find out here, before anyone does.
  std::string vote(1, yes ? 'y' : 'n');
  if (yes) {
    vote.append(reinterpret_cast<const char*>(&result_digest),
                sizeof(result_digest));
  }
  absl::StatusOr<std::vector<std::string>> votes =
      peers_.gather(g, operation, vote, deadline, /*waited=*/nullptr);
  if (!votes.ok()) {
    if (!yes) return votes.status();
    SetOutcome(key, Outcome::kInDoubt);
    return Resolve(g, key, votes.status(), deadline);
  }
  if (absl::Status tally = Tally(g, *votes, vote); !tally.ok()) {
    SetOutcome(key, Outcome::kAborted);
    *refused_by_vote = true;
    return tally;
  }
  SetOutcome(key, Outcome::kCommitted);
  return absl::OkStatus();
}

bool StepProtocol::RecordVote(const OutcomeKey& key, bool yes) {
  absl::MutexLock lock(&mu_);
  Entry& entry = EntryLocked(key);
  // A promise to a peer in doubt (Decide) turns the vote into a no.
  if (entry.outcome == Outcome::kAborted) yes = false;
  if (!yes) {
    entry.outcome = Outcome::kAborted;
    entry.promised = true;
  }
  return yes;
}

absl::Status StepProtocol::Tally(const Group& g,
                                 const std::vector<std::string>& votes,
                                 const std::string& mine) {
  // A no first: it explains a differing vote too.
  for (int r = 0; r < g.size(); ++r) {
    if (votes[r].empty() || votes[r][0] != 'y') {
      return absl::AbortedError(absl::StrCat(
          "rank ", r,
          " voted no (its client gave up, or it had promised a peer in doubt "
          "to refuse the step); no member applied it"));
    }
  }
  for (int r = 0; r < g.size(); ++r) {
    if (votes[r] != mine) {
      if (metrics_ != nullptr) metrics_->mismatches().Increment();
      return absl::AbortedError(absl::StrCat(
          "rank ", r, "'s result differs from rank ", g.rank,
          "'s (a corrupted message or a bug); no member applied the step"));
    }
  }
  return absl::OkStatus();
}

Outcome StepProtocol::Decide(const OutcomeKey& key, bool holds_registration,
                             const std::vector<std::string>& gone) {
  absl::MutexLock lock(&mu_);
  auto it = outcomes_.find(key);
  if (it != outcomes_.end()) {
    Entry& entry = it->second;
    // The asker may give the step up on this answer: from now on, what the
    // members it counts as gone did is no concern of this worker either.
    if (entry.outcome == Outcome::kInDoubt) {
      // Past the bound it records nothing and answers "undecided": the
      // asker keeps asking, which is always safe.
      if (entry.ignored.size() + gone.size() > kMaxGone) {
        return Outcome::kVoting;
      }
      entry.ignored.insert(gone.begin(), gone.end());
    }
    // An abort settled on in doubt is not a decision others may follow.
    return entry.gave_up ? Outcome::kInDoubt : entry.outcome;
  }
  // A registration this process does not hold (it restarted, or never had
  // it): it knows nothing, and promises nothing.
  if (!holds_registration) return Outcome::kInDoubt;
  Entry& entry = EntryLocked(key);
  entry.outcome = Outcome::kAborted;
  entry.promised = true;
  ForgetOldLocked();
  return Outcome::kAborted;
}

absl::Status StepProtocol::Resolve(const Group& g, const OutcomeKey& key,
                                   const absl::Status& why,
                                   absl::Time deadline) {
  // This worker voted yes and did not hear every vote: a peer that did may
  // have applied the step. Ask every peer, naming those a newer view left
  // out; any that applied it decides "apply" (unless a peer in doubt that
  // gave the step up asked this worker to count it gone), else any that
  // refused it (a no vote or a promise) "abort"; with some still undecided
  // (voting, or unreachable while not named gone), ask again. Otherwise no
  // live member applied it, and none will (each answered "in doubt" and
  // stopped listening to the gone): abort, as every other worker in doubt
  // does. Past the deadline and a grace of view_wait, the truth is that this
  // worker does not know.
  if (peers_.ask_outcome == nullptr) {
    SetOutcome(key, Outcome::kAborted, /*gave_up=*/true);
    return why;
  }
  const absl::Time until =
      deadline + std::max(absl::Seconds(1), options_.view_wait);
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    const std::vector<std::string> gone = Gone(g, key);
    std::vector<std::optional<Outcome>> answers = AskPeers(
        g, key, gone, std::min(until, clock_->Now() + absl::Seconds(1)));
    switch (LearnApplied(g, key, gone, &answers)) {
      case Outcome::kCommitted:
        return absl::OkStatus();
      case Outcome::kAborted:
        return why;
      default:
        break;
    }
    auto any = [&](Outcome o) {
      return std::find(answers.begin(), answers.end(), o) != answers.end();
    };
    if (any(Outcome::kAborted)) {
      SetOutcome(key, Outcome::kAborted);
      return why;
    }
    if (!any(Outcome::kVoting)) {
      SetOutcome(key, Outcome::kAborted, /*gave_up=*/true);
      return why;
    }
    if (clock_->Now() >= until) {
      SetOutcome(key, Outcome::kAborted, /*gave_up=*/true);
      if (metrics_ != nullptr) metrics_->unresolved().Increment();
      return absl::DataLossError(absl::StrCat(
          "this worker could not learn whether its peers applied the step (",
          why.message(),
          "); replicas may differ: go on, and when the bucket's next step "
          "fails with DataLoss on every member, Broadcast from the rank it "
          "names"));
    }
    Pause(pause);
    pause = std::min(2 * pause, absl::Milliseconds(320));
  }
}

std::vector<std::string> StepProtocol::Gone(const Group& g,
                                            const OutcomeKey& key) {
  std::vector<std::string> gone;
  {
    absl::MutexLock lock(&mu_);
    const Entry& entry = EntryLocked(key);
    gone.assign(entry.ignored.begin(), entry.ignored.end());
  }
  std::shared_ptr<Group> now = peers_.current ? peers_.current() : nullptr;
  if (now != nullptr && now->view.epoch > g.view.epoch) {
    for (const std::string& id : g.view.member_ids) {
      if (std::find(now->view.member_ids.begin(), now->view.member_ids.end(),
                    id) == now->view.member_ids.end()) {
        gone.push_back(id);
      }
    }
  }
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  return gone;
}

std::vector<std::optional<Outcome>> StepProtocol::AskPeers(
    const Group& g, const OutcomeKey& key, const std::vector<std::string>& gone,
    absl::Time deadline) {
  std::vector<std::optional<Outcome>> answers(g.size());
  std::vector<std::thread> asks;
  for (int p = 0; p < g.size(); ++p) {
    if (p == g.rank) continue;
    asks.emplace_back(
        [&, p] { answers[p] = AskPeer(g, p, key, gone, deadline); });
  }
  for (std::thread& t : asks) t.join();
  return answers;
}

std::optional<Outcome> StepProtocol::AskPeer(
    const Group& g, int peer, const OutcomeKey& key,
    const std::vector<std::string>& gone, absl::Time deadline) {
  absl::StatusOr<Outcome> theirs =
      peers_.ask_outcome(g.view.addresses[peer], key, gone, deadline);
  if (theirs.ok()) return *theirs;
  // Unreachable: gone for good once a newer view leaves it out (what it did
  // is no one's concern then), undecided while it may still answer. Only a
  // member named gone to the others this round counts as gone: they stopped
  // listening to it.
  const bool named = std::find(gone.begin(), gone.end(),
                               g.view.member_ids[peer]) != gone.end();
  if (named) return std::nullopt;
  return Outcome::kVoting;
}

Outcome StepProtocol::LearnApplied(
    const Group& g, const OutcomeKey& key, const std::vector<std::string>& gone,
    std::vector<std::optional<Outcome>>* answers) {
  absl::MutexLock lock(&mu_);
  Entry& entry = EntryLocked(key);
  bool heard = false;
  for (int p = 0; p < g.size(); ++p) {
    if ((*answers)[p] != Outcome::kCommitted) continue;
    const std::string& id = g.view.member_ids[p];
    if (!entry.ignored.contains(id)) {
      heard = true;
    } else if (std::binary_search(gone.begin(), gone.end(), id)) {
      (*answers)[p].reset();  // gone, and this round's questions said so
    } else {
      // Ignored since this round's questions went out: gone only once a
      // round names it to the others.
      (*answers)[p] = Outcome::kVoting;
    }
  }
  if (!heard) return Outcome::kInDoubt;
  if (entry.promised) return entry.outcome;
  entry.outcome = Outcome::kCommitted;
  entry.gave_up = false;
  entry.ignored.clear();
  return entry.outcome;
}

Outcome StepProtocol::SetOutcome(const OutcomeKey& key, Outcome outcome,
                                 bool gave_up) {
  absl::MutexLock lock(&mu_);
  Entry& entry = EntryLocked(key);
  // A promise to refuse the step is kept, whatever comes later.
  if (!(entry.promised && outcome == Outcome::kCommitted)) {
    entry.outcome = outcome;
    entry.gave_up = gave_up;
  }
  if (entry.outcome != Outcome::kInDoubt) entry.ignored.clear();
  const Outcome recorded = entry.outcome;
  ForgetOldLocked();
  return recorded;
}

StepProtocol::Entry& StepProtocol::EntryLocked(const OutcomeKey& key) {
  auto [it, inserted] = outcomes_.try_emplace(key, Entry{.at = clock_->Now()});
  if (inserted) order_.push_back(key);
  return it->second;
}

void StepProtocol::ForgetOldLocked() {
  // Past kOutcomesKept, decided entries older than the retention go, oldest
  // first; undecided ones stay (at most one per bucket in flight).
  const absl::Time old = clock_->Now() - options_.outcome_retention;
  for (size_t looked = 0;
       outcomes_.size() > kOutcomesKept && looked < order_.size(); ++looked) {
    const OutcomeKey oldest = order_.front();
    auto it = outcomes_.find(oldest);
    if (it != outcomes_.end() && it->second.at > old) break;
    order_.pop_front();
    if (it == outcomes_.end()) continue;
    if (it->second.outcome == Outcome::kVoting ||
        it->second.outcome == Outcome::kInDoubt) {
      order_.push_back(oldest);
    } else {
      outcomes_.erase(it);
    }
  }
}

void StepProtocol::Pause(absl::Duration pause) const {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  static constexpr bool kNever = false;
  clock_->AwaitWithDeadline(&mu, absl::Condition(&kNever),
                            clock_->Now() + pause);
}

}  // namespace gradmesh::daemon
