-- The operations page shows time, not only now (issue #23 items 8 and 6, ADR 0054).
--
-- Each transform's lag and the changed keys its drain applied, sampled by the elected
-- staging worker every ten seconds and kept for an hour: the page's charts are drawn from
-- these rows, whichever process serves the page (a web process runs no worker). A
-- backfill's rate and the time it has left come from its keys done over the last minute of
-- samples. And each source index gap offers the statement for a migration's transaction
-- (CREATE INDEX) beside the one for psql (CREATE INDEX CONCURRENTLY).

-- Changed keys the drain applied to the transform in all (each page's or range's
-- re-derived keys, a key changed twice counting twice), as drain loops record their time.
ALTER TABLE @schema@.drain_time ADD COLUMN keys bigint NOT NULL DEFAULT 0;

-- _drained (0031) with the keys applied: ids[i] took secs[i] seconds and applied keys[i]
-- changed keys. The two-argument form stays for processes of the previous version.
CREATE FUNCTION @schema@._drained(ids int[], secs float8[], keys bigint[])
RETURNS void LANGUAGE sql AS $fn$
  INSERT INTO @schema@.drain_time AS d (transform_id, seconds, recent, keys, at)
  SELECT x.id, sum(x.s), sum(x.s), sum(x.k), clock_timestamp()
    FROM unnest(ids, secs, keys) AS x(id, s, k)
   WHERE EXISTS (SELECT 1 FROM @schema@.transforms t WHERE t.id = x.id)
   GROUP BY x.id
   ORDER BY x.id
  ON CONFLICT (transform_id) DO UPDATE
    SET seconds = d.seconds + excluded.seconds,
        recent = d.recent * exp(-greatest(extract(epoch FROM excluded.at - d.at), 0) / 60)
                 + excluded.recent,
        keys = d.keys + excluded.keys,
        at = excluded.at
$fn$;

-- One row per transform per sample (every ten seconds, by the elected staging worker),
-- none older than an hour:
--   lag_seconds, lag_segments   status().lag at `at`
--   keys                        drain_time.keys at `at` (the rate is the difference)
--   backfill_done               status().backfill.keysDone, while it backfills
CREATE TABLE @schema@.samples (
  transform_id int NOT NULL REFERENCES @schema@.transforms (id) ON DELETE CASCADE,
  at timestamptz NOT NULL,
  lag_seconds float8 NOT NULL,
  lag_segments bigint NOT NULL,
  keys bigint NOT NULL,
  backfill_done bigint,
  PRIMARY KEY (transform_id, at)
);
CREATE INDEX samples_at ON @schema@.samples (at);

-- A build's keys done, as status().backfill.keysDone reports them (0022: a build filling
-- chunks has done what its chunks left to fill do not hold); null unless backfilling.
CREATE FUNCTION @schema@._keys_built(p @schema@.pipeline)
RETURNS bigint LANGUAGE sql STABLE AS $fn$
  SELECT CASE WHEN p.phase <> 'backfilling' THEN NULL
              WHEN p.backfill_stage = 'chunks'
              THEN greatest(p.backfill_total - (
                     SELECT coalesce(sum(c.rows), 0) FROM @schema@.build_chunks c
                      WHERE c.transform_id = p.transform_id), 0)
              ELSE p.backfill_done END
$fn$;

-- Takes a sample of every transform and forgets those older than an hour. Returns how
-- many transforms it sampled.
CREATE FUNCTION @schema@._sample()
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  n int;
BEGIN
  INSERT INTO @schema@.samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT t.id, clock_timestamp(), coalesce(l.seconds, 0), coalesce(l.segments, 0),
         coalesce(d.keys, 0), @schema@._keys_built(p)
    FROM @schema@.transforms t
    JOIN @schema@.pipeline p ON p.transform_id = t.id
    LEFT JOIN @schema@.drain_time d ON d.transform_id = t.id
    LEFT JOIN LATERAL (
      SELECT count(*) AS segments,
             extract(epoch FROM clock_timestamp() - min(k.at))::float8 AS seconds
        FROM @schema@.ticks k WHERE k.seq > p.cursor_tick) l ON p.cursor_tick IS NOT NULL
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS n = ROW_COUNT;
  DELETE FROM @schema@.samples WHERE at < clock_timestamp() - interval '1 hour';
  RETURN n;
