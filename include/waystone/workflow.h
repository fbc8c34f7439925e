#pragma once

// Workflows written as C++ functions. A workflow is a function of a Context and
// its input; the engine runs it under the instance's lease, and on every run
// (after a crash, on another worker, after a timer) from the top: each step it
// asks for that the instance already recorded returns its recorded result without
// running, each new one runs once and is checkpointed before the function goes on
// (re-execution). So the function must ask for the same steps in the same order
// on every run: anything that varies (the clock, randomness, a read of the
// outside world) goes through the Context or a step. See docs/cpp-api.md.
//
//   api::Workflow<Order, Receipt> saga("order-saga", [](api::Context& ctx, const Order& order)
//       -> api::Result<Receipt> {
//     api::StepOptions<std::string> create;
//     create.compensate = [erp](api::Context& ctx, const std::string& id) { ... };
//     auto id = ctx.Step<std::string>("create-order", [&] { return erp.Create(order); }, create);
//     if (!id.ok()) return id.status();   // a stop, or the step's failure
//     ...
//   });
//   engine->Register(saga);
//   auto instance = engine->Start(saga, order.id, order);
//
// Thread safety: a Context is used by the thread running its function, while it
// runs. Workflow and StepOptions are values.

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "waystone/export.h"
#include "waystone/status.h"

namespace waystone::api {

// JSON text kept as it is (a step's result, a workflow's input or output).
struct Json {
  std::string text;
};

// How a value of T is kept in a checkpoint: as JSON text. Built in for
// std::string, bool, integers, double and Json; waystone/json_codec.h adds every
// type nlohmann::json converts (to_json/from_json). Specialize it for others:
//   template <> struct Codec<Money> {
//     static std::string Encode(const Money&);
//     static Result<Money> Decode(const std::string& json);  // InvalidArgument when not one
//   };
template <typename T, typename Enable = void>
struct Codec;

// The built-in codecs' halves for strings (JSON string escapes, UTF-8 kept).
WAYSTONE_API std::string EncodeJsonString(const std::string& value);
WAYSTONE_API Result<std::string> DecodeJsonString(const std::string& json);

template <>
struct Codec<Json> {
  static std::string Encode(const Json& value) { return value.text; }
  static Result<Json> Decode(const std::string& json) { return Json{json}; }
};

template <>
struct Codec<std::string> {
  static std::string Encode(const std::string& value) { return EncodeJsonString(value); }
  static Result<std::string> Decode(const std::string& json) { return DecodeJsonString(json); }
};

template <>
struct Codec<bool> {
  static std::string Encode(bool value) { return value ? "true" : "false"; }
  static Result<bool> Decode(const std::string& json) {
    if (json == "true") return true;
    if (json == "false") return false;
    return Status(Status::Code::kInvalidArgument, "not a JSON boolean: " + json);
  }
};

template <typename T>
struct Codec<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static std::string Encode(T value) { return std::to_string(value); }
  static Result<T> Decode(const std::string& json) {
    char* end = nullptr;
    errno = 0;
    if constexpr (std::is_signed_v<T>) {
      const long long value = std::strtoll(json.c_str(), &end, 10);
      if (errno == 0 && !json.empty() && *end == '\0' &&
          value >= static_cast<long long>(std::numeric_limits<T>::min()) &&
          value <= static_cast<long long>(std::numeric_limits<T>::max())) {
        return static_cast<T>(value);
      }
    } else {
      const unsigned long long value = std::strtoull(json.c_str(), &end, 10);
      if (errno == 0 && !json.empty() && json[0] != '-' && *end == '\0' &&
          value <= static_cast<unsigned long long>(std::numeric_limits<T>::max())) {
        return static_cast<T>(value);
      }
    }
    return Status(Status::Code::kInvalidArgument, "not an integer of this type: " + json);
  }
};

// The built-in codec's halves for double: the shortest text that reads back the
// same value; NaN and infinities are not JSON and encode as null.
WAYSTONE_API std::string EncodeJsonDouble(double value);
WAYSTONE_API Result<double> DecodeJsonDouble(const std::string& json);

template <>
struct Codec<double> {
  static std::string Encode(double value) { return EncodeJsonDouble(value); }
  static Result<double> Decode(const std::string& json) { return DecodeJsonDouble(json); }
};

