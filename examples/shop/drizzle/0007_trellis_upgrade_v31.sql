-- Written by `trellis generate upgrade` (trellis-pg 0.2.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 26 to version 31.
-- Only the migrations after version 26, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 26 is refused with what to run.
DO $trellis_upgrade$
DECLARE
  newer int;
  boss_version int;
  installed int := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(1953654124, hashtext('trellis'));
  IF to_regclass('"trellis".migrations') IS NOT NULL THEN
    SELECT coalesce(max(version), 0) INTO installed FROM "trellis".migrations;
  END IF;
  IF installed < 26 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 26 to 31', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 26 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 31 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (31): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 27) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (27, 'capture_edges', false);
    EXECUTE $trellis_m27$-- Capture edges and definitions under load (issue #21 items 2, 8, 9 and 12).

-- Item 8: a statement deadlocking with the app's writers or the engine's workers (40P01),
-- or failing a serialization check (40001), is run again, up to 12 times with a jittered
-- backoff growing from 20 ms to half a second (a drain page the statement met ends within
-- it), inside the caller's transaction (each attempt is a subtransaction: the
-- losing attempt's locks are released, so the other side goes on). Postgres picks the
-- victim that waited first; retried, the statement goes through once the other side
-- committed. Exhausted, it fails with TRT01 (the handle's `transient`), never as an
-- uncoded database error.
CREATE FUNCTION "trellis"._apply_retrying(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  attempt int := 0;
  attempts constant int := 12;
  last_error text;
BEGIN
  LOOP
    attempt := attempt + 1;
    BEGIN
      RETURN "trellis"._apply(statement, transform_only);
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

CREATE OR REPLACE FUNCTION "trellis".apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT "trellis"._apply_retrying(statement, false)
$fn$;

CREATE OR REPLACE FUNCTION "trellis".define(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT "trellis"._apply_retrying(statement, true)
$fn$;

-- Item 2 (ADR 0039): a table a logical replication subscription writes. Postgres's apply
-- worker fires row-level triggers only (and only those enabled REPLICA or ALWAYS), never
-- the statement-level capture triggers: such a source also gets a row-level capture
-- trigger, ENABLE REPLICA (src/engine/capture/trigger-sql.ts). True when the table, or a
-- partition or inheritance child of it, is in some subscription of this database.
CREATE FUNCTION "trellis"._subscribed(rel oid)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid) AS (
    SELECT rel
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
  SELECT EXISTS (SELECT 1 FROM pg_subscription_rel sr WHERE sr.srrelid IN (SELECT relid FROM tree))
$fn$;

-- _capture_status as in 0020, with each source's `subscribed`.
CREATE OR REPLACE FUNCTION "trellis"._capture_status(p_transform_id bigint)
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
                              THEN "trellis"._wal_ineligible(ts.source_oid) END,
               'subscribed', "trellis"._subscribed(ts.source_oid))
             ORDER BY ts.ordinal)
        FROM "trellis".transform_sources ts
        LEFT JOIN "trellis".sources src ON src.source_oid = ts.source_oid
       WHERE ts.transform_id = p_transform_id), '[]'),
    'slot', CASE WHEN c.wal_slot IS NOT NULL THEN (
      SELECT jsonb_build_object(
               'name', c.wal_slot, 'limitBytes', c.wal_retention_limit,
               'retainedBytes', pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint,
               'confirmedLsn', rs.confirmed_flush_lsn::text)
        FROM (SELECT 1) one
        LEFT JOIN pg_replication_slots rs
               ON rs.slot_name = c.wal_slot AND rs.database = current_database()) END)
  FROM "trellis".config c
$fn$;

-- _capture_fingerprint as in 0019, with the subscriptions' rows for the sources: a table
-- becoming a subscription's target (or leaving one) brings a reconcile pass within a tick
-- check, as DDL on it does.
CREATE OR REPLACE FUNCTION "trellis"._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM "trellis".transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM "trellis".transforms),
  pub AS (SELECT p.oid, p.xmin FROM pg_publication p WHERE p.pubname = "trellis"._wal_publication())
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".config),
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
      WHERE n.nspname = 'trellis'),
    (SELECT count(*) || ':' || coalesce(sum(pub.xmin::text::bigint), 0) FROM pub),
    (SELECT count(*) || ':' || coalesce(sum(r.xmin::text::bigint), 0)
       FROM pg_publication_rel r WHERE r.prpubid IN (SELECT oid FROM pub)),
    (SELECT count(*) || ':' || coalesce(sum(sr.xmin::text::bigint), 0)
       FROM pg_subscription_rel sr WHERE sr.srrelid IN (SELECT oid FROM rel)))
$fn$;

-- _drop_stale_capture as in 0016, with the row-level capture functions (capture_<id>_row)
-- and their triggers.
CREATE OR REPLACE FUNCTION "trellis"._drop_stale_capture()
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT tg.tgname, tg.tgrelid::regclass::text AS rel
      FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
     WHERE NOT tg.tgisinternal AND tg.tgparentid = 0
       AND p.pronamespace = quote_ident('trellis')::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate|row)$'
       AND NOT EXISTS (SELECT 1 FROM "trellis".sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure::text AS fn
      FROM pg_proc p
     WHERE p.pronamespace = quote_ident('trellis')::regnamespace
       AND p.proname ~ '^capture_[0-9]+_(insert|update|delete|truncate|row)$'
       AND NOT EXISTS (SELECT 1 FROM "trellis".sources s
                        WHERE s.id = substring(p.proname FROM '^capture_([0-9]+)_')::int)
  LOOP
    EXECUTE 'DROP FUNCTION ' || r.fn;
  END LOOP;
END
$fn$;

-- Item 12 (ADR 0040): status(target) as in 0026, with backfill.keysHeld: the keys held so
-- far (a build that meets failing rows holds them, in steps that commit as they go).
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
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
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
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
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
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
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
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
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0027: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                      upstream_behind OR jsonb_array_length(paused_upstream) > 0));
END
$fn$;
$trellis_m27$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 28) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (28, 'view_sql', false);
    EXECUTE $trellis_m28$-- A view's SQL as Postgres writes it (issue #26, item 1, first slice; ADR 0049):
--
--   TRANSFORM name AS SELECT [ALL | DISTINCT] item {, item}
--     FROM table [[AS] alias] {[INNER | LEFT [OUTER]] JOIN table [[AS] alias] ON condition}
--     [WHERE condition] [GROUP BY expression {, expression}] [HAVING condition]
--     [ORDER BY ...]  (accepted and dropped: a target is a table, it has no order)
--     [WITHOUT SOURCE INDEX] [WITHOUT ROW SECURITY]
--
-- parses into the AST of the FROM-first form (0003, 0024), marked "form": "as" (and
-- "distinct": true), so it is analysed and maintained exactly as that form is. SELECT
-- DISTINCT is a GROUP BY of every item. What the engine cannot maintain yet is refused
-- with a validation error (TRV01) naming the construct: the structure of the SELECT (WITH,
-- set operations, derived tables, LATERAL, functions in FROM, RIGHT, FULL, CROSS and
-- NATURAL joins, USING, DISTINCT ON, LIMIT ...) by the parser here; subqueries, window
-- functions and set-returning functions in expressions by Postgres's own parse of the
-- statement (the query tree of a temporary view, as _analyze_query reads it).
--
-- parse_statement, render_statement and _analyze_transform keep their earlier bodies
-- (whichever migration wrote them last) under new names, and the new functions of those
-- names handle the AS form and hand every other statement to them.

ALTER FUNCTION "trellis".parse_statement(text) RENAME TO grammar_parse_from_first;
ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO grammar_render_from_first;
ALTER FUNCTION "trellis"._analyze_transform(jsonb) RENAME TO _analyze_from_first;

-- Refuses a construct of a view's SQL: a validation error, not a grammar one (the
-- statement is SQL Postgres reads; the engine cannot maintain it), with where it starts.
CREATE FUNCTION "trellis".grammar_refuse(message text, pos int) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  RAISE EXCEPTION USING
    ERRCODE = 'TRV01',
    MESSAGE = format('%s (at character %s)', message, pos),
    DETAIL = jsonb_build_object('position', pos)::text;
END
$fn$;

-- Refuses token i of a view's SQL when it starts a clause a SELECT may have and a
-- transform may not (yet); returns otherwise.
CREATE FUNCTION "trellis".grammar_view_clause(toks "trellis".grammar_token[], i int) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token := toks[i];
  nx "trellis".grammar_token := toks[i + 1];
