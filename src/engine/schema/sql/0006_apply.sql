-- apply(statement): every statement of the grammar, callable from SQL so a transform can
-- be defined inside any migration's transaction, atomically with the DDL around it.

-- Targets are written by Trellis only. A statement-level guard on each target refuses
-- every other INSERT, UPDATE, DELETE and TRUNCATE (ENABLE ALWAYS: replication mode does
-- not lift it). The engine's own writes set trellis.maintaining to its catalog schema for
-- their transaction.
CREATE FUNCTION @schema@.guard_target()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF current_setting('trellis.maintaining', true) IS DISTINCT FROM @schema_literal@ THEN
    RAISE EXCEPTION 'table %.% is a Trellis target: only Trellis writes to it', TG_TABLE_SCHEMA, TG_TABLE_NAME
      USING ERRCODE = 'TRW01',
            HINT = 'change the rows of its sources, or the transform (ALTER TRANSFORM), instead';
  END IF;
  RETURN NULL;
END
$fn$;

-- The transform a statement names, or a not_found error. A statement may write the
-- target schema-qualified; any schema but the instance's target schema names nothing.
CREATE FUNCTION @schema@._transform_named(ast jsonb)
RETURNS @schema@.transforms LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms;
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
BEGIN
  IF ast->>'schema' IS NOT NULL AND ast->>'schema' <> tschema THEN
    PERFORM @schema@._fail('TRN01', format(
      'there is no transform %I.%I: transforms live in schema %I', ast->>'schema', ast->>'transform', tschema));
  END IF;
  SELECT * INTO t FROM @schema@.transforms x
   WHERE x.target_name = ast->>'transform' AND x.target_schema = tschema;
  IF NOT FOUND THEN
    PERFORM @schema@._fail('TRN01', format('there is no transform named %I', ast->>'transform'));
  END IF;
  RETURN t;
END
$fn$;

-- Creates the target table for an analysed spec: typed as Postgres typed the definition,
-- keyed by its key, guarded against writes from anyone but Trellis.
CREATE FUNCTION @schema@._create_target(target_schema name, target_name text, spec jsonb)
RETURNS oid LANGUAGE plpgsql AS $fn$
DECLARE
  qualified text := quote_ident(target_schema) || '.' || quote_ident(target_name);
  ddl text;
  keys text;
  src jsonb;
BEGIN
  keys := (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(spec->'key') k);
  ddl := 'CREATE TABLE ' || qualified || ' (' || (
    SELECT string_agg(quote_ident(c->>'name') || ' ' || (c->>'type')
             || coalesce(' COLLATE ' || (c->>'collation'), '')
             || CASE WHEN (c->>'notnull')::boolean THEN ' NOT NULL' ELSE '' END, ', ' ORDER BY o)
      FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o));
  IF keys IS NOT NULL AND NOT (spec->>'key_nullable')::boolean THEN
    ddl := ddl || ', PRIMARY KEY (' || keys || ')';
  ELSIF keys IS NOT NULL THEN
    IF current_setting('server_version_num')::int < 150000 THEN
      PERFORM @schema@._fail('TRV01',
        'this target''s key can be NULL (a LEFT JOIN or a nullable GROUP BY expression), which needs Postgres 15 or newer (UNIQUE NULLS NOT DISTINCT)');
    END IF;
    ddl := ddl || ', UNIQUE NULLS NOT DISTINCT (' || keys || ')';
  END IF;
  BEGIN
    EXECUTE ddl || ')';
  EXCEPTION
    WHEN insufficient_privilege OR query_canceled OR lock_not_available THEN
      RAISE;
    -- A key column of a type without a btree operator class (GROUP BY xmin groups by xid,
    -- which only hashes): there is no primary key or unique constraint to build on it.
    WHEN undefined_object THEN
      PERFORM @schema@._fail('TRV01', format(
        'the target''s key (%s) cannot be indexed: %s', keys, SQLERRM),
        'group by an expression of a type that sorts, e.g. cast it to text');
    -- The analysis let it through, but Postgres will not create the table (too many
    -- columns, say): a validation error naming the target, not an internal one.
    WHEN syntax_error_or_access_rule_violation OR program_limit_exceeded OR feature_not_supported
         OR data_exception THEN
      PERFORM @schema@._fail('TRV01', format('the target %s cannot be created: %s', qualified, SQLERRM));
  END;
  IF keys IS NULL THEN
    -- A grand total: one row at most.
    EXECUTE 'CREATE UNIQUE INDEX ON ' || qualified || ' ((true))';
  END IF;
  -- Joined tables' keys: the drain finds the target rows a changed row touches by them.
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') WHERE (value->>'ordinal')::int > 0 LOOP
    IF jsonb_typeof(src->'target_key_columns') = 'array' THEN
      EXECUTE 'CREATE INDEX ON ' || qualified || ' (' || (
        SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(src->'target_key_columns') k) || ')';
    END IF;
  END LOOP;
  EXECUTE 'CREATE TRIGGER trellis_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON '
    || qualified || ' FOR EACH STATEMENT EXECUTE FUNCTION @schema@.guard_target()';
  EXECUTE 'ALTER TABLE ' || qualified || ' ENABLE ALWAYS TRIGGER trellis_guard';
  RETURN qualified::regclass::oid;
