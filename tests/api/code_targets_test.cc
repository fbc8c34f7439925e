// The targets of workflows written as C++ functions (Engine::RegisterTargets): a
// ctx.Call under a target's URL asks its protections first and goes with its
// OAuth2 token, as a YAML step's call does. Through libwaystone.so and its headers
// alone, against independent targets that measure what they received:
// tests/targets/fragile_target.py (a struggling ERP: arrivals, calls at once) and
// tests/targets/oauth_erp_target.py (a token endpoint and order API written from
// RFC 6749 and 6750), on SQLite and PostgreSQL.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <waystone/waystone.h>

#include "support/arrivals.h"
#include "support/backends.h"
#include "support/database_client.h"
#include "support/erp_target.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace {

namespace api = waystone::api;
using Json = nlohmann::json;
using waystone::api::Engine;
using waystone::api::EngineOptions;
using waystone::api::InstanceState;
using waystone::testing::Backend;

// An order at `base`/erp/orders, made once per business key: a lost answer is looked
// up by reference; transient failures are retried for long (the target's
// protections, not the retries, are what these tests look at).
api::Workflow<std::string, std::string> OrderCall(const std::string& base) {
  return {
      "target-order",
      [base](api::Context& ctx, const std::string& ref) -> api::Result<std::string> {
        api::CallOptions create;
        create.retry = {200, std::chrono::milliseconds(20), std::chrono::milliseconds(50)};
        create.lookup = api::HttpRequest{
            "GET", base + "/erp/orders?ref=" + ref, {}, "", std::chrono::seconds(5)};
        create.found = [ref](const api::HttpResponse& answer) -> std::optional<api::HttpResponse> {
          const Json items = Json::parse(answer.body)["items"];
          for (const Json& item : items) {
            if (item["ref"] == ref) return api::HttpResponse{201, {}, item.dump()};
          }
          return std::nullopt;
        };
        auto made = ctx.Call("create-order",
                             {"POST",
                              base + "/erp/orders",
                              {{"Content-Type", "application/json"}},
                              Json{{"ref", ref}}.dump(),
                              std::chrono::seconds(5)},
                             create);
        if (!made.ok()) return made.status();
        return std::string(Json::parse(made->body)["id"]);
      }};
}

class CodeTargetsTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    database_ = waystone::testing::FreshStorePath(GetParam(), dir_, "targets");
    ASSERT_FALSE(database_.empty());
  }

  void StartFragile() {
    target_ = std::make_unique<waystone::testing::TargetProcess>(
        dir_.path(), "fragile_target.py", std::vector<std::string>{"--service-ms", "10"});
    ASSERT_TRUE(target_->ok());
  }

  // An engine with `targets` registered (the order workflow's calls go to `base`).
  std::unique_ptr<Engine> Open(int workers, const std::string& targets, const std::string& base) {
    EngineOptions options;
    options.database = database_;
    options.workers = workers;
    options.secrets_file = secrets_file_;
    auto engine = Engine::Open(options);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    if (!engine.ok()) return nullptr;
    api::Status registered = (*engine)->RegisterTargets(targets, "targets.yaml");
    EXPECT_TRUE(registered.ok()) << registered.ToString();
    EXPECT_TRUE((*engine)->Register(OrderCall(base)).ok());
    return std::move(*engine);
  }

  // Starts `count` orders (prefix-0, ...) on an engine without workers, so that all
  // are due when `runner`'s workers start; returns their handles.
  std::vector<std::unique_ptr<api::Instance>> StartMany(const std::string& targets,
                                                        const std::string& base,
                                                        const std::string& prefix, int count) {
    auto starter = Open(0, targets, base);
    std::vector<std::unique_ptr<api::Instance>> started;
    if (starter == nullptr) return started;
    const auto order = OrderCall(base);
    for (int i = 0; i < count; ++i) {
      const std::string key = prefix + "-" + std::to_string(i);
      auto instance = starter->Start(order, key, key);
      EXPECT_TRUE(instance.ok()) << instance.status().ToString();
      if (instance.ok()) started.push_back(std::move(*instance));
    }
    return started;
  }

  // Waits for each to rest; every one completed.
  void ExpectAllCompleted(std::vector<std::unique_ptr<api::Instance>>& instances) {
    for (auto& instance : instances) {
      auto outcome = instance->Wait(std::chrono::seconds(60));
      ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
      EXPECT_EQ(outcome->state, InstanceState::kCompleted)
          << instance->key() << ": " << outcome->reason;
      EXPECT_EQ(outcome->reason, "") << instance->key();
    }
  }

  std::string Query(const std::string& sql) {
    return waystone::testing::ClientQuery(GetParam(), database_, sql, dir_.path());
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }
  void Configure(const Json& config) {
    ASSERT_NE(target_->Call("POST", "/_target/config", config.dump()), "");
  }

  waystone::testing::TempDir dir_;
  std::string database_;
  std::string secrets_file_;
  std::unique_ptr<waystone::testing::TargetProcess> target_;
};

