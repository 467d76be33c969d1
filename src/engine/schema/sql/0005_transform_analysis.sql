-- Analysis of a parsed TRANSFORM (see 0003 for the AST): resolves its tables, has
-- Postgres check every part (naming the part when it refuses one), decides the output
-- names, types and the target's key, and records what each column reads. Creates nothing.
--
-- The key: a projection or join is keyed by the primary keys of the rows it joins (one
-- target row per source row combination); an aggregate by its GROUP BY expressions (a
-- grand total has no key: one row). A key the SELECT list does not carry as a bare column
-- is added as an implicit column, named after the source column (or alias_column when
-- that name is taken).
--
-- Returns the spec the catalog stores:
--   {ast, sources: [{ordinal, oid, schema, name, alias, qualified, join_type, on,
--                    key_columns, key_types, target_key_columns, read_columns}],
--    from_sql, aggregates,
--    columns: [{name, expression, type, collation, is_key, implicit, notnull,
--               reads: [{source, column}]}],
--    key: [names], key_nullable,
--    groups: [{expr, type, collation, plain, reads}],
--    joins: [{join, left, left_attnum, right, right_attnum}]}
-- and per source also join_columns and group_columns (the columns an index should lead
-- with for the drain to find rows by join condition or group).
CREATE FUNCTION @schema@._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  sources jsonb;
  src jsonb;
  j jsonb;
  n int;
  i int;
  k int;
  from_sql text;
  cross_sql text;
  group_list text := '';
  grouping text;
  has_group boolean := jsonb_array_length(ast->'group_by') > 0;
  aggregates boolean;
  item jsonb;
  expr text;
  name text;
  info jsonb;
  items jsonb := '[]';
  groups jsonb := '[]';
  full_sql text;
  full_info jsonb;
  columns jsonb := '[]';
  col jsonb;
  key_names text[] := '{}';
  key_nullable boolean := false;
  taken text[];
  implicit_name text;
  found_name text;
  resolved_select jsonb := '[]';
  joins jsonb := '[]';
  group_specs jsonb := '[]';
  bad record;
  -- Names Postgres reserves for system columns: no target column can have one (CREATE
  -- TABLE would fail with an internal error), so they are refused, or never chosen.
  system_columns text[] := ARRAY['tableoid', 'xmin', 'cmin', 'xmax', 'cmax', 'ctid'];
