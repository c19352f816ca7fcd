// The data plane of P workers in one process: loopback transports, real
// shared-memory segments (each test plays the SDK's part by hand).
#include "worker/daemon/data_plane.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "worker/transport/fault_injection.h"
#include "worker/transport/loopback.h"

namespace gradmesh::daemon {
namespace {

using ::gradmesh::testing::RandomVector;
using ::testing::Each;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// P workers, each with its tracker and data plane, in one view. Worker r
// is member "w<r>"; each view gets its own loopback network, and a worker in
// doubt asks its peers' data planes directly.
class Workers {
 public:
  explicit Workers(int p,
                   PlanInfo plan = {
                       .algorithm = "spardl", .density = 0.1, .teams = 1}) {
    for (int r = 0; r < p; ++r) {
      auto views = std::make_unique<ViewTracker>(
          [this, r](const ViewInfo& view) { return MakeGroup(view, r); },
          RealClock());
      planes_.push_back(std::make_unique<DataPlane>(
          views.get(),
          DataPlaneHooks{
              .on_success =
                  [this, r](const ReduceResult& result) {
                    absl::MutexLock lock(&mu_);
                    reported_[r] = result;
                  },
              .ask_outcome =
                  [this](const std::string& address, const OutcomeKey& key,
                         const std::vector<std::string>& gone,
                         absl::Time) { return Ask(address, key, gone); }},
          DataPlaneOptions{.view_wait = absl::Seconds(3)}));
      views_.push_back(std::move(views));
    }
    view_.epoch = 1;
    view_.plan = plan;
    for (int r = 0; r < p; ++r) {
      view_.member_ids.push_back(absl::StrCat("w", r));
      view_.addresses.push_back(view_.member_ids.back());
    }
  }

  void Start() {
    for (auto& v : views_) ASSERT_TRUE(v->Install(view_).has_value());
  }

  // The view of epoch `epoch` with workers `members`, as the coordinator
  // would publish it.
  ViewInfo View(uint64_t epoch, const std::vector<int>& members) const {
    ViewInfo view{.epoch = epoch, .plan = view_.plan};
    for (int r : members) {
      view.member_ids.push_back(absl::StrCat("w", r));
      view.addresses.push_back(view.member_ids.back());
    }
    return view;
  }

  // Installs `view` on worker r as the daemon does: a membership change
  // aborts the operations in flight on the group it replaces.
  void Install(int r, const ViewInfo& view) {
    auto change = views_[r]->Install(view);
    ASSERT_TRUE(change.has_value());
    for (const auto& replaced : change->replaced) {
      if (replaced->transport == nullptr) continue;  // not a member there
      replaced->transport->Abort(absl::AbortedError("view changed"));
    }
  }

  // Worker r's Decide can't be reached from now on (as if its port were cut).
  void Unreachable(int r) {
    absl::MutexLock lock(&mu_);
    unreachable_.insert(r);
  }

  // Faults of worker r's transports from now on (new views only).
  void Faults(int r,
              std::function<void(transport::FaultInjectingTransport&)> set) {
    absl::MutexLock lock(&mu_);
    faults_[r] = std::move(set);
  }
  void DropSendsIf(int r, transport::FaultInjectingTransport::DropIf drop) {
    Faults(r, [drop](transport::FaultInjectingTransport& t) {
      t.DropSendsIf(drop);
    });
  }

  // Worker r can't run the plans of views installed from now on, for `why`
  // (as a worker that does not know the plan's fusion).
  void PlanFails(int r, absl::Status why) {
    absl::MutexLock lock(&mu_);
    plan_fails_[r] = std::move(why);
  }

  int size() const { return static_cast<int>(planes_.size()); }
  DataPlane& plane(int r) { return *planes_[r]; }

  // What worker r's last successful all-reduce reported (its on_success).
  ReduceResult Reported(int r) {
    absl::MutexLock lock(&mu_);
    return reported_[r];
  }

  // The SDK's part of Register: create (and lock, if `client` says so),
  // register, unlink; telling the segment's name in `*shm_name` (may be
  // null).
  absl::StatusOr<SharedSegment> Register(int r, const BucketName& name,
                                         const std::vector<TensorSpec>& t,
                                         const BucketOptions& options = {},
                                         const BucketClient& client = {},
                                         std::string* shm_name = nullptr) {
    uint64_t n = 0;
    for (const TensorSpec& spec : t) n += spec.size;
    const std::string shm = SharedSegment::UniqueName(name.bucket);
    if (shm_name != nullptr) *shm_name = shm;
    auto segment = SharedSegment::Create(shm, SegmentLayout(n).bytes);
    if (!segment.ok()) return segment.status();
    if (client.locks_segment) {
      if (absl::Status locked = segment->HoldLock(); !locked.ok()) {
        return locked;
      }
    }
    auto joined = planes_[r]->Register(name, t, shm, next_index_[r]++, Soon(),
                                       options, client);
    EXPECT_TRUE(SharedSegment::Unlink(shm).ok());
    if (!joined.ok()) return joined.status();
    return segment;
  }

  // Register on every rank at once (it is collective).
  std::vector<SharedSegment> RegisterAll(const BucketName& name,
                                         const std::vector<TensorSpec>& t,
                                         const BucketClient& client = {},
                                         const BucketOptions& options = {}) {
    std::vector<SharedSegment> segments(size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        auto segment = Register(r, name, t, options, client);
        ASSERT_TRUE(segment.ok()) << segment.status();
        segments[r] = *std::move(segment);
      });
    }
    for (auto& thread : threads) thread.join();
    return segments;
  }

 private:
  absl::StatusOr<Outcome> Ask(const std::string& address, const OutcomeKey& key,
                              const std::vector<std::string>& gone) {
    int r = 0;
    if (!absl::SimpleAtoi(address.substr(1), &r)) {
      return absl::NotFoundError(address);
    }
    {
      absl::MutexLock lock(&mu_);
      if (unreachable_.contains(r)) return absl::UnavailableError(address);
    }
    return planes_[r]->Decide(key, gone);
  }

  std::shared_ptr<Group> MakeGroup(const ViewInfo& view, int worker) {
    auto group = std::make_shared<Group>();
    group->view = view;
    const std::string id = absl::StrCat("w", worker);
    for (int i = 0; i < group->size(); ++i) {
      if (view.member_ids[i] == id) group->rank = i;
    }
    if (group->rank < 0) return group;
    absl::MutexLock lock(&mu_);
    auto& net = nets_[view.epoch];
    if (net == nullptr) {
      net = std::make_unique<transport::LoopbackNetwork>(group->size());
    }
    auto faulty = std::make_unique<transport::FaultInjectingTransport>(
        net->endpoint(group->rank));
    if (faults_.contains(worker)) faults_[worker](*faulty);
    group->transport = std::move(faulty);
    group->options = {.algorithm = {.algorithm = view.plan.algorithm,
                                    .density = view.plan.density,
                                    .teams = view.plan.teams},
                      .timeout = absl::Seconds(20),
                      .epoch = view.epoch};
    if (plan_fails_.contains(worker)) group->error = plan_fails_[worker];
    return group;
  }

  absl::Mutex mu_;
  std::map<uint64_t, std::unique_ptr<transport::LoopbackNetwork>> nets_
      ABSL_GUARDED_BY(mu_);
  std::map<int, std::function<void(transport::FaultInjectingTransport&)>>
      faults_ ABSL_GUARDED_BY(mu_);
  std::set<int> unreachable_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> plan_fails_ ABSL_GUARDED_BY(mu_);
  std::map<int, ReduceResult> reported_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> next_index_ = std::vector<uint64_t>(64, 0);
  ViewInfo view_;
  std::vector<std::unique_ptr<ViewTracker>> views_;
  std::vector<std::unique_ptr<DataPlane>> planes_;
};

