// The HTTP API's write side over a real server on loopback, with a real engine
// calling a recording fake of the external systems: operator actions (effect,
// audit, dry run equal to what then runs, refusals), Idempotency-Key, the
// CloudEvents inbox, roles and tenants on every write route, bad input.

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/hex.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/operate/batch_runner.h"
#include "engine/operate/operations.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "server/permissions.h"
#include "support/backends.h"
#include "support/process.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// A fake external system that records every call and answers as told.
class Recorder {
 public:
  struct Call {
    std::string method;
    std::string path;
    std::string key;  // Idempotency-Key
  };

  Recorder() {
    server_.set_keep_alive_max_count(1);
    auto handle = [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back({req.method, req.path, req.get_header_value("Idempotency-Key")});
      int status = req.path.starts_with("/find") ? 404 : 200;
      for (const auto& [prefix, s] : status_) {
        if (req.path.starts_with(prefix)) status = s;
      }
      res.status = status;
      res.set_content(Json{{"id", "X-" + std::to_string(++ids_)}}.dump(), "application/json");
    };
    server_.Get(".*", handle);
    server_.Post(".*", handle);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(testing::WaitFor([&] { return server_.is_running(); }, std::chrono::seconds(10)));
  }
  ~Recorder() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void Answer(const std::string& prefix, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    status_[prefix] = status;
  }
  std::vector<Call> Calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // Calls made since `from` (an earlier Calls().size()).
  std::vector<Call> Since(size_t from) {
    auto all = Calls();
    return std::vector<Call>(all.begin() + static_cast<long>(std::min(from, all.size())),
                             all.end());
  }
  int Count(const std::string& prefix) {
    int n = 0;
    for (const auto& c : Calls()) n += c.path.starts_with(prefix) ? 1 : 0;
    return n;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<Call> calls_;
  std::map<std::string, int> status_;
  int ids_ = 0;
};

constexpr char kWorkflow[] = R"(workflow: wf
key: "{{input.id}}"
steps:
  - name: read
    request: { method: GET, url: "{{env.REC_URL}}/read/{{input.id}}", timeout: 2s }
    retry: { max_attempts: 1 }
  - name: create
    recovery: lookup
    request:
      method: POST
      url: "{{env.REC_URL}}/create"
      body: { id: "{{input.id}}" }
      timeout: 2s
    result: { external_id: "/id" }
    lookup:
      request: { method: GET, url: "{{env.REC_URL}}/find/{{input.id}}", timeout: 2s }
      found: "/id"
      external_id: "/id"
    compensate:
      request: { method: POST, url: "{{env.REC_URL}}/cancel/{{steps.create.external_id}}", timeout: 2s }
      retry: { max_attempts: 1 }
    retry: { max_attempts: 1 }
  - name: charge
    recovery: manual
    request: { method: POST, url: "{{env.REC_URL}}/charge", timeout: 2s }
    result: { external_id: "/id" }
    retry: { max_attempts: 1 }
  - name: approval
    wait: { event: com.acme.approved }
  - name: notify
    idempotency: { honored: true }
    request: { method: POST, url: "{{env.REC_URL}}/notify", timeout: 2s }
    retry: { max_attempts: 1 }
)";

class ApiWriteTest : public ::testing::TestWithParam<testing::Backend> {
 protected:
  void SetUp() override {
    setenv("REC_URL", recorder_.url().c_str(), 1);
    // A base URL that carries a credential: never shown in a dry run.
    setenv("CRED_URL", "http://svc:pw@127.0.0.1:9", 1);
    const std::string path = testing::FreshStorePath(GetParam(), dir_, "api");
    ASSERT_FALSE(path.empty());
    auto store = OpenStore({path});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    EngineOptions options;
    options.workers = 1;
    options.lease_duration = 5000;
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionText(kWorkflow, "wf.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    ASSERT_TRUE(engine_->Register(*definition).ok());
    viewer_ = *CreateToken(*store_, "viewer1", "t1", Role::kViewer, 1);
    operator_ = *CreateToken(*store_, "op1", "t1", Role::kOperator, 1);
    // The system that starts approvals' instances and revises them (a CRM): four eyes
    // keep it from deciding them, so the tests' approvers are others.
    intake_ = *CreateToken(*store_, "intake", "t1", Role::kOperator, 1);
    operator_t2_ = *CreateToken(*store_, "op2", "t2", Role::kOperator, 1);
    admin_ = *CreateToken(*store_, "root", "*", Role::kAdmin, 1);
    Restart({});
  }

  // (Re)starts the server with `permissions`.
  void Restart(std::vector<PermissionRule> permissions) {
    server_.reset();
    ApiServerOptions api;
    api.listen = "127.0.0.1:0";
    api.max_body_bytes = 64 * 1024;
    api.events = {{"com.acme.order.received", "wf", "", 1},
                  {"com.acme.approved", "", "/order", 2},
                  {"com.acme.order.decided", "", "/order", 3, "decide"},
                  {"com.acme.order.revised", "", "/order", 4, "revise"}};
    api.permissions = std::move(permissions);
    auto server = ApiServer::Start(api, store_.get(), &clock_, engine_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  void TearDown() override {
    server_.reset();
    engine_.reset();
  }

  HttpResponse Send(const std::string& method, const std::string& path, const std::string& token,
                    const std::string& body = "",
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
    HttpRequest request{method, "http://127.0.0.1:" + std::to_string(server_->port()) + path,
                        std::move(headers), body, 10'000};
    if (!token.empty()) request.headers.emplace_back("Authorization", "Bearer " + token);
    if (!body.empty() && !HasHeader(request, "Content-Type")) {
      request.headers.emplace_back("Content-Type", "application/json");
    }
    return http_->Send(request);
  }

  static bool HasHeader(const HttpRequest& r, const std::string& name) {
    for (const auto& [n, v] : r.headers) {
      if (n == name) return true;
    }
    return false;
  }

  // The token a matrix row's caller sends: "none" sends none, "bad" one no server made.
  std::string TokenOf(const std::string& caller) const {
    return caller == "bad"           ? "wst_not-a-token"
           : caller == "viewer"      ? viewer_
           : caller == "operator"    ? operator_
           : caller == "operator_t2" ? operator_t2_
           : caller == "admin"       ? admin_
                                     : "";
  }

  Json Post(const std::string& path, const Json& body, int want, const std::string& token = "") {
    auto response = Send("POST", path, token.empty() ? operator_ : token, body.dump());
    EXPECT_EQ(response.outcome.status, want) << path << ": " << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  Json Get(const std::string& path, const std::string& token = "") {
    auto response = Send("GET", path, token.empty() ? viewer_ : token);
    EXPECT_EQ(response.outcome.status, 200) << path << ": " << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  // Starts instance `id` over the API and drives it until it rests.
  InstanceState StartAndDrive(const std::string& id) {
    Post("/v1/instances", {{"workflow", "wf"}, {"input", {{"id", id}}}}, 201);
    return Drive(id);
  }

  InstanceState Drive(const std::string& key, const std::string& tenant = "t1") {
    auto instance = store_->FindInstance(tenant, key);
    EXPECT_TRUE(instance.ok()) << instance.status();
    std::stop_source stop;
    auto state = engine_->RunUntilRest(instance->id, stop.get_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *state : InstanceState::kFailed;
  }

  Json Step(const std::string& key, const std::string& name) {
    Json view = Get("/v1/instances/" + key);
    for (const Json& step : view["steps"]) {
      if (step["name"] == name) return step;
    }
    return nullptr;
  }

  // Sends the approval event for `key` in binary mode.
  Json Approve(const std::string& key, const std::string& event_id, int want = 200) {
    auto response = Send("POST", "/v1/events", operator_, Json{{"order", key}}.dump(),
                         {{"ce-specversion", "1.0"},
                          {"ce-id", event_id},
                          {"ce-source", "/approvals"},
                          {"ce-type", "com.acme.approved"},
                          {"Content-Type", "application/json"}});
    EXPECT_EQ(response.outcome.status, want) << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  // Checks that the calls made match a plan's would_execute, in order.
  void ExpectCallsMatch(const std::vector<Recorder::Call>& calls, const Json& would_execute) {
    std::vector<Json> planned;
    for (const Json& p : would_execute) {
      if (p["phase"] != "wait") planned.push_back(p);
    }
    ASSERT_EQ(calls.size(), planned.size()) << would_execute.dump();
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].method, planned[i]["method"]) << i;
      const std::string url = planned[i]["url"];
      const std::string path_template = url.substr(url.find("}}") + 2);
      EXPECT_TRUE(calls[i].path.starts_with(path_template.substr(0, path_template.find("{{"))))
          << calls[i].path << " vs " << url;
      EXPECT_EQ(calls[i].key, planned[i].value("idempotency_key", "")) << calls[i].path;
      // Rendered in the dry run: exactly the URL that was sent.
      if (planned[i].contains("rendered_url")) {
        EXPECT_TRUE(planned[i]["rendered_url"].get<std::string>().ends_with(calls[i].path))
            << calls[i].path << " vs " << planned[i]["rendered_url"];
      }
    }
  }

  // Runs a batch runner's rounds, driving every instance between them (the test's
  // engine has no worker pool), until batch `id` is finished; returns its view.
  Json RunBatch(const std::string& id) {
    BatchRunner runner(store_.get(), store_.get(), &engine_->operations(), &clock_, "test-runner");
    Json batch;
    for (int round = 0; round < 20; ++round) {
      auto moved = runner.RunOnce();
      EXPECT_TRUE(moved.ok()) << moved.status();
      auto instances = store_->ListInstances({});
      EXPECT_TRUE(instances.ok()) << instances.status();
      for (const InstanceRecord& r : instances.value_or(std::vector<InstanceRecord>{})) {
        if (r.state == InstanceState::kRunning) {
          std::stop_source stop;
          (void)engine_->RunUntilRest(r.id, stop.get_token());
        }
      }
      batch = Get("/v1/batches/" + id);
      if (batch["state"] != "running") break;
    }
    return batch;
  }

  testing::TempDir dir_;
  Recorder recorder_;
  FakeClock clock_{1'700'000'000'000};
  SeededRandom random_{7};
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ApiServer> server_;
  std::string viewer_, operator_, intake_, operator_t2_, admin_;
};

TEST_P(ApiWriteTest, RetryOfAFailedManualStepIsPreviewedAppliedAndAudited) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("o1"), InstanceState::kNeedsAttention);
  const Json reason = {{"step", "charge"}, {"reason", "card limit raised, INC-1"}};

  Json dry = Post("/v1/instances/o1/retry?dry_run=true", reason, 200);
  EXPECT_EQ(dry["applied"], false);
  EXPECT_EQ(dry["state_after"], "running");
  ASSERT_EQ(dry["would_execute"].size(), 3u) << dry.dump();
  EXPECT_EQ(dry["would_execute"][0]["idempotency_key"], "t1:o1:charge");
  EXPECT_TRUE(dry["would_execute"][0]["rendered_url"].get<std::string>().ends_with("/charge"))
      << dry.dump();
  EXPECT_EQ(dry["would_execute"][1]["phase"], "wait");
  // A dry run changes nothing.
  Json view = Get("/v1/instances/o1");
  EXPECT_EQ(view["state"], "needs_attention");
  EXPECT_TRUE(view["audit"].empty());

  recorder_.Answer("/charge", 200);
  const size_t before = recorder_.Calls().size();
  Json real = Post("/v1/instances/o1/retry", reason, 200);
  EXPECT_EQ(real["applied"], true);
  EXPECT_EQ(real["would_execute"], dry["would_execute"]);
  EXPECT_EQ(real["would_skip"], dry["would_skip"]);
  view = Get("/v1/instances/o1");
  ASSERT_EQ(view["audit"].size(), 1u);
  EXPECT_EQ(view["audit"][0]["action"], "retry");
  EXPECT_EQ(view["audit"][0]["actor"], "op1");
  EXPECT_EQ(view["audit"][0]["reason"], "card limit raised, INC-1");
  for (const Json& alert : view["alerts"]) EXPECT_EQ(alert["state"], "resolved");

  EXPECT_EQ(Drive("o1"), InstanceState::kRunning);  // waiting for the approval
  EXPECT_EQ(Step("o1", "approval")["state"], "waiting");
  Json signalled = Approve("o1", "appr-1");
  EXPECT_EQ(signalled["results"][0]["outcome"], "signalled");
  EXPECT_EQ(Drive("o1"), InstanceState::kCompleted);
  ExpectCallsMatch(recorder_.Since(before), dry["would_execute"]);

  auto again = Send("POST", "/v1/instances/o1/retry", operator_, reason.dump());
  EXPECT_EQ(again.outcome.status, 409);
  EXPECT_EQ(Json::parse(again.body)["type"], "urn:waystone:problem:state-conflict");
}

TEST_P(ApiWriteTest, ConfirmingThatAnUnknownCallHappenedResumesWithoutCallingAgain) {
  recorder_.Answer("/charge", 504);  // the gateway timed out: did the charge happen?
  ASSERT_EQ(StartAndDrive("o2"), InstanceState::kNeedsAttention);
  EXPECT_EQ(Step("o2", "charge")["state"], "unknown");
  EXPECT_EQ(recorder_.Count("/charge"), 1);

  // The step records an external id: confirming it happened needs one.
  Post("/v1/instances/o2/confirm", {{"step", "charge"}, {"happened", true}, {"reason", "r"}}, 400);
  const Json confirm = {{"step", "charge"},
                        {"happened", true},
                        {"external_id", "CH-9"},
                        {"reason", "payment provider shows CH-9"}};
  Json dry = Post("/v1/instances/o2/confirm?dry_run=true", confirm, 200);
  ASSERT_EQ(dry["would_execute"].size(), 2u) << dry.dump();
  EXPECT_EQ(dry["would_execute"][1]["step"], "notify");
  EXPECT_EQ(Step("o2", "charge")["state"], "unknown");

  const size_t before = recorder_.Calls().size();
  Json real = Post("/v1/instances/o2/confirm", confirm, 200);
  EXPECT_EQ(real["would_execute"], dry["would_execute"]);
  Json charge = Step("o2", "charge");
  EXPECT_EQ(charge["state"], "completed");
  EXPECT_EQ(charge["external_id"], "CH-9");
  EXPECT_EQ(charge["resolution"], "operator");
  EXPECT_EQ(Drive("o2"), InstanceState::kRunning);
  Approve("o2", "appr-2");
  EXPECT_EQ(Drive("o2"), InstanceState::kCompleted);
  EXPECT_EQ(recorder_.Count("/charge"), 1) << "the charge must not be sent again";
  ExpectCallsMatch(recorder_.Since(before), dry["would_execute"]);
  Json audit = Get("/v1/instances/o2")["audit"];
  ASSERT_FALSE(audit.empty());
  EXPECT_EQ(audit[0]["detail"]["external_id"], "CH-9");
  Post("/v1/instances/o2/confirm", confirm, 409);
}

TEST_P(ApiWriteTest, ConfirmingThatItDidNotHappenResubmitsUnderTheSameKey) {
  recorder_.Answer("/charge", 504);
  ASSERT_EQ(StartAndDrive("o3"), InstanceState::kNeedsAttention);
  recorder_.Answer("/charge", 200);
  const Json confirm = {{"step", "charge"}, {"happened", false}, {"reason", "no such charge"}};
  Json dry = Post("/v1/instances/o3/confirm?dry_run=true", confirm, 200);
  const size_t before = recorder_.Calls().size();
  Post("/v1/instances/o3/confirm", confirm, 200);
  EXPECT_EQ(Drive("o3"), InstanceState::kRunning);
  auto charges = recorder_.Calls();
  std::vector<std::string> keys;
  for (const auto& c : charges) {
    if (c.path == "/charge") keys.push_back(c.key);
  }
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], "t1:o3:charge");
  EXPECT_EQ(keys[1], "t1:o3:charge");
  Approve("o3", "appr-3");
  EXPECT_EQ(Drive("o3"), InstanceState::kCompleted);
  ExpectCallsMatch(recorder_.Since(before), dry["would_execute"]);
}

TEST_P(ApiWriteTest, CompensateUndoesTheCreatedObjectWithItsOwnKey) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("o4"), InstanceState::kNeedsAttention);
  const std::string order = Step("o4", "create")["external_id"];
  Json dry =
      Post("/v1/instances/o4/compensate?dry_run=true", {{"reason", "customer cancelled"}}, 200);
  ASSERT_EQ(dry["would_execute"].size(), 1u) << dry.dump();
  EXPECT_EQ(dry["would_execute"][0]["idempotency_key"], "t1:o4:create:compensate");
  EXPECT_EQ(dry["would_execute"][0]["rendered_url"], recorder_.url() + "/cancel/" + order);
  const size_t before = recorder_.Calls().size();
  Json real = Post("/v1/instances/o4/compensate", {{"reason", "customer cancelled"}}, 200);
  EXPECT_EQ(real["would_execute"], dry["would_execute"]);
  EXPECT_EQ(Drive("o4"), InstanceState::kCompensated);
  auto calls = recorder_.Since(before);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].path, "/cancel/" + order);
  ExpectCallsMatch(calls, dry["would_execute"]);
  Json audit = Get("/v1/instances/o4")["audit"];
  ASSERT_EQ(audit.size(), 3u) << audit.dump();
  EXPECT_EQ(audit[0]["action"], "compensate");
  EXPECT_EQ(audit[0]["actor"], "op1");
  EXPECT_EQ(audit[0]["reason"], "customer cancelled");
  EXPECT_EQ(audit[0]["detail"]["state_after"], "compensating");
  // The compensation the engine then ran is audited too, in its own changes.
  EXPECT_EQ(audit[1]["actor"], "engine");
  EXPECT_EQ(audit[1]["action"], "compensate");
  EXPECT_EQ(audit[1]["detail"]["key"], "t1:o4:create:compensate");
  EXPECT_EQ(audit[2]["actor"], "engine");
  EXPECT_EQ(audit[2]["action"], "compensated");
  EXPECT_EQ(audit[2]["detail"]["external_id"], order);
  Post("/v1/instances/o4/compensate", {{"reason", "again"}}, 409);
}

