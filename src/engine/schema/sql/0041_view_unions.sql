-- UNION ALL and UNION in a view's SQL (issue #26, item 1; ADR 0059):
--
--   TRANSFORM name AS [WITH ...] <select> { UNION [ALL | DISTINCT] <select> } [ORDER BY ...]
--
-- at the top of the statement, and as the SELECT of a derived table or a WITH query. Each
-- branch is a hidden part (a transform of its own, ADR 0056) named
-- "trellis#<target>#<path><n>" (n = 1, 2, ... in the order written), its columns named and
-- typed as Postgres names and types the union's. Each branch's target is mirrored, by
-- statement triggers with transition tables, into one table of the union's rows,
-- "trellis#<target>#<path>union", keyed by (the branch's number, its row's key as text):
-- an ordinary table, so the statement reading the union captures it as any source. What
-- reads it: the transform itself (`SELECT cols FROM` it for UNION ALL, `SELECT DISTINCT`
-- for UNION), or, for a union in a subquery, a part doing the same, which the statement
-- around it reads as ADR 0056's parts are read. INTERSECT and EXCEPT are refused by name.
--
-- Renamed here and wrapped (statements without a union go straight through, so whichever
-- migration wrote them last stays in force): grammar_parse_view (the four-argument form of
-- 0036) -> grammar_parse_block, _render_view_select -> _render_view_block, render_statement
-- -> _render_statement_block, _define_parts -> _define_parts_block, _define -> _define_view,
-- _drop -> _drop_view, _alter_add_column -> _alter_add_column_block, _alter_drop_column ->
-- _alter_drop_column_block (a union's columns are its branches': refused). Replaced (its latest body, 0035's, copied; the change marked "0041"):
-- status(text), whose upstream now includes the branches feeding a union's table.

ALTER FUNCTION @schema@.grammar_parse_view(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block;
ALTER FUNCTION @schema@._render_view_select(jsonb) RENAME TO _render_view_block;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO _render_statement_block;
ALTER FUNCTION @schema@._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_block;
ALTER FUNCTION @schema@._define(jsonb, text) RENAME TO _define_view;
ALTER FUNCTION @schema@._drop(jsonb) RENAME TO _drop_view;
ALTER FUNCTION @schema@._alter_add_column(jsonb) RENAME TO _alter_add_column_block;
ALTER FUNCTION @schema@._alter_drop_column(jsonb) RENAME TO _alter_drop_column_block;

-- The tables of a union's rows, and the branches (parts) that feed each: a transform
-- reading such a table is downstream of those branches (status(), awaitConverged).
CREATE TABLE @schema@.union_feeds (
  table_oid oid NOT NULL,
  transform_id int NOT NULL REFERENCES @schema@.transforms ON DELETE CASCADE,
  branch int NOT NULL,
  PRIMARY KEY (table_oid, transform_id)
);
CREATE INDEX union_feeds_by_transform ON @schema@.union_feeds (transform_id);

-- The transforms directly upstream of transform `id`: those whose targets it reads, and
-- those feeding a union's table it reads.
CREATE FUNCTION @schema@._upstream_ids(id int)
RETURNS SETOF int LANGUAGE sql STABLE AS $fn$
  SELECT u.id FROM @schema@.transform_sources ts
    JOIN @schema@.transforms u ON u.target_oid = ts.source_oid
   WHERE ts.transform_id = _upstream_ids.id
  UNION
  SELECT f.transform_id FROM @schema@.transform_sources ts
    JOIN @schema@.union_feeds f ON f.table_oid = ts.source_oid
   WHERE ts.transform_id = _upstream_ids.id
$fn$;

-- A view's SELECT at token i, with the WITH queries `ctes` in scope: a set operation at the
-- top level of it (outside brackets) splits it into branches, each read by
-- grammar_parse_block; without one, the SELECT is grammar_parse_block's. A union's AST:
-- {kind, form: 'as', target, union: {all, branches: [AST, ...]}, select (the first
-- branch's, for readers of a statement's columns), parts (its WITH queries), options}.
CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  ops int[] := '{}';
  is_all boolean;
  op_all boolean;
  starts int[];
  ends int[];
  n int;
  b int;
  slice @schema@.grammar_token[];
  branch jsonb;
  branches jsonb := '[]';
  cte_parts jsonb := '[]';
  last jsonb;
  p jsonb;
  eof_at int;
BEGIN
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND (@schema@.grammar_kw(toks[k], 'intersect') OR @schema@.grammar_kw(toks[k], 'except')) THEN
      PERFORM @schema@.grammar_refuse(format(
        '%s is not supported: only UNION and UNION ALL are maintained (write it with [NOT] EXISTS)',
        upper(toks[k].value) || CASE WHEN @schema@.grammar_kw(toks[k + 1], 'all') THEN ' ALL' ELSE '' END),
        toks[k].pos);
    ELSIF d = 0 AND @schema@.grammar_kw(toks[k], 'union') THEN
      ops := ops || k;
    END IF;
    k := k + 1;
  END LOOP;
  eof_at := k;
  IF cardinality(ops) = 0 THEN
    RETURN @schema@.grammar_parse_block(toks, i, target, ctes);
  END IF;

  -- The branches: from i to the first UNION, between two, after the last.
  starts := ARRAY[i];
  ends := '{}';
  FOREACH k IN ARRAY ops LOOP
    op_all := @schema@.grammar_kw(toks[k + 1], 'all');
    IF is_all IS NOT NULL AND is_all <> op_all THEN
      PERFORM @schema@.grammar_refuse(
        'UNION and UNION ALL mixed in one statement are not supported: write one of them (or put one in a subquery in FROM)',
        toks[k].pos);
    END IF;
    is_all := op_all;
    ends := ends || k;
    starts := starts || (k + CASE WHEN op_all OR @schema@.grammar_kw(toks[k + 1], 'distinct') THEN 2 ELSE 1 END);
  END LOOP;
  n := cardinality(starts);
  ends := ends || eof_at;

  FOR b IN 1 .. n LOOP
    IF b > 1 AND NOT @schema@.grammar_kw(toks[starts[b]], 'select')
       AND NOT (toks[starts[b]].kind = 'punct' AND toks[starts[b]].text = '(') THEN
      PERFORM @schema@.grammar_unexpected(toks, starts[b], 'SELECT after UNION');
    END IF;
    slice := toks[starts[b] : ends[b] - 1] || ROW('eof', '', '', toks[ends[b]].pos)::@schema@.grammar_token;
    branch := @schema@.grammar_parse_block(slice, 1, NULL, ctes);
    IF b = 1 THEN
      -- A leading WITH is the whole statement's: its queries are in scope in every branch.
      cte_parts := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(branch->'parts') WITH ORDINALITY AS y(x, o)
                              WHERE x->>'kind' = 'cte'), '[]');
      FOR p IN SELECT value FROM jsonb_array_elements(cte_parts) LOOP
        ctes := ctes || jsonb_build_object(p->>'name', true);
      END LOOP;
      branch := branch - 'parts' || coalesce((
        SELECT jsonb_build_object('parts', jsonb_agg(x ORDER BY o))
          FROM jsonb_array_elements(branch->'parts') WITH ORDINALITY AS y(x, o)
         WHERE x->>'kind' <> 'cte' HAVING count(*) > 0), '{}');
    END IF;
    IF b < n AND (coalesce((branch->>'without_source_index')::boolean, false)
                  OR coalesce((branch->>'without_row_security')::boolean, false)) THEN
      PERFORM @schema@.grammar_refuse(
        'WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY go at the end of the statement, after its last SELECT',
        toks[starts[b]].pos);
    END IF;
    last := branch;
    branches := branches || jsonb_build_array(branch - 'without_source_index' - 'without_row_security' - 'target');
  END LOOP;
  RETURN jsonb_build_object(
    'kind', 'transform', 'form', 'as', 'target', target,
    'union', jsonb_build_object('all', is_all, 'branches', branches),
    'select', branches->0->'select',
    'without_source_index', coalesce((last->>'without_source_index')::boolean, false))
    || CASE WHEN (last->>'without_row_security')::boolean THEN jsonb_build_object('without_row_security', true) ELSE '{}' END
    || CASE WHEN jsonb_array_length(cte_parts) > 0 THEN jsonb_build_object('parts', cte_parts) ELSE '{}' END;