std::string Protected(const std::string& base, const std::string& protection) {
  return "targets:\n  erp:\n    url: \"" + base + "/erp\"\n" + protection + "\n";
}

// A rate of 20 a second: the target receives 20 a second, one request per order
// (a refused call is not sent, and is no attempt).
TEST_P(CodeTargetsTest, ARateLimitedTargetReceivesItsRateAndEveryCallOnce) {
  StartFragile();
  const std::string targets = Protected(target_->base_url(), "    limits: { rate: 20 }");
  auto instances = StartMany(targets, target_->base_url(), "rate", 40);
  auto runner = Open(16, targets, target_->base_url());
  ASSERT_NE(runner, nullptr);
  ExpectAllCompleted(instances);
  const Json stats = Stats();
  EXPECT_EQ(stats["requests"], 40) << stats.dump();
  EXPECT_EQ(stats["orders"], 40) << stats.dump();
  const double rate = waystone::testing::ReceivedRate(stats["arrivals"].get<std::vector<double>>());
  // The limit holds (10 % for the measurement); how close to it the calls get is the
  // machine's (target_processes_test.cc says why).
  EXPECT_LE(rate, 22.0) << stats["arrivals"].dump();
  // Spread, not bunched (without the limit all 40 arrive within a tenth of a second):
  // a second holds its 20 slots and some late ones from the second before, more
  // when the machine is busy running other tests beside this one.
  EXPECT_LE(stats["max_per_second_1s"].get<int>(), 30) << stats["arrivals"].dump();
  std::printf("the target received %.2f calls a second (limit 20)\n", rate);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM steps WHERE name = 'create-order' AND attempts = 1"), "40");
}

TEST_P(CodeTargetsTest, AConcurrencyCapIsNeverExceededAndIsUsed) {
  StartFragile();
  Configure({{"service_ms", 150}});
  const std::string targets = Protected(target_->base_url(), "    limits: { concurrency: 3 }");
  auto instances = StartMany(targets, target_->base_url(), "cap", 15);
  auto runner = Open(8, targets, target_->base_url());
  ASSERT_NE(runner, nullptr);
  ExpectAllCompleted(instances);
  const Json stats = Stats();
  EXPECT_EQ(stats["in_flight_max"], 3) << stats.dump();
  EXPECT_EQ(stats["requests"], 15) << stats.dump();
}

// Three 503s open the circuit: the instances wait, saying why, and while it is open
// one probe goes per cool-down; once the target recovers a probe closes it and every
// order is made once.
TEST_P(CodeTargetsTest, TheCircuitOpensLetsOneProbeThroughPerCoolDownAndCloses) {
  StartFragile();
  Configure({{"mode", "fail"}, {"fail_status", 503}});
  const std::string targets =
      Protected(target_->base_url(), "    circuit_breaker: { failures: 3, cool_down: 1s }");
  auto instances = StartMany(targets, target_->base_url(), "breaker", 4);
  auto runner = Open(4, targets, target_->base_url());
  ASSERT_NE(runner, nullptr);
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {
        for (auto& instance : instances) {
          auto now = instance->Get();
          if (now.ok() &&
              now->reason.starts_with("waiting for target 'erp': circuit open after ")) {
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(20)))
      << Stats().dump();
  ASSERT_NE(target_->Call("POST", "/_target/mark", R"({"label": "open"})"), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(2600));  // two cool-downs and a half
  Json stats = Stats();
  // Four instances retrying every 20-50 ms would have sent a hundred.
  const int while_open = stats["arrivals_after"]["open"];
  EXPECT_GE(while_open, 1) << "the circuit never half-opened: " << stats.dump();
  EXPECT_LE(while_open, 3) << stats.dump();
  Configure({{"mode", "ok"}});
  ExpectAllCompleted(instances);
  stats = Stats();
  EXPECT_EQ(stats["orders"], 4) << stats.dump();
}

// OAuth2 client credentials from the secrets file: one token for every instance
// and thread, each order sent with it; credentials the token endpoint refuses leave
// the instance to an operator (no business refusal), with nothing sent to the API.
TEST_P(CodeTargetsTest, OAuth2TokensAreAskedOnceAndRefusedCredentialsWaitForAnOperator) {
  target_ = std::make_unique<waystone::testing::TargetProcess>(
      dir_.path(), "oauth_erp_target.py",
      std::vector<std::string>{"--client-id", "waystone-worker", "--client-secret",
                               "s3cret+with/odd=chars", "--token-delay-ms", "200"});
  ASSERT_TRUE(target_->ok());
  secrets_file_ = dir_.File("secrets");
  waystone::testing::WriteFile(secrets_file_, "erp_client_secret=s3cret+with/odd=chars\n");
  const std::string base = target_->base_url();
  const std::string targets = "targets:\n  erp:\n    url: \"" + base +
                              "/erp\"\n    oauth2:\n      token_url: \"" + base +
                              "/oauth/token\"\n      client_id: waystone-worker\n"
                              "      client_secret: \"{{secret.erp_client_secret}}\"\n";
  auto instances = StartMany(targets, base, "token", 8);
  auto runner = Open(8, targets, base);
  ASSERT_NE(runner, nullptr);
  ExpectAllCompleted(instances);
  Json stats = Stats();
  EXPECT_EQ(stats["tokens_issued"], 1) << stats.dump();
  EXPECT_EQ(stats["orders"], 8) << stats.dump();
  EXPECT_EQ(stats["orders_by_token"]["1"], 8) << stats.dump();
  EXPECT_EQ(stats["unauthorized"], 0) << stats.dump();

  // A runner with the wrong secret: the token endpoint refuses it.
  runner.reset();
  secrets_file_ = dir_.File("wrong-secrets");
  waystone::testing::WriteFile(secrets_file_, "erp_client_secret=not-the-secret\n");
  auto wrong = Open(2, targets, base);
  ASSERT_NE(wrong, nullptr);
  auto refused = wrong->Start(OrderCall(base), "token-refused", std::string("token-refused"));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  auto outcome = (*refused)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->state, InstanceState::kNeedsAttention) << outcome->reason;
  EXPECT_NE(outcome->reason.find("refused the client credentials"), std::string::npos)
      << outcome->reason;
  EXPECT_NE(outcome->reason.find("an operator retries the step"), std::string::npos)
      << outcome->reason;
  EXPECT_EQ(outcome->reason.find("not-the-secret"), std::string::npos) << outcome->reason;
  stats = Stats();
  EXPECT_EQ(stats["orders"], 8) << stats.dump();
  EXPECT_EQ(stats["unauthorized"], 0) << stats.dump();
}

