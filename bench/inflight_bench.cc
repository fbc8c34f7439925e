// Instances waiting on a slow endpoint: N instances each make one call to a loopback
// endpoint that answers after a fixed delay (tests/targets/slow_target.py, run by
// bench/run-inflight.sh). Prints, per N: throughput, the most requests the endpoint
// saw open at once, the process's threads, and memory per instance in flight (the
// resident size's growth, and the allocator's bytes in use). The baseline, measured in
// the same run: the same N requests sent at once straight through the HTTP client (no
// engine, no store) to the same endpoint.
// See docs/performance.md.
//
//   bench/run-inflight.sh [--instances 1000,10000] [--workers 4] [--delay 2]
//   build/bench/inflight_bench --target http://127.0.0.1:PORT --delay 2 [--dir DIR] ...

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "flags.h"
#include "store/store.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// A field of /proc/self/status in its own unit (kB for memory).
long ProcStatus(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t length = std::strlen(field);
  while (std::getline(status, line)) {
    if (line.compare(0, length, field) == 0 && line.size() > length && line[length] == ':') {
      return std::atol(line.c_str() + length + 1);
    }
  }
  return -1;
}

// Bytes the process's allocator has handed out and not had back, in KiB, over all its
// arenas. Unlike the resident size it does not hide what reused memory another run or
// thread freed, nor count what was freed and kept.
long HeapInUseKb() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<long>((info.uordblks + info.hblkhd) / 1024);
}

std::vector<int> ParseList(const char* text) {
  std::vector<int> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::atoi(item.c_str()));
  return values;
}

Json TargetStats(HttpClient& http, const std::string& target) {
  HttpResponse response = http.Send({"GET", target + "/_stats", {}, "", 5000});
  return Json::parse(response.body, nullptr, /*allow_exceptions=*/false);
}

struct Figures {
  int instances = 0;
  double seconds = 0;
  int most_open = 0;  // requests the endpoint held open at once
  long most_threads = 0;
  long rss_base_kb = 0;  // engine created, instances started, nothing claimed
  long rss_at_most_open_kb = 0;
  long heap_base_kb = 0;  // allocated and not freed, at the same two moments
  long heap_at_most_open_kb = 0;
  long received = 0;  // requests the endpoint received in this run
  long duplicate_keys = 0;
  int completed = 0;
};