absl::Span<float> Values(const SharedSegment& s, uint64_t n) {
  return {s.at<float>(SegmentLayout(n).values), n};
}
std::vector<float> Residual(const SharedSegment& s, uint64_t n) {
  const float* r = s.at<float>(SegmentLayout(n).residual);
  return {r, r + n};
}
sparse::SparseBlock Sparse(const SharedSegment& s, uint64_t n,
                           uint64_t nonzeros) {
  const SegmentLayout layout(n);
  sparse::SparseBlock block;
  block.indices.assign(s.at<uint32_t>(layout.indices),
                       s.at<uint32_t>(layout.indices) + nonzeros);
  block.values.assign(s.at<float>(layout.sparse_values),
                      s.at<float>(layout.sparse_values) + nonzeros);
  return block;
}

// Runs `call` (per rank) on every rank at once, until `deadline`.
std::vector<absl::StatusOr<ReduceResult>> AllReduceAllUntil(
    Workers& w, const ReduceCall& call, absl::Time deadline) {
  std::vector<absl::StatusOr<ReduceResult>> out(w.size(),
                                                absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < w.size(); ++r) {
    threads.emplace_back(
        [&, r] { out[r] = w.plane(r).AllReduce(call, deadline); });
  }
  for (auto& thread : threads) thread.join();
  return out;
}

std::vector<absl::StatusOr<ReduceResult>> AllReduceAll(Workers& w,
                                                       const ReduceCall& call) {
  return AllReduceAllUntil(w, call, Soon());
}

// Writes seeded gradients into every worker's bucket; returns them.
std::vector<std::vector<float>> WriteGradients(
    std::vector<SharedSegment>& segments, uint64_t n, uint64_t seed) {
  std::vector<std::vector<float>> gradients;
  for (size_t r = 0; r < segments.size(); ++r) {
    gradients.push_back(RandomVector(n, seed + r));
    std::memcpy(Values(segments[r], n).data(), gradients[r].data(), n * 4);
  }
  return gradients;
}

// Step `step` of `name` from fresh gradients on every rank; checks that the
// residuals before it held `carried` (zeros if empty): inputs = result +
// residuals.
void ExpectConservedStep(Workers& w, std::vector<SharedSegment>& segments,
                         const BucketName& name, uint64_t n, uint64_t step,
                         uint64_t seed,
                         std::vector<std::vector<float>> carried = {}) {
  std::vector<std::vector<float>> inputs = WriteGradients(segments, n, seed);
  for (size_t r = 0; r < carried.size(); ++r) {
    for (uint64_t i = 0; i < n; ++i) inputs[r][i] += carried[r][i];
  }
  const testing::MassBalance balance(
      inputs,
      std::vector<std::vector<float>>(w.size(), std::vector<float>(n, 0)));
  auto results = AllReduceAll(
      w, {.name = name, .step = step, .sparse = true, .return_residual = true});
  std::vector<std::vector<float>> residuals;
  for (int r = 0; r < w.size(); ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    residuals.push_back(Residual(segments[r], n));
  }
  EXPECT_TRUE(
      balance.Holds(Sparse(segments[0], n, results[0]->nonzeros), residuals));
}

// Step `step` of bucket job/b on every rank, sparse, residuals returned.
std::vector<absl::StatusOr<ReduceResult>> SparseStepOfJobB(Workers& w,
                                                           uint64_t step) {
  return AllReduceAll(w, {.name = {"job", "b"},
                          .step = step,
                          .sparse = true,
                          .return_residual = true});
}

// Sparse results identical everywhere and inputs = result + residuals, over
// three steps, with two tensors fused in one bucket.
TEST(DataPlaneTest, SumsIdenticallyAndConservesMass) {
  constexpr uint64_t kN = 500;
  Workers w(4, {.algorithm = "spardl", .density = 0.05, .teams = 2});
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t1", 300}, {"t2", 200}});
  std::vector<std::vector<float>> residuals(4, std::vector<float>(kN, 0));
  for (uint64_t step = 0; step < 3; ++step) {
    const testing::MassBalance balance(WriteGradients(segments, kN, 10 * step),
                                       residuals);
    auto results = SparseStepOfJobB(w, step);
    std::vector<sparse::SparseBlock> blocks;
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->rank, r);
      EXPECT_EQ(results[r]->world_size, 4);
      blocks.push_back(Sparse(segments[r], kN, results[r]->nonzeros));
      residuals[r] = Residual(segments[r], kN);
      EXPECT_EQ(blocks[r].indices, blocks[0].indices);
      EXPECT_EQ(blocks[r].values, blocks[0].values);
    }
    EXPECT_GT(blocks[0].size(), 0u);
    EXPECT_TRUE(balance.Holds(blocks[0], residuals));
  }
}

// The plan's warm-up: a sparse plan's first warmup_steps steps are summed
// exactly (every value, no residual), the step after by the plan, with mass
// conserved throughout.
TEST(DataPlaneTest, TheWarmUpsStepsAreSummedExactly) {
  constexpr uint64_t kN = 400;
  Workers w(
      4,
      {.algorithm = "spardl", .density = 0.05, .teams = 2, .warmup_steps = 2});
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  std::vector<std::vector<float>> residuals(4, std::vector<float>(kN, 0));
  for (uint64_t step = 0; step < 3; ++step) {
    const testing::MassBalance balance(WriteGradients(segments, kN, 10 * step),
                                       residuals);
    auto results = SparseStepOfJobB(w, step);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->exact, step < 2) << step;
      residuals[r] = Residual(segments[r], kN);
    }
    const sparse::SparseBlock sum =
        Sparse(segments[0], kN, results[0]->nonzeros);
    EXPECT_TRUE(balance.Holds(sum, residuals)) << step;
    if (step < 2) {
      EXPECT_EQ(sum.size(), kN) << step;
      EXPECT_THAT(residuals[0], Each(0.0f)) << step;
    } else {
      EXPECT_LT(sum.size(), kN);
    }
  }
}

// A bucket whose last tensor is registered exact: each step sums it exactly
// (every value, no residual left there) and the other by the plan, in one
// operation, the same on every worker, mass conserved. A tail of every
// tensor is an exact bucket. More exact tensors than the bucket holds is
// refused, as are registrations that differ.
TEST(DataPlaneTest, TheExactLastTensorsAreSummedExactlyInTheSameOperation) {
  constexpr uint64_t kN = 1000, kHead = 900;
  Workers w(4, {.algorithm = "spardl", .density = 0.05, .teams = 2});
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"w", kHead}, {"b", 100}}, {},
                                {.exact_tensors = 1});
  std::vector<std::vector<float>> residuals(4, std::vector<float>(kN, 0));
  for (uint64_t step = 0; step < 2; ++step) {
    const std::vector<std::vector<float>> gradients =
        WriteGradients(segments, kN, 10 * step);
    const testing::MassBalance balance(gradients, residuals);
    auto results = SparseStepOfJobB(w, step);
    std::vector<sparse::SparseBlock> blocks;
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_FALSE(results[r]->exact);
      blocks.push_back(Sparse(segments[r], kN, results[r]->nonzeros));
      residuals[r] = Residual(segments[r], kN);
      EXPECT_EQ(blocks[r].indices, blocks[0].indices);
      EXPECT_EQ(blocks[r].values, blocks[0].values);
      EXPECT_THAT(absl::MakeSpan(residuals[r]).subspan(kHead), Each(0.0f));
    }
    EXPECT_TRUE(balance.Holds(blocks[0], residuals));
    // The head by the plan (5%: 45 of 900), the tail whole.
    ASSERT_LT(blocks[0].size(), kN);
    const size_t head = blocks[0].size() - 100;
    EXPECT_LE(head, 45u);
    for (uint64_t i = 0; i < 100; ++i) {
      EXPECT_EQ(blocks[0].indices[head + i], kHead + i);
      float sum = 0;
      for (int r = 0; r < 4; ++r) sum += gradients[r][kHead + i];
      EXPECT_NEAR(blocks[0].values[head + i], sum, 1e-5) << i;
    }
  }
  std::vector<absl::Status> status(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      status[r] = w.Register(r, {"job", "c"}, {{"w", 90}, {"b", 10}},
                             {.exact_tensors = r == 0 ? 1u : 0u})
                      .status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(status[r])) << r << ": " << status[r];
  }
  // A tail of every tensor: the bucket summed exactly, and reported so.
  auto whole = w.RegisterAll({"job", "e"}, {{"w", 90}, {"b", 10}}, {},
                             {.exact_tensors = 2});
  for (const auto& out : AllReduceAll(w, {.name = {"job", "e"}})) {
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(out->exact);
  }
  const absl::Status too_many =
      w.Register(0, {"job", "d"}, {{"w", 90}}, {.exact_tensors = 2}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(too_many)) << too_many;
  EXPECT_THAT(std::string(too_many.message()),
              ::testing::HasSubstr("the last 2 tensors exact, of 1"));
}

