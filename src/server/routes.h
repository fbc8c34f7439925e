#pragma once

// The API's routes as data: which path and method, the least role, whether a
// token is needed, whether it writes, which query parameters it takes. Matching
// and the one reading of the query live here, without I/O, so the screen that
// runs before a body is read and the handlers agree on them.

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "http/http_front.h"
#include "server/auth.h"

namespace waystone {

enum class RouteId {
  kHealth,
  kReady,
  kMetrics,
  kOpenApi,
  kListInstances,
  kStart,
  kShow,
  kAct,
  kListAlerts,
  kAcknowledge,
  kEvents,
  kMe,
  kTriage,
  kConsole,
  kAttempts,
  kCreateBatch,
  kListBatches,
  kShowBatch,
  kChangeBatch,
  kListTokens,
  kCreateToken,
  kRevokeToken,
  kListTargets,
  kChangeTarget,
  kDecide,
  kRevise,
};

struct RouteSpec {
  RouteId id;
  const char* method;
  Role role;                     // the least role
  bool open;                     // no token needed
  bool writes;                   // needs an engine
  std::set<std::string> params;  // the query parameters it takes
};

// A request matched to its route, with what its path named; kept from the screen
// for the handler.
struct Screened {
  const RouteSpec* route = nullptr;
  std::string key;     // instance routes; the alert's or batch's public id; the console's
                       // file; a token's name
  std::string action;  // kAct; kChangeBatch: pause, resume or cancel; kChangeTarget: pause
                       // or resume
  Principal principal;
};

// The routes that serve `path` (GET and POST may share one). Instance keys may
// hold '/': an action is the last segment.
std::vector<Screened> MatchPath(const std::string& path);

// The one reading of `dry_run`: exactly true or false (absent = false); nullopt
// for anything else.
std::optional<bool> DryRun(const ServerRequest& req);

// Checks the query against the route: known names only, each at most once,
// booleans exactly true or false. The reason when refused.
std::optional<std::string> CheckQuery(const ServerRequest& req, const RouteSpec& route);

// The query parameter, or "" when absent (after CheckQuery: never repeated).
std::string Param(const ServerRequest& req, std::string_view name);

}  // namespace waystone
