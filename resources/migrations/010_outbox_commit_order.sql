-- The outbox in commit order.
--
-- Event ids are handed out at INSERT, not at COMMIT: a transaction that commits late holds ids
-- below events a reader has already passed, and a reader keeping `event_id > cursor` skips its
-- events for good. Each event now carries the id of the transaction that wrote it. A reader reads
-- only events of transactions older than every transaction still running
-- (`pg_snapshot_xmin(pg_current_snapshot())`), in (txid, event_id) order: every transaction
-- below that horizon has ended, so no event can appear behind its cursor later.
--
-- Events written before this migration carry txid 0: they come first, in id order, as before.
-- A reader's recorded position gains the txid (0 for a position recorded before), and pruning
-- compares positions in the same order.

ALTER TABLE checkpoint_events ADD COLUMN txid xid8 NOT NULL DEFAULT '0';
ALTER TABLE checkpoint_events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
CREATE INDEX checkpoint_events_commit_order ON checkpoint_events (txid, event_id);

ALTER TABLE event_readers ADD COLUMN after_txid xid8 NOT NULL DEFAULT '0';
