-- Redefinition in place (issue #25 item 1, ADR 0055):
--
--   ALTER TRANSFORM target AS SELECT ...             (the AS form of ADR 0049, a view's SQL)
--   ALTER TRANSFORM target AS FROM ... SELECT ...    (the FROM-first form's body)
--
-- changes a definition while the target keeps serving reads. The new definition is built as
-- a hidden transform (a "shadow": its target a table "redefine#<id>" in the catalog schema,
-- its transforms row marked `redefines`), by the build and catch-up machinery every
-- transform goes through, while the old transform keeps maintaining the target. Once the
-- shadow is live, the staging worker switches (_redefine_switch, in one short transaction):
-- the target is altered in place to the new definition's columns (ALTER TABLE ADD, DROP,
-- ALTER TYPE; the key constraint replaced when the key changes), its rows made the shadow's
-- by a diff (rows gone deleted, rows new or changed written), the shadow's catalog rows
-- (definition, plan, cursor, key map and group states) made the transform's, the old
-- transform's removed and the shadow table dropped. The table keeps its OID, grants, the
-- app's indexes, comments, views and foreign keys. What Postgres would drop with a column
-- (a view over it, an index or a foreign key on it) refuses the redefinition, naming it.

-- On a shadow: the transform it redefines. On a transform: its redefinition (building, the
-- last switch, or why the last one was given up).
ALTER TABLE @schema@.transforms ADD COLUMN redefines int;
ALTER TABLE @schema@.transforms ADD COLUMN redefinition jsonb;
CREATE UNIQUE INDEX transforms_redefines ON @schema@.transforms (redefines) WHERE redefines IS NOT NULL;

-- grammar_parse_from_first: 0024's parse_statement (renamed by 0028), with ALTER TRANSFORM t AS.
CREATE OR REPLACE FUNCTION @schema@.grammar_parse_from_first(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(statement);
  t @schema@.grammar_token := toks[1];
  i int;
  e int;
  start int;
  sch text;
  nm text;
  alias text;
  col text;
  jt text;
  expected text;
  target jsonb;
  from_ jsonb;
  joins jsonb := '[]';
  items jsonb := '[]';
  group_by jsonb := '[]';
  where_ text;
  having_ text;
  wsi boolean := false;
  wrs boolean := false;
  label text;
  label_expr text;
  last @schema@.grammar_token;
  before @schema@.grammar_token;
BEGIN
  IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
    PERFORM @schema@.grammar_fail(format(
      'empty statement: expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      @schema@.grammar_describe(t)), t.pos);
  END IF;
  IF t.kind <> 'word' OR t.value NOT IN ('transform', 'pause', 'resume', 'drop', 'alter') THEN
    PERFORM @schema@.grammar_fail(format(
      'expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      @schema@.grammar_describe(t)), t.pos);
  END IF;

  IF t.value IN ('pause', 'resume') THEN
    IF NOT @schema@.grammar_kw(toks[2], 'transform') THEN
      PERFORM @schema@.grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    nm := @schema@.grammar_name(toks[3], 'a transform name', true);
    i := 4;
    IF toks[i].kind = 'punct' AND toks[i].text = '.' THEN
      col := @schema@.grammar_name(toks[i + 1], 'a column name after "."', false);
      i := i + 2;
      expected := 'end of statement';
    ELSE
      expected := '"." and a column name, or end of statement';
    END IF;
    PERFORM @schema@.grammar_end(toks, i, expected);
    RETURN jsonb_build_object('kind', t.value, 'transform', nm, 'column', col);
  END IF;

  IF t.value IN ('drop', 'alter') THEN
    IF NOT @schema@.grammar_kw(toks[2], 'transform') THEN
      PERFORM @schema@.grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM @schema@.grammar_qualified(toks, 3, 'a transform name') q;
    -- A qualified target keeps its schema (the engine refuses one that is not its target
    -- schema); the key is there only then, so unqualified statements have the plain shape.
    target := jsonb_build_object('transform', nm)
      || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    IF t.value = 'drop' THEN
      PERFORM @schema@.grammar_end(toks, i, 'end of statement');
      RETURN jsonb_build_object('kind', 'drop') || target;
    END IF;
    t := toks[i];
    -- 0035: ALTER TRANSFORM t AS SELECT ... (a view's SQL, 0028) | AS FROM ... SELECT ...
    -- (the FROM-first form's body): a redefinition. The rest is read by parse_statement as
    -- the TRANSFORM statement it would be (TRANSFORM t AS SELECT ... | TRANSFORM t FROM ...),
    -- with ALTER (and, before FROM, AS) blanked out so every position it reports stays
    -- where it was in this statement.
    IF @schema@.grammar_kw(t, 'as') THEN
      IF NOT (@schema@.grammar_kw(toks[i + 1], 'select') OR @schema@.grammar_kw(toks[i + 1], 'from')) THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 1, 'SELECT or FROM after AS');
      END IF;
      from_ := @schema@.parse_statement(overlay(
        CASE WHEN @schema@.grammar_kw(toks[i + 1], 'from')
             THEN overlay(statement PLACING repeat(' ', char_length(t.text)) FROM t.pos FOR char_length(t.text))
             ELSE statement END
        PLACING repeat(' ', char_length(toks[1].text)) FROM toks[1].pos FOR char_length(toks[1].text)));
      RETURN jsonb_build_object('kind', 'redefine', 'definition', from_) || target;
    END IF;
    IF @schema@.grammar_kw(t, 'add') THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'an expression after ADD COLUMN');
      END IF;
      IF NOT @schema@.grammar_kw(toks[e], 'as') THEN
        PERFORM @schema@.grammar_unexpected(toks, e, 'AS and the new column''s name');
      END IF;
      nm := @schema@.grammar_name(toks[e + 1], 'a column name after AS', false);
      PERFORM @schema@.grammar_end(toks, e + 2, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_add_column',
        'expr', @schema@.grammar_text(toks, i, e), 'name', nm) || target;
    ELSIF @schema@.grammar_kw(t, 'drop') THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      nm := @schema@.grammar_name(toks[i], 'a column name', true);
      PERFORM @schema@.grammar_end(toks, i + 1, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_drop_column', 'name', nm) || target;
    ELSIF @schema@.grammar_kw(t, 'set') OR @schema@.grammar_kw(t, 'reset') THEN
      IF toks[i + 1].kind = 'punct' AND toks[i + 1].text = '(' THEN
        RETURN @schema@.grammar_settings(toks, i + 1, t.value = 'set') || target;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i + 1], 'without') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 1,
          'WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or "(" and settings');
      END IF;
      IF @schema@.grammar_kw(toks[i + 2], 'row') THEN
        IF NOT @schema@.grammar_kw(toks[i + 3], 'security') THEN
          PERFORM @schema@.grammar_unexpected(toks, i + 3, 'SECURITY');
        END IF;
        PERFORM @schema@.grammar_end(toks, i + 4, 'end of statement');
        RETURN jsonb_build_object('kind', 'alter_without_row_security',
          'value', t.value = 'set') || target;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i + 2], 'source') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 2, 'SOURCE INDEX or ROW SECURITY');
      END IF;
      IF NOT @schema@.grammar_kw(toks[i + 3], 'index') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 3, 'INDEX');
      END IF;
      PERFORM @schema@.grammar_end(toks, i + 4, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_without_source_index',
        'value', t.value = 'set') || target;
    END IF;
    PERFORM @schema@.grammar_unexpected(toks, i, 'ADD, DROP, SET, RESET or AS');
  END IF;

  -- TRANSFORM target FROM source [[AS] alias] {join} SELECT ... [WHERE] [GROUP BY] [HAVING]
  --   [WITHOUT SOURCE INDEX]
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM @schema@.grammar_qualified(toks, 2, 'a transform name') q;
  target := jsonb_build_object('schema', sch, 'name', nm);
  IF NOT @schema@.grammar_kw(toks[i], 'from') THEN
    PERFORM @schema@.grammar_unexpected(toks, i, 'FROM');
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM @schema@.grammar_qualified(toks, i + 1, 'a source table name') q;
  SELECT q.alias, q.next INTO alias, i FROM @schema@.grammar_alias(toks, i) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF @schema@.grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF @schema@.grammar_kw(t, 'inner') THEN
      IF NOT @schema@.grammar_kw(toks[i + 1], 'join') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF @schema@.grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i], 'join') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM @schema@.grammar_qualified(toks, i, 'a table name after JOIN') q;
    SELECT q.alias, q.next INTO alias, i FROM @schema@.grammar_alias(toks, i) q;
    IF NOT @schema@.grammar_kw(toks[i], 'on') THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'ON and a join condition', 'join');
    END IF;
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', @schema@.grammar_text(toks, i, e)));
    i := e;
  END LOOP;

  IF NOT @schema@.grammar_kw(toks[i], 'select') THEN
    PERFORM @schema@.grammar_unexpected(toks, i,
      CASE WHEN jsonb_array_length(joins) = 0 AND alias IS NULL THEN 'an alias, JOIN or SELECT'
        ELSE 'JOIN or SELECT' END,
      'join');
  END IF;
  i := i + 1;
  IF @schema@.grammar_kw(toks[i], 'distinct') THEN
    PERFORM @schema@.grammar_fail(format(
      'SELECT DISTINCT is not supported: use GROUP BY (expected a select item, found %s)',
      @schema@.grammar_describe(toks[i])), toks[i].pos);
  END IF;
  IF @schema@.grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  LOOP
    start := i;
    e := @schema@.grammar_scan(toks, i);
    IF e = start THEN
      PERFORM @schema@.grammar_unexpected(toks, e, 'a select item', 'select');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM @schema@.grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        @schema@.grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF @schema@.grammar_kw(toks[e], 'as') THEN
      nm := @schema@.grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND @schema@.grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := @schema@.grammar_name(last, 'a column name', false);
          label_expr := @schema@.grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', @schema@.grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;
  expected := '",", WHERE, GROUP BY, HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF @schema@.grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'group') THEN
    IF NOT @schema@.grammar_kw(toks[i + 1], 'by') THEN
      PERFORM @schema@.grammar_unexpected(toks, i + 1, 'BY after GROUP');
    END IF;
    i := i + 2;
    IF @schema@.grammar_kw(toks[i], 'all') THEN
      PERFORM @schema@.grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        @schema@.grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF @schema@.grammar_kw(toks[i], 'distinct') THEN
      PERFORM @schema@.grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        @schema@.grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF ((@schema@.grammar_kw(toks[i], 'rollup') OR @schema@.grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR (@schema@.grammar_kw(toks[i], 'grouping') AND @schema@.grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM @schema@.grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          @schema@.grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array(@schema@.grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'having') THEN
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY, each at most once, in either order.
  WHILE @schema@.grammar_kw(toks[i], 'without') LOOP
    IF @schema@.grammar_kw(toks[i + 1], 'source') AND NOT wsi THEN
      IF NOT @schema@.grammar_kw(toks[i + 2], 'index') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
      END IF;
      wsi := true;
    ELSIF @schema@.grammar_kw(toks[i + 1], 'row') AND NOT wrs THEN
      IF NOT @schema@.grammar_kw(toks[i + 2], 'security') THEN
        PERFORM @schema@.grammar_unexpected(toks, i + 2, 'SECURITY after WITHOUT ROW');
      END IF;
      wrs := true;
    ELSE
      PERFORM @schema@.grammar_unexpected(toks, i + 1, CASE
        WHEN wsi THEN 'ROW SECURITY after WITHOUT' WHEN wrs THEN 'SOURCE INDEX after WITHOUT'
        ELSE 'SOURCE INDEX or ROW SECURITY after WITHOUT' END);
    END IF;
    i := i + 3;
    expected := CASE WHEN wsi AND wrs THEN 'end of statement'
      WHEN wsi THEN 'WITHOUT ROW SECURITY or end of statement'
      ELSE 'WITHOUT SOURCE INDEX or end of statement' END;
  END LOOP;

  PERFORM @schema@.grammar_end(toks, i, expected,
    CASE WHEN where_ IS NULL AND having_ IS NULL AND jsonb_array_length(group_by) = 0
      THEN 'select' END);
  RETURN jsonb_build_object(
    'kind', 'transform', 'target', target, 'from', from_, 'joins', joins, 'select', items,
    'where', where_, 'group_by', group_by, 'having', having_, 'without_source_index', wsi)
    -- Only when written: the AST of a statement without it is as it was before 0024.
    || CASE WHEN wrs THEN jsonb_build_object('without_row_security', true) ELSE '{}' END;
END
$fn$;

-- grammar_render_from_first: 0024's render_statement (renamed by 0028), with ALTER TRANSFORM t AS.
CREATE OR REPLACE FUNCTION @schema@.grammar_render_from_first(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  kind text := ast ->> 'kind';
  res text;
  j jsonb;
  target text;
BEGIN
  IF kind = 'transform' THEN
    res := 'TRANSFORM '
      || @schema@.grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
      || ' FROM '
      || @schema@.grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
      || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '');
    FOR j IN SELECT value FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) LOOP
      res := res
        || CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
        || @schema@.grammar_render_name(j ->> 'schema', j ->> 'name')
        || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
        || ' ON ' || (j ->> 'on');
    END LOOP;
    res := res || ' SELECT ' || (
      SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
        ', ' ORDER BY ordinality)
      FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY);
    res := res
      || coalesce(' WHERE ' || (ast ->> 'where'), '')
      || coalesce(' GROUP BY ' || (
        SELECT string_agg(value, ', ' ORDER BY ordinality)
        FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '')
      || coalesce(' HAVING ' || (ast ->> 'having'), '')
      || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX'
           ELSE '' END
      || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY'
           ELSE '' END;
  ELSIF kind = 'redefine' THEN
    -- 0035: ALTER TRANSFORM t AS <the definition's body>, in the form it was written in.
    target := 'TRANSFORM ' || @schema@.grammar_render_name(ast ->> 'schema', ast ->> 'transform');
    res := @schema@.render_statement(ast -> 'definition');
    res := CASE WHEN ast -> 'definition' ->> 'form' = 'as' THEN 'ALTER ' || res
                ELSE 'ALTER ' || target || ' AS' || substr(res, char_length(
                       'TRANSFORM ' || @schema@.grammar_render_name(ast -> 'definition' -> 'target' ->> 'schema',
                                                                 ast -> 'definition' -> 'target' ->> 'name')) + 1) END;
  ELSIF kind IN ('pause', 'resume') THEN
    res := upper(kind) || ' TRANSFORM ' || quote_ident(ast ->> 'transform')
      || coalesce('.' || quote_ident(ast ->> 'column'), '');
  ELSIF kind IN ('drop', 'alter_add_column', 'alter_drop_column', 'alter_without_source_index',
                 'alter_without_row_security', 'alter_set_settings', 'alter_reset_settings')
  THEN
    target := @schema@.grammar_render_name(ast ->> 'schema', ast ->> 'transform');
    res := CASE kind
      WHEN 'drop' THEN 'DROP TRANSFORM ' || target
      WHEN 'alter_add_column' THEN 'ALTER TRANSFORM ' || target || ' ADD COLUMN '
        || (ast ->> 'expr') || ' AS ' || quote_ident(ast ->> 'name')
      WHEN 'alter_drop_column' THEN 'ALTER TRANSFORM ' || target || ' DROP COLUMN '
        || quote_ident(ast ->> 'name')
      WHEN 'alter_set_settings' THEN 'ALTER TRANSFORM ' || target || ' SET (' || (
        SELECT string_agg(s.key || ' = ' || quote_literal(s.value), ', ' ORDER BY o)
          FROM jsonb_array_elements(ast -> 'settings') WITH ORDINALITY AS x(v, o),
               LATERAL (SELECT v ->> 'name' AS key, v ->> 'value' AS value) s) || ')'
      WHEN 'alter_reset_settings' THEN 'ALTER TRANSFORM ' || target || ' RESET (' || (
        SELECT string_agg(v, ', ' ORDER BY o)
          FROM jsonb_array_elements_text(ast -> 'names') WITH ORDINALITY AS x(v, o)) || ')'
      ELSE 'ALTER TRANSFORM ' || target
        || CASE WHEN (ast ->> 'value')::boolean THEN ' SET' ELSE ' RESET' END
        || CASE kind WHEN 'alter_without_row_security' THEN ' WITHOUT ROW SECURITY'
                     ELSE ' WITHOUT SOURCE INDEX' END
    END;
  END IF;
  IF res IS NULL THEN
    RAISE EXCEPTION 'render_statement: not a statement AST: %', left(ast::text, 200)
      USING ERRCODE = '22023';
  END IF;
  RETURN res;
END
$fn$;

-- _apply, as in 0024, with ALTER TRANSFORM t AS (redefine); and no other ALTER of a
-- transform while a redefinition of it is being built (it would be lost at the switch).
CREATE OR REPLACE FUNCTION @schema@._apply(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ast jsonb;
  previous jsonb;
  result jsonb;
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
  IF ast->>'kind' LIKE 'alter\_%' AND EXISTS (
       SELECT 1 FROM @schema@.transforms s WHERE s.redefines = (@schema@._transform_named(ast)).id) THEN
    PERFORM @schema@._fail('TRC01', format(
      'transform %I is being redefined (ALTER TRANSFORM %I AS ...): alter it once the redefinition is done, or redefine it again with the change',
      ast->>'transform', ast->>'transform'));
  END IF;
  CASE ast->>'kind'
    WHEN 'transform' THEN RETURN @schema@._define(ast, statement);
    WHEN 'pause' THEN RETURN @schema@._pause(ast);
    WHEN 'resume' THEN RETURN @schema@._resume(ast);
    WHEN 'drop' THEN RETURN @schema@._drop(ast);
    WHEN 'redefine' THEN RETURN @schema@._redefine(ast);
    WHEN 'alter_add_column' THEN
      previous := @schema@._enter_settings((@schema@._transform_named(ast)).settings);
      result := @schema@._alter_add_column(ast);
      PERFORM @schema@._leave_settings(previous);
      RETURN result;
    WHEN 'alter_drop_column' THEN RETURN @schema@._alter_drop_column(ast);
    WHEN 'alter_without_source_index' THEN RETURN @schema@._alter_without_source_index(ast);
    WHEN 'alter_without_row_security' THEN RETURN @schema@._alter_without_row_security(ast);
    WHEN 'alter_set_settings', 'alter_reset_settings' THEN RETURN @schema@._alter_settings(ast);
  END CASE;
  PERFORM @schema@._fail('TRP01', format('unknown statement kind %s', ast->>'kind'));
  RETURN NULL;
END
$fn$;

-- definitions(), as in 0026, without the shadows of redefinitions being built (they are
-- not the app's transforms: a dump must not define them).
CREATE OR REPLACE FUNCTION @schema@.definitions()
RETURNS SETOF jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
           'target', t.target_name,
           'targetSchema', t.target_schema,
           'statement', t.statement,
           'sources', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'table', s.source_schema || '.' || s.source_name, 'alias', s.alias,
                      'join', s.join_type, 'keyColumns', to_jsonb(s.key_columns))
                    ORDER BY s.ordinal)
               FROM @schema@.transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM @schema@.transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object(
             'withoutSourceIndex', t.without_source_index,
             'withoutRowSecurity', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false)),
           'settings', t.settings,
           'aggregates', t.aggregates,
           'maintenance', @schema@._maintenance(t.aggregates, t.delta),
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM @schema@.transforms t
   WHERE t.redefines IS NULL
   ORDER BY t.target_name
$fn$;

-- A shadow goes with the transform it redefines (DROP TRANSFORM, a redefinition replaced
-- by another), and its table and key map with it.
CREATE FUNCTION @schema@._drop_redefinition()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF OLD.redefines IS NULL THEN
    DELETE FROM @schema@.transforms s WHERE s.redefines = OLD.id;
  ELSE
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = OLD.target_oid) THEN
      EXECUTE 'DROP TABLE ' || OLD.target_oid::regclass::text;
    END IF;
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || OLD.id);
  END IF;
  RETURN OLD;
