#include "definition/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/process.h"

namespace waystone {
namespace {

constexpr char kValid[] = R"(workflow: demo
key: "{{input.id}}"
steps:
  - name: read
    request: { method: GET, url: "{{env.URL}}/x/{{input.id}}" }
  - name: write
    recovery: lookup
    request:
      method: POST
      url: "{{env.URL}}/orders"
      body: { ref: "{{instance.key}}", from: "{{steps.read.response.id}}", n: 3 }
    result: { external_id: "/id" }
    lookup:
      request: { method: GET, url: "{{env.URL}}/orders?ref={{instance.key}}" }
      found: /items/0
      external_id: /items/0/id
    compensate:
      request: { method: POST, url: "{{env.URL}}/orders/{{steps.write.external_id}}/cancel" }
)";

std::vector<Diagnostic> Lint(const std::string& text) {
  return LintDefinitionText(text, "flow.yaml", nullptr);
}

// Returns true when one diagnostic contains `fragment`, at `line` when given.
bool Has(const std::vector<Diagnostic>& diagnostics, const std::string& fragment, int line = 0,
         const std::string& step = "") {
  for (const auto& d : diagnostics) {
    if (d.ToString().find(fragment) == std::string::npos) continue;
    if (line != 0 && d.line != line) continue;
    if (!step.empty() && d.step != step) continue;
    return true;
  }
  return false;
}

std::string All(const std::vector<Diagnostic>& diagnostics) {
  std::string out;
  for (const auto& d : diagnostics) out += d.ToString() + "\n";
  return out;
}

TEST(LoaderTest, ValidDefinitionLoads) {
  auto definition = LoadDefinitionText(kValid, "flow.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->name, "demo");
  ASSERT_EQ(definition->steps.size(), 2u);
  const StepDefinition& write = definition->steps[1];
  EXPECT_EQ(write.name, "write");
  EXPECT_EQ(write.line, 6);
  EXPECT_EQ(write.recovery, RecoveryClass::kLookup);
  EXPECT_EQ(write.request.method, "POST");
  EXPECT_EQ(write.result_external_id, "/id");
  ASSERT_TRUE(write.lookup.has_value());
  EXPECT_EQ(write.lookup->found, "/items/0");
  ASSERT_TRUE(write.compensate.has_value());
  EXPECT_NE(write.request.body_json.find("\"n\":3"), std::string::npos);
  EXPECT_EQ(definition->content_hash.size(), 64u);
}

TEST(LoaderTest, ExampleDefinitionsLoad) {
  auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->steps.size(), 6u);
  definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-paged-erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->steps[0].body_errors.size(), 3u);
  EXPECT_TRUE(definition->steps[0].lookup->Paginated());
  definition = LoadDefinitionFile(testing::SourceDir() + "/examples/invoice-to-dms.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->targets.at(0).client_secret, "{{secret.ERP_CLIENT_SECRET}}");
  EXPECT_EQ(definition->steps[1].request.body_kind, BodyKind::kMultipart);
  EXPECT_EQ(definition->steps[1].request.files.at(0).part, "file");
  EXPECT_EQ(definition->steps[2].request.body_kind, BodyKind::kForm);
}

TEST(LoaderTest, JsonIsAccepted) {
  auto definition = LoadDefinitionText(
      R"({"workflow": "j", "key": "{{input.id}}", "steps": [
          {"name": "a", "request": {"method": "GET", "url": "http://x/{{input.id}}"}}]})",
      "flow.json");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->steps[0].name, "a");
}

TEST(LoaderTest, MalformedYamlNamesTheLine) {
  auto d = Lint("workflow: x\nkey: \"{{input.id}}\"\nsteps:\n  - name: [unclosed\n");
  ASSERT_FALSE(d.empty());
  EXPECT_TRUE(Has(d, "malformed YAML")) << All(d);
  EXPECT_GT(d[0].line, 0);
  EXPECT_EQ(d[0].ToString().rfind("flow.yaml:", 0), 0u);
}

TEST(LoaderTest, UnknownFieldsAreRefusedWithLineAndStep) {
  std::string text = kValid;
  text.replace(text.find("    result:"), 0, "    retries: 3\n");
  auto d = Lint(text);
  EXPECT_TRUE(Has(d, "unknown field 'retries'", 12, "write")) << All(d);

  auto top = Lint(std::string(kValid) + "owner: me\n");
  EXPECT_TRUE(Has(top, "unknown field 'owner'", 19)) << All(top);
}

