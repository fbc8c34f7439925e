#pragma once

// What each role may do, per tenant: the server config's `permissions:` section
// narrows the operator actions a role may take and grants `see_redacted`. The
// route's least role (routes.h) is checked first; these come after it. Values
// only, no I/O.

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/operate/operator_plan.h"
#include "server/auth.h"

namespace waystone {

enum class Permission : uint8_t {
  kRetry = 1,
  kConfirm = 2,
  kCompensate = 3,
  kSkip = 4,
  kClose = 5,
  kAcknowledge = 6,  // an alert
  kSeeRedacted = 7,  // the values a definition's `redact:` list hides
  kPauseTarget = 8,  // pause and resume every call to a target
  kRevise = 9,       // revise an instance's input (a new input version)
};

std::string_view ToString(Permission permission);
std::optional<Permission> ParsePermission(std::string_view text);

// The permission an operator action needs.
Permission PermissionOf(OperatorAction action);

// One entry of `permissions:`: all that `role` may do in `tenant` ("" = every
// tenant without an entry of its own). A value type.
struct PermissionRule {
  Role role = Role::kOperator;
  std::string tenant;
  std::set<Permission> allowed;
  int line = 0;  // in the config file
};

// Returns what `role` may do in `tenant`: the rule for that role and tenant, else
// the role's rule for every tenant, else the defaults (viewers nothing, operators
// every action, admins every action and see_redacted).
std::set<Permission> PermissionsOf(const std::vector<PermissionRule>& rules, Role role,
                                   const std::string& tenant);

// One entry of `groups:`: the tokens (by name) that form group `name` in `tenant`.
// An approval step may be decided only by its group (definition.h, ApprovalSpec).
struct ApproverGroup {
  std::string tenant;
  std::string name;
  std::vector<std::string> tokens;
  int line = 0;  // in the config file
};

// The groups of `tenant` that the token named `token` is in.
std::vector<std::string> GroupsOf(const std::vector<ApproverGroup>& groups,
                                  const std::string& token, const std::string& tenant);

// The tenants some rule names for `role` (where its permissions may differ from
// those of every other tenant).
std::set<std::string> TenantsWithRules(const std::vector<PermissionRule>& rules, Role role);

}  // namespace waystone
