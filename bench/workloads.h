#pragma once

// What the engine benchmarks share: the workflow they run and the SQLite baseline
// they are compared with.

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "store/sqlite/raw_commit_probe.h"

namespace waystone::bench {

// Five steps that do no external I/O: the cost measured is the engine's own (claim,
// render, checkpoint, group commit). Each step is its own durable checkpoint. The
// input's `n` names the instance.
inline constexpr char kFiveTransforms[] = R"(workflow: bench-transforms
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

// Single-row commits per second of a fresh SQLite file in `dir` (WAL, `synchronous`),
// measured for 3 s; the file is removed afterwards.
inline absl::StatusOr<double> SqliteRawCommitRate(const std::string& dir,
                                                  const std::string& synchronous) {
  const std::string probe = dir + "/bench-raw.db";
  std::filesystem::remove(probe);
  auto raw = MeasureSqliteRawCommitRate(probe, synchronous, 3000);
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(probe + suffix);
  return raw;
}

}  // namespace waystone::bench
