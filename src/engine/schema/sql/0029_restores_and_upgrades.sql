-- Upgrades and restores (issue #21 items 3 and 4; ADR 0035, ADR 0036).

-- Item 4: migration 0012 added sources.capture_digest and left it NULL for the tables
-- captured already; the staging worker then took every one of them for capture replaced
-- outside Trellis and paused its readers. The digest of the functions as they are now is
-- recorded for those (the staging worker does the same for a source captured by an older
-- trellis-pg still running against this schema).
UPDATE @schema@.sources SET capture_digest = @schema@._capture_digest(id)
 WHERE installed_at IS NOT NULL AND capture_digest IS NULL;

-- Item 3: a database restored from a logical dump (pg_dump/pg_restore, into this cluster or
-- another), or cloned from a template, holds the catalog of the database it came from: its
-- tables' OIDs, the ledger's transaction ids and the ticks' snapshots, all of that other
-- database. The instance records which database it is; one that finds itself elsewhere
-- rebinds its tables by name, forgets what was about the other database's transactions,
-- and rebuilds every transform before any says `live` again (ADR 0035). A physical copy
-- (a base backup, PITR, a promoted standby) is the same database, with the same OIDs and
-- transaction ids: nothing to rebind.

-- This database: the cluster's system identifier (NULL where the role may not read it) and
-- the database's OID, with its name for messages.
CREATE FUNCTION @schema@._database_identity()
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  system_id text;
BEGIN
  BEGIN
    SELECT s.system_identifier::text INTO system_id FROM pg_control_system() s;
  EXCEPTION WHEN insufficient_privilege THEN
    system_id := NULL;
  END;
  RETURN jsonb_build_object(
    'systemIdentifier', system_id,
    'databaseOid', (SELECT d.oid::text FROM pg_database d WHERE d.datname = current_database()),
    'database', current_database());
END
$fn$;

-- Recorded at install (the config row) and when a restore is recognised.
ALTER TABLE @schema@.config ADD COLUMN database_identity jsonb DEFAULT @schema@._database_identity();
-- The last restore recognised: {detectedAt, reason, from}.
ALTER TABLE @schema@.config ADD COLUMN restored jsonb;

-- Why the catalog is not this database's (a sentence), or NULL when it is.
CREATE FUNCTION @schema@._restore_reason()
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT CASE
    WHEN c.database_identity IS NULL THEN NULL
    WHEN c.database_identity->>'systemIdentifier' IS DISTINCT FROM now_id->>'systemIdentifier'
     AND c.database_identity->>'systemIdentifier' IS NOT NULL AND now_id->>'systemIdentifier' IS NOT NULL
      THEN format('the database %s was restored or copied from another cluster (system identifier %s, now %s)',
                  now_id->>'database', c.database_identity->>'systemIdentifier', now_id->>'systemIdentifier')
    WHEN c.database_identity->>'databaseOid' IS DISTINCT FROM now_id->>'databaseOid'
      THEN format('the database %s was restored or cloned from %s (database OID %s, now %s)',
                  now_id->>'database', c.database_identity->>'database',
                  c.database_identity->>'databaseOid', now_id->>'databaseOid')
    -- Where the role may not read the system identifier, two fresh clusters can hand out
    -- the same database OID: tables that all have other OIDs than recorded, while their
    -- names are there, tell a restore.
    WHEN (c.database_identity->>'systemIdentifier' IS NULL OR now_id->>'systemIdentifier' IS NULL)
     AND EXISTS (SELECT 1 FROM @schema@.transforms t
                  WHERE to_regclass(format('%I.%I', t.target_schema, t.target_name)) IS NOT NULL)
     AND NOT EXISTS (SELECT 1 FROM @schema@.transforms t
                      JOIN pg_class k ON k.oid = t.target_oid AND k.relname = t.target_name)
      THEN format('the database %s was restored from a dump: no table Trellis made has the OID it recorded',
                  now_id->>'database')
    END
    FROM @schema@.config c, @schema@._database_identity() now_id
$fn$;

-- Run by the staging worker when it is elected: when the catalog is another database's,
-- rebinds every table by its recorded name, forgets the other database's transactions
-- (ledger, ticks, snapshots and transaction ids) and asks every transform for a rebuild,
-- under the lock apply() takes. Returns the reason, or NULL when there was nothing to do.
CREATE FUNCTION @schema@._recognise_restore()
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
  reason text := @schema@._restore_reason();
  tid int;
  map jsonb;
  ids int[];
  oids oid[];
BEGIN
  IF reason IS NULL THEN RETURN NULL; END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext(@schema_literal@));
  reason := @schema@._restore_reason();
  IF reason IS NULL THEN RETURN NULL; END IF;
  -- Tables by name: each recorded OID to the OID its recorded name has here. One the
  -- dump left out keeps its old OID: the halt checks then say it was dropped.
  SELECT coalesce(jsonb_object_agg(m.old::text, m.new::text), '{}') INTO map
    FROM (SELECT t.target_oid AS old, to_regclass(format('%I.%I', t.target_schema, t.target_name))::oid AS new
            FROM @schema@.transforms t
          UNION
          SELECT ts.source_oid, to_regclass(format('%I.%I', ts.source_schema, ts.source_name))::oid
            FROM @schema@.transform_sources ts) m
   WHERE m.new IS NOT NULL AND m.new <> m.old;
  UPDATE @schema@.transforms SET target_oid = (map->>target_oid::text)::oid, updated_at = now()
   WHERE map ? target_oid::text;
  UPDATE @schema@.transform_sources SET source_oid = (map->>source_oid::text)::oid
   WHERE map ? source_oid::text;
  -- Sources (unique by OID) through OIDs no table has first: two may trade theirs.
  SELECT array_agg(s.id), array_agg(coalesce((map->>s.source_oid::text)::oid, s.source_oid))
    INTO ids, oids FROM @schema@.sources s;
  UPDATE @schema@.sources SET source_oid = (4294967295 - id)::oid;
  UPDATE @schema@.sources s SET source_oid = m.new FROM unnest(ids, oids) AS m(id, new) WHERE m.id = s.id;
  -- Attribute numbers (a restored table has no dropped columns), partitions and children.
  FOR tid IN SELECT id FROM @schema@.transforms LOOP
    PERFORM @schema@._record_read_attrs(tid);
  END LOOP;
  DELETE FROM @schema@.corrections;
  DELETE FROM @schema@.source_members;
  UPDATE @schema@.sources SET members_at = NULL;
  -- The other database's transactions: their ids and snapshots mean nothing here.
  TRUNCATE @schema@.ledger;
  UPDATE @schema@.pipeline SET cursor_tick = NULL;
  DELETE FROM @schema@.ticks;
  UPDATE @schema@.sources SET ready_xmax = CASE WHEN ready_xmax IS NOT NULL THEN pg_snapshot_xmax(pg_current_snapshot()) END,
                              wal_xmax = CASE WHEN wal_xmax IS NOT NULL THEN pg_snapshot_xmax(pg_current_snapshot()) END,
                              widen_holders = NULL;
  -- WAL capture: the other database's slot is not this one's (slots are not dumped, and a
  -- slot's name carries its database's OID), and its publication, restored by the dump, is
  -- another row than the one recorded. Forget both: the decoder makes this database's slot,
  -- and the staging worker publishes each source again, as for a source newly moved to WAL
  -- capture. Nothing is lost: every target is rebuilt from a tick taken once capture is
  -- ready again.
  UPDATE @schema@.config SET wal_slot = NULL, wal_drain_lsn = NULL, wal_publication_xmin = NULL;
  UPDATE @schema@.sources
     SET wal_state = NULL, wal_xmax = NULL, wal_since = NULL, wal_rel_xmin = NULL
   WHERE wal_state IS NOT NULL;
  -- Every target is rebuilt from its sources as they are here.
  FOR tid IN SELECT id FROM @schema@.transforms LOOP
    PERFORM @schema@._request_rebuild(tid);
  END LOOP;
  UPDATE @schema@.config
     SET restored = jsonb_build_object('detectedAt', now(), 'reason', reason, 'from', database_identity),
         database_identity = @schema@._database_identity();
  RETURN reason;
