// Body-level errors and paginated lookups against tests/targets/paged_erp_target.py,
// an ERP written from its README by someone who had not read our code (Python
// standard library): it answers errors inside HTTP 200 bodies, searches loosely
// (a substring of the ref) over pages, lets its index lag behind writes, and
// honours no idempotency key. What counts is what it received and committed.

#include <cstdlib>

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

// One create with body-level error rules and a lookup over pages; `lookup` and
// `body` are spliced in so each test says which shape it uses.
std::string Workflow(const std::string& lookup,
                     const std::string& body = R"({ ref: "{{instance.ref}}", amount: 5 })") {
  return R"(workflow: paged-order
key: "{{input.id}}"
steps:
  - name: create-order
    recovery: lookup
    request:
      method: POST
      url: "{{env.PAGED_URL}}/api/orders"
      body: )" +
         body + R"(
      timeout: 300ms
    result: { external_id: /data/order_no }
    errors:
      503: transient
      body:
        - match: { /status: ERROR, /code: RATE_LIMIT }
          class: transient
        - match: { /status: ERROR, /code: DUPLICATE }
          class: exists
        - match: { /status: ERROR, /code: VALIDATION }
          class: rejected
    retry: { max_attempts: 12, initial_interval: 100ms }
    lookup:
)" + lookup;
}

// The v1 search: 2 a page, each answer linking the next.
constexpr char kNextLinks[] =
    R"(      request: { method: GET, url: "{{env.PAGED_URL}}/api/orders?q={{instance.ref}}&per_page=2" }
      items: /data
      match: { /ref: "{{instance.ref}}" }
      external_id: /order_no
      pages: { next: /next, max: 10 }
)";

class PagedTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<testing::PagedErpTarget>(dir_.path());
    ASSERT_TRUE(target_->ok());
    setenv("PAGED_URL", target_->base_url().c_str(), 1);
    auto store = OpenStore({dir_.File("paged.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // Runs one instance of `text` (key "o-1") to rest on the caller's thread.
  InstanceRecord Run(const std::string& text, const std::string& id = "o-1") {
    auto definition = LoadDefinitionText(text, "paged-order.yaml");
    EXPECT_TRUE(definition.ok()) << definition.status();
    if (!definition.ok()) return {};
    auto started = engine_->StartInstance(*definition, {"default", Json{{"id", id}}.dump()});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  StepRecord CreateStep(const InstanceRecord& instance) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok() && !steps->empty());
    return steps.ok() && !steps->empty() ? steps->front() : StepRecord{};
  }

  std::vector<AlertKind> AlertKinds(const InstanceRecord& instance) {
    std::vector<AlertKind> kinds;
    auto alerts = store_->ListAlerts(instance.id);
    EXPECT_TRUE(alerts.ok()) << alerts.status();
    if (!alerts.ok()) return kinds;
    for (const AlertRecord& alert : *alerts) kinds.push_back(alert.kind);
    return kinds;
  }

  // Seeds orders whose refs hold "default:o-1" (the loose search matches them all).
  void SeedNeighbours(const std::vector<std::string>& refs) {
    Json orders = Json::array();
    for (const std::string& ref : refs) orders.push_back({{"ref", ref}});
    ASSERT_TRUE(target_->Seed(Json{{"orders", orders}}.dump()));
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  testing::TempDir dir_;
  SeededRandom random_{11};
  std::unique_ptr<testing::PagedErpTarget> target_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(PagedTargetTest, ARateLimitInsideA200IsTransientAndRetried) {
  ASSERT_TRUE(target_->Settings(R"({"create_faults": ["rate_limit", "rate_limit"]})"));
  InstanceRecord instance = Run(Workflow(kNextLinks));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const StepRecord create = CreateStep(instance);
  EXPECT_EQ(create.attempts, 3);
  EXPECT_EQ(create.unknowns, 0);
  EXPECT_EQ(create.lookups, 0);
  EXPECT_EQ(create.external_id, "SO-1");
  const Json stats = Stats();
  EXPECT_EQ(stats["creates_received"], 3) << stats.dump();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  auto attempts = store_->ListAttempts(instance.id);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 3u);
  EXPECT_EQ((*attempts)[0].error_class, ErrorClass::kTransient);
  EXPECT_EQ((*attempts)[0].status, 200);
}

TEST_F(PagedTargetTest, AValidationErrorInsideA200IsRejectedNotRetried) {
  InstanceRecord instance = Run(Workflow(kNextLinks, "{ amount: 5 }"));  // no ref
  EXPECT_EQ(instance.state, InstanceState::kFailed) << instance.status_reason;
  const StepRecord create = CreateStep(instance);
  EXPECT_EQ(create.state, StepState::kFailed);
  EXPECT_EQ(create.error_class, ErrorClass::kRejected);
  EXPECT_NE(create.error_message.find("VALIDATION"), std::string::npos) << create.error_message;
  EXPECT_EQ(Stats()["creates_received"], 1);
}

// The lost create's order is the sixth match of the loose search: page 3 of 2 each.
TEST_F(PagedTargetTest, ALookupFollowsNextLinksToTheOrderOnALaterPage) {
  SeedNeighbours({"default:o-10", "default:o-11", "default:o-12", "default:o-13", "default:o-14"});
  ASSERT_TRUE(target_->Settings(R"({"create_faults": ["lost"]})"));
  InstanceRecord instance = Run(Workflow(kNextLinks));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const StepRecord create = CreateStep(instance);
  EXPECT_EQ(create.resolution, Resolution::kLookupFound);
  EXPECT_EQ(create.external_id, "SO-6");
  EXPECT_EQ(create.lookups, 1);
  const Json stats = Stats();
  EXPECT_EQ(stats["creates_received"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["pages_served"], 3) << stats.dump();
  // One attempt record per page asked, each a lookup.
  auto attempts = store_->ListAttempts(instance.id);
  ASSERT_TRUE(attempts.ok());
  int lookups = 0;
  for (const AttemptRecord& a : *attempts) lookups += a.phase == AttemptPhase::kLookup ? 1 : 0;
  EXPECT_EQ(lookups, 3);
}

TEST_F(PagedTargetTest, ALookupCountingPagesReadsUntilAnEmptyPage) {
  SeedNeighbours({"default:o-10", "default:o-11", "default:o-12", "default:o-13"});
  ASSERT_TRUE(target_->Settings(R"({"create_faults": ["lost"]})"));
  InstanceRecord instance = Run(Workflow(
      R"(      request: { method: GET, url: "{{env.PAGED_URL}}/api/v2/orders?q={{instance.ref}}" }
      items: /items
      match: { /ref: "{{instance.ref}}" }
      external_id: /order_no
      pages: { param: page, first: 1 }
)"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(CreateStep(instance).external_id, "SO-5");
  const Json stats = Stats();
  EXPECT_EQ(stats["creates_received"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["searches"]["v2"], 4) << "pages 1-3, then the empty page 4: " << stats.dump();
}

// Without reading every page the lookup proves nothing: it pauses, never resubmits.
TEST_F(PagedTargetTest, MorePagesThanTheLookupMayReadPauseTheInstance) {
  SeedNeighbours({"default:o-10", "default:o-11", "default:o-12", "default:o-13"});
  ASSERT_TRUE(target_->Settings(R"({"create_faults": ["lost"]})"));
  std::string lookup = kNextLinks;
  lookup.replace(lookup.find("max: 10"), 7, "max: 2");
  InstanceRecord instance = Run(Workflow(lookup));
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention);
  EXPECT_NE(instance.status_reason.find("more than 2 pages"), std::string::npos)
      << instance.status_reason;
  EXPECT_EQ(CreateStep(instance).state, StepState::kUnknown);
  EXPECT_EQ(AlertKinds(instance), std::vector<AlertKind>{AlertKind::kNeedsOperator});
  const Json stats = Stats();
  EXPECT_EQ(stats["creates_received"], 1) << stats.dump();
  EXPECT_EQ(stats["pages_served"], 2) << stats.dump();
}

// An order with the same ref was already there (on page 1); ours is on page 3.
TEST_F(PagedTargetTest, TwoMatchesOnDifferentPagesAreAContradiction) {
  SeedNeighbours({"default:o-1", "default:o-10", "default:o-11", "default:o-12"});
  ASSERT_TRUE(target_->Settings(R"({"create_faults": ["lost"]})"));
  InstanceRecord instance = Run(Workflow(kNextLinks));
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention);
  EXPECT_EQ(CreateStep(instance).state, StepState::kUnknown);
  EXPECT_EQ(AlertKinds(instance), std::vector<AlertKind>{AlertKind::kLookupContradiction});
  EXPECT_NE(instance.status_reason.find("found 2 objects"), std::string::npos)
      << instance.status_reason;
  const Json stats = Stats();
  EXPECT_EQ(stats["creates_received"], 1) << stats.dump();
  EXPECT_EQ(stats["orders_by_ref"]["default:o-1"], 2) << "the seeded one and ours, no third";
}

// The create's answer is lost and the search lags 0.8 s behind writes: the lookup
// after the request's timeout finds nothing, so the step is sent again; the ERP
// answers DUPLICATE (class exists): never sent a third time, looked up again with
// backoff until the index shows the order, which is adopted.
TEST_F(PagedTargetTest, ADuplicateAnswerIsAdoptedOnceTheSearchShowsTheOrder) {
  ASSERT_TRUE(
      target_->Settings(R"({"dedupe": true, "search_lag_ms": 800, "create_faults": ["lost"]})"));
  InstanceRecord instance = Run(Workflow(kNextLinks));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const StepRecord create = CreateStep(instance);
  EXPECT_EQ(create.resolution, Resolution::kLookupFound);
  EXPECT_EQ(create.external_id, "SO-1");
  EXPECT_EQ(create.attempts, 2);
  EXPECT_GE(create.lookups, 3) << "one before the resend, then until the index caught up";
  const Json stats = Stats();
  EXPECT_EQ(stats["creates_received"], 2) << stats.dump();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
}

}  // namespace
}  // namespace waystone
