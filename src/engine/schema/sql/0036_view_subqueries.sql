-- Subqueries in FROM and non-recursive WITH in a view's SQL (issue #26, item 1, second
-- slice; ADR 0056):
--
--   TRANSFORM name AS [WITH cte [(column {, column})] AS [[NOT] MATERIALIZED] (<select>) {, ...}]
--     SELECT ... FROM { table | cte | (<select>) [AS] alias [(column {, column})] } ...
--
-- Each derived table and each WITH query becomes a hidden part: a transform of its own,
-- whose target lives in the target schema as "trellis#<target>#<name>" (nested ones as
-- "trellis#<target>#<outer>.<name>"), maintained as any chain is; the statement around it
-- reads that target as a source. A WITH query referenced twice is one part. The user sees
-- one transform: definitions() lists the parts under it (parts), not as transforms of
-- their own, shows the statement as written (normalised), and DROP TRANSFORM drops them.
--
-- Renamed here and wrapped (so whichever migration wrote them last stays in force for
-- statements without parts): _define -> _define_one, _drop -> _drop_one.
-- Replaced (their latest bodies copied, each change marked "0036"): grammar_parse_view
-- (0028; now a wrapper of a four-argument form taking the WITH queries in scope),
-- render_statement (0028), definitions() (0026). A trigger on transforms (follow_part)
-- carries a part's definition changed in place into its transform's statement.

ALTER FUNCTION @schema@._define(jsonb, text) RENAME TO _define_one;
ALTER FUNCTION @schema@._drop(jsonb) RENAME TO _drop_one;

