// The serve config file and the CloudEvents parser: accepted forms and errors
// that name the file and line, or the event and attribute.

#include "server/server_config.h"

#include <gtest/gtest.h>

#include "server/cloudevents_in.h"

namespace waystone {
namespace {

TEST(ServerConfigTest, ReadsEveryFieldAndResolvesPathsFromTheFile) {
  auto config = ParseServerConfig(R"(listen: 0.0.0.0:9000
workers: 4
max_in_flight: 5000
lease: 45s
step_key_retention: 30d
definitions: defs
tls: { cert_file: tls/cert.pem, key_file: /secure/key.pem }
api: { max_body_bytes: 65536, read_timeout: 5s, idempotency_retention: 2h }
events:
  - type: a.start
    start: wf
  - type: a.signal
    signal: { key: /ref }
  - type: a.decided
    decide: { key: /ref }
groups:
  - { tenant: acme, name: finance, tokens: [alice, bob] }
)",
                                  "/etc/waystone/serve.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen, "0.0.0.0:9000");
  EXPECT_EQ(config->workers, 4);
  EXPECT_EQ(config->max_in_flight, 5000);
  EXPECT_EQ(config->definitions, "/etc/waystone/defs");
  EXPECT_EQ(config->tls_cert_file, "/etc/waystone/tls/cert.pem");
  EXPECT_EQ(config->tls_key_file, "/secure/key.pem");
  EXPECT_EQ(config->max_body_bytes, 65536u);
  EXPECT_EQ(config->read_timeout_seconds, 5);
  EXPECT_EQ(config->idempotency_retention, 2 * 3600 * 1000);
  ASSERT_EQ(config->events.size(), 3u);
  EXPECT_EQ(config->events[0].start, "wf");
  EXPECT_EQ(config->events[1].signal_key, "/ref");
  EXPECT_EQ(config->events[1].act, "signal");
  EXPECT_EQ(config->events[2].act, "decide");
  ASSERT_EQ(config->groups.size(), 1u);
  EXPECT_EQ(config->groups[0].tokens, (std::vector<std::string>{"alice", "bob"}));
  EXPECT_EQ(GroupsOf(config->groups, "bob", "acme"), std::vector<std::string>{"finance"});
  EXPECT_TRUE(GroupsOf(config->groups, "bob", "globex").empty());
  EXPECT_EQ(config->events[1].line, 12);
  EXPECT_EQ(config->step_key_retention, "30d");
}

TEST(ServerConfigTest, DefaultsWhenAbsent) {
  auto config = ParseServerConfig("listen: 127.0.0.1:1\n", "c.yaml");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->idempotency_retention, 24LL * 3600 * 1000);
  EXPECT_EQ(config->max_body_bytes, 1u << 20);
}

TEST(ServerConfigTest, ErrorsNameTheFileAndLine) {
  struct Bad {
    std::string text;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {"listen: x\nport: 1\n", "c.yaml:2: unknown field 'port'"},
      {"listen: x\nstep_key_retention: soon\n",
       "c.yaml:2: 'step_key_retention' must be a duration"},
      {"workers: many\n", "c.yaml:1: 'workers'"},
      {"max_in_flight: 0\n", "c.yaml:1: 'max_in_flight' must be a whole number from 1"},
      {"groups:\n  - { tenant: a, name: g }\n", "c.yaml:2: group 'g' lists its members"},
      {"groups:\n  - { tenant: a, name: g, tokens: [x] }\n  - { tenant: a, name: g, tokens: [y] "
       "}\n",
       "c.yaml:3: group 'g' of tenant 'a' is named already, at line 2"},
      {"events:\n  - type: t\n",
       "c.yaml:2: event route 't' needs one of 'start', 'signal', 'decide' or 'revise'"},
      {"events:\n  - type: t\n    start: w\n    signal: { key: /k }\n",
       "needs one of 'start', 'signal'"},
      {"events:\n  - type: t\n    signal: { key: k }\n",
       "c.yaml:3: 'signal.key' is a JSON pointer"},
      {"events:\n  - {type: t, start: a}\n  - {type: t, start: b}\n",
       "c.yaml:3: event type 't' is routed twice"},
      {"api: { idempotency_retention: soon }\n", "idempotency_retention"},
      {"listen: [\n", "c.yaml:2: malformed YAML"},
      {"lease: forever\n", "'lease'"},
      {"permissions: { role: operator }\n", "c.yaml:1: 'permissions' is a list"},
      {"tls: { cert_file: c.pem }\n", "c.yaml:1: 'tls' needs both 'cert_file' and 'key_file'"},
      {"tls: { cert_file: c.pem, key_file: k.pem, ca: x }\n", "unknown field 'ca'"},
      {"permissions:\n  - { role: god, actions: [retry] }\n",
       "c.yaml:2: a permission needs 'role'"},
      {"permissions:\n  - { role: operator }\n", "c.yaml:2: a permission needs 'actions'"},
      {"permissions:\n  - role: operator\n    actions: [retry, delete]\n",
       "c.yaml:3: 'delete' is not one of retry"},
      {"permissions:\n  - { role: viewer, actions: [retry] }\n", "a viewer takes no actions"},
      {"permissions:\n  - { role: operator, tenant: 'a b', actions: [] }\n", "not a tenant name"},
      {"permissions:\n  - { role: operator, actions: [retry], who: x }\n", "unknown field 'who'"},
      {"permissions:\n  - { role: operator, tenant: t, actions: [retry] }\n"
       "  - { role: operator, tenant: t, actions: [close] }\n",
       "c.yaml:3: role 'operator' has permissions for tenant 't' already, at line 2"},
  };
  for (const Bad& c : cases) {
    auto config = ParseServerConfig(c.text, "c.yaml");
    ASSERT_FALSE(config.ok()) << c.text;
    EXPECT_NE(config.status().message().find(c.says), std::string::npos)
        << c.text << " -> " << config.status().message();
  }
}

TEST(ServerConfigTest, PermissionsNarrowARolePerTenantAndDefaultToTodays) {
  auto config = ParseServerConfig(R"(permissions:
  - role: operator
    tenant: acme
    actions: [retry, confirm, acknowledge]
  - role: operator
    actions: [retry, close, see_redacted]
  - role: viewer
    tenant: acme
    actions: [see_redacted]
)",
                                  "c.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->permissions.size(), 3u);
  EXPECT_EQ(config->permissions[0].line, 2);
  const auto& rules = config->permissions;
  using P = Permission;
  EXPECT_EQ(PermissionsOf(rules, Role::kOperator, "acme"),
            (std::set<P>{P::kRetry, P::kConfirm, P::kAcknowledge}));
  EXPECT_EQ(PermissionsOf(rules, Role::kOperator, "other"),
            (std::set<P>{P::kRetry, P::kClose, P::kSeeRedacted}));
  EXPECT_EQ(PermissionsOf(rules, Role::kViewer, "acme"), (std::set<P>{P::kSeeRedacted}));
  EXPECT_EQ(PermissionsOf(rules, Role::kViewer, "other"), (std::set<P>{}));
  // No rule for admins: every action and see_redacted, as without the section.
  EXPECT_EQ(PermissionsOf(rules, Role::kAdmin, "acme").size(), 9u);
  EXPECT_EQ(PermissionsOf({}, Role::kOperator, "acme"),
            (std::set<P>{P::kRetry, P::kConfirm, P::kCompensate, P::kSkip, P::kClose,
                         P::kAcknowledge, P::kPauseTarget, P::kRevise}));
  EXPECT_EQ(TenantsWithRules(rules, Role::kOperator), (std::set<std::string>{"acme"}));
}

HeaderList Headers(std::map<std::string, std::string> headers) {
  return HeaderList(headers.begin(), headers.end());
}

TEST(CloudEventsInTest, StructuredBinaryAndBatch) {
  auto structured = ParseCloudEvents(
      "application/cloudevents+json; charset=utf-8", Headers({}),
      R"({"specversion":"1.0","id":"1","source":"/s","type":"t","tenant":"acme","data":{"a":1}})");
  ASSERT_TRUE(structured.ok()) << structured.status();
  EXPECT_EQ((*structured)[0].tenant, "acme");
  EXPECT_EQ((*structured)[0].data_json, R"({"a":1})");

  auto binary = ParseCloudEvents(
      "application/json",
      Headers({{"ce-specversion", "1.0"}, {"ce-id", "2"}, {"ce-source", "/s"}, {"ce-type", "t"}}),
      R"({"b":2})");
  ASSERT_TRUE(binary.ok()) << binary.status();
  EXPECT_EQ((*binary)[0].id, "2");
  EXPECT_EQ((*binary)[0].data_json, R"({"b":2})");
  auto text = ParseCloudEvents(
      "text/plain",
      Headers({{"ce-specversion", "1.0"}, {"ce-id", "3"}, {"ce-source", "/s"}, {"ce-type", "t"}}),
      "hello");
  EXPECT_EQ((*text)[0].data_json, "\"hello\"");

  auto batch = ParseCloudEvents("application/cloudevents-batch+json", Headers({}),
                                R"([{"specversion":"1.0","id":"4","source":"/s","type":"t"},
                                    {"specversion":"1.0","id":"5","source":"/s","type":"t"}])");
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->size(), 2u);
  EXPECT_EQ((*batch)[1].data_json, "null");
}

