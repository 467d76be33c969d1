-- A view's SQL as Postgres writes it (issue #26, item 1, first slice; ADR 0049):
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

ALTER FUNCTION @schema@.parse_statement(text) RENAME TO grammar_parse_from_first;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO grammar_render_from_first;
ALTER FUNCTION @schema@._analyze_transform(jsonb) RENAME TO _analyze_from_first;

-- Refuses a construct of a view's SQL: a validation error, not a grammar one (the
-- statement is SQL Postgres reads; the engine cannot maintain it), with where it starts.
CREATE FUNCTION @schema@.grammar_refuse(message text, pos int) RETURNS void
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
CREATE FUNCTION @schema@.grammar_view_clause(toks @schema@.grammar_token[], i int) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token := toks[i];
  nx @schema@.grammar_token := toks[i + 1];
BEGIN
  IF t.kind <> 'word' THEN
    RETURN;
  END IF;
  IF t.value IN ('union', 'intersect', 'except') THEN
    PERFORM @schema@.grammar_refuse(format('%s is not supported yet',
      upper(t.value) || CASE WHEN @schema@.grammar_kw(nx, 'all') THEN ' ALL' ELSE '' END), t.pos);
  ELSIF t.value IN ('limit', 'offset', 'fetch') THEN
    PERFORM @schema@.grammar_refuse(format(
      '%s is not supported: a target is a table, it holds every row of its definition (top-N is not supported yet)',
      upper(t.value)), t.pos);
  ELSIF t.value = 'window' THEN
    PERFORM @schema@.grammar_refuse('a WINDOW clause (window functions) is not supported yet', t.pos);
  ELSIF t.value = 'for' AND nx.kind = 'word' AND nx.value IN ('update', 'share', 'no', 'key') THEN
    PERFORM @schema@.grammar_refuse('a locking clause (FOR UPDATE, FOR SHARE) is not supported', t.pos);
  END IF;
END
$fn$;

