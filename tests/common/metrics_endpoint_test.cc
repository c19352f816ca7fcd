#include "common/metrics/metrics_endpoint.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "tests/support/scrape.h"

namespace gradmesh {
namespace {

using ::gradmesh::testing::Scrape;

bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected =
      connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return connected;
}

TEST(MetricsEndpointTest, ServesRefreshedAndStopsServingWhenDestroyed) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Counter& scrapes = prometheus::BuildCounter()
                                     .Name("test_refreshes_total")
                                     .Register(*registry)
                                     .Add({});
  std::atomic<int> refreshes = 0;
  auto endpoint = MetricsEndpoint::Start("0.0.0.0:0", registry, [&] {
    ++refreshes;
    scrapes.Increment();
  });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);
  EXPECT_NE(Scrape(port).find("test_refreshes_total 1"), std::string::npos);
  EXPECT_NE(Scrape(port).find("test_refreshes_total 2"), std::string::npos);
  EXPECT_EQ(refreshes.load(), 2);
  // The connections that wake the server as it stops are not scrapes.
  endpoint->reset();
  EXPECT_EQ(refreshes.load(), 2);
  EXPECT_FALSE(Accepts(port));
}

TEST(MetricsEndpointTest, AnOccupiedPortIsUnavailable) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsEndpoint::Start("127.0.0.1:0", registry, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsEndpoint::Start(
      absl::StrCat("127.0.0.1:", (*first)->port()), registry, nullptr);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace gradmesh
