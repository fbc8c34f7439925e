#pragma once

// Store-internal (postgres/): what several files of PostgresStore share — the
// connection on loan, transactions, reading rows, and the statements more than one
// operation makes.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/records.h"
#include "store/columns.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/pg_store.h"

namespace waystone {

// A connection on loan from the pool; back to it when destroyed (dropped if broken).
class PostgresStore::Lent {
 public:
  Lent(PostgresStore* store, std::unique_ptr<PgConnection> c) : store_(store), c_(std::move(c)) {}
  Lent(Lent&&) = default;
  ~Lent() {
    if (c_) store_->Release(std::move(c_));
  }
  PgConnection& operator*() { return *c_; }
  PgConnection* operator->() { return c_.get(); }

 private:
  PostgresStore* store_;
  std::unique_ptr<PgConnection> c_;
};

template <typename Body>
absl::Status PostgresStore::InTransaction(Body&& body) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_RETURN_IF_ERROR(c->Exec("BEGIN"));
  absl::Status status = body(*c);
  if (status.ok()) status = c->Commit();
  // A connection whose ROLLBACK failed may still be in a transaction: never lent again.
  if (!status.ok() && !c->Exec("ROLLBACK").ok()) c->MarkBroken();
  return status;
}

// One row of a result, as the readers in store/columns.h take it.
class PgRow {
 public:
  PgRow(const PgResult& result, int row) : result_(result), row_(row) {}
  int64_t Int(int column) const { return result_.Int(row_, column); }
  std::string Text(int column) const { return result_.Text(row_, column); }
  bool IsNull(int column) const { return result_.IsNull(row_, column); }

 private:
  const PgResult& result_;
  int row_;
};

// Reads every row of `result` with `read`.
template <typename Read>
auto PgRows(const PgResult& result, Read read) -> std::vector<decltype(read(PgRow(result, 0)))> {
  std::vector<decltype(read(PgRow(result, 0)))> rows;
  rows.reserve(static_cast<size_t>(result.rows()));
  for (int i = 0; i < result.rows(); ++i) rows.push_back(read(PgRow(result, i)));
  return rows;
}

// Reads the first row of `result` with `read`, if there is one.
template <typename Read>
auto PgFirstRow(const PgResult& result, Read read)
    -> std::optional<decltype(read(PgRow(result, 0)))> {
  if (result.rows() == 0) return std::nullopt;
  return read(PgRow(result, 0));
}

// Statements for one pipelined transaction (PostgresStore::CommitAsAssumed), each
// with the rows its result must show where that matters (nullopt: any count).
struct PgAssumedBatch {
  std::vector<PgStatement> statements;
  std::vector<std::optional<int64_t>> rows;

  void Add(PgStatement statement, std::optional<int64_t> assumed = std::nullopt) {
    statements.push_back(std::move(statement));
    rows.push_back(assumed);
  }
};

// `values` as a PostgreSQL array literal ("{1,2,3}"), a parameter of type bigint[].
inline std::string PgArrayOf(const std::vector<int64_t>& values) {
  return absl::StrCat("{", absl::StrJoin(values, ","), "}");
}

absl::StatusOr<std::optional<InstanceRecord>> PgInstanceById(PgConnection& c, int64_t id);
absl::StatusOr<std::optional<InstanceRecord>> PgInstanceByKey(PgConnection& c,
                                                              const std::string& tenant,
                                                              const std::string& key);
absl::StatusOr<std::optional<TombstoneRecord>> PgTombstoneOfInstance(PgConnection& c,
                                                                     int64_t instance_id);
PgStatement PgTombstoneOfKeyStatement(const std::string& tenant, const std::string& key);
absl::StatusOr<std::optional<TombstoneRecord>> PgTombstoneOfKey(PgConnection& c,
                                                                const std::string& tenant,
                                                                const std::string& key);
absl::StatusOr<std::optional<InboxEntry>> PgInboxEntry(PgConnection& c, const std::string& tenant,
                                                       const std::string& source,
                                                       const std::string& id);

// The statements several operations make, each also as a PgStatement for a pipeline.
PgStatement PgInsertEventStatement(const EventRecord& event, int64_t instance_id, Millis now);
PgStatement PgInsertAlertStatement(const AlertRecord& alert, int64_t instance_id, Millis now);
PgStatement PgInsertAuditStatement(const AuditRecord& audit, int64_t instance_id, Millis at);
PgStatement PgSignalWorkStatement();
absl::Status PgInsertEvent(PgConnection& c, const EventRecord& event, int64_t instance_id,
                           Millis now);
// Inserts an open alert and returns its id.
absl::StatusOr<int64_t> PgInsertAlert(PgConnection& c, const AlertRecord& alert,
                                      int64_t instance_id, Millis now);
absl::Status PgInsertAudit(PgConnection& c, const AuditRecord& audit, int64_t instance_id,
                           Millis at);
absl::Status PgAddToCounter(PgConnection& c, const std::string& name, int64_t delta);
// Wakes workers waiting in WaitForWork once the transaction commits.
absl::Status PgSignalWork(PgConnection& c);

// The distinct owners of unexpired leases on the `rows` of `table` (instances or
// deliveries, and the conditions naming their leased rows, one query each, see
// SqlLeasedInstanceRows: fixed text, never input), and the end of one owner's
// leases there.
absl::StatusOr<std::vector<std::string>> PgLeaseOwners(PgConnection& c, const char* table,
                                                       const std::vector<std::string>& rows,
                                                       Millis now);
absl::Status PgExpireLeases(PgConnection& c, const char* table, const std::string& owner);

}  // namespace waystone
