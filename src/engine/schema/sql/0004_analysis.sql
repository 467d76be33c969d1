-- Validation by Postgres itself. A TRANSFORM is checked by having Postgres analyse
-- queries built from its parts (as temporary views, which are parsed and typed but never
-- run), then reading back what Postgres decided: output names and types, the columns and
-- functions the query depends on (pg_depend), and flags of its query tree (pg_rewrite).

-- Raises one of Trellis's own errors (codes in src/engine/sqlstate.ts).
CREATE FUNCTION @schema@._fail(code text, message text, hint text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF hint IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
  END IF;
  RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, HINT = hint;
END
$fn$;

-- What Postgres makes of `query` (a SELECT): raises a validation error prefixed with `what`
-- when Postgres refuses it. Returns
--   columns:  [{name, type, type_oid, typtype, collation}] in output order
--   reads:    [{rel, attnum, attname}] columns the query reads (pg_depend)
--   relids:   the relations in its range tables, once per occurrence (subqueries included)
--   whole_row: whether it reads some table's whole row (then every column counts as read)
--   functions, operator_functions: function OIDs it calls
--   has_aggs, has_window, has_srf, has_sublinks: flags of the top-level query
--   plain: {source, attnum} when the first output is a bare column of the `source`-th table
--          in FROM (0-based), else null (FROM must be a comma list of tables for these
--          positions to hold: explicit JOINs add range-table entries of their own)
--   equalities: [{left, left_attnum, right, right_attnum}] bare-column equalities
-- With `tolerate_grouping`, a grouping error (a column neither grouped nor aggregated)
-- returns NULL instead, so the caller can ask again with the GROUP BY.
CREATE FUNCTION @schema@._analyze_query(query text, what text, tolerate_grouping boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  view_oid oid;
  rule_oid oid;
  action text;
  tlist text;
  own_rtes int;
  plain jsonb;
  m text[];
  result jsonb;
BEGIN
  DROP VIEW IF EXISTS pg_temp.trellis_analysis;
  BEGIN
    EXECUTE 'CREATE TEMP VIEW trellis_analysis AS ' || query;
  EXCEPTION
    WHEN insufficient_privilege OR query_canceled OR lock_not_available THEN
      RAISE;
    WHEN grouping_error THEN
      IF tolerate_grouping THEN
        RETURN NULL;
      END IF;
      PERFORM @schema@._fail('TRV01', what || ': ' || SQLERRM);
    -- Also invalid_schema_name (3F000: a schema-qualified function, type or regnamespace
    -- literal naming no schema, as in `o.c(1)` or `1::nope.t`) and program_limit_exceeded
    -- (54xxx: nesting too deep, too many output columns): both say what is wrong with the
    -- statement, and would otherwise leak as internal `database` errors.
    WHEN syntax_error_or_access_rule_violation OR data_exception OR feature_not_supported
         OR invalid_schema_name OR program_limit_exceeded THEN
      PERFORM @schema@._fail('TRV01', what || ': ' || SQLERRM);
  END;
  view_oid := 'pg_temp.trellis_analysis'::regclass;
  SELECT r.oid, r.ev_action::text INTO rule_oid, action
    FROM pg_rewrite r WHERE r.ev_class = view_oid;

  -- Postgres 15 stores two range-table entries (OLD, NEW) for the view itself before the
  -- query's own tables; later versions store none. Count them to map indexes to tables.
  SELECT count(*) INTO own_rtes
    FROM regexp_matches(action, ':rtekind 0 :relid ' || view_oid || ' ', 'g');
  -- The first :targetList in the text is the top-level one when FROM has no conditions,
  -- which is how callers ask about a single expression.
  tlist := substr(action, position(':targetList (' IN action) + length(':targetList ('));
  m := regexp_match(tlist, '^\{TARGETENTRY :expr \{VAR :varno (\d+) :varattno (\d+) ');
  IF m IS NOT NULL THEN
    plain := jsonb_build_object('source', m[1]::int - 1 - own_rtes, 'attnum', m[2]::int);
  END IF;

  SELECT jsonb_build_object(
    'columns', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'name', a.attname,
               'type', format_type(a.atttypid, a.atttypmod),
               'type_oid', a.atttypid,
               'typtype', t.typtype,
               'collation', CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN
                 (SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                    FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                   WHERE co.oid = a.attcollation) END)
             ORDER BY a.attnum), '[]')
        FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
       WHERE a.attrelid = view_oid AND a.attnum > 0 AND NOT a.attisdropped),
    'reads', (
      SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object(
               'rel', d.refobjid, 'attnum', d.refobjsubid, 'attname', a.attname)), '[]')
        FROM pg_depend d
        JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
       WHERE d.classid = 'pg_rewrite'::regclass AND d.objid = rule_oid
         AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> view_oid
         AND d.refobjsubid > 0),
    'relids', (
      SELECT coalesce(jsonb_agg(r[1]::oid), '[]')
        FROM regexp_matches(action, ':rtekind 0 :relid (\d+) ', 'g') AS r
       WHERE r[1]::oid <> view_oid),
    'whole_row', action ~ '\{VAR :varno \d+ :varattno 0 ',
    -- Functions and operators come from the query tree itself: pg_depend does not record
    -- dependencies on built-in (pinned) objects such as random().
    'functions', (
      SELECT coalesce(jsonb_agg(DISTINCT f[1]::oid), '[]')
        FROM regexp_matches(action, ':(?:funcid|aggfnoid|winfnoid) (\d+)', 'g') AS f),
    'operator_functions', (
      SELECT coalesce(jsonb_agg(DISTINCT o.oprcode::oid), '[]')
        FROM regexp_matches(action, ':opno (\d+)', 'g') AS r
        JOIN pg_operator o ON o.oid = r[1]::oid),
    -- Equalities between two bare columns (join conditions), as source positions in FROM
    -- (0-based) and attribute numbers: what a join needs indexed.
    'equalities', (
      SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object(
               'left', e[2]::int - 1 - own_rtes, 'left_attnum', e[3]::int,
               'right', e[4]::int - 1 - own_rtes, 'right_attnum', e[5]::int)), '[]')
        FROM regexp_matches(action,
               '\{OPEXPR :opno (\d+) :opfuncid \d+ :opresulttype \d+ :opretset \w+ :opcollid \d+ :inputcollid \d+ :args \(\{VAR :varno (\d+) :varattno (\d+) [^}]*:varlevelsup 0 [^}]*\} \{VAR :varno (\d+) :varattno (\d+) [^}]*:varlevelsup 0 [^}]*\}\)',
               'g') AS e
        JOIN pg_operator o ON o.oid = e[1]::oid
       WHERE o.oprname = '=' AND e[2] <> e[4]),
    'has_aggs', substring(action FROM ':hasAggs (true|false)') = 'true',
    'has_window', substring(action FROM ':hasWindowFuncs (true|false)') = 'true',
    'has_srf', substring(action FROM ':hasTargetSRFs (true|false)') = 'true',
    'has_sublinks', substring(action FROM ':hasSubLinks (true|false)') = 'true',
    'plain', plain
  ) INTO result;
  DROP VIEW pg_temp.trellis_analysis;
  RETURN result;