TEST(CloudEventsInTest, MissingOrMalformedAttributesAreNamed) {
  auto missing_id = ParseCloudEvents("application/cloudevents+json", Headers({}),
                                     R"({"specversion":"1.0","source":"/s","type":"t"})");
  EXPECT_NE(missing_id.status().message().find("'id'"), std::string::npos);
  auto empty_type = ParseCloudEvents("application/cloudevents+json", Headers({}),
                                     R"({"specversion":"1.0","id":"1","source":"/s","type":""})");
  EXPECT_NE(empty_type.status().message().find("'type'"), std::string::npos);
  auto binary = ParseCloudEvents(
      "application/json",
      Headers({{"ce-specversion", "1.0"}, {"ce-type", "t"}, {"ce-source", "/s"}}), "{}");
  EXPECT_NE(binary.status().message().find("header ce-id"), std::string::npos);
  auto bad_data = ParseCloudEvents(
      "application/json",
      Headers({{"ce-specversion", "1.0"}, {"ce-id", "2"}, {"ce-source", "/s"}, {"ce-type", "t"}}),
      "{nope");
  EXPECT_FALSE(bad_data.ok());
  auto batch = ParseCloudEvents("application/cloudevents-batch+json", Headers({}),
                                R"([{"specversion":"1.0","id":"4","source":"/s","type":"t"},
                                    {"specversion":"1.0","id":"5","type":"t"}])");
  EXPECT_NE(batch.status().message().find("event 1: missing required attribute 'source'"),
            std::string::npos)
      << batch.status();
  EXPECT_FALSE(ParseCloudEvents("application/cloudevents-batch+json", Headers({}), "[]").ok());
}

}  // namespace
}  // namespace waystone
