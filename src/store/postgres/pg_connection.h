#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace waystone {

// Text parameters of a statement; nullopt is SQL NULL.
using PgParams = std::vector<std::optional<std::string>>;

// Builds PgParams from values: integers and strings become text, nullopt NULL.
inline std::optional<std::string> PgParam(int64_t v) { return std::to_string(v); }
inline std::optional<std::string> PgParam(int v) { return std::to_string(v); }
inline std::optional<std::string> PgParam(const std::string& v) { return v; }
inline std::optional<std::string> PgParam(std::string_view v) { return std::string(v); }
inline std::optional<std::string> PgParam(const char* v) { return std::string(v); }
inline std::optional<std::string> PgParam(std::nullopt_t) { return std::nullopt; }
template <typename T>
std::optional<std::string> PgParam(const std::optional<T>& v) {
  return v ? PgParam(*v) : std::nullopt;
}
template <typename... Args>
PgParams Params(const Args&... args) {
  return PgParams{PgParam(args)...};
}

// The rows of a finished statement. Owns the PGresult.
class PgResult {
 public:
  explicit PgResult(PGresult* result) : result_(result) {}
  PgResult(PgResult&& other) noexcept : result_(other.result_) { other.result_ = nullptr; }
  PgResult& operator=(PgResult&& other) noexcept;
  ~PgResult() { PQclear(result_); }

  int rows() const { return PQntuples(result_); }
  int64_t affected() const;
  std::string Text(int row, int column) const;
  int64_t Int(int row, int column) const;
  bool IsNull(int row, int column) const { return PQgetisnull(result_, row, column) != 0; }
  int columns() const { return PQnfields(result_); }
  std::string ColumnName(int column) const { return PQfname(result_, column); }
  Oid ColumnType(int column) const { return PQftype(result_, column); }

 private:
  PGresult* result_;
};

// Maps a failed result or connection to a status whose code carries the retry
// meaning: lost connections, serialization failures and deadlocks are Unavailable,
// unique violations AlreadyExists, lock_not_available Aborted. A server's error
// carries its SQLSTATE as the payload kPgSqlState.
absl::Status PgStatus(PGconn* conn, PGresult* result, std::string_view what);
// The payload of a PgStatus that holds the server's SQLSTATE ("23505").
inline constexpr char kPgSqlState[] = "waystone/sqlstate";

// A statement and its parameters, for a pipeline (PgConnection::Pipeline).
struct PgStatement {
  const std::string* sql;  // a static string: outlives every connection
  PgParams params;
  // Planned for its parameters each time it runs, instead of prepared once per
  // connection. For a statement over arrays of rows that joins a table which grows
  // while the connection lives: a plan kept from when the table was small scans it
  // whole (a seq scan and a hash join), and keeps doing so as it grows.
  bool planned_each_time = false;
};

// One libpq connection with a prepared-statement cache. Not thread-safe: the
// store hands each connection to one caller at a time.
class PgConnection {
 public:
  static absl::StatusOr<std::unique_ptr<PgConnection>> Connect(const std::string& conninfo);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  // Runs `sql` (prepared once per connection) with `params`.
  absl::StatusOr<PgResult> Query(const std::string& sql, const PgParams& params = {});
  absl::StatusOr<PgResult> Query(const PgStatement& statement) {
    return statement.planned_each_time ? QueryUnprepared(*statement.sql, statement.params)
                                       : Query(*statement.sql, statement.params);
  }
  // Runs `sql` with `params` unprepared (PQexecParams: parsed and planned each time,
  // nothing kept on the connection): for statements the engine did not write, and
  // for the engine's own that are planned each time (PgStatement).
  absl::StatusOr<PgResult> QueryUnprepared(const std::string& sql, const PgParams& params);
  // Runs statements without parameters or results (BEGIN, migrations).
  absl::Status Exec(const std::string& sql);
  // Commits the open transaction. One that an earlier statement failed is rolled back
  // by the server, which answers COMMIT with "ROLLBACK" and no error: Internal here,
  // as nothing was written.
  absl::Status Commit();
  // Runs `statements` (each prepared once per connection, unless planned each time)
  // in libpq pipeline mode: all are sent before the first result is read, in rounds
  // of at most kPipelineRound, so a batch costs one round trip per round instead of
  // one per statement. Returns one result per statement in order. The first
  // statement that fails ends the run: its error is returned and nothing after it
  // ran; inside a transaction, the transaction is then failed and must be rolled back.
  static constexpr size_t kPipelineRound = 256;
  absl::StatusOr<std::vector<PgResult>> Pipeline(const std::vector<PgStatement>& statements);
  // Returns true when the connection is unusable and must be replaced.
  bool broken() const { return unusable_ || PQstatus(conn_) != CONNECTION_OK; }
  // Marks the connection unusable (e.g. a ROLLBACK failed: a transaction may be open).
  void MarkBroken() { unusable_ = true; }
  // The socket to wait on for notifications.
  int socket() const { return PQsocket(conn_); }
  // Reads what arrived and returns how many notifications it held; -1 on error.
  int DrainNotifications();

 private:
  explicit PgConnection(PGconn* conn) : conn_(conn) {}
  // Returns the name `sql` is prepared under on this connection, preparing it first.
  absl::StatusOr<const std::string*> Prepared(const std::string& sql);
  // Sends and reads one round of a pipeline (see Pipeline).
  absl::Status PipelineRound(const PgStatement* begin, const PgStatement* end,
                             std::vector<PgResult>& results);
  PGconn* conn_;
  bool unusable_ = false;  // a pipeline ended with results left unread
  std::map<std::string, std::string, std::less<>> prepared_;
};

}  // namespace waystone
