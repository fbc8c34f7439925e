// The rules of recovery, as tables: what each outcome (a call's answer, a lookup's,
// a compensation's, a crash, an event) does to a step of each recovery class, and to
// its instance. Pure: no store, no sockets, no clock but `now`. This is the place to
// learn the rules; rules/transitions.h says where each lives.

#include "rules/transitions.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/redact.h"
#include "definition/loader.h"
#include "rules/state_machine.h"
#include "support/records.h"

namespace waystone {
namespace {

using S = StepState;
using I = InstanceState;
using A = AlertKind;
using testing::Instance;
using testing::Steps;

// One step of each kind the rules tell apart, in the order a workflow would have them.
constexpr int kRead = 0;       // GET: repeatable, safe to repeat
constexpr int kUndoable = 1;   // POST, compensable, honoured key, with a compensation
constexpr int kLooked = 2;     // POST, recovery lookup, records an external id
constexpr int kHonoured = 3;   // POST, repeatable: the target deduplicates on the key
constexpr int kManual = 4;     // POST, manual, no lookup
constexpr int kMissingId = 5;  // POST, manual, records an external id, no lookup
constexpr int kWait = 6;       // waits for an event, 1 s deadline

const WorkflowDefinition& TransitionsDefinition() {
  static const WorkflowDefinition definition = [] {
    auto loaded = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: GET, url: "http://x/a" }
    retry: { max_attempts: 3 }
  - name: b
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/b" }
    retry: { max_attempts: 3 }
    compensate:
      request: { method: POST, url: "http://x/b/undo" }
      retry: { max_attempts: 2 }
  - name: c
    recovery: lookup
    request: { method: POST, url: "http://x/c" }
    result: { external_id: "/id" }
    retry: { max_attempts: 3 }
    lookup:
      request: { method: GET, url: "http://x/c?ref={{instance.ref}}" }
      items: "/items"
      external_id: "/id"
      match: { "/ref": "{{instance.ref}}" }
  - name: d
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/d" }
    retry: { max_attempts: 3 }
  - name: e
    recovery: manual
    request: { method: POST, url: "http://x/e" }
  - name: f
    recovery: manual
    request: { method: POST, url: "http://x/f" }
    result: { external_id: "/id" }
  - name: g
    wait: { event: com.example.approved, timeout: 1s }
)",
                                     "w.yaml");
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return *loaded;
  }();
  return definition;
}

constexpr Millis kNow = 10'000;

// An instance running at step `at`: the steps before it completed, the rest pending.
struct World {
  InstanceRecord instance = Instance(I::kRunning);
  std::vector<StepRecord> steps;
  SeededRandom random{7};

  explicit World(int at, StepState state = S::kRunning) {
    std::vector<StepState> states(TransitionsDefinition().steps.size(), S::kPending);
    for (int i = 0; i < at; ++i) states[i] = S::kCompleted;
    states[at] = state;
    for (size_t i = 0; i < states.size(); ++i) {
      StepRecord s;
      s.index = static_cast<int>(i);
      s.name = TransitionsDefinition().steps[i].name;
      s.state = states[i];
      steps.push_back(s);
    }
    steps[at].attempts = 1;
  }
  Facts Now() { return {TransitionsDefinition(), instance, steps, kNow, random}; }
};

CallResult Answer(int status, std::string body, ErrorClass error_class) {
  CallResult result;
  result.response.outcome.kind = CallOutcome::Kind::kResponse;
  result.response.outcome.status = status;
  result.response.outcome.sent = true;
  result.response.body = std::move(body);
  result.error_class = error_class;
  return result;
}

CallResult Lost() {
  CallResult result;
  result.response.outcome.kind = CallOutcome::Kind::kLostAfterSend;
  result.response.outcome.sent = true;
  result.response.error = "timed out after the request was sent";
  result.error_class = ErrorClass::kUnknown;
  return result;
}

std::vector<std::string> EventTypes(const Change& change) {
  std::vector<std::string> types;
  for (const EventRecord& event : change.events) types.push_back(event.type);
  return types;
}

std::vector<AlertKind> AlertKinds(const Change& change) {
  std::vector<AlertKind> kinds;
  for (const AlertRecord& alert : change.alerts) kinds.push_back(alert.kind);
  return kinds;
}

// What a transition must leave: the step's state, whether it is due later, the
// instance's next state (nullopt: unchanged), the alerts raised.
struct Expect {
  StepState step;
  std::optional<InstanceState> instance;
  std::vector<AlertKind> alerts;
  bool backoff = false;  // the step's next attempt waits (next_attempt_at > now)
};

void Check(const Change& change, int index, const Expect& expect, const std::string& row) {
  SCOPED_TRACE(row);
  ASSERT_EQ(change.now, kNow);
  ASSERT_FALSE(change.steps.empty());
  const StepRecord& step = change.steps.front();
  EXPECT_EQ(step.index, index);
  EXPECT_EQ(step.state, expect.step) << ToString(step.state);
  EXPECT_EQ(change.state, expect.instance);
  EXPECT_EQ(AlertKinds(change), expect.alerts);
  EXPECT_EQ(step.next_attempt_at > kNow, expect.backoff) << step.next_attempt_at;
  // Every alert leaves through the outbox, and every instance move has its event.
  const std::vector<std::string> types = EventTypes(change);
  auto has = [&](const std::string& type) { return std::ranges::count(types, type) == 1; };
  for (AlertKind kind : expect.alerts) {
    EXPECT_TRUE(has("waystone.alert." + std::string(ToString(kind)))) << ToString(kind);
  }
  if (change.state) {
    EXPECT_TRUE(has("waystone.instance." + std::string(ToString(*change.state))));
    EXPECT_EQ(change.next_run_at, kNow);
  }
}

// --- A call's outcome × the step's recovery class -----------------------------------

struct CallRow {
  const char* name;
  int index;
  CallResult result;
  int attempts;  // made so far, this one included
  Expect expect;
};