END
$fn$;

-- The key map of a GROUP BY transform: one row per source row combination (join row)
-- that passes WHERE, holding every source's key (k<source>_<n>) and its group (g<n>).
-- When a source row changes, its old groups are read here; the drain keeps it in step.
-- Indexed by each source's key, to find the rows a changed source row was part of.
CREATE FUNCTION @schema@._create_key_map(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := @schema_literal@;
  src jsonb;
BEGIN
  map_sql := quote_ident(map_sql) || '.' || quote_ident('map_' || transform_id);
  EXECUTE 'CREATE TABLE ' || map_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT (s->>'ordinal')::int AS o1, k.o AS o2,
             quote_ident(format('k%s_%s', s->>'ordinal', k.o)) || ' ' || k.t AS col
        FROM jsonb_array_elements(spec->'sources') s,
             jsonb_array_elements_text(s->'key_types') WITH ORDINALITY AS k(t, o)
      UNION ALL
      SELECT 1000000, g.o, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '')
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)) c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
END
$fn$;

-- Writes a transform's catalog rows from its spec.
CREATE FUNCTION @schema@._register(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  DELETE FROM @schema@.transform_sources WHERE transform_sources.transform_id = _register.transform_id;
  INSERT INTO @schema@.transform_sources (
      transform_id, ordinal, source_oid, source_schema, source_name, alias, join_type,
      join_condition, key_columns, key_types, target_key_columns, read_columns,
      join_columns, group_columns)
  SELECT _register.transform_id, (s->>'ordinal')::int, (s->>'oid')::oid, s->>'schema', s->>'name',
         s->>'alias', s->>'join_type', s->>'on',
         ARRAY(SELECT jsonb_array_elements_text(s->'key_columns'))::name[],
         ARRAY(SELECT jsonb_array_elements_text(s->'key_types')),
         CASE WHEN jsonb_typeof(s->'target_key_columns') = 'array'
              THEN ARRAY(SELECT jsonb_array_elements_text(s->'target_key_columns'))::name[] END,
         ARRAY(SELECT jsonb_array_elements_text(s->'read_columns'))::name[],
         ARRAY(SELECT jsonb_array_elements_text(coalesce(s->'join_columns', '[]')))::name[],
         ARRAY(SELECT jsonb_array_elements_text(coalesce(s->'group_columns', '[]')))::name[]
    FROM jsonb_array_elements(spec->'sources') s;
END
$fn$;

CREATE FUNCTION @schema@._define(ast jsonb, statement text)
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
  normalised := @schema@.render_statement(spec->'ast');
  v_oid := @schema@._create_target(tschema, tname, spec);

  INSERT INTO @schema@.transforms (target_schema, target_name, target_oid, statement, spec,
                                   aggregates, without_source_index, search_path)
  VALUES (tschema, tname, v_oid, normalised, spec,
          (spec->>'aggregates')::boolean, coalesce((ast->>'without_source_index')::boolean, false),
          array_to_string(ARRAY(SELECT quote_ident(s) FROM unnest(current_schemas(false)) AS s), ', '))
  RETURNING id INTO new_id;
  PERFORM @schema@._register(new_id, spec);
  IF jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN
    PERFORM @schema@._create_key_map(new_id, spec);
  END IF;
  INSERT INTO @schema@.transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  SELECT new_id, o::int - 1, c->>'name', c->>'expression', c->>'type', c->>'collation',
         (c->>'is_key')::boolean, (c->>'implicit')::boolean, c->'reads'
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  RETURN jsonb_build_object('kind', 'transform_defined', 'target', tname);
END
$fn$;

CREATE FUNCTION @schema@._pause(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  col @schema@.transform_columns;
BEGIN
  IF ast->>'column' IS NULL THEN
    UPDATE @schema@.transforms
       SET paused_at = coalesce(paused_at, now()), pause_reason = coalesce(pause_reason, 'operator'),
           updated_at = now()
     WHERE id = t.id;
    RETURN jsonb_build_object('kind', 'paused', 'address', t.target_name);
  END IF;
  SELECT * INTO col FROM @schema@.transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'column';
  IF NOT FOUND THEN
    PERFORM @schema@._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'column'));
  END IF;
  IF col.is_key THEN
    PERFORM @schema@._fail('TRV01', format(
      '%I.%I is part of the target''s key: pause the whole transform instead', t.target_name, col.name));
  END IF;
  UPDATE @schema@.transform_columns
     SET paused_at = coalesce(paused_at, now()), pause_reason = coalesce(pause_reason, 'operator')
   WHERE transform_id = t.id AND name = col.name;
  RETURN jsonb_build_object('kind', 'paused', 'address', t.target_name || '.' || col.name);