// Each step reports the time since the bucket's step before began here (the
// training step, for the autotune); a first step, or one after a gap, knows
// none, and a call refused in between does not restart the clock.
TEST(DataPlaneTest, AStepReportsTheTimeSinceTheStepBeforeBegan) {
  Workers w(2, {.algorithm = "dense"});
  w.Start();
  w.RegisterAll({"job", "b"}, {{"t", 100}});
  for (uint64_t step : {0, 1, 3}) {
    if (step > 0) absl::SleepFor(absl::Milliseconds(100));
    if (step == 1) {  // step 0 again: refused
      for (const auto& out : AllReduceAll(w, {.name = {"job", "b"}})) {
        ASSERT_TRUE(absl::IsInvalidArgument(out.status())) << out.status();
      }
    }
    auto results = AllReduceAll(w, {.name = {"job", "b"}, .step = step});
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      // What goes to the coordinator, and what the call returns.
      const double reported = w.Reported(r).period_seconds;
      EXPECT_EQ(results[r]->period_seconds, reported);
      if (step == 1) {
        EXPECT_GE(reported, 0.1) << "rank " << r;
        EXPECT_LT(reported, 10) << "rank " << r;
      } else {
        EXPECT_EQ(reported, 0) << "step " << step;
      }
    }
  }
}

// Dense mean: the sum divided by P where selected, zeros elsewhere.
TEST(DataPlaneTest, WritesTheDenseMeanInPlace) {
  constexpr uint64_t kN = 64;
  Workers w(2, {.algorithm = "dense", .density = 1.0, .teams = 1});
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  for (int r = 0; r < 2; ++r) {
    for (uint64_t i = 0; i < kN; ++i) Values(segments[r], kN)[i] = i + 100 * r;
  }
  auto results = AllReduceAll(w, {.name = {"job", "b"}, .mean = true});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    for (uint64_t i = 0; i < kN; ++i) {
      EXPECT_EQ(Values(segments[r], kN)[i], (2.0f * i + 100.0f) / 2.0f);
    }
  }
}

// Buckets started in different orders on different workers are matched by
// name: each bucket's result is the same everywhere.
TEST(DataPlaneTest, MatchesBucketsInFlightByName) {
  constexpr uint64_t kN = 300;
  Workers w(3);
  w.Start();
  const std::vector<std::string> names = {"x", "y", "z"};
  std::vector<std::vector<SharedSegment>> segments;
  for (const auto& name : names) {
    segments.push_back(w.RegisterAll({"job", name}, {{"t", kN}}));
  }
  std::vector<std::vector<sparse::SparseBlock>> got(
      3, std::vector<sparse::SparseBlock>(3));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 3; ++i) {
      const int b = (i + r) % 3;  // rank r starts bucket b i-th
      const auto g = RandomVector(kN, 7 * b + r);
      std::memcpy(Values(segments[b][r], kN).data(), g.data(), kN * 4);
      threads.emplace_back([&, r, b] {
        auto result = w.plane(r).AllReduce(
            {.name = {"job", names[b]}, .step = 0, .sparse = true}, Soon());
        ASSERT_TRUE(result.ok()) << result.status();
        got[b][r] = Sparse(segments[b][r], kN, result->nonzeros);
      });
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  for (auto& thread : threads) thread.join();
  for (int b = 0; b < 3; ++b) {
    for (int r = 1; r < 3; ++r) {
      EXPECT_EQ(got[b][r].indices, got[b][0].indices);
      EXPECT_EQ(got[b][r].values, got[b][0].values);
    }
  }
}

// Workers that register different buckets all get InvalidArgument, quickly.
TEST(DataPlaneTest, MismatchedRegistrationsFailEverywhere) {
  Workers w(3);
  w.Start();
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      status[r] =
          w.Register(r, {"job", "b"}, {{"t", r == 1 ? 120u : 100u}}).status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(status[r])) << r << ": " << status[r];
    EXPECT_THAT(std::string(status[r].message()),
                ::testing::HasSubstr("differs between workers"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Nothing is left registered: the same bucket registers cleanly now.
  w.RegisterAll({"job", "b"}, {{"t", 100}});
}

TEST(DataPlaneTest, FusionModesThatDifferFailEverywhere) {
  Workers w(2);
  w.Start();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      status[r] = w.Register(r, {"job", "b"}, {{"w", 90}, {"b", 10}},
                             {.per_tensor_quota = r == 0})
                      .status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(status[r])) << r << ": " << status[r];
  }
}

// A bucket of a large and a small tensor at 1%: per-tensor quotas give the
// small one its entry; after_fusion, from the registration or from the
// plan, may leave it out.
TEST(DataPlaneTest, ThePlansAfterFusionOverridesPerTensorRegistrations) {
  for (const std::string fusion : {"per_tensor", "after_fusion"}) {
    Workers w(
        2,
        {.algorithm = "spardl", .density = 0.01, .teams = 1, .fusion = fusion});
    w.Start();
    auto segments = w.RegisterAll({"job", "b"}, {{"w", 990}, {"b", 10}});
    for (int r = 0; r < 2; ++r) {
      absl::Span<float> values = Values(segments[r], 1000);
      for (uint64_t i = 0; i < 1000; ++i) values[i] = i < 990 ? 100.0f : 0.1f;
    }
    auto results = AllReduceAll(w, {.name = {"job", "b"}, .step = 0});
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(results[r]->tensors_missing, fusion == "per_tensor" ? 0u : 1u)
          << fusion;
    }
  }
}

// NaN on one worker fails the step on every worker; the finite gradients
// stay in the residuals and the next step carries them.
TEST(DataPlaneTest, NonFiniteGradientFailsEverywhereAndKeepsTheRest) {
  constexpr uint64_t kN = 200;
  Workers w(3);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  std::vector<std::vector<float>> kept(3);
  for (int r = 0; r < 3; ++r) {
    kept[r] = RandomVector(kN, r);
    std::memcpy(Values(segments[r], kN).data(), kept[r].data(), kN * 4);
  }
  Values(segments[2], kN)[17] = std::nanf("");
  kept[2][17] = 0;  // dropped, never kept
  auto failed = AllReduceAll(w, {.name = {"job", "b"}, .step = 0});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(failed[r].status()))
        << failed[r].status();
    EXPECT_THAT(std::string(failed[r].status().message()),
                ::testing::HasSubstr("rank 2: 1"));
  }
  ExpectConservedStep(w, segments, {"job", "b"}, kN, 1, 50, kept);
}

