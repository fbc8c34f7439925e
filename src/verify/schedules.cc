#include "verify/schedules.h"

#include <array>
#include <random>
#include <span>
#include <utility>

namespace waystone::verify {
namespace {

constexpr std::array<std::pair<Outcome, std::string_view>, 17> kOutcomes{{
    {Outcome::kOk, "ok"},
    {Outcome::kReject, "reject"},
    {Outcome::kRateLimit, "rate_limit"},
    {Outcome::kUnavailable, "unavailable"},
    {Outcome::kStall, "stall"},
    {Outcome::kSlow, "slow"},
    {Outcome::kCloseBeforeBytes, "close_before_bytes"},
    {Outcome::kReset, "reset"},
    {Outcome::kPartialStatus, "partial_status"},
    {Outcome::kPartialHeaders, "partial_headers"},
    {Outcome::kCutBody, "cut_body"},
    {Outcome::kLost500, "lost_500"},
    {Outcome::kLost502, "lost_502"},
    {Outcome::kLost504, "lost_504"},
    {Outcome::kDuplicate, "duplicate"},
    {Outcome::kKill, "kill"},
    {Outcome::kFreeze, "freeze"},
}};

// The points a kill may be armed at, by the request they stand before or after.
constexpr std::array<std::string_view, 5> kCallPoints{"before-step", "before-call", "after-call",
                                                      "after-checkpoint", "before-send"};
constexpr std::array<std::string_view, 2> kLookupPoints{"before-lookup", "after-lookup"};
constexpr std::array<std::string_view, 3> kCompensatePoints{"before-compensate", "after-compensate",
                                                            "after-compensate-checkpoint"};
// The relay's, with the sink verify gives it: before an event is delivered, and
// after it was acknowledged but before that is marked.
constexpr std::array<std::string_view, 2> kRelayPoints{"before-deliver", "after-deliver"};
// A wait's or an approval's: the instance waits and the event or decision is about
// to be delivered; it was delivered (and not yet delivered again).
constexpr std::array<std::string_view, 2> kWaitPoints{"during-wait", "after-signal"};
// Before a worker claims the instance (its first claim): the instance is started and
// nobody holds it.
constexpr std::string_view kClaimPoint = "before-claim";
constexpr std::string_view kInstance = "instance";

bool WaitingStep(const WorkflowDefinition* definition, const Contract& contract,
                 std::string_view name) {
  if (definition == nullptr) return false;
  for (int index : contract.waiting_steps) {
    if (definition->steps[index].name == name) return true;
  }
  return false;
}

std::optional<Role> RoleNamed(std::string_view name) {
  for (Role role : {Role::kCall, Role::kLookup, Role::kCompensate}) {
    if (RoleName(role) == name) return role;
  }
  return std::nullopt;
}

const Route* RouteFor(const Contract& contract, std::string_view step, Role role) {
  for (const Route& route : contract.routes) {
    if (route.step == step && route.role == role) return &route;
  }
  return nullptr;
}

bool KnownPoint(std::string_view point) {
  if (point == kClaimPoint) return true;
  for (auto points : {std::span<const std::string_view>(kCallPoints),
                      std::span<const std::string_view>(kLookupPoints),
                      std::span<const std::string_view>(kCompensatePoints),
                      std::span<const std::string_view>(kRelayPoints),
                      std::span<const std::string_view>(kWaitPoints)}) {
    for (std::string_view known : points) {
      if (known == point) return true;
    }
  }
  return false;
}

Schedule ScheduleRow(std::string step, std::string request, std::string injected) {
  Schedule schedule;
  schedule.step = std::move(step);
  schedule.request = std::move(request);
  schedule.injected = std::move(injected);
  return schedule;
}

// The first HTTP step after `index` whose rejection makes the instance compensate:
// not optional (its failure is passed over), not beside it in a parallel group.
const Route* LaterCall(const WorkflowDefinition& definition, const Contract& contract, int index) {
  for (const Route& route : contract.routes) {
    if (route.role != Role::kCall || route.step_index <= index) continue;
    const StepDefinition& later = definition.steps[route.step_index];
    if (later.optional || later.pause_on_failure || later.Beside(definition.steps[index])) continue;
    return &route;
  }
  return nullptr;
}

}  // namespace

std::string_view OutcomeName(Outcome outcome) {
  for (const auto& [known, name] : kOutcomes) {
    if (known == outcome) return name;
  }
  return "?";
}

std::optional<Outcome> OutcomeNamed(std::string_view name) {
  for (const auto& [known, known_name] : kOutcomes) {
    if (known_name == name) return known;
  }
  return std::nullopt;
}

bool Commits(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
    case Outcome::kSlow:
    case Outcome::kCloseBeforeBytes:
    case Outcome::kReset:
    case Outcome::kPartialStatus:
    case Outcome::kPartialHeaders:
    case Outcome::kCutBody:
    case Outcome::kLost500:
    case Outcome::kLost502:
    case Outcome::kLost504:
    case Outcome::kKill:
    case Outcome::kFreeze:
      return true;
    case Outcome::kReject:
    case Outcome::kRateLimit:
    case Outcome::kUnavailable:
    case Outcome::kStall:
    case Outcome::kDuplicate:
      return false;
  }
  return false;
}

