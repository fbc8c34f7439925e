// The outbox relay in-process against real webhook endpoints on loopback, with a
// FakeClock to step through retry timers. Signatures are checked by an
// implementation written here from the Standard Webhooks spec, not by the relay's.

#include "messaging/relay.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "definition/loader.h"
#include "engine/engine.h"
#include "messaging/webhook_signature.h"
#include "sim/simulator.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kSecret[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

// Verifies a Standard Webhooks signature: "v1,<base64 HMAC-SHA256(key, id.ts.body)>".
bool IndependentVerify(const std::string& id, const std::string& timestamp, const std::string& body,
                       const std::string& header, long long now_s) {
  if (std::llabs(now_s - std::atoll(timestamp.c_str())) > 300) return false;
  const std::string b64 = std::string(kSecret).substr(6);
  std::vector<unsigned char> key(b64.size());
  int n = EVP_DecodeBlock(key.data(), reinterpret_cast<const unsigned char*>(b64.data()),
                          static_cast<int>(b64.size()));
  for (size_t i = b64.size(); i > 0 && b64[i - 1] == '='; --i) --n;
  const std::string content = id + "." + timestamp + "." + body;
  unsigned char mac[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), n, reinterpret_cast<const unsigned char*>(content.data()),
       content.size(), mac, &len);
  std::string sig(44, '\0');
  EVP_EncodeBlock(reinterpret_cast<unsigned char*>(sig.data()), mac, 32);
  return header == "v1," + sig;
}

// A webhook endpoint on loopback: records what it accepts, can fail every other
// request or answer 410. It also records how many requests it held at once, and
// whether two of one instance (CloudEvent subject) were ever in flight together.
class Receiver {
 public:
  enum class Mode { kOk, kFailHalf, kGone, kAlwaysFail };

  Receiver() {
    server_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    server_.Post("/hook", [this](const httplib::Request& req, httplib::Response& res) {
      const Json sent = Json::parse(req.body, nullptr, false);
      const std::string subject = sent.is_object() ? sent.value("subject", "") : "";
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!in_flight_.insert(subject).second) ++overlaps_;
        max_in_flight_ = std::max(max_in_flight_, static_cast<int>(in_flight_.size()));
      }
      // Held a moment, so that requests sent at once are seen at once.
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms_.load()));
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(subject);
      ++requests_;
      connections_.insert(req.remote_port);
      const long long now_s = now_s_.load();
      if (!IndependentVerify(req.get_header_value("webhook-id"),
                             req.get_header_value("webhook-timestamp"), req.body,
                             req.get_header_value("webhook-signature"), now_s)) {
        ++bad_signatures_;
        res.status = 401;
        return;
      }
      if (mode_ == Mode::kGone) {
        res.status = 410;
        return;
      }
      if (mode_ == Mode::kAlwaysFail || (mode_ == Mode::kFailHalf && requests_ % 2 == 1)) {
        res.status = 500;
        return;
      }
      Json event = Json::parse(req.body);
      EXPECT_EQ(event["id"], req.get_header_value("webhook-id"));
      EXPECT_EQ(req.get_header_value("Content-Type"), "application/cloudevents+json");
      received_.push_back(event);
      res.status = 204;
    });
    server_.set_keep_alive_timeout(1);
    server_.set_read_timeout(1, 0);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(testing::WaitFor([&] { return server_.is_running(); }, std::chrono::seconds(10)));
  }
  ~Receiver() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/hook"; }
  void set_mode(Mode mode) {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
  }
  void set_now(long long seconds) { now_s_ = seconds; }
  std::vector<Json> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  int bad_signatures() {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_signatures_;
  }
  void set_hold_ms(int ms) { hold_ms_ = ms; }
  int max_in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_;
  }
  int overlaps() {
    std::lock_guard<std::mutex> lock(mu_);
    return overlaps_;
  }
  // Requests to /hook, and the connections (client ports) they came on.
  int requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(connections_.size());
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  Mode mode_ = Mode::kOk;
  int requests_ = 0;
  int bad_signatures_ = 0;
  std::atomic<long long> now_s_{0};
  std::atomic<int> hold_ms_{0};
  std::vector<Json> received_;
  std::set<std::string> in_flight_;  // subjects of the requests being handled
  int max_in_flight_ = 0;
  int overlaps_ = 0;           // requests that arrived while one of the same subject was in flight
  std::set<int> connections_;  // client ports seen
};