TEST_P(ApiWriteTest, OnlyManualStepsAreSkippedAndCloseEndsTheCase) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("o5"), InstanceState::kNeedsAttention);
  auto refused = Send("POST", "/v1/instances/o5/skip", operator_,
                      Json{{"step", "create"}, {"reason", "x"}}.dump());
  EXPECT_EQ(refused.outcome.status, 409);
  EXPECT_NE(refused.body.find("manual"), std::string::npos);
  const Json skip = {{"step", "charge"}, {"reason", "paid by invoice"}};
  Json skip_dry = Post("/v1/instances/o5/skip?dry_run=true", skip, 200);
  EXPECT_EQ(Step("o5", "charge")["state"], "failed");
  const size_t before = recorder_.Calls().size();
  Json skipped = Post("/v1/instances/o5/skip", skip, 200);
  EXPECT_EQ(skipped["changed_steps"][0]["state"], "skipped");
  EXPECT_EQ(skipped["would_execute"], skip_dry["would_execute"]);
  EXPECT_EQ(skipped["would_skip"], skip_dry["would_skip"]);
  EXPECT_EQ(Drive("o5"), InstanceState::kRunning);
  EXPECT_TRUE(recorder_.Since(before).empty());  // the wait comes next: no call yet
  EXPECT_EQ(Step("o5", "charge")["state"], "skipped");

  Json dry = Post("/v1/instances/o5/close?dry_run=true", {{"reason", "duplicate order"}}, 200);
  EXPECT_TRUE(dry["would_execute"].empty());
  const size_t before_close = recorder_.Calls().size();
  Json closed = Post("/v1/instances/o5/close", {{"reason", "duplicate order"}}, 200);
  EXPECT_EQ(closed["instance"]["state"], "closed");
  EXPECT_EQ(closed["would_skip"], dry["would_skip"]);
  EXPECT_EQ(Drive("o5"), InstanceState::kClosed);
  ExpectCallsMatch(recorder_.Since(before_close), dry["would_execute"]);  // nothing runs
  // An event for a closed case is refused and changes nothing.
  Approve("o5", "appr-5", 409);
  EXPECT_EQ(Step("o5", "approval")["state"], "waiting");
  Post("/v1/instances/o5/close", {{"reason", "again"}}, 409);
  Json audit = Get("/v1/instances/o5")["audit"];
  ASSERT_EQ(audit.size(), 2u);
  EXPECT_EQ(audit[0]["action"], "skip");
  EXPECT_EQ(audit[1]["action"], "close");
}

TEST_P(ApiWriteTest, ASkippedStepsRunGoesAsItsPreviewSaid) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("o7"), InstanceState::kNeedsAttention);
  const Json skip = {{"step", "charge"}, {"reason", "paid by invoice"}};
  Json dry = Post("/v1/instances/o7/skip?dry_run=true", skip, 200);
  ASSERT_FALSE(dry["would_execute"].empty()) << dry.dump();
  const size_t before = recorder_.Calls().size();
  Json real = Post("/v1/instances/o7/skip", skip, 200);
  EXPECT_EQ(real["would_execute"], dry["would_execute"]);
  EXPECT_EQ(Drive("o7"), InstanceState::kRunning);
  Approve("o7", "appr-7");
  EXPECT_EQ(Drive("o7"), InstanceState::kCompleted);
  // The whole run after the skip made exactly the calls the dry run named.
  ExpectCallsMatch(recorder_.Since(before), dry["would_execute"]);
  EXPECT_EQ(recorder_.Count("/charge"), 1) << "a skipped step is not called";
}

TEST_P(ApiWriteTest, AlertsAreAcknowledgedOnceWithAReason) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("o6"), InstanceState::kNeedsAttention);
  Json open = Get("/v1/alerts?state=open");
  ASSERT_FALSE(open["items"].empty());
  // A public id: 16 hex characters, not the database's sequence.
  const std::string id = open["items"][0]["id"];
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(open["items"][0]["instance"], "o6");
  const std::string path = "/v1/alerts/" + id + "/acknowledge";
  Post("/v1/alerts/1/acknowledge", {{"reason", "guessing"}}, 404);
  Post("/v1/alerts/0123456789abcdef/acknowledge", {{"reason", "guessing"}}, 404);
  Post(path, {{"reason", "looking"}}, 403, viewer_);
  Post(path, {{"reason", "looking"}}, 404, operator_t2_);
  Post(path, Json::object(), 400);
  Json dry = Post(path + "?dry_run=true", {{"reason", "looking"}}, 200);
  EXPECT_EQ(dry["state"], "open");
  Json acked = Post(path, {{"reason", "looking into it"}}, 200);
  EXPECT_EQ(acked["state"], "acknowledged");
  Post(path, {{"reason", "again"}}, 409);
  Json audit = Get("/v1/instances/o6")["audit"];
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0]["action"], "acknowledge");
}

TEST_P(ApiWriteTest, MalformedActionsAreProblemsAndChangeNothing) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("o7"), InstanceState::kNeedsAttention);
  struct Bad {
    std::string path;
    std::string body;
    int status;
  };
  const std::vector<Bad> cases = {
      {"/v1/instances/o7/retry", R"({"step":"charge"})", 400},                     // no reason
      {"/v1/instances/o7/retry", R"({"step":"charge","reason":7})", 400},          // wrong type
      {"/v1/instances/o7/retry", R"({"step":"charge","reason":"r","x":1})", 400},  // unknown field
      {"/v1/instances/o7/retry", R"({"step":"nope","reason":"r"})", 400},          // unknown step
      {"/v1/instances/o7/retry", R"({"step":"charge","reason":)", 400},            // malformed
      {"/v1/instances/o7/retry", R"([1,2])", 400},                                 // not an object
      {"/v1/instances/o7/confirm", R"({"step":"charge","reason":"r","happened":"yes"})", 400},
      {"/v1/instances/zz/retry", R"({"step":"charge","reason":"r"})", 404},  // no instance
      {"/v1/instances/o7/retry?dry_run=maybe", R"({"step":"charge","reason":"r"})", 400},
  };
  for (const Bad& c : cases) {
    auto response = Send("POST", c.path, operator_, c.body);
    EXPECT_EQ(response.outcome.status, c.status)
        << c.path << " " << c.body << ": " << response.body;
    Json problem = Json::parse(response.body, nullptr, false);
    ASSERT_TRUE(problem.is_object()) << response.body;
    EXPECT_TRUE(problem["type"].get<std::string>().starts_with("urn:waystone:problem:"));
  }
  // Another tenant's instance is a 404 for its operator too.
  Post("/v1/instances/o7/close", {{"reason", "r"}}, 404, operator_t2_);
  Json view = Get("/v1/instances/o7");
  EXPECT_EQ(view["state"], "needs_attention");
  EXPECT_TRUE(view["audit"].empty());
}

TEST_P(ApiWriteTest, IdempotencyKeyReplaysRefusesChangedPayloadsAndExpires) {
  const std::string body = Json{{"workflow", "wf"}, {"input", {{"id", "i1"}}}}.dump();
  auto first = Send("POST", "/v1/instances", operator_, body, {{"Idempotency-Key", "key-1"}});
  ASSERT_EQ(first.outcome.status, 201) << first.body;
  auto replay = Send("POST", "/v1/instances", operator_, body, {{"Idempotency-Key", "key-1"}});
  EXPECT_EQ(replay.outcome.status, 201);
  EXPECT_EQ(replay.body, first.body);
  // Another token of the tenant never gets this token's stored answer (it may see
  // or do less): the key is another request for it.
  const std::string other = *CreateToken(*store_, "op1b", "t1", Role::kOperator, 1);
  auto crossed = Send("POST", "/v1/instances", other, body, {{"Idempotency-Key", "key-1"}});
  EXPECT_EQ(crossed.outcome.status, 422) << crossed.body;
  EXPECT_EQ(crossed.body.find("Idempotent-Replayed"), std::string::npos);
  const std::string changed = Json{{"workflow", "wf"}, {"input", {{"id", "i2"}}}}.dump();
  auto reused = Send("POST", "/v1/instances", operator_, changed, {{"Idempotency-Key", "key-1"}});
  EXPECT_EQ(reused.outcome.status, 422);
  EXPECT_EQ(Json::parse(reused.body)["type"], "urn:waystone:problem:idempotency-key-reused");
  EXPECT_TRUE(absl::IsNotFound(store_->FindInstance("t1", "i2").status()));
  // Without a key the business key still makes the start exactly-once.
  auto existing = Send("POST", "/v1/instances", operator_, body);
  EXPECT_EQ(existing.outcome.status, 200);
  EXPECT_EQ(Json::parse(existing.body)["created"], false);

  // Errors are stored and replayed too.
  const std::string unknown = Json{{"workflow", "nope"}, {"input", Json::object()}}.dump();
  auto error = Send("POST", "/v1/instances", operator_, unknown, {{"Idempotency-Key", "key-2"}});
  EXPECT_EQ(error.outcome.status, 422);
  auto error_again =
      Send("POST", "/v1/instances", operator_, unknown, {{"Idempotency-Key", "key-2"}});
  EXPECT_EQ(error_again.outcome.status, 422);
  EXPECT_EQ(error_again.body, error.body);

  // After the retention the key is free again.
  clock_.Advance(24LL * 3600 * 1000 + 1000);
  auto later = Send("POST", "/v1/instances", operator_, changed, {{"Idempotency-Key", "key-1"}});
  EXPECT_EQ(later.outcome.status, 201) << later.body;
  EXPECT_TRUE(store_->FindInstance("t1", "i2").ok());
  auto invalid =
      Send("POST", "/v1/instances", operator_, body, {{"Idempotency-Key", std::string(300, 'k')}});
  EXPECT_EQ(invalid.outcome.status, 400);
}

TEST_P(ApiWriteTest, CloudEventsStartAndSignalOnceInEveryMode) {
  auto event = [](const std::string& id, const std::string& order) {
    return Json{{"specversion", "1.0"},
                {"id", id},
                {"source", "/shop"},
                {"type", "com.acme.order.received"},
                {"data", {{"id", order}}}};
  };
  auto structured = [&](const Json& e) {
    return Send("POST", "/v1/events", operator_, e.dump(),
                {{"Content-Type", "application/cloudevents+json"}});
  };
  auto started = structured(event("e1", "c1"));
  ASSERT_EQ(started.outcome.status, 200) << started.body;
  EXPECT_EQ(Json::parse(started.body)["results"][0]["outcome"], "started");
  auto again = structured(event("e1", "c1"));
  ASSERT_EQ(again.outcome.status, 200);
  EXPECT_EQ(Json::parse(again.body)["results"][0]["outcome"], "duplicate");

  const Json batch = Json::array({event("e2", "c2"), event("e1", "c1")});
  auto batched = Send("POST", "/v1/events", operator_, batch.dump(),
                      {{"Content-Type", "application/cloudevents-batch+json"}});
  ASSERT_EQ(batched.outcome.status, 200) << batched.body;
  Json results = Json::parse(batched.body)["results"];
  EXPECT_EQ(results[0]["outcome"], "started");
  EXPECT_EQ(results[1]["outcome"], "duplicate");
  EXPECT_EQ(Get("/v1/instances")["items"].size(), 2u);

  // c1 runs to the approval; the approval arrives in binary mode, twice.
  ASSERT_EQ(Drive("c1"), InstanceState::kRunning);
  EXPECT_EQ(Approve("c1", "a1")["results"][0]["outcome"], "signalled");
  EXPECT_EQ(Approve("c1", "a1")["results"][0]["outcome"], "duplicate");
  Json approval = Step("c1", "approval");
  EXPECT_EQ(approval["state"], "completed");
  EXPECT_EQ(approval["attempts"], 1);
  EXPECT_EQ(Drive("c1"), InstanceState::kCompleted);
  EXPECT_EQ(recorder_.Count("/notify"), 1);
  auto summary = store_->Summary();
  EXPECT_EQ(summary->inbox_duplicates, 3);
}