END
$fn$;

-- The slot was lost: as 0019's, and nothing while the catalog is another database's (its
-- slot is that database's; _recognise_restore forgets it).
CREATE OR REPLACE FUNCTION @schema@._wal_lost(p_slot name, reason text)
RETURNS SETOF text LANGUAGE plpgsql AS $fn$
BEGIN
  -- A restored or cloned database's recorded slot is the other database's: not lost here,
  -- forgotten when the staging worker rebinds the catalog (_recognise_restore).
  IF @schema@._restore_reason() IS NOT NULL THEN
    RETURN;
  END IF;
  -- Once per slot: whoever sees it lost first (the decoder, the staging worker) acts.
  UPDATE @schema@.config SET wal_slot = NULL WHERE wal_slot = p_slot;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH lost AS (
    SELECT src.id, src.source_oid FROM @schema@.sources src
     WHERE src.wal_state = 'ready' AND src.installed_at IS NULL),
  reset AS (
    UPDATE @schema@.sources src
       SET wal_state = 'publishing', wal_xmax = NULL, wal_since = now()
     WHERE src.wal_state IS NOT NULL
    RETURNING src.id)
  UPDATE @schema@.transforms t
     SET paused_at = coalesce(t.paused_at, now()),
         pause_reason = CASE WHEN t.paused_at IS NULL THEN 'disruption' ELSE t.pause_reason END,
         capture_failure = jsonb_build_object('kind', 'disruption', 'error', reason,
                                              'columns', '[]'::jsonb, 'detected_at', now()),
         updated_at = now()
   WHERE t.capture_failure IS NULL
     AND t.id IN (SELECT ts.transform_id FROM @schema@.transform_sources ts
                   WHERE ts.source_oid IN (SELECT source_oid FROM lost))
  RETURNING t.target_name::text;
END
$fn$;

-- The capture setting: as 0019's, written only when it changes (ADR 0036).
CREATE OR REPLACE FUNCTION @schema@.set_capture(mode text, wal_retention_limit bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF mode IS NULL OR mode NOT IN ('trigger', 'logical') THEN
    PERFORM @schema@._fail('TRV01', format('capture must be ''trigger'' or ''logical'', not %L', mode));
  END IF;
  IF wal_retention_limit IS NOT NULL AND wal_retention_limit <= 0 THEN
    PERFORM @schema@._fail('TRV01', format('wal_retention_limit must be a positive number of bytes, not %s', wal_retention_limit));
  END IF;
  IF mode = 'logical' THEN
    PERFORM @schema@._check_logical_capture();
  END IF;
  -- Written only when it changes: a handle connecting to a read-only server (a standby, a
  -- read-only default) with the setting already recorded must not fail on the UPDATE,
  -- which Postgres refuses there even when it would change no row.
  IF EXISTS (SELECT 1 FROM @schema@.config c
              WHERE c.capture IS DISTINCT FROM mode
                 OR c.wal_retention_limit IS DISTINCT FROM coalesce(set_capture.wal_retention_limit, c.wal_retention_limit)) THEN
    UPDATE @schema@.config c
       SET capture = mode, wal_retention_limit = coalesce(set_capture.wal_retention_limit, c.wal_retention_limit)
     WHERE c.capture IS DISTINCT FROM mode
        OR c.wal_retention_limit IS DISTINCT FROM coalesce(set_capture.wal_retention_limit, c.wal_retention_limit);
  END IF;
END
$fn$;

-- awaitConverged: as 0015's, and never while the catalog is another database's.
CREATE OR REPLACE FUNCTION @schema@._converged(p_transform int, p_token pg_snapshot)
RETURNS boolean LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  cur pg_snapshot;
BEGIN
  SELECT k.snap INTO cur
    FROM @schema@.pipeline p
    JOIN @schema@.transforms t ON t.id = p.transform_id
    JOIN @schema@.ticks k ON k.seq = p.cursor_tick
   WHERE p.transform_id = p_transform AND t.paused_at IS NULL
     AND p.phase IN ('catching_up', 'live');
  -- 0029: nothing has converged in a database restored or cloned until it was rebuilt.
  IF cur IS NULL OR @schema@._restore_reason() IS NOT NULL THEN
    RETURN false;
  END IF;
  IF pg_snapshot_xmax(cur) >= pg_snapshot_xmax(p_token)
     AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(cur) x
                      WHERE x < pg_snapshot_xmax(p_token)
                        AND x NOT IN (SELECT pg_snapshot_xip(p_token))) THEN
    RETURN true;
  END IF;
  RETURN NOT EXISTS (
    SELECT 1 FROM @schema@.ledger l
     WHERE l.source_id IN (SELECT src.id FROM @schema@.transform_sources ts
                             JOIN @schema@.sources src ON src.source_oid = ts.source_oid
                            WHERE ts.transform_id = p_transform)
       AND l.xid >= pg_snapshot_xmin(cur)::text::bigint
       AND l.xid < pg_snapshot_xmax(p_token)::text::bigint
       AND pg_visible_in_snapshot(l.xid::text::xid8, p_token)
       AND NOT pg_visible_in_snapshot(l.xid::text::xid8, cur));
END
$fn$;

-- status(): 0026's, with a lifecycle 'unverified' while the catalog is another database's,
-- what it waits on then, and the field `restored`.
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