class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok());
    sim_ = std::move(*sim);
    for (const char* name : {"CRM_URL", "ERP_URL", "LINE_URL", "EMAIL_URL"}) {
      setenv(name, sim_->base_url().c_str(), 1);
    }
    setenv("WAYSTONE_SECRET_ERP_TOKEN", "t", 1);
    setenv("WAYSTONE_SECRET_LINE_TOKEN", "t", 1);
    setenv("TEST_WEBHOOK_SECRET", kSecret, 1);
    auto store = OpenStore({dir_.File("relay.db")});
    ASSERT_TRUE(store.ok());
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto engine = Engine::Create(store_.get(), http_.get(), &clock_, &random_, {});
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-erp.yaml");
    ASSERT_TRUE(definition.ok());
    example_ = *definition;
    SyncReceivers();
  }

  void SyncReceivers() {
    hooks_.set_now(clock_.NowMillis() / 1000);
    ops_.set_now(clock_.NowMillis() / 1000);
  }

  std::unique_ptr<Relay> MakeRelay(int max_attempts = 10, Millis unknown_alert_after = 60'000) {
    const std::string yaml =
        "deployment: test\nalert_sink: ops\n"
        "retry: { max_attempts: " +
        std::to_string(max_attempts) +
        ", initial_interval: 100ms, max_interval: 1s }\n"
        "unknown_alert_after: " +
        std::to_string(unknown_alert_after) +
        "ms\n"
        "sinks:\n"
        "  - { name: hooks, type: webhook, url: \"" +
        hooks_.url() +
        "\", secret_env: TEST_WEBHOOK_SECRET }\n"
        "  - { name: ops, type: webhook, url: \"" +
        ops_.url() + "\", secret_env: TEST_WEBHOOK_SECRET, events: [\"waystone.alert.*\"] }\n";
    auto config = ParseRelayConfig(yaml, "relay.yaml");
    EXPECT_TRUE(config.ok()) << config.status();
    auto relay = Relay::Create(store_.get(), http_.get(), &clock_, &random_, *config, "relay-1");
    EXPECT_TRUE(relay.ok());
    return std::move(*relay);
  }

  // A relay on the fake clock with `tuning` (relay config lines) whose one sink,
  // "hooks", is `sink`.
  std::unique_ptr<Relay> MakeRelayWith(const std::string& tuning, std::unique_ptr<Sink> sink) {
    std::unique_ptr<Relay> relay = MakeWebhookRelay(tuning, http_.get());
    relay->SetSinkForTest("hooks", std::move(sink));
    return relay;
  }

  // A relay on the fake clock with `tuning` whose one sink is the webhook "hooks"
  // (hooks_), sending through `http`.
  std::unique_ptr<Relay> MakeWebhookRelay(const std::string& tuning, HttpClient* http) {
    const std::string yaml = "deployment: test\n" + tuning +
                             "sinks:\n  - { name: hooks, type: webhook, url: \"" + hooks_.url() +
                             "\", secret_env: TEST_WEBHOOK_SECRET }\n";
    auto config = ParseRelayConfig(yaml, "relay.yaml");
    EXPECT_TRUE(config.ok()) << config.status();
    auto relay = Relay::Create(store_.get(), http, &clock_, &random_, *config, "relay-1");
    EXPECT_TRUE(relay.ok()) << relay.status();
    return std::move(*relay);
  }

  // Runs relay rounds, moving the fake clock past retry timers, until a round
  // finds nothing due and nothing waits, or `rounds` ran out.
  void Drain(Relay& relay, int rounds = 400) {
    for (int i = 0; i < rounds; ++i) {
      SyncReceivers();
      auto attempted = relay.RunOnce();
      ASSERT_TRUE(attempted.ok()) << attempted.status();
      if (*attempted == 0) {
        bool waiting = false;
        for (const auto& s : SinkStatsNow()) waiting = waiting || (s.pending > 0 && !s.disabled);
        if (!waiting) return;
        clock_.Advance(200);
      }
    }
  }

  std::vector<SinkStats> SinkStatsNow() {
    auto stats = store_->DeliveryStats();
    EXPECT_TRUE(stats.ok());
    return stats.ok() ? *stats : std::vector<SinkStats>{};
  }
  std::vector<InstanceRecord> InstancesNow() {
    auto list = store_->ListInstances({});
    EXPECT_TRUE(list.ok());
    return list.ok() ? *list : std::vector<InstanceRecord>{};
  }
  std::vector<EventRecord> EventsOf(int64_t id) {
    auto events = store_->ListEvents(id);
    EXPECT_TRUE(events.ok());
    return events.ok() ? *events : std::vector<EventRecord>{};
  }

  InstanceRecord RunOrder(const std::string& id, const std::string& customer = "C-1",
                          const std::string& tenant = "default") {
    auto started = engine_->StartInstance(
        example_,
        {tenant, Json{{"source", "crm"}, {"order_id", id}, {"customer_id", customer}, {"amount", 5}}
                     .dump()});
    EXPECT_TRUE(started.ok());
    EXPECT_TRUE(engine_->RunUntilRest(started->instance.id, std::stop_token()).ok());
    return *store_->GetInstance(started->instance.id);
  }

  std::vector<EventRecord> AllEvents() {
    std::vector<EventRecord> all;
    for (const auto& instance : InstancesNow()) {
      auto events = EventsOf(instance.id);
      all.insert(all.end(), events.begin(), events.end());
    }
    return all;
  }

  testing::TempDir dir_;
  FakeClock clock_{1'900'000'000'000};
  SeededRandom random_{3};
  Receiver hooks_;
  Receiver ops_;
  std::unique_ptr<Simulator> sim_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition example_;
};

TEST_F(RelayTest, EveryCommittedEventArrivesOnceAsASignedCloudEvent) {
  for (int i = 0; i < 5; ++i) RunOrder("e" + std::to_string(i));
  auto relay = MakeRelay();
  Drain(*relay);
  auto received = hooks_.received();
  auto committed = AllEvents();
  ASSERT_EQ(received.size(), committed.size());
  std::set<std::string> ids;
  for (const auto& e : received) ids.insert(e["id"].get<std::string>());
  for (const auto& e : committed) EXPECT_TRUE(ids.contains(e.event_id)) << e.type;
  EXPECT_EQ(hooks_.bad_signatures(), 0);
  // Instances are delivered in parallel: the first event of e0, not the first to arrive.
  auto of_e0 = std::find_if(received.begin(), received.end(),
                            [](const Json& e) { return e["subject"] == "crm:e0"; });
  ASSERT_NE(of_e0, received.end());
  const Json& first = *of_e0;
  EXPECT_EQ(first["specversion"], "1.0");
  EXPECT_EQ(first["type"], "waystone.instance.started");
  EXPECT_EQ(first["source"], "waystone://test/order-to-erp");
  EXPECT_EQ(first["subject"], "crm:e0");
  EXPECT_EQ(first["aggregatetype"], "order-to-erp");
  EXPECT_EQ(first["aggregateid"], "crm:e0");
  EXPECT_EQ(first["data"]["tenant"], "default");
  for (const auto& e : received) {
    // No database id leaves: it counts every tenant's instances.
    EXPECT_FALSE(e["data"].contains("instance_id")) << e["type"];
    EXPECT_EQ(e["data"]["instance_key"], e["subject"]) << e["type"];
    if (e["type"] == "waystone.step.completed" && e["data"]["step"] == "create-order") {
      EXPECT_TRUE(e["data"]["external_id"].get<std::string>().starts_with("SO-"));
      EXPECT_EQ(e["data"]["trace_id"].get<std::string>().size(), 32u);
    }
  }
  for (const auto& s : SinkStatsNow()) {
    if (s.sink == "hooks") {
      EXPECT_EQ(s.pending, 0);
      EXPECT_EQ(s.delivered, static_cast<int64_t>(committed.size()));
    }
  }
}

// A sink whose first delivery takes the whole lease (on the fake clock), as a
// stalled endpoint would: the round sends nothing more, since another relay may own
// those deliveries by now; they go out in a later round, each once.
class StallingSink final : public Sink {
 public:
  StallingSink(FakeClock* clock, Millis stall) : clock_(clock), stall_(stall) {}
  const std::string& name() const override { return name_; }
  DeliveryOutcome Deliver(const EventRecord& event, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ids_.empty()) clock_->Advance(stall_);
    ids_.push_back(event.event_id);
    return {DeliveryOutcome::Result::kDelivered, "ok", std::nullopt};
  }
  std::vector<std::string> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }

 private:
  FakeClock* clock_;
  Millis stall_;
  std::string name_ = "hooks";
  std::mutex mu_;
  std::vector<std::string> ids_;
};

