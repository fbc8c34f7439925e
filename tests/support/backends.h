#pragma once

#include <string>

#include <gtest/gtest.h>

#include "support/postgres_cluster.h"
#include "support/temp_dir.h"

namespace waystone::testing {

// The store backends every store-touching suite runs on.
enum class Backend { kSqlite, kPostgres };

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kSqlite ? "sqlite" : "postgres";
}

// Returns a fresh store location for `backend`: a file in `dir`, or a new database.
inline std::string FreshStorePath(Backend backend, const TempDir& dir, const std::string& name) {
  return backend == Backend::kSqlite ? dir.File(name + ".db") : FreshPostgresDatabase();
}

}  // namespace waystone::testing