// Runs `instances` one-call instances; `run` keeps their keys apart from earlier runs'.
Figures RunOnce(const std::string& dir, const std::string& target, int run, int instances,
                int workers, HttpClient& probe) {
  Figures figures;
  figures.instances = instances;
  const std::string path = dir + "/bench-inflight.db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  auto store = OpenStore({path});
  if (!store.ok()) {
    std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  const std::string text = R"(workflow: bench-slow-call
key: "slow:{{input.run}}:{{input.n}}"
steps:
  - name: create
    recovery: repeatable
    idempotency: { honored: true }
    request:
      method: POST
      url: ")" + target + R"(/orders"
      body: { n: "{{input.n}}" }
      timeout: 60s
    result: { external_id: "/id" }
)";
  auto definition = LoadDefinitionText(text, "bench-slow-call.yaml");
  if (!definition.ok()) {
    std::fprintf(stderr, "definition: %s\n", definition.status().ToString().c_str());
    std::exit(1);
  }
  auto http = NewCurlHttpClient({});
  SeededRandom random(7);
  EngineOptions options;
  options.workers = workers;
  options.max_in_flight = std::max(instances, workers);
  options.lease_duration = 30'000;
  auto engine = Engine::Create(store->get(), http.get(), SystemClock::Get(), &random, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  // Starts from a few threads (they are group-committed).
  std::vector<std::thread> starters;
  std::atomic<int> next{0};
  for (int t = 0; t < 8; ++t) {
    starters.emplace_back([&] {
      for (int n = next++; n < instances; n = next++) {
        auto started =
            (*engine)->StartInstance(*definition, {"default", Json{{"run", run}, {"n", n}}.dump()});
        if (!started.ok()) {
          std::fprintf(stderr, "start: %s\n", started.status().ToString().c_str());
          std::exit(1);
        }
      }
    });
  }
  for (auto& starter : starters) starter.join();
  const Json before = TargetStats(probe, target);
  figures.rss_base_kb = ProcStatus("VmRSS");
  figures.heap_base_kb = HeapInUseKb();

  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      figures.most_threads = std::max(figures.most_threads, ProcStatus("Threads"));
      const Json stats = TargetStats(probe, target);
      if (stats.is_object() && stats["open"].get<int>() > figures.most_open) {
        figures.most_open = stats["open"].get<int>();
        figures.rss_at_most_open_kb = ProcStatus("VmRSS");
        figures.heap_at_most_open_kb = HeapInUseKb();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  (*engine)->Start();
  while (true) {
    auto idle = (*engine)->Idle();
    if (idle.ok() && *idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  figures.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  done = true;
  watch.join();
  (*engine)->Stop();
  if (auto summary = (*store)->Summary(); summary.ok()) {
    for (const auto& [state, count] : summary->instances_by_state) {
      if (state == InstanceState::kCompleted) figures.completed = static_cast<int>(count);
    }
  }
  const Json after = TargetStats(probe, target);
  figures.received = after["received"].get<long>() - before["received"].get<long>();
  figures.duplicate_keys =
      after["duplicate_keys"].get<long>() - before["duplicate_keys"].get<long>();
  engine->reset();
  store->reset();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return figures;
}

// The baseline: `instances` requests sent straight through the HTTP client, all at
// once, no engine and no store. Returns the seconds until the last answer.
double RawSeconds(const std::string& target, int run, int instances) {
  auto http = NewCurlHttpClient({});
  std::atomic<int> answered{0};
  const auto start = std::chrono::steady_clock::now();
  for (int n = 0; n < instances; ++n) {
    HttpRequest request{
        "POST",
        target + "/orders",
        {{"Idempotency-Key", "raw:" + std::to_string(run) + ":" + std::to_string(n)}},
        "{}",
        60'000};
    http->SendAsync(std::move(request), [&answered](HttpResponse) { ++answered; });
  }
  while (answered < instances) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  using namespace waystone;
  std::string dir = ".";
  std::string target;
  double delay_s = 2;
  int workers = 4;
  std::vector<int> counts = {1000, 10000};
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir")
      dir = argv[i + 1];
    else if (flag == "--target")
      target = argv[i + 1];
    else if (flag == "--delay")
      delay_s = std::atof(argv[i + 1]);
    else if (flag == "--workers")
      workers = std::atoi(argv[i + 1]);
    else if (flag == "--instances")
      counts = ParseList(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (target.empty()) {
    std::fprintf(stderr, "--target URL of a slow endpoint is required (bench/run-inflight.sh)\n");
    return 2;
  }
  // One socket per call in flight: take the whole open-file allowance.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  auto probe = NewCurlHttpClient({});
  std::printf("endpoint %s answers after %.1f s; %d workers; %u cores; open files %ld\n",
              target.c_str(), delay_s, workers, std::thread::hardware_concurrency(),
              static_cast<long>(files.rlim_cur));
  std::printf("%-10s %8s %10s %10s %8s %10s %8s %9s %9s %11s %12s %9s %5s\n", "instances",
              "seconds", "wf/s", "raw_req/s", "wf/raw", "most_open", "threads", "rss_base",
              "rss_peak", "rss/flight", "heap/flight", "received", "dups");
  for (size_t run = 0; run < counts.size(); ++run) {
    const int instances = counts[run];
    // Keys of their own: the endpoint may have seen earlier processes' runs.
    const int id = static_cast<int>(getpid()) * 100 + static_cast<int>(run);
    const double raw = instances / RawSeconds(target, id, instances);
    Figures f = RunOnce(dir, target, id, instances, workers, *probe);
    // KiB per request open: the resident size's growth (what the system sees; memory
    // another run freed and this one reused hides in it) and the allocator's.
    auto per_flight = [&f](long base_kb, long peak_kb) {
      return f.most_open > 0 ? static_cast<double>(peak_kb - base_kb) / f.most_open : 0.0;
    };
    const double rate = f.completed / f.seconds;
    std::printf("%-10d %8.2f %10.1f %10.1f %8.2f %10d %8ld %8ldM %8ldM %11.1f %12.1f %9ld %5ld\n",
                instances, f.seconds, rate, raw, rate / raw, f.most_open, f.most_threads,
                f.rss_base_kb / 1024, f.rss_at_most_open_kb / 1024,
                per_flight(f.rss_base_kb, f.rss_at_most_open_kb),
                per_flight(f.heap_base_kb, f.heap_at_most_open_kb), f.received, f.duplicate_keys);
    if (f.completed != instances || f.received != instances || f.duplicate_keys != 0) {
      std::fprintf(stderr, "completed %d and received %ld of %d instances\n", f.completed,
                   f.received, instances);
      return 1;
    }
  }
  return 0;
}