// Inside a step, a lookup, a compensation or a transaction, the context gives only
// idempotency_key() and key(): any other call is refused (kFailedPrecondition). An
// exception the program's code throws is taken as a failure with kInternal (a
// rejection). A step's function says how it failed through its Status's code:
// - kUnavailable: transient — nothing happened; retried with backoff;
// - kDeadlineExceeded: the outcome is unknown — it may have acted: looked up
//   (`lookup`), run again when `repeatable`, else the instance waits for an operator;
// - any other code: rejected — never retried; the workflow gets the failure.
// Each retried class has a Retry of its own (StepOptions::retry, ::unknown): one
// budget is not spent by the other's failures.
struct Retry {
  int max_attempts = 5;                            // in all, the first included
  std::chrono::milliseconds initial_backoff{200};  // ceiling of the first backoff
  std::chrono::milliseconds max_backoff{10'000};   // the ceiling doubles up to this
};

class Context;

template <typename T>
struct StepOptions {
  // What the step is asked to do (e.g. the request it sends), as JSON (Encode);
  // hashed and checked against the record on replay: another input at the same
  // position parks the instance as diverged.
  std::string input;
  // It may run again when its outcome is unknown (it was interrupted, or answered
  // kDeadlineExceeded): it does nothing twice, or its target honours
  // Context::idempotency_key(). When false, an unknown outcome is looked up, or the
  // instance waits for an operator.
  bool repeatable = true;
  // Transient failures (nothing happened): how many attempts may fail so, the
  // first included, before the step fails; and the backoff between them (never
  // shorter than a call's Retry-After).
  Retry retry;
  // Unknown outcomes (it may have acted, or ran past `timeout`): how many the step
  // may have before an operator decides; each is looked up, or run again when
  // repeatable, after a backoff (the target may still be at work on it). Its
  // lookups are counted against the same number (a failed one is asked again
  // until they are spent).
  Retry unknown;
  // How long one run of the function may take; 0: no limit. A function cannot be
  // stopped from outside: at its timeout the instance's lease runs out (it is
  // renewed no further), and any worker with a free thread, this engine's too,
  // recovers the step as after a crash: its outcome unknown, it is looked up, run
  // again when repeatable (while the late run may still be going: let the target
  // dedupe by idempotency_key()), else left to an operator; when it is not
  // repeatable, a lookup's "not found" is left to an operator too. What the late
  // run returns is not recorded once another worker took the instance; its thread
  // is held until it returns. (The lookup is not bounded by it.) See
  // docs/cpp-api.md#the-context.
  std::chrono::milliseconds timeout{0};
  // Asks the target, before the step runs again, whether it acted after all: its
  // result when it did, nullopt when it did not. An error is retried later.
  std::function<Result<std::optional<T>>()> lookup;
  // Undoes the completed step (given its result) when the workflow fails later.
  // It runs after the function returned (after a crash, in another process): it
  // must capture by value, never the function's locals by reference. Its context
  // gives idempotency_key() ("<step key>:compensate") and key(); other calls are
  // refused. kUnavailable and kDeadlineExceeded are retried (up to 10 attempts,
  // backoff 1 s to 1 min); any other code, or the last attempt, leaves the instance
  // to an operator.
  std::function<Status(Context&, const T&)> compensate;
};

// Encodes `value` with its Codec: for StepOptions::input and Engine::Start.
template <typename T>
std::string Encode(const T& value) {
  return Codec<T>::Encode(value);
}

// An HTTP request a workflow sends with Context::Call.
struct HttpRequest {
  std::string method = "GET";
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::milliseconds timeout{10'000};
};

// What a call received.
struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  // The value of header `lower_name`, "" when absent.
  std::string Header(const std::string& lower_name) const {
    for (const auto& [name, value] : headers) {
      if (name == lower_name) return value;
    }
    return "";
  }
};

// What a call's failure was: nothing happened (retried), the target refused (never
// retried), or it may have acted (looked up, or sent again when repeatable).
enum class ErrorClass { kTransient, kRejected, kUnknown };

// How a Context::Call recovers and is undone. A value.
struct CallOptions {
  // The target acts once per Idempotency-Key: an unknown outcome is sent again under
  // the same key. GET, HEAD and OPTIONS always may be sent again.
  bool repeatable = false;
  Retry retry;    // transient failures, as StepOptions::retry
  Retry unknown;  // unknown outcomes (lost answers, 5xx), as StepOptions::unknown
  // An HTTP status's class where the default does not fit (by default 2xx succeed;
  // 408, 425, 429, 503 and a request that never left are transient; other 5xx and a
  // lost answer unknown; any other status rejected).
  std::map<int, ErrorClass> errors;
  // Reads a 2xx answer's body, for the APIs that answer 200 and say in the body
  // that nothing happened: its class when the body says it failed (200
  // {"status":"ERROR","code":"RATE_LIMIT"}: kTransient), nullopt when it succeeded.
  // Other statuses keep their class. For the call itself, not its lookup or
  // compensation. An exception it throws leaves the answer unknown (looked up).
  std::function<std::optional<ErrorClass>(const HttpResponse& answer)> classify;
  // Before an unknown outcome is sent again: `lookup` is sent, and `found` reads its
  // answer: the call's response when the call acted, nullopt when it did not.
  std::optional<HttpRequest> lookup;
  std::function<std::optional<HttpResponse>(const HttpResponse& answer)> found;
  // A lookup over pages (a search that answers a page at a time): given a page in
  // which `found` found nothing, the request for the next one; nullopt after the
  // last (then the call did not act). Each page is sent as the lookup is; at most
  // 100 pages, then the lookup fails (and is asked again later).
  std::function<std::optional<HttpRequest>(const HttpResponse& page)> next_page;
  // The request that undoes the completed call, given its response (nullopt: nothing
  // to undo), sent with the Idempotency-Key "<call's key>:compensate".
  std::function<std::optional<HttpRequest>(const HttpResponse& response)> compensate;
};

// A statement parameter's value.
struct SqlValue {
  enum class Kind { kNull, kText, kInteger, kReal };
  SqlValue() = default;        // NULL
  SqlValue(std::nullptr_t) {}  // NOLINT: implicit, as a literal
  SqlValue(std::string value) : kind(Kind::kText), text(std::move(value)) {}  // NOLINT
  SqlValue(const char* value) : kind(Kind::kText), text(value) {}             // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  SqlValue(T value) : kind(Kind::kInteger), text(std::to_string(value)) {}      // NOLINT
  SqlValue(double value) : kind(Kind::kReal), text(EncodeJsonDouble(value)) {}  // NOLINT
  Kind kind = Kind::kNull;
  std::string text;
};

// The database inside the transaction that records a step (Context::Transaction):
// the statements, the step's checkpoint and the events emitted commit together or
// not at all. Used by the thread running the function, while it runs.
class WAYSTONE_API Tx {
 public:
  // Runs one statement with :name parameters (bound, never spliced) on a table of
  // the program's own (Waystone's own tables are refused): INSERT, UPDATE, DELETE,
  // SELECT or WITH, written once for SQLite and PostgreSQL. Returns its rows as
  // {"rows": [{column: value}], "count": n}. A statement the database refuses fails
  // the transaction (and the step): nothing of it is written.
  virtual Result<std::string> Execute(const std::string& sql,
                                      const std::map<std::string, SqlValue>& params = {}) = 0;
  // Adds an outbox event (delivered by the relay, like the engine's own).
  virtual void Emit(const std::string& type, const std::string& payload_json) = 0;

