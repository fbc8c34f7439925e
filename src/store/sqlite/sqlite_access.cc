// SqliteStore: API tokens, server keys and Idempotency-Key requests (AccessStore).

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/api_requests.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {

absl::Status SqliteStore::PutToken(const TokenRecord& t) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("INSERT INTO api_tokens (", kTokenColumns,
                                                ") VALUES (?, ?, ?, ?, ?, ?, ?)")));
  auto status =
      s->BindAll(t.token_hash, t.name, t.tenant, t.role, t.created_at, t.revoked_at, t.expires_at)
          .Run();
  if (status.code() == absl::StatusCode::kAlreadyExists ||
      (!status.ok() && std::string(status.message()).find("UNIQUE") != std::string::npos)) {
    return absl::AlreadyExistsError("a token named '" + t.name + "' exists");
  }
  return status;
}

absl::StatusOr<TokenRecord> SqliteStore::FindToken(const std::string& token_hash) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kTokenColumns,
                                                " FROM api_tokens WHERE token_hash = ?")));
  s->BindAll(token_hash);
  WS_ASSIGN_OR_RETURN(std::optional<TokenRecord> token, FirstRow(s, ReadToken<SqliteStatement>));
  if (!token) return absl::NotFoundError("no such token");
  return *token;
}

absl::StatusOr<std::vector<TokenRecord>> SqliteStore::ListTokens() {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare(absl::StrCat("SELECT ", kTokenColumns, " FROM api_tokens ORDER BY name")));
  return CollectRows(s, ReadToken<SqliteStatement>);
}

absl::StatusOr<std::string> SqliteStore::ServerKey(const std::string& name) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT value FROM server_keys WHERE name = ?"));
  s->BindAll(name);
  WS_ASSIGN_OR_RETURN(std::optional<std::string> value, FirstRow(s, ReadText0<SqliteStatement>));
  if (!value) return absl::NotFoundError("no server key '" + name + "'");
  return *value;
}

absl::Status SqliteStore::RevokeToken(const std::string& name, const AuditRecord& audit) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambda below runs with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * find,
                        db.Prepare("SELECT revoked_at FROM api_tokens WHERE name = ?"));
    find->BindAll(name);
    WS_ASSIGN_OR_RETURN(std::optional<Millis> revoked,
                        FirstRow(find, [](const SqliteStatement& r) { return r.Int(0); }));
    if (!revoked) return absl::NotFoundError("no token named '" + name + "'");
    if (*revoked != 0) {
      return absl::FailedPreconditionError("token '" + name + "' is revoked already");
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                        db.Prepare("UPDATE api_tokens SET revoked_at = ? WHERE name = ?"));
    WS_RETURN_IF_ERROR(s->BindAll(audit.at, name).Run());
    return SqliteInsertAudit(db, audit, 0, audit.at);
  });
}

absl::StatusOr<ApiRequestClaim> SqliteStore::BeginApiRequest(const ApiRequestRecord& request,
                                                             Millis stale_before,
                                                             const std::string& dead_owner) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  ApiRequestClaim claim;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * get,
                        db.Prepare("SELECT request_hash, done, status, content_type, body, "
                                   "created_at, expires_at, owner FROM api_requests WHERE "
                                   "tenant = ? AND key = ?"));
    get->BindAll(request.tenant, request.key);
    WS_ASSIGN_OR_RETURN(
        std::optional<ApiRequestRecord> stored, FirstRow(get, [&](const SqliteStatement& r) {
          return ApiRequestRecord{
              request.tenant, request.key, r.Text(0), r.Int(1) != 0, static_cast<int>(r.Int(2)),
              r.Text(3),      r.Text(4),   r.Int(5),  r.Int(6),      r.Text(7)};
        }));
    claim = DecideApiRequest(stored, request, stale_before, dead_owner);
    if (claim.outcome != ApiRequestOutcome::kNew) return absl::OkStatus();
    WS_ASSIGN_OR_RETURN(SqliteStatement * put,
                        db.Prepare("INSERT OR REPLACE INTO api_requests (tenant, key, "
                                   "request_hash, created_at, expires_at, owner) VALUES (?, ?, "
                                   "?, ?, ?, ?)"));
    return put
        ->BindAll(request.tenant, request.key, request.request_hash, request.created_at,
                  request.expires_at, request.owner)
        .Run();
  });
  if (!status.ok()) return status;
  return claim;
}

absl::Status SqliteStore::FinishApiRequest(const ApiRequestRecord& r) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare("UPDATE api_requests SET done = 1, status = ?, content_type = "
                   "?, body = ? WHERE tenant = ? AND key = ? AND request_hash = ?"));
  return s->BindAll(r.status, r.content_type, r.body, r.tenant, r.key, r.request_hash).Run();
}

absl::Status SqliteStore::AbandonApiRequest(const std::string& tenant, const std::string& key) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("DELETE FROM api_requests WHERE tenant = ? AND key = ? AND "
                                   "done = 0"));
  return s->BindAll(tenant, key).Run();
}

}  // namespace waystone