TEST(LoaderTest, ATargetsLimitsAndCircuitBreakerAreReadAndBadOnesNamed) {
  const std::string head =
      "workflow: x\nkey: \"{{input.id}}\"\ntargets:\n  erp:\n    url: http://erp\n";
  const std::string steps =
      "steps:\n  - name: read\n    request: { method: GET, url: http://erp/a }\n";
  auto loaded = LoadDefinitionText(head +
                                       "    limits: { rate: 2.5, concurrency: 4 }\n"
                                       "    circuit_breaker: { failures: 5, cool_down: 45s }\n" +
                                       steps,
                                   "flow.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const TargetLimits& limits = loaded->targets.at(0).limits;
  EXPECT_EQ(limits.rate, 2.5);
  EXPECT_EQ(limits.concurrency, 4);
  EXPECT_EQ(limits.breaker_failures, 5);
  EXPECT_EQ(limits.cool_down, 45'000);

  auto d = Lint(head + "    limits: { rate: 0, concurrency: -1, burst: 3 }\n" + steps);
  EXPECT_TRUE(Has(d, "target 'erp': 'limits.rate' must be calls a second from 0.01 to 10000", 6))
      << All(d);
  EXPECT_TRUE(Has(d, "'limits.concurrency' must be a whole number from 1 to 10000", 6)) << All(d);
  EXPECT_TRUE(Has(d, "unknown field 'burst'", 6)) << All(d);
  d = Lint(head + "    circuit_breaker: { cool_down: 10ms }\n" + steps);
  EXPECT_TRUE(Has(d, "'circuit_breaker' needs 'failures'", 6)) << All(d);
  EXPECT_TRUE(Has(d, "'circuit_breaker.cool_down' must be from 100ms to 24h", 6)) << All(d);
  d = Lint(head + "    limits: 20\n" + steps);
  EXPECT_TRUE(Has(d, "'limits' must be a mapping such as { rate: 20, concurrency: 4 }", 6))
      << All(d);
}

TEST(LoaderTest, BadTemplateIsRefused) {
  std::string text = kValid;
  text.replace(text.find("{{input.id}}\" }"), 12, "{{input.id");
  auto d = Lint(text);
  EXPECT_TRUE(Has(d, "unclosed", 0, "read")) << All(d);
}

TEST(LoaderTest, ReferenceToLaterStepIsRefused) {
  std::string text = kValid;
  text.replace(text.find("{{input.id}}\" }"), 12, "{{steps.write.external_id}}");
  auto d = Lint(text);
  EXPECT_TRUE(Has(d, "has not run yet", 4, "read")) << All(d);
}

TEST(LoaderTest, ReferenceToMissingStepIsRefused) {
  std::string text = kValid;
  text.replace(text.find("steps.read.response.id"), 22, "steps.reed.response.id");
  auto d = Lint(text);
  EXPECT_TRUE(Has(d, "'reed', which does not exist", 6, "write")) << All(d);
}

TEST(LoaderTest, UnknownTemplateRootIsRefused) {
  std::string text = kValid;
  text.replace(text.find("{{env.URL}}/orders\""), 11, "{{config.URL}}");
  auto d = Lint(text);
  EXPECT_TRUE(Has(d, "{{config.URL}} cannot be used here", 6, "write")) << All(d);
}

TEST(LoaderTest, KeyMayOnlyUseInputAndEnv) {
  std::string text = kValid;
  text.replace(text.find("{{input.id}}"), 12, "{{steps.read.response.id}}");
  auto d = Lint(text);
  EXPECT_TRUE(Has(d, "key: {{steps.read.response.id}} cannot be used here")) << All(d);
}

TEST(LoaderTest, SideEffectWithoutProtectionIsRefused) {
  auto d = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: notify
    request: { method: POST, url: "http://line/push" }
)");
  EXPECT_TRUE(Has(d, "side-effecting POST has no 'lookup'", 4, "notify")) << All(d);
}

TEST(LoaderTest, SideEffectIsAcceptedWithHonoredKeyOrManual) {
  auto honored = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: notify
    idempotency: { honored: true }
    request: { method: POST, url: "http://line/push" }
)");
  EXPECT_TRUE(honored.empty()) << All(honored);
  auto manual = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: approve
    recovery: manual
    request: { method: POST, url: "http://approvals" }
)");
  EXPECT_TRUE(manual.empty()) << All(manual);
}

TEST(LoaderTest, CompensableNeedsCompensate) {
  auto d = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: book
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/book" }
)");
  EXPECT_TRUE(Has(d, "'compensable' needs a 'compensate'", 4, "book")) << All(d);
}

TEST(LoaderTest, LookupRecoveryNeedsLookup) {
  auto d = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: book
    recovery: lookup
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/book" }
)");
  EXPECT_TRUE(Has(d, "recovery 'lookup' needs a 'lookup'", 4, "book")) << All(d);
}

TEST(LoaderTest, DuplicateStepNamesAndBadValues) {
  auto d = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: GET, url: "http://x", timeout: soon }
    retry: { max_attempts: 0 }
    errors: { "999": rejected, "409": maybe }
  - name: a
    recovery: sometimes
    request: { method: FETCH, url: "http://x" }
)");
  EXPECT_TRUE(Has(d, "'timeout' must be a duration", 5, "a")) << All(d);
  EXPECT_TRUE(Has(d, "'max_attempts' must be a whole number", 6, "a")) << All(d);
  EXPECT_TRUE(Has(d, "'999' is not an HTTP status code", 7)) << All(d);
  EXPECT_TRUE(Has(d, "must be transient, rejected or unknown", 7)) << All(d);
  EXPECT_TRUE(Has(d, "duplicate step name", 8)) << All(d);
  EXPECT_TRUE(Has(d, "'recovery' must be one of", 9)) << All(d);
  EXPECT_TRUE(Has(d, "unsupported method 'FETCH'", 10)) << All(d);
}

