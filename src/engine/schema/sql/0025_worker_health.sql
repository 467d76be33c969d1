-- Worker health, the processes that run workers, and what every wait waits on (issue #21
-- items 4 and 7, issue #23 item 1; ADR 0038). A pipeline whose workers all fail used to
-- keep status 'live' with nothing saying so, and a transform could wait to be built with
-- nothing saying why.

-- Every process running Trellis workers (a handle with staging or drain loops), written
-- by the process itself (src/engine/workers/process-registry.ts): when it starts, every
-- 10 s, when the health of one of its workers changes, and deleted when it shuts down. A
-- process that died without that is seen by its heartbeat getting old; rows an hour old
-- are deleted by the next heartbeat of any process.
CREATE TABLE @schema@.processes (
  id uuid PRIMARY KEY,
  host text NOT NULL,
  pid int NOT NULL,
  application_name text NOT NULL,
  -- trellis-pg's version (package.json) and the schema version it needs (its newest
  -- migration): a process whose schema_version differs from the installed one is older
  -- (or newer) than the schema.
  package_version text NOT NULL,
  schema_version int NOT NULL,
  staging boolean NOT NULL,
  drain_loops int NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  -- Its workers as it last reported them, each present when it runs it:
  --   staging, decoder: {backendPid, elected, lastPassAt, failingSince, failures, lastError}
  --   drain: {loops, alive, failing, lastPassAt, failingSince, lastError}
  --   refused: {code, message, at} once it stopped its workers (a schema it cannot run on)
  -- lastError: {message, code, sqlstate, at}. Times are the process's clock.
  health jsonb NOT NULL DEFAULT '{}'
);

-- The process rows of this instance still reporting (a heartbeat in the last 30 s: three
-- missed heartbeats), with the session ids pg_locks shows for their workers.
CREATE FUNCTION @schema@._live_processes()
RETURNS SETOF @schema@.processes LANGUAGE sql STABLE AS $fn$
  SELECT * FROM @schema@.processes WHERE heartbeat_at >= now() - interval '30 seconds'
$fn$;

-- The session holding advisory lock p_class (staging 'trst', WAL decoder 'trwl', as in
-- src/engine/internal/advisory-locks.ts) for this instance, if any.
CREATE FUNCTION @schema@._lock_holder(p_class bigint)
RETURNS int LANGUAGE sql STABLE AS $fn$
  SELECT l.pid FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = p_class::oid
     AND l.objid = ((hashtext(@schema_literal@)::bigint + 4294967296) % 4294967296)::oid
   LIMIT 1
$fn$;

