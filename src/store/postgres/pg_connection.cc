#include "store/postgres/pg_connection.h"

#include <cstdlib>
#include <cstring>

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
  if (code == "40001" || code == "40P01" || code.starts_with("08") || code == "57P01" ||
      code == "57P02" || code == "57P03" || code == "53300") {
    return absl::UnavailableError(message);
  }
  if (code == "23505") return absl::AlreadyExistsError(message);
  if (code == "55P03") return absl::AbortedError(message);
  if (code.starts_with("XX")) return absl::DataLossError(message);
  return absl::InternalError(message);
}

absl::StatusOr<std::unique_ptr<PgConnection>> PgConnection::Connect(const std::string& conninfo) {
  // Keepalives let both sides notice a peer that vanished without closing.
  const char* keys[] = {"dbname", "keepalives", "keepalives_idle", "keepalives_interval",
                        "keepalives_count", "connect_timeout", nullptr};
  const char* values[] = {conninfo.c_str(), "1", "5", "2", "3", "10", nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (PQstatus(conn) != CONNECTION_OK) {
    absl::Status status = absl::UnavailableError(std::string("connect to PostgreSQL: ") +
                                                 PQerrorMessage(conn));
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
  PGresult* result = PQexec(conn_, sql.c_str());
  const ExecStatusType status = PQresultStatus(result);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    absl::Status error = PgStatus(conn_, result, "exec");
    PQclear(result);
    return error;
  }
  PQclear(result);
  return absl::OkStatus();
}

absl::StatusOr<PgResult> PgConnection::Query(const std::string& sql, const PgParams& params) {
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
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  PGresult* result = PQexecPrepared(conn_, it->second.c_str(), static_cast<int>(values.size()),
                                    values.data(), nullptr, nullptr, 0);
  const ExecStatusType status = PQresultStatus(result);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    absl::Status error = PgStatus(conn_, result, "query");
    PQclear(result);
    return error;
  }
  return PgResult(result);
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
