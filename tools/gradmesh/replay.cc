#include "tools/gradmesh/replay.h"

#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "tools/gradmesh/npy.h"
#include "tools/gradmesh/synthetic.h"
#include "worker/engine/engine.h"
#include "worker/sparse/sparse_block.h"
#include "worker/transport/loopback.h"

namespace gradmesh::tools {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kWriteChunk = 1 << 20;  // values per densified write

struct Shape {
  uint64_t iterations = 0;
  uint64_t n = 0;
};

std::string RankFile(int rank) { return absl::StrCat("rank", rank, ".npy"); }

// Opens every rank's input and checks that all shapes agree.
absl::StatusOr<std::vector<NpyReader>> OpenInputs(const ReplayOptions& options,
                                                  Shape* shape) {
  std::vector<NpyReader> readers;
  for (int r = 0; r < options.workers; ++r) {
    const std::string path =
        (fs::path(options.input_dir) / RankFile(r)).string();
    auto reader = NpyReader::Open(path);
    if (!reader.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input for rank ", r, ": ", reader.status().message()));
    }
    if (r == 0) {
      *shape = {reader->rows(), reader->columns()};
    } else if (reader->rows() != shape->iterations ||
               reader->columns() != shape->n) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " holds ", reader->rows(), " iteration(s) of ",
                       reader->columns(), " values; rank0.npy holds ",
                       shape->iterations, " of ", shape->n));
    }
    readers.push_back(*std::move(reader));
  }
  if (shape->iterations == 0) {
    return absl::InvalidArgumentError("inputs hold no iteration (T = 0)");
  }
  return readers;
}