// Issue 45, item 5: a secret the 500-character limit cut through kept its first part
// ("Bearer SEKRETdms7Q9z..."): what is kept is redacted first, then cut.
TEST(TransitionsTest, AMessageIsRedactedBeforeItIsCut) {
  RegisterSecretValue("SEKRETdms7Q9zTransitions");
  for (size_t pad : {480u, 490u, 495u, 499u}) {
    const std::string echoed = std::string(pad, 'x') + "Bearer SEKRETdms7Q9zTransitions tail";
    const std::string kept = ShortenMessage(echoed);
    EXPECT_EQ(kept.find("SEKRET"), std::string::npos) << pad << ": " << kept;
    EXPECT_EQ(kept.find("SEKR"), std::string::npos) << pad << ": " << kept;
    EXPECT_LE(kept.size(), 503u);
  }
  HttpResponse answer;
  answer.outcome.kind = CallOutcome::Kind::kResponse;
  answer.outcome.status = 401;
  answer.body = std::string(497, 'y') + "SEKRETdms7Q9zTransitions";
  EXPECT_EQ(DescribeResponse(answer).find("SEK"), std::string::npos) << DescribeResponse(answer);
}

TEST(TransitionsTest, WhatACallsOutcomeDoesToEachKindOfStep) {
  const CallResult ok_id = Answer(201, R"({"id":"ORD-1"})", ErrorClass::kNone);
  const CallResult ok_bare = Answer(200, R"({"status":"accepted"})", ErrorClass::kNone);
  const CallResult busy = Answer(503, "", ErrorClass::kTransient);
  const CallResult refused = Answer(422, R"({"error":"bad sku"})", ErrorClass::kRejected);
  const CallResult gateway = Answer(502, "", ErrorClass::kUnknown);
  const std::vector<CallRow> table = {
      // 2xx: completed; one without the external id the step records is unknown,
      // and pauses only when nothing (lookup, honoured key) can settle it.
      {"read 2xx", kRead, ok_bare, 1, {S::kCompleted, std::nullopt, {}}},
      {"lookup step 2xx with id", kLooked, ok_id, 1, {S::kCompleted, std::nullopt, {}}},
      {"lookup step 2xx without id", kLooked, ok_bare, 1, {S::kUnknown, std::nullopt, {}}},
      {"manual step 2xx without id",
       kMissingId,
       ok_bare,
       1,
       {S::kUnknown, I::kNeedsAttention, {A::kResultMissing}}},
      {"manual step 2xx (records no id)", kManual, ok_bare, 1, {S::kCompleted, std::nullopt, {}}},
      // transient: retried after a backoff until max_attempts; then failed.
      {"read 503", kRead, busy, 1, {S::kPending, std::nullopt, {}, true}},
      {"honoured 503", kHonoured, busy, 2, {S::kPending, std::nullopt, {}, true}},
      {"read 503 exhausted, nothing to undo before it",
       kRead,
       busy,
       3,
       {S::kFailed, I::kFailed, {A::kRetriesExhausted}}},
      {"honoured 503 exhausted, a completed step to undo",
       kHonoured,
       busy,
       3,
       {S::kFailed, I::kCompensating, {A::kRetriesExhausted}}},
      // rejected: failed at once; a manual step pauses for an operator instead.
      {"read 422", kRead, refused, 1, {S::kFailed, I::kFailed, {}}},
      {"lookup step 422 after a compensable step",
       kLooked,
       refused,
       1,
       {S::kFailed, I::kCompensating, {}}},
      {"manual step 422",
       kManual,
       refused,
       1,
       {S::kFailed, I::kNeedsAttention, {A::kNeedsOperator}}},
      // unknown (a gateway answered, or the answer was lost): unknown, settled next.
      {"read 502", kRead, gateway, 1, {S::kUnknown, std::nullopt, {}}},
      {"lookup step lost: looked up after the request's timeout",
       kLooked,
       Lost(),
       1,
       {S::kUnknown, std::nullopt, {}, true}},
      {"manual step lost", kManual, Lost(), 1, {S::kUnknown, std::nullopt, {}}},
      {"honoured lost, retries exhausted: still unknown",
       kHonoured,
       Lost(),
       3,
       {S::kUnknown, std::nullopt, {}}},
  };
  for (const CallRow& row : table) {
    World world(row.index);
    world.steps[row.index].attempts = row.attempts;
    const Change change = RecordCall(world.Now(), world.steps[row.index], row.result);
    Check(change, row.index, row.expect, row.name);
  }
}

// `errors.body`: what a rule makes of a complete answer, first match first; an
// answer no rule matches keeps its class by status.
TEST(TransitionsTest, BodyRulesClassifyAnswersByWhatTheySay) {
  const std::vector<BodyErrorRule> rules = {
      {0, {{"/status", "ERROR"}, {"/code", "RATE_LIMIT"}}, BodyVerdict::kTransient},
      {0, {{"/code", "DUPLICATE"}}, BodyVerdict::kExists},
      {400, {{"/code", "VALIDATION"}}, BodyVerdict::kRejected},
      {0, {{"/retryable", "true"}, {"/n", "7"}}, BodyVerdict::kUnknown},
  };
  struct Row {
    const char* name;
    CallResult answer;
    ErrorClass expected;
    bool exists = false;
  };
  const std::vector<Row> table = {
      {"200 RATE_LIMIT",
       Answer(200, R"({"status":"ERROR","code":"RATE_LIMIT"})", ErrorClass::kNone),
       ErrorClass::kTransient},
      {"200 RATE_LIMIT without status ERROR: no rule",
       Answer(200, R"({"code":"RATE_LIMIT"})", ErrorClass::kNone), ErrorClass::kNone},
      {"409 DUPLICATE: exists", Answer(409, R"({"code":"DUPLICATE"})", ErrorClass::kRejected),
       ErrorClass::kUnknown, true},
      {"400 VALIDATION", Answer(400, R"({"code":"VALIDATION"})", ErrorClass::kRejected),
       ErrorClass::kRejected},
      {"200 VALIDATION: the rule wants 400",
       Answer(200, R"({"code":"VALIDATION"})", ErrorClass::kNone), ErrorClass::kNone},
      {"bool and number values compare as their JSON text",
       Answer(200, R"({"retryable":true,"n":7})", ErrorClass::kNone), ErrorClass::kUnknown},
      {"not JSON: by status", Answer(502, "<html>bad gateway</html>", ErrorClass::kUnknown),
       ErrorClass::kUnknown},
      {"lost: no body to read", Lost(), ErrorClass::kUnknown},
  };
  for (const Row& row : table) {
    const AnswerClass read = ClassifyAnswer(row.answer.response, {nullptr, &rules});
    EXPECT_EQ(read.error_class, row.expected) << row.name;
    EXPECT_EQ(read.exists, row.exists) << row.name;
    EXPECT_FALSE(read.accepted) << row.name;
    // Without rules, each answer keeps the class its status gives it.
    EXPECT_EQ(ClassifyAnswer(row.answer.response, {}).error_class, row.answer.error_class)
        << row.name;
  }
}

