// PostgresStore: batches of operator actions and their runners' claims (BatchStore).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/batch_sql.h"
#include "store/postgres/pg_rows.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

// `where` compares one column with $1 (fixed text, never input).
absl::StatusOr<std::optional<BatchRecord>> BatchWhere(PgConnection& c, const char* where,
                                                      const PgParams& params) {
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c.Query(absl::StrCat("SELECT ", kBatchColumns, " FROM batches WHERE ", where), params));
  std::optional<BatchRecord> batch = PgFirstRow(r, ReadBatch<PgRow>);
  if (!batch) return batch;
  WS_ASSIGN_OR_RETURN(PgResult counts,
                      c.Query("SELECT state, COUNT(*) FROM batch_items WHERE batch_id = "
                              "$1::bigint GROUP BY state",
                              Params(batch->id)));
  SetBatchCounts(*batch, PgRows(counts, ReadCountOf<BatchItemState, PgRow>));
  return batch;
}

// Finishes batch `batch_id` when it is running and no item is open.
absl::Status FinishIfDone(PgConnection& c, int64_t batch_id, Millis now) {
  static const std::string kFinish = absl::StrCat(
      "UPDATE batches SET state = ", SqlValue(BatchState::kFinished),
      ", updated_at = $1::bigint WHERE id = $2::bigint AND state = ",
      SqlValue(BatchState::kRunning),
      " AND NOT EXISTS (SELECT 1 FROM batch_items WHERE batch_id = $2::bigint AND state IN ",
      SqlOpenItemStates(), ")");
  return c.Query(kFinish, Params(now, batch_id)).status();
}

}  // namespace

absl::StatusOr<BatchRecord> PostgresStore::CreateBatch(const NewBatch& in) {
  std::optional<BatchRecord> created;
  WS_RETURN_IF_ERROR(InTransaction([&](PgConnection& c) -> absl::Status {
    const BatchRecord& b = in.batch;
    static const std::string kInsert = absl::StrCat(
        "INSERT INTO batches (public_id, tenant, actor, reason, action, action_json, "
        "filter_json, state, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, ",
        SqlValue(BatchState::kRunning), ", $8::bigint, $8::bigint) RETURNING id");
    WS_ASSIGN_OR_RETURN(PgResult r,
                        c.Query(kInsert, Params(b.public_id, b.tenant, b.actor, b.reason, b.action,
                                                b.action_json, b.filter_json, in.now)));
    const int64_t id = r.Int(0, 0);
    // One statement for every item: arrays of ids and keys, unnested in order.
    static const std::string kItems = absl::StrCat(
        "INSERT INTO batch_items (batch_id, instance_id, instance_key, state, updated_at) "
        "SELECT $1::bigint, u.instance_id, u.instance_key, ",
        SqlValue(BatchItemState::kPending),
        ", $2::bigint FROM unnest($3::bigint[], $4::text[]) AS u (instance_id, instance_key)");
    std::vector<std::string> ids, keys;
    for (const auto& [instance_id, key] : in.items) {
      ids.push_back(std::to_string(instance_id));
      keys.push_back(key);
    }
    WS_RETURN_IF_ERROR(
        c.Query(kItems, Params(id, in.now, absl::StrCat("{", absl::StrJoin(ids, ","), "}"),
                               absl::StrCat("{", QuoteEach(keys), "}")))
            .status());
    WS_ASSIGN_OR_RETURN(created, BatchWhere(c, "id = $1::bigint", Params(id)));
    return absl::OkStatus();
  }));
  return *created;
}

absl::StatusOr<BatchRecord> PostgresStore::GetBatch(int64_t id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch,
                      BatchWhere(*c, "id = $1::bigint", Params(id)));
  if (!batch) return absl::NotFoundError("no batch " + std::to_string(id));
  return *batch;
}

absl::StatusOr<BatchRecord> PostgresStore::FindBatch(const std::string& public_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch,
                      BatchWhere(*c, "public_id = $1", Params(public_id)));
  if (!batch) return absl::NotFoundError("no batch '" + public_id + "'");
  return *batch;
}

absl::StatusOr<std::vector<BatchRecord>> PostgresStore::ListBatches(const BatchFilter& filter) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("SELECT id FROM batches WHERE ($1 = '' OR tenant = $1) AND ($2::bigint = 0 OR id "
               "< $2::bigint) ORDER BY id DESC LIMIT $3::integer",
               Params(filter.tenant.value_or(""), filter.before_id, filter.limit)));
  std::vector<BatchRecord> batches;
  for (int64_t id : PgRows(r, [](const PgRow& row) { return row.Int(0); })) {
    WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch,
                        BatchWhere(*c, "id = $1::bigint", Params(id)));
    if (batch) batches.push_back(std::move(*batch));
  }
  return batches;
}

absl::StatusOr<std::vector<BatchItemRecord>> PostgresStore::ListBatchItems(int64_t batch_id,
                                                                           int64_t after_id,
                                                                           int limit) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query(absl::StrCat("SELECT ", kBatchItemColumns,
                                            " FROM batch_items WHERE batch_id = $1::bigint AND "
                                            "id > $2::bigint ORDER BY id LIMIT $3::integer"),
                               Params(batch_id, after_id, limit)));
  return PgRows(r, ReadBatchItem<PgRow>);
}