-- An elected worker's health (p_role 'staging' or 'decoder'): whether some session holds
-- its lock (elected), the process that runs it (found by the lock holder's backend pid),
-- whether it passes (elected, its process reporting, no failure since its last pass), and
-- `problem`, a sentence saying what is wrong when it does not pass (null when it does, or
-- when no process reports for the lock holder: a trellis-pg older than this schema).
-- Not elected, the process described is one that runs the role and fails, if any: its
-- error says why nobody is elected.
CREATE FUNCTION @schema@._elected_worker(p_role text, p_class bigint, p_name text, p_start text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  holder int := @schema@._lock_holder(p_class);
  pr @schema@.processes;
  h jsonb;
  fresh boolean;
  problem text;
BEGIN
  IF holder IS NOT NULL THEN
    SELECT * INTO pr FROM @schema@.processes p
     WHERE (p.health -> p_role ->> 'backendPid')::int = holder
     ORDER BY p.heartbeat_at DESC LIMIT 1;
  ELSE
    SELECT * INTO pr FROM @schema@._live_processes() p
     WHERE p.health ? p_role
     ORDER BY (p.health -> p_role ->> 'failingSince') IS NULL, p.heartbeat_at DESC LIMIT 1;
  END IF;
  h := pr.health -> p_role;
  fresh := pr.heartbeat_at >= now() - interval '30 seconds';
  IF holder IS NULL THEN
    problem := CASE WHEN h ->> 'failingSince' IS NOT NULL THEN
                 format('no %s is elected: the %s of %s (pid %s) fails: %s', p_name, p_name,
                        pr.host, pr.pid, h -> 'lastError' ->> 'message')
               ELSE format('no %s is running: %s', p_name, p_start) END;
  ELSIF pr.id IS NOT NULL AND NOT fresh THEN
    problem := format('the %s''s process (%s, pid %s) has not reported since %s', p_name,
                      pr.host, pr.pid, pr.heartbeat_at);
  ELSIF pr.id IS NOT NULL AND h ->> 'failingSince' IS NOT NULL THEN
    problem := format('the %s fails: %s', p_name, h -> 'lastError' ->> 'message');
  END IF;
  RETURN jsonb_build_object(
    'elected', holder IS NOT NULL,
    'process', CASE WHEN pr.id IS NOT NULL THEN jsonb_build_object(
                 'id', pr.id, 'host', pr.host, 'pid', pr.pid, 'packageVersion', pr.package_version) END,
    'passing', CASE WHEN holder IS NULL THEN false
                    WHEN pr.id IS NULL THEN NULL
                    ELSE problem IS NULL END,
    'lastPassAt', h -> 'lastPassAt',
    'failingSince', h -> 'failingSince',
    'lastError', h -> 'lastError',
    'problem', problem);
END
$fn$;

-- The instance's workers: the staging worker, the WAL decoder (under WAL capture: null
-- otherwise), the drain loops (sessions holding the drain lock, and what the processes
-- report of theirs), the installed schema version, and every process of the registry,
-- stale ones included. Callable from psql: SELECT jsonb_pretty(trellis.workers()).
CREATE FUNCTION @schema@.workers()
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  installed int := (SELECT max(version) FROM @schema@.migrations);
  logical boolean := (SELECT c.capture = 'logical' OR c.wal_slot IS NOT NULL FROM @schema@.config c);
  loops int;
  drain jsonb;
  drain_problem text;
BEGIN
  SELECT count(*) INTO loops FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = 1953653874::oid  -- 'trdr'
     AND l.objid = ((hashtext(@schema_literal@)::bigint + 4294967296) % 4294967296)::oid;
  SELECT jsonb_build_object(
           'reported', count(*),
           'alive', coalesce(sum((p.health -> 'drain' ->> 'alive')::int), 0),
           'failing', coalesce(sum((p.health -> 'drain' ->> 'failing')::int), 0),
           'lastPassAt', max(p.health -> 'drain' ->> 'lastPassAt'),
           -- All failing: since the last of them began to.
           'failingSince', max(p.health -> 'drain' ->> 'failingSince'),
           'lastError', (SELECT q.health -> 'drain' -> 'lastError' FROM @schema@._live_processes() q
                          WHERE q.health -> 'drain' ->> 'failingSince' IS NOT NULL
                          ORDER BY q.health -> 'drain' -> 'lastError' ->> 'at' DESC LIMIT 1))
    INTO drain
    FROM @schema@._live_processes() p WHERE p.health ? 'drain';
  IF loops = 0 THEN
    drain_problem := CASE WHEN drain -> 'lastError' IS NOT NULL AND drain -> 'lastError' <> 'null'
                          THEN format('no drain loop is running: %s', drain -> 'lastError' ->> 'message')
                          ELSE 'no drain loop is running: connect a handle with drainThreads > 0 (drain loops build targets and apply changes)' END;
  ELSIF (drain ->> 'alive')::int > 0 AND (drain ->> 'failing')::int >= (drain ->> 'alive')::int THEN
    drain_problem := format('every drain loop fails: %s', drain -> 'lastError' ->> 'message');
  END IF;
  RETURN jsonb_build_object(
    'schemaVersion', installed,
    'staging', @schema@._elected_worker('staging', 1953657716, 'staging worker',  -- 'trst'
                 'connect a handle with staging: true (one is elected; others stand by)'),
    'decoder', CASE WHEN logical THEN @schema@._elected_worker('decoder', 1953658732, 'WAL decoder',  -- 'trwl'
                 'the staging worker''s handle (staging: true) runs it') END,
    'drain', jsonb_build_object(
      'loops', loops,
      'passing', CASE WHEN loops = 0 THEN false
                      WHEN (drain ->> 'reported')::int = 0 THEN NULL
                      ELSE drain_problem IS NULL END,
      'lastPassAt', drain -> 'lastPassAt',
      'failingSince', CASE WHEN drain_problem IS NOT NULL THEN drain -> 'failingSince' END,
      'lastError', drain -> 'lastError',
      'problem', drain_problem),
    'processes', coalesce((
      SELECT jsonb_agg(jsonb_build_object(
               'id', p.id, 'host', p.host, 'pid', p.pid, 'applicationName', p.application_name,
               'packageVersion', p.package_version, 'schemaVersion', p.schema_version,
               'staging', p.staging, 'drainLoops', p.drain_loops,
               'startedAt', p.started_at, 'heartbeatAt', p.heartbeat_at,
               'stale', p.heartbeat_at < now() - interval '30 seconds',
               'refused', p.health -> 'refused' ->> 'message')
             ORDER BY p.started_at, p.id)
        FROM @schema@.processes p), '[]'));
END
$fn$;

-- What stops the pipeline, from workers(): the first of the staging worker, the WAL
-- decoder (under WAL capture) and the drain loops that has a problem, or null.
CREATE FUNCTION @schema@._worker_failure(health jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT jsonb_build_object(
           'role', r.role, 'error', r.w ->> 'problem',
           'sqlstate', r.w -> 'lastError' ->> 'sqlstate',
           'since', coalesce(r.w -> 'failingSince', 'null'::jsonb),
           'process', coalesce(r.w -> 'process', 'null'::jsonb))
    FROM (VALUES (1, 'staging', health -> 'staging'), (2, 'decoder', health -> 'decoder'),
                 (3, 'drain', health -> 'drain')) AS r(ord, role, w)
   WHERE r.w IS NOT NULL AND jsonb_typeof(r.w) = 'object' AND r.w ->> 'problem' IS NOT NULL
   ORDER BY r.ord LIMIT 1
$fn$;

-- What a transform that is not live (or lags) waits on, as {kind, reason}: a capture wait
-- (captureWait says more), the staging worker (not running, failing, or about to start the
-- build), capture not in place yet, the first tick, the drain loops, a transform upstream,
-- a failing build. Null for a live transform with nothing to apply, and for a paused one
-- (pauseReason says why).
CREATE FUNCTION @schema@._waiting_on(
  p_transform int, p_lifecycle text, p_wait jsonb, p_health jsonb, p_lag_segments bigint,
  p_upstream boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  p @schema@.pipeline;
  uncovered text;
  staging_problem text := p_health -> 'staging' ->> 'problem';
  decoder_problem text := p_health -> 'decoder' ->> 'problem';
  drain_problem text := p_health -> 'drain' ->> 'problem';
BEGIN
  IF p_lifecycle = 'paused' THEN
    RETURN NULL;
  END IF;
  IF p_wait IS NOT NULL THEN
    RETURN jsonb_build_object('kind', 'capture', 'reason',
      format('capture of %s waits (%s): captureWait lists what it waits on',
             p_wait ->> 'table', p_wait ->> 'operation'));
  END IF;
  SELECT * INTO p FROM @schema@.pipeline WHERE transform_id = p_transform;
  IF p.phase = 'waiting_to_backfill' THEN
    IF staging_problem IS NOT NULL THEN
      RETURN jsonb_build_object('kind', 'staging_worker', 'reason', staging_problem);
    END IF;
    -- A source whose capture does not cover what the transform reads yet (as
    -- startBackfills decides it, src/engine/staging/backfill-start.ts).
    SELECT ts.source_schema || '.' || ts.source_name INTO uncovered
      FROM @schema@.transform_sources ts
      LEFT JOIN @schema@.sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = p_transform
       AND (src.id IS NULL
            OR (src.wal_state IS DISTINCT FROM 'ready'
                AND (src.installed_at IS NULL
                     OR NOT (ARRAY(SELECT unnest(ts.read_columns) EXCEPT SELECT unnest(ts.key_columns))
                             <@ src.captured_columns))))
     ORDER BY ts.ordinal LIMIT 1;
    IF uncovered IS NOT NULL THEN
      RETURN jsonb_build_object('kind', 'capture', 'reason',
        format('capture of %s is not in place yet: the staging worker installs it (or widens it to the columns read) on its next pass%s',
               uncovered, CASE WHEN decoder_problem IS NOT NULL THEN '; ' || decoder_problem ELSE '' END));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @schema@.ticks) THEN
      RETURN jsonb_build_object('kind', 'tick', 'reason',
        'the staging worker has taken no tick yet: a build starts from one');
    END IF;
    RETURN jsonb_build_object('kind', 'staging_worker', 'reason',
      'the staging worker starts the build on its next pass');
  END IF;
  IF p_lifecycle = 'live' AND p_lag_segments = 0 THEN
    RETURN NULL;
  END IF;
  IF drain_problem IS NOT NULL THEN
    RETURN jsonb_build_object('kind', 'drain_worker', 'reason', drain_problem);
  END IF;
  IF p.build_attempts > 0 AND p.build_error IS NOT NULL AND p.build_next_at IS NOT NULL THEN
    RETURN jsonb_build_object('kind', 'build', 'reason',
      format('its build failed %s time(s) (%s); it is tried again at %s (buildFailure)',
             p.build_attempts, p.build_error, p.build_next_at));
  END IF;
  IF p_upstream AND p_lifecycle = 'catching_up' AND p.phase = 'live' THEN
    RETURN jsonb_build_object('kind', 'upstream', 'reason',
      'it reads a transform that is paused, or not live yet (see pausedUpstreamColumns and its status)');
  END IF;
  RETURN jsonb_build_object('kind', 'drain_worker', 'reason',
    CASE WHEN p_lifecycle = 'backfilling' THEN 'the drain loops are building it (backfill shows how far)'
         ELSE 'the drain loops are applying the changes it has not applied yet (lag)' END);
END
$fn$;

-- Where a transform is (the handle's Status), as in 0024, and now the workers' health
-- (workers), what stops the pipeline (workerFailure), and what it waits on (waitingOn).
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
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', @schema@._capture_status(t.id),
    'rowSecurity', @schema@._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', @schema@._worker_failure(health),
    'waitingOn', @schema@._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                      upstream_behind OR jsonb_array_length(paused_upstream) > 0));
END
$fn$;