TEST(LoaderTest, MissingTopLevelFields) {
  auto d = Lint("description: nothing\n");
  EXPECT_TRUE(Has(d, "missing field 'workflow'")) << All(d);
  EXPECT_TRUE(Has(d, "missing field 'key'")) << All(d);
  EXPECT_TRUE(Has(d, "missing field 'steps'")) << All(d);
  EXPECT_TRUE(Has(Lint("- a\n- b\n"), "a definition is a mapping"));
}

TEST(LoaderTest, OversizedDefinitionIsRefused) {
  std::string text(kMaxDefinitionBytes + 1, '#');
  auto d = Lint(text);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(Has(d, "the limit is")) << All(d);
}

TEST(LoaderTest, LoadJoinsAllDiagnostics) {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: POST, url: "http://x" }
    colour: blue
)",
                                       "w.yaml");
  ASSERT_FALSE(definition.ok());
  EXPECT_EQ(definition.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(definition.status().message().find("w.yaml:6: step 'a': unknown field 'colour'"),
            std::string::npos)
      << definition.status();
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

TEST(LoaderWaitTest, WaitStepsLoadAndTheirMistakesAreNamed) {
  auto good = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: approval
    wait: { event: com.acme.approved, timeout: 2d }
  - name: use
    transform: { by: "{{steps.approval.response.approver}}" }
)",
                                 "w.yaml");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->steps[0].kind, StepKind::kWait);
  EXPECT_EQ(good->steps[0].wait_event, "com.acme.approved");
  EXPECT_EQ(good->steps[0].wait_timeout, 2LL * 86'400'000);

  struct Bad {
    std::string step;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {"    wait: { timeout: 1d }\n", "event"},
      {"    wait: { event: e, soon: 1 }\n", "unknown field 'soon'"},
      {"    wait: { event: e }\n    request: { method: GET, url: \"http://x\" }\n",
       "one of 'request', 'transform', 'wait', 'approval' or 'sql'"},
      {"    wait: { event: e }\n    recovery: lookup\n    lookup: { request: { method: GET, url: "
       "\"http://x\" }, found: /a }\n",
       "wait step"},
      {"    wait: { event: e, timeout: later }\n", "timeout"},
  };
  for (const Bad& c : cases) {
    auto definition = LoadDefinitionText(
        "workflow: w\nkey: \"{{input.id}}\"\nsteps:\n  - name: approval\n" + c.step, "w.yaml");
    ASSERT_FALSE(definition.ok()) << c.step;
    EXPECT_NE(definition.status().message().find(c.says), std::string::npos)
        << definition.status().message();
    EXPECT_NE(definition.status().message().find("w.yaml:"), std::string::npos)
        << definition.status().message();
  }
}

TEST(LoaderApprovalTest, ApprovalStepsLoadAndTheirMistakesAreNamed) {
  auto good = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: approve
    approval:
      material: [/amount, /lines]
      summary: "order {{input.id}}"
      requester: "{{input.submitted_by}}"
      approvers: { group: finance }
      on_reject: close
  - name: use
    transform: { by: "{{steps.approve.response.decision.by}}" }
)",
                                 "w.yaml");
  ASSERT_TRUE(good.ok()) << good.status();
  const StepDefinition& step = good->steps[0];
  EXPECT_EQ(step.kind, StepKind::kApproval);
  EXPECT_EQ(step.approval.material, (std::vector<std::string>{"/amount", "/lines"}));
  EXPECT_EQ(step.approval.group, "finance");
  EXPECT_EQ(step.approval.on_reject, RejectRoute::kClose);
  EXPECT_EQ(step.approval.requester, "{{input.submitted_by}}");

  struct Bad {
    std::string step;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {"    approval: { summary: x }\n", "'approval.material' must list"},
      {"    approval: { material: [amount] }\n", "'amount' is not a JSON pointer"},
      {"    approval: { material: [/a], approvers: { role: boss } }\n",
       "must be viewer, operator or admin"},
      {"    approval: { material: [/a], approvers: { role: admin, group: g } }\n",
       "names one 'role'"},
      {"    approval: { material: [/a], on_reject: undo }\n", "compensate, close or wait"},
      {"    approval: { material: [/a], summary: \"{{steps.later.response}}\" }\n",
       "approval.summary"},
      {"    approval: { material: [/a], deadline: 1d }\n", "unknown field 'deadline'"},
      {"    approval: { material: [/a] }\n    recovery: compensable\n", "approval step"},
      {"    approval: { material: [/a] }\n    optional: true\n", "never optional"},
  };
  for (const Bad& c : cases) {
    auto definition =
        LoadDefinitionText("workflow: w\nkey: \"{{input.id}}\"\nsteps:\n  - name: approve\n" +
                               c.step + "  - name: later\n    transform: { x: 1 }\n",
                           "w.yaml");
    ASSERT_FALSE(definition.ok()) << c.step;
    EXPECT_NE(definition.status().message().find(c.says), std::string::npos)
        << definition.status().message();
    EXPECT_NE(definition.status().message().find("step 'approve'"), std::string::npos)
        << definition.status().message();
  }
}