// A targets document with a mistake is refused naming the file, the line and the
// field, and registers nothing; so is a secret written into it.
TEST_P(CodeTargetsTest, BadTargetsAreRefusedNamingTheLine) {
  EngineOptions options;
  options.database = database_;
  options.workers = 0;
  auto engine = Engine::Open(options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  struct Case {
    const char* yaml;
    const char* says;
  } cases[] = {
      {"targets:\n  erp:\n    url: \"http://127.0.0.1:1/erp\"\n    limits: { rate: -1 }\n",
       "targets.yaml:4"},
      {"targets:\n  erp:\n    url: \"http://127.0.0.1:1/erp\"\n    oauth2:\n"
       "      token_url: \"http://127.0.0.1:1/token\"\n      client_id: me\n"
       "      client_secret: hunter2\n",
       "oauth2.client_secret must come from a secret or the environment"},
      {"workflow: not-targets\n", "a targets document is a mapping with 'targets'"},
      {"targets: [\n", "malformed YAML"},
      {"targets:\n  erp:\n    url: \"{{input.url}}\"\n", "cannot be used here"},
  };
  for (const Case& c : cases) {
    api::Status status = (*engine)->RegisterTargets(c.yaml, "targets.yaml");
    EXPECT_EQ(status.code(), api::Status::Code::kInvalidArgument) << c.yaml;
    EXPECT_NE(status.message().find(c.says), std::string::npos) << status.ToString();
    EXPECT_NE(status.message().find("targets.yaml"), std::string::npos) << status.ToString();
  }
}

// An operator pauses the ERP with the CLI, over the HTTP API of a `waystone serve`
// that does not run these workflows (the program declares the target; its first
// call put it on record): the program's calls stop, each instance saying why and
// recording nothing; resumed, every order is made once.
TEST_P(CodeTargetsTest, AnOperatorPausesTheProgramsTargetOverTheApi) {
  StartFragile();
  const std::string base = target_->base_url();
  const std::string targets = Protected(base, "    limits: { concurrency: 4 }");
  auto runner = Open(4, targets, base);
  ASSERT_NE(runner, nullptr);
  const auto order = OrderCall(base);
  auto first = runner->Start(order, "before-pause", std::string("before-pause"));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ((*first)->Wait(std::chrono::seconds(30))->state, InstanceState::kCompleted);

  const std::map<std::string, std::string> db = {{"WAYSTONE_DB", database_}};
  auto token = waystone::testing::RunProcess(
      {waystone::testing::WaystoneBinary(), "token", "create", "--tenant", "default", "--role",
       "operator", "--name", "night-ops"},
      db, dir_.path());
  ASSERT_EQ(token.exit_code, 0) << token.err;
  const std::map<std::string, std::string> operator_env = {
      {"WAYSTONE_TOKEN", token.out.substr(0, token.out.find('\n'))}};
  std::filesystem::create_directories(dir_.File("defs"));
  waystone::testing::WriteFile(dir_.File("server.yaml"), "definitions: defs\nworkers: 1\n");
  const std::string url =
      "http://127.0.0.1:" + std::to_string(waystone::testing::FreeLoopbackPort());
  waystone::testing::Process server({waystone::testing::WaystoneBinary(), "serve", "--config",
                                     dir_.File("server.yaml"), "--listen", url.substr(7)},
                                    db, dir_.path());
  auto cli = [&](const std::string& verb, const std::string& reason) {
    return waystone::testing::RunProcess({waystone::testing::WaystoneBinary(), "target", verb,
                                          "erp", "--reason", reason, "--server", url},
                                         operator_env, dir_.path());
  };
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {  // the server answers (its target list) before the one pause is sent
        return waystone::testing::RunProcess(
                   {waystone::testing::WaystoneBinary(), "targets", "--server", url}, operator_env,
                   dir_.path())
                   .exit_code == 0;
      },
      std::chrono::seconds(30)))
      << server.Errors();
  auto paused_now = cli("pause", "ERP reindexing");
  ASSERT_EQ(paused_now.exit_code, 0) << paused_now.out << paused_now.err;

  std::vector<std::unique_ptr<api::Instance>> paused;
  for (int i = 0; i < 3; ++i) {
    const std::string key = "paused-" + std::to_string(i);
    auto started = runner->Start(order, key, key);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    paused.push_back(std::move(*started));
  }
  for (auto& instance : paused) {
    ASSERT_TRUE(waystone::testing::WaitFor(
        [&] {
          auto now = instance->Get();
          return now.ok() &&
                 now->reason.starts_with("waiting for target 'erp': paused by night-ops at ") &&
                 now->reason.ends_with(": ERP reindexing");
        },
        std::chrono::seconds(20)))
        << instance->Get()->reason;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(Stats()["requests"], 1) << Stats().dump();
  EXPECT_EQ(Query("SELECT COUNT(*) FROM steps s JOIN instances i ON i.id = s.instance_id "
                  "WHERE i.business_key LIKE 'paused-%'"),
            "0");  // a call its target refused records nothing

  auto resumed = cli("resume", "reindex done");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  ExpectAllCompleted(paused);
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 4) << stats.dump();
  EXPECT_EQ(stats["requests"], 4) << stats.dump();
}

