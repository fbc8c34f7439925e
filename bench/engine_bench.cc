// Engine throughput on SQLite beside the raw commit rate of the same disk,
// measured in the same run. See docs/performance.md.
//
//   build/bench/engine_bench [--dir DIR] [--instances N] [--synchronous FULL]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "store/sqlite/raw_commit_probe.h"
#include "store/store.h"

namespace waystone {
namespace {

// Five steps that do no external I/O: the cost measured is the engine's own
// (claim, render, checkpoint, group commit).
constexpr char kFiveTransforms[] = R"(workflow: bench-transforms
key: "bench:{{input.n}}"
steps:
  - name: s1
    transform: { total: "{{input.n}}" }
  - name: s2
    transform: { previous: "{{steps.s1.output.total}}", label: "order {{input.n}}" }
  - name: s3
    transform: { label: "{{steps.s2.output.label}}", ok: true }
  - name: s4
    transform: { items: [ "{{input.n}}", "{{steps.s3.output.label}}" ] }
  - name: s5
    transform: { done: "{{steps.s4.output.items.1}}" }
)";

struct Result {
  int concurrency;
  int instances;
  double seconds;
};

Result RunEngine(const std::string& db_path, const std::string& synchronous, int concurrency,
                 int instances) {
  std::filesystem::remove(db_path);
  std::filesystem::remove(db_path + "-wal");
  std::filesystem::remove(db_path + "-shm");
  StoreOptions store_options;
  store_options.path = db_path;
  store_options.synchronous = synchronous;
  auto store = OpenStore(store_options);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  auto http = NewCurlHttpClient({});
  SeededRandom random(1);
  EngineOptions options;
  options.workers = concurrency;
  options.poll_interval = 5;
  auto engine = Engine::Create(store->get(), http.get(), SystemClock::Get(), &random, options);
  auto definition = LoadDefinitionText(kFiveTransforms, "bench.yaml");
  if (!engine.ok() || !definition.ok()) std::exit(1);
  for (int i = 0; i < instances; ++i) {
    auto started = (*engine)->StartInstance(*definition, {"bench", "{\"n\": " + std::to_string(i) + "}"});
    if (!started.ok()) {
      std::fprintf(stderr, "start: %s\n", started.status().ToString().c_str());
      std::exit(1);
    }
  }
  const auto begin = std::chrono::steady_clock::now();
  (*engine)->Start();
  while (true) {
    auto idle = (*engine)->Idle();
    if (idle.ok() && *idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  (*engine)->Stop();
  auto summary = (*store)->Summary();
  int64_t completed = 0;
  for (const auto& [state, count] : summary->instances_by_state) {
    if (state == InstanceState::kCompleted) completed = count;
  }
  if (completed != instances) {
    std::fprintf(stderr, "only %lld of %d instances completed\n", static_cast<long long>(completed),
                 instances);
    std::exit(1);
  }
  return {concurrency, instances, seconds};
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  std::string dir = ".";
  std::string synchronous = "FULL";
  int instances = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    else if (std::strcmp(argv[i], "--instances") == 0) instances = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--synchronous") == 0) synchronous = argv[i + 1];
  }
  const std::string probe = dir + "/bench-raw.db";
  std::filesystem::remove(probe);
  auto raw = waystone::MeasureSqliteRawCommitRate(probe, synchronous, 3000);
  std::filesystem::remove(probe);
  std::filesystem::remove(probe + "-wal");
  std::filesystem::remove(probe + "-shm");
  if (!raw.ok()) {
    std::fprintf(stderr, "raw probe: %s\n", raw.status().ToString().c_str());
    return 1;
  }
  std::printf("SQLite WAL synchronous=%s in %s\n", synchronous.c_str(), dir.c_str());
  std::printf("raw single-row commits/s (baseline, same run): %.0f\n\n", *raw);
  std::printf("%-12s %10s %10s %14s %12s %16s\n", "concurrency", "instances", "seconds",
              "instances/s", "steps/s", "steps/s / raw");
  for (int concurrency : {1, 64}) {
    const int n = concurrency == 1 ? std::max(50, instances / 10) : instances;
    auto r = waystone::RunEngine(dir + "/bench-engine.db", synchronous, concurrency, n);
    const double per_second = r.instances / r.seconds;
    const double steps = per_second * 5;
    std::printf("%-12d %10d %10.2f %14.1f %12.1f %16.2f\n", r.concurrency, r.instances, r.seconds,
                per_second, steps, steps / *raw);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::filesystem::remove(dir + "/bench-engine.db" + suffix);
  }
  return 0;
}
