// Relay throughput: how fast the outbox relay drains a backlog the engine produced at
// its top rate, to a loopback webhook and to NATS JetStream, with the backlog sampled
// over the run. See docs/performance.md.
//
//   build/bench/relay_bench [--dir DIR] [--instances 2000] [--sinks webhook,nats]
//                           [--batch N] [--parallel N] [--receiver node|python]
//                           [--keep-alive 1]
//   build/bench/relay_bench --postgres postgresql://user@host:port [...]
//     (WAYSTONE_BENCH=relay_bench bash bench/run-postgres.sh starts a private cluster)
//
// The engine first runs `instances` five-step workflows to rest (seven events each);
// its events/s is the rate the relay has to keep up with. Then one relay per sink
// drains the outbox. What arrived is counted by counterparts that share no code with
// ours: an HTTP server on Node's own http module (bench/loopback_receiver.mjs; or with
// --receiver python, the slower Python standard-library one, loopback_receiver.py),
// which also checks the order per instance, and a real nats-server (the stream's
// message count).
// Baselines in the same run: the database's raw single-row commit rate, and each sink's
// raw rate (one publisher calling the sink in a loop, no store).

#include <arpa/inet.h>
#include <fcntl.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "flags.h"
#include "messaging/relay.h"
#include "messaging/relay_config.h"
#include "messaging/sink.h"
#include "store/postgres/raw_commit_probe.h"
#include "store/store.h"
#include "workloads.h"

extern char** environ;
// The checkout this benchmark was built from (the build folder's source_dir.cc).
const char* WaystoneSourceDir();

namespace waystone {
namespace {

using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

constexpr char kSecret[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr char kStream[] = "WAYSTONE";

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "relay_bench: %s\n", what.c_str());
  std::exit(1);
}

double SecondsSince(SteadyClock::time_point begin) {
  return std::chrono::duration<double>(SteadyClock::now() - begin).count();
}

// A child process (the receiver, nats-server), ended with SIGTERM when it goes.
class Child {
 public:
  // Starts `args`; with a `line`, returns the first line the child writes in it.
  Child(const std::vector<std::string>& args, std::string* line) {
    int pipe_fds[2] = {-1, -1};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (line != nullptr) {
      if (pipe(pipe_fds) != 0) Fail("pipe");
      posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
      posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    } else {
      // nats-server logs to standard error: kept out of the figures.
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    }
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
      Fail("cannot start " + args[0]);
    }
    posix_spawn_file_actions_destroy(&actions);
    if (line != nullptr) {
      close(pipe_fds[1]);
      char c = 0;
      while (read(pipe_fds[0], &c, 1) == 1 && c != '\n') line->push_back(c);
      close(pipe_fds[0]);
    }
  }
  ~Child() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

 private:
  pid_t pid_ = 0;
};

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    Fail("no free port");
  }
  close(fd);
  return ntohs(address.sin_port);
}

bool PortOpen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool open = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return open;
}

// Messages in the JetStream stream, as nats-server counts them.
int64_t StreamMessages(const std::string& url) {
  natsConnection* connection = nullptr;
  if (natsConnection_ConnectTo(&connection, url.c_str()) != NATS_OK) Fail("connect " + url);
  jsCtx* js = nullptr;
  natsConnection_JetStream(&js, connection, nullptr);
  jsStreamInfo* info = nullptr;
  jsErrCode error = static_cast<jsErrCode>(0);
  int64_t messages = 0;
  if (js_GetStreamInfo(&info, js, kStream, nullptr, &error) == NATS_OK) {
    messages = static_cast<int64_t>(info->State.Msgs);
    jsStreamInfo_Destroy(info);
  }
  jsCtx_Destroy(js);
  natsConnection_Destroy(connection);
  return messages;
}

