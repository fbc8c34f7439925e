#pragma once

// The generic simulated target `waystone verify` puts in place of every system a
// definition calls (docs/verify.md). It keeps every create as an object (its body,
// plus a generated id where the step's result pointer expects it), answers a
// lookup by matching its query and path values against the stored fields, shaped
// so the step's pointers resolve, and counts business effects per step. Each
// schedule has its own space under the URL prefix "/s<N>", so schedules run side
// by side against one target. Faults come from the schedule (verify/schedules.h).
// The relay's webhook for the schedule's events is "/s<N>/_events".

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "verify/contract.h"
#include "verify/schedules.h"

namespace waystone::verify {

// One business effect the target committed.
struct Effect {
  std::string step;  // the step whose route created or acted
  Role role = Role::kCall;
  std::string object;  // the object's id
  std::string action;  // "create", or the action on an object ("cancel", "put")
  int seq = 0;         // order among the schedule's effects
};

// One event the relay delivered to the schedule's webhook ("/s<N>/_events").
struct DeliveredEvent {
  std::string id;
  std::string type;         // "waystone.step.completed", ...
  std::string step;         // data.step ("" for an instance's event)
  std::string external_id;  // data.external_id
  std::string body;         // as received
};

// What the target saw in one schedule.
struct Observed {
  std::vector<Effect> effects;
  std::vector<DeliveredEvent> events;  // in the order received, repeats included
  std::vector<std::string> log;        // one line per request: route, attempt, outcome
  std::vector<std::string> coverage;   // branches reached: "create-order lookup found", ...
  std::vector<std::string> unmatched;  // requests no route fits
  std::vector<std::string> applied;    // the schedule's faults met: "call:create-order#1"
};

class GenericTarget {
 public:
  // Listens on a loopback port of its own. The routes of an env named in
  // `upstreams` (env -> base URL of a team's sandbox) are forwarded there instead:
  // an outcome that commits sends the request on and then delivers, delays or loses
  // the sandbox's answer as it says; one that does not is answered here.
  static absl::StatusOr<std::unique_ptr<GenericTarget>> Start(
      Contract contract, std::map<std::string, std::string> upstreams = {});
  ~GenericTarget();
  GenericTarget(const GenericTarget&) = delete;
  GenericTarget& operator=(const GenericTarget&) = delete;

  int port() const;
  // The SMTP listener's port: an email's URL is "smtp://127.0.0.1:<port>/s<id>" (the
  // path is what the client says in EHLO: the schedule's space).
  int smtp_port() const;
  // Opens schedule `id`'s space ("http://127.0.0.1:<port>/s<id>"): its faults apply there.
  std::string Open(int id, const Schedule& schedule);
  // The worker process a kill outcome kills (the latest one started for `id`).
  void SetWorker(int id, pid_t pid);
  // Forgets `pid` as schedule `id`'s worker (it ended): no signal goes to it again.
  void ForgetWorker(int id, pid_t pid);
  // The worker a freeze outcome stopped (SIGSTOP) in schedule `id`, once: 0 when none.
  pid_t TakeFrozen(int id);
  // Closes the space and returns what it saw.
  Observed Close(int id);

  class Impl;

 private:
  explicit GenericTarget(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone::verify
