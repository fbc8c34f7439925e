#pragma once

// The work of a code workflow's transaction step, which the store runs inside a
// change's transaction (Change::work).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/records.h"

namespace waystone {

// Runs one statement inside a change's transaction, for BusinessWork. Not
// thread-safe: the thread applying the change uses it while the work runs.
class StatementRunner {
 public:
  // Runs `statement` (its `records_result` and `step_index` are not read) and returns
  // its rows ({"rows": [...], "count": n}). A statement the database refuses is a
  // StatementFailure (store/business_statement.h) and fails the work; once one
  // failed, every later statement fails the same way without running.
  virtual absl::StatusOr<std::string> Run(const BusinessStatement& statement) = 0;

 protected:
  ~StatementRunner() = default;
};

// What a code workflow's transaction step does in its change's transaction.
struct BusinessWorkResult {
  std::string result_json;          // the step's result: its response_json
  std::vector<EventRecord> events;  // outbox events it adds, committed with it
};

// The work of a code workflow's transaction step (Change::work): the embedding
// program's own statements, run by the store on the change's connection, inside its
// transaction, after the fence. The business rows, the step's checkpoint and the
// events commit together or not at all. Run may be called more than once for one
// change (a batch that fails as a whole is applied again), each time in a
// transaction that is then rolled back but the last: it must do nothing outside
// the database. An error it returns fails only its own change (the step fails with
// its message); the database's own trouble fails the batch, which is retried.
// Implementations are immutable; Run is called by one thread at a time.
class BusinessWork {
 public:
  virtual ~BusinessWork() = default;
  virtual int step_index() const = 0;
  virtual absl::StatusOr<BusinessWorkResult> Run(StatementRunner& sql) const = 0;
};

}  // namespace waystone
