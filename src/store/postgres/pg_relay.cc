// PostgresStore: outbox cursors and deliveries under leases (RelayStore).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/postgres/pg_rows.h"
#include "store/relay_rules.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

// A claimed delivery's end, where its lease still holds: one row.
PgStatement FinishClaimedStatement(const DeliveryClaim& claim, const DeliveryUpdate& u) {
  static const std::string kFinish = absl::StrCat(
      "UPDATE deliveries SET state = $1::smallint, attempts = $2::integer, next_attempt_at = "
      "$3::bigint, last_error = $4, delivered_at = CASE WHEN $1::smallint = ",
      SqlValue(DeliveryState::kDelivered),
      " THEN $5::bigint ELSE delivered_at END, lease_owner = '', lease_expires_at = 0 WHERE id "
      "= $6::bigint AND lease_epoch = $7::bigint AND lease_owner = $8");
  return {&kFinish, Params(static_cast<int64_t>(u.state), u.attempts, u.next_attempt_at, u.error,
                           u.now, claim.id, claim.epoch, claim.owner)};
}

// An outbox row delivered to every sink it is for.
PgStatement MarkEventDeliveredStatement(int64_t seq, Millis now) {
  static const std::string kMark = absl::StrCat(
      "UPDATE outbox SET delivered_at = $1::bigint WHERE seq = $2::bigint AND NOT EXISTS "
      "(SELECT 1 FROM deliveries WHERE outbox_seq = $2::bigint AND state <> ",
      SqlValue(DeliveryState::kDelivered), ")");
  return {&kMark, Params(now, seq)};
}

// The SQL of a delivery's end; the rules are FinishDeliveryWith's.
class PgDeliverySql final : public DeliverySql {
 public:
  explicit PgDeliverySql(PgConnection& c) : c_(c) {}

  absl::StatusOr<std::vector<EventRecord>> ReadEvents(const std::vector<int64_t>& seqs) override {
    // Planned each time: a plan kept from when the outbox held a hundred rows reads
    // all of it (PgStatement::planned_each_time).
    static const std::string kEvents =
        absl::StrCat("SELECT ", kEventColumns, " FROM outbox WHERE seq = ANY($1::bigint[])");
    WS_ASSIGN_OR_RETURN(PgResult events, c_.Query({&kEvents, Params(PgArrayOf(seqs)), true}));
    return PgRows(events, waystone::ReadEvent<PgRow>);
  }
  absl::StatusOr<bool> FinishClaimed(const DeliveryClaim& claim, const DeliveryUpdate& u) override {
    WS_ASSIGN_OR_RETURN(PgResult finish, c_.Query(FinishClaimedStatement(claim, u)));
    return finish.affected() == 1;
  }
  absl::Status MarkEventDelivered(int64_t seq, Millis now) override {
    return c_.Query(MarkEventDeliveredStatement(seq, now)).status();
  }
  absl::Status InsertAlert(const AlertRecord& alert, Millis now) override {
    return PgInsertAlert(c_, alert, alert.instance_id, now).status();
  }
  absl::Status InsertEvent(const EventRecord& event, Millis now) override {
    return PgInsertEvent(c_, event, event.instance_id, now);
  }
  absl::Status DisableSink(const std::string& sink, const std::string& reason,
                           Millis now) override {
    return c_
        .Query(
            "INSERT INTO relay_sinks VALUES ($1, 1, $2, $3::bigint) ON CONFLICT (sink) "
            "DO UPDATE SET disabled = 1, reason = excluded.reason, updated_at = "
            "excluded.updated_at",
            Params(sink, reason, now))
        .status();
  }

 private:
  PgConnection& c_;
};

// Queues a round's ends for one pipeline instead of running them, each answering
// as if its lease held and noting that its row must be found (PgQueuedChangeSql
// does the same for checkpoints). A round with an alert, an alert's event or a
// sink to disable is not queued: rare, and those write elsewhere.
class PgQueuedDeliverySql final : public DeliverySql {
 public:
  PgQueuedDeliverySql() {
    static const std::string kBegin = "BEGIN";
    batch_.Add({&kBegin, {}});
  }
  absl::StatusOr<std::vector<EventRecord>> ReadEvents(const std::vector<int64_t>&) override {
    return absl::UnimplementedError("reading events is not pipelined");
  }
  absl::StatusOr<bool> FinishClaimed(const DeliveryClaim& claim, const DeliveryUpdate& u) override {
    batch_.Add(FinishClaimedStatement(claim, u), 1);
    return true;
  }
  absl::Status MarkEventDelivered(int64_t seq, Millis now) override {
    batch_.Add(MarkEventDeliveredStatement(seq, now));
    return absl::OkStatus();
  }
  absl::Status InsertAlert(const AlertRecord&, Millis) override {
    return absl::UnimplementedError("an alert is not pipelined");
  }
  absl::Status InsertEvent(const EventRecord&, Millis) override {
    return absl::UnimplementedError("an event is not pipelined");
  }
  absl::Status DisableSink(const std::string&, const std::string&, Millis) override {
    return absl::UnimplementedError("disabling a sink is not pipelined");
  }

