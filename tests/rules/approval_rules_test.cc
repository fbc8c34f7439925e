// The rules of an `approval` step, as tables over its pure transitions
// (rules/approvals.h) and Decide: a request bound to the data version of its
// material fields, who may decide it, the first decision winning, late and foreign
// decisions refused and audited, a decision before the request kept for it, and
// where a rejection goes.

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "definition/loader.h"
#include "rules/approvals.h"
#include "rules/state_machine.h"
#include "support/records.h"

namespace waystone {
namespace {

using Json = nlohmann::json;
using S = StepState;
using I = InstanceState;

constexpr Millis kApprovalNow = 50'000;

// a: a compensable create; b: the approval (`approval` is its YAML); c: the order.
WorkflowDefinition ApprovalDefinition(const std::string& approval) {
  auto loaded = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/a" }
    compensate: { request: { method: POST, url: "http://x/a/undo" } }
  - name: b
    approval: )" + approval + R"(
  - name: c
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/c" }
)",
                                   "w.yaml");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *loaded : WorkflowDefinition{};
}

const WorkflowDefinition& Finance() {
  static const WorkflowDefinition definition = ApprovalDefinition(
      R"({ material: [/amount, /lines], summary: "order {{input.id}}: {{input.amount}} EUR",
         requester: "{{input.submitted_by}}", approvers: { group: finance } })");
  return definition;
}

InstanceRecord Instance(I state, const std::string& input) {
  InstanceRecord instance = testing::Instance(state);
  instance.id = 7;
  instance.tenant = "acme";
  instance.input_json = input;
  return instance;
}

const std::string kInput =
    R"({"id": "o-1", "amount": 120, "lines": [{"sku": "A", "qty": 2}], "note": "rush",
        "submitted_by": "bob"})";

ApprovalSnapshot Snapshot(const WorkflowDefinition& definition, const InstanceRecord& instance) {
  const Json context = {{"input", Json::parse(instance.input_json)}};
  auto snapshot = RenderApproval(definition.steps[1].approval, instance.input_json, context);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return snapshot.ok() ? *snapshot : ApprovalSnapshot{};
}

std::vector<StepRecord> ApprovalApply(std::vector<StepRecord> steps, const Change& change) {
  for (const StepRecord& step : change.steps) steps[step.index] = step;
  return steps;
}

// The instance with a completed and b's request 1 open (as OpenApproval left it).
struct Open {
  InstanceRecord instance;
  std::vector<StepRecord> steps;
  std::string version;
};

Open OpenRequest(const WorkflowDefinition& definition, I state = I::kRunning) {
  Open open{Instance(state, kInput), testing::Steps({S::kCompleted, S::kPending, S::kPending}), ""};
  SeededRandom random{1};
  const Facts facts{definition, open.instance, open.steps, kApprovalNow, random};
  const Change change = OpenApproval(facts, 1, Snapshot(definition, open.instance));
  open.steps = ApprovalApply(open.steps, change);
  open.version = open.steps[1].request_hash;
  return open;
}

Decision By(const std::string& actor, bool approve, int request, const std::string& version) {
  Decision decision;
  decision.step = "b";
  decision.request = request;
  decision.data_version = version;
  decision.approve = approve;
  decision.comment = approve ? "fine" : "too much";
  decision.actor = actor;
  decision.role = "viewer";
  decision.groups = {"finance"};
  return decision;
}

std::vector<std::string> ApprovalEventTypes(const Change& change) {
  std::vector<std::string> types;
  for (const EventRecord& event : change.events) types.push_back(event.type);
  return types;
}

TEST(ApprovalRulesTest, TheDataVersionIsTheHashOfTheMaterialFieldsOnly) {
  const ApprovalSpec& spec = Finance().steps[1].approval;
  const std::string base = MaterialOf(spec, kInput).data_version;
  EXPECT_EQ(base.size(), 64u);
  Json input = Json::parse(kInput);
  input["note"] = "not rush";  // not material
  EXPECT_EQ(MaterialOf(spec, input.dump()).data_version, base);
  input["amount"] = 121;
  EXPECT_NE(MaterialOf(spec, input.dump()).data_version, base);
  input = Json::parse(kInput);
  input["lines"][0]["qty"] = 3;  // deep inside a material field
  EXPECT_NE(MaterialOf(spec, input.dump()).data_version, base);
  input = Json::parse(kInput);
  input.erase("amount");  // absent is null, and not the same as a value
  const ApprovalSnapshot absent = MaterialOf(spec, input.dump());
  EXPECT_NE(absent.data_version, base);
  EXPECT_TRUE(absent.fields["/amount"].is_null());
}

TEST(ApprovalRulesTest, ARequestOpensOnTheSnapshotAndWaitsWithoutADeadline) {
  const Open open = OpenRequest(Finance());
  const StepRecord& b = open.steps[1];
  EXPECT_EQ(b.state, S::kWaiting);
  EXPECT_EQ(b.attempts, 1);  // request 1
  EXPECT_EQ(b.request_hash, MaterialOf(Finance().steps[1].approval, kInput).data_version);
  const Json record = Json::parse(b.response_json);
  EXPECT_EQ(record["request"], 1);
  EXPECT_EQ(record["data_version"], open.version);
  EXPECT_EQ(record["snapshot"]["fields"]["/amount"], 120);
  EXPECT_EQ(record["snapshot"]["summary"], "order o-1: 120 EUR");
  EXPECT_EQ(record["snapshot"]["requester"], "bob");
  EXPECT_FALSE(record.contains("decision"));
  const NextAction next = Decide(Finance(), open.instance, open.steps, kApprovalNow + 3'600'000);
  EXPECT_EQ(next.kind, NextAction::Kind::kAwaitEvent);
  EXPECT_EQ(next.step, 1);
  EXPECT_EQ(next.wait_until, 0);

  SeededRandom random{1};
  std::vector<StepRecord> pending = testing::Steps({S::kCompleted, S::kPending, S::kPending});
  const Facts facts{Finance(), open.instance, pending, kApprovalNow, random};
  const Change change = OpenApproval(facts, 1, Snapshot(Finance(), open.instance));
  ASSERT_EQ(ApprovalEventTypes(change), std::vector<std::string>{"waystone.approval.requested"});
  const Json payload = Json::parse(change.events[0].payload_json);
  EXPECT_EQ(payload["approval"]["data_version"], open.version);
  EXPECT_EQ(payload["message"], "order o-1: 120 EUR");
}

