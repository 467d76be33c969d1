-- Never silently wrong (issue #8, ADR 0008): what a transform needs to notice a change to
-- its sources that the ledger cannot carry (DDL), stop with a reason, and be rebuilt; key
-- maps that route a change through the join rows it was part of, filtered ones included;
-- and the checks a definition must now pass (reserved names, function volatility).

-- Why a transform stopped reading its sources correctly, while it is paused for it:
-- {kind: 'capture', error: a sentence naming table, column and change, columns:
-- ["schema.table.column", ...], detected_at}.
ALTER TABLE @schema@.transforms ADD COLUMN capture_failure jsonb;

-- The source columns a transform reads, as they were when it was defined (or last
-- rebuilt): [{name, attnum, type}]. The staging worker compares them with the table as it
-- is: a column dropped, renamed or retyped (or, for a definition reading whole rows, any
-- column added or removed) stops the transform.
ALTER TABLE @schema@.transform_sources ADD COLUMN read_attrs jsonb;

-- A key column's type as keys are cast back to it from the ledger's text: with its
-- collation when that is not the type's own. Keys are compared, deduplicated and looked
-- up the way the table's key compares them: under a case-blind collation 'a' and 'A' are
-- one key, and the drain must not re-derive that row twice.
CREATE FUNCTION @schema@._key_type(rel oid, attnum int2)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
                 THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname) ELSE '' END
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    LEFT JOIN pg_collation co ON co.oid = a.attcollation
    LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
   WHERE a.attrelid = rel AND a.attnum = _key_type.attnum
$fn$;

-- _resolve_source, as before (0004), with key types from _key_type.
CREATE OR REPLACE FUNCTION @schema@._resolve_source(src jsonb, role text)
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
  SELECT array_agg(a.attname ORDER BY k.i), array_agg(@schema@._key_type(a.attrelid, a.attnum) ORDER BY k.i)
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


-- Records read_attrs for every source of a transform, from the tables as they are now.
CREATE FUNCTION @schema@._record_read_attrs(p_transform_id int)
RETURNS void LANGUAGE sql AS $fn$
  UPDATE @schema@.transform_sources ts
     SET read_attrs = (
       SELECT coalesce(jsonb_agg(jsonb_build_object(
                'name', a.attname, 'attnum', a.attnum,
                'type', format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]')
         FROM pg_attribute a
        WHERE a.attrelid = ts.source_oid AND a.attnum > 0 AND NOT a.attisdropped
          AND a.attname = ANY (ts.read_columns))
   WHERE ts.transform_id = p_transform_id;
$fn$;

-- Which key map a transform keeps (see _create_key_map): 'groups' for a GROUP BY, 'rows'
-- for a join with a WHERE, NULL for none.
CREATE FUNCTION @schema@._key_map_kind(spec jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN 'groups'
    WHEN jsonb_array_length(spec->'sources') > 1 AND spec->'ast'->>'where' IS NOT NULL THEN 'rows'
  END
$fn$;

-- The key map of a transform: one row per join row (source row combination), holding
-- every source's key (k<source>_<n>). The drain finds there the join rows a changed row
-- was part of: the old state, which the sources no longer show.
--  - 'groups' (GROUP BY): with the row's group (g<n>) and whether it passes WHERE
--    (passes); a join keeps every join row, a single table only those that pass.
--  - 'rows' (a join with a WHERE): every join row, before WHERE. A row a WHERE filtered
--    out is in no target row, yet a change to it can make another row appear: a LEFT JOIN
--    row that loses its last match turns into a NULL-extended row that may pass.
-- Joins without a WHERE need no map: the target holds every join row's keys.
-- Indexed by each source's key, to find the rows a changed source row was part of.
CREATE OR REPLACE FUNCTION @schema@._create_key_map(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := quote_ident(@schema_literal@) || '.' || quote_ident('map_' || transform_id);
  kind text := @schema@._key_map_kind(spec);
  src jsonb;
BEGIN
  IF kind IS NULL THEN
    RETURN;
  END IF;
  EXECUTE 'CREATE TABLE ' || map_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT (s->>'ordinal')::int AS o1, k.o AS o2,
             quote_ident(format('k%s_%s', s->>'ordinal', k.o)) || ' ' || k.t AS col
        FROM jsonb_array_elements(spec->'sources') s,
             jsonb_array_elements_text(s->'key_types') WITH ORDINALITY AS k(t, o)
      UNION ALL
      SELECT 1000000, g.o, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '')
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 2000000, 0, 'passes boolean NOT NULL' WHERE kind = 'groups') c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
END
$fn$;

-- The checks a definition passes beyond what Postgres checks when it is analysed:
--  - no source alias starts with 'trellis#', the prefix of the names the engine gives its
--    own aliases and columns in generated SQL (src/engine/drain/sql-parts.ts), so an
--    expression can never resolve to one of them;
--  - every function it calls that is not built in (pg_catalog) is IMMUTABLE: a STABLE
--    one may read other tables, whose changes would never reach the target (VOLATILE
--    ones are refused by the analysis already).
-- Returns whether the definition reads some source's whole row.
CREATE FUNCTION @schema@._check_definition(spec jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  bad record;
  full_info jsonb;
BEGIN
  SELECT s->>'alias' AS alias INTO bad FROM jsonb_array_elements(spec->'sources') s
   WHERE starts_with(s->>'alias', 'trellis#') LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): give the table another alias',
      bad.alias));
  END IF;
  full_info := @schema@._analyze_query(
    'SELECT ' || (SELECT string_agg((c->>'expression') || ' AS ' || quote_ident(c->>'name'), ', ' ORDER BY o)
                    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o))
    || ' FROM ' || (spec->>'from_sql')
    || coalesce(' WHERE (' || (spec->'ast'->>'where') || ')', '')
    || CASE WHEN jsonb_array_length(spec->'ast'->'group_by') > 0
            THEN ' GROUP BY ' || (SELECT string_agg(g, ', ') FROM jsonb_array_elements_text(spec->'ast'->'group_by') g)
            ELSE '' END
    || coalesce(' HAVING (' || (spec->'ast'->>'having') || ')', ''),
    'in the definition');
  SELECT p.oid::regprocedure AS fn,
         CASE p.provolatile WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END AS volatility INTO bad
    FROM pg_proc p
   WHERE p.provolatile <> 'i' AND p.pronamespace <> 'pg_catalog'::regnamespace
     AND p.oid IN (SELECT f::oid FROM jsonb_array_elements_text(full_info->'functions') f
                   UNION SELECT f::oid FROM jsonb_array_elements_text(full_info->'operator_functions') f)
   LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'the definition calls %s, which is %s: it may read other tables, and their changes would never reach the target. Use only IMMUTABLE functions of your own (declare it IMMUTABLE if its result depends on its arguments alone)',
      bad.fn, bad.volatility));
  END IF;
  RETURN (full_info->>'whole_row')::boolean;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  tname text := ast->'target'->>'name';
  spec jsonb;
  v_oid oid;
  new_id int;
  normalised text;
