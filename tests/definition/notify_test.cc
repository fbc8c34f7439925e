// `templates:` and `notify:` steps, read: each channel becomes a step of its own
// keyed by the delivery's identity, and what would announce too early, leak a token
// or name what does not exist is refused with its line and step.

#include "definition/notify.h"

#include <string>

#include <gtest/gtest.h>

#include "definition/loader.h"

namespace waystone {
namespace {

constexpr char kHead[] = R"(workflow: orders
key: "{{input.id}}"
templates:
  order-confirmed: { version: 3, text: "Order {{steps.create.external_id}} is confirmed" }
  order-cancelled: { version: 1, text: "Order {{steps.create.external_id}} was cancelled" }
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/orders" }
    result: { external_id: /id }
)";

constexpr char kNotify[] = R"(  - name: confirm
    notify:
      reports: create
      template: order-confirmed
      correction: order-cancelled
      recipient: "{{input.customer}}"
      channels:
        line: { to: "{{input.line_id}}", token: "{{secret.LINE_TOKEN}}", url: "{{env.LINE_API}}" }
        webhook: { url: "{{env.HOOK}}/deliveries" }
    retry: { max_attempts: 4 }
)";

// Returns every diagnostic of `text`, one per line.
std::string LintText(const std::string& text) {
  WorkflowDefinition definition;
  std::string all;
  for (const Diagnostic& d : LintDefinitionText(text, "n.yaml", &definition)) {
    all += d.ToString() + "\n";
  }
  return all;
}

