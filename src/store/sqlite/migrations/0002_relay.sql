-- Outbox delivery: one row per (outbox row, sink), claimed under a lease.

ALTER TABLE steps ADD COLUMN unknown_since INTEGER NOT NULL DEFAULT 0;

CREATE TABLE deliveries (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  outbox_seq        INTEGER NOT NULL REFERENCES outbox(seq),
  sink              TEXT NOT NULL,
  instance_id       INTEGER NOT NULL,
  state             INTEGER NOT NULL,            -- DeliveryState: 1 pending, 2 delivered, 3 parked
  attempts          INTEGER NOT NULL DEFAULT 0,
  next_attempt_at   INTEGER NOT NULL DEFAULT 0,
  last_error        TEXT NOT NULL DEFAULT '',
  lease_owner       TEXT NOT NULL DEFAULT '',
  lease_expires_at  INTEGER NOT NULL DEFAULT 0,
  lease_epoch       INTEGER NOT NULL DEFAULT 0,
  created_at        INTEGER NOT NULL,
  delivered_at      INTEGER NOT NULL DEFAULT 0,
  UNIQUE (outbox_seq, sink)
);
-- Head-of-line lookups: the oldest pending delivery of an instance for a sink.
CREATE INDEX deliveries_pending ON deliveries (sink, instance_id, outbox_seq) WHERE state = 1;
CREATE INDEX deliveries_instance ON deliveries (instance_id, outbox_seq);

-- How far each sink has expanded the outbox.
CREATE TABLE relay_cursors (
  sink      TEXT PRIMARY KEY,
  last_seq  INTEGER NOT NULL
) WITHOUT ROWID;

-- Sinks switched off (an endpoint answered 410); their deliveries wait.
CREATE TABLE relay_sinks (
  sink        TEXT PRIMARY KEY,
  disabled    INTEGER NOT NULL,
  reason      TEXT NOT NULL,
  updated_at  INTEGER NOT NULL
) WITHOUT ROWID;
