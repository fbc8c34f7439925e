// The public C++ API (include/waystone/) as a program that embeds Waystone uses
// it: through libwaystone.so and its headers alone, against the independent ERP
// target (tests/targets/erp_target.py), on SQLite and PostgreSQL. What the target
// received is counted from its own stats.

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <waystone/waystone.h>

#include "support/backends.h"
#include "support/database_client.h"
#include "support/erp_target.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace {

using Json = nlohmann::json;
using waystone::api::Engine;
using waystone::api::EngineOptions;
using waystone::api::InstanceState;
using waystone::api::Outcome;
using waystone::api::Status;
using waystone::testing::Backend;

// An ERP order (its answer may be lost: the lookup by reference finds it) and a
// message the target deduplicates by key.
constexpr char kOrder[] = R"(workflow: embedded-order
key: "{{input.order_id}}"
steps:
  - name: create-order
    recovery: lookup
    request:
      method: POST
      url: "{{env.EMBEDDED_ERP_URL}}/erp/orders"
      body: { ref: "{{instance.ref}}", amount: "{{input.amount}}" }
      timeout: 2s
    result: { external_id: "/id" }
    lookup:
      request: { method: GET, url: "{{env.EMBEDDED_ERP_URL}}/erp/orders?ref={{instance.ref}}", timeout: 2s }
      items: "/items"
      match: { "/ref": "{{instance.ref}}" }
      external_id: "/id"
    retry: { max_attempts: 4, initial_interval: 50ms, max_interval: 200ms }
  - name: notify
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.EMBEDDED_ERP_URL}}/notify/messages"
      body: { to: "sales", text: "order {{steps.create-order.external_id}}" }
      timeout: 2s
    result: { external_id: "/id" }
    retry: { max_attempts: 4, initial_interval: 50ms, max_interval: 200ms }
)";

class EmbeddedApiTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    target_ = std::make_unique<waystone::testing::ErpTarget>(dir_.path());
    ASSERT_TRUE(target_->ok());
    setenv("EMBEDDED_ERP_URL", target_->base_url().c_str(), 1);
    database_ = waystone::testing::FreshStorePath(GetParam(), dir_, "embedded");
    ASSERT_FALSE(database_.empty());
  }

  // An engine on the test's database, with `clock` when given; nothing registered.
  std::unique_ptr<Engine> OpenBare(int workers,
                                   std::shared_ptr<waystone::api::ManualClock> clock = nullptr) {
    EngineOptions options;
    options.database = database_;
    options.workers = workers;
    options.clock = std::move(clock);
    auto engine = Engine::Open(options);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // An engine with the order definition registered.
  std::unique_ptr<Engine> Open(int workers) {
    auto engine = OpenBare(workers);
    if (engine == nullptr) return nullptr;
    Status registered = engine->RegisterYaml(kOrder, "embedded-order.yaml");
    EXPECT_TRUE(registered.ok()) << registered.ToString();
    return engine;
  }

  // Where the manual-clock tests start their clocks: fifty years past the epoch.
  static constexpr std::chrono::system_clock::time_point kClockStart{
      std::chrono::hours(24 * 365 * 50)};

  Json Stats() { return Json::parse(target_->StatsJson()); }

  // Runs `sql` on the database with its own client (no code of ours): "a|b" lines.
  std::string Query(const std::string& sql) {
    return waystone::testing::ClientQuery(GetParam(), database_, sql, dir_.path());
  }

  waystone::testing::TempDir dir_;
  std::unique_ptr<waystone::testing::ErpTarget> target_;
  std::string database_;
};

// ctx.Call's create of an order on the paged ERP (paged_erp_target.py) at `base`:
// the order number it made, or the call's error.
waystone::api::Result<std::string> CreatePagedOrder(waystone::api::Context& ctx,
                                                    const std::string& base, const Json& payload,
                                                    const waystone::api::CallOptions& options) {
  auto made = ctx.Call("create-order",
                       {"POST",
                        base + "/api/orders",
                        {{"Content-Type", "application/json"}},
                        payload.dump(),
                        std::chrono::seconds(5)},
                       options);
  if (!made.ok()) return made.status();
  return std::string(Json::parse(made->body)["data"]["order_no"]);
}

const waystone::api::StepOutcome* StepOf(const Outcome& outcome, const std::string& name) {
  for (const auto& step : outcome.steps) {
    if (step.name == name) return &step;
  }
  return nullptr;
}

TEST_P(EmbeddedApiTest, StartThenWaitGivesTheOutcomeAndTheTargetOneOrderAndOneMessage) {
  auto engine = Open(2);
  ASSERT_NE(engine, nullptr);
  // The ERP commits the order and the answer is lost after the headers.
  ASSERT_TRUE(target_->Faults(R"({"create_order": {"next": ["partial_body"]}})"));
  auto order = engine->Start("embedded-order", "A-1", R"({"order_id":"A-1","amount":12})");
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  EXPECT_EQ((*order)->key(), "A-1");
  EXPECT_TRUE((*order)->created());
  auto outcome = (*order)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  EXPECT_TRUE(outcome->at_rest);
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_STREQ(waystone::api::ToString(outcome->state), "completed");
  EXPECT_EQ(outcome->workflow, "embedded-order");
  const auto* created = StepOf(*outcome, "create-order");
  const auto* notified = StepOf(*outcome, "notify");
  ASSERT_NE(created, nullptr);
  ASSERT_NE(notified, nullptr);
  EXPECT_EQ(created->state, "completed");
  EXPECT_EQ(created->external_id, "ORD-1");  // adopted by the lookup, not made twice
  EXPECT_EQ(notified->external_id, "MSG-1");
  EXPECT_EQ(notified->attempts, 1);

  // The same business action started again is the first one.
  auto again = engine->Start("embedded-order", "", R"({"amount":12,"order_id":"A-1"})");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE((*again)->created());
  EXPECT_EQ((*again)->Wait(std::chrono::seconds(5))->state, InstanceState::kCompleted);
  auto found = engine->Find("A-1");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ((*found)->Get()->state, InstanceState::kCompleted);

  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0);
  EXPECT_EQ(stats["messages"], 1);
  EXPECT_EQ(stats["by_route"]["create_order"], 1);  // the lost answer was looked up, not resent
}

