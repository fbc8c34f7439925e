#include "store/migration.h"

#include <algorithm>
#include <string>

namespace waystone {

absl::StatusOr<std::vector<const Migration*>> PendingMigrations(const std::vector<Migration>& known,
                                                                const std::vector<int>& applied) {
  auto is_known = [&](int version) {
    return std::any_of(known.begin(), known.end(),
                       [&](const Migration& m) { return m.version == version; });
  };
  for (int version : applied) {
    if (!is_known(version)) {
      return absl::FailedPreconditionError(
          "database schema has migration " + std::to_string(version) +
          ", which this build does not know (it knows up to " +
          std::to_string(known.empty() ? 0 : known.back().version) + "); use a newer waystone");
    }
  }
  std::vector<const Migration*> pending;
  for (const Migration& m : known) {
    if (std::find(applied.begin(), applied.end(), m.version) == applied.end()) {
      pending.push_back(&m);
    }
  }
  return pending;
}

}  // namespace waystone
