// Closed-loop throughput and latency, the way peers measure theirs: N callers, each
// starts a five-step workflow, waits until its final state is durable
// (Engine::AwaitRest), then starts the next. A warm-up, then a fixed window;
// workflows/s, p50 and p99 of start → durable result, CPU per workflow, and
// steps/s beside the raw commit rate of the same database measured in the same
// run. See docs/performance.md.
//
//   build/bench/closed_loop_bench [--dir DIR] [--seconds 5] [--callers 1,8,64] [--http 1 | --api 1]
//   build/bench/closed_loop_bench --postgres postgresql://user@host:port [...]
//     (bench/run-postgres.sh starts a private cluster and passes its URL)
// In process, a caller is Engine::StartInstance then Engine::AwaitRest. With --api 1
// it is a program embedding Waystone through the public C++ API (libwaystone.so,
// include/waystone/): waystone::api::Engine::Start, then Instance::Wait. With --http 1
// it is a client of `waystone serve`'s API on loopback: POST /v1/instances with
// `Prefer: wait=30`, one kept-alive connection per caller, answered once the
// instance completed.

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
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
#include "store/postgres/pg_connection.h"
#include "store/postgres/raw_commit_probe.h"
#include "store/store.h"
#include "waystone/waystone.h"
#include "workloads.h"