// A stale step, and a step with no view yet, are refused without losing the
// gradient.
TEST(DataPlaneTest, RefusedStepsKeepTheGradient) {
  constexpr uint64_t kN = 100;
  Workers w(1, {.algorithm = "spardl", .density = 0.01, .teams = 1});
  // No view yet: Register waits, then gives up.
  const std::string shm = SharedSegment::UniqueName("early");
  auto early = SharedSegment::Create(shm, SegmentLayout(kN).bytes);
  ASSERT_TRUE(early.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      w.plane(0)
          .Register({"job", "b"}, {{"t", kN}}, shm, /*index=*/99,
                    absl::Now() + absl::Milliseconds(50))
          .status()));
  ASSERT_TRUE(SharedSegment::Unlink(shm).ok());
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  absl::Span<float> values = Values(segments[0], kN);
  std::fill(values.begin(), values.end(), 1.0f);
  ASSERT_TRUE(
      w.plane(0).AllReduce({.name = {"job", "b"}, .step = 5}, Soon()).ok());
  // The residual now holds 1 - result; a stale step adds 2 everywhere.
  std::fill(values.begin(), values.end(), 2.0f);
  auto stale = w.plane(0).AllReduce({.name = {"job", "b"}, .step = 5}, Soon());
  EXPECT_TRUE(absl::IsInvalidArgument(stale.status())) << stale.status();
  std::fill(values.begin(), values.end(), 0.0f);
  auto next = w.plane(0).AllReduce({.name = {"job", "b"},
                                    .step = 6,
                                    .sparse = true,
                                    .return_residual = true},
                                   Soon());
  ASSERT_TRUE(next.ok()) << next.status();
  const sparse::SparseBlock result = Sparse(segments[0], kN, next->nonzeros);
  std::vector<float> residual = Residual(segments[0], kN);
  for (size_t e = 0; e < result.size(); ++e) {
    residual[result.indices[e]] += result.values[e];
  }
  // Mass: 1 (step 5, partly sent) ... total pushed per index = 3, of which
  // step 5's result took some; what step 6 and the residual hold is the rest.
  double total = 0;
  for (float v : residual) total += v;
  EXPECT_NEAR(total, 3.0 * kN - 1.0, 1e-3);  // step 5 sent k = 1 value of 1
  EXPECT_TRUE(absl::IsInvalidArgument(
      w.plane(0)
          .AllReduce({.name = {"job", "nope"}, .step = 0}, Soon())
          .status()));
}

// A second job on the same live workers starts cleanly: steps from 0 again,
// residuals of its own; the first job's bucket is unaffected.
TEST(DataPlaneTest, SecondJobStartsClean) {
  constexpr uint64_t kN = 100;
  Workers w(2, {.algorithm = "spardl", .density = 0.1, .teams = 1});
  w.Start();
  auto first = w.RegisterAll({"job-a", "b"}, {{"t", kN}});
  for (uint64_t step = 0; step < 3; ++step) {
    for (int r = 0; r < 2; ++r) {
      auto g = RandomVector(kN, step * 2 + r);
      std::memcpy(Values(first[r], kN).data(), g.data(), kN * 4);
    }
    for (auto& result :
         AllReduceAll(w, {.name = {"job-a", "b"}, .step = step})) {
      ASSERT_TRUE(result.ok()) << result.status();
    }
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.plane(r).Unregister({"job-a", "b"}).ok());
  }
  auto second = w.RegisterAll({"job-b", "b"}, {{"t", kN}});
  ExpectConservedStep(w, second, {"job-b", "b"}, kN, 0, 90);
}

// A bucket registered again, then the first registration's end (its
// TensorSet freed late): the new registration stays; without the segment's
// name, Unregister ends whichever registration the bucket has.
TEST(DataPlaneTest, TheEndOfAnOlderRegistrationLeavesTheNewOne) {
  constexpr uint64_t kN = 100;
  Workers w(1, {.algorithm = "dense"});
  w.Start();
  std::string first, second;
  auto older = w.Register(0, {"job", "b"}, {{"t", kN}}, {}, {}, &first);
  ASSERT_TRUE(older.ok()) << older.status();
  auto newer = w.Register(0, {"job", "b"}, {{"t", kN}}, {}, {}, &second);
  ASSERT_TRUE(newer.ok()) << newer.status();
  ASSERT_TRUE(w.plane(0).Unregister({"job", "b"}, first).ok());
  EXPECT_TRUE(AllReduceAll(w, {.name = {"job", "b"}, .step = 0})[0].ok());
  ASSERT_TRUE(w.plane(0).Unregister({"job", "b"}, second).ok());
  EXPECT_TRUE(absl::IsNotFound(w.plane(0).Unregister({"job", "b"})));
}

