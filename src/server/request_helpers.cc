#include "server/request_helpers.h"

#include <cstdlib>

#include "base/sha256.h"
#include "model/json_text.h"
#include "server/routes.h"

namespace waystone {

void Send(ServerResponse& res, const Problem& problem, const std::string& path,
          const nlohmann::json& extra) {
  res.status = problem.status;
  nlohmann::json body = nlohmann::json::parse(problem.ToJson(path));
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  if (problem.status == 503) res.SetHeader("Retry-After", "1");
  RedactStrings(body);
  res.SetContent(JsonText(body), "application/problem+json");
}

void SendJson(ServerResponse& res, int status, nlohmann::json body) {
  res.status = status;
  RedactStrings(body);
  res.SetContent(JsonText(body), "application/json");
}

const char* RoleName(Role role) {
  return role == Role::kAdmin ? "admin" : role == Role::kOperator ? "operator" : "viewer";
}

bool WholeNumberParam(const ServerRequest& req, ServerResponse& res, const char* name, int low,
                      int high, int* value, const char* unit) {
  if (req.Query(name) == nullptr) return true;
  const std::string text = Param(req, name);
  const int number = std::atoi(text.c_str());
  if (number < low || number > high || std::to_string(number) != text) {
    Send(res,
         BadRequest(std::string(name) + " must be a whole number" + unit + " from " +
                    std::to_string(low) + " to " + std::to_string(high)),
         req.path);
    return false;
  }
  *value = number;
  return true;
}

std::optional<std::string> TenantOf(const Principal& p, const ServerRequest& req) {
  const std::string asked = Param(req, "tenant");
  if (p.tenant == "*") return asked.empty() ? std::nullopt : std::optional<std::string>(asked);
  return p.tenant;
}

std::optional<std::string> WriteTenant(const Principal& p, const std::string& asked,
                                       const ServerRequest& req, ServerResponse& res) {
  if (p.tenant == "*") {
    if (asked.empty()) {
      Send(res, BadRequest("an all-tenants token must name the tenant"), req.path);
      return std::nullopt;
    }
    return asked;
  }
  if (!asked.empty() && asked != p.tenant) {
    Send(res, Forbidden("the token is for tenant '" + p.tenant + "'"), req.path);
    return std::nullopt;
  }
  return p.tenant;
}

bool Permitted(const std::vector<PermissionRule>& rules, const Principal& p,
               const std::string& tenant, Permission what, const ServerRequest& req,
               ServerResponse& res) {
  if (PermissionsOf(rules, p.role, tenant).contains(what)) return true;
  const std::string action(ToString(what));
  Send(res,
       Forbidden("the " + std::string(RoleName(p.role)) + " role may not " + action +
                 " in tenant '" + tenant + "' (the server config's permissions)"),
       req.path, {{"action", action}, {"role", RoleName(p.role)}, {"tenant", tenant}});
  return false;
}

bool CheckJsonMediaType(const ServerRequest& req, ServerResponse& res) {
  const std::string* type = req.Header("content-type");
  if (!req.body.empty() && type != nullptr && !type->starts_with("application/json")) {
    Send(res, MakeProblem(ProblemKind::kUnsupportedMediaType, "send application/json"), req.path);
    return false;
  }
  return true;
}

bool IfNoneMatchNames(const std::string& if_none_match, std::string_view etag) {
  // RFC 9110 13.1.2: "*", or a comma-separated list of (possibly weak) tags,
  // compared weakly (the opaque part alone).
  const std::string_view opaque = etag.starts_with("W/") ? etag.substr(2) : etag;
  std::string_view rest = if_none_match;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (item == "*") return true;
    if (item.starts_with("W/")) item.remove_prefix(2);
    if (!item.empty() && item == opaque) return true;
  }
  return false;
}

void TagAnswer(ServerResponse& res, std::string_view basis, bool weak) {
  // 128 bits of a hash: a changed view never keeps its tag.
  res.SetHeader("ETag", (weak ? "W/\"" : "\"") + Sha256Hex(basis).substr(0, 32) + "\"");
}

void Revalidate(const ServerRequest& req, ServerResponse& res) {
  if (res.status != 200) return;
  if (res.Header("ETag").empty()) TagAnswer(res, res.body, /*weak=*/false);
  const std::string etag = res.Header("ETag");
  // Kept by no cache, not even the browser's (these are a token's business data);
  // a client revalidates with the tag it kept itself.
  res.SetHeader("Cache-Control", "no-store");
  res.SetHeader("Vary", "Authorization");
  const std::string* if_none_match = req.Header("if-none-match");
  if (if_none_match != nullptr && IfNoneMatchNames(*if_none_match, etag)) {
    res.status = 304;
    res.body.clear();
  }
}

}  // namespace waystone