  const PgAssumedBatch& batch() const { return batch_; }

 private:
  PgAssumedBatch batch_;
};

}  // namespace

absl::StatusOr<int64_t> PostgresStore::OutboxCursor(const std::string& sink) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT last_seq FROM relay_cursors WHERE sink = $1", Params(sink)));
  return r.rows() == 0 ? 0 : r.Int(0, 0);
}

absl::StatusOr<std::vector<EventRecord>> PostgresStore::ReadOutbox(int64_t after_seq, int limit) {
  // Rows are taken in (txid, seq) order and only from transactions older than every
  // one still running: a transaction that commits later can only add rows after them.
  static const std::string kRead = absl::StrCat(
      "SELECT ", kEventColumns,
      " FROM outbox WHERE (txid, seq) > (COALESCE((SELECT txid FROM outbox WHERE seq = "
      "$1::bigint), (SELECT MAX(last_txid) FROM relay_cursors WHERE last_seq = $1::bigint), "
      "'0'::xid8), $1::bigint) AND txid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY txid, "
      "seq LIMIT $2::integer");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kRead, Params(after_seq, limit)));
  return PgRows(r, ReadEvent<PgRow>);
}

absl::Status PostgresStore::AddDeliveries(const std::string& sink, int64_t expected_cursor,
                                          int64_t new_cursor,
                                          const std::vector<std::pair<int64_t, int64_t>>& wanted,
                                          Millis now) {
  // One statement for the whole expansion (claims take deliveries by outbox_seq).
  static const std::string kInsert = absl::StrCat(
      "INSERT INTO deliveries (outbox_seq, sink, instance_id, state, created_at) SELECT "
      "u.seq, $2, u.instance_id, ",
      SqlValue(DeliveryState::kPending),
      ", $4::bigint FROM unnest($1::bigint[], $3::bigint[]) AS u(seq, instance_id) ON "
      "CONFLICT DO NOTHING");
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(PgResult got, c.Query("SELECT last_seq FROM relay_cursors WHERE sink = $1 "
                                              "FOR UPDATE",
                                              Params(sink)));
    const int64_t cursor = got.rows() == 0 ? 0 : got.Int(0, 0);
    if (cursor != expected_cursor) return absl::AbortedError("outbox cursor of " + sink + " moved");
    if (!wanted.empty()) {
      std::vector<int64_t> seqs;
      std::vector<int64_t> instances;
      for (const auto& [seq, instance_id] : wanted) {
        seqs.push_back(seq);
        instances.push_back(instance_id);
      }
      WS_RETURN_IF_ERROR(
          c.Query(kInsert, Params(PgArrayOf(seqs), sink, PgArrayOf(instances), now)).status());
    }
    return c
        .Query(
            "INSERT INTO relay_cursors VALUES ($1, (SELECT txid FROM outbox WHERE seq = "
            "$2::bigint), $2::bigint) ON CONFLICT (sink) DO UPDATE SET last_txid = "
            "excluded.last_txid, last_seq = excluded.last_seq",
            Params(sink, new_cursor))
        .status();
  });
}

absl::StatusOr<std::vector<DeliveryClaim>> PostgresStore::ClaimDeliveries(
    const std::string& owner, Millis now, Millis lease_duration, int limit,
    const std::vector<std::string>& sinks) {
  // Only the oldest pending delivery of an instance per sink is eligible, so a
  // later event never overtakes an earlier one that is still being retried.
  static const std::string kClaim = absl::StrCat(
      "UPDATE deliveries SET lease_owner = $1, lease_expires_at = $2::bigint + $3::bigint, "
      "lease_epoch = lease_epoch + 1 WHERE id IN (SELECT d.id FROM deliveries d WHERE d.state = ",
      SqlValue(DeliveryState::kPending),
      " AND d.next_attempt_at <= $2::bigint AND d.lease_expires_at <= $2::bigint AND d.sink = "
      "ANY($5::text[]) AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.sink = d.sink AND "
      "e.instance_id = d.instance_id AND e.state = ",
      SqlValue(DeliveryState::kPending),
      " AND e.outbox_seq < d.outbox_seq) ORDER BY d.outbox_seq LIMIT $4::integer FOR UPDATE SKIP "
      "LOCKED) RETURNING id, lease_epoch, sink, attempts, outbox_seq");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query(kClaim, Params(owner, now, lease_duration, limit,
                                              absl::StrCat("{", QuoteEach(sinks), "}"))));
  std::vector<DeliveryClaim> claims = PgRows(r, [&](const PgRow& row) {
    DeliveryClaim claim;
    claim.id = row.Int(0);
    claim.epoch = row.Int(1);
    claim.owner = owner;
    claim.sink = row.Text(2);
    claim.attempts = static_cast<int>(row.Int(3));
    claim.event.seq = row.Int(4);
    return claim;
  });
  PgDeliverySql sql(*c);
  WS_RETURN_IF_ERROR(CompleteClaims(sql, &claims));
  return claims;
}

