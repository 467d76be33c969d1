-- Capture edges and definitions under load (issue #21 items 2, 8, 9 and 12).

-- Item 8: a statement deadlocking with the app's writers or the engine's workers (40P01),
-- or failing a serialization check (40001), is run again, up to 12 times with a jittered
-- backoff growing from 20 ms to half a second (a drain page the statement met ends within
-- it), inside the caller's transaction (each attempt is a subtransaction: the
-- losing attempt's locks are released, so the other side goes on). Postgres picks the
-- victim that waited first; retried, the statement goes through once the other side
-- committed. Exhausted, it fails with TRT01 (the handle's `transient`), never as an
-- uncoded database error.
CREATE FUNCTION @schema@._apply_retrying(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  attempt int := 0;
  attempts constant int := 12;
  last_error text;
BEGIN
  LOOP
    attempt := attempt + 1;
    BEGIN
      RETURN @schema@._apply(statement, transform_only);
    EXCEPTION WHEN deadlock_detected OR serialization_failure THEN
      GET STACKED DIAGNOSTICS last_error = MESSAGE_TEXT;
      IF attempt >= attempts THEN
        RAISE EXCEPTION USING ERRCODE = 'TRT01',
          MESSAGE = format('the statement met concurrent work %s times in a row (%s): try it again',
                           attempts, last_error),
          HINT = 'Nothing was changed. Writers or the engine''s workers held the same rows; the statement can be repeated as it is.';
      END IF;
      PERFORM pg_sleep(least(0.5, 0.02 * 2 ^ (attempt - 1)) * (0.5 + random()));
    END;
  END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply_retrying(statement, false)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.define(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply_retrying(statement, true)
$fn$;

-- Item 2 (ADR 0039): a table a logical replication subscription writes. Postgres's apply
-- worker fires row-level triggers only (and only those enabled REPLICA or ALWAYS), never
-- the statement-level capture triggers: such a source also gets a row-level capture
-- trigger, ENABLE REPLICA (src/engine/capture/trigger-sql.ts). True when the table, or a
-- partition or inheritance child of it, is in some subscription of this database.
CREATE FUNCTION @schema@._subscribed(rel oid)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid) AS (
    SELECT rel
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
  SELECT EXISTS (SELECT 1 FROM pg_subscription_rel sr WHERE sr.srrelid IN (SELECT relid FROM tree))
$fn$;

-- _capture_status as in 0020, with each source's `subscribed`.
CREATE OR REPLACE FUNCTION @schema@._capture_status(p_transform_id bigint)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
    'setting', c.capture,
    'sources', coalesce((
      SELECT jsonb_agg(jsonb_build_object(
               'table', coalesce(src.qualified, ts.source_schema || '.' || ts.source_name),
               'mode', CASE WHEN src.wal_state = 'ready' AND src.installed_at IS NULL THEN 'logical'
                            WHEN src.wal_state IS NULL THEN 'trigger'
                            ELSE 'switching' END,
               'reason', CASE WHEN c.capture = 'logical' AND src.wal_state IS NULL
                               AND EXISTS (SELECT 1 FROM pg_class rc WHERE rc.oid = ts.source_oid)
                              THEN @schema@._wal_ineligible(ts.source_oid) END,
               'subscribed', @schema@._subscribed(ts.source_oid))
             ORDER BY ts.ordinal)
        FROM @schema@.transform_sources ts
        LEFT JOIN @schema@.sources src ON src.source_oid = ts.source_oid
       WHERE ts.transform_id = p_transform_id), '[]'),
    'slot', CASE WHEN c.wal_slot IS NOT NULL THEN (
      SELECT jsonb_build_object(
               'name', c.wal_slot, 'limitBytes', c.wal_retention_limit,
               'retainedBytes', pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint,
               'confirmedLsn', rs.confirmed_flush_lsn::text)
        FROM (SELECT 1) one
        LEFT JOIN pg_replication_slots rs
               ON rs.slot_name = c.wal_slot AND rs.database = current_database()) END)
  FROM @schema@.config c
$fn$;

-- _capture_fingerprint as in 0019, with the subscriptions' rows for the sources: a table
-- becoming a subscription's target (or leaving one) brings a reconcile pass within a tick
-- check, as DDL on it does.
CREATE OR REPLACE FUNCTION @schema@._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM @schema@.transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM @schema@.transforms),
  pub AS (SELECT p.oid, p.xmin FROM pg_publication p WHERE p.pubname = @schema@._wal_publication())
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.config),
    (SELECT count(*) || ':' || coalesce(sum(c.xmin::text::bigint), 0)
       FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(a.xmin::text::bigint), 0)
       FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rel) AND a.attnum > 0),
    (SELECT count(*) || ':' || coalesce(sum(x.xmin::text::bigint), 0)
       FROM pg_index x WHERE x.indrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(g.xmin::text::bigint), 0)
       FROM pg_trigger g WHERE g.tgrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(p.xmin::text::bigint), 0)
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = @schema_literal@),
    (SELECT count(*) || ':' || coalesce(sum(pub.xmin::text::bigint), 0) FROM pub),
    (SELECT count(*) || ':' || coalesce(sum(r.xmin::text::bigint), 0)
       FROM pg_publication_rel r WHERE r.prpubid IN (SELECT oid FROM pub)),
    (SELECT count(*) || ':' || coalesce(sum(sr.xmin::text::bigint), 0)
       FROM pg_subscription_rel sr WHERE sr.srrelid IN (SELECT oid FROM rel)))
