// Workflows written as functions: the public Context and Tx over the engine's
// CodeContext and CodeTransaction, and the built-in codecs' halves.

#include "api/workflow.h"

#include <charconv>
#include <cmath>
#include <exception>
#include <utility>

#include <nlohmann/json.hpp>

#include "api/translate.h"
#include "engine/code_workflow.h"

namespace waystone::api {
namespace {

// A status of the function's back to the engine: the code carries the class of a
// step's failure (code_workflow.h ClassifyCodeFailure).
absl::Status ToAbsl(const Status& status) {
  const std::string& message = status.message();
  switch (status.code()) {
    case Status::Code::kOk:
      return absl::OkStatus();
    case Status::Code::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case Status::Code::kNotFound:
      return absl::NotFoundError(message);
    case Status::Code::kAlreadyExists:
      return absl::AlreadyExistsError(message);
    case Status::Code::kFailedPrecondition:
      return absl::FailedPreconditionError(message);
    case Status::Code::kUnavailable:
      return absl::UnavailableError(message);
    case Status::Code::kDeadlineExceeded:
      return absl::DeadlineExceededError(message);
    case Status::Code::kAborted:
      return absl::AbortedError(message);
    case Status::Code::kInternal:
      break;
  }
  return absl::InternalError(message);
}

// The engine's status to the function: a stopped run is kAborted, so the function
// can tell it from a failure.
Status FromEngine(const absl::Status& status) {
  if (IsCodeRunStopped(status))
    return Status(Status::Code::kAborted, std::string(status.message()));
  return FromAbsl(status);
}

// Calls the program's code: an exception it throws becomes a kInternal failure (a
// rejection) of what threw, never an escape through the engine's threads.
template <typename F>
auto Guarded(const char* what, F&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const std::exception& e) {
    return Status(Status::Code::kInternal, std::string(what) + " threw: " + e.what());
  } catch (...) {
    return Status(Status::Code::kInternal, std::string(what) + " threw an exception");
  }
}

template <typename T>
absl::StatusOr<T> ToAbslOr(Result<T> result) {
  if (!result.ok()) return ToAbsl(result.status());
  return std::move(*result);
}

// The engine's record of a call's answer ({"status", "headers", "body"}) and back.
std::string ResponseJson(const HttpResponse& response) {
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : response.headers) headers[name] = value;
  return nlohmann::json{{"status", response.status}, {"headers", headers}, {"body", response.body}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<HttpResponse> ParseResponse(const std::string& json) {
  const nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed.contains("status") || !parsed["status"].is_number_integer() ||
      !parsed.contains("body") || !parsed["body"].is_string()) {
    return Status(Status::Code::kInvalidArgument,
                  "not a call's recorded response: " + json.substr(0, 120));
  }
  HttpResponse response;
  response.status = parsed["status"].get<int>();
  response.body = parsed["body"].get<std::string>();
  if (parsed.contains("headers") && parsed["headers"].is_object()) {
    for (const auto& [name, value] : parsed["headers"].items()) {
      if (value.is_string()) response.headers.emplace_back(name, value.get<std::string>());
    }
  }
  return response;
}

waystone::HttpRequest ToEngine(const HttpRequest& request) {
  waystone::HttpRequest out;
  out.method = request.method;
  out.url = request.url;
  out.headers = request.headers;
  out.body = request.body;
  out.timeout = request.timeout.count();
  return out;
}

waystone::ErrorClass ToEngine(ErrorClass error) {
  switch (error) {
    case ErrorClass::kTransient:
      return waystone::ErrorClass::kTransient;
    case ErrorClass::kUnknown:
      return waystone::ErrorClass::kUnknown;
    case ErrorClass::kRejected:
      break;
  }
  return waystone::ErrorClass::kRejected;
}

RetryPolicy ToPolicy(const Retry& retry) {
  RetryPolicy policy;
  policy.max_attempts = std::max(1, retry.max_attempts);
  policy.initial_interval = std::max<int64_t>(0, retry.initial_backoff.count());
  policy.max_interval = std::max<int64_t>(0, retry.max_backoff.count());
  return policy;
}

class TxImpl final : public Tx {
 public:
  explicit TxImpl(CodeTransaction& tx) : tx_(tx) {}