END
$fn$;

-- The last hour of every transform, for the operations page's charts (the handle's
-- history()): {target, samples: [{at, lagSeconds, lagSegments, keysPerSecond,
-- backfillDone}]}, oldest first. keysPerSecond is the changed keys applied between the
-- sample before and this one, per second (null for the first).
CREATE FUNCTION @schema@.history()
RETURNS SETOF jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object('target', t.target_name, 'samples', coalesce((
           SELECT jsonb_agg(jsonb_build_object(
                    'at', x.at, 'lagSeconds', round(x.lag_seconds::numeric, 3),
                    'lagSegments', x.lag_segments,
                    'keysPerSecond', round(x.rate::numeric, 3),
                    'backfillDone', x.backfill_done) ORDER BY x.at)
             FROM (SELECT s.*,
                          greatest(s.keys - lag(s.keys) OVER w, 0)
                          / nullif(extract(epoch FROM s.at - lag(s.at) OVER w), 0)::float8 AS rate
                     FROM @schema@.samples s
                    WHERE s.transform_id = t.id AND s.at >= clock_timestamp() - interval '1 hour'
                   WINDOW w AS (ORDER BY s.at)) x), '[]'))
    FROM @schema@.transforms t
   ORDER BY t.target_name
$fn$;

-- status().backfill with the build's pace: `rate` (keys a second, over the last minute of
-- samples, or since the build started while it has none that old) and `etaSeconds` (the
-- keys it has left at that rate; null while it knows no total or makes no progress). Both
-- null once the build is over.
CREATE FUNCTION @schema@._backfill_pace(backfill jsonb, transform_id int, building boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  done float8 := (backfill->>'keysDone')::float8;
  total float8 := (backfill->>'keysTotal')::float8;
  started timestamptz := (backfill->>'startedAt')::timestamptz;
  s @schema@.samples;
  rate float8;
  seconds float8;
BEGIN
  IF backfill IS NULL THEN
    RETURN NULL;
  END IF;
  IF building THEN
    -- The oldest sample of this build in the last minute, at least two seconds old.
    SELECT * INTO s FROM @schema@.samples x
     WHERE x.transform_id = _backfill_pace.transform_id AND x.backfill_done IS NOT NULL
       AND x.at >= started AND x.at >= clock_timestamp() - interval '1 minute'
       AND x.at <= clock_timestamp() - interval '2 seconds'
     ORDER BY x.at LIMIT 1;
    IF FOUND THEN
      seconds := extract(epoch FROM clock_timestamp() - s.at);
      rate := greatest(done - s.backfill_done, 0) / seconds;
    ELSE
      -- No sample of this build yet: its pace since it started, from its first moment (a
      -- build of a few seconds would otherwise show none before it is over).
      seconds := extract(epoch FROM clock_timestamp() - started);
      IF seconds > 0 THEN
        rate := done / seconds;
      END IF;
    END IF;
  END IF;
  RETURN backfill || jsonb_build_object(
    'rate', round(rate::numeric, 3),
    'etaSeconds', CASE WHEN rate > 0 AND total IS NOT NULL
                       THEN round((greatest(total - done, 0) / rate)::numeric, 1) END);
END
$fn$;

-- As in 0031, with the build's pace (backfill.rate, backfill.etaSeconds: _backfill_pace)
-- and each source index gap's statement for a migration's transaction (fixInMigration).
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
               'optedOut', g->'opted_out', 'fix', g->'fix',
               -- 0034: the same statement for a migration's transaction (no CONCURRENTLY).
               'fixInMigration', regexp_replace(g->>'fix', '^CREATE INDEX CONCURRENTLY ', 'CREATE INDEX '))), '[]')
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
    -- 0034: with the build's pace (rate, etaSeconds).
    'backfill', @schema@._backfill_pace(CASE WHEN p.backfill_started_at IS NOT NULL
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
        'startedAt', p.backfill_started_at) END, t.id, p.phase = 'backfilling'),
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

