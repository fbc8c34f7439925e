#include "store/postgres/pg_connection.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/cord.h"

namespace waystone {

PgResult& PgResult::operator=(PgResult&& other) noexcept {
  if (this != &other) {
    PQclear(result_);
    result_ = other.result_;
    other.result_ = nullptr;
  }
  return *this;
}

int64_t PgResult::affected() const {
  const char* text = PQcmdTuples(result_);
  return text == nullptr || *text == '\0' ? 0 : std::atoll(text);
}

std::string PgResult::Text(int row, int column) const {
  return std::string(PQgetvalue(result_, row, column),
                     static_cast<size_t>(PQgetlength(result_, row, column)));
}

int64_t PgResult::Int(int row, int column) const {
  return std::atoll(PQgetvalue(result_, row, column));
}

namespace {

// The rows of a statement that finished, or its error named `what` (the result freed).
absl::StatusOr<PgResult> Finished(PGconn* conn, PGresult* result, std::string_view what) {
  const ExecStatusType status = PQresultStatus(result);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    absl::Status error = PgStatus(conn, result, what);
    PQclear(result);
    return error;
  }
  return PgResult(result);
}

// The status of a server error of SQLSTATE `code`.
absl::Status PgStatusOfCode(const std::string& code, const std::string& message) {
  if (code == "40001" || code == "40P01" || code.starts_with("08") || code == "57P01" ||
      code == "57P02" || code == "57P03" || code == "53300") {
    return absl::UnavailableError(message);
  }
  if (code == "23505") return absl::AlreadyExistsError(message);
  if (code == "55P03") return absl::AbortedError(message);
  if (code.starts_with("XX")) return absl::DataLossError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status PgStatus(PGconn* conn, PGresult* result, std::string_view what) {
  std::string message(what);
  message += ": ";
  const char* error = result != nullptr ? PQresultErrorMessage(result) : PQerrorMessage(conn);
  message += error != nullptr ? error : "unknown error";
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  if (PQstatus(conn) != CONNECTION_OK) return absl::UnavailableError(message);
  const char* state = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  if (state == nullptr) return absl::UnavailableError(message);
  const std::string code(state);
  absl::Status status = PgStatusOfCode(code, message);
  status.SetPayload(kPgSqlState, absl::Cord(code));
  return status;
}

absl::StatusOr<std::unique_ptr<PgConnection>> PgConnection::Connect(const std::string& conninfo) {
  // Keepalives let both sides notice a peer that vanished without closing.
  const char* keys[] = {
      "dbname",          "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
      "connect_timeout", nullptr};
  const char* values[] = {conninfo.c_str(), "1", "5", "2", "3", "10", nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (PQstatus(conn) != CONNECTION_OK) {
    absl::Status status =
        absl::UnavailableError(std::string("connect to PostgreSQL: ") + PQerrorMessage(conn));
    PQfinish(conn);
    return status;
  }
  auto connection = std::unique_ptr<PgConnection>(new PgConnection(conn));
  // A worker cut off mid-transaction must not keep its row locks (and so its
  // instances) forever: the server ends a transaction left idle this long. Waystone's
  // own transactions never pause between statements.
  if (auto status = connection->Exec("SET client_min_messages = warning; "
                                     "SET idle_in_transaction_session_timeout = '10s'");
      !status.ok()) {
    return status;
  }
  return connection;
}

PgConnection::~PgConnection() { PQfinish(conn_); }

absl::Status PgConnection::Exec(const std::string& sql) {
  return Finished(conn_, PQexec(conn_, sql.c_str()), "exec").status();
}

absl::Status PgConnection::Commit() {
  PGresult* result = PQexec(conn_, "COMMIT");
  if (PQresultStatus(result) == PGRES_COMMAND_OK &&
      std::string_view(PQcmdStatus(result)) == "ROLLBACK") {
    PQclear(result);
    return absl::InternalError(
        "the transaction had failed before its COMMIT; PostgreSQL rolled it back, nothing "
        "was written");
  }
  return Finished(conn_, result, "commit").status();
}

absl::StatusOr<const std::string*> PgConnection::Prepared(const std::string& sql) {
  auto it = prepared_.find(sql);
  if (it == prepared_.end()) {
    const std::string name = "ws" + std::to_string(prepared_.size());
    PGresult* prepared = PQprepare(conn_, name.c_str(), sql.c_str(), 0, nullptr);
    if (PQresultStatus(prepared) != PGRES_COMMAND_OK) {
      absl::Status error = PgStatus(conn_, prepared, "prepare");
      PQclear(prepared);
      return error;
    }
    PQclear(prepared);
    it = prepared_.emplace(sql, name).first;
  }
  return &it->second;
}

namespace {

std::vector<const char*> Values(const PgParams& params) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  return values;
}

}  // namespace

absl::StatusOr<PgResult> PgConnection::Query(const std::string& sql, const PgParams& params) {
  auto name = Prepared(sql);
  if (!name.ok()) return name.status();
  const std::vector<const char*> values = Values(params);
  return Finished(conn_,
                  PQexecPrepared(conn_, (*name)->c_str(), static_cast<int>(values.size()),
                                 values.data(), nullptr, nullptr, 0),
                  "query");
}

absl::StatusOr<PgResult> PgConnection::QueryUnprepared(const std::string& sql,
                                                       const PgParams& params) {
  const std::vector<const char*> values = Values(params);
  return Finished(conn_,
                  PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr,
                               values.data(), nullptr, nullptr, 0),
                  "query");
}

absl::StatusOr<std::vector<PgResult>> PgConnection::Pipeline(
    const std::vector<PgStatement>& statements) {
  // Prepared beforehand (once per connection), so that the pipeline's results map
  // one to one onto the statements (one planned each time is parsed in the pipeline,
  // as an unnamed statement, and also gives one result).
  for (const PgStatement& s : statements) {
    if (s.planned_each_time) continue;
    if (auto name = Prepared(*s.sql); !name.ok()) return name.status();
  }
  std::vector<PgResult> results;
  results.reserve(statements.size());
  for (size_t at = 0; at < statements.size(); at += kPipelineRound) {
    const size_t end = std::min(statements.size(), at + kPipelineRound);
    if (PQenterPipelineMode(conn_) != 1) return PgStatus(conn_, nullptr, "enter pipeline mode");
    absl::Status round = PipelineRound(&statements[at], &statements[0] + end, results);
    // Leaves pipeline mode even after an error, so the connection can roll back.
    if (PQexitPipelineMode(conn_) != 1) {
      // Results left unread: the connection's state is not known, so it is replaced.
      unusable_ = true;
      if (round.ok()) round = PgStatus(conn_, nullptr, "exit pipeline mode");
    }
    if (!round.ok()) return round;
  }
  return results;
}

absl::Status PgConnection::PipelineRound(const PgStatement* begin, const PgStatement* end,
                                         std::vector<PgResult>& results) {
  // A round is small (a few hundred short statements and their command tags), so
  // sending it whole before reading cannot fill both sockets' buffers.
  for (const PgStatement* s = begin; s != end; ++s) {
    const std::vector<const char*> values = Values(s->params);
    const int count = static_cast<int>(values.size());
    const int sent = s->planned_each_time
                         ? PQsendQueryParams(conn_, s->sql->c_str(), count, nullptr, values.data(),
                                             nullptr, nullptr, 0)
                         : PQsendQueryPrepared(conn_, prepared_.find(*s->sql)->second.c_str(),
                                               count, values.data(), nullptr, nullptr, 0);
    if (sent != 1) return PgStatus(conn_, nullptr, "pipeline send");
  }
  if (PQpipelineSync(conn_) != 1) return PgStatus(conn_, nullptr, "pipeline sync");
  // One result (then a null) per statement, then the sync's. After an error the
  // statements that follow come back PGRES_PIPELINE_ABORTED; all are read to the sync.
  absl::Status first_error;
  for (const PgStatement* s = begin; s != end; ++s) {
    PGresult* result = PQgetResult(conn_);
    if (result == nullptr) return PgStatus(conn_, nullptr, "pipeline result missing");
    const ExecStatusType status = PQresultStatus(result);
    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) {
      if (first_error.ok())
        results.emplace_back(result);
      else
        PQclear(result);
    } else {
      if (first_error.ok()) {
        first_error = status == PGRES_PIPELINE_ABORTED
                          ? absl::InternalError("pipeline aborted without an error")
                          : PgStatus(conn_, result, "pipeline query");
      }
      PQclear(result);
    }
    while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);  // the null ending the query
  }
  PGresult* sync = PQgetResult(conn_);
  const bool synced = sync != nullptr && PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
  PQclear(sync);
  if (!first_error.ok()) return first_error;
  if (!synced) return PgStatus(conn_, nullptr, "pipeline sync result");
  return absl::OkStatus();
}

}  // namespace waystone

namespace waystone {

int PgConnection::DrainNotifications() {
  if (PQconsumeInput(conn_) == 0) return -1;
  int count = 0;
  while (PGnotify* notify = PQnotifies(conn_)) {
    PQfreemem(notify);
    ++count;
  }
  return count;
}

}  // namespace waystone
