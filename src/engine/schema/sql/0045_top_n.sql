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

ALTER FUNCTION @schema@.grammar_parse_block(@schema@.grammar_token[], int, jsonb, jsonb) RENAME TO grammar_parse_block_before_topn;
ALTER FUNCTION @schema@._render_view_block(jsonb) RENAME TO _render_view_block_before_topn;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO render_statement_before_topn;
ALTER FUNCTION @schema@._analyze_transform(jsonb) RENAME TO _analyze_before_topn;
ALTER FUNCTION @schema@._define(jsonb, text) RENAME TO _define_before_topn;

-- A window function whose OVER is token k: refused, naming it. Returns when token k is no
-- OVER of a function call.
CREATE FUNCTION @schema@._topn_refuse_window(toks @schema@.grammar_token[], k int)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  fn text;
BEGIN
  IF NOT @schema@.grammar_kw(toks[k], 'over') OR k < 2
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
  PERFORM @schema@.grammar_refuse(format(
    'a window function (%s() OVER ...) is not supported yet%s', coalesce(fn, '?'),
    CASE WHEN fn IN ('row_number', 'rank', 'dense_rank')
      THEN ': top-N is kept as SELECT ... FROM (SELECT ..., ' || fn || '() OVER (PARTITION BY ... ORDER BY ...) AS rn FROM ...) s WHERE rn <= k, or as SELECT DISTINCT ON (...) ... ORDER BY ...'
      ELSE '' END), toks[k].pos);
END
$fn$;