BEGIN
  IF ast->'target'->>'schema' IS NOT NULL AND ast->'target'->>'schema' <> tschema THEN
    PERFORM @schema@._fail('TRV01', format(
      'targets live in schema %I (the instance''s target schema): write the target as %I', tschema, tname));
  END IF;
  IF octet_length(tname) > 63 THEN
    PERFORM @schema@._fail('TRV01', format('target name %s is longer than 63 bytes', tname));
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM @schema@._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  IF to_regclass(quote_ident(tschema) || '.' || quote_ident(tname)) IS NOT NULL THEN
    PERFORM @schema@._fail('TRV01', format(
      'the target %I.%I would clash with an existing relation of that name: choose another target name',
      tschema, tname));
  END IF;
  -- A table brings a row type of its name, so a type of that name (an enum, a domain...)
  -- is a clash too; but not an array type Postgres made for another type (CREATE TABLE
  -- renames it out of the way).
  IF EXISTS (SELECT 1 FROM pg_type ty JOIN pg_namespace n ON n.oid = ty.typnamespace
              WHERE n.nspname = tschema AND ty.typname = tname
                AND NOT EXISTS (SELECT 1 FROM pg_type el
                                 WHERE el.oid = ty.typelem AND el.typarray = ty.oid)) THEN
    PERFORM @schema@._fail('TRV01', format(
      'the target %I.%I would clash with an existing type of that name: choose another target name',
      tschema, tname));
  END IF;

  spec := @schema@._analyze_transform(ast);
  spec := jsonb_set(spec, '{ast,target}', jsonb_build_object('schema', NULL, 'name', tname));
  spec := spec || jsonb_build_object(
    'whole_row', @schema@._check_definition(spec),
    'key_map', @schema@._key_map_kind(spec));
  normalised := @schema@.render_statement(spec->'ast');
  v_oid := @schema@._create_target(tschema, tname, spec);

  INSERT INTO @schema@.transforms (target_schema, target_name, target_oid, statement, spec,
                                   aggregates, without_source_index, search_path)
  VALUES (tschema, tname, v_oid, normalised, spec,
          (spec->>'aggregates')::boolean, coalesce((ast->>'without_source_index')::boolean, false),
          array_to_string(ARRAY(SELECT quote_ident(s) FROM unnest(current_schemas(false)) AS s), ', '))
  RETURNING id INTO new_id;
  PERFORM @schema@._register(new_id, spec);
  PERFORM @schema@._record_read_attrs(new_id);
  PERFORM @schema@._create_key_map(new_id, spec);
  INSERT INTO @schema@.transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  SELECT new_id, o::int - 1, c->>'name', c->>'expression', c->>'type', c->>'collation',
         (c->>'is_key')::boolean, (c->>'implicit')::boolean, c->'reads'
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  RETURN jsonb_build_object('kind', 'transform_defined', 'target', tname);
END
$fn$;