  Result<std::string> Execute(const std::string& sql,
                              const std::map<std::string, SqlValue>& params) override {
    std::map<std::string, SqlParam> bound;
    for (const auto& [name, value] : params) {
      SqlParam param;
      switch (value.kind) {
        case SqlValue::Kind::kNull:
          param.kind = SqlParam::Kind::kNull;
          break;
        case SqlValue::Kind::kText:
          param.kind = SqlParam::Kind::kText;
          break;
        case SqlValue::Kind::kInteger:
          param.kind = SqlParam::Kind::kInteger;
          break;
        case SqlValue::Kind::kReal:
          param.kind = value.text == "null" ? SqlParam::Kind::kNull : SqlParam::Kind::kReal;
          break;
      }
      if (param.kind != SqlParam::Kind::kNull) param.text = value.text;
      bound.emplace(name, std::move(param));
    }
    auto rows = tx_.Execute(sql, bound);
    if (!rows.ok()) return FromAbsl(rows.status());
    return *rows;
  }

  void Emit(const std::string& type, const std::string& payload_json) override {
    tx_.Emit(type, payload_json);
  }

 private:
  CodeTransaction& tx_;
};

class ContextImpl final : public Context {
 public:
  explicit ContextImpl(CodeContext& ctx) : ctx_(ctx) {}
  ~ContextImpl() override = default;

  Result<std::string> StepJson(const std::string& name,
                               const std::function<Result<std::string>()>& fn,
                               const RawStepOptions& options) override {
    CodeStepOptions code;
    code.repeatable = options.repeatable;
    code.retry = ToPolicy(options.retry);
    code.unknown = ToPolicy(options.unknown);
    code.timeout = std::max<int64_t>(0, options.timeout.count());
    if (options.lookup) {
      code.lookup = [lookup = options.lookup]() {
        return ToAbslOr(Guarded("the lookup", [&] { return lookup(); }));
      };
    }
    if (options.compensate) {
      // Called after the function returned, with the context of that moment.
      code.compensate = [undo = options.compensate](CodeContext& now, const std::string& json) {
        ContextImpl context(now);
        return ToAbsl(Guarded("the compensation", [&] { return undo(context, json); }));
      };
    }
    auto result = ctx_.Step(
        name, options.input,
        [&fn]() { return ToAbslOr(Guarded("the step", [&] { return fn(); })); }, code);
    if (!result.ok()) return FromEngine(result.status());
    return *result;
  }

  Result<HttpResponse> Call(const std::string& name, const HttpRequest& request,
                            const CallOptions& options) override {
    CodeCallOptions code;
    code.repeatable = options.repeatable;
    code.retry = ToPolicy(options.retry);
    code.unknown = ToPolicy(options.unknown);
    for (const auto& [status, error] : options.errors) {
      switch (error) {
        case ErrorClass::kTransient:
          code.transient_statuses.push_back(status);
          break;
        case ErrorClass::kUnknown:
          code.unknown_statuses.push_back(status);
          break;
        case ErrorClass::kRejected:
          code.rejected_statuses.push_back(status);
          break;
      }
    }
    if (options.classify) {
      code.classify = [&classify = options.classify](
                          const std::string& answer_json) -> std::optional<waystone::ErrorClass> {
        // One that cannot say (it threw) leaves the answer unknown: looked up, or
        // left to an operator, never taken as a refusal of what may have been done.
        Result<HttpResponse> answer = ParseResponse(answer_json);
        if (!answer.ok()) return waystone::ErrorClass::kUnknown;
        Result<std::optional<ErrorClass>> said =
            Guarded("the call's `classify`",
                    [&]() -> Result<std::optional<ErrorClass>> { return classify(*answer); });
        if (!said.ok()) return waystone::ErrorClass::kUnknown;
        if (!said->has_value()) return std::nullopt;
        return ToEngine(**said);
      };
    }
    if (options.lookup) code.lookup = ToEngine(*options.lookup);
    if (options.found) {
      code.found =
          [&found = options.found](
              const std::string& answer_json) -> absl::StatusOr<std::optional<std::string>> {
        Result<HttpResponse> answer = ParseResponse(answer_json);
        if (!answer.ok()) return ToAbsl(answer.status());
        Result<std::optional<HttpResponse>> matched =
            Guarded("the lookup's `found`",
                    [&]() -> Result<std::optional<HttpResponse>> { return found(*answer); });
        if (!matched.ok()) return ToAbsl(matched.status());
        if (!matched->has_value()) return std::optional<std::string>();
        return std::optional<std::string>(ResponseJson(**matched));
      };
    }
    if (options.next_page) {
      code.next_page = [&next_page = options.next_page](const std::string& page_json)
          -> absl::StatusOr<std::optional<waystone::HttpRequest>> {
        Result<HttpResponse> page = ParseResponse(page_json);
        if (!page.ok()) return ToAbsl(page.status());
        Result<std::optional<HttpRequest>> next =
            Guarded("the lookup's `next_page`",
                    [&]() -> Result<std::optional<HttpRequest>> { return next_page(*page); });
        if (!next.ok()) return ToAbsl(next.status());
        if (!next->has_value()) return std::optional<waystone::HttpRequest>();
        return std::optional<waystone::HttpRequest>(ToEngine(**next));
      };
    }
    if (options.compensate) {
      // Runs after the function returned: it keeps a copy.
      code.compensate = [undo = options.compensate](const std::string& result_json)
          -> absl::StatusOr<std::optional<waystone::HttpRequest>> {
        Result<HttpResponse> result = ParseResponse(result_json);
        if (!result.ok()) return ToAbsl(result.status());
        Result<std::optional<HttpRequest>> request =
            Guarded("the compensation",
                    [&]() -> Result<std::optional<HttpRequest>> { return undo(*result); });
        if (!request.ok()) return ToAbsl(request.status());
        if (!request->has_value()) return std::optional<waystone::HttpRequest>();
        return std::optional<waystone::HttpRequest>(ToEngine(**request));
      };
    }
    auto recorded = ctx_.Call(name, ToEngine(request), code);
    if (!recorded.ok()) return FromEngine(recorded.status());
    return ParseResponse(*recorded);
  }