// A job whose bucket one client stepped, registering from another client
// under the same members: a new trainer took over. Not before a step, not
// by the same client, and not in another job.
TEST(DataPlaneTest, AnotherClientRegisteringInASteppedJobTakesItOver) {
  constexpr uint64_t kN = 100;
  Workers w(1, {.algorithm = "dense"});
  w.Start();
  const BucketName name{"job", "b"};
  auto segment = w.Register(0, name, {{"t", kN}}, {}, {.id = "first"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_FALSE(w.plane(0).TakenOver(name, "second"));  // never stepped
  ASSERT_TRUE(AllReduceAll(w, {.name = name, .step = 0})[0].ok());
  EXPECT_TRUE(w.plane(0).TakenOver(name, "second"));
  EXPECT_FALSE(w.plane(0).TakenOver(name, "first"));
  EXPECT_FALSE(w.plane(0).TakenOver(name, ""));
  EXPECT_TRUE(w.plane(0).TakenOver({"job", "other"}, "second"));
  EXPECT_FALSE(w.plane(0).TakenOver({"another-job", "b"}, "second"));
  EXPECT_TRUE(w.plane(0).Stepped(name, "first"));
  EXPECT_FALSE(w.plane(0).Stepped(name, "second"));
  // The new trainer's takeover drops the old one's buckets.
  w.plane(0).UnregisterOthers(name, "second");
  EXPECT_TRUE(absl::IsNotFound(w.plane(0).Unregister(name)));
  EXPECT_FALSE(w.plane(0).TakenOver(name, "second"));
}

// A client that dies without Unregister lets go of its segment's lock: the
// worker forgets its buckets (their memory and residual). Buckets of live
// clients, and of clients that hold no lock (an older SDK), stay. Nobody
// waits on a bucket that never stepped, or whose next step no peer starts
// (the job ended); once a peer starts the next step of one that did, the
// trainer counts as absent at once, until a new client takes the job over.
TEST(DataPlaneTest, ABucketWhoseClientDiedIsForgotten) {
  constexpr uint64_t kN = 100;
  constexpr absl::Duration kLongJoin = absl::Hours(1);
  Workers w(2, {.algorithm = "dense"});
  w.Start();
  const BucketClient locked{.id = "c", .locks_segment = true};
  auto stepped = w.RegisterAll({"job", "a"}, {{"t", kN}}, locked);
  auto idle = w.RegisterAll({"job", "b"}, {{"t", kN}}, locked);
  auto unlocked = w.RegisterAll({"job", "c"}, {{"t", kN}});
  for (const auto& r : AllReduceAll(w, {.name = {"job", "a"}, .step = 0})) {
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_TRUE(w.plane(1).ForgetAbandoned().empty()) << "every client lives";

  stepped[1] = SharedSegment();  // rank 1's process exits
  idle[1] = SharedSegment();
  unlocked[1] = SharedSegment();
  std::vector<BucketName> gone = w.plane(1).ForgetAbandoned();
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_TRUE(absl::IsNotFound(w.plane(1).Unregister({"job", "a"})));
  EXPECT_TRUE(absl::IsNotFound(w.plane(1).Unregister({"job", "b"})));
  EXPECT_TRUE(w.plane(1).ForgetAbandoned().empty()) << "once only";
  EXPECT_TRUE(w.plane(1).Unregister({"job", "c"}).ok()) << "no lock: kept";
  EXPECT_EQ(w.plane(1).Absent(kLongJoin), std::nullopt) << "nobody started";

  std::thread peer([&] {
    const auto out = w.plane(0).AllReduce({.name = {"job", "a"}, .step = 1},
                                          absl::Now() + absl::Seconds(2));
    EXPECT_TRUE(absl::IsDeadlineExceeded(out.status())) << out.status();
  });
  std::optional<std::string> absent;
  for (int i = 0; i < 40 && !absent.has_value(); ++i) {
    absl::SleepFor(absl::Milliseconds(25));
    absent = w.plane(1).Absent(kLongJoin);
  }
  peer.join();
  ASSERT_TRUE(absent.has_value()) << "not the hour-long join timeout";
  EXPECT_THAT(*absent, ::testing::HasSubstr("step 1 of bucket 'a'"));
  EXPECT_THAT(*absent, ::testing::HasSubstr("exited without unregistering"));

  // A new client in the job takes over from the dead one (the daemon then
  // rejoins as a new member): nothing waits on the dead one any more.
  EXPECT_FALSE(w.plane(1).TakenOver({"job", "a"}, "c"));
  EXPECT_TRUE(w.plane(1).TakenOver({"job", "a"}, "successor"));
  w.plane(1).UnregisterOthers({"job", "a"}, "successor");
  EXPECT_FALSE(w.plane(1).TakenOver({"job", "a"}, "successor"));
  EXPECT_EQ(w.plane(1).Absent(kLongJoin), std::nullopt);
}

TEST(DataPlaneTest, BroadcastsFromTheRootAndBarriers) {
  constexpr uint64_t kN = 1000;
  Workers w(4);
  w.Start();
  auto segments = w.RegisterAll({"job", "params"}, {{"p", kN}});
  for (int r = 0; r < 4; ++r) {
    for (uint64_t i = 0; i < kN; ++i) Values(segments[r], kN)[i] = r * 1e4f + i;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      auto done =
          w.plane(r).Broadcast({"job", "params"}, 0, /*root=*/2, Soon());
      ASSERT_TRUE(done.ok()) << done.status();
      auto barrier = w.plane(r).Broadcast({"job", ""}, 1, 0, Soon());
      ASSERT_TRUE(barrier.ok()) << barrier.status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 4; ++r) {
    for (uint64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(Values(segments[r], kN)[i], 2e4f + i);
    }
  }
  EXPECT_TRUE(absl::IsInvalidArgument(
      w.plane(0).Broadcast({"job", "params"}, 2, 7, Soon()).status()));
}

TEST(DataPlaneTest, OperationIdsAreStableAndDistinct) {
  EXPECT_EQ(OperationId("allreduce", "j/b#1", 3),
            OperationId("allreduce", "j/b#1", 3));
  EXPECT_NE(OperationId("allreduce", "j/b#1", 3),
            OperationId("allreduce", "j/b#1", 4));
  EXPECT_NE(OperationId("allreduce", "j/b#1", 3),
            OperationId("allreduce", "j/b#2", 3));
  EXPECT_NE(OperationId("allreduce", "j/b#1", 3),
            OperationId("agree", "j/b#1", 3));
}

// A bucket registered again (a new process, or the same job run again)
// replaces the old registration: no residual carried over, and its steps
// start from 0 again without meeting the ids of the old one's failed steps.
TEST(DataPlaneTest, RegisteringAgainStartsOver) {
  constexpr uint64_t kN = 100;
  Workers w(2, {.algorithm = "spardl", .density = 0.1, .teams = 1});
  w.Start();
  auto old = w.RegisterAll({"job", "b"}, {{"t", kN}});
  for (int r = 0; r < 2; ++r) {
    auto g = RandomVector(kN, r);
    std::memcpy(Values(old[r], kN).data(), g.data(), kN * 4);
  }
  Values(old[1], kN)[3] = std::nanf("");  // step 0 fails everywhere
  for (const auto& result :
       AllReduceAll(w, {.name = {"job", "b"}, .step = 0})) {
    EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  }
  auto again = w.RegisterAll({"job", "b"}, {{"t", kN}});
  ExpectConservedStep(w, again, {"job", "b"}, kN, 0, 10);
}

// A result the client no longer waits for is not written into its memory.
TEST(DataPlaneTest, DoesNotWriteForAClientThatGaveUp) {
  constexpr uint64_t kN = 50;
  Workers w(1, {.algorithm = "dense", .density = 1.0, .teams = 1});
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  std::fill(Values(segments[0], kN).begin(), Values(segments[0], kN).end(),
            2.0f);
  auto result = w.plane(0).AllReduce(
      {.name = {"job", "b"}, .mean = true, .cancelled = [] { return true; }},
      Soon());
  EXPECT_TRUE(absl::IsCancelled(result.status())) << result.status();
  for (float v : Values(segments[0], kN)) EXPECT_EQ(v, 2.0f);
}

// A call that finds its bucket busy waits until its own deadline, not the
// earlier call's: rank 0's step 1 waits for a peer that never comes.
TEST(DataPlaneTest, WaitingForABusyBucketEndsAtTheCallersDeadline) {
  constexpr uint64_t kN = 50;
  Workers w(2);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  std::thread stuck([&] {
    auto r = w.plane(0).AllReduce({.name = {"job", "b"}, .step = 1},
                                  absl::Now() + absl::Seconds(4));
    EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  auto second = w.plane(0).AllReduce({.name = {"job", "b"}, .step = 2},
                                     start + absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(second.status())) << second.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  stuck.join();
}

// A worker that refuses a step before its agreement (the new plan can't run
// on it) counts as absent once its peers have waited for it the step-join
// timeout, so that it steps out instead of leaving them to their operation
// timeout. Before, the watch looked at the step after, which nobody ran.
TEST(DataPlaneTest, AStepRefusedBeforeItsAgreementIsWatched) {
  constexpr uint64_t kN = 50;
  constexpr absl::Duration kJoin = absl::Milliseconds(100);
  Workers w(2);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  for (const auto& result : AllReduceAll(w, {.name = {"job", "b"}})) {
    ASSERT_TRUE(result.ok()) << result.status();
  }
  w.PlanFails(0, absl::InvalidArgumentError("fusion 'x' is unknown"));
  ViewInfo plan_change = w.View(2, {0, 1});
  plan_change.start_step = 1;
  for (int r = 0; r < 2; ++r) w.Install(r, plan_change);
  absl::SleepFor(2 * kJoin);
  EXPECT_EQ(w.plane(0).Absent(kJoin), std::nullopt);  // nobody started 1
  std::thread peer([&] {
    auto result = w.plane(1).AllReduce({.name = {"job", "b"}, .step = 1},
                                       absl::Now() + absl::Seconds(3));
    EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  });
  auto refused =
      w.plane(0).AllReduce({.name = {"job", "b"}, .step = 1}, Soon());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  std::optional<std::string> absent;
  for (int i = 0; i < 40 && !absent.has_value(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    absent = w.plane(0).Absent(kJoin);
  }
  ASSERT_TRUE(absent.has_value());
  EXPECT_THAT(*absent, ::testing::HasSubstr("step 1 of bucket 'b'"));
  EXPECT_THAT(*absent, ::testing::HasSubstr("this worker had refused it"));
  peer.join();
}

// A client that gives up after its worker started the step makes every
// member vote the step down: nobody applies it (before, its peers did and
// its own trainer did not), and every gradient is carried by the next step.
TEST(DataPlaneTest, AClientThatGivesUpMidStepStopsTheStepEverywhere) {
  constexpr uint64_t kN = 300;
  Workers w(3);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  const auto pushed = WriteGradients(segments, kN, 40);
  std::vector<absl::StatusOr<ReduceResult>> out(3, absl::UnknownError(""));
  std::vector<std::thread> threads;
  // Rank 1 starts alone (its client is there when its worker checks) and
  // waits for its peers in the agreement; its client gives up meanwhile,
  // and only then do the peers start: the give-up lands before the vote.
  std::atomic<bool> started{false}, gone{false};
  threads.emplace_back([&] {
    out[1] = w.plane(1).AllReduce({.name = {"job", "b"},
                                   .step = 1,
                                   .sparse = true,
                                   .cancelled =
                                       [&] {
                                         started = true;
                                         return gone.load();
                                       }},
                                  Soon());
  });
  while (!started) absl::SleepFor(absl::Milliseconds(1));
  gone = true;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      out[r] = w.plane(r).AllReduce(
          {.name = {"job", "b"}, .step = 1, .sparse = true}, Soon());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsAborted(out[r].status()))
        << r << ": " << out[r].status();
    EXPECT_THAT(std::string(out[r].status().message()),
                ::testing::HasSubstr("rank 1 voted no"));
  }
  ExpectConservedStep(w, segments, {"job", "b"}, kN, 2, 50, pushed);
}

// Membership changes while a step waits: the worker that learns it first
// does not give up but runs the step again on the new view, where the
// survivor that had not started it yet meets it (before, that one waited
// out its deadline for a peer that had moved on).
TEST(DataPlaneTest, AStepCutByAViewChangeRunsAgainOnTheNewView) {
  constexpr uint64_t kN = 300;
  Workers w(3);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  const auto pushed = WriteGradients(segments, kN, 60);
  std::vector<absl::StatusOr<ReduceResult>> out(2, absl::UnknownError(""));
  const absl::Time start = absl::Now();
  // Worker 2 is gone: worker 0 waits on it in epoch 1.
  std::thread first([&] {
    out[0] = w.plane(0).AllReduce({.name = {"job", "b"},
                                   .step = 1,
                                   .sparse = true,
                                   .return_residual = true},
                                  Soon());
  });
  absl::SleepFor(absl::Milliseconds(100));
  const ViewInfo survivors = w.View(2, {0, 1});
  w.Install(0, survivors);
  absl::SleepFor(absl::Milliseconds(200));
  w.Install(1, survivors);
  out[1] = w.plane(1).AllReduce({.name = {"job", "b"},
                                 .step = 1,
                                 .sparse = true,
                                 .return_residual = true},
                                Soon());
  first.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out[r].ok()) << r << ": " << out[r].status();
    EXPECT_EQ(out[r]->epoch, 2u);
    EXPECT_EQ(out[r]->world_size, 2);
  }
  // Nothing lost on the way: the survivors' inputs are the result plus
  // their residuals.
  const testing::MassBalance balance(
      {pushed[0], pushed[1]},
      std::vector<std::vector<float>>(2, std::vector<float>(kN, 0)));
  EXPECT_TRUE(
      balance.Holds(Sparse(segments[0], kN, out[0]->nonzeros),
                    {Residual(segments[0], kN), Residual(segments[1], kN)}));
  EXPECT_EQ(Sparse(segments[0], kN, out[0]->nonzeros).values,
            Sparse(segments[1], kN, out[1]->nonzeros).values);
}

// Worker 3 of 4 (SparDL, d = 2) dies in a phase of a step: from its
// `GetParam().message`-th message of the step on, it sends nothing and
// answers no one. Its sends in a step, in order: the step's agreement (3),
// SRS, R-SAG and Bruck (one round each: teams of 2), then its vote (2
// rounds). The survivors get the view without it (d = 1), as the
// coordinator publishes it after the heartbeat timeout. Before its vote is
// out, they run the step again there: OK on every survivor, on the new epoch,
// with identical results, and nothing lost (their inputs = result +
// residuals). Once its vote is out, a survivor may have applied the step; then
// the others learn it and apply it too (all four inputs = result + all four
// residuals). Either way the survivors agree. (A victim that heard every vote
// may apply the step while the survivors run it again: it is out of the view
// by then, and its trainer must take the parameters again when it rejoins.)
struct DeathPoint {
  std::string phase;
  int message;  // worker 3's sends of the step before it dies
  enum Outcome {
    kVictimFails,  // before its vote: the survivors run the step again
    kRerun,        // its vote reached no one: likewise, whatever it does
    kEither,       // its vote is out: the survivors rerun or apply, together
  } outcome;
  // What the first message it does not send is: its tag's step, and its
  // size (0: any), so that the test checks it dies where it says.
  uint32_t step;
  size_t bytes;
  friend void PrintTo(const DeathPoint& p, std::ostream* os) {
    *os << p.phase << " (after " << p.message << " messages)";
  }
};
class WorkerDiesInPhaseTest : public ::testing::TestWithParam<DeathPoint> {};

TEST_P(WorkerDiesInPhaseTest, SurvivorsRunTheStepAgainWithoutIt) {
  constexpr uint64_t kN = 400;
  constexpr int kVictim = 3;
  Workers w(4, {.algorithm = "spardl", .density = 0.1, .teams = 2});
  std::atomic<bool> armed = false;
  std::atomic<int> sent = 0;
  absl::Notification dead;
  uint32_t died_at_step = 0;  // written before `dead` is notified
  size_t died_at_bytes = 0;
  w.DropSendsIf(kVictim,
                [&](int, const transport::Tag& tag, absl::string_view payload) {
                  if (!armed) return false;
                  if (sent++ < GetParam().message) return false;
                  if (!dead.HasBeenNotified()) {
                    died_at_step = tag.step;
                    died_at_bytes = payload.size();
                    dead.Notify();
                  }
                  return true;
                });
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  const auto pushed = WriteGradients(segments, kN, 70);
  armed = true;
  std::vector<absl::StatusOr<ReduceResult>> out(4, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      const absl::Time deadline = r == kVictim
                                      ? absl::Now() + absl::Seconds(1)
                                      : absl::Now() + absl::Seconds(15);
      out[r] = w.plane(r).AllReduce({.name = {"job", "b"},
                                     .step = 1,
                                     .sparse = true,
                                     .return_residual = true},
                                    deadline);
    });
  }
  const bool died = dead.WaitForNotificationWithTimeout(absl::Seconds(10));
  w.Unreachable(kVictim);
  absl::SleepFor(absl::Milliseconds(100));
  ViewInfo survivors = w.View(2, {0, 1, 2});
  survivors.plan.teams = 1;
  for (int r = 0; r < 3; ++r) w.Install(r, survivors);
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(died);
  EXPECT_EQ(died_at_step, GetParam().step);
  if (GetParam().bytes > 0) {
    EXPECT_EQ(died_at_bytes, GetParam().bytes);
  }
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  const uint64_t epoch = out[0]->epoch;
  if (GetParam().outcome == DeathPoint::kVictimFails) {
    EXPECT_FALSE(out[kVictim].ok());
  }
  if (GetParam().outcome != DeathPoint::kEither) {
    EXPECT_EQ(epoch, 2u);
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].ok()) << r << ": " << out[r].status();
    EXPECT_EQ(out[r]->epoch, epoch);
    EXPECT_EQ(out[r]->world_size, epoch == 2 ? 3 : 4);
    EXPECT_EQ(Sparse(segments[r], kN, out[r]->nonzeros).values,
              Sparse(segments[0], kN, out[0]->nonzeros).values);
  }
  const int applied = epoch == 2 ? 3 : 4;  // whose inputs the step holds
  const testing::MassBalance balance(
      std::vector<std::vector<float>>(pushed.begin(), pushed.begin() + applied),
      std::vector<std::vector<float>>(applied, std::vector<float>(kN, 0)));
  std::vector<std::vector<float>> residuals;
  for (int r = 0; r < applied; ++r)
    residuals.push_back(Residual(segments[r], kN));
  EXPECT_TRUE(
      balance.Holds(Sparse(segments[0], kN, out[0]->nonzeros), residuals));
}

