// HTTP API throughput: POST /v1/instances over loopback into SQLite, beside the raw
// commit rate of the same disk measured in the same run. See docs/performance.md.
//
//   build/bench/api_bench [--dir DIR] [--requests N]
//
// Each start with an Idempotency-Key is three transactions (claim the key, start
// the instance with its steps and outbox event, store the response) plus a token
// lookup; without a key it is one. Workers are not running: this measures the
// API's own cost.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "flags.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "store/sqlite/raw_commit_probe.h"
#include "store/store.h"

namespace waystone {
namespace {

constexpr char kWorkflow[] = R"(workflow: bench-api
key: "bench:{{input.n}}"
steps:
  - name: s1
    transform: { n: "{{input.n}}" }
)";

struct Result {
  int clients;
  bool with_key;
  int requests;
  double seconds;
  int failures;
};

Result Run(const std::string& db_path, int clients, int requests, bool with_key) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
  StoreOptions store_options;
  store_options.path = db_path;
  auto store = OpenStore(store_options);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  auto http = NewCurlHttpClient({});
  SeededRandom random(1);
  auto engine = Engine::Create(store->get(), http.get(), SystemClock::Get(), &random, {});
  auto definition = LoadDefinitionText(kWorkflow, "bench.yaml");
  if (!engine.ok() || !definition.ok() || !(*engine)->Register(*definition).ok()) std::exit(1);
  auto token = CreateToken(**store, "bench", "bench", Role::kOperator, 1);
  ApiServerOptions api;
  api.listen = "127.0.0.1:0";
  auto server = ApiServer::Start(api, store->get(), SystemClock::Get(), engine->get());
  if (!token.ok() || !server.ok()) std::exit(1);
  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->port()) + "/v1/instances";

  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      auto client = NewCurlHttpClient({});  // keeps its connection alive
      while (true) {
        const int n = next.fetch_add(1);
        if (n >= requests) return;
        HttpRequest request{
            "POST",
            url,
            {{"Authorization", "Bearer " + *token}, {"Content-Type", "application/json"}},
            "{\"workflow\":\"bench-api\",\"input\":{\"n\":" + std::to_string(n) + "}}",
            10'000};
        request.reuse = ConnectionReuse::kReuse;  // a client of the API, not an engine call
        if (with_key) request.headers.emplace_back("Idempotency-Key", "k-" + std::to_string(n));
        HttpResponse response = client->Send(request);
        if (response.outcome.status != 201) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {clients, with_key, requests, seconds, failures.load()};
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  std::string dir = std::filesystem::temp_directory_path().string();
  int requests = 1000;
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (std::strcmp(argv[i], "--requests") == 0) requests = std::atoi(argv[i + 1]);
  }
  const std::string probe = dir + "/api-bench-probe.db";
  auto raw = waystone::MeasureSqliteRawCommitRate(probe, "FULL", 2000);
  if (!raw.ok()) {
    std::fprintf(stderr, "raw probe: %s\n", raw.status().ToString().c_str());
    return 1;
  }
  std::printf("SQLite WAL synchronous=FULL in %s\n", dir.c_str());
  std::printf("raw single-row commits/s (baseline, same run): %.0f\n\n", *raw);
  std::printf("%-8s %-16s %9s %9s %12s %14s %9s\n", "clients", "Idempotency-Key", "requests",
              "seconds", "starts/s", "starts/s / raw", "failures");
  for (int clients : {1, 16}) {
    for (bool with_key : {false, true}) {
      auto r = waystone::Run(dir + "/api-bench.db", clients, requests, with_key);
      const double rate = r.requests / r.seconds;
      std::printf("%-8d %-16s %9d %9.2f %12.1f %14.2f %9d\n", r.clients, r.with_key ? "yes" : "no",
                  r.requests, r.seconds, rate, rate / *raw, r.failures);
    }
  }
  std::filesystem::remove(dir + "/api-bench.db");
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(probe + suffix);
  return 0;
}
