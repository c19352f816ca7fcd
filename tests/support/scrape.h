// Scrape: GET http://127.0.0.1:port/metrics with curl (which
// scripts/setup.sh installs), bounded to 10 s and past any proxy; the body,
// or "" when it fails.
#ifndef GRADMESH_TESTS_SUPPORT_SCRAPE_H_
#define GRADMESH_TESTS_SUPPORT_SCRAPE_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace gradmesh::testing {

inline std::string Scrape(int port) {
  const std::string command = absl::StrCat(
      "curl -sf --noproxy '*' --max-time 10 http://127.0.0.1:", port,
      "/metrics");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string body;
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    body.append(buffer, got);
  }
  pclose(pipe);
  return body;
}

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_SCRAPE_H_