TEST(ApprovalRulesTest, AnApprovalCompletesTheStepWithWhoAndWhenAndTheRunGoesOn) {
  const Open open = OpenRequest(Finance());
  SeededRandom random{2};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  const DecisionOutcome out =
      DecisionArrived(facts, 1, By("alice", true, 1, open.version), ApprovalSnapshot{});
  ASSERT_TRUE(out.refusal.ok()) << out.refusal;
  ASSERT_EQ(out.change.steps.size(), 1u);
  const StepRecord& b = out.change.steps[0];
  EXPECT_EQ(b.state, S::kCompleted);
  const Json decision = Json::parse(b.response_json)["decision"];
  EXPECT_EQ(decision["outcome"], "approve");
  EXPECT_EQ(decision["by"], "alice");
  EXPECT_EQ(decision["at"], kApprovalNow);
  EXPECT_EQ(decision["comment"], "fine");
  EXPECT_EQ(out.change.next_run_at, kApprovalNow);
  ASSERT_EQ(out.change.audits.size(), 1u);
  EXPECT_EQ(out.change.audits[0].action, "decide");
  EXPECT_EQ(out.change.audits[0].actor, "alice");
  EXPECT_EQ(out.change.audits[0].reason, "approve: fine");
  EXPECT_NE(out.change.audits[0].detail_json.find(open.version), std::string::npos);
  const std::vector<StepRecord> after = ApprovalApply(open.steps, out.change);
  const NextAction next = Decide(Finance(), open.instance, after, kApprovalNow);
  EXPECT_EQ(next.kind, NextAction::Kind::kRunStep);
  EXPECT_EQ(next.step, 2);
}

TEST(ApprovalRulesTest, ARejectionGoesWhereTheStepSays) {
  struct Row {
    const char* on_reject;
    I state;
    std::vector<std::string> events;
    std::vector<AlertKind> alerts;
  };
  const std::vector<Row> table = {
      // a completed and has a compensation: it is undone.
      {"compensate",
       I::kCompensating,
       {"waystone.step.failed", "waystone.instance.compensating"},
       {}},
      {"close", I::kClosed, {"waystone.step.failed", "waystone.instance.closed"}, {}},
      {"wait",
       I::kNeedsAttention,
       {"waystone.alert.approval_rejected", "waystone.instance.needs_attention"},
       {AlertKind::kApprovalRejected}},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.on_reject);
    const WorkflowDefinition definition = ApprovalDefinition(
        std::string("{ material: [/amount], approvers: { role: operator }, on_reject: ") +
        row.on_reject + " }");
    const Open open = OpenRequest(definition);
    SeededRandom random{3};
    const Facts facts{definition, open.instance, open.steps, kApprovalNow, random};
    Decision decision = By("carol", false, 1, open.version);
    decision.role = "operator";
    const DecisionOutcome out = DecisionArrived(facts, 1, decision, ApprovalSnapshot{});
    ASSERT_TRUE(out.refusal.ok()) << out.refusal;
    EXPECT_EQ(out.change.state, row.state);
    ASSERT_FALSE(out.change.steps.empty());
    EXPECT_EQ(out.change.steps[0].state, S::kFailed);
    EXPECT_EQ(out.change.steps[0].error_class, ErrorClass::kRejected);
    EXPECT_EQ(out.change.steps[0].error_message, "approval rejected by carol: too much");
    EXPECT_EQ(ApprovalEventTypes(out.change), row.events);
    std::vector<AlertKind> alerts;
    for (const AlertRecord& alert : out.change.alerts) alerts.push_back(alert.kind);
    EXPECT_EQ(alerts, row.alerts);
    ASSERT_EQ(out.change.audits.size(), 1u);
    EXPECT_EQ(out.change.audits[0].action, "decide");
  }
}

TEST(ApprovalRulesTest, ADecisionTheStepDoesNotAcceptIsRefusedAuditedAndChangesNothing) {
  const Open open = OpenRequest(Finance());
  struct Row {
    const char* name;
    Decision decision;
    absl::StatusCode code;
    std::string says;
  };
  Decision outsider = By("mallory", true, 1, open.version);
  outsider.groups = {"sales"};
  outsider.role = "admin";  // a role does not stand in for the group
  Decision stale = By("alice", true, 1, std::string(64, 'f'));
  Decision superseded = By("alice", true, 2, open.version);
  const std::vector<Row> table = {
      {"not in the group", outsider, absl::StatusCode::kPermissionDenied,
       "decided by group 'finance'"},
      {"the requester", By("bob", true, 1, open.version), absl::StatusCode::kPermissionDenied,
       "requested the approval"},
      {"other data", stale, absl::StatusCode::kFailedPrecondition, "the data changed"},
      {"another request", superseded, absl::StatusCode::kFailedPrecondition,
       "the current request is 1"},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    SeededRandom random{4};
    const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
    const DecisionOutcome out = DecisionArrived(facts, 1, row.decision, ApprovalSnapshot{});
    EXPECT_EQ(out.refusal.code(), row.code) << out.refusal;
    EXPECT_NE(out.refusal.message().find(row.says), std::string::npos) << out.refusal;
    EXPECT_TRUE(out.change.steps.empty());
    EXPECT_EQ(out.change.state, std::nullopt);
    EXPECT_TRUE(out.change.alerts.empty());  // no decision stood to contradict
    ASSERT_EQ(out.change.audits.size(), 1u);
    EXPECT_EQ(out.change.audits[0].action, "decision_refused");
    EXPECT_EQ(out.change.audits[0].actor, row.decision.actor);
  }
}