END
$fn$;

-- RESUME of a transform resumes it and every paused column of it; RESUME of a column
-- resumes that column. Returns the addresses that were paused and now are not.
CREATE FUNCTION @schema@._resume(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  addresses text[] := '{}';
BEGIN
  IF ast->>'column' IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM @schema@.transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'column') THEN
    PERFORM @schema@._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'column'));
  END IF;
  IF ast->>'column' IS NULL AND t.paused_at IS NOT NULL THEN
    addresses := addresses || t.target_name::text;
    UPDATE @schema@.transforms SET paused_at = NULL, pause_reason = NULL, updated_at = now() WHERE id = t.id;
    -- A pause the ledger could not have covered (capture was broken or disrupted) resumes
    -- through a rebuild; any other resumes from where the transform stopped.
    IF t.pause_reason IN ('capture_failure', 'disruption') THEN
      PERFORM @schema@._request_rebuild(t.id);
    ELSIF t.pause_reason = 'build_failure' THEN
      -- The cause was fixed: the build gets its attempts afresh, starting now.
      UPDATE @schema@.pipeline SET build_attempts = 0, build_next_at = NULL WHERE transform_id = t.id;
    END IF;
  END IF;
  WITH resumed AS (
    UPDATE @schema@.transform_columns SET paused_at = NULL, pause_reason = NULL
     WHERE transform_id = t.id AND paused_at IS NOT NULL
       AND (ast->>'column' IS NULL OR name = ast->>'column')
    RETURNING name)
  SELECT addresses || coalesce(array_agg(t.target_name || '.' || name ORDER BY name), '{}')
    INTO addresses FROM resumed;
  -- A paused column was left as it was while its rows changed: rebuild to catch it up.
  IF EXISTS (SELECT 1 FROM unnest(addresses) a WHERE a LIKE '%.%' AND a <> t.target_name::text) THEN
    PERFORM @schema@._request_rebuild(t.id);
  END IF;
  -- Held keys are tried again: they go back into the ledger as changes of this transaction.
  IF ast->>'column' IS NULL THEN
    WITH released AS (
      DELETE FROM @schema@.held_keys h WHERE h.transform_id = t.id RETURNING h.source_id, h.key)
    INSERT INTO @schema@.ledger (gen, source_id, xid, keys)
    SELECT @schema@.ledger_generation(x.xid), r.source_id, x.xid,
           ARRAY[CASE WHEN cardinality(r.key) = 1 THEN r.key[1] ELSE r.key::text END]
      FROM released r, (SELECT pg_current_xact_id()::text::bigint AS xid) x;
  END IF;
  RETURN jsonb_build_object('kind', 'resumed', 'addresses', to_jsonb(addresses));
END
$fn$;

-- Raises a conflict for a DROP of `what` (a target, or target.column) that objects of the
-- app's depend on (a view, say): Trellis never drops what it did not create, so the app
-- must drop or change them first. `dependents` is the DROP's error detail, which lists them.
CREATE FUNCTION @schema@._fail_dependents(what text, dependents text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._fail('TRC01', format(
    '%s is used by objects Trellis did not create (%s): drop or change them first',
    what, replace(coalesce(dependents, 'see pg_depend'), E'\n', '; ')));
END
$fn$;

CREATE FUNCTION @schema@._drop(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  reader text;
  dependents text;
BEGIN
  SELECT r.target_name INTO reader
    FROM @schema@.transform_sources s JOIN @schema@.transforms r ON r.id = s.transform_id
   WHERE s.source_oid = t.target_oid AND r.id <> t.id LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRC01', format(
      'transform %I reads %I: drop it first', reader, t.target_name));
  END IF;
  DELETE FROM @schema@.transforms WHERE id = t.id;
  IF EXISTS (SELECT 1 FROM pg_class WHERE oid = t.target_oid) THEN
    BEGIN
      EXECUTE 'DROP TABLE ' || t.target_oid::regclass::text;
    EXCEPTION WHEN dependent_objects_still_exist THEN
      GET STACKED DIAGNOSTICS dependents = PG_EXCEPTION_DETAIL;
      PERFORM @schema@._fail_dependents(t.target_name, dependents);
    END;
  END IF;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  RETURN jsonb_build_object('kind', 'dropped', 'target', t.target_name);
END
$fn$;