TEST(NotifyTest, EachChannelIsAStepKeyedByTheDeliveryIdentity) {
  auto definition = LoadDefinitionText(std::string(kHead) + kNotify, "n.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const auto& steps = definition->steps;
  ASSERT_EQ(steps.size(), 3u);
  ASSERT_EQ(definition->templates.size(), 2u);
  EXPECT_EQ(definition->templates[0].version, 3);

  const StepDefinition& line = steps[1];
  EXPECT_EQ(line.name, "confirm-line");
  EXPECT_EQ(line.notify, "confirm");
  EXPECT_EQ(line.reports, "create");
  EXPECT_EQ(line.line, 11);
  EXPECT_TRUE(line.optional) << "a notification is not critical unless it says so";
  EXPECT_EQ(line.retry.max_attempts, 4);
  EXPECT_EQ(line.idempotency_key,
            "notify:{{input.customer}}:order-confirmed@3:{{instance.ref}}/create:line");
  EXPECT_TRUE(line.idempotency_honored);
  EXPECT_EQ(line.key_window, kLineRetryKeyWindow);
  EXPECT_EQ(line.accepted_statuses, std::vector<int>{409});
  EXPECT_EQ(line.request.method, "POST");
  EXPECT_EQ(line.request.url, "{{env.LINE_API}}/v2/bot/message/push");
  ASSERT_EQ(line.request.headers.size(), 2u);
  EXPECT_EQ(line.request.headers[0].second, "Bearer {{secret.LINE_TOKEN}}");
  EXPECT_EQ(line.request.headers[1],
            (std::pair<std::string, std::string>{"X-Line-Retry-Key", "{{step.key_uuid}}"}));
  EXPECT_NE(line.request.body_json.find("Order {{steps.create.external_id}} is confirmed"),
            std::string::npos)
      << line.request.body_json;
  ASSERT_TRUE(line.compensate.has_value());
  EXPECT_EQ(line.recovery, RecoveryClass::kCompensable);
  EXPECT_EQ(line.compensate->idempotency_key,
            "notify:{{input.customer}}:order-cancelled@1:{{instance.ref}}/create:line");
  EXPECT_NE(line.compensate->request.body_json.find("was cancelled"), std::string::npos);

  const StepDefinition& webhook = steps[2];
  EXPECT_EQ(webhook.name, "confirm-webhook");
  EXPECT_EQ(webhook.idempotency_key,
            "notify:{{input.customer}}:order-confirmed@3:{{instance.ref}}/create:webhook");
  EXPECT_EQ(webhook.key_window, 0);
  EXPECT_TRUE(webhook.accepted_statuses.empty());
  EXPECT_EQ(webhook.request.url, "{{env.HOOK}}/deliveries");
  EXPECT_NE(webhook.request.body_json.find("\"version\":3"), std::string::npos);
}

TEST(NotifyTest, ACriticalNotificationWithoutCorrectionAndItsOwnEvent) {
  auto definition = LoadDefinitionText(std::string(kHead) + R"(  - name: confirm
    critical: true
    when: { present: "{{input.line_id}}" }
    notify:
      reports: create
      template: order-confirmed
      recipient: "{{input.customer}}"
      event: "order-confirmed/{{input.order}}"
      channels:
        line: { to: "{{input.line_id}}", token: "{{env.LINE_TOKEN}}" }
)",
                                       "n.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const StepDefinition& line = definition->steps[1];
  EXPECT_FALSE(line.optional);
  EXPECT_FALSE(line.compensate.has_value());
  EXPECT_EQ(line.recovery, RecoveryClass::kRepeatable);
  EXPECT_EQ(line.when.test, Condition::Test::kPresent);
  EXPECT_EQ(line.request.url, "https://api.line.me/v2/bot/message/push");
  EXPECT_EQ(line.idempotency_key,
            "notify:{{input.customer}}:order-confirmed@3:order-confirmed/{{input.order}}:line");
}

TEST(NotifyTest, AnEmailIsSentOnceAndAnUnknownOutcomeWaitsForAnOperator) {
  auto definition = LoadDefinitionText(std::string(R"(workflow: orders
key: "{{input.id}}"
templates:
  order-confirmed:
    version: 2
    subject: "Order {{steps.create.external_id}}"
    text: "Order {{steps.create.external_id}} is confirmed"
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/orders" }
    result: { external_id: /id }
  - name: confirm
    notify:
      reports: create
      template: order-confirmed
      recipient: "{{input.customer}}"
      channels:
        email:
          url: "smtps://mail.example:465"
          from: orders@shop.example
          to: "{{input.email}}"
          user: "{{env.SMTP_USER}}"
          password: "{{secret.SMTP_PASSWORD}}"
)"),
                                       "n.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const StepDefinition& email = definition->steps[1];
  EXPECT_EQ(email.name, "confirm-email");
  EXPECT_EQ(email.idempotency_key,
            "notify:{{input.customer}}:order-confirmed@2:{{instance.ref}}/create:email");
  EXPECT_FALSE(email.idempotency_honored) << "an SMTP server keeps no key";
  EXPECT_EQ(email.recovery, RecoveryClass::kManual) << "a lost 250 is never resent blindly";
  EXPECT_EQ(email.key_window, 0);
  EXPECT_TRUE(email.optional);
  EXPECT_EQ(email.request.method, "MAIL");
  EXPECT_EQ(email.request.url, "smtps://mail.example:465");
  EXPECT_EQ(email.request.body_kind, BodyKind::kMail);
  const MailSpec& mail = email.request.mail;
  EXPECT_EQ(mail.from, "orders@shop.example");
  EXPECT_EQ(mail.to, "{{input.email}}");
  EXPECT_EQ(mail.subject, "Order {{steps.create.external_id}}");
  EXPECT_EQ(mail.text, "Order {{steps.create.external_id}} is confirmed");
  EXPECT_EQ(mail.message_id, "{{step.key_uuid}}");
  EXPECT_EQ(mail.delivery, email.idempotency_key);
  EXPECT_EQ(mail.password, "{{secret.SMTP_PASSWORD}}");
  EXPECT_EQ(email.request.timeout, kEmailTimeout) << "minutes, as RFC 5321 allows after DATA";
  EXPECT_FALSE(email.compensate.has_value());
  EXPECT_NE(LintText(R"(workflow: orders
key: "{{input.id}}"
templates:
  t: { version: 1, subject: "s {{input.nope}}", text: x }
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/orders" }
  - name: confirm
    notify:
      reports: create
      template: t
      recipient: r
      channels: { email: { url: "smtp://m:25", from: a@b.example, to: "{{steps.later.external_id}}" } }
)")
                .find("request.mail.to: {{steps.later.external_id}} refers to step 'later', which "
                      "does not exist"),
            std::string::npos)
      << "the validator reads an email's templates too";
}

TEST(NotifyTest, AnEmailsCorrectionIsSentAtMostOnce) {
  auto definition = LoadDefinitionText(std::string(R"(workflow: orders
key: "{{input.id}}"
templates:
  confirmed: { version: 2, subject: "Order {{steps.create.external_id}}", text: "confirmed" }
  cancelled: { version: 1, subject: "Order {{steps.create.external_id}} cancelled", text: "sorry" }
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/orders" }
    result: { external_id: /id }
  - name: confirm
    notify:
      reports: create
      template: confirmed
      correction: cancelled
      recipient: "{{input.customer}}"
      channels:
        email: { url: "smtp://mail.example:25", from: orders@shop.example, to: "{{input.email}}",
                 timeout: 20s }
)"),
                                       "n.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const StepDefinition& email = definition->steps[1];
  EXPECT_EQ(email.request.timeout, 20'000) << "a relay on the LAN answers sooner";
  EXPECT_EQ(email.recovery, RecoveryClass::kManual) << "the original's unknown outcome waits";
  ASSERT_TRUE(email.compensate.has_value());
  EXPECT_TRUE(email.compensate->at_most_once) << "an SMTP server keeps no key";
  EXPECT_EQ(email.compensate->idempotency_key,
            "notify:{{input.customer}}:cancelled@1:{{instance.ref}}/create:email");
  EXPECT_EQ(email.compensate->request.mail.subject, "Order {{steps.create.external_id}} cancelled");
  EXPECT_EQ(email.compensate->request.mail.delivery, email.compensate->idempotency_key);
  EXPECT_EQ(email.compensate->request.timeout, 20'000);
}

TEST(NotifyTest, WhatWouldAnnounceTooEarlyOrLeakIsRefusedWithLineAndStep) {
  struct Row {
    const char* name;
    std::string text;
    const char* expected;
  };
  const std::string head(kHead);
  const std::string notify(kNotify);
  auto replace = [&](std::string from, const std::string& to) {
    std::string text = head + notify;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  const Row rows[] = {
      {"a later step",
       replace("reports: create", "reports: later") +
           "  - name: later\n    request: { method: GET, url: \"http://x\" }\n",
       "n.yaml:11: step 'confirm': notify 'confirm' reports step 'later', which has not run yet"},
      {"no such step", replace("reports: create", "reports: nothing"),
       "step 'confirm': notify 'confirm' reports step 'nothing', which does not exist"},
      {"an unknown template", replace("template: order-confirmed", "template: order-shipped"),
       ":14: step 'confirm': 'template': no template 'order-shipped' under 'templates:' (known: "
       "order-confirmed, order-cancelled)"},
      {"a token written out", replace("{{secret.LINE_TOKEN}}", "abc123"),
       "'notify.channels.line.token' must be exactly one {{secret.NAME}} or {{env.NAME}}"},
      {"a token from the input", replace("{{secret.LINE_TOKEN}}", "{{input.token}}"),
       "'notify.channels.line.token' must come from {{secret.NAME}} or {{env.NAME}}"},
      {"a correction over email without subject",
       replace("webhook: { url: \"{{env.HOOK}}/deliveries\" }",
               "email: { url: \"smtp://mail:25\", from: a@b.example, to: \"{{input.mail}}\" }"),
       "correction template 'order-cancelled' has no 'subject', which an email needs"},
      {"an email without subject",
       replace("webhook: { url: \"{{env.HOOK}}/deliveries\" }",
               "email: { url: \"smtp://mail:25\", from: a@b.example, to: \"{{input.mail}}\" }"),
       "template 'order-confirmed' has no 'subject', which an email needs"},
      {"an email to an HTTP URL",
       replace("webhook: { url: \"{{env.HOOK}}/deliveries\" }",
               "email: { url: \"http://mail\", from: a@b.example, to: x@y.example }"),
       "'notify.channels.email.url' is the SMTP server: smtp://host:port or smtps://host:port"},
      {"an SMTP password written out",
       replace("webhook: { url: \"{{env.HOOK}}/deliveries\" }",
               "email: { url: \"smtp://m:25\", from: a@b.example, to: x@y.example, user: u, "
               "password: hunter22 }"),
       "'notify.channels.email.password' must be exactly one {{secret.NAME}} or {{env.NAME}}"},
      {"an email timeout under a second",
       replace(
           "webhook: { url: \"{{env.HOOK}}/deliveries\" }",
           "email: { url: \"smtp://m:25\", from: a@b.example, to: x@y.example, timeout: 500ms }"),
       "'notify.channels.email.timeout' is at least 1s (default 2m)"},
      {"an email timeout that is not a duration",
       replace(
           "webhook: { url: \"{{env.HOOK}}/deliveries\" }",
           "email: { url: \"smtp://m:25\", from: a@b.example, to: x@y.example, timeout: soon }"),
       "'timeout' must be a duration such as 200ms, 2s or 1m"},
      {"a user without password",
       replace("webhook: { url: \"{{env.HOOK}}/deliveries\" }",
               "email: { url: \"smtp://m:25\", from: a@b.example, to: x@y.example, user: u }"),
       "'user' and 'password' go together"},
      {"an unknown channel", replace("webhook:", "fax:"), "unknown channel 'fax'"},
      {"no version", replace("version: 3, ", ""), "template 'order-confirmed' needs 'version'"},
      {"a name clash",
       head + notify +
           "  - name: confirm-line\n    request: { method: GET, url: \"http://x\" "
           "}\n",
       "step 'confirm-line': duplicate step name"},
      {"an unknown field", replace("channels:", "channel: {}\n      channels:"),
       "unknown field 'channel' in notify"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const std::string found = LintText(row.text);
    EXPECT_NE(found.find(row.expected), std::string::npos) << found;
  }
  // Reporting an optional step: it may have failed.
  std::string optional = head;
  optional.replace(optional.find("    idempotency"), 0, "    optional: true\n");
  EXPECT_NE(LintText(optional + notify).find("which is optional and may have failed"),
            std::string::npos)
      << LintText(optional + notify);
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

constexpr char kGroup[] = R"(workflow: orders
key: "{{input.id}}"
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "http://erp/orders" }
    result: { external_id: /id }
  - name: downstream
    parallel:
      - branch: crm
        steps:
          - name: link
            idempotency: { honored: true }
            request: { method: POST, url: "http://crm/links", body: { order: "{{steps.create.external_id}}" } }
          - name: tag
            idempotency: { honored: true }
            request: { method: POST, url: "http://crm/tags", body: { link: "{{steps.link.external_id}}" } }
      - name: reserve
        idempotency: { honored: true }
        request: { method: POST, url: "http://wms/reservations" }
  - name: after
    request: { method: GET, url: "http://crm/{{steps.tag.external_id}}/{{steps.reserve.external_id}}" }
)";

TEST(ParallelTest, BranchesAreNumberedAndSeeOnlyTheirOwnPast) {
  auto definition = LoadDefinitionText(kGroup, "g.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const auto& steps = definition->steps;
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[1].name, "link");
  EXPECT_EQ(steps[1].group, "downstream");
  EXPECT_EQ(steps[1].branch, 0);
  EXPECT_EQ(steps[2].branch, 0);
  EXPECT_EQ(steps[3].name, "reserve");
  EXPECT_EQ(steps[3].branch, 1);
  EXPECT_TRUE(steps[4].group.empty());
  EXPECT_TRUE(steps[1].Beside(steps[3]));
  EXPECT_FALSE(steps[1].Beside(steps[2]));
  EXPECT_FALSE(steps[1].Beside(steps[4]));
}

TEST(ParallelTest, ANotificationsChannelsAreBranches) {
  auto definition = LoadDefinitionText(std::string(kHead) + kNotify, "n.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  EXPECT_EQ(definition->steps[1].group, "confirm");
  EXPECT_EQ(definition->steps[1].branch, 0);
  EXPECT_EQ(definition->steps[2].group, "confirm");
  EXPECT_EQ(definition->steps[2].branch, 1);
}

TEST(ParallelTest, WhatABranchCannotKnowIsRefused) {
  const std::string text(kGroup);
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string changed = text;
    changed.replace(changed.find(from), from.size(), to);
    return changed;
  };
  struct Row {
    const char* name;
    std::string text;
    const char* expected;
  };
  const Row rows[] = {
      {"a sibling's result",
       replace("http://wms/reservations", "http://wms/{{steps.link.external_id}}"),
       "refers to step 'link' in another branch of parallel group 'downstream', which may not have "
       "run yet"},
      {"one branch",
       replace("      - name: reserve\n        idempotency: { honored: true }\n"
               "        request: { method: POST, url: \"http://wms/reservations\" }\n",
               ""),
       "'parallel' is a list of at least two branches"},
      {"a group in a group",
       replace("      - name: reserve",
               "      - name: inner\n        parallel: []\n      - name: reserve2"),
       "a parallel group cannot hold another one"},
      {"a name clash", replace("name: reserve", "name: downstream"), "duplicate"},
      {"a notify reporting a sibling",
       "templates:\n  t: { version: 1, text: x }\n" +
           replace(
               "      - name: reserve\n",
               "      - name: tell\n        notify:\n          reports: link\n          template: "
               "t\n"
               "          recipient: r\n          channels: { webhook: { url: \"http://h\" } }\n"
               "      - name: reserve\n"),
       "notify 'tell' reports step 'link', which is in another branch of parallel group "
       "'downstream'"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const std::string found = LintText(row.text);
    EXPECT_NE(found.find(row.expected), std::string::npos) << found;
  }
}

}  // namespace
}  // namespace waystone
