#pragma once

// The schedules `waystone verify` runs: which answer each request of a step gets,
// where the worker is killed, how the instance is started. A schedule prints as a
// spec (its --replay line) and reads back from it exactly. Pure: no I/O.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "verify/contract.h"

namespace waystone::verify {

// What the simulated target does with one request.
enum class Outcome : uint8_t {
  kOk = 1,
  kReject,            // 422, nothing committed
  kRateLimit,         // 429 with Retry-After, nothing committed
  kUnavailable,       // 503, nothing committed
  kStall,             // nothing committed, no answer until past the request's timeout
  kSlow,              // committed, answered only past the request's timeout
  kCloseBeforeBytes,  // committed, the connection closed before a byte of the answer
  kReset,             // committed, the connection reset
  kPartialStatus,     // committed, "HTTP/1.1 20" and close
  kPartialHeaders,    // committed, the status line and a header, and close
  kCutBody,           // committed, the head and part of the body, and close
  kLost500,           // committed, answered 500 (a proxy or the server failed after)
  kLost502,           // committed, 502 from a proxy
  kLost504,           // committed, 504 from a proxy
  kDuplicate,         // nothing new: 409, as a target answers a key it has seen
  kKill,              // committed, then the worker is killed before it reads the answer
  kFreeze,            // committed, then the worker is stopped (SIGSTOP) with the answer
                      // unread; a second worker takes over once the lease runs out, then
                      // the first resumes (SIGCONT) and must not act on what it held
};

// The name of the relay's sink of the schedule's events (its crash points name it).
inline constexpr std::string_view kEventSink = "events";

std::string_view OutcomeName(Outcome outcome);
std::optional<Outcome> OutcomeNamed(std::string_view name);
// True when the target commits the request's effect under this outcome.
bool Commits(Outcome outcome);

// The answer the `attempt`-th request (1-based; 0 = every one) of a step's role gets.
struct Fault {
  std::string step;
  Role role = Role::kCall;
  int attempt = 1;
  Outcome outcome = Outcome::kOk;
};

enum class Starts : uint8_t {
  kOnce = 1,        // one start, driven to rest (and once more after a kill)
  kEventTwice = 2,  // the same start event delivered twice, one after the other
  kConcurrent = 3,  // two workers start the same instance at the same moment
};

struct Schedule {
  std::vector<Fault> faults;
  std::string crash_at;  // "<point>:<step>" (base/crash_point.h); "" = no kill there
  int crash_occurrence = 1;
  Starts starts = Starts::kOnce;
  // Once the instance completes, an operator compensates it (the console's
  // "compensate"): how the compensation of a step that nothing after it can fail runs.
  bool operator_compensates = false;
  // The matrix's row: step ("*" for the instance), its request, what is injected.
  std::string step = "*";
  std::string request = "instance";
  std::string injected = "clean run";

  // The spec: items joined by ';' ("call:create-order#1=reset;crash:after-call:create-order#1").
  std::string Spec() const;
  // The fault for the `attempt`-th request of (step, role), if any.
  std::optional<Outcome> FaultFor(std::string_view step_name, Role role, int attempt) const;
};

// Reads a spec back; InvalidArgument naming the item that does not fit `contract`
// (and `definition`, which names the wait and approval steps).
absl::StatusOr<Schedule> ParseSpec(std::string_view spec, const Contract& contract,
                                   const WorkflowDefinition* definition = nullptr);

// Every boundary and every outcome, for every HTTP step, its lookup and its
// compensation, every wait, the relay, plus the instance's starts.
std::vector<Schedule> AllSchedules(const WorkflowDefinition& definition, const Contract& contract);

// The `index`-th schedule drawn from `seed`: one to three faults, maybe a kill.
// The same (seed, index) draws the same schedule.
Schedule RandomSchedule(const WorkflowDefinition& definition, const Contract& contract,
                        uint64_t seed, int index);

}  // namespace waystone::verify
