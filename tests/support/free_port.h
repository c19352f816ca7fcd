// FreePort: a TCP port free now on every interface (bound, read, released),
// for a test's own server.
#ifndef GRADMESH_TESTS_SUPPORT_FREE_PORT_H_
#define GRADMESH_TESTS_SUPPORT_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace gradmesh::testing {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = {.sin_family = AF_INET};
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_FREE_PORT_H_
