#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace waystone {

// One versioned schema step, embedded from <dialect>/migrations/NNNN_name.sql.
struct Migration {
  int version;
  std::string_view name;
  std::string_view sql;
};

const std::vector<Migration>& sqlite_migrations();
const std::vector<Migration>& postgres_migrations();

// Returns the migrations of `known` that are not in `applied`, in version order.
// Every one missing runs, not only those above the highest applied: migrations
// made on branches land in any order, so a lower number may arrive after a higher
// one was applied. FailedPrecondition when `applied` holds a version this build
// does not know (the database is newer).
absl::StatusOr<std::vector<const Migration*>> PendingMigrations(const std::vector<Migration>& known,
                                                                const std::vector<int>& applied);

}  // namespace waystone