absl::Status CheckFinite(absl::Span<const float> values, int rank,
                         uint64_t iteration) {
  for (uint64_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " iteration ", iteration, " index ", i,
                       ": value is ", std::isnan(values[i]) ? "NaN" : "Inf"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteDense(const sparse::SparseBlock& result, uint64_t n,
                        NpyWriter& writer) {
  std::vector<float> chunk(std::min(n, kWriteChunk));
  for (uint64_t begin = 0; begin < n; begin += kWriteChunk) {
    const sparse::IndexRange range{begin, std::min(n, begin + kWriteChunk)};
    absl::Span<float> out = absl::MakeSpan(chunk).first(range.size());
    sparse::Densify(result, range, out);
    GM_RETURN_IF_ERROR(writer.Append(out));
  }
  return absl::OkStatus();
}

// What one rank's all-reduce of one iteration did and took.
struct IterationStats {
  collectives::OpStats op;
  double seconds = 0;
};

// Rank 0's line for iteration t of `iterations`.
void PrintProgress(uint64_t t, uint64_t iterations,
                   const collectives::OpStats& stats, double seconds) {
  std::printf(
      "iteration %llu/%llu: %llu nonzeros, rank 0 sent %llu B and "
      "received %llu B in %d rounds, %.3f s\n",
      static_cast<unsigned long long>(t + 1),
      static_cast<unsigned long long>(iterations),
      static_cast<unsigned long long>(stats.result_nonzeros),
      static_cast<unsigned long long>(stats.bytes_sent),
      static_cast<unsigned long long>(stats.bytes_received), stats.rounds,
      seconds);
  std::fflush(stdout);
}

// The engine's residual of rank `rank` into rank{rank}.residual.npy.
absl::Status WriteResidual(const engine::Engine& engine,
                           const fs::path& staging, int rank, uint64_t n) {
  GM_ASSIGN_OR_RETURN(
      NpyWriter residual,
      NpyWriter::Create(
          (staging / absl::StrCat("rank", rank, ".residual.npy")).string(),
          {n}));
  absl::Status appended;
  engine.ReadResidual("gradient", [&](absl::Span<const float> r) {
    appended = residual.Append(r);
  });
  GM_RETURN_IF_ERROR(appended);
  return residual.Close();
}

// Everything one rank does: read or generate, all-reduce, write. Every
// iteration's all-reduce starts when all ranks have their gradient
// (`start`), so its time is the operation's alone, without the skew of
// reading and writing.
absl::Status RunRank(const ReplayOptions& options, const Shape& shape,
                     std::optional<NpyReader> reader,
                     transport::Transport* transport, const fs::path& staging,
                     std::barrier<>& start,
                     std::vector<IterationStats>* stats) {
  const int rank = transport->rank();
  const engine::GroupConfig group{
      .transport = transport,
      .options = {.algorithm = options.algorithm, .timeout = options.timeout}};
  GM_RETURN_IF_ERROR(engine::CheckOptions(group));
  engine::Engine engine;
  GM_ASSIGN_OR_RETURN(
      NpyWriter results,
      NpyWriter::Create(
          (staging / absl::StrCat("rank", rank, ".result.npy")).string(),
          {shape.iterations, shape.n}));
  std::vector<float> gradient(shape.n);
  for (uint64_t t = 0; t < shape.iterations; ++t) {
    if (reader.has_value()) {
      GM_RETURN_IF_ERROR(reader->ReadRow(t, absl::MakeSpan(gradient)));
      GM_RETURN_IF_ERROR(CheckFinite(gradient, rank, t));
    } else {
      SyntheticGradient(options.seed, rank, t, absl::MakeSpan(gradient));
    }
    start.arrive_and_wait();
    const absl::Time started = absl::Now();
    collectives::OpStats op_stats;
    GM_ASSIGN_OR_RETURN(
        sparse::SparseBlock result,
        engine.AllReduce(
            group, {.buffer = "gradient", .gradient = gradient, .operation = t},
            &op_stats));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
    stats->push_back({op_stats, seconds});
    GM_RETURN_IF_ERROR(WriteDense(result, shape.n, results));
    if (options.progress && rank == 0) {
      PrintProgress(t, shape.iterations, op_stats, seconds);
    }
  }
  GM_RETURN_IF_ERROR(results.Close());
  return WriteResidual(engine, staging, rank, shape.n);
}

absl::Status WriteStats(const ReplayOptions& options, const Shape& shape,
                        const std::vector<std::vector<IterationStats>>& stats,
                        const fs::path& path) {
  std::ofstream out(path);
  out << "{\n  \"algorithm\": \"" << options.algorithm.algorithm << "\",\n"
      << "  \"workers\": " << options.workers << ",\n"
      << "  \"teams\": " << options.algorithm.teams << ",\n"
      << "  \"density\": " << options.algorithm.density << ",\n"
      << "  \"n\": " << shape.n << ",\n"
      << "  \"k\": "
      << collectives::SelectionSize(shape.n, options.algorithm.density)
      << ",\n  \"iterations\": " << shape.iterations << ",\n"
      << "  \"value_bytes\": 4,\n  \"index_bytes\": 4,\n  \"ranks\": [\n";
  for (size_t r = 0; r < stats.size(); ++r) {
    out << "    {\"rank\": " << r << ", \"iterations\": [\n";
    for (size_t t = 0; t < stats[r].size(); ++t) {
      const collectives::OpStats& s = stats[r][t].op;
      out << "      {\"iteration\": " << t
          << ", \"seconds\": " << stats[r][t].seconds
          << ", \"wait_seconds\": " << s.wait_seconds
          << ", \"rounds\": " << s.rounds
          << ", \"bytes_sent\": " << s.bytes_sent
          << ", \"bytes_received\": " << s.bytes_received
          << ", \"coo_bytes_received\": " << s.coo_bytes_received
          << ", \"result_nonzeros\": " << s.result_nonzeros;
      s.figures.ForEach([&](absl::string_view name, int64_t value) {
        out << ", \"" << name << "\": " << value;
      });
      out << "}" << (t + 1 < stats[r].size() ? "," : "") << "\n";
    }
    out << "    ]}" << (r + 1 < stats.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
  out.close();
  if (!out)
    return absl::DataLossError(absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

// Picks the error to report: a rank's own failure (bad input, say) explains
// more than the Unavailable its peers saw when it stopped.
absl::Status RootCause(const std::vector<absl::Status>& statuses) {
  const absl::Status* first = nullptr;
  for (const absl::Status& s : statuses) {
    if (s.ok()) continue;
    if (!absl::IsUnavailable(s) && !absl::IsAborted(s)) return s;
    if (first == nullptr) first = &s;
  }
  return first == nullptr ? absl::OkStatus() : *first;
}

absl::Status PrepareOutput(const ReplayOptions& options) {
  if (options.output_dir.empty()) {
    return absl::InvalidArgumentError("--output-dir is required");
  }
  std::error_code ec;
  const fs::path out(options.output_dir);
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.output_dir, " exists and is not a directory"));
    }
    if (!fs::is_empty(out, ec) && !options.overwrite) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.output_dir,
                       " is not empty (pass --overwrite to replace it)"));
    }
  }
  return absl::OkStatus();
}