END
$fn$;

-- A view's SELECT as written (normalised): a union's branches joined by UNION [ALL], after
-- its WITH queries; any other SELECT as _render_view_block renders it.
CREATE FUNCTION @schema@._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  with_ text;
BEGIN
  IF NOT ast ? 'union' THEN
    RETURN @schema@._render_view_block(ast);
  END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '') || (
    SELECT string_agg(@schema@._render_view_select(b), CASE WHEN (ast->'union'->>'all')::boolean
                                                          THEN ' UNION ALL ' ELSE ' UNION ' END ORDER BY o)
      FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o));
END
$fn$;

-- render_statement: a union as written (its options after the last branch); every other
-- statement as _render_statement_block renders it.
CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast ? 'union' THEN
    RETURN @schema@._render_statement_block(ast);
  END IF;
  RETURN 'TRANSFORM ' || @schema@.grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
    || ' AS ' || @schema@._render_view_select(ast)
    || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;

-- A view's AST with every reference to a WITH query in `scope` ("cte:<name>" -> its hidden
-- target) made a plain table item naming that target, at every level of its derived
-- tables: what Postgres is asked about a branch before the branch's own parts exist.
CREATE FUNCTION @schema@._bind_scope_plain(ast jsonb, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  tschema text := (SELECT c.target_schema FROM @schema@.config c)::text;
  own_scope jsonb := scope;
  p jsonb;
BEGIN
  IF ast ? 'union' THEN
    RETURN jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg(@schema@._bind_scope_plain(b, scope) ORDER BY o)
        FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  -- Its own WITH queries shadow the ones of the same name around it.
  FOR p IN SELECT value FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WHERE value->>'kind' = 'cte' LOOP
    own_scope := own_scope - ('cte:' || (p->>'name'));
  END LOOP;
  ast := jsonb_set(ast, '{from}', CASE
    WHEN ast->'from'->>'part_kind' = 'cte' AND own_scope ? ('cte:' || (ast->'from'->>'part'))
      THEN (ast->'from') - 'part' - 'part_kind' || jsonb_build_object('schema', tschema,
             'name', own_scope->>('cte:' || (ast->'from'->>'part')), 'alias', coalesce(ast->'from'->>'alias', ast->'from'->>'part'))
    ELSE ast->'from' END);
  ast := jsonb_set(ast, '{joins}', coalesce((
    SELECT jsonb_agg(CASE
      WHEN j->>'part_kind' = 'cte' AND own_scope ? ('cte:' || (j->>'part'))
        THEN j - 'part' - 'part_kind' || jsonb_build_object('schema', tschema,
               'name', own_scope->>('cte:' || (j->>'part')), 'alias', coalesce(j->>'alias', j->>'part'))
      ELSE j END ORDER BY o)
      FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  IF ast ? 'parts' THEN
    ast := jsonb_set(ast, '{parts}', (
      SELECT jsonb_agg(CASE WHEN p2->>'kind' = 'derived'
                            THEN jsonb_set(p2, '{ast}', @schema@._bind_scope_plain(p2->'ast', own_scope))
                            ELSE p2 END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p2, o)));
  END IF;
  RETURN ast;
END
$fn$;

-- Mirrors a union branch's target into the union's table (a statement trigger with
-- transition tables trellis_old / trellis_new on the branch's target). Arguments: the
-- table, the branch's number, the expression of a row's key as text (over `r`), the
-- union's columns (quoted), the same over `r`, and over EXCLUDED. The key's text is made under fixed settings, so the same key always
-- gives the same text, whoever writes.
CREATE FUNCTION @schema@._union_mirror()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, YMD'
SET timezone = 'UTC'
SET intervalstyle = 'postgres'
SET extra_float_digits = '1'
SET bytea_output = 'hex'
SET lc_monetary = 'C'
AS $fn$
DECLARE
  tbl text := TG_ARGV[0];
  b int := TG_ARGV[1]::int;
  key_text text := TG_ARGV[2];
  cols text := TG_ARGV[3];
  new_cols text := TG_ARGV[4];
  excluded_cols text := TG_ARGV[5];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    EXECUTE format('DELETE FROM %s WHERE "trellis#branch" = $1', tbl) USING b;
    RETURN NULL;
  END IF;
  IF TG_OP = 'DELETE' THEN
    EXECUTE format('DELETE FROM %s u WHERE u."trellis#branch" = $1 AND u."trellis#key" IN (SELECT %s FROM trellis_old r)',
      tbl, key_text) USING b;
    RETURN NULL;
  END IF;
  IF TG_OP = 'UPDATE' THEN
    EXECUTE format('DELETE FROM %s u WHERE u."trellis#branch" = $1 AND u."trellis#key" IN (
                      SELECT %s FROM trellis_old r EXCEPT SELECT %s FROM trellis_new r)',
      tbl, key_text, key_text) USING b;
  END IF;
  EXECUTE format('INSERT INTO %s ("trellis#branch", "trellis#key", %s) SELECT $1, %s, %s FROM trellis_new r
                  ON CONFLICT ("trellis#branch", "trellis#key") DO UPDATE SET (%s) = ROW(%s)',
    tbl, cols, key_text, new_cols, cols, excluded_cols) USING b;
  RETURN NULL;
END
$fn$;

-- A table of that reserved name that no transform keeps and no union is fed into is one
-- loaded from a schema dump (restore_definition defines the statement again): dropped, to
-- be made again.
CREATE FUNCTION @schema@._drop_stale_hidden(hidden text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  rel regclass := to_regclass(quote_ident(tschema) || '.' || quote_ident(hidden));
BEGIN
  IF rel IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM @schema@.transforms t WHERE t.target_oid = rel)
     AND NOT EXISTS (SELECT 1 FROM @schema@.union_feeds f WHERE f.table_oid = rel) THEN
    EXECUTE format('DROP TABLE %s', rel);
  END IF;
END
$fn$;

-- Defines a union (an AST with `union`) as parts of transform `root`: its WITH queries,
-- each branch (a hidden transform, its columns named and typed as the union's), and the
-- table of the union's rows each branch's target is mirrored into. Returns, as
-- _define_parts does, {ast: what reads the union (SELECT [DISTINCT] its columns FROM its
-- table; the union itself kept in it, for rendering), ids: [part ids]}.
CREATE FUNCTION @schema@._define_union(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  is_all boolean := (ast->'union'->>'all')::boolean;
  n int := jsonb_array_length(ast->'union'->'branches');
  what text := CASE WHEN path = '' THEN 'the UNION' ELSE format('the UNION in %s', rtrim(path, '.')) END;
  ids jsonb := '[]';
  res jsonb;
  p jsonb;
  branch jsonb;
  bound jsonb := '[]';
  info jsonb;
  binfo jsonb;
  sub jsonb;
  item jsonb;
  col jsonb;
  expr text;
  hidden text;
  union_name text := 'trellis#' || root || '#' || path || 'union';
  union_rel regclass;
  qualified text;
  part_id int;
  part_oid oid;
  spec jsonb;
  key_text text;
  cols text;
  new_cols text;
  excluded_cols text;
  nn boolean[];
  b int;
  j int;
  ddl text;
BEGIN
  IF octet_length(union_name) > 63 THEN
    PERFORM @schema@._fail('TRV01', format(
      '%s is kept in a hidden table named %s, longer than 63 bytes: give the transform a shorter name',
      what, union_name));
  END IF;
  -- Its own WITH queries: parts as any, in scope in every branch.
  IF jsonb_array_length(coalesce(ast->'parts', '[]')) > 0 THEN
    res := @schema@._define_parts_block(jsonb_build_object('parts', ast->'parts', 'from', '{}'::jsonb,
      'joins', '[]'::jsonb, 'select', '[]'::jsonb), root, path, scope);
    ids := ids || (res->'ids');
    FOR p IN SELECT value FROM jsonb_array_elements(ast->'parts') LOOP
      scope := scope || jsonb_build_object('cte:' || (p->>'name'), 'trellis#' || root || '#' || path || (p->>'name'));
    END LOOP;
  END IF;

  -- The union's columns, named and typed by Postgres (the statement was checked whole
  -- before this), and each branch's own.
  FOR branch IN SELECT value FROM jsonb_array_elements(ast->'union'->'branches') LOOP
    bound := bound || jsonb_build_array(@schema@._bind_scope_plain(branch, scope));
  END LOOP;
  info := @schema@._analyze_query(@schema@._render_view_select(
    jsonb_build_object('union', jsonb_build_object('all', is_all, 'branches', bound))), 'in ' || what);
  nn := array_fill(true, ARRAY[jsonb_array_length(info->'columns')]);

  FOR b IN 1 .. n LOOP
    binfo := @schema@._analyze_query(@schema@._render_view_select(bound->(b - 1)),
      format('in SELECT %s of %s', b, what));
    hidden := 'trellis#' || root || '#' || path || b;
    IF octet_length(hidden) > 63 THEN
      PERFORM @schema@._fail('TRV01', format(
        'SELECT %s of %s is kept in a hidden target named %s, longer than 63 bytes: give the transform a shorter name',
        b, what, hidden));
    END IF;
    PERFORM @schema@._drop_stale_hidden(hidden);
    -- Its derived tables (and WITH queries read) bound to their parts.
    res := @schema@._define_parts(ast->'union'->'branches'->(b - 1), root, path || b || '.', scope);
    ids := ids || (res->'ids');
    sub := res->'ast';
    FOR j IN 0 .. jsonb_array_length(sub->'select') - 1 LOOP
      item := sub->'select'->j;
      col := info->'columns'->j;
      expr := item->>'expr';
      -- A bare label (`count(*) n`) is dropped where Postgres reads it as one.
      IF item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL
         AND binfo->'columns'->j->>'name' = item->>'bare_label' THEN
        expr := item->>'label_expr';
      END IF;
      IF binfo->'columns'->j->>'type' IS DISTINCT FROM col->>'type' THEN
        expr := '(' || expr || ')::' || (col->>'type');
      END IF;
      sub := jsonb_set(sub, ARRAY['select', j::text], item || jsonb_build_object(
        'expr', expr, 'name', col->>'name', 'bare_label', NULL, 'label_expr', NULL));
    END LOOP;
    sub := sub || jsonb_build_object('target', jsonb_build_object('schema', NULL, 'name', hidden),
                                     'without_source_index', coalesce((ast->>'without_source_index')::boolean, false))
               || CASE WHEN (ast->>'without_row_security')::boolean
                       THEN jsonb_build_object('without_row_security', true) ELSE '{}' END;
    PERFORM @schema@._define_one(sub, NULL);
    SELECT t.id, t.target_oid, t.spec INTO part_id, part_oid, spec FROM @schema@.transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    UPDATE @schema@.transforms SET part_name = path || b WHERE id = part_id;
    ids := ids || to_jsonb(part_id);
    FOR j IN 1 .. cardinality(nn) LOOP
      nn[j] := nn[j] AND coalesce((
        SELECT a.attnotnull FROM pg_attribute a
         WHERE a.attrelid = part_oid AND a.attname = info->'columns'->(j - 1)->>'name' AND NOT a.attisdropped), false);
    END LOOP;
  END LOOP;

  -- The union's rows: (branch, key) and its columns, columns NOT NULL where every branch's is.
  PERFORM @schema@._drop_stale_hidden(union_name);
  qualified := quote_ident(tschema) || '.' || quote_ident(union_name);
  ddl := 'CREATE TABLE ' || qualified || ' ("trellis#branch" int NOT NULL, "trellis#key" text NOT NULL, '
    || (SELECT string_agg(quote_ident(c->>'name') || ' ' || (c->>'type')
                          || coalesce(' COLLATE ' || (c->>'collation'), '')
                          || CASE WHEN nn[o] THEN ' NOT NULL' ELSE '' END, ', ' ORDER BY o)
          FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o))
    || ', PRIMARY KEY ("trellis#branch", "trellis#key"))';
  EXECUTE ddl;
  union_rel := qualified::regclass;
  EXECUTE 'CREATE TRIGGER trellis_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON '
    || qualified || ' FOR EACH STATEMENT EXECUTE FUNCTION @schema@.guard_target()';
  EXECUTE 'ALTER TABLE ' || qualified || ' ENABLE ALWAYS TRIGGER trellis_guard';
  cols := (SELECT string_agg(quote_ident(c->>'name'), ', ' ORDER BY o)
             FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o));
  new_cols := (SELECT string_agg('r.' || quote_ident(c->>'name'), ', ' ORDER BY o)
                 FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o));
  excluded_cols := (SELECT string_agg('EXCLUDED.' || quote_ident(c->>'name'), ', ' ORDER BY o)
                      FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o));
  FOR b IN 1 .. n LOOP
    hidden := 'trellis#' || root || '#' || path || b;
    SELECT t.id, t.target_oid, t.spec INTO part_id, part_oid, spec FROM @schema@.transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    key_text := 'ROW(' || coalesce((SELECT string_agg('r.' || quote_ident(k), ', ' ORDER BY o)
                                      FROM jsonb_array_elements_text(spec->'key') WITH ORDINALITY AS x(k, o)), '')
                || ')::text';
    EXECUTE format('CREATE TRIGGER trellis_union_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('CREATE TRIGGER trellis_union_update AFTER UPDATE ON %s REFERENCING OLD TABLE AS trellis_old NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('CREATE TRIGGER trellis_union_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS trellis_old
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('CREATE TRIGGER trellis_union_truncate AFTER TRUNCATE ON %s
                      FOR EACH STATEMENT EXECUTE FUNCTION @schema@._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER trellis_union_insert, ENABLE ALWAYS TRIGGER trellis_union_update, '
                   'ENABLE ALWAYS TRIGGER trellis_union_delete, ENABLE ALWAYS TRIGGER trellis_union_truncate',
      part_oid::regclass);
    INSERT INTO @schema@.union_feeds (table_oid, transform_id, branch) VALUES (union_rel, part_id, b);
  END LOOP;

  -- A UNION in a subquery is read by its key, all its columns: none may be NULL.
  IF path <> '' AND NOT is_all AND NOT (true = ALL (nn)) THEN
    PERFORM @schema@._fail('TRV01', format(
      '%s is keyed by every column, and %s can be NULL: the statement around a subquery reads its rows by a key that is never NULL. Use UNION ALL there (a SELECT DISTINCT over it at the top of the statement removes duplicates), or select only columns the branches'' targets hold NOT NULL (their keys, count())',
      what, (SELECT string_agg(quote_ident(c->>'name'), ', ' ORDER BY o)
               FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o) WHERE NOT nn[o])));
  END IF;

  RETURN jsonb_build_object('ids', ids, 'ast', jsonb_build_object(
    'kind', 'transform', 'form', 'as', 'target', ast->'target',
    'from', jsonb_build_object('schema', tschema::text, 'name', union_name, 'alias', 'u'),
    'joins', '[]'::jsonb,
    'select', (SELECT jsonb_agg(jsonb_build_object('expr', quote_ident(c->>'name'), 'name', c->>'name',
                                 'bare_label', NULL, 'label_expr', NULL, 'position', NULL) ORDER BY o)
                 FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o)),
    'where', NULL, 'group_by', '[]'::jsonb, 'having', NULL,
    'without_source_index', coalesce((ast->>'without_source_index')::boolean, false),
    'union', ast->'union')
    || CASE WHEN NOT is_all THEN jsonb_build_object('distinct', true) ELSE '{}' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN jsonb_build_object('without_row_security', true) ELSE '{}' END
    || CASE WHEN ast ? 'parts' THEN jsonb_build_object('parts', ast->'parts') ELSE '{}' END);
END
$fn$;

-- _define_parts (0036), for a union too.
CREATE FUNCTION @schema@._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ? 'union' THEN
    RETURN @schema@._define_union(ast, root, path, scope);
  END IF;
  RETURN @schema@._define_parts_block(ast, root, path, scope);
END
$fn$;

-- TRANSFORM: a union at the top of the statement is checked whole by Postgres, its parts
-- defined (_define_union), then the transform reading the union's table; every other
-- statement as before (_define_view).
CREATE FUNCTION @schema@._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  tname text := ast->'target'->>'name';
  res jsonb;
  result jsonb;
BEGIN
  IF NOT ast ? 'union' THEN
    RETURN @schema@._define_view(ast, statement);
  END IF;
  IF starts_with(tname, 'trellis#') THEN
    PERFORM @schema@._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): choose another target name',
      tname));
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM @schema@._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  -- Postgres reads the statement as written first: names, scopes, the columns' types.
  PERFORM @schema@._analyze_query(@schema@._render_view_select(ast), 'in the definition');
  res := @schema@._define_parts(ast, tname, '', '{}');
  result := @schema@._define_one(res->'ast', statement);
  UPDATE @schema@.transforms p SET part_of = t.id
    FROM @schema@.transforms t
   WHERE t.target_schema = tschema AND t.target_name = tname
     AND p.id IN (SELECT (x)::int FROM jsonb_array_elements_text(res->'ids') x);
  RETURN result;
