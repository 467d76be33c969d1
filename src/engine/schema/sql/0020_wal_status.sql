-- status() under WAL capture (issue #14, ADR 0023): what a transform's capture is, and
-- what a backfill waits on when WAL capture has just published a source.

-- The transactions a published source waits out (as 32-bit xid texts): those of this
-- database that began before the publication changed (an xid below `p_xmax` that the
-- current snapshot still counts as running), prepared ones included. Only this database's:
-- another database's transactions cannot write the source, and a long one there (another
-- app, a test suite's other files) must not hold capture here. Found through pg_locks (each
-- transaction holds the lock on its own xid), which every role may read.
CREATE FUNCTION @schema@._publish_waits_on(p_xmax xid8)
RETURNS SETOF text LANGUAGE sql STABLE AS $fn$
  SELECT (x::text::bigint % 4294967296)::text
    FROM pg_snapshot_xip(pg_current_snapshot()) x
   WHERE p_xmax IS NOT NULL AND x < p_xmax
     AND (x::text::bigint % 4294967296)::text IN (
       SELECT l.transactionid::text FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
          AND a.datname = current_database()
       UNION ALL
       SELECT p.transaction::text FROM pg_prepared_xacts p WHERE p.database = current_database())
$fn$;

-- The sessions and prepared transactions a published source waits out (_publish_waits_on).
-- Same shape as _capture_wait_blockers (0017).
CREATE FUNCTION @schema@._publish_wait_blockers(p_xmax xid8)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH running AS (SELECT w AS xid FROM @schema@._publish_waits_on(p_xmax) w)
  SELECT jsonb_build_object(
    'blockers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'pid', a.pid, 'applicationName', a.application_name, 'database', a.datname,
                   'state', a.state, 'xactStart', a.xact_start, 'queryStart', a.query_start,
                   'query', a.query) ORDER BY a.pid)
                   FROM pg_stat_activity a
                  WHERE a.pid IN (SELECT l.pid FROM pg_locks l
                                   WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock'
                                     AND l.transactionid::text IN (SELECT xid FROM running))
                    AND a.pid <> pg_backend_pid()), '[]'),
    'prepared', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'gid', p.gid, 'owner', p.owner, 'database', p.database,
                   'prepared', p.prepared, 'transaction', p.transaction::text)
                   ORDER BY p.prepared, p.gid)
                   FROM pg_prepared_xacts p
                  WHERE p.transaction::text IN (SELECT xid FROM running)), '[]'))
$fn$;

-- A transform's capture (Status.capture): the instance's setting; each source's mode
-- ('logical' once the slot alone captures it, 'switching' while both or while it is not
-- trusted yet) and, under 'logical', why one stays on triggers; the slot, while the
-- instance has one, with the WAL it holds back against the ceiling.
CREATE FUNCTION @schema@._capture_status(p_transform_id bigint)
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
                              THEN @schema@._wal_ineligible(ts.source_oid) END)
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

-- status(target) as in 0017, with WAL capture: a backfill waiting for a published source's
-- older transactions to end (captureWait 'publish'), and `capture`: the instance's setting,
-- each source's capture mode (and why one stays on triggers), and the slot's retained WAL
-- against its ceiling. (A function is replaced whole: 0017's body, with the two additions.)
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
        'keysDone', p.backfill_done, 'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', @schema@._capture_status(t.id));
END
$fn$;
