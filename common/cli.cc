#include "common/cli.h"

#include <malloc.h>
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradmesh {

namespace {

// `text` broken into lines of at most `width` characters, each indented.
std::string Wrap(absl::string_view text, int indent, size_t width) {
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty())
    absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
  return out;
}

[[noreturn]] void PrintHelpAndExit(const FlagsHelp& help,
                                   absl::string_view env_prefix) {
  std::vector<absl::CommandLineFlag*> flags;
  if (help.flags.empty()) {
    for (const auto& [name, flag] : absl::GetAllFlags()) {
      if (!absl::StrContains(flag->Filename(), "absl/")) flags.push_back(flag);
    }
  } else {
    for (const std::string& name : help.flags) {
      absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag == nullptr) {
        std::fprintf(stderr, "--help names an unknown flag '%s'\n",
                     name.c_str());
        std::abort();
      }
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](auto* a, auto* b) { return a->Name() < b->Name(); });
  std::string out(help.usage.empty() ? absl::ProgramUsageMessage()
                                     : absl::string_view(help.usage));
  absl::StrAppend(&out,
                  "\n\nflags (each may also come from the environment: "
                  "--some-flag as ",
                  env_prefix, "SOME_FLAG):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string value = flag->DefaultValue();
    absl::StrAppend(
        &out, "  --", absl::StrReplaceAll(flag->Name(), {{"_", "-"}}), "=",
        value.empty() ? "\"\"" : value, "\n", Wrap(flag->Help(), 6, 72));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace

std::vector<std::string> ParseFlags(int argc, char** argv,
                                    absl::string_view env_prefix,
                                    const FlagsHelp& help) {
  // --some-flag[=v] becomes --some_flag[=v]; values are left alone.
  std::vector<std::string> normalized(argv, argv + argc);
  absl::flat_hash_set<std::string> given;
  for (std::string& arg : normalized) {
    if (arg == "--") break;
    if (arg == "-h" || absl::StartsWith(arg, "--help") ||
        absl::StartsWith(arg, "-help")) {
      PrintHelpAndExit(help, env_prefix);
    }
    if (!absl::StartsWith(arg, "--")) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    for (size_t i = 2; i < end; ++i) {
      if (arg[i] == '-') arg[i] = '_';
    }
    std::string name = arg.substr(2, end - 2);
    if (absl::StartsWith(name, "no")) given.insert(name.substr(2));
    given.insert(std::move(name));
  }
  std::vector<char*> args;
  for (std::string& a : normalized) args.push_back(a.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());

  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (given.contains(name)) continue;
    const std::string variable =
        absl::StrCat(env_prefix, absl::AsciiStrToUpper(name));
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "%s: %s='%s': %s\n", argv[0], variable.c_str(),
                   value, error.c_str());
      std::exit(2);
    }
  }
  return std::vector<std::string>(positional.begin(), positional.end());
}

namespace {
sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}
}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int AwaitTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  int signal = 0;
  sigwait(&signals, &signal);
  return signal;
}

void KeepLargeBuffersWarm() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  mallopt(M_ARENA_MAX, 1);
}

void ExitAfterShutdown(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

void LogLine(absl::string_view who, absl::string_view context,
             absl::string_view message) {
  const std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3S", absl::Now(),
                       absl::LocalTimeZone()),
      " ", who, context.empty() ? "" : " ", context, ": ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

bool WritePortFile(const std::string& path, const std::string& address,
                   int metrics_port) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << address << " " << metrics_port << "\n";
    if (!out) return false;
  }
  return std::rename(temporary.c_str(), path.c_str()) == 0;
}

PortFile ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  PortFile file;
  if (!(in >> file.address >> file.metrics_port)) return PortFile{};
  return file;
}

}  // namespace gradmesh