// Issue 45, item 9: a relay sink received every tenant's events. A sink serves the
// tenants it lists; with tenants configured, one that lists none is refused.
TEST_F(RelayTest, ASinkReceivesOnlyTheEventsOfItsTenants) {
  RunOrder("a1", "C-1", "acme");
  RunOrder("g1", "C-1", "globex");
  const std::string yaml =
      "deployment: test\nsinks:\n"
      "  - { name: acme-hooks, type: webhook, url: \"" +
      hooks_.url() +
      "\", secret_env: TEST_WEBHOOK_SECRET, tenants: [acme] }\n"
      "  - { name: globex-hooks, type: webhook, url: \"" +
      ops_.url() + "\", secret_env: TEST_WEBHOOK_SECRET, tenants: [globex] }\n";
  auto config = ParseRelayConfig(yaml, "relay.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(CheckSinkTenants(*config, {"acme", "globex"}).ok());
  auto relay = Relay::Create(store_.get(), http_.get(), &clock_, &random_, *config, "relay-1");
  ASSERT_TRUE(relay.ok()) << relay.status();
  Drain(**relay);
  size_t acme = 0, globex = 0;
  for (const EventRecord& event : AllEvents()) (event.tenant == "acme" ? acme : globex) += 1;
  ASSERT_GT(acme, 0u);
  ASSERT_GT(globex, 0u);
  const auto to_acme = hooks_.received();
  const auto to_globex = ops_.received();
  EXPECT_EQ(to_acme.size(), acme);
  EXPECT_EQ(to_globex.size(), globex);
  for (const Json& got : to_acme) EXPECT_EQ(got.dump().find("globex"), std::string::npos) << got;
  for (const Json& got : to_globex) EXPECT_EQ(got.dump().find("acme"), std::string::npos) << got;

  // Without `tenants:` on a sink, a server with tenants refuses the config.
  auto open = ParseRelayConfig(
      "sinks:\n  - { name: all, type: webhook, url: http://x, "
      "secret_env: TEST_WEBHOOK_SECRET }\n",
      "r.yaml");
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_TRUE(CheckSinkTenants(*open, {}).ok());  // one trust domain: as before
  const absl::Status refused = CheckSinkTenants(*open, {"acme", "globex"});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("sink 'all' names no 'tenants'"), std::string::npos) << refused;
  EXPECT_FALSE(CheckSinkTenants(*config, {"acme"}).ok()) << "globex is not configured";
}

TEST_F(RelayTest, ARoundPastItsLeasesSendsNothingMore) {
  for (int i = 0; i < 4; ++i) RunOrder("s" + std::to_string(i));
  auto sink = std::make_unique<StallingSink>(&clock_, 30'000);
  StallingSink* stalling = sink.get();
  auto relay = MakeRelayWith("parallel: 1\nlease: 30s\n", std::move(sink));
  auto attempted = relay->RunOnce();
  ASSERT_TRUE(attempted.ok()) << attempted.status();
  ASSERT_GE(*attempted, 4);  // one claim per instance
  EXPECT_EQ(stalling->ids().size(), 1u) << "the round went on sending after its leases ran out";
  Drain(*relay);
  const std::vector<std::string> ids = stalling->ids();
  // The stalled one's acknowledgement still counts (no other relay took it over).
  EXPECT_EQ(ids.size(), AllEvents().size());
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), AllEvents().size());
}

TEST_F(RelayTest, FlakyEndpointGetsEverythingInOrderPerInstance) {
  hooks_.set_mode(Receiver::Mode::kFailHalf);
  for (int i = 0; i < 4; ++i) RunOrder("f" + std::to_string(i));
  auto relay = MakeRelay();
  Drain(*relay);
  auto received = hooks_.received();
  auto committed = AllEvents();
  ASSERT_EQ(received.size(), committed.size());
  // Per instance, events arrive in the order they were committed.
  std::map<std::string, std::vector<std::string>> arrived, expected;
  for (const auto& e : received) arrived[e["subject"]].push_back(e["id"]);
  for (const auto& instance : InstancesNow()) {
    for (const auto& e : EventsOf(instance.id)) expected[instance.key].push_back(e.event_id);
  }
  EXPECT_EQ(arrived, expected);
  int64_t failed = 0;
  for (const auto& s : SinkStatsNow()) failed += s.failed_attempts;
  EXPECT_GT(failed, 0);
}

TEST_F(RelayTest, GoneEndpointIsDisabledWithOneAlertAndLosesNothing) {
  hooks_.set_mode(Receiver::Mode::kGone);
  RunOrder("g1");
  auto relay = MakeRelay();
  Drain(*relay);
  EXPECT_TRUE(hooks_.received().empty());
  auto disabled = *store_->DisabledSinks();
  ASSERT_EQ(disabled, std::vector<std::string>{"hooks"});
  auto alerts = *store_->ListAlerts(0);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kSinkDisabled);
  // The alert itself was pushed to the ops sink, once.
  auto ops = ops_.received();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0]["type"], "waystone.alert.sink_disabled");
  // Nothing was dropped: once the endpoint is back and the sink enabled, all arrive.
  hooks_.set_mode(Receiver::Mode::kOk);
  ASSERT_TRUE(store_->EnableSink("hooks", clock_.NowMillis()).ok());
  Drain(*relay);
  EXPECT_EQ(hooks_.received().size(), AllEvents().size() - 1);  // all but the ops-only alert
}

TEST_F(RelayTest, EventThatKeepsFailingIsParkedAndAlertedOnce) {
  hooks_.set_mode(Receiver::Mode::kAlwaysFail);
  RunOrder("p1");
  auto relay = MakeRelay(/*max_attempts=*/3);
  Drain(*relay);
  auto stats = SinkStatsNow();
  int64_t parked = 0, pending = 0;
  for (const auto& s : stats) {
    if (s.sink == "hooks") {
      parked = s.parked;
      pending = s.pending;
    }
  }
  // Each instance event is parked once in turn (head of line moves on).
  EXPECT_EQ(pending, 0);
  EXPECT_EQ(parked, 8);
  auto alerts = *store_->ListAlerts(0);
  EXPECT_EQ(alerts.size(), 8u);
  for (const auto& alert : alerts) EXPECT_EQ(alert.kind, AlertKind::kDeliveryParked);
  auto ops = ops_.received();
  EXPECT_EQ(ops.size(), 8u);
  std::set<std::string> ids;
  for (const auto& e : ops) ids.insert(e["id"]);
  EXPECT_EQ(ids.size(), 8u);
}