-- A part's transform: the transform whose statement it is a subquery or WITH query of
-- (NULL for the transforms users define), and its name there (the WITH query's name, or
-- the derived table's alias; "outer.inner" when nested).
ALTER TABLE @schema@.transforms ADD COLUMN part_of int;
ALTER TABLE @schema@.transforms ADD COLUMN part_name text;
CREATE INDEX transforms_by_part_of ON @schema@.transforms (part_of) WHERE part_of IS NOT NULL;

-- A subquery in parentheses starting at token i (the "("), parsed as a view's SELECT with
-- the WITH queries `ctes` in scope: (its AST, the token after its ")").
CREATE FUNCTION @schema@.grammar_subselect(
  toks @schema@.grammar_token[], i int, ctes jsonb, OUT ast jsonb, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  sub @schema@.grammar_token[];
BEGIN
  LOOP
    IF toks[k].kind = 'eof' THEN
      PERFORM @schema@.grammar_fail(format(
        'unbalanced brackets: expected ")" to close "(" (character %s), found end of statement',
        toks[i].pos), toks[k].pos);
    END IF;
    IF toks[k].kind = 'punct' AND toks[k].text = '(' THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text = ')' THEN
      d := d - 1;
      EXIT WHEN d = 0;
    END IF;
    k := k + 1;
  END LOOP;
  sub := toks[i + 1 : k - 1] || ROW('eof', '', '', toks[k].pos)::@schema@.grammar_token;
  ast := @schema@.grammar_parse_view(sub, 1, NULL, ctes);
  IF coalesce((ast ->> 'without_source_index')::boolean, false)
     OR coalesce((ast ->> 'without_row_security')::boolean, false) THEN
    PERFORM @schema@.grammar_refuse(
      'WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY go at the end of the statement, not inside a subquery',
      toks[i].pos);
  END IF;
  next := k + 1;
END
$fn$;

-- A parenthesised list of column names at token i: (the names, the token after ")").
CREATE FUNCTION @schema@.grammar_name_list(
  toks @schema@.grammar_token[], i int, what text, OUT names jsonb, OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  names := '[]';
  next := i + 1;
  LOOP
    names := names || to_jsonb(@schema@.grammar_name(toks[next], what, false));
    next := next + 1;
    EXIT WHEN NOT (toks[next].kind = 'punct' AND toks[next].text = ',');
    next := next + 1;
  END LOOP;
  IF NOT (toks[next].kind = 'punct' AND toks[next].text = ')') THEN
    PERFORM @schema@.grammar_unexpected(toks, next, '"," or ")"');
  END IF;
  next := next + 1;
END
$fn$;

-- An item of a view's FROM clause at token i: a table (as grammar_view_table reads it), a
-- WITH query in scope (`ctes`, by its bare name), or a derived table: (SELECT ...) [AS]
-- alias [(columns)]. For the last two, `part` is the source's part marker and `derived`
-- the derived table's part ({name, kind, columns, ast}).
CREATE FUNCTION @schema@.grammar_view_item(
  toks @schema@.grammar_token[], i int, what text, ctes jsonb,
  OUT schema_name text, OUT rel_name text, OUT alias text, OUT part jsonb, OUT derived jsonb,
  OUT next int
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  sub jsonb;
  cols jsonb;
BEGIN
  IF toks[i].kind = 'punct' AND toks[i].text = '('
     AND (@schema@.grammar_kw(toks[i + 1], 'select') OR @schema@.grammar_kw(toks[i + 1], 'with')) THEN
    SELECT q.ast, q.next INTO sub, next FROM @schema@.grammar_subselect(toks, i, ctes) q;
    SELECT q.alias, q.next INTO alias, next FROM @schema@.grammar_alias(toks, next) q;
    IF alias IS NULL THEN
      PERFORM @schema@.grammar_refuse('a subquery in FROM needs an alias: write (SELECT ...) AS name',
        toks[i].pos);
    END IF;
    IF toks[next].kind = 'punct' AND toks[next].text = '(' THEN
      SELECT q.names, q.next INTO cols, next
        FROM @schema@.grammar_name_list(toks, next, 'a column name') q;
    END IF;
    rel_name := alias;
    part := jsonb_build_object('part', alias, 'part_kind', 'derived');
    derived := jsonb_build_object('name', alias, 'kind', 'derived', 'columns', coalesce(cols, '[]'),
                                  'ast', sub, 'position', toks[i].pos);
    RETURN;
  END IF;
  IF toks[i].kind = 'punct' AND toks[i].text = '(' AND @schema@.grammar_kw(toks[i + 1], 'values') THEN
    PERFORM @schema@.grammar_refuse('VALUES in FROM is not supported: write a table', toks[i].pos);
  END IF;
  -- A WITH query in scope: a bare name (no schema) naming one.
  IF ctes <> '{}' AND (toks[i].kind = 'ident'
       OR (toks[i].kind = 'word' AND @schema@.grammar_keyword_class(toks[i].value) IS NULL))
     AND NOT (toks[i + 1].kind = 'punct' AND toks[i + 1].text = '.')
     AND ctes ? toks[i].value THEN
    rel_name := toks[i].value;
    SELECT q.alias, q.next INTO alias, next FROM @schema@.grammar_alias(toks, i + 1) q;
    IF toks[next].kind = 'punct' AND toks[next].text = '(' THEN
      PERFORM @schema@.grammar_refuse('column aliases after a WITH query''s alias are not supported yet',
        toks[next].pos);
    END IF;
    part := jsonb_build_object('part', rel_name, 'part_kind', 'cte');
    RETURN;
  END IF;
  SELECT q.schema_name, q.rel_name, q.alias, q.next INTO schema_name, rel_name, alias, next
    FROM @schema@.grammar_view_table(toks, i, what) q;
END
$fn$;

-- 0036: grammar_parse_view (0028) with the WITH queries in scope (`ctes`, a JSON object
-- whose keys are their names). As in 0028, with these changes, each marked "0036": a
-- leading WITH (not RECURSIVE) is read into parts; FROM and JOIN items are read by
-- grammar_view_item (derived tables and WITH queries become parts, marked on the item);
-- the AST carries `parts` when it has any.
CREATE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
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
  -- 0036
  parts jsonb := '[]';
  cte_name text;
  cte_cols jsonb;
  cte_pos int;
  sub jsonb;
  part jsonb;
  derived jsonb;
BEGIN
  IF @schema@.grammar_kw(t, 'with') THEN
    IF @schema@.grammar_kw(toks[i + 1], 'recursive') THEN
      PERFORM @schema@.grammar_refuse('a recursive WITH clause (WITH RECURSIVE) is not supported', t.pos);
    END IF;
    -- 0036: WITH name [(columns)] AS [[NOT] MATERIALIZED] (<select>) {, ...}: each a part,
    -- in scope for the queries after it and for the SELECT.
    i := i + 1;
    LOOP
      cte_pos := toks[i].pos;
      cte_name := @schema@.grammar_name(toks[i], 'a WITH query name', true);
      i := i + 1;
      cte_cols := NULL;
      IF toks[i].kind = 'punct' AND toks[i].text = '(' THEN
        SELECT q.names, q.next INTO cte_cols, i
          FROM @schema@.grammar_name_list(toks, i, 'a column name') q;
      END IF;
      IF NOT @schema@.grammar_kw(toks[i], 'as') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, 'AS and the WITH query in parentheses');
      END IF;
      i := i + 1;
      IF @schema@.grammar_kw(toks[i], 'not') AND @schema@.grammar_kw(toks[i + 1], 'materialized') THEN
        i := i + 2;
      ELSIF @schema@.grammar_kw(toks[i], 'materialized') THEN
        i := i + 1;
      END IF;
      IF NOT (toks[i].kind = 'punct' AND toks[i].text = '(') THEN
        PERFORM @schema@.grammar_unexpected(toks, i, '"(" and the WITH query');
      END IF;
      IF NOT (@schema@.grammar_kw(toks[i + 1], 'select') OR @schema@.grammar_kw(toks[i + 1], 'with')) THEN
        PERFORM @schema@.grammar_refuse(
          'a WITH query that is not a SELECT (INSERT, UPDATE, DELETE, VALUES) is not supported',
          toks[i + 1].pos);
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p WHERE p->>'name' = cte_name) THEN
        PERFORM @schema@.grammar_fail(format('WITH query name %s is given more than once', cte_name),
          cte_pos);
      END IF;
      SELECT q.ast, q.next INTO sub, i FROM @schema@.grammar_subselect(toks, i, ctes) q;
      parts := parts || jsonb_build_array(jsonb_build_object(
        'name', cte_name, 'kind', 'cte', 'columns', coalesce(cte_cols, '[]'), 'ast', sub,
        'position', cte_pos));
      ctes := ctes || jsonb_build_object(cte_name, true);
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    t := toks[i];
    IF NOT @schema@.grammar_kw(t, 'select') THEN
      PERFORM @schema@.grammar_unexpected(toks, i, '",", or SELECT after the WITH queries');
    END IF;
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
  -- 0036: a table, a WITH query or a derived table.
  SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
    INTO sch, nm, alias, part, derived, i
    FROM @schema@.grammar_view_item(toks, i + 1, 'a source table name', ctes) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias) || coalesce(part, '{}');
  IF derived IS NOT NULL THEN
    parts := parts || jsonb_build_array(derived);
  END IF;

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
    -- 0036: a table, a WITH query or a derived table.
    SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
      INTO sch, nm, alias, part, derived, i
      FROM @schema@.grammar_view_item(toks, i, 'a table name after JOIN', ctes) q;
    IF derived IS NOT NULL THEN
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p
                  WHERE p->>'kind' = 'derived' AND p->>'name' = derived->>'name') THEN
        PERFORM @schema@.grammar_fail(format('table name %s is given more than once', derived->>'name'),
          (derived->>'position')::int);
      END IF;
      parts := parts || jsonb_build_array(derived);
    END IF;
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
      'name', nm, 'alias', alias, 'on', @schema@.grammar_text(toks, i, e)) || coalesce(part, '{}'));
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
    || CASE WHEN wrs THEN jsonb_build_object('without_row_security', true) ELSE '{}' END
    -- 0036
    || CASE WHEN jsonb_array_length(parts) > 0 THEN jsonb_build_object('parts', parts) ELSE '{}' END;