namespace waystone {
namespace {

using bench::kFiveTransforms;

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// What PostgreSQL counted for a database: statements executed (pg_stat_statements,
// when the server preloads it) and WAL syncs (pg_stat_wal, the whole cluster).
struct PgCounts {
  double statements = -1;  // -1: not available
  double wal_syncs = -1;
};

PgCounts ReadPgCounts(const std::string& conninfo) {
  PgCounts counts;
  auto c = PgConnection::Connect(conninfo);
  if (!c.ok()) return counts;
  if (auto wal = (*c)->Query("SELECT wal_sync FROM pg_stat_wal"); wal.ok()) {
    counts.wal_syncs = std::atof(wal->Text(0, 0).c_str());
  }
  if ((*c)->Exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").ok()) {
    auto calls = (*c)->Query(
        "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements WHERE dbid = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())");
    if (calls.ok()) counts.statements = std::atof(calls->Text(0, 0).c_str());
  }
  return counts;
}

struct Figures {
  int callers = 0;
  double statements_per_workflow = -1;
  double wal_syncs_per_workflow = -1;
  int64_t workflows = 0;
  double seconds = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double cpu_ms_per_workflow = 0;
};

// Runs `callers` closed loops on a fresh store at `path`: warm-up, then the window.
enum class Entry { kInProcess, kPublicApi, kHttp };

absl::StatusOr<Figures> RunClosedLoop(const std::string& path, int callers, double warmup_s,
                                      double window_s, Entry entry) {
  const bool over_http = entry == Entry::kHttp;
  // Through the public API, the library opens the database and runs the workers;
  // the engine below is then not started.
  std::unique_ptr<api::Engine> embedded;
  if (entry == Entry::kPublicApi) {
    api::EngineOptions embedded_options;
    embedded_options.database = path;
    embedded_options.workers = std::max(callers, 2);
    embedded_options.database_connections = callers + 8;
    auto opened = api::Engine::Open(embedded_options);
    if (!opened.ok()) return absl::InternalError(opened.status().ToString());
    embedded = std::move(*opened);
    if (auto registered = embedded->RegisterYaml(kFiveTransforms, "bench.yaml"); !registered.ok()) {
      return absl::InternalError(registered.ToString());
    }
  }
  StoreOptions store_options;
  store_options.path = path;
  store_options.max_connections = callers + 8;
  auto store = OpenStore(store_options);
  if (!store.ok()) return store.status();
  auto http = NewCurlHttpClient({});
  SeededRandom random;
  EngineOptions options;
  options.workers = std::max(callers, 2);
  auto engine = Engine::Create(store->get(), http.get(), SystemClock::Get(), &random, options);
  if (!engine.ok()) return engine.status();
  auto definition = LoadDefinitionText(kFiveTransforms, "bench.yaml");
  if (!definition.ok()) return definition.status();
  const bool postgres = path.starts_with("postgres");
  if (!embedded) (*engine)->Start();
  std::unique_ptr<ApiServer> server;
  std::string url;
  std::string token;
  if (over_http) {
    if (auto registered = (*engine)->Register(*definition); !registered.ok()) return registered;
    auto created = CreateToken(**store, "bench", "bench", Role::kOperator, 1);
    if (!created.ok()) return created.status();
    token = *created;
    ApiServerOptions api;
    api.listen = "127.0.0.1:0";
    // A waiting start holds a handler thread, and at most half of them wait.
    api.handler_threads = 2 * callers + 4;
    auto started = ApiServer::Start(api, store->get(), SystemClock::Get(), engine->get());
    if (!started.ok()) return started.status();
    server = std::move(*started);
    url = "http://127.0.0.1:" + std::to_string(server->port()) + "/v1/instances";
  }

  using SteadyClock = std::chrono::steady_clock;
  const auto begin = SteadyClock::now();
  const auto measure_from = begin + std::chrono::duration<double>(warmup_s);
  const auto measure_until = measure_from + std::chrono::duration<double>(window_s);
  std::mutex mu;
  std::vector<double> latencies_ms;
  std::atomic<bool> failed{false};
  std::atomic<int64_t> next_n{0};  // each start a business key of its own
  std::atomic<double> cpu_at_start{0};
  std::atomic<bool> cpu_taken{false};
  PgCounts pg_before;  // written once, by the caller that opens the window
  std::vector<std::jthread> threads;
  for (int caller = 0; caller < callers; ++caller) {
    threads.emplace_back([&] {
      std::vector<double> mine;
      auto client = NewCurlHttpClient({});  // its own kept-alive connection
      while (!failed) {
        const auto started_at = SteadyClock::now();
        if (started_at >= measure_until) break;
        if (started_at >= measure_from && !cpu_taken.exchange(true)) {
          cpu_at_start = CpuSeconds();
          if (postgres) pg_before = ReadPgCounts(path);
        }
        const std::string input = "{\"n\": " + std::to_string(next_n.fetch_add(1)) + "}";
        if (over_http) {
          HttpRequest request{"POST",
                              url,
                              {{"Authorization", "Bearer " + token},
                               {"Content-Type", "application/json"},
                               {"Prefer", "wait=30"}},
                              "{\"workflow\":\"bench-transforms\",\"input\":" + input + "}",
                              40'000};
          request.reuse = ConnectionReuse::kReuse;  // a client of the API, not an engine call
          const HttpResponse response = client->Send(request);
          if (response.outcome.status != 201 ||
              response.body.find("\"state\":\"completed\"") == std::string::npos) {
            std::fprintf(stderr, "POST answered %d: %s %s\n", response.outcome.status,
                         response.error.c_str(), response.body.substr(0, 300).c_str());
            failed = true;
            break;
          }
        } else if (embedded) {
          auto started = embedded->Start("bench-transforms", "", input);
          auto rested = started.ok() ? (*started)->Wait(std::chrono::seconds(30))
                                     : api::Result<api::Outcome>(started.status());
          if (!rested.ok() || rested->state != api::InstanceState::kCompleted) {
            std::fprintf(stderr, "instance did not complete: %s\n",
                         rested.ok() ? rested->reason.c_str() : rested.status().ToString().c_str());
            failed = true;
            break;
          }
        } else {
          auto started = (*engine)->StartInstance(*definition, {"bench", input});
          if (!started.ok()) {
            std::fprintf(stderr, "start: %s\n", started.status().ToString().c_str());
            failed = true;
            break;
          }
          auto rested = (*engine)->AwaitRest(started->instance.id, 30'000);
          if (!rested.ok() || rested->state != InstanceState::kCompleted) {
            std::fprintf(
                stderr, "instance did not complete: %s\n",
                rested.ok() ? rested->status_reason.c_str() : rested.status().ToString().c_str());
            failed = true;
            break;
          }
        }
        const auto done_at = SteadyClock::now();
        // Counted when it started inside the window and finished before its end.
        if (started_at >= measure_from && done_at <= measure_until) {
          mine.push_back(std::chrono::duration<double, std::milli>(done_at - started_at).count());
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  threads.clear();  // joins
  const double cpu = CpuSeconds() - cpu_at_start.load();
  const PgCounts pg_after = postgres ? ReadPgCounts(path) : PgCounts{};
  server.reset();
  (*engine)->Stop();
  embedded.reset();
  if (failed) return absl::InternalError("a caller failed");
  std::sort(latencies_ms.begin(), latencies_ms.end());
  Figures figures;
  figures.callers = callers;
  figures.workflows = static_cast<int64_t>(latencies_ms.size());
  figures.seconds = window_s;
  if (!latencies_ms.empty()) {
    figures.p50_ms = latencies_ms[latencies_ms.size() / 2];
    figures.p99_ms =
        latencies_ms[std::min(latencies_ms.size() - 1, latencies_ms.size() * 99 / 100)];
    figures.cpu_ms_per_workflow = cpu * 1000 / static_cast<double>(latencies_ms.size());
    // Counted over the window; workflows that straddle its edges make this approximate.
    const double n = static_cast<double>(latencies_ms.size());
    if (pg_before.statements >= 0 && pg_after.statements >= 0) {
      figures.statements_per_workflow = (pg_after.statements - pg_before.statements) / n;
    }
    if (pg_before.wal_syncs >= 0 && pg_after.wal_syncs >= 0) {
      figures.wal_syncs_per_workflow = (pg_after.wal_syncs - pg_before.wal_syncs) / n;
    }
  }
  return figures;
}

std::vector<int> ParseCallers(const std::string& text) {
  std::vector<int> callers;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (int n = std::atoi(item.c_str()); n > 0) callers.push_back(n);
  }
  return callers;
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  using namespace waystone;
  std::string dir = ".";
  std::string postgres;
  double window_s = 5;
  // On PostgreSQL at 64 callers the first seconds open the pool's connections: their
  // latencies are the start-up's, not the steady state's.
  double warmup_s = 3;
  std::vector<int> callers = {1, 8, 64};
  bool over_http = false;
  bool public_api = false;
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir")
      dir = argv[i + 1];
    else if (flag == "--postgres")
      postgres = argv[i + 1];
    else if (flag == "--seconds")
      window_s = std::atof(argv[i + 1]);
    else if (flag == "--warmup")
      warmup_s = std::atof(argv[i + 1]);
    else if (flag == "--callers")
      callers = ParseCallers(argv[i + 1]);
    else if (flag == "--http")
      over_http = std::strcmp(argv[i + 1], "0") != 0;
    else if (flag == "--api")
      public_api = std::strcmp(argv[i + 1], "0") != 0;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  // The raw rate of the same database, measured before each row (the disk of a shared machine
  // moves within minutes, so each row's ratio is to the rate of its own moment) and once more
  // after the last one.
  auto measure_raw = [&]() -> absl::StatusOr<double> {
    if (postgres.empty()) return bench::SqliteRawCommitRate(dir, "FULL");
    return MeasurePostgresRawCommitRate(postgres + "/postgres", 3000);
  };
  if (postgres.empty()) {
    std::printf("SQLite WAL synchronous=FULL in %s\n", dir.c_str());
  } else {
    std::printf("PostgreSQL at %s\n", postgres.c_str());
  }
  std::printf("raw single-row commits/s of the same database measured before each row (raw/s)\n");
  std::printf(
      "closed loop %s: start, wait until completed is durable, repeat; %.0f s warm-up, "
      "%.0f s window\n\n",
      over_http    ? "over HTTP (POST /v1/instances, Prefer: wait=30)"
      : public_api ? "through the public C++ API (api::Engine::Start, Instance::Wait)"
                   : "in process",
      warmup_s, window_s);
  std::printf("%-8s %10s %12s %10s %10s %14s %12s %8s %15s%s\n", "callers", "workflows",
              "workflows/s", "p50 ms", "p99 ms", "CPU ms/wf", "steps/s", "raw/s", "steps/s / raw",
              postgres.empty() ? "" : "  statements/wf  WAL syncs/wf");
  for (int n : callers) {
    std::string path;
    if (postgres.empty()) {
      path = dir + "/bench-closed-loop.db";
      for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
    } else {
      const std::string name = "bench_closed_" + std::to_string(n);
      if (!RecreatePostgresDatabase(postgres + "/postgres", name).ok()) return 1;
      path = postgres + "/" + name;
    }
    const absl::StatusOr<double> raw = measure_raw();
    if (!raw.ok()) {
      std::fprintf(stderr, "raw probe: %s\n", raw.status().ToString().c_str());
      return 1;
    }
    const Entry entry = over_http    ? Entry::kHttp
                        : public_api ? Entry::kPublicApi
                                     : Entry::kInProcess;
    auto figures = RunClosedLoop(path, n, warmup_s, window_s, entry);
    if (!figures.ok()) {
      std::fprintf(stderr, "callers %d: %s\n", n, figures.status().ToString().c_str());
      return 1;
    }
    const double per_second = static_cast<double>(figures->workflows) / figures->seconds;
    std::printf("%-8d %10lld %12.1f %10.2f %10.2f %14.2f %12.1f %8.0f %15.2f", n,
                static_cast<long long>(figures->workflows), per_second, figures->p50_ms,
                figures->p99_ms, figures->cpu_ms_per_workflow, per_second * 5, *raw,
                per_second * 5 / *raw);
    if (!postgres.empty()) {
      for (auto [value, width] : {std::pair{figures->statements_per_workflow, 13},
                                  std::pair{figures->wal_syncs_per_workflow, 12}}) {
        if (value < 0)
          std::printf("  %*s", width, "n/a");
        else
          std::printf("  %*.2f", width, value);
      }
    }
    std::printf("\n");
  }
  if (auto after = measure_raw(); after.ok()) {
    std::printf("raw single-row commits/s after the last row: %.0f\n", *after);
  } else {
    std::printf("raw single-row commits/s after the last row: not measured (%s)\n",
                after.status().ToString().c_str());
  }
  if (postgres.empty()) {
    for (const char* suffix : {"", "-wal", "-shm"}) {
      std::filesystem::remove(dir + "/bench-closed-loop.db" + suffix);
    }
  }
  return 0;
}