TEST_F(RelayTest, RetriesAndCompensationAlertsArePushedOncePerAlert) {
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.cancel_order": {"fail": 1.0}})").ok());
  RunOrder("a1", "C-BLOCKED-1");  // shipment 422 -> cancel fails -> compensation_failed
  auto relay = MakeRelay();
  Drain(*relay);
  Drain(*relay);
  auto ops = ops_.received();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0]["type"], "waystone.alert.compensation_failed");
  EXPECT_EQ(ops[0]["subject"], "crm:a1");
  for (const auto& e : hooks_.received()) {
    EXPECT_FALSE(e["type"].get<std::string>().starts_with("waystone.alert.")) << e.dump();
  }
}

TEST_F(RelayTest, UnknownOutcomeUnresolvedTooLongRaisesOneAlert) {
  auto definition = LoadDefinitionText(R"(workflow: manual-push
key: "{{input.id}}"
steps:
  - name: push
    recovery: manual
    request: { method: POST, url: "{{env.LINE_URL}}/line/push", body: { to: "U1", messages: [] }, timeout: 1s }
)",
                                       "manual.yaml");
  ASSERT_TRUE(definition.ok());
  ASSERT_TRUE(sim_->SetFaults(R"({"line.push": {"next": ["drop_response"]}})").ok());
  auto started = engine_->StartInstance(*definition, {"default", R"({"id": "u1"})"});
  ASSERT_TRUE(engine_->RunUntilRest(started->instance.id, std::stop_token()).ok());
  auto relay = MakeRelay(10, /*unknown_alert_after=*/60'000);
  Drain(*relay);
  const size_t before = ops_.received().size();  // the needs_operator alert
  clock_.Advance(61'000);
  Drain(*relay);
  clock_.Advance(61'000);
  Drain(*relay);
  auto ops = ops_.received();
  ASSERT_EQ(ops.size(), before + 1);
  EXPECT_EQ(ops.back()["type"], "waystone.alert.unknown_unresolved");
  EXPECT_EQ(ops.back()["data"]["step"], "push");
}

// A relay on this host that died holding deliveries: the next relay takes its leases
// at once, in its first round, instead of waiting out their 60 s; after that it looks
// again once a second (the look reads every pending delivery), not every round.
TEST_F(RelayTest, ADeadLocalRelaysLeasesAreTakenAtTheFirstRoundThenOnceASecond) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string dead = std::string(host) + "/" + std::to_string(child) + "/gone";
  // The dead relay expanded the outbox for `hooks` and claimed what it found.
  auto claim_as_dead = [&] {
    auto cursor = store_->OutboxCursor("hooks");
    ASSERT_TRUE(cursor.ok()) << cursor.status();
    auto rows = store_->ReadOutbox(*cursor, 100);
    ASSERT_TRUE(rows.ok() && !rows->empty()) << rows.status();
    std::vector<std::pair<int64_t, int64_t>> wanted;
    for (const auto& r : *rows) wanted.emplace_back(r.seq, r.instance_id);
    const Millis now = clock_.NowMillis();
    ASSERT_TRUE(store_->AddDeliveries("hooks", *cursor, rows->back().seq, wanted, now).ok());
    auto claims = store_->ClaimDeliveries(dead, now, 60'000, 100, {"hooks"});
    ASSERT_TRUE(claims.ok() && !claims->empty()) << claims.status();
  };
  auto delivered = [&] { return static_cast<int>(hooks_.received().size()); };

  const InstanceRecord first = RunOrder("reaped-1");
  claim_as_dead();
  auto relay = MakeRelay();
  SyncReceivers();
  ASSERT_TRUE(relay->RunOnce().ok());
  EXPECT_GT(delivered(), 0) << "the dead relay's leases were not taken in the first round";
  Drain(*relay, 20);
  const int after_first = delivered();
  EXPECT_EQ(after_first, static_cast<int>(EventsOf(first.id).size()));

  RunOrder("reaped-2");
  claim_as_dead();
  clock_.Advance(500);  // within the second: nothing to take yet
  SyncReceivers();
  ASSERT_TRUE(relay->RunOnce().ok());
  EXPECT_EQ(delivered(), after_first);
  clock_.Advance(600);
  SyncReceivers();
  ASSERT_TRUE(relay->RunOnce().ok());
  EXPECT_GT(delivered(), after_first);
}

TEST_F(RelayTest, AChangeThatRollsBackProducesNoEvent) {
  auto started = engine_->StartInstance(
      example_, {"default", R"({"source":"crm","order_id":"r1","customer_id":"C-1","amount":1})"});
  ASSERT_TRUE(started.ok());
  const int64_t id = started->instance.id;
  auto stale = *store_->ClaimRunnable("old", clock_.NowMillis(), 5000, 10);
  clock_.Advance(6000);
  auto fresh = *store_->ClaimRunnable("new", clock_.NowMillis(), 5000, 10);
  ASSERT_EQ(stale.size(), 1u);
  ASSERT_EQ(fresh.size(), 1u);
  Change change;
  change.lease = stale[0];
  change.now = clock_.NowMillis();
  change.lease_expires_at = change.now + 5000;
  change.events.push_back(
      {0, "rolled-back-event", id, "default", "waystone.step.completed", "{}", 0});
  auto results = store_->Commit({change});
  ASSERT_TRUE(results.ok());
  EXPECT_TRUE(absl::IsAborted((*results)[0]));
  auto relay = MakeRelay();
  Drain(*relay);
  for (const auto& e : hooks_.received()) EXPECT_NE(e["id"], "rolled-back-event");
  EXPECT_EQ(hooks_.received().size(), 1u);  // only instance.started
}

// Seven events per instance (started, five steps, completed), no external calls.
constexpr char kTransforms[] = R"(workflow: transforms
key: "t:{{input.n}}"
steps:
  - { name: s1, transform: { n: "{{input.n}}" } }
  - { name: s2, transform: { n: "{{input.n}}" } }
  - { name: s3, transform: { n: "{{input.n}}" } }
  - { name: s4, transform: { n: "{{input.n}}" } }
  - { name: s5, transform: { n: "{{input.n}}" } }
)";

TEST_F(RelayTest, ConcurrentDeliveryKeepsTheOrderOfEachInstanceThroughFailures) {
  auto definition = LoadDefinitionText(kTransforms, "transforms.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  for (int i = 0; i < 24; ++i) {
    auto started =
        engine_->StartInstance(*definition, {"default", "{\"n\": " + std::to_string(i) + "}"});
    ASSERT_TRUE(started.ok());
    ASSERT_TRUE(engine_->RunUntilRest(started->instance.id, std::stop_token()).ok());
  }
  hooks_.set_mode(Receiver::Mode::kFailHalf);
  hooks_.set_hold_ms(10);
  auto relay = MakeRelay(/*max_attempts=*/100);
  Drain(*relay, 2000);
  auto received = hooks_.received();
  auto committed = AllEvents();
  ASSERT_EQ(committed.size(), 24u * 7);
  ASSERT_EQ(received.size(), committed.size());
  std::map<std::string, std::vector<std::string>> arrived, expected;
  for (const auto& e : received) arrived[e["subject"]].push_back(e["id"]);
  for (const auto& instance : InstancesNow()) {
    for (const auto& e : EventsOf(instance.id)) expected[instance.key].push_back(e.event_id);
  }
  EXPECT_EQ(arrived, expected);
  // Deliveries of different instances were in flight together, never two of one.
  EXPECT_GT(hooks_.max_in_flight(), 1);
  EXPECT_EQ(hooks_.overlaps(), 0);
  int64_t failed = 0;
  for (const auto& s : SinkStatsNow()) failed += s.failed_attempts;
  EXPECT_GT(failed, 0);
}

TEST_F(RelayTest, ARoundMarksDeliveredExactlyWhatTheEndpointAcknowledged) {
  auto definition = LoadDefinitionText(kTransforms, "transforms.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  for (int i = 0; i < 20; ++i) {
    auto started =
        engine_->StartInstance(*definition, {"default", "{\"n\": " + std::to_string(i) + "}"});
    ASSERT_TRUE(started.ok());
    ASSERT_TRUE(engine_->RunUntilRest(started->instance.id, std::stop_token()).ok());
  }
  hooks_.set_mode(Receiver::Mode::kFailHalf);  // acknowledges every other request
  auto relay = MakeRelay();
  SyncReceivers();
  auto attempted = relay->RunOnce();
  ASSERT_TRUE(attempted.ok()) << attempted.status();
  ASSERT_EQ(*attempted, 20);  // the first event of each instance, in one round
  std::set<std::string> acknowledged, marked, tried;
  for (const auto& e : hooks_.received()) acknowledged.insert(e["id"]);
  for (const auto& instance : InstancesNow()) {
    auto deliveries = store_->ListDeliveries(instance.id);
    ASSERT_TRUE(deliveries.ok()) << deliveries.status();
    for (const auto& d : *deliveries) {
      if (d.sink != "hooks") continue;
      if (d.state == DeliveryState::kDelivered) marked.insert(d.event_id);
      if (d.attempts > 0) tried.insert(d.event_id);
    }
  }
  EXPECT_EQ(marked, acknowledged);
  EXPECT_EQ(tried.size(), 20u);
  EXPECT_EQ(acknowledged.size(), 10u);
}

// A sink that acknowledges everything (or answers 410 to everything), keeps what it
// got per instance, and can look at the database with a connection of its own (not
// the store's) for the deliveries a relay holds leased at that moment.
class LeaseWatchingSink final : public Sink {
 public:
  struct Options {
    int wait_for_leased = 0;  // the first delivery waits (up to 5 s) to see this many leased
    int hold_at = 0;          // delivery number `hold_at` waits until Release()
    bool gone = false;        // answers 410
  };
  LeaseWatchingSink(const std::string& path, std::string owner, Options options)
      : owner_(std::move(owner)), options_(options) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  }
  ~LeaseWatchingSink() override { sqlite3_close(db_); }
  const std::string& name() const override { return name_; }

  DeliveryOutcome Deliver(const EventRecord& event, const std::string&) override {
    const int number = ++calls_;
    if (number == 1 && options_.wait_for_leased > 0) {
      // The relay holding more leases than its round has: the next round claimed
      // while this one is out.
      int leased = -1;
      testing::WaitFor([&] { return (leased = Leased()) >= options_.wait_for_leased; },
                       std::chrono::seconds(5));
      leased_at_first_ = leased;
    }
    if (number == options_.hold_at) {
      std::unique_lock<std::mutex> lock(gate_mu_);
      held_ = true;
      gate_.notify_all();
      gate_.wait_for(lock, std::chrono::seconds(10), [&] { return released_; });
    }
    if (options_.gone) return {DeliveryOutcome::Result::kEndpointGone, "410", std::nullopt};
    std::lock_guard<std::mutex> lock(mu_);
    got_[event.instance_id].push_back(event.event_id);
    return {DeliveryOutcome::Result::kDelivered, "ok", std::nullopt};
  }

  // Pending deliveries whose lease `owner` holds now.
  int Leased() {
    return Count(
        "SELECT count(*) FROM deliveries WHERE lease_owner = ?1 AND state = ?2 "
        "AND lease_expires_at > ?3",
        DeliveryState::kPending);
  }
  // Deliveries the store marks delivered.
  int Marked() {
    return Count("SELECT count(*) FROM deliveries WHERE state = ?2", DeliveryState::kDelivered);
  }
  bool WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(gate_mu_);
    return gate_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(gate_mu_);
    released_ = true;
    gate_.notify_all();
  }
  int calls() const { return calls_; }
  int count() {
    std::lock_guard<std::mutex> lock(mu_);
    int count = 0;
    for (const auto& [instance, ids] : got_) count += static_cast<int>(ids.size());
    return count;
  }
  std::map<int64_t, std::vector<std::string>> got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }
  int leased_at_first() const { return leased_at_first_; }

 private:
  // Runs `sql`, a count, binding ?1 the owner, ?2 `state` and ?3 now (those it has).
  int Count(const char* sql, DeliveryState state) {
    std::lock_guard<std::mutex> lock(db_mu_);
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &statement, nullptr) != SQLITE_OK) return -1;
    sqlite3_bind_text(statement, 1, owner_.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(statement, 2, static_cast<int>(state));
    sqlite3_bind_int64(statement, 3, SystemClock::Get()->NowMillis());
    const int count = sqlite3_step(statement) == SQLITE_ROW ? sqlite3_column_int(statement, 0) : -1;
    sqlite3_finalize(statement);
    return count;
  }

  std::string name_ = "hooks";
  std::string owner_;
  Options options_;
  std::mutex db_mu_;
  sqlite3* db_ = nullptr;
  std::atomic<int> calls_{0};
  std::atomic<int> leased_at_first_{-1};
  std::mutex gate_mu_;
  std::condition_variable gate_;
  bool held_ = false;
  bool released_ = false;
  std::mutex mu_;
  std::map<int64_t, std::vector<std::string>> got_;  // event ids as they came, per instance
};

