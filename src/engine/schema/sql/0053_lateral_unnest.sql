-- CROSS JOIN LATERAL over a set-returning function of the row (issue #26, item 1; ADR 0071):
--
--   ... FROM t [CROSS JOIN LATERAL | , [LATERAL] | [LEFT] JOIN LATERAL]
--         unnest(<array>) [WITH ORDINALITY] [AS] u[(x[, n])] [ON cond] ...
--   ... jsonb_array_elements(<jsonb>) / jsonb_array_elements_text(<jsonb>) likewise
--
-- is compiled, when the statement is parsed, into a join the engine already keeps: the
-- function's rows are the rows of a fixed table of positions (lateral_ordinals: 1, 2, ...)
-- joined to the row by a condition that is not an equality,
--
--   ... JOIN @schema@.lateral_ordinals AS u ON (u.ordinality = ANY (_lateral_positions(cardinality(<array>))))
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

ALTER FUNCTION @schema@.parse_statement(text) RENAME TO parse_statement_before_lateral;
ALTER FUNCTION @schema@.render_statement(jsonb) RENAME TO render_statement_before_lateral;
ALTER FUNCTION @schema@._resolve_source(jsonb, text) RENAME TO _resolve_source_before_lateral;
ALTER FUNCTION @schema@._join_fans_out(jsonb) RENAME TO _join_fans_out_before_lateral;

-- The positions an expanded row can have. Never written after this migration.
CREATE TABLE @schema@.lateral_ordinals (ordinality bigint PRIMARY KEY);
INSERT INTO @schema@.lateral_ordinals SELECT generate_series(1, 100000);

-- The positions of a row's n elements (1 .. n; NULL for a NULL array), refused beyond
-- lateral_ordinals. Joined as `ordinality = ANY (positions)`: an index lookup per element,
-- which the planner estimates at a few rows per row (`ordinality <= n` it estimated at a
-- third of the table per row, so a page's statement looked big enough to be JIT-compiled,
-- seconds per statement).
CREATE FUNCTION @schema@._lateral_positions(n int) RETURNS bigint[]
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
CREATE FUNCTION @schema@._lateral_element(a anyarray, i bigint) RETURNS anyelement
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT CASE WHEN array_ndims(a) = 1 THEN a[array_lower(a, 1) + i - 1]
              ELSE (SELECT z.x FROM unnest(a) WITH ORDINALITY AS z(x, o) WHERE z.o = i) END
$fn$;

CREATE FUNCTION @schema@._resolve_source(src jsonb, role text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  rel oid := to_regclass(quote_ident(@schema_literal@) || '.lateral_ordinals');
BEGIN
  IF src->>'schema' = @schema_literal@ AND src->>'name' = 'lateral_ordinals' THEN
    RETURN jsonb_build_object(
      'oid', rel, 'schema', @schema_literal@, 'name', 'lateral_ordinals',
      'alias', coalesce(src->>'alias', 'lateral_ordinals'),
      'qualified', quote_ident(@schema_literal@) || '.lateral_ordinals',
      'key_columns', jsonb_build_array('ordinality'),
      'key_types', jsonb_build_array(@schema@._key_type(rel, 1::int2)));
  END IF;
  RETURN @schema@._resolve_source_before_lateral(src, role);
END
$fn$;

CREATE FUNCTION @schema@._join_fans_out(spec jsonb)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT @schema@._join_fans_out_before_lateral(jsonb_set(spec, '{sources}', (
    SELECT coalesce(jsonb_agg(s ORDER BY (s->>'ordinal')::int), '[]')
      FROM jsonb_array_elements(spec->'sources') s
     WHERE NOT (s->>'schema' = @schema_literal@ AND s->>'name' = 'lateral_ordinals'))))
$fn$;

-- The clause token k is in, per depth: 'from', 'select' or 'other'.
CREATE FUNCTION @schema@._lateral_contexts(toks @schema@.grammar_token[]) RETURNS text[]
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
CREATE FUNCTION @schema@._lateral_emit(
  statement text, toks @schema@.grammar_token[], ctx text[], lo int, hi int, lats jsonb
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
  prev @schema@.grammar_token;
  after @schema@.grammar_token;
  start int := 1;
BEGIN
  -- Nothing before the first SELECT or FROM is a reference (TRANSFORM name AS).
  WHILE start < array_length(toks, 1) AND NOT (@schema@.grammar_kw(toks[start], 'select')
                                               OR @schema@.grammar_kw(toks[start], 'from')) LOOP
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
       AND NOT @schema@.grammar_kw(prev, 'as') THEN
      IF toks[k + 1].kind = 'punct' AND toks[k + 1].text = '.' THEN
        -- alias.column
        SELECT x INTO l FROM jsonb_array_elements(lats) x
         WHERE x->>'alias' = toks[k].value AND x ? 'elem' LIMIT 1;
        IF l IS NOT NULL THEN
          IF toks[k + 2].text = '*' THEN
            PERFORM @schema@.grammar_refuse(format('%s.* of a LATERAL function is not supported: name its columns', toks[k].text), toks[k].pos);
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
CREATE FUNCTION @schema@._lateral_rewrite(statement text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks @schema@.grammar_token[] := @schema@.grammar_tokenize(statement);
  n int := array_length(toks, 1);
  ctx text[] := @schema@._lateral_contexts(toks);
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
  q text := '@schema@';
BEGIN
  k := 1;
  WHILE k < n LOOP
    f := NULL;
    IF ctx[k] = 'from' THEN
      IF @schema@.grammar_kw(toks[k], 'lateral') THEN
        f := k + 1;
      ELSIF ((toks[k].kind = 'punct' AND toks[k].text = ',') OR @schema@.grammar_kw(toks[k], 'join'))
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
    s0 := CASE WHEN @schema@.grammar_kw(toks[f - 1], 'lateral') THEN f - 2 ELSE f - 1 END;
    jt := 'cross';
    IF toks[s0].kind = 'punct' AND toks[s0].text = ',' THEN
      jt := 'cross';
    ELSIF @schema@.grammar_kw(toks[s0], 'join') THEN
      jt := 'inner';
      IF @schema@.grammar_kw(toks[s0 - 1], 'cross') THEN
        jt := 'cross'; s0 := s0 - 1;
      ELSIF @schema@.grammar_kw(toks[s0 - 1], 'inner') THEN
        s0 := s0 - 1;
      ELSIF @schema@.grammar_kw(toks[s0 - 1], 'left') THEN
        jt := 'left'; s0 := s0 - 1;
      ELSIF @schema@.grammar_kw(toks[s0 - 1], 'outer') AND @schema@.grammar_kw(toks[s0 - 2], 'left') THEN
        jt := 'left'; s0 := s0 - 2;
      ELSIF @schema@.grammar_kw(toks[s0 - 1], 'outer') OR @schema@.grammar_kw(toks[s0 - 1], 'right')
            OR @schema@.grammar_kw(toks[s0 - 1], 'full') THEN
        PERFORM @schema@.grammar_refuse('a RIGHT or FULL JOIN LATERAL is not supported: write CROSS JOIN LATERAL or LEFT JOIN LATERAL', toks[s0].pos);
      END IF;
    ELSE
      PERFORM @schema@.grammar_refuse('LATERAL is supported after a table only (FROM t CROSS JOIN LATERAL unnest(t.a) AS u(x))', toks[f - 1].pos);
    END IF;
    IF toks[f].kind = 'punct' AND toks[f].text = '(' THEN
      PERFORM @schema@.grammar_refuse(
        'a LATERAL subquery is not supported yet: only CROSS JOIN LATERAL over unnest(...), jsonb_array_elements(...) or jsonb_array_elements_text(...) of the row is maintained',
        toks[f - 1].pos);
    END IF;
    IF NOT (toks[f].kind = 'word' AND toks[f].value IN ('unnest', 'jsonb_array_elements', 'jsonb_array_elements_text')
            AND toks[f + 1].kind = 'punct' AND toks[f + 1].text = '(') THEN
      PERFORM @schema@.grammar_refuse(format(
        '%s over %s is not supported yet: only unnest(...), jsonb_array_elements(...) and jsonb_array_elements_text(...) of the row are maintained',
        CASE WHEN @schema@.grammar_kw(toks[s0], 'cross') THEN 'CROSS JOIN LATERAL'
             WHEN @schema@.grammar_kw(toks[f - 1], 'join') OR @schema@.grammar_kw(toks[f - 2], 'join') THEN 'JOIN LATERAL'
             ELSE 'LATERAL' END,
        coalesce(toks[f].text, 'this')),
        CASE WHEN @schema@.grammar_kw(toks[f - 1], 'lateral') THEN toks[f - 1].pos ELSE toks[f].pos END);
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
        PERFORM @schema@.grammar_refuse(format('%s of several arguments in LATERAL is not supported yet: write one CROSS JOIN LATERAL per array', fn), toks[c].pos);
      END IF;
      c := c + 1;
    END LOOP;
    IF toks[c].kind = 'eof' THEN
      PERFORM @schema@.grammar_unexpected(toks, c, ')');
    END IF;
    IF c = f + 2 THEN
      PERFORM @schema@.grammar_refuse(format('%s() needs an argument', fn), toks[c].pos);
    END IF;
    e := c + 1;
    ord := false;
    IF @schema@.grammar_kw(toks[e], 'with') AND @schema@.grammar_kw(toks[e + 1], 'ordinality') THEN
      ord := true;
      e := e + 2;
    END IF;
    IF @schema@.grammar_kw(toks[e], 'as') THEN
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
          PERFORM @schema@.grammar_unexpected(toks, e, ') after the column names');
        END IF;
        e := e + 1;
        IF cardinality(cols) > (CASE WHEN ord THEN 2 ELSE 1 END) THEN
          PERFORM @schema@.grammar_refuse(format('%s has %s columns, %s names given', fn,
            CASE WHEN ord THEN 2 ELSE 1 END, cardinality(cols)), toks[e - 1].pos);
        END IF;
      END IF;
    END IF;
    IF alias IS NULL THEN
      PERFORM @schema@.grammar_refuse(format('give %s in LATERAL an alias: %s(...) AS u(x)', fn, fn), toks[f].pos);
    END IF;
    -- [LEFT | INNER] JOIN LATERAL ... ON cond: the condition, to the next join or clause.
    on_lo := NULL;
    on_hi := NULL;
    IF jt IN ('inner', 'left') THEN
      IF NOT @schema@.grammar_kw(toks[e], 'on') THEN
        PERFORM @schema@.grammar_unexpected(toks, e, 'ON');
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
      PERFORM @schema@.grammar_refuse(format('the name %s stands for two LATERAL functions: give each its own alias', alias), toks[f].pos);
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
    arg := '(' || rtrim(@schema@._lateral_emit(statement, toks, ctx, (l->>'arg_lo')::int, c - 1,
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
              THEN ' AND (' || rtrim(@schema@._lateral_emit(statement, toks, ctx, (l->>'on_lo')::int,
                                                            (l->>'on_hi')::int, lats)) || ')'
              ELSE '' END || ')');
    lats := jsonb_set(lats, ARRAY[i::text], l);
  END LOOP;
  RETURN @schema@._lateral_emit(statement, toks, ctx, 1, n - 1, lats);
END
$fn$;

-- A statement with a LATERAL set-returning function: parsed as compiled, shown as written.
CREATE FUNCTION @schema@.parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  compiled text := @schema@._lateral_rewrite(statement);
  ast jsonb;
BEGIN
  IF compiled IS NULL THEN
    RETURN @schema@.parse_statement_before_lateral(statement);
  END IF;
  ast := @schema@.parse_statement_before_lateral(compiled);
  IF ast->>'kind' = 'transform' THEN
    ast := ast || jsonb_build_object('lateral_statement',
      regexp_replace(btrim(statement, E' \t\r\n'), E'\\s*;\\s*$', ''));
  END IF;
  RETURN ast;
END
$fn$;

CREATE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  IF ast->>'kind' = 'transform' AND ast ? 'lateral_statement' THEN
    RETURN ast->>'lateral_statement';
  END IF;
  RETURN @schema@.render_statement_before_lateral(ast);
END
$fn$;
