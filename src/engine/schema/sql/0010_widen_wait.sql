-- What a backfill waits on after capture of a source widens (ADR 0009).
--
-- A widen replaces the UPDATE trigger's function and takes no lock on the source, so a
-- transaction that already held a writer lock on the source when the widen committed may
-- still run the older function (cached in its session) and miss a change to a newly
-- captured column. A backfill of a transform reading such a column waits for exactly
-- those transactions, recorded here, instead of for every transaction older than the
-- widen in the whole cluster (ready_xmax, which this version no longer sets: a value an
-- older version set is still honoured).
ALTER TABLE @schema@.sources
  -- When capture last widened while that wait is open; NULL when nothing is waited on.
  ADD COLUMN widened_at timestamptz,
  -- The columns the widens being waited on added.
  ADD COLUMN widen_columns name[],
  -- The transactions waited on, [{vxid, pid}] as pg_locks shows them (pid null for a
  -- prepared transaction): those holding a lock of ROW EXCLUSIVE or stronger on the source
  -- or one of its partitions or inheritance children just after the widen committed. NULL until the staging worker
  -- has looked (its first pass after the widen).
  ADD COLUMN widen_holders jsonb;
