-- Claims take due deliveries in outbox order: walking this index they stop after
-- the batch, instead of reading every pending delivery of the sink and sorting them
-- (a claim's cost grew with the backlog).
CREATE INDEX deliveries_due ON deliveries (outbox_seq) WHERE state = 1;