TEST_P(EmbeddedApiTest, BadInputIsAClearErrorAndStartsNothing) {
  EXPECT_EQ(Engine::Open({}).status().code(), Status::Code::kInvalidArgument);
  EngineOptions no_connections;
  no_connections.database = database_;
  no_connections.database_connections = 0;
  auto refused = Engine::Open(no_connections);
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("database_connections"), std::string::npos);
  EngineOptions bad_tenant;
  bad_tenant.database = database_;
  bad_tenant.tenant = "no spaces here";
  EXPECT_EQ(Engine::Open(bad_tenant).status().code(), Status::Code::kInvalidArgument);
  auto engine = Open(1);
  ASSERT_NE(engine, nullptr);
  // A definition mistake names the origin, the line and the field; nothing is registered.
  Status bad = engine->RegisterYaml(
      "workflow: broken\nkey: \"{{input.id}}\"\nsteps:\n"
      "  - name: s\n    request: { method: GET }\n",
      "broken.yaml");
  EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("broken.yaml"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("url"), std::string::npos) << bad.message();
  EXPECT_EQ(engine->Start("broken", "", R"({"id":"x"})").status().code(), Status::Code::kNotFound);
  Status missing = engine->RegisterFile(dir_.File("missing.yaml"));
  EXPECT_EQ(missing.code(), Status::Code::kNotFound) << missing.ToString();
  EXPECT_NE(missing.message().find("missing.yaml"), std::string::npos) << missing.message();

  // A key the definition does not give for this input: nothing starts.
  auto mismatch = engine->Start("embedded-order", "B-9", R"({"order_id":"B-1","amount":1})");
  ASSERT_EQ(mismatch.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("'B-9'"), std::string::npos);
  EXPECT_NE(mismatch.status().message().find("'B-1'"), std::string::npos);
  EXPECT_EQ(engine->Find("B-1").status().code(), Status::Code::kNotFound);
  EXPECT_EQ(engine->Find("B-9").status().code(), Status::Code::kNotFound);
  EXPECT_EQ(engine->Start("embedded-order", "", "[1,2]").status().code(),
            Status::Code::kInvalidArgument);

  // The same key with other input is refused and changes nothing.
  auto first = engine->Start("embedded-order", "", R"({"order_id":"C-1","amount":1})");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ((*first)->Wait(std::chrono::seconds(30))->state, InstanceState::kCompleted);
  auto other = engine->Start("embedded-order", "", R"({"order_id":"C-1","amount":2})");
  EXPECT_EQ(other.status().code(), Status::Code::kFailedPrecondition) << other.status().ToString();
  EXPECT_EQ(Stats()["orders"], 1);
}

// An engine without workers starts; another engine's workers on the same database
// run the instance (as `waystone worker` would), and the first one's Wait sees it.
TEST_P(EmbeddedApiTest, AnEngineWithoutWorkersStartsAndAnotherRunsIt) {
  auto starter = Open(0);
  ASSERT_NE(starter, nullptr);
  auto order = starter->Start("embedded-order", "", R"({"order_id":"D-1","amount":3})");
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  auto early = (*order)->Wait(std::chrono::milliseconds(300));
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(early->at_rest);  // nobody runs it yet
  EXPECT_EQ(early->state, InstanceState::kRunning);
  EXPECT_EQ(Stats()["by_route"]["create_order"], 0);
  auto runner = Open(2);
  ASSERT_NE(runner, nullptr);
  // Waiting "for ever" waits (a deadline that overflowed would return at once).
  auto outcome = (*order)->Wait(std::chrono::milliseconds::max());
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  EXPECT_TRUE(outcome->at_rest);
  EXPECT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(Stats()["orders"], 1);
  EXPECT_EQ(Stats()["messages"], 1);
}

// A workflow written as a function: the clock, a UUID and a random number are recorded
// once and replayed; a durable timer lets the instance rest and run again from the
// top, where each recorded step returns its result (the step's effect happens once).
// A new function that gives a recorded step another input parks the instance.
waystone::api::Workflow<int64_t, std::string> Timed(std::atomic<int>* runs,
                                                    std::atomic<int>* effects,
                                                    const std::string& version) {
  namespace api = waystone::api;
  return {
      "timed",
      [runs, effects, version](api::Context& ctx, const int64_t& n) -> api::Result<std::string> {
        ++*runs;
        auto before = ctx.Now();
        if (!before.ok()) return before.status();
        auto id = ctx.Uuid();
        if (!id.ok()) return id.status();
        auto dice = ctx.Random();
        if (!dice.ok()) return dice.status();
        api::StepOptions<int64_t> options;
        options.input = version;
        auto doubled = ctx.Step<int64_t>(
            "double",
            [&]() -> api::Result<int64_t> {
              ++*effects;
              return n * 2;
            },
            options);
        if (!doubled.ok()) return doubled.status();
        // (Input 5 sleeps long enough to be caught asleep.)
        const std::chrono::milliseconds nap(n == 5 ? 3000 : 400);
        if (api::Status slept = ctx.Sleep(nap); !slept.ok()) return slept;
        auto after = ctx.Now();
        if (!after.ok()) return after.status();
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(*after - *before).count();
        return *id + " " + std::to_string(*doubled) + " " + std::to_string(*dice) + " " +
               (waited >= 400 ? "slept" : "did not sleep " + std::to_string(waited));
      }};
}

