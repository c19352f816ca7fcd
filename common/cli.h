// Command-line parsing shared by the gradmesh binaries.
//
// Flags are absl flags. Their names take '-' or '_' alike (--chunk-bytes ==
// --chunk_bytes), and every flag not given on the command line may come from
// the environment as <env_prefix><NAME> (GRADMESH_WORKER_CHUNK_BYTES=...),
// which is how Kubernetes passes configuration. The command line wins.
//
//   int main(int argc, char** argv) {
//     const auto args = gradmesh::ParseFlags(argc, argv, "GRADMESH_WORKER_");
#ifndef GRADMESH_COMMON_CLI_H_
#define GRADMESH_COMMON_CLI_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace gradmesh {

// What --help prints for a program or for one command of it.
struct FlagsHelp {
  // The first lines; empty: absl::ProgramUsageMessage().
  std::string usage;
  // The flags listed, by name; empty: every flag the program defines
  // (Abseil's own aside).
  std::vector<std::string> flags;
};

// Parses, exits with status 2 on a bad flag or environment value (one line
// on stderr), and returns the positional arguments, argv[0] first. --help or
// -h (or Abseil's --helpfull and the like; before any "--") prints `help` on
// stdout, every flag spelled with dashes with its default and its text, and
// exits 0.
std::vector<std::string> ParseFlags(int argc, char** argv,
                                    absl::string_view env_prefix,
                                    const FlagsHelp& help = {});

// For daemons: blocks SIGTERM and SIGINT in this thread (call before starting
// any thread, so that every thread inherits the mask), and later waits for
// one of them. Returns the signal.
void BlockTerminationSignals();
int AwaitTerminationSignal();

// For processes that move large messages: keeps freed buffers in the heap
// instead of returning them to the kernel, so that the next message of the
// same size reuses warm pages (fresh pages cost a fault and a clear each,
// which dominated the transport's profile).
void KeepLargeBuffersWarm();

// Ends a process that used gRPC, after its orderly shutdown: flushes stdio
// and exits without static destructors. gRPC 1.51 tears its callback
// completion queue down from static destructors while its own thread may
// still use it, which can double-free at exit.
[[noreturn]] void ExitAfterShutdown(int code);

// One log line on stderr: "<local time> <who> <context>: <message>".
void LogLine(absl::string_view who, absl::string_view context,
             absl::string_view message);

// A server started on port 0 tells its launcher where it listens through a
// port file: one line "<address> <metrics port>", written atomically (a
// temporary file renamed into place), so a reader never sees half of it.
bool WritePortFile(const std::string& path, const std::string& address,
                   int metrics_port);

struct PortFile {
  std::string address;
  int metrics_port = 0;
};
// Empty address when the file is absent or incomplete.
PortFile ReadPortFile(const std::string& path);

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_CLI_H_