END
$fn$;
CREATE TRIGGER drop_redefinition BEFORE DELETE ON @schema@.transforms
  FOR EACH ROW EXECUTE FUNCTION @schema@._drop_redefinition();

-- The objects of the app's that depend on column `attnum` of target `rel` (views, indexes,
-- constraints, foreign keys of other tables, triggers, policies, statistics), each named;
-- not the engine's own: the key's constraint (or a grand total's index) and the indexes it
-- made on joined tables' keys, which a switch replaces itself. `kinds` narrows the list
-- to some catalogs (pg_rewrite for views and rules, say).
CREATE FUNCTION @schema@._column_dependants(t @schema@.transforms, attnum int, kinds regclass[] DEFAULT NULL)
RETURNS text[] LANGUAGE sql STABLE AS $fn$
  WITH engine_constraints AS (
    SELECT c.oid, c.conindid FROM pg_constraint c
     WHERE c.conrelid = t.target_oid AND c.contype IN ('p', 'u')
       AND ARRAY(SELECT a.attname::text FROM unnest(c.conkey) k(n)
                   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY 1)
           = ARRAY(SELECT x FROM jsonb_array_elements_text(t.spec->'key') x ORDER BY 1)
    -- Postgres 18 records a column's NOT NULL as a constraint of its own (contype 'n'): it
    -- is the column's, and goes with it.
    UNION ALL
    SELECT c.oid, c.conindid FROM pg_constraint c
     WHERE c.conrelid = t.target_oid AND c.contype = 'n'),
  engine_indexes AS (
    SELECT conindid AS oid FROM engine_constraints
    UNION
    SELECT i.indexrelid FROM pg_index i
     WHERE i.indrelid = t.target_oid AND NOT i.indisunique AND i.indexprs IS NULL AND i.indpred IS NULL
       AND ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)
           IN (SELECT ARRAY(SELECT jsonb_array_elements_text(s->'target_key_columns'))
                 FROM jsonb_array_elements(t.spec->'sources') s
                WHERE (s->>'ordinal')::int > 0 AND jsonb_typeof(s->'target_key_columns') = 'array'))
  SELECT coalesce(array_agg(DISTINCT what ORDER BY what), '{}') FROM (
    SELECT CASE
             WHEN d.classid = 'pg_rewrite'::regclass THEN
               (SELECT CASE WHEN c.relkind = 'm' THEN 'materialized view ' ELSE 'view ' END || c.oid::regclass::text
                  FROM pg_rewrite w JOIN pg_class c ON c.oid = w.ev_class WHERE w.oid = d.objid)
             ELSE pg_describe_object(d.classid, d.objid, 0) END AS what
      FROM pg_depend d
     WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = t.target_oid
       AND d.refobjsubid = attnum AND d.deptype IN ('n', 'a')
       AND (kinds IS NULL OR d.classid = ANY (kinds))
       AND NOT (d.classid = 'pg_class'::regclass AND d.objid IN (SELECT oid FROM engine_indexes))
       AND NOT (d.classid = 'pg_constraint'::regclass AND d.objid IN (SELECT oid FROM engine_constraints))
       -- a view's own rule on its own columns, a sequence owned by the column
       AND NOT (d.classid = 'pg_class'::regclass AND d.objid = t.target_oid)) x
   WHERE what IS NOT NULL