TEST(LoaderTest, ARedactListHoldsJsonPointersOnly) {
  std::string text = kValid;
  text.replace(text.find("steps:"), 6, "redact: [/customer/phone, /a~1b]\nsteps:");
  auto loaded = LoadDefinitionText(text, "flow.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->redact, (std::vector<std::string>{"/customer/phone", "/a~1b"}));
  std::string bad = kValid;
  bad.replace(bad.find("steps:"), 6, "redact:\n  - customer/phone\n  - /a~2\n  - /\nsteps:");
  auto diagnostics = Lint(bad);
  EXPECT_TRUE(Has(diagnostics, "'redact' entry 'customer/phone' is not a JSON pointer", 4));
  EXPECT_TRUE(Has(diagnostics, "'redact' entry '/a~2' is not a JSON pointer", 5));
  EXPECT_TRUE(Has(diagnostics, "'redact' entry '/' is not a JSON pointer", 6));
  std::string not_list = kValid;
  not_list.replace(not_list.find("steps:"), 6, "redact: /customer/phone\nsteps:");
  EXPECT_TRUE(Has(Lint(not_list), "'redact' must be a list of JSON pointers", 3));
}

TEST(LoaderTest, AWorkflowMayKeepItsStepKeysLonger) {
  std::string text = kValid;
  text.replace(text.find("steps:"), 6, "retention: { step_keys: 30d }\nsteps:");
  auto loaded = LoadDefinitionText(text, "flow.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step_key_retention, 30LL * 24 * 3600 * 1000);
  EXPECT_EQ(LoadDefinitionText(kValid, "flow.yaml")->step_key_retention, 0);
  std::string bad = kValid;
  bad.replace(bad.find("steps:"), 6, "retention: { step_keys: 0s, keep: 1d }\nsteps:");
  auto diagnostics = Lint(bad);
  EXPECT_TRUE(Has(diagnostics, "'retention.step_keys' must be at least 1s", 3));
  EXPECT_TRUE(Has(diagnostics, "unknown field 'keep'", 3));
}

TEST(LoaderTest, UrlsAndLookupsAreCheckedForTenantsAndSafety) {
  std::string host = kValid;
  host.replace(host.find("\"{{env.URL}}/orders\""), 20, "\"http://{{input.host}}/orders\"");
  EXPECT_TRUE(Has(Lint(host), "would be written into the scheme, host or port", 0, "write"))
      << host;
  // A lookup that neither asks for nor matches the tenant's reference: a warning.
  auto diagnostics = Lint(kValid);
  ASSERT_FALSE(diagnostics.empty());
  for (const auto& d : diagnostics) EXPECT_EQ(d.severity, Severity::kWarning) << d.ToString();
  EXPECT_TRUE(Has(diagnostics, "warning: step 'write': the lookup neither queries nor matches"));
  EXPECT_TRUE(LoadDefinitionText(kValid, "flow.yaml").ok()) << "a warning refuses nothing";
  std::string tenanted = kValid;
  tenanted.replace(tenanted.find("found: /items/0"), 15,
                   "items: /items\n      match: { /ref: \"{{instance.ref}}\" }");
  tenanted.replace(tenanted.find("external_id: /items/0/id"), 24, "external_id: /id");
  EXPECT_TRUE(Lint(tenanted).empty()) << Lint(tenanted)[0].ToString();
  std::string both = tenanted;
  both.replace(both.find("items: /items"), 13, "items: /items\n      found: /items/0");
  EXPECT_TRUE(Has(Lint(both), "'found' (one object) or 'items' (candidates), not both"));
}

TEST(LoaderTest, InvalidUtf8IsRefusedNamingTheLine) {
  // Found by the fuzzer: a byte that is not UTF-8 inside a transform used to throw.
  auto diagnostics =
      Lint("workflow: w\nkey: k\nsteps:\n  - name: t\n    transform: { a: \"\xff\" }\n");
  EXPECT_TRUE(Has(diagnostics, "flow.yaml:5: not valid UTF-8")) << diagnostics[0].ToString();
}

// A lookup over pages and errors read from the body, as a realistic ERP needs them.
constexpr char kPagedErp[] = R"(workflow: erp
key: "{{input.id}}"
steps:
  - name: create
    recovery: lookup
    request: { method: POST, url: "{{env.URL}}/api/orders", body: { ref: "{{instance.ref}}" } }
    result: { external_id: /data/order_no }
    errors:
      503: transient
      body:
        - match: { /status: ERROR, /code: RATE_LIMIT }
          class: transient
        - status: 409
          match: { /code: DUPLICATE }
          class: exists
    lookup:
      request: { method: GET, url: "{{env.URL}}/api/orders?q={{instance.ref}}" }
      items: /data
      match: { /ref: "{{instance.ref}}" }
      external_id: /order_no
      pages: { next: /next, max: 20 }
)";

TEST(LoaderTest, BodyErrorRulesAndLookupPagesLoad) {
  auto definition = LoadDefinitionText(kPagedErp, "erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const StepDefinition& create = definition->steps[0];
  EXPECT_EQ(create.errors.at(503), ErrorClass::kTransient);
  ASSERT_EQ(create.body_errors.size(), 2u);
  EXPECT_EQ(create.body_errors[0].status, 0);
  EXPECT_EQ(create.body_errors[0].verdict, BodyVerdict::kTransient);
  EXPECT_EQ(create.body_errors[0].match, (std::vector<std::pair<std::string, std::string>>{
                                             {"/status", "ERROR"}, {"/code", "RATE_LIMIT"}}));
  EXPECT_EQ(create.body_errors[1].status, 409);
  EXPECT_EQ(create.body_errors[1].verdict, BodyVerdict::kExists);
  ASSERT_TRUE(create.lookup.has_value());
  EXPECT_TRUE(create.lookup->Paginated());
  EXPECT_EQ(create.lookup->next_pointer, "/next");
  EXPECT_EQ(create.lookup->max_pages, 20);

  std::string counted = kPagedErp;
  counted.replace(counted.find("{ next: /next, max: 20 }"), 24, "{ param: page, first: 0 }");
  definition = LoadDefinitionText(counted, "erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->steps[0].lookup->page_param, "page");
  EXPECT_EQ(definition->steps[0].lookup->first_page, 0);
  EXPECT_EQ(definition->steps[0].lookup->max_pages, 10);  // the default
}

TEST(LoaderTest, MistakesInBodyRulesAndPagesAreNamedWithTheirLine) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text = kPagedErp;
    text.replace(text.find(from), from.size(), to);
    return Lint(text);
  };
  auto d = with("class: exists", "class: maybe");
  EXPECT_TRUE(Has(d, "must be transient, rejected, unknown or exists", 15, "create")) << All(d);
  d = with("status: 409", "status: 999");
  EXPECT_TRUE(Has(d, "'999' is not an HTTP status code", 13, "create")) << All(d);
  d = with("match: { /code: DUPLICATE }", "match: { code: DUPLICATE }");
  EXPECT_TRUE(Has(d, "'code' is not a JSON pointer", 14, "create")) << All(d);
  d = with("match: { /code: DUPLICATE }", "when: { /code: DUPLICATE }");
  EXPECT_TRUE(Has(d, "unknown field 'when' in an errors.body rule", 14, "create")) << All(d);
  EXPECT_TRUE(Has(d, "needs 'match'", 0, "create")) << All(d);
  d = with(
      "      body:\n        - match: { /status: ERROR, /code: RATE_LIMIT }\n"
      "          class: transient\n        - status: 409\n"
      "          match: { /code: DUPLICATE }\n          class: exists\n",
      "      body: RATE_LIMIT\n");
  EXPECT_TRUE(Has(d, "'errors.body' is a list of rules", 10, "create")) << All(d);
  d = with("{ next: /next, max: 20 }", "{ next: /next, param: page }");
  EXPECT_TRUE(Has(d, "not both", 21, "create")) << All(d);
  d = with("{ next: /next, max: 20 }", "{ max: 20 }");
  EXPECT_TRUE(Has(d, "needs 'next'", 21, "create")) << All(d);
  d = with("{ next: /next, max: 20 }", "{ next: /next, max: 0 }");
  EXPECT_TRUE(Has(d, "from 1 to 1000", 21, "create")) << All(d);
  d = with("{ next: /next, max: 20 }", "{ next: /next, first: 2 }");
  EXPECT_TRUE(Has(d, "'lookup.pages.first' goes with 'param'", 21, "create")) << All(d);
  d = with("items: /data", "found: /data/0");
  EXPECT_TRUE(Has(d, "'lookup.pages' needs 'items'", 21, "create")) << All(d);
}

TEST(LoaderKeepTest, AStepKeepsWhatTheTemplatesReadUnlessItSaysOtherwise) {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: fetch
    request: { method: GET, url: "http://crm.test/customers/{{input.id}}" }
  - name: all
    store_response: all
    request: { method: GET, url: "http://crm.test/x" }
  - name: listed
    store_response: [/status]
    request: { method: GET, url: "http://crm.test/y" }
  - name: notify
    recovery: manual
    request:
      method: POST
      url: "http://line.test/push/{{steps.fetch.response.line.id}}"
      headers: { X-Seen: "{{steps.listed.output.when}}" }
      body: { to: "{{steps.fetch.response.email}}", items: "{{steps.fetch.response.orders.0.no}}" }
)",
                                       "keep.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const auto& steps = definition->steps;
  EXPECT_EQ(steps[0].store_response, ResponseKeep::kNeeded);
  EXPECT_EQ(steps[0].kept_pointers,
            (std::vector<std::string>{"/email", "/line/id", "/orders/0/no"}));
  EXPECT_EQ(steps[1].store_response, ResponseKeep::kAll);
  EXPECT_EQ(steps[2].kept_pointers, (std::vector<std::string>{"/status", "/when"}));
  EXPECT_TRUE(steps[3].kept_pointers.empty());

  auto d = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: fetch
    store_response: some
    request: { method: GET, url: "http://crm.test/customers" }
)");
  EXPECT_TRUE(Has(d, "'store_response' is all, none or a list", 5)) << All(d);

  d = Lint(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: fetch
    store_response: none
    request: { method: GET, url: "http://crm.test/customers" }
  - name: use
    request: { method: GET, url: "http://crm.test/{{steps.fetch.response.id}}" }
)");
  EXPECT_TRUE(Has(d, "keeps none of it (store_response: none)", 0, "use")) << All(d);

  // A definition with warnings (a lookup that names no tenant) loads, and keeps
  // what its templates read all the same.
  auto warned = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: create
    recovery: lookup
    request: { method: POST, url: "http://erp.test/orders" }
    lookup: { request: { method: GET, url: "http://erp.test/orders?ref={{input.id}}" }, found: /id }
  - name: notify
    request: { method: GET, url: "http://line.test/{{steps.create.response.customer.id}}" }
)",
                                   "warned.yaml");
  ASSERT_TRUE(warned.ok()) << warned.status();
  EXPECT_EQ(warned->steps[0].kept_pointers, (std::vector<std::string>{"/customer/id"}));
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

