-- Fair drain (issue #22 item 4, ADR 0045): what the drain loops spent on each transform,
-- and the order they take work in. One transform's heavy pages or build must not hold
-- every loop while others wait: a loop takes next the work of the transform that nobody
-- is serving now and that had the least drain time lately.
--   seconds     drain time spent on it in all (pages, ranges applied at once, builds)
--   recent      the same, decayed with a time constant of a minute, as of `at`
--   at          when drain time was last recorded for it
CREATE TABLE @schema@.drain_time (
  transform_id int PRIMARY KEY REFERENCES @schema@.transforms (id) ON DELETE CASCADE,
  seconds float8 NOT NULL DEFAULT 0,
  recent float8 NOT NULL DEFAULT 0,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Records drain time (a loop sends what it spent, at most once a second): ids[i] took
-- secs[i] seconds.
CREATE FUNCTION @schema@._drained(ids int[], secs float8[])
RETURNS void LANGUAGE sql AS $fn$
  INSERT INTO @schema@.drain_time AS d (transform_id, seconds, recent, at)
  SELECT x.id, sum(x.s), sum(x.s), clock_timestamp()
    FROM unnest(ids, secs) AS x(id, s)
   WHERE EXISTS (SELECT 1 FROM @schema@.transforms t WHERE t.id = x.id)
   GROUP BY x.id
   ORDER BY x.id
  ON CONFLICT (transform_id) DO UPDATE
    SET seconds = d.seconds + excluded.seconds,
        recent = d.recent * exp(-greatest(extract(epoch FROM excluded.at - d.at), 0) / 60)
                 + excluded.recent,
        at = excluded.at
$fn$;

-- Each transform's recent drain time decayed to now, whether another session's drain loop
-- is working for it at this moment (it holds the transform's serving lock, taken shared
-- with each unit of work: drain/work-settings.ts), and whether its live work (pages,
-- ranges) is reserved from the calling loop: when another loop serves it and the caller is
-- the last drain loop of the instance not serving anything, that loop stays free for the
-- other transforms (their next change would otherwise wait for this one's work to end).
-- Builds are not reserved: a chunk is bounded, and a GROUP BY build is one step.
-- The order drain work is taken in: not served first, then least recent time.
CREATE FUNCTION @schema@._drain_ranks()
RETURNS TABLE (transform_id int, serving boolean, recent float8, reserved boolean)
LANGUAGE sql STABLE AS $fn$
  WITH locks AS (
    SELECT l.classid, l.objid, l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid IN (1953657718::oid,   -- 0x74727376, "trsv": LOCK_CLASS.serving
                         1953653874::oid)   -- 0x74726472, "trdr": LOCK_CLASS.drain
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
  keyed AS (
    SELECT t.id, (((hashtext(@schema_literal@ || ':' || t.id))::bigint + 4294967296) % 4294967296)::oid AS key
      FROM @schema@.transforms t),
  served AS (
    SELECT k.id, l.pid FROM keyed k JOIN locks l ON l.classid = 1953657718::oid AND l.objid = k.key
     WHERE l.pid <> pg_backend_pid()),
  free AS (
    SELECT (SELECT count(DISTINCT l.pid) FROM locks l
             WHERE l.classid = 1953653874::oid
               AND l.objid = (((hashtext(@schema_literal@))::bigint + 4294967296) % 4294967296)::oid)
           - (SELECT count(DISTINCT s.pid) FROM served s) AS loops)
  SELECT k.id,
         k.id IN (SELECT s.id FROM served s),
         coalesce(d.recent * exp(-greatest(extract(epoch FROM clock_timestamp() - d.at), 0) / 60), 0),
         k.id IN (SELECT s.id FROM served s) AND (SELECT loops FROM free) <= 1
    FROM keyed k LEFT JOIN @schema@.drain_time d ON d.transform_id = k.id
$fn$;

-- Which kind of work a drain loop should look at first: 'page' (an open page), 'range'
-- (a transform behind with no range open), 'build' (a chunk or step of a build), or null
-- when none waits; the kind whose transform ranks first by _drain_ranks.
CREATE FUNCTION @schema@._drain_next()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH r AS (SELECT * FROM @schema@._drain_ranks()),
  work AS (
    SELECT 'page' AS kind, p.transform_id
      FROM @schema@.pages p JOIN @schema@.transforms t ON t.id = p.transform_id
     WHERE t.paused_at IS NULL AND (p.not_before IS NULL OR p.not_before <= now())
    UNION ALL
    SELECT 'range', pl.transform_id
      FROM @schema@.pipeline pl JOIN @schema@.transforms t ON t.id = pl.transform_id
     WHERE pl.phase IN ('catching_up', 'live') AND t.paused_at IS NULL AND pl.open_lo IS NULL
       AND pl.cursor_tick < (SELECT max(seq) FROM @schema@.ticks)
    UNION ALL
    SELECT 'build', pl.transform_id
      FROM @schema@.pipeline pl JOIN @schema@.transforms t ON t.id = pl.transform_id
     WHERE pl.phase = 'backfilling' AND t.paused_at IS NULL
       AND (pl.build_next_at IS NULL OR pl.build_next_at <= now()))
  SELECT w.kind FROM work w JOIN r ON r.transform_id = w.transform_id
   WHERE NOT (r.reserved AND w.kind <> 'build')
   ORDER BY r.serving, r.recent, w.kind = 'build'
   LIMIT 1
$fn$;

-- status().drain: the drain time spent on a transform in all, lately (decayed over a
-- minute), and its share of the recent drain time of every transform of the instance.
CREATE FUNCTION @schema@._drain_share(transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH r AS (SELECT * FROM @schema@._drain_ranks())
  SELECT jsonb_build_object(
    'seconds', coalesce((SELECT d.seconds FROM @schema@.drain_time d
                          WHERE d.transform_id = _drain_share.transform_id), 0),
    'recentSeconds', round(coalesce((SELECT r.recent FROM r
                                      WHERE r.transform_id = _drain_share.transform_id), 0)::numeric, 3),
    'share', (SELECT round((sum(r.recent) FILTER (WHERE r.transform_id = _drain_share.transform_id)
                            / nullif(sum(r.recent), 0))::numeric, 3) FROM r))
$fn$;

-- As in 0029, with the drain time spent on the transform (drain).
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
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := @schema@._restore_reason();
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

  -- 0029: a target of a database restored or cloned is not live until it was rebuilt here.
  IF restored IS NOT NULL AND lifecycle <> 'paused' THEN
    lifecycle := 'unverified';
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
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM @schema@.held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', @schema@._capture_status(t.id),
    'rowSecurity', @schema@._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0031: the drain time spent on it, and its share of the drain's recent time.
    'drain', @schema@._drain_share(t.id),
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', @schema@._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE @schema@._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM @schema@.config c WHERE c.restored IS NOT NULL) END);
END
$fn$;

-- Whether the calling drain loop, having claimed a page of `transform_id` (and taken its
-- serving lock), should leave it: two loops woken together can claim pages of one
-- transform at once, before either sees the other serving it. A loop that sees another
-- serving it leaves, when no other drain loop of the instance is free for the other
-- transforms' work (_drain_ranks' reserve, decided after the claim). Two that check at the
-- same moment may both leave: they claim again at their next step.
CREATE FUNCTION @schema@._drain_yield(transform_id int)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH locks AS (
    SELECT l.classid, l.objid, l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid IN (1953657718::oid, 1953653874::oid)
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
  keyed AS (
    SELECT t.id, (((hashtext(@schema_literal@ || ':' || t.id))::bigint + 4294967296) % 4294967296)::oid AS key
      FROM @schema@.transforms t),
  served AS (
    SELECT k.id, l.pid FROM keyed k JOIN locks l ON l.classid = 1953657718::oid AND l.objid = k.key)
  SELECT EXISTS (SELECT 1 FROM served s
                  WHERE s.id = _drain_yield.transform_id AND s.pid <> pg_backend_pid())
     AND (SELECT count(DISTINCT l.pid) FROM locks l
           WHERE l.classid = 1953653874::oid
             AND l.objid = (((hashtext(@schema_literal@))::bigint + 4294967296) % 4294967296)::oid)
         - (SELECT count(DISTINCT s.pid) FROM served s) <= 0
$fn$;