// One function reads an answer for both drivers: the status class after the step's
// overrides, then its body rules, then its accepted statuses (LINE's 409: this very
// request was accepted before under its key), which win over both.
TEST(TransitionsTest, AnAnswerIsClassifiedByOverridesThenBodyRulesThenAcceptedStatuses) {
  const StatusOverrides overrides = {{409, ErrorClass::kTransient}, {503, ErrorClass::kRejected}};
  const std::vector<BodyErrorRule> body = {{0, {{"/code", "BUSY"}}, BodyVerdict::kTransient}};
  const std::vector<int> accepted = {409};
  struct Row {
    const char* name;
    CallResult answer;
    AnswerRules rules;
    ErrorClass expected;
    bool accepted = false;
  };
  const std::vector<Row> table = {
      {"503 overridden to rejected", Answer(503, "", {}), {&overrides}, ErrorClass::kRejected},
      {"409 overridden to transient", Answer(409, "", {}), {&overrides}, ErrorClass::kTransient},
      {"an override does not apply to a lost request",
       [] {
         CallResult lost = Lost();
         lost.response.outcome.status = 503;
         return lost;
       }(),
       {&overrides},
       ErrorClass::kUnknown},
      {"a body rule over the override",
       Answer(503, R"({"code":"BUSY"})", {}),
       {&overrides, &body},
       ErrorClass::kTransient},
      {"409 accepted before: no error",
       Answer(409, "", {}),
       {&overrides, &body, &accepted},
       ErrorClass::kNone,
       true},
      {"accepted wins over a body rule",
       Answer(409, R"({"code":"BUSY"})", {}),
       {nullptr, &body, &accepted},
       ErrorClass::kNone,
       true},
      {"another status is not accepted",
       Answer(503, "", {}),
       {nullptr, nullptr, &accepted},
       ErrorClass::kTransient},
      {"a lost request with that status is not an answer, so not accepted",
       [] {
         CallResult lost = Lost();
         lost.response.outcome.status = 409;
         return lost;
       }(),
       {nullptr, nullptr, &accepted},
       ErrorClass::kUnknown},
  };
  for (const Row& row : table) {
    const AnswerClass read = ClassifyAnswer(row.answer.response, row.rules);
    EXPECT_EQ(read.error_class, row.expected) << row.name;
    EXPECT_EQ(read.accepted, row.accepted) << row.name;
    EXPECT_FALSE(read.exists) << row.name;
  }
}

// "It exists already": never sent again. With a lookup it is looked up at once and
// a lookup that keeps finding nothing is a contradiction; without one, an operator.
TEST(TransitionsTest, AnExistsAnswerIsLookedUpNeverResent) {
  CallResult duplicate = Answer(200, R"({"code":"DUPLICATE","id":"ORD-9"})", ErrorClass::kUnknown);
  duplicate.exists = true;
  World looked(kLooked);
  Change change = RecordCall(looked.Now(), looked.steps[kLooked], duplicate);
  Check(change, kLooked, {S::kUnknown, std::nullopt, {}}, "exists with a lookup");
  EXPECT_FALSE(change.steps.front().response_json.empty()) << "the target said it exists";
  EXPECT_NE(change.steps.front().error_message.find("exists already"), std::string::npos);
  StepRecord step = change.steps.front();
  step.lookups = 1;
  const MatchValues ref = std::vector<std::pair<std::string, std::string>>{{"/ref", "t:k"}};
  change = RecordLookup(looked.Now(), step, Answer(200, R"({"items":[]})", ErrorClass::kNone), ref);
  Check(change, kLooked, {S::kUnknown, std::nullopt, {}, true}, "exists, not found yet");
  EXPECT_EQ(change.steps.front().resolution, Resolution::kNone) << "never resubmitted";

  World manual(kMissingId);
  change = RecordCall(manual.Now(), manual.steps[kMissingId], duplicate);
  Check(change, kMissingId, {S::kUnknown, I::kNeedsAttention, {A::kNeedsOperator}},
        "exists without a lookup");
  World honoured(kHonoured);
  change = RecordCall(honoured.Now(), honoured.steps[kHonoured], duplicate);
  Check(change, kHonoured, {S::kUnknown, I::kNeedsAttention, {A::kNeedsOperator}},
        "exists with an honoured key: not resent either");
}

