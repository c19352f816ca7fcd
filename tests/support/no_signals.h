// NoSignals: a signalfd that never fires (nothing is blocked or sent), for
// the launcher's parts that poll one for SIGINT and SIGTERM.
#ifndef GRADMESH_TESTS_SUPPORT_NO_SIGNALS_H_
#define GRADMESH_TESTS_SUPPORT_NO_SIGNALS_H_

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace gradmesh::testing {

class NoSignals {
 public:
  NoSignals() {
    sigset_t none;
    sigemptyset(&none);
    fd_ = signalfd(-1, &none, SFD_NONBLOCK | SFD_CLOEXEC);
  }
  ~NoSignals() { close(fd_); }
  NoSignals(const NoSignals&) = delete;
  NoSignals& operator=(const NoSignals&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_NO_SIGNALS_H_