INSTANTIATE_TEST_SUITE_P(
    Phases, WorkerDiesInPhaseTest,
    // Agreement records are 40 bytes, votes 9; the schedule's phases
    // number their rounds from 0, 4096 and 8192.
    ::testing::Values(DeathPoint{"agreement", 0, DeathPoint::kVictimFails, 0,
                                 sizeof(StepRecord)},
                      DeathPoint{"srs", 3, DeathPoint::kVictimFails, 0, 0},
                      DeathPoint{"sag", 4, DeathPoint::kVictimFails, 4096, 0},
                      DeathPoint{"bruck", 5, DeathPoint::kVictimFails, 8192, 0},
                      DeathPoint{"vote", 6, DeathPoint::kRerun, 0, 9},
                      DeathPoint{"vote_round_2", 7, DeathPoint::kEither, 1, 9}),
    [](const auto& p) { return p.param.phase; });

// A yes vote: "y" and the result's 8-byte hash (agreement records are 40
// bytes).
bool IsVote(int, const transport::Tag&, absl::string_view payload) {
  return payload.size() == 9 && payload[0] == 'y';
}

// Worker 1 misses worker 0's vote; worker 0 heard every vote and applied the
// step. Worker 1, in doubt, asks worker 0 and applies it too.
TEST(DataPlaneTest, AWorkerInDoubtAppliesTheStepItsPeerApplied) {
  constexpr uint64_t kN = 300;
  Workers w(2);
  w.DropSendsIf(0, IsVote);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  const auto pushed = WriteGradients(segments, kN, 70);
  const testing::MassBalance balance(
      pushed, std::vector<std::vector<float>>(2, std::vector<float>(kN, 0)));
  std::vector<absl::StatusOr<ReduceResult>> out(2, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      out[r] = w.plane(r).AllReduce({.name = {"job", "b"},
                                     .step = 1,
                                     .sparse = true,
                                     .return_residual = true},
                                    absl::Now() + absl::Seconds(1));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out[r].ok()) << r << ": " << out[r].status();
  }
  EXPECT_EQ(Sparse(segments[0], kN, out[0]->nonzeros).values,
            Sparse(segments[1], kN, out[1]->nonzeros).values);
  EXPECT_TRUE(
      balance.Holds(Sparse(segments[0], kN, out[0]->nonzeros),
                    {Residual(segments[0], kN), Residual(segments[1], kN)}));
}