// A LINE notification: its 409 for a reused retry key is the first send's success,
// and past the key's 24 h window an unknown outcome is never resent.
TEST(TransitionsTest, ANotificationsKeyWindowAndAcceptedAnswer) {
  auto loaded = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
templates:
  hello: { version: 1, text: "hello" }
steps:
  - name: a
    request: { method: GET, url: "http://x/a" }
  - name: tell
    notify:
      reports: a
      template: hello
      recipient: "{{input.id}}"
      channels: { line: { to: U1, token: "{{secret.T}}", url: "http://line" } }
)",
                                   "w.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const WorkflowDefinition& definition = *loaded;
  const InstanceRecord instance = Instance(I::kRunning);
  SeededRandom random{3};
  const Millis day = 24LL * 3600 * 1000;
  const Millis now = 10 * day;
  std::vector<StepRecord> steps(2);
  steps[0].state = S::kCompleted;
  steps[1].index = 1;
  steps[1].name = "tell-line";
  steps[1].state = S::kPending;
  steps[1].attempts = 1;
  steps[1].unknowns = 1;
  steps[1].resolution = Resolution::kResubmitted;
  auto beyond = [&](Millis first_sent) {
    steps[1].started_at = first_sent;
    return BeyondKeyWindow({definition, instance, steps, now, random}, 1);
  };
  EXPECT_FALSE(beyond(now - day + 60'000).has_value()) << "a minute left: resent under its key";
  // Ten seconds left, but the request may take its whole 10 s timeout to arrive.
  std::optional<Change> paused = beyond(now - day + 10'000);
  ASSERT_TRUE(paused.has_value());
  ASSERT_EQ(paused->steps.size(), 1u);
  EXPECT_EQ(paused->steps[0].state, S::kUnknown);
  EXPECT_EQ(paused->steps[0].unknowns, 1) << "nothing was sent: not another unknown";
  EXPECT_EQ(paused->state, I::kNeedsAttention);
  EXPECT_EQ(AlertKinds(*paused), std::vector<AlertKind>{A::kNeedsOperator});
  EXPECT_NE(paused->steps[0].error_message.find("keeps its key only 1d"), std::string::npos)
      << paused->steps[0].error_message;
  steps[1].unknowns = 0;  // every earlier attempt was answered: nothing can be delivered twice
  EXPECT_FALSE(beyond(now - 2 * day).has_value());

  // 409 with the accepted request's id: completed, that id its external id.
  steps[1].state = S::kRunning;
  CallResult conflict =
      Answer(409, R"({"message":"The retry key is already accepted"})", ErrorClass::kNone);
  conflict.accepted = true;
  conflict.response.headers = {{"x-line-request-id", "req-2"},
                               {"x-line-accepted-request-id", "req-1"}};
  Change change = RecordCall({definition, instance, steps, now, random}, steps[1], conflict);
  ASSERT_EQ(change.steps.size(), 1u);
  EXPECT_EQ(change.steps[0].state, S::kCompleted);
  EXPECT_EQ(change.steps[0].external_id, "req-1");
  ASSERT_EQ(change.events.size(), 1u);
  EXPECT_NE(change.events[0].payload_json.find("accepted before under its key"), std::string::npos)
      << change.events[0].payload_json;
  CallResult ok = Answer(200, R"({"sentMessages":[{"id":"1"}]})", ErrorClass::kNone);
  ok.response.headers = {{"x-line-request-id", "req-3"}};
  change = RecordCall({definition, instance, steps, now, random}, steps[1], ok);
  EXPECT_EQ(change.steps[0].external_id, "req-3");
}

// A certificate refused at the TLS layer is not a business refusal: the step fails
// without a retry, and even with a completed compensable step before it the instance
// waits for an operator instead of compensating.
TEST(TransitionsTest, ACertificateRefusedWaitsForAnOperatorInsteadOfCompensating) {
  World world(kLooked);
  CallResult refused;
  refused.response.outcome.kind = CallOutcome::Kind::kInvalid;
  refused.response.outcome.identity_refused = true;
  refused.response.error = "TLS with target 'erp' failed: certificate has expired";
  refused.error_class = ErrorClass::kRejected;
  Change change = RecordCall(world.Now(), world.steps[kLooked], refused);
  Check(change, kLooked, {S::kFailed, I::kNeedsAttention, {A::kNeedsOperator}}, "tls");
  EXPECT_NE(change.status_reason->find("fix the target's certificate"), std::string::npos);
  refused.response.outcome.identity_refused = false;  // a malformed URL, say: a real refusal
  change = RecordCall(world.Now(), world.steps[kLooked], refused);
  Check(change, kLooked, {S::kFailed, I::kCompensating, {}}, "invalid");
}

// Found by `waystone verify`: after a lost answer the step was sent again under its
// key, the target answered 409 "this key was used before", and the step failed and
// the order was compensated while the first request's effect stayed at the target.
TEST(TransitionsTest, ARefusedResubmissionAfterAnUnknownOutcomeWaitsForAnOperator) {
  World world(kHonoured);
  const CallResult duplicate =
      Answer(409, R"({"detail":"key used before"})", ErrorClass::kRejected);
  Change first = RecordCall(world.Now(), world.steps[kHonoured], duplicate);
  Check(first, kHonoured, {S::kFailed, I::kCompensating, {}},
        "a first refusal proves nothing happened");

  world.steps[kHonoured].unknowns = 1;  // an earlier attempt's outcome was not known ...
  world.steps[kHonoured].attempts = 2;  // ... and it was sent again under the same key
  world.steps[kHonoured].resolution = Resolution::kResubmitted;
  Change again = RecordCall(world.Now(), world.steps[kHonoured], duplicate);
  Check(again, kHonoured, {S::kUnknown, I::kNeedsAttention, {A::kNeedsOperator}}, "after unknown");
  EXPECT_NE(again.status_reason->find("the earlier attempt may have taken effect"),
            std::string::npos)
      << *again.status_reason;
  EXPECT_EQ(EventTypes(again).front(), "waystone.step.unknown");  // never step.failed
  EXPECT_EQ(again.steps.front().unknowns, 1);  // the refusal itself was no unknown outcome

  // Any other refusal of the same key is one: a target that keeps keys would have
  // answered as the first time had the first attempt acted (a blocked customer's 422).
  Check(RecordCall(world.Now(), world.steps[kHonoured],
                   Answer(422, R"({"error":"customer blocked"})", ErrorClass::kRejected)),
        kHonoured, {S::kFailed, I::kCompensating, {}}, "a 422 after unknown");

  // A lookup that found nothing proved the earlier attempt did nothing: a refusal of
  // the resubmission it allowed is a refusal, and what came before is undone.
  World looked(kLooked);
  looked.steps[kLooked].unknowns = 1;
  looked.steps[kLooked].resolution = Resolution::kResubmitted;
  Check(RecordCall(looked.Now(), looked.steps[kLooked], duplicate), kLooked,
        {S::kFailed, I::kCompensating, {}}, "after a lookup found nothing");
  // A read changed nothing, whatever happened to the request before.
  World read(kRead);
  read.steps[kRead].unknowns = 1;
  Check(RecordCall(read.Now(), read.steps[kRead], Answer(409, "", ErrorClass::kRejected)), kRead,
        {S::kFailed, I::kFailed, {}}, "a read");
}

TEST(TransitionsTest, ALookupThatCouldNotReadEveryPagePausesTheInstance) {
  World world(kLooked, S::kUnknown);
  const Change change = LookupUnproven(world.Now(), world.steps[kLooked], "more than 2 pages");
  Check(change, kLooked, {S::kUnknown, I::kNeedsAttention, {A::kNeedsOperator}}, "unproven");
  ASSERT_TRUE(change.status_reason.has_value());
  EXPECT_NE(change.status_reason->find("more than 2 pages"), std::string::npos);
}

TEST(TransitionsTest, ACompletedCallKeepsItsExternalIdAndSaysSo) {
  World world(kLooked);
  world.steps[kLooked].unknown_since = 5;
  const Change change = RecordCall(world.Now(), world.steps[kLooked],
                                   Answer(201, R"({"id":"ORD-1"})", ErrorClass::kNone));
  const StepRecord& step = change.steps.front();
  EXPECT_EQ(step.external_id, "ORD-1");
  EXPECT_EQ(step.finished_at, kNow);
  EXPECT_EQ(step.unknown_since, 0);
  EXPECT_EQ(step.error_class, ErrorClass::kNone);
  EXPECT_EQ(EventTypes(change), std::vector<std::string>{"waystone.step.completed"});
}

TEST(TransitionsTest, AnAnswerNestedTooDeepFailsTheStepInsteadOfBeingKept) {
  World world(kRead);
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const Change change =
      RecordCall(world.Now(), world.steps[kRead], Answer(200, deep, ErrorClass::kNone));
  Check(change, kRead, {S::kFailed, I::kFailed, {}}, "deep");
  EXPECT_NE(change.steps.front().error_message.find("deeper"), std::string::npos);
}

TEST(TransitionsTest, AnUnknownOutcomeRemembersWhenItBecameUnknown) {
  World world(kLooked);
  Change change = RecordCall(world.Now(), world.steps[kLooked], Lost());
  EXPECT_EQ(change.steps.front().unknown_since, kNow);
  EXPECT_EQ(change.steps.front().unknowns, 1);
  world.steps[kLooked] = change.steps.front();
  world.steps[kLooked].unknown_since = 3;  // it was unknown before this attempt
  change = RecordCall(world.Now(), world.steps[kLooked], Lost());
  EXPECT_EQ(change.steps.front().unknown_since, 3);
  EXPECT_EQ(change.steps.front().unknowns, 2);
}

// --- The checkpoint before a call, and a crash during it ----------------------------

TEST(TransitionsTest, BeforeACallTheStepIsRunningAndAWriteClaimsItsKey) {
  World world(kHonoured, S::kPending);
  world.steps[kHonoured].response_json = "{}";  // an earlier 2xx without id
  Change change = BeginCall(world.Now(), kHonoured, "t:k:d", "hash", "span", 1000);
  const StepRecord& step = change.steps.front();
  EXPECT_EQ(step.state, S::kRunning);
  EXPECT_EQ(step.attempts, 2);
  EXPECT_EQ(step.idempotency_key, "t:k:d");
  EXPECT_EQ(step.request_hash, "hash");
  EXPECT_EQ(step.started_at, kNow);
  EXPECT_TRUE(step.response_json.empty());
  ASSERT_TRUE(change.idempotency.has_value());
  EXPECT_EQ(change.idempotency->expires_at, kNow + 1000);
  EXPECT_FALSE(change.state.has_value());

  World read(kRead, S::kPending);
  change = BeginCall(read.Now(), kRead, "", "hash", "span", 1000);
  EXPECT_FALSE(change.idempotency.has_value());  // a read claims nothing
}

TEST(TransitionsTest, AStepFoundRunningIsUnknownNeverFailed) {
  World world(kLooked, S::kRunning);
  world.steps[kLooked].started_at = 4000;
  const Change change = RecoverRunning(world.Now(), kLooked);
  Check(change, kLooked, {S::kUnknown, std::nullopt, {}, true}, "recover");
  ASSERT_EQ(change.attempts.size(), 1u);
  EXPECT_EQ(change.attempts[0].error_class, ErrorClass::kUnknown);
  EXPECT_EQ(change.attempts[0].started_at, 4000);
  EXPECT_EQ(EventTypes(change), std::vector<std::string>{"waystone.step.unknown"});
}

// The worker before may have sent its request up to the moment its lease ran out,
// that is before this claim: the lookup waits one request timeout (c's default,
// 10 s), so a request still in flight is found. Steps without a lookup settle
// otherwise and wait for nothing.
TEST(TransitionsTest, AStepFoundRunningIsLookedUpOnlyAfterARequestTimeout) {
  World looked(kLooked, S::kRunning);
  Change change = RecoverRunning(looked.Now(), kLooked);
  EXPECT_EQ(change.steps.front().next_attempt_at, kNow + 10'000);
  looked.steps[kLooked] = change.steps.front();
  EXPECT_EQ(Decide(TransitionsDefinition(), looked.instance, looked.steps, kNow + 9'999).kind,
            NextAction::Kind::kWait);
  EXPECT_EQ(Decide(TransitionsDefinition(), looked.instance, looked.steps, kNow + 10'000).kind,
            NextAction::Kind::kResolveUnknown);
  for (int index : {kRead, kHonoured, kManual}) {
    World world(index, S::kRunning);
    EXPECT_EQ(RecoverRunning(world.Now(), index).steps.front().next_attempt_at, 0)
        << TransitionsDefinition().steps[index].name;
  }
}

// An answer lost 300 ms after the request was handed over (a reset, a proxy closing
// early) does not mean the target is done with it: the lookup waits out the rest of
// the request's timeout. After a timeout it runs at once.
TEST(TransitionsTest, ALookupAfterALostAnswerWaitsOutTheRequestTimeout) {
  World world(kLooked);
  CallResult reset = Lost();
  reset.left_at = kNow - 300;
  Change change = RecordCall(world.Now(), world.steps[kLooked], reset);
  EXPECT_EQ(change.steps.front().state, S::kUnknown);
  EXPECT_EQ(change.steps.front().next_attempt_at, kNow - 300 + 10'000);
  CallResult timed_out = Lost();
  timed_out.left_at = kNow - 12'000;  // 10 s of timeout, and then some
  change = RecordCall(world.Now(), world.steps[kLooked], timed_out);
  EXPECT_LE(change.steps.front().next_attempt_at, kNow);
  World honoured(kHonoured);
  change = RecordCall(honoured.Now(), honoured.steps[kHonoured], reset);
  EXPECT_EQ(change.steps.front().state, S::kUnknown);
  EXPECT_EQ(change.steps.front().next_attempt_at, 0);  // resubmitted under its key
}

// --- Settling an unknown outcome ----------------------------------------------------

struct UnknownRow {
  const char* name;
  int index;
  int attempts;
  std::optional<Expect> expect;  // nullopt: it has a lookup to run
  Resolution resolution = Resolution::kNone;
};

TEST(TransitionsTest, WhatAnUnknownOutcomeBecomesWithoutALookup) {
  const std::vector<UnknownRow> table = {
      {"read: repeated after a backoff", kRead, 1, Expect{S::kPending, std::nullopt, {}, true}},
      {"read, retries exhausted: failed", kRead, 3,
       Expect{S::kFailed, I::kFailed, {A::kRetriesExhausted}}},
      {"honoured key: resubmitted under it", kHonoured, 1, Expect{S::kPending, std::nullopt, {}},
       Resolution::kResubmitted},
      {"honoured key, retries exhausted: stays unknown, paused", kHonoured, 3,
       Expect{S::kUnknown, I::kNeedsAttention, {A::kRetriesExhausted}}},
      {"compensable with honoured key: resubmitted", kUndoable, 1,
       Expect{S::kPending, std::nullopt, {}}, Resolution::kResubmitted},
      {"manual without lookup: paused for an operator", kManual, 1,
       Expect{S::kUnknown, I::kNeedsAttention, {A::kNeedsOperator}}},
      {"with a lookup: look it up", kLooked, 1, std::nullopt},
  };
  for (const UnknownRow& row : table) {
    World world(row.index, S::kUnknown);
    world.steps[row.index].attempts = row.attempts;
    const std::optional<Change> change = ResolveWithoutLookup(world.Now(), row.index);
    ASSERT_EQ(change.has_value(), row.expect.has_value()) << row.name;
    if (!change) continue;
    Check(*change, row.index, *row.expect, row.name);
    EXPECT_EQ(change->steps.front().resolution, row.resolution) << row.name;
  }
}

struct LookupRow {
  const char* name;
  CallResult answer;
  Expect expect;
  std::string recorded_id;    // the step's external id before the lookup
  bool answered_yes = false;  // a 2xx without id answered this step before
  int lookups = 1;
  Resolution resolution = Resolution::kNone;
  std::string adopted_id;
};

TEST(TransitionsTest, WhatALookupsAnswerDoesToAnUnknownStep) {
  auto items = [](std::string json) { return Answer(200, std::move(json), ErrorClass::kNone); };
  const std::string ours = R"({"id":"ORD-7","ref":"t:k"})";
  const std::string theirs = R"({"id":"ORD-8","ref":"t:other"})";
  const std::vector<LookupRow> table = {
      {"exactly one of ours: adopted",
       items(R"({"items":[)" + ours + "," + theirs + "]}"),
       {S::kCompleted, std::nullopt, {}},
       "",
       false,
       1,
       Resolution::kLookupFound,
       "ORD-7"},
      {"none: resubmitted under the same key",
       items(R"({"items":[)" + theirs + "]}"),
       {S::kPending, std::nullopt, {}},
       "",
       false,
       1,
       Resolution::kResubmitted},
      {"404 is none",
       Answer(404, "", ErrorClass::kNone),
       {S::kPending, std::nullopt, {}},
       "",
       false,
       1,
       Resolution::kResubmitted},
      {"none although the target said yes: asked again later (a search may lag)",
       items(R"({"items":[]})"),
       {S::kUnknown, std::nullopt, {}, true},
       "",
       true},
      {"none although the target said yes, lookups exhausted: contradiction",
       items(R"({"items":[]})"),
       {S::kUnknown, I::kNeedsAttention, {A::kLookupContradiction}},
       "",
       true,
       3},
      {"two of ours: an operator picks",
       items(R"({"items":[)" + ours + "," + ours + "]}"),
       {S::kUnknown, I::kNeedsAttention, {A::kLookupContradiction}}},
      {"another id than recorded: contradiction",
       items(R"({"items":[)" + ours + "]}"),
       {S::kUnknown, I::kNeedsAttention, {A::kLookupContradiction}},
       "ORD-1"},
      {"no items array: contradiction",
       items(R"({"found":[]})"),
       {S::kUnknown, I::kNeedsAttention, {A::kLookupContradiction}}},
      {"ours without an id: contradiction",
       items(R"({"items":[{"ref":"t:k"}]})"),
       {S::kUnknown, I::kNeedsAttention, {A::kLookupContradiction}}},
      // Found by `waystone verify`: an answer cut after its head reads as a 2xx
      // without a body, and used to count as "none", so the order was sent again.
      {"a 2xx without a body proves nothing: looked up again later",
       Answer(201, "", ErrorClass::kNone),
       {S::kUnknown, std::nullopt, {}, true}},
      {"a 2xx without a body, lookups exhausted: paused",
       Answer(200, "", ErrorClass::kNone),
       {S::kUnknown, I::kNeedsAttention, {A::kRetriesExhausted}},
       "",
       false,
       3},
      {"204 No Content is none",
       Answer(204, "", ErrorClass::kNone),
       {S::kPending, std::nullopt, {}},
       "",
       false,
       1,
       Resolution::kResubmitted},
      {"lookup busy: looked up again later",
       Answer(503, "", ErrorClass::kTransient),
       {S::kUnknown, std::nullopt, {}, true}},
      {"lookup lost, lookups exhausted: paused",
       Lost(),
       {S::kUnknown, I::kNeedsAttention, {A::kRetriesExhausted}},
       "",
       false,
       3},
      {"lookup refused: paused",
       Answer(403, "", ErrorClass::kRejected),
       {S::kUnknown, I::kNeedsAttention, {A::kNeedsOperator}}},
  };
  const MatchValues ref = std::vector<std::pair<std::string, std::string>>{{"/ref", "t:k"}};
  for (const LookupRow& row : table) {
    World world(kLooked, S::kUnknown);
    StepRecord& step = world.steps[kLooked];
    step.external_id = row.recorded_id;
    step.lookups = row.lookups;
    if (row.answered_yes) step.response_json = "{}";
    const Change change = RecordLookup(world.Now(), step, row.answer, ref);
    Check(change, kLooked, row.expect, row.name);
    EXPECT_EQ(change.steps.front().resolution, row.resolution) << row.name;
    if (!row.adopted_id.empty()) {
      EXPECT_EQ(change.steps.front().external_id, row.adopted_id) << row.name;
    }
  }
}

TEST(TransitionsTest, AMatchThatCannotBeRenderedIsAContradictionNotAMatch) {
  World world(kLooked, S::kUnknown);
  const Change change =
      RecordLookup(world.Now(), world.steps[kLooked],
                   Answer(200, R"({"items":[{"id":"ORD-7","ref":"t:k"}]})", ErrorClass::kNone),
                   absl::InvalidArgumentError("no value at instance.ref"));
  Check(change, kLooked, {S::kUnknown, I::kNeedsAttention, {A::kLookupContradiction}}, "render");
}

// --- Compensation -------------------------------------------------------------------

struct CompensationRow {
  const char* name;
  CallResult answer;
  int attempts;
  Expect expect;
  std::vector<std::string> audits;
};

TEST(TransitionsTest, WhatACompensationsOutcomeDoes) {
  const std::vector<CompensationRow> table = {
      {"2xx: compensated",
       Answer(200, "", ErrorClass::kNone),
       1,
       {S::kCompensated, std::nullopt, {}},
       {"compensated"}},
      {"503: retried",
       Answer(503, "", ErrorClass::kTransient),
       1,
       {S::kCompensating, std::nullopt, {}, true},
       {}},
      {"lost: retried (the key makes it safe)",
       Lost(),
       1,
       {S::kCompensating, std::nullopt, {}, true},
       {}},
      {"503, exhausted: failed for good",
       Answer(503, "", ErrorClass::kTransient),
       2,
       {S::kCompensationFailed, I::kNeedsAttention, {A::kCompensationFailed}},
       {"compensation_failed"}},
      {"422: failed for good",
       Answer(422, "", ErrorClass::kRejected),
       1,
       {S::kCompensationFailed, I::kNeedsAttention, {A::kCompensationFailed}},
       {"compensation_failed"}},
  };
  for (const CompensationRow& row : table) {
    World world(kLooked, S::kFailed);
    world.instance.state = I::kCompensating;
    world.steps[kUndoable].state = S::kCompensating;
    world.steps[kUndoable].compensation_attempts = row.attempts;
    const Change change =
        RecordCompensation(world.Now(), world.steps[kUndoable], row.answer, "t:k:b:compensate");
    Check(change, kUndoable, row.expect, row.name);
    std::vector<std::string> audits;
    for (const AuditRecord& audit : change.audits) audits.push_back(audit.action);
    EXPECT_EQ(audits, row.audits) << row.name;
  }
}

TEST(TransitionsTest, ACompensationIsAuditedBeforeItIsSent) {
  World world(kLooked, S::kFailed);
  world.instance.state = I::kCompensating;
  const Change change = BeginCompensation(world.Now(), kUndoable, "t:k:b:compensate");
  EXPECT_EQ(change.steps.front().state, S::kCompensating);
  EXPECT_EQ(change.steps.front().compensation_attempts, 1);
  ASSERT_EQ(change.audits.size(), 1u);
  EXPECT_EQ(change.audits[0].actor, "engine");
  EXPECT_EQ(change.audits[0].action, "compensate");
  EXPECT_NE(change.audits[0].detail_json.find("t:k:b:compensate"), std::string::npos);
}

// An email's correction (CompensationSpec::at_most_once): the SMTP server keeps no
// key, so whatever may have arrived is never sent again by the engine.
TEST(TransitionsTest, AnAtMostOnceCompensationThatMayHaveArrivedIsNotSentAgain) {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
templates:
  ok: { version: 1, subject: "s", text: "confirmed" }
  sorry: { version: 1, subject: "s", text: "cancelled" }
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/orders" }
  - name: tell
    notify:
      reports: create
      template: ok
      correction: sorry
      recipient: r
      channels: { email: { url: "smtp://m:25", from: a@b.example, to: c@d.example } }
)",
                                       "w.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  auto steps = Steps({S::kCompleted, S::kCompleted});
  steps[1].name = "tell-email";
  const auto instance = Instance(I::kCompensating);
  SeededRandom random(3);
  auto facts = [&](Millis now) { return Facts{*definition, instance, steps, now, random}; };

  EXPECT_FALSE(CompensationInFlight(facts(100), 1).has_value()) << "not begun: send it";
  const Change begun = BeginCompensation(facts(100), 1, "k");
  steps[1] = begun.steps.front();
  EXPECT_EQ(steps[1].error_class, ErrorClass::kUnknown) << "unknown until recorded";
  // Found begun and never recorded (its worker stopped): not sent again.
  const std::optional<Change> found = CompensationInFlight(facts(200), 1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->steps.front().state, S::kCompensationFailed);
  ASSERT_TRUE(found->state.has_value());
  EXPECT_EQ(*found->state, I::kNeedsAttention);
  EXPECT_NE(found->status_reason->find("it is not sent again"), std::string::npos)
      << *found->status_reason;

  // Its 250 lost: the same, never retried.
  const Change lost = RecordCompensation(facts(200), steps[1], Lost(), "k");
  EXPECT_EQ(lost.steps.front().state, S::kCompensationFailed);
  ASSERT_EQ(lost.alerts.size(), 1u);
  EXPECT_EQ(lost.alerts[0].kind, A::kCompensationFailed);
  // Refused before it was handed over (451, or the connection lost before DATA): retried,
  // and no longer taken for one under way.
  const Change later =
      RecordCompensation(facts(200), steps[1], Answer(451, "", ErrorClass::kTransient), "k");
  EXPECT_EQ(later.steps.front().state, S::kCompensating);
  EXPECT_GT(later.steps.front().next_attempt_at, 200);
  steps[1] = later.steps.front();
  EXPECT_FALSE(CompensationInFlight(facts(later.steps.front().next_attempt_at), 1).has_value());
}

// --- Transforms, waits and events ---------------------------------------------------

TEST(TransitionsTest, AWaitStepWaitsUntilItsDeadlineThenFails) {
  World world(kWait, S::kPending);
  world.steps[kWait].attempts = 0;
  Change change = RunWait(world.Now(), kWait);
  Check(change, kWait, {S::kWaiting, std::nullopt, {}, true}, "starts waiting");
  EXPECT_EQ(change.steps.front().next_attempt_at, kNow + 1000);
  world.steps[kWait] = change.steps.front();
  change = RunWait(world.Now(), kWait);  // Decide runs it again once the deadline passed
  Check(change, kWait, {S::kFailed, I::kCompensating, {}}, "deadline passed");
}

TEST(TransitionsTest, AnEventCompletesTheStepItsWaitingFor) {
  World world(kWait, S::kWaiting);
  world.steps[kWait].attempts = 0;
  const Change change = EventArrived(world.Now(), kWait, R"({"by":"kim"})", "evt-1",
                                     "event com.example.approved from crm");
  Check(change, kWait, {S::kCompleted, std::nullopt, {}}, "event");
  EXPECT_EQ(change.steps.front().external_id, "evt-1");
  EXPECT_EQ(change.steps.front().attempts, 1);
  EXPECT_EQ(change.steps.front().finished_at, kNow);
}

TEST(TransitionsTest, ATransformCompletesWithItsOutputOrFails) {
  World world(kRead, S::kPending);
  world.steps[kRead].attempts = 0;
  Change change = RecordTransform(world.Now(), kRead, std::string(R"({"x":1})"), 9000);
  Check(change, kRead, {S::kCompleted, std::nullopt, {}}, "output");
  EXPECT_EQ(change.steps.front().response_json, R"({"x":1})");
  EXPECT_EQ(change.steps.front().started_at, 9000);
  change = RecordTransform(world.Now(), kRead, absl::InvalidArgumentError("no input.x"), 9000);
  Check(change, kRead, {S::kFailed, I::kFailed, {}}, "no output");
}

// --- The instance -------------------------------------------------------------------

TEST(TransitionsTest, FinishingSaysWhy) {
  World world(kRead);
  world.instance.status_reason = "step 'a' failed";
  EXPECT_EQ(*Finish(world.Now(), I::kCompleted).status_reason, "all steps completed");
  EXPECT_EQ(*Finish(world.Now(), I::kCompensated).status_reason,
            "completed steps were compensated");
  EXPECT_EQ(*Finish(world.Now(), I::kFailed).status_reason, "step 'a' failed");
  EXPECT_EQ(EventTypes(Finish(world.Now(), I::kCompleted)),
            std::vector<std::string>{"waystone.instance.completed"});
}

TEST(TransitionsTest, AFailedStepMovesTheInstanceByWhatItCanUndo) {
  struct Row {
    const char* name;
    int index;
    InstanceState expected;
  } table[] = {
      {"nothing completed before it has a compensation", kRead, I::kFailed},
      {"a completed compensable step before it", kLooked, I::kCompensating},
      {"a manual step: an operator decides", kManual, I::kNeedsAttention},
  };
  for (const Row& row : table) {
    World world(row.index);
    const Change change =
        FailStep(world.Now(), world.steps[row.index], ErrorClass::kRejected, "no", std::nullopt);
    EXPECT_EQ(change.state, row.expected) << row.name;
    EXPECT_EQ(change.steps.front().finished_at, kNow) << row.name;
  }
}

TEST(TransitionsTest, ATransitionIsAFunctionOfItsFacts) {
  // The same facts and the same seed give the same change: nothing else is read.
  World one(kHonoured), two(kHonoured);
  const Change a =
      RecordCall(one.Now(), one.steps[kHonoured], Answer(503, "", ErrorClass::kTransient));
  const Change b =
      RecordCall(two.Now(), two.steps[kHonoured], Answer(503, "", ErrorClass::kTransient));
  EXPECT_EQ(a.steps.front().next_attempt_at, b.steps.front().next_attempt_at);
  ASSERT_EQ(one.steps[kHonoured].state, S::kRunning);  // the facts are not changed
}

// --- Waiting for a target ------------------------------------------------------

TEST(TransitionsTest, AWaitForATargetSaysSoChangesNoStepAndGivesTheReasonBackAfter) {
  World world(kUndoable, S::kCompensating);
  world.instance.state = I::kCompensating;
  world.instance.status_reason = "compensation started by alice: wrong customer";
  Change wait = AwaitTarget(world.Now(), "waiting for target 'erp': circuit open until T");
  EXPECT_TRUE(wait.steps.empty());
  EXPECT_TRUE(wait.events.empty());
  EXPECT_FALSE(wait.state.has_value());
  ASSERT_TRUE(wait.status_reason.has_value());
  EXPECT_EQ(*wait.status_reason,
            "waiting for target 'erp': circuit open until T; before that: compensation started "
            "by alice: wrong customer");
  world.instance.status_reason = *wait.status_reason;
  // Refused again: one wait text, the same reason kept behind it.
  Change again = AwaitTarget(world.Now(), "waiting for target 'erp': paused by bob at T: x");
  EXPECT_EQ(*again.status_reason,
            "waiting for target 'erp': paused by bob at T: x; before that: compensation started "
            "by alice: wrong customer");
  world.instance.status_reason = *again.status_reason;
  // Admitted: the compensation goes on under the operator's reason, audited with it.
  Change begun = BeginCompensation(world.Now(), kUndoable, "t:k:b:compensate");
  ASSERT_TRUE(begun.status_reason.has_value());
  EXPECT_EQ(*begun.status_reason, "compensation started by alice: wrong customer");
  ASSERT_EQ(begun.audits.size(), 1u);
  EXPECT_EQ(begun.audits[0].reason, "compensation started by alice: wrong customer");
  // Without a reason before the wait, the instance has none after it.
  World fresh(kHonoured, S::kPending);
  fresh.instance.status_reason = "waiting for target 'erp': 4 calls under way";
  Change call = BeginCall(fresh.Now(), kHonoured, "t:k:d", "hash", "span", 1000);
  ASSERT_TRUE(call.status_reason.has_value());
  EXPECT_EQ(*call.status_reason, "");
  // Any other reason is left alone by a transition.
  fresh.instance.status_reason = "step 'd' retried by alice: fixed";
  EXPECT_FALSE(
      BeginCall(fresh.Now(), kHonoured, "t:k:d", "hash", "span", 1000).status_reason.has_value());
}

}  // namespace
}  // namespace waystone
