// The attempt history: opening an instance with 10,000 attempts (its view and the
// first page of GET /v1/attempts) beside reading one row by primary key, and the
// group commit with attempts under and at the per-step bound beside one without
// attempts, all measured in the same run. See docs/performance.md.
//
//   build/bench/attempts_bench [--dir DIR] [--postgres postgresql://user@host:port]
//     (WAYSTONE_BENCH=attempts_bench bench/run-postgres.sh runs it on a private
//     cluster; without --postgres only SQLite is measured)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "flags.h"
#include "server/wire.h"
#include "store/postgres/raw_commit_probe.h"
#include "store/store.h"

namespace waystone {
namespace {

constexpr int kSteps = 10;
constexpr int kAttemptsPerStep = 1000;  // the default bound: 10,000 kept in all
constexpr int kPerCommit = 100;
constexpr int kRepeats = 21;

[[noreturn]] void Die(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

std::unique_ptr<Store> OpenWith(const std::string& path, int attempts_per_step) {
  StoreOptions options;
  options.path = path;
  options.attempts_per_step = attempts_per_step;
  auto store = OpenStore(options);
  if (!store.ok()) Die("open", store.status());
  return std::move(*store);
}

NewInstance InstanceNamed(const std::string& key) {
  NewInstance in;
  in.tenant = "bench";
  in.key = key;
  in.workflow = "wf";
  in.definition_hash = "defhash";
  in.input_json = "{}";
  in.input_hash = Sha256Hex(in.input_json);
  in.trace_id = "trace";
  for (int s = 0; s < kSteps; ++s) in.step_names.push_back("step-" + std::to_string(s));
  in.started_event = {0, "ev-" + key, 0, "bench", "waystone.instance.started", "{}", 0};
  in.now = 1000;
  return in;
}

AttemptRecord AttemptOf(int step, Millis at, const Lease& lease) {
  return {step,
          0,
          AttemptPhase::kCall,
          true,
          ConnectionUsed::kReused,
          503,
          ErrorClass::kTransient,
          "HTTP 503 Service Unavailable",
          at,
          at + 40,
          lease.owner,
          lease.epoch};
}

// Returns the median of `kRepeats` runs of `body`, in milliseconds.
double MedianMs(const std::function<void()>& body) {
  std::vector<double> ms;
  for (int i = 0; i < kRepeats; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    body();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
                     .count());
  }
  std::nth_element(ms.begin(), ms.begin() + kRepeats / 2, ms.end());
  return ms[kRepeats / 2];
}

// One instance with kSteps x kAttemptsPerStep attempts, recorded as the engine
// does (through Commit, kPerCommit at a time, the steps interleaved in time).
void OpenTheHistory(const std::string& path) {
  auto store = OpenWith(path, kAttemptsPerStep);
  if (auto s = store->PutDefinition("defhash", "wf", "wf.yaml", "text", 1); !s.ok()) Die("def", s);
  auto started = store->StartInstance(InstanceNamed("many"));
  if (!started.ok()) Die("start", started.status());
  const int64_t id = started->instance.id;
  auto lease = store->ClaimInstance(id, "bench-host/1/w", 2000, 3'600'000);
  if (!lease.ok()) Die("claim", lease.status());
  const auto begin = std::chrono::steady_clock::now();
  Millis at = 10'000;
  for (int n = 0; n < kSteps * kAttemptsPerStep; n += kPerCommit) {
    Change change;
    change.lease = *lease;
    change.now = at;
    change.lease_expires_at = at + 3'600'000;
    for (int i = 0; i < kPerCommit; ++i)
      change.attempts.push_back(AttemptOf((n + i) % kSteps, at++, *lease));
    auto done = store->Commit({change});
    if (!done.ok()) Die("commit", done.status());
    if (!(*done)[0].ok()) Die("commit", (*done)[0]);
  }
  const double build_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  auto ids = PublicIdsOf(*store);
  if (!ids.ok()) Die("ids", ids.status());
  auto instance = store->GetInstance(id);
  size_t view_bytes = 0, page_rows = 0, all_rows = 0;
  const double by_key = MedianMs([&] {
    if (!store->GetInstance(id).ok()) Die("get", absl::InternalError("read"));
  });
  const double view = MedianMs([&] {
    auto text = InstanceViewJson(*store, *instance, *ids);
    if (!text.ok()) Die("view", text.status());
    view_bytes = text->size();
  });
  // What GET /v1/attempts reads: the instance, its steps, one page and the counts.
  const double first_page = MedianMs([&] {
    if (!store->FindInstance("bench", "many").ok() || !store->GetSteps(id).ok()) {
      Die("page", absl::InternalError("read"));
    }
    auto page = store->ListAttemptPage({id, std::nullopt, std::nullopt, 101});
    if (!page.ok() || !store->CountAttempts(id).ok()) Die("page", page.status());
    page_rows = page->size();
  });
  auto middle = store->ListAttemptPage({id, std::nullopt, std::nullopt, 5000});
  if (!middle.ok()) Die("middle", middle.status());
  const AttemptRecord& cut = middle->back();
  const double deep_page = MedianMs([&] {
    auto page = store->ListAttemptPage(
        {id, std::nullopt, AttemptCursor{cut.started_at, cut.step_index, cut.seq}, 101});
    if (!page.ok()) Die("deep", page.status());
  });
  const double one_step = MedianMs([&] {
    if (!store->ListAttemptPage({id, 3, std::nullopt, 101}).ok())
      Die("step", absl::InternalError(""));
  });
  const double every_row = MedianMs([&] {
    auto all = store->ListAttempts(id);
    if (!all.ok()) Die("all", all.status());
    all_rows = all->size();
  });
  std::printf("  one instance, %d steps x %d attempts, built in %.1f s (%d per commit)\n", kSteps,
              kAttemptsPerStep, build_s, kPerCommit);
  std::printf("  %-52s %9.3f ms   (baseline)\n", "one row by primary key (GetInstance)", by_key);
  std::printf("  %-52s %9.3f ms   %5.0fx  (%zu bytes)\n", "instance view (GET /v1/instances/{key})",
              view, view / by_key, view_bytes);
  std::printf("  %-52s %9.3f ms   %5.0fx\n", "first page of 100 attempts (GET /v1/attempts)",
              first_page, first_page / by_key);
  std::printf("  %-52s %9.3f ms   %5.0fx\n", "a page of 100 after 5,000 (cursor)", deep_page,
              deep_page / by_key);
  std::printf("  %-52s %9.3f ms   %5.0fx\n", "first page of 100 of one step", one_step,
              one_step / by_key);
  std::printf("  %-52s %9.3f ms   %5.0fx  (%zu rows; what the view read before)\n",
              "every attempt of the instance (ListAttempts)", every_row, every_row / by_key,
              all_rows);
  (void)page_rows;
}

// kBatch instances on a fresh store under `bound`, whose step 0 already holds
// `prefill` attempts; each batch commits one change per instance carrying
// `attempts` attempts of that step.
class CommitLoad {
 public:
  static constexpr int kBatch = 64;

