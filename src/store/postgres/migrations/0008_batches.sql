-- Batches: one operator action over the instances a filter matched when the batch
-- was created (its items, frozen), applied by the serve processes' batch runners.
-- Items name instances by id and key without a foreign key: gc may remove an
-- instance, and the batch stays the record of what was done to it (as the audit log).
CREATE TABLE batches (
  id           BIGSERIAL PRIMARY KEY,
  public_id    TEXT NOT NULL UNIQUE,
  tenant       TEXT NOT NULL,
  actor        TEXT NOT NULL,
  reason       TEXT NOT NULL,
  action       TEXT NOT NULL,
  action_json  TEXT NOT NULL,
  filter_json  TEXT NOT NULL,
  state        INTEGER NOT NULL,
  created_at   BIGINT NOT NULL,
  updated_at   BIGINT NOT NULL
);
CREATE INDEX batches_tenant ON batches (tenant, id);

CREATE TABLE batch_items (
  id                BIGSERIAL PRIMARY KEY,
  batch_id          BIGINT NOT NULL REFERENCES batches (id),
  instance_id       BIGINT NOT NULL,
  instance_key      TEXT NOT NULL,
  state             INTEGER NOT NULL,
  result_state      TEXT NOT NULL DEFAULT '',
  message           TEXT NOT NULL DEFAULT '',
  owner             TEXT NOT NULL DEFAULT '',
  claim_expires_at  BIGINT NOT NULL DEFAULT 0,
  tries             INTEGER NOT NULL DEFAULT 0,
  applied_at        BIGINT NOT NULL DEFAULT 0,
  finished_at       BIGINT NOT NULL DEFAULT 0,
  updated_at        BIGINT NOT NULL,
  UNIQUE (batch_id, instance_id)
);
-- Runners look for items to take (pending, applying) and to judge (applied).
CREATE INDEX batch_items_open ON batch_items (state, batch_id) WHERE state IN (1, 2, 3);
