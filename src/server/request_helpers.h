#pragma once

// Inside the API server: how a handler answers (every problem from problem.h's
// table, every answer redacted) and reads what every route reads alike: the
// tenant, a JSON body. Included by the server's own .cc files only.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "http/http_front.h"
#include "http/problem.h"
#include "server/auth.h"
#include "server/permissions.h"

namespace waystone {

// Answers `problem` as application/problem+json for `path`, with the members of
// `extra` added (a batch's results); a 503 says Retry-After. Redacted.
void Send(ServerResponse& res, const Problem& problem, const std::string& path,
          const nlohmann::json& extra = nlohmann::json::object());

// Answers `body` as application/json. Every answer passes RedactSecrets:
// previews render templates now, and a secret must not leave in one.
void SendJson(ServerResponse& res, int status, nlohmann::json body);

// The name of a role as the API spells it.
const char* RoleName(Role role);

// The tenant a request reads: the token's, or ?tenant= for an all-tenants token
// (nullopt: all of them).
std::optional<std::string> TenantOf(const Principal& p, const ServerRequest& req);

// The one tenant a write acts in: the token's, or `asked` for an all-tenants
// token; answers 400 or 403 itself (nullopt) when there is none.
std::optional<std::string> WriteTenant(const Principal& p, const std::string& asked,
                                       const ServerRequest& req, ServerResponse& res);

// True when `p` may do `what` in `tenant` under `rules`; otherwise answers 403
// naming the action, the role and the tenant, and returns false.
bool Permitted(const std::vector<PermissionRule>& rules, const Principal& p,
               const std::string& tenant, Permission what, const ServerRequest& req,
               ServerResponse& res);

// Reads the query parameter `name`, when given, into `*value`: a whole number from
// `low` to `high` (in `unit`, e.g. " of seconds", for the error). False, having
// answered 400, when it is not one.
bool WholeNumberParam(const ServerRequest& req, ServerResponse& res, const char* name, int low,
                      int high, int* value, const char* unit = "");

// True when an If-None-Match list names `etag` (or is "*"); weak forms (W/"...")
// match their strong ones (RFC 9110 13.1.2: weak comparison for GET).
bool IfNoneMatchNames(const std::string& if_none_match, std::string_view etag);

// Tags a 200 answer to a GET with a strong ETag over its body (unless its handler
// tagged it, with TagAnswer), and turns it into a 304 without a body when the
// request's If-None-Match names that tag: the console polls its views this way
// (RFC 9110 13.1.2), and an unchanged view costs the client nothing to read. The
// tag is of this token's view (Vary: Authorization); nothing caches the answer.
void Revalidate(const ServerRequest& req, ServerResponse& res);

// Tags the answer with an ETag over `basis`: what the answer says, without what
// changes on every read (triage's "at"; such a tag is `weak`: two answers with it
// may differ in that).
void TagAnswer(ServerResponse& res, std::string_view basis, bool weak);

// False, having answered 415, unless the body is empty or sent as application/json.
bool CheckJsonMediaType(const ServerRequest& req, ServerResponse& res);

// Parses a JSON body with `parse` (request_bodies.h), answering 415 or 400 itself.
template <typename Parse>
auto JsonBody(const ServerRequest& req, ServerResponse& res, Parse parse)
    -> std::optional<typename decltype(parse(req.body))::value_type> {
  if (!CheckJsonMediaType(req, res)) return std::nullopt;
  auto parsed = parse(req.body);
  if (!parsed.ok()) {
    Send(res, BadRequest(std::string(parsed.status().message())), req.path);
    return std::nullopt;
  }
  return std::move(*parsed);
}

}  // namespace waystone
