#pragma once

// What a code workflow's call (ctx.Call) makes of an HTTP answer: its class, its
// result as the step sees it, and its failure as a step's.

#include <string>

#include "absl/status/status.h"
#include "connectors/http/http_client.h"
#include "engine/code_workflow.h"
#include "model/classify.h"

namespace waystone::code_call {

// What a call's body says of its class.
using BodyClassifier = decltype(CodeCallOptions::classify);

// The class of `answer`: what `classify` reads in the body of a 2xx answer, else by its
// status (with `errors`). (A 5xx that may have acted stays unknown whatever its body
// says.)
ErrorClass ClassOf(const HttpResponse& answer, const StatusOverrides& errors,
                   const BodyClassifier* classify);

// `answer` of a request that was not sent, its class in `error_class` (if given).
HttpResponse Unsent(HttpResponse answer, const StatusOverrides& errors, ErrorClass* error_class);

// A request that was not sent: kInvalid (rejected) unless said otherwise.
HttpResponse Unsendable(const std::string& why,
                        CallOutcome::Kind kind = CallOutcome::Kind::kInvalid,
                        bool withdrawn = false);

// An answer as a call's result: {"status": n, "headers": {...}, "body": "text"}.
std::string ResultJson(const HttpResponse& answer);

// An answer in a line: "HTTP 503 <the body's first 200 bytes>" or "no answer (why)".
std::string Described(const HttpResponse& answer);

// A call's failure as a step's: its class in its code (ClassifyCodeFailure).
absl::Status Failure(ErrorClass error, const HttpResponse& answer);

}  // namespace waystone::code_call