-- ALTER ... ADD COLUMN: as before (0006), and the new column's reads are recorded.
CREATE OR REPLACE FUNCTION @schema@._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  new_ast jsonb;
  spec jsonb;
  col jsonb;
BEGIN
  IF EXISTS (SELECT 1 FROM @schema@.transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name') THEN
    PERFORM @schema@._fail('TRV01', format('transform %I already has a column %I', t.target_name, ast->>'name'));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', (t.spec->'ast'->'select') || jsonb_build_array(
    jsonb_build_object('expr', ast->>'expr', 'name', ast->>'name', 'bare_label', NULL,
                       'label_expr', NULL, 'position', NULL)));
  spec := @schema@._analyze_transform(new_ast);
  IF (spec->>'aggregates')::boolean <> t.aggregates THEN
    PERFORM @schema@._fail('TRV01', format(
      'column %I would make transform %I %s: define a new transform instead', ast->>'name', t.target_name,
      CASE WHEN t.aggregates THEN 'stop aggregating' ELSE 'aggregate' END));
  END IF;
  IF @schema@._check_definition(spec) AND NOT coalesce((t.spec->>'whole_row')::boolean, false) THEN
    UPDATE @schema@.transforms SET spec = spec || '{"whole_row": true}' WHERE id = t.id;
  END IF;
  SELECT c INTO col FROM jsonb_array_elements(spec->'columns') c WHERE c->>'name' = ast->>'name';
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' ADD COLUMN ' || quote_ident(col->>'name')
      || ' ' || (col->>'type') || coalesce(' COLLATE ' || (col->>'collation'), '');
  EXCEPTION WHEN program_limit_exceeded THEN
    -- Tables can have at most 1600 columns.
    PERFORM @schema@._fail('TRV01', format('column %I cannot be added to %I: %s', col->>'name', t.target_name, SQLERRM));
  END;
  INSERT INTO @schema@.transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  VALUES (t.id, (SELECT max(ordinal) + 1 FROM @schema@.transform_columns WHERE transform_id = t.id),
          col->>'name', col->>'expression', col->>'type', col->>'collation', false, false, col->'reads');
  -- Sources may now be read in more columns.
  UPDATE @schema@.transform_sources s
     SET read_columns = ARRAY(SELECT jsonb_array_elements_text(n->'read_columns'))::name[]
    FROM jsonb_array_elements(spec->'sources') n
   WHERE s.transform_id = t.id AND s.ordinal = (n->>'ordinal')::int;
  PERFORM @schema@._record_read_attrs(t.id);
  PERFORM @schema@._restate(t, new_ast);
  PERFORM @schema@._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- A transform stopped by a capture failure binds its statement to its sources again, as
