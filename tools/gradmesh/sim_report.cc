#include "tools/gradmesh/sim_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/cost_model.h"
#include "worker/collectives/registry.h"

namespace gradmesh::tools {

using collectives::FormulaCost;
using collectives::TableOneCost;
namespace {

struct CaseReport {
  SimCase c;
  SimResult result;
  std::optional<FormulaCost> formula;
};

std::string Num(double v) { return absl::StrFormat("%.9g", v); }

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.3g GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.3g MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.3g kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

std::string Ms(double s) { return absl::StrFormat("%.3f ms", s * 1e3); }

std::string FormulaBytes(const FormulaCost& f) {
  return f.exact() ? Bytes(f.min_bytes)
                   : absl::StrCat("[", Bytes(f.min_bytes), ", ",
                                  Bytes(f.max_bytes), "]");
}

std::string CaseJson(const CaseReport& r) {
  const SimCase& c = r.c;
  const SimResult& s = r.result;
  std::vector<std::string> seconds;
  for (double t : s.seconds) seconds.push_back(Num(t));
  std::string formula = "null";
  if (r.formula.has_value()) {
    formula = absl::StrCat("{\"rounds\": ", r.formula->rounds,
                           ", \"min_bytes\": ", Num(r.formula->min_bytes),
                           ", \"max_bytes\": ", Num(r.formula->max_bytes), "}");
  }
  return absl::StrCat(
      "{\"algorithm\": \"", c.algorithm.algorithm,
      "\", \"workers\": ", c.workers, ", \"teams\": ", c.algorithm.teams,
      ", \"n\": ", c.n, ", \"density\": ", Num(c.algorithm.density),
      ", \"simulated_n\": ", s.simulated_n, ", \"scale\": ", Num(s.scale),
      ", \"min_block_quota\": ", Num(s.min_block_quota),
      ", \"iterations\": ", c.iterations,
      ", \"alpha_s\": ", Num(c.link.alpha_s),
      ", \"beta_s_per_byte\": ", Num(c.link.beta_s_per_byte),
      ", \"select_s_per_value\": ", Num(c.compute.select_s_per_value),
      ", \"merge_s_per_value\": ", Num(c.compute.merge_s_per_value),
      ", \"accumulate_s_per_value\": ", Num(c.compute.accumulate_s_per_value),
      ", \"seconds\": ", Num(s.mean_seconds), ", \"iteration_seconds\": [",
      absl::StrJoin(seconds, ", "),
      "], \"compute_seconds\": ", Num(s.compute_seconds),
      ", \"rounds\": ", s.max_rounds,
      ", \"max_bytes_received\": ", Num(s.max_bytes_received),
      ", \"mean_bytes_received\": ", Num(s.mean_bytes_received),
      ", \"table_one\": ", formula, "}");
}

void PrintHeader(const SimRequest& request, const SimCase& c) {
  const uint64_t n = SimulatedValues(c);
  std::printf("%s  P=%d  n=%s  density %g  (%d iterations)\n",
              c.algorithm.algorithm.c_str(), c.workers,
              absl::StrFormat("%d", c.n).c_str(), c.algorithm.density,
              c.iterations);
  if (n < c.n) {
    std::printf(
        "simulated at n'=%llu a worker (--max_values), bytes and work "
        "counted x%.4g\n",
        static_cast<unsigned long long>(n),
        static_cast<double>(c.n) / static_cast<double>(n));
  }
  std::printf(
      "link: alpha %.4g us, %.4g Gbit/s; compute per value: select %.3g ns, "
      "merge %.3g ns, accumulate %.3g ns%s\n",
      c.link.alpha_s * 1e6,
      c.link.beta_s_per_byte > 0 ? 8e-9 / c.link.beta_s_per_byte : 0.0,
      c.compute.select_s_per_value * 1e9, c.compute.merge_s_per_value * 1e9,
      c.compute.accumulate_s_per_value * 1e9,
      request.calibrate ? " (measured here)" : "");
  if (request.calibrate) {
    std::printf(
        "to reuse them: --select-ns=%.3g --merge-ns=%.3g "
        "--accumulate-ns=%.3g\n",
        c.compute.select_s_per_value * 1e9 / request.compute_scale,
        c.compute.merge_s_per_value * 1e9 / request.compute_scale,
        c.compute.accumulate_s_per_value * 1e9 / request.compute_scale);
  }
}

void PrintCase(const CaseReport& r) {
  const SimResult& s = r.result;
  if (r.c.algorithm.algorithm == "spardl") {
    std::printf("d=%d\n", r.c.algorithm.teams);
  }
  std::printf("  time per all-reduce  %s (slowest worker; its compute %s)\n",
              Ms(s.mean_seconds).c_str(), Ms(s.compute_seconds).c_str());
  const std::string formula_rounds =
      r.formula ? absl::StrCat("   Table I: ", r.formula->rounds) : "";
  const std::string formula_bytes =
      r.formula ? absl::StrCat("   Table I: ", FormulaBytes(*r.formula)) : "";
  std::printf("  rounds               %d%s\n", s.max_rounds,
              formula_rounds.c_str());
  std::printf("  bytes received       max %s, mean %s a worker%s\n",
              Bytes(s.max_bytes_received).c_str(),
              Bytes(s.mean_bytes_received).c_str(), formula_bytes.c_str());
  if (s.min_block_quota < 8) {
    std::printf(
        "  note: the smallest selection holds %.3g values at n'; scaled "
        "figures are rough below about 8 (raise --max-values)\n",
        s.min_block_quota);
  }
}

absl::StatusOr<CaseReport> RunCase(const SimCase& c) {
  GM_ASSIGN_OR_RETURN(SimResult result, Simulate(c));
  return CaseReport{
      .c = c,
      .result = result,
      .formula = TableOneCost(c.algorithm.algorithm, c.workers,
                              c.algorithm.teams, c.n, c.algorithm.density)};
}

// Every d, and the model's ranking beside the simulated one.
absl::StatusOr<std::string> RunAllTeams(const SimRequest& request, bool text) {
  const SimCase& base = request.base;
  const std::vector<int> teams = server::ValidTeamCounts(base.workers);
  GM_CHECK(!teams.empty());  // ValidateCase checked P >= 1
  std::vector<CaseReport> reports;
  for (size_t i = 0; i < teams.size(); ++i) {
    std::fprintf(stderr, "gradmesh sim: d=%d (%zu of %zu)\n", teams[i], i + 1,
                 teams.size());
    SimCase c = base;
    c.algorithm.teams = teams[i];
    GM_ASSIGN_OR_RETURN(CaseReport report, RunCase(c));
    if (text) PrintCase(report);
    std::fflush(stdout);
    reports.push_back(std::move(report));
  }
  const CaseReport* best = &reports[0];
  for (const CaseReport& r : reports) {
    if (r.result.mean_seconds < best->result.mean_seconds) best = &r;
  }
  const std::vector<server::TeamCountModel> model =
      server::RankTeamCounts(base.workers, base.n, base.algorithm.density,
                             {.alpha_s = base.link.alpha_s,
                              .beta_s_per_byte = base.link.beta_s_per_byte},
                             request.skip_factor);
  std::vector<std::string> skipped, model_json, cases_json;
  for (const server::TeamCountModel& m : model) {
    if (m.skipped) skipped.push_back(absl::StrCat(m.teams));
    model_json.push_back(
        absl::StrCat("{\"teams\": ", m.teams, ", \"seconds\": ", Num(m.seconds),
                     ", \"skipped\": ", m.skipped ? "true" : "false", "}"));
  }
  for (const CaseReport& r : reports) cases_json.push_back(CaseJson(r));
  if (text) {
    std::printf(
        "simulated best: d=%d (%s); the coordinator's model picks d=%d "
        "(%s simulated)%s\n",
        best->c.algorithm.teams, Ms(best->result.mean_seconds).c_str(),
        model[0].teams,
        Ms(reports[std::find(teams.begin(), teams.end(), model[0].teams) -
                   teams.begin()]
               .result.mean_seconds)
            .c_str(),
        skipped.empty()
            ? ""
            : absl::StrCat(
                  "; autotune would skip d=", absl::StrJoin(skipped, ", "),
                  absl::StrFormat(" (modeled over %gx the best)",
                                  request.skip_factor))
                  .c_str());
  }
  return absl::StrCat("{\"cases\": [", absl::StrJoin(cases_json, ",\n  "),
                      "],\n \"best_teams\": ", best->c.algorithm.teams,
                      ", \"model_teams\": ", model[0].teams,
                      ", \"skip_factor\": ", Num(request.skip_factor),
                      ",\n \"model\": [", absl::StrJoin(model_json, ", "),
                      "]}");
}

absl::Status WriteJson(const std::string& path, const std::string& json) {
  if (path == "-") {
    std::printf("%s\n", json.c_str());
    return absl::OkStatus();
  }
  std::ofstream out(path);
  out << json << "\n";
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunSimCommand(SimRequest request) {
  if (!(request.compute_scale > 0) || !std::isfinite(request.compute_scale)) {
    return absl::InvalidArgumentError(
        "--compute-scale must be positive and finite");
  }
  if (!(request.skip_factor >= 1) || !std::isfinite(request.skip_factor)) {
    return absl::InvalidArgumentError("--skip-factor must be at least 1");
  }
  SimCase& base = request.base;
  GM_RETURN_IF_ERROR(ValidateCase(base));
  if (request.all_teams && base.algorithm.algorithm != "spardl") {
    return absl::InvalidArgumentError("--teams=all needs --algo=spardl");
  }
  if (request.calibrate) base.compute = Calibrate();
  base.compute.select_s_per_value *= request.compute_scale;
  base.compute.merge_s_per_value *= request.compute_scale;
  base.compute.accumulate_s_per_value *= request.compute_scale;
  const bool text = request.json != "-";
  if (text) PrintHeader(request, base);
  std::string json;
  if (request.all_teams) {
    GM_ASSIGN_OR_RETURN(json, RunAllTeams(request, text));
  } else {
    GM_ASSIGN_OR_RETURN(CaseReport report, RunCase(base));
    if (text) PrintCase(report);
    json = CaseJson(report);
  }
  if (request.json.empty()) return absl::OkStatus();
  return WriteJson(request.json, json);
}

}  // namespace gradmesh::tools