-- ORDER BY items from token i, up to a token that ends them (anything but ","): each
-- {expr, dir} (dir: ASC/DESC and NULLS FIRST/LAST as written, or null).
CREATE FUNCTION @schema@._topn_order_items(toks @schema@.grammar_token[], k int, what text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  e int;
  c int;
  order_ jsonb := '[]';
BEGIN
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
        PERFORM @schema@.grammar_refuse(format('ORDER BY ... USING is not supported with %s: write ASC or DESC', what), toks[j].pos);
      END IF;
    END LOOP;
    IF c = k + 1 AND toks[k].kind = 'number' THEN
      PERFORM @schema@.grammar_refuse(format(
        'ORDER BY a position (ORDER BY 2) is not supported with %s: write the expression', what), toks[k].pos);
    END IF;
    order_ := order_ || jsonb_build_array(jsonb_build_object(
      'expr', @schema@.grammar_text(toks, k, c),
      'dir', CASE WHEN c < e THEN @schema@.grammar_text(toks, c, e) END));
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
CREATE FUNCTION @schema@._topn_window_item(toks @schema@.grammar_token[], a int, b int)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  d int := 0;
  c int;
  k int;
  e int;
  nm text;
  sub @schema@.grammar_token[];
  part_ jsonb := '[]';
  order_ jsonb := '[]';
BEGIN
  IF NOT (toks[a].kind = 'word' AND toks[a].value IN ('row_number', 'rank', 'dense_rank')
          AND toks[a + 1].text = '(' AND toks[a + 2].text = ')'
          AND @schema@.grammar_kw(toks[a + 3], 'over') AND toks[a + 4].text = '(') THEN
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
    PERFORM @schema@.grammar_refuse(format(
      'name the %s() column (AS rn): the statement around it filters on it', toks[a].value), toks[a].pos);
  ELSIF @schema@.grammar_kw(toks[c + 1], 'as') AND c + 3 = b THEN
    nm := @schema@.grammar_name(toks[c + 2], 'a column name after AS', false);
  ELSIF c + 2 = b THEN
    nm := @schema@.grammar_name(toks[c + 1], 'a column name', false);
  ELSE
    RETURN NULL;
  END IF;
  sub := toks[a + 5 : c - 1] || ROW('eof', '', '', toks[c].pos)::@schema@.grammar_token;
  k := 1;
  IF @schema@.grammar_kw(sub[k], 'partition') AND @schema@.grammar_kw(sub[k + 1], 'by') THEN
    k := k + 2;
    LOOP
      e := @schema@.grammar_scan(sub, k);
      IF e = k THEN
        PERFORM @schema@.grammar_unexpected(sub, k, 'a PARTITION BY expression');
      END IF;
      part_ := part_ || to_jsonb(@schema@.grammar_text(sub, k, e));
      k := e;
      EXIT WHEN NOT (sub[k].kind = 'punct' AND sub[k].text = ',');
      k := k + 1;
    END LOOP;
  ELSE
    PERFORM @schema@.grammar_refuse(format(
      'a window function (%s() OVER) without PARTITION BY is not supported yet: top-N is kept per partition', toks[a].value),
      toks[a + 3].pos);
  END IF;
  IF NOT (@schema@.grammar_kw(sub[k], 'order') AND @schema@.grammar_kw(sub[k + 1], 'by')) THEN
    PERFORM @schema@.grammar_refuse(format(
      'a window function (%s() OVER) without ORDER BY is not supported: the rank would be arbitrary', toks[a].value), toks[a + 3].pos);
  END IF;
  order_ := @schema@._topn_order_items(sub, k + 2, toks[a].value || '()');
  k := 1;
  WHILE sub[k].kind <> 'eof' LOOP
    k := k + 1;
  END LOOP;
  -- _topn_order_items stops at the first token that is not part of an item.
  e := 1;
  FOR j IN 1 .. k LOOP
    IF sub[j].kind = 'word' AND sub[j].value IN ('rows', 'range', 'groups') THEN
      PERFORM @schema@.grammar_refuse(format('a window frame (%s ...) is not supported', upper(sub[j].value)), sub[j].pos);
    ELSIF sub[j].kind = 'word' AND sub[j].value = 'exclude' THEN
      PERFORM @schema@.grammar_refuse('a window frame exclusion (EXCLUDE ...) is not supported', sub[j].pos);
    END IF;
  END LOOP;
  RETURN jsonb_build_object('fn', toks[a].value, 'name', nm, 'partition', part_, 'order_by', order_,
    'expr', @schema@.grammar_text(toks, a, c + 1), 'position', toks[a].pos);
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
  eof_at int;
  on_ jsonb := '[]';
  order_ jsonb := '[]';
  ast jsonb;
  sub @schema@.grammar_token[];
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
    ELSIF d = 0 AND sel IS NULL AND @schema@.grammar_kw(toks[k], 'select') THEN
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
                                              OR @schema@.grammar_kw(toks[k], 'from'))) THEN
        w := @schema@._topn_window_item(toks, item_start, k);
        IF w IS NOT NULL THEN
          IF win IS NOT NULL THEN
            PERFORM @schema@.grammar_refuse('two ranking window functions in one SELECT are not supported', toks[item_start].pos);
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
       AND (@schema@.grammar_kw(toks[k + 1], 'select') OR @schema@.grammar_kw(toks[k + 1], 'with')) THEN
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
      PERFORM @schema@._topn_refuse_window(toks, k);
    END IF;
    k := k + 1;
  END LOOP;

  IF win IS NOT NULL THEN
    IF n_items = 1 THEN
      PERFORM @schema@.grammar_refuse('a SELECT of nothing but a rank is not supported: select the columns ranked too',
        (win ->> 'position')::int);
    END IF;
    IF @schema@.grammar_kw(toks[sel + 1], 'distinct') THEN
      PERFORM @schema@.grammar_refuse(format('%s() OVER with DISTINCT is not supported', win ->> 'fn'), toks[sel + 1].pos);
    END IF;
    toks := toks[1 : cut_a - 1] || toks[cut_b :];
    ast := @schema@.grammar_parse_block_before_topn(toks, i, target, ctes);
    IF jsonb_array_length(coalesce(ast -> 'group_by', '[]')) > 0 OR ast ->> 'having' IS NOT NULL THEN
      PERFORM @schema@.grammar_refuse(format('%s() OVER with GROUP BY or HAVING is not supported yet', win ->> 'fn'),
        (win ->> 'position')::int);
    END IF;
    RETURN ast || jsonb_build_object('window', win);
  END IF;

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
      order_ := @schema@._topn_order_items(toks, k + 2, 'DISTINCT ON');
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
  -- A top-N derived table (rewritten by _topn_bind) as written.
  IF ast ? 'topn_written' THEN
    ast := ast -> 'topn_written';
  END IF;
  IF ast ? 'window' THEN
    RETURN @schema@._render_view_block_before_topn((ast - 'window') || jsonb_build_object('select', (
      SELECT jsonb_agg(x ORDER BY o) FROM (
        SELECT i AS x, CASE WHEN o0 - 1 < (ast -> 'window' ->> 'index')::int THEN o0 ELSE o0 + 1 END AS o
          FROM jsonb_array_elements(ast -> 'select') WITH ORDINALITY AS y(i, o0)
        UNION ALL
        SELECT jsonb_build_object('expr', ast -> 'window' ->> 'expr', 'name', ast -> 'window' ->> 'name'),
               (ast -> 'window' ->> 'index')::int + 1) z)));
  END IF;
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
  dropped text[];
BEGIN
  -- A ranking item not made top-N (_topn_bind; a path defining without it): refused, never
  -- dropped.
  IF ast ? 'window' THEN
    PERFORM @schema@._topn_bind(ast);
  END IF;
  IF ast ? 'topn_written' THEN
    -- A top-N derived table: the part of the partition's top k matches a row on its whole
    -- key (the partition), at most one, so it adds nothing to the key; its key stays a
    -- column, where a change to a partition's top k finds the rows holding it.
    spec := @schema@._analyze_before_topn(ast);
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
    RETURN @schema@._analyze_before_topn(ast);
  END IF;
  spec := @schema@._analyze_before_topn(@schema@._topn_rewrite(ast));
  RETURN spec || jsonb_build_object('ast', (spec -> 'ast') || jsonb_build_object(
    'select', ast -> 'select', 'distinct_on', ast -> 'distinct_on', 'order_by', ast -> 'order_by',
    'group_by', ast -> 'distinct_on'));
