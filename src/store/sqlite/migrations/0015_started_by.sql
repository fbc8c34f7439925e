-- Who started the instance (a token's name; empty when started from the command line
-- or by code): an approval step's four-eyes rule excludes the starter from deciding.
ALTER TABLE instances ADD COLUMN started_by TEXT NOT NULL DEFAULT '';
