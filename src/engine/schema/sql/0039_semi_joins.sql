-- Semi- and anti-joins in a view's SQL (issue #26, item 1; ADR 0057): conditions AND-ed at
-- the top of WHERE of the form
--
--   [NOT] EXISTS (SELECT ... FROM ... WHERE <inner = outer equalities> AND ...)
--   expr [NOT] IN (SELECT col FROM ...), expr = ANY (SELECT ...), expr <> ALL (SELECT ...)
--
-- are decorrelated, when the statement is defined, into hidden parts (ADR 0056): a part
-- keyed by the subquery's correlation columns (`SELECT l_orderkey FROM lineitem WHERE
-- l_commitdate < l_receiptdate AND l_orderkey IS NOT NULL GROUP BY l_orderkey`), read by
-- the statement around it through a LEFT JOIN on that key, filtered on the part's key
-- being there (EXISTS, IN) or not (NOT EXISTS, NOT IN over values that are never NULL).
-- A correlation `inner <> outer` (TPC-H Q21) is kept as min() and max() of the inner
-- column per key. The statement is recorded (and rendered) as it was written.
--
-- Renamed here and wrapped (so whichever migration wrote them last stays in force):
--   _define (0036)             -> _define_before_semi
--   _analyze_transform (0028)  -> _analyze_before_semi
--   render_statement (0036)    -> render_before_semi
-- No other function is replaced.

ALTER FUNCTION @schema@._define(jsonb, text) RENAME TO _define_before_semi;
ALTER FUNCTION @schema@._analyze_transform(jsonb) RENAME TO _analyze_before_semi;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO render_before_semi;

-- The top-level conjuncts of a condition (split at AND outside brackets, the AND of a
-- BETWEEN kept), as their texts.
CREATE FUNCTION @schema@._semi_conjuncts(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(cond);
  n int := array_length(toks, 1);
  d int := 0;
  start int := 1;
  betweens int := 0;
  res text[] := '{}';
BEGIN
  FOR k IN 1 .. n LOOP
    IF toks[k].kind = 'eof' THEN
      res := res || @schema@.grammar_text(toks, start, k);
      EXIT;
    END IF;
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND @schema@.grammar_kw(toks[k], 'between') THEN
      betweens := betweens + 1;
    ELSIF d = 0 AND @schema@.grammar_kw(toks[k], 'and') THEN
      IF betweens > 0 THEN
        betweens := betweens - 1;
      ELSE
        res := res || @schema@.grammar_text(toks, start, k);
        start := k + 1;
      END IF;
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;

-- A condition's tokens as a comparable string (keywords folded, quoted names kept).
CREATE FUNCTION @schema@._semi_norm(cond text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT string_agg(x.kind || ':' || CASE WHEN x.kind = 'word' THEN x.value ELSE x.text END, ' ' ORDER BY x.o)
    FROM unnest(@schema@.grammar_tokenize(cond)) WITH ORDINALITY AS x(kind, text, value, pos, o)
   WHERE x.kind <> 'eof'
$fn$;

-- Whether tokens a..b hold EXISTS (, or IN / ANY / SOME / ALL ( SELECT: a subquery used as
-- a semi- or anti-join.
CREATE FUNCTION @schema@._semi_has_sublink(toks @schema@.grammar_token[])
RETURNS boolean LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  FOR k IN 1 .. coalesce(array_length(toks, 1), 0) - 2 LOOP
    IF toks[k].kind = 'word' AND toks[k + 1].kind = 'punct' AND toks[k + 1].text = '('
       AND (toks[k].value = 'exists'
            OR (toks[k].value IN ('in', 'any', 'some', 'all')
                AND (@schema@.grammar_kw(toks[k + 2], 'select') OR @schema@.grammar_kw(toks[k + 2], 'with')))) THEN
      RETURN true;
    END IF;
  END LOOP;
  RETURN false;
END
$fn$;

-- A conjunct that is a semi- or anti-join: {kind: exists | not_exists | in | not_in,
-- expr (the outer expression of IN forms), written (the form, for messages),
-- sub: the subquery's tokens (without its brackets, ending in eof)}; NULL otherwise.
CREATE FUNCTION @schema@._semi_shape(cond text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(cond);
  n int := array_length(toks, 1) - 1;  -- the last token before eof
  negated boolean := false;
  s int := 1;
  open_at int;
  kind text;
  expr_end int;
  d int := 0;
  written text;
BEGIN
  IF n < 3 OR NOT (toks[n].kind = 'punct' AND toks[n].text = ')') THEN
    RETURN NULL;
  END IF;
  IF @schema@.grammar_kw(toks[1], 'not') THEN
    negated := true;
    s := 2;
  END IF;
  IF @schema@.grammar_kw(toks[s], 'exists') AND toks[s + 1].text = '(' THEN
    open_at := s + 1;
    kind := CASE WHEN negated THEN 'not_exists' ELSE 'exists' END;
    written := CASE WHEN negated THEN 'NOT EXISTS' ELSE 'EXISTS' END;
  ELSE
    -- expr [NOT] IN (SELECT ...), expr = ANY|SOME (SELECT ...), expr <> ALL (SELECT ...)
    FOR k IN s .. n LOOP
      IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
        d := d + 1;
      ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
        d := d - 1;
      ELSIF d = 0 AND k > s AND toks[k + 1].kind = 'punct' AND toks[k + 1].text = '('
            AND (@schema@.grammar_kw(toks[k + 2], 'select') OR @schema@.grammar_kw(toks[k + 2], 'with')) THEN
        IF @schema@.grammar_kw(toks[k], 'in') THEN
          open_at := k + 1;
          IF @schema@.grammar_kw(toks[k - 1], 'not') THEN
            expr_end := k - 1;
            kind := CASE WHEN negated THEN 'in' ELSE 'not_in' END;
            written := 'NOT IN';
          ELSE
            expr_end := k;
            kind := CASE WHEN negated THEN 'not_in' ELSE 'in' END;
            written := 'IN';
          END IF;
        ELSIF toks[k].kind = 'word' AND toks[k].value IN ('any', 'some') AND toks[k - 1].kind = 'op'
              AND toks[k - 1].text = '=' THEN
          open_at := k + 1;
          expr_end := k - 1;
          kind := CASE WHEN negated THEN 'not_in' ELSE 'in' END;
          written := '= ' || upper(toks[k].value);
        ELSIF @schema@.grammar_kw(toks[k], 'all') AND toks[k - 1].kind = 'op'
              AND toks[k - 1].text IN ('<>', '!=') THEN
          open_at := k + 1;
          expr_end := k - 1;
          kind := CASE WHEN negated THEN 'in' ELSE 'not_in' END;
          written := toks[k - 1].text || ' ALL';
        END IF;
        EXIT WHEN open_at IS NOT NULL;
      END IF;
    END LOOP;
    IF open_at IS NULL OR expr_end <= s THEN
      RETURN NULL;
    END IF;
  END IF;
  IF @schema@._closing_token(toks, open_at) IS DISTINCT FROM n THEN
    RETURN NULL;
  END IF;
  RETURN jsonb_build_object(
    'kind', kind, 'written', CASE WHEN negated THEN 'NOT ... ' ELSE '' END || written,
    'expr', CASE WHEN expr_end IS NOT NULL THEN @schema@.grammar_text(toks, s, expr_end) END,
    'sub', @schema@.grammar_text(toks, open_at + 1, n));
END
$fn$;

-- A view's AST with the WITH queries of the statements around it in scope (for Postgres
-- to read an expression of it alone), asking for `expr` (or 1) with `where`.
CREATE FUNCTION @schema@._semi_probe(ast jsonb, outer_ctes jsonb, expr text, where_ text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  RETURN @schema@._view_parse(@schema@._render_view_select(ast || jsonb_build_object(
    'select', jsonb_build_array(jsonb_build_object('expr', coalesce(expr, '1'), 'name', 'trellis#x')),
    'where', where_, 'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false,
    'parts', outer_ctes || coalesce(ast->'parts', '[]'))));
END
$fn$;

-- Whether `expr` of a view's AST (its FROM items, in scope of the WITH queries around it)
-- is never NULL: a conjunct of its WHERE says `expr IS NOT NULL`, or it is a bare column
-- declared NOT NULL of a table not on the nullable side of a LEFT JOIN.
CREATE FUNCTION @schema@._semi_not_null(ast jsonb, expr text, conjuncts text[])
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  items jsonb := jsonb_build_array(ast->'from') || coalesce(ast->'joins', '[]');
  info jsonb;
  item jsonb;
BEGIN
  IF @schema@._semi_norm(expr || ' IS NOT NULL') = ANY (ARRAY(SELECT @schema@._semi_norm(c) FROM unnest(conjuncts) c))
     OR @schema@._semi_norm('(' || expr || ') IS NOT NULL') = ANY (ARRAY(SELECT @schema@._semi_norm(c) FROM unnest(conjuncts) c)) THEN
    RETURN true;
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(items) i WHERE i ? 'part') THEN
    RETURN false;
  END IF;
  info := @schema@._view_parse('SELECT ' || expr || ' FROM ' || (
    SELECT string_agg(@schema@.grammar_render_name(i->>'schema', i->>'name')
                      || coalesce(' AS ' || quote_ident(i->>'alias'), ''), ', ' ORDER BY o)
      FROM jsonb_array_elements(items) WITH ORDINALITY AS x(i, o)));
  IF info IS NULL OR info->'plain' IS NULL OR info->'plain' = 'null' THEN
    RETURN false;
  END IF;
  item := items->((info->'plain'->>'source')::int);
  IF item->>'type' = 'left' THEN
    RETURN false;
  END IF;
  RETURN coalesce((SELECT a.attnotnull FROM pg_attribute a
                    WHERE a.attrelid = to_regclass(@schema@.grammar_render_name(item->>'schema', item->>'name'))
                      AND a.attnum = (info->'plain'->>'attnum')::int), false);
END
$fn$;

-- The subquery of a semi- or anti-join (its tokens), parsed as a view's SELECT with the WITH
-- queries `ctes` in scope; for EXISTS its SELECT list is not read (SELECT * is common there).
CREATE FUNCTION @schema@._semi_parse_sub(sub text, for_exists boolean, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(sub);
  d int := 0;
  sel int;
  fr int;
BEGIN
  IF for_exists THEN
    FOR k IN 1 .. array_length(toks, 1) LOOP
      IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
        d := d + 1;
      ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
        d := d - 1;
      ELSIF d = 0 AND sel IS NULL AND @schema@.grammar_kw(toks[k], 'select') THEN
        sel := k;
      ELSIF d = 0 AND sel IS NOT NULL AND @schema@.grammar_kw(toks[k], 'from') THEN
        fr := k;
        EXIT;
      END IF;
    END LOOP;
    IF sel IS NOT NULL AND fr IS NOT NULL THEN
      toks := toks[1 : sel] || ROW('number', '1', '1', toks[sel + 1].pos)::@schema@.grammar_token
              || toks[fr : array_length(toks, 1)];
    END IF;
  END IF;
  RETURN @schema@.grammar_parse_view(toks, 1, NULL, ctes);
END
$fn$;

-- Rewrites the semi- and anti-joins at the top of a view's WHERE (and, first, those of its
-- parts) into hidden parts read through LEFT JOINs: see the head of this file and ADR 0057.
-- `outer_ctes`: the WITH query parts of the statements around it (for Postgres to read its
-- expressions). Returns the AST unchanged when it holds none.
CREATE FUNCTION @schema@._semi_rewrite(ast jsonb, outer_ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  conjuncts text[];
  kept text[] := '{}';
  conds text[] := '{}';
  c text;
  shape jsonb;
  sub jsonb;
  sub_conj text[];
  sub_kept text[];
  keys jsonb;        -- [{inner, outer}]
  nes jsonb;         -- [{inner, outer}]: inner <> outer
  item jsonb;
  expr text;
  toks @schema@.grammar_token[];
  eq int;
  d int;
  lhs text;
  rhs text;
  alias text;
  n int := 0;
  ctes jsonb;
  scope_ctes jsonb;
  on_ text;
  sel jsonb;
  part_where text;
  k int;
  p jsonb;
  parts jsonb := '[]';
  joins jsonb;
  found boolean := false;
  seen jsonb;
BEGIN
  -- The parts inside first (a derived table or WITH query with a semi-join of its own).
  scope_ctes := outer_ctes || coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(ast->'parts') x
                                          WHERE x->>'kind' = 'cte'), '[]');
  seen := outer_ctes;
  FOR p IN SELECT value FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) LOOP
    -- A WITH query sees those before it; a derived table every one of the statement's.
    parts := parts || jsonb_build_array(p || jsonb_build_object('ast', @schema@._semi_rewrite(p->'ast',
      CASE WHEN p->>'kind' = 'cte' THEN seen ELSE scope_ctes END)));
    IF p->>'kind' = 'cte' THEN
      seen := seen || jsonb_build_array(p);
    END IF;
  END LOOP;
  IF jsonb_array_length(parts) > 0 THEN
    ast := ast || jsonb_build_object('parts', parts);
  END IF;
  IF ast->>'where' IS NULL
     OR NOT @schema@._semi_has_sublink(@schema@.grammar_tokenize(ast->>'where')) THEN
    RETURN ast;
  END IF;
  ctes := coalesce((SELECT jsonb_object_agg(x->>'name', true) FROM jsonb_array_elements(scope_ctes) x), '{}');
  conjuncts := @schema@._semi_conjuncts(ast->>'where');
  joins := coalesce(ast->'joins', '[]');
  FOREACH c IN ARRAY conjuncts LOOP
    shape := @schema@._semi_shape(c);
    IF shape IS NULL THEN
      toks := @schema@.grammar_tokenize(c);
      IF @schema@._semi_has_sublink(toks) THEN
        PERFORM @schema@._fail('TRV01', format(
          'a subquery in WHERE as EXISTS, IN, = ANY or <> ALL is supported only as a condition AND-ed at the top of WHERE, not inside %s (%s): write it as its own AND-ed condition (an OR of two can be two transforms, or a UNION later)',
          CASE WHEN EXISTS (SELECT 1 FROM unnest(toks) t WHERE @schema@.grammar_kw(t, 'or')) THEN 'an OR'
               ELSE 'another expression (NOT, CASE, a comparison)' END, c));
      END IF;
      kept := kept || ('(' || c || ')');
      CONTINUE;
    END IF;
    found := true;
    n := n + 1;
    alias := replace(shape->>'kind', '_', '-') || '#' || n;
    sub := @schema@._semi_parse_sub(shape->>'sub', shape->>'kind' IN ('exists', 'not_exists'), ctes);
    -- GROUP BY: IN over the groups of its one selected expression (TPC-H Q18), kept with
    -- its HAVING: the part groups by it (and the correlation columns: the groups of a
    -- correlated subquery are those of its rows for one outer value).
    IF (jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL)
       AND NOT (shape->>'kind' IN ('in', 'not_in') AND jsonb_array_length(sub->'select') = 1
                AND jsonb_array_length(coalesce(sub->'group_by', '[]')) = 1
                AND @schema@._semi_norm(sub->'group_by'->>0) IN (
                      @schema@._semi_norm(sub->'select'->0->>'expr'),
                      @schema@._semi_norm(coalesce(sub->'select'->0->>'label_expr', '')))) THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) has GROUP BY or HAVING: supported only for IN over the groups of the one expression it selects (SELECT x ... GROUP BY x HAVING ...)',
        shape->>'written', c));
    END IF;
    -- Its own semi-joins first, then what it reads.
    sub := @schema@._semi_rewrite(sub - 'distinct', scope_ctes);
    IF (@schema@._semi_probe(sub, scope_ctes, NULL, NULL)) IS NULL THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) reads a WITH query of a statement around it, or is otherwise not readable alone: not supported yet',
        shape->>'written', c));
    END IF;
    keys := '[]';
    nes := '[]';
    IF shape->>'kind' IN ('in', 'not_in') THEN
      IF jsonb_array_length(sub->'select') <> 1 THEN
        PERFORM @schema@._fail('TRV01', format(
          'the subquery of %s (%s) selects %s columns: write one (a row compared with IN is not supported yet)',
          shape->>'written', c, jsonb_array_length(sub->'select')));
      END IF;
      item := sub->'select'->0;
      expr := CASE WHEN item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL
                   THEN item->>'label_expr' ELSE item->>'expr' END;
      IF jsonb_array_length(coalesce(sub->'group_by', '[]')) = 0
         AND coalesce((@schema@._semi_probe(sub, scope_ctes, expr, NULL)->>'has_aggs')::boolean, true) THEN
        PERFORM @schema@._fail('TRV01', format(
          'the subquery of %s (%s) aggregates without GROUP BY (one row): a subquery of one row is not supported yet (scalar subqueries are a later slice)',
          shape->>'written', c));
      END IF;
      keys := keys || jsonb_build_array(jsonb_build_object('inner', expr, 'outer', shape->>'expr'));
    END IF;
    -- The subquery's conditions: its own (kept in the part), and those reading the statement
    -- around it (correlation), each an equality inner = outer (or inner <> outer).
    sub_conj := CASE WHEN sub->>'where' IS NULL THEN '{}' ELSE @schema@._semi_conjuncts(sub->>'where') END;
    sub_kept := '{}';
    FOREACH expr IN ARRAY sub_conj LOOP
      IF @schema@._semi_probe(sub, scope_ctes, NULL, expr) IS NOT NULL THEN
        sub_kept := sub_kept || ('(' || expr || ')');
        CONTINUE;
      END IF;
      toks := @schema@.grammar_tokenize(expr);
      eq := NULL;
      d := 0;
      FOR k IN 1 .. array_length(toks, 1) LOOP
        IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
          d := d + 1;
        ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
          d := d - 1;
        ELSIF d = 0 AND toks[k].kind = 'op' AND toks[k].text IN ('=', '<>', '!=') THEN
          IF eq IS NOT NULL THEN
            eq := -1;
          ELSE
            eq := k;
          END IF;
        END IF;
      END LOOP;
      lhs := NULL;
      IF eq > 1 THEN
        lhs := @schema@.grammar_text(toks, 1, eq);
        rhs := @schema@.grammar_text(toks, eq + 1, array_length(toks, 1));
        IF @schema@._semi_probe(sub, scope_ctes, lhs, NULL) IS NOT NULL
           AND @schema@._semi_probe(sub, scope_ctes, rhs, NULL) IS NULL
           AND @schema@._semi_probe(ast, outer_ctes, rhs, NULL) IS NOT NULL THEN
          NULL;
        ELSIF @schema@._semi_probe(sub, scope_ctes, rhs, NULL) IS NOT NULL
           AND @schema@._semi_probe(sub, scope_ctes, lhs, NULL) IS NULL
           AND @schema@._semi_probe(ast, outer_ctes, lhs, NULL) IS NOT NULL THEN
          expr := lhs;
          lhs := rhs;
          rhs := expr;
        ELSE
          lhs := NULL;
        END IF;
      END IF;
      IF lhs IS NULL THEN
        PERFORM @schema@._fail('TRV01', format(
          'the subquery of %s (%s) reads the statement around it in %s: a correlated condition must be an equality (or <>) of an expression of the subquery''s tables with one of the statement''s',
          shape->>'written', c, expr));
      END IF;
      IF toks[eq].text = '=' THEN
        keys := keys || jsonb_build_array(jsonb_build_object('inner', lhs, 'outer', rhs));
      ELSE
        nes := nes || jsonb_build_array(jsonb_build_object('inner', lhs, 'outer', rhs));
      END IF;
    END LOOP;
    IF jsonb_array_length(keys) = 0 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) is not correlated by an equality with the statement around it: it is one fact for every row (a one-row part, not supported yet). Correlate it (WHERE inner_column = outer_column), or keep it in a transform of its own',
        shape->>'written', c));
    END IF;
    IF jsonb_array_length(nes) > 1 THEN
      PERFORM @schema@._fail('TRV01', format(
        'the subquery of %s (%s) has more than one correlated <> condition: not supported',
        shape->>'written', c));
    END IF;
    -- NOT IN's NULLs: x NOT IN (SELECT col ...) is NULL (the row is left out) when col holds
    -- a NULL, or when x is NULL and the subquery has rows. Kept exactly only where neither
    -- can happen.
    IF shape->>'kind' = 'not_in' THEN
      IF NOT @schema@._semi_not_null(sub, keys->0->>'inner', sub_conj) THEN
        PERFORM @schema@._fail('TRV01', format(
          '%s (%s): its subquery''s column %s can be NULL, and one NULL there makes the condition NULL for every row it does not match (so no row passes). Keeping that exactly needs a one-row part, not supported yet: add WHERE %s IS NOT NULL to the subquery (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE %s = %s)',
          shape->>'written', c, keys->0->>'inner', keys->0->>'inner', keys->0->>'inner', keys->0->>'outer'));
      END IF;
      IF NOT @schema@._semi_not_null(ast, keys->0->>'outer', conjuncts) THEN
        PERFORM @schema@._fail('TRV01', format(
          '%s (%s): %s can be NULL, and a NULL there makes the condition NULL when the subquery has rows and true when it has none. Keeping that exactly needs a one-row part, not supported yet: add AND %s IS NOT NULL to WHERE (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE column = %s)',
          shape->>'written', c, keys->0->>'outer', keys->0->>'outer', keys->0->>'outer'));
      END IF;
    END IF;
    -- The part: the subquery's rows that pass its own conditions, one per correlation key.
    sel := '[]';
    part_where := NULL;
    FOR k IN 0 .. jsonb_array_length(keys) - 1 LOOP
      sel := sel || jsonb_build_array(jsonb_build_object(
        'expr', keys->k->>'inner', 'name', 'key#' || (k + 1)));
      sub_kept := sub_kept || ('(' || (keys->k->>'inner') || ') IS NOT NULL');
    END LOOP;
    IF jsonb_array_length(nes) = 1 THEN
      sel := sel || jsonb_build_array(
        jsonb_build_object('expr', 'min(' || (nes->0->>'inner') || ')', 'name', 'min#1'),
        jsonb_build_object('expr', 'max(' || (nes->0->>'inner') || ')', 'name', 'max#1'));
    END IF;
    sub := sub || jsonb_build_object(
      'select', sel, 'where', array_to_string(sub_kept, ' AND '),
      'group_by', (SELECT jsonb_agg(x->>'inner' ORDER BY o) FROM jsonb_array_elements(keys) WITH ORDINALITY AS y(x, o)),
      'having', sub->'having', 'semi_key', true);
    on_ := (SELECT string_agg(format('%I.%I = (%s)', alias, 'key#' || o, x->>'outer'), ' AND ' ORDER BY o)
              FROM jsonb_array_elements(keys) WITH ORDINALITY AS y(x, o));
    joins := joins || jsonb_build_array(jsonb_build_object(
      'type', 'left', 'schema', NULL, 'name', alias, 'alias', alias, 'on', on_,
      'part', alias, 'part_kind', 'derived', 'semi', true));
    ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(jsonb_build_object(
      'name', alias, 'kind', 'derived', 'columns', '[]'::jsonb, 'ast', sub, 'semi', true)));
    IF jsonb_array_length(nes) = 1 THEN
      rhs := format('coalesce(%I.%I <> (%s) OR %I.%I <> (%s), false)',
        alias, 'min#1', nes->0->>'outer', alias, 'max#1', nes->0->>'outer');
      conds := conds || CASE WHEN shape->>'kind' IN ('exists', 'in') THEN rhs ELSE 'NOT ' || rhs END;
    ELSE
      conds := conds || format('%I.%I IS %sNULL', alias, 'key#1',
        CASE WHEN shape->>'kind' IN ('exists', 'in') THEN 'NOT ' ELSE '' END);
    END IF;
  END LOOP;
  IF NOT found THEN
    RETURN ast;
  END IF;
  RETURN ast || jsonb_build_object(
    'joins', joins, 'where', array_to_string(kept || conds, ' AND '),
    'semi_where', ast->>'where');
END
$fn$;

-- A rewritten AST as it was written: its WHERE as written, without the semi-join parts and
-- their joins (the parts inside it likewise).
CREATE FUNCTION @schema@._semi_as_written(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  IF ast ? 'parts' THEN
    ast := ast || jsonb_build_object('parts', coalesce((
      SELECT jsonb_agg(p || jsonb_build_object('ast', @schema@._semi_as_written(p->'ast')) ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)
       WHERE NOT coalesce((p->>'semi')::boolean, false)), '[]'));
    IF jsonb_array_length(ast->'parts') = 0 THEN
      ast := ast - 'parts';
    END IF;
  END IF;
  IF ast ? 'semi_where' THEN
    ast := (ast - 'semi_where') || jsonb_build_object(
      'where', ast->'semi_where',
      'joins', coalesce((SELECT jsonb_agg(j ORDER BY o)
                           FROM jsonb_array_elements(ast->'joins') WITH ORDINALITY AS x(j, o)
                          WHERE NOT coalesce((j->>'semi')::boolean, false)), '[]'));
  END IF;
  RETURN ast;
END
$fn$;

-- TRANSFORM: a view's SQL whose WHERE holds semi- or anti-joins is checked as written by
-- Postgres, rewritten (_semi_rewrite) and defined with its parts; the transform's statement
-- is the one written. Every other statement as before.
CREATE FUNCTION @schema@._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  rewritten jsonb;
  result jsonb;
BEGIN
  IF ast->>'form' IS DISTINCT FROM 'as' THEN
    RETURN @schema@._define_before_semi(ast, statement);
  END IF;
  rewritten := @schema@._semi_rewrite(ast, '[]');
  IF rewritten = ast THEN
    RETURN @schema@._define_before_semi(ast, statement);
  END IF;
  -- Postgres reads the statement as written first: names, scopes, types.
  PERFORM @schema@._analyze_query(@schema@._render_view_select(ast), 'in the definition');
  RETURN @schema@._define_before_semi(rewritten, statement);
END
$fn$;

-- The analysis (whichever migration wrote it last), and: a semi-join part's key is never
-- NULL (its WHERE says so: the target gets a primary key); a semi-join part read by the
-- statement around it adds nothing to that statement's key (it matches one row at most,
-- on its whole key).
CREATE FUNCTION @schema@._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  spec jsonb := @schema@._analyze_before_semi(ast);
  semi int[];
  dropped text[];
BEGIN
  IF coalesce((ast->>'semi_key')::boolean, false) THEN
    spec := spec || jsonb_build_object(
      'columns', (SELECT jsonb_agg(CASE WHEN (c->>'is_key')::boolean THEN c || '{"notnull": true}' ELSE c END ORDER BY o)
                    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o)),
      'key_nullable', false);
  END IF;
  semi := ARRAY(SELECT o::int FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)
                 WHERE coalesce((j->>'semi')::boolean, false));
  IF cardinality(semi) > 0 AND NOT (spec->>'aggregates')::boolean THEN
    dropped := ARRAY(SELECT c->>'name' FROM jsonb_array_elements(spec->'columns') c
                      WHERE (c->>'implicit')::boolean AND (c->>'is_key')::boolean
                        AND (c->'plain'->>'source')::int = ANY (semi));
    spec := spec || jsonb_build_object(
      'columns', (SELECT jsonb_agg(c ORDER BY o) FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o)
                   WHERE NOT (c->>'name' = ANY (dropped))),
      'key', (SELECT coalesce(jsonb_agg(k ORDER BY o), '[]') FROM jsonb_array_elements_text(spec->'key') WITH ORDINALITY AS x(k, o)
               WHERE NOT (k = ANY (dropped))),
      'sources', (SELECT jsonb_agg(CASE WHEN (s->>'ordinal')::int = ANY (semi)
                                        THEN s || jsonb_build_object('target_key_columns', 'null'::jsonb) ELSE s END
                                   ORDER BY o)
                    FROM jsonb_array_elements(spec->'sources') WITH ORDINALITY AS x(s, o)));
    spec := spec || jsonb_build_object('key_nullable', EXISTS (
      SELECT 1 FROM jsonb_array_elements(spec->'columns') c
       WHERE (c->>'is_key')::boolean AND NOT (c->>'notnull')::boolean));
  END IF;
  RETURN spec;
END
$fn$;

-- render_statement (whichever migration wrote it last), of the statement as written.
CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast->>'kind' = 'transform' AND ast->>'form' = 'as' THEN
    ast := @schema@._semi_as_written(ast);
  END IF;
  RETURN @schema@.render_before_semi(ast);
END
$fn$;