constexpr char kNotifyHead[] = R"(workflow: notify
key: "{{input.id}}"
steps:
  - name: create
    request: { method: GET, url: "http://x/orders/{{input.id}}" }
  - name: line
)";

TEST(LoaderTest, WhenAndOptionalAreReadInEachForm) {
  auto definition =
      LoadDefinitionText(std::string(kNotifyHead) + R"(    when: { present: "{{input.line_id}}" }
    optional: true
    request: { method: GET, url: "http://x/line" }
  - name: email
    when: { equals: ["{{input.channel}}", email] }
    request: { method: GET, url: "http://x/email" }
  - name: sms
    when: { not_equals: ["{{steps.create.response.country}}", JP] }
    request: { method: GET, url: "http://x/sms" }
  - name: fax
    when: "{{input.fax}}"
    request: { method: GET, url: "http://x/fax" }
  - name: audit
    when: { absent: "{{input.quiet}}" }
    request: { method: GET, url: "http://x/audit" }
)",
                         "notify.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const auto& steps = definition->steps;
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_TRUE(steps[0].when.Always());
  EXPECT_FALSE(steps[0].optional);
  EXPECT_EQ(steps[1].when.test, Condition::Test::kPresent);
  EXPECT_EQ(steps[1].when.value, "{{input.line_id}}");
  EXPECT_TRUE(steps[1].optional);
  EXPECT_EQ(steps[2].when.test, Condition::Test::kEquals);
  EXPECT_EQ(steps[2].when.other, "email");
  EXPECT_EQ(steps[2].when.shown, "{{input.channel}} == email");
  EXPECT_EQ(steps[3].when.test, Condition::Test::kNotEquals);
  EXPECT_EQ(steps[4].when.test, Condition::Test::kTrue);
  EXPECT_EQ(steps[5].when.test, Condition::Test::kAbsent);
}