-- The statement and spec after an ALTER: the spec's AST changed, the rest follows.
CREATE FUNCTION @schema@._restate(t @schema@.transforms, ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  UPDATE @schema@.transforms
     SET spec = jsonb_set(spec, '{ast}', ast),
         statement = @schema@.render_statement(ast),
         without_source_index = coalesce((ast->>'without_source_index')::boolean, false),
         updated_at = now()
   WHERE id = t.id;
END
$fn$;

-- ALTER ... ADD COLUMN: the whole definition, with the new column, is validated again; the
-- column is added to the target, which is then rebuilt to fill it. Never part of the key.
CREATE FUNCTION @schema@._alter_add_column(ast jsonb)
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
  PERFORM @schema@._restate(t, new_ast);
  PERFORM @schema@._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

CREATE FUNCTION @schema@._alter_drop_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  col @schema@.transform_columns;
  reader text;
  new_ast jsonb;
  dependents text;
BEGIN
  SELECT * INTO col FROM @schema@.transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name';
  IF NOT FOUND THEN
    PERFORM @schema@._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'name'));
  END IF;
  IF col.is_key THEN
    PERFORM @schema@._fail('TRV01', format(
      '%I.%I is part of the target''s key and cannot be dropped', t.target_name, col.name));
  END IF;
  SELECT r.target_name INTO reader
    FROM @schema@.transform_sources s JOIN @schema@.transforms r ON r.id = s.transform_id
   WHERE s.source_oid = t.target_oid AND col.name = ANY (s.read_columns) LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRC01', format('transform %I reads %I.%I: change it first', reader, t.target_name, col.name));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', coalesce((
    SELECT jsonb_agg(i ORDER BY o) FROM jsonb_array_elements(t.spec->'ast'->'select') WITH ORDINALITY AS x(i, o)
     WHERE i->>'name' <> col.name), '[]'));
  IF jsonb_array_length(new_ast->'select') = 0 THEN
    PERFORM @schema@._fail('TRV01', format(
      '%I is the last column of transform %I''s SELECT list: drop the transform instead', col.name, t.target_name));
  END IF;
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' DROP COLUMN ' || quote_ident(col.name);
  EXCEPTION WHEN dependent_objects_still_exist THEN
    GET STACKED DIAGNOSTICS dependents = PG_EXCEPTION_DETAIL;
    PERFORM @schema@._fail_dependents(t.target_name || '.' || col.name, dependents);
  END;
  DELETE FROM @schema@.transform_columns WHERE transform_id = t.id AND name = col.name;
  PERFORM @schema@._restate(t, new_ast);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

CREATE FUNCTION @schema@._alter_without_source_index(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
BEGIN
  PERFORM @schema@._restate(t, jsonb_set(t.spec->'ast', '{without_source_index}', ast->'value'));
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- Applies one statement (see the grammar in 0003) and returns what it did:
--   {"kind": "transform_defined", "target"} | {"kind": "paused", "address"}
--   | {"kind": "resumed", "addresses"} | {"kind": "dropped", "target"} | {"kind": "altered", "target"}
-- Applies of one instance are serialised by an advisory lock held to the end of the
-- transaction, so the catalog never sees two statements interleave.
CREATE FUNCTION @schema@._apply(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ast jsonb;
BEGIN
  IF statement IS NULL THEN
    PERFORM @schema@._fail('TRP01', 'the statement is NULL');
  END IF;
  ast := @schema@.parse_statement(statement);
  IF transform_only AND ast->>'kind' <> 'transform' THEN
    PERFORM @schema@._fail('TRV01', format(
      'define() takes a TRANSFORM statement, not %s: use apply() for it', upper(split_part(ast->>'kind', '_', 1))));
  END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext(@schema_literal@));
  CASE ast->>'kind'
    WHEN 'transform' THEN RETURN @schema@._define(ast, statement);
    WHEN 'pause' THEN RETURN @schema@._pause(ast);
    WHEN 'resume' THEN RETURN @schema@._resume(ast);
    WHEN 'drop' THEN RETURN @schema@._drop(ast);
    WHEN 'alter_add_column' THEN RETURN @schema@._alter_add_column(ast);
    WHEN 'alter_drop_column' THEN RETURN @schema@._alter_drop_column(ast);
    WHEN 'alter_without_source_index' THEN RETURN @schema@._alter_without_source_index(ast);
  END CASE;
  PERFORM @schema@._fail('TRP01', format('unknown statement kind %s', ast->>'kind'));
  RETURN NULL;
END
$fn$;

CREATE FUNCTION @schema@.apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply(statement, false)
$fn$;

-- apply() for a TRANSFORM only: refuses every other statement.
CREATE FUNCTION @schema@.define(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT @schema@._apply(statement, true)
$fn$;