END
$fn$;

-- A FROM/JOIN table of a statement, resolved through Postgres (search_path included):
-- {oid, schema, name, alias, qualified, key_columns, key_types, key_notnull}.
CREATE FUNCTION @schema@._resolve_source(src jsonb, role text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  written text;
  rel regclass;
  r record;
  keys name[];
  key_types text[];
BEGIN
  written := CASE WHEN src->>'schema' IS NULL THEN quote_ident(src->>'name')
                  ELSE quote_ident(src->>'schema') || '.' || quote_ident(src->>'name') END;
  rel := to_regclass(written);
  IF rel IS NULL THEN
    PERFORM @schema@._fail('TRV01', format('%s table %s does not exist', role, written));
  END IF;
  SELECT c.relkind, c.relpersistence, n.nspname, c.relname INTO r
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
  IF r.relkind NOT IN ('r', 'p') THEN
    PERFORM @schema@._fail('TRV01', format('%s %s is a %s: sources must be tables', role, written,
      CASE r.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
        WHEN 'f' THEN 'foreign table' WHEN 'S' THEN 'sequence' ELSE 'relation of kind ' || r.relkind::text END));
  END IF;
  IF r.relpersistence = 't' THEN
    PERFORM @schema@._fail('TRV01', format('%s %s is a temporary table: sources must be permanent tables', role, written));
  END IF;
  IF r.nspname = @schema_literal@ THEN
    PERFORM @schema@._fail('TRV01', format('%s %s is one of Trellis''s own tables', role, written));
  END IF;
  -- Another transform's target in the middle of its build may be without its key (see
  -- _restore_deferred_ddl in 0007_pipeline.sql, which exists by the time this runs).
  PERFORM @schema@._restore_deferred_ddl(rel);
  SELECT array_agg(a.attname ORDER BY k.i), array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY k.i)
    INTO keys, key_types
    FROM pg_index x
    CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
    JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
   WHERE x.indrelid = rel AND x.indisprimary;
  IF keys IS NULL THEN
    PERFORM @schema@._fail('TRV01',
      format('%s %I.%I has no primary key: Trellis keys target rows by their source rows'' keys',
             role, r.nspname, r.relname),
      'add one, e.g. ALTER TABLE ' || quote_ident(r.nspname) || '.' || quote_ident(r.relname) || ' ADD PRIMARY KEY (...)');
  END IF;
  RETURN jsonb_build_object(
    'oid', rel::oid, 'schema', r.nspname, 'name', r.relname,
    'alias', coalesce(src->>'alias', r.relname),
    'qualified', quote_ident(r.nspname) || '.' || quote_ident(r.relname),
    'key_columns', to_jsonb(keys), 'key_types', to_jsonb(key_types));
END
$fn$;