// A fresh staging directory beside `out`, renamed into place on success.
absl::StatusOr<fs::path> MakeStaging(const fs::path& out) {
  const fs::path staging =
      out.parent_path() /
      absl::StrCat(".", out.filename().string(), ".partial-", getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (!fs::create_directories(staging, ec)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", staging.string(), ": ", ec.message()));
  }
  return staging;
}

// Moves `staging` into place at `out` if `status` is OK; removes it
// otherwise (or if the move fails). Returns the outcome.
absl::Status Publish(const fs::path& staging, const fs::path& out,
                     absl::Status status) {
  std::error_code ec;
  if (status.ok()) {
    fs::remove_all(out, ec);
    fs::rename(staging, out, ec);
    if (ec) {
      status = absl::PermissionDeniedError(absl::StrCat(
          "cannot move results to ", out.string(), ": ", ec.message()));
    }
  }
  if (!status.ok()) fs::remove_all(staging, ec);
  return status;
}

}  // namespace

absl::Status RunReplay(const ReplayOptions& options) {
  if (options.workers < 1 || options.workers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers=", options.workers, " is outside 1..1024"));
  }
  // Checks algorithm, density and teams before touching any file.
  GM_RETURN_IF_ERROR(
      collectives::CreateCollective(options.algorithm, options.workers, 0, 0)
          .status());
  GM_RETURN_IF_ERROR(PrepareOutput(options));

  Shape shape{options.iterations, options.n};
  std::vector<std::optional<NpyReader>> readers(options.workers);
  if (!options.input_dir.empty()) {
    GM_ASSIGN_OR_RETURN(std::vector<NpyReader> opened,
                        OpenInputs(options, &shape));
    for (int r = 0; r < options.workers; ++r) readers[r] = std::move(opened[r]);
  } else if (shape.iterations == 0) {
    return absl::InvalidArgumentError("--iterations must be at least 1");
  }
  if (shape.n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("n = ", shape.n, " exceeds uint32 indices"));
  }

  // "out/" names the directory "out": drop the empty last component.
  fs::path out = fs::path(options.output_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  GM_ASSIGN_OR_RETURN(const fs::path staging, MakeStaging(out));

  transport::LoopbackNetwork network(options.workers);
  std::vector<absl::Status> statuses(options.workers);
  std::vector<std::vector<IterationStats>> stats(options.workers);
  std::barrier<> start(options.workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < options.workers; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = RunRank(options, shape, std::move(readers[r]),
                            network.endpoint(r), staging, start, &stats[r]);
      // Done or failed: the others no longer wait for this rank to start.
      start.arrive_and_drop();
      // Peers waiting on a failed rank learn at once instead of timing out.
      if (!statuses[r].ok()) network.endpoint(r)->Abort(statuses[r]);
    });
  }
  for (std::thread& t : threads) t.join();

  absl::Status status = RootCause(statuses);
  if (status.ok()) {
    status = WriteStats(options, shape, stats, staging / "stats.json");
  }
  return Publish(staging, out, status);
}

}  // namespace gradmesh::tools