END
$fn$;

-- DROP TRANSFORM: as before (_drop_view: the transform, then its parts), then the tables
-- of the unions its parts fed.
CREATE FUNCTION @schema@._drop(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  tables oid[];
  rel oid;
  result jsonb;
BEGIN
  tables := ARRAY(SELECT DISTINCT f.table_oid FROM @schema@.union_feeds f
                    JOIN @schema@.transforms p ON p.id = f.transform_id
                   WHERE p.part_of = t.id);
  result := @schema@._drop_view(ast);
  FOREACH rel IN ARRAY tables LOOP
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
      EXECUTE format('DROP TABLE %s', rel::regclass);
    END IF;
  END LOOP;
  RETURN result;
END
$fn$;

-- ALTER TRANSFORM ... ADD COLUMN / DROP COLUMN: a union's columns are its branches', which
-- the column would not be added to: refused (DROP TRANSFORM and define it again); every
-- other transform as before.
CREATE FUNCTION @schema@._refuse_union_alter(ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
BEGIN
  IF t.spec->'ast' ? 'union' THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I is a UNION: a column is added to or dropped from each of its SELECTs. DROP TRANSFORM it and define it again',
      t.target_name));
  END IF;
END
$fn$;

CREATE FUNCTION @schema@._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._refuse_union_alter(ast);
  RETURN @schema@._alter_add_column_block(ast);
END
$fn$;

CREATE FUNCTION @schema@._alter_drop_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._refuse_union_alter(ast);
  RETURN @schema@._alter_drop_column_block(ast);
END
$fn$;

-- 0041: status() as in 0035, its upstream (what keeps a transform from being live while
-- something it reads is behind) found by _upstream_ids: a union's branches included.
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