// A relay on the system clock delivering to `sink` in rounds of `batch`, one at a time.
std::unique_ptr<Relay> MakeRoundRelay(Store* store, HttpClient* http, Random* random,
                                      const std::string& url, int batch, std::unique_ptr<Sink> sink,
                                      const std::string& poll_interval = "10ms") {
  const std::string yaml = "deployment: test\nparallel: 1\nbatch: " + std::to_string(batch) +
                           "\nlease: 30s\npoll_interval: " + poll_interval +
                           "\n"
                           "sinks:\n  - { name: hooks, type: webhook, url: \"" +
                           url + "\", secret_env: TEST_WEBHOOK_SECRET }\n";
  auto config = ParseRelayConfig(yaml, "relay.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
  auto relay = Relay::Create(store, http, SystemClock::Get(), random, *config, "relay-run");
  EXPECT_TRUE(relay.ok()) << relay.status();
  (*relay)->SetSinkForTest("hooks", std::move(sink));
  return std::move(*relay);
}

TEST_F(RelayTest, RunClaimsTheNextRoundWhileTheSinksTakeThisOne) {
  std::vector<InstanceRecord> orders;
  for (int i = 0; i < 6; ++i) orders.push_back(RunOrder("ahead-" + std::to_string(i)));
  // Rounds of two: while the first two deliveries are out, two more are claimed.
  auto sink = std::make_unique<LeaseWatchingSink>(dir_.File("relay.db"), "relay-run",
                                                  LeaseWatchingSink::Options{.wait_for_leased = 4});
  LeaseWatchingSink* watching = sink.get();
  auto relay =
      MakeRoundRelay(store_.get(), http_.get(), &random_, hooks_.url(), 2, std::move(sink));
  const int total = static_cast<int>(AllEvents().size());
  relay->Start();
  EXPECT_TRUE(
      testing::WaitFor([&] { return watching->count() >= total; }, std::chrono::seconds(30)));
  relay->Stop();
  EXPECT_EQ(watching->leased_at_first(), 4)
      << "the next round was not claimed while the first was being delivered";
  // Each event once, in its instance's order.
  std::map<int64_t, std::vector<std::string>> expected;
  for (const InstanceRecord& order : orders) {
    for (const EventRecord& event : EventsOf(order.id)) {
      expected[order.id].push_back(event.event_id);
    }
  }
  EXPECT_EQ(watching->got(), expected);
  EXPECT_EQ(watching->calls(), total);
  EXPECT_EQ(watching->Leased(), 0);
  for (const SinkStats& stats : SinkStatsNow()) {
    if (stats.sink == "hooks") {
      EXPECT_EQ(stats.pending, 0);
    }
  }
}

TEST_F(RelayTest, RunMovesAnInstancesEventsAtTheSinksPaceNotThePollInterval) {
  const InstanceRecord order = RunOrder("one-lane");
  const int total = static_cast<int>(EventsOf(order.id).size());
  ASSERT_GE(total, 5);
  // One instance: each round holds its one next event, and nothing can be claimed
  // ahead (its lane is out). A 5 s poll interval would show between events.
  auto sink = std::make_unique<LeaseWatchingSink>(dir_.File("relay.db"), "relay-run",
                                                  LeaseWatchingSink::Options{});
  LeaseWatchingSink* watching = sink.get();
  auto relay =
      MakeRoundRelay(store_.get(), http_.get(), &random_, hooks_.url(), 2, std::move(sink), "5s");
  relay->Start();
  EXPECT_TRUE(testing::WaitFor([&] { return watching->count() >= total; }, std::chrono::seconds(4)))
      << watching->count() << " of " << total << " events in 4 s";
  relay->Stop();
  EXPECT_EQ(watching->count(), total);
}

TEST_F(RelayTest, StoppedRunDeliversAndRecordsWhatItClaimedAhead) {
  for (int i = 0; i < 6; ++i) RunOrder("stop-" + std::to_string(i));
  // The third delivery (the second round's first) is held until the relay has claimed
  // the third round ahead; then the relay is told to stop.
  auto sink = std::make_unique<LeaseWatchingSink>(dir_.File("relay.db"), "relay-run",
                                                  LeaseWatchingSink::Options{.hold_at = 3});
  LeaseWatchingSink* watching = sink.get();
  auto relay =
      MakeRoundRelay(store_.get(), http_.get(), &random_, hooks_.url(), 2, std::move(sink));
  std::stop_source stop;
  std::thread running([&] { relay->Run(stop.get_token()); });
  ASSERT_TRUE(watching->WaitUntilHeld());
  // The first round recorded (its two no longer leased), the second out: four leased
  // means the third claimed ahead.
  const bool ahead = testing::WaitFor(
      [&] { return watching->Marked() == 2 && watching->Leased() == 4; }, std::chrono::seconds(5));
  stop.request_stop();
  watching->Release();
  running.join();
  ASSERT_TRUE(ahead) << "no round was claimed ahead while the second was out";
  // The round out and the one claimed ahead went out, and were recorded: nothing it
  // claimed is left to wait out its lease, and what the sink took is exactly what the
  // store marks delivered.
  EXPECT_EQ(watching->count(), 6);
  EXPECT_EQ(watching->Leased(), 0);
  std::set<std::string> got, marked;
  for (const auto& [instance, ids] : watching->got()) got.insert(ids.begin(), ids.end());
  for (const InstanceRecord& instance : InstancesNow()) {
    auto deliveries = store_->ListDeliveries(instance.id);
    ASSERT_TRUE(deliveries.ok()) << deliveries.status();
    for (const DeliveryRecord& d : *deliveries) {
      if (d.sink == "hooks" && d.state == DeliveryState::kDelivered) marked.insert(d.event_id);
    }
  }
  EXPECT_EQ(marked, got);
}

TEST_F(RelayTest, RunDisablesAGoneSinkOnceAndSendsItNoMore) {
  for (int i = 0; i < 6; ++i) RunOrder("gone-" + std::to_string(i));
  // The first round's two deliveries answer 410 while the second round is claimed
  // ahead: that one must not go out to the gone endpoint, nor alert a second time.
  auto sink = std::make_unique<LeaseWatchingSink>(
      dir_.File("relay.db"), "relay-run",
      LeaseWatchingSink::Options{.wait_for_leased = 4, .gone = true});
  LeaseWatchingSink* watching = sink.get();
  auto relay =
      MakeRoundRelay(store_.get(), http_.get(), &random_, hooks_.url(), 2, std::move(sink));
  relay->Start();
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto disabled = store_->DisabledSinks();
        return disabled.ok() && !disabled->empty();
      },
      std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rounds that would follow
  relay->Stop();
  EXPECT_EQ(watching->leased_at_first(), 4);  // a round was claimed ahead
  EXPECT_EQ(watching->calls(), 2) << "the round claimed ahead went out to a gone endpoint";
  auto alerts = store_->ListAlerts(0);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  ASSERT_EQ(alerts->size(), 1u);
  EXPECT_EQ((*alerts)[0].kind, AlertKind::kSinkDisabled);
}