-- A table of a view's FROM clause at token i: (schema_name, rel_name, alias, next token).
-- Refuses what FROM may hold besides a table: a subquery, LATERAL, a function.
CREATE FUNCTION @schema@.grammar_view_table(
  toks @schema@.grammar_token[], i int, what text,
  OUT schema_name text, OUT rel_name text, OUT alias text, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF @schema@.grammar_kw(toks[i], 'lateral') THEN
    PERFORM @schema@.grammar_refuse('LATERAL is not supported yet', toks[i].pos);
  END IF;
  IF toks[i].kind = 'punct' AND toks[i].text = '(' THEN
    PERFORM @schema@.grammar_refuse(CASE
      WHEN @schema@.grammar_kw(toks[i + 1], 'select') OR @schema@.grammar_kw(toks[i + 1], 'with')
        OR @schema@.grammar_kw(toks[i + 1], 'values')
      THEN 'a subquery in FROM is not supported yet'
      ELSE 'a parenthesised join in FROM is not supported yet' END, toks[i].pos);
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO schema_name, rel_name, next
    FROM @schema@.grammar_qualified(toks, i, what) q;
  IF toks[next].kind = 'punct' AND toks[next].text = '(' THEN
    PERFORM @schema@.grammar_refuse(format(
      'a set-returning function in FROM (%s) is not supported yet', rel_name), toks[i].pos);
  END IF;
  SELECT q.alias, q.next INTO alias, next FROM @schema@.grammar_alias(toks, next) q;
  IF alias IS NOT NULL AND toks[next].kind = 'punct' AND toks[next].text = '(' THEN
    PERFORM @schema@.grammar_refuse('column aliases after a table alias are not supported yet',
      toks[next].pos);
  END IF;
END
$fn$;

-- TRANSFORM target AS <the SELECT>, from token i (the token after AS).
CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token := toks[i];
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
  last @schema@.grammar_token;
  before @schema@.grammar_token;
BEGIN
  IF @schema@.grammar_kw(t, 'with') THEN
    PERFORM @schema@.grammar_refuse(CASE WHEN @schema@.grammar_kw(toks[i + 1], 'recursive')
      THEN 'a recursive WITH clause (WITH RECURSIVE) is not supported'
      ELSE 'a WITH clause (common table expressions) is not supported yet' END, t.pos);
  ELSIF t.kind = 'punct' AND t.text = '(' THEN
    PERFORM @schema@.grammar_refuse(
      'a SELECT in parentheses is not supported yet: write it without them', t.pos);
  ELSIF @schema@.grammar_kw(t, 'values') OR @schema@.grammar_kw(t, 'table') THEN
    PERFORM @schema@.grammar_refuse(format('%s is not supported: write a SELECT', upper(t.value)),
      t.pos);
  ELSIF NOT @schema@.grammar_kw(t, 'select') THEN
    PERFORM @schema@.grammar_unexpected(toks, i, 'SELECT after AS');
  END IF;
  i := i + 1;
  IF @schema@.grammar_kw(toks[i], 'distinct') THEN
    IF @schema@.grammar_kw(toks[i + 1], 'on') THEN
      PERFORM @schema@.grammar_refuse('DISTINCT ON is not supported yet', toks[i].pos);
    END IF;
    distinct_ := true;
    i := i + 1;
  ELSIF @schema@.grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  -- The SELECT list, as in the FROM-first form (0024).
  LOOP
    start := i;
    e := @schema@.grammar_scan(toks, i);
    IF e = start THEN
      PERFORM @schema@.grammar_view_clause(toks, e);
      PERFORM @schema@.grammar_unexpected(toks, e, 'a select item');
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

  IF NOT @schema@.grammar_kw(toks[i], 'from') THEN
    PERFORM @schema@.grammar_view_clause(toks, i);
    PERFORM @schema@.grammar_unexpected(toks, i, '",", or FROM and the tables');
  END IF;
  SELECT q.schema_name, q.rel_name, q.alias, q.next INTO sch, nm, alias, i
    FROM @schema@.grammar_view_table(toks, i + 1, 'a source table name') q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF t.kind = 'punct' AND t.text = ',' THEN
      PERFORM @schema@.grammar_refuse(
        'a comma-separated FROM list (FROM a, b) is not supported yet: write JOIN ... ON', t.pos);
    ELSIF t.kind = 'word' AND t.value IN ('right', 'full')
      AND (@schema@.grammar_kw(toks[i + 1], 'join') OR @schema@.grammar_kw(toks[i + 1], 'outer')) THEN
      PERFORM @schema@.grammar_refuse(format('a %s JOIN is not supported yet', upper(t.value)), t.pos);
    ELSIF @schema@.grammar_kw(t, 'cross') AND @schema@.grammar_kw(toks[i + 1], 'join') THEN
      PERFORM @schema@.grammar_refuse('CROSS JOIN is not supported yet', t.pos);
    ELSIF @schema@.grammar_kw(t, 'natural') THEN
      PERFORM @schema@.grammar_refuse('NATURAL JOIN is not supported yet: write JOIN ... ON', t.pos);
    ELSIF @schema@.grammar_kw(t, 'join') THEN
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
    SELECT q.schema_name, q.rel_name, q.alias, q.next INTO sch, nm, alias, i
      FROM @schema@.grammar_view_table(toks, i, 'a table name after JOIN') q;
    IF @schema@.grammar_kw(toks[i], 'using') THEN
      PERFORM @schema@.grammar_refuse('JOIN ... USING is not supported yet: write ON', toks[i].pos);
    END IF;
    IF NOT @schema@.grammar_kw(toks[i], 'on') THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'ON and a join condition');
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
  expected := 'JOIN, WHERE, GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF @schema@.grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'group') AND @schema@.grammar_kw(toks[i + 1], 'by') THEN
    IF distinct_ THEN
      PERFORM @schema@.grammar_refuse('SELECT DISTINCT with GROUP BY is not supported yet', toks[i].pos);
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
    expected := '",", HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF @schema@.grammar_kw(toks[i], 'having') THEN
    IF distinct_ THEN
      PERFORM @schema@.grammar_refuse('SELECT DISTINCT with HAVING is not supported yet', toks[i].pos);
    END IF;
    i := i + 1;
    e := @schema@.grammar_scan(toks, i);
    IF e = i THEN
      PERFORM @schema@.grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := @schema@.grammar_text(toks, i, e);
    i := e;
    expected := 'ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- A set operation or a WINDOW clause here is refused by name before ORDER BY is read.
  PERFORM @schema@.grammar_view_clause(toks, i);

  -- ORDER BY: read, and dropped (a table has no order; ADR 0049). Its expressions are not
  -- checked: they never run.
  IF @schema@.grammar_kw(toks[i], 'order') AND @schema@.grammar_kw(toks[i + 1], 'by') THEN
    i := i + 2;
    LOOP
      e := @schema@.grammar_scan(toks, i);
      IF e = i THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'an ORDER BY expression');
      END IF;
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  PERFORM @schema@.grammar_view_clause(toks, i);

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

  PERFORM @schema@.grammar_end(toks, i, expected);
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
CREATE FUNCTION @schema@.parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[];
  sch text;
  nm text;
  i int;
  d int := 0;
  sel int;
  ast jsonb;