TEST(LoaderTest, ABadConditionIsNamedWithItsLineAndStep) {
  struct Row {
    const char* yaml;
    const char* says;
    int line;  // 7: the field's own line (the loader); 6: the step's (the validator)
  };
  const std::vector<Row> table = {
      {"    when: { exists: \"{{input.a}}\" }\n", "'when' is a template that renders true or false",
       7},
      {"    when: { present: \"{{input.a}}\", absent: \"{{input.b}}\" }\n",
       "'when' is a template that renders true or false", 7},
      {"    when: { present: \"mail {{input.a}}\" }\n", "exactly one placeholder", 7},
      {"    when: { present: [a] }\n", "'when.present' names one value", 7},
      {"    when: { equals: [\"{{input.a}}\"] }\n", "'when.equals' compares two values", 7},
      {"    when: { equals: \"{{input.a}}\" }\n", "'when.equals' compares two values", 7},
      {"    when: yes\n", "'when' as a value is exactly one placeholder", 7},
      {"    when: \"{{input.a}} and {{input.b}}\"\n",
       "'when' as a value is exactly one placeholder", 7},
      {"    when: \"{{secret.TOKEN}}\"\n", "when: {{secret.TOKEN}} cannot be used here", 6},
      {"    when: \"{{steps.later.output}}\"\n", "which has not run yet at this point", 6},
      {"    when: { equals: [\"{{input.a}}\", \"{{secret.B}}\"] }\n", "{{secret.B}} cannot be used",
       6},
      {"    when: \"{{input.a\"\n", "when: unclosed", 7},
      {"    optional: sometimes\n", "'optional' must be true or false", 7},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.yaml);
    const std::string text = std::string(kNotifyHead) + row.yaml +
                             "    request: { method: GET, url: \"http://x/line\" }\n"
                             "  - name: later\n"
                             "    transform: { a: 1 }\n";
    auto d = Lint(text);
    EXPECT_TRUE(Has(d, row.says, row.line, "line")) << All(d);
    EXPECT_TRUE(Has(d, "flow.yaml:", 0, "line")) << All(d);
    EXPECT_FALSE(LoadDefinitionText(text, "flow.yaml").ok());
  }
}

