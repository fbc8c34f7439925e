#pragma once

// What `waystone verify` infers of the systems a definition calls: for every
// request a step can send (its call, its lookup, its compensation) the route it
// arrives on at the generic simulated target, and how that target must answer so
// the step's pointers resolve (docs/verify.md). Pure: no I/O.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/definition.h"

namespace waystone::verify {

// Which of a step's requests a route carries.
enum class Role : uint8_t { kCall = 1, kLookup = 2, kCompensate = 3 };

std::string_view RoleName(Role role);

// One request a step sends, as the target recognises it.
struct Route {
  std::string step;
  int step_index = 0;
  Role role = Role::kCall;
  std::string method;
  // The path after the base URL, split at '/': a segment rendered from a template
  // is "*" and matches any one segment.
  std::vector<std::string> segments;
  std::string env;     // the {{env.NAME}} its URL starts with
  Millis timeout = 0;  // the request's timeout
  bool side_effecting = false;
  // A call that creates an object: side-effecting, not a PUT, and its path names
  // no object (a POST to a collection). Otherwise a side-effecting request acts on
  // the object its path names (a PUT, a cancel), which is idempotent by its nature.
  bool creates = false;
  std::string result_pointer;              // where the generated id goes in a create's answer
  std::vector<std::string> read_pointers;  // what the templates read of a GET's answer
  // The target keeps every key it was sent and answers a repeated key as the first
  // time, without a second effect: only when the step declares `idempotency:
  // { honored: true }`. A step protected by its lookup meets a target that does not.
  bool honors_key = false;
  std::vector<std::string> key_headers;  // lower case: idempotency-key and the step's own
  // kLookup: where the candidates go (`items`) or the one found (`found`).
  std::string items_pointer;
  std::string found_pointer;
  std::string external_id_pointer;
  // kLookup: the query parameters whose value is a literal in the definition (a page
  // size, a format): knobs, not search terms; the target ignores them.
  std::vector<std::string> literal_params;
  // kCall: where a lookup of this step finds a candidate's id (the stored object
  // holds its id there too); "" = no lookup.
  std::string lookup_id_pointer;
  // An email (method "MAIL"): received by the target's SMTP listener. Its
  // X-Waystone-Delivery as a pattern ("{{...}}" matches anything): which of the
  // step's emails a message is (its original, or its correction).
  std::string mail_delivery;
  // Forwarded to a team's sandbox (--against): its effects are not seen here.
  bool forwarded = false;
  // A branch of a parallel group ("" = the main line): branches side by side take
  // effect, and are undone, in no order among themselves.
  std::string group;
  int branch = -1;
  // The literal pieces of its body's strings ("is confirmed."): what tells two
  // requests on one path apart (a LINE message and its correction).
  std::vector<std::string> body_fragments;

  // The specificity of the route: literal segments count.
  int Literals() const;
};

struct Contract {
  std::vector<Route> routes;
  std::vector<std::string> url_envs;    // env names that are a base URL of some request
  std::vector<std::string> smtp_envs;   // those of them that are an smtp:// URL (emails)
  std::vector<std::string> other_envs;  // env names read elsewhere (given a verify value)
  std::vector<std::string> secrets;     // secret names (given a verify value)
  std::vector<std::string> inferred;    // one line per route: what verify assumed
  // Routes of two steps that look alike: the second step's requests are counted
  // (and its faults met) as the first's. Listed as not covered.
  std::vector<std::string> ambiguous;
  // The steps verify exercises, in order: the HTTP steps of the main line.
  std::vector<int> http_steps;
  // The wait and approval steps: the worker delivers their event or decision (twice).
  std::vector<int> waiting_steps;
};

// Infers the contract of `definition`. InvalidArgument naming the step when verify
// cannot stand in for what it calls (a URL not under {{env.NAME}}, an email).
absl::StatusOr<Contract> InferContract(const WorkflowDefinition& definition);

// Applies a contract file (YAML) to `contract`: per system, by the env name of its
// base URL, `honors_keys` (whatever the definition declares), `key_header` (the one
// header it deduplicates on) and `ignore_params` (lookup parameters that are knobs).
// InvalidArgument as "FILE:LINE: message".
absl::Status ApplyContractFile(const std::string& path, Contract* contract);

// The route an email arrives on: the first email route whose delivery pattern fits
// `delivery` (the message's X-Waystone-Delivery); nullptr when none does.
const Route* MatchMail(const Contract& contract, std::string_view delivery);

// The route a request arrives on: method and path (after the schedule's prefix)
// against every route, the most literal match first, and among those alike the one
// whose body fragments `body` holds; nullptr when none matches.
const Route* MatchRoute(const Contract& contract, std::string_view method, std::string_view path,
                        std::string_view body = {});

// Splits a path at '/' (no empty segments).
std::vector<std::string> PathSegments(std::string_view path);

// A value for a field verify makes up (of an input, an answer, an event): a plain
// address for a field named like an email, else "verify<pointer>".
std::string SampleValue(const std::string& pointer_or_path);

// An input object for the definition: every {{input.a.b}} it reads gets a string
// "verify-a.b". Used when verify is given no --input.
std::string SynthesizeInput(const WorkflowDefinition& definition);

}  // namespace waystone::verify
