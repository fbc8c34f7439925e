// PostgresStore: API tokens, server keys and Idempotency-Key requests (AccessStore).

#include "absl/strings/str_cat.h"
#include "store/api_requests.h"
#include "store/postgres/pg_rows.h"

namespace waystone {

absl::Status PostgresStore::PutToken(const TokenRecord& t) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  auto status = c->Query(absl::StrCat("INSERT INTO api_tokens (", kTokenColumns,
                                      ") VALUES ($1, $2, $3, $4, $5::bigint, $6::bigint, "
                                      "$7::bigint)"),
                         Params(t.token_hash, t.name, t.tenant, t.role, t.created_at, t.revoked_at,
                                t.expires_at))
                    .status();
  if (absl::IsAlreadyExists(status) ||
      (!status.ok() &&
       std::string(status.message()).find("api_tokens_name") != std::string::npos)) {
    return absl::AlreadyExistsError("a token named '" + t.name + "' exists");
  }
  return status;
}

absl::StatusOr<TokenRecord> PostgresStore::FindToken(const std::string& token_hash) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kTokenColumns,
                                                        " FROM api_tokens WHERE token_hash = $1"),
                                           Params(token_hash)));
  std::optional<TokenRecord> token = PgFirstRow(r, ReadToken<PgRow>);
  if (!token) return absl::NotFoundError("no such token");
  return *token;
}

absl::StatusOr<std::vector<TokenRecord>> PostgresStore::ListTokens() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kTokenColumns,
                                                        " FROM api_tokens ORDER BY name")));
  return PgRows(r, ReadToken<PgRow>);
}

absl::StatusOr<std::string> PostgresStore::ServerKey(const std::string& name) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT value FROM server_keys WHERE name = $1", Params(name)));
  if (r.rows() == 0) return absl::NotFoundError("no server key '" + name + "'");
  return r.Text(0, 0);
}

absl::Status PostgresStore::RevokeToken(const std::string& name, const AuditRecord& audit) {
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(PgResult r,
                        c.Query("UPDATE api_tokens SET revoked_at = $1::bigint WHERE name = $2 "
                                "AND revoked_at = 0 RETURNING name",
                                Params(audit.at, name)));
    if (r.rows() == 1) return PgInsertAudit(c, audit, 0, audit.at);
    WS_ASSIGN_OR_RETURN(PgResult exists,
                        c.Query("SELECT 1 FROM api_tokens WHERE name = $1", Params(name)));
    if (exists.rows() == 0) return absl::NotFoundError("no token named '" + name + "'");
    return absl::FailedPreconditionError("token '" + name + "' is revoked already");
  });
}

absl::StatusOr<ApiRequestClaim> PostgresStore::BeginApiRequest(const ApiRequestRecord& request,
                                                               Millis stale_before,
                                                               const std::string& dead_owner) {
  ApiRequestClaim claim;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    // A concurrent first claim of the same key waits here for the other to commit.
    WS_RETURN_IF_ERROR(c.Query("INSERT INTO api_requests (tenant, key, request_hash, "
                               "created_at, expires_at) VALUES ($1, $2, '', 0, 0) ON CONFLICT "
                               "DO NOTHING",
                               Params(request.tenant, request.key))
                           .status());
    WS_ASSIGN_OR_RETURN(PgResult got,
                        c.Query("SELECT request_hash, done, status, content_type, body, "
                                "created_at, expires_at, owner FROM api_requests WHERE tenant = "
                                "$1 AND key = $2 FOR UPDATE",
                                Params(request.tenant, request.key)));
    // The placeholder row just inserted has expired at 0: a fresh key decides kNew.
    const ApiRequestRecord stored{request.tenant,
                                  request.key,
                                  got.Text(0, 0),
                                  got.Text(0, 1) == "t",
                                  static_cast<int>(got.Int(0, 2)),
                                  got.Text(0, 3),
                                  got.Text(0, 4),
                                  got.Int(0, 5),
                                  got.Int(0, 6),
                                  got.Text(0, 7)};
    claim = DecideApiRequest(stored, request, stale_before, dead_owner);
    if (claim.outcome != ApiRequestOutcome::kNew) return absl::OkStatus();
    return c
        .Query(
            "UPDATE api_requests SET request_hash = $3, done = FALSE, status = 0, "
            "content_type = '', body = '', created_at = $4::bigint, expires_at = "
            "$5::bigint, owner = $6 WHERE tenant = $1 AND key = $2",
            Params(request.tenant, request.key, request.request_hash, request.created_at,
                   request.expires_at, request.owner))
        .status();
  });
  if (!status.ok()) return status;
  return claim;
}

absl::Status PostgresStore::FinishApiRequest(const ApiRequestRecord& r) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c
      ->Query(
          "UPDATE api_requests SET done = TRUE, status = $1::integer, content_type = $2, "
          "body = $3 WHERE tenant = $4 AND key = $5 AND request_hash = $6",
          Params(r.status, r.content_type, r.body, r.tenant, r.key, r.request_hash))
      .status();
}

absl::Status PostgresStore::AbandonApiRequest(const std::string& tenant, const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c
      ->Query("DELETE FROM api_requests WHERE tenant = $1 AND key = $2 AND NOT done",
              Params(tenant, key))
      .status();
}

}  // namespace waystone
