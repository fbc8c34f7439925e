#pragma once

// Store-internal: one batch in one transaction, each item under its own savepoint,
// written once for the group commit of changes (group_commit) and of starts
// (start_decision). A dialect supplies the three statements.

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"

namespace waystone {

// The savepoint statements inside an open transaction. Not thread-safe.
class SavepointSql {
 public:
  virtual ~SavepointSql() = default;
  virtual absl::Status Savepoint() = 0;
  virtual absl::Status RollbackToSavepoint() = 0;
  virtual absl::Status ReleaseSavepoint() = 0;
};

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

// Applies `apply` to each item under its own savepoint and returns one result per
// item. A failed item is rolled back to its savepoint; when `undoes_only_itself`
// accepts its status that status is its result, otherwise the whole batch fails
// with it (the caller's transaction is rolled back: nothing is written).
// An item for which `needs_savepoint` is false runs without one (two statements
// fewer): it must be one that, when it fails alone, fails before writing anything.
template <typename Result, typename Item, typename Apply, typename OnlyItself,
          typename NeedsSavepoint>
absl::StatusOr<std::vector<Result>> EachUnderSavepoint(SavepointSql& sql,
                                                       const std::vector<Item>& items,
                                                       Apply&& apply,
                                                       OnlyItself&& undoes_only_itself,
                                                       NeedsSavepoint&& needs_savepoint) {
  std::vector<Result> results;
  results.reserve(items.size());
  for (const Item& item : items) {
    const bool savepoint = needs_savepoint(item);
    if (savepoint) WS_RETURN_IF_ERROR(sql.Savepoint());
    Result result = apply(item);
    if (const absl::Status& status = StatusOf(result); !status.ok()) {
      if (savepoint) WS_RETURN_IF_ERROR(sql.RollbackToSavepoint());
      if (!undoes_only_itself(status, item)) return status;
    }
    if (savepoint) WS_RETURN_IF_ERROR(sql.ReleaseSavepoint());
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace waystone