std::string Schedule::Spec() const {
  std::string spec;
  auto add = [&](const std::string& item) {
    if (!spec.empty()) spec += ";";
    spec += item;
  };
  for (const Fault& fault : faults) {
    add(std::string(RoleName(fault.role)) + ":" + fault.step + "#" +
        (fault.attempt == 0 ? std::string("*") : std::to_string(fault.attempt)) + "=" +
        std::string(OutcomeName(fault.outcome)));
  }
  if (!crash_at.empty()) add("crash:" + crash_at + "#" + std::to_string(crash_occurrence));
  if (starts == Starts::kEventTwice) add("starts:event-twice");
  if (starts == Starts::kConcurrent) add("starts:concurrent");
  if (operator_compensates) add("operator:compensate");
  return spec.empty() ? "clean" : spec;
}

std::optional<Outcome> Schedule::FaultFor(std::string_view step_name, Role role,
                                          int attempt) const {
  for (const Fault& fault : faults) {
    if (fault.step == step_name && fault.role == role &&
        (fault.attempt == 0 || fault.attempt == attempt)) {
      return fault.outcome;
    }
  }
  return std::nullopt;
}

absl::StatusOr<Schedule> ParseSpec(std::string_view spec, const Contract& contract,
                                   const WorkflowDefinition* definition) {
  Schedule schedule;
  schedule.injected = std::string(spec);
  if (spec == "clean") return schedule;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t end = spec.find(';', at);
    if (end == std::string_view::npos) end = spec.size();
    const std::string_view item = spec.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError("schedule item '" + std::string(item) +
                                        "': " + std::string(why));
    };
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) return bad("expected kind:what");
    const std::string_view kind = item.substr(0, colon);
    const std::string_view rest = item.substr(colon + 1);
    if (kind == "operator") {
      if (rest != "compensate") return bad("operator:compensate is the one operator action");
      schedule.operator_compensates = true;
      continue;
    }
    if (kind == "starts") {
      if (rest == "event-twice")
        schedule.starts = Starts::kEventTwice;
      else if (rest == "concurrent")
        schedule.starts = Starts::kConcurrent;
      else
        return bad("starts is event-twice or concurrent");
      continue;
    }
    const size_t hash = rest.rfind('#');
    if (kind == "crash") {
      if (hash == std::string_view::npos) return bad("expected crash:<point>:<step>#<n>");
      const std::string_view at_text = rest.substr(0, hash);
      const size_t point_end = at_text.find(':');
      if (point_end == std::string_view::npos || !KnownPoint(at_text.substr(0, point_end))) {
        return bad("unknown crash point (docs/verify.md lists them)");
      }
      const std::string_view point = at_text.substr(0, point_end);
      const bool relay = point == kRelayPoints[0] || point == kRelayPoints[1];
      if (relay && at_text.substr(point_end + 1) != kEventSink) {
        return bad("the relay's points name the sink '" + std::string(kEventSink) + "'");
      }
      const bool waits = point == kWaitPoints[0] || point == kWaitPoints[1];
      const bool claims = point == kClaimPoint;
      if (claims && at_text.substr(point_end + 1) != kInstance) {
        return bad("before-claim names 'instance'");
      }
      if (waits && !WaitingStep(definition, contract, at_text.substr(point_end + 1))) {
        return bad("no wait or approval step of that name");
      }
      if (!relay && !waits && !claims &&
          RouteFor(contract, at_text.substr(point_end + 1), Role::kCall) == nullptr) {
        return bad("no HTTP step of that name");
      }
      schedule.crash_at = std::string(at_text);
      schedule.crash_occurrence = std::atoi(std::string(rest.substr(hash + 1)).c_str());
      if (schedule.crash_occurrence < 1) return bad("the occurrence counts from 1");
      continue;
    }
    const std::optional<Role> role = RoleNamed(kind);
    if (!role) return bad("kind is call, lookup, compensate, crash or starts");
    const size_t eq = rest.rfind('=');
    if (hash == std::string_view::npos || eq == std::string_view::npos || eq < hash) {
      return bad("expected <kind>:<step>#<attempt>=<outcome>");
    }
    Fault fault;
    fault.step = std::string(rest.substr(0, hash));
    fault.role = *role;
    const std::string attempt(rest.substr(hash + 1, eq - hash - 1));
    fault.attempt = attempt == "*" ? 0 : std::atoi(attempt.c_str());
    if (attempt != "*" && fault.attempt < 1) return bad("the attempt counts from 1, or is *");
    const std::optional<Outcome> outcome = OutcomeNamed(rest.substr(eq + 1));
    if (!outcome) return bad("unknown outcome");
    fault.outcome = *outcome;
    if (RouteFor(contract, fault.step, fault.role) == nullptr) {
      return bad("step '" + fault.step + "' sends no " + std::string(kind) + " request");
    }
    schedule.faults.push_back(std::move(fault));
  }
  if (!schedule.faults.empty()) {
    schedule.step = schedule.faults.front().step;
    schedule.request = std::string(RoleName(schedule.faults.front().role));
  } else if (!schedule.crash_at.empty()) {
    schedule.step = schedule.crash_at.substr(schedule.crash_at.find(':') + 1);
    schedule.request = "worker";
  }
  return schedule;
}