// The receiver's "/stats" (counts and order) or "/count" (counts only, cheap).
Json ReceiverStats(HttpClient& http, const std::string& base, const std::string& path) {
  HttpRequest request{"GET", base + path, {}, "", 5'000, ConnectionReuse::kFresh};
  HttpResponse response = http.Send(request);
  if (response.outcome.kind != CallOutcome::Kind::kResponse || response.outcome.status != 200) {
    Fail("receiver stats: " + response.error);
  }
  return Json::parse(response.body);
}

// Calls `sink` in a loop from one thread for about 2 s with events like the engine's;
// returns deliveries acknowledged per second.
double RawSinkRate(Sink& sink, const std::string& prefix) {
  const auto begin = SteadyClock::now();
  int delivered = 0;
  for (int i = 0; SecondsSince(begin) < 2.0; ++i) {
    EventRecord event{0,
                      prefix + std::to_string(i),
                      1,
                      "bench",
                      "waystone.step.completed",
                      R"({"workflow":"bench-transforms","instance_key":"raw","step":"s1"})",
                      0};
    const std::string body = R"({"specversion":"1.0","id":")" + event.event_id +
                             R"(","type":"waystone.step.completed","subject":"raw","data":{}})";
    if (sink.Deliver(event, body).result != DeliveryOutcome::Result::kDelivered) {
      Fail("raw sink delivery failed");
    }
    ++delivered;
  }
  return delivered / SecondsSince(begin);
}