TEST_P(EmbeddedApiTest, AFunctionsClockRandomnessAndTimerAreRecordedAndReplayed) {
  std::atomic<int> runs{0}, effects{0};
  auto timed = Timed(&runs, &effects, "v1");
  std::string output;
  {
    auto engine = Open(2);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->Register(timed).ok());
    EXPECT_EQ(engine->Start(timed, "", int64_t{21}).status().code(),
              Status::Code::kInvalidArgument);  // a function's start needs its key
    auto started = engine->Start(timed, "T-1", int64_t{21});
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    auto outcome = (*started)->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
    ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
    auto result = waystone::api::Output<std::string>(*outcome);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    output = *result;
    EXPECT_NE(output.find(" 42 "), std::string::npos) << output;
    EXPECT_NE(output.find("slept"), std::string::npos) << output;
    EXPECT_EQ(output[14], '4') << output;  // a version 4 UUID
    EXPECT_GE(runs.load(), 2);             // the timer: it rested, and ran again from the top
    EXPECT_EQ(effects.load(), 1);
    std::vector<std::string> names;
    for (const auto& step : outcome->steps) names.push_back(step.name);
    EXPECT_EQ(names, (std::vector<std::string>{"$now", "$uuid", "$random", "double", "$sleep",
                                               "$now", "$return"}));
    // Started again: the same instance, the same output; nothing runs.
    auto again = engine->Start(timed, "T-1", int64_t{21});
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE((*again)->created());
    EXPECT_EQ(*waystone::api::Output<std::string>(*(*again)->Get()), output);

    // T-2 rests on its timer when this engine goes.
    ASSERT_TRUE(engine->Start(timed, "T-2", int64_t{5}).ok());
    ASSERT_TRUE(waystone::testing::WaitFor(
        [&] {
          auto found = engine->Find("T-2");
          if (!found.ok()) return false;
          auto now = (*found)->Get();
          return now.ok() && now->steps.size() == 5 && now->steps[4].state == "waiting";
        },
        std::chrono::seconds(20)));
  }
  // The function changed: the step recorded with "v1" is asked for with "v2".
  auto changed = Timed(&runs, &effects, "v2");
  auto engine = Open(2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(changed).ok());
  auto parked = engine->Find("T-2");
  ASSERT_TRUE(parked.ok());
  auto outcome = (*parked)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->state, InstanceState::kNeedsAttention);
  EXPECT_NE(outcome->reason.find("definition_diverged: step 4 'double' was recorded with another "
                                 "input"),
            std::string::npos)
      << outcome->reason;
  EXPECT_EQ(effects.load(), 2);  // T-1's and T-2's: nothing ran again
  EXPECT_EQ(waystone::api::Output<std::string>(*outcome).status().code(),
            Status::Code::kFailedPrecondition);
}

// The program's code misbehaves: an exception thrown by a step is a rejection of that
// step (the process goes on), and a step that calls the context from inside itself
// is refused; each instance fails with a reason that says so.
TEST_P(EmbeddedApiTest, AThrowingStepOrOneThatCallsTheContextFailsItsInstanceNotTheProcess) {
  namespace api = waystone::api;
  api::Workflow<std::string, std::string> unruly(
      "unruly", [](api::Context& ctx, const std::string& how) -> api::Result<std::string> {
        return ctx.Step<std::string>("misbehave", [&]() -> api::Result<std::string> {
          if (how == "throw") throw std::runtime_error("no such customer");
          auto now = ctx.Now();  // inside a step: refused
          if (!now.ok()) return now.status();
          return std::string("called the context");
        });
      });
  auto engine = Open(2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(unruly).ok());
  for (const std::string how : {"throw", "nest"}) {
    auto started = engine->Start(unruly, "U-" + how, how);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    auto outcome = (*started)->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
    EXPECT_EQ(outcome->state, InstanceState::kFailed) << how << ": " << outcome->reason;
    EXPECT_NE(outcome->reason.find(how == "throw" ? "threw: no such customer"
                                                  : "may not call the workflow's context"),
              std::string::npos)
        << outcome->reason;
  }
}

// ctx.Call against the independent ERP target: the create's answer is lost after the
// order is made (it is looked up, not sent again), the message's connection closes
// before any answer (it is sent again under the same key, which the target honours),
// and a refused message undoes the order with its compensation. What the target
// counted is checked.
waystone::api::Workflow<std::string, std::string> CalledOrder(const std::string& erp) {
  namespace api = waystone::api;
  return {
      "called-order", [erp](api::Context& ctx, const std::string& to) -> api::Result<std::string> {
        const std::string ref = "call:" + ctx.key();
        api::CallOptions create;
        create.retry = {4, std::chrono::milliseconds(20), std::chrono::milliseconds(100)};
        create.lookup = api::HttpRequest{
            "GET", erp + "/erp/orders?ref=" + ref, {}, "", std::chrono::seconds(5)};
        create.found = [ref](const api::HttpResponse& answer) -> std::optional<api::HttpResponse> {
          const Json items =
              Json::parse(answer.body)["items"];  // (a temporary's part would dangle)
          for (const Json& item : items) {
            if (item["ref"] == ref) return api::HttpResponse{201, {}, item.dump()};
          }
          return std::nullopt;
        };
        create.compensate =
            [erp](const api::HttpResponse& made) -> std::optional<api::HttpRequest> {
          const std::string id = Json::parse(made.body)["id"];
          return api::HttpRequest{
              "POST", erp + "/erp/orders/" + id + "/cancel", {}, "{}", std::chrono::seconds(5)};
        };
        const api::HttpRequest order{"POST",
                                     erp + "/erp/orders",
                                     {{"Content-Type", "application/json"}},
                                     Json{{"ref", ref}, {"amount", 3}}.dump(),
                                     std::chrono::seconds(5)};
        auto made = ctx.Call("create-order", order, create);
        if (!made.ok()) return made.status();
        const std::string id = Json::parse(made->body)["id"];
        api::CallOptions notify;
        notify.repeatable = true;  // the target keeps one message per Idempotency-Key
        notify.retry = create.retry;
        Json message = {{"text", "order " + id}};
        if (!to.empty()) message["to"] = to;
        auto sent = ctx.Call("notify",
                             {"POST",
                              erp + "/notify/messages",
                              {{"Content-Type", "application/json"}},
                              message.dump(),
                              std::chrono::seconds(5)},
                             notify);
        if (!sent.ok()) return sent.status();
        return id;
      }};
}

