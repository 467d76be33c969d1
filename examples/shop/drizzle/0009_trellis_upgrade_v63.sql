-- Written by `trellis generate upgrade` (trellis-pg 0.2.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 36 to version 63.
-- Only the migrations after version 36, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 36 is refused with what to run.
DO $trellis_upgrade$
DECLARE
  newer int;
  boss_version int;
  installed int := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(1953654124, hashtext('trellis'));
  IF to_regclass('"trellis".migrations') IS NOT NULL THEN
    SELECT coalesce(max(version), 0) INTO installed FROM "trellis".migrations;
  END IF;
  IF installed < 36 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 36 to 63', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 36 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 63 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (63): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 37) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (37, 'no_change', false);
    EXECUTE $trellis_m37$-- Schema version 37 changes nothing: the number was set aside for work (builds, ADR 0060;
-- Q11's shadows, ADR 0061) that turned out to need no migration. Kept so versions stay
-- contiguous.
SELECT 1;
$trellis_m37$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 38) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (38, 'no_change', false);
    EXECUTE $trellis_m38$-- Schema version 38 changes nothing: the number was set aside for work (builds, ADR 0060;
-- Q11's shadows, ADR 0061) that turned out to need no migration. Kept so versions stay
-- contiguous.
SELECT 1;
$trellis_m38$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 39) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (39, 'semi_joins', false);
    EXECUTE $trellis_m39$-- Semi- and anti-joins in a view's SQL (issue #26, item 1; ADR 0057): conditions AND-ed at
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

ALTER FUNCTION "trellis"._define(jsonb, text) RENAME TO _define_before_semi;
ALTER FUNCTION "trellis"._analyze_transform(jsonb) RENAME TO _analyze_before_semi;
ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO render_before_semi;

-- The top-level conjuncts of a condition (split at AND outside brackets, the AND of a
-- BETWEEN kept), as their texts.
CREATE FUNCTION "trellis"._semi_conjuncts(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(cond);
  n int := array_length(toks, 1);
  d int := 0;
  start int := 1;
  betweens int := 0;
  res text[] := '{}';
BEGIN
  FOR k IN 1 .. n LOOP
    IF toks[k].kind = 'eof' THEN
      res := res || "trellis".grammar_text(toks, start, k);
      EXIT;
    END IF;
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND "trellis".grammar_kw(toks[k], 'between') THEN
      betweens := betweens + 1;
    ELSIF d = 0 AND "trellis".grammar_kw(toks[k], 'and') THEN
      IF betweens > 0 THEN
        betweens := betweens - 1;
      ELSE
        res := res || "trellis".grammar_text(toks, start, k);
        start := k + 1;
      END IF;
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;

-- A condition's tokens as a comparable string (keywords folded, quoted names kept).
CREATE FUNCTION "trellis"._semi_norm(cond text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT string_agg(x.kind || ':' || CASE WHEN x.kind = 'word' THEN x.value ELSE x.text END, ' ' ORDER BY x.o)
    FROM unnest("trellis".grammar_tokenize(cond)) WITH ORDINALITY AS x(kind, text, value, pos, o)
   WHERE x.kind <> 'eof'
$fn$;

-- Whether tokens a..b hold EXISTS (, or IN / ANY / SOME / ALL ( SELECT: a subquery used as
-- a semi- or anti-join.
CREATE FUNCTION "trellis"._semi_has_sublink(toks "trellis".grammar_token[])
RETURNS boolean LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  FOR k IN 1 .. coalesce(array_length(toks, 1), 0) - 2 LOOP
    IF toks[k].kind = 'word' AND toks[k + 1].kind = 'punct' AND toks[k + 1].text = '('
       AND (toks[k].value = 'exists'
            OR (toks[k].value IN ('in', 'any', 'some', 'all')
                AND ("trellis".grammar_kw(toks[k + 2], 'select') OR "trellis".grammar_kw(toks[k + 2], 'with')))) THEN
      RETURN true;
    END IF;
  END LOOP;
  RETURN false;
END
$fn$;

-- A conjunct that is a semi- or anti-join: {kind: exists | not_exists | in | not_in,
-- expr (the outer expression of IN forms), written (the form, for messages),
-- sub: the subquery's tokens (without its brackets, ending in eof)}; NULL otherwise.
CREATE FUNCTION "trellis"._semi_shape(cond text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(cond);
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
  IF "trellis".grammar_kw(toks[1], 'not') THEN
    negated := true;
    s := 2;
  END IF;
  IF "trellis".grammar_kw(toks[s], 'exists') AND toks[s + 1].text = '(' THEN
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
            AND ("trellis".grammar_kw(toks[k + 2], 'select') OR "trellis".grammar_kw(toks[k + 2], 'with')) THEN
        IF "trellis".grammar_kw(toks[k], 'in') THEN
          open_at := k + 1;
          IF "trellis".grammar_kw(toks[k - 1], 'not') THEN
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
        ELSIF "trellis".grammar_kw(toks[k], 'all') AND toks[k - 1].kind = 'op'
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
  IF "trellis"._closing_token(toks, open_at) IS DISTINCT FROM n THEN
    RETURN NULL;
  END IF;
  RETURN jsonb_build_object(
    'kind', kind, 'written', CASE WHEN negated THEN 'NOT ... ' ELSE '' END || written,
    'expr', CASE WHEN expr_end IS NOT NULL THEN "trellis".grammar_text(toks, s, expr_end) END,
    'sub', "trellis".grammar_text(toks, open_at + 1, n));
END
$fn$;

-- A view's AST with the WITH queries of the statements around it in scope (for Postgres
-- to read an expression of it alone), asking for `expr` (or 1) with `where`.
CREATE FUNCTION "trellis"._semi_probe(ast jsonb, outer_ctes jsonb, expr text, where_ text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  RETURN "trellis"._view_parse("trellis"._render_view_select(ast || jsonb_build_object(
    'select', jsonb_build_array(jsonb_build_object('expr', coalesce(expr, '1'), 'name', 'trellis#x')),
    'where', where_, 'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false,
    'parts', outer_ctes || coalesce(ast->'parts', '[]'))));
END
$fn$;

-- Whether `expr` of a view's AST (its FROM items, in scope of the WITH queries around it)
-- is never NULL: a conjunct of its WHERE says `expr IS NOT NULL`, or it is a bare column
-- declared NOT NULL of a table not on the nullable side of a LEFT JOIN.
CREATE FUNCTION "trellis"._semi_not_null(ast jsonb, expr text, conjuncts text[])
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  items jsonb := jsonb_build_array(ast->'from') || coalesce(ast->'joins', '[]');
  info jsonb;
  item jsonb;
BEGIN
  IF "trellis"._semi_norm(expr || ' IS NOT NULL') = ANY (ARRAY(SELECT "trellis"._semi_norm(c) FROM unnest(conjuncts) c))
     OR "trellis"._semi_norm('(' || expr || ') IS NOT NULL') = ANY (ARRAY(SELECT "trellis"._semi_norm(c) FROM unnest(conjuncts) c)) THEN
    RETURN true;
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(items) i WHERE i ? 'part') THEN
    RETURN false;
  END IF;
  info := "trellis"._view_parse('SELECT ' || expr || ' FROM ' || (
    SELECT string_agg("trellis".grammar_render_name(i->>'schema', i->>'name')
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
                    WHERE a.attrelid = to_regclass("trellis".grammar_render_name(item->>'schema', item->>'name'))
                      AND a.attnum = (info->'plain'->>'attnum')::int), false);
END
$fn$;

-- The subquery of a semi- or anti-join (its tokens), parsed as a view's SELECT with the WITH
-- queries `ctes` in scope; for EXISTS its SELECT list is not read (SELECT * is common there).
CREATE FUNCTION "trellis"._semi_parse_sub(sub text, for_exists boolean, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(sub);
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
      ELSIF d = 0 AND sel IS NULL AND "trellis".grammar_kw(toks[k], 'select') THEN
        sel := k;
      ELSIF d = 0 AND sel IS NOT NULL AND "trellis".grammar_kw(toks[k], 'from') THEN
        fr := k;
        EXIT;
      END IF;
    END LOOP;
    IF sel IS NOT NULL AND fr IS NOT NULL THEN
      toks := toks[1 : sel] || ROW('number', '1', '1', toks[sel + 1].pos)::"trellis".grammar_token
              || toks[fr : array_length(toks, 1)];
    END IF;
  END IF;
  RETURN "trellis".grammar_parse_view(toks, 1, NULL, ctes);
END
$fn$;

-- Rewrites the semi- and anti-joins at the top of a view's WHERE (and, first, those of its
-- parts) into hidden parts read through LEFT JOINs: see the head of this file and ADR 0057.
-- `outer_ctes`: the WITH query parts of the statements around it (for Postgres to read its
-- expressions). Returns the AST unchanged when it holds none.
CREATE FUNCTION "trellis"._semi_rewrite(ast jsonb, outer_ctes jsonb)
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
  toks "trellis".grammar_token[];
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
    parts := parts || jsonb_build_array(p || jsonb_build_object('ast', "trellis"._semi_rewrite(p->'ast',
      CASE WHEN p->>'kind' = 'cte' THEN seen ELSE scope_ctes END)));
    IF p->>'kind' = 'cte' THEN
      seen := seen || jsonb_build_array(p);
    END IF;
  END LOOP;
  IF jsonb_array_length(parts) > 0 THEN
    ast := ast || jsonb_build_object('parts', parts);
  END IF;
  IF ast->>'where' IS NULL
     OR NOT "trellis"._semi_has_sublink("trellis".grammar_tokenize(ast->>'where')) THEN
    RETURN ast;
  END IF;
  ctes := coalesce((SELECT jsonb_object_agg(x->>'name', true) FROM jsonb_array_elements(scope_ctes) x), '{}');
  conjuncts := "trellis"._semi_conjuncts(ast->>'where');
  joins := coalesce(ast->'joins', '[]');
  FOREACH c IN ARRAY conjuncts LOOP
    shape := "trellis"._semi_shape(c);
    IF shape IS NULL THEN
      toks := "trellis".grammar_tokenize(c);
      IF "trellis"._semi_has_sublink(toks) THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a subquery in WHERE as EXISTS, IN, = ANY or <> ALL is supported only as a condition AND-ed at the top of WHERE, not inside %s (%s): write it as its own AND-ed condition (an OR of two can be two transforms, or a UNION later)',
          CASE WHEN EXISTS (SELECT 1 FROM unnest(toks) t WHERE "trellis".grammar_kw(t, 'or')) THEN 'an OR'
               ELSE 'another expression (NOT, CASE, a comparison)' END, c));
      END IF;
      kept := kept || ('(' || c || ')');
      CONTINUE;
    END IF;
    found := true;
    n := n + 1;
    alias := replace(shape->>'kind', '_', '-') || '#' || n;
    sub := "trellis"._semi_parse_sub(shape->>'sub', shape->>'kind' IN ('exists', 'not_exists'), ctes);
    -- GROUP BY: IN over the groups of its one selected expression (TPC-H Q18), kept with
    -- its HAVING: the part groups by it (and the correlation columns: the groups of a
    -- correlated subquery are those of its rows for one outer value).
    IF (jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL)
       AND NOT (shape->>'kind' IN ('in', 'not_in') AND jsonb_array_length(sub->'select') = 1
                AND jsonb_array_length(coalesce(sub->'group_by', '[]')) = 1
                AND "trellis"._semi_norm(sub->'group_by'->>0) IN (
                      "trellis"._semi_norm(sub->'select'->0->>'expr'),
                      "trellis"._semi_norm(coalesce(sub->'select'->0->>'label_expr', '')))) THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) has GROUP BY or HAVING: supported only for IN over the groups of the one expression it selects (SELECT x ... GROUP BY x HAVING ...)',
        shape->>'written', c));
    END IF;
    -- Its own semi-joins first, then what it reads.
    sub := "trellis"._semi_rewrite(sub - 'distinct', scope_ctes);
    IF ("trellis"._semi_probe(sub, scope_ctes, NULL, NULL)) IS NULL THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) reads a WITH query of a statement around it, or is otherwise not readable alone: not supported yet',
        shape->>'written', c));
    END IF;
    keys := '[]';
    nes := '[]';
    IF shape->>'kind' IN ('in', 'not_in') THEN
      IF jsonb_array_length(sub->'select') <> 1 THEN
        PERFORM "trellis"._fail('TRV01', format(
          'the subquery of %s (%s) selects %s columns: write one (a row compared with IN is not supported yet)',
          shape->>'written', c, jsonb_array_length(sub->'select')));
      END IF;
      item := sub->'select'->0;
      expr := CASE WHEN item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL
                   THEN item->>'label_expr' ELSE item->>'expr' END;
      IF jsonb_array_length(coalesce(sub->'group_by', '[]')) = 0
         AND coalesce(("trellis"._semi_probe(sub, scope_ctes, expr, NULL)->>'has_aggs')::boolean, true) THEN
        PERFORM "trellis"._fail('TRV01', format(
          'the subquery of %s (%s) aggregates without GROUP BY (one row): a subquery of one row is not supported yet (scalar subqueries are a later slice)',
          shape->>'written', c));
      END IF;
      keys := keys || jsonb_build_array(jsonb_build_object('inner', expr, 'outer', shape->>'expr'));
    END IF;
    -- The subquery's conditions: its own (kept in the part), and those reading the statement
    -- around it (correlation), each an equality inner = outer (or inner <> outer).
    sub_conj := CASE WHEN sub->>'where' IS NULL THEN '{}' ELSE "trellis"._semi_conjuncts(sub->>'where') END;
    sub_kept := '{}';
    FOREACH expr IN ARRAY sub_conj LOOP
      IF "trellis"._semi_probe(sub, scope_ctes, NULL, expr) IS NOT NULL THEN
        sub_kept := sub_kept || ('(' || expr || ')');
        CONTINUE;
      END IF;
      toks := "trellis".grammar_tokenize(expr);
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
        lhs := "trellis".grammar_text(toks, 1, eq);
        rhs := "trellis".grammar_text(toks, eq + 1, array_length(toks, 1));
        IF "trellis"._semi_probe(sub, scope_ctes, lhs, NULL) IS NOT NULL
           AND "trellis"._semi_probe(sub, scope_ctes, rhs, NULL) IS NULL
           AND "trellis"._semi_probe(ast, outer_ctes, rhs, NULL) IS NOT NULL THEN
          NULL;
        ELSIF "trellis"._semi_probe(sub, scope_ctes, rhs, NULL) IS NOT NULL
           AND "trellis"._semi_probe(sub, scope_ctes, lhs, NULL) IS NULL
           AND "trellis"._semi_probe(ast, outer_ctes, lhs, NULL) IS NOT NULL THEN
          expr := lhs;
          lhs := rhs;
          rhs := expr;
        ELSE
          lhs := NULL;
        END IF;
      END IF;
      IF lhs IS NULL THEN
        PERFORM "trellis"._fail('TRV01', format(
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
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) is not correlated by an equality with the statement around it: it is one fact for every row (a one-row part, not supported yet). Correlate it (WHERE inner_column = outer_column), or keep it in a transform of its own',
        shape->>'written', c));
    END IF;
    IF jsonb_array_length(nes) > 1 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) has more than one correlated <> condition: not supported',
        shape->>'written', c));
    END IF;
    -- NOT IN's NULLs: x NOT IN (SELECT col ...) is NULL (the row is left out) when col holds
    -- a NULL, or when x is NULL and the subquery has rows. Kept exactly only where neither
    -- can happen.
    IF shape->>'kind' = 'not_in' THEN
      IF NOT "trellis"._semi_not_null(sub, keys->0->>'inner', sub_conj) THEN
        PERFORM "trellis"._fail('TRV01', format(
          '%s (%s): its subquery''s column %s can be NULL, and one NULL there makes the condition NULL for every row it does not match (so no row passes). Keeping that exactly needs a one-row part, not supported yet: add WHERE %s IS NOT NULL to the subquery (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE %s = %s)',
          shape->>'written', c, keys->0->>'inner', keys->0->>'inner', keys->0->>'inner', keys->0->>'outer'));
      END IF;
      IF NOT "trellis"._semi_not_null(ast, keys->0->>'outer', conjuncts) THEN
        PERFORM "trellis"._fail('TRV01', format(
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
CREATE FUNCTION "trellis"._semi_as_written(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  IF ast ? 'parts' THEN
    ast := ast || jsonb_build_object('parts', coalesce((
      SELECT jsonb_agg(p || jsonb_build_object('ast', "trellis"._semi_as_written(p->'ast')) ORDER BY o)
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
CREATE FUNCTION "trellis"._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  rewritten jsonb;
  result jsonb;
BEGIN
  IF ast->>'form' IS DISTINCT FROM 'as' THEN
    RETURN "trellis"._define_before_semi(ast, statement);
  END IF;
  rewritten := "trellis"._semi_rewrite(ast, '[]');
  IF rewritten = ast THEN
    RETURN "trellis"._define_before_semi(ast, statement);
  END IF;
  -- Postgres reads the statement as written first: names, scopes, types.
  PERFORM "trellis"._analyze_query("trellis"._render_view_select(ast), 'in the definition');
  RETURN "trellis"._define_before_semi(rewritten, statement);
END
$fn$;

-- The analysis (whichever migration wrote it last), and: a semi-join part's key is never
-- NULL (its WHERE says so: the target gets a primary key); a semi-join part read by the
-- statement around it adds nothing to that statement's key (it matches one row at most,
-- on its whole key).
CREATE FUNCTION "trellis"._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  spec jsonb := "trellis"._analyze_before_semi(ast);
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
CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast->>'kind' = 'transform' AND ast->>'form' = 'as' THEN
    ast := "trellis"._semi_as_written(ast);
  END IF;
  RETURN "trellis".render_before_semi(ast);
END
$fn$;
$trellis_m39$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 40) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (40, 'scalar_subqueries', false);
    EXECUTE $trellis_m40$-- Scalar subqueries that read tables, in the SELECT list, WHERE and HAVING of a view's
-- SQL (issue #26, item 1, third slice; ADR 0058), and one-row derived tables / WITH
-- queries (aggregates without GROUP BY):
--
--   uncorrelated  x > (SELECT 0.5 * sum(y) FROM t WHERE ...)
--     -> a one-row part (the subquery, aggregates without GROUP BY), given a constant key
--        column "trellis#one" (boolean, always true, its primary key) so the statement
--        around it can read it as a source: JOIN <part> AS "scalar#n" ON true, and
--        the subquery replaced by "scalar#n".v (in HAVING or the SELECT list of a GROUP
--        BY, outside an aggregate, by (array_agg("scalar#n".v))[1]: the same in every row).
--   correlated    x < (SELECT 0.2 * avg(q) FROM t2 WHERE t2.k = outer.k AND ...)
--     -> a GROUP BY part keyed by the inner side of each correlation equality, LEFT JOINed
--        on those equalities; the subquery replaced by CASE WHEN the part's key IS NULL
--        THEN <the subquery's value over no rows, computed once> ELSE "...".v END.
--
-- Every subquery accepted returns exactly one row per outer row by construction (an
-- aggregate without GROUP BY or HAVING); anything that could return more than one row
-- (GROUP BY, no aggregate, HAVING) is refused with validation, by name.
--
-- New functions: _one_row_part_key (the constant key of a one-row part: reusable by any
-- compilation that needs to read a one-row part as a source), _split_conjuncts,
-- _top_level_equality, _scalar_subqueries (the rewrite), _scalar_part (one subquery),
-- _scalar_as_written (the statement as written, for rendering), _render_scalar_item,
-- _scalar_render, _scalar_rewrite_expr, _scalar_replace, _scalar_wrap; and for
-- comma-separated FROM lists (FROM a, b WHERE ...: inner joins, WHERE's conditions moved
-- into their ON) _comma_joins, _comma_as_table.
-- Replaced (their latest bodies, 0036, copied; each change marked "0040"):
-- _render_view_item, _render_view_select, _define_parts, _define (0039's _define_before_semi),
-- grammar_parse_view (the
-- four-argument form).

-- A one-row part's target (aggregates without GROUP BY: a grand total, one row, no key)
-- gets a key the statement around it reads it by: a column "trellis#one" (boolean, NOT
-- NULL, always true) and a primary key on it. The engine keeps writing the row through its
-- own unique index on ((true)); the column's default fills it.
CREATE FUNCTION "trellis"._one_row_part_key(tschema name, hidden text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  EXECUTE format('ALTER TABLE %I.%I ADD COLUMN %I boolean NOT NULL DEFAULT true',
    tschema, hidden, 'trellis#one');
  EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (%I)', tschema, hidden, 'trellis#one');
END
$fn$;

-- The top-level AND conjuncts of a condition (the AND of BETWEEN ... AND left alone), each
-- as normalised text.
CREATE FUNCTION "trellis"._split_conjuncts(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(cond);
  n int := array_length(toks, 1);
  depth int := 0;
  between_open int := 0;
  start int := 1;
  res text[] := '{}';
BEGIN
  FOR k IN 1 .. n - 1 LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      depth := depth + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      depth := depth - 1;
    ELSIF depth = 0 AND "trellis".grammar_kw(toks[k], 'between') THEN
      between_open := between_open + 1;
    ELSIF depth = 0 AND "trellis".grammar_kw(toks[k], 'and') THEN
      IF between_open > 0 THEN
        between_open := between_open - 1;
      ELSE
        res := res || "trellis".grammar_text(toks, start, k);
        start := k + 1;
      END IF;
    END IF;
  END LOOP;
  RETURN res || "trellis".grammar_text(toks, start, n);
END
$fn$;

-- A condition `a = b` with one top-level "=" (outside brackets, no AND/OR/NOT around it):
-- (a, b); else (NULL, NULL).
CREATE FUNCTION "trellis"._top_level_equality(cond text, OUT lhs text, OUT rhs text)
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(cond);
  n int := array_length(toks, 1);
  depth int := 0;
  at int;
BEGIN
  FOR k IN 1 .. n - 1 LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      depth := depth + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      depth := depth - 1;
    ELSIF depth = 0 AND (toks[k].kind = 'op' OR (toks[k].kind = 'word' AND toks[k].value IN ('or', 'not', 'and', 'is', 'in', 'like', 'between'))) THEN
      IF toks[k].kind = 'op' AND toks[k].text = '=' AND at IS NULL THEN
        at := k;
      ELSIF toks[k].kind = 'op' AND toks[k].text IN ('+', '-', '*', '/', '%', '||', '^') THEN
        NULL;
      ELSE
        RETURN;
      END IF;
    END IF;
  END LOOP;
  IF at IS NULL OR at = 1 OR at = n - 1 THEN
    RETURN;
  END IF;
  lhs := "trellis".grammar_text(toks, 1, at);
  rhs := "trellis".grammar_text(toks, at + 1, n);
END
$fn$;

-- A view's SELECT (an AS-form AST) rendered with the outer WITH queries `ctes` (parts of
-- kind cte) in scope: what Postgres is asked about a subquery on its own.
CREATE FUNCTION "trellis"._scalar_render(sub jsonb, ctes jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT "trellis"._render_view_select(sub || jsonb_build_object('parts', ctes || coalesce(sub->'parts', '[]')))
$fn$;

-- One scalar subquery (its AST `sub`, the n-th of the statement, in `clause`) made a part:
-- {part, join, placeholder, correlated}. `outer_ast` is the statement around it as
-- written (for the scope of correlated names); `ctes` its WITH queries.
CREATE FUNCTION "trellis"._scalar_part(sub jsonb, n int, clause text, outer_ast jsonb, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  name text := 'scalar#' || n;
  alias text := 'scalar#' || n;
  what text := format('the scalar subquery in %s', clause);
  info jsonb;
  bare jsonb := sub || jsonb_build_object('where', NULL);
  conj text;
  kept text[] := '{}';
  inner_exprs text[] := '{}';
  outer_exprs text[] := '{}';
  eq record;
  on_ text;
  empty_value text;
  empty_type text;
  k int;
  outer_scope jsonb := outer_ast - 'scalars' || jsonb_build_object(
    'where', NULL, 'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false);
BEGIN
  IF jsonb_array_length(sub->'select') <> 1 THEN
    PERFORM "trellis"._fail('TRV01', format('%s must return one column', what));
  END IF;
  IF jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL
     OR coalesce((sub->>'distinct')::boolean, false) THEN
    PERFORM "trellis"._fail('TRV01', format(
      '%s has GROUP BY, HAVING or DISTINCT: it may return more or fewer than one row (Postgres fails the statement on more than one), which is not supported. Aggregate without GROUP BY (one row), e.g. (SELECT max(...) FROM ...)',
      what));
  END IF;
  info := "trellis"._view_parse("trellis"._scalar_render(sub, ctes));
  IF info IS NOT NULL THEN
    -- Uncorrelated: one row, whatever the tables hold.
    IF NOT (info->>'has_aggs')::boolean THEN
      PERFORM "trellis"._fail('TRV01', format(
        '%s does not aggregate: it may return more or fewer than one row (Postgres fails the statement on more than one), which is not supported. Aggregate without GROUP BY (one row), e.g. (SELECT max(...) FROM ...), or JOIN the table',
        what));
    END IF;
    RETURN jsonb_build_object(
      'part', jsonb_build_object('name', name, 'kind', 'scalar', 'columns', '["v"]'::jsonb, 'ast', sub,
                                 'clause', clause, 'one_row', true),
      'join', jsonb_build_object('type', 'inner', 'part', name, 'part_kind', 'scalar', 'alias', alias,
                                 'on', 'true', 'schema', NULL, 'name', name),
      'placeholder', quote_ident(alias) || '.v',
      'correlated', false);
  END IF;
  -- Correlated: it may name the statement around it only in equalities of its WHERE
  -- (inner = outer), each a key of a GROUP BY part.
  IF "trellis"._view_parse("trellis"._scalar_render(bare, ctes)) IS NULL THEN
    PERFORM "trellis"._fail('TRV01', format(
      '%s names the statement around it (a correlated subquery) outside its WHERE, or is not valid on its own: a correlated scalar subquery may name the outer query only in equalities of its WHERE (inner column = outer expression)',
      what));
  END IF;
  FOREACH conj IN ARRAY "trellis"._split_conjuncts(sub->>'where') LOOP
    IF "trellis"._view_parse("trellis"._scalar_render(bare || jsonb_build_object('where', conj), ctes)) IS NOT NULL THEN
      kept := kept || conj;
      CONTINUE;
    END IF;
    SELECT * INTO eq FROM "trellis"._top_level_equality(conj);
    IF eq.lhs IS NOT NULL AND "trellis"._view_parse("trellis"._scalar_render(bare || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.lhs, 'name', 'x'))), ctes)) IS NOT NULL
       AND "trellis"._view_parse("trellis"._render_view_select(outer_scope || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.rhs, 'name', 'x'))))) IS NOT NULL THEN
      inner_exprs := inner_exprs || eq.lhs;
      outer_exprs := outer_exprs || eq.rhs;
    ELSIF eq.lhs IS NOT NULL AND "trellis"._view_parse("trellis"._scalar_render(bare || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.rhs, 'name', 'x'))), ctes)) IS NOT NULL
       AND "trellis"._view_parse("trellis"._render_view_select(outer_scope || jsonb_build_object(
         'select', jsonb_build_array(jsonb_build_object('expr', eq.lhs, 'name', 'x'))))) IS NOT NULL THEN
      inner_exprs := inner_exprs || eq.rhs;
      outer_exprs := outer_exprs || eq.lhs;
    ELSE
      PERFORM "trellis"._fail('TRV01', format(
        '%s names the statement around it in %s: a correlated scalar subquery may name the outer query only in equalities of its WHERE (inner column = outer expression), joined by AND',
        what, conj));
    END IF;
  END LOOP;
  bare := bare || jsonb_build_object('where', CASE WHEN cardinality(kept) > 0
                                                   THEN array_to_string(kept, ' AND ') END);
  info := "trellis"._view_parse("trellis"._scalar_render(bare, ctes));
  IF info IS NULL OR NOT (info->>'has_aggs')::boolean THEN
    PERFORM "trellis"._fail('TRV01', format(
      '%s does not aggregate: it may return more or fewer than one row per outer row (Postgres fails the statement on more than one), which is not supported. Aggregate without GROUP BY, e.g. (SELECT avg(...) FROM ... WHERE inner = outer), or JOIN the table',
      what));
  END IF;
  -- Its value over no rows (an outer row no group matches): count() is 0, most others NULL.
  BEGIN
    EXECUTE format('SELECT quote_nullable(x.v::text), pg_typeof(x.v)::text FROM (%s) AS x (v)',
      "trellis"._scalar_render(bare || jsonb_build_object('where', 'false'), ctes))
      INTO empty_value, empty_type;
  EXCEPTION WHEN OTHERS THEN
    PERFORM "trellis"._fail('TRV01', format('%s fails over no rows (%s): not supported', what, SQLERRM));
  END;
  on_ := '';
  FOR k IN 1 .. cardinality(inner_exprs) LOOP
    bare := jsonb_set(bare, '{select}', (bare->'select') || jsonb_build_array(jsonb_build_object(
      'expr', inner_exprs[k], 'name', 'trellis#k' || k, 'bare_label', NULL, 'label_expr', NULL)));
    bare := jsonb_set(bare, '{group_by}', coalesce(bare->'group_by', '[]') || to_jsonb(inner_exprs[k]));
    on_ := on_ || CASE WHEN k > 1 THEN ' AND ' ELSE '' END
      || quote_ident(alias) || '.' || quote_ident('trellis#k' || k) || ' = (' || outer_exprs[k] || ')';
  END LOOP;
  RETURN jsonb_build_object(
    'part', jsonb_build_object('name', name, 'kind', 'scalar', 'columns', '["v"]'::jsonb, 'ast', bare,
                               'clause', clause, 'one_row', false),
    'join', jsonb_build_object('type', 'left', 'part', name, 'part_kind', 'scalar', 'alias', alias,
                               'on', on_, 'schema', NULL, 'name', name),
    'placeholder', format('CASE WHEN %I.%I IS NULL THEN %s ELSE %I.v END', alias, 'trellis#k1',
                          CASE WHEN empty_value = 'NULL' THEN 'NULL' ELSE empty_value || '::' || empty_type END,
                          alias),
    'correlated', true);
END
$fn$;

-- Each scalar subquery of `scalars` ({placeholder, written}) in `expr`: its written text
-- replaced by its placeholder, or (to_written) the other way round.
CREATE FUNCTION "trellis"._scalar_replace(expr text, scalars jsonb, to_written boolean)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  s jsonb;
BEGIN
  IF expr IS NULL THEN
    RETURN NULL;
  END IF;
  FOR s IN SELECT value FROM jsonb_array_elements(coalesce(scalars, '[]')) LOOP
    expr := CASE WHEN to_written THEN replace(expr, s->>'placeholder', s->>'written')
                 ELSE replace(expr, s->>'written', s->>'placeholder') END;
  END LOOP;
  RETURN expr;
END
$fn$;

-- One expression of a view's statement with its scalar subqueries made parts (from the
-- n-th on): {expr (rewritten), scalars: [{part, join, placeholder, written, correlated}]}.
-- A subquery after EXISTS, IN, ANY, ALL, SOME or ARRAY is not a scalar subquery: left as
-- it is (refused, or compiled, elsewhere).
CREATE FUNCTION "trellis"._scalar_rewrite_expr(expr text, n int, clause text, outer_ast jsonb, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(expr);
  out_toks "trellis".grammar_token[] := '{}';
  len int := array_length(toks, 1);
  k int := 1;
  close_at int;
  sub jsonb;
  made jsonb;
  found jsonb := '[]';
  cte_names jsonb;
BEGIN
  cte_names := coalesce((SELECT jsonb_object_agg(p->>'name', true) FROM jsonb_array_elements(ctes) p), '{}');
  WHILE k <= len LOOP
    IF toks[k].kind = 'punct' AND toks[k].text = '('
       AND ("trellis".grammar_kw(toks[k + 1], 'select') OR "trellis".grammar_kw(toks[k + 1], 'with'))
       AND NOT (k > 1 AND toks[k - 1].kind = 'word'
                AND toks[k - 1].value IN ('exists', 'in', 'any', 'all', 'some', 'array')) THEN
      close_at := "trellis"._closing_token(toks, k);
      -- A subquery the view grammar cannot read (no FROM: `(SELECT 1)`, a set operation...)
      -- is refused as a subquery of its clause, not as a syntax error of the statement.
      BEGIN
        sub := "trellis".grammar_parse_view(
          toks[k + 1 : close_at - 1] || ROW('eof', '', '', toks[close_at].pos)::"trellis".grammar_token,
          1, NULL, cte_names);
      EXCEPTION WHEN SQLSTATE 'TRP01' THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a subquery in %s is not supported yet here: as a scalar subquery it must read a table (SELECT <aggregate> FROM ...): %s',
          clause, SQLERRM));
      END;
      n := n + 1;
      made := "trellis"._scalar_part(sub, n, clause, outer_ast, ctes);
      found := found || jsonb_build_array(made || jsonb_build_object(
        'written', "trellis".grammar_text(toks, k, close_at + 1)));
      out_toks := out_toks || ROW('ident', made->>'placeholder', made->>'placeholder', toks[k].pos)::"trellis".grammar_token;
      k := close_at + 1;
    ELSE
      out_toks := out_toks || toks[k];
      k := k + 1;
    END IF;
  END LOOP;
  IF jsonb_array_length(found) = 0 THEN
    RETURN jsonb_build_object('expr', expr, 'scalars', found);
  END IF;
  RETURN jsonb_build_object('expr', "trellis".grammar_text(out_toks, 1, array_length(out_toks, 1)),
                            'scalars', found);
END
$fn$;

-- A statement's HAVING and SELECT list with a placeholder read as (array_agg(it))[1].
CREATE FUNCTION "trellis"._scalar_wrap(ast jsonb, placeholder text)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT ast || jsonb_build_object(
    'having', replace(ast->>'having', placeholder, '(array_agg(' || placeholder || '))[1]'),
    'select', (SELECT jsonb_agg(i || jsonb_build_object(
                        'expr', replace(i->>'expr', placeholder, '(array_agg(' || placeholder || '))[1]'))
                      || CASE WHEN i->>'label_expr' IS NOT NULL THEN jsonb_build_object('label_expr',
                           replace(i->>'label_expr', placeholder, '(array_agg(' || placeholder || '))[1]')) ELSE '{}' END
                      ORDER BY o)
                 FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS x(i, o)))
$fn$;

-- A view's statement (AS form) with its scalar subqueries (SELECT list, WHERE, HAVING)
-- made parts of kind 'scalar', each joined under an alias "scalar#<n>" and read
-- through a placeholder expression (_scalar_part). The AST keeps how it was written
-- (`scalars`: [{placeholder, written}]): _scalar_as_written gives it back. A
-- statement without any is returned as it is.
CREATE FUNCTION "trellis"._scalar_subqueries(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ctes jsonb;
  res jsonb;
  s jsonb;
  all_found jsonb := '[]';
  n int := 0;
  item jsonb;
  k int;
  has_group boolean := jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0;
  aggregating boolean;
  info jsonb;
  written jsonb := '[]';
  trial jsonb;
  cands int[];
  m int;
  mask int;
  wrapped_set int[] := '{}';
BEGIN
  IF ast->>'form' IS DISTINCT FROM 'as' OR ast->>'kind' IS DISTINCT FROM 'transform' OR ast ? 'scalars' THEN
    RETURN ast;
  END IF;
  -- Cheap test first: no "(SELECT" or "(WITH" in any expression.
  IF NOT (coalesce(ast->>'where', '') ~* '\(\s*(select|with)\M'
          OR coalesce(ast->>'having', '') ~* '\(\s*(select|with)\M'
          OR EXISTS (SELECT 1 FROM jsonb_array_elements(ast->'select') i
                      WHERE i->>'expr' ~* '\(\s*(select|with)\M')) THEN
    RETURN ast;
  END IF;
  ctes := coalesce((SELECT jsonb_agg(p ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
                     WHERE p->>'kind' = 'cte'), '[]');
  -- Postgres reads the statement as written first (names, scopes, one column each).
  PERFORM "trellis"._analyze_query("trellis"._render_view_select(ast), 'in the definition');
  info := "trellis"._view_parse("trellis"._render_view_select(ast));
  aggregating := has_group OR ast->>'having' IS NOT NULL OR coalesce((info->>'has_aggs')::boolean, false);

  IF ast->>'where' IS NOT NULL THEN
    res := "trellis"._scalar_rewrite_expr(ast->>'where', n, 'WHERE', ast, ctes);
    ast := jsonb_set(ast, '{where}', res->'expr');
    all_found := all_found || (SELECT coalesce(jsonb_agg(f || '{"clause": "WHERE"}'), '[]') FROM jsonb_array_elements(res->'scalars') f);
    n := n + jsonb_array_length(res->'scalars');
  END IF;
  IF ast->>'having' IS NOT NULL THEN
    res := "trellis"._scalar_rewrite_expr(ast->>'having', n, 'HAVING', ast, ctes);
    ast := jsonb_set(ast, '{having}', res->'expr');
    all_found := all_found || (SELECT coalesce(jsonb_agg(f || '{"clause": "HAVING"}'), '[]') FROM jsonb_array_elements(res->'scalars') f);
    n := n + jsonb_array_length(res->'scalars');
  END IF;
  FOR k IN 0 .. jsonb_array_length(ast->'select') - 1 LOOP
    item := ast->'select'->k;
    res := "trellis"._scalar_rewrite_expr(item->>'expr', n, 'the SELECT list', ast, ctes);
    IF jsonb_array_length(res->'scalars') > 0 THEN
      item := item || jsonb_build_object('expr', res->'expr');
      -- A bare label after the subquery stays the label of the rewritten expression.
      IF item->>'label_expr' IS NOT NULL THEN
        item := item || jsonb_build_object('label_expr',
          "trellis"._scalar_replace(item->>'label_expr', res->'scalars', false));
      END IF;
      ast := jsonb_set(ast, ARRAY['select', k::text], item);
      all_found := all_found || (SELECT coalesce(jsonb_agg(f || '{"clause": "SELECT"}'), '[]') FROM jsonb_array_elements(res->'scalars') f);
      n := n + jsonb_array_length(res->'scalars');
    END IF;
  END LOOP;
  IF n = 0 THEN
    RETURN ast;
  END IF;
  FOR s IN SELECT value FROM jsonb_array_elements(all_found) LOOP
    IF aggregating AND s->>'clause' <> 'WHERE' THEN
      IF (s->>'correlated')::boolean THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a correlated scalar subquery in %s of a statement that aggregates is not supported yet: move it into WHERE, or into a subquery in FROM',
          CASE s->>'clause' WHEN 'SELECT' THEN 'the SELECT list' ELSE s->>'clause' END));
      END IF;
      IF NOT has_group THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a scalar subquery in %s of an aggregate without GROUP BY is not supported yet: compute the aggregate in a WITH query, and compare with it in the statement around it',
          CASE s->>'clause' WHEN 'SELECT' THEN 'the SELECT list' ELSE s->>'clause' END));
      END IF;
    END IF;
    ast := jsonb_set(ast, '{parts}', coalesce(ast->'parts', '[]') || jsonb_build_array(s->'part'));
    ast := jsonb_set(ast, '{joins}', coalesce(ast->'joins', '[]') || jsonb_build_array(s->'join'));
  END LOOP;
  -- In HAVING or the SELECT list of a GROUP BY, outside an aggregate, the part's one row
  -- (the same in every row of a group) is read as (array_agg(v))[1]: a group is never
  -- empty, and its value is then the subquery's. Inside an aggregate's argument it stays
  -- a row's value. Tried whole, as Postgres reads the statement; left bare if that fails.
  -- Which of them to wrap: the first choice Postgres accepts, trying every one wrapped
  -- first, then fewer (a subquery inside an aggregate's argument stays bare).
  cands := ARRAY(SELECT x.ord::int - 1 FROM jsonb_array_elements(all_found) WITH ORDINALITY AS x(found_item, ord)
                  WHERE aggregating AND x.found_item->>'clause' <> 'WHERE');
  m := least(cardinality(cands), 6);
  IF m > 0 THEN
    FOR mask IN SELECT g.b FROM generate_series(0, (1 << m) - 1) AS g(b)
                 ORDER BY length(replace(g.b::bit(6)::text, '0', '')), g.b LOOP
      trial := ast;
      FOR k IN 1 .. m LOOP
        IF mask & (1 << (k - 1)) = 0 THEN
          trial := "trellis"._scalar_wrap(trial, all_found->(cands[k])->>'placeholder');
        END IF;
      END LOOP;
      IF "trellis"._view_parse("trellis"._render_view_select(trial)) IS NOT NULL THEN
        ast := trial;
        wrapped_set := ARRAY(SELECT cands[g.j] FROM generate_series(1, m) AS g(j) WHERE mask & (1 << (g.j - 1)) = 0);
        EXIT;
      END IF;
    END LOOP;
  END IF;
  FOR k IN 0 .. jsonb_array_length(all_found) - 1 LOOP
    s := all_found->k;
    written := written || jsonb_build_array(jsonb_build_object(
      'placeholder', CASE WHEN k = ANY (wrapped_set)
                          THEN '(array_agg(' || (s->>'placeholder') || '))[1]'
                          ELSE s->>'placeholder' END,
      'written', s->>'written'));
  END LOOP;
  RETURN ast || jsonb_build_object('scalars', written);
END
$fn$;

-- A statement whose scalar subqueries were made parts (_scalar_subqueries), as it was
-- written: the subqueries in place of their placeholders, without the joins, GROUP BY
-- items and parts they became.
CREATE FUNCTION "trellis"._scalar_as_written(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  sc jsonb := ast->'scalars';
BEGIN
  IF sc IS NULL THEN
    RETURN ast;
  END IF;
  RETURN (ast - 'scalars') || jsonb_build_object(
    'where', "trellis"._scalar_replace(ast->>'where', sc, true),
    'having', "trellis"._scalar_replace(ast->>'having', sc, true),
    'select', coalesce((
      SELECT jsonb_agg(i || jsonb_build_object(
               'expr', "trellis"._scalar_replace(i->>'expr', sc, true))
               || CASE WHEN i ? 'label_expr'
                       THEN jsonb_build_object('label_expr', "trellis"._scalar_replace(i->>'label_expr', sc, true))
                       ELSE '{}' END ORDER BY o)
        FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS x(i, o)), '[]'),
    'joins', coalesce((
      SELECT jsonb_agg(j ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)
       WHERE j->>'part_kind' IS DISTINCT FROM 'scalar'), '[]'),
    'parts', coalesce((
      SELECT jsonb_agg(p ORDER BY o)
        FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
       WHERE p->>'kind' IS DISTINCT FROM 'scalar'), '[]'));
END
$fn$;

-- A scalar subquery's join as the engine reads it, before its part is defined: the part's
-- SELECT as a derived table under its alias.
CREATE FUNCTION "trellis"._render_scalar_item(ast jsonb, item jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  p jsonb;
BEGIN
  SELECT x INTO p FROM jsonb_array_elements(ast->'parts') x
   WHERE x->>'kind' = 'scalar' AND x->>'name' = item->>'part';
  RETURN '(' || "trellis"._render_view_select(p->'ast') || ') AS ' || quote_ident(item->>'alias') || ' (v)';
END
$fn$;

-- A comma-separated FROM list (FROM a, b, c WHERE ...), parsed as inner joins ON true
-- (marked `comma`), with each top-level conjunct of WHERE that needs a comma-joined table
-- moved into that join's ON: the first join after which Postgres can read it (its
-- equalities are then the join's columns, found by index, as JOIN ... ON's are). For inner
-- joins, a condition in ON or in WHERE is the same. A conjunct with a subquery stays in
-- WHERE. Parts already bound to their targets are read as those tables.
CREATE FUNCTION "trellis"._comma_joins(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  joins jsonb := coalesce(ast->'joins', '[]');
  n int := jsonb_array_length(coalesce(ast->'joins', '[]'));
  conj text;
  kept text[] := '{}';
  k int;
  placed boolean;
  probe jsonb;
BEGIN
  IF ast->>'where' IS NULL OR NOT EXISTS (
       SELECT 1 FROM jsonb_array_elements(joins) j WHERE coalesce((j->>'comma')::boolean, false)) THEN
    RETURN ast;
  END IF;
  probe := (ast - 'scalars') || jsonb_build_object(
    'select', jsonb_build_array(jsonb_build_object('expr', '1', 'name', 'x')),
    'group_by', '[]'::jsonb, 'having', NULL, 'distinct', false,
    'from', "trellis"._comma_as_table(ast->'from'));
  -- Bound throughout (a part's own statement): its WITH queries are tables already.
  IF ast->'from'->>'schema' IS NOT NULL AND NOT EXISTS (
       SELECT 1 FROM jsonb_array_elements(joins) j WHERE j->>'part' IS NOT NULL AND j->>'schema' IS NULL) THEN
    probe := probe || jsonb_build_object('parts', '[]'::jsonb);
  END IF;
  FOREACH conj IN ARRAY "trellis"._split_conjuncts(ast->>'where') LOOP
    placed := false;
    IF conj !~* '\(\s*(select|with)\M' THEN
      FOR k IN 0 .. n LOOP
        IF "trellis"._view_parse("trellis"._render_view_select(probe || jsonb_build_object(
             'where', conj,
             'joins', coalesce((SELECT jsonb_agg("trellis"._comma_as_table(j) ORDER BY o)
                                  FROM jsonb_array_elements(joins) WITH ORDINALITY AS x(j, o)
                                 WHERE o <= k), '[]')))) IS NOT NULL THEN
          IF k > 0 AND coalesce((joins->(k - 1)->>'comma')::boolean, false) THEN
            joins := jsonb_set(joins, ARRAY[(k - 1)::text, 'on'], to_jsonb(
              CASE WHEN joins->(k - 1)->>'on' = 'true' THEN conj
                   ELSE (joins->(k - 1)->>'on') || ' AND ' || conj END));
            placed := true;
          END IF;
          EXIT;
        END IF;
      END LOOP;
    END IF;
    IF NOT placed THEN
      kept := kept || conj;
    END IF;
  END LOOP;
  RETURN ast || jsonb_build_object(
    'joins', (SELECT jsonb_agg(j - 'comma' ORDER BY o) FROM jsonb_array_elements(joins) WITH ORDINALITY AS x(j, o)),
    'where', CASE WHEN cardinality(kept) > 0 THEN array_to_string(kept, ' AND ') END);
END
$fn$;

-- A FROM or JOIN item bound to a part's target (schema set) read as that table; any other
-- as it is.
CREATE FUNCTION "trellis"._comma_as_table(item jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN item->>'part' IS NOT NULL AND item->>'schema' IS NOT NULL
              THEN item - 'part' - 'part_kind' - 'alias_implicit'
              ELSE item END
$fn$;

-- 0040: _render_view_item as in 0036, and a scalar subquery's part (before it is bound).
CREATE OR REPLACE FUNCTION "trellis"._render_view_item(ast jsonb, item jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  p jsonb;
BEGIN
  -- 0040: a scalar subquery's part.
  IF item->>'part_kind' = 'scalar' THEN RETURN "trellis"._render_scalar_item(ast, item); END IF;
  IF item->>'part_kind' = 'derived' THEN
    SELECT x INTO p FROM jsonb_array_elements(ast->'parts') x
     WHERE x->>'kind' = 'derived' AND x->>'name' = item->>'part';
    RETURN '(' || "trellis"._render_view_select(p->'ast') || ') AS ' || quote_ident(p->>'name')
      || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o)
                             FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o)) || ')', '');
  ELSIF item->>'part_kind' = 'cte' THEN
    RETURN quote_ident(item->>'part')
      || CASE WHEN coalesce((item->>'alias_implicit')::boolean, false) THEN ''
              ELSE coalesce(' AS ' || quote_ident(item->>'alias'), '') END;
  END IF;
  RETURN "trellis".grammar_render_name(item->>'schema', item->>'name')
    || coalesce(' AS ' || quote_ident(item->>'alias'), '');
END
$fn$;

-- 0040: _render_view_select as in 0036; a statement whose scalar subqueries were made
-- parts is rendered as written.
CREATE OR REPLACE FUNCTION "trellis"._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  is_distinct boolean := coalesce((ast ->> 'distinct')::boolean, false);
  with_ text;
BEGIN
  -- 0040: scalar subqueries made parts are shown as written.
  IF ast ? 'scalars' THEN ast := "trellis"._scalar_as_written(ast); is_distinct := coalesce((ast ->> 'distinct')::boolean, false); END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '')
    || 'SELECT ' || CASE WHEN is_distinct THEN 'DISTINCT ' ELSE '' END || (
         SELECT string_agg((value ->> 'expr') || coalesce(' AS ' || quote_ident(value ->> 'name'), ''),
                           ', ' ORDER BY ordinality)
           FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY)
    || ' FROM ' || "trellis"._render_view_item(ast, ast->'from')
    || coalesce((
         SELECT string_agg(
                  CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
                  || "trellis"._render_view_item(ast, j) || ' ON ' || (j ->> 'on'), '' ORDER BY o)
           FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '')
    || coalesce(' WHERE ' || (ast ->> 'where'), '')
    || CASE WHEN is_distinct THEN '' ELSE coalesce(' GROUP BY ' || (
         SELECT string_agg(value, ', ' ORDER BY ordinality)
           FROM jsonb_array_elements_text(coalesce(ast -> 'group_by', '[]')) WITH ORDINALITY), '') END
    || coalesce(' HAVING ' || (ast ->> 'having'), '');
END
$fn$;

-- 0040: _define_parts as in 0036, with scalar subqueries' parts named in messages, and a
-- part of one row (aggregates without GROUP BY) read by a constant key (_one_row_part_key)
-- instead of refused.
CREATE OR REPLACE FUNCTION "trellis"._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
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
                               -- 0040
                               WHEN 'scalar' THEN format('scalar subquery in %s', part->>'clause')
                               ELSE format('subquery %I in FROM', part->>'name') END;
    hidden := 'trellis#' || root || '#' || path || (part->>'name');
    IF octet_length(hidden) > 63 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the %s is kept in a hidden target named %s, longer than 63 bytes: give it, or the transform, a shorter name',
        what, hidden));
    END IF;
    -- A table of that reserved name that no transform keeps is a part's target loaded
    -- from a schema dump (restore_definition defines the statement again): the part makes
    -- its own, and builds it.
    IF to_regclass(quote_ident(tschema) || '.' || quote_ident(hidden)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM "trellis".transforms t
                        WHERE t.target_schema = tschema AND t.target_name = hidden) THEN
      EXECUTE format('DROP TABLE %I.%I', tschema, hidden);
    END IF;
    res := "trellis"._define_parts(part->'ast', root, path || (part->>'name') || '.', scope);
    ids := ids || (res->'ids');
    sub := res->'ast';
    -- 0040: a comma-separated FROM list's conditions go to its joins.
    sub := "trellis"._comma_joins(sub);
    -- Column aliases name the part's columns, in order; Postgres refuses more of them than
    -- columns (the statement was checked whole before this).
    cols := coalesce(part->'columns', '[]');
    IF jsonb_array_length(cols) > jsonb_array_length(sub->'select') THEN
      PERFORM "trellis"._fail('TRV01', format('the %s has %s columns available but %s columns specified',
        what, jsonb_array_length(sub->'select'), jsonb_array_length(cols)));
    END IF;
    FOR k IN 0 .. jsonb_array_length(cols) - 1 LOOP
      item := sub->'select'->k;
      -- A bare label (`count(*) n`) gives way to the alias: the expression without it, when
      -- Postgres reads it as a label (as _distinct_groups decides it).
      IF item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL THEN
        info := "trellis"._analyze_query('SELECT ' || (item->>'expr') || ' FROM ' || "trellis"._view_from_sql(sub),
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
    PERFORM "trellis"._define_one(sub, NULL);
    SELECT t.id, t.spec INTO part_id, spec FROM "trellis".transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    -- Its count() columns are never NULL: declared so, a GROUP BY of one around it is a key.
    IF (spec->>'aggregates')::boolean THEN
      FOR item IN SELECT c FROM jsonb_array_elements(spec->'columns') c
                   WHERE NOT (c->>'is_key')::boolean AND c->>'type' = 'bigint'
                     AND "trellis"._is_count_call(c->>'expression') LOOP
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET NOT NULL', tschema, hidden, item->>'name');
        -- Recorded in its spec too: a target made again from it (a halt's repair) says so.
        UPDATE "trellis".transforms t
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
      -- 0040: a part of one row is read by a constant key.
      PERFORM "trellis"._one_row_part_key(tschema, hidden);
    END IF;
    IF (spec->>'key_nullable')::boolean THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the %s is keyed by (%s), which can be NULL (a LEFT JOIN''s side, or a GROUP BY of a column that is not NOT NULL): the statement around a subquery reads its rows by a key that is never NULL. Group by columns declared NOT NULL (or filter the NULLs out and coalesce the column)',
        what, (SELECT string_agg(k2, ', ') FROM jsonb_array_elements_text(spec->'key') k2)));
    END IF;
    UPDATE "trellis".transforms SET part_name = path || (part->>'name') WHERE id = part_id;
    ids := ids || to_jsonb(part_id);
    scope := scope || jsonb_build_object((part->>'kind') || ':' || (part->>'name'), hidden);
  END LOOP;
  ast := jsonb_set(ast, '{from}', "trellis"._bind_part_item(ast->'from', scope));
  ast := jsonb_set(ast, '{joins}', coalesce((
    SELECT jsonb_agg("trellis"._bind_part_item(j, scope) ORDER BY o)
      FROM jsonb_array_elements(coalesce(ast->'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  RETURN jsonb_build_object('ast', ast, 'ids', ids);
END
$fn$;

-- 0040: _define as in 0036, with scalar subqueries made parts first (_scalar_subqueries).
-- Migration 0039 renamed 0036's _define to _define_before_semi (its _define rewrites
-- semi-joins, then calls it): this replaces that body, so both rewrites stay in force.
CREATE OR REPLACE FUNCTION "trellis"._define_before_semi(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  tname text := ast->'target'->>'name';
  res jsonb;
  result jsonb;
BEGIN
  IF starts_with(tname, 'trellis#') THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): choose another target name',
      tname));
  END IF;
  -- 0040: a comma-separated FROM list's conditions go to its joins; scalar subqueries
  -- become parts.
  ast := "trellis"._comma_joins(ast);
  ast := "trellis"._scalar_subqueries(ast);
  IF jsonb_array_length(coalesce(ast->'parts', '[]')) = 0 THEN
    RETURN "trellis"._define_one(ast, statement);
  END IF;
  IF EXISTS (SELECT 1 FROM "trellis".transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM "trellis"._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  -- Postgres reads the statement as written first: names, column aliases, scopes.
  PERFORM "trellis"._analyze_query("trellis"._render_view_select(ast), 'in the definition');
  -- 0040: as the engine reads it (scalar subqueries as their parts).
  PERFORM "trellis"._refuse_view_sublinks(ast - 'scalars');
  res := "trellis"._define_parts(ast, tname, '', '{}');
  result := "trellis"._define_one(res->'ast', statement);
  UPDATE "trellis".transforms p SET part_of = t.id
    FROM "trellis".transforms t
   WHERE t.target_schema = tschema AND t.target_name = tname
     AND p.id IN (SELECT (x)::int FROM jsonb_array_elements_text(res->'ids') x);
  RETURN result;
END
$fn$;

-- 0040: grammar_parse_view (the four-argument form) as in 0036, with a comma-separated
-- FROM list read as inner joins ON true, marked `comma` (_comma_joins moves WHERE's
-- conditions into them when the statement is defined).
CREATE OR REPLACE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token := toks[i];
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
  last "trellis".grammar_token;
  before "trellis".grammar_token;
  -- 0036
  parts jsonb := '[]';
  cte_name text;
  cte_cols jsonb;
  cte_pos int;
  sub jsonb;
  part jsonb;
  derived jsonb;
BEGIN
  IF "trellis".grammar_kw(t, 'with') THEN
    IF "trellis".grammar_kw(toks[i + 1], 'recursive') THEN
      PERFORM "trellis".grammar_refuse('a recursive WITH clause (WITH RECURSIVE) is not supported', t.pos);
    END IF;
    -- 0036: WITH name [(columns)] AS [[NOT] MATERIALIZED] (<select>) {, ...}: each a part,
    -- in scope for the queries after it and for the SELECT.
    i := i + 1;
    LOOP
      cte_pos := toks[i].pos;
      cte_name := "trellis".grammar_name(toks[i], 'a WITH query name', true);
      i := i + 1;
      cte_cols := NULL;
      IF toks[i].kind = 'punct' AND toks[i].text = '(' THEN
        SELECT q.names, q.next INTO cte_cols, i
          FROM "trellis".grammar_name_list(toks, i, 'a column name') q;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'as') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'AS and the WITH query in parentheses');
      END IF;
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'not') AND "trellis".grammar_kw(toks[i + 1], 'materialized') THEN
        i := i + 2;
      ELSIF "trellis".grammar_kw(toks[i], 'materialized') THEN
        i := i + 1;
      END IF;
      IF NOT (toks[i].kind = 'punct' AND toks[i].text = '(') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, '"(" and the WITH query');
      END IF;
      IF NOT ("trellis".grammar_kw(toks[i + 1], 'select') OR "trellis".grammar_kw(toks[i + 1], 'with')) THEN
        PERFORM "trellis".grammar_refuse(
          'a WITH query that is not a SELECT (INSERT, UPDATE, DELETE, VALUES) is not supported',
          toks[i + 1].pos);
      END IF;
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p WHERE p->>'name' = cte_name) THEN
        PERFORM "trellis".grammar_fail(format('WITH query name %s is given more than once', cte_name),
          cte_pos);
      END IF;
      SELECT q.ast, q.next INTO sub, i FROM "trellis".grammar_subselect(toks, i, ctes) q;
      parts := parts || jsonb_build_array(jsonb_build_object(
        'name', cte_name, 'kind', 'cte', 'columns', coalesce(cte_cols, '[]'), 'ast', sub,
        'position', cte_pos));
      ctes := ctes || jsonb_build_object(cte_name, true);
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    t := toks[i];
    IF NOT "trellis".grammar_kw(t, 'select') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, '",", or SELECT after the WITH queries');
    END IF;
  ELSIF t.kind = 'punct' AND t.text = '(' THEN
    PERFORM "trellis".grammar_refuse(
      'a SELECT in parentheses is not supported yet: write it without them', t.pos);
  ELSIF "trellis".grammar_kw(t, 'values') OR "trellis".grammar_kw(t, 'table') THEN
    PERFORM "trellis".grammar_refuse(format('%s is not supported: write a SELECT', upper(t.value)),
      t.pos);
  ELSIF NOT "trellis".grammar_kw(t, 'select') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'SELECT after AS');
  END IF;
  i := i + 1;
  IF "trellis".grammar_kw(toks[i], 'distinct') THEN
    IF "trellis".grammar_kw(toks[i + 1], 'on') THEN
      PERFORM "trellis".grammar_refuse('DISTINCT ON is not supported yet', toks[i].pos);
    END IF;
    distinct_ := true;
    i := i + 1;
  ELSIF "trellis".grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  -- The SELECT list, as in the FROM-first form (0024).
  LOOP
    start := i;
    e := "trellis".grammar_scan(toks, i);
    IF e = start THEN
      PERFORM "trellis".grammar_view_clause(toks, e);
      PERFORM "trellis".grammar_unexpected(toks, e, 'a select item');
    END IF;
    IF (e = start + 1 AND toks[start].text = '*')
      OR (e >= start + 2 AND toks[e - 1].text = '*' AND toks[e - 2].kind = 'punct'
          AND toks[e - 2].text = '.') THEN
      PERFORM "trellis".grammar_fail(format(
        'name each column: SELECT * is not supported (expected an expression, found %s)',
        "trellis".grammar_describe(toks[e - 1])), toks[start].pos);
    END IF;
    nm := NULL;
    label := NULL;
    label_expr := NULL;
    IF "trellis".grammar_kw(toks[e], 'as') THEN
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      i := e + 2;
    ELSE
      i := e;
      IF e >= start + 2 THEN
        last := toks[e - 1];
        before := toks[e - 2];
        IF (last.kind = 'ident'
            OR (last.kind = 'word' AND "trellis".grammar_keyword_class(last.value) IS NULL))
          AND before.kind <> 'op'
          AND NOT (before.kind = 'punct' AND before.text IN ('.', '::')) THEN
          label := "trellis".grammar_name(last, 'a column name', false);
          label_expr := "trellis".grammar_text(toks, start, e - 1);
        END IF;
      END IF;
    END IF;
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', "trellis".grammar_text(toks, start, e), 'name', nm, 'bare_label', label,
      'label_expr', label_expr, 'position', toks[start].pos));
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;

  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_view_clause(toks, i);
    PERFORM "trellis".grammar_unexpected(toks, i, '",", or FROM and the tables');
  END IF;
  -- 0036: a table, a WITH query or a derived table.
  SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
    INTO sch, nm, alias, part, derived, i
    FROM "trellis".grammar_view_item(toks, i + 1, 'a source table name', ctes) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias) || coalesce(part, '{}');
  IF derived IS NOT NULL THEN
    parts := parts || jsonb_build_array(derived);
  END IF;

  LOOP
    t := toks[i];
    IF t.kind = 'punct' AND t.text = ',' THEN
      -- 0040: a comma-separated FROM list: an inner join (its conditions found in WHERE).
      jt := 'comma';
      i := i + 1;
    ELSIF t.kind = 'word' AND t.value IN ('right', 'full')
      AND ("trellis".grammar_kw(toks[i + 1], 'join') OR "trellis".grammar_kw(toks[i + 1], 'outer')) THEN
      PERFORM "trellis".grammar_refuse(format('a %s JOIN is not supported yet', upper(t.value)), t.pos);
    ELSIF "trellis".grammar_kw(t, 'cross') AND "trellis".grammar_kw(toks[i + 1], 'join') THEN
      PERFORM "trellis".grammar_refuse('CROSS JOIN is not supported yet', t.pos);
    ELSIF "trellis".grammar_kw(t, 'natural') THEN
      PERFORM "trellis".grammar_refuse('NATURAL JOIN is not supported yet: write JOIN ... ON', t.pos);
    ELSIF "trellis".grammar_kw(t, 'join') THEN
      jt := 'inner';
      i := i + 1;
    ELSIF "trellis".grammar_kw(t, 'inner') THEN
      IF NOT "trellis".grammar_kw(toks[i + 1], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1, 'JOIN after INNER');
      END IF;
      jt := 'inner';
      i := i + 2;
    ELSIF "trellis".grammar_kw(t, 'left') AND coalesce(toks[i + 1].text, '') <> '(' THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'outer') THEN
        i := i + 1;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i], 'join') THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'JOIN after LEFT');
      END IF;
      jt := 'left';
      i := i + 1;
    ELSE
      EXIT;
    END IF;
    -- 0036: a table, a WITH query or a derived table.
    SELECT q.schema_name, q.rel_name, q.alias, q.part, q.derived, q.next
      INTO sch, nm, alias, part, derived, i
      FROM "trellis".grammar_view_item(toks, i, 'a table name after JOIN', ctes) q;
    IF derived IS NOT NULL THEN
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(parts) p
                  WHERE p->>'kind' = 'derived' AND p->>'name' = derived->>'name') THEN
        PERFORM "trellis".grammar_fail(format('table name %s is given more than once', derived->>'name'),
          (derived->>'position')::int);
      END IF;
      parts := parts || jsonb_build_array(derived);
    END IF;
    -- 0040
    IF jt = 'comma' THEN joins := joins || jsonb_build_array(jsonb_build_object('type', 'inner', 'comma', true, 'schema', sch, 'name', nm, 'alias', alias, 'on', 'true') || coalesce(part, '{}')); CONTINUE; END IF;
    IF "trellis".grammar_kw(toks[i], 'using') THEN
      PERFORM "trellis".grammar_refuse('JOIN ... USING is not supported yet: write ON', toks[i].pos);
    END IF;
    IF NOT "trellis".grammar_kw(toks[i], 'on') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'ON and a join condition');
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', "trellis".grammar_text(toks, i, e)) || coalesce(part, '{}'));
    i := e;
  END LOOP;
  expected := 'JOIN, WHERE, GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF "trellis".grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'group') AND "trellis".grammar_kw(toks[i + 1], 'by') THEN
    IF distinct_ THEN
      PERFORM "trellis".grammar_refuse('SELECT DISTINCT with GROUP BY is not supported yet', toks[i].pos);
    END IF;
    i := i + 2;
    IF "trellis".grammar_kw(toks[i], 'all') THEN
      PERFORM "trellis".grammar_fail(format(
        'GROUP BY ALL is not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    IF "trellis".grammar_kw(toks[i], 'distinct') THEN
      PERFORM "trellis".grammar_fail(format(
        'grouping sets are not supported: expected the GROUP BY expressions, found %s',
        "trellis".grammar_describe(toks[i])), toks[i].pos);
    END IF;
    LOOP
      IF (("trellis".grammar_kw(toks[i], 'rollup') OR "trellis".grammar_kw(toks[i], 'cube'))
          AND toks[i + 1].text = '(')
        OR ("trellis".grammar_kw(toks[i], 'grouping') AND "trellis".grammar_kw(toks[i + 1], 'sets'))
        OR (toks[i].text = '(' AND toks[i + 1].text = ')')
      THEN
        PERFORM "trellis".grammar_fail(format(
          'grouping sets are not supported: expected a GROUP BY expression, found %s',
          "trellis".grammar_describe(toks[i])), toks[i].pos);
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'a GROUP BY expression');
      END IF;
      group_by := group_by || jsonb_build_array("trellis".grammar_text(toks, i, e));
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", HAVING, ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'having') THEN
    IF distinct_ THEN
      PERFORM "trellis".grammar_refuse('SELECT DISTINCT with HAVING is not supported yet', toks[i].pos);
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'ORDER BY, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  -- A set operation or a WINDOW clause here is refused by name before ORDER BY is read.
  PERFORM "trellis".grammar_view_clause(toks, i);

  -- ORDER BY: read, and dropped (a table has no order; ADR 0049). Its expressions are not
  -- checked: they never run.
  IF "trellis".grammar_kw(toks[i], 'order') AND "trellis".grammar_kw(toks[i + 1], 'by') THEN
    i := i + 2;
    LOOP
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'an ORDER BY expression');
      END IF;
      i := e;
      EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
      i := i + 1;
    END LOOP;
    expected := '",", WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  PERFORM "trellis".grammar_view_clause(toks, i);

  -- WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY, each at most once, in either order.
  WHILE "trellis".grammar_kw(toks[i], 'without') LOOP
    IF "trellis".grammar_kw(toks[i + 1], 'source') AND NOT wsi THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'INDEX after WITHOUT SOURCE');
      END IF;
      wsi := true;
    ELSIF "trellis".grammar_kw(toks[i + 1], 'row') AND NOT wrs THEN
      IF NOT "trellis".grammar_kw(toks[i + 2], 'security') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SECURITY after WITHOUT ROW');
      END IF;
      wrs := true;
    ELSE
      PERFORM "trellis".grammar_unexpected(toks, i + 1, CASE
        WHEN wsi THEN 'ROW SECURITY after WITHOUT' WHEN wrs THEN 'SOURCE INDEX after WITHOUT'
        ELSE 'SOURCE INDEX or ROW SECURITY after WITHOUT' END);
    END IF;
    i := i + 3;
    expected := CASE WHEN wsi AND wrs THEN 'end of statement'
      WHEN wsi THEN 'WITHOUT ROW SECURITY or end of statement'
      ELSE 'WITHOUT SOURCE INDEX or end of statement' END;
  END LOOP;

  PERFORM "trellis".grammar_end(toks, i, expected);
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
$trellis_m40$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 41) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (41, 'view_unions', false);
    EXECUTE $trellis_m41$-- UNION ALL and UNION in a view's SQL (issue #26, item 1; ADR 0059):
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

ALTER FUNCTION "trellis".grammar_parse_view("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block;
ALTER FUNCTION "trellis"._render_view_select(jsonb) RENAME TO _render_view_block;
ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO _render_statement_block;
ALTER FUNCTION "trellis"._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_block;
ALTER FUNCTION "trellis"._define(jsonb, text) RENAME TO _define_view;
ALTER FUNCTION "trellis"._drop(jsonb) RENAME TO _drop_view;
ALTER FUNCTION "trellis"._alter_add_column(jsonb) RENAME TO _alter_add_column_block;
ALTER FUNCTION "trellis"._alter_drop_column(jsonb) RENAME TO _alter_drop_column_block;

-- The tables of a union's rows, and the branches (parts) that feed each: a transform
-- reading such a table is downstream of those branches (status(), awaitConverged).
CREATE TABLE "trellis".union_feeds (
  table_oid oid NOT NULL,
  transform_id int NOT NULL REFERENCES "trellis".transforms ON DELETE CASCADE,
  branch int NOT NULL,
  PRIMARY KEY (table_oid, transform_id)
);
CREATE INDEX union_feeds_by_transform ON "trellis".union_feeds (transform_id);

-- The transforms directly upstream of transform `id`: those whose targets it reads, and
-- those feeding a union's table it reads.
CREATE FUNCTION "trellis"._upstream_ids(id int)
RETURNS SETOF int LANGUAGE sql STABLE AS $fn$
  SELECT u.id FROM "trellis".transform_sources ts
    JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
   WHERE ts.transform_id = _upstream_ids.id
  UNION
  SELECT f.transform_id FROM "trellis".transform_sources ts
    JOIN "trellis".union_feeds f ON f.table_oid = ts.source_oid
   WHERE ts.transform_id = _upstream_ids.id
$fn$;

-- A view's SELECT at token i, with the WITH queries `ctes` in scope: a set operation at the
-- top level of it (outside brackets) splits it into branches, each read by
-- grammar_parse_block; without one, the SELECT is grammar_parse_block's. A union's AST:
-- {kind, form: 'as', target, union: {all, branches: [AST, ...]}, select (the first
-- branch's, for readers of a statement's columns), parts (its WITH queries), options}.
CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
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
  slice "trellis".grammar_token[];
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
    ELSIF d = 0 AND ("trellis".grammar_kw(toks[k], 'intersect') OR "trellis".grammar_kw(toks[k], 'except')) THEN
      PERFORM "trellis".grammar_refuse(format(
        '%s is not supported: only UNION and UNION ALL are maintained (write it with [NOT] EXISTS)',
        upper(toks[k].value) || CASE WHEN "trellis".grammar_kw(toks[k + 1], 'all') THEN ' ALL' ELSE '' END),
        toks[k].pos);
    ELSIF d = 0 AND "trellis".grammar_kw(toks[k], 'union') THEN
      ops := ops || k;
    END IF;
    k := k + 1;
  END LOOP;
  eof_at := k;
  IF cardinality(ops) = 0 THEN
    RETURN "trellis".grammar_parse_block(toks, i, target, ctes);
  END IF;

  -- The branches: from i to the first UNION, between two, after the last.
  starts := ARRAY[i];
  ends := '{}';
  FOREACH k IN ARRAY ops LOOP
    op_all := "trellis".grammar_kw(toks[k + 1], 'all');
    IF is_all IS NOT NULL AND is_all <> op_all THEN
      PERFORM "trellis".grammar_refuse(
        'UNION and UNION ALL mixed in one statement are not supported: write one of them (or put one in a subquery in FROM)',
        toks[k].pos);
    END IF;
    is_all := op_all;
    ends := ends || k;
    starts := starts || (k + CASE WHEN op_all OR "trellis".grammar_kw(toks[k + 1], 'distinct') THEN 2 ELSE 1 END);
  END LOOP;
  n := cardinality(starts);
  ends := ends || eof_at;

  FOR b IN 1 .. n LOOP
    IF b > 1 AND NOT "trellis".grammar_kw(toks[starts[b]], 'select')
       AND NOT (toks[starts[b]].kind = 'punct' AND toks[starts[b]].text = '(') THEN
      PERFORM "trellis".grammar_unexpected(toks, starts[b], 'SELECT after UNION');
    END IF;
    slice := toks[starts[b] : ends[b] - 1] || ROW('eof', '', '', toks[ends[b]].pos)::"trellis".grammar_token;
    branch := "trellis".grammar_parse_block(slice, 1, NULL, ctes);
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
      PERFORM "trellis".grammar_refuse(
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
CREATE FUNCTION "trellis"._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  with_ text;
BEGIN
  IF NOT ast ? 'union' THEN
    RETURN "trellis"._render_view_block(ast);
  END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '') || (
    SELECT string_agg("trellis"._render_view_select(b), CASE WHEN (ast->'union'->>'all')::boolean
                                                          THEN ' UNION ALL ' ELSE ' UNION ' END ORDER BY o)
      FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o));
END
$fn$;

-- render_statement: a union as written (its options after the last branch); every other
-- statement as _render_statement_block renders it.
CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast ? 'union' THEN
    RETURN "trellis"._render_statement_block(ast);
  END IF;
  RETURN 'TRANSFORM ' || "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
    || ' AS ' || "trellis"._render_view_select(ast)
    || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;

-- A view's AST with every reference to a WITH query in `scope` ("cte:<name>" -> its hidden
-- target) made a plain table item naming that target, at every level of its derived
-- tables: what Postgres is asked about a branch before the branch's own parts exist.
CREATE FUNCTION "trellis"._bind_scope_plain(ast jsonb, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  tschema text := (SELECT c.target_schema FROM "trellis".config c)::text;
  own_scope jsonb := scope;
  p jsonb;
BEGIN
  IF ast ? 'union' THEN
    RETURN jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg("trellis"._bind_scope_plain(b, scope) ORDER BY o)
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
                            THEN jsonb_set(p2, '{ast}', "trellis"._bind_scope_plain(p2->'ast', own_scope))
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
CREATE FUNCTION "trellis"._union_mirror()
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
CREATE FUNCTION "trellis"._drop_stale_hidden(hidden text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  rel regclass := to_regclass(quote_ident(tschema) || '.' || quote_ident(hidden));
BEGIN
  IF rel IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM "trellis".transforms t WHERE t.target_oid = rel)
     AND NOT EXISTS (SELECT 1 FROM "trellis".union_feeds f WHERE f.table_oid = rel) THEN
    EXECUTE format('DROP TABLE %s', rel);
  END IF;
END
$fn$;

-- Defines a union (an AST with `union`) as parts of transform `root`: its WITH queries,
-- each branch (a hidden transform, its columns named and typed as the union's), and the
-- table of the union's rows each branch's target is mirrored into. Returns, as
-- _define_parts does, {ast: what reads the union (SELECT [DISTINCT] its columns FROM its
-- table; the union itself kept in it, for rendering), ids: [part ids]}.
CREATE FUNCTION "trellis"._define_union(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
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
    PERFORM "trellis"._fail('TRV01', format(
      '%s is kept in a hidden table named %s, longer than 63 bytes: give the transform a shorter name',
      what, union_name));
  END IF;
  -- Its own WITH queries: parts as any, in scope in every branch.
  IF jsonb_array_length(coalesce(ast->'parts', '[]')) > 0 THEN
    res := "trellis"._define_parts_block(jsonb_build_object('parts', ast->'parts', 'from', '{}'::jsonb,
      'joins', '[]'::jsonb, 'select', '[]'::jsonb), root, path, scope);
    ids := ids || (res->'ids');
    FOR p IN SELECT value FROM jsonb_array_elements(ast->'parts') LOOP
      scope := scope || jsonb_build_object('cte:' || (p->>'name'), 'trellis#' || root || '#' || path || (p->>'name'));
    END LOOP;
  END IF;

  -- The union's columns, named and typed by Postgres (the statement was checked whole
  -- before this), and each branch's own.
  FOR branch IN SELECT value FROM jsonb_array_elements(ast->'union'->'branches') LOOP
    bound := bound || jsonb_build_array("trellis"._bind_scope_plain(branch, scope));
  END LOOP;
  info := "trellis"._analyze_query("trellis"._render_view_select(
    jsonb_build_object('union', jsonb_build_object('all', is_all, 'branches', bound))), 'in ' || what);
  nn := array_fill(true, ARRAY[jsonb_array_length(info->'columns')]);

  FOR b IN 1 .. n LOOP
    binfo := "trellis"._analyze_query("trellis"._render_view_select(bound->(b - 1)),
      format('in SELECT %s of %s', b, what));
    hidden := 'trellis#' || root || '#' || path || b;
    IF octet_length(hidden) > 63 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'SELECT %s of %s is kept in a hidden target named %s, longer than 63 bytes: give the transform a shorter name',
        b, what, hidden));
    END IF;
    PERFORM "trellis"._drop_stale_hidden(hidden);
    -- Its derived tables (and WITH queries read) bound to their parts.
    res := "trellis"._define_parts(ast->'union'->'branches'->(b - 1), root, path || b || '.', scope);
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
    PERFORM "trellis"._define_one(sub, NULL);
    SELECT t.id, t.target_oid, t.spec INTO part_id, part_oid, spec FROM "trellis".transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    UPDATE "trellis".transforms SET part_name = path || b WHERE id = part_id;
    ids := ids || to_jsonb(part_id);
    FOR j IN 1 .. cardinality(nn) LOOP
      nn[j] := nn[j] AND coalesce((
        SELECT a.attnotnull FROM pg_attribute a
         WHERE a.attrelid = part_oid AND a.attname = info->'columns'->(j - 1)->>'name' AND NOT a.attisdropped), false);
    END LOOP;
  END LOOP;

  -- The union's rows: (branch, key) and its columns, columns NOT NULL where every branch's is.
  PERFORM "trellis"._drop_stale_hidden(union_name);
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
    || qualified || ' FOR EACH STATEMENT EXECUTE FUNCTION "trellis".guard_target()';
  EXECUTE 'ALTER TABLE ' || qualified || ' ENABLE ALWAYS TRIGGER trellis_guard';
  cols := (SELECT string_agg(quote_ident(c->>'name'), ', ' ORDER BY o)
             FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o));
  new_cols := (SELECT string_agg('r.' || quote_ident(c->>'name'), ', ' ORDER BY o)
                 FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o));
  excluded_cols := (SELECT string_agg('EXCLUDED.' || quote_ident(c->>'name'), ', ' ORDER BY o)
                      FROM jsonb_array_elements(info->'columns') WITH ORDINALITY AS x(c, o));
  FOR b IN 1 .. n LOOP
    hidden := 'trellis#' || root || '#' || path || b;
    SELECT t.id, t.target_oid, t.spec INTO part_id, part_oid, spec FROM "trellis".transforms t
     WHERE t.target_schema = tschema AND t.target_name = hidden;
    key_text := 'ROW(' || coalesce((SELECT string_agg('r.' || quote_ident(k), ', ' ORDER BY o)
                                      FROM jsonb_array_elements_text(spec->'key') WITH ORDINALITY AS x(k, o)), '')
                || ')::text';
    EXECUTE format('CREATE TRIGGER trellis_union_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('CREATE TRIGGER trellis_union_update AFTER UPDATE ON %s REFERENCING OLD TABLE AS trellis_old NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('CREATE TRIGGER trellis_union_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS trellis_old
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('CREATE TRIGGER trellis_union_truncate AFTER TRUNCATE ON %s
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._union_mirror(%L, %L, %L, %L, %L, %L)',
      part_oid::regclass, qualified, b, key_text, cols, new_cols, excluded_cols);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER trellis_union_insert, ENABLE ALWAYS TRIGGER trellis_union_update, '
                   'ENABLE ALWAYS TRIGGER trellis_union_delete, ENABLE ALWAYS TRIGGER trellis_union_truncate',
      part_oid::regclass);
    INSERT INTO "trellis".union_feeds (table_oid, transform_id, branch) VALUES (union_rel, part_id, b);
  END LOOP;

  -- A UNION in a subquery is read by its key, all its columns: none may be NULL.
  IF path <> '' AND NOT is_all AND NOT (true = ALL (nn)) THEN
    PERFORM "trellis"._fail('TRV01', format(
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
CREATE FUNCTION "trellis"._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ? 'union' THEN
    RETURN "trellis"._define_union(ast, root, path, scope);
  END IF;
  RETURN "trellis"._define_parts_block(ast, root, path, scope);
END
$fn$;

-- TRANSFORM: a union at the top of the statement is checked whole by Postgres, its parts
-- defined (_define_union), then the transform reading the union's table; every other
-- statement as before (_define_view).
CREATE FUNCTION "trellis"._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  tschema name := (SELECT c.target_schema FROM "trellis".config c);
  tname text := ast->'target'->>'name';
  res jsonb;
  result jsonb;
BEGIN
  IF NOT ast ? 'union' THEN
    RETURN "trellis"._define_view(ast, statement);
  END IF;
  IF starts_with(tname, 'trellis#') THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): choose another target name',
      tname));
  END IF;
  IF EXISTS (SELECT 1 FROM "trellis".transforms t
              WHERE t.target_schema = tschema AND t.target_name = tname) THEN
    PERFORM "trellis"._fail('TRC01', format('a transform named %I is already defined', tname),
      'DROP TRANSFORM it first, or ALTER TRANSFORM it');
  END IF;
  -- Postgres reads the statement as written first: names, scopes, the columns' types.
  PERFORM "trellis"._analyze_query("trellis"._render_view_select(ast), 'in the definition');
  res := "trellis"._define_parts(ast, tname, '', '{}');
  result := "trellis"._define_one(res->'ast', statement);
  UPDATE "trellis".transforms p SET part_of = t.id
    FROM "trellis".transforms t
   WHERE t.target_schema = tschema AND t.target_name = tname
     AND p.id IN (SELECT (x)::int FROM jsonb_array_elements_text(res->'ids') x);
  RETURN result;
END
$fn$;

-- DROP TRANSFORM: as before (_drop_view: the transform, then its parts), then the tables
-- of the unions its parts fed.
CREATE FUNCTION "trellis"._drop(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  tables oid[];
  rel oid;
  result jsonb;
BEGIN
  tables := ARRAY(SELECT DISTINCT f.table_oid FROM "trellis".union_feeds f
                    JOIN "trellis".transforms p ON p.id = f.transform_id
                   WHERE p.part_of = t.id);
  result := "trellis"._drop_view(ast);
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
CREATE FUNCTION "trellis"._refuse_union_alter(ast jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
BEGIN
  IF t.spec->'ast' ? 'union' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I is a UNION: a column is added to or dropped from each of its SELECTs. DROP TRANSFORM it and define it again',
      t.target_name));
  END IF;
END
$fn$;

CREATE FUNCTION "trellis"._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._refuse_union_alter(ast);
  RETURN "trellis"._alter_add_column_block(ast);
END
$fn$;

CREATE FUNCTION "trellis"._alter_drop_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._refuse_union_alter(ast);
  RETURN "trellis"._alter_drop_column_block(ast);
END
$fn$;

-- 0041: status() as in 0035, its upstream (what keeps a transform from being live while
-- something it reads is behind) found by _upstream_ids: a union's branches included.
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := "trellis"._restore_reason();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
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
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    -- 0041: upstream through _upstream_ids (a union's branches feed its table too).
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis"._upstream_ids(t.id) u(id)
      UNION
      SELECT u.id FROM up CROSS JOIN LATERAL "trellis"._upstream_ids(up.id) u(id))
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
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
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
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
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix',
               -- 0034: the same statement for a migration's transaction (no CONCURRENTLY).
               'fixInMigration', regexp_replace(g->>'fix', '^CREATE INDEX CONCURRENTLY ', 'CREATE INDEX '))), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
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
    'backfill', "trellis"._backfill_pace(CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END, t.id, p.phase = 'backfilling'),
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0031: the drain time spent on it, and its share of the drain's recent time.
    'drain', "trellis"._drain_share(t.id),
    -- 0035: the last ALTER TRANSFORM ... AS: being built, switched, or given up and why.
    'redefinition', CASE WHEN t.redefinition IS NOT NULL THEN jsonb_build_object(
        'state', t.redefinition->'state', 'statement', t.redefinition->'statement',
        'changes', coalesce(t.redefinition->'changes', '[]'),
        'error', t.redefinition->'error', 'lockMs', t.redefinition->'lockMs',
        'since', t.redefinition->'since', 'at', t.redefinition->'at') END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM "trellis".config c WHERE c.restored IS NOT NULL) END);
END
$fn$;
$trellis_m41$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 42) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (42, 'redefine_bounded_lock', false);
    EXECUTE $trellis_m42$-- A redefinition's switch holds the target's ACCESS EXCLUSIVE lock for metadata only
-- (issue #25, ADR 0055's addendum). Before: a column added, retyped or replaced was
-- written under ACCESS EXCLUSIVE (ALTER TABLE, then every row updated: 1.5 s for 50,000
-- rows). Now, once the shadow is live and the switch can be staged:
--
-- 1. _redefine_prepare, a short transaction of its own: each column the new definition
--    adds, retypes or replaces is added to the target as a staged column
--    "trellis#<shadow id>#<ordinal>" (ADD COLUMN without a rewrite: nullable, or NOT NULL
--    with a constant default taken from the shadow, which Postgres records without
--    touching a row).
-- 2. _redefine_fill, batches of rows by key, each a transaction holding the drain's locks of
--    the transform and its shadow: the staged columns take the shadow's values. The old
--    definition keeps maintaining the target's own columns; readers read those.
-- 3. _redefine_switch, one transaction: under EXCLUSIVE (readers go on, seeing the old rows)
--    the rows the drains changed since are made the shadow's (kept and staged columns), the
--    rows the new definition lacks deleted, the keys it adds listed; then under ACCESS
--    EXCLUSIVE, metadata only: old columns dropped, staged ones renamed, defaults dropped,
--    NOT NULL adjusted, the listed rows inserted.
--
-- Where the switch cannot be staged (the key changes, the engine's join indexes change, a
-- retyped column carries the app's index, constraint, grant or comment, or a chain reads
-- it), it goes as before (_redefine_switch's classic path, ALTER COLUMN TYPE under the lock).

-- How the switch of shadow `s` (redefining `t`, by `plan`) can be staged: {staged: false}
-- when it cannot; else {staged: true, columns: [{name, staged, type, collation, not_null}]}
-- (the columns to stage: added, retyped, replaced).
CREATE FUNCTION "trellis"._redefine_staging(t "trellis".transforms, s "trellis".transforms, plan jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  c jsonb;
  att pg_attribute;
  columns jsonb := '[]';
  keys text[];
  old_wanted text[];
  new_wanted text[];
BEGIN
  IF (plan->>'key_changed')::boolean OR jsonb_array_length(coalesce(s.spec->'key', '[]')) = 0
     OR coalesce((s.spec->>'key_nullable')::boolean, false) THEN
    RETURN jsonb_build_object('staged', false);
  END IF;
  new_wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                        FROM jsonb_array_elements(s.spec->'sources') src
                       WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  old_wanted := ARRAY(SELECT array_to_string(ARRAY(SELECT quote_ident(k) FROM jsonb_array_elements_text(src->'target_key_columns') k), ', ')
                        FROM jsonb_array_elements(t.spec->'sources') src
                       WHERE (src->>'ordinal')::int > 0 AND jsonb_typeof(src->'target_key_columns') = 'array');
  IF new_wanted IS DISTINCT FROM old_wanted THEN
    RETURN jsonb_build_object('staged', false);
  END IF;
  -- Columns the engine's own objects stand on: the key, joined tables' keys.
  keys := ARRAY(SELECT jsonb_array_elements_text(s.spec->'key'))
    || ARRAY(SELECT jsonb_array_elements_text(t.spec->'key'))
    || ARRAY(SELECT k FROM jsonb_array_elements((s.spec->'sources') || (t.spec->'sources')) src,
                           jsonb_array_elements_text(CASE WHEN jsonb_typeof(src->'target_key_columns') = 'array'
                                                          THEN src->'target_key_columns' ELSE '[]' END) k);
  FOR c IN SELECT value FROM jsonb_array_elements(plan->'columns') LOOP
    CONTINUE WHEN c->>'action' = 'drop';
    IF c->>'action' IN ('retype', 'replace') THEN
      SELECT * INTO att FROM pg_attribute a
       WHERE a.attrelid = t.target_oid AND a.attname = c->>'name' AND NOT a.attisdropped;
      IF NOT FOUND OR c->>'name' = ANY (keys) OR att.attacl IS NOT NULL
         OR col_description(t.target_oid, att.attnum) IS NOT NULL
         OR cardinality("trellis"._column_dependants(t, att.attnum)) > 0
         OR EXISTS (SELECT 1 FROM "trellis".transform_sources ts JOIN "trellis".transforms x ON x.id = ts.transform_id
                     WHERE ts.source_oid = t.target_oid AND x.id <> t.id AND x.id <> s.id
                       AND c->>'name' = ANY (ts.read_columns::text[])) THEN
        RETURN jsonb_build_object('staged', false);
      END IF;
    END IF;
    columns := columns || jsonb_build_object(
      'name', c->>'name', 'type', c->>'type', 'collation', c->'collation',
      'staged', 'trellis#' || s.id || '#' || (SELECT cc.ordinal FROM "trellis".transform_columns cc
                                              WHERE cc.transform_id = s.id AND cc.name = c->>'name'),
      'not_null', coalesce((SELECT a.attnotnull FROM pg_attribute a
                             WHERE a.attrelid = s.target_oid AND a.attname = c->>'name' AND NOT a.attisdropped), false));
  END LOOP;
  RETURN jsonb_build_object('staged', true, 'columns', columns);
END
$fn$;

-- Step 1 (the staging worker, in a transaction of its own with a short lock_timeout, once
-- the shadow is live): the staged columns added to the target, each without a rewrite.
-- Returns how many were added now (0: none to stage, already added, or not staged).
CREATE FUNCTION "trellis"._redefine_prepare(shadow_id int)
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  plan jsonb;
  st jsonb;
  c jsonb;
  lit text;
  added int := 0;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  plan := "trellis"._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    RETURN 0;
  END IF;
  st := "trellis"._redefine_staging(t, s, plan);
  IF NOT (st->>'staged')::boolean THEN
    RETURN 0;
  END IF;
  FOR c IN SELECT value FROM jsonb_array_elements(st->'columns') LOOP
    CONTINUE WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                             AND a.attname = c->>'staged' AND NOT a.attisdropped);
    lit := NULL;
    IF (c->>'not_null')::boolean THEN
      -- A constant default: Postgres records it as the value of the rows there are, with
      -- no rewrite and no scan; the fill and the switch write the real values.
      EXECUTE format('SELECT n.%I::text FROM %s n WHERE n.%I IS NOT NULL LIMIT 1', c->>'name',
                     s.target_oid::regclass::text, c->>'name') INTO lit;
    END IF;
    EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s%s%s', t.target_oid::regclass::text, c->>'staged', c->>'type',
                   coalesce(' COLLATE ' || (c->>'collation'), ''),
                   CASE WHEN lit IS NOT NULL THEN format(' NOT NULL DEFAULT %L::%s', lit, c->>'type') ELSE '' END);
    added := added + 1;
  END LOOP;
  RETURN added;
END
$fn$;

-- Step 2: one batch of the fill, the shadow's rows after key `after` (NULL: from the
-- first), at most `batch` of them: the target's staged columns take the shadow's values
-- where they differ. Holds the drain's locks of the transform and its shadow (page slots,
-- then pipeline rows, as the drain takes them) for the batch. Returns {updated, last}:
-- `last` the batch's last key (text values) to pass on, NULL once every row was seen.
CREATE FUNCTION "trellis"._redefine_fill(shadow_id int, after text[], batch int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  plan jsonb;
  st jsonb;
  staged jsonb;
  ids int[];
  keys text[];
  key_list text;
  cond text := 'true';
  result jsonb;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  ids := ARRAY(SELECT i FROM unnest(ARRAY[s.id, s.redefines]) i ORDER BY i);
  PERFORM 1 FROM "trellis".page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM "trellis".pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  plan := "trellis"._redefine_plan(t, s.spec);
  st := "trellis"._redefine_staging(t, s, plan);
  IF NOT (st->>'staged')::boolean THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  staged := (SELECT coalesce(jsonb_agg(c), '[]') FROM jsonb_array_elements(st->'columns') c
              WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                               AND a.attname = c->>'staged' AND NOT a.attisdropped));
  IF jsonb_array_length(staged) = 0 THEN
    RETURN jsonb_build_object('updated', 0, 'last', NULL);
  END IF;
  PERFORM set_config('trellis.maintaining', 'trellis', true);
  keys := ARRAY(SELECT jsonb_array_elements_text(s.spec->'key'));
  key_list := (SELECT string_agg(quote_ident(k), ', ') FROM unnest(keys) k);
  IF after IS NOT NULL THEN
    cond := '(' || (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k) || ') > ('
      || (SELECT string_agg(format('%L::%s', after[o], format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY o)
            FROM unnest(keys) WITH ORDINALITY AS u(k, o)
            JOIN pg_attribute a ON a.attrelid = s.target_oid AND a.attname = u.k) || ')';
  END IF;
  EXECUTE format(
    'WITH b AS (SELECT %s FROM %s n WHERE %s ORDER BY %s LIMIT %s),'
    ' u AS (UPDATE %s t SET (%s) = ROW(%s) FROM b JOIN %s n ON %s WHERE %s AND record_image_ne(ROW(%s), ROW(%s)) RETURNING 1)'
    ' SELECT jsonb_build_object(''updated'', (SELECT count(*) FROM u),'
    ' ''last'', (SELECT to_jsonb(ARRAY[%s]) FROM b ORDER BY %s LIMIT 1))',
    (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k),
    s.target_oid::regclass::text, cond, key_list, batch,
    t.target_oid::regclass::text,
    (SELECT string_agg(quote_ident(c->>'staged'), ', ') FROM jsonb_array_elements(staged) c),
    (SELECT string_agg('n.' || quote_ident(c->>'name'), ', ') FROM jsonb_array_elements(staged) c),
    s.target_oid::regclass::text,
    (SELECT string_agg(format('n.%I = b.%I', k, k), ' AND ') FROM unnest(keys) k),
    (SELECT string_agg(format('t.%I = n.%I', k, k), ' AND ') FROM unnest(keys) k),
    (SELECT string_agg('t.' || quote_ident(c->>'staged'), ', ') FROM jsonb_array_elements(staged) c),
    (SELECT string_agg('n.' || quote_ident(c->>'name'), ', ') FROM jsonb_array_elements(staged) c),
    (SELECT string_agg('b.' || quote_ident(k) || '::text', ', ') FROM unnest(keys) k),
    (SELECT string_agg('b.' || quote_ident(k) || ' DESC', ', ') FROM unnest(keys) k))
  INTO result;
  RETURN jsonb_build_object('updated', result->'updated',
                            'last', CASE WHEN jsonb_typeof(result->'last') = 'array' THEN result->'last' END);
END
$fn$;

-- 0035's _drop_redefinition, and a shadow's staged columns dropped from the target with it
-- (a redefinition replaced, given up, or dropped with its transform).
CREATE OR REPLACE FUNCTION "trellis"._drop_redefinition()
RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
BEGIN
  IF OLD.redefines IS NULL THEN
    DELETE FROM "trellis".transforms s WHERE s.redefines = OLD.id;
  ELSE
    -- 0042
    FOR r IN SELECT a.attrelid, a.attname FROM "trellis".transforms x
               JOIN pg_attribute a ON a.attrelid = x.target_oid
              WHERE x.id = OLD.redefines AND NOT a.attisdropped
                AND starts_with(a.attname, 'trellis#' || OLD.id || '#') LOOP
      EXECUTE format('ALTER TABLE %s DROP COLUMN %I', r.attrelid::regclass::text, r.attname);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = OLD.target_oid) THEN
      EXECUTE 'DROP TABLE ' || OLD.target_oid::regclass::text;
    END IF;
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || OLD.id);
  END IF;
  RETURN OLD;
END
$fn$;

-- Step 3: 0035's _redefine_switch, with the staged path (see the top of this file): when
-- _redefine_prepare added every column to stage, the rows are written under EXCLUSIVE and
-- ACCESS EXCLUSIVE covers the metadata and the rows the new definition adds; otherwise as
-- before. Reports also readersBlockedMs (how long ACCESS EXCLUSIVE was held: 0 when the
-- switch took none) and staged.
CREATE OR REPLACE FUNCTION "trellis"._redefine_switch(shadow_id int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  x "trellis".transforms;
  p "trellis".pipeline;
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
  -- 0042
  st jsonb;
  staged_mode boolean;
  tcols text;
  ncols text;
  readers_at timestamptz;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  ids := ARRAY(SELECT DISTINCT i FROM unnest(ARRAY[t.id, s.id] || ARRAY(
                 SELECT ts.transform_id FROM "trellis".transform_sources ts WHERE ts.source_oid = t.target_oid)) i
               ORDER BY i);
  PERFORM 1 FROM "trellis".page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM "trellis".pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    -- Dropped, or replaced by another ALTER TRANSFORM … AS, while this waited.
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO p FROM "trellis".pipeline px WHERE px.transform_id = s.id;
  IF p.phase <> 'live' OR p.follow_pending OR s.paused_at IS NOT NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'the new definition is not live yet');
  END IF;

  plan := "trellis"._redefine_plan(t, s.spec);
  IF jsonb_array_length(plan->'refused') > 0 THEN
    PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: %s', t.target_name,
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
  -- 0042: staged when _redefine_prepare added every column to stage (the fill wrote them).
  st := "trellis"._redefine_staging(t, s, plan);
  staged_mode := (st->>'staged')::boolean AND NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements(st->'columns') sc
     WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.target_oid
                          AND a.attname = sc->>'staged' AND NOT a.attisdropped));
  IF staged_mode THEN
    -- EXCLUSIVE: the drains' writes wait, readers go on reading the old rows.
    EXECUTE 'LOCK TABLE ' || rel || ' IN EXCLUSIVE MODE';
    locked_at := clock_timestamp();
    EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
    PERFORM set_config('trellis.maintaining', 'trellis', true);
    cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
               FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
    ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
    -- The target's column for each of the new definition's: its staged one where staged.
    tcols := (SELECT string_agg(quote_ident(coalesce(sc->>'staged', cc.name)), ', ' ORDER BY cc.ordinal)
                FROM "trellis".transform_columns cc
                LEFT JOIN jsonb_array_elements(st->'columns') sc ON sc->>'name' = cc.name
               WHERE cc.transform_id = s.id);
    key_match := (SELECT string_agg(format('n.%I = t.%I', k, k), ' AND ') FROM unnest(new_key) k);
    EXECUTE 'DELETE FROM ' || rel || ' t WHERE NOT EXISTS (SELECT 1 FROM ' || shadow_rel || ' n WHERE ' || key_match || ')';
    GET DIAGNOSTICS deleted = ROW_COUNT;
    -- Rows the drains changed since the fill (and the kept columns that differ): written.
    EXECUTE 'UPDATE ' || rel || ' t SET (' || tcols || ') = ROW(' || ncols || ') FROM ' || shadow_rel || ' n WHERE '
      || key_match || ' AND record_image_ne(ROW(' || (
           SELECT string_agg('t.' || quote_ident(coalesce(sc->>'staged', cc.name)), ', ' ORDER BY cc.ordinal)
             FROM "trellis".transform_columns cc
             LEFT JOIN jsonb_array_elements(st->'columns') sc ON sc->>'name' = cc.name
            WHERE cc.transform_id = s.id)
      || '), ROW(' || ncols || '))';
    GET DIAGNOSTICS written = ROW_COUNT;
    ddl := jsonb_array_length(plan->'columns') > 0 OR EXISTS (
      SELECT 1 FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
       WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
         AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull <> n.attnotnull);
    IF NOT ddl THEN
      EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || ncols || ' FROM ' || shadow_rel || ' n'
        || ' WHERE NOT EXISTS (SELECT 1 FROM ' || rel || ' t WHERE ' || key_match || ')';
      GET DIAGNOSTICS gone = ROW_COUNT;
      written := written + gone;
    ELSE
      -- The keys to insert, listed before the lock readers wait for.
      EXECUTE format('CREATE TEMP TABLE %I ON COMMIT DROP AS SELECT %s FROM %s n WHERE NOT EXISTS (SELECT 1 FROM %s t WHERE %s)',
                     'trellis#new#' || s.id, (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(new_key) k),
                     shadow_rel, rel, key_match);
      -- ACCESS EXCLUSIVE, for metadata and the rows the new definition adds only.
      EXECUTE 'LOCK TABLE ' || rel || ' IN ACCESS EXCLUSIVE MODE';
      readers_at := clock_timestamp();
      BEGIN
        FOR c IN SELECT value FROM jsonb_array_elements(plan->'columns') LOOP
          IF c->>'action' IN ('drop', 'retype', 'replace') THEN
            EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, c->>'name');
          END IF;
          IF c->>'action' IN ('add', 'retype', 'replace') THEN
            EXECUTE format('ALTER TABLE %s RENAME COLUMN %I TO %I', rel,
              (SELECT sc->>'staged' FROM jsonb_array_elements(st->'columns') sc WHERE sc->>'name' = c->>'name'), c->>'name');
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', rel, c->>'name');
          END IF;
        END LOOP;
      EXCEPTION
        WHEN dependent_objects_still_exist OR feature_not_supported THEN
          GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
          PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
            t.target_name, SQLERRM, coalesce(' (' || replace(nullif(detail, ''), E'\n', '; ') || ')', '')));
      END;
      FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
                WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                  AND NOT a.attisdropped AND NOT n.attisdropped AND a.attnotnull AND NOT n.attnotnull LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP NOT NULL', rel, r.attname);
      END LOOP;
      EXECUTE 'INSERT INTO ' || rel || ' (' || cols || ') SELECT ' || ncols || ' FROM ' || shadow_rel || ' n JOIN pg_temp.'
        || quote_ident('trellis#new#' || s.id) || ' k ON '
        || (SELECT string_agg(format('n.%I = k.%I', k, k), ' AND ') FROM unnest(new_key) k);
      GET DIAGNOSTICS gone = ROW_COUNT;
      written := written + gone;
      EXECUTE 'DROP TABLE pg_temp.' || quote_ident('trellis#new#' || s.id);
    END IF;
    -- NOT NULL where the new definition's columns are (a scan, where a staged column could
    -- not be added NOT NULL: the shadow had no row then).
    FOR r IN SELECT a.attname FROM pg_attribute a JOIN pg_attribute n ON n.attname = a.attname
              WHERE a.attrelid = t.target_oid AND n.attrelid = s.target_oid AND a.attnum > 0
                AND NOT a.attisdropped AND NOT n.attisdropped AND NOT a.attnotnull AND n.attnotnull LOOP
      EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', rel, r.attname);
    END LOOP;
  ELSE
  EXECUTE 'LOCK TABLE ' || rel || CASE WHEN ddl THEN ' IN ACCESS EXCLUSIVE MODE' ELSE ' IN EXCLUSIVE MODE' END;
  locked_at := clock_timestamp();
  EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
  PERFORM set_config('trellis.maintaining', 'trellis', true);

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
      PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: %s%s',
        t.target_name, SQLERRM, coalesce(' (' || replace(nullif(detail, ''), E'\n', '; ') || ')', '')));
  END;

  -- The rows: the shadow's, by a diff (rows gone deleted, rows new or changed written, as
  -- the drain writes them: value images, so 1.0 becomes 1.00), so a chain reading the target
  -- sees keyed changes.
  cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
             FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
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
          FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id) || ')'
      || ' FROM ' || shadow_rel || ' n WHERE ' || coalesce(key_match || ' AND ', '')
      || 'record_image_ne(ROW(' || (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                                      FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id)
      || '), ROW(' || (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
                        FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id) || '))';
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

  IF ddl THEN
    readers_at := locked_at;
  END IF;
  -- Columns staged for a switch that could not be staged after all (the app indexed a
  -- retyped column since, say): not the target's.
  FOR r IN SELECT a.attname FROM pg_attribute a
            WHERE a.attrelid = t.target_oid AND NOT a.attisdropped
              AND starts_with(a.attname, 'trellis#' || s.id || '#') LOOP
    EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, r.attname);
    readers_at := coalesce(readers_at, clock_timestamp());
  END LOOP;
  END IF;

  -- Transforms reading the target follow a column's new type (ADR 0047: their definition
  -- rebound and analysed again, their target altered, re-derived by the staging worker),
  -- or the switch is refused naming them.
  FOR x IN
    SELECT y.* FROM "trellis".transforms y
     WHERE y.id <> t.id AND y.id <> s.id AND y.capture_failure IS NULL AND y.paused_at IS NULL
       AND EXISTS (SELECT 1 FROM "trellis".transform_sources ts
                     CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) ra
                     JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                    WHERE ts.transform_id = y.id AND ts.source_oid = t.target_oid AND NOT a.attisdropped
                      AND (format_type(a.atttypid, a.atttypmod) <> ra->>'type' OR a.attnum <> (ra->>'attnum')::int))
     ORDER BY y.id
  LOOP
    -- read_attrs by name: a column dropped and added again moved to another attnum.
    UPDATE "trellis".transform_sources ts
       SET read_attrs = (SELECT jsonb_agg(CASE WHEN a.attnum IS NULL THEN ra
                                               ELSE jsonb_set(ra, '{attnum}', to_jsonb(a.attnum::int)) END)
                           FROM jsonb_array_elements(ts.read_attrs) ra
                           LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attname = ra->>'name'
                                                   AND NOT a.attisdropped)
     WHERE ts.transform_id = x.id AND ts.source_oid = t.target_oid;
    BEGIN
      EXECUTE 'LOCK TABLE ' || x.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
      PERFORM "trellis"._follow_transform(x);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS detail = MESSAGE_TEXT;
      PERFORM "trellis"._fail('TRC01', format('transform %I cannot be switched to its new definition: transform %I reads it and %s',
        t.target_name, x.target_name, detail));
    END;
  END LOOP;

  -- The catalog: the shadow's rows become the transform's (definition, plan, cursor, key
  -- map, group states, held keys), on the target; the old transform's go.
  UPDATE "trellis".transforms y SET redefines = NULL WHERE y.id = s.id;
  DELETE FROM "trellis".transforms y WHERE y.id = t.id;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  UPDATE "trellis".transforms y
     SET target_schema = t.target_schema, target_name = t.target_name, target_oid = t.target_oid,
         created_at = t.created_at, updated_at = now(),
         redefinition = jsonb_build_object('state', 'switched', 'statement', s.statement,
                                           'previous', t.statement, 'since', t.redefinition->'since',
                                           'at', now(), 'changes', plan->'changes',
                                           'deleted', deleted, 'written', written,
                                           'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2),
                                           'readersBlockedMs', coalesce(round((extract(epoch FROM clock_timestamp() - readers_at) * 1000)::numeric, 2), 0),
                                           'staged', staged_mode)
   WHERE y.id = s.id;
  EXECUTE 'DROP TABLE ' || shadow_rel;
  RETURN jsonb_build_object('switched', true, 'target', t.target_name, 'changes', plan->'changes',
                            'deleted', deleted, 'written', written,
                            'lockMs', round((extract(epoch FROM clock_timestamp() - locked_at) * 1000)::numeric, 2),
                            'readersBlockedMs', coalesce(round((extract(epoch FROM clock_timestamp() - readers_at) * 1000)::numeric, 2), 0),
                            'staged', staged_mode);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m42$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 43) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (43, 'quiet_samples', false);
    EXECUTE $trellis_m43$-- Samples only when something changed (ADR 0063).
--
-- The staging worker sampled every transform every ten seconds (0034), so an idle instance
-- wrote a row per transform every ten seconds, against I8 (idle transforms cost next to
-- nothing). A sample is now written only when the transform's lag (in segments), its
-- changed keys applied or its build's keys done differ from its latest sample. When a
-- change comes after such a quiet stretch, the pass before it (which found nothing
-- changed) is written first, as a copy of the latest sample at that pass's time: the
-- charts then show the quiet stretch as it was, flat, and the change from where it began,
-- not a slope across the stretch. The latest sample of each transform is kept past the
-- hour (history() reads the last hour only), so that a quiet instance writes nothing to
-- find out whether it changed.
--
-- Hidden parts (0036) and the shadows of redefinitions being built (0035) are left out:
-- they are not transforms an operator sees, and their keys are counted by their own.

DELETE FROM "trellis".samples s
 USING "trellis".transforms t
 WHERE t.id = s.transform_id AND (t.part_of IS NOT NULL OR t.redefines IS NOT NULL);

-- The transforms whose lag (segments), changed keys applied or build's keys done differ
-- from their latest sample (or that have none) at `p_at`: their values now and their
-- latest sample's. Hidden parts and shadows of redefinitions left out.
CREATE FUNCTION "trellis"._sample_changes(p_at timestamptz)
RETURNS TABLE (transform_id int, lag_seconds float8, lag_segments bigint, keys bigint,
               backfill_done bigint, last_at timestamptz, last_lag_seconds float8,
               last_lag_segments bigint, last_keys bigint, last_backfill_done bigint)
LANGUAGE sql STABLE AS $fn$
  SELECT c.id, c.lag_seconds, c.lag_segments, c.keys, c.backfill_done,
         l.at, l.lag_seconds, l.lag_segments, l.keys, l.backfill_done
    FROM (SELECT t.id, coalesce(w.seconds, 0) AS lag_seconds, coalesce(w.segments, 0) AS lag_segments,
                 coalesce(d.keys, 0) AS keys, "trellis"._keys_built(p) AS backfill_done
            FROM "trellis".transforms t
            JOIN "trellis".pipeline p ON p.transform_id = t.id
            LEFT JOIN "trellis".drain_time d ON d.transform_id = t.id
            LEFT JOIN LATERAL (
              SELECT count(*) AS segments,
                     extract(epoch FROM p_at - min(k.at))::float8 AS seconds
                FROM "trellis".ticks k WHERE k.seq > p.cursor_tick) w ON p.cursor_tick IS NOT NULL
           WHERE t.part_of IS NULL AND t.redefines IS NULL) c
    LEFT JOIN LATERAL (
      SELECT s.* FROM "trellis".samples s WHERE s.transform_id = c.id ORDER BY s.at DESC LIMIT 1) l ON true
   WHERE l.transform_id IS NULL
      OR c.lag_segments <> l.lag_segments OR c.keys <> l.keys
      OR c.backfill_done IS DISTINCT FROM l.backfill_done
$fn$;

-- Takes a sample of every transform that changed since its latest, and forgets samples
-- older than an hour but each transform's latest. `p_last_pass` is the `at` the previous
-- call of this election returned (null at first): the time as of which every transform
-- not sampled then was as its latest sample says. Returns how many samples it wrote and
-- the time of this pass. With nothing changed and nothing turning an hour old it only
-- reads (no transaction id, no WAL).
CREATE FUNCTION "trellis"._sample(p_last_pass timestamptz, OUT written int, OUT at timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
  carried int;
BEGIN
  at := clock_timestamp();
  written := 0;
  -- Deletes nothing (and so writes nothing) unless a sample has just turned an hour old.
  DELETE FROM "trellis".samples s
   WHERE s.at < _sample.at - interval '1 hour'
     AND EXISTS (SELECT 1 FROM "trellis".samples n WHERE n.transform_id = s.transform_id AND n.at > s.at);
  IF NOT EXISTS (SELECT 1 FROM "trellis"._sample_changes(at)) THEN
    RETURN;
  END IF;
  -- The quiet stretch, as the previous pass found it: the latest sample, at that pass.
  INSERT INTO "trellis".samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT x.transform_id, p_last_pass,
         x.last_lag_seconds + CASE WHEN x.last_lag_segments > 0
                                   THEN extract(epoch FROM p_last_pass - x.last_at) ELSE 0 END,
         x.last_lag_segments, x.last_keys, x.last_backfill_done
    FROM "trellis"._sample_changes(at) x
   WHERE p_last_pass IS NOT NULL AND x.last_at IS NOT NULL AND p_last_pass > x.last_at
     AND p_last_pass < _sample.at
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS carried = ROW_COUNT;
  -- Read again: the copies above are older than the samples they copy, not newer.
  INSERT INTO "trellis".samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT x.transform_id, _sample.at, x.lag_seconds, x.lag_segments, x.keys, x.backfill_done
    FROM "trellis"._sample_changes(at) x
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS written = ROW_COUNT;
  written := written + carried;
END
$fn$;

-- The 0034 form, for a process of the previous version: the same, with no previous pass.
CREATE OR REPLACE FUNCTION "trellis"._sample()
RETURNS int LANGUAGE sql AS $fn$
  SELECT written FROM "trellis"._sample(NULL::timestamptz)
$fn$;
$trellis_m43$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 44) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (44, 'not_in_nulls', false);
    EXECUTE $trellis_m44$-- NOT IN and <> ALL over values that can be NULL, uncorrelated EXISTS and NOT EXISTS, and
-- these subquery predicates under an OR (issue #26, item 1; ADR 0057, addendum "NULLs, one
-- fact per statement, OR").
--
--   x NOT IN (SELECT s FROM S WHERE ...)   (x <> ALL (...) likewise), x or s nullable:
--     TRUE iff S is empty, or x IS NOT NULL and no s = x and S holds no NULL. Compiled to
--     ADR 0057's anti-join part (keyed by s, LEFT JOINed on s = x) plus up to two
--     existence parts, LEFT JOINed on the correlation columns (if any):
--       "nulls#n"   the rows of S whose s IS NULL       (only if s can be NULL)
--       "values#n"  the rows of S whose s IS NOT NULL   (only if x can be NULL)
--     and the condition
--       anti.key IS NULL AND nulls.key IS NULL AND ((x) IS NOT NULL OR values.key IS NULL)
--   [NOT] EXISTS (SELECT ... FROM S WHERE <no reference to the outer query>):
--     an existence part, `key IS [NOT] NULL`.
--
-- An existence part is a GROUP BY of the correlation columns (never NULL, ADR 0057), or,
-- uncorrelated, of the constant-valued `(1 IS NULL)` (Postgres refuses a bare constant in
-- GROUP BY): at most one row per correlation key, which appears when the first row of S
-- (of that key) does and leaves with the last. A change to S reaches the statement only
-- when such a row appears or leaves; uncorrelated, that re-derives every row of the
-- statement (the join matches them all), as a one-row part's change does (ADR 0058).
--
-- Under OR: a top-level AND-ed condition that is an OR of terms (in brackets or not), each
-- either free of subqueries or one of the forms above, gets each form's condition in its
-- place (the parts LEFT JOINed, the row kept or not by the OR). Each such condition is
-- TRUE exactly when the predicate is, and FALSE otherwise (where SQL would say NULL):
-- under AND and OR at the top of WHERE the two filter the same rows.
--
-- Replaced (its latest body, 0039's, copied; each change marked "0044"): _semi_rewrite.
-- New: _semi_exists_part, _semi_or_terms, _semi_shape_operand.

-- An existence part over the subquery `sub` (after its own rewrite): its rows passing `kept`
-- (the subquery's own conditions and any added here), one per value of the correlation
-- columns `corr` ([{inner, outer}]), or, with none, at most one row (a constant-valued key).
-- {part, join}: the part under `alias`, LEFT JOINed on the correlation equalities.
CREATE FUNCTION "trellis"._semi_exists_part(sub jsonb, kept text[], corr jsonb, alias text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  sel jsonb := '[]';
  gb jsonb := '[]';
  on_ text;
BEGIN
  FOR k IN 0 .. jsonb_array_length(corr) - 1 LOOP
    sel := sel || jsonb_build_array(jsonb_build_object('expr', corr->k->>'inner', 'name', 'key#' || (k + 1)));
    gb := gb || to_jsonb(corr->k->>'inner');
    kept := kept || ('(' || (corr->k->>'inner') || ') IS NOT NULL');
  END LOOP;
  IF jsonb_array_length(corr) = 0 THEN
    sel := jsonb_build_array(jsonb_build_object('expr', '(1 IS NULL)', 'name', 'key#1'));
    gb := '["(1 IS NULL)"]';
    on_ := format('%I.%I IS NOT NULL', alias, 'key#1');
  ELSE
    on_ := (SELECT string_agg(format('%I.%I = (%s)', alias, 'key#' || o, x->>'outer'), ' AND ' ORDER BY o)
              FROM jsonb_array_elements(corr) WITH ORDINALITY AS y(x, o));
  END IF;
  RETURN jsonb_build_object(
    'part', jsonb_build_object('name', alias, 'kind', 'derived', 'columns', '[]'::jsonb, 'semi', true,
      'ast', sub || jsonb_build_object(
        'select', sel, 'where', CASE WHEN cardinality(kept) > 0 THEN array_to_string(kept, ' AND ') END,
        'group_by', gb, 'having', NULL, 'semi_key', true)),
    'join', jsonb_build_object(
      'type', 'left', 'schema', NULL, 'name', alias, 'alias', alias, 'on', on_,
      'part', alias, 'part_kind', 'derived', 'semi', true));
END
$fn$;

-- _semi_shape, and NULL when the outer expression it found for an IN form is not one
-- operand (`a OR x IN (...)`, `a AND x IN (...)`, `a = x IN (...)`: IN binds tighter than
-- those, so the operand is x, not what is before IN).
CREATE FUNCTION "trellis"._semi_shape_operand(cond text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  shape jsonb := "trellis"._semi_shape(cond);
  toks "trellis".grammar_token[];
  d int := 0;
BEGIN
  IF shape IS NULL OR shape->>'expr' IS NULL THEN
    RETURN shape;
  END IF;
  toks := "trellis".grammar_tokenize(shape->>'expr');
  FOR k IN 1 .. array_length(toks, 1) LOOP
    IF (toks[k].kind = 'punct' AND toks[k].text IN ('(', '[')) OR "trellis".grammar_kw(toks[k], 'case') THEN
      d := d + 1;
    ELSIF (toks[k].kind = 'punct' AND toks[k].text IN (')', ']')) OR "trellis".grammar_kw(toks[k], 'end') THEN
      d := d - 1;
    ELSIF d = 0 AND ((toks[k].kind = 'word' AND toks[k].value IN (
                        'and', 'or', 'not', 'is', 'isnull', 'notnull', 'between', 'like', 'ilike',
                        'similar', 'in'))
                     OR (toks[k].kind = 'op' AND toks[k].text IN ('=', '<>', '!=', '<', '>', '<=', '>='))) THEN
      RETURN NULL;
    END IF;
  END LOOP;
  RETURN shape;
END
$fn$;

-- The terms of a condition that is an OR at its top (in brackets or not), as their texts;
-- NULL when it is not one.
CREATE FUNCTION "trellis"._semi_or_terms(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(cond);
  n int := array_length(toks, 1);  -- the eof token
  a int := 1;
  b int;
  d int := 0;
  start int;
  res text[] := '{}';
BEGIN
  b := n;  -- exclusive
  WHILE b - a >= 2 AND toks[a].kind = 'punct' AND toks[a].text = '('
        AND "trellis"._closing_token(toks, a) = b - 1 LOOP
    a := a + 1;
    b := b - 1;
  END LOOP;
  start := a;
  FOR k IN a .. b - 1 LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND "trellis".grammar_kw(toks[k], 'or') THEN
      IF k = start THEN
        RETURN NULL;
      END IF;
      res := res || "trellis".grammar_text(toks, start, k);
      start := k + 1;
    END IF;
  END LOOP;
  IF cardinality(res) = 0 OR start >= b THEN
    RETURN NULL;
  END IF;
  RETURN res || "trellis".grammar_text(toks, start, b);
END
$fn$;

-- Rewrites the semi- and anti-joins at the top of a view's WHERE (and, first, those of its
-- parts) into hidden parts read through LEFT JOINs: see the head of 0039 and ADR 0057.
-- `outer_ctes`: the WITH query parts of the statements around it (for Postgres to read its
-- expressions). Returns the AST unchanged when it holds none.
-- 0044: (as 0039's) and NOT IN over nullable values, uncorrelated EXISTS, and the forms as
-- terms of an OR AND-ed at the top of WHERE: see the head of this file.
CREATE OR REPLACE FUNCTION "trellis"._semi_rewrite(ast jsonb, outer_ctes jsonb)
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
  toks "trellis".grammar_token[];
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
  -- 0044
  work jsonb := '[]';    -- [{text, shape, grp, term}]: the forms to compile, in order
  grps jsonb := '[]';    -- per OR: its terms' texts (a form's replaced by its condition)
  terms text[];
  w jsonb;
  cond text;
  made jsonb;
  base_kept text[];
  nullable_inner boolean;
  nullable_outer boolean;
  corr jsonb;
  extra text;
BEGIN
  -- The parts inside first (a derived table or WITH query with a semi-join of its own).
  scope_ctes := outer_ctes || coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(ast->'parts') x
                                          WHERE x->>'kind' = 'cte'), '[]');
  seen := outer_ctes;
  FOR p IN SELECT value FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) LOOP
    -- A WITH query sees those before it; a derived table every one of the statement's.
    parts := parts || jsonb_build_array(p || jsonb_build_object('ast', "trellis"._semi_rewrite(p->'ast',
      CASE WHEN p->>'kind' = 'cte' THEN seen ELSE scope_ctes END)));
    IF p->>'kind' = 'cte' THEN
      seen := seen || jsonb_build_array(p);
    END IF;
  END LOOP;
  IF jsonb_array_length(parts) > 0 THEN
    ast := ast || jsonb_build_object('parts', parts);
  END IF;
  IF ast->>'where' IS NULL
     OR NOT "trellis"._semi_has_sublink("trellis".grammar_tokenize(ast->>'where')) THEN
    RETURN ast;
  END IF;
  ctes := coalesce((SELECT jsonb_object_agg(x->>'name', true) FROM jsonb_array_elements(scope_ctes) x), '{}');
  conjuncts := "trellis"._semi_conjuncts(ast->>'where');
  joins := coalesce(ast->'joins', '[]');
  -- 0044: the forms to compile: AND-ed at the top, or terms of an OR AND-ed at the top.
  FOREACH c IN ARRAY conjuncts LOOP
    toks := "trellis".grammar_tokenize(c);
    IF NOT "trellis"._semi_has_sublink(toks) THEN
      kept := kept || ('(' || c || ')');
      CONTINUE;
    END IF;
    terms := "trellis"._semi_or_terms(c);
    shape := CASE WHEN terms IS NULL THEN "trellis"._semi_shape_operand(c) END;
    IF shape IS NOT NULL THEN
      work := work || jsonb_build_array(jsonb_build_object('text', c, 'shape', shape));
      CONTINUE;
    END IF;
    IF terms IS NOT NULL AND NOT EXISTS (
         SELECT 1 FROM unnest(terms) t
          WHERE "trellis"._semi_shape_operand(t) IS NULL AND "trellis"._semi_has_sublink("trellis".grammar_tokenize(t))) THEN
      FOR k IN 1 .. cardinality(terms) LOOP
        IF "trellis"._semi_shape_operand(terms[k]) IS NOT NULL THEN
          work := work || jsonb_build_array(jsonb_build_object(
            'text', terms[k], 'shape', "trellis"._semi_shape_operand(terms[k]),
            'grp', jsonb_array_length(grps), 'term', k - 1));
        END IF;
      END LOOP;
      grps := grps || jsonb_build_array(to_jsonb(ARRAY(SELECT '(' || t || ')' FROM unnest(terms) t)));
      CONTINUE;
    END IF;
    PERFORM "trellis"._fail('TRV01', format(
      'a subquery in WHERE as EXISTS, IN, = ANY or <> ALL is supported only as a condition AND-ed at the top of WHERE or as a term of an OR so AND-ed, not inside %s (%s): write it as its own AND-ed condition, or as a term of an OR',
      CASE WHEN terms IS NOT NULL THEN 'an AND or another expression under an OR'
           WHEN EXISTS (SELECT 1 FROM unnest(toks) t WHERE "trellis".grammar_kw(t, 'or'))
             THEN 'an OR inside another expression (NOT, CASE, a comparison)'
           ELSE 'another expression (NOT, CASE, a comparison)' END, c));
  END LOOP;
  FOR w IN SELECT value FROM jsonb_array_elements(work) LOOP
    c := w->>'text';
    shape := w->'shape';
    found := true;
    n := n + 1;
    alias := replace(shape->>'kind', '_', '-') || '#' || n;
    sub := "trellis"._semi_parse_sub(shape->>'sub', shape->>'kind' IN ('exists', 'not_exists'), ctes);
    -- GROUP BY: IN over the groups of its one selected expression (TPC-H Q18), kept with
    -- its HAVING: the part groups by it (and the correlation columns: the groups of a
    -- correlated subquery are those of its rows for one outer value).
    IF (jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL)
       AND NOT (shape->>'kind' IN ('in', 'not_in') AND jsonb_array_length(sub->'select') = 1
                AND jsonb_array_length(coalesce(sub->'group_by', '[]')) = 1
                AND "trellis"._semi_norm(sub->'group_by'->>0) IN (
                      "trellis"._semi_norm(sub->'select'->0->>'expr'),
                      "trellis"._semi_norm(coalesce(sub->'select'->0->>'label_expr', '')))) THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) has GROUP BY or HAVING: supported only for IN over the groups of the one expression it selects (SELECT x ... GROUP BY x HAVING ...)',
        shape->>'written', c));
    END IF;
    -- Its own semi-joins first, then what it reads.
    sub := "trellis"._semi_rewrite(sub - 'distinct', scope_ctes);
    IF ("trellis"._semi_probe(sub, scope_ctes, NULL, NULL)) IS NULL THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) reads a WITH query of a statement around it, or is otherwise not readable alone: not supported yet',
        shape->>'written', c));
    END IF;
    keys := '[]';
    nes := '[]';
    IF shape->>'kind' IN ('in', 'not_in') THEN
      IF jsonb_array_length(sub->'select') <> 1 THEN
        PERFORM "trellis"._fail('TRV01', format(
          'the subquery of %s (%s) selects %s columns: write one (a row compared with IN is not supported yet)',
          shape->>'written', c, jsonb_array_length(sub->'select')));
      END IF;
      item := sub->'select'->0;
      expr := CASE WHEN item->>'name' IS NULL AND item->>'bare_label' IS NOT NULL
                   THEN item->>'label_expr' ELSE item->>'expr' END;
      IF jsonb_array_length(coalesce(sub->'group_by', '[]')) = 0
         AND coalesce(("trellis"._semi_probe(sub, scope_ctes, expr, NULL)->>'has_aggs')::boolean, true) THEN
        PERFORM "trellis"._fail('TRV01', format(
          'the subquery of %s (%s) aggregates without GROUP BY (one row): a subquery of one row is not supported yet (scalar subqueries are a later slice)',
          shape->>'written', c));
      END IF;
      keys := keys || jsonb_build_array(jsonb_build_object('inner', expr, 'outer', shape->>'expr'));
    END IF;
    -- The subquery's conditions: its own (kept in the part), and those reading the statement
    -- around it (correlation), each an equality inner = outer (or inner <> outer).
    sub_conj := CASE WHEN sub->>'where' IS NULL THEN '{}' ELSE "trellis"._semi_conjuncts(sub->>'where') END;
    sub_kept := '{}';
    FOREACH expr IN ARRAY sub_conj LOOP
      IF "trellis"._semi_probe(sub, scope_ctes, NULL, expr) IS NOT NULL THEN
        sub_kept := sub_kept || ('(' || expr || ')');
        CONTINUE;
      END IF;
      toks := "trellis".grammar_tokenize(expr);
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
        lhs := "trellis".grammar_text(toks, 1, eq);
        rhs := "trellis".grammar_text(toks, eq + 1, array_length(toks, 1));
        IF "trellis"._semi_probe(sub, scope_ctes, lhs, NULL) IS NOT NULL
           AND "trellis"._semi_probe(sub, scope_ctes, rhs, NULL) IS NULL
           AND "trellis"._semi_probe(ast, outer_ctes, rhs, NULL) IS NOT NULL THEN
          NULL;
        ELSIF "trellis"._semi_probe(sub, scope_ctes, rhs, NULL) IS NOT NULL
           AND "trellis"._semi_probe(sub, scope_ctes, lhs, NULL) IS NULL
           AND "trellis"._semi_probe(ast, outer_ctes, lhs, NULL) IS NOT NULL THEN
          expr := lhs;
          lhs := rhs;
          rhs := expr;
        ELSE
          lhs := NULL;
        END IF;
      END IF;
      IF lhs IS NULL THEN
        PERFORM "trellis"._fail('TRV01', format(
          'the subquery of %s (%s) reads the statement around it in %s: a correlated condition must be an equality (or <>) of an expression of the subquery''s tables with one of the statement''s',
          shape->>'written', c, expr));
      END IF;
      IF toks[eq].text = '=' THEN
        keys := keys || jsonb_build_array(jsonb_build_object('inner', lhs, 'outer', rhs));
      ELSE
        nes := nes || jsonb_build_array(jsonb_build_object('inner', lhs, 'outer', rhs));
      END IF;
    END LOOP;
    -- 0044: uncorrelated (EXISTS): an existence part, below. Correlated only by <>: refused.
    IF jsonb_array_length(keys) = 0 AND jsonb_array_length(nes) > 0 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) is correlated only by <>, not by an equality with the statement around it: a correlated <> is supported only besides an equality (inner_column = outer_column)',
        shape->>'written', c));
    END IF;
    IF jsonb_array_length(nes) > 1 THEN
      PERFORM "trellis"._fail('TRV01', format(
        'the subquery of %s (%s) has more than one correlated <> condition: not supported',
        shape->>'written', c));
    END IF;
    -- NOT IN's NULLs: x NOT IN (SELECT col ...) is NULL (the row is left out) when col holds
    -- a NULL, or when x is NULL and the subquery has rows. Kept exactly only where neither
    -- can happen.
    -- 0044: kept exactly with existence parts (below) where either can, except over the
    -- groups of a GROUP BY (whether a group passes HAVING is not a fact of S's rows) or
    -- besides a correlated <>.
    nullable_inner := false;
    nullable_outer := false;
    IF shape->>'kind' = 'not_in' THEN
      nullable_inner := NOT "trellis"._semi_not_null(sub, keys->0->>'inner', sub_conj);
      nullable_outer := NOT "trellis"._semi_not_null(ast, keys->0->>'outer', conjuncts);
      IF (nullable_inner OR nullable_outer)
         AND (jsonb_array_length(coalesce(sub->'group_by', '[]')) > 0 OR sub->>'having' IS NOT NULL
              OR jsonb_array_length(nes) > 0) THEN
        IF nullable_inner THEN
          PERFORM "trellis"._fail('TRV01', format(
            '%s (%s): its subquery''s column %s can be NULL, and one NULL there makes the condition NULL for every row it does not match; kept exactly for a subquery of rows, not over the groups of a GROUP BY or besides a correlated <>: add WHERE %s IS NOT NULL to the subquery (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE %s = %s)',
            shape->>'written', c, keys->0->>'inner', keys->0->>'inner', keys->0->>'inner', keys->0->>'outer'));
        END IF;
        PERFORM "trellis"._fail('TRV01', format(
          '%s (%s): %s can be NULL, and a NULL there makes the condition NULL when the subquery has rows and true when it has none; kept exactly for a subquery of rows, not over the groups of a GROUP BY or besides a correlated <>: add AND %s IS NOT NULL to WHERE (or declare the column NOT NULL), or write NOT EXISTS (SELECT 1 FROM ... WHERE column = %s)',
          shape->>'written', c, keys->0->>'outer', keys->0->>'outer', keys->0->>'outer'));
      END IF;
    END IF;
    base_kept := sub_kept;
    -- 0044: uncorrelated EXISTS / NOT EXISTS: one existence part, at most one row.
    IF jsonb_array_length(keys) = 0 THEN
      made := "trellis"._semi_exists_part(sub, base_kept, '[]', alias);
      joins := joins || jsonb_build_array(made->'join');
      ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(made->'part'));
      cond := format('%I.%I IS %sNULL', alias, 'key#1',
        CASE WHEN shape->>'kind' = 'exists' THEN 'NOT ' ELSE '' END);
    ELSE
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
        cond := CASE WHEN shape->>'kind' IN ('exists', 'in') THEN rhs ELSE 'NOT ' || rhs END;
      ELSE
        cond := format('%I.%I IS %sNULL', alias, 'key#1',
          CASE WHEN shape->>'kind' IN ('exists', 'in') THEN 'NOT ' ELSE '' END);
      END IF;
      -- 0044: NOT IN over nullable values: TRUE iff the subquery (for this row's correlation
      -- values) is empty, or x is not NULL, matches nothing, and the subquery holds no NULL.
      corr := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(keys) WITH ORDINALITY AS y(x, o)
                         WHERE o > 1), '[]');
      IF nullable_inner THEN
        made := "trellis"._semi_exists_part(sub, base_kept || ('(' || (keys->0->>'inner') || ') IS NULL'),
          corr, 'nulls#' || n);
        joins := joins || jsonb_build_array(made->'join');
        ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(made->'part'));
        cond := cond || format(' AND %I.%I IS NULL', 'nulls#' || n, 'key#1');
      END IF;
      IF nullable_outer THEN
        made := "trellis"._semi_exists_part(sub, base_kept || ('(' || (keys->0->>'inner') || ') IS NOT NULL'),
          corr, 'values#' || n);
        joins := joins || jsonb_build_array(made->'join');
        ast := ast || jsonb_build_object('parts', coalesce(ast->'parts', '[]') || jsonb_build_array(made->'part'));
        cond := cond || format(' AND ((%s) IS NOT NULL OR %I.%I IS NULL)', keys->0->>'outer', 'values#' || n, 'key#1');
      END IF;
    END IF;
    -- 0044: AND-ed at the top, or in its place among an OR's terms.
    IF w ? 'grp' THEN
      grps := jsonb_set(grps, ARRAY[w->>'grp', w->>'term'], to_jsonb('(' || cond || ')'));
    ELSE
      conds := conds || cond;
    END IF;
  END LOOP;
  -- 0044: each OR, its forms' conditions in their places.
  conds := conds || ARRAY(SELECT '(' || (SELECT string_agg(t, ' OR ' ORDER BY o2)
                                           FROM jsonb_array_elements_text(g) WITH ORDINALITY AS z(t, o2)) || ')'
                            FROM jsonb_array_elements(grps) WITH ORDINALITY AS y(g, o) ORDER BY o);
  IF NOT found THEN
    RETURN ast;
  END IF;
  RETURN ast || jsonb_build_object(
    'joins', joins, 'where', array_to_string(kept || conds, ' AND '),
    'semi_where', ast->>'where');
END
$fn$;

-- Scalar subqueries in the WHERE, HAVING or SELECT list of a derived table or WITH query
-- (TPC-H Q22: `c_acctbal > (SELECT avg(c_acctbal) ...)` inside its FROM's subquery): each
-- part's statement gets _scalar_subqueries (ADR 0058) before it is defined, as the
-- statement around it does; its comma joins first, as there. A part without one, or
-- reading a WITH query of the statement around it, is as before. Renamed and wrapped:
-- _define_parts (0041) -> _define_parts_before_notin.
ALTER FUNCTION "trellis"._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_before_notin;

CREATE FUNCTION "trellis"._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ? 'parts' THEN
    ast := ast || jsonb_build_object('parts', (
      SELECT jsonb_agg(CASE WHEN p ? 'ast' AND NOT (p->'ast') ? 'union' AND NOT (p->'ast') ? 'scalars'
                             -- not one reading a WITH query of the statement around it (Postgres
                             -- cannot read it alone): refused as before, "a subquery in WHERE"
                             AND NOT EXISTS (
                               SELECT 1 FROM jsonb_array_elements(jsonb_build_array(p->'ast'->'from')
                                                                  || coalesce(p->'ast'->'joins', '[]')) i
                                WHERE i->>'part_kind' = 'cte'
                                  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(p->'ast'->'parts', '[]')) q
                                                   WHERE q->>'kind' = 'cte' AND q->>'name' = i->>'part'))
                             AND (coalesce(p->'ast'->>'where', '') ~* '\(\s*(select|with)\M'
                                  OR coalesce(p->'ast'->>'having', '') ~* '\(\s*(select|with)\M'
                                  OR EXISTS (SELECT 1 FROM jsonb_array_elements(p->'ast'->'select') i
                                              WHERE i->>'expr' ~* '\(\s*(select|with)\M'))
                            THEN p || jsonb_build_object('ast',
                                   "trellis"._scalar_subqueries("trellis"._comma_joins(p->'ast')))
                            ELSE p END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN "trellis"._define_parts_before_notin(ast, root, path, scope);
END
$fn$;
$trellis_m44$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 45) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (45, 'top_n', false);
    EXECUTE $trellis_m45$-- DISTINCT ON in a view's SQL (issue #26, item 1; ADR 0065):
--
--   TRANSFORM name AS SELECT DISTINCT ON (p1, p2, ...) item, ... FROM ... [WHERE ...]
--     ORDER BY p1, p2, ..., o1 [ASC | DESC] [NULLS FIRST | LAST], ...
--
-- at the top of the statement and as the SELECT of a derived table or a WITH query. It is
-- kept as the GROUP BY of its DISTINCT ON expressions (a group is a partition, recomputed
-- whole from its current rows when a row of it changes, as any GROUP BY is: ADR 0006),
-- each other item the value of the partition's first row:
--
--   (array_agg((item) ORDER BY o1 ..., <every item, ascending>))[1]
--
-- Ties in the ORDER BY are broken by the selected items, in order (ascending, NULLS LAST):
-- the row kept is the one Postgres keeps for the statement with those items appended to its
-- ORDER BY, so the target is a function of the rows (Postgres's own choice among ties is
-- arbitrary). An ORDER BY is required (without one the row kept is arbitrary); positions
-- (ORDER BY 2) and output names are refused or resolved as noted in _topn_rewrite.
--
-- Top-N per partition: a derived table whose SELECT list ranks its rows with row_number(),
-- rank() or dense_rank() OVER (PARTITION BY ... ORDER BY ...), read by a SELECT whose WHERE
-- keeps ranks up to k, is kept as the derived table's tables joined with a GROUP BY part
-- holding each partition's top k (_topn_rewrite_window, applied by _define through
-- _topn_bind). Every other window function stays refused, now naming the function.
--
-- Renamed here and wrapped (statements without DISTINCT ON go straight through, so whichever
-- migration wrote them last stays in force): grammar_parse_block -> grammar_parse_block_before_topn,
-- _render_view_block -> _render_view_block_before_topn, render_statement ->
-- render_statement_before_topn, _analyze_transform -> _analyze_before_topn, _define ->
-- _define_before_topn.

ALTER FUNCTION "trellis".grammar_parse_block("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_topn;
ALTER FUNCTION "trellis"._render_view_block(jsonb) RENAME TO _render_view_block_before_topn;
ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO render_statement_before_topn;
ALTER FUNCTION "trellis"._analyze_transform(jsonb) RENAME TO _analyze_before_topn;
ALTER FUNCTION "trellis"._define(jsonb, text) RENAME TO _define_before_topn;

-- A window function whose OVER is token k: refused, naming it. Returns when token k is no
-- OVER of a function call.
CREATE FUNCTION "trellis"._topn_refuse_window(toks "trellis".grammar_token[], k int)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  fn text;
BEGIN
  IF NOT "trellis".grammar_kw(toks[k], 'over') OR k < 2
     OR NOT (toks[k - 1].kind = 'punct' AND toks[k - 1].text = ')') THEN
    RETURN;
  END IF;
  -- The function's name: the token before the "(" that the ")" before OVER closes.
  FOR j IN REVERSE k - 1 .. 1 LOOP
    IF toks[j].kind = 'punct' AND toks[j].text = ')' THEN
      d := d + 1;
    ELSIF toks[j].kind = 'punct' AND toks[j].text = '(' THEN
      d := d - 1;
      IF d = 0 THEN
        fn := CASE WHEN j > 1 THEN coalesce(toks[j - 1].value, toks[j - 1].text) END;
        EXIT;
      END IF;
    END IF;
  END LOOP;
  PERFORM "trellis".grammar_refuse(format(
    'a window function (%s() OVER ...) is not supported yet%s', coalesce(fn, '?'),
    CASE WHEN fn IN ('row_number', 'rank', 'dense_rank')
      THEN ': top-N is kept as SELECT ... FROM (SELECT ..., ' || fn || '() OVER (PARTITION BY ... ORDER BY ...) AS rn FROM ...) s WHERE rn <= k, or as SELECT DISTINCT ON (...) ... ORDER BY ...'
      ELSE '' END), toks[k].pos);
END
$fn$;

-- ORDER BY items from token i, up to a token that ends them (anything but ","): each
-- {expr, dir} (dir: ASC/DESC and NULLS FIRST/LAST as written, or null).
CREATE FUNCTION "trellis"._topn_order_items(toks "trellis".grammar_token[], k int, what text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  e int;
  c int;
  order_ jsonb := '[]';
BEGIN
  LOOP
    e := "trellis".grammar_scan(toks, k);
    IF e = k THEN
      PERFORM "trellis".grammar_unexpected(toks, k, 'an ORDER BY expression');
    END IF;
    c := e;
    IF c - 2 > k AND "trellis".grammar_kw(toks[c - 2], 'nulls')
       AND ("trellis".grammar_kw(toks[c - 1], 'first') OR "trellis".grammar_kw(toks[c - 1], 'last')) THEN
      c := c - 2;
    END IF;
    IF c - 1 > k AND ("trellis".grammar_kw(toks[c - 1], 'asc') OR "trellis".grammar_kw(toks[c - 1], 'desc')) THEN
      c := c - 1;
    END IF;
    FOR j IN k .. c - 1 LOOP
      IF "trellis".grammar_kw(toks[j], 'using') THEN
        PERFORM "trellis".grammar_refuse(format('ORDER BY ... USING is not supported with %s: write ASC or DESC', what), toks[j].pos);
      END IF;
    END LOOP;
    IF c = k + 1 AND toks[k].kind = 'number' THEN
      PERFORM "trellis".grammar_refuse(format(
        'ORDER BY a position (ORDER BY 2) is not supported with %s: write the expression', what), toks[k].pos);
    END IF;
    order_ := order_ || jsonb_build_array(jsonb_build_object(
      'expr', "trellis".grammar_text(toks, k, c),
      'dir', CASE WHEN c < e THEN "trellis".grammar_text(toks, c, e) END));
    k := e;
    EXIT WHEN NOT (toks[k].kind = 'punct' AND toks[k].text = ',');
    k := k + 1;
  END LOOP;
  RETURN order_;
END
$fn$;

-- A ranking window item of a SELECT list, tokens a .. b-1:
--   row_number() | rank() | dense_rank() OVER (PARTITION BY e, ... ORDER BY o, ...) [AS] name
-- as {fn, name, partition, order_by, expr (as written)}, or NULL when it is not one.
-- Refuses what is one but not kept: no name, no PARTITION BY or ORDER BY, a frame.
CREATE FUNCTION "trellis"._topn_window_item(toks "trellis".grammar_token[], a int, b int)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  c int;
  k int;
  e int;
  nm text;
  sub "trellis".grammar_token[];
  part_ jsonb := '[]';
  order_ jsonb := '[]';
BEGIN
  IF NOT (toks[a].kind = 'word' AND toks[a].value IN ('row_number', 'rank', 'dense_rank')
          AND toks[a + 1].text = '(' AND toks[a + 2].text = ')'
          AND "trellis".grammar_kw(toks[a + 3], 'over') AND toks[a + 4].text = '(') THEN
    RETURN NULL;
  END IF;
  c := a + 4;
  LOOP
    IF c >= b THEN
      RETURN NULL;
    ELSIF toks[c].kind = 'punct' AND toks[c].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[c].kind = 'punct' AND toks[c].text IN (')', ']') THEN
      d := d - 1;
      EXIT WHEN d = 0;
    END IF;
    c := c + 1;
  END LOOP;
  IF c + 1 = b THEN
    PERFORM "trellis".grammar_refuse(format(
      'name the %s() column (AS rn): the statement around it filters on it', toks[a].value), toks[a].pos);
  ELSIF "trellis".grammar_kw(toks[c + 1], 'as') AND c + 3 = b THEN
    nm := "trellis".grammar_name(toks[c + 2], 'a column name after AS', false);
  ELSIF c + 2 = b THEN
    nm := "trellis".grammar_name(toks[c + 1], 'a column name', false);
  ELSE
    RETURN NULL;
  END IF;
  sub := toks[a + 5 : c - 1] || ROW('eof', '', '', toks[c].pos)::"trellis".grammar_token;
  k := 1;
  IF "trellis".grammar_kw(sub[k], 'partition') AND "trellis".grammar_kw(sub[k + 1], 'by') THEN
    k := k + 2;
    LOOP
      e := "trellis".grammar_scan(sub, k);
      IF e = k THEN
        PERFORM "trellis".grammar_unexpected(sub, k, 'a PARTITION BY expression');
      END IF;
      part_ := part_ || to_jsonb("trellis".grammar_text(sub, k, e));
      k := e;
      EXIT WHEN NOT (sub[k].kind = 'punct' AND sub[k].text = ',');
      k := k + 1;
    END LOOP;
  ELSE
    PERFORM "trellis".grammar_refuse(format(
      'a window function (%s() OVER) without PARTITION BY is not supported yet: top-N is kept per partition', toks[a].value),
      toks[a + 3].pos);
  END IF;
  IF NOT ("trellis".grammar_kw(sub[k], 'order') AND "trellis".grammar_kw(sub[k + 1], 'by')) THEN
    PERFORM "trellis".grammar_refuse(format(
      'a window function (%s() OVER) without ORDER BY is not supported: the rank would be arbitrary', toks[a].value), toks[a + 3].pos);
  END IF;
  order_ := "trellis"._topn_order_items(sub, k + 2, toks[a].value || '()');
  k := 1;
  WHILE sub[k].kind <> 'eof' LOOP
    k := k + 1;
  END LOOP;
  -- _topn_order_items stops at the first token that is not part of an item.
  e := 1;
  FOR j IN 1 .. k LOOP
    IF sub[j].kind = 'word' AND sub[j].value IN ('rows', 'range', 'groups') THEN
      PERFORM "trellis".grammar_refuse(format('a window frame (%s ...) is not supported', upper(sub[j].value)), sub[j].pos);
    ELSIF sub[j].kind = 'word' AND sub[j].value = 'exclude' THEN
      PERFORM "trellis".grammar_refuse('a window frame exclusion (EXCLUDE ...) is not supported', sub[j].pos);
    END IF;
  END LOOP;
  RETURN jsonb_build_object('fn', toks[a].value, 'name', nm, 'partition', part_, 'order_by', order_,
    'expr', "trellis".grammar_text(toks, a, c + 1), 'position', toks[a].pos);
END
$fn$;

-- A view's SELECT block at token i (grammar_parse_block_before_topn), and:
--  * a ranking window item of its SELECT list (_topn_window_item) read here and taken out
--    of the list the block parser reads; the AST gains `window` ({fn, name, partition,
--    order_by, expr, index: its place in the list}). Kept only as a derived table whose
--    statement filters the rank (_topn_bind, when defined). Every other window function
--    (OVER) in the block is refused, naming it.
--  * SELECT DISTINCT ON (exprs) read here, the rest of the block read without those tokens,
--    and its ORDER BY (which the block parser drops) kept as `order_by`: [{expr, dir}]. The
--    AST gains `distinct_on` (the expressions, as written).
CREATE FUNCTION "trellis".grammar_parse_block(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  sel int;
  close_ int;
  e int;
  eof_at int;
  on_ jsonb := '[]';
  order_ jsonb := '[]';
  ast jsonb;
  sub "trellis".grammar_token[];
  win jsonb;
  w jsonb;
  win_over int;
  item_start int;
  n_items int := 0;
  cut_a int;
  cut_b int;
BEGIN
  -- The block's SELECT keyword (after its WITH queries, outside brackets) and its end.
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND sel IS NULL AND "trellis".grammar_kw(toks[k], 'select') THEN
      sel := k;
    END IF;
    k := k + 1;
  END LOOP;
  eof_at := k;

  -- The SELECT list's items (top level, up to FROM): a ranking window item among them.
  IF sel IS NOT NULL THEN
    d := 0;
    k := sel + 1;
    item_start := k;
    LOOP
      IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
        d := d + 1;
      ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
        d := d - 1;
      ELSIF toks[k].kind = 'eof' OR (d = 0 AND ((toks[k].kind = 'punct' AND toks[k].text = ',')
                                              OR "trellis".grammar_kw(toks[k], 'from'))) THEN
        w := "trellis"._topn_window_item(toks, item_start, k);
        IF w IS NOT NULL THEN
          IF win IS NOT NULL THEN
            PERFORM "trellis".grammar_refuse('two ranking window functions in one SELECT are not supported', toks[item_start].pos);
          END IF;
          win := w || jsonb_build_object('index', n_items);
          win_over := item_start + 3;
          IF toks[k].kind = 'punct' AND toks[k].text = ',' THEN
            cut_a := item_start;
            cut_b := k + 1;
          ELSE
            cut_a := item_start - 1;
            cut_b := k;
          END IF;
        END IF;
        n_items := n_items + 1;
        EXIT WHEN NOT (toks[k].kind = 'punct' AND toks[k].text = ',');
        item_start := k + 1;
      END IF;
      k := k + 1;
    END LOOP;
  END IF;

  -- Every other OVER in the block (outside its subqueries, which are blocks of their own).
  d := 0;
  k := i;
  WHILE k < eof_at LOOP
    IF toks[k].kind = 'punct' AND toks[k].text = '('
       AND ("trellis".grammar_kw(toks[k + 1], 'select') OR "trellis".grammar_kw(toks[k + 1], 'with')) THEN
      d := 0;
      LOOP
        IF toks[k].kind = 'punct' AND toks[k].text = '(' THEN
          d := d + 1;
        ELSIF toks[k].kind = 'punct' AND toks[k].text = ')' THEN
          d := d - 1;
          EXIT WHEN d = 0;
        END IF;
        EXIT WHEN toks[k].kind = 'eof';
        k := k + 1;
      END LOOP;
    ELSIF k IS DISTINCT FROM win_over THEN
      PERFORM "trellis"._topn_refuse_window(toks, k);
    END IF;
    k := k + 1;
  END LOOP;

  IF win IS NOT NULL THEN
    IF n_items = 1 THEN
      PERFORM "trellis".grammar_refuse('a SELECT of nothing but a rank is not supported: select the columns ranked too',
        (win ->> 'position')::int);
    END IF;
    IF "trellis".grammar_kw(toks[sel + 1], 'distinct') THEN
      PERFORM "trellis".grammar_refuse(format('%s() OVER with DISTINCT is not supported', win ->> 'fn'), toks[sel + 1].pos);
    END IF;
    toks := toks[1 : cut_a - 1] || toks[cut_b :];
    ast := "trellis".grammar_parse_block_before_topn(toks, i, target, ctes);
    IF jsonb_array_length(coalesce(ast -> 'group_by', '[]')) > 0 OR ast ->> 'having' IS NOT NULL THEN
      PERFORM "trellis".grammar_refuse(format('%s() OVER with GROUP BY or HAVING is not supported yet', win ->> 'fn'),
        (win ->> 'position')::int);
    END IF;
    RETURN ast || jsonb_build_object('window', win);
  END IF;

  IF sel IS NULL OR NOT "trellis".grammar_kw(toks[sel + 1], 'distinct')
     OR NOT "trellis".grammar_kw(toks[sel + 2], 'on') THEN
    RETURN "trellis".grammar_parse_block_before_topn(toks, i, target, ctes);
  END IF;
  IF NOT (toks[sel + 3].kind = 'punct' AND toks[sel + 3].text = '(') THEN
    PERFORM "trellis".grammar_unexpected(toks, sel + 3, '"(" and the DISTINCT ON expressions');
  END IF;
  -- The ")" closing the list; the expressions between, split at top-level commas.
  d := 0;
  k := sel + 3;
  LOOP
    IF toks[k].kind = 'eof' THEN
      PERFORM "trellis".grammar_unexpected(toks, k, '")" after the DISTINCT ON expressions');
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
      EXIT WHEN d = 0;
    END IF;
    k := k + 1;
  END LOOP;
  close_ := k;
  sub := toks[sel + 4 : close_ - 1] || ROW('eof', '', '', toks[close_].pos)::"trellis".grammar_token;
  k := 1;
  LOOP
    e := "trellis".grammar_scan(sub, k);
    IF e = k THEN
      PERFORM "trellis".grammar_unexpected(sub, k, 'a DISTINCT ON expression');
    END IF;
    on_ := on_ || to_jsonb("trellis".grammar_text(sub, k, e));
    k := e;
    EXIT WHEN NOT (sub[k].kind = 'punct' AND sub[k].text = ',');
    k := k + 1;
  END LOOP;
  IF sub[k].kind <> 'eof' THEN
    PERFORM "trellis".grammar_unexpected(sub, k, '"," or ")" after a DISTINCT ON expression');
  END IF;

  -- ORDER BY at the block's top level: its items, each split into its expression and
  -- direction.
  d := 0;
  k := close_ + 1;
  WHILE k < eof_at LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND "trellis".grammar_kw(toks[k], 'order') AND "trellis".grammar_kw(toks[k + 1], 'by') THEN
      order_ := "trellis"._topn_order_items(toks, k + 2, 'DISTINCT ON');
      EXIT;
    END IF;
    k := k + 1;
  END LOOP;
  IF jsonb_array_length(order_) = 0 THEN
    PERFORM "trellis".grammar_refuse(
      'DISTINCT ON without ORDER BY is not supported: the row kept would be arbitrary (add ORDER BY the DISTINCT ON expressions, then the order within each)',
      toks[sel + 1].pos);
  END IF;

  ast := "trellis".grammar_parse_block_before_topn(toks[1 : sel] || toks[close_ + 1 :], i, target, ctes);
  IF jsonb_array_length(coalesce(ast -> 'group_by', '[]')) > 0 OR ast ->> 'having' IS NOT NULL THEN
    PERFORM "trellis".grammar_refuse('DISTINCT ON with GROUP BY or HAVING is not supported yet', toks[sel + 1].pos);
  END IF;
  IF coalesce((ast ->> 'distinct')::boolean, false) THEN
    PERFORM "trellis".grammar_unexpected(toks, sel + 1, 'one DISTINCT');
  END IF;
  RETURN ast || jsonb_build_object('distinct_on', on_, 'order_by', order_);
END
$fn$;

-- The ORDER BY of a DISTINCT ON AST as written.
CREATE FUNCTION "trellis"._topn_order_sql(ast jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT string_agg((o ->> 'expr') || coalesce(' ' || (o ->> 'dir'), ''), ', ' ORDER BY n)
    FROM jsonb_array_elements(ast -> 'order_by') WITH ORDINALITY AS x(o, n)
$fn$;

-- A view's SELECT block as written: a DISTINCT ON one with DISTINCT ON and its ORDER BY
-- (its GROUP BY is the engine's), every other as before.
CREATE FUNCTION "trellis"._render_view_block(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  plain jsonb;
  full_ text;
  body text;
BEGIN
  -- A top-N derived table (rewritten by _topn_bind) as written.
  IF ast ? 'topn_written' THEN
    ast := ast -> 'topn_written';
  END IF;
  IF ast ? 'window' THEN
    RETURN "trellis"._render_view_block_before_topn((ast - 'window') || jsonb_build_object('select', (
      SELECT jsonb_agg(x ORDER BY o) FROM (
        SELECT i AS x, CASE WHEN o0 - 1 < (ast -> 'window' ->> 'index')::int THEN o0 ELSE o0 + 1 END AS o
          FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY AS y(i, o0)
        UNION ALL
        SELECT jsonb_build_object('expr', ast -> 'window' ->> 'expr', 'name', ast -> 'window' ->> 'name'),
               (ast -> 'window' ->> 'index')::int + 1) z)));
  END IF;
  IF NOT ast ? 'distinct_on' THEN
    RETURN "trellis"._render_view_block_before_topn(ast);
  END IF;
  plain := ast - 'distinct_on' - 'order_by' || jsonb_build_object('group_by', '[]'::jsonb);
  full_ := "trellis"._render_view_block_before_topn(plain);
  -- The block without its WITH queries starts with SELECT: what precedes it is the WITH.
  body := "trellis"._render_view_block_before_topn(plain || jsonb_build_object('parts', coalesce((
    SELECT jsonb_agg(p ORDER BY o) FROM jsonb_array_elements(plain -> 'parts') WITH ORDINALITY AS x(p, o)
     WHERE p ->> 'kind' <> 'cte'), '[]')));
  RETURN left(full_, length(full_) - length(body))
    || 'SELECT DISTINCT ON (' || (SELECT string_agg(e, ', ' ORDER BY n)
                                   FROM jsonb_array_elements_text(ast -> 'distinct_on') WITH ORDINALITY AS x(e, n)) || ') '
    || substr(body, length('SELECT ') + 1)
    || ' ORDER BY ' || "trellis"._topn_order_sql(ast);
END
$fn$;

-- render_statement (whichever migration wrote it last); a view's SQL whose top SELECT is a
-- DISTINCT ON, as written.
CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast ? 'distinct_on' THEN
    RETURN "trellis".render_statement_before_topn(ast);
  END IF;
  ast := "trellis"._semi_as_written(ast);
  RETURN 'TRANSFORM ' || "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
    || ' AS ' || "trellis"._render_view_select(ast)
    || CASE WHEN (ast ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;

-- A DISTINCT ON AST as the GROUP BY that keeps it: the DISTINCT ON expressions grouped,
-- each item that is not one of them the value of the partition's first row by the ORDER
-- BY, ties broken by the items in order. Postgres reads the statement as written first
-- (DISTINCT ON's expressions must lead its ORDER BY; names; types), and names the columns:
-- each item keeps the name Postgres gives it. An ORDER BY naming an output column (an
-- item's alias) orders by that item's expression, as Postgres does.
CREATE FUNCTION "trellis"._topn_rewrite(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := "trellis"._view_from_sql(ast);
  where_sql text := coalesce(' WHERE (' || (ast ->> 'where') || ')', '');
  on_list text := (SELECT string_agg(e, ', ' ORDER BY n)
                     FROM jsonb_array_elements_text(ast -> 'distinct_on') WITH ORDINALITY AS x(e, n));
  info jsonb;
  item jsonb;
  k int := 0;
  core text;
  cores text[] := '{}';
  names text[] := '{}';
  col jsonb;
  orders text[] := '{}';
  o jsonb;
  oexpr text;
  agg_order text;
  items jsonb := '[]';
BEGIN
  info := "trellis"._analyze_query('SELECT DISTINCT ON (' || on_list || ') '
    || (SELECT string_agg((i ->> 'expr') || coalesce(' AS ' || quote_ident(i ->> 'name'), ''), ', ' ORDER BY n)
          FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY AS x(i, n))
    || ' FROM ' || from_sql || where_sql || ' ORDER BY ' || "trellis"._topn_order_sql(ast),
    'in the definition');
  FOR item IN SELECT value FROM jsonb_array_elements(ast -> 'select') LOOP
    k := k + 1;
    col := info -> 'columns' -> (k - 1);
    core := item ->> 'expr';
    IF item ->> 'name' IS NULL AND item ->> 'bare_label' IS NOT NULL
       AND col ->> 'name' = item ->> 'bare_label' THEN
      core := item ->> 'label_expr';
    END IF;
    IF (SELECT t.typcategory = 'A' FROM pg_type t WHERE t.oid = (col ->> 'type_oid')::oid)
       AND NOT core = ANY (ARRAY(SELECT jsonb_array_elements_text(ast -> 'distinct_on'))) THEN
      PERFORM "trellis"._fail('TRV01', format(
        'DISTINCT ON with a column of an array type (%s, %s) is not supported yet', col ->> 'name', col ->> 'type'));
    END IF;
    cores := cores || core;
    names := names || (col ->> 'name');
  END LOOP;
  FOR o IN SELECT value FROM jsonb_array_elements(ast -> 'order_by') LOOP
    oexpr := o ->> 'expr';
    -- An output column's name orders by its item (Postgres looks there first).
    FOR n IN 1 .. cardinality(names) LOOP
      IF quote_ident(names[n]) = oexpr OR (names[n] = oexpr AND names[n] = lower(names[n])) THEN
        oexpr := cores[n];
        EXIT;
      END IF;
    END LOOP;
    orders := orders || ('(' || oexpr || ')' || coalesce(' ' || (o ->> 'dir'), ''));
  END LOOP;
  agg_order := array_to_string(orders || ARRAY(SELECT '(' || c || ')' FROM unnest(cores) AS c), ', ');
  FOR n IN 1 .. cardinality(cores) LOOP
    items := items || jsonb_build_array(jsonb_build_object(
      'expr', CASE WHEN cores[n] = ANY (ARRAY(SELECT jsonb_array_elements_text(ast -> 'distinct_on')))
                   THEN cores[n]
                   ELSE format('(array_agg((%s) ORDER BY %s))[1]', cores[n], agg_order) END,
      'name', names[n], 'position', (ast -> 'select' -> (n - 1)) -> 'position'));
  END LOOP;
  RETURN (ast - 'distinct_on' - 'order_by')
    || jsonb_build_object('select', items, 'group_by', ast -> 'distinct_on');
END
$fn$;

-- The analysis (whichever migration wrote it last), of a DISTINCT ON's GROUP BY; the AST
-- it keeps is the statement as written (its items, DISTINCT ON, ORDER BY), with the GROUP
-- BY the drain reads.
CREATE FUNCTION "trellis"._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  spec jsonb;
  dropped text[];
BEGIN
  -- A ranking item not made top-N (_topn_bind; a path defining without it): refused, never
  -- dropped.
  IF ast ? 'window' THEN
    PERFORM "trellis"._topn_bind(ast);
  END IF;
  IF ast ? 'topn_written' THEN
    -- A top-N derived table: the part of the partition's top k matches a row on its whole
    -- key (the partition), at most one, so it adds nothing to the key; its key stays a
    -- column, where a change to a partition's top k finds the rows holding it.
    spec := "trellis"._analyze_before_topn(ast);
    dropped := ARRAY(SELECT c->>'name' FROM jsonb_array_elements(spec->'columns') c
                      WHERE (c->>'implicit')::boolean AND (c->>'is_key')::boolean
                        AND (c->'plain'->>'source')::int = jsonb_array_length(ast->'joins'));
    spec := spec || jsonb_build_object(
      'columns', (SELECT jsonb_agg(CASE WHEN c->>'name' = ANY (dropped) THEN c || '{"is_key": false}' ELSE c END ORDER BY o)
                    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o)),
      'key', (SELECT coalesce(jsonb_agg(k ORDER BY o), '[]') FROM jsonb_array_elements_text(spec->'key') WITH ORDINALITY AS x(k, o)
               WHERE NOT (k = ANY (dropped))));
    RETURN spec || jsonb_build_object('key_nullable', EXISTS (
      SELECT 1 FROM jsonb_array_elements(spec->'columns') c
       WHERE (c->>'is_key')::boolean AND NOT (c->>'notnull')::boolean));
  END IF;
  IF NOT ast ? 'distinct_on' THEN
    RETURN "trellis"._analyze_before_topn(ast);
  END IF;
  spec := "trellis"._analyze_before_topn("trellis"._topn_rewrite(ast));
  RETURN spec || jsonb_build_object('ast', (spec -> 'ast') || jsonb_build_object(
    'select', ast -> 'select', 'distinct_on', ast -> 'distinct_on', 'order_by', ast -> 'order_by',
    'group_by', ast -> 'distinct_on'));
END
$fn$;

-- The first k distinct elements of an array, in order (dense_rank's top values).
CREATE FUNCTION "trellis"._topn_distinct_prefix(a text[], k int)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
  res text[] := '{}';
  v text;
BEGIN
  FOREACH v IN ARRAY coalesce(a, '{}') LOOP
    IF array_position(res, v) IS NULL THEN
      EXIT WHEN cardinality(res) >= k;
      res := res || v;
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;

-- The bound k of a top-N: in `where` (the statement around a derived table `alias` with a
-- rank column `rn`), a conjunct `[alias.]rn <= k`, `< k` or `= 1` (k a whole number);
-- NULL when there is none.
CREATE FUNCTION "trellis"._topn_bound(where_ text, alias text, rn text)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  c text;
  t "trellis".grammar_token[];
  k int;
  n int;
  best int;
BEGIN
  IF where_ IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH c IN ARRAY "trellis"._split_conjuncts(where_) LOOP
    t := "trellis".grammar_tokenize(c);
    k := 1;
    IF t[2].kind = 'punct' AND t[2].text = '.' THEN
      CONTINUE WHEN t[1].value IS DISTINCT FROM alias;
      k := 3;
    END IF;
    CONTINUE WHEN t[k].value IS DISTINCT FROM rn OR t[k].kind NOT IN ('word', 'ident');
    CONTINUE WHEN t[k + 2].kind <> 'number' OR t[k + 3].kind <> 'eof' OR t[k + 2].text !~ '^[0-9]+$';
    n := t[k + 2].text::int;
    n := CASE t[k + 1].text WHEN '<=' THEN n WHEN '<' THEN n - 1 WHEN '=' THEN CASE WHEN n = 1 THEN 1 END END;
    IF n IS NOT NULL AND n >= 1 AND (best IS NULL OR n < best) THEN
      best := n;
    END IF;
  END LOOP;
  RETURN best;
END
$fn$;

-- A derived table ranking its rows (`window`), read by a statement that keeps the ranks up
-- to k, as what keeps it: the table's rows joined with a part, grouped by the partition,
-- holding the partition's top k (row_number: the rows' keys, ties by the key; rank and
-- dense_rank: the order values), each row's rank its place there:
--
--   SELECT items, array_position(topn."trellis#top", probe) AS rn
--     FROM t JOIN (SELECT p AS "trellis#p1", (array_agg(probe ORDER BY o, key))[1:k] AS "trellis#top"
--                    FROM t WHERE w GROUP BY p) topn ON topn."trellis#p1" = p
--    WHERE w AND array_position(topn."trellis#top", probe) IS NOT NULL
--
-- (probe: ROW(key)::text for row_number, ROW(o1, o2, ...)::text for rank and dense_rank).
CREATE FUNCTION "trellis"._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  win jsonb := pa -> 'window';
  fn text := win ->> 'fn';
  rel regclass;
  alias text;
  keys text[];
  probe text;
  ord text;
  top text;
  on_ text;
  g jsonb;
  items jsonb;
  rank_expr text;
  item jsonb;
  one text[];
BEGIN
  keys := '{}';
  -- The key of every table in FROM (a join's rows are ranked by all of them).
  FOR item IN SELECT x FROM (SELECT pa -> 'from' AS x, 0 AS o
                             UNION ALL
                             SELECT j, o FROM jsonb_array_elements(coalesce(pa -> 'joins', '[]')) WITH ORDINALITY AS y(j, o)) z
               ORDER BY o LOOP
    IF item ? 'part' THEN
      PERFORM "trellis"._fail('TRV01', format(
        '%s() OVER over a subquery or a WITH query is not supported yet: rank the rows of tables', fn));
    END IF;
    rel := to_regclass("trellis".grammar_render_name(item ->> 'schema', item ->> 'name'));
    IF rel IS NULL THEN
      PERFORM "trellis"._fail('TRV01', format('in the definition: relation %s does not exist',
        "trellis".grammar_render_name(item ->> 'schema', item ->> 'name')));
    END IF;
    alias := quote_ident(coalesce(item ->> 'alias', item ->> 'name'));
    one := ARRAY(SELECT alias || '.' || quote_ident(a.attname)
                   FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS u(attnum, n)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum
                  WHERE i.indrelid = rel AND i.indisprimary ORDER BY u.n);
    IF cardinality(one) = 0 THEN
      PERFORM "trellis"._fail('TRV01', format('%s() OVER needs a primary key on %s (its rows are ranked by it)', fn, rel));
    END IF;
    keys := keys || one;
  END LOOP;
  ord := (SELECT string_agg('(' || (o ->> 'expr') || ')' || coalesce(' ' || (o ->> 'dir'), ''), ', ' ORDER BY n)
            FROM jsonb_array_elements(win -> 'order_by') WITH ORDINALITY AS x(o, n));
  IF fn = 'row_number' THEN
    probe := 'ROW(' || array_to_string(keys, ', ') || ')::text';
    ord := ord || ', ' || array_to_string(keys, ', ');
  ELSE
    probe := 'ROW(' || (SELECT string_agg('(' || (o ->> 'expr') || ')', ', ' ORDER BY n)
                          FROM jsonb_array_elements(win -> 'order_by') WITH ORDINALITY AS x(o, n)) || ')::text';
  END IF;
  top := CASE WHEN fn = 'dense_rank'
    THEN format('"trellis"._topn_distinct_prefix(array_agg(%s ORDER BY %s), %s)', probe, ord, k)
    ELSE format('(array_agg(%s ORDER BY %s))[1:%s]', probe, ord, k) END;
  g := jsonb_build_object('kind', 'transform', 'form', 'as', 'target', NULL,
    'from', pa -> 'from', 'joins', coalesce(pa -> 'joins', '[]'), 'where', pa -> 'where', 'having', NULL,
    'group_by', win -> 'partition', 'without_source_index', false,
    'select', (SELECT jsonb_agg(jsonb_build_object('expr', e, 'name', 'trellis#p' || n) ORDER BY n)
                 FROM jsonb_array_elements_text(win -> 'partition') WITH ORDINALITY AS x(e, n))
              || jsonb_build_array(jsonb_build_object('expr', top, 'name', 'trellis#top')));
  on_ := (SELECT string_agg(format('"topn".%I = (%s)', 'trellis#p' || n, e), ' AND ' ORDER BY n)
            FROM jsonb_array_elements_text(win -> 'partition') WITH ORDINALITY AS x(e, n));
  rank_expr := format('array_position("topn"."trellis#top", %s)', probe);
  items := (SELECT jsonb_agg(x ORDER BY o) FROM (
      SELECT i AS x, CASE WHEN o0 - 1 < (win ->> 'index')::int THEN o0 ELSE o0 + 1 END AS o
        FROM jsonb_array_elements(pa -> 'select') WITH ORDINALITY AS y(i, o0)
      UNION ALL
      SELECT jsonb_build_object('expr', rank_expr || '::bigint', 'name', win ->> 'name'),
             (win ->> 'index')::int + 1) z);
  RETURN (pa - 'window') || jsonb_build_object(
    'topn_written', pa,
    'select', items,
    'joins', coalesce(pa -> 'joins', '[]') || jsonb_build_array(jsonb_build_object('type', 'inner', 'schema', NULL, 'name', 'topn',
      'alias', 'topn', 'on', on_, 'part', 'topn', 'part_kind', 'derived')),
    'parts', coalesce(pa -> 'parts', '[]') || jsonb_build_array(jsonb_build_object(
      'name', 'topn', 'kind', 'derived', 'columns', '[]'::jsonb, 'ast', g)),
    'where', coalesce('(' || (pa ->> 'where') || ') AND ', '') || rank_expr || ' IS NOT NULL');
END
$fn$;

-- A view's AST with each ranking derived table (a part whose SELECT has `window`) rewritten
-- by _topn_rewrite_window, at every level; its k is read from the WHERE of the SELECT that
-- reads it. A ranking SELECT anywhere else is refused, saying how to write top-N.
CREATE FUNCTION "trellis"._topn_bind(ast jsonb, ranked boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  p jsonb;
  parts jsonb := '[]';
  k int;
  win jsonb;
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' THEN
    RETURN ast;
  END IF;
  IF ast ? 'window' AND NOT ranked THEN
    win := ast -> 'window';
    PERFORM "trellis"._fail('TRV01', format(
      'a window function (%s() OVER ...) is kept only as top-N per partition: SELECT ... FROM (SELECT ..., %s AS %I FROM ...) AS s WHERE %I <= k',
      win ->> 'fn', win ->> 'expr', win ->> 'name', win ->> 'name'));
  END IF;
  IF ast ? 'union' THEN
    ast := jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg("trellis"._topn_bind(b) ORDER BY o)
        FROM jsonb_array_elements(ast -> 'union' -> 'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  IF NOT ast ? 'parts' THEN
    RETURN ast;
  END IF;
  FOR p IN SELECT x FROM jsonb_array_elements(ast -> 'parts') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    IF p ? 'ast' AND p -> 'ast' ? 'window' AND p ->> 'kind' = 'derived' THEN
      win := p -> 'ast' -> 'window';
      IF jsonb_array_length(coalesce(p -> 'columns', '[]')) > 0 THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a column alias list on a ranking subquery (%s) is not supported yet: name the columns inside it', p ->> 'name'));
      END IF;
      k := "trellis"._topn_bound(ast ->> 'where', p ->> 'name', win ->> 'name');
      IF k IS NULL THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a window function (%s() OVER ...) is kept only as top-N per partition: the statement reading %I must filter it with WHERE %I <= k (or < k, or = 1)',
          win ->> 'fn', p ->> 'name', win ->> 'name'));
      END IF;
      p := p || jsonb_build_object('ast', "trellis"._topn_rewrite_window("trellis"._topn_bind(p -> 'ast', true), k));
    ELSIF p ? 'ast' THEN
      p := p || jsonb_build_object('ast', "trellis"._topn_bind(p -> 'ast'));
    END IF;
    parts := parts || jsonb_build_array(p);
  END LOOP;
  RETURN ast || jsonb_build_object('parts', parts);
END
$fn$;

-- TRANSFORM: a view's SQL with ranking derived tables (_topn_bind) defined as top-N; every
-- other statement as before.
CREATE FUNCTION "trellis"._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ->> 'form' = 'as' THEN
    ast := "trellis"._topn_bind(ast);
  END IF;
  RETURN "trellis"._define_before_topn(ast, statement);
END
$fn$;
$trellis_m45$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 46) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (46, 'right_full_joins', false);
    EXECUTE $trellis_m46$-- RIGHT and FULL joins in a view's SQL (issue #26, item 1; ADR 0066):
--
--   ... FROM a RIGHT [OUTER] JOIN b ON cond [further joins] ...
--     is kept as  FROM b LEFT JOIN a ON cond [further joins]  (the same rows; the SELECT
--     list is written item by item, so the columns keep their order);
--   ... FROM a FULL [OUTER] JOIN b ON cond [further joins] [WHERE w] ...
--     is kept as the UNION ALL (ADR 0059) of two branches:
--       SELECT ... FROM a LEFT JOIN b ON cond [further joins] [WHERE w]
--       SELECT ... FROM b LEFT JOIN a ON cond [further joins] WHERE ROW(a.*) IS NULL [AND w]
--     the second holding b's rows no row of a matches, with a's columns NULL (the LEFT
--     JOIN's own NULLs: a row of b that some row of a matches makes rows whose a has its
--     key, never NULL; one no row of a matches makes one row whose a is all NULL, whatever
--     cond makes of NULLs). SELECT DISTINCT over a FULL JOIN is a UNION of the
--     two. GROUP BY, HAVING and aggregates over a FULL JOIN are refused (a union's
--     branches are grouped apart): the FULL JOIN goes in a subquery in FROM.
--
-- LATERAL (CROSS JOIN LATERAL unnest(...), a correlated subquery) is refused by name here.
--
-- Only as the first join of its FROM (a RIGHT or FULL JOIN after other joins joins their
-- result, which one LEFT JOIN chain cannot say). The statement is recorded and shown as
-- written: the compiled AST keeps the parsed one under "written" (render_statement shows
-- that), and everything else (analysis, parts, capture, the drain) sees only what it was
-- compiled into.
--
-- Renamed and wrapped (statements without these joins go straight through, so whichever
-- migration wrote them last stays in force): grammar_parse_block (0041) ->
-- grammar_parse_block_before_joins, grammar_parse_view (four arguments, 0041) ->
-- grammar_parse_view_before_joins, _render_view_select (0041) ->
-- _render_view_select_before_joins, render_statement (0041) -> render_statement_before_joins,
-- _define_parts (0041) -> _define_parts_before_joins. No body is replaced.

ALTER FUNCTION "trellis".grammar_parse_block("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_joins;
ALTER FUNCTION "trellis".grammar_parse_view("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_view_before_joins;
ALTER FUNCTION "trellis"._render_view_select(jsonb) RENAME TO _render_view_select_before_joins;
ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO render_statement_before_joins;
ALTER FUNCTION "trellis"._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_before_joins;

-- Whether token k starts RIGHT [OUTER] JOIN or FULL [OUTER] JOIN: its word, or NULL.
CREATE FUNCTION "trellis"._outer_join_at(toks "trellis".grammar_token[], k int)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE WHEN toks[k].kind = 'word' AND toks[k].value IN ('right', 'full')
               AND ("trellis".grammar_kw(toks[k + 1], 'join')
                    OR ("trellis".grammar_kw(toks[k + 1], 'outer') AND "trellis".grammar_kw(toks[k + 2], 'join')))
              THEN toks[k].value END
$fn$;

-- A SELECT block (grammar_parse_block's) with a RIGHT or FULL JOIN as its first join,
-- compiled as the header says; any other block as before.
CREATE FUNCTION "trellis".grammar_parse_block(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  f int;
  first_join int;
  outer_at int;
  kind text;
  w text;
  ast jsonb;
  j0 jsonb;
  swapped jsonb;
  written jsonb;
  b1 jsonb;
  b2 jsonb;
  cte_parts jsonb;
  other_parts jsonb;
  cond text;
  where2 text;
  has_or boolean := false;
  wt "trellis".grammar_token[];
  wk int;
  wd int := 0;
BEGIN
  -- The block's FROM, its first join, and the RIGHT or FULL JOINs, at the top level.
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND "trellis".grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL THEN
      IF "trellis".grammar_kw(toks[k], 'lateral') THEN
        PERFORM "trellis".grammar_refuse(
          'LATERAL is not supported yet: neither CROSS JOIN LATERAL over a set-returning function of the row (unnest(...) [WITH ORDINALITY], jsonb_array_elements(...)) nor a correlated subquery in FROM is maintained',
          toks[k].pos);
      END IF;
      IF first_join IS NULL AND (
           (toks[k].kind = 'punct' AND toks[k].text = ',')
           OR (toks[k].kind = 'word' AND toks[k].value IN ('join', 'inner', 'cross', 'natural'))
           OR ("trellis".grammar_kw(toks[k], 'left') AND coalesce(toks[k + 1].text, '') <> '(')
           OR "trellis"._outer_join_at(toks, k) IS NOT NULL) THEN
        first_join := k;
      END IF;
      IF "trellis"._outer_join_at(toks, k) IS NOT NULL THEN
        IF k <> first_join THEN
          PERFORM "trellis".grammar_refuse(format(
            'a %s JOIN after another join is not supported yet: make it the first join of FROM (FROM a %s JOIN b ON ... JOIN c ON ...), or write it as a LEFT JOIN',
            upper(toks[k].value), upper(toks[k].value)), toks[k].pos);
        END IF;
        outer_at := k;
        kind := toks[k].value;
      END IF;
    END IF;
    k := k + 1;
  END LOOP;
  IF outer_at IS NULL THEN
    RETURN "trellis".grammar_parse_block_before_joins(toks, i, target, ctes);
  END IF;

  -- Parsed as a LEFT JOIN in the order written: the statement as written, but its first
  -- join's type.
  toks[outer_at] := ROW('word', 'LEFT', 'left', toks[outer_at].pos)::"trellis".grammar_token;
  ast := "trellis".grammar_parse_block_before_joins(toks, i, target, ctes);
  written := ast || jsonb_build_object('written_join', kind);
  j0 := ast->'joins'->0;
  -- The sides swapped: b LEFT JOIN a ON cond, then the further joins.
  swapped := ast || jsonb_build_object(
    'from', j0 - 'type' - 'on',
    'joins', jsonb_build_array((ast->'from') || jsonb_build_object('type', 'left', 'on', j0->>'on'))
             || ((ast->'joins') - 0));

  IF kind = 'right' THEN
    RETURN swapped || jsonb_build_object('written', written);
  END IF;

  -- FULL JOIN.
  IF jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0 OR ast->>'having' IS NOT NULL THEN
    PERFORM "trellis".grammar_refuse(
      'GROUP BY or HAVING over a FULL JOIN is not supported yet: put the FULL JOIN in a subquery in FROM (SELECT ... FROM (SELECT ... FROM a FULL JOIN b ON ...) AS j GROUP BY ...)',
      toks[outer_at].pos);
  END IF;
  cond := j0->>'on';
  w := ast->>'where';
  IF w IS NOT NULL THEN
    -- w is AND-ed as it is (its conjuncts stay at the top, where semi-joins are found)
    -- unless it has an OR at its top level.
    wt := "trellis".grammar_tokenize(w);
    FOR wk IN 1 .. coalesce(array_length(wt, 1), 0) LOOP
      IF wt[wk].kind = 'punct' AND wt[wk].text IN ('(', '[') THEN
        wd := wd + 1;
      ELSIF wt[wk].kind = 'punct' AND wt[wk].text IN (')', ']') THEN
        wd := wd - 1;
      ELSIF wd = 0 AND "trellis".grammar_kw(wt[wk], 'or') THEN
        has_or := true;
      END IF;
    END LOOP;
  END IF;
  -- b's rows no row of a matches: the LEFT JOIN's row whose a is NULL (every column of it,
  -- the key included, which a row of a never has).
  -- (ROW(a.*), not the bare name a, which a column of that name would take.)
  where2 := 'ROW(' || quote_ident(coalesce(ast->'from'->>'alias', ast->'from'->>'part', ast->'from'->>'name')) || '.*) IS NULL'
    || coalesce(' AND ' || CASE WHEN has_or THEN '(' || w || ')' ELSE w END, '');
  -- The WITH queries are the whole statement's; derived tables belong to each branch.
  cte_parts := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS y(x, o)
                          WHERE x->>'kind' = 'cte'), '[]');
  other_parts := coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS y(x, o)
                            WHERE x->>'kind' <> 'cte'), '[]');
  b1 := ast - 'target' - 'without_source_index' - 'without_row_security' - 'distinct' - 'parts'
    || CASE WHEN jsonb_array_length(other_parts) > 0 THEN jsonb_build_object('parts', other_parts) ELSE '{}' END;
  b2 := swapped - 'target' - 'without_source_index' - 'without_row_security' - 'distinct' - 'parts'
    || jsonb_build_object('where', where2)
    || CASE WHEN jsonb_array_length(other_parts) > 0 THEN jsonb_build_object('parts', other_parts) ELSE '{}' END;
  RETURN jsonb_build_object(
    'kind', 'transform', 'form', 'as', 'target', target,
    'union', jsonb_build_object('all', NOT coalesce((ast->>'distinct')::boolean, false),
                                'branches', jsonb_build_array(b1, b2)),
    'select', b1->'select',
    'without_source_index', coalesce((ast->>'without_source_index')::boolean, false),
    'written', written)
    || CASE WHEN (ast->>'without_row_security')::boolean THEN jsonb_build_object('without_row_security', true) ELSE '{}' END
    || CASE WHEN jsonb_array_length(cte_parts) > 0 THEN jsonb_build_object('parts', cte_parts) ELSE '{}' END;
END
$fn$;

-- A view's SELECT: as before, but a FULL JOIN (compiled into a union) inside a branch of
-- a UNION is refused (a union of unions: put the FULL JOIN in a subquery in FROM).
CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  ast jsonb := "trellis".grammar_parse_view_before_joins(toks, i, target, ctes);
BEGIN
  IF ast ? 'union' AND NOT ast ? 'written'
     AND EXISTS (SELECT 1 FROM jsonb_array_elements(ast->'union'->'branches') b WHERE b ? 'union') THEN
    PERFORM "trellis".grammar_refuse(
      'a FULL JOIN in a SELECT of a UNION is not supported yet: put the FULL JOIN in a subquery in FROM',
      toks[i].pos);
  END IF;
  RETURN ast;
END
$fn$;

-- A view's SELECT as text: a block marked "written_join" (the parsed form of a RIGHT or
-- FULL JOIN, kept to be shown) with its first join's word as written; any other as before.
-- The first join follows the FROM item, which is rendered apart and found by a name no
-- statement holds.
CREATE FUNCTION "trellis"._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  sentinel text := 'trellis#first#join#item';
  txt text;
  marker text;
BEGIN
  IF NOT ast ? 'written_join' THEN
    RETURN "trellis"._render_view_select_before_joins(ast);
  END IF;
  txt := "trellis"._render_view_select_before_joins(
    (ast - 'written_join') || jsonb_build_object('from', jsonb_build_object('schema', NULL, 'name', sentinel, 'alias', NULL)));
  marker := quote_ident(sentinel) || ' LEFT JOIN ';
  RETURN overlay(txt PLACING "trellis"._render_view_item(ast, ast->'from') || ' '
                 || upper(ast->>'written_join') || ' JOIN '
                 FROM strpos(txt, marker) FOR length(marker));
END
$fn$;

-- The AST as written: every node compiled from a RIGHT or FULL JOIN replaced by what was
-- parsed (its "written"), at every level (WITH queries, derived tables, union branches).
CREATE FUNCTION "trellis"._joins_as_written(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' THEN
    RETURN ast;
  END IF;
  IF ast ? 'written' THEN
    ast := (ast->'written') || CASE WHEN ast ? 'target' THEN jsonb_build_object('target', ast->'target') ELSE '{}' END;
  END IF;
  IF ast ? 'union' THEN
    ast := jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg("trellis"._joins_as_written(b) ORDER BY o)
        FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  IF jsonb_typeof(ast->'parts') = 'array' AND jsonb_array_length(ast->'parts') > 0 THEN
    ast := jsonb_set(ast, '{parts}', (
      SELECT jsonb_agg(CASE WHEN p ? 'ast' THEN jsonb_set(p, '{ast}', "trellis"._joins_as_written(p->'ast')) ELSE p END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN ast;
END
$fn$;

-- render_statement: the statement as written (RIGHT and FULL JOINs as the user wrote
-- them), rendered as before.
CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  w jsonb;
BEGIN
  -- A hidden part (trellis#...) is shown as what it keeps.
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast::text LIKE '%"written"%'
     OR starts_with(coalesce(ast->'target'->>'name', ''), 'trellis#') THEN
    RETURN "trellis".render_statement_before_joins(ast);
  END IF;
  w := "trellis"._joins_as_written(ast);
  IF NOT w ? 'written_join' THEN
    RETURN "trellis".render_statement_before_joins(w);
  END IF;
  -- The statement's own FROM has the RIGHT or FULL JOIN: its SELECT as written.
  RETURN 'TRANSFORM ' || "trellis".grammar_render_name(w -> 'target' ->> 'schema', w -> 'target' ->> 'name')
    || ' AS ' || "trellis"._render_view_select(w)
    || CASE WHEN (w ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (w ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;

-- A part's definition: a FULL JOIN whose SELECT aggregates (without GROUP BY: the grammar
-- refuses GROUP BY and HAVING over one) is refused, as its two branches would each make
-- their own row; Postgres says whether it aggregates. Everything else as before.
CREATE FUNCTION "trellis"._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  info jsonb;
  res jsonb;
BEGIN
  IF ast ? 'union' AND ast->'written'->>'written_join' = 'full' THEN
    info := "trellis"._analyze_query(
      "trellis"._render_view_select("trellis"._bind_scope_plain(ast->'written', scope)),
      'in the definition');
    IF coalesce((info->>'has_aggs')::boolean, false) THEN
      PERFORM "trellis"._fail('TRV01',
        'aggregates over a FULL JOIN are not supported yet: put the FULL JOIN in a subquery in FROM (SELECT count(*) FROM (SELECT ... FROM a FULL JOIN b ON ...) AS j)');
    END IF;
  END IF;
  res := "trellis"._define_parts_before_joins(ast, root, path, scope);
  -- What was written goes on being shown (definitions(), dumps).
  IF ast ? 'written' AND NOT res->'ast' ? 'written' THEN
    res := jsonb_set(res, '{ast}', (res->'ast') || jsonb_build_object('written', ast->'written'));
  END IF;
  RETURN res;
END
$fn$;
$trellis_m46$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 47) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (47, 'redefine_parts', false);
    EXECUTE $trellis_m47$-- Redefinitions in place to and from statements with parts (issue #25 follow-up; ADR 0055,
-- second addendum), and how long readers were blocked in status().
--
-- ALTER TRANSFORM t AS <a statement with derived tables or WITH queries> (ADR 0056's parts):
-- the statement is checked whole by Postgres (as a TRANSFORM with parts is), its parts are
-- defined as hidden transforms of their own, named "trellis#<t>~<id>#<part>" (another name
-- than the parts in force, "trellis#<t>#<part>" or an earlier redefinition's), and the
-- shadow (0035) is the statement around them, reading their targets. The parts belong to
-- the shadow (part_of = the shadow's id): they are built and kept live as any part is,
-- while the old definition (and its own parts) keep serving the target. The switch (0042)
-- is unchanged: the shadow's row becomes the transform (its id is kept), so the new parts
-- are the transform's from then on. The old parts, whose transform is gone, are dropped
-- after the switch, in a transaction of their own (_drop_orphan_parts, called by the
-- staging worker): nothing the app reads is touched by that. A redefinition replaced,
-- given up or dropped drops its parts with its shadow (the trigger drop_redefinition_parts).
-- A redefinition from a statement with parts to one without (or the other way round) goes
-- the same way. Unions (0041) in the new statement are still refused, by name.
--
-- Renamed here and wrapped (statements and transforms without parts go straight through):
-- _redefine (0036's) -> _redefine_before_parts; parse_statement (0028's) ->
-- parse_statement_before_alter_with (ALTER TRANSFORM t AS WITH ... is read). Replaced (its latest body, 0041's, copied;
-- the change marked "0047"): status(text), whose redefinition now carries readersBlockedMs,
-- staged, deleted and written, which the switch records in transforms.redefinition since
-- 0042.

ALTER FUNCTION "trellis"._redefine(jsonb) RENAME TO _redefine_before_parts;
ALTER FUNCTION "trellis".parse_statement(text) RENAME TO parse_statement_before_alter_with;

-- ALTER TRANSFORM t AS WITH ... SELECT ...: a redefinition whose statement starts with WITH
-- queries (0035 took SELECT or FROM after AS). Read as the TRANSFORM statement it would
-- be, ALTER blanked out so positions stay the statement's own; every other statement as
-- before (parse_statement_before_alter_with).
CREATE FUNCTION "trellis".parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(statement);
  sch text;
  nm text;
  i int;
BEGIN
  IF "trellis".grammar_kw(toks[1], 'alter') AND "trellis".grammar_kw(toks[2], 'transform') THEN
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, 3, 'a transform name') q;
    IF "trellis".grammar_kw(toks[i], 'as') AND "trellis".grammar_kw(toks[i + 1], 'with') THEN
      RETURN jsonb_build_object('kind', 'redefine', 'transform', nm,
               'definition', "trellis".parse_statement_before_alter_with(overlay(statement
                 PLACING repeat(' ', char_length(toks[1].text)) FROM toks[1].pos FOR char_length(toks[1].text))))
             || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    END IF;
  END IF;
  RETURN "trellis".parse_statement_before_alter_with(statement);
END
$fn$;

-- Whether a view-SQL AST (a statement or a part) has a union anywhere in it.
CREATE FUNCTION "trellis"._has_union(ast jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
  SELECT ast ? 'union' OR EXISTS (
    SELECT 1 FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) p
     WHERE "trellis"._has_union(p->'ast'))
$fn$;

-- Drops transforms `ids`' parts (the last defined first: a part may read an earlier one),
-- and the tables of the unions they fed.
CREATE FUNCTION "trellis"._drop_parts_of(ids int[])
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  tables oid[];
  rel oid;
  p record;
  n int := 0;
BEGIN
  tables := ARRAY(SELECT DISTINCT f.table_oid FROM "trellis".union_feeds f
                    JOIN "trellis".transforms x ON x.id = f.transform_id
                   WHERE x.part_of = ANY (ids));
  FOR p IN SELECT x.target_name FROM "trellis".transforms x WHERE x.part_of = ANY (ids) ORDER BY x.id DESC LOOP
    PERFORM "trellis"._drop_one(jsonb_build_object('kind', 'drop', 'transform', p.target_name));
    n := n + 1;
  END LOOP;
  FOREACH rel IN ARRAY tables LOOP
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
      EXECUTE format('DROP TABLE %s', rel::regclass);
    END IF;
  END LOOP;
  RETURN n;
END
$fn$;

-- The parts of a transform that is gone (the old definition's, after a switch): dropped.
-- The staging worker calls it after each switch, under a short lock_timeout, and again on
-- later passes while some are left. Returns how many were dropped.
CREATE FUNCTION "trellis"._drop_orphan_parts()
RETURNS int LANGUAGE plpgsql AS $fn$
BEGIN
  RETURN "trellis"._drop_parts_of(ARRAY(
    SELECT DISTINCT x.part_of FROM "trellis".transforms x
     WHERE x.part_of IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM "trellis".transforms o WHERE o.id = x.part_of)));
END
$fn$;

-- A shadow gone (replaced, given up, dropped with its transform): its parts with it.
CREATE FUNCTION "trellis"._drop_redefinition_parts()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._drop_parts_of(ARRAY[OLD.id]);
  RETURN NULL;
END
$fn$;
CREATE TRIGGER drop_redefinition_parts AFTER DELETE ON "trellis".transforms
  FOR EACH ROW WHEN (OLD.redefines IS NOT NULL) EXECUTE FUNCTION "trellis"._drop_redefinition_parts();

-- ALTER TRANSFORM ... AS: with parts on either side, the new parts defined and the shadow
-- made reading them; otherwise as before (_redefine_before_parts).
CREATE FUNCTION "trellis"._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  def jsonb := ast->'definition';
  has_new boolean := jsonb_array_length(coalesce(ast->'definition'->'parts', '[]')) > 0;
  res jsonb;
  result jsonb;
  shadow_id int;
BEGIN
  IF t.part_of IS NOT NULL OR t.redefines IS NOT NULL
     OR NOT (has_new OR EXISTS (SELECT 1 FROM "trellis".transforms p WHERE p.part_of = t.id)) THEN
    RETURN "trellis"._redefine_before_parts(ast);
  END IF;
  IF "trellis"._has_union(def) THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot be redefined in place to a statement with UNION yet', t.target_name),
      'DROP TRANSFORM it and define it again');
  END IF;
  -- A switch to a redefinition being replaced finishes first (as _redefine_one waits).
  PERFORM 1 FROM "trellis".pipeline px
   WHERE px.transform_id = t.id
      OR px.transform_id IN (SELECT y.id FROM "trellis".transforms y WHERE y.redefines = t.id)
   ORDER BY px.transform_id FOR UPDATE;
  IF NOT EXISTS (SELECT 1 FROM "trellis".transforms y WHERE y.id = t.id) THEN
    PERFORM "trellis"._fail('TRT01', format(
      'transform %I was switched to another definition while this statement waited: apply it again', t.target_name));
  END IF;
  -- A redefinition being built is replaced: its shadow, and its parts, go first (their
  -- names are this one's).
  DELETE FROM "trellis".transforms s WHERE s.redefines = t.id;
  IF has_new THEN
    def := jsonb_set(def, '{target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
    -- Postgres reads the statement as written first: names, column aliases, scopes.
    PERFORM "trellis"._analyze_query("trellis"._render_view_select(def), 'in the definition');
    PERFORM "trellis"._refuse_view_sublinks(def);
    res := "trellis"._define_parts(def, t.target_name || '~' || t.id, '', '{}');
    ast := jsonb_set(ast, '{definition}', res->'ast');
  END IF;
  result := "trellis"._redefine_one(ast);
  SELECT s.id INTO shadow_id FROM "trellis".transforms s WHERE s.redefines = t.id;
  IF shadow_id IS NULL THEN
    -- The definition in force, written again: nothing to build, the parts just made go.
    IF has_new THEN
      PERFORM "trellis"._drop_one(jsonb_build_object('kind', 'drop', 'transform', x.target_name))
         FROM (SELECT y.target_name FROM "trellis".transforms y
                WHERE y.id IN (SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i)
                ORDER BY y.id DESC) x;
    END IF;
    RETURN result;
  END IF;
  IF has_new THEN
    UPDATE "trellis".transforms p SET part_of = shadow_id
     WHERE p.id IN (SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i);
  END IF;
  RETURN result;
END
$fn$;

-- status(text): replaced (its latest body, 0041's, copied; the change marked "0047"): its
-- redefinition carries what the switch recorded beside lockMs since 0042. Wrapping it is
-- not possible: its body names its parameter as status.target, which a renamed function
-- no longer resolves.
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  health jsonb := "trellis".workers();
  -- 0029: the catalog is another database's (restored or cloned), not rebound yet.
  restored text := "trellis"._restore_reason();
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
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
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    -- 0041: upstream through _upstream_ids (a union's branches feed its table too).
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis"._upstream_ids(t.id) u(id)
      UNION
      SELECT u.id FROM up CROSS JOIN LATERAL "trellis"._upstream_ids(up.id) u(id))
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
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
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
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
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix',
               -- 0034: the same statement for a migration's transaction (no CONCURRENTLY).
               'fixInMigration', regexp_replace(g->>'fix', '^CREATE INDEX CONCURRENTLY ', 'CREATE INDEX '))), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
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
    'backfill', "trellis"._backfill_pace(CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        -- 0028: keys held while building (they count as done: found, and not filled).
        'keysHeld', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
        'startedAt', p.backfill_started_at) END, t.id, p.phase = 'backfilling'),
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0031: the drain time spent on it, and its share of the drain's recent time.
    'drain', "trellis"._drain_share(t.id),
    -- 0035: the last ALTER TRANSFORM ... AS: being built, switched, or given up and why.
    'redefinition', CASE WHEN t.redefinition IS NOT NULL THEN jsonb_build_object(
        'state', t.redefinition->'state', 'statement', t.redefinition->'statement',
        'changes', coalesce(t.redefinition->'changes', '[]'),
        'error', t.redefinition->'error', 'lockMs', t.redefinition->'lockMs',
        -- 0047: how long of the lock readers waited for (ACCESS EXCLUSIVE), whether the
        -- columns were staged, and the rows the switch deleted and wrote.
        'readersBlockedMs', t.redefinition->'readersBlockedMs', 'staged', t.redefinition->'staged',
        'deleted', t.redefinition->'deleted', 'written', t.redefinition->'written',
        'since', t.redefinition->'since', 'at', t.redefinition->'at') END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', CASE WHEN restored IS NOT NULL THEN jsonb_build_object(
        'kind', 'staging_worker',
        'reason', restored || ': the staging worker rebinds its tables by name and rebuilds every transform when it starts')
      ELSE "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                upstream_behind OR jsonb_array_length(paused_upstream) > 0) END,
    -- 0029: the last restore (or clone) recognised, or the one not rebound yet.
    'restored', CASE WHEN restored IS NOT NULL THEN jsonb_build_object('reason', restored, 'detectedAt', NULL)
                     ELSE (SELECT jsonb_build_object('reason', c.restored->>'reason',
                                                     'detectedAt', (c.restored->>'detectedAt')::timestamptz)
                             FROM "trellis".config c WHERE c.restored IS NOT NULL) END);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m47$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 48) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (48, 'semi_parenthesized', false);
    EXECUTE $trellis_m48$-- A semi- or anti-join in brackets is still a condition AND-ed at the top of WHERE
-- (issue #24, item 4: found by the differential tests' view SQL).
--
-- `WHERE (x > 1) AND (EXISTS (SELECT …))` was refused as a subquery "inside another
-- expression", and `WHERE (c IS NOT NULL) AND (c NOT IN (SELECT …))` did not see its
-- `c IS NOT NULL`: the conjuncts were split at the top-level ANDs only, the brackets
-- around each kept. Brackets mean nothing in Postgres's parse tree, and pg_get_viewdef()
-- writes every condition in them (`WHERE ((o.x > 1) AND (EXISTS ( SELECT …)))`), which
-- README says the AS form takes as it is. A conjunct wholly in brackets is now split again
-- inside them, so `((a) AND (b))` gives `a` and `b`.
--
-- Renamed here and wrapped:
--   _semi_conjuncts (0039) -> _semi_conjuncts_before_parens
-- No other function is replaced.

ALTER FUNCTION "trellis"._semi_conjuncts(text) RENAME TO _semi_conjuncts_before_parens;

CREATE FUNCTION "trellis"._semi_conjuncts(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  res text[] := '{}';
  c text;
  toks "trellis".grammar_token[];
  n int;
BEGIN
  FOREACH c IN ARRAY "trellis"._semi_conjuncts_before_parens(cond) LOOP
    toks := "trellis".grammar_tokenize(c);
    n := array_length(toks, 1) - 1;  -- the last token before eof
    IF n >= 2 AND toks[1].kind = 'punct' AND toks[1].text = '('
       AND "trellis"._closing_token(toks, 1) = n THEN
      res := res || "trellis"._semi_conjuncts("trellis".grammar_text(toks, 2, n));
    ELSE
      res := res || c;
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;
$trellis_m48$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 49) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (49, 'fan_out_deltas', false);
    EXECUTE $trellis_m49$-- Aggregates kept by delta over a join that fans out (issue #22 item 1; ADR 0067).
--
-- A GROUP BY over a join that multiplies rows keeps a shadow of its sources as its key map
-- (0033, ADR 0051), and was kept by group recompute whatever its aggregates: a delta needed
-- each join row's old inputs, which a shadow does not keep per join row. They are now
-- computed from it by the delta rule of a join (drain/shadow-sql.ts, shadowSignedRows):
-- each changed occurrence's old rows (the shadow's, signed -1) and new rows (the source's,
-- +1) joined with the occurrences before it as they are after the change and those after
-- it as they were before. Such a transform, when every aggregate has an exact delta
-- (0026), keeps both the shadow and the group state table of ADR 0044 (groups_<id>).
--
-- An inner join only: a LEFT JOIN's NULL-extended rows are not a sum of its sources' rows
-- (a row losing its last match gains one), so a fan-out join with a LEFT JOIN keeps the
-- group recompute, and its classification says why.
--
-- Renamed here and wrapped: _make_key_map -> _make_key_map_before_fanout (every case but
-- the one above goes straight through to it). The group state table's creation, which
-- 0033's _make_key_map does inline, is a function of its own here (_create_group_states),
-- with the same columns.

ALTER FUNCTION "trellis"._make_key_map(int, jsonb, jsonb) RENAME TO _make_key_map_before_fanout;

-- The group state table of a transform kept by delta (as 0026 and 0033 make it): the
-- groups g1..gn, the row count n, each aggregate's state parts a<n>_<part>; unique on the
-- groups (NULLs not distinct).
CREATE FUNCTION "trellis"._create_group_states(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  state_sql text := quote_ident('trellis') || '.' || quote_ident('groups_' || transform_id);
  groups text;
BEGIN
  groups := (SELECT string_agg(quote_ident('g' || o), ', ' ORDER BY o)
               FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o));
  EXECUTE 'DROP TABLE IF EXISTS ' || state_sql;
  EXECUTE 'CREATE TABLE ' || state_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT 0 AS o1, g.o AS o2, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '') AS col
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 1, 0, 'n bigint NOT NULL'
      UNION ALL
      SELECT 2, a.o * 10 + p.o, quote_ident(format('a%s_%s', a.o, p.part)) || ' ' || p.type
        FROM jsonb_array_elements(classified->'aggs') WITH ORDINALITY AS a(v, o)
        CROSS JOIN LATERAL (
          SELECT * FROM (VALUES
            (1, 'c', 'bigint', true),
            (2, 's', CASE WHEN a.v->>'kind' = 'sum_int' THEN 'bigint' ELSE 'numeric' END,
                     a.v->>'kind' IN ('sum_int', 'sum_int8', 'avg_int', 'sum_numeric', 'avg_numeric')),
            (3, 'nan', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (4, 'pinf', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (5, 'ninf', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric')),
            (6, 'ms', 'int', a.v->>'kind' IN ('sum_numeric', 'avg_numeric') AND a.v->>'scale' IS NULL),
            (7, 'msc', 'bigint', a.v->>'kind' IN ('sum_numeric', 'avg_numeric') AND a.v->>'scale' IS NULL),
            (8, 'm', (a.v->>'type') || coalesce(' COLLATE ' || (a.v->>'collation'), ''), a.v->>'kind' IN ('min', 'max')),
            (9, 'b', 'bigint', a.v->>'kind' IN ('bool_and', 'bool_or'))
          ) AS parts(o, part, type, used)
          WHERE used AND (a.v->>'kind' <> 'count' OR part = 'c')) p) c) || ')';
  EXECUTE 'CREATE UNIQUE INDEX ON ' || state_sql
    || coalesce(' (' || groups || ') NULLS NOT DISTINCT', ' ((true))');
END
$fn$;

-- As before (0033), and a GROUP BY over an inner join that fans out, every aggregate of
-- which has an exact delta, keeps its sources' shadow (as 0033 makes it) and a group state
-- table: kept by delta. Over a LEFT JOIN that fans out, the group recompute, saying why.
CREATE FUNCTION "trellis"._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  whole_row boolean;
  left_join boolean;
  fanned text;
BEGIN
  whole_row := coalesce((spec->>'whole_row')::boolean, false)
    OR coalesce((SELECT (t.spec->>'whole_row')::boolean FROM "trellis".transforms t WHERE t.id = transform_id), false);
  IF classified->>'mode' IS DISTINCT FROM 'delta'
     OR jsonb_array_length(coalesce(spec->'groups', '[]')) = 0
     OR jsonb_array_length(spec->'sources') < 2
     OR whole_row
     OR NOT "trellis"._join_fans_out(spec)
     OR "trellis"._shadow_columns(spec) IS NULL THEN
    PERFORM "trellis"._make_key_map_before_fanout(transform_id, spec, classified);
    RETURN;
  END IF;
  left_join := EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left');
  IF left_join THEN
    SELECT quote_ident(s->>'alias') INTO fanned FROM jsonb_array_elements(spec->'sources') s
     WHERE (s->>'ordinal')::int > 0 AND NOT "trellis"._joined_on_key(spec, s, s)
     ORDER BY (s->>'ordinal')::int DESC LIMIT 1;
    PERFORM "trellis"._make_key_map_before_fanout(transform_id, spec, classified || jsonb_build_object(
      'mode', 'group', 'reason', format(
        'the join can multiply rows (%s is not joined on its whole key) and has a LEFT JOIN, whose NULL-extended rows have no delta: groups are recomputed from the sources',
        coalesce(fanned, 'a joined source'))));
    RETURN;
  END IF;
  -- The shadow, as 0033 makes it for a transform kept by group recompute.
  PERFORM "trellis"._make_key_map_before_fanout(transform_id, spec,
    classified || '{"mode": "group", "reason": "made by _make_key_map"}');
  UPDATE "trellis".transforms
     SET delta = (classified - 'remap') || jsonb_build_object('fan_out', true, 'reason',
           (classified->>'reason') || '; the join can multiply rows, so a change''s join rows are signed from the sources'' shadow (ADR 0067)')
   WHERE id = transform_id;
  PERFORM "trellis"._create_group_states(transform_id, spec, classified);
END
$fn$;

-- Transforms defined before this migration over an inner join that fans out, whose
-- aggregates all have an exact delta (0033 recorded them as kept by group recompute, their
-- classification kept under its reason): recorded as pending, so that their next build
-- (_switch_to_delta) gives them their group states and keeps them by delta. Until then they
-- keep their shadow and the group recompute.
UPDATE "trellis".transforms t
   SET delta = t.delta || jsonb_build_object(
         'mode', 'delta', 'reason', 'every aggregate has an exact delta', 'pending', true)
 WHERE t.aggregates
   AND t.delta->>'mode' = 'group'
   AND t.delta->>'reason' LIKE 'the join can multiply rows (%'
   AND NOT coalesce((t.delta->>'remap')::boolean, false)
   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.delta->'aggs') a WHERE NOT (a->>'delta')::boolean)
   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.spec->'sources') s WHERE s->>'join_type' = 'left');
$trellis_m49$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 50) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (50, 'explain_statements', false);
    EXECUTE $trellis_m50$-- EXPLAIN TRANSFORM <statement> (issue #26, item 2; ADR 0059's explain(), now before a
-- definition exists): the plan a statement would get — its parts, how each is kept, the
-- source indexes each needs with their CREATE INDEX, the state it keeps per row — or what
-- is refused and why. From SQL as `explain(statement)` or `apply('EXPLAIN TRANSFORM …')`,
-- from the handle as explain(statement), from the CLI as `trellis explain '<statement>'`.
--
-- How: the statement is defined in a subtransaction, its parts read from the catalog as
-- explain(target) reads a defined transform's (_explain_parts, which the handle's
-- explain(target) now reads too), and the subtransaction rolled back: nothing stays, no
-- worker ever sees it (its NOTIFY is never sent), and what the explanation says is what
-- defining it would do, by the same code. The drain's SQL for changed keys is not in it
-- (that needs capture installed: the handle adds it for a defined transform).

-- The state a transform (or part) keeps besides its target, in words and by kind, for
-- explain(): its key map (by _key_map_kind's kinds) and, kept by delta, its group states.
CREATE FUNCTION "trellis"._explain_state(t "trellis".transforms)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH m AS (
    SELECT CASE WHEN t.aggregates AND t.spec->>'key_map' = 'rows' THEN NULL
                ELSE t.spec->>'key_map' END AS kind,
           (SELECT count(*) FROM jsonb_array_elements(t.spec->'sources')) AS sources,
           t.delta IS NOT NULL AND t.delta->>'mode' = 'delta'
             AND NOT coalesce((t.delta->>'pending')::boolean, false) AS by_delta)
  SELECT jsonb_build_object(
    'keyMap', m.kind,
    'groupStates', m.by_delta,
    'description', concat_ws('; ',
      CASE m.kind
        WHEN 'groups' THEN CASE WHEN m.sources > 1
          THEN 'a key map: one row per join row, with its sources'' keys and its group'
          ELSE 'a key map: one row per source row that passes WHERE, with its key and its group' END
          || CASE WHEN m.by_delta THEN ' and the inputs of the aggregates kept by delta' ELSE '' END
        WHEN 'shadow' THEN 'a shadow of each joined table (the join can multiply rows): one row per source row and occurrence, with the columns the definition reads'
        WHEN 'rows' THEN 'a key map: one row per join row before WHERE, with its sources'' keys'
        ELSE CASE WHEN t.aggregates AND jsonb_array_length(coalesce(t.spec->'groups', '[]')) = 0
                  THEN 'none: the target''s one row'
                  ELSE 'none: only the target (one row per key)' END
      END,
      CASE WHEN m.by_delta THEN 'group states: one row per group (each aggregate''s running state)' END))
    FROM m
$fn$;

-- The parts of transform `root` (its hidden parts first, in the order a change flows
-- through them, then the transform itself), as explain() shows them.
CREATE FUNCTION "trellis"._explain_parts(root int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(p ORDER BY (p->>'id')::int = root, (p->>'id')::int), '[]')
    FROM (
      SELECT jsonb_build_object(
        'id', t.id,
        'name', CASE WHEN t.id = root THEN NULL ELSE t.part_name END,
        'target', t.target_name,
        'statement', t.statement,
        'key', to_jsonb(ARRAY(SELECT c.name::text FROM "trellis".transform_columns c
                               WHERE c.transform_id = t.id AND c.is_key ORDER BY c.ordinal)),
        'maintenance', "trellis"._maintenance(t.aggregates, t.delta),
        'state', "trellis"._explain_state(t),
        'reads', coalesce((
          SELECT jsonb_agg(jsonb_build_object(
                   'table', ts.source_schema || '.' || ts.source_name, 'alias', ts.alias,
                   'join', ts.join_type, 'keyColumns', to_jsonb(ts.key_columns),
                   'writtenBy', to_jsonb(ARRAY(
                      SELECT u.target_name::text FROM "trellis".transforms u
                       WHERE u.id IN (SELECT "trellis"._upstream_ids(t.id))
                         AND (u.target_oid = ts.source_oid
                              OR u.id IN (SELECT f.transform_id FROM "trellis".union_feeds f
                                           WHERE f.table_oid = ts.source_oid))
                       ORDER BY u.id)),
                   'indexes', coalesce((
                     SELECT jsonb_agg(jsonb_build_object('name', ic.relname, 'columns', to_jsonb(ARRAY(
                              SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, o)
                                JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                               ORDER BY k.o))) ORDER BY ic.relname)
                       FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid
                      WHERE x.indrelid = ts.source_oid AND x.indisvalid
                        AND (SELECT a.attname FROM pg_attribute a
                              WHERE a.attrelid = x.indrelid AND a.attnum = x.indkey[0])
                            = ANY (ts.key_columns || ts.join_columns || ts.group_columns)), '[]'))
                 ORDER BY ts.ordinal)
            FROM "trellis".transform_sources ts WHERE ts.transform_id = t.id), '[]'),
        'needs', coalesce((
          SELECT jsonb_agg(jsonb_build_object('table', g->'table', 'columns', g->'columns',
                                              'role', g->'role', 'fix', g->'fix'))
            FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g
           WHERE NOT coalesce((g->>'opted_out')::boolean, false)), '[]')) AS p
        FROM "trellis".transforms t
       WHERE t.id = root OR t.part_of = root) x
$fn$;

-- The explanation of a TRANSFORM statement not defined (see the header): {"kind":
-- "explained", "target", "statement", "chain", "parts", "refused": null}, or, for a
-- statement the grammar refuses, {"kind": "explained", "target": null, ..., "refused":
-- {"code", "message", "hint"}} with the code and message defining it would raise.
-- "EXPLAIN " in front of the statement is allowed.
CREATE FUNCTION "trellis".explain(statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  body text := regexp_replace(coalesce(statement, ''), '^\s*explain\s+', '', 'i');
  defined jsonb;
  root int;
  parts jsonb;
  result jsonb;
  code text;
  message text;
  hint text;
BEGIN
  BEGIN
    defined := "trellis"._apply_retrying(body, true);
    SELECT t.id INTO root FROM "trellis".transforms t
     WHERE t.target_name = defined->>'target' AND t.part_of IS NULL AND t.redefines IS NULL
       AND t.target_schema = (SELECT c.target_schema FROM "trellis".config c);
    parts := "trellis"._explain_parts(root);
    result := jsonb_build_object(
      'kind', 'explained',
      'target', defined->>'target',
      'statement', (SELECT t.statement FROM "trellis".transforms t WHERE t.id = root),
      'chain', (SELECT jsonb_agg(p->'target' ORDER BY o) FROM jsonb_array_elements(parts) WITH ORDINALITY AS x(p, o)),
      'parts', (SELECT jsonb_agg(p - 'id' ORDER BY o) FROM jsonb_array_elements(parts) WITH ORDINALITY AS x(p, o)),
      'refused', NULL);
    -- Undo the definition: only the explanation is kept.
    RAISE EXCEPTION USING ERRCODE = 'TRX01', MESSAGE = 'explained';
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    IF code = 'TRX01' THEN
      RETURN result;
    END IF;
    -- Trellis's own refusals (parse, validation, conflict, not found) are the answer;
    -- anything else (a lost lock, no privilege) is the caller's error.
    IF code IN ('TRP01', 'TRV01', 'TRC01', 'TRN01') THEN
      RETURN jsonb_build_object(
        'kind', 'explained', 'target', NULL, 'statement', body, 'chain', '[]'::jsonb,
        'parts', '[]'::jsonb,
        'refused', jsonb_build_object('code', code, 'message', message, 'hint', nullif(hint, '')));
    END IF;
    RAISE;
  END;
END
$fn$;

-- apply() takes EXPLAIN TRANSFORM too (defines nothing); every other statement as before.
CREATE OR REPLACE FUNCTION "trellis".apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT CASE WHEN statement ~* '^\s*explain\s+transform\s'
              THEN "trellis".explain(statement)
              ELSE "trellis"._apply_retrying(statement, false) END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m50$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 51) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (51, 'bit_string_literals', false);
    EXECUTE $trellis_m51$-- Bit-string and hex-string literals (B'…', X'…') as Postgres reads them: a doubled quote
-- does not continue them (Postgres's scanner doubles quotes only in '…', E'…', N'…' and
-- U&'…'), so B'01''x' is B'01' followed by 'x', as Postgres would run it. The tokenizer
-- read one literal there, and a value Postgres then refused with a raw syntax error (the
-- grammar's token-soup property test found it in ALTER … SET (timezone = B'01''UTC')).
-- grammar_tokenize as in 0003 (its only body), the change marked "0051".
CREATE OR REPLACE FUNCTION "trellis".grammar_tokenize(statement text) RETURNS "trellis".grammar_token[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  ch text[] := coalesce(string_to_array(statement, NULL), '{}');
  n int := coalesce(array_length(string_to_array(statement, NULL), 1), 0);
  cp int[];
  toks "trellis".grammar_token[] := '{}';
  nt int := 0;
  p int := 1;
  q int;
  r int;
  c int;
  pl int;
  depth int;
  seg int;
  backslash boolean;
  doubled boolean; -- 0051: whether '' continues the literal (not in B'…', X'…')
  k int;
  body text;
  txt text;
BEGIN
  -- Code points (any character outside ASCII reads as 128: ascii() refuses those in
  -- multibyte encodings other than UTF8, and all of them count as letters anyway).
  SELECT coalesce(array_agg(CASE WHEN octet_length(u.c) > 1 THEN 128 ELSE ascii(u.c) END
      ORDER BY u.k), '{}') INTO cp
    FROM unnest(ch) WITH ORDINALITY AS u(c, k);
  -- Sentinels past the end, so looking ahead never meets a NULL.
  cp := cp || ARRAY[0, 0, 0, 0];

  WHILE p <= n LOOP
    c := cp[p];

    -- Whitespace and comments.
    IF c IN (32, 9, 10, 13, 12, 11) THEN
      p := p + 1;
      CONTINUE;
    END IF;
    IF c = 45 AND cp[p + 1] = 45 THEN
      p := p + 2;
      WHILE p <= n AND cp[p] NOT IN (10, 13) LOOP
        p := p + 1;
      END LOOP;
      CONTINUE;
    END IF;
    IF c = 47 AND cp[p + 1] = 42 THEN
      q := p + 2;
      depth := 1;
      WHILE depth > 0 LOOP
        IF q > n THEN
          PERFORM "trellis".grammar_fail(
            'unterminated comment: expected "*/" to close "/*", found end of statement', p);
        END IF;
        IF cp[q] = 47 AND cp[q + 1] = 42 THEN
          depth := depth + 1;
          q := q + 2;
        ELSIF cp[q] = 42 AND cp[q + 1] = 47 THEN
          depth := depth - 1;
          q := q + 2;
        ELSE
          q := q + 1;
        END IF;
      END LOOP;
      p := q;
      CONTINUE;
    END IF;

    -- String literals: '...', E'...', B'...', X'...', N'...', U&'...' (pl: prefix length).
    pl := CASE
      WHEN c = 39 THEN 0
      WHEN c IN (69, 101, 66, 98, 88, 120, 78, 110) AND cp[p + 1] = 39 THEN 1
      WHEN c IN (85, 117) AND cp[p + 1] = 38 AND cp[p + 2] = 39 THEN 2
    END;
    IF pl IS NOT NULL THEN
      backslash := pl = 1 AND c IN (69, 101);
      doubled := NOT (pl = 1 AND c IN (66, 98, 88, 120)); -- 0051
      body := '';
      FOR k IN p .. p + pl LOOP
        body := body || ch[k];
      END LOOP;
      seg := p;
      q := p + pl + 1;
      LOOP
        r := q;
        LOOP
          IF q > n THEN
            PERFORM "trellis".grammar_fail(
              'unterminated string literal: expected a closing quote, found end of statement',
              seg);
          END IF;
          IF cp[q] = 39 THEN
            EXIT WHEN cp[q + 1] <> 39 OR NOT doubled; -- 0051
            q := q + 2;
          ELSIF backslash AND cp[q] = 92 THEN
            q := q + 2;
          ELSE
            q := q + 1;
          END IF;
        END LOOP;
        FOR k IN r .. q - 1 LOOP
          body := body || ch[k];
        END LOOP;
        q := q + 1;
        -- Postgres joins literals separated by whitespace that holds a newline ('a'
        -- <newline> 'b' is 'ab'): the next segment continues this token.
        r := q;
        LOOP
          IF cp[r] IN (32, 9, 12) THEN
            r := r + 1;
          ELSIF cp[r] = 45 AND cp[r + 1] = 45 THEN
            r := r + 2;
            WHILE r <= n AND cp[r] NOT IN (10, 13) LOOP
              r := r + 1;
            END LOOP;
          ELSE
            EXIT;
          END IF;
        END LOOP;
        EXIT WHEN cp[r] NOT IN (10, 13);
        r := r + 1;
        LOOP
          IF cp[r] IN (32, 9, 10, 13, 12, 11) THEN
            r := r + 1;
          ELSIF cp[r] = 45 AND cp[r + 1] = 45 THEN
            pl := r + 2;
            WHILE pl <= n AND cp[pl] NOT IN (10, 13) LOOP
              pl := pl + 1;
            END LOOP;
            EXIT WHEN pl > n;
            r := pl + 1;
          ELSE
            EXIT;
          END IF;
        END LOOP;
        EXIT WHEN cp[r] <> 39;
        seg := r;
        q := r + 1;
      END LOOP;
      txt := body || '''';
      nt := nt + 1;
      toks[nt] := ROW('string', txt, txt, p)::"trellis".grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Quoted identifiers: "..." and U&"...".
    pl := CASE
      WHEN c = 34 THEN 0
      WHEN c IN (85, 117) AND cp[p + 1] = 38 AND cp[p + 2] = 34 THEN 2
    END;
    IF pl IS NOT NULL THEN
      q := p + pl + 1;
      LOOP
        IF q > n THEN
          PERFORM "trellis".grammar_fail(
            'unterminated quoted identifier: expected a closing ", found end of statement', p);
        END IF;
        IF cp[q] = 34 THEN
          EXIT WHEN cp[q + 1] <> 34;
          q := q + 2;
        ELSE
          q := q + 1;
        END IF;
      END LOOP;
      IF q = p + pl + 1 THEN
        PERFORM "trellis".grammar_fail(
          'zero-length quoted identifier: expected a name between the double quotes, found ""',
          p);
      END IF;
      txt := '';
      FOR k IN p .. q LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW(CASE WHEN pl = 0 THEN 'ident' ELSE 'uident' END, txt,
        replace(substr(txt, pl + 2, length(txt) - pl - 2), '""', '"'), p)::"trellis".grammar_token;
      p := q + 1;
      CONTINUE;
    END IF;

    -- Parameters ($1) and dollar-quoted strings ($tag$...$tag$).
    IF c = 36 THEN
      q := p + 1;
      IF cp[q] BETWEEN 48 AND 57 THEN
        WHILE cp[q] BETWEEN 48 AND 57 LOOP
          q := q + 1;
        END LOOP;
        txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
        PERFORM "trellis".grammar_fail(format(
          'parameters (%s) cannot appear in a statement: expected a value, found %s', txt, txt),
          p);
      END IF;
      IF cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122 OR cp[q] = 95 OR cp[q] > 127 THEN
        WHILE cp[q] BETWEEN 48 AND 57 OR cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122
            OR cp[q] = 95 OR cp[q] > 127 LOOP
          q := q + 1;
        END LOOP;
      END IF;
      IF cp[q] <> 36 THEN
        PERFORM "trellis".grammar_fail('unexpected character: expected a token, found "$"', p);
      END IF;
      txt := array_to_string(ch[p:q], '');
      r := strpos(array_to_string(ch[q + 1:n], ''), txt);
      IF r = 0 THEN
        PERFORM "trellis".grammar_fail(format(
          'unterminated dollar-quoted string: expected %s to close it, found end of statement',
          txt), p);
      END IF;
      q := q + r + length(txt) - 1;
      txt := '';
      FOR k IN p .. q LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('string', txt, txt, p)::"trellis".grammar_token;
      p := q + 1;
      CONTINUE;
    END IF;

    -- Numbers, as Postgres 16+ reads them (0x/0o/0b integers, _ between digits).
    IF c BETWEEN 48 AND 57 OR (c = 46 AND cp[p + 1] BETWEEN 48 AND 57) THEN
      q := p;
      IF c = 48 AND cp[p + 1] IN (88, 120)
        AND (cp[p + 2] BETWEEN 48 AND 57 OR cp[p + 2] BETWEEN 65 AND 70 OR cp[p + 2] BETWEEN 97 AND 102
          OR (cp[p + 2] = 95 AND (cp[p + 3] BETWEEN 48 AND 57 OR cp[p + 3] BETWEEN 65 AND 70
            OR cp[p + 3] BETWEEN 97 AND 102))) THEN
        q := p + 2;
        WHILE cp[q] BETWEEN 48 AND 57 OR cp[q] BETWEEN 65 AND 70 OR cp[q] BETWEEN 97 AND 102
          OR (cp[q] = 95 AND (cp[q + 1] BETWEEN 48 AND 57 OR cp[q + 1] BETWEEN 65 AND 70
            OR cp[q + 1] BETWEEN 97 AND 102)) LOOP
          q := q + 1;
        END LOOP;
      ELSIF c = 48 AND cp[p + 1] IN (79, 111)
        AND (cp[p + 2] BETWEEN 48 AND 55 OR (cp[p + 2] = 95 AND cp[p + 3] BETWEEN 48 AND 55)) THEN
        q := p + 2;
        WHILE cp[q] BETWEEN 48 AND 55 OR (cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 55) LOOP
          q := q + 1;
        END LOOP;
      ELSIF c = 48 AND cp[p + 1] IN (66, 98)
        AND (cp[p + 2] IN (48, 49) OR (cp[p + 2] = 95 AND cp[p + 3] IN (48, 49))) THEN
        q := p + 2;
        WHILE cp[q] IN (48, 49) OR (cp[q] = 95 AND cp[q + 1] IN (48, 49)) LOOP
          q := q + 1;
        END LOOP;
      ELSE
        WHILE cp[q] BETWEEN 48 AND 57 OR (q > p AND cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 57)
        LOOP
          q := q + 1;
        END LOOP;
        IF cp[q] = 46 AND cp[q + 1] <> 46 THEN
          q := q + 1;
          IF cp[q] BETWEEN 48 AND 57 THEN
            WHILE cp[q] BETWEEN 48 AND 57 OR (cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 57) LOOP
              q := q + 1;
            END LOOP;
          END IF;
        END IF;
        IF cp[q] IN (69, 101) THEN
          r := CASE WHEN cp[q + 1] IN (43, 45) THEN q + 2 ELSE q + 1 END;
          IF cp[r] BETWEEN 48 AND 57 THEN
            q := r;
            WHILE cp[q] BETWEEN 48 AND 57 OR (cp[q] = 95 AND cp[q + 1] BETWEEN 48 AND 57) LOOP
              q := q + 1;
            END LOOP;
          END IF;
        END IF;
      END IF;
      txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
      IF cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122 OR cp[q] = 95 OR cp[q] > 127 THEN
        PERFORM "trellis".grammar_fail(format(
          'trailing junk after numeric literal: expected a space or an operator after %s, found %s',
          txt, to_jsonb(ch[q])::text), p);
      END IF;
      nt := nt + 1;
      toks[nt] := ROW('number', txt, txt, p)::"trellis".grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Unquoted words: keywords and identifiers. Only ASCII letters fold, as in Postgres.
    IF c BETWEEN 65 AND 90 OR c BETWEEN 97 AND 122 OR c = 95 OR c > 127 THEN
      q := p + 1;
      WHILE cp[q] BETWEEN 48 AND 57 OR cp[q] BETWEEN 65 AND 90 OR cp[q] BETWEEN 97 AND 122
          OR cp[q] = 95 OR cp[q] = 36 OR cp[q] > 127 LOOP
        q := q + 1;
      END LOOP;
      txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('word', txt,
        translate(txt, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
        p)::"trellis".grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Operators: a run of + - * / < > = ~ ! @ # % ^ & | ` ?, cut where a comment starts.
    IF c IN (43, 45, 42, 47, 60, 62, 61, 126, 33, 64, 35, 37, 94, 38, 124, 96, 63) THEN
      q := p + 1;
      WHILE cp[q] IN (43, 45, 42, 47, 60, 62, 61, 126, 33, 64, 35, 37, 94, 38, 124, 96, 63)
          AND NOT (cp[q] = 45 AND cp[q + 1] = 45) AND NOT (cp[q] = 47 AND cp[q + 1] = 42) LOOP
        q := q + 1;
      END LOOP;
      txt := '';
      FOR k IN p .. q - 1 LOOP
        txt := txt || ch[k];
      END LOOP;
      nt := nt + 1;
      toks[nt] := ROW('op', txt, txt, p)::"trellis".grammar_token;
      p := q;
      CONTINUE;
    END IF;

    -- Punctuation.
    IF c = 58 AND cp[p + 1] IN (58, 61) THEN
      q := p + 2;
    ELSIF c IN (40, 41, 91, 93, 44, 59, 46, 58) THEN
      q := p + 1;
    ELSE
      PERFORM "trellis".grammar_fail(format(
        'unexpected character: expected a token, found %s', to_jsonb(ch[p])::text), p);
    END IF;
    txt := '';
    FOR k IN p .. q - 1 LOOP
      txt := txt || ch[k];
    END LOOP;
    nt := nt + 1;
    toks[nt] := ROW('punct', txt, txt, p)::"trellis".grammar_token;
    p := q;
  END LOOP;
  nt := nt + 1;
  toks[nt] := ROW('eof', '', '', n + 1)::"trellis".grammar_token;
  RETURN toks;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m51$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 52) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (52, 'follow_through_parts', false);
    EXECUTE $trellis_m52$-- A retype followed (ADR 0047) reaches every transform downstream of it (issue #24's
-- randomized runs found two ways it did not, one of them silent):
--
-- - Through a UNION's table: a branch's target column was retyped, and the union's table
--   (0041: an engine table the branches' rows are mirrored into) kept the old type, so a
--   value the new type holds was cast into the old one on its way (numeric(12,2) rounding
--   1.005 to 1.01), and the transform reading the union saw no change of its source: the
--   target silently held other values than its statement. Now, once a round has followed
--   transforms feeding a union's table, the table's columns are retyped, in the same
--   transaction and before any refill, to the types Postgres gives the UNION ALL of its
--   branches' targets as they now are; the transforms reading the table then follow it in
--   the next round. At the round's end, not with each branch: with the branches' page
--   slots and targets held, no drain can be writing the table through a branch's mirror
--   while waiting for a branch this transaction is about to lock (a deadlock).
-- - Down a chain: the transforms reading a followed target were looked at by the same pass
--   only as they were when it began, so the target's retyped column made the staging
--   worker stop them (capture_failure) instead of following them. _follow_source_columns
--   now goes on until a round follows nothing new, each transform once.
--
-- - Keys held before the follow: tried again once it is done (_follow_transform wrapped,
--   0030's renamed _follow_transform_before_release).
--
-- _follow_source_columns (0030, its only body) is replaced, its change marked "0052".


ALTER FUNCTION "trellis"._follow_transform("trellis".transforms) RENAME TO _follow_transform_before_release;

-- As before (0030), and the transform's held keys go back into the ledger, as RESUME puts
-- them (0011): a key held between the retype and this follow (a value the new type holds
-- but the target's old column could not: "integer out of range") is tried again once the
-- target is retyped, rather than held until an operator releases it.
CREATE FUNCTION "trellis"._follow_transform(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._follow_transform_before_release(t);
  WITH released AS (
    DELETE FROM "trellis".held_keys h WHERE h.transform_id = t.id RETURNING h.source_id, h.key)
  INSERT INTO "trellis".ledger (gen, source_id, xid, keys)
  SELECT "trellis".ledger_generation(x.xid), r.source_id, x.xid,
         ARRAY[CASE WHEN cardinality(r.key) = 1 THEN r.key[1] ELSE r.key::text END]
    FROM (SELECT DISTINCT source_id, key FROM released) r,
         (SELECT pg_current_xact_id()::text::bigint AS xid) x;
END
$fn$;

-- Retypes the columns of union table `u` to the types of the UNION ALL of the targets that
-- feed it, as they are now (Postgres's resolution of the branches' types).
CREATE FUNCTION "trellis"._follow_union_table(u oid)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  cols text;
  q text;
  probe oid;
  r record;
BEGIN
  SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
    FROM pg_attribute a
   WHERE a.attrelid = u AND a.attnum > 0 AND NOT a.attisdropped
     AND a.attname NOT IN ('trellis#branch', 'trellis#key');
  SELECT string_agg(format('SELECT %s FROM %s', cols, t.target_oid::regclass), ' UNION ALL ' ORDER BY f.branch)
    INTO q
    FROM "trellis".union_feeds f JOIN "trellis".transforms t ON t.id = f.transform_id
   WHERE f.table_oid = u;
  IF q IS NULL THEN
    RETURN;
  END IF;
  EXECUTE 'CREATE TEMP TABLE trellis_union_probe AS ' || q || ' WITH NO DATA';
  probe := to_regclass('pg_temp.trellis_union_probe');
  FOR r IN
    SELECT a.attname, format_type(p.atttypid, p.atttypmod) AS want
      FROM pg_attribute a JOIN pg_attribute p ON p.attrelid = probe AND p.attname = a.attname
     WHERE a.attrelid = u AND a.attnum > 0 AND NOT a.attisdropped
       AND (a.atttypid, a.atttypmod) IS DISTINCT FROM (p.atttypid, p.atttypmod)
     ORDER BY a.attnum
  LOOP
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING %I::%s',
                   u::regclass, r.attname, r.want, r.attname, r.want);
  END LOOP;
  EXECUTE 'DROP TABLE pg_temp.trellis_union_probe';
END
$fn$;


CREATE OR REPLACE FUNCTION "trellis"._follow_source_columns()
RETURNS TABLE (target text, refused text) LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms;
  seen int[] := '{}'; -- 0052: each transform looked at once per call
  looked int;         -- 0052: how many the last round looked at
  skip boolean;       -- 0052
  round_followed int[]; -- 0052: the transforms this round followed
  u oid;              -- 0052
BEGIN
  -- 0052: rounds until one looks at nothing new: a transform followed can retype the
  -- target (or union table) another transform reads, which the next round follows.
  LOOP
  looked := 0;
  round_followed := '{}';
  FOR t IN
    SELECT x.* FROM "trellis".transforms x
     WHERE x.capture_failure IS NULL AND x.paused_at IS NULL
       AND x.id <> ALL (seen) -- 0052
       AND EXISTS (
         SELECT 1 FROM "trellis".transform_sources ts
           CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) r
           JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (r->>'attnum')::int
          WHERE ts.transform_id = x.id AND NOT a.attisdropped
            AND (a.attname <> r->>'name' OR format_type(a.atttypid, a.atttypmod) <> r->>'type'))
       -- Nothing about its sources that stops it: every read column there, every source
       -- there with its key's columns (by attnum), and no column added to one it reads
       -- whole (its rows' JSON would change shape).
       AND NOT EXISTS (
         SELECT 1 FROM "trellis".transform_sources ts
           LEFT JOIN pg_class c ON c.oid = ts.source_oid
          WHERE ts.transform_id = x.id
            AND (c.oid IS NULL
                 OR EXISTS (SELECT 1 FROM jsonb_array_elements(ts.read_attrs) r
                             LEFT JOIN pg_attribute a ON a.attrelid = ts.source_oid
                                                     AND a.attnum = (r->>'attnum')::int
                             WHERE a.attnum IS NULL OR a.attisdropped)
                 OR (SELECT array_agg(a.attnum::int ORDER BY k.i)
                       FROM pg_index i
                       CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                      WHERE i.indrelid = ts.source_oid AND i.indisprimary)
                    IS DISTINCT FROM
                    ARRAY(SELECT (SELECT (r->>'attnum')::int FROM jsonb_array_elements(ts.read_attrs) r
                                   WHERE r->>'name' = k.name)
                            FROM unnest(ts.key_columns) WITH ORDINALITY AS k(name, i) ORDER BY k.i)
                 OR (coalesce((x.spec->>'whole_row')::boolean, false) AND EXISTS (
                       SELECT 1 FROM pg_attribute a
                        WHERE a.attrelid = ts.source_oid AND a.attnum > 0 AND NOT a.attisdropped
                          AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(ts.read_attrs) r
                                           WHERE (r->>'attnum')::int = a.attnum)))))
     ORDER BY x.id
  LOOP
    seen := seen || t.id; -- 0052
    looked := looked + 1; -- 0052
    target := t.target_name;
    skip := false;
    -- 0052: a deadlock or a lock not granted (a union's table is locked too, which the
    -- drain writes through the branches' mirrors) is tried again, not taken as a refusal
    -- (which would stop the transform).
    FOR attempt IN 1 .. 5 LOOP
      BEGIN
        -- Locks in the drain's order (page slots, pipeline row, target, catalog row): the
        -- drain applying a range to this target finishes first, and none starts meanwhile.
        PERFORM 1 FROM "trellis".page_slots s WHERE s.transform_id = t.id ORDER BY s.bucket FOR UPDATE;
        PERFORM 1 FROM "trellis".pipeline p WHERE p.transform_id = t.id FOR UPDATE;
        EXECUTE 'LOCK TABLE ' || t.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
        SELECT x.* INTO t FROM "trellis".transforms x WHERE x.id = t.id FOR UPDATE;
        IF t.capture_failure IS NOT NULL OR t.paused_at IS NOT NULL THEN
          skip := true;
          EXIT;
        END IF;
        PERFORM "trellis"._follow_transform(t);
        refused := NULL;
        round_followed := round_followed || t.id;
        EXIT;
      EXCEPTION
        WHEN deadlock_detected OR lock_not_available THEN
          refused := SQLERRM;
          PERFORM pg_sleep(0.05 * attempt * (0.5 + random()));
        WHEN OTHERS THEN
          refused := SQLERRM;
          EXIT;
      END;
    END LOOP;
    CONTINUE WHEN skip;
    RETURN NEXT;
  END LOOP;
  -- 0052: the union tables the round's transforms feed, retyped as their branches now are.
  FOR u IN SELECT DISTINCT f.table_oid FROM "trellis".union_feeds f
            WHERE f.transform_id = ANY (round_followed) ORDER BY 1 LOOP
    FOR attempt IN 1 .. 5 LOOP
      BEGIN
        PERFORM "trellis"._follow_union_table(u);
        EXIT;
      EXCEPTION WHEN deadlock_detected OR lock_not_available THEN
        IF attempt = 5 THEN
          RAISE;
        END IF;
        PERFORM pg_sleep(0.05 * attempt * (0.5 + random()));
      END;
    END LOOP;
  END LOOP;
  EXIT WHEN looked = 0; -- 0052
  END LOOP;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m52$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 53) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (53, 'lateral_unnest', false);
    EXECUTE $trellis_m53$-- CROSS JOIN LATERAL over a set-returning function of the row (issue #26, item 1; ADR 0071):
--
--   ... FROM t [CROSS JOIN LATERAL | , [LATERAL] | [LEFT] JOIN LATERAL]
--         unnest(<array>) [WITH ORDINALITY] [AS] u[(x[, n])] [ON cond] ...
--   ... jsonb_array_elements(<jsonb>) / jsonb_array_elements_text(<jsonb>) likewise
--
-- is compiled, when the statement is parsed, into a join the engine already keeps: the
-- function's rows are the rows of a fixed table of positions (lateral_ordinals: 1, 2, ...)
-- joined to the row by a condition that is not an equality,
--
--   ... JOIN "trellis".lateral_ordinals AS u ON (u.ordinality = ANY (_lateral_positions(cardinality(<array>))))
--
-- and every reference to the function's value column (u.x, or x) is the element at that
-- position (_lateral_element(<array>, u.ordinality), <jsonb> -> (u.ordinality - 1), ->> for
-- _text), every reference to its ordinality column (u.n, or n) is u.ordinality. So a row's
-- expanded rows are keyed by (the row's key, the position), a change to the row re-derives
-- all of them (the join's driving key), and analysis, key maps, capture and the drain are
-- those of a join (a GROUP BY over it keeps a key map row per expanded row: the join is
-- not counted as fanning out, its rows being bounded by the row's own array). An array
-- longer than lateral_ordinals fails that row's derivation (quarantined, named).
--
-- The statement is shown as written (the AST keeps its text under lateral_statement).
--
-- Renamed and wrapped (statements without such a LATERAL go straight through, so whichever
-- migration wrote them last stays in force): parse_statement (0047) ->
-- parse_statement_before_lateral, render_statement (0046) -> render_statement_before_lateral,
-- _resolve_source (0009) -> _resolve_source_before_lateral (lateral_ordinals is the one
-- table of the engine's own a statement may read), _join_fans_out (0033) ->
-- _join_fans_out_before_lateral (lateral_ordinals left out). No body is replaced.

ALTER FUNCTION "trellis".parse_statement(text) RENAME TO parse_statement_before_lateral;
ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO render_statement_before_lateral;
ALTER FUNCTION "trellis"._resolve_source(jsonb, text) RENAME TO _resolve_source_before_lateral;
ALTER FUNCTION "trellis"._join_fans_out(jsonb) RENAME TO _join_fans_out_before_lateral;

-- The positions an expanded row can have. Never written after this migration.
CREATE TABLE "trellis".lateral_ordinals (ordinality bigint PRIMARY KEY);
INSERT INTO "trellis".lateral_ordinals SELECT generate_series(1, 100000);

-- The positions of a row's n elements (1 .. n; NULL for a NULL array), refused beyond
-- lateral_ordinals. Joined as `ordinality = ANY (positions)`: an index lookup per element,
-- which the planner estimates at a few rows per row (`ordinality <= n` it estimated at a
-- third of the table per row, so a page's statement looked big enough to be JIT-compiled,
-- seconds per statement).
CREATE FUNCTION "trellis"._lateral_positions(n int) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF n > 100000 THEN
    RAISE EXCEPTION USING ERRCODE = '54000',
      MESSAGE = format('an array of %s elements is expanded by LATERAL: Trellis keeps at most 100000 per row', n);
  END IF;
  RETURN ARRAY(SELECT generate_series(1::bigint, n));
END
$fn$;

-- Element i (1-based, in unnest's order) of an array of any dimensions and bounds.
CREATE FUNCTION "trellis"._lateral_element(a anyarray, i bigint) RETURNS anyelement
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE WHEN array_ndims(a) = 1 THEN a[array_lower(a, 1) + i - 1]
              ELSE (SELECT z.x FROM unnest(a) WITH ORDINALITY AS z(x, o) WHERE z.o = i) END
$fn$;

CREATE FUNCTION "trellis"._resolve_source(src jsonb, role text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  rel oid := to_regclass(quote_ident('trellis') || '.lateral_ordinals');
BEGIN
  IF src->>'schema' = 'trellis' AND src->>'name' = 'lateral_ordinals' THEN
    RETURN jsonb_build_object(
      'oid', rel, 'schema', 'trellis', 'name', 'lateral_ordinals',
      'alias', coalesce(src->>'alias', 'lateral_ordinals'),
      'qualified', quote_ident('trellis') || '.lateral_ordinals',
      'key_columns', jsonb_build_array('ordinality'),
      'key_types', jsonb_build_array("trellis"._key_type(rel, 1::int2)));
  END IF;
  RETURN "trellis"._resolve_source_before_lateral(src, role);
END
$fn$;

CREATE FUNCTION "trellis"._join_fans_out(spec jsonb)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT "trellis"._join_fans_out_before_lateral(jsonb_set(spec, '{sources}', (
    SELECT coalesce(jsonb_agg(s ORDER BY (s->>'ordinal')::int), '[]')
      FROM jsonb_array_elements(spec->'sources') s
     WHERE NOT (s->>'schema' = 'trellis' AND s->>'name' = 'lateral_ordinals'))))
$fn$;

-- The clause token k is in, per depth: 'from', 'select' or 'other'.
CREATE FUNCTION "trellis"._lateral_contexts(toks "trellis".grammar_token[]) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  ctx text[] := ARRAY['other'];
  d int := 1;
  out text[] := '{}';
  k int;
BEGIN
  FOR k IN 1 .. array_length(toks, 1) LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      out := out || ctx[d];
      d := d + 1;
      ctx[d] := 'other';
      CONTINUE;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := greatest(d - 1, 1);
    ELSIF toks[k].kind = 'word' THEN
      IF toks[k].value = 'from' THEN
        ctx[d] := 'from';
      ELSIF toks[k].value = 'select' THEN
        ctx[d] := 'select';
      ELSIF toks[k].value IN ('where', 'group', 'having', 'order', 'union', 'intersect', 'except',
                              'window', 'limit', 'offset', 'fetch', 'without') THEN
        ctx[d] := 'other';
      END IF;
    END IF;
    out := out || ctx[d];
  END LOOP;
  RETURN out;
END
$fn$;

-- The text of tokens lo..hi of `statement`, with the LATERAL constructs of `lats` compiled
-- and references to their columns replaced (see the header).
CREATE FUNCTION "trellis"._lateral_emit(
  statement text, toks "trellis".grammar_token[], ctx text[], lo int, hi int, lats jsonb
) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  out text := '';
  k int := lo;
  l jsonb;
  r text;
  nxt int;
  col text;
  prev "trellis".grammar_token;
  after "trellis".grammar_token;
  start int := 1;
BEGIN
  -- Nothing before the first SELECT or FROM is a reference (TRANSFORM name AS).
  WHILE start < array_length(toks, 1) AND NOT ("trellis".grammar_kw(toks[start], 'select')
                                               OR "trellis".grammar_kw(toks[start], 'from')) LOOP
    start := start + 1;
  END LOOP;
  WHILE k <= hi LOOP
    SELECT x INTO l FROM jsonb_array_elements(lats) x WHERE (x->>'s0')::int = k AND x ? 'join_sql';
    IF l IS NOT NULL THEN
      out := out || (l->>'join_sql') || ' ';
      k := (l->>'e0')::int + 1;
      CONTINUE;
    END IF;
    r := NULL;
    col := NULL;
    nxt := k + 1;
    prev := toks[k - 1];
    IF k > start AND toks[k].kind IN ('word', 'ident') AND NOT (prev.kind = 'punct' AND prev.text = '.')
       AND NOT (toks[k + 1].kind = 'punct' AND toks[k + 1].text = '(')
       AND NOT "trellis".grammar_kw(prev, 'as') THEN
      IF toks[k + 1].kind = 'punct' AND toks[k + 1].text = '.' THEN
        -- alias.column
        SELECT x INTO l FROM jsonb_array_elements(lats) x
         WHERE x->>'alias' = toks[k].value AND x ? 'elem' LIMIT 1;
        IF l IS NOT NULL THEN
          IF toks[k + 2].text = '*' THEN
            PERFORM "trellis".grammar_refuse(format('%s.* of a LATERAL function is not supported: name its columns', toks[k].text), toks[k].pos);
          ELSIF toks[k + 2].value = l->>'valcol' THEN
            r := l->>'elem'; col := l->>'valcol'; nxt := k + 3;
          ELSIF toks[k + 2].value = l->>'ordcol' AND (l->>'ordinality')::boolean THEN
            r := quote_ident(l->>'alias') || '.ordinality'; col := l->>'ordcol'; nxt := k + 3;
          END IF;
        END IF;
      ELSE
        SELECT x INTO l FROM jsonb_array_elements(lats) x
         WHERE x ? 'elem' AND (x->>'valcol' = toks[k].value
                OR (x->>'ordcol' = toks[k].value AND (x->>'ordinality')::boolean)) LIMIT 1;
        IF l IS NOT NULL THEN
          col := toks[k].value;
          r := CASE WHEN l->>'valcol' = toks[k].value THEN l->>'elem'
                    ELSE quote_ident(l->>'alias') || '.ordinality' END;
        END IF;
      END IF;
    END IF;
    IF r IS NULL THEN
      out := out || substr(statement, toks[k].pos, toks[k + 1].pos - toks[k].pos);
      k := k + 1;
      CONTINUE;
    END IF;
    -- A bare reference as a SELECT item keeps its name.
    after := toks[nxt];
    IF ctx[k] = 'select' AND ((prev.kind = 'punct' AND prev.text = ',')
          OR (prev.kind = 'word' AND prev.value IN ('select', 'distinct', 'all')))
       AND (after.kind = 'eof' OR (after.kind = 'punct' AND after.text IN (',', ')'))
            OR (after.kind = 'word' AND after.value IN ('from', 'where', 'group', 'having', 'order',
                                                        'union', 'without', 'intersect', 'except'))) THEN
      r := r || ' AS ' || quote_ident(col);
    END IF;
    out := out || r || ' ';
    k := nxt;
  END LOOP;
  RETURN out;
END
$fn$;

-- The statement with its LATERAL set-returning functions compiled (see the header), or
-- NULL when it has none.
CREATE FUNCTION "trellis"._lateral_rewrite(statement text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(statement);
  n int := array_length(toks, 1);
  ctx text[] := "trellis"._lateral_contexts(toks);
  lats jsonb := '[]';
  l jsonb;
  k int;
  f int;
  s0 int;
  c int;
  d int;
  e int;
  jt text;
  fn text;
  alias text;
  cols text[];
  ord boolean;
  on_lo int;
  on_hi int;
  arg text;
  cnt text;
  elem text;
  i int;
  q text := '"trellis"';
BEGIN
  k := 1;
  WHILE k < n LOOP
    f := NULL;
    IF ctx[k] = 'from' THEN
      IF "trellis".grammar_kw(toks[k], 'lateral') THEN
        f := k + 1;
      ELSIF ((toks[k].kind = 'punct' AND toks[k].text = ',') OR "trellis".grammar_kw(toks[k], 'join'))
            AND toks[k + 1].kind = 'word'
            AND toks[k + 1].value IN ('unnest', 'jsonb_array_elements', 'jsonb_array_elements_text')
            AND toks[k + 2].kind = 'punct' AND toks[k + 2].text = '(' THEN
        f := k + 1;
      END IF;
    END IF;
    IF f IS NULL THEN
      k := k + 1;
      CONTINUE;
    END IF;
    -- The separator before it: , | [CROSS | INNER | LEFT [OUTER]] JOIN [LATERAL]
    s0 := CASE WHEN "trellis".grammar_kw(toks[f - 1], 'lateral') THEN f - 2 ELSE f - 1 END;
    jt := 'cross';
    IF toks[s0].kind = 'punct' AND toks[s0].text = ',' THEN
      jt := 'cross';
    ELSIF "trellis".grammar_kw(toks[s0], 'join') THEN
      jt := 'inner';
      IF "trellis".grammar_kw(toks[s0 - 1], 'cross') THEN
        jt := 'cross'; s0 := s0 - 1;
      ELSIF "trellis".grammar_kw(toks[s0 - 1], 'inner') THEN
        s0 := s0 - 1;
      ELSIF "trellis".grammar_kw(toks[s0 - 1], 'left') THEN
        jt := 'left'; s0 := s0 - 1;
      ELSIF "trellis".grammar_kw(toks[s0 - 1], 'outer') AND "trellis".grammar_kw(toks[s0 - 2], 'left') THEN
        jt := 'left'; s0 := s0 - 2;
      ELSIF "trellis".grammar_kw(toks[s0 - 1], 'outer') OR "trellis".grammar_kw(toks[s0 - 1], 'right')
            OR "trellis".grammar_kw(toks[s0 - 1], 'full') THEN
        PERFORM "trellis".grammar_refuse('a RIGHT or FULL JOIN LATERAL is not supported: write CROSS JOIN LATERAL or LEFT JOIN LATERAL', toks[s0].pos);
      END IF;
    ELSE
      PERFORM "trellis".grammar_refuse('LATERAL is supported after a table only (FROM t CROSS JOIN LATERAL unnest(t.a) AS u(x))', toks[f - 1].pos);
    END IF;
    IF toks[f].kind = 'punct' AND toks[f].text = '(' THEN
      PERFORM "trellis".grammar_refuse(
        'a LATERAL subquery is not supported yet: only CROSS JOIN LATERAL over unnest(...), jsonb_array_elements(...) or jsonb_array_elements_text(...) of the row is maintained',
        toks[f - 1].pos);
    END IF;
    IF NOT (toks[f].kind = 'word' AND toks[f].value IN ('unnest', 'jsonb_array_elements', 'jsonb_array_elements_text')
            AND toks[f + 1].kind = 'punct' AND toks[f + 1].text = '(') THEN
      PERFORM "trellis".grammar_refuse(format(
        '%s over %s is not supported yet: only unnest(...), jsonb_array_elements(...) and jsonb_array_elements_text(...) of the row are maintained',
        CASE WHEN "trellis".grammar_kw(toks[s0], 'cross') THEN 'CROSS JOIN LATERAL'
             WHEN "trellis".grammar_kw(toks[f - 1], 'join') OR "trellis".grammar_kw(toks[f - 2], 'join') THEN 'JOIN LATERAL'
             ELSE 'LATERAL' END,
        coalesce(toks[f].text, 'this')),
        CASE WHEN "trellis".grammar_kw(toks[f - 1], 'lateral') THEN toks[f - 1].pos ELSE toks[f].pos END);
    END IF;
    fn := toks[f].value;
    -- Its one argument.
    c := f + 2;
    d := 0;
    WHILE toks[c].kind <> 'eof' LOOP
      IF toks[c].kind = 'punct' AND toks[c].text IN ('(', '[') THEN
        d := d + 1;
      ELSIF toks[c].kind = 'punct' AND toks[c].text IN (')', ']') THEN
        EXIT WHEN d = 0;
        d := d - 1;
      ELSIF d = 0 AND toks[c].kind = 'punct' AND toks[c].text = ',' THEN
        PERFORM "trellis".grammar_refuse(format('%s of several arguments in LATERAL is not supported yet: write one CROSS JOIN LATERAL per array', fn), toks[c].pos);
      END IF;
      c := c + 1;
    END LOOP;
    IF toks[c].kind = 'eof' THEN
      PERFORM "trellis".grammar_unexpected(toks, c, ')');
    END IF;
    IF c = f + 2 THEN
      PERFORM "trellis".grammar_refuse(format('%s() needs an argument', fn), toks[c].pos);
    END IF;
    e := c + 1;
    ord := false;
    IF "trellis".grammar_kw(toks[e], 'with') AND "trellis".grammar_kw(toks[e + 1], 'ordinality') THEN
      ord := true;
      e := e + 2;
    END IF;
    IF "trellis".grammar_kw(toks[e], 'as') THEN
      e := e + 1;
    END IF;
    alias := NULL;
    cols := '{}';
    IF toks[e].kind = 'ident' OR (toks[e].kind = 'word' AND toks[e].value NOT IN (
         'on', 'join', 'cross', 'inner', 'left', 'right', 'full', 'natural', 'where', 'group', 'having',
         'order', 'select', 'union', 'without', 'window', 'limit', 'offset', 'fetch', 'for', 'intersect', 'except')) THEN
      alias := toks[e].value;
      e := e + 1;
      IF toks[e].kind = 'punct' AND toks[e].text = '(' THEN
        e := e + 1;
        WHILE toks[e].kind IN ('word', 'ident') LOOP
          cols := cols || toks[e].value;
          e := e + 1;
          EXIT WHEN NOT (toks[e].kind = 'punct' AND toks[e].text = ',');
          e := e + 1;
        END LOOP;
        IF NOT (toks[e].kind = 'punct' AND toks[e].text = ')') THEN
          PERFORM "trellis".grammar_unexpected(toks, e, ') after the column names');
        END IF;
        e := e + 1;
        IF cardinality(cols) > (CASE WHEN ord THEN 2 ELSE 1 END) THEN
          PERFORM "trellis".grammar_refuse(format('%s has %s columns, %s names given', fn,
            CASE WHEN ord THEN 2 ELSE 1 END, cardinality(cols)), toks[e - 1].pos);
        END IF;
      END IF;
    END IF;
    IF alias IS NULL THEN
      PERFORM "trellis".grammar_refuse(format('give %s in LATERAL an alias: %s(...) AS u(x)', fn, fn), toks[f].pos);
    END IF;
    -- [LEFT | INNER] JOIN LATERAL ... ON cond: the condition, to the next join or clause.
    on_lo := NULL;
    on_hi := NULL;
    IF jt IN ('inner', 'left') THEN
      IF NOT "trellis".grammar_kw(toks[e], 'on') THEN
        PERFORM "trellis".grammar_unexpected(toks, e, 'ON');
      END IF;
      on_lo := e + 1;
      c := on_lo;
      d := 0;
      WHILE toks[c].kind <> 'eof' LOOP
        IF toks[c].kind = 'punct' AND toks[c].text IN ('(', '[') THEN
          d := d + 1;
        ELSIF toks[c].kind = 'punct' AND toks[c].text IN (')', ']') THEN
          EXIT WHEN d = 0;
          d := d - 1;
        ELSIF d = 0 AND ((toks[c].kind = 'punct' AND toks[c].text = ',') OR (toks[c].kind = 'word' AND toks[c].value IN (
             'join', 'cross', 'inner', 'left', 'right', 'full', 'natural', 'where', 'group', 'having',
             'order', 'select', 'union', 'without', 'window', 'limit', 'offset', 'fetch', 'intersect', 'except'))) THEN
          EXIT;
        END IF;
        c := c + 1;
      END LOOP;
      on_hi := c - 1;
      e := c;
    END IF;
    IF jt = 'inner' THEN
      jt := 'cross';
    END IF;
    l := jsonb_build_object('s0', s0, 'e0', e - 1, 'fn', fn, 'alias', alias, 'ordinality', ord,
      'valcol', coalesce(cols[1], CASE WHEN fn = 'unnest' THEN alias ELSE 'value' END),
      'ordcol', coalesce(cols[2], 'ordinality'), 'jt', jt,
      'arg_lo', f + 2, 'on_lo', on_lo, 'on_hi', on_hi);
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(lats) x WHERE x->>'alias' = alias) THEN
      PERFORM "trellis".grammar_refuse(format('the name %s stands for two LATERAL functions: give each its own alias', alias), toks[f].pos);
    END IF;
    lats := lats || jsonb_build_array(l);
    k := e;
  END LOOP;
  IF jsonb_array_length(lats) = 0 THEN
    RETURN NULL;
  END IF;
  -- Each one's element and join, in order (an argument may read an earlier one's column).
  FOR i IN 0 .. jsonb_array_length(lats) - 1 LOOP
    l := lats->i;
    -- The argument's bounds were taken before the closing bracket was found: recompute.
    c := (l->>'arg_lo')::int;
    d := 0;
    WHILE NOT (d = 0 AND toks[c].kind = 'punct' AND toks[c].text = ')') LOOP
      IF toks[c].kind = 'punct' AND toks[c].text IN ('(', '[') THEN d := d + 1;
      ELSIF toks[c].kind = 'punct' AND toks[c].text IN (')', ']') THEN d := d - 1; END IF;
      c := c + 1;
    END LOOP;
    arg := '(' || rtrim("trellis"._lateral_emit(statement, toks, ctx, (l->>'arg_lo')::int, c - 1,
                                               lats)) || ')';
    elem := CASE l->>'fn'
      WHEN 'unnest' THEN q || '._lateral_element(' || arg || ', ' || quote_ident(l->>'alias') || '.ordinality)'
      WHEN 'jsonb_array_elements' THEN '(' || arg || ' -> (' || quote_ident(l->>'alias') || '.ordinality - 1)::int)'
      ELSE '(' || arg || ' ->> (' || quote_ident(l->>'alias') || '.ordinality - 1)::int)' END;
    cnt := CASE l->>'fn' WHEN 'unnest' THEN 'cardinality(' || arg || ')' ELSE 'jsonb_array_length(' || arg || ')' END;
    l := l || jsonb_build_object('elem', elem);
    lats := jsonb_set(lats, ARRAY[i::text], l);
    l := l || jsonb_build_object('join_sql',
      CASE WHEN l->>'jt' = 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
      || q || '.lateral_ordinals AS ' || quote_ident(l->>'alias') || ' ON ('
      || quote_ident(l->>'alias') || '.ordinality = ANY (' || q || '._lateral_positions(' || cnt || '))'
      || CASE WHEN l->>'on_lo' IS NOT NULL
              THEN ' AND (' || rtrim("trellis"._lateral_emit(statement, toks, ctx, (l->>'on_lo')::int,
                                                            (l->>'on_hi')::int, lats)) || ')'
              ELSE '' END || ')');
    lats := jsonb_set(lats, ARRAY[i::text], l);
  END LOOP;
  RETURN "trellis"._lateral_emit(statement, toks, ctx, 1, n - 1, lats);
END
$fn$;

-- A statement with a LATERAL set-returning function: parsed as compiled, shown as written.
CREATE FUNCTION "trellis".parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  compiled text := "trellis"._lateral_rewrite(statement);
  ast jsonb;
BEGIN
  IF compiled IS NULL THEN
    RETURN "trellis".parse_statement_before_lateral(statement);
  END IF;
  ast := "trellis".parse_statement_before_lateral(compiled);
  IF ast->>'kind' = 'transform' THEN
    ast := ast || jsonb_build_object('lateral_statement',
      regexp_replace(btrim(statement, E' \t\r\n'), E'\\s*;\\s*$', ''));
  END IF;
  RETURN ast;
END
$fn$;

CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast->>'kind' = 'transform' AND ast ? 'lateral_statement' THEN
    RETURN ast->>'lateral_statement';
  END IF;
  RETURN "trellis".render_statement_before_lateral(ast);
END
$fn$;
$trellis_m53$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 54) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (54, 'set_operations', false);
    EXECUTE $trellis_m54$-- Set operations and the indexes of joins on other conditions than equalities (issue #26,
-- item 1; ADR 0072).
--
-- 1. Source indexes of joins on other conditions than equalities (`ON r.k BETWEEN l.k AND
--    l.k + 2`, `ON l.k > r.k`): the drain finds the rows a change touches through the
--    condition, run from the changed rows (a change to r looks l up by the columns of l the
--    condition compares, and the other way round). source_index_gaps (0008) named indexes
--    from equalities only; it now also names, for each join whose condition has no
--    equality the engine routes by, the columns of each side its condition reads (role
--    join_joined for the joined table, join_from for the tables before it), when no valid
--    index of that table leads with one of them.
--
-- 2. INTERSECT and EXCEPT (distinct), compiled when the statement is parsed into what the
--    engine keeps already: a GROUP BY of every column over a UNION ALL (ADR 0059) of the
--    branches, each tagged with its place, filtered by HAVING:
--
--      A INTERSECT B INTERSECT C  is
--        SELECT s."trellis#1" AS c1, ... FROM (A' UNION ALL B' UNION ALL C') AS "set#op"
--               ("trellis#1", ..., "trellis#side")
--         GROUP BY every column
--        HAVING sum(CASE WHEN side = 1 THEN 1 ELSE 0 END) > 0 AND ... (every branch)
--      A EXCEPT B EXCEPT C  is the same, HAVING max(side) = 1 (in A, in none of the others)
--
--    (X' is X with `<its place> AS "trellis#side"` added to its SELECT list.) A GROUP BY
--    treats NULLs as equal, as INTERSECT and EXCEPT do. The columns are named as the first
--    branch names them (an item's AS, or a column's own name; another expression must be
--    named). The statement is shown as written: the compiled AST keeps the union the
--    branches make, marked with the operator, under "written" (0046's mechanism), which
--    _render_view_select renders with INTERSECT or EXCEPT. INTERSECT ALL and EXCEPT ALL,
--    and set operators of different kinds in one statement, are refused by name.
--
-- 3. GROUP BY, HAVING or aggregates directly over a FULL JOIN (the first join of FROM, ADR 0066), kept as
--    the same GROUP BY over a subquery holding the FULL JOIN:
--
--      SELECT f(l.x), count(r.y) FROM l FULL JOIN r ON ... WHERE w GROUP BY f(l.x) HAVING h
--    is
--      SELECT f(j."l.x") AS f, count(j."r.y") AS count
--        FROM (SELECT l.x AS "l.x", r.y AS "r.y" FROM l FULL JOIN r ON ... WHERE w) AS "full#join"
--       GROUP BY f(j."l.x") HAVING h'
--
--    every column the SELECT list, GROUP BY and HAVING read (`alias.column`, or a bare name
--    that is no word of SQL's syntax: the grammar runs before names are resolved, so a bare
--    column named like one, `year`, needs its table's alias) selected by the subquery under a name
--    of its own and read from it. The subquery is a FULL JOIN ADR 0066 keeps (a UNION ALL
--    read by its never-NULL key), so the GROUP BY around it is kept as any GROUP BY over a
--    part. Items are named as Postgres names them (AS, a column's name, a function's name);
--    another unnamed expression is refused. Shown as written ("written", as 0046 does).
--
-- 4. A RIGHT or FULL JOIN after other joins (`a JOIN b ON c1 FULL JOIN c ON c2 ...`): the
--    joins before it made a subquery, which the RIGHT or FULL JOIN then joins as its first
--    join (ADR 0066 keeps that):
--
--      SELECT ... FROM (SELECT a.x AS "a.x", b.y AS "b.y" FROM a JOIN b ON c1) AS "joined#"
--        FULL JOIN c ON c2' ... WHERE w' [GROUP BY ...]
--
--    every column of a and b the rest reads (`alias.column`) selected by the subquery and
--    read from it. The joins before it must be inner joins (the subquery is read by its
--    key, its tables' keys, never NULL), and every column the rest reads must be written
--    with its table's alias (the grammar cannot tell whose a bare name is): refused by name
--    otherwise. Shown as written.
--
-- Renamed and wrapped (statements without these go straight through): source_index_gaps
-- (0008) -> source_index_gaps_before_setops, grammar_parse_view (four arguments, 0046) ->
-- grammar_parse_view_before_setops, _render_view_select (0046) ->
-- _render_view_select_before_setops, grammar_parse_block (0046) ->
-- grammar_parse_block_before_setops, render_statement (0046) -> render_statement_before_setops.
-- No body is replaced.

ALTER FUNCTION "trellis".source_index_gaps(int) RENAME TO source_index_gaps_before_setops;

-- The columns a join condition reads, per source: `alias.column` (a source at or before
-- the join, by its alias), and a bare name that is a column of exactly one of them.
CREATE FUNCTION "trellis"._condition_columns(p_transform_id int, p_ordinal int, cond text)
RETURNS TABLE (src int, attnum int)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token[] := "trellis".grammar_tokenize(cond);
  n int := coalesce(array_length(t, 1), 0);
  k int;
  s int;
  a int;
BEGIN
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN t[k].kind NOT IN ('word', 'ident');
    -- Part of a qualified name already read, or a function's name.
    CONTINUE WHEN k > 1 AND t[k - 1].kind = 'punct' AND t[k - 1].text = '.';
    CONTINUE WHEN k < n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '(';
    IF k + 2 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.' AND t[k + 2].kind IN ('word', 'ident') THEN
      SELECT ts.ordinal, att.attnum INTO s, a
        FROM "trellis".transform_sources ts
        JOIN pg_attribute att ON att.attrelid = ts.source_oid AND att.attname = t[k + 2].value
                              AND att.attnum > 0 AND NOT att.attisdropped
       WHERE ts.transform_id = p_transform_id AND ts.ordinal <= p_ordinal AND ts.alias = t[k].value;
      IF s IS NOT NULL THEN
        src := s; attnum := a;
        RETURN NEXT;
      END IF;
    ELSE
      IF (SELECT count(*) FROM "trellis".transform_sources ts
            JOIN pg_attribute att ON att.attrelid = ts.source_oid AND att.attname = t[k].value
                                  AND att.attnum > 0 AND NOT att.attisdropped
           WHERE ts.transform_id = p_transform_id AND ts.ordinal <= p_ordinal) = 1 THEN
        RETURN QUERY
          SELECT ts.ordinal, att.attnum::int
            FROM "trellis".transform_sources ts
            JOIN pg_attribute att ON att.attrelid = ts.source_oid AND att.attname = t[k].value
                                  AND att.attnum > 0 AND NOT att.attisdropped
           WHERE ts.transform_id = p_transform_id AND ts.ordinal <= p_ordinal;
      END IF;
    END IF;
  END LOOP;
END
$fn$;

-- As before (0008), and the indexes joins on other conditions than equalities need: for a
-- join with no equality the engine routes by (none in the spec's joins for it), the
-- columns of each side its condition reads.
CREATE FUNCTION "trellis".source_index_gaps(p_transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH t AS (SELECT * FROM "trellis".transforms WHERE id = p_transform_id),
  theta AS (
    SELECT ts.ordinal AS j, ts.join_condition AS cond
      FROM t JOIN "trellis".transform_sources ts ON ts.transform_id = t.id
     WHERE ts.ordinal > 0 AND ts.join_condition IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(t.spec->'joins', '[]')) e
                        WHERE (e->>'join')::int = ts.ordinal)
       -- LATERAL's table of positions (0053) is joined by its key from each row of the
       -- table before it (`ordinality = ANY (...)`): nothing to index on either side.
       AND NOT (ts.source_schema = 'trellis' AND ts.source_name = 'lateral_ordinals')),
  sides AS (
    SELECT DISTINCT c.src, c.attnum, CASE WHEN c.src = th.j THEN 'join_joined' ELSE 'join_from' END AS role
      FROM theta th CROSS JOIN LATERAL "trellis"._condition_columns(p_transform_id, th.j, th.cond) c),
  needs AS (
    SELECT src, role, array_agg(attnum ORDER BY attnum) AS attnums FROM sides GROUP BY src, role),
  extra AS (
    SELECT ts.ordinal, n.role, jsonb_build_object(
             'table', ts.source_schema || '.' || ts.source_name,
             'columns', to_jsonb(cols.names),
             'role', n.role,
             'opted_out', t.without_source_index,
             'fix', format('CREATE INDEX CONCURRENTLY ON %I.%I (%s)', ts.source_schema, ts.source_name,
                           (SELECT string_agg(quote_ident(c), ', ') FROM unnest(cols.names) c))) AS gap
      FROM needs n
      CROSS JOIN t
      JOIN "trellis".transform_sources ts ON ts.transform_id = t.id AND ts.ordinal = n.src
      CROSS JOIN LATERAL (
        SELECT array_agg(a.attname::text ORDER BY a.attnum) AS names
          FROM pg_attribute a WHERE a.attrelid = ts.source_oid AND a.attnum = ANY (n.attnums)) cols
     WHERE NOT EXISTS (
       SELECT 1 FROM pg_index i
        WHERE i.indrelid = ts.source_oid AND i.indisvalid AND i.indkey[0] = ANY (n.attnums))),
  before AS (
    SELECT g, o FROM jsonb_array_elements("trellis".source_index_gaps_before_setops(p_transform_id))
      WITH ORDINALITY AS y(g, o))
  SELECT coalesce(jsonb_agg(g ORDER BY o1, o2, o3), '[]') FROM (
    SELECT g, 0 AS o1, o AS o2, '' AS o3 FROM before
    UNION ALL
    SELECT x.gap, 1, x.ordinal, x.role FROM (SELECT DISTINCT ON (gap) ordinal, role, gap FROM extra) x
     WHERE NOT EXISTS (SELECT 1 FROM before b WHERE b.g = x.gap)) all_gaps
$fn$;

ALTER FUNCTION "trellis".grammar_parse_view("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_view_before_setops;
ALTER FUNCTION "trellis"._render_view_select(jsonb) RENAME TO _render_view_select_before_setops;

-- A view's SELECT: with INTERSECT or EXCEPT at its top level, compiled as the header says;
-- any other as before.
CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  op text;
  op_at int;
  has_union boolean := false;
  t2 "trellis".grammar_token[] := '{}';
  u jsonb;
  b jsonb;
  nb int;
  n int;
  names text[] := '{}';
  it jsonb;
  et "trellis".grammar_token[];
  nm text;
  with_ text;
  txt text;
  res jsonb;
  q text := quote_ident('set#op');
BEGIN
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND ("trellis".grammar_kw(toks[k], 'intersect') OR "trellis".grammar_kw(toks[k], 'except')) THEN
      IF "trellis".grammar_kw(toks[k + 1], 'all') THEN
        PERFORM "trellis".grammar_refuse(format(
          '%s ALL is not supported yet: only %s (distinct) is maintained (count each row''s copies per branch with GROUP BY over a UNION ALL)',
          upper(toks[k].value), upper(toks[k].value)), toks[k].pos);
      END IF;
      IF op IS NOT NULL AND op <> toks[k].value THEN
        PERFORM "trellis".grammar_refuse(
          'INTERSECT and EXCEPT mixed in one statement are not supported: put one of them in a subquery in FROM',
          toks[k].pos);
      END IF;
      op := toks[k].value;
      op_at := coalesce(op_at, k);
    ELSIF d = 0 AND "trellis".grammar_kw(toks[k], 'union') THEN
      has_union := true;
    END IF;
    k := k + 1;
  END LOOP;
  IF op IS NULL THEN
    RETURN "trellis".grammar_parse_view_before_setops(toks, i, target, ctes);
  END IF;
  IF has_union THEN
    PERFORM "trellis".grammar_refuse(format(
      'UNION and %s mixed in one statement are not supported: put one of them in a subquery in FROM',
      upper(op)), toks[op_at].pos);
  END IF;

  -- The branches as a UNION ALL (each INTERSECT or EXCEPT [DISTINCT] read as UNION ALL).
  k := 1;
  WHILE k <= array_length(toks, 1) LOOP
    IF k >= i AND "trellis".grammar_kw(toks[k], op) THEN
      t2 := t2 || ROW('word', 'UNION', 'union', toks[k].pos)::"trellis".grammar_token
               || ROW('word', 'ALL', 'all', toks[k].pos)::"trellis".grammar_token;
      IF "trellis".grammar_kw(toks[k + 1], 'distinct') THEN
        k := k + 1;
      END IF;
    ELSE
      t2 := t2 || toks[k];
    END IF;
    k := k + 1;
  END LOOP;
  u := "trellis".grammar_parse_view_before_setops(t2, i, target, ctes);
  IF NOT u ? 'union' THEN
    PERFORM "trellis".grammar_refuse(format('%s could not be read here', upper(op)), toks[op_at].pos);
  END IF;
  nb := jsonb_array_length(u->'union'->'branches');

  -- The columns, as the first branch names them.
  FOR it IN SELECT x FROM jsonb_array_elements(u->'select') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    nm := it->>'name';
    IF nm IS NULL THEN
      et := "trellis".grammar_tokenize(it->>'expr');
      n := array_length(et, 1);
      -- ident [. ident [. ident]] then eof
      IF et[n - 1].kind IN ('word', 'ident')
         AND (n = 2 OR (et[n - 2].kind = 'punct' AND et[n - 2].text = '.'
                        AND (n = 4 OR (n = 6 AND et[2].kind = 'punct' AND et[2].text = '.')))) THEN
        nm := et[n - 1].value;
      ELSE
        PERFORM "trellis".grammar_refuse(format(
          'a column of %s must be named in its first SELECT: write %s AS name', upper(op), it->>'expr'),
          coalesce((it->>'position')::int, toks[i].pos));
      END IF;
    END IF;
    names := names || nm;
  END LOOP;
  n := cardinality(names);

  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(u->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';

  txt := coalesce(with_, '') || 'SELECT '
    || (SELECT string_agg(format('%s.%I AS %I', q, 'trellis#' || o, nm2), ', ' ORDER BY o)
          FROM unnest(names) WITH ORDINALITY AS x(nm2, o))
    || ' FROM ('
    || (SELECT string_agg("trellis"._render_view_select(br || jsonb_build_object('select',
                 (br->'select') || jsonb_build_array(jsonb_build_object('expr', o::text, 'name', 'trellis#side',
                   'position', NULL, 'bare_label', NULL, 'label_expr', NULL)))), ' UNION ALL ' ORDER BY o)
          FROM jsonb_array_elements(u->'union'->'branches') WITH ORDINALITY AS x(br, o))
    || ') AS ' || q || ' ('
    || (SELECT string_agg(quote_ident('trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o)
    || ', "trellis#side") GROUP BY '
    || (SELECT string_agg(format('%s.%I', q, 'trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o)
    || ' HAVING '
    || CASE WHEN op = 'intersect'
         THEN (SELECT string_agg(format('sum(CASE WHEN %s."trellis#side" = %s THEN 1 ELSE 0 END) > 0', q, o), ' AND ' ORDER BY o)
                 FROM generate_series(1, nb) o)
         ELSE format('max(%s."trellis#side") = 1', q) END
    || CASE WHEN (u->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (u->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  res := "trellis".grammar_parse_view_before_setops("trellis".grammar_tokenize(txt), 1, target, ctes);
  RETURN res || jsonb_build_object('written', u || jsonb_build_object('union', (u->'union') || jsonb_build_object('setop', op)));
END
$fn$;

-- A view's SELECT as text: a union marked with a set operator (the written form of an
-- INTERSECT or EXCEPT) joined by it; a block marked "written_outer" (a RIGHT or FULL JOIN
-- after other joins, as written) with that join's word; any other as before.
CREATE FUNCTION "trellis"._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  with_ text;
  sentinel text := 'trellis#outer#join#item';
  m int;
  txt text;
  marker text;
BEGIN
  IF ast ? 'written_outer' THEN
    -- A RIGHT or FULL JOIN after other joins, as written: parsed as a LEFT JOIN, its word
    -- put back (the join found by a name no statement holds, as 0046 finds the first).
    m := (ast->'written_outer'->>'at')::int;
    txt := "trellis"._render_view_select(jsonb_set(ast - 'written_outer', ARRAY['joins', m::text],
      jsonb_build_object('schema', NULL, 'name', sentinel, 'alias', NULL, 'type', 'left', 'on', ast->'joins'->m->>'on')));
    marker := 'LEFT JOIN ' || quote_ident(sentinel);
    RETURN overlay(txt PLACING upper(ast->'written_outer'->>'kind') || ' JOIN ' || "trellis"._render_view_item(ast, ast->'joins'->m)
                   FROM strpos(txt, marker) FOR length(marker));
  END IF;
  IF NOT (ast ? 'union' AND ast->'union' ? 'setop') THEN
    RETURN "trellis"._render_view_select_before_setops(ast);
  END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  RETURN coalesce(with_, '') || (
    SELECT string_agg("trellis"._render_view_select(b), ' ' || upper(ast->'union'->>'setop') || ' ' ORDER BY o)
      FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o));
END
$fn$;

ALTER FUNCTION "trellis".grammar_parse_block("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_setops;

-- An expression with every column it reads from `sources` (the aliases of FROM) replaced by the subquery's column ("full#join"."alias.column", or "full#join".
-- "column" for a bare name): {expr, columns: {name: expression in the subquery}}.
CREATE FUNCTION "trellis"._full_join_refs(expr text, sources jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token[] := "trellis".grammar_tokenize(expr);
  n int := coalesce(array_length(t, 1), 0);
  k int;
  cols jsonb := '{}';
  edits jsonb := '[]';
  e jsonb;
  nm text;
  q text := quote_ident('full#join');
BEGIN
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN t[k].kind NOT IN ('word', 'ident');
    CONTINUE WHEN k > 1 AND t[k - 1].kind = 'punct' AND t[k - 1].text IN ('.', '::');
    CONTINUE WHEN k < n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '(';
    IF k + 2 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.' THEN
      CONTINUE WHEN NOT sources ? t[k].value;
      IF t[k + 2].kind NOT IN ('word', 'ident') THEN
        PERFORM "trellis"._fail('TRV01', format(
          'GROUP BY over a FULL JOIN reads %s.%s: name the columns (alias.column)', t[k].text, t[k + 2].text));
      END IF;
      nm := t[k].value || '.' || t[k + 2].value;
      cols := cols || jsonb_build_object(nm, quote_ident(t[k].value) || '.' || quote_ident(t[k + 2].value));
      edits := edits || jsonb_build_object('from', t[k].pos, 'to', t[k + 2].pos + length(t[k + 2].text),
                                            'text', q || '.' || quote_ident(nm));
    ELSE
      -- A bare name: a column, unless it is a word of SQL's syntax (a keyword other than an
      -- unreserved one, or one of the unreserved words expressions use), a typed literal's
      -- type (date '…'), or a table's alias (a whole row).
      CONTINUE WHEN k < n AND t[k + 1].kind = 'string';
      CONTINUE WHEN sources ? t[k].value;
      CONTINUE WHEN t[k].kind = 'word' AND (
        EXISTS (SELECT 1 FROM pg_get_keywords() w WHERE w.word = t[k].value AND w.catcode <> 'U')
        OR t[k].value IN ('at', 'zone', 'nulls', 'first', 'last', 'escape', 'within', 'over', 'filter',
                          'ordinality', 'day', 'hour', 'minute', 'second', 'month', 'year', 'to'));
      nm := t[k].value;
      cols := cols || jsonb_build_object(nm, quote_ident(nm));
      edits := edits || jsonb_build_object('from', t[k].pos, 'to', t[k].pos + length(t[k].text),
                                            'text', q || '.' || quote_ident(nm));
    END IF;
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(edits) x ORDER BY (x->>'from')::int DESC LOOP
    expr := overlay(expr PLACING e->>'text' FROM (e->>'from')::int FOR (e->>'to')::int - (e->>'from')::int);
  END LOOP;
  RETURN jsonb_build_object('expr', expr, 'columns', cols);
END
$fn$;

-- The name Postgres gives a SELECT item written without AS: a column's own name, or a
-- function call's name; NULL for anything else.
CREATE FUNCTION "trellis"._item_default_name(expr text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token[] := "trellis".grammar_tokenize(expr);
  n int := array_length(t, 1);
  d int := 0;
  k int;
BEGIN
  IF t[n - 1].kind IN ('word', 'ident')
     AND (n = 2 OR (t[n - 2].kind = 'punct' AND t[n - 2].text = '.'
                    AND (n = 4 OR (n = 6 AND t[2].kind = 'punct' AND t[2].text = '.')))) THEN
    RETURN t[n - 1].value;
  END IF;
  -- f(...) and nothing after its closing bracket.
  IF t[1].kind IN ('word', 'ident') AND t[2].kind = 'punct' AND t[2].text = '(' THEN
    FOR k IN 2 .. n - 1 LOOP
      IF t[k].kind = 'punct' AND t[k].text IN ('(', '[') THEN
        d := d + 1;
      ELSIF t[k].kind = 'punct' AND t[k].text IN (')', ']') THEN
        d := d - 1;
        IF d = 0 THEN
          RETURN CASE WHEN k = n - 1 THEN t[1].value END;
        END IF;
      END IF;
    END LOOP;
  END IF;
  RETURN NULL;
END
$fn$;

-- An expression with every `alias.column` of `sources` (aliases) replaced by the column of
-- the subquery q ("alias.column"): {expr, columns: {name: expression in the subquery},
-- bare: [the bare names that may be columns]}.
CREATE FUNCTION "trellis"._prefix_refs(expr text, sources jsonb, q text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token[] := "trellis".grammar_tokenize(expr);
  n int := coalesce(array_length(t, 1), 0);
  k int;
  cols jsonb := '{}';
  bare jsonb := '[]';
  edits jsonb := '[]';
  e jsonb;
  nm text;
BEGIN
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN t[k].kind NOT IN ('word', 'ident');
    CONTINUE WHEN k > 1 AND t[k - 1].kind = 'punct' AND t[k - 1].text IN ('.', '::');
    CONTINUE WHEN k < n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '(';
    IF k + 2 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.' THEN
      CONTINUE WHEN NOT sources ? t[k].value;
      IF t[k + 2].kind NOT IN ('word', 'ident') THEN
        PERFORM "trellis"._fail('TRV01', format(
          'a RIGHT or FULL JOIN after another join reads %s.%s: name the columns (alias.column)', t[k].text, t[k + 2].text));
      END IF;
      nm := t[k].value || '.' || t[k + 2].value;
      cols := cols || jsonb_build_object(nm, quote_ident(t[k].value) || '.' || quote_ident(t[k + 2].value));
      edits := edits || jsonb_build_object('from', t[k].pos, 'to', t[k + 2].pos + length(t[k + 2].text),
                                            'text', q || '.' || quote_ident(nm));
    ELSIF NOT (k < n AND t[k + 1].kind = 'string')
          AND NOT (k + 1 <= n AND t[k + 1].kind = 'punct' AND t[k + 1].text = '.')
          AND NOT (t[k].kind = 'word' AND (
            EXISTS (SELECT 1 FROM pg_get_keywords() w WHERE w.word = t[k].value AND w.catcode <> 'U')
            OR t[k].value IN ('at', 'zone', 'nulls', 'first', 'last', 'escape', 'within', 'over', 'filter',
                              'ordinality', 'day', 'hour', 'minute', 'second', 'month', 'year', 'to'))) THEN
      bare := bare || to_jsonb(t[k].text);
    END IF;
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(edits) x ORDER BY (x->>'from')::int DESC LOOP
    expr := overlay(expr PLACING e->>'text' FROM (e->>'from')::int FOR (e->>'to')::int - (e->>'from')::int);
  END LOOP;
  RETURN jsonb_build_object('expr', expr, 'columns', cols, 'bare', bare);
END
$fn$;

-- A SELECT block with a RIGHT or FULL JOIN after other joins, compiled as the header says
-- (then read again, by grammar_parse_block); NULL for any other block.
CREATE FUNCTION "trellis"._outer_join_later(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  f int;
  first_join int;
  outer_at int;
  kind text;
  m int := 0;
  t2 "trellis".grammar_token[];
  ast jsonb;
  written jsonb;
  sources jsonb := '{}';
  item jsonb;
  j jsonb;
  r jsonb;
  cols jsonb := '{}';
  bare jsonb := '[]';
  items text[] := '{}';
  joins_txt text := '';
  groups text[] := '{}';
  on_ text;
  where_ text;
  having_ text;
  nm text;
  g text;
  p_txt text;
  with_ text;
  txt text;
  o int;
  q text := quote_ident('joined#');
BEGIN
  IF NOT "trellis".grammar_kw(toks[i], 'select') THEN
    RETURN NULL;
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND "trellis".grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL THEN
      IF (toks[k].kind = 'punct' AND toks[k].text = ',')
         OR (toks[k].kind = 'word' AND toks[k].value IN ('join', 'inner', 'cross', 'natural'))
         OR ("trellis".grammar_kw(toks[k], 'left') AND coalesce(toks[k + 1].text, '') <> '(')
         OR "trellis"._outer_join_at(toks, k) IS NOT NULL THEN
        IF first_join IS NULL THEN
          first_join := k;
        END IF;
        -- Count the joins before the outer one (a JOIN word after INNER or LEFT is its own).
        IF outer_at IS NULL AND toks[k].kind = 'word' AND toks[k].value = 'join'
           AND NOT (k > 1 AND toks[k - 1].kind = 'word' AND toks[k - 1].value IN ('inner', 'left', 'outer', 'cross', 'natural')) THEN
          m := m + 1;
        ELSIF outer_at IS NULL AND toks[k].kind = 'word' AND toks[k].value IN ('inner', 'left', 'cross', 'natural') THEN
          m := m + 1;
        END IF;
      END IF;
      IF outer_at IS NULL AND "trellis"._outer_join_at(toks, k) IS NOT NULL AND k <> first_join THEN
        outer_at := k;
        kind := toks[k].value;
      END IF;
    END IF;
    k := k + 1;
  END LOOP;
  IF outer_at IS NULL THEN
    RETURN NULL;
  END IF;

  -- Parsed with that join read as a LEFT JOIN; its word kept to be shown.
  t2 := toks;
  t2[outer_at] := ROW('word', 'LEFT', 'left', toks[outer_at].pos)::"trellis".grammar_token;
  ast := "trellis".grammar_parse_block_before_joins(t2, i, target, ctes);
  IF ast ? 'window' OR ast ? 'distinct_on'
     OR jsonb_array_length(coalesce(ast->'joins', '[]')) <= m OR ast->'joins'->m->>'type' <> 'left' THEN
    RETURN NULL;
  END IF;
  FOR o IN 0 .. m - 1 LOOP
    IF ast->'joins'->o->>'type' <> 'inner' THEN
      PERFORM "trellis".grammar_refuse(format(
        'a %s JOIN after a %s JOIN is not supported yet: only after inner joins (the joins before it are kept as a subquery, read by its tables'' keys)',
        upper(kind), upper(ast->'joins'->o->>'type')), toks[outer_at].pos);
    END IF;
  END LOOP;
  written := ast || jsonb_build_object('written_outer', jsonb_build_object('at', m, 'kind', kind));

  -- The joins before it, and their aliases.
  p_txt := "trellis"._render_view_item(ast, ast->'from');
  sources := jsonb_build_object(coalesce(ast->'from'->>'alias', ast->'from'->>'part', ast->'from'->>'name'), true);
  FOR o IN 0 .. m - 1 LOOP
    j := ast->'joins'->o;
    p_txt := p_txt || ' JOIN ' || "trellis"._render_view_item(ast, j) || ' ON ' || (j->>'on');
    sources := sources || jsonb_build_object(coalesce(j->>'alias', j->>'part', j->>'name'), true);
  END LOOP;

  FOR item IN SELECT x FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS y(x, o2) ORDER BY o2 LOOP
    nm := coalesce(item->>'name', "trellis"._item_default_name(item->>'expr'));
    IF nm IS NULL THEN
      PERFORM "trellis".grammar_refuse(format(
        'a %s JOIN after another join: name this column (%s AS name)', upper(kind), item->>'expr'),
        coalesce((item->>'position')::int, toks[i].pos));
    END IF;
    r := "trellis"._prefix_refs(item->>'expr', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    items := items || ((r->>'expr') || ' AS ' || quote_ident(nm));
  END LOOP;
  FOR o IN m .. jsonb_array_length(ast->'joins') - 1 LOOP
    j := ast->'joins'->o;
    r := "trellis"._prefix_refs(j->>'on', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    joins_txt := joins_txt || ' ' || CASE WHEN o = m THEN upper(kind) || ' JOIN '
                                          WHEN j->>'type' = 'left' THEN 'LEFT JOIN ' ELSE 'JOIN ' END
      || "trellis"._render_view_item(ast, j) || ' ON ' || (r->>'expr');
  END LOOP;
  IF ast->>'where' IS NOT NULL THEN
    r := "trellis"._prefix_refs(ast->>'where', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    where_ := r->>'expr';
  END IF;
  FOR g IN SELECT x FROM jsonb_array_elements_text(coalesce(ast->'group_by', '[]')) WITH ORDINALITY AS y(x, o2) ORDER BY o2 LOOP
    r := "trellis"._prefix_refs(g, sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    groups := groups || (r->>'expr');
  END LOOP;
  IF ast->>'having' IS NOT NULL THEN
    r := "trellis"._prefix_refs(ast->>'having', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    having_ := r->>'expr';
  END IF;
  IF jsonb_array_length(bare) > 0 THEN
    PERFORM "trellis".grammar_refuse(format(
      'a %s JOIN after another join needs every column written with its table''s alias (alias.column): %s',
      upper(kind), (SELECT string_agg(DISTINCT x, ', ') FROM jsonb_array_elements_text(bare) x)), toks[outer_at].pos);
  END IF;

  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o3) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o3)
   WHERE p->>'kind' = 'cte';
  txt := coalesce(with_, '') || 'SELECT '
    || CASE WHEN coalesce((ast->>'distinct')::boolean, false) THEN 'DISTINCT ' ELSE '' END
    || array_to_string(items, ', ')
    || ' FROM (SELECT '
    || CASE WHEN cols = '{}' THEN '1 AS "trellis#one"'
            ELSE (SELECT string_agg((c.value #>> '{}') || ' AS ' || quote_ident(c.key), ', ' ORDER BY c.key) FROM jsonb_each(cols) c) END
    || ' FROM ' || p_txt || ') AS ' || q
    || joins_txt
    || coalesce(' WHERE ' || where_, '')
    || CASE WHEN cardinality(groups) > 0 THEN ' GROUP BY ' || array_to_string(groups, ', ') ELSE '' END
    || coalesce(' HAVING ' || having_, '')
    || CASE WHEN (ast->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  RETURN "trellis".grammar_parse_block("trellis".grammar_tokenize(txt), 1, target, ctes)
    || jsonb_build_object('written', written);
END
$fn$;

-- A SELECT block with GROUP BY or HAVING over a FULL JOIN, compiled as the header says;
-- any other as before.
CREATE FUNCTION "trellis".grammar_parse_block(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  f int;
  full_at int;
  grouped boolean := false;
  t2 "trellis".grammar_token[];
  ast jsonb;
  written jsonb;
  sources jsonb := '{}';
  item jsonb;
  r jsonb;
  cols jsonb := '{}';
  items text[] := '{}';
  groups text[] := '{}';
  having_ text;
  nm text;
  g text;
  inner_ jsonb;
  with_ text;
  txt text;
  q text := quote_ident('full#join');
BEGIN
  -- A RIGHT or FULL JOIN after other joins first (its result may then group over a FULL JOIN).
  ast := "trellis"._outer_join_later(toks, i, target, ctes);
  IF ast IS NOT NULL THEN
    RETURN ast;
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND "trellis".grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL AND full_at IS NULL AND "trellis"._outer_join_at(toks, k) = 'full' THEN
      full_at := k;
    ELSIF d = 0 AND f IS NOT NULL AND (("trellis".grammar_kw(toks[k], 'group') AND "trellis".grammar_kw(toks[k + 1], 'by'))
                                       OR "trellis".grammar_kw(toks[k], 'having')) THEN
      grouped := true;
    ELSIF f IS NULL AND toks[k].kind = 'word' AND toks[k + 1].kind = 'punct' AND toks[k + 1].text = '('
          AND (k = 1 OR NOT (toks[k - 1].kind = 'punct' AND toks[k - 1].text = '.'))
          AND toks[k].value IN ('count', 'sum', 'avg', 'min', 'max', 'bool_and', 'bool_or', 'every',
                                'array_agg', 'string_agg', 'json_agg', 'jsonb_agg', 'json_object_agg',
                                'jsonb_object_agg', 'stddev', 'stddev_pop', 'stddev_samp', 'variance',
                                'var_pop', 'var_samp', 'bit_and', 'bit_or', 'bit_xor') THEN
      -- An aggregate in the SELECT list (or one named as one): grouped, without GROUP BY.
      grouped := true;
    END IF;
    k := k + 1;
  END LOOP;
  IF full_at IS NULL OR NOT grouped THEN
    RETURN "trellis".grammar_parse_block_before_setops(toks, i, target, ctes);
  END IF;

  -- Parsed as written (the FULL JOIN read as a LEFT JOIN, its word kept as 0046 keeps it).
  t2 := toks;
  t2[full_at] := ROW('word', 'LEFT', 'left', toks[full_at].pos)::"trellis".grammar_token;
  ast := "trellis".grammar_parse_block_before_joins(t2, i, target, ctes);
  IF ast->'joins'->0 IS NULL OR ast->'joins'->0->>'type' <> 'left' OR (ast->>'distinct')::boolean
     OR ast ? 'window' OR ast ? 'distinct_on' THEN
    -- Not the first join, or a form refused anyway: as before (refused by name there).
    RETURN "trellis".grammar_parse_block_before_setops(toks, i, target, ctes);
  END IF;
  written := ast || jsonb_build_object('written_join', 'full');

  -- The tables of FROM, by alias.
  FOR item IN SELECT x FROM (SELECT ast->'from' AS x, 0 AS o
                             UNION ALL SELECT j, o FROM jsonb_array_elements(ast->'joins') WITH ORDINALITY AS y(j, o)) z ORDER BY o LOOP
    sources := sources || jsonb_build_object(coalesce(item->>'alias', item->>'part', item->>'name'), true);
  END LOOP;

  FOR item IN SELECT x FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    nm := coalesce(item->>'name', "trellis"._item_default_name(item->>'expr'));
    IF nm IS NULL THEN
      PERFORM "trellis".grammar_refuse(format(
        'GROUP BY over a FULL JOIN: name this column (%s AS name)', item->>'expr'),
        coalesce((item->>'position')::int, toks[i].pos));
    END IF;
    r := "trellis"._full_join_refs(item->>'expr', sources);
    cols := cols || (r->'columns');
    items := items || ((r->>'expr') || ' AS ' || quote_ident(nm));
  END LOOP;
  FOR g IN SELECT x FROM jsonb_array_elements_text(coalesce(ast->'group_by', '[]')) WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    r := "trellis"._full_join_refs(g, sources);
    cols := cols || (r->'columns');
    groups := groups || (r->>'expr');
  END LOOP;
  IF ast->>'having' IS NOT NULL THEN
    r := "trellis"._full_join_refs(ast->>'having', sources);
    cols := cols || (r->'columns');
    having_ := r->>'expr';
  END IF;

  -- The subquery: the FULL JOIN as written, selecting the columns read around it.
  inner_ := (written - 'group_by' - 'having' - 'target' - 'without_source_index' - 'without_row_security')
    || jsonb_build_object('group_by', '[]'::jsonb, 'having', NULL,
         'parts', coalesce((SELECT jsonb_agg(x ORDER BY o) FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS y(x, o)
                             WHERE x->>'kind' <> 'cte'), '[]'),
         'select', CASE WHEN cols = '{}' THEN jsonb_build_array(jsonb_build_object('expr', '1', 'name', 'trellis#one'))
                   ELSE (SELECT jsonb_agg(jsonb_build_object('expr', c.value #>> '{}', 'name', c.key) ORDER BY c.key)
                           FROM jsonb_each(cols) c) END);
  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p->>'kind' = 'cte';
  txt := coalesce(with_, '') || 'SELECT ' || array_to_string(items, ', ')
    || ' FROM (' || "trellis"._render_view_select(inner_) || ') AS ' || q
    || CASE WHEN cardinality(groups) > 0 THEN ' GROUP BY ' || array_to_string(groups, ', ') ELSE '' END
    || coalesce(' HAVING ' || having_, '')
    || CASE WHEN (ast->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  RETURN "trellis".grammar_parse_block_before_setops("trellis".grammar_tokenize(txt), 1, target, ctes)
    || jsonb_build_object('written', written);
END
$fn$;

ALTER FUNCTION "trellis".render_statement(jsonb) RENAME TO render_statement_before_setops;

-- render_statement: a statement whose own FROM has a RIGHT or FULL JOIN after other joins,
-- as written; every other as before.
CREATE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  w jsonb;
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast::text LIKE '%"written_outer"%'
     OR starts_with(coalesce(ast->'target'->>'name', ''), 'trellis#') THEN
    RETURN "trellis".render_statement_before_setops(ast);
  END IF;
  w := "trellis"._joins_as_written(ast);
  IF NOT w ? 'written_outer' THEN
    RETURN "trellis".render_statement_before_setops(ast);
  END IF;
  RETURN 'TRANSFORM ' || "trellis".grammar_render_name(w -> 'target' ->> 'schema', w -> 'target' ->> 'name')
    || ' AS ' || "trellis"._render_view_select(w)
    || CASE WHEN (w ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (w ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
END
$fn$;
$trellis_m54$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 55) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (55, 'generator_findings', false);
    EXECUTE $trellis_m55$-- Two engine bugs the differential tests' view SQL found (issue #24, item 4; test/
-- view-sql-regressions.test.ts keeps each minimised):
--
-- 1. A top-N's rank filter in brackets was not seen. `WHERE (dt.rn <= 1) AND (…)`, as
--    pg_get_viewdef() writes every condition, was refused ("the statement reading dt must
--    filter it with WHERE rn <= k"): _topn_bound (0045) split the WHERE at its top-level
--    ANDs and read each conjunct bare. It now reads the conjuncts as _semi_conjuncts (0048)
--    splits them, brackets taken off, so `(rn <= 2)` and `((a) AND (rn = 1))` are read.
--
-- 2. A UNION branch other than the first selecting one column twice (`… UNION ALL SELECT
--    b.id, b.id FROM b`) was refused: valid SQL (the union's columns take the first
--    branch's names), but _define_union (0041) checks each branch alone, as a view, under
--    its own output names, and a view cannot have two columns named `id`. The names a
--    later branch gives its columns mean nothing to the union, and each branch's part is
--    defined under the union's names anyway: the branches after the first are now checked
--    with each unnamed item (but bare labels, which that check reads) named
--    `trellis#c<n>`, and the union returned as written (for rendering).
--
-- 3. A semi- or anti-join as a term of an OR, in brackets (`WHERE ((EXISTS (SELECT …)) OR
--    (x > 1))`, pg_get_viewdef()'s form again) was refused as "inside an AND or another
--    expression under an OR": _semi_or_terms (0044) gave each term with its brackets, and
--    a term in brackets is no EXISTS, IN or NOT IN to the shape it is read by. Each term now
--    comes without the brackets around the whole of it.
--
-- 4. A source column renamed that a DISTINCT ON reads in its DISTINCT ON expressions or
--    ORDER BY (and nowhere else) stopped the transform (`capture_failure`: "its definition
--    no longer holds") instead of being followed: _rename_in_ast (0030) renames the
--    SELECT list, WHERE, GROUP BY, HAVING and ON, and the stored AST of a DISTINCT ON
--    keeps its DISTINCT ON and ORDER BY as written (0045), which it did not rename.
--
-- Renamed here and wrapped:
--   _topn_bound (0045)     -> _topn_bound_before_parens
--   _define_union (0041)   -> _define_union_before_twice
--   _semi_or_terms (0044)  -> _semi_or_terms_before_parens
--   _rename_in_ast (0030)  -> _rename_in_ast_before_distinct_on
-- No other function is replaced.

ALTER FUNCTION "trellis"._topn_bound(text, text, text) RENAME TO _topn_bound_before_parens;

CREATE FUNCTION "trellis"._topn_bound(where_ text, alias text, rn text)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  c text;
  n int;
  best int;
BEGIN
  IF where_ IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH c IN ARRAY "trellis"._semi_conjuncts(where_) LOOP
    n := "trellis"._topn_bound_before_parens(c, alias, rn);
    IF n IS NOT NULL AND (best IS NULL OR n < best) THEN
      best := n;
    END IF;
  END LOOP;
  RETURN best;
END
$fn$;

ALTER FUNCTION "trellis"._define_union(jsonb, text, text, jsonb) RENAME TO _define_union_before_twice;

CREATE FUNCTION "trellis"._define_union(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  branches jsonb := '[]';
  branch jsonb;
  b bigint;
  res jsonb;
BEGIN
  FOR branch, b IN SELECT x, o FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS y(x, o) LOOP
    IF b > 1 AND jsonb_typeof(branch->'select') = 'array' THEN
      branch := branch || jsonb_build_object('select', (
        SELECT jsonb_agg(CASE WHEN i->>'bare_label' IS NULL
                              THEN i || jsonb_build_object('name', 'trellis#c' || n)
                              ELSE i END ORDER BY n)
          FROM jsonb_array_elements(branch->'select') WITH ORDINALITY AS z(i, n)));
    END IF;
    branches := branches || jsonb_build_array(branch);
  END LOOP;
  res := "trellis"._define_union_before_twice(
    jsonb_set(ast, '{union,branches}', branches), root, path, scope);
  IF res->'ast' ? 'union' THEN
    res := jsonb_set(res, '{ast,union}', ast->'union');
  END IF;
  RETURN res;
END
$fn$;

ALTER FUNCTION "trellis"._semi_or_terms(text) RENAME TO _semi_or_terms_before_parens;

CREATE FUNCTION "trellis"._semi_or_terms(cond text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  terms text[] := "trellis"._semi_or_terms_before_parens(cond);
  res text[] := '{}';
  t text;
  toks "trellis".grammar_token[];
  n int;
BEGIN
  IF terms IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH t IN ARRAY terms LOOP
    LOOP
      toks := "trellis".grammar_tokenize(t);
      n := array_length(toks, 1) - 1;  -- the last token before eof
      EXIT WHEN NOT (n >= 2 AND toks[1].kind = 'punct' AND toks[1].text = '('
                     AND "trellis"._closing_token(toks, 1) = n);
      t := "trellis".grammar_text(toks, 2, n);
    END LOOP;
    res := res || t;
  END LOOP;
  RETURN res;
END
$fn$;

ALTER FUNCTION "trellis"._rename_in_ast(jsonb, int, text, text) RENAME TO _rename_in_ast_before_distinct_on;

CREATE FUNCTION "trellis"._rename_in_ast(ast jsonb, ordinal int, old_name text, new_name text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  src jsonb := CASE WHEN ordinal = 0 THEN ast->'from' ELSE ast->'joins'->(ordinal - 1) END;
  alias text := coalesce(src->>'alias', src->>'name');
BEGIN
  IF ast ? 'distinct_on' THEN
    ast := ast || jsonb_build_object(
      'distinct_on', (SELECT coalesce(jsonb_agg(to_jsonb("trellis"._rename_in_expression(e, alias, old_name, new_name)) ORDER BY n), '[]')
                        FROM jsonb_array_elements_text(ast->'distinct_on') WITH ORDINALITY AS x(e, n)),
      'order_by', (SELECT coalesce(jsonb_agg(o || jsonb_build_object('expr', "trellis"._rename_in_expression(o->>'expr', alias, old_name, new_name)) ORDER BY n), '[]')
                     FROM jsonb_array_elements(ast->'order_by') WITH ORDINALITY AS x(o, n)));
  END IF;
  RETURN "trellis"._rename_in_ast_before_distinct_on(ast, ordinal, old_name, new_name);
END
$fn$;
$trellis_m55$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 56) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (56, 'redefine_unions', false);
    EXECUTE $trellis_m56$-- Redefinitions in place to, from and between statements with UNION [ALL] (issue #25
-- follow-up; ADR 0055's third addendum). 0047 refused a UNION anywhere in the new
-- statement by name; 0047's parts machinery already covers it: _define_parts (0041's
-- wrapper) defines a union's branches and its table like any part, under the root name
-- it is given ("trellis#<t>~<id>#…", so the branches and the union's table
-- "trellis#<t>~<id>#union" never meet the ones in force), and _drop_parts_of (0047) drops
-- the union tables the dropped parts fed. What 0047 lacked: a union at the top of the new
-- statement (no WITH queries, no derived table) was not seen as a statement with parts.
--
-- Renamed here and wrapped: _redefine (0047's) -> _redefine_before_unions. Statements
-- without a UNION in the new definition go straight through to it; a union's goes the
-- same way as 0047's parts (its body copied, the refusal lifted, "has parts" including a
-- union at the top; changes marked "0056").

ALTER FUNCTION "trellis"._redefine(jsonb) RENAME TO _redefine_before_unions;

CREATE FUNCTION "trellis"._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  def jsonb := ast->'definition';
  res jsonb;
  result jsonb;
  shadow_id int;
BEGIN
  IF t.part_of IS NOT NULL OR t.redefines IS NOT NULL OR NOT "trellis"._has_union(def) THEN
    RETURN "trellis"._redefine_before_unions(ast);
  END IF;
  -- A switch to a redefinition being replaced finishes first (as _redefine_one waits).
  PERFORM 1 FROM "trellis".pipeline px
   WHERE px.transform_id = t.id
      OR px.transform_id IN (SELECT y.id FROM "trellis".transforms y WHERE y.redefines = t.id)
   ORDER BY px.transform_id FOR UPDATE;
  IF NOT EXISTS (SELECT 1 FROM "trellis".transforms y WHERE y.id = t.id) THEN
    PERFORM "trellis"._fail('TRT01', format(
      'transform %I was switched to another definition while this statement waited: apply it again', t.target_name));
  END IF;
  -- A redefinition being built is replaced: its shadow, its parts and its union tables go
  -- first (their names are this one's).
  DELETE FROM "trellis".transforms s WHERE s.redefines = t.id;
  def := jsonb_set(def, '{target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
  -- Postgres reads the statement as written first: names, column aliases, scopes, the
  -- union's column count and types.
  PERFORM "trellis"._analyze_query("trellis"._render_view_select(def), 'in the definition');
  PERFORM "trellis"._refuse_view_sublinks(def);
  -- 0056: a union at the top too (_define_parts is 0041's wrapper): its branches and its
  -- table, under the shadow's root name; the shadow reads the union's table.
  res := "trellis"._define_parts(def, t.target_name || '~' || t.id, '', '{}');
  ast := jsonb_set(ast, '{definition}', res->'ast');
  result := "trellis"._redefine_one(ast);
  SELECT s.id INTO shadow_id FROM "trellis".transforms s WHERE s.redefines = t.id;
  IF shadow_id IS NULL THEN
    -- The definition in force, written again: nothing to build, the parts just made (and
    -- the union tables they feed) go.
    PERFORM "trellis"._drop_new_parts(ARRAY(SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i));
    RETURN result;
  END IF;
  UPDATE "trellis".transforms p SET part_of = shadow_id
   WHERE p.id IN (SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i);
  RETURN result;
END
$fn$;

-- Transforms `ids` (parts just defined, belonging to no statement yet) dropped, the last
-- defined first, and the union tables they fed.
CREATE FUNCTION "trellis"._drop_new_parts(ids int[])
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  tables oid[];
  rel oid;
  p record;
BEGIN
  tables := ARRAY(SELECT DISTINCT f.table_oid FROM "trellis".union_feeds f WHERE f.transform_id = ANY (ids));
  FOR p IN SELECT y.target_name FROM "trellis".transforms y WHERE y.id = ANY (ids) ORDER BY y.id DESC LOOP
    PERFORM "trellis"._drop_one(jsonb_build_object('kind', 'drop', 'transform', p.target_name));
  END LOOP;
  FOREACH rel IN ARRAY tables LOOP
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
      EXECUTE format('DROP TABLE %s', rel::regclass);
    END IF;
  END LOOP;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m56$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 57) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (57, 'left_join_deltas', false);
    EXECUTE $trellis_m57$-- Aggregates kept by delta over a LEFT JOIN that fans out, and a grand total over a join
-- that fans out (issue #22 item 1; ADR 0067, addendum).
--
-- 0049 kept by delta a GROUP BY over an inner join that fans out, its join rows signed from
-- the sources' shadow by the delta rule of an inner join. Two shapes were left to recompute:
--
-- - a GROUP BY over a join with a LEFT JOIN that fans out (group recompute): a
--   NULL-extended row is not a sum of its sources' rows. Its signed rows are now the join
--   rows of each FROM row the change touches (drain/shadow-sql.ts, shadowSignedRows), as
--   they are after the change (+1) less as they were (-1): a FROM row is never
--   NULL-extended (only INNER and LEFT joins reach here), so the join is the disjoint union
--   of its FROM rows' join rows, and a FROM row whose match set empties or fills has its
--   NULL-extended row counted in exactly one of the two states;
-- - a grand total (no GROUP BY) over a join that fans out (recomputed whole: 0033 keeps a
--   shadow only for a GROUP BY). It now keeps the shadow (made as for a GROUP BY, with no
--   GROUP BY index) and one group state row.
--
-- Both only when every aggregate has an exact delta (0026's classification); otherwise, as
-- before. Renamed here and wrapped: _make_key_map -> _make_key_map_before_left_deltas
-- (0049's; every other case goes straight through to it).

ALTER FUNCTION "trellis"._make_key_map(int, jsonb, jsonb) RENAME TO _make_key_map_before_left_deltas;

CREATE FUNCTION "trellis"._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  whole_row boolean;
  left_join boolean;
  grand_total boolean;
  shadow_spec jsonb := spec;
  why text;
BEGIN
  whole_row := coalesce((spec->>'whole_row')::boolean, false)
    OR coalesce((SELECT (t.spec->>'whole_row')::boolean FROM "trellis".transforms t WHERE t.id = transform_id), false);
  left_join := EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left');
  grand_total := jsonb_array_length(coalesce(spec->'groups', '[]')) = 0;
  IF classified->>'mode' IS DISTINCT FROM 'delta'
     OR NOT (left_join OR grand_total)
     OR jsonb_array_length(spec->'sources') < 2
     OR whole_row
     OR EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s
                 WHERE (s->>'ordinal')::int > 0 AND coalesce(s->>'join_type', 'inner') NOT IN ('inner', 'left'))
     OR NOT "trellis"._join_fans_out(spec)
     OR "trellis"._shadow_columns(spec) IS NULL THEN
    PERFORM "trellis"._make_key_map_before_left_deltas(transform_id, spec, classified);
    RETURN;
  END IF;
  -- The shadow, as 0033 makes it for a GROUP BY kept by group recompute (0033 keeps one
  -- only for a GROUP BY: a grand total is given a group it indexes nothing for).
  IF grand_total THEN
    shadow_spec := spec || '{"groups": [{"grand_total": true}]}';
  END IF;
  PERFORM "trellis"._make_key_map_before_fanout(transform_id, shadow_spec,
    classified || '{"mode": "group", "reason": "made by _make_key_map"}');
  why := CASE WHEN left_join
    THEN '; the join can multiply rows and has a LEFT JOIN, so a change''s join rows are those of the FROM rows it touches, re-joined from the sources'' shadow as they were and as they are (ADR 0067, addendum)'
    ELSE '; the join can multiply rows, so a change''s join rows are signed from the sources'' shadow (ADR 0067)' END;
  UPDATE "trellis".transforms
     SET delta = (classified - 'remap') || jsonb_build_object('fan_out', true,
           'left_join', left_join, 'reason', (classified->>'reason') || why)
   WHERE id = transform_id;
  PERFORM "trellis"._create_group_states(transform_id, spec, classified);
END
$fn$;

-- Transforms defined before this migration over a LEFT JOIN that fans out (0049 recorded
-- them as kept by group recompute), or a grand total over a join that fans out (0033's
-- reason), whose aggregates all have an exact delta: recorded as pending, so that their next
-- build (_switch_to_delta) gives them their shadow and group states and keeps them by delta.
UPDATE "trellis".transforms t
   SET delta = t.delta || jsonb_build_object(
         'mode', 'delta', 'reason', 'every aggregate has an exact delta', 'pending', true)
 WHERE t.aggregates
   AND t.delta->>'mode' = 'group'
   AND (t.delta->>'reason' LIKE '%has a LEFT JOIN, whose NULL-extended rows have no delta%'
        OR (t.delta->>'reason' LIKE 'the join can multiply rows (%'
            AND jsonb_array_length(coalesce(t.spec->'groups', '[]')) = 0))
   AND NOT coalesce((t.delta->>'remap')::boolean, false)
   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.delta->'aggs') a WHERE NOT (a->>'delta')::boolean);
$trellis_m57$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 58) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (58, 'mvcc_rebuilds_typed_ranks', false);
    EXECUTE $trellis_m58$-- rank() and dense_rank() top-N compare ORDER BY values with their own type's equality
-- (ADR 0076), as Postgres ranks them: numeric 1.0 and 1.00 share a rank. Until now the
-- partition's top k held the values as text (`ROW(o)::text`, ADR 0065), so values equal in
-- order but not in text counted as different ranks.
--
-- Wrapped (the pattern of 0039-0041): `_topn_rewrite_window` is renamed
-- `_topn_rewrite_window_before_mvcc`, and the new function of the old name rewrites its
-- result for rank and dense_rank over ONE order expression: the top k is an array of the
-- expression's own type (`array_agg(o ORDER BY o …, (o)::text)`, the text only breaking
-- ties between equal values so the stored array is one function of the rows), and a row's
-- rank is `array_position(top, o)` (the type's equality). Over several order expressions
-- the values are still compared as text (a record[] column cannot be stored): left, and
-- said in README. Transforms defined before keep the text comparison until defined again
-- (or redefined with ALTER TRANSFORM … AS).

ALTER FUNCTION "trellis"._topn_rewrite_window(jsonb, int) RENAME TO _topn_rewrite_window_before_mvcc;

-- The first k distinct values of `a` (in its order), for an array of any type: equality is
-- the element type's (array_position).
CREATE FUNCTION "trellis"._topn_distinct_prefix(a anyarray, k int)
RETURNS anyarray LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
  res ALIAS FOR $0;
BEGIN
  IF a IS NULL THEN
    RETURN a;
  END IF;
  res := a[1:0];
  FOR i IN 1 .. coalesce(cardinality(a), 0) LOOP
    IF array_position(res, a[i]) IS NULL THEN
      EXIT WHEN cardinality(res) >= k;
      res := array_append(res, a[i]);
    END IF;
  END LOOP;
  RETURN res;
END
$fn$;

CREATE FUNCTION "trellis"._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  win jsonb := pa -> 'window';
  res jsonb := "trellis"._topn_rewrite_window_before_mvcc(pa, k);
  expr text;
  ord text;
  old_probe text;
  old_top text;
  new_top text;
  txt text;
BEGIN
  IF win ->> 'fn' NOT IN ('rank', 'dense_rank') OR jsonb_array_length(win -> 'order_by') <> 1 THEN
    RETURN res;
  END IF;
  -- As _topn_rewrite_window_before_mvcc writes them (0045).
  expr := '(' || (win -> 'order_by' -> 0 ->> 'expr') || ')';
  ord := expr || coalesce(' ' || (win -> 'order_by' -> 0 ->> 'dir'), '');
  old_probe := 'ROW(' || expr || ')::text';
  old_top := format('array_agg(%s ORDER BY %s)', old_probe, ord);
  new_top := format('array_agg(%s ORDER BY %s, (%s)::text)', expr, ord, expr);
  -- Replaced inside the AST's strings (the top k's aggregate, then every probe: the rank
  -- item and the WHERE), as JSON writes them.
  txt := res::text;
  txt := replace(txt, "trellis"._json_inner(old_top), "trellis"._json_inner(new_top));
  txt := replace(txt, "trellis"._json_inner(old_probe), "trellis"._json_inner(expr));
  RETURN txt::jsonb;
END
$fn$;

-- A string as it appears inside a JSON text (escaped, without its quotes).
CREATE FUNCTION "trellis"._json_inner(s text)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT substr(to_jsonb(s)::text, 2, length(to_jsonb(s)::text) - 2)
$fn$;

-- RESUME of a target whose key was dropped by hand (0014's _repair_target): it TRUNCATEd
-- the target before adding the key back, and TRUNCATE is not MVCC-safe (a repeatable-read
-- reader whose snapshot came before read the target empty, ADR 0076). Wrapped (renamed
-- `_repair_target_before_mvcc`): when the target is there without its key and every key
-- column is there, it is emptied here with DELETE and the key added back, as 0014 does, so
-- the delegate finds the key and does not TRUNCATE. (A key column dropped too: the delegate
-- adds it and TRUNCATEs, as before.)
ALTER FUNCTION "trellis"._repair_target("trellis".transforms) RENAME TO _repair_target_before_mvcc;

CREATE FUNCTION "trellis"._repair_target(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  qualified text := quote_ident(t.target_schema) || '.' || quote_ident(t.target_name);
  keys text;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = t.target_oid)
     AND NOT EXISTS (SELECT 1 FROM pg_index x
                      WHERE x.indrelid = t.target_oid AND (x.indisprimary OR x.indisunique))
     AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(coalesce(t.spec->'key', '[]')) k
                      WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                                         WHERE a.attrelid = t.target_oid AND a.attname = k
                                           AND a.attnum > 0 AND NOT a.attisdropped)) THEN
    keys := (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k);
    -- As Trellis: the guard, if it is there, lets only Trellis write.
    PERFORM set_config('trellis.maintaining', 'trellis', true);
    EXECUTE 'DELETE FROM ' || qualified;
    IF keys IS NULL THEN
      EXECUTE 'CREATE UNIQUE INDEX ON ' || qualified || ' ((true))';
    ELSIF (t.spec->>'key_nullable')::boolean THEN
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD UNIQUE NULLS NOT DISTINCT (' || keys || ')';
    ELSE
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD PRIMARY KEY (' || keys || ')';
    END IF;
  END IF;
  PERFORM "trellis"._repair_target_before_mvcc(t);
END
$fn$;
$trellis_m58$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 59) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (59, 'view_sql_more', false);
    EXECUTE $trellis_m59$-- More of a view's SQL (issue #26; ADR 0073).
--
-- 1. Top-N over a subquery or a WITH query: a ranking derived table whose FROM reads a
--    part (`SELECT ... FROM (SELECT ..., row_number() OVER (PARTITION BY g ORDER BY v) AS rn
--    FROM (SELECT ... FROM t JOIN u ...) AS s) AS x WHERE rn <= 3`, or `FROM w` for a WITH
--    query w). ADR 0065's rewrite ranks a row by its source's key, and a part's key is
--    known only once the part is defined. So the rewrite waits: _topn_rewrite_window, given
--    a ranking block over a part not yet defined, marks it `topn_pending` (k) and leaves it
--    as written; _define_parts, reaching such a block, defines the parts inside it first
--    (binding its FROM and JOIN items to their hidden targets, which then have a primary
--    key), then rewrites it (the bound items read as tables) and defines the part of each
--    partition's top k. Nothing new runs in the drain: the ranking reads the part's target
--    as a chain reads a target.
--
-- Renamed and wrapped (statements without these forms go straight through):
-- _topn_rewrite_window (0058) -> _topn_rewrite_window_before_sqlmore, _define_parts (0046)
-- -> _define_parts_before_sqlmore.

ALTER FUNCTION "trellis"._topn_rewrite_window(jsonb, int) RENAME TO _topn_rewrite_window_before_sqlmore;
ALTER FUNCTION "trellis"._define_parts(jsonb, text, text, jsonb) RENAME TO _define_parts_before_sqlmore;

-- A ranking block (ADR 0065): over a part not yet bound to its target, marked to be
-- rewritten once its parts are defined (_define_parts); over bound parts, their items read
-- as the tables they are bound to; otherwise as before.
CREATE FUNCTION "trellis"._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  items jsonb := jsonb_build_array(pa -> 'from') || coalesce(pa -> 'joins', '[]');
BEGIN
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(items) i
              WHERE i ->> 'part' IS NOT NULL AND i ->> 'schema' IS NULL) THEN
    RETURN pa || jsonb_build_object('topn_pending', k);
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(items) i WHERE i ->> 'part' IS NOT NULL) THEN
    pa := pa || jsonb_build_object(
      'from', (pa -> 'from') - 'part' - 'part_kind' - 'alias_implicit',
      'joins', coalesce((SELECT jsonb_agg(j - 'part' - 'part_kind' - 'alias_implicit' ORDER BY o)
                           FROM jsonb_array_elements(coalesce(pa -> 'joins', '[]')) WITH ORDINALITY AS x(j, o)), '[]'));
  END IF;
  RETURN "trellis"._topn_rewrite_window_before_sqlmore(pa, k);
END
$fn$;

-- The partition columns of a ranking block over parts (bound to their targets) that are a
-- part's column copied from a NOT NULL column of a table on no LEFT JOIN's side: declared
-- NOT NULL on the part's target (and in its spec, as 0036 does for count() columns), so the
-- part of each partition's top k, grouped by them, has a key that is never NULL.
CREATE FUNCTION "trellis"._topn_part_partition_not_null(pa jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  e text;
  t "trellis".grammar_token[];
  al text;
  col text;
  item jsonb;
  tr "trellis".transforms;
  c jsonb;
  src jsonb;
BEGIN
  FOR e IN SELECT x FROM jsonb_array_elements_text(coalesce(pa -> 'window' -> 'partition', '[]')) x LOOP
    t := "trellis".grammar_tokenize(e);
    IF t[1].kind IN ('word', 'ident') AND t[2].kind = 'eof' THEN
      al := NULL; col := t[1].value;
    ELSIF t[1].kind IN ('word', 'ident') AND t[2].kind = 'punct' AND t[2].text = '.'
          AND t[3].kind IN ('word', 'ident') AND t[4].kind = 'eof' THEN
      al := t[1].value; col := t[3].value;
    ELSE
      CONTINUE;
    END IF;
    FOR item IN SELECT i FROM jsonb_array_elements(jsonb_build_array(pa -> 'from') || coalesce(pa -> 'joins', '[]')) i
                 WHERE i ->> 'part' IS NOT NULL AND i ->> 'schema' IS NOT NULL
                   AND (al IS NULL OR coalesce(i ->> 'alias', i ->> 'part') = al) LOOP
      SELECT * INTO tr FROM "trellis".transforms x
       WHERE x.target_schema = item ->> 'schema' AND x.target_name = item ->> 'name';
      CONTINUE WHEN tr.id IS NULL;
      SELECT x INTO c FROM jsonb_array_elements(tr.spec -> 'columns') x WHERE x ->> 'name' = col;
      CONTINUE WHEN c IS NULL OR coalesce((c ->> 'notnull')::boolean, false)
                    OR c -> 'plain' IS NULL OR jsonb_typeof(c -> 'plain') <> 'object';
      src := tr.spec -> 'sources' -> ((c -> 'plain' ->> 'source')::int);
      CONTINUE WHEN coalesce(src ->> 'join_type', 'inner') = 'left';
      CONTINUE WHEN NOT coalesce((SELECT a.attnotnull FROM pg_attribute a
                                   WHERE a.attrelid = (src ->> 'oid')::oid
                                     AND a.attnum = (c -> 'plain' ->> 'attnum')::int), false);
      EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET NOT NULL', tr.target_schema, tr.target_name, col);
      UPDATE "trellis".transforms x
         SET spec = jsonb_set(x.spec, '{columns}', (
               SELECT jsonb_agg(CASE WHEN y ->> 'name' = col THEN y || '{"notnull": true}' ELSE y END ORDER BY o)
                 FROM jsonb_array_elements(x.spec -> 'columns') WITH ORDINALITY AS z(y, o)))
       WHERE x.id = tr.id;
    END LOOP;
  END LOOP;
END
$fn$;

-- The union a set operation's counts group (bound item `item`): its "trellis#row" (a row's
-- text, never NULL) declared NOT NULL, so the part grouping by it has a key that never is;
-- a column of an array type refused (the part holds a row's values as (array_agg(v))[1]).
CREATE FUNCTION "trellis"._setop_row_not_null(item jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  rel regclass := to_regclass(quote_ident(item ->> 'schema') || '.' || quote_ident(item ->> 'name'));
  bad text;
BEGIN
  IF rel IS NULL THEN
    RETURN;
  END IF;
  SELECT string_agg(format_type(a.atttypid, a.atttypmod), ', ') INTO bad
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
   WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND t.typcategory = 'A'
     AND a.attname LIKE 'trellis#%' AND a.attname NOT IN ('trellis#row', 'trellis#side');
  IF bad IS NOT NULL THEN
    PERFORM "trellis"._fail('TRV01', format(
      'a column of an array type (%s) in INTERSECT ALL, EXCEPT ALL or set operations of different kinds is not supported yet', bad));
  END IF;
  EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET NOT NULL', rel, 'trellis#row');
  UPDATE "trellis".transforms x
     SET spec = jsonb_set(x.spec, '{columns}', (
           SELECT jsonb_agg(CASE WHEN y ->> 'name' = 'trellis#row' THEN y || '{"notnull": true}' ELSE y END ORDER BY o)
             FROM jsonb_array_elements(x.spec -> 'columns') WITH ORDINALITY AS z(y, o)))
   WHERE x.target_oid = rel;
END
$fn$;

-- A part's definition: a ranking block waiting for its parts (topn_pending) gets them
-- defined, then is rewritten as top-N (its items bound) and the part of its top k defined;
-- everything else as before.
CREATE FUNCTION "trellis"._define_parts(ast jsonb, root text, path text, scope jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  k int;
  r1 jsonb;
  r2 jsonb;
  bound jsonb;
  rewritten jsonb;
  p jsonb;
BEGIN
  IF ast ? 'setop_all' THEN
    -- The counts of a set operation's rows (below): its union's row text is never NULL.
    r1 := "trellis"._define_parts_before_sqlmore(ast, root, path, scope);
    PERFORM "trellis"._setop_row_not_null(r1 -> 'ast' -> 'from');
    RETURN r1;
  END IF;
  IF NOT ast ? 'topn_pending' THEN
    RETURN "trellis"._define_parts_before_sqlmore(ast, root, path, scope);
  END IF;
  k := (ast ->> 'topn_pending')::int;
  r1 := "trellis"._define_parts_before_sqlmore(ast - 'topn_pending', root, path, scope);
  -- Its own parts, now defined, are in scope for the part of its top k (which reads them).
  FOR p IN SELECT x FROM jsonb_array_elements(coalesce(ast -> 'parts', '[]')) x LOOP
    scope := scope || jsonb_build_object((p ->> 'kind') || ':' || (p ->> 'name'),
                                         'trellis#' || root || '#' || path || (p ->> 'name'));
  END LOOP;
  bound := (r1 -> 'ast') || jsonb_build_object('parts', '[]'::jsonb);
  PERFORM "trellis"._topn_part_partition_not_null(bound);
  rewritten := "trellis"._topn_rewrite_window(bound, k);
  -- Shown as written (its subqueries in place, not bound).
  rewritten := rewritten || jsonb_build_object('topn_written', ast - 'topn_pending');
  r2 := "trellis"._define_parts_before_sqlmore(rewritten, root, path, scope);
  RETURN jsonb_build_object('ast', r2 -> 'ast', 'ids', (r1 -> 'ids') || (r2 -> 'ids'));
END
$fn$;

-- 2. and 3. Set operations beyond ADR 0059 and 0072: INTERSECT ALL and EXCEPT ALL, set
--    operators of different kinds in one statement (with parentheses, and SQL's precedence:
--    INTERSECT binds tighter than UNION and EXCEPT, which go left to right), and set
--    operations other than UNION ALL in a subquery or a WITH query. The branches are read as
--    a UNION ALL (ADR 0059), each tagged with its place, and a row's count in the result is
--    a function of its counts in the branches (c_i: the number of copies in branch i):
--
--      UNION ALL  a + b            UNION      1 if a + b > 0
--      INTERSECT ALL least(a, b)   INTERSECT  1 if a > 0 and b > 0
--      EXCEPT ALL greatest(a - b, 0)  EXCEPT  1 if a > 0 and b = 0
--
--    When the outermost operator is distinct (each row once), at the top of a statement:
--    ADR 0072's GROUP BY of every column over the tagged UNION ALL, HAVING count > 0. Else
--    (INTERSECT ALL, EXCEPT ALL, a UNION ALL over other operators, or any in a subquery,
--    whose key must never be NULL): each branch also selects its row as text
--    (ROW(items)::text, never NULL: "trellis#row"), a part groups the union by it, holding
--    the row's values and its count, and the statement joins it with lateral_ordinals (ADR
--    0071's table of positions) for positions 1 .. count: a row's copies are keyed by (its
--    text, its position).
--
--    Shown as written: the AST keeps the union of the branches under "written", marked
--    setop 'tree' with the operators' tree (parentheses where written), which the wrapped
--    _render_view_select renders.
--
-- Renamed and wrapped: grammar_parse_view (0054) -> grammar_parse_view_before_sqlmore,
-- _render_view_select (0054) -> _render_view_select_before_sqlmore.

ALTER FUNCTION "trellis".grammar_parse_view("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_view_before_sqlmore;
ALTER FUNCTION "trellis"._render_view_select(jsonb) RENAME TO _render_view_select_before_sqlmore;

-- The operator at token k ('union', 'union all', 'intersect', 'intersect all', 'except',
-- 'except all') and the token after it; NULL when token k is none.
CREATE FUNCTION "trellis"._setop_at(toks "trellis".grammar_token[], k int, OUT op text, OUT next int)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF toks[k].kind <> 'word' OR toks[k].value NOT IN ('union', 'intersect', 'except') THEN
    RETURN;
  END IF;
  op := toks[k].value;
  next := k + 1;
  IF "trellis".grammar_kw(toks[k + 1], 'all') THEN
    op := op || ' all';
    next := k + 2;
  ELSIF "trellis".grammar_kw(toks[k + 1], 'distinct') THEN
    next := k + 2;
  END IF;
END
$fn$;

-- Set operations from token k: level 0 (UNION, EXCEPT, left to right), 1 (INTERSECT),
-- 2 (a bracketed set operation, or one SELECT: a leaf, up to the next operator or closing
-- bracket at its depth). Returns {node, k (the token after it), leaves ([[from, to)])};
-- a node is {leaf: n} or {op, l, r}, with paren: true when written in brackets.
CREATE FUNCTION "trellis"._setop_parse(toks "trellis".grammar_token[], k int, lvl int, leaves jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  r jsonb;
  r2 jsonb;
  node jsonb;
  o record;
  d int := 0;
  s int := k;
BEGIN
  IF lvl < 2 THEN
    r := "trellis"._setop_parse(toks, k, lvl + 1, leaves);
    node := r -> 'node';
    LOOP
      SELECT * INTO o FROM "trellis"._setop_at(toks, (r ->> 'k')::int);
      EXIT WHEN o.op IS NULL OR (lvl = 0) = starts_with(o.op, 'intersect');
      r2 := "trellis"._setop_parse(toks, o.next, lvl + 1, r -> 'leaves');
      node := jsonb_build_object('op', o.op, 'l', node, 'r', r2 -> 'node');
      r := r2;
    END LOOP;
    RETURN jsonb_build_object('node', node, 'k', r -> 'k', 'leaves', r -> 'leaves');
  END IF;
  IF toks[k].kind = 'punct' AND toks[k].text = '(' THEN
    r := "trellis"._setop_parse(toks, k + 1, 0, leaves);
    IF NOT (toks[(r ->> 'k')::int].kind = 'punct' AND toks[(r ->> 'k')::int].text = ')') THEN
      PERFORM "trellis".grammar_unexpected(toks, (r ->> 'k')::int, ')');
    END IF;
    RETURN jsonb_build_object('node', (r -> 'node') || '{"paren": true}', 'k', (r ->> 'k')::int + 1,
                              'leaves', r -> 'leaves');
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      EXIT WHEN d = 0;
      d := d - 1;
    ELSIF d = 0 AND toks[k].kind = 'word' AND toks[k].value IN ('union', 'intersect', 'except') THEN
      EXIT;
    END IF;
    k := k + 1;
  END LOOP;
  RETURN jsonb_build_object('node', jsonb_build_object('leaf', jsonb_array_length(leaves) + 1), 'k', k,
                            'leaves', leaves || jsonb_build_array(jsonb_build_array(s, k)));
END
$fn$;

-- The number of copies of a row in a node's result, from its counts in the branches (the
-- union "q", tagged by "trellis#side").
CREATE FUNCTION "trellis"._setop_count(node jsonb, q text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  a text;
  b text;
BEGIN
  IF node ? 'leaf' THEN
    RETURN format('sum(CASE WHEN %s."trellis#side" = %s THEN 1 ELSE 0 END)', q, node ->> 'leaf');
  END IF;
  a := "trellis"._setop_count(node -> 'l', q);
  b := "trellis"._setop_count(node -> 'r', q);
  RETURN CASE node ->> 'op'
    WHEN 'union all' THEN format('(%s + %s)', a, b)
    WHEN 'union' THEN format('(CASE WHEN %s + %s > 0 THEN 1 ELSE 0 END)', a, b)
    WHEN 'intersect all' THEN format('least(%s, %s)', a, b)
    WHEN 'intersect' THEN format('(CASE WHEN %s > 0 AND %s > 0 THEN 1 ELSE 0 END)', a, b)
    WHEN 'except all' THEN format('greatest(%s - %s, 0)', a, b)
    ELSE format('(CASE WHEN %s > 0 AND %s = 0 THEN 1 ELSE 0 END)', a, b) END;
END
$fn$;

-- The operators of a tree, each once.
CREATE FUNCTION "trellis"._setop_ops(node jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN node ? 'leaf' THEN '{}'::text[]
              ELSE ARRAY(SELECT DISTINCT x FROM unnest(ARRAY[node ->> 'op'] || "trellis"._setop_ops(node -> 'l')
                                                   || "trellis"._setop_ops(node -> 'r')) x) END
$fn$;

-- Whether a tree reads as its leaves joined left to right by its operator (no bracketed
-- operation on a right side, none of another operator).
CREATE FUNCTION "trellis"._setop_flat(node jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
  SELECT node ? 'leaf' OR ((node -> 'r') ? 'leaf' AND "trellis"._setop_flat(node -> 'l'))
$fn$;

-- A view's SELECT: set operations the ADRs 0059 and 0072 do not keep compiled as the header
-- says; any other as before.
CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int;
  s int := i;
  found_op boolean := false;
  parsed jsonb;
  tree jsonb;
  leaves jsonb;
  ops text[];
  flat "trellis".grammar_token[] := '{}';
  u jsonb;
  nb int;
  n int;
  names text[] := '{}';
  it jsonb;
  et "trellis".grammar_token[];
  nm text;
  with_ text;
  txt text;
  res jsonb;
  cnt text;
  two boolean;
  lf jsonb;
  q text := quote_ident('set#op');
  a text := quote_ident('set#all');
  sch text := quote_ident('trellis');
BEGIN
  k := i;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND toks[k].kind = 'word' AND toks[k].value IN ('union', 'intersect', 'except') THEN
      found_op := true;
    END IF;
    k := k + 1;
  END LOOP;
  -- A set operation in brackets at the top: `(SELECT ... UNION SELECT ...) EXCEPT ...`.
  IF NOT found_op AND NOT (toks[i].kind = 'punct' AND toks[i].text = '(') THEN
    RETURN "trellis".grammar_parse_view_before_sqlmore(toks, i, target, ctes);
  END IF;
  -- The statement's WITH queries come first.
  IF "trellis".grammar_kw(toks[s], 'with') THEN
    s := s + 1;
    IF "trellis".grammar_kw(toks[s], 'recursive') THEN
      RETURN "trellis".grammar_parse_view_before_sqlmore(toks, i, target, ctes);
    END IF;
    LOOP
      s := s + 1;
      IF toks[s].kind = 'punct' AND toks[s].text = '(' THEN
        s := "trellis"._closing_token(toks, s) + 1;
      END IF;
      EXIT WHEN NOT "trellis".grammar_kw(toks[s], 'as');
      s := s + 1;
      IF "trellis".grammar_kw(toks[s], 'not') THEN s := s + 1; END IF;
      IF "trellis".grammar_kw(toks[s], 'materialized') THEN s := s + 1; END IF;
      EXIT WHEN NOT (toks[s].kind = 'punct' AND toks[s].text = '(');
      s := "trellis"._closing_token(toks, s) + 1;
      EXIT WHEN NOT (toks[s].kind = 'punct' AND toks[s].text = ',');
    END LOOP;
  END IF;
  parsed := "trellis"._setop_parse(toks, s, 0, '[]');
  tree := parsed -> 'node';
  leaves := parsed -> 'leaves';
  IF tree ? 'leaf' THEN
    RETURN "trellis".grammar_parse_view_before_sqlmore(toks, i, target, ctes);
  END IF;
  ops := "trellis"._setop_ops(tree);
  -- What ADR 0059 and 0072 keep: one operator, read left to right; in a subquery, UNION ALL.
  IF cardinality(ops) = 1 AND ops[1] IN ('union', 'union all', 'intersect', 'except')
     AND (ops[1] <> 'except' OR "trellis"._setop_flat(tree))
     AND (target IS NOT NULL OR ops[1] IN ('union all', 'union')) AND tree::text NOT LIKE '%"paren"%' THEN
    RETURN "trellis".grammar_parse_view_before_sqlmore(toks, i, target, ctes);
  END IF;

  -- The branches as one UNION ALL: the tokens before the first, each branch's, then what
  -- follows the last (ORDER BY, options).
  flat := toks[1 : s - 1];
  FOR lf IN SELECT x FROM jsonb_array_elements(leaves) x LOOP
    IF cardinality(flat) > s - 1 THEN
      flat := flat || ROW('word', 'UNION', 'union', toks[(lf ->> 0)::int].pos)::"trellis".grammar_token
                   || ROW('word', 'ALL', 'all', toks[(lf ->> 0)::int].pos)::"trellis".grammar_token;
    END IF;
    flat := flat || toks[(lf ->> 0)::int : (lf ->> 1)::int - 1];
  END LOOP;
  flat := flat || toks[(parsed ->> 'k')::int : array_length(toks, 1)];
  u := "trellis".grammar_parse_view_before_sqlmore(flat, i, target, ctes);
  nb := jsonb_array_length(u -> 'union' -> 'branches');
  IF NOT u ? 'union' OR nb <> jsonb_array_length(leaves) THEN
    PERFORM "trellis".grammar_refuse('this combination of set operations could not be read', toks[s].pos);
  END IF;

  -- The columns, as the first branch names them.
  FOR it IN SELECT x FROM jsonb_array_elements(u -> 'select') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    nm := it ->> 'name';
    IF nm IS NULL THEN
      et := "trellis".grammar_tokenize(it ->> 'expr');
      n := array_length(et, 1);
      IF et[n - 1].kind IN ('word', 'ident')
         AND (n = 2 OR (et[n - 2].kind = 'punct' AND et[n - 2].text = '.'
                        AND (n = 4 OR (n = 6 AND et[2].kind = 'punct' AND et[2].text = '.')))) THEN
        nm := et[n - 1].value;
      ELSE
        PERFORM "trellis".grammar_refuse(format(
          'a column of a set operation must be named in its first SELECT: write %s AS name', it ->> 'expr'),
          coalesce((it ->> 'position')::int, toks[s].pos));
      END IF;
    END IF;
    names := names || nm;
  END LOOP;
  n := cardinality(names);

  SELECT 'WITH ' || string_agg(quote_ident(p ->> 'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p -> 'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p -> 'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(u -> 'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p ->> 'kind' = 'cte';

  cnt := "trellis"._setop_count(tree, q);
  -- Each row once (the outermost operator is distinct) at the top: ADR 0072's form.
  two := target IS NULL OR (tree ->> 'op') LIKE '% all';
  txt := coalesce(with_, '') || 'SELECT '
    || (SELECT string_agg(format('%s.%I AS %I', CASE WHEN two THEN a ELSE q END, 'trellis#' || o, nm2), ', ' ORDER BY o)
          FROM unnest(names) WITH ORDINALITY AS x(nm2, o))
    || ' FROM ('
    || CASE WHEN two THEN 'SELECT ' || q || '."trellis#row" AS "trellis#row", '
         || (SELECT string_agg(format('(array_agg(%s.%I))[1] AS %I', q, 'trellis#' || o, 'trellis#' || o), ', ' ORDER BY o)
               FROM generate_series(1, n) o)
         || ', ' || cnt || ' AS "trellis#n" FROM (' ELSE '' END
    || (SELECT string_agg("trellis"._render_view_select(br || jsonb_build_object('select',
                 (br -> 'select')
                 || CASE WHEN two THEN jsonb_build_array(jsonb_build_object('expr',
                      'ROW(' || (SELECT string_agg('(' || (s2 ->> 'expr') || ')', ', ' ORDER BY o2)
                                   FROM jsonb_array_elements(br -> 'select') WITH ORDINALITY AS z(s2, o2)) || ')::text',
                      'name', 'trellis#row', 'position', NULL, 'bare_label', NULL, 'label_expr', NULL)) ELSE '[]' END
                 || jsonb_build_array(jsonb_build_object('expr', o::text, 'name', 'trellis#side',
                   'position', NULL, 'bare_label', NULL, 'label_expr', NULL)))), ' UNION ALL ' ORDER BY o)
          FROM jsonb_array_elements(u -> 'union' -> 'branches') WITH ORDINALITY AS x(br, o))
    || ') AS ' || q || ' ('
    || (SELECT string_agg(quote_ident('trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o)
    || CASE WHEN two THEN ', "trellis#row"' ELSE '' END
    || ', "trellis#side") GROUP BY '
    || CASE WHEN two THEN q || '."trellis#row"'
         ELSE (SELECT string_agg(format('%s.%I', q, 'trellis#' || o), ', ' ORDER BY o) FROM generate_series(1, n) o) END
    || ' HAVING ' || cnt || ' > 0'
    || CASE WHEN two THEN ') AS ' || a || ' JOIN ' || sch || '.lateral_ordinals AS "set#copy" ON "set#copy".ordinality = ANY ('
         || sch || '._lateral_positions(' || a || '."trellis#n"::int))' ELSE '' END
    || CASE WHEN (u ->> 'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (u ->> 'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  res := "trellis".grammar_parse_view_before_sqlmore("trellis".grammar_tokenize(txt), 1, target, ctes);
  IF two THEN
    res := res || jsonb_build_object('parts', (
      SELECT jsonb_agg(CASE WHEN p ->> 'name' = 'set#all' THEN p || jsonb_build_object('ast', (p -> 'ast') || '{"setop_all": true}')
                            ELSE p END ORDER BY o)
        FROM jsonb_array_elements(res -> 'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN res || jsonb_build_object('written', u || jsonb_build_object('union', (u -> 'union')
    || jsonb_build_object('setop', 'tree', 'tree', tree)));
END
$fn$;

-- A set operations' tree as written: each leaf its branch, brackets where written.
CREATE FUNCTION "trellis"._setop_render(node jsonb, branches jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  txt text;
BEGIN
  IF node ? 'leaf' THEN
    txt := "trellis"._render_view_select(branches -> ((node ->> 'leaf')::int - 1));
  ELSE
    txt := "trellis"._setop_render(node -> 'l', branches) || ' ' || upper(node ->> 'op') || ' '
        || "trellis"._setop_render(node -> 'r', branches);
  END IF;
  RETURN CASE WHEN (node ->> 'paren')::boolean THEN '(' || txt || ')' ELSE txt END;
END
$fn$;

-- A view's SELECT as text: a union marked with a tree of set operations as written; any
-- other as before.
CREATE FUNCTION "trellis"._render_view_select(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  with_ text;
BEGIN
  IF ast -> 'union' ->> 'setop' IS DISTINCT FROM 'tree' THEN
    RETURN "trellis"._render_view_select_before_sqlmore(ast);
  END IF;
  SELECT 'WITH ' || string_agg(quote_ident(p ->> 'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p -> 'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p -> 'ast') || ')', ', ' ORDER BY o) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast -> 'parts', '[]')) WITH ORDINALITY AS x(p, o)
   WHERE p ->> 'kind' = 'cte';
  RETURN coalesce(with_, '') || "trellis"._setop_render(ast -> 'union' -> 'tree', ast -> 'union' -> 'branches');
END
$fn$;

-- 4. A RIGHT or FULL JOIN after a LEFT JOIN (`a LEFT JOIN b ON c1 FULL JOIN c ON c2`): ADR
--    0072 keeps a RIGHT or FULL JOIN after inner joins by making the joins before it a
--    subquery read by its tables' keys, which a LEFT JOIN's side makes nullable. With a LEFT
--    JOIN among them, the subquery is made a union of that one SELECT (ADR 0059): a union's
--    rows are keyed by their branch and the text of their tables' keys (ROW(k)::text, never
--    NULL), so the RIGHT or FULL JOIN reads it as any part. (The statement is compiled with a
--    second branch, WHERE false, which the parser needs to read a union; it is dropped from
--    the AST before anything is defined.) Renamed and wrapped: _outer_join_later (0054) ->
--    _outer_join_later_before_sqlmore (statements with inner joins only before the outer
--    join go to it unchanged).

ALTER FUNCTION "trellis"._outer_join_later("trellis".grammar_token[], int, jsonb, jsonb) RENAME TO _outer_join_later_before_sqlmore;

-- An AST with the subquery "joined#" (a union compiled with a second branch WHERE false)
-- left with its first branch, wherever it is (a FULL JOIN is itself a union of two).
CREATE FUNCTION "trellis"._joined_one_branch(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' THEN
    RETURN ast;
  END IF;
  IF jsonb_typeof(ast->'union'->'branches') = 'array' THEN
    ast := jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg("trellis"._joined_one_branch(b) ORDER BY o)
        FROM jsonb_array_elements(ast->'union'->'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  IF jsonb_typeof(ast->'parts') = 'array' AND jsonb_array_length(ast->'parts') > 0 THEN
    ast := jsonb_set(ast, '{parts}', (
      SELECT jsonb_agg(CASE WHEN p->>'name' = 'joined#' AND jsonb_typeof(p->'ast'->'union'->'branches') = 'array'
                            THEN jsonb_set(p, '{ast,union,branches}', jsonb_build_array(p->'ast'->'union'->'branches'->0))
                            WHEN p ? 'ast' THEN jsonb_set(p, '{ast}', "trellis"._joined_one_branch(p->'ast'))
                            ELSE p END ORDER BY o)
        FROM jsonb_array_elements(ast->'parts') WITH ORDINALITY AS x(p, o)));
  END IF;
  RETURN ast;
END
$fn$;

CREATE FUNCTION "trellis"._outer_join_later(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  k int := i;
  f int;
  first_join int;
  outer_at int;
  kind text;
  m int := 0;
  t2 "trellis".grammar_token[];
  ast jsonb;
  written jsonb;
  sources jsonb := '{}';
  item jsonb;
  j jsonb;
  r jsonb;
  cols jsonb := '{}';
  bare jsonb := '[]';
  items text[] := '{}';
  joins_txt text := '';
  groups text[] := '{}';
  on_ text;
  where_ text;
  having_ text;
  nm text;
  g text;
  p_txt text;
  with_ text;
  txt text;
  o int;
  q text := quote_ident('joined#');
  sel_ text;
  res jsonb;
BEGIN
  IF NOT "trellis".grammar_kw(toks[i], 'select') THEN
    RETURN NULL;
  END IF;
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND f IS NULL AND "trellis".grammar_kw(toks[k], 'from') THEN
      f := k;
    ELSIF d = 0 AND f IS NOT NULL THEN
      IF (toks[k].kind = 'punct' AND toks[k].text = ',')
         OR (toks[k].kind = 'word' AND toks[k].value IN ('join', 'inner', 'cross', 'natural'))
         OR ("trellis".grammar_kw(toks[k], 'left') AND coalesce(toks[k + 1].text, '') <> '(')
         OR "trellis"._outer_join_at(toks, k) IS NOT NULL THEN
        IF first_join IS NULL THEN
          first_join := k;
        END IF;
        -- Count the joins before the outer one (a JOIN word after INNER or LEFT is its own).
        IF outer_at IS NULL AND toks[k].kind = 'word' AND toks[k].value = 'join'
           AND NOT (k > 1 AND toks[k - 1].kind = 'word' AND toks[k - 1].value IN ('inner', 'left', 'outer', 'cross', 'natural')) THEN
          m := m + 1;
        ELSIF outer_at IS NULL AND toks[k].kind = 'word' AND toks[k].value IN ('inner', 'left', 'cross', 'natural') THEN
          m := m + 1;
        END IF;
      END IF;
      IF outer_at IS NULL AND "trellis"._outer_join_at(toks, k) IS NOT NULL AND k <> first_join THEN
        outer_at := k;
        kind := toks[k].value;
      END IF;
    END IF;
    k := k + 1;
  END LOOP;
  IF outer_at IS NULL THEN
    RETURN NULL;
  END IF;

  -- Parsed with that join read as a LEFT JOIN; its word kept to be shown.
  t2 := toks;
  t2[outer_at] := ROW('word', 'LEFT', 'left', toks[outer_at].pos)::"trellis".grammar_token;
  ast := "trellis".grammar_parse_block_before_joins(t2, i, target, ctes);
  IF ast ? 'window' OR ast ? 'distinct_on'
     OR jsonb_array_length(coalesce(ast->'joins', '[]')) <= m OR ast->'joins'->m->>'type' <> 'left' THEN
    RETURN NULL;
  END IF;
  -- After inner joins only: as before (0054).
  IF NOT EXISTS (SELECT 1 FROM generate_series(0, m - 1) o2 WHERE ast->'joins'->o2->>'type' = 'left') THEN
    RETURN "trellis"._outer_join_later_before_sqlmore(toks, i, target, ctes);
  END IF;
  FOR o IN 0 .. m - 1 LOOP
    IF ast->'joins'->o->>'type' NOT IN ('inner', 'left') THEN
      PERFORM "trellis".grammar_refuse(format(
        'a %s JOIN after a %s JOIN is not supported yet', upper(kind), upper(ast->'joins'->o->>'type')), toks[outer_at].pos);
    END IF;
  END LOOP;
  written := ast || jsonb_build_object('written_outer', jsonb_build_object('at', m, 'kind', kind));

  -- The joins before it, and their aliases.
  p_txt := "trellis"._render_view_item(ast, ast->'from');
  sources := jsonb_build_object(coalesce(ast->'from'->>'alias', ast->'from'->>'part', ast->'from'->>'name'), true);
  FOR o IN 0 .. m - 1 LOOP
    j := ast->'joins'->o;
    p_txt := p_txt || CASE WHEN j->>'type' = 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
      || "trellis"._render_view_item(ast, j) || ' ON ' || (j->>'on');
    sources := sources || jsonb_build_object(coalesce(j->>'alias', j->>'part', j->>'name'), true);
  END LOOP;

  FOR item IN SELECT x FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS y(x, o2) ORDER BY o2 LOOP
    nm := coalesce(item->>'name', "trellis"._item_default_name(item->>'expr'));
    IF nm IS NULL THEN
      PERFORM "trellis".grammar_refuse(format(
        'a %s JOIN after another join: name this column (%s AS name)', upper(kind), item->>'expr'),
        coalesce((item->>'position')::int, toks[i].pos));
    END IF;
    r := "trellis"._prefix_refs(item->>'expr', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    items := items || ((r->>'expr') || ' AS ' || quote_ident(nm));
  END LOOP;
  FOR o IN m .. jsonb_array_length(ast->'joins') - 1 LOOP
    j := ast->'joins'->o;
    r := "trellis"._prefix_refs(j->>'on', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    joins_txt := joins_txt || ' ' || CASE WHEN o = m THEN upper(kind) || ' JOIN '
                                          WHEN j->>'type' = 'left' THEN 'LEFT JOIN ' ELSE 'JOIN ' END
      || "trellis"._render_view_item(ast, j) || ' ON ' || (r->>'expr');
  END LOOP;
  IF ast->>'where' IS NOT NULL THEN
    r := "trellis"._prefix_refs(ast->>'where', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    where_ := r->>'expr';
  END IF;
  FOR g IN SELECT x FROM jsonb_array_elements_text(coalesce(ast->'group_by', '[]')) WITH ORDINALITY AS y(x, o2) ORDER BY o2 LOOP
    r := "trellis"._prefix_refs(g, sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    groups := groups || (r->>'expr');
  END LOOP;
  IF ast->>'having' IS NOT NULL THEN
    r := "trellis"._prefix_refs(ast->>'having', sources, q);
    cols := cols || (r->'columns'); bare := bare || (r->'bare');
    having_ := r->>'expr';
  END IF;
  IF jsonb_array_length(bare) > 0 THEN
    PERFORM "trellis".grammar_refuse(format(
      'a %s JOIN after another join needs every column written with its table''s alias (alias.column): %s',
      upper(kind), (SELECT string_agg(DISTINCT x, ', ') FROM jsonb_array_elements_text(bare) x)), toks[outer_at].pos);
  END IF;

  SELECT 'WITH ' || string_agg(quote_ident(p->>'name')
           || coalesce(' (' || (SELECT string_agg(quote_ident(c), ', ' ORDER BY o2)
                                  FROM jsonb_array_elements_text(coalesce(p->'columns', '[]')) WITH ORDINALITY AS y(c, o2)) || ')', '')
           || ' AS (' || "trellis"._render_view_select(p->'ast') || ')', ', ' ORDER BY o3) || ' '
    INTO with_
    FROM jsonb_array_elements(coalesce(ast->'parts', '[]')) WITH ORDINALITY AS x(p, o3)
   WHERE p->>'kind' = 'cte';
  sel_ := CASE WHEN cols = '{}' THEN '1 AS "trellis#one"'
            ELSE (SELECT string_agg((c.value #>> '{}') || ' AS ' || quote_ident(c.key), ', ' ORDER BY c.key) FROM jsonb_each(cols) c) END;
  txt := coalesce(with_, '') || 'SELECT '
    || CASE WHEN coalesce((ast->>'distinct')::boolean, false) THEN 'DISTINCT ' ELSE '' END
    || array_to_string(items, ', ')
    -- sqlmore: the joins before it, LEFT JOINs among them, as a UNION ALL (its second
    -- branch, never any row, dropped once parsed, below): a union's rows are read by a key
    -- that is never NULL (its branch and the text of its tables' keys), where the LEFT
    -- JOIN's side's key can be NULL.
    || ' FROM (SELECT ' || sel_ || ' FROM ' || p_txt || ' UNION ALL SELECT ' || sel_ || ' FROM ' || p_txt
    || ' WHERE false) AS ' || q
    || joins_txt
    || coalesce(' WHERE ' || where_, '')
    || CASE WHEN cardinality(groups) > 0 THEN ' GROUP BY ' || array_to_string(groups, ', ') ELSE '' END
    || coalesce(' HAVING ' || having_, '')
    || CASE WHEN (ast->>'without_source_index')::boolean THEN ' WITHOUT SOURCE INDEX' ELSE '' END
    || CASE WHEN (ast->>'without_row_security')::boolean THEN ' WITHOUT ROW SECURITY' ELSE '' END;
  res := "trellis".grammar_parse_block("trellis".grammar_tokenize(txt), 1, target, ctes);
  RETURN "trellis"._joined_one_branch(res) || jsonb_build_object('written', written);
END
$fn$;
$trellis_m59$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 60) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (60, 'redefine_bounded_diff', false);
    EXECUTE $trellis_m60$-- Redefinitions in place (issue #25 follow-up; ADR 0055's fourth addendum).
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

CREATE FUNCTION "trellis"._redefine_lock_mode(shadow_id int)
RETURNS text LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  plan jsonb;
  wanted text[];
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN 'ACCESS EXCLUSIVE';
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  plan := "trellis"._redefine_plan(t, s.spec);
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
CREATE FUNCTION "trellis"._redefine_blockers(rel oid, mode text, older_ms float8)
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
CREATE TABLE "trellis".redefine_logs (
  shadow_id int PRIMARY KEY REFERENCES "trellis".transforms ON DELETE CASCADE,
  log_table text NOT NULL,
  after text[],
  done boolean NOT NULL DEFAULT false,
  void boolean NOT NULL DEFAULT false,
  started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The log table goes with its row (a redefinition switched, replaced, given up, dropped).
CREATE FUNCTION "trellis"._redefine_log_drop()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident(OLD.log_table);
  RETURN OLD;
END
$fn$;
CREATE TRIGGER redefine_log_drop AFTER DELETE ON "trellis".redefine_logs
  FOR EACH ROW EXECUTE FUNCTION "trellis"._redefine_log_drop();

-- The triggers' function: TG_ARGV[0] the log table (in the catalog schema), TG_ARGV[1] the
-- key's columns (quoted, comma-separated). Does nothing once the log table is gone.
CREATE FUNCTION "trellis"._redefine_log_keys()
RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  log text := quote_ident('trellis') || '.' || quote_ident(TG_ARGV[0]);
BEGIN
  IF to_regclass(log) IS NULL THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'TRUNCATE' THEN
    UPDATE "trellis".redefine_logs SET void = true WHERE log_table = TG_ARGV[0];
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
CREATE FUNCTION "trellis"._redefine_log_eligible(shadow_id int)
RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
BEGIN
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  RETURN "trellis"._redefine_lock_mode(shadow_id) = 'EXCLUSIVE'
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
CREATE FUNCTION "trellis"._redefine_log_start(shadow_id int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  s "trellis".transforms;
  t "trellis".transforms;
  log text := 'redefine_log#' || shadow_id;
  keys text;
  rel oid;
BEGIN
  IF EXISTS (SELECT 1 FROM "trellis".redefine_logs l WHERE l.shadow_id = _redefine_log_start.shadow_id) THEN
    RETURN true;
  END IF;
  IF NOT "trellis"._redefine_log_eligible(shadow_id) THEN
    RETURN false;
  END IF;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  keys := (SELECT string_agg(quote_ident(k), ', ' ORDER BY o) FROM jsonb_array_elements_text(s.spec->'key') WITH ORDINALITY x(k, o));
  EXECUTE format('CREATE TABLE %I.%I AS SELECT %s FROM %s WITH NO DATA', 'trellis', log, keys,
                 s.target_oid::regclass::text);
  EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (%s)', 'trellis', log, keys);
  FOREACH rel IN ARRAY ARRAY[t.target_oid, s.target_oid] LOOP
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#i', rel::regclass, log, keys);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS trellis_old NEW TABLE AS trellis_new
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#u', rel::regclass, log, keys);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS trellis_old
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#d', rel::regclass, log, keys);
    EXECUTE format('CREATE TRIGGER %I AFTER TRUNCATE ON %s
                      FOR EACH STATEMENT EXECUTE FUNCTION "trellis"._redefine_log_keys(%L, %L)',
                   'trellis_log#' || shadow_id || '#t', rel::regclass, log, keys);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I, ENABLE ALWAYS TRIGGER %I, ENABLE ALWAYS TRIGGER %I, ENABLE ALWAYS TRIGGER %I',
                   rel::regclass, 'trellis_log#' || shadow_id || '#i', 'trellis_log#' || shadow_id || '#u',
                   'trellis_log#' || shadow_id || '#d', 'trellis_log#' || shadow_id || '#t');
  END LOOP;
  INSERT INTO "trellis".redefine_logs (shadow_id, log_table) VALUES (shadow_id, log);
  RETURN true;
END
$fn$;

-- A key's columns compared with the text values `v` (as `after` holds them), typed as
-- relation `rel`'s columns: `(a.k1, a.k2) > ('1'::int, 'x'::text)`.
CREATE FUNCTION "trellis"._redefine_key_cmp(rel oid, alias text, keys text[], op text, v text[])
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT '(' || string_agg(alias || '.' || quote_ident(k), ', ' ORDER BY o) || ') ' || op || ' ('
         || string_agg(format('%L::%s', v[o], format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY o) || ')'
    FROM unnest(keys) WITH ORDINALITY AS u(k, o)
    JOIN pg_attribute a ON a.attrelid = rel AND a.attname = u.k AND NOT a.attisdropped
$fn$;

-- Step 2: one page, the shadow's next `batch` keys after the last page's (and the target's
-- keys in the same range): the keys where the two differ, logged. Reads only. Returns
-- whether every page is done.
CREATE FUNCTION "trellis"._redefine_log_page(shadow_id int, batch int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  l "trellis".redefine_logs;
  s "trellis".transforms;
  t "trellis".transforms;
  keys text[];
  key_list text;
  upto text[];
  range_n text;
  range_t text;
  tcols text;
  ncols text;
  log text;
BEGIN
  SELECT * INTO l FROM "trellis".redefine_logs x WHERE x.shadow_id = _redefine_log_page.shadow_id FOR UPDATE;
  IF NOT FOUND OR l.done OR l.void THEN
    RETURN true;
  END IF;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  log := quote_ident('trellis') || '.' || quote_ident(l.log_table);
  keys := ARRAY(SELECT k FROM jsonb_array_elements_text(s.spec->'key') WITH ORDINALITY x(k, o) ORDER BY o);
  key_list := (SELECT string_agg(quote_ident(k), ', ') FROM unnest(keys) k);
  -- The page's last key: the batch-th after the last page's (NULL: the rest of the table).
  EXECUTE format('SELECT ARRAY[%s] FROM (SELECT %s FROM %s n WHERE %s ORDER BY %s LIMIT 1 OFFSET %s) x',
                 (SELECT string_agg('x.' || quote_ident(k) || '::text', ', ') FROM unnest(keys) k),
                 (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k),
                 s.target_oid::regclass::text,
                 CASE WHEN l.after IS NULL THEN 'true' ELSE "trellis"._redefine_key_cmp(s.target_oid, 'n', keys, '>', l.after) END,
                 (SELECT string_agg('n.' || quote_ident(k), ', ') FROM unnest(keys) k), batch - 1)
    INTO upto;
  range_n := concat_ws(' AND ',
    CASE WHEN l.after IS NOT NULL THEN "trellis"._redefine_key_cmp(s.target_oid, 'n', keys, '>', l.after) END,
    CASE WHEN upto IS NOT NULL THEN "trellis"._redefine_key_cmp(s.target_oid, 'n', keys, '<=', upto) END, 'true');
  range_t := concat_ws(' AND ',
    CASE WHEN l.after IS NOT NULL THEN "trellis"._redefine_key_cmp(t.target_oid, 't', keys, '>', l.after) END,
    CASE WHEN upto IS NOT NULL THEN "trellis"._redefine_key_cmp(t.target_oid, 't', keys, '<=', upto) END, 'true');
  tcols := (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
  ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
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
  UPDATE "trellis".redefine_logs x SET after = upto, done = upto IS NULL
   WHERE x.shadow_id = _redefine_log_page.shadow_id;
  RETURN upto IS NULL;
END
$fn$;

-- Step 3: 0042's switch, wrapped. With a log done and not void, and the switch still one
-- that takes EXCLUSIVE only with the same key: the diff restricted to the logged keys, then
-- the catalog as 0042's. Otherwise the log goes and 0042's switch diffs whole.
ALTER FUNCTION "trellis"._redefine_switch(int) RENAME TO _redefine_switch_before_log;

CREATE FUNCTION "trellis"._redefine_switch(shadow_id int)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  l "trellis".redefine_logs;
  s "trellis".transforms;
  t "trellis".transforms;
  p "trellis".pipeline;
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
  SELECT * INTO l FROM "trellis".redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;
  IF NOT FOUND THEN
    RETURN "trellis"._redefine_switch_before_log(shadow_id);
  END IF;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  -- The drain's locks first, in the drain's order, as 0042's.
  ids := ARRAY(SELECT DISTINCT i FROM unnest(ARRAY[t.id, s.id] || ARRAY(
                 SELECT ts.transform_id FROM "trellis".transform_sources ts WHERE ts.source_oid = t.target_oid)) i
               ORDER BY i);
  PERFORM 1 FROM "trellis".page_slots ps WHERE ps.transform_id = ANY (ids)
   ORDER BY ps.transform_id, ps.bucket FOR UPDATE;
  PERFORM 1 FROM "trellis".pipeline px WHERE px.transform_id = ANY (ids) ORDER BY px.transform_id FOR UPDATE;
  SELECT * INTO s FROM "trellis".transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  SELECT * INTO t FROM "trellis".transforms y WHERE y.id = s.redefines;
  IF s.id IS NULL OR t.id IS NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'no such redefinition');
  END IF;
  SELECT * INTO p FROM "trellis".pipeline px WHERE px.transform_id = s.id;
  IF p.phase <> 'live' OR p.follow_pending OR s.paused_at IS NOT NULL THEN
    RETURN jsonb_build_object('switched', false, 'why', 'the new definition is not live yet');
  END IF;
  rel := t.target_oid::regclass::text;
  shadow_rel := s.target_oid::regclass::text;
  -- The target's lock, then the log's state under it (a TRUNCATE since marks it void).
  EXECUTE 'LOCK TABLE ' || rel || ' IN EXCLUSIVE MODE';
  locked_at := clock_timestamp();
  EXECUTE 'LOCK TABLE ' || shadow_rel || ' IN ACCESS EXCLUSIVE MODE';
  SELECT * INTO l FROM "trellis".redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;
  plan := "trellis"._redefine_plan(t, s.spec);
  IF NOT l.done OR l.void OR NOT "trellis"._redefine_log_eligible(shadow_id)
     OR jsonb_array_length(plan->'refused') > 0 THEN
    DELETE FROM "trellis".redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;
    RETURN "trellis"._redefine_switch_before_log(shadow_id);
  END IF;
  PERFORM set_config('trellis.maintaining', 'trellis', true);
  log := quote_ident('trellis') || '.' || quote_ident(l.log_table);
  keys := ARRAY(SELECT k FROM jsonb_array_elements_text(s.spec->'key') WITH ORDINALITY x(k, o) ORDER BY o);
  cols := (SELECT string_agg(quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
             FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
  tcols := (SELECT string_agg('t.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
  ncols := (SELECT string_agg('n.' || quote_ident(cc.name), ', ' ORDER BY cc.ordinal)
              FROM "trellis".transform_columns cc WHERE cc.transform_id = s.id);
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
  DELETE FROM "trellis".redefine_logs x WHERE x.shadow_id = _redefine_switch.shadow_id;

  -- The catalog, as 0042's: the shadow's rows become the transform's, on the target.
  UPDATE "trellis".transforms y SET redefines = NULL WHERE y.id = s.id;
  DELETE FROM "trellis".transforms y WHERE y.id = t.id;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  UPDATE "trellis".transforms y
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
CREATE FUNCTION "trellis"._redefine_log_cleanup(older_ms float8)
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
  r record;
  tg record;
  left_ int := 0;
BEGIN
  FOR r IN SELECT DISTINCT g.tgrelid FROM pg_trigger g
            WHERE starts_with(g.tgname, 'trellis_log#')
              AND to_regclass(quote_ident('trellis') || '.' || quote_ident('redefine_log#' || split_part(g.tgname, '#', 2))) IS NULL LOOP
    IF jsonb_array_length("trellis"._redefine_blockers(r.tgrelid, 'ACCESS EXCLUSIVE', older_ms)) > 0 THEN
      left_ := left_ + 1;
      CONTINUE;
    END IF;
    FOR tg IN SELECT g.tgname FROM pg_trigger g
               WHERE g.tgrelid = r.tgrelid AND starts_with(g.tgname, 'trellis_log#')
                 AND to_regclass(quote_ident('trellis') || '.' || quote_ident('redefine_log#' || split_part(g.tgname, '#', 2))) IS NULL LOOP
      EXECUTE format('DROP TRIGGER %I ON %s', tg.tgname, r.tgrelid::regclass);
    END LOOP;
  END LOOP;
  RETURN left_;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m60$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 61) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (61, 'equal_values_canonical_text', false);
    EXECUTE $trellis_m61$-- rank() and dense_rank() top-N over SEVERAL order expressions compare a row's values with
-- the others' as one text, `ROW(o1, o2, ...)::text` (ADR 0065): values equal in order but
-- not in text (numeric 1.0 and 1.00, float8 0 and -0, interval '1 day' and '24 hours',
-- citext 'A' and 'a') got different ranks where Postgres gives them one (0058 typed the
-- comparison for one order expression only: a record[] cannot be a column).
--
-- Wrapped again (the pattern of 0039-0041): `_topn_rewrite_window` (0058's) is renamed
-- `_topn_rewrite_window_before_canon`, and the new function of the old name rewrites its
-- result for rank and dense_rank over several order expressions: each value in the probe
-- is its canonical text (`_topn_canon`), the same text for values its type calls equal, so
-- equal texts are equal values and the other way round. Rows are still ordered by the
-- values themselves. Transforms defined before keep the old probe until defined again (or
-- redefined with ALTER TRANSFORM … AS).

ALTER FUNCTION "trellis"._topn_rewrite_window(jsonb, int) RENAME TO _topn_rewrite_window_before_canon;

-- A value's text, the same for every value its type's equality calls equal: numerics without
-- trailing zeros, float zero without its sign, intervals justified (30-day months, 24-hour
-- days, as interval comparison counts them), citext in lower case; any other type's own
-- text (equal and same text for the types a ranking orders by: integers, text under a
-- deterministic collation, dates, timestamps, booleans, uuids). IMMUTABLE as a definition's
-- own functions must be (the check of _check_definition): a type's text can depend on
-- settings (timestamptz on TimeZone), which a transform's statements run under as it was
-- defined (ADR 0033), as the `::text` it replaces did.
CREATE FUNCTION "trellis"._topn_canon(v anyelement)
RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
  t regtype := pg_typeof(v);
BEGIN
  IF v IS NULL THEN
    RETURN NULL;
  ELSIF t = 'numeric'::regtype THEN
    RETURN trim_scale(v::text::numeric)::text;
  ELSIF t IN ('float8'::regtype, 'float4'::regtype) THEN
    RETURN CASE WHEN v::text::float8 = 0 THEN '0' ELSE v::text END;
  ELSIF t = 'interval'::regtype THEN
    RETURN justify_interval(v::text::interval)::text;
  -- By the type's name (a syscache lookup, not a query per value): citext in any schema.
  ELSIF t::text ~ '(^|\.)citext$' THEN
    RETURN lower(v::text);
  END IF;
  RETURN v::text;
END
$fn$;

CREATE FUNCTION "trellis"._topn_rewrite_window(pa jsonb, k int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  win jsonb := pa -> 'window';
  res jsonb := "trellis"._topn_rewrite_window_before_canon(pa, k);
  old_probe text;
  new_probe text;
BEGIN
  IF win ->> 'fn' NOT IN ('rank', 'dense_rank') OR jsonb_array_length(win -> 'order_by') < 2 THEN
    RETURN res;
  END IF;
  -- As _topn_rewrite_window_before_mvcc writes it (0045): in the top k's aggregate, the
  -- rank item and the WHERE.
  old_probe := 'ROW(' || (SELECT string_agg('(' || (o ->> 'expr') || ')', ', ' ORDER BY n)
                            FROM jsonb_array_elements(win -> 'order_by') WITH ORDINALITY AS x(o, n)) || ')::text';
  new_probe := 'ROW(' || (SELECT string_agg('"trellis"._topn_canon((' || (o ->> 'expr') || '))', ', ' ORDER BY n)
                            FROM jsonb_array_elements(win -> 'order_by') WITH ORDINALITY AS x(o, n)) || ')::text';
  RETURN replace(res::text, "trellis"._json_inner(old_probe), "trellis"._json_inner(new_probe))::jsonb;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;

-- Set operations whose rows are counted by their text (ADR 0073: an ALL operator outermost,
-- or any set operation in a subquery or WITH query) grouped a row's copies by
-- `ROW(items)::text`: values equal to Postgres but not in text (numeric 1.0 and 1.00, an
-- integer 1 in one branch and a numeric 1.0 in another) were different rows, so INTERSECT
-- dropped them and EXCEPT kept them. Wrapped: `grammar_parse_view` (4 arguments, 0059's) is
-- renamed `grammar_parse_view_before_canon`, and the new function of the old name rewrites
-- each "trellis#row" item the set operation wrote into the same row of canonical texts
-- (`_topn_canon`): equal values, one group. A row shows one of its equal values, as
-- Postgres's own result does. Transforms defined before keep the text until defined again.
ALTER FUNCTION "trellis".grammar_parse_view("trellis".grammar_token[], int, jsonb, jsonb)
  RENAME TO grammar_parse_view_before_canon;

-- `node` with every SELECT list's "trellis#row" item, as the set operation writes it
-- (`ROW((e1), (e2), ...)::text` over the items before it), made of canonical texts.
CREATE FUNCTION "trellis"._setop_row_canon(node jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  res jsonb;
  items jsonb;
  before text;
  written text;
  canon text;
  i int;
BEGIN
  IF jsonb_typeof(node) = 'array' THEN
    RETURN (SELECT coalesce(jsonb_agg("trellis"._setop_row_canon(e) ORDER BY o), '[]')
              FROM jsonb_array_elements(node) WITH ORDINALITY AS x(e, o));
  ELSIF jsonb_typeof(node) IS DISTINCT FROM 'object' THEN
    RETURN node;
  END IF;
  SELECT coalesce(jsonb_object_agg(k, "trellis"._setop_row_canon(v)), '{}') INTO res
    FROM jsonb_each(node) AS x(k, v);
  items := res -> 'select';
  IF jsonb_typeof(items) = 'array' THEN
    FOR i IN 0 .. jsonb_array_length(items) - 1 LOOP
      CONTINUE WHEN items -> i ->> 'name' IS DISTINCT FROM 'trellis#row' OR i = 0;
      SELECT 'ROW(' || string_agg('(' || (e ->> 'expr') || ')', ', ' ORDER BY o) || ')::text',
             'ROW(' || string_agg('"trellis"._topn_canon((' || (e ->> 'expr') || '))', ', ' ORDER BY o) || ')::text'
        INTO written, canon
        FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, o) WHERE o <= i;
      before := items -> i ->> 'expr';
      IF before = written THEN
        items := jsonb_set(items, ARRAY[i::text, 'expr'], to_jsonb(canon));
      END IF;
    END LOOP;
    res := jsonb_set(res, '{select}', items);
  END IF;
  RETURN res;
END
$fn$;

CREATE FUNCTION "trellis".grammar_parse_view(
  toks "trellis".grammar_token[], i int, target jsonb, ctes jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  res jsonb := "trellis".grammar_parse_view_before_canon(toks, i, target, ctes);
BEGIN
  IF strpos(res::text, 'trellis#row') = 0 THEN
    RETURN res;
  END IF;
  RETURN "trellis"._setop_row_canon(res);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m61$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 62) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (62, 'top_n_in_with_query', false);
    EXECUTE $trellis_m62$-- Top-N per partition written with a WITH query (issue #26): the ranking SELECT as a WITH
-- query, read by the statement that filters its rank,
--
--   WITH r AS (SELECT id, team, rank() OVER (PARTITION BY team ORDER BY score DESC) AS rk FROM t)
--   SELECT id, team, rk FROM r WHERE rk <= 3
--
-- was refused ("a window function is kept only as top-N per partition: SELECT ... FROM
-- (SELECT ...) AS s WHERE rk <= k"), though it is the derived-table form Postgres itself
-- inlines a WITH query read once into. A WITH query ranking its rows is now kept as that
-- derived table is (ADR 0065): when the statement reads it exactly once, in the FROM or a
-- join of the SELECT whose WHERE bounds the rank. Read more than once, or from another
-- level (a subquery, another WITH query), it is refused as before: each reading would need
-- its own bound.
--
-- Wrapped (the pattern of 0039-0041): `_topn_bind` (0045) is renamed `_topn_bind_before_cte`;
-- the new function of the old name marks such a WITH query as a ranking derived table for
-- the delegate (which reads k from the WHERE and rewrites it), then gives it back its kind.
-- The delegate's recursion calls `_topn_bind` by name: every level goes through here.

ALTER FUNCTION "trellis"._topn_bind(jsonb, boolean) RENAME TO _topn_bind_before_cte;

-- How many FROM or join items anywhere in `ast` read the relation `name` without a schema
-- (a WITH query's name).
CREATE FUNCTION "trellis"._cte_readers(ast jsonb, name text)
RETURNS int LANGUAGE sql IMMUTABLE AS $fn$
  SELECT count(*)::int
    FROM jsonb_path_query(ast, 'strict $.** ? (@.name == $n && @.schema == null && exists (@.alias))',
                          jsonb_build_object('n', name)) r
$fn$;

CREATE FUNCTION "trellis"._topn_bind(ast jsonb, ranked boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  here jsonb;
  marked jsonb;
  res jsonb;
BEGIN
  IF ast IS NULL OR jsonb_typeof(ast) <> 'object' OR NOT ast ? 'parts' THEN
    RETURN "trellis"._topn_bind_before_cte(ast, ranked);
  END IF;
  -- This level's FROM and joins.
  here := jsonb_build_array(ast -> 'from') || coalesce(ast -> 'joins', '[]');
  -- Each such WITH query's name, and the name its reader calls it by (its alias, if any).
  SELECT jsonb_object_agg(p ->> 'name', (
           SELECT coalesce(r ->> 'alias', r ->> 'name') FROM jsonb_array_elements(here) r
            WHERE r ->> 'name' = p ->> 'name' AND r ->> 'schema' IS NULL LIMIT 1))
    INTO marked
    FROM jsonb_array_elements(ast -> 'parts') p
   WHERE p ->> 'kind' = 'cte' AND p -> 'ast' ? 'window'
     AND "trellis"._cte_readers(ast, p ->> 'name') = 1
     AND "trellis"._cte_readers(here, p ->> 'name') = 1;
  IF marked IS NULL THEN
    RETURN "trellis"._topn_bind_before_cte(ast, ranked);
  END IF;
  -- For the delegate, a ranking derived table named as its reader calls it (the delegate
  -- reads k from the WHERE by that name); given back its kind and name after.
  res := "trellis"._topn_bind_before_cte(ast || jsonb_build_object('parts', (
    SELECT jsonb_agg(CASE WHEN p ->> 'kind' = 'cte' AND marked ? (p ->> 'name')
                          THEN p || jsonb_build_object('kind', 'derived', 'name', marked ->> (p ->> 'name'),
                                                       'trellis#cte', p ->> 'name')
                          ELSE p END ORDER BY o)
      FROM jsonb_array_elements(ast -> 'parts') WITH ORDINALITY AS x(p, o))), ranked);
  RETURN res || jsonb_build_object('parts', (
    SELECT jsonb_agg(CASE WHEN p ? 'trellis#cte'
                          THEN (p - 'trellis#cte') || jsonb_build_object('kind', 'cte', 'name', p ->> 'trellis#cte')
                          ELSE p END ORDER BY o)
      FROM jsonb_array_elements(res -> 'parts') WITH ORDINALITY AS x(p, o)));
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m62$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 63) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (63, 'redefine_into_top_n', false);
    EXECUTE $trellis_m63$-- ALTER TRANSFORM t AS <statement> into a top-N (issue #25: a definition changes like code;
-- #26: the view SQL it may change into): a ranking derived table, or a ranking WITH query
-- (0062), was refused ("a window function is kept only as top-N per partition") although the
-- same statement defines a transform. TRANSFORM binds the rankings before it defines anything
-- (`_define` calls `_topn_bind`, 0045: each ranking part rewritten into the partition's top k
-- and the rows joined with it); ALTER … AS did not, and each part's own check then refused
-- the ranking SELECT.
--
-- Wrapped (the pattern of 0039-0041): `_redefine` (0056's) is renamed `_redefine_before_topn`;
-- the new function of the old name binds the new definition's rankings as `_define` does,
-- then delegates.

ALTER FUNCTION "trellis"._redefine(jsonb) RENAME TO _redefine_before_topn;

CREATE FUNCTION "trellis"._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast -> 'definition' ->> 'form' = 'as' THEN
    ast := jsonb_set(ast, '{definition}', "trellis"._topn_bind(ast -> 'definition'));
  END IF;
  RETURN "trellis"._redefine_before_topn(ast);
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;

-- A RIGHT or FULL JOIN after another join checks that every column is written with its
-- table's alias (`_prefix_refs`, 0054): the name after COLLATE (`a.tag COLLATE "C"`) was taken
-- for a bare column and the statement refused (found by the differential generator).
-- Wrapped: renamed `_prefix_refs_before_collate`; the new function of the old name drops
-- collation names from the bare names its delegate found.
ALTER FUNCTION "trellis"._prefix_refs(text, jsonb, text) RENAME TO _prefix_refs_before_collate;

CREATE FUNCTION "trellis"._prefix_refs(expr text, sources jsonb, q text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  r jsonb := "trellis"._prefix_refs_before_collate(expr, sources, q);
  t "trellis".grammar_token[];
  collations text[];
BEGIN
  IF jsonb_array_length(r -> 'bare') = 0 THEN
    RETURN r;
  END IF;
  t := "trellis".grammar_tokenize(expr);
  collations := ARRAY(SELECT t[k].text FROM generate_series(2, coalesce(array_length(t, 1), 0)) k
                       WHERE t[k - 1].kind = 'word' AND t[k - 1].value = 'collate');
  RETURN jsonb_set(r, '{bare}', coalesce((SELECT jsonb_agg(b) FROM jsonb_array_elements_text(r -> 'bare') b
                                           WHERE b <> ALL (collations)), '[]'));
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m63$;
  END IF;
  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
  INSERT INTO "trellis".config (target_schema) VALUES ('public')
    ON CONFLICT DO NOTHING;

  -- Background jobs (self-checks) run on pg-boss, in the schema trellis_jobs at pg-boss's
  -- schema version 24 (ADR 0014).
  IF to_regclass('trellis_jobs.migrations') IS NOT NULL THEN
    RAISE EXCEPTION 'schema trellis_jobs, where Trellis instance trellis keeps its jobs, holds another Trellis instance''s catalog: choose another catalog schema'
      USING ERRCODE = 'TRC01';
  END IF;
  IF to_regclass('trellis_jobs.version') IS NULL THEN
    EXECUTE $trellis_boss$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    
    CREATE SCHEMA IF NOT EXISTS trellis_jobs
  ;

    CREATE TYPE trellis_jobs.job_state AS ENUM (
      'created',
      'retry',
      'active',
      'completed',
      'cancelled',
      'failed'
    )
  ;

    CREATE TABLE trellis_jobs.version (
      version int primary key,
      maintained_on timestamp with time zone,
      cron_on timestamp with time zone,
      monitored_on timestamp with time zone
    )
  ;

    CREATE TABLE trellis_jobs.queue (
      name text,
      policy text,
      retry_limit int,
      retry_delay int,
      retry_backoff bool,
      expire_seconds int,
      retention_minutes int,
      dead_letter text REFERENCES trellis_jobs.queue (name),
      partition_name text,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.schedule (
      name text REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      cron text not null,
      timezone text,
      data jsonb,
      options jsonb,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.subscription (
      event text not null,
      name text not null REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY(event, name)
    )
  ;

    CREATE TABLE trellis_jobs.job (
      id uuid not null default gen_random_uuid(),
      name text not null,
      priority integer not null default(0),
      data jsonb,
      state trellis_jobs.job_state not null default('created'),
      retry_limit integer not null default(2),
      retry_count integer not null default(0),
      retry_delay integer not null default(0),
      retry_backoff boolean not null default false,
      start_after timestamp with time zone not null default now(),
      started_on timestamp with time zone,
      singleton_key text,
      singleton_on timestamp without time zone,
      expire_in interval not null default interval '15 minutes',
      created_on timestamp with time zone not null default now(),
      completed_on timestamp with time zone,
      keep_until timestamp with time zone NOT NULL default now() + interval '14 days',
      output jsonb,
      dead_letter text,
      policy text
    ) PARTITION BY LIST (name)
  ;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);
CREATE TABLE trellis_jobs.archive (LIKE trellis_jobs.job);
ALTER TABLE trellis_jobs.archive ADD PRIMARY KEY (name, id);
ALTER TABLE trellis_jobs.archive ADD archived_on timestamptz NOT NULL DEFAULT now();
CREATE INDEX archive_i1 ON trellis_jobs.archive(archived_on);

    CREATE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
      queue_created_on timestamptz;
    BEGIN

      WITH q as (
      INSERT INTO trellis_jobs.queue (
        name,
        policy,
        retry_limit,
        retry_delay,
        retry_backoff,
        expire_seconds,
        retention_minutes,
        dead_letter,
        partition_name
      )
      VALUES (
        queue_name,
        options->>'policy',
        (options->>'retryLimit')::int,
        (options->>'retryDelay')::int,
        (options->>'retryBackoff')::bool,
        (options->>'expireInSeconds')::int,
        (options->>'retentionMinutes')::int,
        options->>'deadLetter',
        table_name
      )
      ON CONFLICT DO NOTHING
      RETURNING created_on
      )
      SELECT created_on into queue_created_on from q;

      IF queue_created_on IS NULL THEN
        RETURN;
      END IF;

      EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
      EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
      EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;

    CREATE FUNCTION trellis_jobs.delete_queue(queue_name text)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar;
    BEGIN
      WITH deleted as (
        DELETE FROM trellis_jobs.queue
        WHERE name = queue_name
        RETURNING partition_name
      )
      SELECT partition_name from deleted INTO table_name;

      EXECUTE format('DROP TABLE IF EXISTS trellis_jobs.%I', table_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;
INSERT INTO trellis_jobs.version(version) VALUES ('24');
    $trellis_boss$;
  ELSE
    SELECT version INTO boss_version FROM trellis_jobs.version;
    IF boss_version >= 24 THEN
      NULL; -- up to date, or installed by a newer trellis-pg
  ELSIF boss_version = 23 THEN
    EXECUTE $trellis_boss_23$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_23$;
  ELSIF boss_version = 22 THEN
    EXECUTE $trellis_boss_22$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_22$;
  ELSIF boss_version = 21 THEN
    EXECUTE $trellis_boss_21$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ALTER COLUMN retry_limit SET DEFAULT 2;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_21$;
    ELSE
      RAISE EXCEPTION 'the jobs schema trellis_jobs is at pg-boss schema version %, which this trellis-pg cannot upgrade to 24', boss_version
        USING ERRCODE = 'TRI01';
    END IF;
  END IF;
  PERFORM trellis_jobs.create_queue('self_check', '{"policy": "standard"}'::json);

  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis_jobs" FROM PUBLIC;
END
$trellis_upgrade$;