TEST(LoaderTest, ReadingAStepThatMayBeSkippedOrPassedOverIsWarnedUnlessConditional) {
  const std::string head = std::string(kNotifyHead) + R"(    when: { present: "{{input.line_id}}" }
    request: { method: GET, url: "http://x/line" }
    result: { external_id: /id }
  - name: mail
    optional: true
    request: { method: GET, url: "http://x/mail" }
)";
  auto d = Lint(head + R"(  - name: report
    request: { method: GET, url: "http://x/r?line={{steps.line.external_id}}&m={{steps.mail.response.id}}" }
)");
  EXPECT_TRUE(Has(d, "step 'line' may be skipped (when: present {{input.line_id}})", 0, "report"))
      << All(d);
  EXPECT_TRUE(Has(d, "step 'mail' is optional", 0, "report")) << All(d);
  EXPECT_TRUE(
      Has(d, "guard it with when: { present: \"{{steps.line.external_id}}\" }", 0, "report"))
      << All(d);
  // Reading a step that may be skipped is a warning; a required step reading an
  // optional one's result is refused (its failure would undo the business).
  EXPECT_TRUE(LoadDefinitionText(head + R"(  - name: report
    request: { method: GET, url: "http://x/r?line={{steps.line.external_id}}" }
)",
                                 "flow.yaml")
                  .ok());
  EXPECT_FALSE(LoadDefinitionText(head + R"(  - name: report
    request: { method: GET, url: "http://x/r?m={{steps.mail.response.id}}" }
)",
                                  "flow.yaml")
                   .ok());
  EXPECT_TRUE(LoadDefinitionText(head + R"(  - name: report
    optional: true
    request: { method: GET, url: "http://x/r?m={{steps.mail.response.id}}" }
)",
                                 "flow.yaml")
                  .ok());
  auto guarded = Lint(head + R"(  - name: report
    when: { present: "{{steps.line.external_id}}" }
    request: { method: GET, url: "http://x/r?line={{steps.line.external_id}}" }
)");
  EXPECT_FALSE(Has(guarded, "may be skipped")) << All(guarded);
  // A condition about something else guards nothing; one that reads the step fails too.
  auto unrelated = Lint(head + R"(  - name: report
    when: { present: "{{input.report}}" }
    request: { method: GET, url: "http://x/r?line={{steps.line.external_id}}" }
)");
  EXPECT_TRUE(Has(unrelated, "step 'line' may be skipped", 0, "report")) << All(unrelated);
  auto compared = Lint(head + R"(  - name: report
    when: { equals: ["{{steps.mail.response.kind}}", urgent] }
    request: { method: GET, url: "http://x/r" }
)");
  EXPECT_TRUE(Has(compared, "when reads {{steps.mail.response.kind}}", 0, "report"))
      << All(compared);
}

TEST(LoaderTest, APresenceTestOnAnExternalIdNeverRecordedIsWarned) {
  auto d = Lint(std::string(kNotifyHead) + R"(    transform: { sent: true }
  - name: after
    when: { present: "{{steps.line.external_id}}" }
    request: { method: GET, url: "http://x/after" }
)");
  EXPECT_TRUE(Has(d, "step 'line' records no external id", 0, "after")) << All(d);
  auto recorded =
      Lint(std::string(kNotifyHead) + R"(    request: { method: GET, url: "http://x/line" }
    result: { external_id: /id }
  - name: after
    when: { present: "{{steps.line.external_id}}" }
    request: { method: GET, url: "http://x/after" }
)");
  EXPECT_FALSE(Has(recorded, "records no external id")) << All(recorded);
}

TEST(LoaderSqlTest, SqlStepsLoadWithTheirParametersInOrder) {
  auto good = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: record
    recovery: compensable
    sql:
      statement: |
        INSERT INTO orders (order_key, amount, note) VALUES (:key, :amount, :note)
        RETURNING id
      params:
        amount: "{{input.amount}}"
        key: "{{input.id}}"
        note: null
    compensate:
      sql:
        statement: "UPDATE orders SET state = 'cancelled' WHERE id = :id"
        params: { id: "{{steps.record.output.rows.0.id}}" }
  - name: use
    transform: { row: "{{steps.record.output.rows.0.id}}" }
)",
                                 "w.yaml");
  ASSERT_TRUE(good.ok()) << good.status();
  const StepDefinition& step = good->steps[0];
  EXPECT_EQ(step.kind, StepKind::kSql);
  ASSERT_EQ(step.sql.params.size(), 3u);
  EXPECT_EQ(step.sql.params[0].first, "key");  // the statement's order, not the file's
  EXPECT_EQ(step.sql.params[1].second, "{{input.amount}}");
  EXPECT_FALSE(step.sql.params[2].second.has_value());  // null binds NULL
  EXPECT_NE(step.sql.statement.postgres.find("VALUES ($1, $2, $3)"), std::string::npos);
  ASSERT_TRUE(step.compensate_sql.has_value());
  EXPECT_TRUE(step.Compensable());
  EXPECT_EQ(step.compensate_sql->statement.names, std::vector<std::string>{"id"});
}

