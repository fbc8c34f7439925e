#include "server/permissions.h"

namespace waystone {
namespace {

// see_redacted last: operators have every one but it.
constexpr Permission kAll[] = {
    Permission::kRetry,       Permission::kConfirm, Permission::kCompensate,
    Permission::kSkip,        Permission::kClose,   Permission::kAcknowledge,
    Permission::kPauseTarget, Permission::kRevise,  Permission::kSeeRedacted};

}  // namespace

std::string_view ToString(Permission permission) {
  switch (permission) {
    case Permission::kRetry:
      return "retry";
    case Permission::kConfirm:
      return "confirm";
    case Permission::kCompensate:
      return "compensate";
    case Permission::kSkip:
      return "skip";
    case Permission::kClose:
      return "close";
    case Permission::kAcknowledge:
      return "acknowledge";
    case Permission::kSeeRedacted:
      return "see_redacted";
    case Permission::kPauseTarget:
      return "pause_target";
    case Permission::kRevise:
      return "revise";
  }
  return "?";
}

std::optional<Permission> ParsePermission(std::string_view text) {
  for (Permission permission : kAll) {
    if (ToString(permission) == text) return permission;
  }
  return std::nullopt;
}

Permission PermissionOf(OperatorAction action) {
  switch (action) {
    case OperatorAction::kRetry:
      return Permission::kRetry;
    case OperatorAction::kConfirm:
      return Permission::kConfirm;
    case OperatorAction::kCompensate:
      return Permission::kCompensate;
    case OperatorAction::kSkip:
      return Permission::kSkip;
    case OperatorAction::kClose:
      return Permission::kClose;
  }
  return Permission::kClose;
}

std::set<Permission> PermissionsOf(const std::vector<PermissionRule>& rules, Role role,
                                   const std::string& tenant) {
  const PermissionRule* every_tenant = nullptr;
  for (const PermissionRule& rule : rules) {
    if (rule.role != role) continue;
    if (rule.tenant == tenant) return rule.allowed;
    if (rule.tenant.empty()) every_tenant = &rule;
  }
  if (every_tenant != nullptr) return every_tenant->allowed;
  switch (role) {
    case Role::kViewer:
      return {};
    case Role::kOperator:
      return {std::begin(kAll), std::end(kAll) - 1};  // all but see_redacted
    case Role::kAdmin:
      return {std::begin(kAll), std::end(kAll)};
  }
  return {};
}

std::set<std::string> TenantsWithRules(const std::vector<PermissionRule>& rules, Role role) {
  std::set<std::string> out;
  for (const PermissionRule& rule : rules) {
    if (rule.role == role && !rule.tenant.empty()) out.insert(rule.tenant);
  }
  return out;
}

std::vector<std::string> GroupsOf(const std::vector<ApproverGroup>& groups,
                                  const std::string& token, const std::string& tenant) {
  std::vector<std::string> out;
  for (const ApproverGroup& group : groups) {
    if (group.tenant != tenant) continue;
    for (const std::string& member : group.tokens) {
      if (member == token) out.push_back(group.name);
    }
  }
  return out;
}

}  // namespace waystone