TEST_P(ApiWriteTest, TheInboxIsPerTenantAndTheSameIdWithOtherDataIsAConflict) {
  auto send = [&](const std::string& token, const std::string& id, const Json& data) {
    const Json event = {{"specversion", "1.0"},
                        {"id", id},
                        {"source", "/shop"},
                        {"type", "com.acme.order.received"},
                        {"data", data}};
    return Send("POST", "/v1/events", token, event.dump(),
                {{"Content-Type", "application/cloudevents+json"}});
  };
  auto first = send(operator_, "e-7", {{"id", "n7"}});
  ASSERT_EQ(first.outcome.status, 200) << first.body;
  EXPECT_EQ(Json::parse(first.body)["results"][0]["outcome"], "started");
  // Another tenant, the same (source, id): its own instance, not a duplicate.
  auto other = send(operator_t2_, "e-7", {{"id", "n7"}});
  ASSERT_EQ(other.outcome.status, 200) << other.body;
  EXPECT_EQ(Json::parse(other.body)["results"][0]["outcome"], "started");
  EXPECT_TRUE(store_->FindInstance("t2", "n7").ok());
  EXPECT_EQ(Get("/v1/instances")["items"].size(), 1u);  // t1 sees only its own
  // The same tenant and id with other data: refused, never a duplicate, alerted.
  auto changed = send(operator_, "e-7", {{"id", "n8"}});
  ASSERT_EQ(changed.outcome.status, 409) << changed.body;
  const Json problem = Json::parse(changed.body);
  EXPECT_EQ(problem["type"], "urn:waystone:problem:inbox-conflict");
  EXPECT_NE(problem["detail"].get<std::string>().find("data hash"), std::string::npos);
  EXPECT_EQ(problem["results"][0]["outcome"], "conflict");
  EXPECT_TRUE(absl::IsNotFound(store_->FindInstance("t1", "n8").status()));
  Json alerts = Get("/v1/alerts");
  bool raised = false;
  for (const Json& alert : alerts["items"]) raised = raised || alert["kind"] == "inbox_conflict";
  EXPECT_TRUE(raised) << alerts.dump();
  // A signal redelivered with other data is a conflict too.
  ASSERT_EQ(Drive("n7"), InstanceState::kRunning);
  EXPECT_EQ(Approve("n7", "ap-7")["results"][0]["outcome"], "signalled");
  auto signal = Send("POST", "/v1/events", operator_, Json{{"order", "n7"}, {"note", "x"}}.dump(),
                     {{"ce-specversion", "1.0"},
                      {"ce-id", "ap-7"},
                      {"ce-source", "/approvals"},
                      {"ce-type", "com.acme.approved"},
                      {"Content-Type", "application/json"}});
  EXPECT_EQ(signal.outcome.status, 409) << signal.body;
}

// A sender that retries before its first try is answered: the same event over
// several connections at once. Every copy is answered 200; one signals and the rest
// are duplicates, never "no step waiting" (a copy that found its step moved on).
TEST_P(ApiWriteTest, TheSameEventSentConcurrentlySignalsOnceAndAnswersEveryCopy) {
  auto definition = LoadDefinitionText(R"(workflow: gate
key: "{{input.id}}"
steps:
  - name: approval
    wait: { event: com.acme.approved }
  - name: after
    transform: { ok: true }
)",
                                       "gate.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  ASSERT_TRUE(engine_->Register(*definition).ok());
  constexpr int kInstances = 12;
  constexpr int kCopies = 4;
  for (int i = 0; i < kInstances; ++i) {
    const std::string id = "race-" + std::to_string(i);
    Post("/v1/instances", {{"workflow", "gate"}, {"input", {{"id", id}}}}, 201);
    ASSERT_EQ(Drive(id), InstanceState::kRunning);
  }
  for (int i = 0; i < kInstances; ++i) {
    const std::string id = "race-" + std::to_string(i);
    std::vector<std::string> outcomes(kCopies);
    std::vector<std::thread> senders;
    for (int c = 0; c < kCopies; ++c) {
      senders.emplace_back([&, c] {
        const Json answer = Approve(id, "ap-" + id);  // expects 200
        outcomes[c] = answer.is_object() ? answer["results"][0].value("outcome", "") : "";
      });
    }
    for (std::thread& t : senders) t.join();
    std::sort(outcomes.begin(), outcomes.end());
    EXPECT_EQ(outcomes,
              (std::vector<std::string>{"duplicate", "duplicate", "duplicate", "signalled"}))
        << id;
    EXPECT_EQ(Drive(id), InstanceState::kCompleted) << id;
    EXPECT_EQ(Step(id, "approval")["external_id"], "ap-" + id);
  }
}

TEST_P(ApiWriteTest, AfterGcARedeliveredStartOrSignalChangesNothing) {
  auto start_event = Json{{"specversion", "1.0"},
                          {"id", "e-9"},
                          {"source", "/shop"},
                          {"type", "com.acme.order.received"},
                          {"data", {{"id", "g9"}}}};
  auto send_start = [&] {
    return Send("POST", "/v1/events", operator_, start_event.dump(),
                {{"Content-Type", "application/cloudevents+json"}});
  };
  ASSERT_EQ(send_start().outcome.status, 200);
  ASSERT_EQ(Drive("g9"), InstanceState::kRunning);
  EXPECT_EQ(Approve("g9", "ap-9")["results"][0]["outcome"], "signalled");
  ASSERT_EQ(Drive("g9"), InstanceState::kCompleted);
  const std::string order = Step("g9", "create")["external_id"];
  const std::string plain_hash = store_->FindInstance("t1", "g9")->input_hash;
  const int creates = recorder_.Count("/create");
  const int notifies = recorder_.Count("/notify");

  // The engine of this suite runs on the system clock.
  const Millis later = SystemClock::Get()->NowMillis() + 60'000;
  auto gc = store_->CollectGarbage(later, later, /*protect_before=*/0, /*dry_run=*/false);
  ASSERT_TRUE(gc.ok()) << gc.status();
  ASSERT_EQ(gc->instances, 1);
  EXPECT_EQ(gc->inbox_claims, 0);
  ASSERT_TRUE(absl::IsNotFound(store_->FindInstance("t1", "g9").status()));

  // The start event again: answered as existing from the tombstone; nothing runs.
  auto again = send_start();
  ASSERT_EQ(again.outcome.status, 200) << again.body;
  const Json result = Json::parse(again.body)["results"][0];
  EXPECT_EQ(result["outcome"], "duplicate");
  EXPECT_EQ(result["tombstone"]["final_state"], "completed");
  EXPECT_EQ(result["tombstone"]["external_ids"]["create"], order);
  // A start over the API for the same key: the same answer, no new instance.
  Json started = Post("/v1/instances", {{"workflow", "wf"}, {"input", {{"id", "g9"}}}}, 200);
  EXPECT_EQ(started["collected"], true);
  EXPECT_EQ(started["created"], false);
  // What gc kept of the input hash is keyed for a token without see_redacted (the
  // tombstone no longer says what its definition redacted); an admin of all tenants
  // sees it as stored.
  EXPECT_EQ(result["tombstone"]["input_hash"].get<std::string>().size(), 64u);
  EXPECT_NE(result["tombstone"]["input_hash"], plain_hash);
  EXPECT_EQ(started["tombstone"]["input_hash"], result["tombstone"]["input_hash"]);
  EXPECT_EQ(Post("/v1/instances", {{"workflow", "wf"}, {"tenant", "t1"}, {"input", {{"id", "g9"}}}},
                 200, admin_)["tombstone"]["input_hash"],
            plain_hash);
  // The signal again: a duplicate, not an error, though its instance is gone.
  EXPECT_EQ(Approve("g9", "ap-9")["results"][0]["outcome"], "duplicate");
  EXPECT_TRUE(absl::IsNotFound(store_->FindInstance("t1", "g9").status()));
  EXPECT_EQ(recorder_.Count("/create"), creates);
  EXPECT_EQ(recorder_.Count("/notify"), notifies);

  // Past the protection window the claims go too (and only then).
  gc = store_->CollectGarbage(0, later + 1, later + 1, /*dry_run=*/false);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->inbox_claims, 2);
  EXPECT_EQ(gc->tombstones, 1);
}

TEST_P(ApiWriteTest, MalformedEventsAreRefusedNamingTheProblem) {
  struct Bad {
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
    int status;
    std::string says;
  };
  const std::string ce = "application/cloudevents+json";
  const std::vector<Bad> cases = {
      {R"({"specversion":"1.0","id":"x","type":"com.acme.order.received","data":{"id":"m"}})",
       {{"Content-Type", ce}},
       400,
       "'source'"},
      {R"({"specversion":"0.3","id":"x","source":"/s","type":"com.acme.order.received"})",
       {{"Content-Type", ce}},
       400,
       "specversion"},
      {R"({"specversion":"1.0","id":"x","source":"/s","type":"com.acme.order.received",)",
       {{"Content-Type", ce}},
       400,
       "JSON"},
      {R"({"id":"m"})",
       {{"Content-Type", "application/json"},
        {"ce-specversion", "1.0"},
        {"ce-id", "x"},
        {"ce-source", "/s"}},
       400,
       "'type'"},
      {R"({"specversion":"1.0","id":"x","source":"/s","type":"com.acme.unknown"})",
       {{"Content-Type", ce}},
       422,
       "no route"},
      {R"({"specversion":"1.0","id":"x","source":"/s","type":"com.acme.order.received","data":[1]})",
       {{"Content-Type", ce}},
       400,
       "data must be a JSON object"},
      {R"({"specversion":"1.0","id":"x","source":"/s","type":"com.acme.approved","data":{}})",
       {{"Content-Type", ce}},
       400,
       "/order"},
      {R"({"specversion":"1.0","id":"x","source":"/s","type":"com.acme.approved","data":{"order":"zz"}})",
       {{"Content-Type", ce}},
       404,
       "zz"},
      {R"({"not":"a batch"})",
       {{"Content-Type", "application/cloudevents-batch+json"}},
       400,
       "array"},
      {R"([{"specversion":"1.0","id":"y","source":"/s","type":"com.acme.order.received","data":{"id":"n"}},{"specversion":"1.0","id":"z"}])",
       {{"Content-Type", "application/cloudevents-batch+json"}},
       400,
       "event 1"},
  };
  for (const Bad& c : cases) {
    auto response = Send("POST", "/v1/events", operator_, c.body, c.headers);
    EXPECT_EQ(response.outcome.status, c.status) << c.body << ": " << response.body;
    EXPECT_NE(response.body.find(c.says), std::string::npos) << response.body;
  }
  // Nothing was started, not even the good first event of the bad batch.
  EXPECT_TRUE(Get("/v1/instances")["items"].empty());
  EXPECT_FALSE(store_->LookupInbox("t1", "/s", "y")->has_value());
  EXPECT_FALSE(store_->LookupInbox("default", "/s", "y")->has_value());
}

TEST_P(ApiWriteTest, BadStartsAreProblemsAndStartNothing) {
  struct Bad {
    std::string body;
    int status;
  };
  const std::vector<Bad> cases = {
      {R"({"workflow":"wf","input":{"id":"b1"})", 400},             // malformed
      {R"({"workflow":"wf"})", 400},                                // no input
      {R"({"workflow":"wf","input":[1]})", 400},                    // input not an object
      {R"({"workflow":7,"input":{"id":"b1"}})", 400},               // wrong type
      {R"({"workflow":"nope","input":{"id":"b1"}})", 422},          // unknown definition
      {R"({"workflow":"wf","input":{"id":"b1"},"extra":1})", 400},  // unknown field
      {R"({"workflow":"wf","input":{"other":"b1"}})", 400},         // business key cannot be built
      {R"({"workflow":"wf","input":{"id":"b1"},"tenant":"t2"})", 403},  // another tenant
  };
  for (const Bad& c : cases) {
    auto response = Send("POST", "/v1/instances", operator_, c.body);
    EXPECT_EQ(response.outcome.status, c.status) << c.body << ": " << response.body;
    EXPECT_TRUE(Json::parse(response.body, nullptr, false).contains("type")) << response.body;
  }
  auto large =
      Send("POST", "/v1/instances", operator_,
           Json{{"workflow", "wf"}, {"input", {{"id", std::string(100 * 1024, 'x')}}}}.dump());
  EXPECT_EQ(large.outcome.status, 413);
  auto text =
      Send("POST", "/v1/instances", operator_, "workflow=wf", {{"Content-Type", "text/plain"}});
  EXPECT_EQ(text.outcome.status, 415);
  EXPECT_TRUE(Get("/v1/instances?tenant=t1", admin_)["items"].empty());
  EXPECT_TRUE(Get("/v1/instances?tenant=t2", admin_)["items"].empty());
}

TEST_P(ApiWriteTest, EveryWriteRouteForEveryCaller) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("w1"), InstanceState::kNeedsAttention);
  const std::string alert = Get("/v1/alerts?state=open")["items"][0]["id"];
  const std::string start = Json{{"workflow", "wf"}, {"input", {{"id", "w2"}}}}.dump();
  const std::string close = Json{{"reason", "r"}}.dump();
  const std::string event = Json{
      {"specversion", "1.0"},
      {"id", "ev"},
      {"source", "/s"},
      {"type", "com.acme.order.received"},
      {"data", {{"id", "w3"}}}}.dump();
  struct Case {
    std::string path;
    std::string body;
    std::string caller;
    int status;
  };
  const std::string ack = "/v1/alerts/" + alert + "/acknowledge?dry_run=true";
  const Json batch = {
      {"action", "close"}, {"reason", "r"}, {"filter", {{"state", "needs_attention"}}}};
  Json batch_in_t1 = batch;
  batch_in_t1["tenant"] = "t1";
  const std::string preview = "/v1/batches?dry_run=true";
  const std::string token = Json{{"name", "matrix"}, {"role", "viewer"}, {"tenant", "t1"}}.dump();
  const std::vector<Case> cases = {
      {preview, batch.dump(), "none", 401},
      {preview, batch.dump(), "bad", 401},
      {preview, batch.dump(), "viewer", 403},
      {preview, batch.dump(), "operator", 200},
      {preview, batch.dump(), "operator_t2", 200},  // its own tenant's: none
      {preview, batch.dump(), "admin", 400},        // must name a tenant
      {preview, batch_in_t1.dump(), "admin", 200},
      {preview, batch_in_t1.dump(), "operator_t2", 403},
      {"/v1/batches/nope/pause", "", "none", 401},
      {"/v1/batches/nope/pause", "", "viewer", 403},
      {"/v1/batches/nope/cancel", "", "operator", 404},
      {"/v1/instances", start, "none", 401},
      {"/v1/instances", start, "bad", 401},
      {"/v1/instances", start, "viewer", 403},
      {"/v1/instances", start, "operator", 201},
      {"/v1/instances", start, "operator_t2", 201},  // its own tenant's w2
      {"/v1/instances", start, "admin", 400},        // must name a tenant
      {"/v1/instances/w1/close?dry_run=true", close, "none", 401},
      {"/v1/instances/w1/close?dry_run=true", close, "bad", 401},
      {"/v1/instances/w1/close?dry_run=true", close, "viewer", 403},
      {"/v1/instances/w1/close?dry_run=true", close, "operator", 200},
      {"/v1/instances/w1/close?dry_run=true", close, "operator_t2", 404},
      {"/v1/instances/w1/close?dry_run=true", close, "admin", 400},
      {"/v1/instances/w1/close?dry_run=true&tenant=t1", close, "admin", 200},
      {ack, close, "none", 401},
      {ack, close, "viewer", 403},
      {ack, close, "operator", 200},
      {ack, close, "operator_t2", 404},
      {ack, close, "admin", 200},
      {"/v1/events", event, "none", 401},
      {"/v1/events", event, "bad", 401},
      {"/v1/events", event, "viewer", 403},
      {"/v1/events", event, "operator_t2", 200},
      {"/v1/events", event, "admin", 400},  // the event must name its tenant
      {"/v1/tokens", token, "none", 401},
      {"/v1/tokens", token, "bad", 401},
      {"/v1/tokens", token, "viewer", 403},
      {"/v1/tokens", token, "operator", 403},
      {"/v1/tokens", token, "operator_t2", 403},
      {"/v1/tokens", token, "admin", 201},
      {"/v1/tokens/matrix/revoke", close, "none", 401},
      {"/v1/tokens/matrix/revoke", close, "viewer", 403},
      {"/v1/tokens/matrix/revoke", close, "operator", 403},
      {"/v1/tokens/matrix/revoke", close, "admin", 200},
      {"/v1/tokens/matrix/revoke", close, "admin", 409},  // revoked already
  };
  for (const Case& c : cases) {
    const std::string token = TokenOf(c.caller);
    const bool is_event = c.path == "/v1/events";
    auto response = Send(
        "POST", c.path, token, c.body,
        is_event
            ? std::vector<std::pair<std::string, std::string>>{{"Content-Type",
                                                                "application/cloudevents+json"}}
            : std::vector<std::pair<std::string, std::string>>{});
    EXPECT_EQ(response.outcome.status, c.status)
        << c.path << " as " << c.caller << ": " << response.body;
    if (c.status >= 400) {
      EXPECT_EQ(Json::parse(response.body, nullptr, false)["status"], c.status) << response.body;
    }
  }
  // Every read route lets an operator and an admin read too.
  for (const std::string& token : {operator_, admin_}) {
    EXPECT_EQ(Send("GET", "/v1/instances", token).outcome.status, 200);
    EXPECT_EQ(Send("GET", "/v1/alerts", token).outcome.status, 200);
    EXPECT_EQ(Send("GET", "/v1/batches", token).outcome.status, 200);
  }
  EXPECT_EQ(Send("GET", "/v1/batches", "").outcome.status, 401);
  EXPECT_EQ(Send("GET", "/v1/openapi.json", "").outcome.status, 200);
}

