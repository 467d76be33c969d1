-- Two races between the staging worker's or a build's check and a transaction that has not
-- committed yet (ADR 0010, ADR 0005).

-- As before (0007), after a lock on the target that a build's key drop waits for, and that
-- waits for it: a build that dropped the key has committed (its deferred_ddl is seen, and
-- put back), or it drops the key only after this transaction, which then holds a
-- transform reading the target, has committed (the build sees it and keeps the key:
-- drain/backfill.ts, deferIndexes). Without the lock, a build could check for readers
-- before this transaction committed and drop the key after it had bound it.
CREATE OR REPLACE FUNCTION @schema@._restore_deferred_ddl(target oid)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  building int;
  ddl text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM @schema@.transforms t WHERE t.target_oid = target) THEN
    RETURN;
  END IF;
  EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', target::regclass);
  SELECT p.transform_id INTO building
    FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
   WHERE t.target_oid = target AND p.deferred_ddl IS NOT NULL
     FOR UPDATE OF p;
  IF building IS NULL THEN RETURN; END IF;
  FOR ddl IN SELECT unnest(deferred_ddl) FROM @schema@.pipeline WHERE transform_id = building LOOP
    EXECUTE ddl;
  END LOOP;
  UPDATE @schema@.pipeline SET deferred_ddl = NULL WHERE transform_id = building;
END
$fn$;

-- When a source's members (partitions, inheritance children) last came or went. Once set,
-- awaitConverged on its readers converges on a snapshot taken after its corrections are
-- queued and done, never on the token alone: a correction finished before the wait first
-- looked leaves no member and no correction behind, yet its keys, written into the ledger
-- after the token, may not be applied yet (src/engine/watermark.ts).
ALTER TABLE @schema@.sources ADD COLUMN members_changed_at timestamptz;
