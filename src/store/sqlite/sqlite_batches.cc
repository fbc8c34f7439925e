// SqliteStore: batches of operator actions and their runners' claims (BatchStore).

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/batch_sql.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {
namespace {

absl::StatusOr<std::optional<BatchRecord>> BatchWhere(SqliteDb& db, const char* column,
                                                      const auto& value) {
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db.Prepare(absl::StrCat("SELECT ", kBatchColumns, " FROM batches WHERE ", column, " = ?")));
  s->BindAll(value);
  WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch, FirstRow(s, ReadBatch<SqliteStatement>));
  if (!batch) return batch;
  WS_ASSIGN_OR_RETURN(SqliteStatement * counts,
                      db.Prepare("SELECT state, COUNT(*) FROM batch_items WHERE batch_id = ? "
                                 "GROUP BY state"));
  counts->BindAll(batch->id);
  WS_ASSIGN_OR_RETURN(auto rows, CollectRows(counts, ReadCountOf<BatchItemState, SqliteStatement>));
  SetBatchCounts(*batch, rows);
  return batch;
}

// Finishes batch `batch_id` when it is running and no item is open.
absl::Status FinishIfDone(SqliteDb& db, int64_t batch_id, Millis now) {
  static const std::string kFinish =
      absl::StrCat("UPDATE batches SET state = ", SqlValue(BatchState::kFinished),
                   ", updated_at = ?1 WHERE id = ?2 AND state = ", SqlValue(BatchState::kRunning),
                   " AND NOT EXISTS (SELECT 1 FROM batch_items WHERE batch_id = ?2 AND state IN ",
                   SqlOpenItemStates(), ")");
  WS_ASSIGN_OR_RETURN(SqliteStatement * finish, db.Prepare(kFinish));
  return finish->BindAll(now, batch_id).Run();
}

}  // namespace

absl::StatusOr<BatchRecord> SqliteStore::CreateBatch(const NewBatch& in) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db, [&]() -> absl::StatusOr<BatchRecord> {
    const BatchRecord& b = in.batch;
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * insert,
        db.Prepare("INSERT INTO batches (public_id, tenant, actor, reason, action, action_json, "
                   "filter_json, state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, "
                   "?, ?)"));
    WS_RETURN_IF_ERROR(insert
                           ->BindAll(b.public_id, b.tenant, b.actor, b.reason, b.action,
                                     b.action_json, b.filter_json,
                                     static_cast<int64_t>(BatchState::kRunning), in.now, in.now)
                           .Run());
    const int64_t id = db.LastInsertRowId();
    static const std::string kItem = absl::StrCat(
        "INSERT INTO batch_items (batch_id, instance_id, instance_key, state, updated_at) VALUES "
        "(?, ?, ?, ",
        SqlValue(BatchItemState::kPending), ", ?)");
    for (const auto& [instance_id, key] : in.items) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * item, db.Prepare(kItem));  // reset for each
      WS_RETURN_IF_ERROR(item->BindAll(id, instance_id, key, in.now).Run());
    }
    WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> created, BatchWhere(db, "id", id));
    return *created;
  });
}

absl::StatusOr<BatchRecord> SqliteStore::GetBatch(int64_t id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch, BatchWhere(*db_, "id", id));
  if (!batch) return absl::NotFoundError("no batch " + std::to_string(id));
  return *batch;
}

absl::StatusOr<BatchRecord> SqliteStore::FindBatch(const std::string& public_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch, BatchWhere(*db_, "public_id", public_id));
  if (!batch) return absl::NotFoundError("no batch '" + public_id + "'");
  return *batch;
}

absl::StatusOr<std::vector<BatchRecord>> SqliteStore::ListBatches(const BatchFilter& filter) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare(absl::StrCat("SELECT id FROM batches WHERE (?1 = '' OR tenant = ?1) AND "
                                "(?2 = 0 OR id < ?2) ORDER BY id DESC LIMIT ?3")));
  s->BindAll(filter.tenant.value_or(""), filter.before_id, filter.limit);
  WS_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                      CollectRows(s, [](const SqliteStatement& r) { return r.Int(0); }));
  std::vector<BatchRecord> batches;
  for (int64_t id : ids) {
    WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch, BatchWhere(*db_, "id", id));
    if (batch) batches.push_back(std::move(*batch));
  }
  return batches;
}

absl::StatusOr<std::vector<BatchItemRecord>> SqliteStore::ListBatchItems(int64_t batch_id,
                                                                         int64_t after_id,
                                                                         int limit) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kBatchItemColumns,
                                                " FROM batch_items WHERE batch_id = ? AND id > ? "
                                                "ORDER BY id LIMIT ?")));
  s->BindAll(batch_id, after_id, limit);
  return CollectRows(s, ReadBatchItem<SqliteStatement>);
}

