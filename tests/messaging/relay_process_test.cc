// The relay as a real process: SIGKILLed between the sink's acknowledgement and
// marking the row delivered, restarted; and against a real nats-server with
// JetStream that is itself restarted mid-run.

#include <arpa/inet.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "messaging/sink.h"
#include "sim/simulator.h"
#include "store/store.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kSecret[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

bool PortOpen(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool open = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return open;
}

class RelayProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok());
    sim_ = std::move(*sim);
    db_ = dir_.File("relay.db");
  }

  // Starts nats-server with JetStream on `port` (its store in the test's folder) and
  // waits until it listens.
  std::unique_ptr<testing::Process> StartNats(int port) {
    auto server = std::make_unique<testing::Process>(
        std::vector<std::string>{"/usr/sbin/nats-server", "-js", "-a", "127.0.0.1", "-p",
                                 std::to_string(port), "-sd", dir_.File("jetstream")},
        Env(), dir_.path());
    EXPECT_TRUE(testing::WaitFor([&] { return PortOpen(port); }, std::chrono::seconds(10)));
    return server;
  }

  std::map<std::string, std::string> Env(std::map<std::string, std::string> extra = {}) {
    extra.emplace("WAYSTONE_DB", db_);
    extra.emplace("WEBHOOK_SECRET", kSecret);
    return testing::SimulatorEnv(sim_->base_url(), extra);
  }

  testing::ProcessResult Waystone(const std::vector<std::string>& args,
                                  std::map<std::string, std::string> extra = {}) {
    std::vector<std::string> argv = {testing::WaystoneBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunProcess(argv, Env(extra), dir_.path());
  }

  // Starts and completes `count` orders through the CLI.
  void RunOrders(int count, const std::string& prefix) {
    std::string lines;
    for (int i = 0; i < count; ++i) {
      lines += Json{{"source", "crm"},
                    {"order_id", prefix + std::to_string(i)},
                    {"customer_id", "C-" + std::to_string(i)},
                    {"amount", 3}}
                   .dump() +
               "\n";
    }
    testing::WriteFile(dir_.File(prefix + ".jsonl"), lines);
    ASSERT_EQ(Waystone({"start", testing::SourceDir() + "/examples/order-to-erp.yaml", "--inputs",
                        dir_.File(prefix + ".jsonl")})
                  .exit_code,
              0);
    auto worker = Waystone({"worker", "--exit-when-idle"});
    ASSERT_EQ(worker.exit_code, 0) << worker.err;
  }

  // Returns the rest of the first line starting with `prefix` in any output file.
  std::string WaitForLine(const std::string& prefix) {
    std::string found;
    testing::WaitFor(
        [&] {
          for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
            const std::string text = testing::ReadFile(entry.path());
            const size_t at = text.find(prefix);
            if (at != std::string::npos) {
              found = text.substr(at + prefix.size(), text.find('\n', at) - at - prefix.size());
              return true;
            }
          }
          return false;
        },
        std::chrono::seconds(10));
    return found;
  }

  Json Get(const std::string& url) {
    return Json::parse(testing::RunProcess({"/usr/bin/curl", "-s", url}, {}, dir_.path()).out);
  }

  std::vector<EventRecord> Committed() {
    auto store = OpenStore({db_});
    std::vector<EventRecord> all;
    auto instances = (*store)->ListInstances({std::nullopt, std::nullopt, std::nullopt, 10000});
    for (const auto& instance : *instances) {
      auto events = (*store)->ListEvents(instance.id);
      all.insert(all.end(), events->begin(), events->end());
    }
    return all;
  }

  testing::TempDir dir_;
  std::string db_;
  std::unique_ptr<Simulator> sim_;
};