// Runs `instances` five-step workflows to rest on 64 workers; returns the events
// committed per second.
double FillOutbox(Store* store, HttpClient* http, int instances) {
  SeededRandom random(1);
  EngineOptions options;
  options.workers = 64;
  options.poll_interval = 5;
  auto engine = Engine::Create(store, http, SystemClock::Get(), &random, options);
  auto definition = LoadDefinitionText(bench::kFiveTransforms, "bench.yaml");
  if (!engine.ok() || !definition.ok()) Fail("engine");
  const auto begin = SteadyClock::now();
  for (int i = 0; i < instances; ++i) {
    if (!(*engine)
             ->StartInstance(*definition, {"bench", "{\"n\": " + std::to_string(i) + "}"})
             .ok()) {
      Fail("start");
    }
  }
  (*engine)->Start();
  while (true) {
    auto idle = (*engine)->Idle();
    if (idle.ok() && *idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const double seconds = SecondsSince(begin);
  (*engine)->Stop();
  auto summary = store->Summary();
  if (!summary.ok()) Fail("summary");
  return summary->outbox_events / seconds;
}

// The committed order of event ids per instance key (the CloudEvent subject).
Json CommittedOrder(Store* store) {
  Json order = Json::object();
  auto instances = store->ListInstances({});
  if (!instances.ok()) Fail("list instances");
  for (const InstanceRecord& instance : *instances) {
    auto events = store->ListEvents(instance.id);
    if (!events.ok()) Fail("list events");
    Json& ids = order[instance.key];
    for (const EventRecord& event : *events) ids.push_back(event.event_id);
  }
  return order;
}

int64_t Delivered(Store* store, const std::string& sink) {
  auto stats = store->DeliveryStats();
  if (!stats.ok()) Fail("delivery stats: " + stats.status().ToString());
  for (const SinkStats& s : *stats) {
    if (s.sink == sink) return s.delivered;
  }
  return 0;
}

struct Drained {
  double seconds = 0;
  int64_t delivered = 0;
};

// One relay with the sink of `sink_yaml` drains the outbox; prints the backlog (events
// the counterpart has not received yet, `arrived`) every 250 ms. The counterpart is
// asked every 10 ms, which costs the store nothing (its own count scans every delivery
// kept); once all arrived, the store is asked until it marked the last round.
Drained Drain(Store* store, HttpClient* http, const std::string& name, const std::string& sink_yaml,
              const std::string& tuning, int64_t total, const std::function<int64_t()>& arrived) {
  const std::string yaml = "deployment: bench\n" + tuning + "sinks:\n  - " + sink_yaml + "\n";
  auto config = ParseRelayConfig(yaml, "relay_bench.yaml");
  if (!config.ok()) Fail(config.status().ToString());
  SeededRandom random(2);
  auto relay = Relay::Create(store, http, SystemClock::Get(), &random, *config, "bench-" + name);
  if (!relay.ok()) Fail(relay.status().ToString());
  const auto begin = SteadyClock::now();
  (*relay)->Start();
  std::printf("  backlog of %s (s: undelivered):", name.c_str());
  int64_t delivered = 0;
  int64_t received = 0;
  for (int tick = 1, printed = 0; delivered < total; ++tick) {
    std::this_thread::sleep_until(begin + std::chrono::milliseconds(10 * tick));
    const bool short_before = received < total;
    if (short_before) received = arrived();
    if (tick % 25 == 0 || (short_before && received >= total)) {
      std::printf("%s %.2f: %lld", printed++ % 8 == 0 ? "\n   " : "", SecondsSince(begin),
                  static_cast<long long>(total - received));
    }
    if (received >= total) delivered = Delivered(store, name);
    if (SecondsSince(begin) > 600) Fail("the relay did not drain in 600 s");
  }
  const double seconds = SecondsSince(begin);
  std::printf("\n");
  (*relay)->Stop();
  return {seconds, Delivered(store, name)};
}

int Run(const std::map<std::string, std::string>& flags) {
  auto flag = [&](const std::string& name, const std::string& fallback) {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  };
  const std::string postgres = flag("postgres", "");
  const std::string dir = flag("dir", ".");
  const int instances = std::atoi(flag("instances", "2000").c_str());
  const std::string sinks = flag("sinks", "webhook,nats");
  // The webhook's counterpart: Node's http module (one event loop) or Python's
  // standard library (a thread per connection, slower than the relay).
  const std::string receiver_kind = flag("receiver", "node");
  // The webhook sink's keep_alive (and its raw baseline's): 1 reuses connections.
  const std::string keep_alive_flag = flag("keep-alive", "0");
  if (keep_alive_flag != "0" && keep_alive_flag != "1") Fail("--keep-alive is 0 or 1");
  const bool keep_alive = keep_alive_flag == "1";
  if (receiver_kind != "node" && receiver_kind != "python") {
    Fail("--receiver is node or python, not " + receiver_kind);
  }
  if (instances < 1) Fail("--instances must be a positive whole number");
  for (absl::string_view sink : absl::StrSplit(sinks, ',')) {
    if (sink != "webhook" && sink != "nats")
      Fail("--sinks lists webhook and/or nats, not " + std::string(sink));
  }
  std::string tuning;
  if (flags.contains("batch")) tuning += "batch: " + flags.at("batch") + "\n";
  if (flags.contains("parallel")) tuning += "parallel: " + flags.at("parallel") + "\n";
  setenv("RELAY_BENCH_SECRET", kSecret, 1);

  // Baseline 1: the raw single-row commit rate of the same database.
  double raw_commits = 0;
  StoreOptions options;
  options.max_connections = 16;
  if (!postgres.empty()) {
    auto raw = MeasurePostgresRawCommitRate(postgres + "/postgres", 3000);
    if (!raw.ok()) Fail("raw probe: " + raw.status().ToString());
    raw_commits = *raw;
    if (!RecreatePostgresDatabase(postgres + "/postgres", "relay_bench").ok()) Fail("database");
    options.path = postgres + "/relay_bench";
    std::printf("PostgreSQL at %s\n", postgres.c_str());
  } else {
    auto raw = bench::SqliteRawCommitRate(dir, "FULL");
    if (!raw.ok()) Fail("raw probe: " + raw.status().ToString());
    raw_commits = *raw;
    options.path = dir + "/bench-relay.db";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(options.path + suffix);
    std::printf("SQLite WAL synchronous=FULL in %s\n", dir.c_str());
  }
  std::printf("raw single-row commits/s (baseline, same run): %.0f\n", raw_commits);
  auto store = OpenStore(options);
  if (!store.ok()) Fail("open: " + store.status().ToString());
  auto http = NewCurlHttpClient({});

  const double engine_rate = FillOutbox(store->get(), http.get(), instances);
  auto summary = (*store)->Summary();
  const int64_t total = summary->outbox_events;
  std::printf("engine: %d instances, %lld events at %.0f events/s (the rate to keep up with)\n",
              instances, static_cast<long long>(total), engine_rate);
  std::printf("relay tuning: %s\n\n", tuning.empty() ? "defaults" : tuning.c_str());

  struct Row {
    std::string sink;
    Drained drained;
    double raw_sink = 0;
    int64_t counted = 0;  // what the counterpart received
  };
  std::vector<Row> rows;
  const std::string tmp =
      std::filesystem::temp_directory_path() / ("relay-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(tmp);

  if (sinks.find("webhook") != std::string::npos) {
    std::string port;
    const std::string bench_dir = std::string(WaystoneSourceDir()) + "/bench/";
    Child receiver(
        receiver_kind == "python"
            ? std::vector<std::string>{"/usr/bin/python3", bench_dir + "loopback_receiver.py"}
            : std::vector<std::string>{"/usr/bin/node", bench_dir + "loopback_receiver.mjs"},
        &port);
    if (port.empty()) Fail("the receiver did not start");
    const std::string base = "http://127.0.0.1:" + port;
    HttpRequest expect{"POST",
                       base + "/expect",
                       {{"Content-Type", "application/json"}},
                       CommittedOrder(store->get()).dump(),
                       30'000,
                       ConnectionReuse::kFresh};
    if (http->Send(expect).outcome.status != 204) Fail("receiver /expect");
    SinkConfig raw_config;
    raw_config.name = "raw";
    raw_config.url = base + "/raw";
    raw_config.secret = kSecret;
    raw_config.keep_alive = keep_alive;
    Row row{"webhook",
            {},
            RawSinkRate(*NewWebhookSink(raw_config, http.get(), SystemClock::Get()), "raw-"),
            0};
    row.drained = Drain(store->get(), http.get(), "hook",
                        "{ name: hook, type: webhook, url: \"" + base +
                            "/hook\", secret_env: RELAY_BENCH_SECRET, keep_alive: " +
                            (keep_alive ? "true" : "false") + " }",
                        tuning, total, [&] {
                          return ReceiverStats(*http, base, "/count")["unique"].get<int64_t>();
                        });
    const Json stats = ReceiverStats(*http, base, "/stats");
    row.counted = stats["unique"].get<int64_t>();
    std::printf(
        "  receiver: %lld requests, %lld distinct events, %lld instances out of order, "
        "%lld missing\n",
        stats["hook"].get<long long>(), stats["unique"].get<long long>(),
        stats["out_of_order"].get<long long>(), stats["missing"].get<long long>());
    if (row.counted != row.drained.delivered || stats["out_of_order"].get<int64_t>() != 0) {
      Fail("the receiver's count or order does not match what the relay marked delivered");
    }
    rows.push_back(row);
  }
  if (sinks.find("nats") != std::string::npos) {
    const int port = FreeLoopbackPort();
    Child server({"/usr/sbin/nats-server", "-js", "-a", "127.0.0.1", "-p", std::to_string(port),
                  "-sd", tmp + "/jetstream"},
                 nullptr);
    const auto begin = SteadyClock::now();
    while (!PortOpen(port)) {
      if (SecondsSince(begin) > 10) Fail("nats-server did not start");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string url = "nats://127.0.0.1:" + std::to_string(port);
    SinkConfig raw_config;
    raw_config.name = "raw";
    raw_config.kind = SinkKind::kNats;
    raw_config.nats_url = url;
    raw_config.stream = kStream;
    Row row{"nats", {}, RawSinkRate(*NewNatsSink(raw_config), "raw-"), 0};
    const int64_t before = StreamMessages(url);
    row.drained = Drain(store->get(), http.get(), "bus",
                        "{ name: bus, type: nats, url: \"" + url + "\", stream: " + kStream + " }",
                        tuning, total, [&] { return StreamMessages(url) - before; });
    row.counted = StreamMessages(url) - before;
    std::printf("  nats-server: %lld messages in the stream from the relay\n",
                static_cast<long long>(row.counted));
    if (row.counted != row.drained.delivered) {
      Fail("the stream's count does not match what the relay marked delivered");
    }
    rows.push_back(row);
  }
  std::filesystem::remove_all(tmp);

  std::printf("\n%-8s %8s %8s %10s %12s %14s %14s %14s\n", "sink", "events", "seconds", "events/s",
              "raw sink/s", "/ raw sink", "/ raw commits", "/ engine rate");
  for (const Row& row : rows) {
    const double rate = row.drained.delivered / row.drained.seconds;
    std::printf("%-8s %8lld %8.2f %10.0f %12.0f %14.2f %14.2f %14.2f\n", row.sink.c_str(),
                static_cast<long long>(row.drained.delivered), row.drained.seconds, rate,
                row.raw_sink, rate / row.raw_sink, rate / raw_commits, rate / engine_rate);
  }
  if (postgres.empty()) {
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(options.path + suffix);
  }
  return 0;
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "relay_bench: unexpected argument %s\n", argv[i]);
      return 2;
    }
    flags[argv[i] + 2] = argv[i + 1];
  }
  return waystone::Run(flags);
}
