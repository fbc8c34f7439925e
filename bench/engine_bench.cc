// Engine throughput beside the raw commit rate of the same database, measured in
// the same run. See docs/performance.md.
//
//   build/bench/engine_bench [--dir DIR] [--instances N] [--synchronous FULL]
//   build/bench/engine_bench --postgres postgresql://user@host:port [--instances N]
//     (1, 2 and 4 worker processes on one PostgreSQL; bench/run-postgres.sh starts a
//     private cluster for it)

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "flags.h"
#include "store/postgres/raw_commit_probe.h"
#include "store/store.h"
#include "workloads.h"

namespace waystone {
namespace {

using bench::kFiveTransforms;

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
    auto started =
        (*engine)->StartInstance(*definition, {"bench", "{\"n\": " + std::to_string(i) + "}"});
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

// Runs an engine on `db` until nothing is runnable: one worker process of the
// PostgreSQL benchmark.
int RunWorkerProcess(const std::string& db, int threads) {
  StoreOptions options;
  options.path = db;
  options.max_connections = threads + 4;
  auto store = OpenStore(options);
  if (!store.ok()) return 1;
  auto http = NewCurlHttpClient({});
  SeededRandom random;
  EngineOptions engine_options;
  engine_options.workers = threads;
  auto engine =
      Engine::Create(store->get(), http.get(), SystemClock::Get(), &random, engine_options);
  if (!engine.ok()) return 1;
  (*engine)->Start();
  while (true) {
    auto idle = (*engine)->Idle();
    if (idle.ok() && *idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  (*engine)->Stop();
  return 0;
}

int RunPostgres(const std::string& self, const std::string& server, int instances) {
  auto raw = MeasurePostgresRawCommitRate(server + "/postgres", 3000);
  if (!raw.ok()) {
    std::fprintf(stderr, "raw probe: %s\n", raw.status().ToString().c_str());
    return 1;
  }
  std::printf("PostgreSQL at %s\n", server.c_str());
  std::printf("raw single-row commits/s over one connection (baseline, same run): %.0f\n\n", *raw);
  std::printf("%-10s %10s %10s %14s %12s %16s\n", "processes", "instances", "seconds",
              "instances/s", "steps/s", "steps/s / raw");
  for (int processes : {1, 2, 4}) {
    const std::string name = "bench_" + std::to_string(processes);
    if (!RecreatePostgresDatabase(server + "/postgres", name).ok()) return 1;
    const std::string db = server + "/" + name;
    {
      StoreOptions options;
      options.path = db;
      auto store = OpenStore(options);
      auto http = NewCurlHttpClient({});
      SeededRandom random(1);
      auto engine = Engine::Create(store->get(), http.get(), SystemClock::Get(), &random, {});
      auto definition = LoadDefinitionText(kFiveTransforms, "bench.yaml");
      if (!engine.ok() || !definition.ok()) return 1;
      for (int i = 0; i < instances; ++i) {
        if (!(*engine)
                 ->StartInstance(*definition, {"bench", "{\"n\": " + std::to_string(i) + "}"})
                 .ok()) {
          return 1;
        }
      }
    }
    const auto begin = std::chrono::steady_clock::now();
    std::vector<pid_t> pids;
    for (int p = 0; p < processes; ++p) {
      std::vector<std::string> args = {self, "--worker-process", db, "--threads",
                                       std::to_string(64 / processes)};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      pid_t pid = 0;
      if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return 1;
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    StoreOptions options;
    options.path = db;
    auto store = OpenStore(options);
    int64_t completed = 0;
    const auto summary = (*store)->Summary();
    if (!summary.ok()) return 1;
    for (const auto& [state, count] : summary->instances_by_state) {
      if (state == InstanceState::kCompleted) completed = count;
    }
    if (completed != instances) {
      std::fprintf(stderr, "only %lld of %d instances completed\n",
                   static_cast<long long>(completed), instances);
      return 1;
    }
    const double per_second = instances / seconds;
    std::printf("%-10d %10d %10.2f %14.1f %12.1f %16.2f\n", processes, instances, seconds,
                per_second, per_second * 5, per_second * 5 / *raw);
  }
  return 0;
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker-process") == 0) {
    const int threads = argc >= 5 ? std::atoi(argv[4]) : 16;
    return waystone::RunWorkerProcess(argv[2], threads);
  }
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--postgres") == 0) {
      int instances = 2000;
      for (int j = 1; j + 1 < argc; j += 2) {
        if (std::strcmp(argv[j], "--instances") == 0) instances = std::atoi(argv[j + 1]);
      }
      char self[4096] = {};
      if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 1;
      return waystone::RunPostgres(self, argv[i + 1], instances);
    }
  }
  std::string dir = ".";
  std::string synchronous = "FULL";
  int instances = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--dir") == 0)
      dir = argv[i + 1];
    else if (std::strcmp(argv[i], "--instances") == 0)
      instances = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--synchronous") == 0)
      synchronous = argv[i + 1];
  }
  auto raw = waystone::bench::SqliteRawCommitRate(dir, synchronous);
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