TEST(ApprovalRulesTest, TheFirstDecisionWinsALaterOneIsRefusedAndAContradictionAlerts) {
  const Open open = OpenRequest(Finance());
  SeededRandom random{5};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  const DecisionOutcome first =
      DecisionArrived(facts, 1, By("alice", true, 1, open.version), ApprovalSnapshot{});
  ASSERT_TRUE(first.refusal.ok());
  const std::vector<StepRecord> decided = ApprovalApply(open.steps, first.change);
  const Facts later{Finance(), open.instance, decided, kApprovalNow + 5, random};

  // Another approver agreeing: refused (409), audited, no alert.
  const DecisionOutcome agree =
      DecisionArrived(later, 1, By("dave", true, 1, open.version), ApprovalSnapshot{});
  EXPECT_EQ(agree.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(agree.refusal.message().find("decided already: approve by alice"), std::string::npos)
      << agree.refusal;
  EXPECT_TRUE(agree.change.alerts.empty());
  ASSERT_EQ(agree.change.audits.size(), 1u);

  // Another approver rejecting: refused, audited, and an alert says it contradicts.
  const DecisionOutcome contra =
      DecisionArrived(later, 1, By("dave", false, 1, open.version), ApprovalSnapshot{});
  EXPECT_EQ(contra.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contra.change.steps.empty());
  ASSERT_EQ(contra.change.alerts.size(), 1u);
  EXPECT_EQ(contra.change.alerts[0].kind, AlertKind::kContradictingDecision);
  EXPECT_NE(contra.change.alerts[0].message.find("approve by alice"), std::string::npos);

  // While that alert is open, more contradicting decisions are audited without another
  // alert; once an operator resolved it, the next one alerts again.
  std::vector<AlertRecord> open_alerts = contra.change.alerts;
  const DecisionOutcome more = DecisionArrived(later, 1, By("erin", false, 1, open.version),
                                               ApprovalSnapshot{}, open_alerts);
  EXPECT_EQ(more.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(more.change.alerts.empty());
  EXPECT_TRUE(more.change.events.empty());
  ASSERT_EQ(more.change.audits.size(), 1u);
  open_alerts[0].state = AlertState::kResolved;
  const DecisionOutcome after = DecisionArrived(later, 1, By("erin", false, 1, open.version),
                                                ApprovalSnapshot{}, open_alerts);
  ASSERT_EQ(after.change.alerts.size(), 1u);

  // The same decision by its own actor again (its answer was lost): replayed, nothing new.
  const DecisionOutcome again =
      DecisionArrived(later, 1, By("alice", true, 1, open.version), ApprovalSnapshot{});
  EXPECT_TRUE(again.refusal.ok());
  EXPECT_TRUE(again.replayed);
  EXPECT_TRUE(again.change.audits.empty());
  EXPECT_TRUE(again.change.steps.empty());
}

TEST(ApprovalRulesTest, ADecisionOnAnInstanceClosedBeforeItsRequestIsRefused) {
  // Closed by an operator while a was still running: b never opened.
  InstanceRecord closed = Instance(I::kClosed, kInput);
  const std::vector<StepRecord> steps = testing::Steps({S::kRunning, S::kPending, S::kPending});
  SeededRandom random{6};
  const Facts facts{Finance(), closed, steps, kApprovalNow, random};
  const ApprovalSnapshot now = Snapshot(Finance(), closed);
  const DecisionOutcome out =
      DecisionArrived(facts, 1, By("alice", true, 0, now.data_version), now);
  EXPECT_EQ(out.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(out.refusal.message().find("is closed"), std::string::npos) << out.refusal;
  EXPECT_TRUE(out.change.steps.empty());
  ASSERT_EQ(out.change.audits.size(), 1u);
  EXPECT_EQ(out.change.audits[0].action, "decision_refused");
}

TEST(ApprovalRulesTest, ALateDecisionOnAClosedInstanceIsRefusedNamingWhatStood) {
  const Open open = OpenRequest(Finance());
  SeededRandom random{6};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  const DecisionOutcome approved =
      DecisionArrived(facts, 1, By("alice", true, 1, open.version), ApprovalSnapshot{});
  InstanceRecord closed = open.instance;
  closed.state = I::kClosed;
  const std::vector<StepRecord> decided = ApprovalApply(open.steps, approved.change);
  const Facts late{Finance(), closed, decided, kApprovalNow + 9, random};
  const DecisionOutcome out =
      DecisionArrived(late, 1, By("erin", false, 1, open.version), ApprovalSnapshot{});
  EXPECT_EQ(out.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(out.refusal.message().find("decided already: approve by alice"), std::string::npos)
      << out.refusal;
  ASSERT_EQ(out.change.alerts.size(), 1u);
  EXPECT_EQ(out.change.alerts[0].kind, AlertKind::kContradictingDecision);
  ASSERT_EQ(out.change.audits.size(), 1u);
  EXPECT_EQ(out.change.audits[0].action, "decision_refused");
}

TEST(ApprovalRulesTest, ADecisionBeforeTheRequestIsKeptForThatRequestOnly) {
  const InstanceRecord instance = Instance(I::kRunning, kInput);
  // a is still running: b's request has not opened.
  std::vector<StepRecord> steps = testing::Steps({S::kRunning, S::kPending, S::kPending});
  const ApprovalSnapshot now = Snapshot(Finance(), instance);
  SeededRandom random{7};
  const Facts facts{Finance(), instance, steps, kApprovalNow, random};

  Decision wrong = By("alice", true, 0, std::string(64, 'a'));
  const DecisionOutcome refused = DecisionArrived(facts, 1, wrong, now);
  EXPECT_EQ(refused.refusal.code(), absl::StatusCode::kFailedPrecondition);

  const DecisionOutcome kept =
      DecisionArrived(facts, 1, By("alice", true, 0, now.data_version), now);
  ASSERT_TRUE(kept.refusal.ok()) << kept.refusal;
  ASSERT_EQ(kept.change.steps.size(), 1u);
  EXPECT_EQ(kept.change.steps[0].state, S::kPending);  // nothing runs earlier
  EXPECT_EQ(kept.change.state, std::nullopt);
  EXPECT_EQ(kept.change.next_run_at, std::nullopt);
  ASSERT_EQ(kept.change.audits.size(), 1u);
  EXPECT_NE(kept.change.audits[0].detail_json.find("before_request"), std::string::npos);
  steps = ApprovalApply(steps, kept.change);

  // A second one before the request: the first stands.
  const Facts again{Finance(), instance, steps, kApprovalNow + 1, random};
  const DecisionOutcome second =
      DecisionArrived(again, 1, By("dave", false, 0, now.data_version), now);
  EXPECT_EQ(second.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.change.alerts.size(), 1u);

  // a completes; b's request opens on the same data and is decided at once.
  steps[0].state = S::kCompleted;
  const Facts opening{Finance(), instance, steps, kApprovalNow + 2, random};
  const Change opened = OpenApproval(opening, 1, now);
  ASSERT_EQ(opened.steps.size(), 1u);
  EXPECT_EQ(opened.steps[0].state, S::kCompleted);
  EXPECT_EQ(opened.steps[0].attempts, 1);
  const Json record = Json::parse(opened.steps[0].response_json);
  EXPECT_EQ(record["decision"]["by"], "alice");
  EXPECT_EQ(record["decision"]["before_request"], true);
  EXPECT_EQ(record["request"], 1);
  EXPECT_FALSE(record.contains("early_decision"));

  // Had the data changed before the request opened, the kept decision is dropped
  // (audited) and the request waits for a decision on the new data.
  Json revised = Json::parse(kInput);
  revised["amount"] = 999;
  const InstanceRecord changed = Instance(I::kRunning, revised.dump());
  const Facts on_new{Finance(), changed, steps, kApprovalNow + 2, random};
  const Change reopened = OpenApproval(on_new, 1, Snapshot(Finance(), changed));
  ASSERT_EQ(reopened.steps.size(), 1u);
  EXPECT_EQ(reopened.steps[0].state, S::kWaiting);
  ASSERT_EQ(reopened.audits.size(), 1u);
  EXPECT_EQ(reopened.audits[0].action, "decision_dropped");
  EXPECT_EQ(reopened.audits[0].actor, "alice");
}

TEST(ApprovalRulesTest, ARoleDecidesAtItsRankOrAbove) {
  const WorkflowDefinition definition =
      ApprovalDefinition("{ material: [/amount], approvers: { role: admin } }");
  const Open open = OpenRequest(definition);
  for (const auto& [role, allowed] : std::vector<std::pair<std::string, bool>>{
           {"viewer", false}, {"operator", false}, {"admin", true}}) {
    SCOPED_TRACE(role);
    SeededRandom random{8};
    const Facts facts{definition, open.instance, open.steps, kApprovalNow, random};
    Decision decision = By("root", true, 1, open.version);
    decision.role = role;
    decision.groups = {};
    const DecisionOutcome out = DecisionArrived(facts, 1, decision, ApprovalSnapshot{});
    EXPECT_EQ(out.refusal.ok(), allowed) << out.refusal;
  }
}

TEST(ApprovalRulesTest, ASummaryThatDoesNotRenderFailsTheStepNamingTheField) {
  const WorkflowDefinition definition =
      ApprovalDefinition(R"({ material: [/amount], summary: "{{input.customer.name}}" })");
  const InstanceRecord instance = Instance(I::kRunning, kInput);
  const Json context = {{"input", Json::parse(kInput)}};
  const auto snapshot = RenderApproval(definition.steps[1].approval, kInput, context);
  ASSERT_FALSE(snapshot.ok());
  std::vector<StepRecord> steps = testing::Steps({S::kCompleted, S::kPending, S::kPending});
  SeededRandom random{9};
  const Facts facts{definition, instance, steps, kApprovalNow, random};
  const Change change = OpenApproval(facts, 1, snapshot);
  ASSERT_FALSE(change.steps.empty());
  EXPECT_EQ(change.steps[0].state, S::kFailed);
  EXPECT_NE(change.steps[0].error_message.find("approval: summary"), std::string::npos)
      << change.steps[0].error_message;
}

// --- Revisions ---------------------------------------------------------------------

Revision Revised(const std::string& field, Json value) {
  Json input = Json::parse(kInput);
  input[field] = std::move(value);
  return {input.dump(), "crm-sync", "customer changed " + field};
}

TEST(ApprovalRulesTest, AMaterialRevisionCancelsTheOpenRequestAndAsksAgainOnTheNewData) {
  const Open open = OpenRequest(Finance());
  SeededRandom random{10};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  const auto out = Revise(facts, Revised("amount", 150));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->cancelled, std::vector<std::string>{"b"});
  EXPECT_EQ(out->material, std::vector<std::string>{"b"});
  ASSERT_TRUE(out->change.input_json.has_value());
  EXPECT_EQ(Json::parse(*out->change.input_json)["amount"], 150);
  ASSERT_EQ(out->change.steps.size(), 1u);
  const StepRecord& b = out->change.steps[0];
  EXPECT_EQ(b.state, S::kPending);
  const Json cancelled = Json::parse(b.response_json)["cancelled"];
  EXPECT_EQ(cancelled["by"], "crm-sync");
  EXPECT_EQ(cancelled["reason"], "customer changed amount");
  EXPECT_EQ(cancelled["superseded_by"], 2);
  ASSERT_EQ(out->change.audits.size(), 2u);
  EXPECT_EQ(out->change.audits[0].action, "approval_cancelled");
  EXPECT_EQ(out->change.audits[0].actor, "crm-sync");
  EXPECT_NE(out->change.audits[0].detail_json.find("\"superseded_by\":2"), std::string::npos)
      << out->change.audits[0].detail_json;
  EXPECT_EQ(out->change.audits[1].action, "revise");
  EXPECT_EQ(out->change.next_run_at, kApprovalNow);

  // The request opens again: request 2, on the new data.
  InstanceRecord revised = open.instance;
  revised.input_json = *out->change.input_json;
  const std::vector<StepRecord> after = ApprovalApply(open.steps, out->change);
  EXPECT_EQ(Decide(Finance(), revised, after, kApprovalNow).kind, NextAction::Kind::kRunStep);
  const Facts reopening{Finance(), revised, after, kApprovalNow + 1, random};
  const std::vector<StepRecord> reopened =
      ApprovalApply(after, OpenApproval(reopening, 1, Snapshot(Finance(), revised)));
  EXPECT_EQ(reopened[1].state, S::kWaiting);
  EXPECT_EQ(reopened[1].attempts, 2);
  EXPECT_NE(reopened[1].request_hash, open.version);

  // A decision on request 1 now: refused, naming the current request and version.
  const Facts late{Finance(), revised, reopened, kApprovalNow + 2, random};
  const DecisionOutcome stale =
      DecisionArrived(late, 1, By("alice", true, 1, open.version), ApprovalSnapshot{});
  EXPECT_EQ(stale.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.refusal.message().find("the current request is 2, on data version " +
                                         reopened[1].request_hash.substr(0, 16)),
            std::string::npos)
      << stale.refusal;
  ASSERT_EQ(stale.change.audits.size(), 1u);
  EXPECT_EQ(stale.change.audits[0].action, "decision_refused");
  // ... and before request 2 opened, too.
  const Facts between{Finance(), revised, after, kApprovalNow + 1, random};
  const DecisionOutcome early =
      DecisionArrived(between, 1, By("alice", true, 1, open.version), Snapshot(Finance(), revised));
  EXPECT_NE(early.refusal.message().find("request 1 of step 'b' was cancelled (superseded)"),
            std::string::npos)
      << early.refusal;
}

TEST(ApprovalRulesTest, ANonMaterialRevisionOnlyNotifies) {
  const Open open = OpenRequest(Finance());
  SeededRandom random{11};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  const auto out = Revise(facts, Revised("note", "call first"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->material.empty());
  EXPECT_TRUE(out->cancelled.empty());
  EXPECT_TRUE(out->change.steps.empty());  // the open request stands
  EXPECT_EQ(ApprovalEventTypes(out->change), std::vector<std::string>{"waystone.instance.revised"});
  EXPECT_NE(out->change.events[0].payload_json.find("not material"), std::string::npos);
  ASSERT_TRUE(out->change.input_json.has_value());
  ASSERT_EQ(out->change.audits.size(), 1u);
  EXPECT_EQ(out->change.audits[0].action, "revise");

  // The same input again: nothing to do.
  InstanceRecord same = open.instance;
  same.input_json = *out->change.input_json;
  const Facts again{Finance(), same, open.steps, kApprovalNow, random};
  const auto unchanged = Revise(again, Revised("note", "call first"));
  ASSERT_TRUE(unchanged.ok());
  EXPECT_TRUE(unchanged->unchanged);
}

TEST(ApprovalRulesTest, ADecidedApprovalIsNeverMovedUnderItsDecisionButARejectedOneIsAskedAgain) {
  const WorkflowDefinition waits =
      ApprovalDefinition("{ material: [/amount], approvers: { role: viewer }, on_reject: wait }");
  struct Row {
    const char* name;
    bool approve;
    bool allowed;
  };
  for (const Row& row : {Row{"approved", true, false}, Row{"rejected, waiting", false, true}}) {
    SCOPED_TRACE(row.name);
    const Open open = OpenRequest(waits);
    SeededRandom random{12};
    const Facts facts{waits, open.instance, open.steps, kApprovalNow, random};
    const DecisionOutcome decided =
        DecisionArrived(facts, 1, By("alice", row.approve, 1, open.version), ApprovalSnapshot{});
    ASSERT_TRUE(decided.refusal.ok());
    InstanceRecord instance = open.instance;
    if (decided.change.state) instance.state = *decided.change.state;
    const std::vector<StepRecord> after = ApprovalApply(open.steps, decided.change);
    const Facts later{waits, instance, after, kApprovalNow + 1, random};
    const auto revised = Revise(later, Revised("amount", 99));
    EXPECT_EQ(revised.ok(), row.allowed) << revised.status();
    if (!revised.ok()) {
      EXPECT_EQ(revised.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(revised.status().message().find("decided request 1 (approve by alice)"),
                std::string::npos)
          << revised.status();
      // A change beside its material fields is still fine.
      EXPECT_TRUE(Revise(later, Revised("note", "x")).ok());
      continue;
    }
    EXPECT_EQ(revised->reopened, std::vector<std::string>{"b"});
    EXPECT_EQ(revised->change.state, I::kRunning);
    EXPECT_TRUE(revised->change.resolve_alerts);
    ASSERT_EQ(revised->change.steps.size(), 1u);
    EXPECT_EQ(revised->change.steps[0].state, S::kPending);
  }
}

TEST(ApprovalRulesTest, ARevisionRerunsTheDeclaredReadsAndRedoesNothingElse) {
  auto loaded = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
revision: { reruns: [price] }
steps:
  - name: price
    request: { method: GET, url: "http://x/price?amount={{input.amount}}" }
  - name: reserve
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/reserve" }
  - name: approve
    approval: { material: [/amount] }
)",
                                   "w.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const InstanceRecord instance = Instance(I::kRunning, kInput);
  std::vector<StepRecord> steps = testing::Steps({S::kCompleted, S::kCompleted, S::kPending});
  SeededRandom random{13};
  const Facts facts{*loaded, instance, steps, kApprovalNow, random};
  const auto out = Revise(facts, Revised("amount", 7));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->reruns, std::vector<std::string>{"price"});
  // price runs again; reserve stands; the approval, not asked yet, only notes who
  // changed its data (four eyes).
  ASSERT_EQ(out->change.steps.size(), 2u);
  EXPECT_EQ(out->change.steps[0].index, 2);
  EXPECT_EQ(out->change.steps[0].state, S::kPending);
  EXPECT_EQ(Json::parse(out->change.steps[0].response_json)["revised_by"],
            Json::array({"crm-sync"}));
  EXPECT_EQ(out->change.steps[1].name, "a");  // price
  EXPECT_EQ(out->change.steps[1].state, S::kPending);
  const std::vector<StepRecord> after = ApprovalApply(steps, out->change);
  const NextAction next = Decide(*loaded, instance, after, kApprovalNow);
  EXPECT_EQ(next.kind, NextAction::Kind::kRunStep);
  EXPECT_EQ(next.step, 0);

  auto bad = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
revision: { reruns: [reserve, nope] }
steps:
  - name: reserve
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/reserve" }
)",
                                "w.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a step that changed something is never redone"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("no step 'nope'"), std::string::npos) << bad.status();
}

TEST(ApprovalRulesTest, AFinishedInstanceTakesNoRevision) {
  for (I state : {I::kCompleted, I::kClosed, I::kCompensating, I::kFailed}) {
    SCOPED_TRACE(ToString(state));
    const InstanceRecord instance = Instance(state, kInput);
    const std::vector<StepRecord> steps =
        testing::Steps({S::kCompleted, S::kCompleted, S::kCompleted});
    SeededRandom random{14};
    const Facts facts{Finance(), instance, steps, kApprovalNow, random};
    const auto out = Revise(facts, Revised("note", "late"));
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

// --- After approval ------------------------------------------------------------------

TEST(ApprovalRulesTest, AFailureAfterAnApprovalPausesWhenTheStepSaysSoInsteadOfUndoingIt) {
  for (const bool pause : {true, false}) {
    SCOPED_TRACE(pause ? "on_failure: pause" : "default");
    auto loaded = LoadDefinitionText(std::string(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/a" }
    compensate: { request: { method: POST, url: "http://x/a/undo" } }
  - name: b
    approval: { material: [/amount] }
  - name: c
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/c" }
)") + (pause ? "    on_failure: pause\n" : ""),
                                     "w.yaml");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const InstanceRecord instance = Instance(I::kRunning, kInput);
    std::vector<StepRecord> steps = testing::Steps({S::kCompleted, S::kCompleted, S::kRunning});
    steps[2].attempts = 1;
    SeededRandom random{15};
    const Facts facts{*loaded, instance, steps, kApprovalNow, random};
    CallResult refused;
    refused.response.outcome.kind = CallOutcome::Kind::kResponse;
    refused.response.outcome.status = 422;
    refused.response.outcome.sent = true;
    refused.error_class = ErrorClass::kRejected;
    const Change change = RecordCall(facts, steps[2], refused);
    EXPECT_EQ(change.state, pause ? I::kNeedsAttention : I::kCompensating);
    std::vector<AlertKind> alerts;
    for (const AlertRecord& alert : change.alerts) alerts.push_back(alert.kind);
    EXPECT_EQ(alerts, pause ? std::vector<AlertKind>{AlertKind::kInconsistencyAfterApproval}
                            : std::vector<AlertKind>{});
    if (pause) {
      EXPECT_NE(change.alerts[0].message.find("approval 'b' stood"), std::string::npos)
          << change.alerts[0].message;
    }
  }
}

// --- Deadlines (the clock is `now`: each row a moment) ----------------------------------

TEST(ApprovalRulesTest, ARequestIsRemindedThenEscalatedThenTimesOutAsDeclared) {
  const WorkflowDefinition definition = ApprovalDefinition(
      "{ material: [/amount], approvers: { group: finance }, remind_after: 1h, "
      "escalate_after: 2h, escalate_to: leads, timeout: 3h, on_timeout: close }");
  constexpr Millis kHour = 3'600'000;
  const Open open = OpenRequest(definition);
  std::vector<StepRecord> steps = open.steps;
  EXPECT_EQ(steps[1].next_attempt_at,
            kApprovalNow + kHour);  // the durable timer: its first deadline
  SeededRandom random{16};
  NextAction next = Decide(definition, open.instance, steps, kApprovalNow + kHour / 2);
  EXPECT_EQ(next.kind, NextAction::Kind::kAwaitEvent);
  EXPECT_EQ(next.wait_until, kApprovalNow + kHour);

  Decision lead = By("lena", true, 1, open.version);
  lead.groups = {"leads"};
  {
    const Facts before{definition, open.instance, steps, kApprovalNow + kHour / 2, random};
    EXPECT_EQ(DecisionArrived(before, 1, lead, ApprovalSnapshot{}).refusal.code(),
              absl::StatusCode::kPermissionDenied);
  }

  // One hour: a reminder; still waiting, the next deadline the escalation.
  next = Decide(definition, open.instance, steps, kApprovalNow + kHour);
  EXPECT_EQ(next.kind, NextAction::Kind::kRunStep);
  const Facts reminding{definition, open.instance, steps, kApprovalNow + kHour, random};
  const Change reminded = ApprovalDue(reminding, 1);
  EXPECT_EQ(ApprovalEventTypes(reminded), std::vector<std::string>{"waystone.approval.reminder"});
  steps = ApprovalApply(steps, reminded);
  EXPECT_EQ(steps[1].state, S::kWaiting);
  EXPECT_EQ(steps[1].next_attempt_at, kApprovalNow + 2 * kHour);

  // Two hours: escalated to the leads, who may decide from now on.
  const Facts escalating{definition, open.instance, steps, kApprovalNow + 2 * kHour, random};
  const Change escalated = ApprovalDue(escalating, 1);
  EXPECT_EQ(ApprovalEventTypes(escalated), std::vector<std::string>{"waystone.approval.escalated"});
  ASSERT_EQ(escalated.audits.size(), 1u);
  EXPECT_EQ(escalated.audits[0].action, "approval_escalated");
  std::vector<StepRecord> after_escalation = ApprovalApply(steps, escalated);
  EXPECT_EQ(after_escalation[1].next_attempt_at, kApprovalNow + 3 * kHour);
  {
    const Facts later{definition, open.instance, after_escalation, kApprovalNow + 2 * kHour + 1,
                      random};
    const DecisionOutcome by_lead = DecisionArrived(later, 1, lead, ApprovalSnapshot{});
    EXPECT_TRUE(by_lead.refusal.ok()) << by_lead.refusal;
  }

  // Three hours without a decision: it times out, and closes as declared.
  const Facts timing_out{definition, open.instance, after_escalation, kApprovalNow + 3 * kHour,
                         random};
  const Change timed_out = ApprovalDue(timing_out, 1);
  EXPECT_EQ(timed_out.state, I::kClosed);
  ASSERT_FALSE(timed_out.steps.empty());
  EXPECT_EQ(timed_out.steps[0].state, S::kFailed);
  EXPECT_EQ(timed_out.steps[0].error_message, "no decision within 3h");
  const Json decision = Json::parse(timed_out.steps[0].response_json)["decision"];
  EXPECT_EQ(decision["outcome"], "timeout");
  EXPECT_EQ(decision["by"], "waystone");
  ASSERT_FALSE(timed_out.audits.empty());
  EXPECT_EQ(timed_out.audits.back().action, "approval_timed_out");
}

TEST(ApprovalRulesTest, ATimeoutGoesWhereOnTimeoutSays) {
  struct Row {
    const char* on_timeout;
    I state;
  };
  for (const Row& row : {Row{"reject", I::kCompensating}, Row{"wait", I::kNeedsAttention},
                         Row{"close", I::kClosed}}) {
    SCOPED_TRACE(row.on_timeout);
    const WorkflowDefinition definition = ApprovalDefinition(
        std::string("{ material: [/amount], timeout: 2d, on_timeout: ") + row.on_timeout + " }");
    const Open open = OpenRequest(definition);
    EXPECT_EQ(open.steps[1].next_attempt_at, kApprovalNow + 2 * 86'400'000LL);
    SeededRandom random{17};
    const Facts facts{definition, open.instance, open.steps, kApprovalNow + 2 * 86'400'000LL,
                      random};
    EXPECT_EQ(ApprovalDue(facts, 1).state, row.state);
  }
}

// --- Who may not decide, however the decision comes ---------------------------------

TEST(ApprovalRulesTest, ADecisionKeptFromTheRequesterIsDroppedWhenItsRequestOpens) {
  // bob decided before the request opened, when the requester's template could not
  // say yet that it is bob (here: the input named someone else then).
  const InstanceRecord instance = Instance(I::kRunning, kInput);  // submitted_by: bob
  std::vector<StepRecord> steps = testing::Steps({S::kCompleted, S::kPending, S::kPending});
  const ApprovalSnapshot now = Snapshot(Finance(), instance);
  steps[1].response_json = Json{{"early_decision",
                                 {{"outcome", "approve"},
                                  {"by", "bob"},
                                  {"at", kApprovalNow},
                                  {"data_version", now.data_version},
                                  {"before_request", true}}}}
                               .dump();
  SeededRandom random{18};
  const Facts facts{Finance(), instance, steps, kApprovalNow, random};
  const Change opened = OpenApproval(facts, 1, now);
  ASSERT_EQ(opened.steps.size(), 1u);
  EXPECT_EQ(opened.steps[0].state, S::kWaiting);  // not decided by bob's own approval
  ASSERT_EQ(opened.audits.size(), 1u);
  EXPECT_EQ(opened.audits[0].action, "decision_dropped");
  EXPECT_NE(opened.audits[0].reason.find("who requested the approval"), std::string::npos);

  // And a decision before the request while the requester cannot be known is refused.
  ApprovalSnapshot unknown = now;
  unknown.requester.clear();
  std::vector<StepRecord> early = testing::Steps({S::kRunning, S::kPending, S::kPending});
  const Facts before{Finance(), instance, early, kApprovalNow, random};
  const DecisionOutcome refused =
      DecisionArrived(before, 1, By("bob", true, 0, now.data_version), unknown);
  EXPECT_EQ(refused.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.refusal.message().find("requester is not known yet"), std::string::npos);
}

TEST(ApprovalRulesTest, WhoRevisedTheDataOfARequestMayNotDecideTheNextOne) {
  const Open open = OpenRequest(Finance());
  SeededRandom random{19};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  Revision revision = Revised("amount", 77);
  revision.actor = "alice";  // a finance member who changed the amount
  const auto revised = Revise(facts, revision);
  ASSERT_TRUE(revised.ok()) << revised.status();
  InstanceRecord instance = open.instance;
  instance.input_json = *revised->change.input_json;
  std::vector<StepRecord> steps = ApprovalApply(open.steps, revised->change);
  const Facts reopening{Finance(), instance, steps, kApprovalNow + 1, random};
  steps = ApprovalApply(steps, OpenApproval(reopening, 1, Snapshot(Finance(), instance)));
  EXPECT_EQ(Json::parse(steps[1].response_json)["revised_by"], Json::array({"alice"}));
  const Facts deciding{Finance(), instance, steps, kApprovalNow + 2, random};
  const DecisionOutcome own =
      DecisionArrived(deciding, 1, By("alice", true, 2, steps[1].request_hash), ApprovalSnapshot{});
  EXPECT_EQ(own.refusal.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(own.refusal.message().find("revised the data"), std::string::npos) << own.refusal;
  const DecisionOutcome other =
      DecisionArrived(deciding, 1, By("dave", true, 2, steps[1].request_hash), ApprovalSnapshot{});
  EXPECT_TRUE(other.refusal.ok()) << other.refusal;
}

// Issue 45, high 3: alice revised the amount before the request opened, then approved
// it herself, with no `requester` in the definition. Whoever changed the material
// data, at any time before the decision, and whoever started the instance, do not
// decide: early or after the request opened.
TEST(ApprovalRulesTest, WhoRevisedBeforeTheRequestOpenedOrStartedTheInstanceMayNotDecide) {
  const WorkflowDefinition plain = ApprovalDefinition(
      R"({ material: [/amount], summary: "order {{input.id}}", approvers: { group: finance } })");
  InstanceRecord instance = Instance(I::kRunning, kInput);
  instance.started_by = "carol";  // a finance member who started it
  std::vector<StepRecord> steps = testing::Steps({S::kRunning, S::kPending, S::kPending});
  SeededRandom random{23};
  Revision revision = Revised("amount", 99999);
  revision.actor = "alice";
  const auto revised = Revise(Facts{plain, instance, steps, kApprovalNow, random}, revision);
  ASSERT_TRUE(revised.ok()) << revised.status();
  EXPECT_EQ(revised->material, std::vector<std::string>{"b"});
  instance.input_json = *revised->change.input_json;
  steps = ApprovalApply(steps, revised->change);
  EXPECT_EQ(Json::parse(steps[1].response_json)["revised_by"], Json::array({"alice"}));

  const ApprovalSnapshot current = Snapshot(plain, instance);
  for (const char* actor : {"alice", "carol"}) {
    SCOPED_TRACE(actor);
    // Before the request opens: refused, nothing kept.
    const Facts pending{plain, instance, steps, kApprovalNow + 1, random};
    const DecisionOutcome early =
        DecisionArrived(pending, 1, By(actor, true, 0, current.data_version), current);
    EXPECT_EQ(early.refusal.code(), absl::StatusCode::kPermissionDenied) << early.refusal;
    EXPECT_NE(early.refusal.message().find("four eyes"), std::string::npos) << early.refusal;
    EXPECT_TRUE(early.change.steps.empty());
    ASSERT_EQ(early.change.audits.size(), 1u);
    EXPECT_EQ(early.change.audits[0].action, "decision_refused");
  }
  // The request opens: the reviser is recorded on it, and neither decides it.
  const Facts opening{plain, instance, steps, kApprovalNow + 2, random};
  steps = ApprovalApply(steps, OpenApproval(opening, 1, current));
  ASSERT_EQ(steps[1].state, S::kWaiting);
  EXPECT_EQ(Json::parse(steps[1].response_json)["revised_by"], Json::array({"alice"}));
  const Facts open{plain, instance, steps, kApprovalNow + 3, random};
  EXPECT_NE(DecisionArrived(open, 1, By("alice", true, 1, current.data_version), current)
                .refusal.message()
                .find("revised the data"),
            std::string::npos);
  EXPECT_NE(DecisionArrived(open, 1, By("carol", true, 1, current.data_version), current)
                .refusal.message()
                .find("started this instance"),
            std::string::npos);
  const DecisionOutcome dave =
      DecisionArrived(open, 1, By("dave", true, 1, current.data_version), current);
  EXPECT_TRUE(dave.refusal.ok()) << dave.refusal;
  EXPECT_EQ(ApprovalApply(steps, dave.change)[1].state, S::kCompleted);
}

// Issue 45, item 11: `requester: "{{input.submitted_by}}"` names bob, but alice started
// the instance: she is the requester in fact, and is refused too, however early.
TEST(ApprovalRulesTest, AStarterWhoNamedSomeoneElseAsRequesterStillMayNotDecide) {
  InstanceRecord instance = Instance(I::kRunning, kInput);  // submitted_by: bob
  instance.started_by = "alice";
  const ApprovalSnapshot now = Snapshot(Finance(), instance);
  std::vector<StepRecord> steps = testing::Steps({S::kCompleted, S::kPending, S::kPending});
  steps[1].response_json = Json{{"early_decision",
                                 {{"outcome", "approve"},
                                  {"by", "alice"},
                                  {"at", kApprovalNow},
                                  {"data_version", now.data_version},
                                  {"before_request", true}}}}
                               .dump();
  SeededRandom random{24};
  // A decision kept before the starter was known to matter is dropped when it opens.
  const Change opened =
      OpenApproval(Facts{Finance(), instance, steps, kApprovalNow, random}, 1, now);
  ASSERT_EQ(opened.steps.size(), 1u);
  EXPECT_EQ(opened.steps[0].state, S::kWaiting);
  ASSERT_EQ(opened.audits.size(), 1u);
  EXPECT_NE(opened.audits[0].reason.find("started this instance"), std::string::npos);
  steps = ApprovalApply(steps, opened);
  const DecisionOutcome own =
      DecisionArrived(Facts{Finance(), instance, steps, kApprovalNow + 1, random}, 1,
                      By("alice", true, 1, now.data_version), now);
  EXPECT_EQ(own.refusal.code(), absl::StatusCode::kPermissionDenied);
}

TEST(ApprovalRulesTest, ARefusalChangesNothingButItsAuditEvenWhileTheInstanceWaitsForATarget) {
  Open open = OpenRequest(Finance());
  open.instance.status_reason = "waiting for target 'erp' (paused)";
  SeededRandom random{20};
  const Facts facts{Finance(), open.instance, open.steps, kApprovalNow, random};
  Decision outsider = By("mallory", true, 1, open.version);
  outsider.groups = {};
  const DecisionOutcome out = DecisionArrived(facts, 1, outsider, ApprovalSnapshot{});
  ASSERT_FALSE(out.refusal.ok());
  EXPECT_EQ(out.change.status_reason, std::nullopt);
  EXPECT_EQ(out.change.state, std::nullopt);
  EXPECT_TRUE(out.change.steps.empty());
  EXPECT_EQ(out.change.audits.size(), 1u);
}

}  // namespace
}  // namespace waystone