// A sink that takes batches: it keeps each batch's size and acknowledges the events
// of even-numbered instances only, so the outcome of each position is its own.
class BatchingSink final : public Sink {
 public:
  const std::string& name() const override { return name_; }
  DeliveryOutcome Deliver(const EventRecord&, const std::string&) override {
    ADD_FAILURE() << "a lone delivery to a sink that takes batches";
    return {DeliveryOutcome::Result::kRetry, "lone", std::nullopt};
  }
  bool delivers_batches() const override { return true; }
  std::vector<DeliveryOutcome> DeliverBatch(const std::vector<const EventRecord*>& events,
                                            const std::vector<std::string>& bodies,
                                            const MayStart&) override {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_.push_back(static_cast<int>(events.size()));
    std::vector<DeliveryOutcome> outcomes;
    for (size_t i = 0; i < events.size(); ++i) {
      EXPECT_EQ(Json::parse(bodies[i])["id"], events[i]->event_id);
      outcomes.push_back(events[i]->instance_id % 2 == 0
                             ? DeliveryOutcome{DeliveryOutcome::Result::kDelivered, "ok", {}}
                             : DeliveryOutcome{DeliveryOutcome::Result::kRetry, "odd", {}});
    }
    return outcomes;
  }
  std::vector<int> sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> sorted = sizes_;
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  }

 private:
  std::string name_ = "hooks";
  std::mutex mu_;
  std::vector<int> sizes_;
};