// Worker 1 misses worker 0's vote and is still in doubt at its deadline,
// when its client gives up; it then learns that worker 0 applied the step.
// Its trainer never gets the result (its call ended at the deadline), so
// its replica missed a step the others applied. From then on every member
// refuses the bucket's steps at once with DataLoss (gradients kept), naming
// the replica behind, until a Broadcast from a whole replica; a Broadcast
// from the one behind is refused too. The mark is the job's: a Broadcast of
// the parameters' bucket clears it for the gradients' bucket.
TEST(DataPlaneTest, AStepAppliedAfterTheClientGaveUpIsReportedNextTime) {
  constexpr uint64_t kN = 300;
  Workers w(2);
  w.DropSendsIf(0, IsVote);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  // The parameters go through a bucket of their own, as in Python.
  auto params = w.RegisterAll({"job", "params"}, {{"w", kN}});
  WriteGradients(segments, kN, 70);
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  std::vector<absl::StatusOr<ReduceResult>> out(2, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      out[r] = w.plane(r).AllReduce(
          {.name = {"job", "b"},
           .step = 1,
           .sparse = true,
           .cancelled = [deadline] { return absl::Now() > deadline; }},
          deadline);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  ASSERT_FALSE(out[1].ok());  // its client had given up
  // Votes flow again from the next view's transports.
  w.DropSendsIf(
      0, [](int, const transport::Tag&, absl::string_view) { return false; });
  w.Install(0, w.View(2, {0, 1}));
  w.Install(1, w.View(2, {0, 1}));

  // On every member, at once: rank 1 is behind.
  std::vector<std::vector<float>> before;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.plane(r).SaveResidual({"job", "b"}, Soon()).ok());
    before.push_back(Residual(segments[r], kN));
  }
  const auto gradients = WriteGradients(segments, kN, 71);
  const absl::Time start = absl::Now();
  for (const auto& r :
       AllReduceAllUntil(w, {.name = {"job", "b"}, .step = 2}, Soon())) {
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
    EXPECT_THAT(r.status().message(),
                ::testing::HasSubstr("rank 1's replica is behind"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.plane(r).SaveResidual({"job", "b"}, Soon()).ok());
    const std::vector<float> kept = Residual(segments[r], kN);
    for (uint64_t i = 0; i < kN; ++i) {
      ASSERT_FLOAT_EQ(kept[i], before[r][i] + gradients[r][i]) << r << i;
    }
  }

  // A Broadcast from the replica behind is refused; from a whole one it
  // brings the parameters, and steps run again.
  uint64_t sequence = 0;
  for (int root : {1, 0}) {
    std::vector<absl::StatusOr<Membership>> synced(2, absl::UnknownError(""));
    threads.clear();
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        synced[r] =
            w.plane(r).Broadcast({"job", "params"}, sequence, root, Soon());
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(synced[r].ok(), root == 0) << synced[r].status();
      if (root == 1) {
        EXPECT_TRUE(absl::IsDataLoss(synced[r].status()));
      }
    }
    ++sequence;
  }
  for (const auto& r :
       AllReduceAllUntil(w, {.name = {"job", "b"}, .step = 3}, Soon())) {
    EXPECT_TRUE(r.ok()) << r.status();
  }
}

// Worker 2 is out of the group for a step (its link was cut, say) and
// comes back as the same process: its replica lacks the step the others
// applied. Its first step back fails with DataLoss on every member, naming
// it and a whole rank (before: it ran, and the replicas differed for good);
// a Broadcast from the whole rank clears it, and steps run again.
TEST(DataPlaneTest, AMemberBackFromOutsideTheGroupMustTakeTheParameters) {
  constexpr uint64_t kN = 300;
  Workers w(3);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  auto params = w.RegisterAll({"job", "params"}, {{"w", kN}});
  WriteGradients(segments, kN, 80);
  for (const auto& r : AllReduceAll(w, {.name = {"job", "b"}, .step = 0})) {
    ASSERT_TRUE(r.ok()) << r.status();
  }
  for (int r = 0; r < 3; ++r) w.Install(r, w.View(2, {0, 1}));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const auto out =
          w.plane(r).AllReduce({.name = {"job", "b"}, .step = 1}, Soon());
      EXPECT_TRUE(out.ok()) << out.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) w.Install(r, w.View(3, {0, 1, 2}));

  for (const auto& r : AllReduceAll(w, {.name = {"job", "b"}, .step = 2})) {
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
    EXPECT_THAT(r.status().message(),
                ::testing::HasSubstr("rank 2's replica differs"));
    EXPECT_THAT(r.status().message(),
                ::testing::HasSubstr("replica is whole (rank 0)"));
  }
  threads.clear();
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const auto synced =
          w.plane(r).Broadcast({"job", "params"}, 0, /*root=*/0, Soon());
      EXPECT_TRUE(synced.ok()) << synced.status();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : AllReduceAll(w, {.name = {"job", "b"}, .step = 3})) {
    EXPECT_TRUE(r.ok()) << r.status();
  }
}

// Alone in its group, a worker whose client gave up after its yes vote
// holds a replica behind with no whole one to take the parameters from: a
// Broadcast from itself makes it whole again (with none whole, any root
// does), and steps run again.
TEST(DataPlaneTest, WithNoReplicaWholeABroadcastFromAnyRootClearsIt) {
  constexpr uint64_t kN = 300;
  Workers w(1);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  WriteGradients(segments, kN, 60);
  // Yes at the vote, gone when the result is written: the worker looks
  // when it takes the bucket, at the vote, and before writing the result.
  auto asked = std::make_shared<int>(0);
  const absl::StatusOr<ReduceResult> gave_up =
      w.plane(0).AllReduce({.name = {"job", "b"},
                            .step = 1,
                            .cancelled = [asked] { return ++*asked > 2; }},
                           Soon());
  ASSERT_TRUE(absl::IsCancelled(gave_up.status())) << gave_up.status();
  EXPECT_TRUE(
      absl::IsDataLoss(w.plane(0)
                           .AllReduce({.name = {"job", "b"}, .step = 2}, Soon())
                           .status()));
  ASSERT_TRUE(w.plane(0).Broadcast({"job", "b"}, 0, /*root=*/0, Soon()).ok());
  const absl::StatusOr<ReduceResult> after =
      w.plane(0).AllReduce({.name = {"job", "b"}, .step = 3}, Soon());
  EXPECT_TRUE(after.ok()) << after.status();
}