TEST_P(EmbeddedApiTest, ACallIsLookedUpOrSentAgainUnderItsKeyAndUndoneOnFailure) {
  auto engine = Open(2);
  ASSERT_NE(engine, nullptr);
  const auto called = CalledOrder(target_->base_url());
  ASSERT_TRUE(engine->Register(called).ok());
  ASSERT_TRUE(target_->Faults(R"({"create_order": {"next": ["partial_body"]},
                                  "send_message": {"next": ["close_before_bytes"]}})"));
  auto started = engine->Start(called, "CALL-1", std::string("U-1"));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto outcome = (*started)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*waystone::api::Output<std::string>(*outcome), "ORD-1");
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["by_route"]["create_order"], 1) << stats.dump();  // looked up, not resent
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
  EXPECT_EQ(stats["by_route"]["send_message"], 2) << stats.dump();  // sent again, same key
  EXPECT_EQ(stats["duplicate_messages"], 0) << stats.dump();
  // Each request is in the step's attempt history, as a YAML step's (phase 1 call,
  // 2 lookup; status 0 when no whole answer came).
  const std::string history =
      "SELECT s.name, a.phase, a.status FROM attempts a JOIN steps s ON s.instance_id = "
      "a.instance_id AND s.step_index = a.step_index JOIN instances i ON i.id = a.instance_id "
      "WHERE i.business_key = 'CALL-1' ORDER BY a.step_index, a.seq";
  EXPECT_EQ(Query(history), "create-order|1|0\ncreate-order|2|200\nnotify|1|0\nnotify|1|200");

  // No recipient: the target refuses the message (422), and the order is cancelled.
  auto refused = engine->Start(called, "CALL-2", std::string());
  ASSERT_TRUE(refused.ok());
  outcome = (*refused)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->state, InstanceState::kCompensated) << outcome->reason;
  EXPECT_NE(outcome->reason.find("HTTP 422"), std::string::npos) << outcome->reason;
  stats = Stats();
  EXPECT_EQ(stats["orders"], 2) << stats.dump();
  ASSERT_EQ(stats["cancels"].size(), 1u) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
}

// A lookup over pages, against the independent paged ERP (tests/targets/
// paged_erp_target.py: a loose substring search, two results a page, a "next" link):
// the create's answer is lost after the order is made, and the lookup reads page
// after page until the fourth holds it, past six older orders whose references
// contain this one's. One order; four pages read, each in the attempt history.
TEST_P(EmbeddedApiTest, ALookupReadsPagesUntilItFindsTheCall) {
  namespace api = waystone::api;
  waystone::testing::TargetProcess erp(dir_.path(), "paged_erp_target.py", {});
  ASSERT_TRUE(erp.ok());
  const std::string base = erp.base_url();
  ASSERT_NE(erp.Call("POST", "/_target/seed", R"({"orders": [{"ref": "pg-10"}, {"ref": "pg-11"},
      {"ref": "pg-12"}, {"ref": "pg-13"}, {"ref": "pg-14"}, {"ref": "pg-15"}]})"),
            "");
  ASSERT_NE(erp.Call("POST", "/_target/settings", R"({"create_faults": ["lost"]})"), "");
  api::Workflow<std::string, std::string> paged(
      "paged-order", [base](api::Context& ctx, const std::string& ref) -> api::Result<std::string> {
        api::CallOptions create;
        create.retry = {4, std::chrono::milliseconds(20), std::chrono::milliseconds(100)};
        create.unknown = create.retry;
        create.lookup = api::HttpRequest{
            "GET", base + "/api/orders?q=" + ref + "&per_page=2", {}, "", std::chrono::seconds(5)};
        create.found = [ref](const api::HttpResponse& page) -> std::optional<api::HttpResponse> {
          const Json data = Json::parse(page.body)["data"];
          for (const Json& order : data) {
            if (order["ref"] == ref)
              return api::HttpResponse{200, {}, Json{{"data", order}}.dump()};
          }
          return std::nullopt;
        };
        create.next_page =
            [base](const api::HttpResponse& page) -> std::optional<api::HttpRequest> {
          const Json next = Json::parse(page.body)["next"];
          if (next.is_null()) return std::nullopt;
          return api::HttpRequest{
              "GET", base + next.get<std::string>(), {}, "", std::chrono::seconds(5)};
        };
        return CreatePagedOrder(ctx, base, Json{{"ref", ref}}, create);
      });
  auto engine = OpenBare(2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(paged).ok());
  auto started = engine->Start(paged, "PAGED-1", std::string("pg-1"));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto outcome = (*started)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*api::Output<std::string>(*outcome), "SO-7");
  const Json stats = Json::parse(erp.StatsJson());
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["creates_received"], 1) << stats.dump();
  EXPECT_EQ(stats["searches"]["v1"], 4) << stats.dump();
  EXPECT_EQ(Query("SELECT COUNT(*) FROM attempts a JOIN instances i ON i.id = a.instance_id "
                  "WHERE i.business_key = 'PAGED-1' AND a.phase = 2 AND a.status = 200"),
            "4");
}