END
$fn$;

-- 0028's three-argument form: the statement's own SELECT, no WITH query in scope.
CREATE OR REPLACE FUNCTION @schema@.grammar_parse_view(
  toks @schema@.grammar_token[], i int, target jsonb
) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT @schema@.grammar_parse_view(toks, i, target, '{}'::jsonb)
$fn$;

-- A FROM or JOIN item of a view's AST as written: a table, a WITH query by its name, or a
-- derived table in parentheses (found among the AST's parts).
CREATE FUNCTION @schema@._render_view_item(ast jsonb, item jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  p jsonb;
BEGIN
  IF item->>'part_kind' = 'derived' THEN
    SELECT x INTO p FROM jsonb_array_elements(ast->'parts') x
     WHERE x->>'kind' = 'derived' AND x->>'name' = item->>'part';
    RETURN '(' || @schema@._render_view_select(p->'ast') || ') AS ' || quote_ident(p->>'name')
      || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o)
                             FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o)) || ')', '');
  ELSIF item->>'part_kind' = 'cte' THEN
    RETURN quote_ident(item->>'part')
      || CASE WHEN coalesce((item->>'alias_implicit')::boolean, false) THEN ''
              ELSE coalesce(' AS ' || quote_ident(item->>'alias'), '') END;
  END IF;
  RETURN @schema@.grammar_render_name(item->>'schema', item->>'name')
    || coalesce(' AS ' || quote_ident(item->>'alias'), '');