  Result<std::string> TransactionJson(const std::string& name,
                                      const std::function<Result<std::string>(Tx&)>& fn) override {
    auto result = ctx_.Transaction(name, [&fn](CodeTransaction& tx) {
      TxImpl session(tx);
      return ToAbslOr(Guarded("the transaction", [&] { return fn(session); }));
    });
    if (!result.ok()) return FromEngine(result.status());
    return *result;
  }

  Result<std::chrono::system_clock::time_point> Now() override {
    auto now = ctx_.Now();
    if (!now.ok()) return FromEngine(now.status());
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(*now));
  }

  Result<uint64_t> Random() override {
    auto value = ctx_.Random();
    if (!value.ok()) return FromEngine(value.status());
    return *value;
  }

  Result<std::string> Uuid() override {
    auto value = ctx_.Uuid();
    if (!value.ok()) return FromEngine(value.status());
    return *value;
  }

  Status Sleep(std::chrono::milliseconds duration) override {
    return FromEngine(ctx_.Sleep(duration.count()));
  }

  Result<std::string> WaitEvent(const std::string& event_type,
                                std::chrono::milliseconds timeout) override {
    if (timeout.count() < 0) {
      return Status(Status::Code::kInvalidArgument,
                    "WaitEvent('" + event_type + "'): a timeout is 0 (none) or more");
    }
    auto data = ctx_.WaitEvent(event_type, timeout.count());
    if (!data.ok()) return FromEngine(data.status());
    return *data;
  }

  Result<bool> Patched(const std::string& patch) override {
    auto patched = ctx_.Patched(patch);
    if (!patched.ok()) return FromEngine(patched.status());
    return *patched;
  }

  const std::string& idempotency_key() const override { return ctx_.idempotency_key(); }
  const std::string& key() const override { return ctx_.business_key(); }

 private:
  CodeContext& ctx_;
};

}  // namespace

absl::StatusOr<std::string> FunctionWorkflow::Run(CodeContext& ctx,
                                                  const std::string& input_json) const {
  ContextImpl context(ctx);
  return ToAbslOr(Guarded("the workflow function", [&] { return function_(context, input_json); }));
}

std::string EncodeJsonString(const std::string& value) {
  return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<std::string> DecodeJsonString(const std::string& json) {
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_string()) {
    return Status(Status::Code::kInvalidArgument, "not a JSON string: " + json.substr(0, 80));
  }
  return parsed.get<std::string>();
}

std::string EncodeJsonDouble(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  if (error != std::errc()) return "null";
  return std::string(text, end);
}

Result<double> DecodeJsonDouble(const std::string& json) {
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_number()) {
    return Status(Status::Code::kInvalidArgument, "not a JSON number: " + json.substr(0, 80));
  }
  return parsed.get<double>();
}

}  // namespace waystone::api