absl::Status SqliteStore::ChangeBatchState(int64_t id, const std::vector<BatchState>& from,
                                           BatchState to, Millis now) {
  std::string states;
  for (BatchState state : from)
    absl::StrAppend(&states, states.empty() ? "" : ", ", SqlValue(state));
  const std::string change =
      absl::StrCat("UPDATE batches SET state = ", SqlValue(to),
                   ", updated_at = ? WHERE id = ? AND state IN (", states, ")");
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * update, db.Prepare(change));
    WS_RETURN_IF_ERROR(update->BindAll(now, id).Run());
    if (db.Changes() != 1) {
      WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch, BatchWhere(db, "id", id));
      if (!batch) return absl::NotFoundError("no batch " + std::to_string(id));
      return absl::FailedPreconditionError("the batch is " + std::string(ToString(batch->state)));
    }
    if (to == BatchState::kCancelled) {
      static const std::string kCancel =
          absl::StrCat("UPDATE batch_items SET state = ", SqlValue(BatchItemState::kCancelled),
                       ", finished_at = ?1, updated_at = ?1 WHERE batch_id = ?2 AND state = ",
                       SqlValue(BatchItemState::kPending));
      WS_ASSIGN_OR_RETURN(SqliteStatement * cancel, db.Prepare(kCancel));
      WS_RETURN_IF_ERROR(cancel->BindAll(now, id).Run());
    }
    if (to == BatchState::kRunning) return FinishIfDone(db, id, now);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<BatchItemRecord>> SqliteStore::ClaimBatchItems(const std::string& owner,
                                                                          Millis now,
                                                                          Millis claim_duration,
                                                                          int limit) {
  static const std::string kPick = absl::StrCat(
      "SELECT i.id FROM batch_items i JOIN batches b ON b.id = i.batch_id WHERE (i.state = ",
      SqlValue(BatchItemState::kPending), " AND b.state = ", SqlValue(BatchState::kRunning),
      ") OR (i.state = ", SqlValue(BatchItemState::kApplying),
      " AND i.claim_expires_at <= ?1) ORDER BY i.batch_id, i.id LIMIT ?2");
  static const std::string kClaim = absl::StrCat(
      "UPDATE batch_items SET state = ", SqlValue(BatchItemState::kApplying),
      ", owner = ?1, claim_expires_at = ?2, tries = tries + 1, updated_at = ?3 WHERE id = ?4");
  static const std::string kRead =
      absl::StrCat("SELECT ", kBatchItemColumns, " FROM batch_items WHERE id = ?");
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db, [&]() -> absl::StatusOr<std::vector<BatchItemRecord>> {
    WS_ASSIGN_OR_RETURN(SqliteStatement * pick, db.Prepare(kPick));
    pick->BindAll(now, limit);
    WS_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                        CollectRows(pick, [](const SqliteStatement& r) { return r.Int(0); }));
    std::vector<BatchItemRecord> items;
    for (int64_t id : ids) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * claim, db.Prepare(kClaim));
      WS_RETURN_IF_ERROR(claim->BindAll(owner, now + claim_duration, now, id).Run());
      WS_ASSIGN_OR_RETURN(SqliteStatement * read, db.Prepare(kRead));
      read->BindAll(id);
      WS_ASSIGN_OR_RETURN(std::optional<BatchItemRecord> item,
                          FirstRow(read, ReadBatchItem<SqliteStatement>));
      if (item) items.push_back(std::move(*item));
    }
    return items;
  });
}

absl::StatusOr<std::vector<BatchItemRecord>> SqliteStore::AppliedBatchItems(int limit) {
  static const std::string kApplied =
      absl::StrCat("SELECT ", kBatchItemColumns,
                   " FROM batch_items WHERE state = ", SqlValue(BatchItemState::kApplied),
                   " ORDER BY applied_at, id LIMIT ?");
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(kApplied));
  s->BindAll(limit);
  return CollectRows(s, ReadBatchItem<SqliteStatement>);
}

absl::Status SqliteStore::UpdateBatchItem(const BatchItemUpdate& u) {
  static const std::string kUpdate = absl::StrCat(
      "UPDATE batch_items SET state = ?1, result_state = ?2, message = ?3, owner = '', "
      "claim_expires_at = 0, applied_at = CASE WHEN ?1 = ",
      SqlValue(BatchItemState::kApplied),
      " THEN ?4 ELSE applied_at END, finished_at = ?5, updated_at = ?4 WHERE id = ?6 AND state "
      "= ?7 AND (?7 <> ",
      SqlValue(BatchItemState::kApplying), " OR owner = ?8)");
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * update, db.Prepare(kUpdate));
    WS_RETURN_IF_ERROR(update
                           ->BindAll(static_cast<int64_t>(u.to), u.result_state, u.message, u.now,
                                     IsFinalItemState(u.to) ? u.now : Millis{0}, u.item_id,
                                     static_cast<int64_t>(u.from), u.owner)
                           .Run());
    if (db.Changes() != 1) {
      return absl::FailedPreconditionError("the batch item moved on (another runner took it)");
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * batch,
                        db.Prepare("SELECT batch_id FROM batch_items WHERE id = ?"));
    batch->BindAll(u.item_id);
    WS_ASSIGN_OR_RETURN(std::optional<int64_t> batch_id,
                        FirstRow(batch, [](const SqliteStatement& r) { return r.Int(0); }));
    return FinishIfDone(db, batch_id.value_or(0), u.now);
  });
}

}  // namespace waystone