BEGIN
  IF t.kind <> 'word' THEN
    RETURN;
  END IF;
  IF t.value IN ('union', 'intersect', 'except') THEN
    PERFORM "trellis".grammar_refuse(format('%s is not supported yet',
      upper(t.value) || CASE WHEN "trellis".grammar_kw(nx, 'all') THEN ' ALL' ELSE '' END), t.pos);
  ELSIF t.value IN ('limit', 'offset', 'fetch') THEN
    PERFORM "trellis".grammar_refuse(format(
      '%s is not supported: a target is a table, it holds every row of its definition (top-N is not supported yet)',
      upper(t.value)), t.pos);
  ELSIF t.value = 'window' THEN
    PERFORM "trellis".grammar_refuse('a WINDOW clause (window functions) is not supported yet', t.pos);
  ELSIF t.value = 'for' AND nx.kind = 'word' AND nx.value IN ('update', 'share', 'no', 'key') THEN
    PERFORM "trellis".grammar_refuse('a locking clause (FOR UPDATE, FOR SHARE) is not supported', t.pos);
  END IF;
END
$fn$;

-- A table of a view's FROM clause at token i: (schema_name, rel_name, alias, next token).
-- Refuses what FROM may hold besides a table: a subquery, LATERAL, a function.
CREATE FUNCTION "trellis".grammar_view_table(
  toks "trellis".grammar_token[], i int, what text,
  OUT schema_name text, OUT rel_name text, OUT alias text, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF "trellis".grammar_kw(toks[i], 'lateral') THEN
    PERFORM "trellis".grammar_refuse('LATERAL is not supported yet', toks[i].pos);
  END IF;
  IF toks[i].kind = 'punct' AND toks[i].text = '(' THEN
    PERFORM "trellis".grammar_refuse(CASE
      WHEN "trellis".grammar_kw(toks[i + 1], 'select') OR "trellis".grammar_kw(toks[i + 1], 'with')
        OR "trellis".grammar_kw(toks[i + 1], 'values')
      THEN 'a subquery in FROM is not supported yet'
      ELSE 'a parenthesised join in FROM is not supported yet' END, toks[i].pos);
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO schema_name, rel_name, next
    FROM "trellis".grammar_qualified(toks, i, what) q;
  IF toks[next].kind = 'punct' AND toks[next].text = '(' THEN
    PERFORM "trellis".grammar_refuse(format(
      'a set-returning function in FROM (%s) is not supported yet', rel_name), toks[i].pos);
  END IF;
  SELECT q.alias, q.next INTO alias, next FROM "trellis".grammar_alias(toks, next) q;
  IF alias IS NOT NULL AND toks[next].kind = 'punct' AND toks[next].text = '(' THEN
    PERFORM "trellis".grammar_refuse('column aliases after a table alias are not supported yet',
      toks[next].pos);
  END IF;
END
$fn$;

-- TRANSFORM target AS <the SELECT>, from token i (the token after AS).
CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token := toks[i];
  e int;
  start int;
  sch text;
  nm text;
  alias text;
  jt text;
  expected text;
  from_ jsonb;
  joins jsonb := '[]';
  items jsonb := '[]';
  group_by jsonb := '[]';
  where_ text;
  having_ text;
  distinct_ boolean := false;
  wsi boolean := false;
  wrs boolean := false;
  label text;
  label_expr text;
  last "trellis".grammar_token;
  before "trellis".grammar_token;
BEGIN
  IF "trellis".grammar_kw(t, 'with') THEN
    PERFORM "trellis".grammar_refuse(CASE WHEN "trellis".grammar_kw(toks[i + 1], 'recursive')
      THEN 'a recursive WITH clause (WITH RECURSIVE) is not supported'
      ELSE 'a WITH clause (common table expressions) is not supported yet' END, t.pos);
  ELSIF t.kind = 'punct' AND t.text = '(' THEN
    PERFORM "trellis".grammar_refuse(
      'a SELECT in parentheses is not supported yet: write it without them', t.pos);
  ELSIF "trellis".grammar_kw(t, 'values') OR "trellis".grammar_kw(t, 'table') THEN
    PERFORM "trellis".grammar_refuse(format('%s is not supported: write a SELECT', upper(t.value)),
      t.pos);
  ELSIF NOT "trellis".grammar_kw(t, 'select') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'SELECT after AS');
  END IF;
  i := i + 1;
  IF "trellis".grammar_kw(toks[i], 'distinct') THEN
    IF "trellis".grammar_kw(toks[i + 1], 'on') THEN
      PERFORM "trellis".grammar_refuse('DISTINCT ON is not supported yet', toks[i].pos);
    END IF;
    distinct_ := true;
    i := i + 1;
  ELSIF "trellis".grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  -- The SELECT list, as in the FROM-first form (0024).
  LOOP
    start := i;
    e := "trellis".grammar_scan(toks, i);
    IF e = start THEN
      PERFORM "trellis".grammar_view_clause(toks, e);
      PERFORM "trellis".grammar_unexpected(toks, e, 'a select item');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM "trellis".grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        "trellis".grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF "trellis".grammar_kw(toks[e], 'as') THEN
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND "trellis".grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := "trellis".grammar_name(last, 'a column name', false);
          label_expr := "trellis".grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', "trellis".grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;

  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_view_clause(toks, i);
    PERFORM "trellis".grammar_unexpected(toks, i, '",", or FROM and the tables');
  END IF;
  SELECT q.schema_name, q.rel_name, q.alias, q.next INTO sch, nm, alias, i
    FROM "trellis".grammar_view_table(toks, i + 1, 'a source table name') q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF t.kind = 'punct' AND t.text = ',' THEN
      PERFORM "trellis".grammar_refuse(
        'a comma-separated FROM list (FROM a, b) is not supported yet: write JOIN ... ON', t.pos);
    ELSIF t.kind = 'word' AND t.value IN ('right', 'full')
      AND ("trellis".grammar_kw(toks[i + 1], 'join') OR "trellis".grammar_kw(toks[i + 1], 'outer')) THEN
      PERFORM "trellis".grammar_refuse(format('a %s JOIN is not supported yet', upper(t.value)), t.pos);
    ELSIF "trellis".grammar_kw(t, 'cross') AND "trellis".grammar_kw(toks[i + 1], 'join') THEN
      PERFORM "trellis".grammar_refuse('CROSS JOIN is not supported yet', t.pos);
    ELSIF "trellis".grammar_kw(t, 'natural') THEN
      PERFORM "trellis".grammar_refuse('NATURAL JOIN is not supported yet: write JOIN ... ON', t.pos);
    ELSIF "trellis".grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF "trellis".grammar_kw(t, 'inner') THEN
      IF NOT "trellis".grammar_kw(toks[i + 1], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF "trellis".grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    SELECT q.schema_name, q.rel_name, q.alias, q.next INTO sch, nm, alias, i
      FROM "trellis".grammar_view_table(toks, i, 'a table name after JOIN') q;
    IF "trellis".grammar_kw(toks[i], 'using') THEN
      PERFORM "trellis".grammar_refuse('JOIN ... USING is not supported yet: write ON', toks[i].pos);
    END IF;
    IF NOT "trellis".grammar_kw(toks[i], 'on') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'ON and a join condition');
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', "trellis".grammar_text(toks, i, e)));
    i := e;
  END LOOP;
  expected := 'JOIN, WHERE, GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF "trellis".grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'group') AND "trellis".grammar_kw(toks[i + 1], 'by') THEN
    IF distinct_ THEN
      PERFORM "trellis".grammar_refuse('SELECT DISTINCT with GROUP BY is not supported yet', toks[i].pos);
    END IF;
    i := i + 2;
    IF "trellis".grammar_kw(toks[i], 'all') THEN
      PERFORM "trellis".grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF "trellis".grammar_kw(toks[i], 'distinct') THEN
      PERFORM "trellis".grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF (("trellis".grammar_kw(toks[i], 'rollup') OR "trellis".grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR ("trellis".grammar_kw(toks[i], 'grouping') AND "trellis".grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM "trellis".grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          "trellis".grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array("trellis".grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'having') THEN
    IF distinct_ THEN
      PERFORM "trellis".grammar_refuse('SELECT DISTINCT with HAVING is not supported yet', toks[i].pos);
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- A set operation or a WINDOW clause here is refused by name before ORDER BY is read.
  PERFORM "trellis".grammar_view_clause(toks, i);

  -- ORDER BY: read, and dropped (a table has no order; ADR 0049). Its expressions are not
  -- checked: they never run.
  IF "trellis".grammar_kw(toks[i], 'order') AND "trellis".grammar_kw(toks[i + 1], 'by') THEN
    i := i + 2;
    LOOP
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'an ORDER BY expression');
      END IF;
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  PERFORM "trellis".grammar_view_clause(toks, i);

  -- WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY, each at most once, in either order.
  WHILE "trellis".grammar_kw(toks[i], 'without') LOOP
    IF "trellis".grammar_kw(toks[i + 1], 'source') AND NOT wsi THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
      END IF;
      wsi := true;
    ELSIF "trellis".grammar_kw(toks[i + 1], 'row') AND NOT wrs THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'security') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SECURITY after WITHOUT ROW');
      END IF;
      wrs := true;
    ELSE
      PERFORM "trellis".grammar_unexpected(toks, i + 1, CASE
        WHEN wsi THEN 'ROW SECURITY after WITHOUT' WHEN wrs THEN 'SOURCE INDEX after WITHOUT'
        ELSE 'SOURCE INDEX or ROW SECURITY after WITHOUT' END);
    END IF;
    i := i + 3;
    expected := CASE WHEN wsi AND wrs THEN 'end of statement'
      WHEN wsi THEN 'WITHOUT ROW SECURITY or end of statement'
      ELSE 'WITHOUT SOURCE INDEX or end of statement' END;
  END LOOP;

  PERFORM "trellis".grammar_end(toks, i, expected);
  RETURN jsonb_build_object(
    'kind', 'transform', 'form', 'as', 'target', target, 'from', from_, 'joins', joins,
    'select', items, 'where', where_, 'group_by', group_by, 'having', having_,
    'without_source_index', wsi)
    || CASE WHEN distinct_ THEN jsonb_build_object('distinct', true) ELSE '{}' END
    || CASE WHEN wrs THEN jsonb_build_object('without_row_security', true) ELSE '{}' END;
END
$fn$;

-- One statement -> its AST (see 0003): TRANSFORM name AS <select> here, and SELECT
-- DISTINCT in the FROM-first form (read by the FROM-first parser with DISTINCT blanked
-- out, so every position it reports stays where it was); every other statement as
-- before. A TRANSFORM with neither FROM nor AS after its name is told both.
CREATE FUNCTION "trellis".parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[];
  sch text;
  nm text;
  i int;
  d int := 0;
  sel int;
  ast jsonb;
BEGIN
  toks := "trellis".grammar_tokenize(statement);
  IF NOT "trellis".grammar_kw(toks[1], 'transform') THEN
    RETURN "trellis".grammar_parse_from_first(statement);
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, 2, 'a transform name') q;
  IF "trellis".grammar_kw(toks[i], 'as') THEN
    RETURN "trellis".grammar_parse_view(toks, i + 1, jsonb_build_object('schema', sch, 'name', nm));
  END IF;
  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'FROM or AS');
  END IF;
  -- The SELECT keyword: the first SELECT outside brackets (no expression before it holds one).
  WHILE toks[i].kind <> 'eof' LOOP
    IF toks[i].kind = 'punct' AND toks[i].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[i].kind = 'punct' AND toks[i].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND "trellis".grammar_kw(toks[i], 'select') THEN
      sel := i;
      EXIT;
    END IF;
    i := i + 1;
  END LOOP;
  IF sel IS NULL OR NOT "trellis".grammar_kw(toks[sel + 1], 'distinct') THEN
    RETURN "trellis".grammar_parse_from_first(statement);
  END IF;
  IF "trellis".grammar_kw(toks[sel + 2], 'on') THEN
    PERFORM "trellis".grammar_refuse('DISTINCT ON is not supported yet', toks[sel + 1].pos);
  END IF;
  ast := "trellis".grammar_parse_from_first(overlay(statement
    PLACING repeat(' ', length(toks[sel + 1].text)) FROM toks[sel + 1].pos FOR length(toks[sel + 1].text)));
  IF jsonb_array_length(ast -> 'group_by') > 0 OR ast ->> 'having' IS NOT NULL THEN
    PERFORM "trellis".grammar_refuse(format('SELECT DISTINCT with %s is not supported yet',
      CASE WHEN jsonb_array_length(ast -> 'group_by') > 0 THEN 'GROUP BY' ELSE 'HAVING' END),
      toks[sel + 1].pos);
  END IF;
  RETURN ast || jsonb_build_object('distinct', true);
