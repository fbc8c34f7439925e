-- Outbox delivery (see the SQLite migration of the same name).

CREATE TABLE deliveries (
  id                BIGSERIAL PRIMARY KEY,
  outbox_seq        BIGINT NOT NULL REFERENCES outbox(seq),
  sink              TEXT NOT NULL,
  instance_id       BIGINT NOT NULL,
  state             SMALLINT NOT NULL,
  attempts          INTEGER NOT NULL DEFAULT 0,
  next_attempt_at   BIGINT NOT NULL DEFAULT 0,
  last_error        TEXT NOT NULL DEFAULT '',
  lease_owner       TEXT NOT NULL DEFAULT '',
  lease_expires_at  BIGINT NOT NULL DEFAULT 0,
  lease_epoch       BIGINT NOT NULL DEFAULT 0,
  created_at        BIGINT NOT NULL,
  delivered_at      BIGINT NOT NULL DEFAULT 0,
  UNIQUE (outbox_seq, sink)
);
CREATE INDEX deliveries_pending ON deliveries (sink, instance_id, outbox_seq) WHERE state = 1;
CREATE INDEX deliveries_instance ON deliveries (instance_id, outbox_seq);

-- Cursor per sink: the (txid, seq) of the last outbox row expanded.
CREATE TABLE relay_cursors (
  sink      TEXT PRIMARY KEY,
  last_txid XID8 NOT NULL,
  last_seq  BIGINT NOT NULL
);

CREATE TABLE relay_sinks (
  sink        TEXT PRIMARY KEY,
  disabled    SMALLINT NOT NULL,
  reason      TEXT NOT NULL,
  updated_at  BIGINT NOT NULL
);
