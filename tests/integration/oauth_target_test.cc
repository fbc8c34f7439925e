// A target's OAuth2 client credentials (`targets: { erp: { oauth2: ... } }`) against
// tests/targets/oauth_erp_target.py, a token endpoint and order API written from
// RFC 6749 and RFC 6750 by someone who had not read our code. It counts the token
// requests and orders it received, and which token each order came with.

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Form-encoding and Basic must both be right for this one to pass (RFC 6749 §2.3.1).
constexpr const char* kSecret = "s3cr3t+/:é-oauth";

class OAuthTargetTest : public ::testing::Test {
 public:
  void SetUp() override { StartTarget({}); }

  void StartTarget(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--client-id", "waystone-worker",  "--client-secret",
                                     kSecret,       "--token-delay-ms", "200"};
    args.insert(args.end(), extra.begin(), extra.end());
    target_ = std::make_unique<testing::TargetProcess>(dir_.path(), "oauth_erp_target.py", args);
    ASSERT_TRUE(target_->ok());
    setenv("OAUTH_ERP_URL", target_->base_url().c_str(), 1);
    testing::WriteFile(dir_.File("secrets"), std::string("erp_client_secret=") + kSecret + "\n");
    testing::WriteFile(dir_.File("wrong-secrets"), "erp_client_secret=not-the-secret\n");
    auto store = OpenStore({dir_.File("oauth.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto definition = LoadDefinitionText(kWorkflow, "oauth-order.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = std::move(*definition);
  }

  void TearDown() override {
    if (engine_ != nullptr) engine_->Stop();
  }

  // An engine with `workers` workers, reading the secret from `secrets`.
  void StartEngine(const std::string& secrets, int workers = 16) {
    EngineOptions options;
    options.workers = workers;
    options.secrets_file = dir_.File(secrets);
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    engine_->Start();
  }

  // Starts `count` instances (ids prefix-0 ...) at once and waits until each rests.
  std::vector<InstanceRecord> RunMany(const std::string& prefix, int count) {
    std::vector<int64_t> ids;
    for (int i = 0; i < count; ++i) {
      auto started = engine_->StartInstance(
          definition_, {"default", Json{{"id", prefix + "-" + std::to_string(i)}}.dump()});
      EXPECT_TRUE(started.ok()) << started.status();
      if (started.ok()) ids.push_back(started->instance.id);
    }
    std::vector<InstanceRecord> rested;
    for (int64_t id : ids) {
      auto instance = engine_->AwaitRest(id, 60'000);
      EXPECT_TRUE(instance.ok()) << instance.status();
      if (instance.ok()) rested.push_back(*instance);
    }
    return rested;
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  StepRecord CreateStep(const InstanceRecord& instance) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok() && !steps->empty());
    return steps.ok() && !steps->empty() ? steps->front() : StepRecord{};
  }

  // The bytes of the database files (the SQLite file and its WAL).
  std::string DatabaseBytes() {
    std::string bytes;
    for (const char* suffix : {"", "-wal"}) {
      std::ifstream file(dir_.File(std::string("oauth.db") + suffix), std::ios::binary);
      std::stringstream read;
      read << file.rdbuf();
      bytes += read.str();
    }
    return bytes;
  }

  static constexpr const char* kWorkflow = R"(workflow: oauth-order
key: "{{input.id}}"
targets:
  erp:
    url: "{{env.OAUTH_ERP_URL}}/erp"
    oauth2:
      token_url: "{{env.OAUTH_ERP_URL}}/oauth/token"
      client_id: waystone-worker
      client_secret: "{{secret.erp_client_secret}}"
steps:
  - name: create-order
    recovery: lookup
    request:
      method: POST
      url: "{{env.OAUTH_ERP_URL}}/erp/orders"
      body: { ref: "{{input.id}}" }
      timeout: 5s
    result: { external_id: /id }
    lookup:
      request: { method: GET, url: "{{env.OAUTH_ERP_URL}}/erp/orders?ref={{input.id}}" }
      items: /items
      match: { /ref: "{{input.id}}" }
      external_id: /id
    retry: { max_attempts: 3, initial_interval: 10ms, max_interval: 20ms }
)";

  testing::TempDir dir_;
  SeededRandom random_{5};
  std::unique_ptr<testing::TargetProcess> target_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  WorkflowDefinition definition_;
  std::unique_ptr<Engine> engine_;
};

// Every order made once, by the instance whose ref it carries, in one attempt.
void ExpectEachOrderOnce(const Json& stats, const std::vector<InstanceRecord>& instances) {
  EXPECT_EQ(stats["orders"].get<int>(), static_cast<int>(instances.size())) << stats.dump();
  for (const InstanceRecord& instance : instances) {
    EXPECT_EQ(instance.state, InstanceState::kCompleted)
        << instance.key << ": " << instance.status_reason;
    EXPECT_EQ(stats["orders_by_ref"].value(instance.key, 0), 1) << instance.key;
  }
}

TEST_F(OAuthTargetTest, SixtyFourInstancesAtOnceAskForOneToken) {
  StartEngine("secrets");
  const auto instances = RunMany("wave", 64);
  ASSERT_EQ(instances.size(), 64u);
  const Json stats = Stats();
  ExpectEachOrderOnce(stats, instances);
  EXPECT_EQ(stats["token_requests"].get<int>(), 1) << stats.dump();
  EXPECT_EQ(stats["unauthorized"].get<int>(), 0) << stats.dump();
  EXPECT_EQ(stats["token_auth_methods"]["basic"].get<int>(), 1);
  for (const InstanceRecord& instance : instances) {
    EXPECT_EQ(CreateStep(instance).attempts, 1) << instance.key;
  }
  engine_->Stop();
  const std::string bytes = DatabaseBytes();
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(bytes.find(kSecret), std::string::npos) << "the client secret reached the database";
  EXPECT_EQ(bytes.find("s3cr3t"), std::string::npos);
}

TEST_F(OAuthTargetTest, AnExpiringTokenIsRenewedOncePerLifetimeAndNeverSentStale) {
  target_.reset();
  StartTarget({"--token-ttl", "2"});
  StartEngine("secrets");
  const auto started = std::chrono::steady_clock::now();
  std::vector<InstanceRecord> all;
  for (int wave = 0; wave < 3; ++wave) {
    if (wave > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2'100));
    const auto instances = RunMany("wave" + std::to_string(wave), 12);
    all.insert(all.end(), instances.begin(), instances.end());
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const Json stats = Stats();
  ExpectEachOrderOnce(stats, all);
  // Each wave came after the last token's life: at least one each; never two at once,
  // and no more than one per 1.8 s (a token is renewed a tenth of its life ahead).
  EXPECT_GE(stats["token_requests"].get<int>(), 3) << stats.dump();
  EXPECT_LE(stats["token_requests"].get<double>(), elapsed / 1.8 + 1) << stats.dump();
  EXPECT_EQ(stats["max_concurrent_token_requests"].get<int>(), 1) << stats.dump();
  EXPECT_EQ(stats["unauthorized"].get<int>(), 0) << "a token was sent after it expired";
}

TEST_F(OAuthTargetTest, ARevokedTokenIsRenewedOnceWithoutSpendingAnAttempt) {
  StartEngine("secrets");
  auto first = RunMany("before", 8);
  ASSERT_EQ(Stats()["token_requests"].get<int>(), 1);
  ASSERT_NE(target_->Call("POST", "/_target/revoke", "").find("revoked"), std::string::npos);
  auto second = RunMany("after", 8);
  first.insert(first.end(), second.begin(), second.end());
  const Json stats = Stats();
  ExpectEachOrderOnce(stats, first);
  EXPECT_GE(stats["unauthorized"].get<int>(), 1) << "the revoked token was never tried";
  EXPECT_EQ(stats["token_requests"].get<int>(), 2) << stats.dump();
  EXPECT_EQ(stats["orders_by_token"].value("2", 0), 8) << stats.dump();
  // Every request on the wire is recorded: each 401 the target counted is an attempt
  // record of its own, beside the 201, and spends no business attempt.
  int refused = 0;
  for (const InstanceRecord& instance : second) {
    EXPECT_EQ(CreateStep(instance).attempts, 1) << "a 401 spent a business attempt";
    auto attempts = store_->ListAttempts(instance.id);
    ASSERT_TRUE(attempts.ok());
    int created = 0;
    for (const AttemptRecord& attempt : *attempts) {
      created += attempt.status == 201;
      refused += attempt.status == 401;
    }
    EXPECT_EQ(created, 1);
    EXPECT_LE(attempts->size(), 2u);
  }
  EXPECT_EQ(refused, stats["unauthorized"].get<int>()) << "a request on the wire went unrecorded";
}

TEST_F(OAuthTargetTest, RefusedClientCredentialsStopTheStepNamingTheTarget) {
  StartEngine("wrong-secrets");
  const auto instances = RunMany("refused", 1);
  ASSERT_EQ(instances.size(), 1u);
  const InstanceRecord& instance = instances.front();
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"].get<int>(), 0);
  EXPECT_EQ(stats["token_requests"].get<int>(), 1) << "refused credentials are not retried";
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention) << instance.status_reason;
  EXPECT_NE(instance.status_reason.find("target 'erp'"), std::string::npos)
      << instance.status_reason;
  EXPECT_NE(instance.status_reason.find("invalid_client"), std::string::npos)
      << instance.status_reason;
  EXPECT_NE(instance.status_reason.find("client credentials"), std::string::npos);
  const StepRecord step = CreateStep(instance);
  EXPECT_EQ(step.state, StepState::kFailed);
  EXPECT_EQ(step.error_message.find("not-the-secret"), std::string::npos);
  engine_->Stop();
  EXPECT_EQ(DatabaseBytes().find("not-the-secret"), std::string::npos);
}

TEST_F(OAuthTargetTest, ATokenEndpointThatFailsSendsNoOrderAndIsRetriedAsTransient) {
  ASSERT_NE(target_->Call("POST", "/_target/config", R"({"fail_token":"server_error"})")
                .find("server_error"),
            std::string::npos);
  StartEngine("secrets");
  const auto instances = RunMany("down", 1);
  ASSERT_EQ(instances.size(), 1u);
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"].get<int>(), 0);
  EXPECT_EQ(stats["token_requests"].get<int>(), 3) << "one per attempt: failures are not kept";
  const StepRecord step = CreateStep(instances.front());
  EXPECT_EQ(step.state, StepState::kFailed);
  EXPECT_NE(step.error_message.find("retries exhausted"), std::string::npos) << step.error_message;
  EXPECT_NE(step.error_message.find("HTTP 500"), std::string::npos) << step.error_message;
}

TEST(OAuthLoadTest, ClientCredentialsComeFromTheDeploymentOnly) {
  auto lint = [](const std::string& oauth2) {
    std::string all;
    for (const Diagnostic& d : LintDefinitionText(R"(workflow: t
key: "{{input.id}}"
targets:
  erp:
    url: "{{env.ERP_URL}}"
    oauth2:
)" + oauth2 + R"(
steps:
  - name: read
    request: { method: GET, url: "{{env.ERP_URL}}/x" }
)",
                                                  "t.yaml", nullptr)) {
      all += d.ToString() + "\n";
    }
    return all;
  };
  const std::string good = "      token_url: \"{{env.TOKEN_URL}}\"\n      client_id: worker\n";
  EXPECT_EQ(lint(good + "      client_secret: \"{{secret.erp}}\""), "");
  EXPECT_EQ(lint(good + "      client_secret: \"{{env.ERP_SECRET}}\"\n      scope: orders"), "");
  std::string d = lint(good + "      client_secret: hunter2");
  EXPECT_NE(d.find("t.yaml:4: target 'erp': oauth2.client_secret must come from a secret or the "
                   "environment"),
            std::string::npos)
      << d;
  d = lint(good + "      client_secret: \"{{secret.erp}}x}}\"");
  EXPECT_NE(d.find("oauth2.client_secret must come from a secret"), std::string::npos) << d;
  d = lint(good + "      client_secret: \"x{{secret.erp}}\"");
  EXPECT_NE(d.find("oauth2.client_secret must come from a secret"), std::string::npos) << d;
  d = lint(good + "      client_secret: \"{{input.secret}}\"");
  EXPECT_NE(d.find("oauth2.client_secret: {{input.secret}} cannot be used here"), std::string::npos)
      << d;
  d = lint("      client_id: worker\n      client_secret: \"{{secret.erp}}\"");
  EXPECT_NE(d.find("missing field 'token_url'"), std::string::npos) << d;
  d = lint(good + "      client_secret: \"{{secret.erp}}\"\n      audience: x");
  EXPECT_NE(d.find("unknown field 'audience'"), std::string::npos) << d;
}

}  // namespace
}  // namespace waystone