$fn$;

-- What switching transform `t` to the definition `spec` does to its target, and what it
-- cannot do (refused): {changes: [sentence...], refused: [sentence...], key_changed,
-- columns: [{name, action: add | drop | retype | replace, type, from}]}. Column by name:
-- one the new definition lacks is dropped, a new one added, one whose type or collation
-- changes is retyped in place (ALTER COLUMN ... TYPE, with the cast from the old type), or
-- dropped and added again where there is no such cast. Refused, naming them: the app's
-- objects on a column that would be dropped (Postgres would drop an index, a constraint,
-- a trigger with it, and refuses for a view or a foreign key), views and policies over a
-- column that would be retyped (Postgres refuses), foreign keys referencing a key that
-- changes, and transforms reading a column that would be dropped.
CREATE FUNCTION @schema@._redefine_plan(t @schema@.transforms, spec jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  changes text[] := '{}';
  refused text[] := '{}';
  columns jsonb := '[]';
  key_changed boolean;
  r record;
  deps text[];
  castable boolean;
  action text;
BEGIN
  key_changed := (t.spec->'key') IS DISTINCT FROM (spec->'key')
    OR coalesce((t.spec->>'key_nullable')::boolean, false) IS DISTINCT FROM coalesce((spec->>'key_nullable')::boolean, false);
  IF key_changed THEN
    deps := ARRAY(SELECT format('foreign key %I of %s', c.conname, c.conrelid::regclass)
                    FROM pg_constraint c WHERE c.confrelid = t.target_oid AND c.contype = 'f' ORDER BY 1);
    IF cardinality(deps) > 0 THEN
      refused := refused || format('its key would change from (%s) to (%s), and %s reference%s it',
        (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k),
        (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(spec->'key') k),
        array_to_string(deps, ', '), CASE WHEN cardinality(deps) = 1 THEN 's' ELSE '' END);
    ELSE
      changes := changes || format('key changed from (%s) to (%s): the key constraint replaced, every row written again',
        coalesce((SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k), ''),
        coalesce((SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(spec->'key') k), ''));
    END IF;
  END IF;
  FOR r IN
    SELECT coalesce(o.name, nn.n->>'name') AS name, o.type AS old_type, o.collation_name AS old_coll,
           nn.n->>'type' AS new_type, nn.n->>'collation' AS new_coll, a.attnum::int AS attnum,
           o.name IS NULL AS added, nn.n IS NULL AS dropped, coalesce(nn.o, 1000 + o.ordinal) AS o
      FROM (SELECT c.name::text AS name, c.type, c.collation_name, c.ordinal FROM @schema@.transform_columns c
             WHERE c.transform_id = t.id) o
      FULL JOIN jsonb_array_elements(spec->'columns') WITH ORDINALITY AS nn(n, o) ON nn.n->>'name' = o.name
      LEFT JOIN pg_attribute a ON a.attrelid = t.target_oid AND a.attname = coalesce(o.name, nn.n->>'name')
                              AND NOT a.attisdropped
     ORDER BY 9
  LOOP
    action := NULL;
    IF r.added THEN
      action := 'add';
      changes := changes || format('column %I added (%s)', r.name, r.new_type);
    ELSIF r.dropped THEN
      action := 'drop';
    ELSIF r.old_type IS DISTINCT FROM r.new_type OR r.old_coll IS DISTINCT FROM r.new_coll THEN
      BEGIN
        EXECUTE format('SELECT NULL::%s::%s', r.old_type, r.new_type);
        castable := true;
      EXCEPTION WHEN OTHERS THEN
        castable := false;
      END;
      action := CASE WHEN castable THEN 'retype' ELSE 'replace' END;
    END IF;
    CONTINUE WHEN action IS NULL;
    columns := columns || jsonb_build_object('name', r.name, 'action', action, 'type', r.new_type,
                                             'collation', r.new_coll, 'from', r.old_type);
    IF action = 'add' THEN
      CONTINUE;
    END IF;
    IF r.attnum IS NULL THEN
      CONTINUE;
    END IF;
    -- Transforms reading the column (chains).
    deps := ARRAY(SELECT DISTINCT format('transform %I', x.target_name)
                    FROM @schema@.transform_sources ts JOIN @schema@.transforms x ON x.id = ts.transform_id
                   WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.redefines IS DISTINCT FROM t.id
                     AND r.name = ANY (ts.read_columns::text[])
                   ORDER BY 1);
    IF action IN ('drop', 'replace') THEN
      deps := deps || @schema@._column_dependants(t, r.attnum);
      IF cardinality(deps) > 0 THEN
        refused := refused || format('column %I would be dropped%s, and %s depend%s on it',
          r.name, CASE WHEN action = 'replace' THEN format(' and added again (there is no cast from %s to %s)', r.old_type, r.new_type) ELSE '' END,
          array_to_string(deps, ', '), CASE WHEN cardinality(deps) = 1 THEN 's' ELSE '' END);
      ELSE
        changes := changes || CASE WHEN action = 'drop' THEN format('column %I dropped', r.name)
          ELSE format('column %I dropped and added again as %s (there is no cast from %s)', r.name, r.new_type, r.old_type) END;
      END IF;
    ELSE
      -- Postgres refuses to retype a column a view, a rule or a policy reads.
      deps := @schema@._column_dependants(t, r.attnum, ARRAY['pg_rewrite'::regclass, 'pg_policy'::regclass]);
      IF cardinality(deps) > 0 THEN
        refused := refused || format('column %I would change type from %s to %s, which Postgres refuses while %s read%s it',
          r.name, r.old_type, r.new_type, array_to_string(deps, ', '), CASE WHEN cardinality(deps) = 1 THEN 's' ELSE '' END);
      ELSE
        deps := @schema@._column_dependants(t, r.attnum);
        changes := changes || format('column %I retyped from %s to %s%s', r.name, r.old_type,
          r.new_type || coalesce(' COLLATE ' || r.new_coll, ''),
          CASE WHEN cardinality(deps) > 0 THEN format(' (%s rebuilt or checked again)', array_to_string(deps, ', ')) ELSE '' END);
        -- A transform reading it follows the new type (ADR 0047) or the switch is refused.
        FOR action IN SELECT DISTINCT x.target_name FROM @schema@.transform_sources ts
                        JOIN @schema@.transforms x ON x.id = ts.transform_id
                       WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.redefines IS DISTINCT FROM t.id
                         AND r.name = ANY (ts.read_columns::text[]) ORDER BY 1 LOOP
          changes := changes || format('transform %I reads column %I: its definition follows the new type and its target is re-derived', action, r.name);
        END LOOP;
      END IF;
    END IF;
  END LOOP;
  RETURN jsonb_build_object('changes', to_jsonb(changes), 'refused', to_jsonb(refused),
                            'key_changed', key_changed, 'columns', columns);
END
$fn$;

-- ALTER TRANSFORM t AS <definition>: the definition analysed as a fresh TRANSFORM of that
-- name would be (under this session's search_path and settings, as a definition is), the
-- switch planned (refused at once when it would be: see _redefine_plan), and the shadow
-- defined, for the staging worker to build and switch to. A redefinition already being
-- built is replaced; one to the definition in force is none (and ends one being built).
CREATE FUNCTION @schema@._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  def jsonb := ast->'definition';
  cat name := @schema_literal@;
  shadow_name text := 'redefine#' || t.id;
  spec jsonb;
  normalised text;
  plan jsonb;
  v_oid oid;
  new_id int;
BEGIN
  IF t.redefines IS NOT NULL THEN
    PERFORM @schema@._fail('TRN01', format('there is no transform named %I', t.target_name));
  END IF;
  -- A switch to a redefinition being replaced finishes first (it holds these rows, taken
  -- in the drain's order): the transform is then the one it switched to.
  PERFORM 1 FROM @schema@.pipeline px
   WHERE px.transform_id = t.id
      OR px.transform_id IN (SELECT y.id FROM @schema@.transforms y WHERE y.redefines = t.id)
   ORDER BY px.transform_id FOR UPDATE;
  IF NOT EXISTS (SELECT 1 FROM @schema@.transforms y WHERE y.id = t.id) THEN
    PERFORM @schema@._fail('TRT01', format(
      'transform %I was switched to another definition while this statement waited: apply it again', t.target_name));
  END IF;
  def := jsonb_set(def, '{target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
  spec := @schema@._analyze_transform(def);
  spec := jsonb_set(spec, '{ast,target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
  spec := spec || jsonb_build_object(
    'whole_row', @schema@._check_definition(spec),
    'key_map', @schema@._key_map_kind(spec));
  normalised := @schema@.render_statement(spec->'ast');
  DELETE FROM @schema@.transforms s WHERE s.redefines = t.id;
  IF normalised = t.statement THEN
    UPDATE @schema@.transforms x SET redefinition = NULL WHERE x.id = t.id AND x.redefinition->>'state' = 'building';
    RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
  END IF;
  plan := @schema@._redefine_plan(t, spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    PERFORM @schema@._fail('TRC01', format('transform %I cannot be redefined in place: %s', t.target_name,
      (SELECT string_agg(x, '; ') FROM jsonb_array_elements_text(plan->'refused') x)),
      'drop or change those objects first (or DROP TRANSFORM and define it again)');
  END IF;

  v_oid := @schema@._create_target(cat, shadow_name, spec);
  INSERT INTO @schema@.transforms (target_schema, target_name, target_oid, statement, spec,
                                   aggregates, without_source_index, search_path, redefines)
  VALUES (cat, shadow_name, v_oid, normalised, spec,
          (spec->>'aggregates')::boolean, coalesce((def->>'without_source_index')::boolean, false),
          array_to_string(ARRAY(SELECT quote_ident(s) FROM unnest(current_schemas(false)) AS s), ', '),
          t.id)
  RETURNING id INTO new_id;
  PERFORM @schema@._register(new_id, spec);
  PERFORM @schema@._record_read_attrs(new_id);
  PERFORM @schema@._create_key_map(new_id, spec);
  INSERT INTO @schema@.transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  SELECT new_id, o::int - 1, c->>'name', c->>'expression', c->>'type', c->>'collation',
         (c->>'is_key')::boolean, (c->>'implicit')::boolean, c->'reads'
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  UPDATE @schema@.transforms x
     SET redefinition = jsonb_build_object('state', 'building', 'statement', normalised,
                                           'since', now(), 'changes', plan->'changes')
   WHERE x.id = t.id;
  RETURN jsonb_build_object('kind', 'redefining', 'target', t.target_name, 'changes', plan->'changes');
END
$fn$;

-- A redefinition given up (its shadow paused, or the switch refused): the shadow goes, the
-- transform keeps its definition and says why (redefinition.state 'failed').
CREATE FUNCTION @schema@._redefine_abandon(shadow_id int, reason text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  s @schema@.transforms;
BEGIN
  SELECT * INTO s FROM @schema@.transforms x WHERE x.id = shadow_id AND x.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  DELETE FROM @schema@.transforms x WHERE x.id = s.id;
  UPDATE @schema@.transforms x
     SET redefinition = jsonb_build_object('state', 'failed', 'statement', s.statement,
                                           'error', reason, 'at', now())
   WHERE x.id = s.redefines;
END
$fn$;

-- The switch (the staging worker calls it, in a transaction of its own, once the shadow is
-- live). Locks in the drain's order (page slots, pipeline rows, then tables), of the
-- transform, its shadow and every transform reading the target (a chain), so no drain
-- applies to any of them meanwhile; then the target: ACCESS EXCLUSIVE when its columns,
-- key or the engine's indexes change (ALTER TABLE takes it anyway), EXCLUSIVE otherwise (the
-- app's reads go on, seeing the rows as they were until the switch commits). The caller
-- sets a short lock_timeout: a switch waiting on a long reader is tried again, not queued
-- in front of every other reader. Returns {switched, target, changes, deleted, written,
-- lockMs} (switched false, with why, when the shadow is not ready); raises TRC01 when the
-- switch is refused (_redefine_plan, or a reading transform that cannot follow).
CREATE FUNCTION @schema@._redefine_switch(shadow_id int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  x @schema@.transforms;
  p @schema@.pipeline;
  ids int[];
  rel text;
  shadow_rel text;
  plan jsonb;
  c jsonb;
  ddl boolean;
  key_changed boolean;
  locked_at timestamptz;
  r record;
  cols text;
  keys text;
  key_match text;
  deleted bigint := 0;
  gone bigint := 0;
  written bigint := 0;
  wanted text[];
  detail text;
  new_key text[];
BEGIN
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  ids := ARRAY(SELECT DISTINCT i FROM unnest(ARRAY[t.id, s.id] || ARRAY(
                 SELECT ts.transform_id FROM @schema@.transform_sources ts WHERE ts.source_oid = t.target_oid)) i
               ORDER BY i);
  PERFORM 1 FROM @schema@.page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM @schema@.pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    -- Dropped, or replaced by another ALTER TRANSFORM … AS, while this waited.
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO p FROM @schema@.pipeline px WHERE px.transform_id = s.id;
  IF p.phase <> 'live' OR p.follow_pending OR s.paused_at IS NOT NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'the new definition is not live yet');
  END IF;

  plan := @schema@._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: %s', t.target_name,
      (SELECT string_agg(v, '; ') FROM jsonb_array_elements_text(plan->'refused') v)));
  END IF;
  key_changed := (plan->>'key_changed')::boolean;
  new_key := ARRAY(SELECT jsonb_array_elements_text(s.spec->'key'));
  -- The engine's indexes on joined tables' keys the new definition needs.
  wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                    FROM jsonb_array_elements(s.spec->'sources') src
                   WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  ddl := key_changed OR jsonb_array_length(plan->'columns') > 0
    OR wanted IS DISTINCT FROM ARRAY(
         SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
           FROM jsonb_array_elements(t.spec->'sources') src
          WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');

  rel := t.target_oid::regclass::text;
  shadow_rel := s.target_oid::regclass::text;
  EXECUTE 'LOCK TABLE ' || rel || CASE WHEN ddl THEN ' IN ACCESS EXCLUSIVE MODE' ELSE ' IN EXCLUSIVE MODE' END;
  locked_at := clock_timestamp();
  EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
  PERFORM set_config('trellis.maintaining', @schema_literal@, true);

  BEGIN
    -- The engine's own objects the new definition does not keep: its key constraint (or a
    -- grand total's index) when the key changes, the indexes on keys no longer joined.
    FOR r IN
      SELECT i.indexrelid::regclass::text AS idx, con.conname,
             array_to_string(ARRAY(SELECT quote_ident(a.attname) FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o), ', ') AS cols,
             i.indisunique, i.indexprs IS NOT NULL AS on_expression
        FROM pg_index i LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
       WHERE i.indrelid = t.target_oid
    LOOP
      IF key_changed AND r.conname IS NOT NULL AND r.cols = coalesce((
           SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k), '') THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', rel, r.conname);
      ELSIF key_changed AND r.indisunique AND r.on_expression AND jsonb_array_length(t.spec->'key') = 0
            AND r.conname IS NULL THEN
        EXECUTE 'DROP INDEX ' || r.idx;
      ELSIF NOT r.indisunique AND NOT r.on_expression AND r.cols IN (
              SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                FROM jsonb_array_elements(t.spec->'sources') src
               WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array')
            AND r.cols <> ALL (wanted) THEN
        EXECUTE 'DROP INDEX ' || r.idx;
      END IF;
    END LOOP;
    IF key_changed THEN
      -- Rows keyed another way: every row is written again.
      EXECUTE 'DELETE FROM ' || rel;
      GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    FOR c IN SELECT value FROM jsonb_array_elements(plan->'columns') LOOP
      IF c->>'action' IN ('drop', 'replace') THEN
        EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, c->>'name');
      END IF;
      IF c->>'action' IN ('add', 'replace') THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s%s', rel, c->>'name', c->>'type',
                       coalesce(' COLLATE ' || (c->>'collation'), ''));
      ELSIF c->>'action' = 'retype' THEN
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s%s USING %I::%s', rel, c->>'name', c->>'type',
                       coalesce(' COLLATE ' || (c->>'collation'), ''), c->>'name', c->>'type');
      END IF;
    END LOOP;
    -- NULLs the new definition allows where the old did not (before the rows come).
    FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
              WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull AND NOT n.attnotnull LOOP
      EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP NOT NULL', rel, r.attname);
    END LOOP;
    IF key_changed THEN
      keys := (SELECT string_agg(quote_ident(k), ', ') FROM unnest(new_key) k);
      IF keys IS NULL THEN
        EXECUTE 'CREATE UNIQUE INDEX ON ' || rel || ' ((true))';
      ELSIF coalesce((s.spec->>'key_nullable')::boolean, false) THEN
        EXECUTE 'ALTER TABLE ' || rel || ' ADD UNIQUE NULLS NOT DISTINCT (' || keys || ')';
      ELSE
        EXECUTE 'ALTER TABLE ' || rel || ' ADD PRIMARY KEY (' || keys || ')';
      END IF;
    END IF;
    FOR r IN SELECT w FROM unnest(wanted) w WHERE w NOT IN (
               SELECT array_to_string(ARRAY(SELECT quote_ident(a.attname) FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o), ', ')
                 FROM pg_index i WHERE i.indrelid = t.target_oid AND NOT i.indisunique AND i.indexprs IS NULL) LOOP
      EXECUTE 'CREATE INDEX ON ' || rel || ' (' || r.w || ')';
    END LOOP;
  EXCEPTION
    WHEN dependent_objects_still_exist OR feature_not_supported THEN
      GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
      PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
        t.target_name, SQLERRM, coalesce(' (' || replace(nullif(detail, ''), E'\n', '; ') || ')', '')));
  END;

  -- The rows: the shadow's, by a diff (rows gone deleted, rows new or changed written, as
  -- the drain writes them: value images, so 1.0 becomes 1.00), so a chain reading the target
  -- sees keyed changes.
  cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
             FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id);
  IF NOT key_changed THEN
    -- `=` where the key column cannot be NULL (a hash anti-join); IS NOT DISTINCT FROM,
    -- which Postgres can only join by nested loop, only where it can (a nullable key).
    key_match := (SELECT string_agg(format(CASE WHEN a.attnotnull THEN 'n.%I = t.%I' ELSE 'n.%I IS NOT DISTINCT FROM t.%I' END,
                                           k, k), ' AND ')
                    FROM unnest(new_key) k
                    LEFT JOIN pg_attribute a ON a.attrelid = s.target_oid AND a.attname = k);
    EXECUTE 'DELETE FROM ' || rel || ' t WHERE NOT EXISTS (SELECT 1 FROM ' || shadow_rel || ' n'
      || coalesce(' WHERE ' || key_match, '') || ')';
    GET DIAGNOSTICS gone = ROW_COUNT;
    deleted := deleted + gone;
  END IF;
  -- Rows the target holds otherwise, updated, and rows it lacks, inserted, each by one join
  -- (a hash join where the key cannot be NULL): an unchanged row is not touched. No writer
  -- but this one can reach the target meanwhile (the drain's locks are held).
  IF NOT key_changed THEN
    EXECUTE 'UPDATE ' || rel || ' t SET (' || cols || ') = ROW(' || (
        SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
          FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id) || ')'
      || ' FROM ' || shadow_rel || ' n WHERE ' || coalesce(key_match || ' AND ', '')
      || 'record_image_ne(ROW(' || (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                                      FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id)
      || '), ROW(' || (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                        FROM @schema@.transform_columns cc WHERE cc.transform_id = s.id) || '))';
    GET DIAGNOSTICS written = ROW_COUNT;
  END IF;
  EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || cols || ' FROM ' || shadow_rel || ' n'
    || CASE WHEN key_changed THEN '' ELSE
         ' WHERE NOT EXISTS (SELECT 1 FROM ' || rel || ' t' || coalesce(' WHERE ' || key_match, '') || ')' END;
  GET DIAGNOSTICS gone = ROW_COUNT;
  written := written + gone;
  -- NOT NULL where the new definition's columns are (the rows are in now).
  FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
            WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
              AND NOT a.attisdropped AND NOT n.attisdropped AND NOT a.attnotnull AND n.attnotnull LOOP
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', rel, r.attname);
  END LOOP;

  -- Transforms reading the target follow a column's new type (ADR 0047: their definition
  -- rebound and analysed again, their target altered, re-derived by the staging worker),
  -- or the switch is refused naming them.
  FOR x IN
    SELECT y.* FROM @schema@.transforms y
     WHERE y.id <> t.id AND y.id <> s.id AND y.capture_failure IS NULL AND y.paused_at IS NULL
       AND EXISTS (SELECT 1 FROM @schema@.transform_sources ts
                     CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) ra
                     JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                    WHERE ts.transform_id = y.id AND ts.source_oid = t.target_oid AND NOT a.attisdropped
                      AND (format_type(a.atttypid, a.atttypmod) <> ra->>'type' OR a.attnum <> (ra->>'attnum')::int))
     ORDER BY y.id
  LOOP
    -- read_attrs by name: a column dropped and added again moved to another attnum.
    UPDATE @schema@.transform_sources ts
       SET read_attrs = (SELECT jsonb_agg(CASE WHEN a.attnum IS NULL THEN ra
                                               ELSE jsonb_set(ra, '{attnum}', to_jsonb(a.attnum::int)) END)
                           FROM jsonb_array_elements(ts.read_attrs) ra
                           LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                                                   AND NOT a.attisdropped)
     WHERE ts.transform_id = x.id AND ts.source_oid = t.target_oid;
    BEGIN
      EXECUTE 'LOCK TABLE ' || x.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
      PERFORM @schema@._follow_transform(x);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS detail = MESSAGE_TEXT;
      PERFORM @schema@._fail('TRC01', format('transform %I cannot be switched to its new definition: transform %I reads it and %s',
        t.target_name, x.target_name, detail));
    END;
  END LOOP;

  -- The catalog: the shadow's rows become the transform's (definition, plan, cursor, key
  -- map, group states, held keys), on the target; the old transform's go.
  UPDATE @schema@.transforms y SET redefines = NULL WHERE y.id = s.id;
  DELETE FROM @schema@.transforms y WHERE y.id = t.id;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  UPDATE @schema@.transforms y
     SET target_schema = t.target_schema, target_name = t.target_name, target_oid = t.target_oid,
         created_at = t.created_at, updated_at = now(),
         redefinition = jsonb_build_object('state', 'switched', 'statement', s.statement,
                                           'previous', t.statement, 'since', t.redefinition->'since',
                                           'at', now(), 'changes', plan->'changes',
                                           'deleted', deleted, 'written', written,
                                           'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2))
   WHERE y.id = s.id;
  EXECUTE 'DROP TABLE ' || shadow_rel;
  RETURN jsonb_build_object('switched', true, 'target', t.target_name, 'changes', plan->'changes',
                            'deleted', deleted, 'written', written,
                            'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2));
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;

-- As in 0034, with the transform's last redefinition (redefinition): a redefinition
-- being built, or given up, is said by status(), not only by the logs.
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