// Decisions and revisions over the API: who may send them (route role, then the
// step's own approvers, then the tenant), each refusal a problem+json with its status.
TEST_P(ApiWriteTest, TheRoleAndTenantMatrixCoversDecisionsAndRevisions) {
  auto approval = LoadDefinitionText(R"(workflow: appr
key: "{{input.id}}"
steps:
  - name: approve
    approval: { material: [/amount], approvers: { role: operator } }
)",
                                     "appr.yaml");
  ASSERT_TRUE(approval.ok()) << approval.status();
  ASSERT_TRUE(engine_->Register(*approval).ok());
  for (const char* id : {"a1", "a2", "a3"}) {
    Post("/v1/instances", {{"workflow", "appr"}, {"input", {{"id", id}, {"amount", 5}}}}, 201,
         intake_);
    ASSERT_EQ(Drive(id), InstanceState::kRunning);
  }
  const Json open = Get("/v1/instances/a1")["approvals"][0];
  ASSERT_EQ(open["state"], "waiting") << open.dump();
  auto decide = [&](const char* decision) {
    return Json{{"step", "approve"},
                {"request", 1},
                {"data_version", open["data_version"]},
                {"decision", decision}}
        .dump();
  };
  const std::string revise =
      Json{{"input", {{"id", "x"}, {"amount", 6}}}, {"reason", "the amount changed"}}.dump();
  struct Case {
    std::string path;
    std::string body;
    std::string caller;
    int status;
  };
  const std::vector<Case> cases = {
      {"/v1/instances/a1/decide", decide("approve"), "none", 401},
      {"/v1/instances/a1/decide", decide("approve"), "bad", 401},
      {"/v1/instances/a1/decide", decide("approve"), "viewer", 403},       // the step's role
      {"/v1/instances/a1/decide", decide("approve"), "operator_t2", 404},  // another tenant's
      {"/v1/instances/a1/decide", decide("approve"), "admin", 400},        // must name a tenant
      {"/v1/instances/a1/decide", "{\"step\": \"approve\"}", "operator", 400},
      {"/v1/instances/a1/decide", decide("approve"), "operator", 200},
      {"/v1/instances/a1/decide", decide("reject"), "operator", 409},  // decided already
      {"/v1/instances/a2/decide?tenant=t1", decide("reject"), "admin", 200},
      {"/v1/instances/a3/revise", revise, "none", 401},
      {"/v1/instances/a3/revise", revise, "viewer", 403},
      {"/v1/instances/a3/revise", revise, "operator_t2", 404},
      {"/v1/instances/a3/revise", revise, "admin", 400},
      {"/v1/instances/a3/revise", "{\"input\": {}}", "operator", 400},  // no reason
      {"/v1/instances/a3/revise", revise, "operator", 200},
      {"/v1/instances/a1/revise", revise, "operator", 409},  // approved on the old amount
  };
  for (const Case& c : cases) {
    const std::string token = TokenOf(c.caller);
    auto response = Send("POST", c.path, token, c.body);
    EXPECT_EQ(response.outcome.status, c.status)
        << c.path << " as " << c.caller << ": " << response.body;
    if (c.status >= 400) {
      EXPECT_EQ(Json::parse(response.body, nullptr, false)["status"], c.status) << response.body;
    }
  }
  // What they did: a1 approved by op1, a2 rejected by root, a3 asked again on 6.
  EXPECT_EQ(Get("/v1/instances/a1")["approvals"][0]["decision"]["by"], "op1");
  EXPECT_EQ(Get("/v1/instances/a2")["state"], "failed");  // nothing before it to undo
  const Json a3 = Get("/v1/instances/a3");
  EXPECT_EQ(a3["input"]["amount"], 6);
  EXPECT_EQ(a3["approvals"][0]["state"], "pending");  // the next drive asks again
  EXPECT_EQ(a3["approvals"][0]["next_request"], 2);
}

// A decision sent while its step still waits behind an earlier one is kept for that
// step's request of that instance only; two approvers at the same moment: one wins.
TEST_P(ApiWriteTest, ADecisionBeforeTheRequestIsKeptForItsInstanceAndTwoAtOnceMakeOne) {
  auto early = LoadDefinitionText(R"(workflow: early
key: "{{input.id}}"
steps:
  - name: stock
    wait: { event: com.acme.stock }
  - name: approve
    approval: { material: [/amount], approvers: { role: operator } }
)",
                                  "early.yaml");
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_TRUE(engine_->Register(*early).ok());
  for (const char* id : {"e1", "e2", "e3"}) {
    Post("/v1/instances", {{"workflow", "early"}, {"input", {{"id", id}, {"amount", 5}}}}, 201,
         intake_);
    ASSERT_EQ(Drive(id), InstanceState::kRunning);
  }
  const Json ahead = Get("/v1/instances/e1")["approvals"][0];
  ASSERT_EQ(ahead["state"], "pending") << ahead.dump();
  ASSERT_EQ(ahead["next_request"], 1);
  // e1 and e2 have the same amount, so the same data version: the decision still
  // belongs to e1 alone.
  EXPECT_EQ(Get("/v1/instances/e2")["approvals"][0]["data_version"], ahead["data_version"]);
  const Json early_body = {{"step", "approve"},
                           {"data_version", ahead["data_version"]},
                           {"decision", "approve"},
                           {"comment", "pre-approved"}};
  Post("/v1/instances/e1/decide", early_body, 200);
  EXPECT_EQ(Get("/v1/instances/e1")["approvals"][0]["early_decision"]["by"], "op1");
  for (const char* id : {"e1", "e2"}) {
    Signal signal{"t1", id, "com.acme.stock", "/stock", std::string("s-") + id, "{}", "test"};
    ASSERT_TRUE(engine_->operations().Deliver(signal).ok());
  }
  EXPECT_EQ(Drive("e1"), InstanceState::kCompleted);
  EXPECT_EQ(Get("/v1/instances/e1")["approvals"][0]["decision"]["before_request"], true);
  EXPECT_EQ(Drive("e2"), InstanceState::kRunning);
  EXPECT_EQ(Get("/v1/instances/e2")["approvals"][0]["state"], "waiting");

  // Two approvers on e2 at the same moment, over two connections.
  const Json open = Get("/v1/instances/e2")["approvals"][0];
  const std::string op_b = *CreateToken(*store_, "op1b", "t1", Role::kOperator, 1);
  std::vector<int> statuses(2);
  std::vector<std::thread> approvers;
  for (int i = 0; i < 2; ++i) {
    approvers.emplace_back([&, i] {
      const Json body = {{"step", "approve"},
                         {"request", open["request"]},
                         {"data_version", open["data_version"]},
                         {"decision", i == 0 ? "approve" : "reject"}};
      statuses[i] = Send("POST", "/v1/instances/e2/decide", i == 0 ? operator_ : op_b, body.dump())
                        .outcome.status;
    });
  }
  for (std::thread& t : approvers) t.join();
  std::vector<int> sorted = statuses;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{200, 409}));
  const Json e2 = Get("/v1/instances/e2");
  EXPECT_EQ(e2["approvals"][0]["decision"]["by"], statuses[0] == 200 ? "op1" : "op1b");
  int decided = 0, refused = 0;
  for (const Json& a : e2["audit"]) {
    decided += a["action"] == "decide";
    refused += a["action"] == "decision_refused";
  }
  EXPECT_EQ(decided, 1);
  EXPECT_EQ(refused, 1);
  // e3 never had a decision: its approval, once open, waits.
  Signal stock{"t1", "e3", "com.acme.stock", "/stock", "s-e3", "{}", "test"};
  ASSERT_TRUE(engine_->operations().Deliver(stock).ok());
  EXPECT_EQ(Drive("e3"), InstanceState::kRunning);
}

// Decisions and revisions carried by CloudEvents (event routes decide: and revise:):
// claimed in the inbox with their effect, so a redelivery does nothing again.
TEST_P(ApiWriteTest, DecisionsAndRevisionsArriveAsEventsOnce) {
  auto approval = LoadDefinitionText(R"(workflow: appr
key: "{{input.id}}"
steps:
  - name: approve
    approval: { material: [/amount], approvers: { role: operator } }
)",
                                     "appr.yaml");
  ASSERT_TRUE(approval.ok()) << approval.status();
  ASSERT_TRUE(engine_->Register(*approval).ok());
  Post("/v1/instances", {{"workflow", "appr"}, {"input", {{"id", "ev1"}, {"amount", 5}}}}, 201,
       intake_);
  ASSERT_EQ(Drive("ev1"), InstanceState::kRunning);
  // Revisions come from the CRM (intake), decisions from the approval portal (op1).
  auto send = [&](const std::string& type, const std::string& id, const Json& data) {
    const bool revision = type.ends_with(".revised");
    auto response = Send("POST", "/v1/events", revision ? intake_ : operator_, data.dump(),
                         {{"ce-specversion", "1.0"},
                          {"ce-id", id},
                          {"ce-source", "/crm"},
                          {"ce-type", type},
                          {"Content-Type", "application/json"}});
    Json body = Json::parse(response.body, nullptr, false);
    return std::make_pair(response.outcome.status, body);
  };
  const Json revision = {{"order", "ev1"},
                         {"input", {{"id", "ev1"}, {"amount", 8}}},
                         {"reason", "amount corrected in the CRM"}};
  auto [revised_status, revised] = send("com.acme.order.revised", "r-1", revision);
  ASSERT_EQ(revised_status, 200) << revised.dump();
  EXPECT_EQ(revised["results"][0]["outcome"], "revised");
  auto [again_status, again] = send("com.acme.order.revised", "r-1", revision);
  ASSERT_EQ(again_status, 200) << again.dump();
  EXPECT_EQ(again["results"][0]["outcome"], "duplicate");
  ASSERT_EQ(Drive("ev1"), InstanceState::kRunning);  // asked again on 8
  const Json open = Get("/v1/instances/ev1")["approvals"][0];
  ASSERT_EQ(open["request"], 2) << open.dump();
  EXPECT_EQ(open["snapshot"]["fields"]["/amount"], 8);

  const Json decision = {{"order", "ev1"},        {"step", "approve"},
                         {"request", 2},          {"data_version", open["data_version"]},
                         {"decision", "approve"}, {"comment", "from the approval portal"}};
  auto [decided_status, decided] = send("com.acme.order.decided", "d-1", decision);
  ASSERT_EQ(decided_status, 200) << decided.dump();
  EXPECT_EQ(decided["results"][0]["outcome"], "decided");
  auto [redelivered_status, redelivered] = send("com.acme.order.decided", "d-1", decision);
  ASSERT_EQ(redelivered_status, 200) << redelivered.dump();
  EXPECT_EQ(redelivered["results"][0]["outcome"], "duplicate");
  // The same event id with other data is never a duplicate: refused, with an alert.
  Json changed = decision;
  changed["comment"] = "edited";
  auto [conflict_status, conflict] = send("com.acme.order.decided", "d-1", changed);
  EXPECT_EQ(conflict_status, 409) << conflict.dump();
  // A decision event that the step refuses: its problem, and the event is not applied.
  Json other = decision;
  other["decision"] = "reject";
  auto [refused_status, refused] = send("com.acme.order.decided", "d-2", other);
  EXPECT_EQ(refused_status, 409) << refused.dump();
  EXPECT_EQ(refused["results"][0]["outcome"], "failed");
  EXPECT_EQ(Drive("ev1"), InstanceState::kCompleted);
  const Json view = Get("/v1/instances/ev1");
  int decides = 0, revises = 0;
  for (const Json& a : view["audit"]) {
    decides += a["action"] == "decide";
    revises += a["action"] == "revise";
  }
  EXPECT_EQ(decides, 1);
  EXPECT_EQ(revises, 1);
  EXPECT_EQ(view["approvals"][0]["decision"]["by"], "op1");
  for (const Json& a : view["audit"]) {
    if (a["action"] == "decide") {
      EXPECT_EQ(a["detail"]["event"], (Json{{"source", "/crm"}, {"id", "d-1"}})) << a.dump();
    }
  }
  bool inbox_conflict = false;
  for (const Json& alert : view["alerts"]) inbox_conflict |= alert["kind"] == "inbox_conflict";
  EXPECT_TRUE(inbox_conflict) << view["alerts"].dump();
}

// What a definition's redact: list hides stays hidden in an approval's snapshot; the
// permission to revise is narrowed like any other.
TEST_P(ApiWriteTest, ApprovalSnapshotsHideRedactedFieldsAndRevisionsNeedTheirPermission) {
  auto approval = LoadDefinitionText(R"(workflow: apprx
key: "{{input.id}}"
redact: [/customer/phone, /salary]
steps:
  - name: approve
    approval: { material: [/customer, /salary, /amount] }
)",
                                     "apprx.yaml");
  ASSERT_TRUE(approval.ok()) << approval.status();
  ASSERT_TRUE(engine_->Register(*approval).ok());
  const Json input = {{"id", "x1"},
                      {"amount", 5},
                      {"salary", 91000},
                      {"customer", {{"name", "Aiko"}, {"phone", "+81-90-1234-5678"}}}};
  Post("/v1/instances", {{"workflow", "apprx"}, {"input", input}}, 201);
  ASSERT_EQ(Drive("x1"), InstanceState::kRunning);
  const auto viewed = Send("GET", "/v1/instances/x1", viewer_);
  ASSERT_EQ(viewed.outcome.status, 200);
  EXPECT_EQ(viewed.body.find("1234-5678"), std::string::npos) << viewed.body;
  EXPECT_EQ(viewed.body.find("91000"), std::string::npos) << viewed.body;
  const Json fields = Json::parse(viewed.body)["approvals"][0]["snapshot"]["fields"];
  EXPECT_EQ(fields["/customer"]["phone"], "[redacted]") << fields.dump();
  EXPECT_EQ(fields["/customer"]["name"], "Aiko");
  EXPECT_EQ(fields["/salary"], "[redacted]");
  EXPECT_EQ(fields["/amount"], 5);
  const Json full = Get("/v1/instances/x1?tenant=t1", admin_)["approvals"][0]["snapshot"]["fields"];
  EXPECT_EQ(full["/customer"]["phone"], "+81-90-1234-5678");

  const std::string revise =
      Json{{"input", {{"id", "x1"}, {"amount", 6}}}, {"reason", "the amount changed"}}.dump();
  Restart({PermissionRule{Role::kOperator, "t1", {Permission::kRetry}, 1}});
  const auto refused = Send("POST", "/v1/instances/x1/revise", operator_, revise);
  EXPECT_EQ(refused.outcome.status, 403) << refused.body;
  EXPECT_NE(refused.body.find("revise"), std::string::npos) << refused.body;
  Restart({});
  EXPECT_EQ(Send("POST", "/v1/instances/x1/revise", operator_, revise).outcome.status, 200);
}