  CommitLoad(const std::string& path, int attempts, int prefill, int bound)
      : store_(OpenWith(path, bound)), attempts_(attempts) {
    if (auto s = store_->PutDefinition("defhash", "wf", "wf.yaml", "text", 1); !s.ok())
      Die("def", s);
    for (int i = 0; i < kBatch; ++i) {
      std::string name = "c";  // appended, not "c" + ...: GCC 12 -O3's false -Wrestrict
      name += std::to_string(i);
      auto started = store_->StartInstance(InstanceNamed(name));
      if (!started.ok()) Die("start", started.status());
      auto lease = store_->ClaimInstance(started->instance.id, "bench-host/1/w", 2000, 3'600'000);
      if (!lease.ok()) Die("claim", lease.status());
      leases_.push_back(*lease);
    }
    for (int filled = 0; filled < prefill; filled += kPerCommit) Commit(kPerCommit);
  }

  // Commits one batch; returns its milliseconds.
  double Batch() {
    const auto begin = std::chrono::steady_clock::now();
    Commit(attempts_);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
        .count();
  }

 private:
  void Commit(int per_change) {
    std::vector<Change> changes;
    for (const Lease& lease : leases_) {
      Change c;
      c.lease = lease;
      c.now = ++at_;
      c.lease_expires_at = at_ + 3'600'000;
      for (int i = 0; i < per_change; ++i) c.attempts.push_back(AttemptOf(0, ++at_, lease));
      changes.push_back(std::move(c));
    }
    auto done = store_->Commit(changes);
    if (!done.ok()) Die("commit", done.status());
    for (const absl::Status& s : *done) {
      if (!s.ok()) Die("commit", s);
    }
  }

  std::unique_ptr<Store> store_;
  int attempts_;
  std::vector<Lease> leases_;
  Millis at_ = 10'000;
};

// The three loads take turns batch by batch, so that a busy moment of the machine
// falls on all of them alike; each figure is from the median batch.
void Commits(const std::function<std::string(const char*)>& fresh) {
  constexpr int kRounds = 150;
  CommitLoad none(fresh("c0"), 0, 0, 1000);
  CommitLoad under(fresh("c1"), 1, 0, 1000);
  CommitLoad at_bound(fresh("c2"), 1, 1000, 1000);
  std::vector<double> ms[3];
  for (int round = 0; round < kRounds; ++round) {
    ms[0].push_back(none.Batch());
    ms[1].push_back(under.Batch());
    ms[2].push_back(at_bound.Batch());
  }
  double rate[3];
  for (int i = 0; i < 3; ++i) {
    std::nth_element(ms[i].begin(), ms[i].begin() + kRounds / 2, ms[i].end());
    rate[i] = CommitLoad::kBatch / (ms[i][kRounds / 2] / 1000);
  }
  std::printf(
      "  group commit, batches of 64 changes (one instance each), median of %d, taking turns:\n",
      kRounds);
  std::printf("  %-52s %9.0f changes/s (baseline)\n", "without attempts", rate[0]);
  std::printf("  %-52s %9.0f changes/s %5.2fx\n", "one attempt each, step under the bound", rate[1],
              rate[1] / rate[0]);
  std::printf("  %-52s %9.0f changes/s %5.2fx\n",
              "one attempt each, step at the bound (one deleted)", rate[2], rate[2] / rate[0]);
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  using namespace waystone;
  std::string dir = std::filesystem::temp_directory_path() / "waystone-attempts-bench";
  std::string postgres;
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (std::strcmp(argv[i], "--postgres") == 0) postgres = argv[i + 1];
  }
  std::filesystem::create_directories(dir);
  auto sqlite = [&](const char* name) {
    const std::string path = dir + "/" + name + ".db";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
    return path;
  };
  std::printf("SQLite (synchronous FULL) in %s\n", dir.c_str());
  OpenTheHistory(sqlite("history"));
  Commits(sqlite);
  if (!postgres.empty()) {
    auto database = [&](const char* name) {
      const std::string db = std::string("bench_attempts_") + name;
      if (auto s = RecreatePostgresDatabase(postgres + "/postgres", db); !s.ok()) Die("db", s);
      return postgres + "/" + db;
    };
    std::printf("\nPostgreSQL at %s\n", postgres.c_str());
    OpenTheHistory(database("history"));
    Commits(database);
  }
  return 0;
}