// A target whose settings do not render (an environment variable or a secret the
// deployment lacks) is refused when it is registered, naming it: not at 3 a.m. on
// the first call. Nothing of that document is registered.
TEST_P(CodeTargetsTest, ATargetThatDoesNotRenderIsRefusedAtRegistration) {
  StartFragile();
  unsetenv("WAYSTONE_TEST_NO_SUCH_URL");
  const std::string base = target_->base_url();
  auto engine = Open(2, Protected(base, "    limits: { rate: 1000 }"), base);
  ASSERT_NE(engine, nullptr);
  const std::string broken = "targets:\n  erp:\n    url: \"" + base +
                             "/erp\"\n    limits: { concurrency: 1 }\n  forgotten:\n    url: "
                             "\"{{env.WAYSTONE_TEST_NO_SUCH_URL}}/crm\"\n";
  api::Status refused = engine->RegisterTargets(broken, "later.yaml");
  EXPECT_EQ(refused.code(), api::Status::Code::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("later.yaml"), std::string::npos) << refused.ToString();
  EXPECT_NE(refused.message().find("target 'forgotten'"), std::string::npos) << refused.ToString();
  EXPECT_NE(refused.message().find("WAYSTONE_TEST_NO_SUCH_URL"), std::string::npos)
      << refused.ToString();
  const std::string secret = "targets:\n  crm:\n    url: \"" + base +
                             "/crm\"\n    oauth2:\n      token_url: \"" + base +
                             "/token\"\n      client_id: me\n"
                             "      client_secret: \"{{secret.no_such_secret}}\"\n";
  EXPECT_EQ(engine->RegisterTargets(secret, "crm.yaml").code(),
            api::Status::Code::kInvalidArgument);
  // The erp registered first is unchanged (no concurrency cap of 1): four orders
  // held 150 ms each are under way together.
  Configure({{"service_ms", 150}});
  std::vector<std::unique_ptr<api::Instance>> instances;
  for (int i = 0; i < 4; ++i) {
    const std::string key = "kept-" + std::to_string(i);
    auto started = engine->Start(OrderCall(base), key, key);
    ASSERT_TRUE(started.ok());
    instances.push_back(std::move(*started));
  }
  ExpectAllCompleted(instances);
  EXPECT_GT(Stats()["in_flight_max"].get<int>(), 1) << Stats().dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, CodeTargetsTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         waystone::testing::BackendName);

}  // namespace