// An API that answers 200 and says in the body that nothing happened (the paged
// ERP's {"status":"ERROR","code":"RATE_LIMIT"}, committing nothing): the call's
// `classify` reads the body, so the rate limit is retried (one order, two creates
// received) and a validation error fails the call, where by status alone both would
// have been taken as orders made.
TEST_P(EmbeddedApiTest, ACallsBodyCanSayItFailed) {
  namespace api = waystone::api;
  waystone::testing::TargetProcess erp(dir_.path(), "paged_erp_target.py", {});
  ASSERT_TRUE(erp.ok());
  const std::string base = erp.base_url();
  ASSERT_NE(erp.Call("POST", "/_target/settings", R"({"create_faults": ["rate_limit"]})"), "");
  api::Workflow<std::string, std::string> order(
      "body-classified",
      [base](api::Context& ctx, const std::string& ref) -> api::Result<std::string> {
        api::CallOptions create;
        create.retry = {4, std::chrono::milliseconds(20), std::chrono::milliseconds(100)};
        create.classify = [](const api::HttpResponse& answer) -> std::optional<api::ErrorClass> {
          const Json body = Json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
          if (!body.is_object() || body.value("status", "") != "ERROR") return std::nullopt;
          if (body.value("code", "") == "RATE_LIMIT") return api::ErrorClass::kTransient;
          return api::ErrorClass::kRejected;
        };
        return CreatePagedOrder(ctx, base, ref.empty() ? Json{{"amount", 1}} : Json{{"ref", ref}},
                                create);
      });
  auto engine = OpenBare(2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(order).ok());
  auto limited = engine->Start(order, "BODY-1", std::string("body-1"));
  ASSERT_TRUE(limited.ok()) << limited.status().ToString();
  auto outcome = (*limited)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*api::Output<std::string>(*outcome), "SO-1");
  Json stats = Json::parse(erp.StatsJson());
  EXPECT_EQ(stats["creates_received"], 2) << stats.dump();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  // The attempt history classes the first answer by its body (1: transient).
  EXPECT_EQ(Query("SELECT a.status, a.error_class FROM attempts a JOIN instances i ON i.id = "
                  "a.instance_id WHERE i.business_key = 'BODY-1' ORDER BY a.seq"),
            "200|1\n200|0");

  auto invalid = engine->Start(order, "BODY-2", std::string());
  ASSERT_TRUE(invalid.ok());
  outcome = (*invalid)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->state, InstanceState::kFailed) << outcome->reason;
  EXPECT_NE(outcome->reason.find("VALIDATION"), std::string::npos) << outcome->reason;
  stats = Json::parse(erp.StatsJson());
  EXPECT_EQ(stats["creates_received"], 3) << stats.dump();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
}

// A call refused with 503 and Retry-After: 120 is sent again no sooner than the
// server asked, though its own backoff is at most 100 ms (a manual clock: what the
// target counts decides, not the time the machine takes).
TEST_P(EmbeddedApiTest, ACallHonoursTheServersRetryAfter) {
  auto clock = waystone::api::ManualClock::Create(kClockStart);
  auto engine = OpenBare(1, clock);
  ASSERT_NE(engine, nullptr);
  const auto called = CalledOrder(target_->base_url());
  ASSERT_TRUE(engine->Register(called).ok());
  ASSERT_TRUE(
      target_->Faults(R"({"send_message": {"next": ["refuse_503"], "retry_after_s": 120}})"));
  auto started = engine->Start(called, "LATER-1", std::string("U-1"));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ASSERT_TRUE(waystone::testing::WaitFor([&] { return Stats()["by_route"]["send_message"] == 1; },
                                         std::chrono::seconds(20)));
  // The target counts the request before the engine has its answer: the clock moves
  // only once the engine rested the instance until the time the server asked for
  // (moved before, the wait would start from the moved time).
  const int64_t asked_until =
      std::chrono::duration_cast<std::chrono::milliseconds>(kClockStart.time_since_epoch())
          .count() +
      120'000;
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {
        return Query("SELECT CASE WHEN next_run_at >= " + std::to_string(asked_until) +
                     " THEN 1 ELSE 0 END FROM instances WHERE business_key = 'LATER-1'") == "1";
      },
      std::chrono::seconds(20)));
  clock->Advance(std::chrono::seconds(60));
  auto early = (*started)->Wait(std::chrono::milliseconds(1500));
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->state, InstanceState::kRunning);
  EXPECT_EQ(Stats()["by_route"]["send_message"], 1) << Stats().dump();
  clock->Advance(std::chrono::seconds(61));
  auto outcome = (*started)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  const Json stats = Stats();
  EXPECT_EQ(stats["by_route"]["send_message"], 2) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
}

