#include "worker/daemon/trainer_watch.h"

#include <atomic>
#include <string>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::daemon {
namespace {

using ::testing::HasSubstr;

// Hooks that count what the watch does; `absent` says so once `gone` is
// set.
struct Recorder {
  std::atomic<bool> gone{false};
  std::atomic<int> asked{0};
  std::atomic<int> stepped_out{0};
  std::atomic<int> rejoined{0};
  absl::Notification out;

  TrainerWatch::Hooks Hooks() {
    return {.absent = [this]() -> std::optional<std::string> {
              ++asked;
              if (!gone) return std::nullopt;
              return "its peers started step 3 of bucket 'g'";
            },
            .step_out =
                [this] {
                  ++stepped_out;
                  gone = false;  // out of the group: nobody waits on it
                  out.Notify();
                },
            .rejoin = [this] { ++rejoined; },
            .log = [](const std::string&) {}};
  }
};

TEST(TrainerWatchTest, StepsOutOnceAndTheNextCallRejoinsAndSaysWhy) {
  Recorder recorder;
  TrainerWatch watch(absl::Milliseconds(40), recorder.Hooks());
  EXPECT_TRUE(watch.BeforeCall(/*step=*/true).ok());
  recorder.gone = true;
  ASSERT_TRUE(recorder.out.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(recorder.stepped_out, 1);
  EXPECT_EQ(recorder.rejoined, 0);

  const absl::Status back = watch.BeforeCall(/*step=*/true);
  EXPECT_TRUE(absl::IsFailedPrecondition(back)) << back;
  EXPECT_THAT(back.message(), HasSubstr("started step 3 of bucket 'g'"));
  EXPECT_THAT(back.message(), HasSubstr("register every bucket again"));
  EXPECT_EQ(recorder.rejoined, 1);
  // Back in: calls go through, and nothing else happened.
  EXPECT_TRUE(watch.BeforeCall(/*step=*/true).ok());
  watch.Stop();
  EXPECT_EQ(recorder.stepped_out, 1);
  EXPECT_EQ(recorder.rejoined, 1);
}

TEST(TrainerWatchTest, ARegistrationAfterAStepOutRejoinsAndGoesOn) {
  Recorder recorder;
  TrainerWatch watch(absl::Milliseconds(40), recorder.Hooks());
  recorder.gone = true;
  ASSERT_TRUE(recorder.out.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(watch.BeforeCall(/*step=*/false).ok());
  EXPECT_EQ(recorder.rejoined, 1);
  EXPECT_TRUE(watch.BeforeCall(/*step=*/true).ok());
}

TEST(TrainerWatchTest, ANewTrainerRejoinsAtOnceAndClearsAStepOut) {
  Recorder recorder;
  TrainerWatch watch(absl::Milliseconds(40), recorder.Hooks());
  watch.NewTrainer("a new client registers bucket 'g'");
  EXPECT_EQ(recorder.rejoined, 1);
  EXPECT_EQ(recorder.stepped_out, 0);
  recorder.gone = true;
  ASSERT_TRUE(recorder.out.WaitForNotificationWithTimeout(absl::Seconds(10)));
  watch.NewTrainer("a new client registers bucket 'g'");
  EXPECT_EQ(recorder.rejoined, 2);
  // The step-out is over: the next call goes through.
  EXPECT_TRUE(watch.BeforeCall(/*step=*/true).ok());
  EXPECT_EQ(recorder.rejoined, 2);
}

TEST(TrainerWatchTest, AZeroTimeoutWatchesNothing) {
  Recorder recorder;
  recorder.gone = true;
  TrainerWatch watch(absl::ZeroDuration(), recorder.Hooks());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(watch.BeforeCall(/*step=*/true).ok());
  EXPECT_EQ(recorder.asked, 0);
  EXPECT_EQ(recorder.stepped_out, 0);
}

}  // namespace
}  // namespace gradmesh::daemon
