#include "engine/drive/code_call_answers.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "model/json_text.h"
#include "rules/transitions.h"

namespace waystone::code_call {

ErrorClass ClassOf(const HttpResponse& answer, const StatusOverrides& errors,
                   const BodyClassifier* classify) {
  if (classify != nullptr && *classify && answer.outcome.kind == CallOutcome::Kind::kResponse &&
      answer.outcome.status >= 200 && answer.outcome.status < 300) {
    if (std::optional<ErrorClass> said = (*classify)(ResultJson(answer))) return *said;
  }
  return ClassifyAnswer(answer, {&errors}).error_class;
}

HttpResponse Unsent(HttpResponse answer, const StatusOverrides& errors, ErrorClass* error_class) {
  if (error_class != nullptr) *error_class = ClassifyAnswer(answer, {&errors}).error_class;
  return answer;
}

HttpResponse Unsendable(const std::string& why, CallOutcome::Kind kind, bool withdrawn) {
  HttpResponse answer;
  answer.outcome.kind = kind;
  answer.outcome.withdrawn = withdrawn;
  answer.error = why;
  return answer;
}

std::string ResultJson(const HttpResponse& answer) {
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : answer.headers) headers[name] = value;
  return JsonText(nlohmann::json{
      {"status", answer.outcome.status}, {"headers", headers}, {"body", answer.body}});
}

std::string Described(const HttpResponse& answer) {
  if (answer.outcome.kind != CallOutcome::Kind::kResponse) {
    return "no answer (" + (answer.error.empty() ? std::string("connection lost") : answer.error) +
           ")";
  }
  return "HTTP " + std::to_string(answer.outcome.status) + " " + answer.body.substr(0, 200);
}

absl::Status Failure(ErrorClass error, const HttpResponse& answer) {
  switch (error) {
    case ErrorClass::kNone:
      return absl::OkStatus();
    case ErrorClass::kTransient:
      return absl::UnavailableError(Described(answer));
    case ErrorClass::kUnknown:
      return absl::DeadlineExceededError(Described(answer));
    case ErrorClass::kRejected:
      break;
  }
  return absl::FailedPreconditionError(Described(answer));
}

}  // namespace waystone::code_call