TEST_F(RelayTest, ASinkThatTakesBatchesGetsTheRoundSplitOverThePoolAndEachOutcomeCounts) {
  std::vector<InstanceRecord> orders;
  for (int i = 0; i < 12; ++i) orders.push_back(RunOrder("batched-" + std::to_string(i)));
  auto sink = std::make_unique<BatchingSink>();
  BatchingSink* batching = sink.get();
  auto relay = MakeRelayWith("parallel: 4\nbatch: 64\n", std::move(sink));
  auto attempted = relay->RunOnce();
  ASSERT_TRUE(attempted.ok()) << attempted.status();
  ASSERT_EQ(*attempted, 12);                                     // the first event of each instance
  EXPECT_EQ(batching->sizes(), (std::vector<int>{3, 3, 3, 3}));  // 12 over 4 threads
  for (const InstanceRecord& order : orders) {
    auto deliveries = store_->ListDeliveries(order.id);
    ASSERT_TRUE(deliveries.ok()) << deliveries.status();
    int tried = 0;
    for (const DeliveryRecord& d : *deliveries) {
      if (d.sink != "hooks" || d.attempts == 0) continue;
      ++tried;
      EXPECT_EQ(d.state, order.id % 2 == 0 ? DeliveryState::kDelivered : DeliveryState::kPending)
          << "instance " << order.id << ": " << d.event_id;
    }
    EXPECT_EQ(tried, 1) << "instance " << order.id;
  }
}

// A webhook sink sends each delivery on a connection of its own, unless keep_alive
// says otherwise; counted by the receiver (the client ports it saw).
TEST_F(RelayTest, AWebhookSinkReusesConnectionsOnlyWithKeepAlive) {
  for (int i = 0; i < 3; ++i) RunOrder("k" + std::to_string(i));
  for (const bool keep_alive : {false, true}) {
    Receiver receiver;
    const std::string yaml =
        std::string("deployment: test\nparallel: 1\n") + "sinks:\n  - { name: r" +
        (keep_alive ? "1" : "0") + ", type: webhook, url: \"" + receiver.url() +
        "\", secret_env: TEST_WEBHOOK_SECRET, keep_alive: " + (keep_alive ? "true" : "false") +
        " }\n";
    auto config = ParseRelayConfig(yaml, "relay.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    auto relay = Relay::Create(store_.get(), http_.get(), &clock_, &random_, *config, "relay-1");
    ASSERT_TRUE(relay.ok()) << relay.status();
    receiver.set_now(clock_.NowMillis() / 1000);
    Drain(**relay);
    EXPECT_EQ(receiver.received().size(), AllEvents().size());
    const int requests = receiver.requests();
    if (keep_alive) {
      EXPECT_LT(receiver.connections(), requests / 2) << requests << " requests";
    } else {
      EXPECT_EQ(receiver.connections(), requests);
    }
  }
}

// Sends through `inner`, moving the fake clock `step` on at each answer, before the
// caller hears it: each request to the endpoint seems to take that long.
class SlowAnswers final : public HttpClient {
 public:
  SlowAnswers(HttpClient* inner, FakeClock* clock, Millis step)
      : inner_(inner), clock_(clock), step_(step) {}
  HttpResponse Send(const HttpRequest& request) override {
    HttpResponse response = inner_->Send(request);
    clock_->Advance(step_);
    return response;
  }
  void SendAsync(HttpRequest request, HttpDone done) override {
    inner_->SendAsync(std::move(request),
                      [this, done = std::move(done)](HttpResponse response) mutable {
                        clock_->Advance(step_);
                        std::move(done)(std::move(response));
                      });
  }

 private:
  HttpClient* inner_;
  FakeClock* clock_;
  Millis step_;
};

// Answers 204 at once, inside SendAsync (the default SendAsync calls Send), and
// records how deeply SendAsync calls were nested: a batch whose answers each sent the
// next from inside the one before would nest as deep as the batch is long.
class InlineAnswers final : public HttpClient {
 public:
  HttpResponse Send(const HttpRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    ids_.push_back(Json::parse(request.body)["id"]);
    HttpResponse response;
    response.outcome.kind = CallOutcome::Kind::kResponse;
    response.outcome.status = 204;
    return response;
  }
  void SendAsync(HttpRequest request, HttpDone done) override {
    const int depth = ++depth_;
    deepest_ = std::max(deepest_.load(), depth);
    HttpClient::SendAsync(std::move(request), std::move(done));
    --depth_;
  }
  std::vector<std::string> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }
  int deepest() const { return deepest_; }

 private:
  std::mutex mu_;
  std::vector<std::string> ids_;
  std::atomic<int> depth_ = 0;
  std::atomic<int> deepest_ = 0;
};