// Retries by error class: with 2 transient attempts and 3 unknown outcomes allowed,
// a message whose answers are lost, refused with 503 and lost again is sent a
// fourth time (one budget does not spend the other's: the 503 is its first
// transient failure though it came on the second attempt); each budget, spent
// alone, stops the step its own way: two 503s fail it, three lost answers leave it
// to an operator. Counted at the independent target.
TEST_P(EmbeddedApiTest, EachErrorClassIsRetriedWithinItsOwnBudget) {
  namespace api = waystone::api;
  const std::string erp = target_->base_url();
  api::Workflow<std::string, std::string> message(
      "budgeted-message",
      [erp](api::Context& ctx, const std::string& text) -> api::Result<std::string> {
        api::CallOptions notify;
        notify.repeatable = true;  // the target keeps one message per Idempotency-Key
        notify.retry = {2, std::chrono::milliseconds(10), std::chrono::milliseconds(40)};
        notify.unknown = {3, std::chrono::milliseconds(10), std::chrono::milliseconds(40)};
        auto sent = ctx.Call("notify",
                             {"POST",
                              erp + "/notify/messages",
                              {{"Content-Type", "application/json"}},
                              Json{{"to", "sales"}, {"text", text}}.dump(),
                              std::chrono::seconds(5)},
                             notify);
        if (!sent.ok()) return sent.status();
        return std::string(Json::parse(sent->body)["id"]);
      });
  auto engine = OpenBare(2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(message).ok());
  auto run = [&](const std::string& key) {
    auto started = engine->Start(message, key, "hello " + key);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    auto outcome = started.ok() ? (*started)->Wait(std::chrono::seconds(30))
                                : waystone::api::Result<Outcome>(started.status());
    EXPECT_TRUE(outcome.ok()) << outcome.status().ToString();
    EXPECT_TRUE(outcome.ok() && outcome->at_rest);
    return outcome.ok() ? *outcome : Outcome();
  };

  ASSERT_TRUE(target_->Faults(
      R"({"send_message": {"next": ["close_before_bytes", "refuse_503", "close_before_bytes"]}})"));
  Outcome outcome = run("BUDGET-1");
  ASSERT_EQ(outcome.state, InstanceState::kCompleted) << outcome.reason;
  Json stats = Stats();
  EXPECT_EQ(stats["by_route"]["send_message"], 4) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
  EXPECT_EQ(Query("SELECT s.attempts, s.unknowns FROM steps s JOIN instances i ON i.id = "
                  "s.instance_id WHERE i.business_key = 'BUDGET-1' AND s.name = 'notify'"),
            "4|2");

  ASSERT_TRUE(target_->Faults(R"({"send_message": {"next": ["refuse_503", "refuse_503"]}})"));
  outcome = run("BUDGET-2");
  EXPECT_EQ(outcome.state, InstanceState::kFailed) << outcome.reason;
  EXPECT_NE(outcome.reason.find("HTTP 503"), std::string::npos) << outcome.reason;
  stats = Stats();
  EXPECT_EQ(stats["by_route"]["send_message"], 6) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();

  ASSERT_TRUE(target_->Faults(R"({"send_message": {"next": ["close_before_bytes",
      "close_before_bytes", "close_before_bytes"]}})"));
  outcome = run("BUDGET-3");
  EXPECT_EQ(outcome.state, InstanceState::kNeedsAttention) << outcome.reason;
  EXPECT_NE(outcome.reason.find("outcome was unknown 3 times"), std::string::npos)
      << outcome.reason;
  stats = Stats();
  EXPECT_EQ(stats["by_route"]["send_message"], 9) << stats.dump();
  EXPECT_EQ(stats["messages"], 2) << stats.dump();  // the first of the three made it
}

// A step past its timeout: its lease runs out at the timeout and the engine's other
// worker recovers it as after a crash, while the first run still hangs. Repeatable,
// it runs again and the instance completes; the late run's result, when it comes,
// is not recorded. Not repeatable and without a lookup, it waits for an operator
// who is told why.
TEST_P(EmbeddedApiTest, AStepPastItsTimeoutIsRecoveredWhileItsLateRunIsRefused) {
  namespace api = waystone::api;
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    std::map<std::string, int> runs;  // by business key
    int returned_late = 0;
  };
  auto gate = std::make_shared<Gate>();
  api::Workflow<bool, std::string> slow(
      "slow-reserve",
      [gate](api::Context& ctx, const bool& repeatable) -> api::Result<std::string> {
        api::StepOptions<std::string> options;
        options.repeatable = repeatable;
        options.timeout = std::chrono::milliseconds(300);
        options.unknown = {3, std::chrono::milliseconds(10), std::chrono::milliseconds(40)};
        return ctx.Step<std::string>(
            "reserve",
            [gate, &ctx]() -> api::Result<std::string> {
              std::unique_lock lock(gate->mu);
              if (++gate->runs[ctx.key()] > 1) return std::string("prompt");
              // The first run hangs until the test lets it go.
              gate->cv.wait_for(lock, std::chrono::seconds(60), [&] { return gate->open; });
              ++gate->returned_late;
              gate->cv.notify_all();
              return std::string("late");
            },
            options);
      });
  struct Release {  // lets a hung run go before its engine stops (it waits for it)
    std::shared_ptr<Gate> gate;
    ~Release() {
      std::lock_guard lock(gate->mu);
      gate->open = true;
      gate->cv.notify_all();
    }
  };
  auto let_go = [&](int late_runs) {
    std::unique_lock lock(gate->mu);
    gate->open = true;
    gate->cv.notify_all();
    EXPECT_TRUE(gate->cv.wait_for(lock, std::chrono::seconds(20),
                                  [&] { return gate->returned_late == late_runs; }));
    gate->open = false;
  };
  // The step row as the database holds it (state 3 completed, 5 unknown).
  const std::string row =
      "SELECT s.state, s.attempts, s.unknowns, s.response_json FROM steps s JOIN instances i "
      "ON i.id = s.instance_id WHERE s.name = 'reserve' AND i.business_key = ";

  {
    auto engine = OpenBare(2);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->Register(slow).ok());
    Release release{gate};
    auto started = engine->Start(slow, "SLOW-1", true);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    auto outcome = (*started)->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(outcome.ok());
    ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
    EXPECT_EQ(*api::Output<std::string>(*outcome), "prompt");
    let_go(1);
    engine.reset();  // its workers joined: the late run's commit was tried, and refused
    auto after = (*started)->Wait(std::chrono::seconds(1));  // read from the database alone
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->state, InstanceState::kCompleted);
    EXPECT_EQ(*api::Output<std::string>(*after), "prompt");
    EXPECT_EQ(Query(row + "'SLOW-1'"), "3|2|1|\"prompt\"");
  }
  {
    auto engine = OpenBare(2);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->Register(slow).ok());
    Release release{gate};
    {
      std::lock_guard lock(gate->mu);
      gate->open = false;  // (the first block's Release opened it)
    }
    auto started = engine->Start(slow, "SLOW-2", false);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    auto outcome = (*started)->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(outcome.ok());
    ASSERT_EQ(outcome->state, InstanceState::kNeedsAttention) << outcome->reason;
    EXPECT_NE(outcome->reason.find("may have acted"), std::string::npos) << outcome->reason;
    const auto* reserve = StepOf(*outcome, "reserve");
    ASSERT_NE(reserve, nullptr);
    EXPECT_EQ(reserve->state, "unknown");
    EXPECT_NE(reserve->error.find("ran past its timeout of 300 ms"), std::string::npos)
        << reserve->error;
    let_go(2);
    engine.reset();
    EXPECT_EQ(Query(row + "'SLOW-2'"), "5|1|1|");
    auto after = (*started)->Wait(std::chrono::seconds(1));  // read from the database alone
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->state, InstanceState::kNeedsAttention);
  }
}