 protected:
  ~Tx() = default;
};

// What a workflow's function calls. Every call returns an error once the run must
// stop here (it waits for a timer, or was parked, or another worker has the
// instance): code kAborted. Return it (or any error): the engine knows it is
// its own, and nothing the function does after it is recorded.
class WAYSTONE_API Context {
 public:
  // Runs `fn` (returning Result<T>) once for this instance as step `name`, at the
  // next position; on a later run returns the recorded result without running it.
  // A name may not begin with '$' or hold ':' or '#'. A step that failed for good
  // returns kFailedPrecondition naming it, its error class and its message.
  template <typename T, typename F>
  Result<T> Step(const std::string& name, F&& fn, StepOptions<T> options = {});

  // Runs `fn(Tx&)` (returning Result<T>) inside the transaction that
  // records it as step `name`: SQL on the engine's own database and connection.
  // Does nothing outside the database in it: it may run more than once, all but
  // one rolled back. Keep it short: it runs on the engine's commit thread, and
  // every other checkpoint waits for it.
  template <typename T, typename F>
  Result<T> Transaction(const std::string& name, F&& fn);

  // Sends `request` once for this instance as step `name`: with an Idempotency-Key
  // header (the step's key, the same on every attempt) unless it has one; the
  // answer classified (a 2xx is the result; see CallOptions::errors); a transient
  // failure retried; an unknown outcome looked up (`lookup`) or sent again when
  // `repeatable`, else left to an operator. A refusal is kFailedPrecondition naming
  // the status and the body. On a later run, the recorded response.
  virtual Result<HttpResponse> Call(const std::string& name, const HttpRequest& request,
                                    const CallOptions& options) = 0;
  Result<HttpResponse> Call(const std::string& name, const HttpRequest& request) {
    return Call(name, request, CallOptions());
  }