absl::Status PostgresStore::ChangeBatchState(int64_t id, const std::vector<BatchState>& from,
                                             BatchState to, Millis now) {
  std::string states;
  for (BatchState state : from)
    absl::StrAppend(&states, states.empty() ? "" : ", ", SqlValue(state));
  const std::string change =
      absl::StrCat("UPDATE batches SET state = ", SqlValue(to),
                   ", updated_at = $1::bigint WHERE id = $2::bigint AND state IN (", states, ")");
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(PgResult updated, c.Query(change, Params(now, id)));
    if (updated.affected() != 1) {
      WS_ASSIGN_OR_RETURN(std::optional<BatchRecord> batch,
                          BatchWhere(c, "id = $1::bigint", Params(id)));
      if (!batch) return absl::NotFoundError("no batch " + std::to_string(id));
      return absl::FailedPreconditionError("the batch is " + std::string(ToString(batch->state)));
    }
    if (to == BatchState::kCancelled) {
      static const std::string kCancel = absl::StrCat(
          "UPDATE batch_items SET state = ", SqlValue(BatchItemState::kCancelled),
          ", finished_at = $1::bigint, updated_at = $1::bigint WHERE batch_id = $2::bigint AND "
          "state = ",
          SqlValue(BatchItemState::kPending));
      WS_RETURN_IF_ERROR(c.Query(kCancel, Params(now, id)).status());
    }
    if (to == BatchState::kRunning) return FinishIfDone(c, id, now);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<BatchItemRecord>> PostgresStore::ClaimBatchItems(
    const std::string& owner, Millis now, Millis claim_duration, int limit) {
  // SKIP LOCKED: two runners claiming at once take different items.
  static const std::string kClaim = absl::StrCat(
      "WITH picked AS (SELECT i.id AS picked_id FROM batch_items i JOIN batches b ON b.id = "
      "i.batch_id WHERE (i.state = ",
      SqlValue(BatchItemState::kPending), " AND b.state = ", SqlValue(BatchState::kRunning),
      ") OR (i.state = ", SqlValue(BatchItemState::kApplying),
      " AND i.claim_expires_at <= $2::bigint) ORDER BY i.batch_id, i.id LIMIT $4::integer FOR "
      "UPDATE OF i SKIP LOCKED) UPDATE batch_items SET state = ",
      SqlValue(BatchItemState::kApplying),
      ", owner = $1, claim_expires_at = $2::bigint + $3::bigint, tries = tries + 1, updated_at "
      "= $2::bigint FROM picked WHERE id = picked.picked_id RETURNING ",
      kBatchItemColumns);
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kClaim, Params(owner, now, claim_duration, limit)));
  std::vector<BatchItemRecord> items = PgRows(r, ReadBatchItem<PgRow>);
  std::sort(items.begin(), items.end(),
            [](const BatchItemRecord& a, const BatchItemRecord& b) { return a.id < b.id; });
  return items;
}

absl::StatusOr<std::vector<BatchItemRecord>> PostgresStore::AppliedBatchItems(int limit) {
  static const std::string kApplied =
      absl::StrCat("SELECT ", kBatchItemColumns,
                   " FROM batch_items WHERE state = ", SqlValue(BatchItemState::kApplied),
                   " ORDER BY applied_at, id LIMIT $1::integer");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kApplied, Params(limit)));
  return PgRows(r, ReadBatchItem<PgRow>);
}

absl::Status PostgresStore::UpdateBatchItem(const BatchItemUpdate& u) {
  static const std::string kUpdate = absl::StrCat(
      "UPDATE batch_items SET state = $1::integer, result_state = $2, message = $3, owner = '', "
      "claim_expires_at = 0, applied_at = CASE WHEN $1::integer = ",
      SqlValue(BatchItemState::kApplied),
      " THEN $4::bigint ELSE applied_at END, finished_at = $5::bigint, updated_at = $4::bigint "
      "WHERE id = $6::bigint AND state = $7::integer AND ($7::integer <> ",
      SqlValue(BatchItemState::kApplying), " OR owner = $8) RETURNING batch_id");
  // The batch's row first: two runners closing its last two items at once would
  // each, under READ COMMITTED, still see the other's item open, and neither would
  // finish the batch. Locked, the second sees the first's commit.
  static const std::string kLockBatch =
      "SELECT id FROM batches WHERE id = (SELECT batch_id FROM batch_items WHERE id = "
      "$1::bigint) FOR UPDATE";
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_RETURN_IF_ERROR(c.Query(kLockBatch, Params(u.item_id)).status());
    WS_ASSIGN_OR_RETURN(PgResult r,
                        c.Query(kUpdate, Params(static_cast<int>(u.to), u.result_state, u.message,
                                                u.now, IsFinalItemState(u.to) ? u.now : Millis{0},
                                                u.item_id, static_cast<int>(u.from), u.owner)));
    if (r.rows() != 1) {
      return absl::FailedPreconditionError("the batch item moved on (another runner took it)");
    }
    return FinishIfDone(c, r.Int(0, 0), u.now);
  });
}

}  // namespace waystone