END
$fn$;

-- A view's SELECT (an AS form AST, with parts) as written, normalised: its WITH queries,
-- derived tables in place, no target, no trailing options. Also what Postgres is asked to
-- check the statement as a whole.
CREATE FUNCTION @schema@._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  is_distinct boolean := coalesce((ast ->> 'distinct')::boolean, false);
  with_ text;
BEGIN
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || @schema@._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '')
    || 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
         SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
                           ', ' ORDER BY ordinality)
           FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY)
    || ' FROM ' || @schema@._render_view_item(ast, ast->'from')
    || coalesce((
         SELECT string_agg(
                  CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
                  || @schema@._render_view_item(ast, j) || ' ON ' || (j ->> 'on'), '' ORDER BY o)
           FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '')
    || coalesce(' WHERE ' || (ast ->> 'where'), '')
    || CASE WHEN is_distinct THEN '' ELSE coalesce(' GROUP BY ' || (
         SELECT string_agg(value, ', ' ORDER BY ordinality)
           FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '') END
    || coalesce(' HAVING ' || (ast ->> 'having'), '');
END
$fn$;

-- 0036: render_statement as in 0028, and a view's SQL with parts (WITH queries, derived
-- tables) rendered as it was written, by _render_view_select.
CREATE OR REPLACE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
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
  -- 0036: a statement with parts.
  IF jsonb_array_length(coalesce(ast -> 'parts', '[]')) > 0 THEN
    RETURN 'TRANSFORM ' || target || ' AS ' || @schema@._render_view_select(ast)
      || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
      || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  END IF;
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

-- A FROM or JOIN item naming a part, bound to the part's hidden target (in `scope`:
-- "<kind>:<name>" -> target name); any other item as it is. A WITH query written without
-- an alias is read under its own name.
CREATE FUNCTION @schema@._bind_part_item(item jsonb, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  hidden text;
BEGIN
  IF item->>'part' IS NULL THEN
    RETURN item;
  END IF;
  hidden := scope->>((item->>'part_kind') || ':' || (item->>'part'));
  IF hidden IS NULL THEN
    PERFORM @schema@._fail('TRV01', format('the %s %I is not in scope here',
      CASE item->>'part_kind' WHEN 'cte' THEN 'WITH query' ELSE 'subquery' END, item->>'part'));
  END IF;
  RETURN item || jsonb_build_object(
    'schema', (SELECT c.target_schema FROM @schema@.config c)::text, 'name', hidden,
    'alias', coalesce(item->>'alias', item->>'part'),
    'alias_implicit', item->>'alias' IS NULL);
END
$fn$;

-- Whether an expression is one call of count() (with or without FILTER), which is never
-- NULL: a part's column so made is declared NOT NULL, so that a GROUP BY of it around the
-- part (an aggregate over an aggregate, TPC-H Q13's c_count) is a key that is never NULL.
CREATE FUNCTION @schema@._is_count_call(expr text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(expr);
  n int := array_length(toks, 1);
  close_at int;
BEGIN
  IF NOT (@schema@.grammar_kw(toks[1], 'count') AND toks[2].kind = 'punct' AND toks[2].text = '(') THEN
    RETURN false;
  END IF;
  close_at := @schema@._closing_token(toks, 2);
  IF close_at IS NULL THEN
    RETURN false;
  END IF;
  IF @schema@.grammar_kw(toks[close_at + 1], 'filter') THEN
    close_at := @schema@._closing_token(toks, close_at + 2);
  END IF;
  RETURN close_at IS NOT NULL AND toks[close_at + 1].kind = 'eof' AND close_at + 1 = n;
EXCEPTION WHEN SQLSTATE 'TRP01' THEN
  RETURN false;
END
$fn$;

-- Defines the parts of a view's AST (its WITH queries, then its derived tables, each
-- after the parts inside it) as hidden transforms of `root`, and returns
-- {ast: the AST with its FROM and JOIN items bound to their targets, ids: [part ids]}.
-- `path` prefixes the parts' names (nested ones), `scope` holds the WITH queries of the
-- enclosing queries.
CREATE FUNCTION @schema@._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  part jsonb;
  sub jsonb;
  res jsonb;
  ids jsonb := '[]';
  hidden text;
  what text;
  cols jsonb;
  item jsonb;
  info jsonb;
  spec jsonb;
  part_id int;
  k int;
BEGIN
  FOR part IN SELECT value FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) LOOP
    what := CASE part->>'kind' WHEN 'cte' THEN format('WITH query %I', part->>'name')
                               ELSE format('subquery %I in FROM', part->>'name') END;
    hidden := 'trellis#' || root || '#' || path || (part->>'name');
    IF octet_length(hidden) > 63 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the %s is kept in a hidden target named %s, longer than 63 bytes: give it, or the transform, a shorter name',
        what, hidden));
    END IF;
    -- A table of that reserved name that no transform keeps is a part's target loaded
    -- from a schema dump (restore_definition defines the statement again): the part makes
    -- its own, and builds it.
    IF to_regclass(quote_ident(tschema) || '.' || quote_ident(hidden)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM @schema@.transforms t
                        WHERE t.target_schema = tschema AND t.target_name = hidden) THEN
      EXECUTE format('DROP TABLE %I.%I', tschema, hidden);
    END IF;
    res := @schema@._define_parts(part->'ast', root, path || (part->>'name') || '.', scope);
    ids := ids || (res->'ids');
    sub := res->'ast';
    -- Column aliases name the part's columns, in order; Postgres refuses more of them than
    -- columns (the statement was checked whole before this).
    cols := coalesce(part->'columns', '[]');
    IF jsonb_array_length(cols) > jsonb_array_length(sub->'select') THEN
      PERFORM @schema@._fail('TRV01', format('the %s has %s columns available but %s columns specified',
        what, jsonb_array_length(sub->'select'), jsonb_array_length(cols)));
    END IF;
    FOR k IN 0 .. jsonb_array_length(cols) - 1 LOOP
      item := sub->'select'->k;
      -- A bare label (`count(*) n`) gives way to the alias: the expression without it, when
      -- Postgres reads it as a label (as _distinct_groups decides it).
      IF item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL THEN
        info := @schema@._analyze_query('SELECT ' || (item->>'expr') || ' FROM ' || @schema@._view_from_sql(sub),
          format('in the %s, SELECT item %s (%s)', what, k + 1, item->>'expr'));
        IF info->'columns'->0->>'name' = item->>'bare_label' THEN
          item := item || jsonb_build_object('expr', item->>'label_expr');
        END IF;
      END IF;
      item := item || jsonb_build_object('name', cols->>k, 'bare_label', NULL, 'label_expr', NULL);
      sub := jsonb_set(sub, ARRAY['select', k::text], item);
    END LOOP;
    sub := sub || jsonb_build_object('target', jsonb_build_object('schema', NULL, 'name', hidden),
                                     'without_source_index', coalesce((ast->>'without_source_index')::boolean, false))
               || CASE WHEN (ast->>'without_row_security')::boolean
                       THEN jsonb_build_object('without_row_security', true) ELSE '{}' END;
    PERFORM @schema@._define_one(sub, NULL);
    SELECT t.id, t.spec INTO part_id, spec FROM @schema@.transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    -- Its count() columns are never NULL: declared so, a GROUP BY of one around it is a key.
    IF (spec->>'aggregates')::boolean THEN
      FOR item IN SELECT c FROM jsonb_array_elements(spec->'columns') c
                   WHERE NOT (c->>'is_key')::boolean AND c->>'type' = 'bigint'
                     AND @schema@._is_count_call(c->>'expression') LOOP
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET NOT NULL', tschema, hidden, item->>'name');
        -- Recorded in its spec too: a target made again from it (a halt's repair) says so.
        UPDATE @schema@.transforms t
           SET spec = jsonb_set(t.spec, '{columns}', (
                 SELECT jsonb_agg(CASE WHEN c->>'name' = item->>'name'
                                       THEN c || '{"notnull": true}' ELSE c END ORDER BY o)
                   FROM jsonb_array_elements(t.spec->'columns') WITH ORDINALITY AS x(c, o)))
         WHERE t.id = part_id;
      END LOOP;
    END IF;
    -- The statement around it reads the part's target as a source: by a key that is
    -- never NULL (a primary key).
    IF jsonb_array_length(spec->'key') = 0 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the %s aggregates without GROUP BY (one row, no key): a subquery of one row is not supported yet (a scalar subquery is a later slice)',
        what));
    END IF;
    IF (spec->>'key_nullable')::boolean THEN
      PERFORM @schema@._fail('TRV01', format(
        'the %s is keyed by (%s), which can be NULL (a LEFT JOIN''s side, or a GROUP BY of a column that is not NOT NULL): the statement around a subquery reads its rows by a key that is never NULL. Group by columns declared NOT NULL (or filter the NULLs out and coalesce the column)',
        what, (SELECT string_agg(k2, ', ') FROM jsonb_array_elements_text(spec->'key') k2)));
    END IF;
    UPDATE @schema@.transforms SET part_name = path || (part->>'name') WHERE id = part_id;
    ids := ids || to_jsonb(part_id);
    scope := scope || jsonb_build_object((part->>'kind') || ':' || (part->>'name'), hidden);
  END LOOP;
  ast := jsonb_set(ast, '{from}', @schema@._bind_part_item(ast->'from', scope));
  ast := jsonb_set(ast, '{joins}', coalesce((
    SELECT jsonb_agg(@schema@._bind_part_item(j, scope) ORDER BY o)
      FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  RETURN jsonb_build_object('ast', ast, 'ids', ids);
END
$fn$;

-- Refuses a subquery in the expressions of a view's SELECT with parts (as written, its
-- WITH queries in scope), naming the clause it is in, as _refuse_view_sql (0028) does for a
-- statement without parts.
CREATE FUNCTION @schema@._refuse_view_sublinks(ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  base jsonb := ast || jsonb_build_object(
    'select', jsonb_build_array(jsonb_build_object('expr', '1', 'name', 'x')),
    'where', NULL, 'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false);
  grouped jsonb;
  clause text;
BEGIN
  IF NOT coalesce((@schema@._view_parse(@schema@._render_view_select(ast)) ->> 'has_sublinks')::boolean, false) THEN
    RETURN;
  END IF;
  grouped := base || jsonb_build_object('group_by', coalesce(ast->'group_by', '[]'));
  clause := CASE
    WHEN (@schema@._view_parse(@schema@._render_view_select(base)) ->> 'has_sublinks')::boolean
      THEN 'a join condition (ON)'
    WHEN ast->>'where' IS NOT NULL AND (@schema@._view_parse(@schema@._render_view_select(
        base || jsonb_build_object('where', ast->>'where'))) ->> 'has_sublinks')::boolean
      THEN 'WHERE'
    WHEN jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0
      AND (@schema@._view_parse(@schema@._render_view_select(grouped)) ->> 'has_sublinks')::boolean
      THEN 'GROUP BY'
    WHEN ast->>'having' IS NOT NULL AND (@schema@._view_parse(@schema@._render_view_select(
        grouped || jsonb_build_object('having', ast->>'having'))) ->> 'has_sublinks')::boolean
      THEN 'HAVING'
    ELSE 'the SELECT list' END;
  PERFORM @schema@._fail('TRV01', format('a subquery in %s is not supported yet', clause));
END
$fn$;

-- TRANSFORM: a statement with parts (derived tables, WITH queries) is checked whole by
-- Postgres, its parts defined as hidden transforms, then the statement around them, which
-- reads their targets; every other statement as before (_define_one). Names starting
-- with trellis# are the engine's own.
CREATE FUNCTION @schema@._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM @schema@.config c);
  tname text := ast->'target'->>'name';
  res jsonb;
  result jsonb;
BEGIN
  IF starts_with(tname, 'trellis#') THEN
    PERFORM @schema@._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): choose another target name',
      tname));
  END IF;
  IF jsonb_array_length(coalesce(ast->'parts', '[]')) = 0 THEN
    RETURN @schema@._define_one(ast, statement);
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM @schema@._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  -- Postgres reads the statement as written first: names, column aliases, scopes.
  PERFORM @schema@._analyze_query(@schema@._render_view_select(ast), 'in the definition');
  PERFORM @schema@._refuse_view_sublinks(ast);
  res := @schema@._define_parts(ast, tname, '', '{}');
  result := @schema@._define_one(res->'ast', statement);
  UPDATE @schema@.transforms p SET part_of = t.id
    FROM @schema@.transforms t
   WHERE t.target_schema = tschema AND t.target_name = tname
     AND p.id IN (SELECT (x)::int FROM jsonb_array_elements_text(res->'ids') x);
  RETURN result;