// A function waits for an event (the instance rests meanwhile): the event's data is
// what ctx.WaitEvent returns; another type is kept (nothing waits for it); the same
// event again changes nothing; with no event the timeout comes.
TEST_P(EmbeddedApiTest, AFunctionWaitsForItsEventOrItsTimeout) {
  namespace api = waystone::api;
  api::Workflow<int64_t, std::string> approval(
      "approval", [](api::Context& ctx, const int64_t& wait_ms) -> api::Result<std::string> {
        auto decided = ctx.WaitEvent("com.example.approved", std::chrono::milliseconds(wait_ms));
        if (decided.ok()) return "approved " + *decided;
        if (decided.status().code() == api::Status::Code::kDeadlineExceeded) {
          return std::string("no answer");
        }
        return decided.status();
      });
  auto engine = Open(2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(approval).ok());
  EXPECT_EQ(engine->Signal("nobody", "com.example.approved", "crm", "e-0", "{}").code(),
            Status::Code::kNotFound);
  auto waiting = engine->Start(approval, "AP-1", int64_t{60'000});
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {
        auto now = (*waiting)->Get();
        return now.ok() && !now->steps.empty() && now->steps[0].state == "waiting";
      },
      std::chrono::seconds(20)));
  EXPECT_TRUE(engine->Signal("AP-1", "com.example.other", "crm", "e-1", "{}").ok());
  EXPECT_EQ(engine->Signal("AP-1", "com.example.approved", "crm", "e-2", "{not json").code(),
            Status::Code::kInvalidArgument);
  Status delivered =
      engine->Signal("AP-1", "com.example.approved", "crm", "e-2", R"({"by":"alice"})");
  ASSERT_TRUE(delivered.ok()) << delivered.ToString();
  auto outcome = (*waiting)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*waystone::api::Output<std::string>(*outcome), R"(approved {"by":"alice"})");
  EXPECT_TRUE(
      engine->Signal("AP-1", "com.example.approved", "crm", "e-2", R"({"by":"alice"})").ok());
  EXPECT_EQ(Query("SELECT event_type, event_id, taken_by IS NULL FROM kept_events"),
            Query("SELECT 'com.example.other', 'e-1', 1 = 1"));

  auto unanswered = engine->Start(approval, "AP-2", int64_t{300});
  ASSERT_TRUE(unanswered.ok());
  outcome = (*unanswered)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*waystone::api::Output<std::string>(*outcome), "no answer");
}

// Testing a workflow with a clock moved by hand: an hour's durable timer comes due
// when the test advances the clock, not before, and the recorded times say an hour.
TEST_P(EmbeddedApiTest, AManualClockMovesAFunctionsTimers) {
  namespace api = waystone::api;
  api::Workflow<int64_t, int64_t> nap(
      "nap", [](api::Context& ctx, const int64_t&) -> api::Result<int64_t> {
        auto before = ctx.Now();
        if (!before.ok()) return before.status();
        if (api::Status slept = ctx.Sleep(std::chrono::hours(1)); !slept.ok()) return slept;
        auto after = ctx.Now();
        if (!after.ok()) return after.status();
        return static_cast<int64_t>(
            std::chrono::duration_cast<std::chrono::minutes>(*after - *before).count());
      });
  auto clock = api::ManualClock::Create(kClockStart);
  auto engine = OpenBare(2, clock);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(nap).ok());
  auto started = engine->Start(nap, "NAP-1", int64_t{0});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  // It sleeps (however long the machine takes to get there), and stays asleep: an
  // hour to go on its clock, whatever real time passes.
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {
        auto now = (*started)->Get();
        return now.ok() && now->steps.size() == 2 && now->steps[1].state == "waiting";
      },
      std::chrono::seconds(20)));
  auto asleep = (*started)->Wait(std::chrono::milliseconds(300));
  ASSERT_TRUE(asleep.ok());
  EXPECT_EQ(asleep->state, InstanceState::kRunning);
  ASSERT_EQ(asleep->steps.size(), 2u);
  clock->Advance(std::chrono::hours(1));
  auto outcome = (*started)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*waystone::api::Output<int64_t>(*outcome), 60);
  EXPECT_EQ(clock->Now(), kClockStart + std::chrono::hours(1));
}