absl::Status PostgresStore::FinishDelivery(const DeliveryClaim& claim, const DeliveryUpdate& u) {
  return InTransaction([&](PgConnection& c) -> absl::Status {
    PgDeliverySql sql(c);
    return FinishDeliveryWith(sql, claim, u);
  });
}

absl::StatusOr<std::vector<absl::Status>> PostgresStore::FinishDeliveries(
    const std::vector<FinishedDelivery>& finished) {
  // The common round (every lease held, nothing to alert) as one pipeline: two
  // round trips, where one statement at a time costs two per delivery.
  const bool queueable = std::none_of(finished.begin(), finished.end(), [](const auto& f) {
    return f.update.alert || f.update.alert_event || f.update.disable_sink;
  });
  if (queueable && !finished.empty()) {
    PgQueuedDeliverySql queued;
    auto assumed = FinishDeliveriesWith(queued, finished);
    if (assumed.ok() && std::all_of(assumed->begin(), assumed->end(),
                                    [](const absl::Status& s) { return s.ok(); })) {
      WS_ASSIGN_OR_RETURN(bool committed, CommitAsAssumed(queued.batch()));
      if (committed) return *assumed;
    }
  }
  std::vector<absl::Status> results;
  WS_RETURN_IF_ERROR(InTransaction([&](PgConnection& c) -> absl::Status {
    PgDeliverySql sql(c);
    WS_ASSIGN_OR_RETURN(results, FinishDeliveriesWith(sql, finished));
    return absl::OkStatus();
  }));
  return results;
}

absl::StatusOr<std::vector<std::string>> PostgresStore::DeliveryLeaseOwners(Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return PgLeaseOwners(*c, "deliveries", SqlLeasedDeliveryRows(), now);
}

absl::Status PostgresStore::ExpireDeliveryLeases(const std::string& owner) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return PgExpireLeases(*c, "deliveries", owner);
}

absl::StatusOr<std::vector<std::string>> PostgresStore::DisabledSinks() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT sink FROM relay_sinks WHERE disabled = 1"));
  return PgRows(r, ReadText0<PgRow>);
}

absl::Status PostgresStore::EnableSink(const std::string& sink, Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c
      ->Query(
          "UPDATE relay_sinks SET disabled = 0, reason = 'enabled', updated_at = "
          "$1::bigint WHERE sink = $2",
          Params(now, sink))
      .status();
}

absl::StatusOr<std::vector<DeliveryRecord>> PostgresStore::ListDeliveries(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kDeliveryColumns,
                                                        " FROM deliveries d JOIN outbox o ON "
                                                        "o.seq = d.outbox_seq WHERE d.instance_id "
                                                        "= $1::bigint ORDER BY d.outbox_seq, "
                                                        "d.sink"),
                                           Params(instance_id)));
  return PgRows(r, ReadDelivery<PgRow>);
}

absl::StatusOr<std::vector<SinkStats>> PostgresStore::DeliveryStats() {
  static const std::string kStats = absl::StrCat(
      "SELECT d.sink, COUNT(*) FILTER (WHERE d.state = ", SqlValue(DeliveryState::kPending),
      "), COUNT(*) FILTER (WHERE d.state = ", SqlValue(DeliveryState::kDelivered),
      "), COUNT(*) FILTER (WHERE d.state = ", SqlValue(DeliveryState::kParked),
      "), SUM(d.attempts) - COUNT(*) FILTER (WHERE d.state = ", SqlValue(DeliveryState::kDelivered),
      "), COALESCE(MIN(d.created_at) FILTER (WHERE d.state = ", SqlValue(DeliveryState::kPending),
      "), 0), COALESCE(MAX(r.disabled), 0) FROM deliveries d LEFT JOIN relay_sinks r ON r.sink = "
      "d.sink GROUP BY d.sink ORDER BY d.sink");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kStats));
  return PgRows(r, ReadSinkStats<PgRow>);
}

}  // namespace waystone
