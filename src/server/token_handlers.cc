#include <map>

#include <nlohmann/json.hpp>

#include "model/duration.h"
#include "server/api_handlers.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"
#include "server/wire.h"

// GET and POST /v1/tokens, POST /v1/tokens/{name}/revoke: the token store for
// admins. An admin of one tenant sees, creates and revokes only that tenant's
// tokens; a token's hash never leaves, and its secret only once, when made.

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kRevokeAction[] = "revoke_token";

Json TokenJson(const TokenRecord& t, Millis now) {
  auto when = [](Millis at) { return at == 0 ? Json(nullptr) : Json(Rfc3339(at)); };
  const char* state = t.revoked_at != 0                          ? "revoked"
                      : t.expires_at != 0 && t.expires_at <= now ? "expired"
                                                                 : "active";
  return {{"name", t.name},
          {"tenant", t.tenant},
          {"role", t.role},
          {"state", state},
          {"created_at", when(t.created_at)},
          {"expires_at", when(t.expires_at)},
          {"revoked_at", when(t.revoked_at)}};
}

// The tokens `principal` may see, by name.
absl::StatusOr<std::vector<TokenRecord>> VisibleTokens(const ApiContext& ctx,
                                                       const Principal& principal) {
  auto tokens = ctx.store->ListTokens();
  if (!tokens.ok()) return tokens.status();
  std::vector<TokenRecord> out;
  for (TokenRecord& t : *tokens) {
    if (principal.tenant == "*" || t.tenant == principal.tenant) out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

void ListTokens(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                ServerResponse& res) {
  auto tokens = VisibleTokens(ctx, principal);
  if (!tokens.ok()) return Send(res, ProblemFromStatus(tokens.status()), req.path);
  // Who revoked each and why: the audit records about no instance, of the tenants the
  // principal sees (another tenant's revocations, actors and reasons are its own).
  auto audit = ctx.store->ListAudit(0);
  if (!audit.ok()) return Send(res, ProblemFromStatus(audit.status()), req.path);
  std::map<std::string, const AuditRecord*> revocations;
  for (const AuditRecord& a : *audit) {
    if (a.action != kRevokeAction) continue;
    if (principal.tenant != "*" && a.tenant != principal.tenant) continue;
    Json detail = Json::parse(a.detail_json, nullptr, false);
    if (detail.is_object() && detail["token"].is_string()) revocations[detail["token"]] = &a;
  }
  const Millis now = ctx.clock->NowMillis();
  Json items = Json::array();
  for (const TokenRecord& t : *tokens) {
    Json item = TokenJson(t, now);
    if (auto it = revocations.find(t.name); t.revoked_at != 0 && it != revocations.end()) {
      item["revoked_by"] = it->second->actor;
      item["revoke_reason"] = it->second->reason;
    }
    items.push_back(std::move(item));
  }
  SendJson(res, 200, {{"items", std::move(items)}});
}

void CreateTokenOf(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res) {
  auto body = JsonBody(req, res, ParseTokenBody);
  if (!body) return;
  const std::string tenant = body->tenant.empty() ? principal.tenant : body->tenant;
  if (principal.tenant != "*" && tenant != principal.tenant) {
    return Send(res,
                Forbidden("an admin of tenant '" + principal.tenant +
                          "' creates tokens for that tenant only"),
                req.path);
  }
  auto role = ParseRole(body->role);
  if (!role) return Send(res, BadRequest("'role' must be viewer, operator or admin"), req.path);
  const Millis now = ctx.clock->NowMillis();
  Millis expires_at = 0;
  if (!body->expires.empty()) {
    auto valid_for = ParseDuration(body->expires);
    if (!valid_for || *valid_for < 1000) {
      return Send(res, BadRequest("'expires' must be a duration of at least 1s, such as 90d"),
                  req.path);
    }
    expires_at = now + *valid_for;
  }
  auto token = CreateToken(*ctx.store, body->name, tenant, *role, now, expires_at);
  if (absl::IsAlreadyExists(token.status())) {
    return Send(res,
                ProblemFromStatus(
                    absl::AlreadyExistsError("a token named '" + body->name + "' exists already")),
                req.path);
  }
  if (!token.ok()) return Send(res, ProblemFromStatus(token.status()), req.path);
  Json out = TokenJson({"", body->name, tenant, body->role, now, 0, expires_at}, now);
  out["token"] = *token;  // shown this once; only its SHA-256 is stored
  SendJson(res, 201, std::move(out));
}

void RevokeTokenOf(const ApiContext& ctx, const Principal& principal, const std::string& name,
                   const ServerRequest& req, ServerResponse& res) {
  auto reason = JsonBody(req, res, ParseReasonBody);
  if (!reason) return;
  if (reason->empty()) {
    return Send(res, BadRequest("'reason' is required: say why the token is revoked"), req.path);
  }
  auto tokens = VisibleTokens(ctx, principal);
  if (!tokens.ok()) return Send(res, ProblemFromStatus(tokens.status()), req.path);
  const TokenRecord* token = nullptr;
  for (const TokenRecord& t : *tokens) {
    if (t.name == name) token = &t;
  }
  // Another tenant's token and a missing one look the same.
  if (token == nullptr) return Send(res, NotFound("no token named '" + name + "'"), req.path);
  AuditRecord audit;
  audit.at = ctx.clock->NowMillis();
  audit.actor = principal.token_name;
  audit.tenant = token->tenant;
  audit.action = kRevokeAction;
  audit.reason = *reason;
  audit.detail_json = Json{{"token", name}}.dump();
  if (auto status = ctx.store->RevokeToken(name, audit); !status.ok()) {
    return Send(res, ProblemFromStatus(status), req.path);
  }
  TokenRecord revoked = *token;
  revoked.revoked_at = audit.at;
  Json out = TokenJson(revoked, audit.at);
  out["revoked_by"] = audit.actor;
  out["revoke_reason"] = audit.reason;
  SendJson(res, 200, std::move(out));
}

}  // namespace waystone