END
$fn$;

-- The first k distinct elements of an array, in order (dense_rank's top values).
CREATE FUNCTION @schema@._topn_distinct_prefix(a text[], k int)
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
CREATE FUNCTION @schema@._topn_bound(where_ text, alias text, rn text)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  c text;
  t @schema@.grammar_token[];
  k int;
  n int;
  best int;
BEGIN
  IF where_ IS NULL THEN
    RETURN NULL;
  END IF;
  FOREACH c IN ARRAY @schema@._split_conjuncts(where_) LOOP
    t := @schema@.grammar_tokenize(c);
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
CREATE FUNCTION @schema@._topn_rewrite_window(pa jsonb, k int)
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
      PERFORM @schema@._fail('TRV01', format(
        '%s() OVER over a subquery or a WITH query is not supported yet: rank the rows of tables', fn));
    END IF;
    rel := to_regclass(@schema@.grammar_render_name(item ->> 'schema', item ->> 'name'));
    IF rel IS NULL THEN
      PERFORM @schema@._fail('TRV01', format('in the definition: relation %s does not exist',
        @schema@.grammar_render_name(item ->> 'schema', item ->> 'name')));
    END IF;
    alias := quote_ident(coalesce(item ->> 'alias', item ->> 'name'));
    one := ARRAY(SELECT alias || '.' || quote_ident(a.attname)
                   FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS u(attnum, n)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum
                  WHERE i.indrelid = rel AND i.indisprimary ORDER BY u.n);
    IF cardinality(one) = 0 THEN
      PERFORM @schema@._fail('TRV01', format('%s() OVER needs a primary key on %s (its rows are ranked by it)', fn, rel));
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
    THEN format('@schema@._topn_distinct_prefix(array_agg(%s ORDER BY %s), %s)', probe, ord, k)
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
CREATE FUNCTION @schema@._topn_bind(ast jsonb, ranked boolean DEFAULT false)
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
    PERFORM @schema@._fail('TRV01', format(
      'a window function (%s() OVER ...) is kept only as top-N per partition: SELECT ... FROM (SELECT ..., %s AS %I FROM ...) AS s WHERE %I <= k',
      win ->> 'fn', win ->> 'expr', win ->> 'name', win ->> 'name'));
  END IF;
  IF ast ? 'union' THEN
    ast := jsonb_set(ast, '{union,branches}', (
      SELECT jsonb_agg(@schema@._topn_bind(b) ORDER BY o)
        FROM jsonb_array_elements(ast -> 'union' -> 'branches') WITH ORDINALITY AS x(b, o)));
  END IF;
  IF NOT ast ? 'parts' THEN
    RETURN ast;
  END IF;
  FOR p IN SELECT x FROM jsonb_array_elements(ast -> 'parts') WITH ORDINALITY AS y(x, o) ORDER BY o LOOP
    IF p ? 'ast' AND p -> 'ast' ? 'window' AND p ->> 'kind' = 'derived' THEN
      win := p -> 'ast' -> 'window';
      IF jsonb_array_length(coalesce(p -> 'columns', '[]')) > 0 THEN
        PERFORM @schema@._fail('TRV01', format(
          'a column alias list on a ranking subquery (%s) is not supported yet: name the columns inside it', p ->> 'name'));
      END IF;
      k := @schema@._topn_bound(ast ->> 'where', p ->> 'name', win ->> 'name');
      IF k IS NULL THEN
        PERFORM @schema@._fail('TRV01', format(
          'a window function (%s() OVER ...) is kept only as top-N per partition: the statement reading %I must filter it with WHERE %I <= k (or < k, or = 1)',
          win ->> 'fn', p ->> 'name', win ->> 'name'));
      END IF;
      p := p || jsonb_build_object('ast', @schema@._topn_rewrite_window(@schema@._topn_bind(p -> 'ast', true), k));
    ELSIF p ? 'ast' THEN
      p := p || jsonb_build_object('ast', @schema@._topn_bind(p -> 'ast'));
    END IF;
    parts := parts || jsonb_build_array(p);
  END LOOP;
  RETURN ast || jsonb_build_object('parts', parts);
END
$fn$;

-- TRANSFORM: a view's SQL with ranking derived tables (_topn_bind) defined as top-N; every
-- other statement as before.
CREATE FUNCTION @schema@._define(ast jsonb, statement text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
BEGIN
  IF ast ->> 'form' = 'as' THEN
    ast := @schema@._topn_bind(ast);
  END IF;
  RETURN @schema@._define_before_topn(ast, statement);
END
$fn$;