TEST_P(ApiWriteTest, ListsArePagedAndFiltered) {
  recorder_.Answer("/charge", 422);
  for (const char* id : {"p1", "p2", "p3"})
    ASSERT_EQ(StartAndDrive(id), InstanceState::kNeedsAttention);
  recorder_.Answer("/charge", 200);
  for (const char* id : {"p4", "p5"}) ASSERT_EQ(StartAndDrive(id), InstanceState::kRunning);
  std::vector<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    Json page = Get("/v1/instances?limit=2" + (cursor.empty() ? "" : "&cursor=" + cursor));
    for (const Json& item : page["items"]) seen.push_back(item["key"]);
    cursor = page["next_cursor"].is_null() ? "" : page["next_cursor"].get<std::string>();
    ++pages;
  } while (!cursor.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"p1", "p2", "p3", "p4", "p5"}));
  EXPECT_EQ(Get("/v1/instances?state=needs_attention")["items"].size(), 3u);
  EXPECT_EQ(Get("/v1/instances?error_class=rejected")["items"].size(), 3u);
  EXPECT_EQ(Get("/v1/instances?alert=any")["items"].size(), 3u);
  EXPECT_EQ(Get("/v1/instances?alert=needs_operator")["items"].size(), 3u);
  EXPECT_EQ(Get("/v1/instances?alert=compensation_failed")["items"].size(), 0u);
  EXPECT_EQ(Get("/v1/instances?created_after=2999-01-01T00:00:00Z")["items"].size(), 0u);
  EXPECT_EQ(Get("/v1/instances?created_before=2999-01-01T00:00:00%2B09:00")["items"].size(), 5u);
  EXPECT_EQ(Send("GET", "/v1/instances?created_after=yesterday", viewer_).outcome.status, 400);
  EXPECT_EQ(Send("GET", "/v1/instances?cursor=abc", viewer_).outcome.status, 400);
  EXPECT_EQ(Send("GET", "/v1/instances?error_class=none", viewer_).outcome.status, 400);
}

TEST_P(ApiWriteTest, MetricsPassPromtool) {
  recorder_.Answer("/charge", 504);
  ASSERT_EQ(StartAndDrive("m1"), InstanceState::kNeedsAttention);
  EXPECT_EQ(Send("GET", "/metrics", "").outcome.status, 401);
  auto metrics = Send("GET", "/metrics", admin_);
  ASSERT_EQ(metrics.outcome.status, 200);
  for (const char* series :
       {"waystone_step_attempts_total", "waystone_step_outcomes",
        "waystone_step_calls_total{phase=\"call\",class=\"unknown\"}",
        "waystone_unknown_resolutions_total", "waystone_lease_takeovers_total",
        "waystone_inbox_duplicates_total", "waystone_step_duration_seconds_bucket",
        "waystone_compensations_total", "waystone_open_alerts"}) {
    EXPECT_NE(metrics.body.find(series), std::string::npos) << series;
  }
  testing::WriteFile(dir_.File("metrics.txt"), metrics.body);
  auto check = testing::RunProcess(
      {"/bin/sh", "-c", "exec /usr/bin/promtool check metrics < \"$0\"", dir_.File("metrics.txt")},
      {}, dir_.path());
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

TEST_P(ApiWriteTest, AWaitWithADeadlineFailsWhenNoEventCame) {
  auto definition = LoadDefinitionText(R"(workflow: short
key: "{{input.id}}"
steps:
  - name: approval
    wait: { event: com.acme.approved, timeout: 1s }
)",
                                       "short.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  ASSERT_TRUE(engine_->Register(*definition).ok());
  Post("/v1/instances", {{"workflow", "short"}, {"input", {{"id", "d1"}}}}, 201);
  EXPECT_EQ(Drive("d1"), InstanceState::kFailed);
  Json approval = Step("d1", "approval");
  EXPECT_EQ(approval["state"], "failed");
  EXPECT_NE(
      approval["error_message"].get<std::string>().find("no event of type "
                                                        "'com.acme.approved' arrived within 1s"),
      std::string::npos)
      << approval.dump();
  // A late event changes nothing.
  Approve("d1", "late-1", 409);
}

TEST_P(ApiWriteTest, AnEventBeforeTheDeadlineIsSeenByADriverWaitingForIt) {
  auto definition = LoadDefinitionText(R"(workflow: long
key: "{{input.id}}"
steps:
  - name: approval
    wait: { event: com.acme.approved, timeout: 60s }
  - name: after
    transform: { by: "{{steps.approval.response.by}}" }
)",
                                       "long.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  ASSERT_TRUE(engine_->Register(*definition).ok());
  Post("/v1/instances", {{"workflow", "long"}, {"input", {{"id", "e1"}}}}, 201);
  const auto started = std::chrono::steady_clock::now();
  std::thread approve([&] {
    // Once the driver waits for it: the step is committed waiting.
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          auto instance = store_->FindInstance("t1", "e1");
          auto steps = instance.ok() ? store_->GetSteps(instance->id) : absl::NotFoundError("e1");
          return steps.ok() && steps->size() == 2 && (*steps)[0].state == StepState::kWaiting;
        },
        std::chrono::seconds(15)));
    auto response =
        Send("POST", "/v1/events", operator_, Json{{"order", "e1"}, {"by", "mika"}}.dump(),
             {{"ce-specversion", "1.0"},
              {"ce-id", "early-1"},
              {"ce-source", "/a"},
              {"ce-type", "com.acme.approved"},
              {"Content-Type", "application/json"}});
    EXPECT_EQ(response.outcome.status, 200) << response.body;
  });
  EXPECT_EQ(Drive("e1"), InstanceState::kCompleted);
  approve.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
  EXPECT_EQ(Step("e1", "approval")["external_id"], "early-1");
}

TEST_P(ApiWriteTest, SearchByExternalIdAndKeyPrefixPagesOnTheServer) {
  // Each create answers a fresh id (X-1, X-2, …): the recorder's, read back per instance.
  for (const char* id : {"ord-1", "ord-2", "ord-3", "other-1"}) {
    ASSERT_EQ(StartAndDrive(id), InstanceState::kRunning);  // waits for approval
  }
  const std::string erp_id = Step("ord-2", "create")["external_id"];
  ASSERT_TRUE(erp_id.starts_with("X-")) << erp_id;
  Json found = Get("/v1/instances?external_id=" + erp_id);
  ASSERT_EQ(found["items"].size(), 1u) << found.dump();
  EXPECT_EQ(found["items"][0]["key"], "ord-2");
  EXPECT_EQ(Get("/v1/instances?external_id=X-999")["items"].size(), 0u);
  // Another tenant's token finds nothing under the same id.
  EXPECT_EQ(Get("/v1/instances?external_id=" + erp_id, operator_t2_)["items"].size(), 0u);
  EXPECT_EQ(Send("GET", "/v1/instances?external_id=", viewer_).outcome.status, 400);

  std::vector<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    Json page =
        Get("/v1/instances?key_prefix=ord-&limit=1" + (cursor.empty() ? "" : "&cursor=" + cursor));
    for (const Json& item : page["items"]) seen.push_back(item["key"]);
    cursor = page["next_cursor"].is_null() ? "" : page["next_cursor"].get<std::string>();
    ++pages;
  } while (!cursor.empty() && pages < 10);
  EXPECT_EQ(seen, (std::vector<std::string>{"ord-1", "ord-2", "ord-3"}));
  EXPECT_EQ(Get("/v1/instances?key_prefix=other-")["items"].size(), 1u);
  // Both at once, and with the other filters.
  EXPECT_EQ(Get("/v1/instances?key_prefix=ord-&external_id=" + erp_id)["items"].size(), 1u);
  EXPECT_EQ(Get("/v1/instances?key_prefix=other-&external_id=" + erp_id)["items"].size(), 0u);
  EXPECT_EQ(Get("/v1/instances?key_prefix=ord-&state=completed")["items"].size(), 0u);
}

TEST_P(ApiWriteTest, ListFiltersByStepStateHttpStatusUpdatedAndDefinitionAndRefusesBadOnes) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("flt-1"), InstanceState::kNeedsAttention);  // the charge refused
  recorder_.Answer("/charge", 200);
  ASSERT_EQ(StartAndDrive("flt-2"), InstanceState::kRunning);  // waits for approval
  auto keys = [&](const std::string& query) {
    std::vector<std::string> out;
    const Json page = Get("/v1/instances?" + query);
    for (const Json& item : page["items"]) out.push_back(item["key"]);
    return out;
  };
  using Keys = std::vector<std::string>;
  EXPECT_EQ(keys("http_status=422"), Keys{"flt-1"});
  EXPECT_EQ(keys("http_status=503"), Keys{});
  EXPECT_EQ(keys("step=charge&step_state=completed"), Keys{"flt-2"});
  EXPECT_EQ(keys("step=charge&http_status=422&step_state=failed"), Keys{"flt-1"});
  EXPECT_EQ(keys("step=approval&step_state=waiting"), Keys{"flt-2"});
  const std::string hash = Get("/v1/instances/flt-1")["definition_hash"];
  EXPECT_EQ(keys("definition=" + hash.substr(0, 12)), (Keys{"flt-1", "flt-2"}));
  EXPECT_EQ(keys("definition=ffffffffffff"), Keys{});
  EXPECT_EQ(keys("updated_after=2000-01-01T00:00:00Z&updated_before=2999-01-01T00:00:00Z"),
            (Keys{"flt-1", "flt-2"}));
  EXPECT_EQ(keys("updated_before=2000-01-01T00:00:00Z"), Keys{});
  for (const char* bad : {"step_state=sleeping", "http_status=99", "http_status=5x",
                          "definition=xyz", "definition=abc", "updated_after=yesterday", "step="}) {
    auto response = Send("GET", std::string("/v1/instances?") + bad, viewer_);
    EXPECT_EQ(response.outcome.status, 400) << bad << ": " << response.body;
    EXPECT_NE(response.body.find("\"detail\""), std::string::npos) << response.body;
  }
}

TEST_P(ApiWriteTest, ADryRunRendersOnlyWhatTheInstanceViewShows) {
  auto definition = LoadDefinitionText(R"(
workflow: shown
key: "{{input.id}}"
steps:
  - name: first
    recovery: manual
    request: { method: POST, url: "{{env.REC_URL}}/charge/{{input.id}}", timeout: 2s }
    retry: { max_attempts: 1 }
  - name: with-secret
    request: { method: GET, url: "{{env.REC_URL}}/read?t={{secret.TOKEN}}", timeout: 2s }
  - name: with-response
    recovery: manual
    request: { method: POST, url: "{{env.REC_URL}}/b/{{steps.with-secret.response.id}}", timeout: 2s }
  - name: env-inside
    recovery: manual
    request: { method: POST, url: "{{env.REC_URL}}/c?back={{env.CRED_URL}}", timeout: 2s }
  - name: credential-base
    recovery: manual
    request: { method: POST, url: "{{env.CRED_URL}}/d/{{instance.key}}", timeout: 2s }
)",
                                       "shown.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  ASSERT_TRUE(engine_->Register(*definition).ok());
  recorder_.Answer("/charge", 422);
  Post("/v1/instances", {{"workflow", "shown"}, {"input", {{"id", "sh-1"}}}}, 201);
  ASSERT_EQ(Drive("sh-1"), InstanceState::kNeedsAttention);
  Json dry = Post("/v1/instances/sh-1/retry?dry_run=true",
                  {{"step", "first"}, {"reason", "what would be sent"}}, 200);
  std::map<std::string, Json> by_step;
  for (const Json& call : dry["would_execute"]) by_step[call["step"]] = call;
  ASSERT_EQ(by_step.size(), 5u) << dry.dump();
  EXPECT_EQ(by_step["first"]["rendered_url"], recorder_.url() + "/charge/sh-1");
  for (const char* hidden : {"with-secret", "with-response", "env-inside"}) {
    EXPECT_FALSE(by_step[hidden].contains("rendered_url")) << hidden << ": " << dry.dump();
    EXPECT_TRUE(by_step[hidden].contains("url")) << "the template is still shown";
  }
  EXPECT_EQ(by_step["credential-base"]["rendered_url"], "http://127.0.0.1:9/d/sh-1");
  EXPECT_EQ(dry.dump().find("svc:pw"), std::string::npos) << dry.dump();
}

