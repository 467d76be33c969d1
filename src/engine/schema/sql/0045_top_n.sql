-- DISTINCT ON in a view's SQL (issue #26, item 1; ADR 0065):
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
-- Window functions stay refused, now naming the function (row_number() OVER ...).
--
-- Renamed here and wrapped (statements without DISTINCT ON go straight through, so whichever
-- migration wrote them last stays in force): grammar_parse_block -> grammar_parse_block_before_topn,
-- _render_view_block -> _render_view_block_before_topn, render_statement ->
-- render_statement_before_topn, _analyze_transform -> _analyze_before_topn.

ALTER FUNCTION @schema@.grammar_parse_block(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_topn;
ALTER FUNCTION @schema@._render_view_block(jsonb) RENAME TO _render_view_block_before_topn;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO render_statement_before_topn;
ALTER FUNCTION @schema@._analyze_transform(jsonb) RENAME TO _analyze_before_topn;

-- A window function in tokens a .. b-1 (at any depth): refused, naming it.
CREATE FUNCTION @schema@._topn_refuse_window(toks @schema@.grammar_token[], a int, b int)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  k int;
  d int;
  fn text;
BEGIN
  FOR k IN a .. b - 1 LOOP
    CONTINUE WHEN NOT @schema@.grammar_kw(toks[k], 'over') OR k = a;
    CONTINUE WHEN NOT (toks[k - 1].kind = 'punct' AND toks[k - 1].text = ')');
    -- The function's name: the token before the "(" that the ")" before OVER closes.
    d := 0;
    FOR j IN REVERSE k - 1 .. a LOOP
      IF toks[j].kind = 'punct' AND toks[j].text = ')' THEN
        d := d + 1;
      ELSIF toks[j].kind = 'punct' AND toks[j].text = '(' THEN
        d := d - 1;
        IF d = 0 THEN
          fn := CASE WHEN j > a THEN coalesce(toks[j - 1].value, toks[j - 1].text) END;
          EXIT;
        END IF;
      END IF;
    END LOOP;
    PERFORM @schema@.grammar_refuse(format(
      'a window function (%s() OVER ...) is not supported yet%s', coalesce(fn, '?'),
      CASE WHEN fn IN ('row_number', 'rank', 'dense_rank', 'first_value')
        THEN ': for the first row of each partition write SELECT DISTINCT ON (partition) ... ORDER BY partition, order'
        ELSE '' END), toks[k].pos);
  END LOOP;
END
$fn$;

-- A view's SELECT block at token i (grammar_parse_block_before_topn), and: SELECT DISTINCT
-- ON (exprs) read here, the rest of the block read without those tokens, and its ORDER BY
-- (which the block parser drops) kept as `order_by`: [{expr, dir}] (dir: ASC/DESC/NULLS
-- as written). The AST gains `distinct_on` (the expressions, as written).
CREATE FUNCTION @schema@.grammar_parse_block(
  toks @schema@.grammar_token[], i int, target jsonb, ctes jsonb
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
  c int;
  eof_at int;
  on_ jsonb := '[]';
  order_ jsonb := '[]';
  ast jsonb;
  sub @schema@.grammar_token[];
BEGIN
  -- The block's SELECT keyword (after its WITH queries, outside brackets) and its end.
  WHILE toks[k].kind <> 'eof' LOOP
    IF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
    ELSIF d = 0 AND sel IS NULL AND @schema@.grammar_kw(toks[k], 'select') THEN
      sel := k;
    END IF;
    k := k + 1;
  END LOOP;
  eof_at := k;
  PERFORM @schema@._topn_refuse_window(toks, i, eof_at);
  IF sel IS NULL OR NOT @schema@.grammar_kw(toks[sel + 1], 'distinct')
     OR NOT @schema@.grammar_kw(toks[sel + 2], 'on') THEN
    RETURN @schema@.grammar_parse_block_before_topn(toks, i, target, ctes);
  END IF;
  IF NOT (toks[sel + 3].kind = 'punct' AND toks[sel + 3].text = '(') THEN
    PERFORM @schema@.grammar_unexpected(toks, sel + 3, '"(" and the DISTINCT ON expressions');
  END IF;
  -- The ")" closing the list; the expressions between, split at top-level commas.
  d := 0;
  k := sel + 3;
  LOOP
    IF toks[k].kind = 'eof' THEN
      PERFORM @schema@.grammar_unexpected(toks, k, '")" after the DISTINCT ON expressions');
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN ('(', '[') THEN
      d := d + 1;
    ELSIF toks[k].kind = 'punct' AND toks[k].text IN (')', ']') THEN
      d := d - 1;
      EXIT WHEN d = 0;
    END IF;
    k := k + 1;
  END LOOP;
  close_ := k;
  sub := toks[sel + 4 : close_ - 1] || ROW('eof', '', '', toks[close_].pos)::@schema@.grammar_token;
  k := 1;
  LOOP
    e := @schema@.grammar_scan(sub, k);
    IF e = k THEN
      PERFORM @schema@.grammar_unexpected(sub, k, 'a DISTINCT ON expression');
    END IF;
    on_ := on_ || to_jsonb(@schema@.grammar_text(sub, k, e));
    k := e;
    EXIT WHEN NOT (sub[k].kind = 'punct' AND sub[k].text = ',');
    k := k + 1;
  END LOOP;
  IF sub[k].kind <> 'eof' THEN
    PERFORM @schema@.grammar_unexpected(sub, k, '"," or ")" after a DISTINCT ON expression');
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
    ELSIF d = 0 AND @schema@.grammar_kw(toks[k], 'order') AND @schema@.grammar_kw(toks[k + 1], 'by') THEN
      k := k + 2;
      LOOP
        e := @schema@.grammar_scan(toks, k);
        IF e = k THEN
          PERFORM @schema@.grammar_unexpected(toks, k, 'an ORDER BY expression');
        END IF;
        c := e;
        IF c - 2 > k AND @schema@.grammar_kw(toks[c - 2], 'nulls')
           AND (@schema@.grammar_kw(toks[c - 1], 'first') OR @schema@.grammar_kw(toks[c - 1], 'last')) THEN
          c := c - 2;
        END IF;
        IF c - 1 > k AND (@schema@.grammar_kw(toks[c - 1], 'asc') OR @schema@.grammar_kw(toks[c - 1], 'desc')) THEN
          c := c - 1;
        END IF;
        FOR j IN k .. c - 1 LOOP
          IF @schema@.grammar_kw(toks[j], 'using') THEN
            PERFORM @schema@.grammar_refuse('ORDER BY ... USING is not supported with DISTINCT ON: write ASC or DESC', toks[j].pos);
          END IF;
        END LOOP;
        IF c = k + 1 AND toks[k].kind = 'number' THEN
          PERFORM @schema@.grammar_refuse(
            'ORDER BY a position (ORDER BY 2) is not supported with DISTINCT ON: write the expression', toks[k].pos);
        END IF;
        order_ := order_ || jsonb_build_array(jsonb_build_object(
          'expr', @schema@.grammar_text(toks, k, c),
          'dir', CASE WHEN c < e THEN @schema@.grammar_text(toks, c, e) END));
        k := e;
        EXIT WHEN NOT (toks[k].kind = 'punct' AND toks[k].text = ',');
        k := k + 1;
      END LOOP;
      EXIT;
    END IF;
    k := k + 1;
  END LOOP;
  IF jsonb_array_length(order_) = 0 THEN
    PERFORM @schema@.grammar_refuse(
      'DISTINCT ON without ORDER BY is not supported: the row kept would be arbitrary (add ORDER BY the DISTINCT ON expressions, then the order within each)',
      toks[sel + 1].pos);
  END IF;

  ast := @schema@.grammar_parse_block_before_topn(toks[1 : sel] || toks[close_ + 1 :], i, target, ctes);
  IF jsonb_array_length(coalesce(ast -> 'group_by', '[]')) > 0 OR ast ->> 'having' IS NOT NULL THEN
    PERFORM @schema@.grammar_refuse('DISTINCT ON with GROUP BY or HAVING is not supported yet', toks[sel + 1].pos);
  END IF;
  IF coalesce((ast ->> 'distinct')::boolean, false) THEN
    PERFORM @schema@.grammar_unexpected(toks, sel + 1, 'one DISTINCT');
  END IF;
  RETURN ast || jsonb_build_object('distinct_on', on_, 'order_by', order_);
END
$fn$;

-- The ORDER BY of a DISTINCT ON AST as written.
CREATE FUNCTION @schema@._topn_order_sql(ast jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT string_agg((o ->> 'expr') || coalesce(' ' || (o ->> 'dir'), ''), ', ' ORDER BY n)
    FROM jsonb_array_elements(ast -> 'order_by') WITH ORDINALITY AS x(o, n)
$fn$;

-- A view's SELECT block as written: a DISTINCT ON one with DISTINCT ON and its ORDER BY
-- (its GROUP BY is the engine's), every other as before.
CREATE FUNCTION @schema@._render_view_block(ast jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  plain jsonb;
  full_ text;
  body text;
BEGIN
  IF NOT ast ? 'distinct_on' THEN
    RETURN @schema@._render_view_block_before_topn(ast);
  END IF;
  plain := ast - 'distinct_on' - 'order_by' || jsonb_build_object('group_by', '[]'::jsonb);
  full_ := @schema@._render_view_block_before_topn(plain);
  -- The block without its WITH queries starts with SELECT: what precedes it is the WITH.
  body := @schema@._render_view_block_before_topn(plain || jsonb_build_object('parts', coalesce((
    SELECT jsonb_agg(p ORDER BY o) FROM jsonb_array_elements(plain -> 'parts') WITH ORDINALITY AS x(p, o)
     WHERE p ->> 'kind' <> 'cte'), '[]')));
  RETURN left(full_, length(full_) - length(body))
    || 'SELECT DISTINCT ON (' || (SELECT string_agg(e, ', ' ORDER BY n)
                                   FROM jsonb_array_elements_text(ast -> 'distinct_on') WITH ORDINALITY AS x(e, n)) || ') '
    || substr(body, length('SELECT ') + 1)
    || ' ORDER BY ' || @schema@._topn_order_sql(ast);
END
$fn$;

-- render_statement (whichever migration wrote it last); a view's SQL whose top SELECT is a
-- DISTINCT ON, as written.
CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast ->> 'kind' IS DISTINCT FROM 'transform' OR NOT ast ? 'distinct_on' THEN
    RETURN @schema@.render_statement_before_topn(ast);
  END IF;
  ast := @schema@._semi_as_written(ast);
  RETURN 'TRANSFORM ' || @schema@.grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
    || ' AS ' || @schema@._render_view_select(ast)
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
CREATE FUNCTION @schema@._topn_rewrite(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := @schema@._view_from_sql(ast);
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
  info := @schema@._analyze_query('SELECT DISTINCT ON (' || on_list || ') '
    || (SELECT string_agg((i ->> 'expr') || coalesce(' AS ' || quote_ident(i ->> 'name'), ''), ', ' ORDER BY n)
          FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY AS x(i, n))
    || ' FROM ' || from_sql || where_sql || ' ORDER BY ' || @schema@._topn_order_sql(ast),
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
      PERFORM @schema@._fail('TRV01', format(
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
CREATE FUNCTION @schema@._analyze_transform(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  spec jsonb;
BEGIN
  IF NOT ast ? 'distinct_on' THEN
    RETURN @schema@._analyze_before_topn(ast);
  END IF;
  spec := @schema@._analyze_before_topn(@schema@._topn_rewrite(ast));
  RETURN spec || jsonb_build_object('ast', (spec -> 'ast') || jsonb_build_object(
    'select', ast -> 'select', 'distinct_on', ast -> 'distinct_on', 'order_by', ast -> 'order_by',
    'group_by', ast -> 'distinct_on'));
END
$fn$;