-- they are now (resolved with the search_path it was defined with): a source renamed back,
-- or a table created again under the old name, is read from then on. Refused, with the
-- transform left paused, when the statement no longer holds or would change the target's
-- columns (DROP TRANSFORM and define it again then).
CREATE FUNCTION @schema@._rebind(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  new_spec jsonb;
  now_cols text;
  was_cols text;
BEGIN
  PERFORM set_config('search_path', t.search_path, true);
  BEGIN
    new_spec := @schema@._analyze_transform(t.spec->'ast');
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM set_config('search_path', old_path, true);
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot resume: its definition no longer holds (%s). Fix the sources, or DROP TRANSFORM it and define it again',
      t.target_name, SQLERRM));
  END;
  PERFORM set_config('search_path', old_path, true);
  new_spec := jsonb_set(new_spec, '{ast,target}', t.spec->'ast'->'target');
  new_spec := new_spec || jsonb_build_object(
    'whole_row', @schema@._check_definition(new_spec),
    'key_map', @schema@._key_map_kind(new_spec));
  SELECT string_agg(format('%s %s %s', c->>'name', c->>'type', (c->>'is_key')::boolean), ', ' ORDER BY o) INTO now_cols
    FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(c, o);
  SELECT string_agg(format('%s %s %s', c.name, c.type, c.is_key), ', ' ORDER BY c.ordinal) INTO was_cols
    FROM @schema@.transform_columns c WHERE c.transform_id = t.id;
  IF now_cols IS DISTINCT FROM was_cols THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot resume: as its sources are now, its definition gives the columns (%s), and its target has (%s). DROP TRANSFORM it and define it again',
      t.target_name, now_cols, was_cols));
  END IF;
  UPDATE @schema@.transforms SET spec = new_spec, capture_failure = NULL, updated_at = now()
   WHERE id = t.id;
  PERFORM @schema@._register(t.id, new_spec);
  PERFORM @schema@._record_read_attrs(t.id);
  -- Key types may have changed: the key map is made again (the rebuild fills it).
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  PERFORM @schema@._create_key_map(t.id, new_spec);
END
$fn$;

-- Transforms defined before this migration: their reads are recorded as the sources are
-- now; GROUP BY maps gain `passes` (every row they hold passed WHERE); a join with a WHERE
-- gets a map, and is rebuilt (as is a GROUP BY over a join with a WHERE, whose map lacked
-- the rows WHERE filtered out).
DO $migrate$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM @schema@.transforms LOOP
    PERFORM @schema@._record_read_attrs(t.id);
    UPDATE @schema@.transforms SET spec = spec || jsonb_build_object(
             'whole_row', false, 'key_map', @schema@._key_map_kind(spec))
     WHERE id = t.id;
    IF @schema@._key_map_kind(t.spec) = 'groups' THEN
      EXECUTE 'ALTER TABLE ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id)
        || ' ADD COLUMN passes boolean NOT NULL DEFAULT true';
    ELSIF @schema@._key_map_kind(t.spec) = 'rows' THEN
      PERFORM @schema@._create_key_map(t.id, t.spec);
    END IF;
    IF jsonb_array_length(t.spec->'sources') > 1 AND t.spec->'ast'->>'where' IS NOT NULL THEN
      PERFORM @schema@._request_rebuild(t.id);
    END IF;
  END LOOP;
END
$migrate$;

-- A source renamed (or moved to another schema) is followed, as capture follows it (by
-- OID): the catalog's names, the statement's AST and its normalised text take the new
-- name, and a source written without an alias keeps its old name as one, so expressions
-- that qualify columns by it still mean the same. Returns the targets changed.
CREATE FUNCTION @schema@._follow_source_renames()
RETURNS SETOF text LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
  path text[];
  new_spec jsonb;
BEGIN
  FOR r IN
    SELECT ts.transform_id, ts.ordinal, ts.source_schema, ts.source_name, n.nspname, c.relname
      FROM @schema@.transform_sources ts
      JOIN pg_class c ON c.oid = ts.source_oid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE (n.nspname, c.relname) IS DISTINCT FROM (ts.source_schema, ts.source_name)
     ORDER BY ts.transform_id, ts.ordinal
  LOOP
    path := CASE WHEN r.ordinal = 0 THEN ARRAY['ast', 'from'] ELSE ARRAY['ast', 'joins', (r.ordinal - 1)::text] END;
    SELECT t.spec INTO new_spec FROM @schema@.transforms t WHERE t.id = r.transform_id FOR UPDATE;
    IF new_spec #>> (path || 'alias'::text) IS NULL THEN
      new_spec := jsonb_set(new_spec, path || 'alias'::text, to_jsonb(r.source_name::text));
    END IF;
    new_spec := jsonb_set(new_spec, path || 'schema'::text, to_jsonb(r.nspname::text));
    new_spec := jsonb_set(new_spec, path || 'name'::text, to_jsonb(r.relname::text));
    UPDATE @schema@.transforms t
       SET spec = new_spec, statement = @schema@.render_statement(new_spec->'ast'), updated_at = now()
     WHERE t.id = r.transform_id;
    UPDATE @schema@.transform_sources ts SET source_schema = r.nspname, source_name = r.relname
     WHERE ts.transform_id = r.transform_id AND ts.ordinal = r.ordinal;
    RETURN NEXT (SELECT t.target_name::text FROM @schema@.transforms t WHERE t.id = r.transform_id);
  END LOOP;
END
$fn$;