TEST_P(ApiWriteTest, ViewsCarryAnETagAndAnUnchangedOneIsA304WithoutBody) {
  ASSERT_EQ(StartAndDrive("tag-1"), InstanceState::kRunning);  // waits for approval
  auto get = [&](const std::string& path, const std::string& etag) {
    std::string raw = "GET " + path + " HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + viewer_ +
                      "\r\nConnection: close\r\n";
    if (!etag.empty()) raw += "If-None-Match: " + etag + "\r\n";
    return server_->ServeBytesForTest(raw + "\r\n");
  };
  auto etag_of = [](const std::string& response) {
    const size_t at = response.find("ETag: ");
    if (at == std::string::npos) return std::string();
    return response.substr(at + 6, response.find("\r\n", at) - at - 6);
  };
  for (const std::string path : {"/v1/instances/tag-1", "/v1/instances", "/v1/triage"}) {
    const std::string first = get(path, "");
    ASSERT_TRUE(first.starts_with("HTTP/1.1 200")) << first;
    const std::string etag = etag_of(first);
    // Triage's tag leaves out its "at", so it is weak: two answers with it differ in that.
    const bool weak = path == "/v1/triage";
    ASSERT_EQ(etag.size(), weak ? 36u : 34u) << first;
    const std::string opaque = weak ? etag.substr(2) : etag;
    EXPECT_NE(first.find("Cache-Control: no-store"), std::string::npos) << first;
    EXPECT_NE(first.find("Vary: Authorization"), std::string::npos) << first;
    clock_.Advance(61'000);  // a minute on: "at" moves, nothing else does
    EXPECT_EQ(etag_of(get(path, "")), etag) << "the same view, the same tag";
    const std::string unchanged = get(path, etag);
    EXPECT_TRUE(unchanged.starts_with("HTTP/1.1 304")) << unchanged;
    EXPECT_EQ(unchanged.substr(unchanged.find("\r\n\r\n") + 4), "") << "a 304 has no body";
    EXPECT_NE(unchanged.find("ETag: " + etag), std::string::npos) << unchanged;
    EXPECT_TRUE(get(path, "W/" + opaque).starts_with("HTTP/1.1 304")) << "weak comparison";
    EXPECT_TRUE(get(path, "\"other\", " + opaque).starts_with("HTTP/1.1 304")) << "a list";
    EXPECT_TRUE(get(path, "*").starts_with("HTTP/1.1 304"));
    EXPECT_TRUE(get(path, "\"other\"").starts_with("HTTP/1.1 200"));
    // A tag inside another is not that tag.
    EXPECT_TRUE(get(path, "\"x" + opaque.substr(1)).starts_with("HTTP/1.1 200"));
    EXPECT_TRUE(get(path, "\"*\"").starts_with("HTTP/1.1 200"));
  }
  const std::string before = etag_of(get("/v1/instances/tag-1", ""));
  Approve("tag-1", "tag-approval");
  ASSERT_EQ(Drive("tag-1"), InstanceState::kCompleted);
  const std::string changed = get("/v1/instances/tag-1", before);
  EXPECT_TRUE(changed.starts_with("HTTP/1.1 200")) << "a changed view is sent again: " << changed;
  EXPECT_NE(etag_of(changed), before);
}

TEST_P(ApiWriteTest, AttemptsArePagedNewestFirstPerInstanceAndStep) {
  recorder_.Answer("/charge", 422);
  const size_t before = recorder_.Calls().size();
  ASSERT_EQ(StartAndDrive("att-1"), InstanceState::kNeedsAttention);
  const std::vector<Recorder::Call> received = recorder_.Since(before);  // read, create, charge
  ASSERT_EQ(received.size(), 3u);
  Json all = Get("/v1/attempts?key=att-1");
  EXPECT_EQ(all["total"], 3);
  ASSERT_EQ(all["items"].size(), 3u);
  EXPECT_TRUE(all["next_cursor"].is_null());
  // Newest first: what the recorder received, in reverse.
  EXPECT_EQ(all["items"][0]["step"], "charge");
  EXPECT_EQ(all["items"][0]["status"], 422);
  EXPECT_EQ(all["items"][0]["error_class"], "rejected");
  EXPECT_EQ(all["items"][1]["step"], "create");
  EXPECT_EQ(all["items"][2]["step"], "read");
  EXPECT_EQ(all["items"][2]["status"], 200);
  EXPECT_EQ(all["items"][2]["sent"], true);
  // One at a time, the same order, and the cursor ends.
  std::vector<Json> paged;
  std::string cursor;
  for (int page = 0; page < 5; ++page) {
    Json one = Get("/v1/attempts?key=att-1&limit=1" + (cursor.empty() ? "" : "&cursor=" + cursor));
    for (const Json& item : one["items"]) paged.push_back(item);
    if (one["next_cursor"].is_null()) break;
    cursor = one["next_cursor"];
  }
  EXPECT_EQ(Json(paged), all["items"]);
  Json create = Get("/v1/attempts?key=att-1&step=create");
  ASSERT_EQ(create["items"].size(), 1u);
  EXPECT_EQ(create["items"][0]["phase"], "call");
  EXPECT_EQ(create["total"], 1);
  EXPECT_EQ(create["dropped"], 0);
  // Each names the worker and lease epoch it was sent under: this engine's.
  for (const Json& item : all["items"]) {
    EXPECT_EQ(item["worker"], engine_->owner());
    EXPECT_TRUE(item["lease_epoch"].is_number_integer() && item["lease_epoch"] > 0) << item.dump();
    EXPECT_TRUE(item["latency_ms"].is_number_integer()) << item.dump();
  }
  // The instance view carries each step's newest requests and the counts.
  Json view = Get("/v1/instances/att-1");
  EXPECT_EQ(view["steps"][1]["requests"].size(), 1u);
  EXPECT_EQ(view["steps"][1]["requests_total"], 1);
  EXPECT_EQ(view["steps"][1]["requests_dropped"], 0);
  EXPECT_EQ(view["steps"][1]["requests"][0]["worker"], engine_->owner());
  EXPECT_EQ(Send("GET", "/v1/attempts?key=att-1&step=nope", viewer_).outcome.status, 400);
  EXPECT_EQ(Send("GET", "/v1/attempts", viewer_).outcome.status, 400);
  // A cursor or limit this server did not make is a problem+json 400 that names it.
  const std::string other_cursor = HexOf("1\n2");  // an older server's (step, seq) form
  for (const std::string& bad :
       {std::string("cursor=zz"), "cursor=" + other_cursor, "cursor=" + HexOf("1\n2\n3\n4"),
        "cursor=" + HexOf("x\n0\n1"), std::string("limit=0"), std::string("limit=1001"),
        std::string("limit=ten")}) {
    auto refused = Send("GET", "/v1/attempts?key=att-1&" + bad, viewer_);
    EXPECT_EQ(refused.outcome.status, 400) << bad;
    Json problem = Json::parse(refused.body, nullptr, false);
    EXPECT_EQ(problem.value("status", 0), 400) << bad << ": " << refused.body;
    EXPECT_NE(problem.value("detail", "").find(bad.starts_with("cursor") ? "cursor" : "limit"),
              std::string::npos)
        << refused.body;
    EXPECT_TRUE(problem["type"].is_string()) << refused.body;  // RFC 9457's members
  }
  // Another tenant's instance is as missing as one that is not there.
  EXPECT_EQ(Send("GET", "/v1/attempts?key=att-1", operator_t2_).outcome.status, 404);
  EXPECT_EQ(Send("GET", "/v1/attempts?key=nobody", viewer_).outcome.status, 404);
}

TEST_P(ApiWriteTest, TriageSaysWhyAndWhatMayFollowAsTheActionsDo) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("t-refused"), InstanceState::kNeedsAttention);
  recorder_.Answer("/charge", 200);
  ASSERT_EQ(StartAndDrive("t-waiting"), InstanceState::kRunning);
  Json triage = Get("/v1/triage", operator_);
  std::map<std::string, Json> groups;
  for (const Json& g : triage["groups"]) groups[g["reason"]] = g;
  ASSERT_EQ(groups["needs_operator"]["count"], 1) << triage.dump();
  ASSERT_EQ(groups["waiting_for_event"]["count"], 1) << triage.dump();
  const Json refused = groups["needs_operator"]["items"][0];
  EXPECT_EQ(refused["key"], "t-refused");
  EXPECT_EQ(refused["stopped"]["step"], "charge");
  EXPECT_NE(refused["stopped"]["words"].get<std::string>().find("HTTP 422"), std::string::npos)
      << refused.dump();
  // What triage offers is what the actions accept: each dry run answers 200, and an
  // action it does not offer (confirm: the outcome is known) is refused.
  const Json offered = refused["stopped"]["next_actions"];
  std::set<std::string> names;
  for (const Json& a : offered) {
    names.insert(a["action"]);
    Json body = {{"reason", "triage check"}};
    if (a.contains("step")) body["step"] = a["step"];
    Post("/v1/instances/t-refused/" + a["action"].get<std::string>() + "?dry_run=true", body, 200);
  }
  // create completed and has a compensation: compensating is allowed too.
  EXPECT_EQ(names, (std::set<std::string>{"retry", "skip", "compensate", "close"}))
      << offered.dump();
  Post("/v1/instances/t-refused/confirm?dry_run=true",
       {{"reason", "x"}, {"step", "charge"}, {"happened", false}}, 409);
  const Json waiting = groups["waiting_for_event"]["items"][0];
  EXPECT_EQ(waiting["stopped"]["step"], "approval");
  EXPECT_EQ(waiting["stopped"]["overdue"], false);
}

// The server config's permissions, role x tenant x action: each dry run is refused
// (403 naming the action and role) exactly where the rules say, or answered as
// the instance's state allows; a refused action changes nothing; /v1/me and the
// next actions say the same.
TEST_P(ApiWriteTest, PermissionsNarrowEachRolePerTenantAndAction) {
  using P = Permission;
  Restart({{Role::kOperator, "t1", {P::kRetry, P::kConfirm, P::kAcknowledge}, 1},
           {Role::kOperator, "", {P::kSkip, P::kClose}, 2},
           {Role::kAdmin, "t2", {P::kRetry}, 3}});
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("m1"), InstanceState::kNeedsAttention);
  Post("/v1/instances", {{"workflow", "wf"}, {"input", {{"id", "m2"}}}}, 201, operator_t2_);
  ASSERT_EQ(Drive("m2", "t2"), InstanceState::kNeedsAttention);
  const std::string alert_t1 = Get("/v1/alerts?state=open", viewer_)["items"][0]["id"];
  const Json open_t2 = Get("/v1/alerts?state=open&tenant=t2", admin_)["items"];
  ASSERT_EQ(open_t2.size(), 1u);
  const std::string alert_t2 = open_t2[0]["id"];
  ASSERT_NE(alert_t1, alert_t2);

  const std::vector<std::string> actions = {"retry", "confirm", "compensate",
                                            "skip",  "close",   "acknowledge"};
  struct Row {
    std::string caller;
    std::string key;        // also the tenant: m1 in t1, m2 in t2
    std::vector<int> want;  // per action, in the order above
  };
  // What each state allows when permitted: confirm is 409 (the outcome is known).
  const std::vector<Row> rows = {
      {"op1", "m1", {200, 409, 403, 403, 403, 200}},
      {"op2", "m2", {403, 403, 403, 200, 200, 403}},
      {"admin", "m1", {200, 409, 200, 200, 200, 200}},
      {"admin", "m2", {200, 403, 403, 403, 403, 403}},
  };
  const size_t calls_before = recorder_.Calls().size();
  for (const Row& row : rows) {
    const std::string token = row.caller == "op1"   ? operator_
                              : row.caller == "op2" ? operator_t2_
                                                    : admin_;
    const std::string tenant = row.key == "m1" ? "t1" : "t2";
    for (size_t i = 0; i < actions.size(); ++i) {
      const std::string& action = actions[i];
      Json body = {{"reason", "matrix"}};
      if (action == "retry" || action == "confirm" || action == "skip") body["step"] = "charge";
      if (action == "confirm") body["happened"] = false;
      std::string path =
          action == "acknowledge"
              ? "/v1/alerts/" + (tenant == "t1" ? alert_t1 : alert_t2) + "/acknowledge"
              : "/v1/instances/" + row.key + "/" + action;
      path += "?dry_run=true";
      if (row.caller == "admin" && action != "acknowledge") path += "&tenant=" + tenant;
      auto response = Send("POST", path, token, body.dump());
      EXPECT_EQ(response.outcome.status, row.want[i])
          << row.caller << " " << action << " " << row.key << ": " << response.body;
      if (row.want[i] == 403) {
        Json problem = Json::parse(response.body, nullptr, false);
        EXPECT_EQ(problem["action"], action) << response.body;
        EXPECT_EQ(problem["role"], row.caller == "admin" ? "admin" : "operator");
        EXPECT_EQ(problem["tenant"], tenant);
        EXPECT_NE(problem["detail"].get<std::string>().find("may not " + action), std::string::npos)
            << response.body;
      }
    }
  }
  // Another tenant's instance is still not found when the action is permitted.
  EXPECT_EQ(Send("POST", "/v1/instances/m2/retry?dry_run=true", operator_,
                 Json{{"reason", "x"}, {"step", "charge"}}.dump())
                .outcome.status,
            404);
  EXPECT_EQ(Send("POST", "/v1/instances/m1/close?dry_run=true", operator_t2_,
                 Json{{"reason", "x"}}.dump())
                .outcome.status,
            404);
  // Refused for real: nothing changes, nothing is called.
  EXPECT_EQ(Send("POST", "/v1/instances/m1/close", operator_, Json{{"reason", "x"}}.dump())
                .outcome.status,
            403);
  Json view = Get("/v1/instances/m1");
  EXPECT_EQ(view["state"], "needs_attention");
  EXPECT_TRUE(view["audit"].empty());
  for (const Json& alert : view["alerts"]) EXPECT_EQ(alert["state"], "open");
  EXPECT_EQ(recorder_.Calls().size(), calls_before);

  // /v1/me says what each token may do; the next actions are only those.
  EXPECT_EQ(Get("/v1/me", operator_)["actions"], (Json{"retry", "confirm", "acknowledge"}));
  EXPECT_EQ(Get("/v1/me", operator_t2_)["actions"], (Json{"skip", "close"}));
  EXPECT_EQ(Get("/v1/me", viewer_)["actions"], Json::array());
  Json admin_me = Get("/v1/me", admin_);
  EXPECT_EQ(admin_me["actions"].size(), 9u) << admin_me.dump();
  EXPECT_EQ(admin_me["actions_by_tenant"], (Json{{"t2", {"retry"}}}));

  // A batch needs what its action needs, in the batch's tenant: its preview, its
  // creation, and pausing, resuming or cancelling it.
  auto batch = [](const std::string& action) {
    return Json{{"action", action}, {"reason", "matrix"}, {"filter", {{"workflow", "wf"}}}}.dump();
  };
  auto refused = Send("POST", "/v1/batches?dry_run=true", operator_, batch("close"));
  EXPECT_EQ(refused.outcome.status, 403) << refused.body;
  EXPECT_EQ(Json::parse(refused.body, nullptr, false)["action"], "close") << refused.body;
  EXPECT_EQ(Send("POST", "/v1/batches", operator_, batch("close")).outcome.status, 403);
  EXPECT_EQ(Send("POST", "/v1/batches?dry_run=true", operator_, batch("retry")).outcome.status,
            200);
  auto made = Send("POST", "/v1/batches", operator_t2_, batch("close"));
  ASSERT_EQ(made.outcome.status, 201) << made.body;
  const std::string id = Json::parse(made.body)["id"];
  auto pause = Send("POST", "/v1/batches/" + id + "/pause", admin_, "{}");
  EXPECT_EQ(pause.outcome.status, 403) << pause.body;  // admins may only retry in t2
  EXPECT_EQ(Get("/v1/batches/" + id, admin_)["state"], "running");
  EXPECT_EQ(Send("POST", "/v1/batches/" + id + "/pause", operator_t2_, "{}").outcome.status, 200);
  auto next = [&](const std::string& key, const std::string& tenant, const std::string& token) {
    std::set<std::string> names;
    const Json shown =
        Get("/v1/instances/" + key + (token == admin_ ? "?tenant=" + tenant : ""), token);
    for (const Json& a : shown["stopped"]["next_actions"]) names.insert(a["action"]);
    return names;
  };
  EXPECT_EQ(next("m1", "t1", operator_), (std::set<std::string>{"retry"}));
  EXPECT_EQ(next("m2", "t2", operator_t2_), (std::set<std::string>{"skip", "close"}));
  EXPECT_EQ(next("m1", "t1", admin_),
            (std::set<std::string>{"retry", "skip", "compensate", "close"}));
  EXPECT_EQ(next("m2", "t2", admin_), (std::set<std::string>{"retry"}));
  EXPECT_EQ(next("m1", "t1", viewer_), (std::set<std::string>{}));
  // Triage too.
  Json triage = Get("/v1/triage", operator_t2_);
  for (const Json& group : triage["groups"]) {
    for (const Json& item : group["items"]) {
      for (const Json& a : item["stopped"]["next_actions"]) {
        EXPECT_TRUE(a["action"] == "skip" || a["action"] == "close") << a.dump();
      }
    }
  }
}

