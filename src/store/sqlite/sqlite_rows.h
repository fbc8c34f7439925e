#pragma once

// Store-internal (sqlite/): what several files of SqliteStore share — reading rows,
// write transactions, and the inserts more than one operation makes. Every function
// runs on a connection the caller holds under SqliteStore's mutex.

#include <optional>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "model/records.h"
#include "store/columns.h"
#include "store/sqlite/sqlite_db.h"

namespace waystone {

// Steps `statement` to the end, reading each row with `read`, then resets it.
template <typename Read>
auto CollectRows(SqliteStatement* statement, Read read)
    -> absl::StatusOr<std::vector<decltype(read(*statement))>> {
  std::vector<decltype(read(*statement))> rows;
  while (true) {
    auto row = statement->Step();
    if (!row.ok()) {
      statement->Reset();
      return row.status();
    }
    if (!*row) break;
    rows.push_back(read(*statement));
  }
  statement->Reset();
  return rows;
}

// Steps `statement` once and reads the row with `read` when there is one.
template <typename Read>
auto FirstRow(SqliteStatement* statement, Read read)
    -> absl::StatusOr<std::optional<decltype(read(*statement))>> {
  auto row = statement->Step();
  std::optional<decltype(read(*statement))> value;
  if (row.ok() && *row) value = read(*statement);
  statement->Reset();
  if (!row.ok()) return row.status();
  return value;
}

// Runs `body` inside BEGIN IMMEDIATE ... COMMIT; rolls back on any error.
template <typename Body>
absl::Status InWriteTransaction(SqliteDb& db, Body&& body) {
  WS_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = db.Exec("COMMIT");
  if (!status.ok()) (void)db.Exec("ROLLBACK");
  return status;
}

// Runs `body`, which returns an absl::StatusOr, inside a write transaction as
// InWriteTransaction does, and returns its value once committed.
template <typename Body>
auto InWriteTransactionFor(SqliteDb& db, Body&& body) -> decltype(body()) {
  std::optional<typename decltype(body())::value_type> value;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    auto result = body();
    if (!result.ok()) return result.status();
    value = std::move(*result);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return std::move(*value);
}

// Reads the instance with `id`; nullopt when there is none.
absl::StatusOr<std::optional<InstanceRecord>> SqliteInstanceById(SqliteDb& db, int64_t id);
absl::StatusOr<std::optional<InstanceRecord>> SqliteInstanceByKey(SqliteDb& db,
                                                                  const std::string& tenant,
                                                                  const std::string& key);
absl::StatusOr<std::optional<TombstoneRecord>> SqliteTombstoneOfInstance(SqliteDb& db,
                                                                         int64_t instance_id);
absl::StatusOr<std::optional<TombstoneRecord>> SqliteTombstoneOfKey(SqliteDb& db,
                                                                    const std::string& tenant,
                                                                    const std::string& key);
absl::StatusOr<std::optional<InboxEntry>> SqliteInboxEntry(SqliteDb& db, const std::string& tenant,
                                                           const std::string& source,
                                                           const std::string& id);

absl::Status SqliteInsertEvent(SqliteDb& db, const EventRecord& event, int64_t instance_id,
                               Millis now);
// Inserts an open alert and returns its id.
absl::StatusOr<int64_t> SqliteInsertAlert(SqliteDb& db, const AlertRecord& alert,
                                          int64_t instance_id, Millis now);
absl::Status SqliteInsertAudit(SqliteDb& db, const AuditRecord& audit, int64_t instance_id,
                               Millis at);
absl::Status SqliteAddToCounter(SqliteDb& db, const std::string& name, int64_t delta);

// Inside the write transaction open on `db`: starts `starts` (StartInstancesWith)
// or applies `changes` (CommitChanges).
absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> SqliteStartInstances(
    SqliteDb& db, const std::vector<NewInstance>& starts);
absl::StatusOr<std::vector<absl::Status>> SqliteApplyChanges(SqliteDb& db,
                                                             const std::vector<Change>& changes,
                                                             int attempts_per_step);

}  // namespace waystone

namespace waystone {

// The distinct owners of unexpired leases on the `rows` of `table` (instances or
// deliveries, and the conditions naming their leased rows, one query each, see
// SqlLeasedInstanceRows: fixed text, never input), and the end of one owner's
// leases there.
absl::StatusOr<std::vector<std::string>> SqliteLeaseOwners(SqliteDb& db, const char* table,
                                                           const std::vector<std::string>& rows,
                                                           Millis now);
absl::Status SqliteExpireLeases(SqliteDb& db, const char* table, const std::string& owner);

}  // namespace waystone
