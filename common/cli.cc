#include "common/cli.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gradmesh {

std::vector<std::string> ParseFlags(int argc, char** argv,
                                    absl::string_view env_prefix) {
  // --some-flag[=v] becomes --some_flag[=v]; values are left alone.
  std::vector<std::string> normalized(argv, argv + argc);
  absl::flat_hash_set<std::string> given;
  for (std::string& arg : normalized) {
    if (arg == "--") break;
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