END
$fn$;

-- DROP TRANSFORM: the transform, then its parts (the last defined first: a part may read
-- an earlier one). A part is dropped only with its transform.
CREATE FUNCTION @schema@._drop(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  parts text[];
  p text;
  result jsonb;
BEGIN
  IF t.part_of IS NOT NULL THEN
    PERFORM @schema@._fail('TRC01', format(
      '%I is part of transform %I (its %s): DROP TRANSFORM %I drops it', t.target_name,
      (SELECT o.target_name FROM @schema@.transforms o WHERE o.id = t.part_of), t.part_name,
      (SELECT o.target_name FROM @schema@.transforms o WHERE o.id = t.part_of)));
  END IF;
  parts := ARRAY(SELECT x.target_name FROM @schema@.transforms x WHERE x.part_of = t.id ORDER BY x.id DESC);
  result := @schema@._drop_one(ast);
  FOREACH p IN ARRAY parts LOOP
    PERFORM @schema@._drop_one(jsonb_build_object('kind', 'drop', 'transform', p));
  END LOOP;
  RETURN result;
END
$fn$;

-- 0036: definitions() as in 0026, without the parts of a transform as transforms of their
-- own: each transform with parts lists them (parts: [{name, target, statement, key,
-- maintenance, sourceIndexGaps}], in the order they were defined).
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
         -- 0036
         || CASE WHEN EXISTS (SELECT 1 FROM @schema@.transforms p WHERE p.part_of = t.id)
              THEN jsonb_build_object('parts', (
                SELECT jsonb_agg(jsonb_build_object(
                         'name', p.part_name, 'target', p.target_name, 'statement', p.statement,
                         'key', to_jsonb(ARRAY(SELECT c.name::text FROM @schema@.transform_columns c
                                                WHERE c.transform_id = p.id AND c.is_key ORDER BY c.ordinal)),
                         'maintenance', @schema@._maintenance(p.aggregates, p.delta),
                         -- The source indexes its changes are found by, as status() shows a
                         -- transform's: a part has no status() of its own in the lists.
                         'sourceIndexGaps', (
                           SELECT coalesce(jsonb_agg(jsonb_build_object(
                                    'table', g->'table', 'columns', g->'columns', 'role', g->'role',
                                    'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
                             FROM jsonb_array_elements(@schema@.source_index_gaps(p.id)) g))
                       ORDER BY p.id)
                  FROM @schema@.transforms p WHERE p.part_of = t.id))
              ELSE '{}'::jsonb END
    FROM @schema@.transforms t
   -- 0035: a redefinition being built is not a transform of its own either.
   WHERE t.part_of IS NULL AND t.redefines IS NULL
   ORDER BY t.target_name
$fn$;

-- A part's definition changed in place (a source or column rename followed, ADR 0047; a
-- RESUME that bound it again): the transform's own statement shows the part as it is now.
-- The part's AST (its parts inside it kept as the transform records them) replaces the
-- one the transform recorded for it, and the statement is rendered again.
CREATE FUNCTION @schema@._follow_part()
RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  root @schema@.transforms;
  nm text;
  idx int;
  path text[] := ARRAY['ast'];
  cur jsonb;
  new_ast jsonb;
  new_spec jsonb;
BEGIN
  SELECT * INTO root FROM @schema@.transforms WHERE id = NEW.part_of;
  IF NOT FOUND OR NEW.part_name IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH nm IN ARRAY string_to_array(NEW.part_name, '.') LOOP
    SELECT o::int - 1 INTO idx
      FROM jsonb_array_elements(coalesce(root.spec #> (path || 'parts'::text), '[]')) WITH ORDINALITY AS x(p, o)
     WHERE p->>'name' = nm LIMIT 1;
    IF idx IS NULL THEN
      RETURN NULL;
    END IF;
    path := path || ARRAY['parts', idx::text, 'ast'];
  END LOOP;
  cur := root.spec #> path;
  new_ast := (NEW.spec->'ast') - 'target' - 'without_source_index' - 'without_row_security' - 'parts'
    || CASE WHEN cur ? 'parts' THEN jsonb_build_object('parts', cur->'parts') ELSE '{}' END;
  IF new_ast = cur THEN
    RETURN NULL;
  END IF;
  new_spec := jsonb_set(root.spec, path, new_ast);
  UPDATE @schema@.transforms
     SET spec = new_spec, statement = @schema@.render_statement(new_spec->'ast'), updated_at = now()
   WHERE id = root.id;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER follow_part AFTER UPDATE OF spec ON @schema@.transforms
  FOR EACH ROW WHEN (NEW.part_of IS NOT NULL AND NEW.spec IS DISTINCT FROM OLD.spec)
  EXECUTE FUNCTION @schema@._follow_part();

-- ALTER TRANSFORM ... AS (0035) redefines a transform through one shadow transform; a
-- statement with parts is several. Until redefinitions build parts too, a statement with
-- parts, or a transform that has some (or is one), is refused by name: DROP TRANSFORM and
-- TRANSFORM again (or change the parts' sources) instead.
ALTER FUNCTION @schema@._redefine(jsonb) RENAME TO _redefine_one;

CREATE FUNCTION @schema@._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
BEGIN
  IF t.part_of IS NOT NULL THEN
    PERFORM @schema@._fail('TRC01', format(
      '%I is part of transform %I (its %s): ALTER TRANSFORM %I AS redefines the whole statement',
      t.target_name, (SELECT o.target_name FROM @schema@.transforms o WHERE o.id = t.part_of),
      t.part_name, (SELECT o.target_name FROM @schema@.transforms o WHERE o.id = t.part_of)));
  END IF;
  IF jsonb_array_length(coalesce(ast->'definition'->'parts', '[]')) > 0
     OR EXISTS (SELECT 1 FROM @schema@.transforms p WHERE p.part_of = t.id) THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot be redefined in place to or from a statement with subqueries in FROM or WITH queries yet',
      t.target_name), 'DROP TRANSFORM it and define it again');
  END IF;
  RETURN @schema@._redefine_one(ast);
END
$fn$;