// An event that comes after its wait timed out is refused, even before a worker has
// recorded the timeout (the manual clock passed it while nothing ran).
TEST_P(EmbeddedApiTest, AnEventAfterItsTimeoutIsRefused) {
  namespace api = waystone::api;
  api::Workflow<int64_t, std::string> waits(
      "waits", [](api::Context& ctx, const int64_t&) -> api::Result<std::string> {
        auto data = ctx.WaitEvent("com.example.paid", std::chrono::minutes(1));
        if (data.ok()) return *data;
        if (data.status().code() == api::Status::Code::kDeadlineExceeded) {
          return std::string("unpaid");
        }
        return data.status();
      });
  auto clock = api::ManualClock::Create(kClockStart);
  auto engine = OpenBare(1, clock);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Register(waits).ok());
  auto started = engine->Start(waits, "PAY-1", int64_t{0});
  ASSERT_TRUE(started.ok());
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {
        auto now = (*started)->Get();
        return now.ok() && !now->steps.empty() && now->steps[0].state == "waiting";
      },
      std::chrono::seconds(20)));
  clock->Advance(std::chrono::minutes(2));
  EXPECT_EQ(engine->Signal("PAY-1", "com.example.paid", "bank", "p-1", "{}").code(),
            Status::Code::kDeadlineExceeded);
  auto outcome = (*started)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*waystone::api::Output<std::string>(*outcome), "unpaid");
}

// Events that come before the function waits for them (here: while it sleeps) are
// kept, wake nothing, and are taken by its waits in the order they came; the same
// event again is a duplicate, the same id with other data a conflict; an instance
// keeps at most 100; a kept event survives the engine's restart.
TEST_P(EmbeddedApiTest, AnEventBeforeItsWaitIsKeptAndTakenInOrder) {
  namespace api = waystone::api;
  api::Workflow<int64_t, std::string> payments(
      "payments", [](api::Context& ctx, const int64_t&) -> api::Result<std::string> {
        if (api::Status slept = ctx.Sleep(std::chrono::hours(1)); !slept.ok()) return slept;
        std::string paid;
        for (int i = 0; i < 2; ++i) {
          auto data = ctx.WaitEvent("com.example.paid", std::chrono::minutes(1));
          if (!data.ok()) return data.status();
          paid += *data;
        }
        return paid;
      });
  auto clock = api::ManualClock::Create(kClockStart);
  auto open = [&] {
    auto engine = OpenBare(1, clock);
    if (engine != nullptr) {
      EXPECT_TRUE(engine->Register(payments).ok());
    }
    return engine;
  };
  auto engine = open();
  ASSERT_NE(engine, nullptr);
  auto started = engine->Start(payments, "PAY-7", int64_t{0});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ASSERT_TRUE(waystone::testing::WaitFor(
      [&] {
        auto now = (*started)->Get();
        return now.ok() && now->steps.size() == 1 && now->steps[0].state == "waiting";
      },
      std::chrono::seconds(20)));
  const std::string due = "SELECT next_run_at FROM instances WHERE business_key = 'PAY-7'";
  const std::string due_before = Query(due);
  ASSERT_TRUE(engine->Signal("PAY-7", "com.example.paid", "bank", "p-1", R"({"n":1})").ok());
  ASSERT_TRUE(engine->Signal("PAY-7", "com.example.paid", "bank", "p-2", R"({"n":2})").ok());
  EXPECT_TRUE(engine->Signal("PAY-7", "com.example.paid", "bank", "p-1", R"({"n":1})").ok());
  EXPECT_EQ(engine->Signal("PAY-7", "com.example.paid", "bank", "p-1", R"({"n":9})").code(),
            Status::Code::kFailedPrecondition);
  for (int i = 0; i < 98; ++i) {
    Status kept =
        engine->Signal("PAY-7", "com.example.noise", "bank", "n-" + std::to_string(i), "{}");
    ASSERT_TRUE(kept.ok()) << i << ": " << kept.ToString();
  }
  Status full = engine->Signal("PAY-7", "com.example.noise", "bank", "n-98", "{}");
  EXPECT_EQ(full.code(), Status::Code::kFailedPrecondition) << full.ToString();
  EXPECT_NE(full.message().find("keeps 100 events"), std::string::npos) << full.ToString();
  // Nothing woke it: due when its timer is, one step recorded, 100 kept.
  EXPECT_EQ(Query(due), due_before);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM kept_events WHERE taken_by IS NULL"), "100");
  auto asleep = (*started)->Get();
  ASSERT_TRUE(asleep.ok());
  EXPECT_EQ(asleep->state, InstanceState::kRunning);
  EXPECT_EQ(asleep->steps.size(), 1u);

  // Kept in the database: another engine on it takes them.
  engine.reset();
  engine = open();
  ASSERT_NE(engine, nullptr);
  clock->Advance(std::chrono::hours(1));
  auto restarted = engine->Find("PAY-7");
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  auto outcome = (*restarted)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->state, InstanceState::kCompleted) << outcome->reason;
  EXPECT_EQ(*waystone::api::Output<std::string>(*outcome), R"({"n":1}{"n":2})");
  int waits = 0;
  for (const auto& step : outcome->steps) {
    if (step.name != "$wait:com.example.paid") continue;
    ++waits;
    EXPECT_EQ(step.state, "completed");
  }
  EXPECT_EQ(waits, 2);
  // Taken: the same event again is a duplicate, not kept anew.
  EXPECT_TRUE(engine->Signal("PAY-7", "com.example.paid", "bank", "p-2", R"({"n":2})").ok());
  EXPECT_EQ(Query("SELECT event_id FROM kept_events WHERE taken_by IS NOT NULL ORDER BY seq"),
            "p-1\np-2");
  EXPECT_EQ(Query("SELECT COUNT(*) FROM kept_events WHERE taken_by IS NULL"), "98");
}

TEST(EmbeddedApiVersionTest, TheLibraryAndTheHeadersAgree) {
  const std::string headers = std::to_string(WAYSTONE_VERSION_MAJOR) + "." +
                              std::to_string(WAYSTONE_VERSION_MINOR) + "." +
                              std::to_string(WAYSTONE_VERSION_PATCH);
  EXPECT_EQ(headers, waystone::api::Version());
  EXPECT_EQ(headers, WAYSTONE_VERSION_STRING);
}

INSTANTIATE_TEST_SUITE_P(Backends, EmbeddedApiTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         waystone::testing::BackendName);

}  // namespace