BEGIN
  toks := @schema@.grammar_tokenize(statement);
  IF NOT @schema@.grammar_kw(toks[1], 'transform') THEN
    RETURN @schema@.grammar_parse_from_first(statement);
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM @schema@.grammar_qualified(toks, 2, 'a transform name') q;
  IF @schema@.grammar_kw(toks[i], 'as') THEN
    RETURN @schema@.grammar_parse_view(toks, i + 1, jsonb_build_object('schema', sch, 'name', nm));
  END IF;
  IF NOT @schema@.grammar_kw(toks[i], 'from') THEN
    PERFORM @schema@.grammar_unexpected(toks, i, 'FROM or AS');
  END IF;
  -- The SELECT keyword: the first SELECT outside brackets (no expression before it holds one).
  WHILE toks[i].kind <> 'eof' LOOP
    IF toks[i].kind = 'punct' AND toks[i].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[i].kind = 'punct' AND toks[i].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND @schema@.grammar_kw(toks[i], 'select') THEN
      sel := i;
      EXIT;
    END IF;
    i := i + 1;
  END LOOP;
  IF sel IS NULL OR NOT @schema@.grammar_kw(toks[sel + 1], 'distinct') THEN
    RETURN @schema@.grammar_parse_from_first(statement);
  END IF;
  IF @schema@.grammar_kw(toks[sel + 2], 'on') THEN
    PERFORM @schema@.grammar_refuse('DISTINCT ON is not supported yet', toks[sel + 1].pos);
  END IF;
  ast := @schema@.grammar_parse_from_first(overlay(statement
    PLACING repeat(' ', length(toks[sel + 1].text)) FROM toks[sel + 1].pos FOR length(toks[sel + 1].text)));
  IF jsonb_array_length(ast -> 'group_by') > 0 OR ast ->> 'having' IS NOT NULL THEN
    PERFORM @schema@.grammar_refuse(format('SELECT DISTINCT with %s is not supported yet',
      CASE WHEN jsonb_array_length(ast -> 'group_by') > 0 THEN 'GROUP BY' ELSE 'HAVING' END),
      toks[sel + 1].pos);
  END IF;
  RETURN ast || jsonb_build_object('distinct', true);
END
$fn$;

