// StepProtocol: how the members of a step agree to run it and decide
// whether it is applied.
//
// Before a step runs, the members agree (Agree): an all-gather of a small
// record (what they reduce, and how many non-finite values each one's
// gradient holds), so that tensor sets that differ between workers, or a NaN
// or Inf on any worker, fail the step alike on every member instead of a hang
// or a poisoned sum.
//
// Once a worker knows a step's result, the members vote: an all-gather of a
// yes with a hash of the result, or a no when its client has given up. Only
// with every vote yes, for the same result, does a worker apply the step
// (members whose results differ all refuse it, Aborted). A worker that voted
// yes but did not hear every vote is in doubt: it asks its peers for their
// outcome (StepPeers::ask_outcome, answered by Decide) and applies the step
// iff one of them did; a peer asked about a step it has not voted on
// promises never to apply it. With every peer in doubt too, or gone (left
// out of a newer view), it gives the step up. That is safe because each
// question names the members the asker counts as gone, and a peer that
// answers "in doubt" stops learning "applied" from them and names them in
// its own questions: no peer whose answer let a worker give up can apply the
// step later, nor any peer it asks. A worker that cannot
// learn the outcome by its deadline plus view_wait (a peer unreachable but
// still a member) answers DataLoss: its replica may differ from the others'.
//
// The protocol holds the outcome table and nothing else: the all-gather, the
// question to a peer and the newest view are injected (StepPeers), and so is
// time (Clock), so it runs over any transport and is tested alone.
//
// Thread-safe: votes on distinct keys and Decide run concurrently.
#ifndef GRADMESH_WORKER_DAEMON_STEP_PROTOCOL_H_
#define GRADMESH_WORKER_DAEMON_STEP_PROTOCOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/daemon/view_tracker.h"

namespace gradmesh::daemon {

class WorkerMetrics;

// A step's decision, as one worker holds it: the registration (its agreed
// id), the step and the epoch of the attempt.
struct OutcomeKey {
  uint64_t bucket_id = 0;
  uint64_t step = 0;
  uint64_t epoch = 0;
  friend bool operator==(const OutcomeKey&, const OutcomeKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const OutcomeKey& key) {
    return H::combine(std::move(h), key.bucket_id, key.step, key.epoch);
  }
};
enum class Outcome {
  kVoting,     // voted yes, votes still coming
  kCommitted,  // applied
  kAborted,    // not applied, and never will be
  kInDoubt,    // voted yes, missed a vote, asking the others
};

// What a member brings to the agreement before a step.
struct StepRecord {
  uint64_t fingerprint = 0;  // the bucket's tensor names and sizes
  uint64_t values = 0;       // its length
  uint64_t nonfinite = 0;    // NaN and Inf in this member's gradient
  int64_t root = -1;         // a broadcast's root; -1 for an all-reduce
  // 1 + a step this member's replica of the job missed; 0: none.
  uint64_t missed = 0;
  // The last step of the bucket this member applied: 1 + its number (0:
  // none since the registration or the job's last Broadcast), and the epoch
  // of its group. Equal on every member that has one, unless a replica
  // differs (all-reduce only).
  uint64_t applied_step = 0;
  uint64_t applied_epoch = 0;
};

struct StepPeers {
  // Every member's small record of `group` by rank, under operation id
  // `operation`, by `deadline`; adds the time blocked on peers to `*waited`
  // (null: not counted).
  using Gather = std::function<absl::StatusOr<std::vector<std::string>>(
      const Group& group, uint64_t operation, std::string mine,
      absl::Time deadline, double* waited)>;
  Gather gather;
  // The outcome of `key` at the member reachable at `address` (its Decide),
  // telling it the member ids this worker counts as `gone`. Empty: a worker
  // in doubt aborts.
  using Ask = std::function<absl::StatusOr<Outcome>(
      const std::string& address, const OutcomeKey& key,
      const std::vector<std::string>& gone, absl::Time deadline)>;
  Ask ask_outcome;
  // The newest view's group, or null: a peer that a newer view leaves out
  // is gone, not undecided.
  std::function<std::shared_ptr<Group>()> current;
};

struct StepProtocolOptions {
  // How long past its deadline a worker in doubt keeps asking (at least 1 s).
  absl::Duration view_wait = absl::Seconds(5);
  // How long decided outcomes are kept for peers in doubt: longer than any
  // operation timeout plus view_wait.
  absl::Duration outcome_retention = absl::Minutes(5);
};

class StepProtocol {
 public:
  // `clock` outlives the protocol; `metrics` may be null.
  StepProtocol(StepPeers peers, Clock* clock, WorkerMetrics* metrics,
               StepProtocolOptions options);
  StepProtocol(const StepProtocol&) = delete;
  StepProtocol& operator=(const StepProtocol&) = delete;

  // The members' agreement before a step of `bucket` (named in errors), under
  // operation id `operation`. OK when every member's fingerprint and root
  // equal this one's, no member's gradient holds non-finite values, and no
  // member's replica missed a step (for a broadcast: not the root's), and
  // for an all-reduce the members' last applied steps agree
  // (StepRecord::applied_step);
  // otherwise InvalidArgument naming a rank, or DataLoss naming the replica
  // behind and a rank to broadcast from, on every member alike (all see the
  // same records). The gather's error when it fails. `waited` (may be null)
  // accumulates the time blocked on peers.
  absl::Status Agree(const Group& g, absl::string_view bucket,
                     uint64_t operation, const StepRecord& mine,
                     absl::Time deadline, double* waited = nullptr);