BEGIN
  -- Tables, in order: the FROM source, then each joined table.
  sources := jsonb_build_array(
    @schema@._resolve_source(ast->'from', 'source')
      || jsonb_build_object('ordinal', 0, 'join_type', NULL, 'on', NULL));
  i := 0;
  FOR j IN SELECT value FROM jsonb_array_elements(ast->'joins') LOOP
    i := i + 1;
    sources := sources || jsonb_build_array(
      @schema@._resolve_source(j, 'joined')
        || jsonb_build_object('ordinal', i, 'join_type', j->>'type', 'on', j->>'on'));
  END LOOP;
  n := jsonb_array_length(sources);
  SELECT e->>'alias' AS alias INTO bad
    FROM jsonb_array_elements(sources) e GROUP BY e->>'alias' HAVING count(*) > 1 LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01',
      format('the name %I stands for two tables: give each an alias', bad.alias));
  END IF;

  -- FROM with its join conditions, each checked as it is added; and the same tables as a
  -- comma list (no join conditions, and no range-table entries but the tables'), to ask
  -- Postgres about one expression at a time.
  from_sql := (sources->0->>'qualified') || ' AS ' || quote_ident(sources->0->>'alias');
  cross_sql := from_sql;
  FOR i IN 1 .. n - 1 LOOP
    src := sources->i;
    from_sql := from_sql
      || CASE src->>'join_type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
      || (src->>'qualified') || ' AS ' || quote_ident(src->>'alias')
      || ' ON (' || (src->>'on') || ')';
    PERFORM @schema@._analyze_query('SELECT 1 FROM ' || from_sql,
      format('in JOIN %s ON %s', src->>'qualified', src->>'on'));
    cross_sql := cross_sql || ', ' || (src->>'qualified') || ' AS ' || quote_ident(src->>'alias');
    -- The join's equi-join columns on either side (for source index gaps).
    info := @schema@._analyze_query('SELECT 1 FROM ' || cross_sql || ' WHERE (' || (src->>'on') || ')',
      format('in JOIN %s ON %s', src->>'qualified', src->>'on'));
    FOR j IN SELECT value FROM jsonb_array_elements(info->'equalities') LOOP
      IF (j->>'left')::int <= i AND (j->>'right')::int <= i
         AND ((j->>'left')::int = i OR (j->>'right')::int = i) THEN
        joins := joins || jsonb_build_array(j || jsonb_build_object('join', i));
      END IF;
    END LOOP;
  END LOOP;

  IF ast->>'where' IS NOT NULL THEN
    PERFORM @schema@._analyze_query(
      'SELECT 1 FROM ' || from_sql || ' WHERE (' || (ast->>'where') || ')', 'in WHERE');
  END IF;

  -- GROUP BY expressions, each on its own.
  k := 0;
  FOR expr IN SELECT value FROM jsonb_array_elements_text(ast->'group_by') LOOP
    k := k + 1;
    IF expr ~ '^\s*\d+\s*$' THEN
      PERFORM @schema@._fail('TRV01', format(
        'GROUP BY item %s is a number: write the expression it stands for (output positions are not supported)', k));
    END IF;
    PERFORM @schema@._analyze_query('SELECT 1 FROM ' || from_sql || ' GROUP BY ' || expr,
      format('in GROUP BY item %s (%s)', k, expr));
    info := @schema@._analyze_query('SELECT ' || expr || ' FROM ' || cross_sql,
      format('in GROUP BY item %s (%s)', k, expr));
    groups := groups || jsonb_build_array(jsonb_build_object('expr', expr, 'info', info));
    group_list := group_list || CASE WHEN k > 1 THEN ', ' ELSE '' END || expr;
  END LOOP;

  -- SELECT items, each on its own: output name, type, what it reads.
  k := 0;
  aggregates := has_group OR ast->>'having' IS NOT NULL;
  FOR item IN SELECT value FROM jsonb_array_elements(ast->'select') LOOP
    k := k + 1;
    expr := item->>'expr';
    info := @schema@._analyze_query('SELECT ' || expr || ' FROM ' || cross_sql,
      format('in SELECT item %s (%s)', k, expr), true);
    IF info IS NULL THEN
      -- Mixes grouped columns and aggregates: ask again with the grouping.
      aggregates := true;
      info := @schema@._analyze_query(
        'SELECT ' || expr || ' FROM ' || from_sql || ' GROUP BY ' || coalesce(nullif(group_list, ''), '()'),
        format('in SELECT item %s (%s)', k, expr));
      info := info || jsonb_build_object('has_aggs', true, 'plain', NULL);
    END IF;
    name := item->>'name';
    IF name IS NULL AND item->>'bare_label' IS NOT NULL
       AND info->'columns'->0->>'name' = item->>'bare_label' THEN
      -- Postgres read the last word as the column's label.
      name := item->>'bare_label';
      expr := item->>'label_expr';
    END IF;
    IF name IS NULL THEN
      name := info->'columns'->0->>'name';
      IF name = '?column?' THEN
        PERFORM @schema@._fail('TRV01', format(
          'SELECT item %s (%s) needs a name: write it as %s AS name', k, expr, expr));
      END IF;
    END IF;
    IF octet_length(name) > 63 THEN
      PERFORM @schema@._fail('TRV01', format('column name %s is longer than 63 bytes', name));
    END IF;
    IF name = ANY (system_columns) THEN
      PERFORM @schema@._fail('TRV01', format(
        'SELECT item %s (%s) would be a column named %I, a name Postgres reserves for a system column: choose another name',
        k, expr, name));
    END IF;
    IF (info->>'has_window')::boolean THEN
      PERFORM @schema@._fail('TRV01', format(
        'SELECT item %s (%s) uses a window function: not supported in a transform (a row''s value would depend on other rows)', k, expr));
    END IF;
    IF (info->>'has_srf')::boolean THEN
      PERFORM @schema@._fail('TRV01', format(
        'SELECT item %s (%s) calls a set-returning function: not supported in a transform', k, expr));
    END IF;
    IF (info->>'has_aggs')::boolean THEN
      aggregates := true;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object('expr', expr, 'name', name, 'info', info));
    resolved_select := resolved_select || jsonb_build_array(jsonb_build_object(
      'expr', expr, 'name', name, 'bare_label', NULL, 'label_expr', NULL, 'position', item->'position'));
  END LOOP;

  SELECT x->>'name' AS name INTO bad
    FROM jsonb_array_elements(items) x GROUP BY x->>'name' HAVING count(*) > 1 LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format('two columns are named %I: give each its own name', bad.name));
  END IF;

  grouping := coalesce(nullif(group_list, ''), '()');
  IF aggregates THEN
    k := 0;
    FOR item IN SELECT value FROM jsonb_array_elements(items) LOOP
      k := k + 1;
      PERFORM @schema@._analyze_query(
        'SELECT ' || (item->>'expr') || ' FROM ' || from_sql || ' GROUP BY ' || grouping,
        format('in SELECT item %s (%s)', k, item->>'expr'));
    END LOOP;
  END IF;
  IF ast->>'having' IS NOT NULL THEN
    PERFORM @schema@._analyze_query(
      'SELECT 1 FROM ' || from_sql || ' GROUP BY ' || grouping || ' HAVING (' || (ast->>'having') || ')',
      'in HAVING');
  END IF;

  -- Output columns, in SELECT order.
  taken := ARRAY(SELECT x->>'name' FROM jsonb_array_elements(items) x) || system_columns;
  FOR item IN SELECT value FROM jsonb_array_elements(items) LOOP
    columns := columns || jsonb_build_array(jsonb_build_object(
      'name', item->>'name', 'expression', item->>'expr',
      'type', item->'info'->'columns'->0->>'type',
      'collation', item->'info'->'columns'->0->'collation',
      'is_key', false, 'implicit', false, 'notnull', false,
      'plain', item->'info'->'plain',
      'reads', @schema@._reads_by_source(item->'info', sources)));
  END LOOP;

  -- The key.
  IF NOT aggregates THEN
    FOR i IN 0 .. n - 1 LOOP
      src := sources->i;
      FOR k IN 0 .. jsonb_array_length(src->'key_columns') - 1 LOOP
        found_name := NULL;
        SELECT c->>'name' INTO found_name
          FROM jsonb_array_elements(columns) c
         WHERE (c->'plain'->>'source')::int = i
           AND (c->'plain'->>'attnum')::int = (
             SELECT a.attnum FROM pg_attribute a
              WHERE a.attrelid = (src->>'oid')::oid AND a.attname = src->'key_columns'->>k)
           AND NOT (c->>'is_key')::boolean
         LIMIT 1;
        IF found_name IS NULL THEN
          implicit_name := src->'key_columns'->>k;
          IF implicit_name = ANY (taken) THEN
            implicit_name := (src->>'alias') || '_' || implicit_name;
          END IF;
          IF implicit_name = ANY (taken) OR octet_length(implicit_name) > 63 THEN
            PERFORM @schema@._fail('TRV01', format(
              'the target needs a column for %s.%I (part of its key), and the name %I is taken: select %s.%I under a name of your choice',
              src->>'alias', src->'key_columns'->>k, implicit_name, src->>'alias', src->'key_columns'->>k));
          END IF;
          taken := taken || implicit_name;
          SELECT columns || jsonb_build_array(jsonb_build_object(
                   'name', implicit_name,
                   'expression', quote_ident(src->>'alias') || '.' || quote_ident(a.attname),
                   'type', format_type(a.atttypid, a.atttypmod),
                   'collation', CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN
                     (SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                        FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                       WHERE co.oid = a.attcollation) END,
                   'is_key', true, 'implicit', true, 'notnull', false,
                   'plain', jsonb_build_object('source', i, 'attnum', a.attnum),
                   'reads', jsonb_build_array(jsonb_build_object('source', i, 'column', a.attname))))
            INTO columns
            FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
           WHERE a.attrelid = (src->>'oid')::oid AND a.attname = src->'key_columns'->>k;
          found_name := implicit_name;
        ELSE
          columns := (SELECT jsonb_agg(CASE WHEN c->>'name' = found_name
                                            THEN c || '{"is_key": true}' ELSE c END ORDER BY o)
                        FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o));
        END IF;
        key_names := key_names || found_name;
        sources := jsonb_set(sources, ARRAY[i::text, 'target_key_columns'],
          coalesce(sources->i->'target_key_columns', '[]') || to_jsonb(found_name));
        IF src->>'join_type' = 'left' THEN
          key_nullable := true;
        END IF;
      END LOOP;
    END LOOP;
  ELSE
    k := 0;
    FOR j IN SELECT value FROM jsonb_array_elements(groups) LOOP
      k := k + 1;
      found_name := NULL;
      IF j->'info'->'plain' IS NOT NULL AND j->'info'->'plain' <> 'null' THEN
        SELECT c->>'name' INTO found_name FROM jsonb_array_elements(columns) c
         WHERE c->'plain' = j->'info'->'plain' AND NOT (c->>'is_key')::boolean LIMIT 1;
      END IF;
      IF found_name IS NULL THEN
        SELECT c->>'name' INTO found_name FROM jsonb_array_elements(columns) c
         WHERE c->>'expression' = j->>'expr' AND NOT (c->>'is_key')::boolean LIMIT 1;
      END IF;
      IF found_name IS NULL THEN
        implicit_name := j->'info'->'columns'->0->>'name';
        IF implicit_name = ANY (taken) AND j->'info'->'plain' IS NOT NULL AND j->'info'->'plain' <> 'null' THEN
          implicit_name := (sources->((j->'info'->'plain'->>'source')::int)->>'alias') || '_' || implicit_name;
        END IF;
        IF implicit_name = '?column?' OR implicit_name = ANY (taken) THEN
          PERFORM @schema@._fail('TRV01', format(
            'GROUP BY item %s (%s) is the target''s key: add it to the SELECT list under a name', k, j->>'expr'));
        END IF;
        taken := taken || implicit_name;
        columns := columns || jsonb_build_array(jsonb_build_object(
          'name', implicit_name, 'expression', j->>'expr',
          'type', j->'info'->'columns'->0->>'type',
          'collation', j->'info'->'columns'->0->'collation',
          'is_key', true, 'implicit', true, 'notnull', false,
          'plain', j->'info'->'plain',
          'reads', @schema@._reads_by_source(j->'info', sources)));
        found_name := implicit_name;
      ELSE
        columns := (SELECT jsonb_agg(CASE WHEN c->>'name' = found_name
                                          THEN c || '{"is_key": true}' ELSE c END ORDER BY o)
                      FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o));
      END IF;
      key_names := key_names || found_name;
    END LOOP;
  END IF;

  -- Key columns that can never be NULL: source keys on the non-nullable side of every
  -- join, and GROUP BY expressions that are bare NOT NULL columns of such a source.
  columns := (
    SELECT jsonb_agg(c || jsonb_build_object('notnull',
             (c->>'is_key')::boolean
             AND c->'plain' IS NOT NULL AND c->'plain' <> 'null'
             AND coalesce(sources->((c->'plain'->>'source')::int)->>'join_type', 'inner') <> 'left'
             AND (SELECT a.attnotnull FROM pg_attribute a
                   WHERE a.attrelid = (sources->((c->'plain'->>'source')::int)->>'oid')::oid
                     AND a.attnum = (c->'plain'->>'attnum')::int))
           ORDER BY o)
      FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o));
  key_nullable := EXISTS (
    SELECT 1 FROM jsonb_array_elements(columns) c
     WHERE (c->>'is_key')::boolean AND NOT (c->>'notnull')::boolean);

  -- GROUP BY expressions as the key map stores them: typed, and the bare source column
  -- each is, if any (for source index gaps).
  FOR j IN SELECT value FROM jsonb_array_elements(groups) LOOP
    group_specs := group_specs || jsonb_build_array(jsonb_build_object(
      'expr', j->>'expr',
      'type', j->'info'->'columns'->0->>'type',
      'collation', j->'info'->'columns'->0->'collation',
      'plain', j->'info'->'plain',
      'reads', @schema@._reads_by_source(j->'info', sources)));
  END LOOP;

  -- The whole definition, as Postgres sees it.
  full_sql := 'SELECT ' || (
      SELECT string_agg((c->>'expression') || ' AS ' || quote_ident(c->>'name'), ', ' ORDER BY o)
        FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o))
    || ' FROM ' || from_sql
    || coalesce(' WHERE (' || (ast->>'where') || ')', '')
    || CASE WHEN has_group THEN ' GROUP BY ' || group_list ELSE '' END
    || coalesce(' HAVING (' || (ast->>'having') || ')', '');
  full_info := @schema@._analyze_query(full_sql, 'in the definition');

  -- Every table it reads must be a source, read only where the statement names it:
  -- changes to any other table would never reach the target.
  SELECT r.relid::oid::regclass AS rel, count(*) AS uses INTO bad
    FROM jsonb_array_elements_text(full_info->'relids') AS r(relid)
   GROUP BY r.relid
  HAVING count(*) > (SELECT count(*) FROM jsonb_array_elements(sources) s WHERE (s->>'oid') = r.relid)
   LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'the definition reads %s in a subquery: subqueries that read tables are not supported (changes to what they read would not reach the target)',
      bad.rel));
  END IF;
  SELECT p.oid::regprocedure AS fn INTO bad
    FROM pg_proc p
   WHERE p.provolatile = 'v'
     AND p.oid IN (SELECT f::oid FROM jsonb_array_elements_text(full_info->'functions') f
                   UNION SELECT f::oid FROM jsonb_array_elements_text(full_info->'operator_functions') f)
   LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'the definition calls the volatile function %s: a re-derived row must come out the same every time',
      bad.fn));
  END IF;
  SELECT c->>'name' AS name, c->>'type' AS type INTO bad
    FROM jsonb_array_elements(full_info->'columns') c WHERE c->>'typtype' = 'p' LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'column %I would have type %s, which a table column cannot have: cast it to a concrete type',
      bad.name, bad.type));
  END IF;
  -- Final types come from the whole definition (a GROUP BY can change nothing here, but
  -- this is the query the engine runs).
  columns := (
    SELECT jsonb_agg(c || jsonb_build_object('type', f->>'type', 'collation', f->'collation') ORDER BY o)
      FROM jsonb_array_elements(columns) WITH ORDINALITY AS x(c, o)
      JOIN jsonb_array_elements(full_info->'columns') WITH ORDINALITY AS y(f, p) ON p = o);

  -- What each source must capture: every column the definition reads, and its key.
  FOR i IN 0 .. n - 1 LOOP
    src := sources->i;
    sources := jsonb_set(sources, ARRAY[i::text, 'read_columns'], to_jsonb(ARRAY(
      SELECT DISTINCT a.attname::text FROM pg_attribute a
       WHERE a.attrelid = (src->>'oid')::oid AND a.attnum > 0 AND NOT a.attisdropped
         AND ((full_info->>'whole_row')::boolean
              OR a.attname::text IN (SELECT jsonb_array_elements_text(src->'key_columns'))
              OR a.attnum IN (SELECT (r->>'attnum')::int FROM jsonb_array_elements(full_info->'reads') r
                               WHERE (r->>'rel')::oid = (src->>'oid')::oid))
       ORDER BY 1)));
    sources := jsonb_set(sources, ARRAY[i::text, 'join_columns'], to_jsonb(ARRAY(
      SELECT DISTINCT a.attname::text
        FROM jsonb_array_elements(joins) e
        JOIN pg_attribute a ON a.attrelid = (src->>'oid')::oid
         AND a.attnum = CASE WHEN (e->>'left')::int = i THEN (e->>'left_attnum')::int
                             ELSE (e->>'right_attnum')::int END
       WHERE (e->>'left')::int = i OR (e->>'right')::int = i
       ORDER BY 1)));
    sources := jsonb_set(sources, ARRAY[i::text, 'group_columns'], to_jsonb(ARRAY(
      SELECT DISTINCT r->>'column'
        FROM jsonb_array_elements(group_specs) g, jsonb_array_elements(g->'reads') r
       WHERE (r->>'source')::int = i
       ORDER BY 1)));
    IF NOT (sources->i ? 'target_key_columns') THEN
      sources := jsonb_set(sources, ARRAY[i::text, 'target_key_columns'],
        CASE WHEN aggregates THEN 'null'::jsonb ELSE '[]'::jsonb END);
    END IF;
  END LOOP;

  RETURN jsonb_build_object(
    'ast', jsonb_set(
      jsonb_set(ast, '{select}', resolved_select),
      '{from,schema}', to_jsonb(sources->0->>'schema'))
      || jsonb_build_object('joins', coalesce((
           SELECT jsonb_agg(jn || jsonb_build_object('schema', sources->(o::int)->>'schema') ORDER BY o)
             FROM jsonb_array_elements(ast->'joins') WITH ORDINALITY AS x(jn, o)), '[]')),
    'sources', sources,
    'from_sql', from_sql,
    'aggregates', aggregates,
    'columns', columns,
    'key', to_jsonb(key_names),
    'key_nullable', key_nullable,
    'groups', group_specs,
    'joins', joins);
END
$fn$;

-- The columns a query (analysed by _analyze_query) reads, as [{source, column}] of the
-- statement's sources; a whole-row reference counts as every column.
CREATE FUNCTION @schema@._reads_by_source(info jsonb, sources jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object('source', (s->>'ordinal')::int, 'column', a.attname)), '[]')
    FROM jsonb_array_elements(sources) s
    JOIN pg_attribute a ON a.attrelid = (s->>'oid')::oid AND a.attnum > 0 AND NOT a.attisdropped
   WHERE (info->>'whole_row')::boolean
      OR EXISTS (SELECT 1 FROM jsonb_array_elements(info->'reads') r
                  WHERE (r->>'rel')::oid = (s->>'oid')::oid AND (r->>'attnum')::int = a.attnum)
$fn$;