-- An AST -> the normalised statement text: the AS form as it was written (without its
-- ORDER BY), SELECT DISTINCT in either form, every other statement as before.
CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
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
    RETURN @schema@.grammar_render_from_first(ast);
  END IF;
  target := @schema@.grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name');
  select_ := 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
    SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
      ', ' ORDER BY ordinality)
    FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY);
  from_ := 'FROM '
    || @schema@.grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
    || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '')
    || coalesce((
      SELECT string_agg(
               CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
               || @schema@.grammar_render_name(j ->> 'schema', j ->> 'name')
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
CREATE FUNCTION @schema@._view_from_sql(ast jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT @schema@.grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
    || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '')
    || coalesce((
      SELECT string_agg(
               CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
               || @schema@.grammar_render_name(j ->> 'schema', j ->> 'name')
               || coalesce(' AS ' || quote_ident(j ->> 'alias'), '')
               || ' ON (' || (j ->> 'on') || ')', '' ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '')
$fn$;

-- What Postgres makes of a query (_analyze_query), or NULL when it refuses it: the
-- analysis that follows says why, part by part.
CREATE FUNCTION @schema@._view_parse(query text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  RETURN @schema@._analyze_query(query, 'in the definition');
EXCEPTION WHEN SQLSTATE 'TRV01' THEN
  RETURN NULL;
END
$fn$;

-- Refuses, as Postgres's parse of the whole SELECT finds it (the flags of its query tree):
-- SELECT DISTINCT over aggregates (either form); and what a view's SQL may hold in its
-- expressions and the engine cannot maintain yet: subqueries (EXISTS, IN (SELECT ...),
-- scalar subqueries), naming the clause they are in; window functions; set-returning
-- functions in the SELECT list.
CREATE FUNCTION @schema@._refuse_view_sql(ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := @schema@._view_from_sql(ast);
  grouping text := coalesce(' GROUP BY ' || (
    SELECT string_agg(g, ', ' ORDER BY o)
      FROM jsonb_array_elements_text(ast -> 'group_by') WITH ORDINALITY AS x(g, o)), '');
  info jsonb;
  clause text;
BEGIN
  info := @schema@._view_parse('SELECT '
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
    PERFORM @schema@._fail('TRV01', 'SELECT DISTINCT over aggregates is not supported yet');
  END IF;
  -- The FROM-first form keeps its own rules for what follows (0005).
  IF ast ->> 'form' IS DISTINCT FROM 'as' THEN
    RETURN;
  END IF;
  IF (info ->> 'has_sublinks')::boolean THEN
    clause := CASE
      WHEN (@schema@._view_parse('SELECT 1 FROM ' || from_sql) ->> 'has_sublinks')::boolean
        THEN 'a join condition (ON)'
      WHEN ast ->> 'where' IS NOT NULL AND (@schema@._view_parse(
          'SELECT 1 FROM ' || from_sql || ' WHERE (' || (ast ->> 'where') || ')') ->> 'has_sublinks')::boolean
        THEN 'WHERE'
      WHEN grouping <> '' AND (@schema@._view_parse(
          'SELECT 1 FROM ' || from_sql || grouping) ->> 'has_sublinks')::boolean
        THEN 'GROUP BY'
      WHEN ast ->> 'having' IS NOT NULL AND (@schema@._view_parse(
          'SELECT 1 FROM ' || from_sql || coalesce(nullif(grouping, ''), ' GROUP BY ()')
          || ' HAVING (' || (ast ->> 'having') || ')') ->> 'has_sublinks')::boolean
        THEN 'HAVING'
      ELSE 'the SELECT list' END;
    PERFORM @schema@._fail('TRV01', format('a subquery in %s is not supported yet', clause));
  END IF;
  IF (info ->> 'has_window')::boolean THEN
    PERFORM @schema@._fail('TRV01', 'a window function (OVER) is not supported yet');
  END IF;
  IF (info ->> 'has_srf')::boolean THEN
    PERFORM @schema@._fail('TRV01', 'a set-returning function in the SELECT list is not supported yet');
  END IF;
END
$fn$;

-- SELECT DISTINCT's GROUP BY: every item's expression (without its label: a bare label
-- is one where Postgres reads it so, as _analyze_transform decides it).
CREATE FUNCTION @schema@._distinct_groups(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := @schema@._view_from_sql(ast);
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
      info := @schema@._analyze_query('SELECT ' || expr || ' FROM ' || from_sql,
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
CREATE FUNCTION @schema@._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ->> 'form' = 'as' OR coalesce((ast ->> 'distinct')::boolean, false) THEN
    PERFORM @schema@._refuse_view_sql(ast);
  END IF;
  -- A statement as parsed has no GROUP BY with its DISTINCT; a stored one has its items'
  -- (RESUME, ALTER): an item more or less there is a column added or dropped.
  IF coalesce((ast ->> 'distinct')::boolean, false) THEN
    IF jsonb_array_length(ast -> 'group_by') = 0 THEN
      ast := jsonb_set(ast, '{group_by}', @schema@._distinct_groups(ast));
    ELSIF jsonb_array_length(ast -> 'group_by') <> jsonb_array_length(ast -> 'select') THEN
      PERFORM @schema@._fail('TRV01', format(
        'transform %I is a SELECT DISTINCT, keyed by every column: adding or dropping one would change its key. DROP TRANSFORM it and define it again',
        ast -> 'target' ->> 'name'));
    END IF;
  END IF;
  RETURN @schema@._analyze_from_first(ast);
END
$fn$;
