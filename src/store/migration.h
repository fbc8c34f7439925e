#pragma once

#include <string_view>
#include <vector>

namespace waystone {

// One versioned schema step, embedded from <dialect>/migrations/NNNN_name.sql.
struct Migration {
  int version;
  std::string_view name;
  std::string_view sql;
};

const std::vector<Migration>& sqlite_migrations();
const std::vector<Migration>& postgres_migrations();

}  // namespace waystone