// Tokens from the API: an admin lists them (never a hash), creates one (its
// secret shown once, never stored) and revokes one with a reason (audited, then
// 401); an admin of one tenant sees and manages only that tenant's tokens.
TEST_P(ApiWriteTest, AdminsListCreateAndRevokeTokensWithinTheirTenant) {
  const std::string admin_t1 = *CreateToken(*store_, "admin1", "t1", Role::kAdmin, 1);
  auto names = [&](const std::string& token) {
    std::set<std::string> out;
    const Json listed = Get("/v1/tokens", token);
    for (const Json& t : listed["items"]) out.insert(t["name"]);
    return out;
  };
  EXPECT_EQ(names(admin_),
            (std::set<std::string>{"admin1", "intake", "op1", "op2", "root", "viewer1"}));
  EXPECT_EQ(names(admin_t1), (std::set<std::string>{"admin1", "intake", "op1", "viewer1"}));
  auto listing = Send("GET", "/v1/tokens", admin_);
  auto stored = store_->ListTokens();
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (const TokenRecord& t : *stored) {
    EXPECT_EQ(listing.body.find(t.token_hash.substr(0, 12)), std::string::npos) << t.name;
  }
  Json op1;
  const Json listed = Json::parse(listing.body);
  for (const Json& t : listed["items"]) {
    if (t["name"] == "op1") op1 = t;
  }
  EXPECT_EQ(op1, (Json{{"name", "op1"},
                       {"tenant", "t1"},
                       {"role", "operator"},
                       {"state", "active"},
                       {"created_at", "1970-01-01T00:00:00.001Z"},
                       {"expires_at", nullptr},
                       {"revoked_at", nullptr}}));

  // Create: within the admin's tenant only; only '*' admins make '*' tokens.
  Json made = Post("/v1/tokens", {{"name", "night-op"}, {"role", "operator"}, {"expires", "1h"}},
                   201, admin_t1);
  EXPECT_EQ(made["tenant"], "t1");
  EXPECT_EQ(made["role"], "operator");
  EXPECT_EQ(made["expires_at"], "2023-11-14T23:13:20.000Z");
  const std::string secret = made["token"];
  EXPECT_TRUE(secret.starts_with("wst_")) << secret;
  EXPECT_EQ(Get("/v1/me", secret)["token"], "night-op");
  EXPECT_EQ(Send("GET", "/v1/tokens", admin_).body.find(secret.substr(4)), std::string::npos);
  stored = store_->ListTokens();
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (const TokenRecord& t : *stored) {
    EXPECT_EQ(t.token_hash.find(secret.substr(4)), std::string::npos);
  }
  Post("/v1/tokens", {{"name", "x"}, {"role", "viewer"}, {"tenant", "t2"}}, 403, admin_t1);
  Post("/v1/tokens", {{"name", "x"}, {"role", "admin"}, {"tenant", "*"}}, 403, admin_t1);
  Post("/v1/tokens", {{"name", "x"}, {"role", "operator"}, {"tenant", "*"}}, 400, admin_);
  Post("/v1/tokens", {{"name", "x"}, {"role", "god"}, {"tenant", "t2"}}, 400, admin_);
  Post("/v1/tokens", {{"name", "x"}, {"role", "viewer"}, {"expires", "soon"}}, 400, admin_t1);
  Post("/v1/tokens", {{"name", "night-op"}, {"role", "viewer"}}, 409, admin_t1);
  Post("/v1/tokens", {{"name", "x"}, {"role", "viewer"}, {"hash", "h"}}, 400, admin_t1);
  Post("/v1/tokens", {{"name", "all-admin"}, {"role", "admin"}, {"tenant", "*"}}, 201, admin_);
  EXPECT_EQ(names(admin_t1),
            (std::set<std::string>{"admin1", "intake", "night-op", "op1", "viewer1"}));

  // Revoke: a reason is required; another tenant's token is not found.
  Post("/v1/tokens/op2/revoke", {{"reason", "left"}}, 404, admin_t1);
  Post("/v1/tokens/op1/revoke", Json::object(), 400, admin_t1);
  Post("/v1/tokens/op1/revoke", {{"reason", "x"}}, 403, operator_);
  EXPECT_EQ(Send("GET", "/v1/me", operator_).outcome.status, 200);
  Json revoked = Post("/v1/tokens/op1/revoke", {{"reason", "laptop lost, INC-7"}}, 200, admin_t1);
  EXPECT_EQ(revoked["state"], "revoked");
  EXPECT_EQ(Send("GET", "/v1/me", operator_).outcome.status, 401);
  EXPECT_EQ(Send("GET", "/v1/me", operator_t2_).outcome.status, 200);
  Post("/v1/tokens/op1/revoke", {{"reason", "again"}}, 409, admin_);
  const Json after = Get("/v1/tokens", admin_);
  for (const Json& t : after["items"]) {
    if (t["name"] != "op1") continue;
    EXPECT_EQ(t["state"], "revoked");
    EXPECT_EQ(t["revoked_by"], "admin1");
    EXPECT_EQ(t["revoke_reason"], "laptop lost, INC-7");
  }
  auto audit = store_->ListAudit(0);
  ASSERT_TRUE(audit.ok()) << audit.status();
  ASSERT_EQ(audit->size(), 1u);
  EXPECT_EQ((*audit)[0].actor, "admin1");
  EXPECT_EQ((*audit)[0].tenant, "t1");
  EXPECT_EQ((*audit)[0].action, "revoke_token");
  EXPECT_EQ((*audit)[0].reason, "laptop lost, INC-7");
}

// A definition's redact list: tokens without see_redacted see "[redacted]" for the
// input's phone and for the ERP's order id wherever it is shown (the external id,
// the requests, triage); admins and a viewer granted see_redacted see them.
TEST_P(ApiWriteTest, RedactedValuesAreHiddenFromTokensWithoutSeeRedacted) {
  auto definition = LoadDefinitionText(R"(workflow: wfr
key: "{{input.ref}}"
redact: [/customer/phone, /id]
steps:
  - name: create
    idempotency: { honored: true }
    request: { method: POST, url: "{{env.REC_URL}}/create", body: { phone: "{{input.customer.phone}}" }, timeout: 2s }
    result: { external_id: "/id" }
    retry: { max_attempts: 1 }
  - name: charge
    recovery: manual
    request: { method: POST, url: "{{env.REC_URL}}/charge?phone={{input.customer.phone}}", timeout: 2s }
    retry: { max_attempts: 1 }
)",
                                       "wfr.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  ASSERT_TRUE(engine_->Register(*definition).ok());
  Restart({{Role::kViewer, "t2", {Permission::kSeeRedacted}, 1}});
  const std::string viewer_t2 = *CreateToken(*store_, "viewer2", "t2", Role::kViewer, 1);
  recorder_.Answer("/charge", 422);
  const std::string phone = "+81-90-5555-0101";
  for (const std::string& token : {operator_, operator_t2_}) {
    Post("/v1/instances",
         {{"workflow", "wfr"}, {"input", {{"ref", "r1"}, {"customer", {{"phone", phone}}}}}}, 201,
         token);
  }
  ASSERT_EQ(Drive("r1", "t1"), InstanceState::kNeedsAttention);
  ASSERT_EQ(Drive("r1", "t2"), InstanceState::kNeedsAttention);
  // The order id the ERP gave, from the recorder's own answers: X-1 or X-3 per tenant.
  const Json admin_view = Get("/v1/instances/r1?tenant=t1", admin_);
  const std::string order = admin_view["steps"][0]["external_id"];
  ASSERT_TRUE(order.starts_with("X-")) << admin_view.dump();
  EXPECT_EQ(admin_view["input"]["customer"]["phone"], phone);

  std::set<std::string> keyed_hashes;
  for (const std::string& token : {viewer_, operator_}) {
    const Json view = Get("/v1/instances/r1", token);
    EXPECT_EQ(view["input"]["customer"]["phone"], "[redacted]");
    // The input's hash is keyed by the server's secret: trying every phone number
    // against it finds nothing without the key (the admin's is the plain SHA-256).
    EXPECT_NE(view["input_hash"], admin_view["input_hash"]);
    EXPECT_EQ(view["input_hash"].get<std::string>().size(), 64u);
    keyed_hashes.insert(view["input_hash"].get<std::string>());
    EXPECT_EQ(Send("GET", "/v1/instances?workflow=wfr", token)
                  .body.find(admin_view["input_hash"].get<std::string>()),
              std::string::npos);
    EXPECT_EQ(view["input"]["ref"], "r1");
    EXPECT_EQ(view["key"], "r1");
    EXPECT_EQ(view["steps"][0]["external_id"], "[redacted]");
    for (const char* path : {"/v1/instances/r1", "/v1/attempts?key=r1", "/v1/triage",
                             "/v1/instances?workflow=wfr", "/v1/alerts"}) {
      auto raw = Send("GET", path, token);
      EXPECT_EQ(raw.outcome.status, 200) << path;
      EXPECT_EQ(raw.body.find(phone), std::string::npos) << path << ": " << raw.body;
      // Neither as a value nor quoted in a response body ({"id":"X-1"}); the
      // recorder's other ids are X-2 to X-4.
      EXPECT_EQ(raw.body.find(order), std::string::npos) << path << ": " << raw.body;
    }
  }
  // The list's and the alerts' reason quote the refused charge's body: its id hidden.
  for (const char* path : {"/v1/instances?workflow=wfr", "/v1/alerts"}) {
    auto raw = Send("GET", path, operator_);
    EXPECT_NE(raw.body.find(R"({\"id\":\"[redacted]\"})"), std::string::npos)
        << path << ": " << raw.body;
    EXPECT_EQ(raw.body.find(R"({\"id\":\"X-)"), std::string::npos) << path << ": " << raw.body;
  }
  // A start of the same instance again answers with it: redacted too.
  auto restart =
      Send("POST", "/v1/instances", operator_,
           Json{{"workflow", "wfr"}, {"input", {{"ref", "r1"}, {"customer", {{"phone", phone}}}}}}
               .dump());
  EXPECT_EQ(restart.outcome.status, 200) << restart.body;
  EXPECT_EQ(restart.body.find(R"({\"id\":\"X-)"), std::string::npos) << restart.body;
  EXPECT_NE(restart.body.find("[redacted]"), std::string::npos) << restart.body;
  // A dry run's rendered URL holds the phone: hidden from the operator, in the
  // action's dry run and in a batch's preview, and shown to the admin. (A value
  // shorter than 4 characters, as the recorder's X-1, is hidden only where it is a
  // whole string: quoted, it would blank out unrelated text.)
  const Json retry = {{"reason", "dry"}, {"step", "charge"}};
  auto dry = Send("POST", "/v1/instances/r1/retry?dry_run=true", operator_, retry.dump());
  ASSERT_EQ(dry.outcome.status, 200) << dry.body;
  EXPECT_EQ(dry.body.find(phone), std::string::npos) << dry.body;
  EXPECT_EQ(dry.body.find("5555-0101"), std::string::npos) << dry.body;  // nor encoded
  const Json planned = Json::parse(dry.body)["would_execute"];
  ASSERT_FALSE(planned.empty()) << dry.body;
  EXPECT_NE(planned[0]["rendered_url"].get<std::string>().find("[redacted]"), std::string::npos)
      << dry.body;
  auto preview = Send("POST", "/v1/batches?dry_run=true", operator_,
                      Json{{"action", "retry"},
                           {"step", "charge"},
                           {"reason", "dry"},
                           {"filter", {{"workflow", "wfr"}}}}
                          .dump());
  ASSERT_EQ(preview.outcome.status, 200) << preview.body;
  EXPECT_EQ(Json::parse(preview.body)["count"], 1);
  EXPECT_EQ(preview.body.find("5555-0101"), std::string::npos) << preview.body;
  EXPECT_NE(preview.body.find("[redacted]"), std::string::npos) << preview.body;
  auto seen = Send("POST", "/v1/instances/r1/retry?dry_run=true&tenant=t1", admin_, retry.dump());
  EXPECT_NE(seen.body.find("phone=%2B81-90-5555-0101"), std::string::npos) << seen.body;
  // Granted see_redacted in t2: a viewer there sees the values; the admin does everywhere.
  const Json granted = Get("/v1/instances/r1", viewer_t2);
  EXPECT_EQ(granted["input"]["customer"]["phone"], phone);
  EXPECT_TRUE(granted["steps"][0]["external_id"].get<std::string>().starts_with("X-"));
  EXPECT_NE(Send("GET", "/v1/attempts?key=r1&tenant=t1", admin_).body.find(order),
            std::string::npos);
  // The stored instance is untouched: only what is shown is redacted.
  auto stored = store_->FindInstance("t1", "r1");
  ASSERT_TRUE(stored.ok());
  EXPECT_NE(stored->input_json.find(phone), std::string::npos);
  EXPECT_EQ(admin_view["input_hash"], stored->input_hash);
  EXPECT_EQ(keyed_hashes.size(), 1u);  // one tenant's tokens compare equal inputs
}

TEST_P(ApiWriteTest, TheOpenApiDocumentDescribesEveryRoute) {
  auto response = Send("GET", "/v1/openapi.json", "");
  ASSERT_EQ(response.outcome.status, 200);
  Json doc = Json::parse(response.body, nullptr, false);
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["openapi"].get<std::string>().substr(0, 2), "3.");
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"/healthz", "get"},
      {"/readyz", "get"},
      {"/metrics", "get"},
      {"/v1/openapi.json", "get"},
      {"/v1/instances", "get"},
      {"/v1/instances", "post"},
      {"/v1/instances/{key}", "get"},
      {"/v1/instances/{key}/retry", "post"},
      {"/v1/instances/{key}/confirm", "post"},
      {"/v1/instances/{key}/compensate", "post"},
      {"/v1/instances/{key}/skip", "post"},
      {"/v1/instances/{key}/close", "post"},
      {"/v1/alerts", "get"},
      {"/v1/alerts/{id}/acknowledge", "post"},
      {"/v1/events", "post"},
      {"/v1/me", "get"},
      {"/v1/triage", "get"},
      {"/v1/attempts", "get"},
      {"/v1/batches", "get"},
      {"/v1/batches", "post"},
      {"/v1/batches/{id}", "get"},
      {"/v1/batches/{id}/pause", "post"},
      {"/v1/batches/{id}/resume", "post"},
      {"/v1/batches/{id}/cancel", "post"},
      {"/v1/tokens", "get"},
      {"/v1/tokens", "post"},
      {"/v1/tokens/{name}/revoke", "post"},
      {"/v1/targets", "get"},
      {"/v1/targets/{name}/pause", "post"},
      {"/v1/targets/{name}/resume", "post"},
      {"/v1/instances/{key}/decide", "post"},
      {"/v1/instances/{key}/revise", "post"}};
  for (const auto& [path, method] : routes) {
    EXPECT_TRUE(doc["paths"].contains(path) && doc["paths"][path].contains(method))
        << method << " " << path;
  }
  // And every documented path is served: nothing answers "no route".
  for (auto it = doc["paths"].begin(); it != doc["paths"].end(); ++it) {
    std::string path = it.key();
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"{key}", "nobody"},
                                   {"{id}", "999"},
                                   {"{name}", "nobody"}}) {
      if (auto at = path.find(from); at != std::string::npos) path.replace(at, from.size(), to);
    }
    for (auto m = it.value().begin(); m != it.value().end(); ++m) {
      auto answer = Send(m.key() == "get" ? "GET" : "POST", path, operator_, "{}");
      // (The document itself may say "no route"; only a 404 must not.)
      if (answer.outcome.status == 404) {
        EXPECT_EQ(answer.body.find("no route"), std::string::npos) << m.key() << " " << path;
      }
    }
  }
}

