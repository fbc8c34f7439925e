#include "server/request_bodies.h"

#include <set>

#include <nlohmann/json.hpp>

#include "base/status_macros.h"
#include "model/json_text.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

absl::StatusOr<Json> ObjectOf(const std::string& body) {
  if (body.empty()) return Json::object();
  WS_ASSIGN_OR_RETURN(Json parsed, ParseBoundedJson(body, "the body"));
  if (!parsed.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  return parsed;
}

// Reads an optional string field; null counts as absent.
absl::Status StringField(const Json& body, const char* name, std::string* out) {
  if (!body.contains(name) || body[name].is_null()) return absl::OkStatus();
  if (!body[name].is_string()) {
    return absl::InvalidArgumentError(std::string("'") + name + "' must be a string");
  }
  *out = body[name].get<std::string>();
  return absl::OkStatus();
}

absl::Status OnlyFields(const Json& body, const std::set<std::string>& allowed) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!allowed.contains(it.key())) {
      return absl::InvalidArgumentError("unknown field '" + it.key() + "'");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StartBody> ParseStartBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  StartBody out;
  WS_RETURN_IF_ERROR(StringField(body, "workflow", &out.workflow));
  WS_RETURN_IF_ERROR(StringField(body, "tenant", &out.tenant));
  if (out.workflow.empty()) return absl::InvalidArgumentError("'workflow' is required");
  if (!body.contains("input")) return absl::InvalidArgumentError("'input' is required");
  if (!body["input"].is_object())
    return absl::InvalidArgumentError("'input' must be a JSON object");
  WS_RETURN_IF_ERROR(OnlyFields(body, {"workflow", "input", "tenant"}));
  out.input_json = JsonText(body["input"]);
  return out;
}

absl::StatusOr<OperatorRequest> ParseActionBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  OperatorRequest request;
  WS_RETURN_IF_ERROR(StringField(body, "reason", &request.reason));
  WS_RETURN_IF_ERROR(StringField(body, "step", &request.step));
  WS_RETURN_IF_ERROR(StringField(body, "external_id", &request.external_id));
  if (body.contains("happened")) {
    if (!body["happened"].is_boolean()) {
      return absl::InvalidArgumentError("'happened' must be true or false");
    }
    request.happened = body["happened"].get<bool>();
  }
  if (body.contains("response")) request.response_json = JsonText(body["response"]);
  WS_RETURN_IF_ERROR(OnlyFields(body, {"reason", "step", "external_id", "happened", "response"}));
  return request;
}

absl::StatusOr<ReviseBody> ParseReviseBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  ReviseBody out;
  WS_RETURN_IF_ERROR(StringField(body, "reason", &out.reason));
  WS_RETURN_IF_ERROR(OnlyFields(body, {"input", "reason"}));
  if (!body.contains("input")) return absl::InvalidArgumentError("'input' is required");
  if (!body["input"].is_object()) {
    return absl::InvalidArgumentError("'input' must be a JSON object");
  }
  if (out.reason.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("'reason' is required: why the input changes");
  }
  out.input_json = JsonText(body["input"]);
  return out;
}

absl::StatusOr<DecisionBody> ParseDecisionBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  DecisionBody out;
  std::string decision;
  WS_RETURN_IF_ERROR(StringField(body, "step", &out.step));
  WS_RETURN_IF_ERROR(StringField(body, "data_version", &out.data_version));
  WS_RETURN_IF_ERROR(StringField(body, "decision", &decision));
  WS_RETURN_IF_ERROR(StringField(body, "comment", &out.comment));
  WS_RETURN_IF_ERROR(OnlyFields(body, {"step", "request", "data_version", "decision", "comment"}));
  if (body.contains("request")) {
    const Json& request = body["request"];
    if (!request.is_number_integer() || request.get<int64_t>() < 1 ||
        request.get<int64_t>() > 1'000'000) {
      return absl::InvalidArgumentError("'request' must be the request's number (1, 2, ...)");
    }
    out.request = request.get<int>();
  }
  if (out.step.empty()) return absl::InvalidArgumentError("'step' is required: the approval step");
  if (out.data_version.empty()) {
    return absl::InvalidArgumentError(
        "'data_version' is required: the data version of the request decided on");
  }
  if (decision != "approve" && decision != "reject") {
    return absl::InvalidArgumentError("'decision' must be approve or reject");
  }
  out.approve = decision == "approve";
  if (out.comment.size() > 2000) {
    return absl::InvalidArgumentError("'comment' is longer than 2000 bytes");
  }
  return out;
}

absl::StatusOr<BatchBody> ParseBatchBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  BatchBody out;
  std::string action;
  WS_RETURN_IF_ERROR(StringField(body, "action", &action));
  WS_RETURN_IF_ERROR(StringField(body, "tenant", &out.tenant));
  auto parsed = ParseOperatorAction(action);
  if (!parsed) {
    return absl::InvalidArgumentError(
        "'action' must be one of retry, confirm, compensate, skip, close");
  }
  if (!body.contains("filter") || !body["filter"].is_object() || body["filter"].empty()) {
    return absl::InvalidArgumentError(
        "'filter' is required: an object with at least one filter, e.g. {\"workflow\": "
        "\"order-to-erp\", \"state\": \"needs_attention\"}");
  }
  for (auto it = body["filter"].begin(); it != body["filter"].end(); ++it) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError("filter '" + it.key() + "' must be a string");
    }
    out.filter[it.key()] = it->get<std::string>();
  }
  Json fields = body;
  for (const char* name : {"action", "tenant", "filter"}) fields.erase(name);
  WS_ASSIGN_OR_RETURN(out.request, ParseActionBody(JsonText(fields)));
  out.request.action = *parsed;
  if (out.request.reason.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("a reason is required");
  }
  return out;
}

absl::StatusOr<TokenBody> ParseTokenBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  TokenBody out;
  WS_RETURN_IF_ERROR(StringField(body, "name", &out.name));
  WS_RETURN_IF_ERROR(StringField(body, "role", &out.role));
  WS_RETURN_IF_ERROR(StringField(body, "tenant", &out.tenant));
  WS_RETURN_IF_ERROR(StringField(body, "expires", &out.expires));
  WS_RETURN_IF_ERROR(OnlyFields(body, {"name", "role", "tenant", "expires"}));
  if (out.name.empty()) return absl::InvalidArgumentError("'name' is required");
  if (out.role.empty()) return absl::InvalidArgumentError("'role' is required");
  return out;
}

absl::StatusOr<std::string> ParseReasonBody(const std::string& text) {
  WS_ASSIGN_OR_RETURN(Json body, ObjectOf(text));
  std::string reason;
  WS_RETURN_IF_ERROR(StringField(body, "reason", &reason));
  return reason;
}

}  // namespace waystone