  // The members' vote on step `key` of group `g`, under operation id
  // `operation`. This worker votes yes with `result_digest` when `yes` and
  // it has not promised a peer to refuse the step, else no. OK: apply the
  // step. Aborted with *refused_by_vote: a member voted no, or the results
  // differ; no member applies it. Another error: the vote failed and nobody
  // applied the step as far as this worker could learn (DataLoss when it
  // could not learn it). Blocks until deadline + max(1 s, view_wait) at
  // most.
  absl::Status Vote(const Group& g, const OutcomeKey& key, uint64_t operation,
                    bool yes, uint64_t result_digest, absl::Time deadline,
                    bool* refused_by_vote);

  // This worker's outcome of `key`, for a peer in doubt that counts the
  // members `gone` as gone. A step of a registration it holds
  // (`holds_registration`) and has not voted on is refused from now on: it
  // will vote no (kAborted). A step it is in doubt about reads kInDoubt, and
  // from now on it does not learn "applied" from the members `gone` (the
  // asker may give the step up on that answer), and names them gone in its
  // own questions; past kMaxGone such members in all it reads kVoting and
  // records nothing. An abort it settled on in doubt itself, or a
  // registration it does not hold, reads kInDoubt too.
  Outcome Decide(const OutcomeKey& key, bool holds_registration,
                 const std::vector<std::string>& gone = {});

  // The most member ids a question may name as gone, and a step in doubt may
  // count as gone (the members of a group are far fewer).
  static constexpr size_t kMaxGone = 4096;

  // Decided outcomes are forgotten only past this many and once older than
  // the retention; undecided ones never.
  static constexpr size_t kOutcomesKept = 4096;

 private:
  struct Entry {
    Outcome outcome = Outcome::kVoting;
    bool promised = false;  // kAborted by a no vote or a promise: final
    bool gave_up = false;   // kAborted settled on in doubt: not a decision
    absl::Time at;          // recorded
    // In doubt: members whose "applied" it no longer follows (Decide).
    absl::flat_hash_set<std::string> ignored;
  };

  // Agree's check that no replica is behind (for a broadcast of `root`:
  // that the root's is not, unless no replica is whole).
  static absl::Status CheckNoneBehind(absl::string_view bucket,
                                      const std::vector<StepRecord>& records,
                                      int64_t root);
  // DataLoss when the members' last applied steps of the bucket (those
  // that have one) differ: a member that was out of the group while the
  // others applied steps, or that applied a step they gave up, and came
  // back as the same process.
  static absl::Status CheckSameLastStep(absl::string_view bucket,
                                        const std::vector<StepRecord>& records);
  // Records this worker's vote; returns whether it is yes.
  bool RecordVote(const OutcomeKey& key, bool yes);
  // Aborted naming the member that refused, or whose result differs; OK if
  // every vote equals `mine`.
  absl::Status Tally(const Group& g, const std::vector<std::string>& votes,
                     const std::string& mine);
  // In doubt after `why`: OK if a peer applied the step, `why` if none did,
  // DataLoss if that can't be learned in time.
  absl::Status Resolve(const Group& g, const OutcomeKey& key,
                       const absl::Status& why, absl::Time deadline);
  // The member ids, sorted, that this worker counts as gone in a round about
  // `key`: those of `g` that the newest view leaves out, and those it was
  // asked to count as gone (Decide).
  std::vector<std::string> Gone(const Group& g, const OutcomeKey& key);
  // Every peer's outcome of `key`, asked at once, naming `gone`.
  std::vector<std::optional<Outcome>> AskPeers(
      const Group& g, const OutcomeKey& key,
      const std::vector<std::string>& gone, absl::Time deadline);
  // Peer `peer`'s outcome of `key`; an unreachable peer is nullopt (gone)
  // when named in `gone`, else kVoting (undecided: at worst it is named
  // next round).
  std::optional<Outcome> AskPeer(const Group& g, int peer,
                                 const OutcomeKey& key,
                                 const std::vector<std::string>& gone,
                                 absl::Time deadline);
  // Follows the peers of `g` whose `answers` say they applied `key`: records
  // kCommitted and returns it, or kAborted where a promise to refuse the step
  // stands. An "applied" from a member this worker was asked to count as
  // gone is cleared (nullopt) when this round named it (`gone`, sorted), and
  // becomes kVoting (ask again) when not; with no other, returns kInDoubt.
  Outcome LearnApplied(const Group& g, const OutcomeKey& key,
                       const std::vector<std::string>& gone,
                       std::vector<std::optional<Outcome>>* answers);
  // Records `outcome` (`gave_up`: an abort settled on in doubt) unless a
  // promise to refuse the step stands; returns what is recorded.
  Outcome SetOutcome(const OutcomeKey& key, Outcome outcome,
                     bool gave_up = false);
  // The entry of `key`, made (kVoting, now) if absent.
  Entry& EntryLocked(const OutcomeKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets decided outcomes past kOutcomesKept and the retention.
  void ForgetOldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits `pause` on the clock.
  void Pause(absl::Duration pause) const;

  const StepPeers peers_;
  Clock* const clock_;
  WorkerMetrics* const metrics_;
  const StepProtocolOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<OutcomeKey, Entry> outcomes_ ABSL_GUARDED_BY(mu_);
  std::deque<OutcomeKey> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_STEP_PROTOCOL_H_