std::vector<Schedule> AllSchedules(const WorkflowDefinition& definition, const Contract& contract) {
  std::vector<Schedule> all;
  all.push_back(ScheduleRow("*", "instance", "clean run"));
  Schedule twice = ScheduleRow("*", "instance", "the start event delivered twice");
  twice.starts = Starts::kEventTwice;
  all.push_back(twice);
  Schedule concurrent = ScheduleRow("*", "instance", "two identical starts at once");
  concurrent.starts = Starts::kConcurrent;
  all.push_back(concurrent);
  Schedule claim = ScheduleRow("*", "instance", "kill before the first claim");
  claim.crash_at = std::string(kClaimPoint) + ":" + std::string(kInstance);
  all.push_back(claim);
  for (int index : contract.waiting_steps) {
    const std::string& name = definition.steps[index].name;
    const std::string what =
        definition.steps[index].kind == StepKind::kApproval ? "decision" : "event";
    for (std::string_view point : kWaitPoints) {
      Schedule row =
          ScheduleRow(name, what,
                      point == kWaitPoints[0] ? "kill during the wait"
                                              : "kill after the " + what + " was delivered");
      row.crash_at = std::string(point) + ":" + name;
      all.push_back(row);
    }
  }
  for (std::string_view point : kRelayPoints) {
    for (int occurrence : {1, 2}) {
      Schedule row = ScheduleRow(
          "*", "events", "kill at " + std::string(point) + " #" + std::to_string(occurrence));
      row.crash_at = std::string(point) + ":" + std::string(kEventSink);
      row.crash_occurrence = occurrence;
      all.push_back(row);
    }
  }

  for (int index : contract.http_steps) {
    const StepDefinition& step = definition.steps[index];
    const std::string& name = step.name;
    const bool reads = !step.request.SideEffecting();
    const bool mail = step.request.body_kind == BodyKind::kMail;
    auto fault = [&](Role role, int attempt, Outcome outcome) {
      return Fault{name, role, attempt, outcome};
    };
    // Every answer its call can get, the first time.
    for (const auto& [outcome, outcome_name] : kOutcomes) {
      if (outcome == Outcome::kOk || outcome == Outcome::kKill || outcome == Outcome::kDuplicate ||
          outcome == Outcome::kFreeze) {
        continue;
      }
      if (reads && outcome == Outcome::kSlow) continue;  // a read's slow answer is its stall
      // SMTP: past its timeout, and its lost replies are one shape (a close).
      if (mail && (outcome == Outcome::kStall || outcome == Outcome::kSlow ||
                   outcome == Outcome::kPartialHeaders || outcome == Outcome::kCutBody ||
                   outcome == Outcome::kLost502 || outcome == Outcome::kLost504)) {
        continue;
      }
      Schedule row = ScheduleRow(name, "call", std::string(outcome_name));
      row.faults.push_back(fault(Role::kCall, 1, outcome));
      all.push_back(row);
    }
    if (!reads && !mail && !step.lookup) {  // with a lookup the retry never goes
      Schedule duplicate = ScheduleRow(name, "call", "reset, then duplicate (409) on the retry");
      duplicate.faults = {fault(Role::kCall, 1, Outcome::kReset),
                          fault(Role::kCall, 2, Outcome::kDuplicate)};
      all.push_back(duplicate);
    }
    // Every boundary around it, with a kill of the worker there.
    for (std::string_view point :
         {"before-step", "before-call", "after-call", "after-checkpoint"}) {
      Schedule row = ScheduleRow(name, "call", "kill at " + std::string(point));
      row.crash_at = std::string(point) + ":" + name;
      all.push_back(row);
    }
    Schedule sent = ScheduleRow(name, "call", "kill after sent, before the answer is read");
    sent.faults.push_back(fault(Role::kCall, 1, Outcome::kKill));
    all.push_back(sent);
    if (!reads) {
      Schedule frozen = ScheduleRow(name, "call", "frozen after sent; a second worker takes over");
      frozen.faults.push_back(fault(Role::kCall, 1, Outcome::kFreeze));
      all.push_back(frozen);
    }

    if (step.lookup) {
      auto after_loss = [&](std::string injected) {
        Schedule row = ScheduleRow(name, "lookup", std::move(injected));
        row.faults.push_back(fault(Role::kCall, 1, Outcome::kReset));
        return row;
      };
      for (std::string_view point : kLookupPoints) {
        Schedule row = after_loss("kill at " + std::string(point));
        row.crash_at = std::string(point) + ":" + name;
        all.push_back(row);
      }
      Schedule lookup_sent = after_loss("kill after sent, before the answer is read");
      lookup_sent.faults.push_back(fault(Role::kLookup, 1, Outcome::kKill));
      all.push_back(lookup_sent);
      for (Outcome outcome : {Outcome::kUnavailable, Outcome::kRateLimit, Outcome::kReset,
                              Outcome::kStall, Outcome::kLost502}) {
        Schedule row = after_loss(std::string(OutcomeName(outcome)));
        row.faults.push_back(fault(Role::kLookup, 1, outcome));
        all.push_back(row);
      }
    }

    if (step.compensate) {
      // What makes it run: a later step rejected, or (when nothing after it can fail)
      // an operator compensating the completed instance.
      const Route* later = LaterCall(definition, contract, index);
      auto rejected = [&](std::string injected) {
        if (later == nullptr) {
          Schedule row =
              ScheduleRow(name, "compensate", std::move(injected) + " (an operator compensates)");
          row.operator_compensates = true;
          return row;
        }
        Schedule row = ScheduleRow(name, "compensate",
                                   std::move(injected) + " (" + later->step + " rejected)");
        row.faults.push_back(Fault{later->step, Role::kCall, 0, Outcome::kReject});
        return row;
      };
      all.push_back(rejected("ok"));
      for (Outcome outcome :
           {Outcome::kUnavailable, Outcome::kReset, Outcome::kStall, Outcome::kLost500}) {
        Schedule row = rejected(std::string(OutcomeName(outcome)) + " once");
        row.faults.insert(row.faults.begin(), fault(Role::kCompensate, 1, outcome));
        all.push_back(row);
      }
      Schedule for_good = rejected("unavailable for good");
      for_good.faults.insert(for_good.faults.begin(),
                             fault(Role::kCompensate, 0, Outcome::kUnavailable));
      all.push_back(for_good);
      for (std::string_view point : kCompensatePoints) {
        Schedule row = rejected("kill at " + std::string(point));
        row.crash_at = std::string(point) + ":" + name;
        all.push_back(row);
      }
      Schedule comp_sent = rejected("kill after sent, before the answer is read");
      comp_sent.faults.insert(comp_sent.faults.begin(),
                              fault(Role::kCompensate, 1, Outcome::kKill));
      all.push_back(comp_sent);
    }
  }
  return all;
}

