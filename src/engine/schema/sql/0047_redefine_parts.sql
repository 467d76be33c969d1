-- Redefinitions in place to and from statements with parts (issue #25 follow-up; ADR 0055,
-- second addendum), and how long readers were blocked in status().
--
-- ALTER TRANSFORM t AS <a statement with derived tables or WITH queries> (ADR 0056's parts):
-- the statement is checked whole by Postgres (as a TRANSFORM with parts is), its parts are
-- defined as hidden transforms of their own, named "trellis#<t>~<id>#<part>" (another name
-- than the parts in force, "trellis#<t>#<part>" or an earlier redefinition's), and the
-- shadow (0035) is the statement around them, reading their targets. The parts belong to
-- the shadow (part_of = the shadow's id): they are built and kept live as any part is,
-- while the old definition (and its own parts) keep serving the target. The switch (0042)
-- is unchanged: the shadow's row becomes the transform (its id is kept), so the new parts
-- are the transform's from then on. The old parts, whose transform is gone, are dropped
-- after the switch, in a transaction of their own (_drop_orphan_parts, called by the
-- staging worker): nothing the app reads is touched by that. A redefinition replaced,
-- given up or dropped drops its parts with its shadow (the trigger drop_redefinition_parts).
-- A redefinition from a statement with parts to one without (or the other way round) goes
-- the same way. Unions (0041) in the new statement are still refused, by name.
--
-- Renamed here and wrapped (statements and transforms without parts go straight through):
-- _redefine (0036's) -> _redefine_before_parts; parse_statement (0028's) ->
-- parse_statement_before_alter_with (ALTER TRANSFORM t AS WITH ... is read). Replaced (its latest body, 0041's, copied;
-- the change marked "0047"): status(text), whose redefinition now carries readersBlockedMs,
-- staged, deleted and written, which the switch records in transforms.redefinition since
-- 0042.

ALTER FUNCTION @schema@._redefine(jsonb) RENAME TO _redefine_before_parts;
ALTER FUNCTION @schema@.parse_statement(text) RENAME TO parse_statement_before_alter_with;

-- ALTER TRANSFORM t AS WITH ... SELECT ...: a redefinition whose statement starts with WITH
-- queries (0035 took SELECT or FROM after AS). Read as the TRANSFORM statement it would
-- be, ALTER blanked out so positions stay the statement's own; every other statement as
-- before (parse_statement_before_alter_with).
CREATE FUNCTION @schema@.parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(statement);
  sch text;
  nm text;
  i int;
BEGIN
  IF @schema@.grammar_kw(toks[1], 'alter') AND @schema@.grammar_kw(toks[2], 'transform') THEN
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM @schema@.grammar_qualified(toks, 3, 'a transform name') q;
    IF @schema@.grammar_kw(toks[i], 'as') AND @schema@.grammar_kw(toks[i + 1], 'with') THEN
      RETURN jsonb_build_object('kind', 'redefine', 'transform', nm,
               'definition', @schema@.parse_statement_before_alter_with(overlay(statement
                 PLACING repeat(' ', char_length(toks[1].text)) FROM toks[1].pos FOR char_length(toks[1].text))))
             || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    END IF;
  END IF;
  RETURN @schema@.parse_statement_before_alter_with(statement);
END
$fn$;

-- Whether a view-SQL AST (a statement or a part) has a union anywhere in it.
CREATE FUNCTION @schema@._has_union(ast jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
  SELECT ast ? 'union' OR EXISTS (
    SELECT 1 FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) p
     WHERE @schema@._has_union(p->'ast'))
$fn$;

-- Drops transforms `ids`' parts (the last defined first: a part may read an earlier one),
-- and the tables of the unions they fed.
CREATE FUNCTION @schema@._drop_parts_of(ids int[])
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  tables oid[];
  rel oid;
  p record;
  n int := 0;
BEGIN
  tables := ARRAY(SELECT DISTINCT f.table_oid FROM @schema@.union_feeds f
                    JOIN @schema@.transforms x ON x.id = f.transform_id
                   WHERE x.part_of = ANY (ids));
  FOR p IN SELECT x.target_name FROM @schema@.transforms x WHERE x.part_of = ANY (ids) ORDER BY x.id DESC LOOP
    PERFORM @schema@._drop_one(jsonb_build_object('kind', 'drop', 'transform', p.target_name));
    n := n + 1;
  END LOOP;
  FOREACH rel IN ARRAY tables LOOP
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
      EXECUTE format('DROP TABLE %s', rel::regclass);
    END IF;
  END LOOP;
  RETURN n;
END
$fn$;

-- The parts of a transform that is gone (the old definition's, after a switch): dropped.
-- The staging worker calls it after each switch, under a short lock_timeout, and again on
-- later passes while some are left. Returns how many were dropped.
CREATE FUNCTION @schema@._drop_orphan_parts()
RETURNS int LANGUAGE plpgsql AS $fn$
BEGIN
  RETURN @schema@._drop_parts_of(ARRAY(
    SELECT DISTINCT x.part_of FROM @schema@.transforms x
     WHERE x.part_of IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM @schema@.transforms o WHERE o.id = x.part_of)));
END
$fn$;

-- A shadow gone (replaced, given up, dropped with its transform): its parts with it.
CREATE FUNCTION @schema@._drop_redefinition_parts()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._drop_parts_of(ARRAY[OLD.id]);
  RETURN NULL;
END
$fn$;
CREATE TRIGGER drop_redefinition_parts AFTER DELETE ON @schema@.transforms
  FOR EACH ROW WHEN (OLD.redefines IS NOT NULL) EXECUTE FUNCTION @schema@._drop_redefinition_parts();

-- ALTER TRANSFORM ... AS: with parts on either side, the new parts defined and the shadow
-- made reading them; otherwise as before (_redefine_before_parts).
CREATE FUNCTION @schema@._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  def jsonb := ast->'definition';
  has_new boolean := jsonb_array_length(coalesce(ast->'definition'->'parts', '[]')) > 0;
  res jsonb;
  result jsonb;
  shadow_id int;
BEGIN
  IF t.part_of IS NOT NULL OR t.redefines IS NOT NULL
     OR NOT (has_new OR EXISTS (SELECT 1 FROM @schema@.transforms p WHERE p.part_of = t.id)) THEN
    RETURN @schema@._redefine_before_parts(ast);
  END IF;
  IF @schema@._has_union(def) THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot be redefined in place to a statement with UNION yet', t.target_name),
      'DROP TRANSFORM it and define it again');
  END IF;
  -- A switch to a redefinition being replaced finishes first (as _redefine_one waits).
  PERFORM 1 FROM @schema@.pipeline px
   WHERE px.transform_id = t.id
      OR px.transform_id IN (SELECT y.id FROM @schema@.transforms y WHERE y.redefines = t.id)
   ORDER BY px.transform_id FOR UPDATE;
  IF NOT EXISTS (SELECT 1 FROM @schema@.transforms y WHERE y.id = t.id) THEN
    PERFORM @schema@._fail('TRT01', format(
      'transform %I was switched to another definition while this statement waited: apply it again', t.target_name));
  END IF;
  -- A redefinition being built is replaced: its shadow, and its parts, go first (their
  -- names are this one's).
  DELETE FROM @schema@.transforms s WHERE s.redefines = t.id;
  IF has_new THEN
    def := jsonb_set(def, '{target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
    -- Postgres reads the statement as written first: names, column aliases, scopes.
    PERFORM @schema@._analyze_query(@schema@._render_view_select(def), 'in the definition');
    PERFORM @schema@._refuse_view_sublinks(def);
    res := @schema@._define_parts(def, t.target_name || '~' || t.id, '', '{}');
    ast := jsonb_set(ast, '{definition}', res->'ast');
  END IF;
  result := @schema@._redefine_one(ast);
  SELECT s.id INTO shadow_id FROM @schema@.transforms s WHERE s.redefines = t.id;
  IF shadow_id IS NULL THEN
    -- The definition in force, written again: nothing to build, the parts just made go.
    IF has_new THEN
      PERFORM @schema@._drop_one(jsonb_build_object('kind', 'drop', 'transform', x.target_name))
         FROM (SELECT y.target_name FROM @schema@.transforms y
                WHERE y.id IN (SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i)
                ORDER BY y.id DESC) x;
    END IF;
    RETURN result;
  END IF;
  IF has_new THEN
    UPDATE @schema@.transforms p SET part_of = shadow_id
     WHERE p.id IN (SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i);
  END IF;
  RETURN result;
END
$fn$;

-- status(text): replaced (its latest body, 0041's, copied; the change marked "0047"): its
-- redefinition carries what the switch recorded beside lockMs since 0042. Wrapping it is
-- not possible: its body names its parameter as status.target, which a renamed function
-- no longer resolves.
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
    -- 0041: upstream through _upstream_ids (a union's branches feed its table too).
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM @schema@._upstream_ids(t.id) u(id)
      UNION
      SELECT u.id FROM up CROSS JOIN LATERAL @schema@._upstream_ids(up.id) u(id))
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
    -- 0035: the last ALTER TRANSFORM ... AS: being built, switched, or given up and why.
    'redefinition', CASE WHEN t.redefinition IS NOT NULL THEN jsonb_build_object(
        'state', t.redefinition->'state', 'statement', t.redefinition->'statement',
        'changes', coalesce(t.redefinition->'changes', '[]'),
        'error', t.redefinition->'error', 'lockMs', t.redefinition->'lockMs',
        -- 0047: how long of the lock readers waited for (ACCESS EXCLUSIVE), whether the
        -- columns were staged, and the rows the switch deleted and wrote.
        'readersBlockedMs', t.redefinition->'readersBlockedMs', 'staged', t.redefinition->'staged',
        'deleted', t.redefinition->'deleted', 'written', t.redefinition->'written',
        'since', t.redefinition->'since', 'at', t.redefinition->'at') END,
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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