  // The time, a random number and a UUID: recorded on first use, the same on replay.
  virtual Result<std::chrono::system_clock::time_point> Now() = 0;
  virtual Result<uint64_t> Random() = 0;
  virtual Result<std::string> Uuid() = 0;
  // Waits on a durable timer: the instance rests (no thread held) and its function
  // runs again when it is due, past this call.
  virtual Status Sleep(std::chrono::milliseconds duration) = 0;
  // Waits for an event of `event_type` delivered to this instance (Engine::Signal,
  // or the HTTP API's events), at most `timeout` (0: no limit): its data (JSON), or
  // kDeadlineExceeded once the timeout passed. The instance rests without a thread
  // meanwhile. An event that came while the function did not wait for its type was
  // kept: the oldest such is returned at once (see Engine::Signal).
  virtual Result<std::string> WaitEvent(const std::string& event_type,
                                        std::chrono::milliseconds timeout) = 0;
  // True when this run takes the code path introduced under `patch`; false for an
  // instance that went past this point before the patch (it keeps the old path).
  virtual Result<bool> Patched(const std::string& patch) = 0;
  // Inside a step (or its lookup or compensation): its idempotency key, the same
  // on every attempt: "<tenant>:<business key>:<step>" ("#2", ... for a name's
  // later steps). "" elsewhere.
  virtual const std::string& idempotency_key() const = 0;
  // The instance's business key.
  virtual const std::string& key() const = 0;

  // The untyped steps the templates above use (results as JSON text).
  struct RawStepOptions {
    std::string input;
    bool repeatable = true;
    Retry retry;
    Retry unknown;
    std::chrono::milliseconds timeout{0};
    std::function<Result<std::optional<std::string>>()> lookup;
    std::function<Status(Context&, const std::string&)> compensate;
  };
  virtual Result<std::string> StepJson(const std::string& name,
                                       const std::function<Result<std::string>()>& fn,
                                       const RawStepOptions& options) = 0;
  virtual Result<std::string> TransactionJson(
      const std::string& name, const std::function<Result<std::string>(Tx&)>& fn) = 0;

 protected:
  virtual ~Context() = default;
};

// A workflow: its name and function. Register it with Engine::Register, start it
// with Engine::Start. A value.
template <typename In, typename Out>
class Workflow {
 public:
  using Function = std::function<Result<Out>(Context&, const In&)>;
  Workflow(std::string name, Function function)
      : name_(std::move(name)), function_(std::move(function)) {}
  const std::string& name() const { return name_; }
  // The function over JSON text: what the engine runs.
  std::function<Result<std::string>(Context&, const std::string&)> Raw() const {
    Function function = function_;
    return [function](Context& ctx, const std::string& input_json) -> Result<std::string> {
      Result<In> input = Codec<In>::Decode(input_json);
      if (!input.ok()) return input.status();
      Result<Out> output = function(ctx, *input);
      if (!output.ok()) return output.status();
      return Codec<Out>::Encode(*output);
    };
  }

 private:
  std::string name_;
  Function function_;
};

template <typename T, typename F>
Result<T> Context::Step(const std::string& name, F&& fn, StepOptions<T> options) {
  RawStepOptions raw;
  raw.input = std::move(options.input);
  raw.repeatable = options.repeatable;
  raw.retry = options.retry;
  raw.unknown = options.unknown;
  raw.timeout = options.timeout;
  if (options.lookup) {
    raw.lookup = [lookup = std::move(options.lookup)]() -> Result<std::optional<std::string>> {
      Result<std::optional<T>> found = lookup();
      if (!found.ok()) return found.status();
      if (!found->has_value()) return std::optional<std::string>();
      return std::optional<std::string>(Codec<T>::Encode(**found));
    };
  }
  if (options.compensate) {
    raw.compensate = [undo = std::move(options.compensate)](Context& ctx,
                                                            const std::string& json) -> Status {
      Result<T> value = Codec<T>::Decode(json);
      if (!value.ok()) return value.status();
      return undo(ctx, *value);
    };
  }
  Result<std::string> json = StepJson(
      name,
      [&fn]() -> Result<std::string> {
        Result<T> value = fn();
        if (!value.ok()) return value.status();
        return Codec<T>::Encode(*value);
      },
      raw);
  if (!json.ok()) return json.status();
  return Codec<T>::Decode(*json);
}

template <typename T, typename F>
Result<T> Context::Transaction(const std::string& name, F&& fn) {
  Result<std::string> json = TransactionJson(name, [&fn](Tx& tx) -> Result<std::string> {
    Result<T> value = fn(tx);
    if (!value.ok()) return value.status();
    return Codec<T>::Encode(*value);
  });
  if (!json.ok()) return json.status();
  return Codec<T>::Decode(*json);
}

}  // namespace waystone::api
