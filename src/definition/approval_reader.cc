// An `approval` step's fields: who approves, what they see, how long it waits.
// Declared in definition_readers.h.

#include <string>

#include "definition/definition_readers.h"

namespace waystone {
namespace {
using Json = nlohmann::json;
}  // namespace

void ApprovalReader::ReadApproval(const YAML::Node& node, const std::string& name,
                                  ApprovalSpec* out) {
  if (!node.IsMap()) {
    Error(node, name, "'approval' must be a mapping such as { material: [/amount] }");
    return;
  }
  CheckFields(node, name,
              {"material", "summary", "requester", "approvers", "on_reject", "remind_after",
               "escalate_after", "escalate_to", "timeout", "on_timeout"},
              "approval");
  out->remind_after = Duration(node, "remind_after", 0, name);
  out->escalate_after = Duration(node, "escalate_after", 0, name);
  out->escalate_to = OptionalString(node, "escalate_to", name);
  out->timeout = Duration(node, "timeout", 0, name);
  if ((out->escalate_after > 0) != !out->escalate_to.empty()) {
    Error(node, name,
          "'approval.escalate_after' and 'approval.escalate_to' (a group) go "
          "together");
  } else if (!out->escalate_to.empty() && !ValidName(out->escalate_to)) {
    Error(node["escalate_to"], name, "'approval.escalate_to' must be a group's name");
  }
  if (const YAML::Node outcome = node["on_timeout"]) {
    const std::string text = outcome.IsScalar() ? outcome.Scalar() : "";
    if (!node["timeout"]) {
      Error(outcome, name, "'approval.on_timeout' needs 'approval.timeout'");
    } else if (text == "reject") {
      out->timeout_rejects = true;
    } else if (text == "close") {
      out->on_timeout = RejectRoute::kClose;
    } else if (text != "wait") {
      Error(outcome, name, "'approval.on_timeout' must be reject, close or wait");
    }
  }
  const YAML::Node material = node["material"];
  if (!material || !material.IsSequence() || material.size() == 0) {
    Error(material ? material : node, name,
          "'approval.material' must list the input's JSON pointers an approval is about, "
          "such as [/amount, /lines]");
  } else {
    for (const YAML::Node& pointer : material) {
      if (!pointer.IsScalar() || !ValidJsonPointer(pointer.Scalar())) {
        Error(pointer, name,
              "'approval.material' entry '" + (pointer.IsScalar() ? pointer.Scalar() : "?") +
                  "' is not a JSON pointer such as /amount");
      } else {
        out->material.push_back(pointer.Scalar());
      }
    }
  }
  out->summary = OptionalString(node, "summary", name);
  out->requester = OptionalString(node, "requester", name);
  if (const YAML::Node approvers = node["approvers"]) {
    if (!approvers.IsMap() || (approvers["role"] ? 1 : 0) + (approvers["group"] ? 1 : 0) != 1) {
      Error(approvers, name,
            "'approval.approvers' names one 'role' (viewer, operator, admin) "
            "or one 'group' (of the server config's groups:)");
    } else {
      CheckFields(approvers, name, {"role", "group"}, "approval.approvers");
      out->group = OptionalString(approvers, "group", name);
      if (approvers["role"]) {
        out->role = OptionalString(approvers, "role", name);
        if (out->role != "viewer" && out->role != "operator" && out->role != "admin") {
          Error(approvers["role"], name,
                "'approval.approvers.role' must be viewer, operator "
                "or admin");
        }
      } else if (!ValidName(out->group)) {
        Error(approvers["group"], name,
              "'approval.approvers.group' must be a name of "
              "letters, digits, '-', '_' and '.'");
      }
    }
  }
  if (const YAML::Node route = node["on_reject"]) {
    const std::string text = route.IsScalar() ? route.Scalar() : "";
    if (text == "compensate")
      out->on_reject = RejectRoute::kCompensate;
    else if (text == "close")
      out->on_reject = RejectRoute::kClose;
    else if (text == "wait")
      out->on_reject = RejectRoute::kWait;
    else
      Error(route, name, "'approval.on_reject' must be compensate, close or wait");
  }
}

}  // namespace waystone