$fn$;

-- _drop_stale_capture as in 0016, with the row-level capture functions (capture_<id>_row)
-- and their triggers.
CREATE OR REPLACE FUNCTION @schema@._drop_stale_capture()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT tg.tgname, tg.tgrelid::regclass::text AS rel
      FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
     WHERE NOT tg.tgisinternal AND tg.tgparentid = 0
       AND p.pronamespace = quote_ident(@schema_literal@)::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate|row)$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure::text AS fn
      FROM pg_proc p
     WHERE p.pronamespace = quote_ident(@schema_literal@)::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate|row)$'
       AND NOT EXISTS (SELECT 1 FROM @schema@.sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE 'DROP FUNCTION ' || r.fn;
  END LOOP;
END
$fn$;

-- Item 12 (ADR 0040): status(target) as in 0026, with backfill.keysHeld: the keys held so
-- far (a build that meets failing rows holds them, in steps that commit as they go).
CREATE OR REPLACE FUNCTION @schema@.status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t @schema@.transforms;
  p @schema@.pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := @schema@.workers();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM @schema@.transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM @schema@.pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM @schema@.transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM @schema@.transform_sources src
      JOIN @schema@.transforms u ON u.target_oid = src.source_oid
      JOIN @schema@.transform_columns uc ON uc.transform_id = u.id
     WHERE src.transform_id = t.id
       AND uc.name = ANY (src.read_columns)
       AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
     ORDER BY 1));
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'node', c.node, 'since', c.since,
           'keysRemaining', CASE WHEN c.keys_total IS NOT NULL
                                 THEN greatest(c.keys_total - c.keys_done, 0) END)
         ORDER BY c.since, c.node), '[]')
    INTO correcting
    FROM @schema@.corrections c JOIN @schema@.sources src ON src.id = c.source_id
    JOIN @schema@.transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM @schema@.transform_sources ts
        JOIN @schema@.transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN @schema@.transform_sources ts ON ts.transform_id = up.id
        JOIN @schema@.transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN @schema@.transforms u ON u.id = up.id
      JOIN @schema@.pipeline pu ON pu.transform_id = u.id
     WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live');

  lifecycle := CASE WHEN t.paused_at IS NOT NULL THEN 'paused' ELSE p.phase END;
  -- Rows that came or went without DML are being re-derived: a build, of a part of it.
  IF lifecycle IN ('live', 'catching_up') AND jsonb_array_length(correcting) > 0 THEN
    lifecycle := 'backfilling';
  END IF;
  -- A live transform reading a paused upstream column, or reading a target that is still
  -- being built, is not keeping up with its sources.
  IF lifecycle = 'live' AND (jsonb_array_length(paused_upstream) > 0 OR upstream_behind) THEN
    lifecycle := 'catching_up';
  END IF;

  IF p.cursor_tick IS NOT NULL THEN
    SELECT count(*), extract(epoch FROM clock_timestamp() - min(k.at))::float8
      INTO lag_segments, lag_seconds
      FROM @schema@.ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || @schema@._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM @schema@.transform_sources ts JOIN @schema@.sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || @schema@._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM @schema@.transform_sources ts JOIN @schema@.sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
     ORDER BY ts.ordinal LIMIT 1;
  END IF;
  -- WAL capture published a source and waits out the transactions that began before
  -- (they could write it unpublished) before a backfill reads it (ADR 0023).
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'publish', 'table', src.qualified, 'lockMode', 'none',
             'since', src.wal_since, 'attempts', NULL)
           || @schema@._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM @schema@.transform_sources ts JOIN @schema@.sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM @schema@.transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM @schema@.pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM @schema@.held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements(@schema@.source_index_gaps(t.id)) g),
    'correcting', correcting,
    'captureFailure', CASE WHEN t.capture_failure IS NOT NULL THEN jsonb_build_object(
        'kind', t.capture_failure->'kind', 'error', t.capture_failure->'error',
        'columns', t.capture_failure->'columns',
        'detectedAt', (t.capture_failure->>'detected_at')::timestamptz) END,
    'captureWait', wait,
    'buildFailure', CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL
                          AND p.build_next_at IS NOT NULL THEN jsonb_build_object(
        'attempts', p.build_attempts, 'error', p.build_error,
        'nextAttemptAt', p.build_next_at) END,
    'drainFailure', drain,
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM @schema@.build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0027: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM @schema@.held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', @schema@._capture_status(t.id),
    'rowSecurity', @schema@._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', @schema@._worker_failure(health),
    'waitingOn', @schema@._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                      upstream_behind OR jsonb_array_length(paused_upstream) > 0));
END
$fn$;
