-- Redefinitions in place (issue #25 follow-up; ADR 0055's fourth addendum).
--
-- _redefine_lock_mode: the strongest lock the next step of a redefinition takes on its
-- target ('ACCESS EXCLUSIVE' when columns are staged, or the switch changes columns, the
-- key, NOT NULL or the engine's join indexes; 'EXCLUSIVE' otherwise), so the staging
-- worker's pre-check counts only the locks that conflict with it: a plain reader's ACCESS
-- SHARE does not conflict with EXCLUSIVE, and no longer holds a filter change's switch off.
--
-- A bounded diff for a switch that changes no column, key or NOT NULL (a filter or a
-- projection's expressions changed: the switch takes EXCLUSIVE, the drains wait for it).
-- The switch diffed both tables whole under that lock (in proportion to the table). Now,
-- once the shadow is live, the staging worker:
--
-- 1. _redefine_log_start, a short transaction: a table of keys "redefine_log#<shadow id>"
--    in the catalog schema, and statement triggers (transition tables) on the target and
--    the shadow that add to it the keys of every row written from then on;
-- 2. _redefine_log_page, pages of 5,000 of the shadow's keys, each a transaction of its own
--    taking no lock a drain or a reader waits for: the keys in the page's range where the
--    target and the shadow differ, added to the log;
-- 3. _redefine_switch (wrapped: 0042's is _redefine_switch_before_log), once every page is
--    done: under the same locks as before, the diff restricted to the logged keys (by the
--    key's index). Every key where the two differ at the switch is logged: it differed
--    when its page read both tables (one snapshot), or a row of it was written since, which
--    the triggers (created before the first page, once the writers then running ended)
--    logged. A TRUNCATE of either marks the log void: the switch then diffs whole.
--
-- The triggers stay on the target after the switch (doing nothing: the log table is gone)
-- until _redefine_log_cleanup drops them, in a transaction of its own (DROP TRIGGER takes
-- ACCESS EXCLUSIVE for a catalog change; not tried while a long transaction holds the target).

CREATE FUNCTION @schema@._redefine_lock_mode(shadow_id int)
RETURNS text LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  plan jsonb;
  wanted text[];
BEGIN
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN 'ACCESS EXCLUSIVE';
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  plan := @schema@._redefine_plan(t, s.spec);
  wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                    FROM jsonb_array_elements(s.spec->'sources') src
                   WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  IF coalesce((plan->>'key_changed')::boolean, false) OR jsonb_array_length(coalesce(plan->'columns', '[]')) > 0
     OR wanted IS DISTINCT FROM ARRAY(
          SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
            FROM jsonb_array_elements(t.spec->'sources') src
           WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array')
     -- NOT NULL set or dropped, or staged columns left on the target: ALTER TABLE.
     OR EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
                 WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                   AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull <> n.attnotnull)
     OR EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid AND NOT a.attisdropped
                   AND starts_with(a.attname, 'trellis#' || s.id || '#')) THEN
    RETURN 'ACCESS EXCLUSIVE';
  END IF;
  RETURN 'EXCLUSIVE';
END
$fn$;

-- The transactions holding, for longer than `older_ms`, a lock on `rel` that conflicts
-- with `mode` ('EXCLUSIVE' or 'ACCESS EXCLUSIVE'), this session's aside: what holds a
-- redefinition's next step off (pid, the mode held, since when), oldest first.
CREATE FUNCTION @schema@._redefine_blockers(rel oid, mode text, older_ms float8)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(jsonb_build_object('pid', b.pid, 'mode', b.mode, 'since', b.since)
                            ORDER BY b.since), '[]')
    FROM (SELECT DISTINCT ON (l.pid) l.pid, l.mode, a.xact_start AS since
            FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
             AND l.relation = rel
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             -- Every mode conflicts with ACCESS EXCLUSIVE; every one but ACCESS SHARE with EXCLUSIVE.
             AND (mode = 'ACCESS EXCLUSIVE' OR l.mode <> 'AccessShareLock')
             AND a.xact_start < clock_timestamp() - make_interval(secs => older_ms / 1000)
           ORDER BY l.pid, l.mode) b
$fn$;

-- One row per redefinition whose diff is logged: its log table, how far the pages went
-- (`after`, the last key done, as text), whether every page is done, and whether the log
-- is void (a TRUNCATE of the target or the shadow).
CREATE TABLE @schema@.redefine_logs (
  shadow_id int PRIMARY KEY REFERENCES @schema@.transforms ON DELETE CASCADE,
  log_table text NOT NULL,
  after text[],
  done boolean NOT NULL DEFAULT false,
  void boolean NOT NULL DEFAULT false,
  started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The log table goes with its row (a redefinition switched, replaced, given up, dropped).
CREATE FUNCTION @schema@._redefine_log_drop()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident(OLD.log_table);
  RETURN OLD;
END
$fn$;
CREATE TRIGGER redefine_log_drop AFTER DELETE ON @schema@.redefine_logs
  FOR EACH ROW EXECUTE FUNCTION @schema@._redefine_log_drop();

-- The triggers' function: TG_ARGV[0] the log table (in the catalog schema), TG_ARGV[1] the
-- key's columns (quoted, comma-separated). Does nothing once the log table is gone.
CREATE FUNCTION @schema@._redefine_log_keys()
RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  log text := quote_ident(@schema_literal@) || '.' || quote_ident(TG_ARGV[0]);
BEGIN
  IF to_regclass(log) IS NULL THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'TRUNCATE' THEN
    UPDATE @schema@.redefine_logs SET void = true WHERE log_table = TG_ARGV[0];
    RETURN NULL;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    EXECUTE format('INSERT INTO %s SELECT DISTINCT %s FROM trellis_new ON CONFLICT DO NOTHING', log, TG_ARGV[1]);
  END IF;
  IF TG_OP IN ('DELETE', 'UPDATE') THEN
    EXECUTE format('INSERT INTO %s SELECT DISTINCT %s FROM trellis_old ON CONFLICT DO NOTHING', log, TG_ARGV[1]);
  END IF;
  RETURN NULL;
END
$fn$;

-- Whether the switch of shadow `shadow_id` can use a logged diff: it takes EXCLUSIVE only
-- (no column, key, NOT NULL or join index change), and the key is not empty, unchanged and
-- never NULL (the log is looked up by `=`).
CREATE FUNCTION @schema@._redefine_log_eligible(shadow_id int)
RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
BEGIN
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  RETURN @schema@._redefine_lock_mode(shadow_id) = 'EXCLUSIVE'
    AND jsonb_array_length(coalesce(s.spec->'key', '[]')) > 0
    AND NOT coalesce((s.spec->>'key_nullable')::boolean, false)
    AND s.spec->'key' = t.spec->'key'
    AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(s.spec->'key') k
                      LEFT JOIN pg_attribute a ON a.attrelid = t.target_oid AND a.attname = k AND NOT a.attisdropped
                     WHERE a.attnum IS NULL OR NOT a.attnotnull);
END
$fn$;

-- Step 1: the log table and the triggers (SHARE ROW EXCLUSIVE on both tables: waits for
-- the writers running, readers go on). Returns false when the switch cannot use a log.
CREATE FUNCTION @schema@._redefine_log_start(shadow_id int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  log text := 'redefine_log#' || shadow_id;
  keys text;
  rel oid;
BEGIN
  IF EXISTS (SELECT 1 FROM @schema@.redefine_logs l WHERE l.shadow_id = _redefine_log_start.shadow_id) THEN
    RETURN true;
  END IF;
  IF NOT @schema@._redefine_log_eligible(shadow_id) THEN
    RETURN false;
  END IF;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  keys := (SELECT string_agg(quote_ident(k), ', ' ORDER BY o) FROM jsonb_array_elements_text(s.spec->'key') WITH ORDINALITY x(k, o));
  EXECUTE format('CREATE TABLE %I.%I AS SELECT %s FROM %s WITH NO DATA', @schema_literal@, log, keys,
                 s.target_oid::regclass::text);
  EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (%s)', @schema_literal@, log, keys);
  FOREACH rel IN ARRAY ARRAY[t.target_oid, s.target_oid] LOOP
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#i', rel::regclass, log, keys);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS trellis_old NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#u', rel::regclass, log, keys);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS trellis_old
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#d', rel::regclass, log, keys);
    EXECUTE format('CREATE TRIGGER %I AFTER TRUNCATE ON %s
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#t', rel::regclass, log, keys);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I, ENABLE ALWAYS TRIGGER %I, ENABLE ALWAYS TRIGGER %I, ENABLE ALWAYS TRIGGER %I',
                   rel::regclass, 'trellis_log#' || shadow_id || '#i', 'trellis_log#' || shadow_id || '#u',
                   'trellis_log#' || shadow_id || '#d', 'trellis_log#' || shadow_id || '#t');
  END LOOP;
  INSERT INTO @schema@.redefine_logs (shadow_id, log_table) VALUES (shadow_id, log);
  RETURN true;
END
$fn$;

-- A key's columns compared with the text values `v` (as `after` holds them), typed as
-- relation `rel`'s columns: `(a.k1, a.k2) > ('1'::int, 'x'::text)`.
CREATE FUNCTION @schema@._redefine_key_cmp(rel oid, alias text, keys text[], op text, v text[])
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT '(' || string_agg(alias || '.' || quote_ident(k), ', ' ORDER BY o) || ') ' || op || ' ('
         || string_agg(format('%L::%s', v[o], format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY o) || ')'
    FROM unnest(keys) WITH ORDINALITY AS u(k, o)
    JOIN pg_attribute a ON a.attrelid = rel AND a.attname = u.k AND NOT a.attisdropped
$fn$;

-- Step 2: one page, the shadow's next `batch` keys after the last page's (and the target's
-- keys in the same range): the keys where the two differ, logged. Reads only. Returns
-- whether every page is done.
CREATE FUNCTION @schema@._redefine_log_page(shadow_id int, batch int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  l @schema@.redefine_logs;
  s @schema@.transforms;
  t @schema@.transforms;
  keys text[];
  key_list text;
  upto text[];
  range_n text;
  range_t text;
  tcols text;
  ncols text;
  log text;
BEGIN
  SELECT * INTO l FROM @schema@.redefine_logs x WHERE x.shadow_id = _redefine_log_page.shadow_id FOR UPDATE;
  IF NOT FOUND OR l.done OR l.void THEN
    RETURN true;
  END IF;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  log := quote_ident(@schema_literal@) || '.' || quote_ident(l.log_table);
  keys := ARRAY(SELECT k FROM jsonb_array_elements_text(s.spec->'key') WITH ORDINALITY x(k, o) ORDER BY o);
  key_list := (SELECT string_agg(quote_ident(k), ', ') FROM unnest(keys) k);
  -- The page's last key: the batch-th after the last page's (NULL: the rest of the table).
  EXECUTE format('SELECT ARRAY[%s] FROM (SELECT %s FROM %s n WHERE %s ORDER BY %s LIMIT 1 OFFSET %s) x',
                 (SELECT string_agg('x.' || quote_ident(k) || '::text', ', ') FROM unnest(keys) k),
                 (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k),
                 s.target_oid::regclass::text,
                 CASE WHEN l.after IS NULL THEN 'true' ELSE @schema@._redefine_key_cmp(s.target_oid, 'n', keys, '>', l.after) END,
                 (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k), batch - 1)
    INTO upto;
  range_n := concat_ws(' AND ',
    CASE WHEN l.after IS NOT NULL THEN @schema@._redefine_key_cmp(s.target_oid, 'n', keys, '>', l.after) END,
    CASE WHEN upto IS NOT NULL THEN @schema@._redefine_key_cmp(s.target_oid, 'n', keys, '<=', upto) END, 'true');
  range_t := concat_ws(' AND ',
    CASE WHEN l.after IS NOT NULL THEN @schema@._redefine_key_cmp(t.target_oid, 't', keys, '>', l.after) END,
    CASE WHEN upto IS NOT NULL THEN @schema@._redefine_key_cmp(t.target_oid, 't', keys, '<=', upto) END, 'true');
  tcols := (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
  ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
  -- Rows of the shadow the target lacks or holds otherwise, and rows of the target the
  -- shadow lacks: one statement, one snapshot of both.
  EXECUTE format(
    'INSERT INTO %s SELECT %s FROM %s n LEFT JOIN %s t ON %s WHERE %s AND (%s OR record_image_ne(ROW(%s), ROW(%s)))'
    ' UNION SELECT %s FROM %s t WHERE %s AND NOT EXISTS (SELECT 1 FROM %s n WHERE %s)'
    ' ON CONFLICT DO NOTHING',
    log, (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k),
    s.target_oid::regclass::text, t.target_oid::regclass::text,
    (SELECT string_agg(format('t.%I = n.%I', k, k), ' AND ') FROM unnest(keys) k),
    range_n, 't.' || quote_ident(keys[1]) || ' IS NULL', tcols, ncols,
    (SELECT string_agg('t.' || quote_ident(k), ', ') FROM unnest(keys) k),
    t.target_oid::regclass::text, range_t, s.target_oid::regclass::text,
    (SELECT string_agg(format('n.%I = t.%I', k, k), ' AND ') FROM unnest(keys) k));
  UPDATE @schema@.redefine_logs x SET after = upto, done = upto IS NULL
   WHERE x.shadow_id = _redefine_log_page.shadow_id;
  RETURN upto IS NULL;
END
$fn$;

-- Step 3: 0042's switch, wrapped. With a log done and not void, and the switch still one
-- that takes EXCLUSIVE only with the same key: the diff restricted to the logged keys, then
-- the catalog as 0042's. Otherwise the log goes and 0042's switch diffs whole.
ALTER FUNCTION @schema@._redefine_switch(int) RENAME TO _redefine_switch_before_log;

CREATE FUNCTION @schema@._redefine_switch(shadow_id int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  l @schema@.redefine_logs;
  s @schema@.transforms;
  t @schema@.transforms;
  p @schema@.pipeline;
  ids int[];
  rel text;
  shadow_rel text;
  log text;
  plan jsonb;
  keys text[];
  key_match text;
  cols text;
  tcols text;
  ncols text;
  locked_at timestamptz;
  deleted bigint := 0;
  written bigint := 0;
  gone bigint := 0;
  logged bigint;
BEGIN
  SELECT * INTO l FROM @schema@.redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;
  IF NOT FOUND THEN
    RETURN @schema@._redefine_switch_before_log(shadow_id);
  END IF;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  -- The drain's locks first, in the drain's order, as 0042's.
  ids := ARRAY(SELECT DISTINCT i FROM unnest(ARRAY[t.id, s.id] || ARRAY(
                 SELECT ts.transform_id FROM @schema@.transform_sources ts WHERE ts.source_oid = t.target_oid)) i
               ORDER BY i);
  PERFORM 1 FROM @schema@.page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM @schema@.pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO p FROM @schema@.pipeline px WHERE px.transform_id = s.id;
  IF p.phase <> 'live' OR p.follow_pending OR s.paused_at IS NOT NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'the new definition is not live yet');
  END IF;
  rel := t.target_oid::regclass::text;
  shadow_rel := s.target_oid::regclass::text;
  -- The target's lock, then the log's state under it (a TRUNCATE since marks it void).
  EXECUTE 'LOCK TABLE ' || rel || ' IN EXCLUSIVE MODE';
  locked_at := clock_timestamp();
  EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
  SELECT * INTO l FROM @schema@.redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;
  plan := @schema@._redefine_plan(t, s.spec);
  IF NOT l.done OR l.void OR NOT @schema@._redefine_log_eligible(shadow_id)
     OR jsonb_array_length(plan->'refused') > 0 THEN
    DELETE FROM @schema@.redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;
    RETURN @schema@._redefine_switch_before_log(shadow_id);
  END IF;
  PERFORM set_config('trellis.maintaining', @schema_literal@, true);
  log := quote_ident(@schema_literal@) || '.' || quote_ident(l.log_table);
  keys := ARRAY(SELECT k FROM jsonb_array_elements_text(s.spec->'key') WITH ORDINALITY x(k, o) ORDER BY o);
  cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
             FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
  tcols := (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
  ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
  key_match := (SELECT string_agg(format('n.%I = t.%I', k, k), ' AND ') FROM unnest(keys) k);
  EXECUTE 'SELECT count(*) FROM ' || log INTO logged;
  -- The logged keys only, each found by the key's index of both tables.
  EXECUTE 'DELETE FROM ' || rel || ' t USING ' || log || ' g WHERE '
    || (SELECT string_agg(format('t.%I = g.%I', k, k), ' AND ') FROM unnest(keys) k)
    || ' AND NOT EXISTS (SELECT 1 FROM ' || shadow_rel || ' n WHERE ' || key_match || ')';
  GET DIAGNOSTICS deleted = ROW_COUNT;
  EXECUTE 'UPDATE ' || rel || ' t SET (' || cols || ') = ROW(' || ncols || ') FROM ' || log || ' g JOIN '
    || shadow_rel || ' n ON ' || (SELECT string_agg(format('n.%I = g.%I', k, k), ' AND ') FROM unnest(keys) k)
    || ' WHERE ' || key_match || ' AND record_image_ne(ROW(' || tcols || '), ROW(' || ncols || '))';
  GET DIAGNOSTICS written = ROW_COUNT;
  EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || ncols || ' FROM ' || log || ' g JOIN '
    || shadow_rel || ' n ON ' || (SELECT string_agg(format('n.%I = g.%I', k, k), ' AND ') FROM unnest(keys) k)
    || ' WHERE NOT EXISTS (SELECT 1 FROM ' || rel || ' t WHERE ' || key_match || ')';
  GET DIAGNOSTICS gone = ROW_COUNT;
  written := written + gone;
  DELETE FROM @schema@.redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;

  -- The catalog, as 0042's: the shadow's rows become the transform's, on the target.
  UPDATE @schema@.transforms y SET redefines = NULL WHERE y.id = s.id;
  DELETE FROM @schema@.transforms y WHERE y.id = t.id;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  UPDATE @schema@.transforms y
     SET target_schema = t.target_schema, target_name = t.target_name, target_oid = t.target_oid,
         created_at = t.created_at, updated_at = now(),
         redefinition = jsonb_build_object('state', 'switched', 'statement', s.statement,
                                           'previous', t.statement, 'since', t.redefinition->'since',
                                           'at', now(), 'changes', plan->'changes',
                                           'deleted', deleted, 'written', written, 'logged', logged,
                                           'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2),
                                           'readersBlockedMs', 0, 'staged', true)
   WHERE y.id = s.id;
  EXECUTE 'DROP TABLE ' || shadow_rel;
  RETURN jsonb_build_object('switched', true, 'target', t.target_name, 'changes', plan->'changes',
                            'deleted', deleted, 'written', written, 'logged', logged,
                            'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2),
                            'readersBlockedMs', 0, 'staged', true);
END
$fn$;

-- The log triggers left on targets after their redefinition ended (their log table gone):
-- dropped, one table at a time, where no transaction has held a lock on the table for longer
-- than `older_ms` (DROP TRIGGER takes ACCESS EXCLUSIVE, briefly: a catalog change). Returns
-- how many tables still carry some (tried again later).
CREATE FUNCTION @schema@._redefine_log_cleanup(older_ms float8)
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
  tg record;
  left_ int := 0;
BEGIN
  FOR r IN SELECT DISTINCT g.tgrelid FROM pg_trigger g
            WHERE starts_with(g.tgname, 'trellis_log#')
              AND to_regclass(quote_ident(@schema_literal@) || '.' || quote_ident('redefine_log#' || split_part(g.tgname, '#', 2))) IS NULL LOOP
    IF jsonb_array_length(@schema@._redefine_blockers(r.tgrelid, 'ACCESS EXCLUSIVE', older_ms)) > 0 THEN
      left_ := left_ + 1;
      CONTINUE;
    END IF;
    FOR tg IN SELECT g.tgname FROM pg_trigger g
               WHERE g.tgrelid = r.tgrelid AND starts_with(g.tgname, 'trellis_log#')
                 AND to_regclass(quote_ident(@schema_literal@) || '.' || quote_ident('redefine_log#' || split_part(g.tgname, '#', 2))) IS NULL LOOP
      EXECUTE format('DROP TRIGGER %I ON %s', tg.tgname, r.tgrelid::regclass);
    END LOOP;
  END LOOP;
  RETURN left_;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
