-- The console finds an instance by an external id (an ERP order number, a LINE
-- request id): some step's, exactly. Most steps have none.
CREATE INDEX steps_external_id ON steps (external_id) WHERE external_id <> '';