END
$fn$;

-- An AST -> the normalised statement text: the AS form as it was written (without its
-- ORDER BY), SELECT DISTINCT in either form, every other statement as before.
CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  is_distinct boolean := coalesce((ast ->> 'distinct')::boolean, false);
  target text;
  select_ text;
  from_ text;
  rest text;
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform'
     OR (ast ->> 'form' IS DISTINCT FROM 'as' AND NOT is_distinct) THEN
    RETURN "trellis".grammar_render_from_first(ast);
  END IF;
  target := "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name');
  select_ := 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
    SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
      ', ' ORDER BY ordinality)
    FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY);
  from_ := 'FROM '
    || "trellis".grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
    || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '')
    || coalesce((
      SELECT string_agg(
               CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
               || "trellis".grammar_render_name(j ->> 'schema', j ->> 'name')
               || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
               || ' ON ' || (j ->> 'on'), '' ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '');
  rest := coalesce(' WHERE ' || (ast ->> 'where'), '')
    -- SELECT DISTINCT's GROUP BY is the engine's (filled in by _analyze_transform).
    || CASE WHEN is_distinct THEN '' ELSE coalesce(' GROUP BY ' || (
         SELECT string_agg(value, ', ' ORDER BY ordinality)
           FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '') END
    || coalesce(' HAVING ' || (ast ->> 'having'), '')
    || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  RETURN 'TRANSFORM ' || target || CASE WHEN ast ->> 'form' = 'as'
    THEN ' AS ' || select_ || ' ' || from_ ELSE ' ' || from_ || ' ' || select_ END || rest;
END
$fn$;

-- The FROM clause of a view's AST as it was written (names resolved by search_path).
CREATE FUNCTION "trellis"._view_from_sql(ast jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT "trellis".grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
    || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '')
    || coalesce((
      SELECT string_agg(
               CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
               || "trellis".grammar_render_name(j ->> 'schema', j ->> 'name')
               || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
               || ' ON (' || (j ->> 'on') || ')', '' ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '')
$fn$;

-- What Postgres makes of a query (_analyze_query), or NULL when it refuses it: the
-- analysis that follows says why, part by part.
CREATE FUNCTION "trellis"._view_parse(query text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  RETURN "trellis"._analyze_query(query, 'in the definition');
EXCEPTION WHEN SQLSTATE 'TRV01' THEN
  RETURN NULL;
END
$fn$;

-- Refuses, as Postgres's parse of the whole SELECT finds it (the flags of its query tree):
-- SELECT DISTINCT over aggregates (either form); and what a view's SQL may hold in its
-- expressions and the engine cannot maintain yet: subqueries (EXISTS, IN (SELECT ...),
-- scalar subqueries), naming the clause they are in; window functions; set-returning
-- functions in the SELECT list.
CREATE FUNCTION "trellis"._refuse_view_sql(ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := "trellis"._view_from_sql(ast);
  grouping text := coalesce(' GROUP BY ' || (
    SELECT string_agg(g, ', ' ORDER BY o)
      FROM jsonb_array_elements_text(ast -> 'group_by') WITH ORDINALITY AS x(g, o)), '');
  info jsonb;
  clause text;
BEGIN
  info := "trellis"._view_parse('SELECT '
    || (SELECT string_agg((i ->> 'expr') || coalesce(' AS ' || quote_ident(i ->> 'name'), ''), ', ' ORDER BY o)
          FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY AS x(i, o))
    || ' FROM ' || from_sql
    || coalesce(' WHERE (' || (ast ->> 'where') || ')', '')
    || grouping
    || coalesce(' HAVING (' || (ast ->> 'having') || ')', ''));
  IF info IS NULL THEN
    RETURN;
  END IF;
  IF coalesce((ast ->> 'distinct')::boolean, false) AND (info ->> 'has_aggs')::boolean THEN
    PERFORM "trellis"._fail('TRV01', 'SELECT DISTINCT over aggregates is not supported yet');
  END IF;
  -- The FROM-first form keeps its own rules for what follows (0005).
  IF ast ->> 'form' IS DISTINCT FROM 'as' THEN
    RETURN;
  END IF;
  IF (info ->> 'has_sublinks')::boolean THEN
    clause := CASE
      WHEN ("trellis"._view_parse('SELECT 1 FROM ' || from_sql) ->> 'has_sublinks')::boolean
        THEN 'a join condition (ON)'
      WHEN ast ->> 'where' IS NOT NULL AND ("trellis"._view_parse(
          'SELECT 1 FROM ' || from_sql || ' WHERE (' || (ast ->> 'where') || ')') ->> 'has_sublinks')::boolean
        THEN 'WHERE'
      WHEN grouping <> '' AND ("trellis"._view_parse(
          'SELECT 1 FROM ' || from_sql || grouping) ->> 'has_sublinks')::boolean
        THEN 'GROUP BY'
      WHEN ast ->> 'having' IS NOT NULL AND ("trellis"._view_parse(
          'SELECT 1 FROM ' || from_sql || coalesce(nullif(grouping, ''), ' GROUP BY ()')
          || ' HAVING (' || (ast ->> 'having') || ')') ->> 'has_sublinks')::boolean
        THEN 'HAVING'
      ELSE 'the SELECT list' END;
    PERFORM "trellis"._fail('TRV01', format('a subquery in %s is not supported yet', clause));
  END IF;
  IF (info ->> 'has_window')::boolean THEN
    PERFORM "trellis"._fail('TRV01', 'a window function (OVER) is not supported yet');
  END IF;
  IF (info ->> 'has_srf')::boolean THEN
    PERFORM "trellis"._fail('TRV01', 'a set-returning function in the SELECT list is not supported yet');
  END IF;
END
$fn$;

-- SELECT DISTINCT's GROUP BY: every item's expression (without its label: a bare label
-- is one where Postgres reads it so, as _analyze_transform decides it).
CREATE FUNCTION "trellis"._distinct_groups(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := "trellis"._view_from_sql(ast);
  item jsonb;
  k int := 0;
  expr text;
  info jsonb;
  groups jsonb := '[]';
BEGIN
  FOR item IN SELECT value FROM jsonb_array_elements(ast -> 'select') LOOP
    k := k + 1;
    expr := item ->> 'expr';
    IF item ->> 'name' IS NULL AND item ->> 'bare_label' IS NOT NULL THEN
      info := "trellis"._analyze_query('SELECT ' || expr || ' FROM ' || from_sql,
        format('in SELECT item %s (%s)', k, expr));
      IF info -> 'columns' -> 0 ->> 'name' = item ->> 'bare_label' THEN
        expr := item ->> 'label_expr';
      END IF;
    END IF;
    groups := groups || to_jsonb(expr);
  END LOOP;
  RETURN groups;
END
$fn$;

-- _analyze_transform (0005, and whichever migration replaced it since, now
-- _analyze_from_first) for every form: a view's SQL (and SELECT DISTINCT) is first checked
-- for what it may not hold, and SELECT DISTINCT becomes the GROUP BY of its items.
CREATE FUNCTION "trellis"._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ->> 'form' = 'as' OR coalesce((ast ->> 'distinct')::boolean, false) THEN
    PERFORM "trellis"._refuse_view_sql(ast);
  END IF;
  -- A statement as parsed has no GROUP BY with its DISTINCT; a stored one has its items'
  -- (RESUME, ALTER): an item more or less there is a column added or dropped.
  IF coalesce((ast ->> 'distinct')::boolean, false) THEN
    IF jsonb_array_length(ast -> 'group_by') = 0 THEN
      ast := jsonb_set(ast, '{group_by}', "trellis"._distinct_groups(ast));
    ELSIF jsonb_array_length(ast -> 'group_by') <> jsonb_array_length(ast -> 'select') THEN
      PERFORM "trellis"._fail('TRV01', format(
        'transform %I is a SELECT DISTINCT, keyed by every column: adding or dropping one would change its key. DROP TRANSFORM it and define it again',
        ast -> 'target' ->> 'name'));
    END IF;
  END IF;
  RETURN "trellis"._analyze_from_first(ast);
END
$fn$;
$trellis_m28$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 29) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (29, 'restores_and_upgrades', false);
    EXECUTE $trellis_m29$-- Upgrades and restores (issue #21 items 3 and 4; ADR 0035, ADR 0036).

-- Item 4: migration 0012 added sources.capture_digest and left it NULL for the tables
-- captured already; the staging worker then took every one of them for capture replaced
-- outside Trellis and paused its readers. The digest of the functions as they are now is
-- recorded for those (the staging worker does the same for a source captured by an older
-- trellis-pg still running against this schema).
UPDATE "trellis".sources SET capture_digest = "trellis"._capture_digest(id)
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
CREATE FUNCTION "trellis"._database_identity()
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
ALTER TABLE "trellis".config ADD COLUMN database_identity jsonb DEFAULT "trellis"._database_identity();
-- The last restore recognised: {detectedAt, reason, from}.
ALTER TABLE "trellis".config ADD COLUMN restored jsonb;

-- Why the catalog is not this database's (a sentence), or NULL when it is.
CREATE FUNCTION "trellis"._restore_reason()
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
     AND EXISTS (SELECT 1 FROM "trellis".transforms t
                  WHERE to_regclass(format('%I.%I', t.target_schema, t.target_name)) IS NOT NULL)
     AND NOT EXISTS (SELECT 1 FROM "trellis".transforms t
                      JOIN pg_class k ON k.oid = t.target_oid AND k.relname = t.target_name)
      THEN format('the database %s was restored from a dump: no table Trellis made has the OID it recorded',
                  now_id->>'database')
    END
    FROM "trellis".config c, "trellis"._database_identity() now_id
$fn$;

-- Run by the staging worker when it is elected: when the catalog is another database's,
-- rebinds every table by its recorded name, forgets the other database's transactions
-- (ledger, ticks, snapshots and transaction ids) and asks every transform for a rebuild,
-- under the lock apply() takes. Returns the reason, or NULL when there was nothing to do.
CREATE FUNCTION "trellis"._recognise_restore()
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
  reason text := "trellis"._restore_reason();
  tid int;
  map jsonb;
  ids int[];
  oids oid[];
BEGIN
  IF reason IS NULL THEN RETURN NULL; END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext('trellis'));
  reason := "trellis"._restore_reason();
  IF reason IS NULL THEN RETURN NULL; END IF;
  -- Tables by name: each recorded OID to the OID its recorded name has here. One the
  -- dump left out keeps its old OID: the halt checks then say it was dropped.
  SELECT coalesce(jsonb_object_agg(m.old::text, m.new::text), '{}') INTO map
    FROM (SELECT t.target_oid AS old, to_regclass(format('%I.%I', t.target_schema, t.target_name))::oid AS new
            FROM "trellis".transforms t
          UNION
          SELECT ts.source_oid, to_regclass(format('%I.%I', ts.source_schema, ts.source_name))::oid
            FROM "trellis".transform_sources ts) m
   WHERE m.new IS NOT NULL AND m.new <> m.old;
  UPDATE "trellis".transforms SET target_oid = (map->>target_oid::text)::oid, updated_at = now()
   WHERE map ? target_oid::text;
  UPDATE "trellis".transform_sources SET source_oid = (map->>source_oid::text)::oid
   WHERE map ? source_oid::text;
  -- Sources (unique by OID) through OIDs no table has first: two may trade theirs.
  SELECT array_agg(s.id), array_agg(coalesce((map->>s.source_oid::text)::oid, s.source_oid))
    INTO ids, oids FROM "trellis".sources s;
  UPDATE "trellis".sources SET source_oid = (4294967295 - id)::oid;
  UPDATE "trellis".sources s SET source_oid = m.new FROM unnest(ids, oids) AS m(id, new) WHERE m.id = s.id;
  -- Attribute numbers (a restored table has no dropped columns), partitions and children.
  FOR tid IN SELECT id FROM "trellis".transforms LOOP
    PERFORM "trellis"._record_read_attrs(tid);
  END LOOP;
  DELETE FROM "trellis".corrections;
  DELETE FROM "trellis".source_members;
  UPDATE "trellis".sources SET members_at = NULL;
  -- The other database's transactions: their ids and snapshots mean nothing here.
  TRUNCATE "trellis".ledger;
  UPDATE "trellis".pipeline SET cursor_tick = NULL;
  DELETE FROM "trellis".ticks;
  UPDATE "trellis".sources SET ready_xmax = CASE WHEN ready_xmax IS NOT NULL THEN pg_snapshot_xmax(pg_current_snapshot()) END,
                              wal_xmax = CASE WHEN wal_xmax IS NOT NULL THEN pg_snapshot_xmax(pg_current_snapshot()) END,
                              widen_holders = NULL;
  -- WAL capture: the other database's slot is not this one's (slots are not dumped, and a
  -- slot's name carries its database's OID), and its publication, restored by the dump, is
  -- another row than the one recorded. Forget both: the decoder makes this database's slot,
  -- and the staging worker publishes each source again, as for a source newly moved to WAL
  -- capture. Nothing is lost: every target is rebuilt from a tick taken once capture is
  -- ready again.
  UPDATE "trellis".config SET wal_slot = NULL, wal_drain_lsn = NULL, wal_publication_xmin = NULL;
  UPDATE "trellis".sources
     SET wal_state = NULL, wal_xmax = NULL, wal_since = NULL, wal_rel_xmin = NULL
   WHERE wal_state IS NOT NULL;
  -- Every target is rebuilt from its sources as they are here.
  FOR tid IN SELECT id FROM "trellis".transforms LOOP
    PERFORM "trellis"._request_rebuild(tid);
  END LOOP;
  UPDATE "trellis".config
     SET restored = jsonb_build_object('detectedAt', now(), 'reason', reason, 'from', database_identity),
         database_identity = "trellis"._database_identity();
  RETURN reason;
END
$fn$;

-- The slot was lost: as 0019's, and nothing while the catalog is another database's (its
-- slot is that database's; _recognise_restore forgets it).
CREATE OR REPLACE FUNCTION "trellis"._wal_lost(p_slot name, reason text)
RETURNS SETOF text LANGUAGE plpgsql AS $fn$
BEGIN
  -- A restored or cloned database's recorded slot is the other database's: not lost here,
  -- forgotten when the staging worker rebinds the catalog (_recognise_restore).
  IF "trellis"._restore_reason() IS NOT NULL THEN
    RETURN;
  END IF;
  -- Once per slot: whoever sees it lost first (the decoder, the staging worker) acts.
  UPDATE "trellis".config SET wal_slot = NULL WHERE wal_slot = p_slot;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH lost AS (
    SELECT src.id, src.source_oid FROM "trellis".sources src
     WHERE src.wal_state = 'ready' AND src.installed_at IS NULL),
  reset AS (
    UPDATE "trellis".sources src
       SET wal_state = 'publishing', wal_xmax = NULL, wal_since = now()
     WHERE src.wal_state IS NOT NULL
    RETURNING src.id)
  UPDATE "trellis".transforms t
     SET paused_at = coalesce(t.paused_at, now()),
         pause_reason = CASE WHEN t.paused_at IS NULL THEN 'disruption' ELSE t.pause_reason END,
         capture_failure = jsonb_build_object('kind', 'disruption', 'error', reason,
                                              'columns', '[]'::jsonb, 'detected_at', now()),
         updated_at = now()
   WHERE t.capture_failure IS NULL
     AND t.id IN (SELECT ts.transform_id FROM "trellis".transform_sources ts
                   WHERE ts.source_oid IN (SELECT source_oid FROM lost))
  RETURNING t.target_name::text;
END
$fn$;

-- The capture setting: as 0019's, written only when it changes (ADR 0036).
CREATE OR REPLACE FUNCTION "trellis".set_capture(mode text, wal_retention_limit bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF mode IS NULL OR mode NOT IN ('trigger', 'logical') THEN
    PERFORM "trellis"._fail('TRV01', format('capture must be ''trigger'' or ''logical'', not %L', mode));
  END IF;
  IF wal_retention_limit IS NOT NULL AND wal_retention_limit <= 0 THEN
    PERFORM "trellis"._fail('TRV01', format('wal_retention_limit must be a positive number of bytes, not %s', wal_retention_limit));
  END IF;
  IF mode = 'logical' THEN
    PERFORM "trellis"._check_logical_capture();
  END IF;
  -- Written only when it changes: a handle connecting to a read-only server (a standby, a
  -- read-only default) with the setting already recorded must not fail on the UPDATE,
  -- which Postgres refuses there even when it would change no row.
  IF EXISTS (SELECT 1 FROM "trellis".config c
              WHERE c.capture IS DISTINCT FROM mode
                 OR c.wal_retention_limit IS DISTINCT FROM coalesce(set_capture.wal_retention_limit, c.wal_retention_limit)) THEN
    UPDATE "trellis".config c
       SET capture = mode, wal_retention_limit = coalesce(set_capture.wal_retention_limit, c.wal_retention_limit)
     WHERE c.capture IS DISTINCT FROM mode
        OR c.wal_retention_limit IS DISTINCT FROM coalesce(set_capture.wal_retention_limit, c.wal_retention_limit);
  END IF;
END
$fn$;

-- awaitConverged: as 0015's, and never while the catalog is another database's.
CREATE OR REPLACE FUNCTION "trellis"._converged(p_transform int, p_token pg_snapshot)
RETURNS boolean LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  cur pg_snapshot;
BEGIN
  SELECT k.snap INTO cur
    FROM "trellis".pipeline p
    JOIN "trellis".transforms t ON t.id = p.transform_id
    JOIN "trellis".ticks k ON k.seq = p.cursor_tick
   WHERE p.transform_id = p_transform AND t.paused_at IS NULL
     AND p.phase IN ('catching_up', 'live');
  -- 0029: nothing has converged in a database restored or cloned until it was rebuilt.
  IF cur IS NULL OR "trellis"._restore_reason() IS NOT NULL THEN
    RETURN false;
  END IF;
  IF pg_snapshot_xmax(cur) >= pg_snapshot_xmax(p_token)
     AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(cur) x
                      WHERE x < pg_snapshot_xmax(p_token)
                        AND x NOT IN (SELECT pg_snapshot_xip(p_token))) THEN
    RETURN true;
  END IF;
  RETURN NOT EXISTS (
    SELECT 1 FROM "trellis".ledger l
     WHERE l.source_id IN (SELECT src.id FROM "trellis".transform_sources ts
                             JOIN "trellis".sources src ON src.source_oid = ts.source_oid
                            WHERE ts.transform_id = p_transform)
       AND l.xid >= pg_snapshot_xmin(cur)::text::bigint
       AND l.xid < pg_snapshot_xmax(p_token)::text::bigint
       AND pg_visible_in_snapshot(l.xid::text::xid8, p_token)
       AND NOT pg_visible_in_snapshot(l.xid::text::xid8, cur));
END
$fn$;

-- status(): 0026's, with a lifecycle 'unverified' while the catalog is another database's,
-- what it waits on then, and the field `restored`.
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := "trellis"._restore_reason();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
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
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
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
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
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
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
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
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM "trellis".config c WHERE c.restored IS NOT NULL) END);
END
$fn$;
$trellis_m29$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 30) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (30, 'follow_source_changes', false);
    EXECUTE $trellis_m30$-- Source changes that keep a definition valid are followed, not stopped (issue #25 item 2,
-- ADR 0047): a read column renamed (key columns included) or retyped to a type the
-- definition still accepts. The staging worker rebinds the definition to the table as it
-- is (_follow_source_columns, on its reconcile pass, before it stops what cannot be
-- followed), adjusts the target's columns in place (ALTER TABLE: a type, or the name of a
-- key column the engine named after the source's), and then re-derives the whole target in
-- one transaction (src/engine/staging/follow-refill.ts). Meanwhile the drain leaves the
-- transform alone (follow_pending): the ranges it would read may hold "any row changed"
-- rows capture wrote while its triggers named the old column, which the re-derivation
-- covers.

-- Set by _follow_source_columns, cleared once the target is re-derived.
ALTER TABLE "trellis".pipeline ADD COLUMN follow_pending boolean NOT NULL DEFAULT false;

-- `expr` with every reference to column `old_name` of the source aliased `alias` written
-- as `new_name`: an unqualified name, or one qualified by that alias; not a function's
-- name (followed by "("), nor a qualifier (followed by "."), nor a string's text. The
-- caller checks that the result reads the same columns as before (by attnum): a name this
-- got wrong cannot pass unseen.
CREATE FUNCTION "trellis"._rename_in_expression(expr text, alias text, old_name text, new_name text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks "trellis".grammar_token[];
  n int;
  i int;
  out text := '';
  last int := 1;
  tok "trellis".grammar_token;
  qualified_by text;
BEGIN
  IF expr IS NULL THEN
    RETURN NULL;
  END IF;
  toks := "trellis".grammar_tokenize(expr);
  n := coalesce(array_length(toks, 1), 0);
  FOR i IN 1 .. n LOOP
    tok := toks[i];
    CONTINUE WHEN tok.kind NOT IN ('word', 'ident', 'uident') OR tok.value IS DISTINCT FROM old_name;
    CONTINUE WHEN i < n AND toks[i + 1].kind = 'punct' AND toks[i + 1].text IN ('(', '.');
    qualified_by := NULL;
    IF i > 1 AND toks[i - 1].kind = 'punct' AND toks[i - 1].text = '.' THEN
      -- schema.table.column, or (row).field: left alone.
      CONTINUE WHEN i < 3 OR toks[i - 2].kind NOT IN ('word', 'ident', 'uident')
                    OR (i > 3 AND toks[i - 3].kind = 'punct' AND toks[i - 3].text = '.');
      qualified_by := toks[i - 2].value;
      CONTINUE WHEN qualified_by IS DISTINCT FROM alias;
    END IF;
    out := out || substr(expr, last, tok.pos - last) || quote_ident(new_name);
    last := tok.pos + char_length(tok.text);
  END LOOP;
  RETURN out || substr(expr, last);
END
$fn$;

-- The statement's AST with column `old_name` of source `ordinal` renamed `new_name` in
-- every expression: SELECT items (their names stay: the target's columns keep theirs), ON,
-- WHERE, GROUP BY, HAVING.
CREATE FUNCTION "trellis"._rename_in_ast(ast jsonb, ordinal int, old_name text, new_name text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  src jsonb := CASE WHEN ordinal = 0 THEN ast->'from' ELSE ast->'joins'->(ordinal - 1) END;
  alias text := coalesce(src->>'alias', src->>'name');
  j int;
BEGIN
  ast := jsonb_set(ast, '{select}', coalesce((
    SELECT jsonb_agg(jsonb_set(s, '{expr}', to_jsonb("trellis"._rename_in_expression(s->>'expr', alias, old_name, new_name)))
                     ORDER BY o)
      FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS x(s, o)), '[]'));
  IF ast->>'where' IS NOT NULL THEN
    ast := jsonb_set(ast, '{where}', to_jsonb("trellis"._rename_in_expression(ast->>'where', alias, old_name, new_name)));
  END IF;
  IF ast->>'having' IS NOT NULL THEN
    ast := jsonb_set(ast, '{having}', to_jsonb("trellis"._rename_in_expression(ast->>'having', alias, old_name, new_name)));
  END IF;
  IF jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0 THEN
    ast := jsonb_set(ast, '{group_by}', (
      SELECT jsonb_agg(to_jsonb("trellis"._rename_in_expression(g, alias, old_name, new_name)) ORDER BY o)
        FROM jsonb_array_elements_text(ast->'group_by') WITH ORDINALITY AS x(g, o)));
  END IF;
  FOR j IN 0 .. jsonb_array_length(coalesce(ast->'joins', '[]')) - 1 LOOP
    IF ast->'joins'->j->>'on' IS NOT NULL THEN
      ast := jsonb_set(ast, ARRAY['joins', j::text, 'on'],
                       to_jsonb("trellis"._rename_in_expression(ast->'joins'->j->>'on', alias, old_name, new_name)));
    END IF;
  END LOOP;
  RETURN ast;
END
$fn$;

-- The attnums a spec's source `ordinal` reads, as the table is now.
CREATE FUNCTION "trellis"._read_attnums(spec jsonb, ordinal int)
RETURNS int[] LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(array_agg(a.attnum::int ORDER BY a.attnum), '{}')
    FROM jsonb_array_elements(spec->'sources') s
    JOIN pg_attribute a ON a.attrelid = (s->>'oid')::oid AND NOT a.attisdropped
   WHERE (s->>'ordinal')::int = ordinal
     AND a.attname IN (SELECT jsonb_array_elements_text(s->'read_columns'))
$fn$;

-- Follows one transform's read columns renamed or retyped, or raises (TRV01, with why)
-- when it cannot: the definition, its reads renamed, must still bind (under its
-- search_path and settings), read the very same columns, keep its key and aggregation,
-- and give the same columns but for types (and a key column's name) the target can be
-- altered to. The target is altered in place; the key map is made again by the refill.
CREATE FUNCTION "trellis"._follow_transform(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  previous jsonb;
  new_ast jsonb := t.spec->'ast';
  new_spec jsonb;
  r record;
  target_sql text := t.target_oid::regclass::text;
BEGIN
  FOR r IN
    SELECT ts.ordinal, x->>'name' AS old_name, a.attname::text AS new_name
      FROM "trellis".transform_sources ts
      CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) x
      JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (x->>'attnum')::int
     WHERE ts.transform_id = t.id AND NOT a.attisdropped AND a.attname <> x->>'name'
     ORDER BY ts.ordinal, a.attnum
  LOOP
    new_ast := "trellis"._rename_in_ast(new_ast, r.ordinal, r.old_name, r.new_name);
  END LOOP;
  PERFORM set_config('search_path', t.search_path, true);
  previous := "trellis"._enter_settings(t.settings);
  BEGIN
    new_spec := "trellis"._analyze_transform(new_ast);
    new_spec := jsonb_set(new_spec, '{ast,target}', t.spec->'ast'->'target');
    new_spec := new_spec || jsonb_build_object(
      'whole_row', "trellis"._check_definition(new_spec),
      'key_map', "trellis"._key_map_kind(new_spec));
  EXCEPTION WHEN OTHERS THEN
    PERFORM set_config('search_path', old_path, true);
    PERFORM "trellis"._leave_settings(previous);
    PERFORM "trellis"._fail('TRV01', format('its definition no longer holds (%s)', SQLERRM));
  END;
  PERFORM set_config('search_path', old_path, true);
  PERFORM "trellis"._leave_settings(previous);

  IF (new_spec->>'aggregates')::boolean IS DISTINCT FROM t.aggregates THEN
    PERFORM "trellis"._fail('TRV01', 'it would change whether the definition aggregates');
  END IF;
  -- The same columns read, and the same key, by attnum.
  FOR r IN SELECT ts.ordinal, ts.read_attrs, ts.key_columns FROM "trellis".transform_sources ts
            WHERE ts.transform_id = t.id LOOP
    IF "trellis"._read_attnums(new_spec, r.ordinal) IS DISTINCT FROM
       ARRAY(SELECT (x->>'attnum')::int FROM jsonb_array_elements(r.read_attrs) x ORDER BY (x->>'attnum')::int) THEN
      PERFORM "trellis"._fail('TRV01', 'the definition would read other columns than it did');
    END IF;
  END LOOP;
  -- The target's columns, one for one: the same names (but a key column the engine named
  -- after a source's, which follows it), the same key, collations; types may change.
  FOR r IN
    SELECT c.ordinal, c.name AS old_name, c.type AS old_type, c.is_key, c.implicit, c.collation_name,
           n->>'name' AS new_name, n->>'type' AS new_type, (n->>'is_key')::boolean AS new_key,
           (n->>'implicit')::boolean AS new_implicit, n->>'collation' AS new_collation
      FROM "trellis".transform_columns c
      FULL JOIN (SELECT n, o FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(n, o)) x
        ON x.o - 1 = c.ordinal AND c.transform_id = t.id
     WHERE c.transform_id = t.id OR c.transform_id IS NULL
     ORDER BY coalesce(c.ordinal, x.o - 1)
  LOOP
    IF r.old_name IS NULL OR r.new_name IS NULL OR r.is_key IS DISTINCT FROM r.new_key
       OR r.implicit IS DISTINCT FROM r.new_implicit
       OR r.collation_name IS DISTINCT FROM r.new_collation
       OR (r.old_name <> r.new_name AND NOT r.implicit) THEN
      PERFORM "trellis"._fail('TRV01', format('its target''s columns would change (%s %s)',
        coalesce(r.old_name, r.new_name), coalesce(r.new_type, r.old_type)));
    END IF;
    IF r.old_name <> r.new_name THEN
      EXECUTE format('ALTER TABLE %s RENAME COLUMN %I TO %I', target_sql, r.old_name, r.new_name);
    END IF;
    IF r.old_type <> r.new_type THEN
      -- Values are converted as they are; the refill then writes them as the definition gives them.
      EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING %I::%s',
                     target_sql, r.new_name, r.new_type, r.new_name, r.new_type);
    END IF;
    UPDATE "trellis".transform_columns c
       SET name = r.new_name, type = r.new_type, expression = n->>'expression', reads = n->'reads'
      FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(n, o)
     WHERE c.transform_id = t.id AND c.ordinal = r.ordinal AND x.o - 1 = r.ordinal;
  END LOOP;
  UPDATE "trellis".transforms
     SET spec = new_spec, statement = "trellis".render_statement(new_spec->'ast'), updated_at = now()
   WHERE id = t.id;
  PERFORM "trellis"._register(t.id, new_spec);
  PERFORM "trellis"._record_read_attrs(t.id);
  UPDATE "trellis".pipeline SET follow_pending = true, updated_at = now() WHERE transform_id = t.id;
END
$fn$;

-- Every transform running whose read columns were renamed or retyped, and nothing else
-- changed about its sources that stops it, is followed (see _follow_transform); the
-- others are left to the staging worker's stop (ADR 0008's table says which). Returns
-- each transform looked at, and why it could not be followed (NULL when it was).
CREATE FUNCTION "trellis"._follow_source_columns()
RETURNS TABLE (target text, refused text) LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms;
BEGIN
  FOR t IN
    SELECT x.* FROM "trellis".transforms x
     WHERE x.capture_failure IS NULL AND x.paused_at IS NULL
       AND EXISTS (
         SELECT 1 FROM "trellis".transform_sources ts
           CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) r
           JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (r->>'attnum')::int
          WHERE ts.transform_id = x.id AND NOT a.attisdropped
            AND (a.attname <> r->>'name' OR format_type(a.atttypid, a.atttypmod) <> r->>'type'))
       -- Nothing about its sources that stops it: every read column there, every source
       -- there with its key's columns (by attnum), and no column added to one it reads
       -- whole (its rows' JSON would change shape).
       AND NOT EXISTS (
         SELECT 1 FROM "trellis".transform_sources ts
           LEFT JOIN pg_class c ON c.oid = ts.source_oid
          WHERE ts.transform_id = x.id
            AND (c.oid IS NULL
                 OR EXISTS (SELECT 1 FROM jsonb_array_elements(ts.read_attrs) r
                             LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid
                                                     AND a.attnum = (r->>'attnum')::int
                             WHERE a.attnum IS NULL OR a.attisdropped)
                 OR (SELECT array_agg(a.attnum::int ORDER BY k.i)
                       FROM pg_index i
                       CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                      WHERE i.indrelid = ts.source_oid AND i.indisprimary)
                    IS DISTINCT FROM
                    ARRAY(SELECT (SELECT (r->>'attnum')::int FROM jsonb_array_elements(ts.read_attrs) r
                                   WHERE r->>'name' = k.name)
                            FROM unnest(ts.key_columns) WITH ORDINALITY AS k(name, i) ORDER BY k.i)
                 OR (coalesce((x.spec->>'whole_row')::boolean, false) AND EXISTS (
                       SELECT 1 FROM pg_attribute a
                        WHERE a.attrelid = ts.source_oid AND a.attnum > 0 AND NOT a.attisdropped
                          AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(ts.read_attrs) r
                                           WHERE (r->>'attnum')::int = a.attnum)))))
     ORDER BY x.id
  LOOP
    target := t.target_name;
    BEGIN
      -- Locks in the drain's order (page slots, pipeline row, target, catalog row): the
      -- drain applying a range to this target finishes first, and none starts meanwhile.
      PERFORM 1 FROM "trellis".page_slots s WHERE s.transform_id = t.id ORDER BY s.bucket FOR UPDATE;
      PERFORM 1 FROM "trellis".pipeline p WHERE p.transform_id = t.id FOR UPDATE;
      EXECUTE 'LOCK TABLE ' || t.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
      SELECT x.* INTO t FROM "trellis".transforms x WHERE x.id = t.id FOR UPDATE;
      IF t.capture_failure IS NOT NULL OR t.paused_at IS NOT NULL THEN
        CONTINUE;
      END IF;
      PERFORM "trellis"._follow_transform(t);
      refused := NULL;
    EXCEPTION WHEN OTHERS THEN
      refused := SQLERRM;
    END;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- The refill's first step, in its transaction: the key map (and group states) made again
-- for the definition as followed (key and group types may have changed), empty for the
-- refill to fill.
CREATE FUNCTION "trellis"._follow_remap(transform_id int)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  spec jsonb := (SELECT t.spec FROM "trellis".transforms t WHERE t.id = transform_id);
BEGIN
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || transform_id);
  PERFORM "trellis"._create_key_map(transform_id, spec);
  UPDATE "trellis".transforms t SET updated_at = now() WHERE t.id = transform_id;
  UPDATE "trellis".pipeline p SET apply_costs = NULL WHERE p.transform_id = _follow_remap.transform_id;
END
$fn$;
$trellis_m30$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 31) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (31, 'fair_drain', false);
    EXECUTE $trellis_m31$-- Fair drain (issue #22 item 4, ADR 0045): what the drain loops spent on each transform,
-- and the order they take work in. One transform's heavy pages or build must not hold
-- every loop while others wait: a loop takes next the work of the transform that nobody
-- is serving now and that had the least drain time lately.
--   seconds     drain time spent on it in all (pages, ranges applied at once, builds)
--   recent      the same, decayed with a time constant of a minute, as of `at`
--   at          when drain time was last recorded for it
CREATE TABLE "trellis".drain_time (
  transform_id int PRIMARY KEY REFERENCES "trellis".transforms (id) ON DELETE CASCADE,
  seconds float8 NOT NULL DEFAULT 0,
  recent float8 NOT NULL DEFAULT 0,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Records drain time (a loop sends what it spent, at most once a second): ids[i] took
-- secs[i] seconds.
CREATE FUNCTION "trellis"._drained(ids int[], secs float8[])
RETURNS void LANGUAGE sql AS $fn$
  INSERT INTO "trellis".drain_time AS d (transform_id, seconds, recent, at)
  SELECT x.id, sum(x.s), sum(x.s), clock_timestamp()
    FROM unnest(ids, secs) AS x(id, s)
   WHERE EXISTS (SELECT 1 FROM "trellis".transforms t WHERE t.id = x.id)
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
CREATE FUNCTION "trellis"._drain_ranks()
RETURNS TABLE (transform_id int, serving boolean, recent float8, reserved boolean)
LANGUAGE sql STABLE AS $fn$
  WITH locks AS (
    SELECT l.classid, l.objid, l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid IN (1953657718::oid,   -- 0x74727376, "trsv": LOCK_CLASS.serving
                         1953653874::oid)   -- 0x74726472, "trdr": LOCK_CLASS.drain
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
  keyed AS (
    SELECT t.id, (((hashtext('trellis' || ':' || t.id))::bigint + 4294967296) % 4294967296)::oid AS key
      FROM "trellis".transforms t),
  served AS (
    SELECT k.id, l.pid FROM keyed k JOIN locks l ON l.classid = 1953657718::oid AND l.objid = k.key
     WHERE l.pid <> pg_backend_pid()),
  free AS (
    SELECT (SELECT count(DISTINCT l.pid) FROM locks l
             WHERE l.classid = 1953653874::oid
               AND l.objid = (((hashtext('trellis'))::bigint + 4294967296) % 4294967296)::oid)
           - (SELECT count(DISTINCT s.pid) FROM served s) AS loops)
  SELECT k.id,
         k.id IN (SELECT s.id FROM served s),
         coalesce(d.recent * exp(-greatest(extract(epoch FROM clock_timestamp() - d.at), 0) / 60), 0),
         k.id IN (SELECT s.id FROM served s) AND (SELECT loops FROM free) <= 1
    FROM keyed k LEFT JOIN "trellis".drain_time d ON d.transform_id = k.id
$fn$;

-- Which kind of work a drain loop should look at first: 'page' (an open page), 'range'
-- (a transform behind with no range open), 'build' (a chunk or step of a build), or null
-- when none waits; the kind whose transform ranks first by _drain_ranks.
CREATE FUNCTION "trellis"._drain_next()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH r AS (SELECT * FROM "trellis"._drain_ranks()),
  work AS (
    SELECT 'page' AS kind, p.transform_id
      FROM "trellis".pages p JOIN "trellis".transforms t ON t.id = p.transform_id
     WHERE t.paused_at IS NULL AND (p.not_before IS NULL OR p.not_before <= now())
    UNION ALL
    SELECT 'range', pl.transform_id
      FROM "trellis".pipeline pl JOIN "trellis".transforms t ON t.id = pl.transform_id
     WHERE pl.phase IN ('catching_up', 'live') AND t.paused_at IS NULL AND pl.open_lo IS NULL
       AND pl.cursor_tick < (SELECT max(seq) FROM "trellis".ticks)
    UNION ALL
    SELECT 'build', pl.transform_id
      FROM "trellis".pipeline pl JOIN "trellis".transforms t ON t.id = pl.transform_id
     WHERE pl.phase = 'backfilling' AND t.paused_at IS NULL
       AND (pl.build_next_at IS NULL OR pl.build_next_at <= now()))
  SELECT w.kind FROM work w JOIN r ON r.transform_id = w.transform_id
   WHERE NOT (r.reserved AND w.kind <> 'build')
   ORDER BY r.serving, r.recent, w.kind = 'build'
   LIMIT 1
$fn$;

-- status().drain: the drain time spent on a transform in all, lately (decayed over a
-- minute), and its share of the recent drain time of every transform of the instance.
CREATE FUNCTION "trellis"._drain_share(transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH r AS (SELECT * FROM "trellis"._drain_ranks())
  SELECT jsonb_build_object(
    'seconds', coalesce((SELECT d.seconds FROM "trellis".drain_time d
                          WHERE d.transform_id = _drain_share.transform_id), 0),
    'recentSeconds', round(coalesce((SELECT r.recent FROM r
                                      WHERE r.transform_id = _drain_share.transform_id), 0)::numeric, 3),
    'share', (SELECT round((sum(r.recent) FILTER (WHERE r.transform_id = _drain_share.transform_id)
                            / nullif(sum(r.recent), 0))::numeric, 3) FROM r))
$fn$;

-- As in 0029, with the drain time spent on the transform (drain).
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := "trellis"._restore_reason();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
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
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
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
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
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
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
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
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0031: the drain time spent on it, and its share of the drain's recent time.
    'drain', "trellis"._drain_share(t.id),
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM "trellis".config c WHERE c.restored IS NOT NULL) END);
END
$fn$;

-- Whether the calling drain loop, having claimed a page of `transform_id` (and taken its
-- serving lock), should leave it: two loops woken together can claim pages of one
-- transform at once, before either sees the other serving it. A loop that sees another
-- serving it leaves, when no other drain loop of the instance is free for the other
-- transforms' work (_drain_ranks' reserve, decided after the claim). Two that check at the
-- same moment may both leave: they claim again at their next step.
CREATE FUNCTION "trellis"._drain_yield(transform_id int)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH locks AS (
    SELECT l.classid, l.objid, l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid IN (1953657718::oid, 1953653874::oid)
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
  keyed AS (
    SELECT t.id, (((hashtext('trellis' || ':' || t.id))::bigint + 4294967296) % 4294967296)::oid AS key
      FROM "trellis".transforms t),
  served AS (
    SELECT k.id, l.pid FROM keyed k JOIN locks l ON l.classid = 1953657718::oid AND l.objid = k.key)
  SELECT EXISTS (SELECT 1 FROM served s
                  WHERE s.id = _drain_yield.transform_id AND s.pid <> pg_backend_pid())
     AND (SELECT count(DISTINCT l.pid) FROM locks l
           WHERE l.classid = 1953653874::oid
             AND l.objid = (((hashtext('trellis'))::bigint + 4294967296) % 4294967296)::oid)
         - (SELECT count(DISTINCT s.pid) FROM served s) <= 0
$fn$;
$trellis_m31$;
  END IF;
  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
  INSERT INTO "trellis".config (target_schema) VALUES ('public')
    ON CONFLICT DO NOTHING;

  -- Background jobs (self-checks) run on pg-boss, in the schema trellis_jobs at pg-boss's
  -- schema version 24 (ADR 0014).
  IF to_regclass('trellis_jobs.migrations') IS NOT NULL THEN
    RAISE EXCEPTION 'schema trellis_jobs, where Trellis instance trellis keeps its jobs, holds another Trellis instance''s catalog: choose another catalog schema'
      USING ERRCODE = 'TRC01';
  END IF;
  IF to_regclass('trellis_jobs.version') IS NULL THEN
    EXECUTE $trellis_boss$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    
    CREATE SCHEMA IF NOT EXISTS trellis_jobs
  ;

    CREATE TYPE trellis_jobs.job_state AS ENUM (
      'created',
      'retry',
      'active',
      'completed',
      'cancelled',
      'failed'
    )
  ;

    CREATE TABLE trellis_jobs.version (
      version int primary key,
      maintained_on timestamp with time zone,
      cron_on timestamp with time zone,
      monitored_on timestamp with time zone
    )
  ;

    CREATE TABLE trellis_jobs.queue (
      name text,
      policy text,
      retry_limit int,
      retry_delay int,
      retry_backoff bool,
      expire_seconds int,
      retention_minutes int,
      dead_letter text REFERENCES trellis_jobs.queue (name),
      partition_name text,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.schedule (
      name text REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      cron text not null,
      timezone text,
      data jsonb,
      options jsonb,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.subscription (
      event text not null,
      name text not null REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY(event, name)
    )
  ;

    CREATE TABLE trellis_jobs.job (
      id uuid not null default gen_random_uuid(),
      name text not null,
      priority integer not null default(0),
      data jsonb,
      state trellis_jobs.job_state not null default('created'),
      retry_limit integer not null default(2),
      retry_count integer not null default(0),
      retry_delay integer not null default(0),
      retry_backoff boolean not null default false,
      start_after timestamp with time zone not null default now(),
      started_on timestamp with time zone,
      singleton_key text,
      singleton_on timestamp without time zone,
      expire_in interval not null default interval '15 minutes',
      created_on timestamp with time zone not null default now(),
      completed_on timestamp with time zone,
      keep_until timestamp with time zone NOT NULL default now() + interval '14 days',
      output jsonb,
      dead_letter text,
      policy text
    ) PARTITION BY LIST (name)
  ;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);
CREATE TABLE trellis_jobs.archive (LIKE trellis_jobs.job);
ALTER TABLE trellis_jobs.archive ADD PRIMARY KEY (name, id);
ALTER TABLE trellis_jobs.archive ADD archived_on timestamptz NOT NULL DEFAULT now();
CREATE INDEX archive_i1 ON trellis_jobs.archive(archived_on);

    CREATE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
      queue_created_on timestamptz;
    BEGIN

      WITH q as (
      INSERT INTO trellis_jobs.queue (
        name,
        policy,
        retry_limit,
        retry_delay,
        retry_backoff,
        expire_seconds,
        retention_minutes,
        dead_letter,
        partition_name
      )
      VALUES (
        queue_name,
        options->>'policy',
        (options->>'retryLimit')::int,
        (options->>'retryDelay')::int,
        (options->>'retryBackoff')::bool,
        (options->>'expireInSeconds')::int,
        (options->>'retentionMinutes')::int,
        options->>'deadLetter',
        table_name
      )
      ON CONFLICT DO NOTHING
      RETURNING created_on
      )
      SELECT created_on into queue_created_on from q;

      IF queue_created_on IS NULL THEN
        RETURN;
      END IF;

      EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
      EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
      EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;

    CREATE FUNCTION trellis_jobs.delete_queue(queue_name text)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar;
    BEGIN
      WITH deleted as (
        DELETE FROM trellis_jobs.queue
        WHERE name = queue_name
        RETURNING partition_name
      )
      SELECT partition_name from deleted INTO table_name;

      EXECUTE format('DROP TABLE IF EXISTS trellis_jobs.%I', table_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;
INSERT INTO trellis_jobs.version(version) VALUES ('24');
    $trellis_boss$;
  ELSE
    SELECT version INTO boss_version FROM trellis_jobs.version;
    IF boss_version >= 24 THEN
      NULL; -- up to date, or installed by a newer trellis-pg
  ELSIF boss_version = 23 THEN
    EXECUTE $trellis_boss_23$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_23$;
  ELSIF boss_version = 22 THEN
    EXECUTE $trellis_boss_22$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_22$;
  ELSIF boss_version = 21 THEN
    EXECUTE $trellis_boss_21$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ALTER COLUMN retry_limit SET DEFAULT 2;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_21$;
    ELSE
      RAISE EXCEPTION 'the jobs schema trellis_jobs is at pg-boss schema version %, which this trellis-pg cannot upgrade to 24', boss_version
        USING ERRCODE = 'TRI01';
    END IF;
  END IF;
  PERFORM trellis_jobs.create_queue('self_check', '{"policy": "standard"}'::json);

  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis_jobs" FROM PUBLIC;
END
$trellis_upgrade$;
