#pragma once

// Store-internal: what both dialects share of running a sql step's statement
// (BusinessStatement) inside a change's transaction: which failures are the
// statement's own (the step fails; the rest of the batch commits) and how its
// rows become the step's result.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace waystone {

// Most rows and bytes a statement's result may hold: it is a checkpoint, kept with
// the step and read by templates, not a query's answer.
inline constexpr int kMaxStatementRows = 100;
inline constexpr size_t kMaxStatementResultBytes = 64 * 1024;

// A failure of the statement itself (a constraint, a missing table, bad SQL or
// data, a refusal): it undoes only its own change, and the runner fails the step
// with `message`. The dialect decides which errors are the statement's.
absl::Status StatementFailure(const std::string& message);

// Trouble of the database while the statement ran (busy, I/O, memory, a lost
// connection, a lock wait): Unavailable, so the whole batch fails and is retried;
// never taken for a lost lease.
absl::Status StatementTrouble(const absl::Status& cause);

// Returns true for a status StatementFailure made (StatementRows makes them too).
bool IsStatementFailure(const absl::Status& status);

// The rows of a statement, gathered into {"rows": [{column: value}], "count": n}.
// Not thread-safe.
class StatementRows {
 public:
  // kDecimal: an exact number (PostgreSQL numeric), a JSON number when a double holds
  // it exactly enough (15 significant digits or fewer), else its text.
  enum class Type { kNull, kInteger, kReal, kDecimal, kText, kBoolean, kJson };
  // Starts a row; Err when the result would hold more than kMaxStatementRows.
  absl::Status StartRow();
  // Adds a column of the row begun last. `text` is the value as the database gave it.
  void Add(std::string_view column, Type type, std::string_view text);
  // The result with `count` rows inserted, updated, deleted or returned; a statement
  // failure when it grew past kMaxStatementResultBytes.
  absl::Status Finish(int64_t count, std::string* json);

 private:
  void CloseRow();
  std::string rows_;  // serialized rows, comma-separated
  std::string row_;   // the row begun last, serialized without its closing brace
  int count_ = 0;
};

}  // namespace waystone
