#include "cli/common.h"

#include <cstdio>
#include <cstdlib>

#include "definition/loader.h"

namespace waystone::cli {

std::string DatabasePath(const GlobalOptions& global) {
  if (!global.db.empty()) return global.db;
  if (const char* env = std::getenv("WAYSTONE_DB"); env != nullptr && *env != '\0') return env;
  return "waystone.db";
}

absl::StatusOr<std::unique_ptr<Store>> OpenStoreFor(const GlobalOptions& global) {
  StoreOptions options;
  options.path = DatabasePath(global);
  return OpenStore(options);
}

absl::StatusOr<std::string> TextOrFile(const std::string& arg, size_t max_bytes) {
  if (!arg.starts_with("@")) {
    if (arg.size() > max_bytes) {
      return absl::InvalidArgumentError("input is " + std::to_string(arg.size()) +
                                        " bytes; the limit is " + std::to_string(max_bytes));
    }
    return arg;
  }
  std::string text;
  auto status = ReadFileText(arg.substr(1), max_bytes, &text);
  if (!status.ok()) return status;
  return text;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "waystone: %s\n", std::string(status.message()).c_str());
  return kExitError;
}

}  // namespace waystone::cli