TEST_F(RelayProcessTest, KilledAfterTheAckRedeliversTheSameIdAndTheConsumerAppliesItOnce) {
  testing::Process consumer({testing::ExampleConsumerBinary(), "--port", "0", "--db",
                             dir_.File("consumer.db"), "--secret-env", "WEBHOOK_SECRET"},
                            Env(), dir_.path());
  const std::string consumer_url = WaitForLine("consumer listening on ");
  ASSERT_FALSE(consumer_url.empty());
  testing::WriteFile(
      dir_.File("relay.yaml"),
      "deployment: crash-test\nretry: { initial_interval: 50ms, max_interval: 200ms }\n"
      "sinks:\n  - { name: consumer, type: webhook, url: \"" +
          consumer_url + "/events\", secret_env: WEBHOOK_SECRET }\n");
  RunOrders(2, "k");
  const auto committed = Committed();
  ASSERT_EQ(committed.size(), 16u);

  auto killed = Waystone({"relay", "--config", dir_.File("relay.yaml"), "--until-drained"},
                         {{"WAYSTONE_CRASH_AT", "after-deliver:consumer"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
  auto resumed = Waystone({"relay", "--config", dir_.File("relay.yaml"), "--until-drained"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;

  Json stats = Get(consumer_url + "/stats");
  // The relay died after an ack and before it marked the round: every event of the
  // round that was acknowledged by then — the first of one instance or of both,
  // delivered at once — arrives again, with the same id.
  EXPECT_GE(stats["duplicates"], 1) << stats.dump();
  EXPECT_LE(stats["duplicates"], 2) << stats.dump();
  EXPECT_EQ(stats["received"], 16 + stats["duplicates"].get<int>()) << stats.dump();
  EXPECT_EQ(stats["applied"], 16) << stats.dump();  // once each
  EXPECT_EQ(stats["rejected"], 0) << stats.dump();
  // Applied in commit order per instance, across the restart.
  Json applied = Get(consumer_url + "/applied");
  std::map<std::string, std::vector<std::string>> arrived, expected;
  for (const auto& row : applied) arrived[row[0]].push_back(row[2]);
  for (const auto& e : committed) {
    expected[Json::parse(e.payload_json)["instance_key"]].push_back(e.event_id);
  }
  EXPECT_EQ(arrived, expected);
  // The instance view shows where each event stands.
  auto status = Waystone({"status", "crm:k0", "--json"});
  Json view = Json::parse(status.out);
  ASSERT_EQ(view["deliveries"].size(), 8u);
  for (const auto& d : view["deliveries"]) EXPECT_EQ(d["state"], "delivered") << d.dump();
}

TEST_F(RelayProcessTest, TwoRelaysAtOnceNeverDeliverTheSameRowTwice) {
  testing::Process consumer({testing::ExampleConsumerBinary(), "--port", "0", "--db",
                             dir_.File("consumer.db"), "--secret-env", "WEBHOOK_SECRET"},
                            Env(), dir_.path());
  const std::string consumer_url = WaitForLine("consumer listening on ");
  ASSERT_FALSE(consumer_url.empty());
  testing::WriteFile(dir_.File("relay.yaml"),
                     "batch: 4\nsinks:\n  - { name: consumer, type: webhook, url: \"" +
                         consumer_url + "/events\", secret_env: WEBHOOK_SECRET }\n");
  RunOrders(8, "two");
  std::vector<std::string> relay = {testing::WaystoneBinary(), "relay", "--config",
                                    dir_.File("relay.yaml"), "--until-drained"};
  testing::Process a(relay, Env(), dir_.path());
  testing::Process b(relay, Env(), dir_.path());
  EXPECT_EQ(a.Wait().exit_code, 0);
  EXPECT_EQ(b.Wait().exit_code, 0);
  Json stats = Get(consumer_url + "/stats");
  EXPECT_EQ(stats["received"], 64) << stats.dump();
  EXPECT_EQ(stats["applied"], 64) << stats.dump();
  EXPECT_EQ(stats["duplicates"], 0) << stats.dump();
}

TEST_F(RelayProcessTest, MetricsShowLagAndFailuresAndPassPromtool) {
  const int dead_port = testing::FreeLoopbackPort();  // nothing listens there: every delivery fails
  testing::WriteFile(dir_.File("relay.yaml"),
                     "retry: { max_attempts: 1000, initial_interval: 20ms, max_interval: 50ms }\n"
                     "sinks:\n  - { name: dead, type: webhook, url: \"http://127.0.0.1:" +
                         std::to_string(dead_port) + "/x\", secret_env: WEBHOOK_SECRET }\n");
  RunOrders(1, "q");
  testing::Process relay({testing::WaystoneBinary(), "relay", "--config", dir_.File("relay.yaml"),
                          "--metrics-listen", "127.0.0.1:0"},
                         Env(), dir_.path());
  const std::string url = WaitForLine("metrics on ");
  ASSERT_FALSE(url.empty());
  std::string metrics;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        metrics = testing::RunProcess({"/usr/bin/curl", "-s", url}, {}, dir_.path()).out;
        return metrics.find("waystone_relay_failed_attempts_total{sink=\"dead\"} ") !=
                   std::string::npos &&
               metrics.find("waystone_relay_failed_attempts_total{sink=\"dead\"} 0\n") ==
                   std::string::npos;
      },
      std::chrono::seconds(20)))
      << metrics;
  EXPECT_NE(metrics.find("waystone_relay_pending_deliveries{sink=\"dead\"} 8\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("waystone_instances{state=\"completed\"} 1\n"), std::string::npos);
  EXPECT_EQ(metrics.find("waystone_relay_lag_seconds{sink=\"dead\"} 0.000"), std::string::npos)
      << "lag should be above zero while events wait";
  testing::WriteFile(dir_.File("metrics.txt"), metrics);
  // promtool reads the exposition from standard input.
  auto check = testing::RunProcess(
      {"/bin/sh", "-c", "exec /usr/bin/promtool check metrics < \"$0\"", dir_.File("metrics.txt")},
      {}, dir_.path());
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  relay.Signal(SIGTERM);
  EXPECT_EQ(relay.Wait().exit_code, 0);
}

// Reads every message of a JetStream stream; returns their CloudEvent ids.
std::vector<std::string> StreamIds(int port, const std::string& stream) {
  std::vector<std::string> ids;
  natsConnection* connection = nullptr;
  if (natsConnection_ConnectTo(&connection, ("nats://127.0.0.1:" + std::to_string(port)).c_str()) !=
      NATS_OK) {
    ADD_FAILURE() << "cannot connect to nats-server";
    return ids;
  }
  jsCtx* js = nullptr;
  natsConnection_JetStream(&js, connection, nullptr);
  jsStreamInfo* info = nullptr;
  jsErrCode error;
  if (js_GetStreamInfo(&info, js, stream.c_str(), nullptr, &error) == NATS_OK) {
    const uint64_t last = info->State.LastSeq;
    for (uint64_t seq = info->State.FirstSeq; seq <= last && seq > 0; ++seq) {
      natsMsg* msg = nullptr;
      if (js_GetMsg(&msg, js, stream.c_str(), seq, nullptr, &error) != NATS_OK) continue;
      Json event = Json::parse(std::string(natsMsg_GetData(msg), natsMsg_GetDataLength(msg)));
      const char* msg_id = nullptr;
      natsMsgHeader_Get(msg, "Nats-Msg-Id", &msg_id);
      EXPECT_EQ(event["id"], msg_id == nullptr ? "" : msg_id);
      ids.push_back(event["id"]);
      natsMsg_Destroy(msg);
    }
    jsStreamInfo_Destroy(info);
  } else {
    ADD_FAILURE() << "stream " << stream << " not found";
  }
  jsCtx_Destroy(js);
  natsConnection_Destroy(connection);
  return ids;
}

TEST_F(RelayProcessTest, NatsGetsEachEventOnceAcrossRelayAndServerRestarts) {
  const int port = testing::FreeLoopbackPort();
  auto server = StartNats(port);
  testing::WriteFile(dir_.File("relay.yaml"),
                     "retry: { max_attempts: 100, initial_interval: 50ms, max_interval: 500ms }\n"
                     "sinks:\n  - { name: bus, type: nats, url: \"nats://127.0.0.1:" +
                         std::to_string(port) + "\", stream: ORDERS }\n");
  RunOrders(3, "n");
  auto killed = Waystone({"relay", "--config", dir_.File("relay.yaml"), "--until-drained"},
                         {{"WAYSTONE_CRASH_AT", "after-deliver:bus"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;

  // The server goes down; more work is committed meanwhile; a relay keeps trying.
  server->Signal(SIGTERM);
  server->Wait();
  RunOrders(3, "m");
  testing::Process relay({testing::WaystoneBinary(), "relay", "--config", dir_.File("relay.yaml")},
                         Env(), dir_.path());
  // Deliberate: the relay keeps failing against the absent server for a while first.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  server = StartNats(port);
  auto store = OpenStore({db_});
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto stats = (*store)->DeliveryStats();
        if (!stats.ok() || stats->empty()) return false;
        return (*stats)[0].pending == 0 && (*stats)[0].delivered > 0;
      },
      std::chrono::seconds(60)));
  relay.Signal(SIGTERM);
  EXPECT_EQ(relay.Wait().exit_code, 0);

  const auto committed = Committed();
  ASSERT_EQ(committed.size(), 48u);
  const auto ids = StreamIds(port, "ORDERS");
  std::set<std::string> unique(ids.begin(), ids.end());
  EXPECT_EQ(ids.size(), unique.size()) << "an event id appears twice on the stream";
  EXPECT_EQ(ids.size(), committed.size());
  for (const auto& e : committed) EXPECT_TRUE(unique.contains(e.event_id)) << e.type;
}

// A NATS sink named "bus" publishing to `stream` on the nats-server at `port`.
std::unique_ptr<Sink> NatsSinkTo(int port, const std::string& stream) {
  SinkConfig config;
  config.name = "bus";
  config.kind = SinkKind::kNats;
  config.nats_url = "nats://127.0.0.1:" + std::to_string(port);
  config.stream = stream;
  return NewNatsSink(config);
}

// `count` events "PREFIX0".. with their CloudEvents, as the relay hands a sink a batch.
struct TestBatch {
  TestBatch(const std::string& prefix, int count) {
    for (int i = 0; i < count; ++i) {
      const std::string id = prefix + std::to_string(i);
      events.push_back({i + 1, id, i + 1, "default", "waystone.step.completed", "{}", 0});
      bodies.push_back(Json{{"specversion", "1.0"}, {"id", id}}.dump());
    }
    for (const EventRecord& event : events) pointers.push_back(&event);
  }
  TestBatch(const TestBatch&) = delete;  // `pointers` point into `events`
  TestBatch& operator=(const TestBatch&) = delete;
  // Hands the batch to `sink` as the relay would, with room in the lease throughout.
  std::vector<DeliveryOutcome> SentTo(Sink& sink) const {
    return sink.DeliverBatch(pointers, bodies, [] { return true; });
  }
  std::vector<EventRecord> events;
  std::vector<std::string> bodies;
  std::vector<const EventRecord*> pointers;
};

// The NATS sink's batch against a real nats-server whose stream takes five messages
// and refuses the rest: each acknowledgement and each refusal reaches its own event.
TEST_F(RelayProcessTest, NatsBatchMatchesEachAcknowledgementToItsEvent) {
  const int port = testing::FreeLoopbackPort();
  auto server = StartNats(port);
  const std::string url = "nats://127.0.0.1:" + std::to_string(port);
  {
    natsConnection* connection = nullptr;
    ASSERT_EQ(natsConnection_ConnectTo(&connection, url.c_str()), NATS_OK);
    jsCtx* js = nullptr;
    ASSERT_EQ(natsConnection_JetStream(&js, connection, nullptr), NATS_OK);
    jsStreamConfig stream;
    jsStreamConfig_Init(&stream);
    stream.Name = "SMALL";
    const char* subjects[] = {"waystone.>"};
    stream.Subjects = subjects;
    stream.SubjectsLen = 1;
    stream.MaxMsgs = 5;
    stream.Discard = js_DiscardNew;  // the sixth and later are refused, not made room for
    jsStreamInfo* info = nullptr;
    jsErrCode error;
    ASSERT_EQ(js_AddStream(&info, js, &stream, nullptr, &error), NATS_OK);
    jsStreamInfo_Destroy(info);
    jsCtx_Destroy(js);
    natsConnection_Destroy(connection);
  }
  auto sink = NatsSinkTo(port, "SMALL");
  ASSERT_TRUE(sink->delivers_batches());
  const TestBatch batch("batch-", 10);
  const std::vector<EventRecord>& events = batch.events;

  auto delivered_ids = [&](const std::vector<DeliveryOutcome>& outcomes) {
    std::set<std::string> ids;
    EXPECT_EQ(outcomes.size(), events.size());
    for (size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].result == DeliveryOutcome::Result::kDelivered) {
        ids.insert(events[i].event_id);
      } else {
        EXPECT_EQ(outcomes[i].result, DeliveryOutcome::Result::kRetry);
        EXPECT_NE(outcomes[i].detail, "") << events[i].event_id;
      }
    }
    return ids;
  };
  const std::set<std::string> first = delivered_ids(batch.SentTo(*sink));
  const std::vector<std::string> held = StreamIds(port, "SMALL");
  EXPECT_EQ(first.size(), 5u);
  EXPECT_EQ(first, std::set<std::string>(held.begin(), held.end()));
  // Again: the five held are acknowledged as duplicates (delivered), the rest refused.
  const std::set<std::string> again = delivered_ids(batch.SentTo(*sink));
  EXPECT_EQ(again, first);
  EXPECT_EQ(StreamIds(port, "SMALL").size(), 5u);
}

// The NATS sink's batch when the server stops answering (SIGSTOP) mid-way: each event
// is a retry within the sink's longest attempt; once the server goes on, the same batch
// again is acknowledged, and the stream holds each event once (what the server had
// taken while stopped is recognised by its Nats-Msg-Id).
TEST_F(RelayProcessTest, NatsBatchToAStoppedServerRetriesInTimeAndLandsOnce) {
  const int port = testing::FreeLoopbackPort();
  auto server = StartNats(port);
  auto sink = NatsSinkTo(port, "HALTED");
  auto count = [](const std::vector<DeliveryOutcome>& outcomes, DeliveryOutcome::Result result) {
    return std::count_if(outcomes.begin(), outcomes.end(),
                         [&](const DeliveryOutcome& o) { return o.result == result; });
  };
  const TestBatch first("up-", 5);
  ASSERT_EQ(count(first.SentTo(*sink), DeliveryOutcome::Result::kDelivered),
            5);  // connected, the stream made

  server->Signal(SIGSTOP);
  const TestBatch halted("halted-", 5);
  const auto began = std::chrono::steady_clock::now();
  const std::vector<DeliveryOutcome> stalled = halted.SentTo(*sink);
  const auto took = std::chrono::steady_clock::now() - began;
  server->Signal(SIGCONT);
  EXPECT_EQ(count(stalled, DeliveryOutcome::Result::kRetry), 5);
  EXPECT_LE(took, std::chrono::milliseconds(sink->longest_attempt() + 500));

  EXPECT_EQ(count(halted.SentTo(*sink), DeliveryOutcome::Result::kDelivered), 5);
  const std::vector<std::string> ids = StreamIds(port, "HALTED");
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 10u);
}

}  // namespace
}  // namespace waystone