TEST_F(RelayTest, AWebhookRoundKeepsParallelRequestsOutAndNoMore) {
  for (int i = 0; i < 12; ++i) RunOrder("p" + std::to_string(i));
  hooks_.set_hold_ms(40);  // so that requests sent together are seen together
  auto relay = MakeWebhookRelay("parallel: 3\n", http_.get());
  SyncReceivers();
  auto attempted = relay->RunOnce();
  ASSERT_TRUE(attempted.ok()) << attempted.status();
  ASSERT_EQ(*attempted, 12);  // the first event of each instance
  EXPECT_EQ(hooks_.received().size(), 12u);
  EXPECT_LE(hooks_.max_in_flight(), 3);
  EXPECT_GE(hooks_.max_in_flight(), 2);  // (3 but for a pool thread late by 40 ms)
  EXPECT_EQ(hooks_.overlaps(), 0);
  Drain(*relay);
  EXPECT_EQ(hooks_.received().size(), AllEvents().size());
}

// The endpoint's answers take 15 s each (on the fake clock) and a request may take
// 5 s (the sink's timeout): with a 30-second lease, the second request is the last
// that fits, and the batch starts no third. The rest go in later rounds, each once.
TEST_F(RelayTest, AWebhookBatchStartsNoRequestItsLeaseHasNoRoomFor) {
  for (int i = 0; i < 4; ++i) RunOrder("l" + std::to_string(i));
  SlowAnswers slow(http_.get(), &clock_, 15'000);
  auto relay = MakeWebhookRelay("parallel: 1\nlease: 30s\n", &slow);
  SyncReceivers();
  auto attempted = relay->RunOnce();
  ASSERT_TRUE(attempted.ok()) << attempted.status();
  ASSERT_EQ(*attempted, 4);
  EXPECT_EQ(hooks_.received().size(), 2u) << "the batch went on past its lease";
  // The two not sent were not attempted: no failure counted against them.
  for (const SinkStats& stats : SinkStatsNow()) EXPECT_EQ(stats.failed_attempts, 0);
  Drain(*relay);
  std::set<std::string> ids;
  for (const Json& event : hooks_.received()) ids.insert(event["id"].get<std::string>());
  EXPECT_EQ(ids.size(), hooks_.received().size()) << "an event arrived twice";
  EXPECT_EQ(ids.size(), AllEvents().size());
}

TEST_F(RelayTest, AWebhookBatchAnsweredInlineSendsEachEventOnceWithoutNesting) {
  for (int i = 0; i < 20; ++i) RunOrder("i" + std::to_string(i));
  InlineAnswers inline_answers;
  auto relay = MakeWebhookRelay("parallel: 1\n", &inline_answers);
  auto attempted = relay->RunOnce();
  ASSERT_TRUE(attempted.ok()) << attempted.status();
  ASSERT_EQ(*attempted, 20);
  EXPECT_EQ(inline_answers.ids().size(), 20u);
  EXPECT_EQ(inline_answers.deepest(), 1) << "each answer sent the next from inside it";
  Drain(*relay);
  const std::vector<std::string> ids = inline_answers.ids();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
  EXPECT_EQ(ids.size(), AllEvents().size());
  for (const SinkStats& stats : SinkStatsNow()) {
    EXPECT_EQ(stats.delivered, static_cast<int64_t>(ids.size()));
  }
}

TEST(WebhookSignatureTest, MatchesAnIndependentImplementationAndCatchesTampering) {
  const long long now = 1'900'000'000;
  const std::string body = R"({"id":"ev1","type":"waystone.step.completed"})";
  auto signature = SignStandardWebhook(kSecret, "ev1", now, body);
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(IndependentVerify("ev1", std::to_string(now), body, *signature, now));
  EXPECT_FALSE(IndependentVerify("ev1", std::to_string(now), body + " ", *signature, now));
  EXPECT_FALSE(IndependentVerify("ev2", std::to_string(now), body, *signature, now));
  auto stale = SignStandardWebhook(kSecret, "ev1", now - 3600, body);
  EXPECT_FALSE(IndependentVerify("ev1", std::to_string(now - 3600), body, *stale, now));
  // The published test vector of the Standard Webhooks specification.
  auto vector =
      SignStandardWebhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
                          1614265330, R"({"test": 2432232314})");
  ASSERT_TRUE(vector.ok());
  EXPECT_EQ(*vector, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
  EXPECT_FALSE(SignStandardWebhook("whsec_***", "id", 1, "x").ok());
}

TEST(RelayConfigTest, ErrorsNameTheLine) {
  // The error of a config that must not parse ("" when it parses).
  auto error_of = [](const std::string& yaml) {
    auto config = ParseRelayConfig(yaml, "r.yaml");
    EXPECT_FALSE(config.ok()) << yaml;
    return config.ok() ? std::string() : std::string(config.status().message());
  };
  const std::string type = error_of("sinks:\n  - { name: a, type: carrier-pigeon, url: x }\n");
  EXPECT_NE(type.find("r.yaml:2"), std::string::npos) << type;
  const std::string no_secret = error_of("sinks:\n  - { name: a, type: webhook, url: http://x }\n");
  EXPECT_NE(no_secret.find("secret_env"), std::string::npos) << no_secret;
  const std::string unknown = error_of("sinks: []\ncolour: red\n");
  EXPECT_NE(unknown.find("unknown field 'colour'"), std::string::npos) << unknown;
  setenv("TEST_WEBHOOK_SECRET", kSecret, 1);
  const std::string keep_alive = error_of(
      "sinks:\n  - { name: a, type: webhook, url: http://x,\n"
      "      secret_env: TEST_WEBHOOK_SECRET, keep_alive: yes }\n");
  EXPECT_NE(keep_alive.find("r.yaml:3"), std::string::npos) << keep_alive;
  EXPECT_NE(keep_alive.find("keep_alive is true or false, not 'yes'"), std::string::npos)
      << keep_alive;
  // A field of the other kind of sink would mean nothing: an error, not ignored.
  const std::string nats_timeout =
      error_of("sinks:\n  - name: bus\n    type: nats\n    url: nats://x\n    timeout: 5s\n");
  EXPECT_NE(nats_timeout.find("r.yaml:5"), std::string::npos) << nats_timeout;
  EXPECT_NE(nats_timeout.find("'timeout' is for webhook sinks"), std::string::npos) << nats_timeout;
  const std::string webhook_stream = error_of(
      "sinks:\n  - { name: a, type: webhook, url: http://x, secret_env: TEST_WEBHOOK_SECRET,\n"
      "      stream: S }\n");
  EXPECT_NE(webhook_stream.find("'stream' is for nats sinks"), std::string::npos) << webhook_stream;
}

}  // namespace
}  // namespace waystone
