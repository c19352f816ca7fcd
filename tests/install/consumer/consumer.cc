// Connects to the worker named by GRADMESH_WORKER; with none it must say so.
#include <cstdio>

#include "gradmesh/client.h"

int main() {
  auto client = gradmesh::Client::Connect({.timeout = absl::Seconds(2)});
  std::printf("%s\n",
              client.ok() ? "connected" : client.status().ToString().c_str());
  return client.ok() ? 0 : 1;
}