// Both workers miss the other's vote: both in doubt, neither applied it, so
// both give the step up, and the next step carries every gradient.
TEST(DataPlaneTest, WorkersAllInDoubtGiveTheStepUpTogether) {
  constexpr uint64_t kN = 300;
  Workers w(2);
  w.DropSendsIf(0, IsVote);
  w.DropSendsIf(1, IsVote);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  const auto pushed = WriteGradients(segments, kN, 80);
  for (const auto& r : AllReduceAllUntil(w, {.name = {"job", "b"}, .step = 1},
                                         absl::Now() + absl::Seconds(1))) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  }
  w.DropSendsIf(
      0, [](int, const transport::Tag&, absl::string_view) { return false; });
  w.DropSendsIf(
      1, [](int, const transport::Tag&, absl::string_view) { return false; });
  w.Install(0, w.View(2, {0, 1}));
  w.Install(1, w.View(2, {0, 1}));
  ExpectConservedStep(w, segments, {"job", "b"}, kN, 2, 90, pushed);
}

// Three workers; worker 2 misses worker 0's vote (dropped on the way to it,
// relayed or not): worker 2, in doubt, asks both others at once and applies
// the step they applied.
TEST(DataPlaneTest, InDoubtAmongThreeFollowsThePeersThatApplied) {
  constexpr uint64_t kN = 300;
  Workers w(3);
  w.DropSendsIf(
      0, [](int peer, const transport::Tag& tag, absl::string_view payload) {
        return peer == 2 && IsVote(peer, tag, payload);
      });
  w.DropSendsIf(
      1, [](int peer, const transport::Tag& tag, absl::string_view payload) {
        return peer == 2 && IsVote(peer, tag, payload);  // relays too
      });
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  WriteGradients(segments, kN, 100);
  const auto out =
      AllReduceAllUntil(w, {.name = {"job", "b"}, .step = 1, .sparse = true},
                        absl::Now() + absl::Seconds(2));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].ok()) << r << ": " << out[r].status();
    EXPECT_EQ(Sparse(segments[r], kN, out[r]->nonzeros).values,
              Sparse(segments[0], kN, out[0]->nonzeros).values);
  }
}

// A worker in doubt whose peer can't be asked, and is still a member, does
// not guess: past its deadline and the grace it answers DataLoss.
TEST(DataPlaneTest, InDoubtWithAnUnreachableMemberSaysItDoesNotKnow) {
  constexpr uint64_t kN = 300;
  Workers w(2);
  w.DropSendsIf(0, IsVote);
  w.Unreachable(0);
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  WriteGradients(segments, kN, 110);
  const auto out = AllReduceAllUntil(w, {.name = {"job", "b"}, .step = 1},
                                     absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(out[0].ok()) << out[0].status();  // it heard every vote
  EXPECT_TRUE(absl::IsDataLoss(out[1].status())) << out[1].status();
}

// Faults on worker 1's messages of the schedule (not the 40-byte agreement
// records or the 9-byte votes), during one step of three workers.
enum class MessageFault { kDuplicate, kDelay, kTruncate, kCorrupt };

class MessageFaultTest : public ::testing::TestWithParam<MessageFault> {};

TEST_P(MessageFaultTest, EndsInTheSameResultEverywhereOrAnErrorEverywhere) {
  constexpr uint64_t kN = 3000;
  const MessageFault fault = GetParam();
  Workers w(3);
  std::atomic<bool> on{true};
  w.Faults(1, [&, fault](transport::FaultInjectingTransport& t) {
    if (fault == MessageFault::kDelay) {
      t.DelaySends(absl::Milliseconds(30));
      return;
    }
    t.MangleSends([&, fault](int, const transport::Tag&, std::string p) {
      std::vector<std::string> out;
      if (on && p.size() > sizeof(StepRecord)) {  // not agreement, votes
        if (fault == MessageFault::kDuplicate) out.push_back(p);
        if (fault == MessageFault::kTruncate) p.resize(p.size() / 2);
        if (fault == MessageFault::kCorrupt) p.back() ^= 0x40;
      }
      out.push_back(std::move(p));
      return out;
    });
  });
  w.Start();
  auto segments = w.RegisterAll({"job", "b"}, {{"t", kN}});
  const auto pushed = WriteGradients(segments, kN, 120);
  const absl::Time start = absl::Now();
  const auto out = AllReduceAllUntil(w,
                                     {.name = {"job", "b"},
                                      .step = 1,
                                      .sparse = true,
                                      .return_residual = true},
                                     absl::Now() + absl::Seconds(2));
  // No hang: the deadline, and the grace of a worker in doubt, at most.
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  const bool applied = out[0].ok();
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(out[r].ok(), applied) << r << ": " << out[r].status();
    if (applied) {
      EXPECT_EQ(Sparse(segments[r], kN, out[r]->nonzeros).values,
                Sparse(segments[0], kN, out[0]->nonzeros).values);
    }
  }
  if (fault == MessageFault::kDuplicate || fault == MessageFault::kDelay) {
    ASSERT_TRUE(applied);
    const testing::MassBalance balance(
        pushed, std::vector<std::vector<float>>(3, std::vector<float>(kN, 0)));
    EXPECT_TRUE(
        balance.Holds(Sparse(segments[0], kN, out[0]->nonzeros),
                      {Residual(segments[0], kN), Residual(segments[1], kN),
                       Residual(segments[2], kN)}));
    return;
  }
  // A block cut short decodes as a smaller one and a flipped value bit as
  // another value (here one that is not finite, which decoding refuses):
  // either way the members' results differ or the step fails, and the vote
  // refuses it everywhere, every gradient kept for the next step. (A
  // corrupted value that leaves the result the same goes unseen: the wire
  // relies on TCP's and TLS's checksums for the bytes.)
  EXPECT_FALSE(applied);
  if (fault == MessageFault::kTruncate) {
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(absl::IsAborted(out[r].status())) << out[r].status();
      EXPECT_THAT(std::string(out[r].status().message()),
                  ::testing::HasSubstr("result differs"));
    }
  }
  on = false;
  ExpectConservedStep(w, segments, {"job", "b"}, kN, 2, 130, pushed);
}

std::string FaultName(const ::testing::TestParamInfo<MessageFault>& info) {
  switch (info.param) {
    case MessageFault::kDuplicate:
      return "Duplicated";
    case MessageFault::kDelay:
      return "Delayed";
    case MessageFault::kTruncate:
      return "Truncated";
    case MessageFault::kCorrupt:
      return "Corrupted";
  }
  return "Unknown";
}

INSTANTIATE_TEST_SUITE_P(Faults, MessageFaultTest,
                         ::testing::Values(MessageFault::kDuplicate,
                                           MessageFault::kDelay,
                                           MessageFault::kTruncate,
                                           MessageFault::kCorrupt),
                         FaultName);

// Asked about a registration it does not hold (it restarted, or never had
// it), a worker knows nothing and promises nothing: the asker keeps asking.
TEST(DataPlaneTest, DecidePromisesNothingForARegistrationItDoesNotHold) {
  Workers w(2);
  w.Start();
  w.RegisterAll({"job", "b"}, {{"t", 100}});
  EXPECT_EQ(w.plane(0).Decide({.bucket_id = 12345, .step = 1, .epoch = 1}),
            Outcome::kInDoubt);
}

}  // namespace
}  // namespace gradmesh::daemon