Schedule RandomSchedule(const WorkflowDefinition& definition, const Contract& contract,
                        uint64_t seed, int index) {
  std::mt19937_64 random(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index));
  auto pick = [&](size_t n) { return static_cast<size_t>(random() % n); };
  // Outcomes that take no timeout to play out, so a thousand schedules stay quick.
  constexpr std::array<Outcome, 11> kQuick{
      Outcome::kReject,    Outcome::kUnavailable,   Outcome::kCloseBeforeBytes,
      Outcome::kReset,     Outcome::kPartialStatus, Outcome::kPartialHeaders,
      Outcome::kCutBody,   Outcome::kLost500,       Outcome::kLost502,
      Outcome::kDuplicate, Outcome::kKill};
  // Faults drawn where they will be met: a call's first attempt; its lookup's when
  // that call's answer was lost; a retry's when the step retries (no lookup); the
  // compensation of an earlier step when a later call is refused.
  auto loses = [](Outcome outcome) { return Commits(outcome) && outcome != Outcome::kOk; };
  std::vector<const Route*> calls;
  for (const Route& route : contract.routes) {
    if (route.role == Role::kCall) calls.push_back(&route);
  }
  auto route_of = [&](const std::string& step, Role role) -> const Route* {
    for (const Route& route : contract.routes) {
      if (route.step == step && route.role == role) return &route;
    }
    return nullptr;
  };
  Schedule schedule;
  const size_t faults = 1 + pick(3);
  for (size_t i = 0; i < faults; ++i) {
    const Route& call = *calls[pick(calls.size())];
    if (schedule.FaultFor(call.step, Role::kCall, 1)) continue;
    // A 409 for "this key was used before" comes only for a key the target has
    // seen: on a retry after an answer lost once the first request was committed.
    Outcome outcome = kQuick[pick(kQuick.size())];
    if (outcome == Outcome::kDuplicate) outcome = Outcome::kUnavailable;
    schedule.faults.push_back(Fault{call.step, Role::kCall, 1, outcome});
    const Route* lookup = route_of(call.step, Role::kLookup);
    if (lookup != nullptr && loses(outcome) && pick(2) == 0) {
      Outcome looked = kQuick[pick(kQuick.size())];
      if (looked == Outcome::kReject || looked == Outcome::kDuplicate)
        looked = Outcome::kUnavailable;
      schedule.faults.push_back(Fault{call.step, Role::kLookup, 1, looked});
    } else if (lookup == nullptr && (loses(outcome) || outcome == Outcome::kUnavailable) &&
               pick(2) == 0) {
      Outcome retried = kQuick[pick(kQuick.size())];
      if (retried == Outcome::kDuplicate && !loses(outcome)) retried = Outcome::kUnavailable;
      schedule.faults.push_back(Fault{call.step, Role::kCall, 2, retried});
    }
    if (outcome == Outcome::kReject && pick(2) == 0) {
      std::vector<const Route*> earlier;
      for (const Route& route : contract.routes) {
        if (route.role == Role::kCompensate && route.step_index < call.step_index) {
          earlier.push_back(&route);
        }
      }
      if (!earlier.empty()) {
        Outcome undone = kQuick[pick(kQuick.size())];
        if (undone == Outcome::kDuplicate) undone = Outcome::kUnavailable;
        const Route& compensate = *earlier[pick(earlier.size())];
        if (!schedule.FaultFor(compensate.step, Role::kCompensate, 1)) {
          schedule.faults.push_back(Fault{compensate.step, Role::kCompensate, 1, undone});
        }
      }
    }
  }
  if (!contract.waiting_steps.empty() && pick(6) == 0) {
    const int step = contract.waiting_steps[pick(contract.waiting_steps.size())];
    schedule.crash_at =
        std::string(kWaitPoints[pick(kWaitPoints.size())]) + ":" + definition.steps[step].name;
  } else if (pick(8) == 0) {
    schedule.crash_at =
        std::string(kRelayPoints[pick(kRelayPoints.size())]) + ":" + std::string(kEventSink);
    schedule.crash_occurrence = 1 + static_cast<int>(pick(3));
  } else if (pick(2) == 0) {
    const int step = contract.http_steps[pick(contract.http_steps.size())];
    const StepDefinition& def = definition.steps[step];
    std::vector<std::string_view> points(kCallPoints.begin(), kCallPoints.end());
    if (def.lookup) points.insert(points.end(), kLookupPoints.begin(), kLookupPoints.end());
    if (def.compensate)
      points.insert(points.end(), kCompensatePoints.begin(), kCompensatePoints.end());
    schedule.crash_at = std::string(points[pick(points.size())]) + ":" + def.name;
    schedule.crash_occurrence = pick(4) == 0 ? 2 : 1;
  }
  schedule.step = schedule.faults.front().step;
  schedule.request = std::string(RoleName(schedule.faults.front().role));
  schedule.injected = "random #" + std::to_string(index);
  return schedule;
}

}  // namespace waystone::verify