TEST_P(ApiWriteTest, ABatchIsPreviewedCreatedOnceAppliedAndJudgedByWhereEachInstanceRests) {
  recorder_.Answer("/charge", 422);
  for (const char* id : {"b1", "b2", "b3"})
    ASSERT_EQ(StartAndDrive(id), InstanceState::kNeedsAttention);
  recorder_.Answer("/charge", 200);
  ASSERT_EQ(StartAndDrive("b4"), InstanceState::kRunning);  // waiting for its approval
  recorder_.Answer("/charge", 422);                         // still refused: a retry stops again
  const Json body = {{"action", "retry"},
                     {"step", "charge"},
                     {"reason", "card limits raised, INC-7"},
                     {"filter", {{"state", "needs_attention"}, {"stopped_at", "charge"}}}};

  Json preview = Post("/v1/batches?dry_run=true", body, 200);
  EXPECT_EQ(preview["count"], 3);
  EXPECT_EQ(preview["keys"], Json::array({"b1", "b2", "b3"}));
  ASSERT_EQ(preview["dry_runs"].size(), 3u);
  EXPECT_EQ(preview["dry_runs"][0]["plan"]["state_after"], "running");
  EXPECT_EQ(preview["dry_runs"][0]["plan"]["would_execute"][0]["idempotency_key"], "t1:b1:charge");
  // Another tenant's operator sees none of them.
  EXPECT_EQ(Post("/v1/batches?dry_run=true", body, 200, operator_t2_)["count"], 0);
  // A preview changes nothing.
  EXPECT_TRUE(Get("/v1/batches")["items"].empty());
  EXPECT_TRUE(Get("/v1/instances/b1")["audit"].empty());

  auto created = Send("POST", "/v1/batches", operator_, body.dump(), {{"Idempotency-Key", "bk-1"}});
  ASSERT_EQ(created.outcome.status, 201) << created.body;
  const Json batch = Json::parse(created.body);
  EXPECT_EQ(batch["total"], preview["count"]);
  EXPECT_EQ(batch["counts"]["pending"], 3);
  EXPECT_EQ(batch["actor"], "op1");
  EXPECT_EQ(batch["state"], "running");
  auto replayed =
      Send("POST", "/v1/batches", operator_, body.dump(), {{"Idempotency-Key", "bk-1"}});
  EXPECT_EQ(Json::parse(replayed.body)["id"], batch["id"]);
  ASSERT_EQ(Get("/v1/batches")["items"].size(), 1u);  // one batch, not two

  const size_t calls = recorder_.Count("/charge");
  Json done = RunBatch(batch["id"]);
  EXPECT_EQ(done["state"], "finished");
  EXPECT_EQ(done["counts"]["stopped"], 3) << done.dump();
  EXPECT_EQ(recorder_.Count("/charge"), static_cast<int>(calls) + 3);  // one retry each
  ASSERT_EQ(done["items"].size(), 3u);
  for (const Json& item : done["items"]) {
    EXPECT_EQ(item["state"], "stopped");
    EXPECT_EQ(item["result_state"], "needs_attention");
    EXPECT_FALSE(item.value("message", "").empty()) << item.dump();
  }
  Json audit = Get("/v1/instances/b2")["audit"];
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0]["actor"], "op1");
  EXPECT_EQ(audit[0]["reason"], "card limits raised, INC-7");
  EXPECT_EQ(audit[0]["detail"]["batch"], batch["id"]);
  EXPECT_EQ(Get("/v1/instances/b4")["audit"].size(), 0u);  // not in the filter

  // Items are paged; a finished batch is not paused.
  Json first = Get("/v1/batches/" + batch["id"].get<std::string>() + "?limit=2");
  ASSERT_EQ(first["items"].size(), 2u);
  Json second = Get("/v1/batches/" + batch["id"].get<std::string>() +
                    "?limit=2&cursor=" + first["next_cursor"].get<std::string>());
  ASSERT_EQ(second["items"].size(), 1u);
  EXPECT_EQ(second["items"][0]["key"], "b3");
  EXPECT_EQ(
      Post("/v1/batches/" + batch["id"].get<std::string>() + "/pause", Json::object(), 409)["type"],
      "urn:waystone:problem:state-conflict");

  // This time the card goes through: closed batches of one, paused, resumed, cancelled.
  recorder_.Answer("/charge", 200);
  const Json close = {
      {"action", "close"}, {"reason", "duplicate order"}, {"filter", {{"key_prefix", "b1"}}}};
  Json second_batch = Post("/v1/batches", close, 201);
  const std::string path = "/v1/batches/" + second_batch["id"].get<std::string>();
  EXPECT_EQ(Post(path + "/pause", Json::object(), 200)["state"], "paused");
  EXPECT_EQ(Post(path + "/pause", Json::object(), 409)["status"], 409);
  BatchRunner runner(store_.get(), store_.get(), &engine_->operations(), &clock_, "test-runner");
  EXPECT_EQ(*runner.RunOnce(), 0);  // paused: nothing taken
  EXPECT_EQ(Get("/v1/instances/b1")["state"], "needs_attention");
  EXPECT_EQ(Post(path + "/resume", Json::object(), 200)["state"], "running");
  Json closed = RunBatch(second_batch["id"]);
  EXPECT_EQ(closed["counts"]["succeeded"], 1) << closed.dump();
  EXPECT_EQ(closed["items"][0]["result_state"], "closed");
  Json third = Post("/v1/batches", close, 201);  // b1 is closed now: refused
  Post("/v1/batches/" + third["id"].get<std::string>() + "/cancel", Json::object(), 200);
  Json cancelled = Get("/v1/batches/" + third["id"].get<std::string>());
  EXPECT_EQ(cancelled["state"], "cancelled");
  EXPECT_EQ(cancelled["counts"]["cancelled"], 1);
  EXPECT_EQ(Get("/v1/batches")["items"].size(), 3u);
  EXPECT_EQ(Get("/v1/batches", operator_t2_)["items"].size(), 0u);
  auto hidden = Send("GET", path, operator_t2_);
  EXPECT_EQ(hidden.outcome.status, 404) << hidden.body;
}

// Two runners of one item (the first's claim expired while it applied): the second
// finds, under the instance's lease, that its batch's retry is in the audit trail and
// applies nothing, even though the instance has stopped again and would take a retry.
TEST_P(ApiWriteTest, ABatchsActionIsAppliedToAnInstanceOnceEvenByTwoRunners) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("twice"), InstanceState::kNeedsAttention);
  OperatorRequest retry;
  retry.action = OperatorAction::kRetry;
  retry.step = "charge";
  retry.reason = "ERP back";
  retry.actor = "alice";
  retry.batch = "00112233aabbccdd";
  ASSERT_TRUE(engine_->operations().Apply("t1", "twice", retry).ok());
  ASSERT_EQ(Drive("twice"), InstanceState::kNeedsAttention);  // refused again
  const size_t calls = recorder_.Calls().size();
  auto again = engine_->operations().Apply("t1", "twice", retry);
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  EXPECT_EQ(Drive("twice"), InstanceState::kNeedsAttention);
  EXPECT_EQ(recorder_.Calls().size(), calls);
  auto audit = store_->ListAudit(store_->FindInstance("t1", "twice")->id);
  ASSERT_TRUE(audit.ok());
  EXPECT_EQ(std::count_if(audit->begin(), audit->end(),
                          [](const AuditRecord& a) { return a.action == "retry"; }),
            1);
  // Another batch, or one operator by hand, still retries it.
  retry.batch = "ffeeddccbbaa0099";
  EXPECT_TRUE(engine_->operations().Apply("t1", "twice", retry).ok());
}

TEST_P(ApiWriteTest, BadBatchesAreProblemsAndCreateNothing) {
  recorder_.Answer("/charge", 422);
  ASSERT_EQ(StartAndDrive("x1"), InstanceState::kNeedsAttention);
  const Json filter = {{"state", "needs_attention"}};
  const std::vector<std::pair<Json, std::string>> bad = {
      {{{"action", "retry"}, {"step", "charge"}, {"filter", filter}}, "a reason is required"},
      {{{"action", "retry"}, {"reason", "   "}, {"filter", filter}}, "a reason is required"},
      {{{"action", "explode"}, {"reason", "r"}, {"filter", filter}}, "'action' must be"},
      {{{"action", "close"}, {"reason", "r"}}, "'filter' is required"},
      {{{"action", "close"}, {"reason", "r"}, {"filter", Json::object()}}, "'filter' is required"},
      {{{"action", "close"}, {"reason", "r"}, {"filter", {{"colour", "red"}}}},
       "unknown filter 'colour'"},
      {{{"action", "close"}, {"reason", "r"}, {"filter", {{"state", "sleepy"}}}},
       "not an instance state"},
      {{{"action", "close"}, {"reason", "r"}, {"filter", {{"state", 3}}}}, "must be a string"},
      {{{"action", "close"}, {"reason", "r"}, {"filter", filter}, {"colour", "red"}},
       "unknown field 'colour'"},
  };
  for (const auto& [body, says] : bad) {
    for (const char* path : {"/v1/batches", "/v1/batches?dry_run=true"}) {
      Json problem = Post(path, body, 400);
      EXPECT_NE(problem.value("detail", "").find(says), std::string::npos) << problem.dump();
    }
  }
  Json none = Post("/v1/batches",
                   {{"action", "close"}, {"reason", "r"}, {"filter", {{"key_prefix", "zz"}}}}, 409);
  EXPECT_NE(none.value("detail", "").find("matches no instance"), std::string::npos);
  EXPECT_EQ(Post("/v1/batches?dry_run=maybe", {{"action", "close"}}, 400)["status"], 400);
  auto wrong_type = Send("POST", "/v1/batches", operator_, "{}", {{"Content-Type", "text/plain"}});
  EXPECT_EQ(wrong_type.outcome.status, 415);
  EXPECT_EQ(Send("GET", "/v1/batches/nope", viewer_).outcome.status, 404);
  EXPECT_EQ(Send("GET", "/v1/batches?cursor=nope", viewer_).outcome.status, 400);
  EXPECT_TRUE(Get("/v1/batches", admin_)["items"].empty());
  EXPECT_TRUE(Get("/v1/instances/x1")["audit"].empty());
  EXPECT_EQ(Get("/v1/instances/x1")["state"], "needs_attention");
}

TEST_P(ApiWriteTest, ABatchOverMoreThanAThousandInstancesIsRefusedAskingToNarrowTheFilter) {
  auto definition = engine_->catalog().Current("wf");
  ASSERT_NE(definition, nullptr);
  for (int i = 0; i < 1001; ++i) {
    StartRequest start;
    start.tenant = "t1";
    start.input_json = Json{{"id", "many-" + std::to_string(i)}}.dump();
    ASSERT_TRUE(engine_->StartInstance(*definition, start).ok());
  }
  const Json body = {
      {"action", "close"}, {"reason", "too many"}, {"filter", {{"state", "running"}}}};
  for (const char* path : {"/v1/batches", "/v1/batches?dry_run=true"}) {
    Json problem = Post(path, body, 422);
    EXPECT_EQ(problem["type"], "urn:waystone:problem:filter-too-broad");
    EXPECT_NE(problem.value("detail", "").find("narrow it"), std::string::npos) << problem.dump();
  }
  EXPECT_TRUE(Get("/v1/batches")["items"].empty());
  // A narrower filter is taken.
  Json narrower = body;
  narrower["filter"]["key_prefix"] = "many-1";
  Json preview = Post("/v1/batches?dry_run=true", narrower, 200);
  EXPECT_EQ(preview["count"], 1 + 10 + 100 + 1);  // many-1, many-1x, many-1xx, many-1000
}

constexpr char kTargetWorkflow[] = R"(workflow: erp-orders
key: "{{input.id}}"
targets:
  erp:
    url: "{{env.REC_URL}}"
    limits: { rate: 5, concurrency: 2 }
    circuit_breaker: { failures: 4, cool_down: 20s }
steps:
  - name: create
    recovery: manual
    request: { method: POST, url: "{{env.REC_URL}}/create", timeout: 2s }
)";

TEST_P(ApiWriteTest, AnOperatorPausesAndResumesATargetWithAReasonAudited) {
  auto definition = LoadDefinitionText(kTargetWorkflow, "erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  ASSERT_TRUE(engine_->Register(*definition).ok());
  Json listed = Get("/v1/targets");
  ASSERT_EQ(listed["items"].size(), 1u) << listed.dump();
  EXPECT_EQ(listed["items"][0]["name"], "erp");
  EXPECT_EQ(listed["items"][0]["paused"], false);
  EXPECT_EQ(listed["items"][0]["circuit"], "closed");
  EXPECT_EQ(listed["items"][0]["rate"], 5);
  EXPECT_EQ(listed["items"][0]["concurrency"], 2);
  EXPECT_EQ(listed["items"][0]["circuit_breaker"]["cool_down"], "20s");

  const Json why = {{"reason", "ERP maintenance window, CHG-7"}};
  EXPECT_EQ(Send("POST", "/v1/targets/erp/pause", viewer_, why.dump()).outcome.status, 403);
  Post("/v1/targets/erp/pause", {{"reason", ""}}, 400);
  Json unknown = Post("/v1/targets/crm/pause", why, 404);
  EXPECT_NE(unknown["detail"].get<std::string>().find("declared: erp"), std::string::npos)
      << unknown.dump();
  Post("/v1/targets/erp/pause", why, 400, admin_);  // all tenants: which one?
  EXPECT_TRUE(store_->ListAudit(0)->empty()) << "refused requests change nothing";

  Json paused = Post("/v1/targets/erp/pause", why, 200);
  EXPECT_EQ(paused["paused"], true);
  EXPECT_EQ(paused["paused_by"], "op1");
  EXPECT_EQ(paused["pause_reason"], "ERP maintenance window, CHG-7");
  Post("/v1/targets/erp/pause", why, 409);
  EXPECT_EQ(Get("/v1/targets")["items"][0]["paused"], true);

  // Every worker on the database asks the store: t1's calls wait, t2's go.
  TargetCallAsk ask{"t1", "erp", {}, clock_.NowMillis(), 1000, 30'000, "permit-1"};
  auto refused = store_->AdmitTargetCall(ask);
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE(refused->admitted);
  EXPECT_NE(refused->reason.find("waiting for target 'erp': paused by op1 at "), std::string::npos)
      << refused->reason;
  EXPECT_NE(refused->reason.find("ERP maintenance window, CHG-7"), std::string::npos);
  ask.tenant = "t2";
  EXPECT_TRUE(store_->AdmitTargetCall(ask)->admitted);

  Json resumed = Post("/v1/targets/erp/resume", {{"reason", "maintenance over"}}, 200);
  EXPECT_EQ(resumed["paused"], false);
  Post("/v1/targets/erp/resume", {{"reason", "again"}}, 409);
  ask.tenant = "t1";
  ask.permit = "permit-2";
  EXPECT_TRUE(store_->AdmitTargetCall(ask)->admitted);
  auto audit = store_->ListAudit(0);
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ(audit->size(), 2u);
  EXPECT_EQ((*audit)[0].action, "target.pause");
  EXPECT_EQ((*audit)[0].actor, "op1");
  EXPECT_EQ((*audit)[0].tenant, "t1");
  EXPECT_EQ((*audit)[0].reason, "ERP maintenance window, CHG-7");
  EXPECT_EQ((*audit)[1].action, "target.resume");

  // A target no workflow of this server declares, but on record (a C++ program's,
  // Engine::RegisterTargets, whose limited calls leave its row): paused as well.
  EXPECT_NE(Post("/v1/targets/crm/pause", why, 404)["detail"].get<std::string>().find(
                "no call to it is on record"),
            std::string::npos);
  TargetCallAsk crm{"t1", "crm", {}, clock_.NowMillis(), 1000, 30'000, "permit-3"};
  crm.limits.concurrency = 1;
  ASSERT_TRUE(store_->AdmitTargetCall(crm)->admitted);
  ASSERT_TRUE(store_
                  ->SettleTargetCall({"t1", "crm", crm.limits, "permit-3", false,
                                      CallHealth::kHealthy, clock_.NowMillis()})
                  .ok());
  EXPECT_EQ(Send("POST", "/v1/targets/crm/pause", viewer_, why.dump()).outcome.status, 403);
  Json crm_paused = Post("/v1/targets/crm/pause", why, 200);
  EXPECT_EQ(crm_paused["paused"], true) << crm_paused.dump();
  EXPECT_EQ(crm_paused["declared"], false) << crm_paused.dump();
  crm.permit = "permit-4";
  auto crm_refused = store_->AdmitTargetCall(crm);
  ASSERT_TRUE(crm_refused.ok());
  EXPECT_FALSE(crm_refused->admitted);
  EXPECT_NE(crm_refused->reason.find("paused by op1"), std::string::npos) << crm_refused->reason;
  crm.tenant = "t2";  // another tenant's calls to its crm go on
  EXPECT_TRUE(store_->AdmitTargetCall(crm)->admitted);

  // The server config may take the permission away from operators.
  Restart({{Role::kOperator, "", {Permission::kRetry}, 1}});
  Json forbidden = Post("/v1/targets/erp/pause", why, 403);
  EXPECT_EQ(forbidden["action"], "pause_target") << forbidden.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, ApiWriteTest,
                         ::testing::Values(testing::Backend::kSqlite, testing::Backend::kPostgres),
                         testing::BackendName);

}  // namespace
}  // namespace waystone