TEST(LoaderSqlTest, SqlStepMistakesAreNamedWithFileLineAndStep) {
  struct Bad {
    std::string step;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {"    sql: { statement: \"INSERT INTO t VALUES ('{{input.id}}')\" }\n",
       "sql.statement: the statement contains a template"},
      {"    sql: { statement: \"INSERT INTO t VALUES (:a)\" }\n", "no value for :a"},
      {"    sql: { statement: \"INSERT INTO t VALUES (:a)\", params: { a: x, b: y } }\n",
       "params.b is not used"},
      {"    sql: { statement: \"DELETE FROM t; DROP TABLE t\" }\n", "exactly one statement"},
      {"    sql: { statement: \"DROP TABLE t\" }\n", "not 'drop'"},
      {"    sql: { statement: \"UPDATE steps SET state = 1\" }\n",
       "'steps', one of Waystone's own"},
      {"    sql: { statement: \"SELECT * FROM public.instances\" }\n", "'instances', one of"},
      {"    sql: { statement: \"INSERT INTO \\\"main\\\".api_tokens VALUES (:h)\", params: { h: x "
       "} }\n",
       "'api_tokens', one of"},
      {"    sql: { statement: \"SELECT * FROM orders, server_keys\" }\n", "'server_keys', one of"},
      {"    sql: { statement: \"UPDATE [STEPS] SET a = 1\" }\n", "'steps', one of"},
      {"    sql: { statement: \"SELECT :s\", params: { s: \"{{secret.erp_key}}\" } }\n", "secret"},
      {"    sql: { statement: \"SELECT 1\", tx: true }\n", "unknown field 'tx'"},
      {"    sql: { statement: \"DELETE FROM t WHERE tenant = :tenant\", params: { tenant: x } "
       "}\n",
       "params.tenant is bound by Waystone to the instance's tenant"},
      {"    sql: { statement: \"SELECT 1\" }\n    recovery: lookup\n",
       "its recovery is 'repeatable'"},
      {"    sql: { statement: \"SELECT 1\" }\n    recovery: compensable\n", "needs compensate.sql"},
      {"    sql: { statement: \"SELECT 1\" }\n    idempotency: { key: \"x\" }\n",
       "needs no idempotency key"},
      {"    sql: { statement: \"SELECT 1\" }\n    compensate: { request: { method: POST, url: "
       "\"http://x\" } }\n",
       "unknown field 'request' in compensate"},
      {"    sql: { statement: \"SELECT :a\", params: { a: \"{{steps.later.output}}\" } }\n",
       "later"},
      {"    sql: { statement: \"SELECT 1\" }\n    request: { method: GET, url: \"http://x\" }\n",
       "a step has one of"},
  };
  for (const Bad& c : cases) {
    auto definition = LoadDefinitionText(
        "workflow: w\nkey: \"{{input.id}}\"\nsteps:\n  - name: "
        "record\n" +
            c.step + "  - name: later\n    transform: { a: 1 }\n",
        "w.yaml");
    ASSERT_FALSE(definition.ok()) << c.step;
    EXPECT_NE(definition.status().message().find(c.says), std::string::npos)
        << c.step << " => " << definition.status().message();
    EXPECT_NE(definition.status().message().find("w.yaml:"), std::string::npos)
        << definition.status().message();
    EXPECT_NE(definition.status().message().find("'record'"), std::string::npos)
        << definition.status().message();
  }
}

TEST(LoaderSqlTest, TenantIsBoundByWaystoneAndAStatementThatCouldTouchAnotherTenantIsNamed) {
  const std::string head = "workflow: w\nkey: \"{{input.id}}\"\nsteps:\n  - name: record\n";
  auto scoped = LoadDefinitionText(head + R"(    recovery: compensable
    sql:
      statement: "UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k"
      params: { k: "{{input.id}}", v: 1 }
    compensate:
      sql:
        statement: "UPDATE accounts SET v = 0 WHERE tenant = :tenant AND k = :k"
        params: { k: "{{input.id}}" }
)",
                                   "w.yaml");
  ASSERT_TRUE(scoped.ok()) << scoped.status();
  const SqlSpec& sql = scoped->steps[0].sql;
  ASSERT_EQ(sql.params.size(), 3u);
  EXPECT_EQ(sql.params[1].first, "tenant");  // the statement's order: :v, :tenant, :k
  EXPECT_EQ(sql.params[1].second, "{{instance.tenant}}");
  EXPECT_EQ(sql.statement.unscoped, "");
  EXPECT_TRUE(CheckTenantScoped(*scoped).ok());
  EXPECT_FALSE(Has(Lint(head + "    sql: { statement: \"DELETE FROM a WHERE tenant = :tenant\" "
                               "}\n"),
                   "not scoped"));

  // The probe's statement: globex's UPDATE changed acme's row. It loads (a server without
  // tenants: runs it), lint warns, and a runtime with tenants: refuses it by name.
  const std::string unscoped = head + R"(    recovery: compensable
    sql:
      statement: "UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k"
      params: { k: "{{input.id}}", v: 1 }
    compensate:
      sql:
        statement: "UPDATE accounts SET v = 0 WHERE k = :k"
        params: { k: "{{input.id}}" }
)";
  auto loaded = LoadDefinitionText(unscoped, "w.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const absl::Status refused = CheckTenantScoped(*loaded);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.message()),
              ::testing::AllOf(::testing::HasSubstr("w.yaml:4: step 'record': compensate.sql"),
                               ::testing::HasSubstr("does not use :tenant")));
  EXPECT_TRUE(Has(Lint(unscoped), "compensate.sql.statement is not scoped to its tenant", 4))
      << All(Lint(unscoped));
}

}  // namespace
}  // namespace waystone
