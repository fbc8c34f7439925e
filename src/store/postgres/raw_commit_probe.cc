#include "store/postgres/raw_commit_probe.h"

#include <chrono>

#include "base/status_macros.h"
#include "store/postgres/pg_connection.h"

namespace waystone {

absl::StatusOr<double> MeasurePostgresRawCommitRate(const std::string& conninfo, Millis duration) {
  WS_ASSIGN_OR_RETURN(auto c, PgConnection::Connect(conninfo));
  WS_RETURN_IF_ERROR(c->Exec("DROP TABLE IF EXISTS probe"));
  WS_RETURN_IF_ERROR(c->Exec("CREATE TABLE probe (id BIGSERIAL PRIMARY KEY, v TEXT)"));
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::milliseconds(duration);
  int64_t commits = 0;
  while (std::chrono::steady_clock::now() < end) {
    // Autocommit: each INSERT is its own durable transaction.
    WS_RETURN_IF_ERROR(c->Query("INSERT INTO probe (v) VALUES ($1)", Params("row")).status());
    ++commits;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WS_RETURN_IF_ERROR(c->Exec("DROP TABLE probe"));
  return static_cast<double>(commits) / seconds;
}

absl::Status RecreatePostgresDatabase(const std::string& server_conninfo, const std::string& name) {
  WS_ASSIGN_OR_RETURN(auto c, PgConnection::Connect(server_conninfo));
  WS_RETURN_IF_ERROR(c->Exec("DROP DATABASE IF EXISTS " + name));
  return c->Exec("CREATE DATABASE " + name);
}

}  // namespace waystone
