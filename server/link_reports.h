// LinkReports: which member the coordinator removes when members report
// peers they cannot reach, and who is kept out afterwards.
//
// A link that drops every packet (a black-holed route, a switch port gone
// bad) while both ends heartbeat leaves membership unchanged, so every step
// that needs the link fails. Each worker names, with its heartbeats, the
// members of its view to which it has had frames unacknowledged, or which
// have refused its connections, for its link timeout
// (GrpcTransport::StalledPeers). The coordinator decides once
// every report has stood for `settle` (a heartbeat timeout: every member
// that sees the fault has had a heartbeat to say so), or the oldest twice
// that. The member named by the most reports is removed. A reporter that
// names more than half of the other members (itself the likely fault: cut
// off, or too starved to read) is not counted while there are more than two
// members. Ties go first to a member that itself reports others (on a ring,
// a node cut off is named by its predecessor and names its successor), then
// to the last in node-id order.
//
// The removed node may not join again for the quarantine, doubled at each
// removal (to 16 times; the count starts over once 16 quarantines have
// passed since the last one ended), so that a link still bad does not cut
// the others' steps every few seconds. A new process of the node is kept
// out too: the link is the node's. The views the coordinator publishes list
// the nodes kept out or on probation (Quarantines), so that a restarted
// coordinator that adopts one keeps them out, or on probation, too (Adopt).
//
// Not thread-safe: the Coordinator holds it under its mutex. Time is passed
// in (steady time in the service).
#ifndef GRADMESH_SERVER_LINK_REPORTS_H_
#define GRADMESH_SERVER_LINK_REPORTS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradmesh::server {

class LinkReports {
 public:
  // `settle` and `quarantine` must be positive.
  LinkReports(absl::Duration settle, absl::Duration quarantine);

  // The member `reporter`'s list at `now` of the peers it cannot reach: a
  // peer listed before keeps the time it was first listed, one no longer
  // listed is forgotten.
  void Update(absl::string_view reporter,
              const std::vector<std::string>& unreachable, absl::Time now);

  // Forgets every report (the members changed: the reports were about
  // another view's links).
  void ForgetReports();

  // The coordinator could not watch for `unobserved` before `now`: moves
  // every report's time forward by it, to `now` at most.
  void Excuse(absl::Duration unobserved, absl::Time now);

  struct Verdict {
    std::string node_id;
    std::vector<std::string> reporters;  // sorted
  };
  // Among `members`, the one to remove at `now`, or nullopt: see above.
  // Reports by or about non-members do not count.
  std::optional<Verdict> Choose(const absl::flat_hash_set<std::string>& members,
                                absl::Time now) const;

  // Keeps `node_id` out from `now`; returns for how long.
  absl::Duration KeepOut(const std::string& node_id, absl::Time now);

  // OK, or Unavailable (the same message throughout) while `node_id` is
  // kept out.
  absl::Status MayJoin(absl::string_view node_id, absl::Time now) const;

  // Whether `node_id` was removed and its removals in a row still count at
  // `now` (kept out, or back for less than 16 quarantines): it joins only
  // while it can reach every member.
  bool OnProbation(absl::string_view node_id, absl::Time now) const;

  // A node kept out: the length of its quarantine (zero: back already, on
  // probation), and its removals in a row.
  struct Quarantine {
    std::string node_id;
    absl::Duration length;
    int strikes = 1;
    friend bool operator==(const Quarantine&, const Quarantine&) = default;
  };
  // The nodes kept out or on probation at `now`, by node id.
  std::vector<Quarantine> Quarantines(absl::Time now) const;
  // Keeps `q.node_id` out for `q.length` from `now` (a quarantine that an
  // earlier coordinator imposed, learned from its view: counted in full from
  // now, since its start is not known here), unless it is kept out longer
  // already. The length is cut to 16 quarantines, the strikes to 1..5. A
  // zero (or negative) length puts it on probation from `now`, unless it is
  // kept out or on probation here already.
  void Adopt(const Quarantine& q, absl::Time now);
  // The most removals in a row that double the quarantine.
  static constexpr int kMaxStrikes = 5;

 private:
  struct KeptOut {
    absl::Time until;
    absl::Duration length;
    int strikes = 0;  // removals in a row
  };

  const absl::Duration settle_;
  const absl::Duration quarantine_;
  // reporter -> (unreachable peer -> first listed).
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, absl::Time>>
      reports_;
  absl::flat_hash_map<std::string, KeptOut> kept_out_;
};

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_LINK_REPORTS_H_
