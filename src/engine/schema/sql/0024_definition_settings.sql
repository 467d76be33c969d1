-- Definitions mean one thing wherever they run (issue #21, items 1, 10 and 11; ADRs 0033
-- and 0034):
--  - the settings a definition's expressions depend on (TimeZone, DateStyle,
--    IntervalStyle, the lc_* locales, extra_float_digits...) are recorded with each
--    transform when it is defined, as search_path is, and every build, re-derivation,
--    self-check, RESUME rebind and restore runs under them; ALTER TRANSFORM ... SET (...) /
--    RESET (...) changes them deliberately, and rebuilds;
--  - a source with row level security is refused unless the definition says WITHOUT ROW
--    SECURITY (a target holds every row the engine's role reads, whatever the policies);
--  - no function of Trellis's schema is executable by PUBLIC.

-- The settings a transform records (lower-case GUC names): those whose value changes what
-- a built-in function, a cast or a type's input or output gives. TimeZone: timestamptz to
-- date, text or timestamp, date_trunc, extract, to_char, literals; DateStyle and
-- IntervalStyle: date, time and interval text, and how literals are read; lc_monetary,
-- lc_numeric, lc_time: money, to_char's L, D, G and TM patterns; extra_float_digits: float
-- text; bytea_output: bytea text; default_text_search_config: to_tsvector(text) and the
-- other one-argument text search functions; timezone_abbreviations: how 'EST' is read;
-- xmlbinary, xmloption: XML functions.
CREATE FUNCTION @schema@._recorded_setting_names()
RETURNS text[] LANGUAGE sql IMMUTABLE AS $fn$
  SELECT ARRAY['bytea_output', 'datestyle', 'default_text_search_config', 'extra_float_digits',
               'intervalstyle', 'lc_monetary', 'lc_numeric', 'lc_time', 'timezone',
               'timezone_abbreviations', 'xmlbinary', 'xmloption']
$fn$;

-- The recorded settings as the current session has them: {"timezone": "UTC", ...}.
CREATE FUNCTION @schema@._session_settings()
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_object_agg(n, current_setting(n)) FROM unnest(@schema@._recorded_setting_names()) n
$fn$;

-- Puts a transform's recorded settings in force for the rest of the transaction (as SET
-- LOCAL does), and returns the values they replaced, for _leave_settings. Only recorded
-- names are taken; a setting the transform did not record (defined by an older version)
-- stays as the session has it.
CREATE FUNCTION @schema@._enter_settings(settings jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  previous jsonb := '{}';
  s record;
BEGIN
  FOR s IN SELECT e.key, e.value FROM jsonb_each_text(coalesce(settings, '{}')) e
            WHERE e.key = ANY (@schema@._recorded_setting_names())
              AND current_setting(e.key) IS DISTINCT FROM e.value LOOP
    previous := previous || jsonb_build_object(s.key, current_setting(s.key));
    PERFORM set_config(s.key, s.value, true);
  END LOOP;
  RETURN previous;
END
$fn$;

CREATE FUNCTION @schema@._leave_settings(previous jsonb)
RETURNS void LANGUAGE sql AS $fn$
  SELECT count(set_config(e.key, e.value, true)) FROM jsonb_each_text(previous) e
$fn$;

-- The settings each transform was defined under. One defined before this migration was
-- built and kept by the engine's sessions, under the defaults a new session gets (the
-- server's, the database's and the role's): those are recorded (reset_val, not what this
-- migration's session may have SET).
ALTER TABLE @schema@.transforms ADD COLUMN settings jsonb;
UPDATE @schema@.transforms SET settings = (
  SELECT jsonb_object_agg(n, s.reset_val)
    FROM unnest(@schema@._recorded_setting_names()) n JOIN pg_settings s ON lower(s.name) = n);
-- A transform defined from now on records the settings of the session that defines it
-- (a migration's, when it is defined in one): the INSERT in _define takes this default.
ALTER TABLE @schema@.transforms
  ALTER COLUMN settings SET DEFAULT @schema@._session_settings(),
  ALTER COLUMN settings SET NOT NULL;

-- The grammar (0003) grows: ALTER TRANSFORM t SET (name = value, ...) | RESET (name, ...);
-- the option WITHOUT ROW SECURITY, on TRANSFORM and in ALTER TRANSFORM t SET | RESET.

-- From the "(" at token i of ALTER TRANSFORM t SET | RESET to the end of the statement:
-- SET ( name = value {, name = value} ) or RESET ( name {, name} ). A value is a string
-- literal, a number (with its sign) or a word, as SET takes them; names are lower-cased
-- (setting names are not case-sensitive). Which names and values hold is for
-- _alter_settings to say, when the statement is applied.
CREATE FUNCTION @schema@.grammar_settings(toks @schema@.grammar_token[], i int, is_set boolean)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  settings jsonb := '[]';
  names jsonb := '[]';
  nm text;
  v text;
  t @schema@.grammar_token;
BEGIN
  i := i + 1;
  LOOP
    nm := lower(@schema@.grammar_name(toks[i], 'a setting name', false));
    i := i + 1;
    IF is_set THEN
      t := toks[i];
      IF t.kind = 'op' AND t.text IN ('=-', '=+') AND toks[i + 1].kind = 'number' THEN
        -- "x=-1" written without spaces: the tokenizer reads "=-" as one operator.
        v := CASE WHEN t.text = '=-' THEN '-' ELSE '' END || toks[i + 1].text;
        i := i + 2;
      ELSIF t.kind = 'op' AND t.text = '=' THEN
        t := toks[i + 1];
        IF t.kind = 'string' THEN
          -- One literal token, as the tokenizer read it: its value.
          EXECUTE 'SELECT ' || t.text INTO v;
          i := i + 2;
        ELSIF t.kind = 'number' THEN
          v := t.text;
          i := i + 2;
        ELSIF t.kind = 'op' AND t.text IN ('-', '+') AND toks[i + 2].kind = 'number' THEN
          v := CASE WHEN t.text = '-' THEN '-' ELSE '' END || toks[i + 2].text;
          i := i + 3;
        ELSIF t.kind IN ('word', 'ident') THEN
          v := t.value;
          i := i + 2;
        ELSE
          PERFORM @schema@.grammar_unexpected(toks, i + 1, 'a value (a string, a number or a name)');
        END IF;
      ELSE
        PERFORM @schema@.grammar_unexpected(toks, i, '"=" and a value');
      END IF;
      settings := settings || jsonb_build_array(jsonb_build_object('name', nm, 'value', v));
    ELSE
      names := names || to_jsonb(nm);
    END IF;
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;
  IF NOT (toks[i].kind = 'punct' AND toks[i].text = ')') THEN
    PERFORM @schema@.grammar_unexpected(toks, i, '"," or ")"');
  END IF;
  PERFORM @schema@.grammar_end(toks, i + 1, 'end of statement');
  RETURN CASE WHEN is_set THEN jsonb_build_object('kind', 'alter_set_settings', 'settings', settings)
              ELSE jsonb_build_object('kind', 'alter_reset_settings', 'names', names) END;
END
$fn$;

-- grammar_scan, as in 0003: an expression also ends at WITHOUT ROW (SECURITY).
CREATE OR REPLACE FUNCTION @schema@.grammar_scan(toks @schema@.grammar_token[], i int) RETURNS int
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t @schema@.grammar_token;
  nx @schema@.grammar_token;
  opened @schema@.grammar_token[] := '{}';
  d int := 0;
  want text;
BEGIN
  LOOP
    t := toks[i];
    IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
      IF d > 0 THEN
        want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
        PERFORM @schema@.grammar_fail(format(
          'unbalanced %s: expected %s to close %s (character %s), found %s',
          CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE 'brackets' END,
          want, CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE '"' || opened[d].text || '"' END,
          opened[d].pos, @schema@.grammar_describe(t)), t.pos);
      END IF;
      RETURN i;
    END IF;
    IF t.kind = 'punct' THEN
      IF t.text IN ('(', '[') THEN
        d := d + 1;
        opened[d] := t;
      ELSIF t.text IN (')', ']') THEN
        IF d = 0 THEN
          PERFORM @schema@.grammar_fail(format(
            'unbalanced brackets: found "%s" without a matching "%s"',
            t.text, CASE t.text WHEN ')' THEN '(' ELSE '[' END), t.pos);
        END IF;
        IF opened[d].text <> (CASE t.text WHEN ')' THEN '(' ELSE '[' END) THEN
          want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
          PERFORM @schema@.grammar_fail(format(
            'unbalanced %s: expected %s to close %s (character %s), found "%s"',
            CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE 'brackets' END,
            want, CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE '"' || opened[d].text || '"' END,
            opened[d].pos, t.text), t.pos);
        END IF;
        d := d - 1;
      ELSIF t.text = ',' AND d = 0 THEN
        RETURN i;
      END IF;
    ELSIF t.kind = 'word' THEN
      IF t.value = 'case' THEN
        d := d + 1;
        opened[d] := t;
      ELSIF t.value = 'end' AND d > 0 AND opened[d].kind = 'word' THEN
        d := d - 1;
      ELSIF d = 0 THEN
        nx := toks[i + 1];
        IF t.value IN ('select', 'where', 'having', 'as', 'on', 'using', 'order', 'limit',
            'offset', 'union', 'intersect', 'except', 'window', 'fetch')
          OR (t.value = 'from' AND NOT @schema@.grammar_kw(toks[i - 1], 'distinct'))
          OR (t.value = 'group' AND @schema@.grammar_kw(nx, 'by'))
          OR (t.value = 'without' AND (@schema@.grammar_kw(nx, 'source') OR @schema@.grammar_kw(nx, 'row')))
          OR (t.value = 'for' AND nx.kind = 'word' AND nx.value IN ('update', 'share', 'no', 'key'))
          OR (t.value IN ('join', 'inner', 'left', 'right', 'full', 'cross', 'natural')
              AND coalesce(nx.text, '') <> '(')
        THEN
          RETURN i;
        END IF;
      END IF;
    END IF;
    i := i + 1;
  END LOOP;
END
$fn$;


-- parse_statement, as in 0003, with the statements and option of 0024.
CREATE OR REPLACE FUNCTION @schema@.parse_statement(statement text) RETURNS jsonb
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
    PERFORM @schema@.grammar_unexpected(toks, i, 'ADD, DROP, SET or RESET');
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


-- render_statement, as in 0003, with the statements and option of 0024.
CREATE OR REPLACE FUNCTION @schema@.render_statement(ast jsonb) RETURNS text
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


-- The checks a definition passes beyond what Postgres checks when it is analysed, as in
-- 0009, and: no source has row level security enabled unless the statement says WITHOUT
-- ROW SECURITY. The engine's role reads a source to fill the target, and every role that
-- may read the target then reads what it read, whatever the source's policies say (as
-- with a materialized view).
CREATE OR REPLACE FUNCTION @schema@._check_definition(spec jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  bad record;
  full_info jsonb;
BEGIN
  SELECT s->>'alias' AS alias INTO bad FROM jsonb_array_elements(spec->'sources') s
   WHERE starts_with(s->>'alias', 'trellis#') LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): give the table another alias',
      bad.alias));
  END IF;
  IF NOT coalesce((spec->'ast'->>'without_row_security')::boolean, false) THEN
    SELECT s->>'qualified' AS source INTO bad
      FROM jsonb_array_elements(spec->'sources') s JOIN pg_class c ON c.oid = (s->>'oid')::oid
     WHERE c.relrowsecurity LIMIT 1;
    IF FOUND THEN
      PERFORM @schema@._fail('TRV01', format(
        'source %s has row level security enabled: its target would hold every row Trellis''s role reads, and every role that may read the target would read them all, whatever the policies say. Write WITHOUT ROW SECURITY at the end of the statement to accept that (and grant SELECT on the target only to roles that may read those rows)',
        bad.source));
    END IF;
  END IF;
  -- Keys travel as text inside the engine's work (build chunks' bounds, held keys), written
  -- and read back under the transform's settings: refused where that loses the key.
  SELECT k AS key_type,
         CASE WHEN k IN ('real', 'double precision') THEN 'extra_float_digits = 1'
              ELSE 'DateStyle = ''ISO, ' || split_part(current_setting('datestyle'), ', ', 2) || '''' END AS fix
    INTO bad
    FROM (SELECT split_part(t, ' COLLATE ', 1) AS k
            FROM jsonb_array_elements(spec->'sources') s, jsonb_array_elements_text(s->'key_types') t
          UNION ALL
          SELECT c->>'type' FROM jsonb_array_elements(spec->'columns') c WHERE (c->>'is_key')::boolean) keys
   WHERE (k IN ('real', 'double precision') AND current_setting('extra_float_digits')::int < 1)
      OR (k ~ '^timestamp(\(\d+\))? with time zone$' AND current_setting('datestyle') NOT LIKE 'ISO%')
   LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'a key of type %s would not read back exactly from its text under extra_float_digits = %s and DateStyle = ''%s'', which the transform would record: define it with %s (SET LOCAL in the defining transaction, or ALTER TRANSFORM ... SET)',
      bad.key_type, current_setting('extra_float_digits'), current_setting('datestyle'), bad.fix));
  END IF;
  full_info := @schema@._analyze_query(
    'SELECT ' || (SELECT string_agg((c->>'expression') || ' AS ' || quote_ident(c->>'name'), ', ' ORDER BY o)
                    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o))
    || ' FROM ' || (spec->>'from_sql')
    || coalesce(' WHERE (' || (spec->'ast'->>'where') || ')', '')
    || CASE WHEN jsonb_array_length(spec->'ast'->'group_by') > 0
            THEN ' GROUP BY ' || (SELECT string_agg(g, ', ') FROM jsonb_array_elements_text(spec->'ast'->'group_by') g)
            ELSE '' END
    || coalesce(' HAVING (' || (spec->'ast'->>'having') || ')', ''),
    'in the definition');
  SELECT p.oid::regprocedure AS fn,
         CASE p.provolatile WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END AS volatility INTO bad
    FROM pg_proc p
   WHERE p.provolatile <> 'i' AND p.pronamespace <> 'pg_catalog'::regnamespace
     AND p.oid IN (SELECT f::oid FROM jsonb_array_elements_text(full_info->'functions') f
                   UNION SELECT f::oid FROM jsonb_array_elements_text(full_info->'operator_functions') f)
   LIMIT 1;
  IF FOUND THEN
    PERFORM @schema@._fail('TRV01', format(
      'the definition calls %s, which is %s: it may read other tables, and their changes would never reach the target. Use only IMMUTABLE functions of your own (declare it IMMUTABLE if its result depends on its arguments alone)',
      bad.fn, bad.volatility));
  END IF;
  RETURN (full_info->>'whole_row')::boolean;
END
$fn$;

-- _rebind, as in 0009, analysing the statement under the settings it was defined with as
-- well as its search_path: a literal ('01/02/2024'::date) or a cast reads as it did then.
CREATE OR REPLACE FUNCTION @schema@._rebind(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  previous jsonb;
  new_spec jsonb;
  now_cols text;
  was_cols text;
BEGIN
  PERFORM set_config('search_path', t.search_path, true);
  previous := @schema@._enter_settings(t.settings);
  BEGIN
    new_spec := @schema@._analyze_transform(t.spec->'ast');
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM set_config('search_path', old_path, true);
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot resume: its definition no longer holds (%s). Fix the sources, or DROP TRANSFORM it and define it again',
      t.target_name, SQLERRM));
  END;
  PERFORM set_config('search_path', old_path, true);
  new_spec := jsonb_set(new_spec, '{ast,target}', t.spec->'ast'->'target');
  BEGIN
    new_spec := new_spec || jsonb_build_object(
      'whole_row', @schema@._check_definition(new_spec),
      'key_map', @schema@._key_map_kind(new_spec));
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot resume: %s', t.target_name, SQLERRM));
  END;
  PERFORM @schema@._leave_settings(previous);
  SELECT string_agg(format('%s %s %s', c->>'name', c->>'type', (c->>'is_key')::boolean), ', ' ORDER BY o) INTO now_cols
    FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(c, o);
  SELECT string_agg(format('%s %s %s', c.name, c.type, c.is_key), ', ' ORDER BY c.ordinal) INTO was_cols
    FROM @schema@.transform_columns c WHERE c.transform_id = t.id;
  IF now_cols IS DISTINCT FROM was_cols THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I cannot resume: as its sources are now, its definition gives the columns (%s), and its target has (%s). DROP TRANSFORM it and define it again',
      t.target_name, now_cols, was_cols));
  END IF;
  UPDATE @schema@.transforms SET spec = new_spec, capture_failure = NULL, updated_at = now()
   WHERE id = t.id;
  PERFORM @schema@._register(t.id, new_spec);
  PERFORM @schema@._record_read_attrs(t.id);
  -- Key types may have changed: the key map is made again (the rebuild fills it).
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || t.id);
  PERFORM @schema@._create_key_map(t.id, new_spec);
END
$fn$;

-- ALTER TRANSFORM t SET | RESET WITHOUT ROW SECURITY. RESET is refused while a source has
-- row level security (the definition would no longer hold); neither changes the target.
CREATE FUNCTION @schema@._alter_without_row_security(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  new_ast jsonb;
  previous jsonb;
BEGIN
  new_ast := CASE WHEN (ast->>'value')::boolean
                  THEN jsonb_set(t.spec->'ast', '{without_row_security}', 'true')
                  ELSE (t.spec->'ast') - 'without_row_security' END;
  IF NOT (ast->>'value')::boolean THEN
    previous := @schema@._enter_settings(t.settings);
    PERFORM @schema@._check_definition(jsonb_set(t.spec, '{ast}', new_ast));
    PERFORM @schema@._leave_settings(previous);
  END IF;
  PERFORM @schema@._restate(t, new_ast);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- ALTER TRANSFORM t SET (name = value, ...) records those values; RESET (name, ...) records
-- the values in force in the session that runs it. Each name must be one Trellis records,
-- each value one Postgres takes; the definition must still hold, with the same target
-- columns, under the new settings. The target is then rebuilt under them.
CREATE FUNCTION @schema@._alter_settings(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  wanted jsonb := '{}';
  s record;
  canonical text;
  new_settings jsonb;
  previous jsonb;
  old_path text := current_setting('search_path');
  spec jsonb;
  now_cols text;
  was_cols text;
BEGIN
  FOR s IN SELECT x->>'name' AS name, x->>'value' AS value
             FROM jsonb_array_elements(coalesce(ast->'settings', '[]')) x
           UNION ALL
           SELECT n, NULL FROM jsonb_array_elements_text(coalesce(ast->'names', '[]')) n LOOP
    IF NOT s.name = ANY (@schema@._recorded_setting_names()) THEN
      PERFORM @schema@._fail('TRV01', format(
        '%s is not a setting Trellis records with a transform (those are %s)',
        s.name, array_to_string(@schema@._recorded_setting_names(), ', ')));
    END IF;
    IF s.value IS NULL THEN
      canonical := current_setting(s.name);
    ELSE
      -- The value as Postgres takes it (and writes it: 'utc' is UTC), tried in a
      -- subtransaction so that the session keeps its own.
      BEGIN
        PERFORM set_config(s.name, s.value, true);
        canonical := current_setting(s.name);
        RAISE EXCEPTION USING ERRCODE = 'TRX99';
      EXCEPTION
        WHEN SQLSTATE 'TRX99' THEN NULL;
        WHEN OTHERS THEN
          PERFORM @schema@._fail('TRV01', format('%s cannot be %L: %s', s.name, s.value, SQLERRM));
      END;
    END IF;
    wanted := wanted || jsonb_build_object(s.name, canonical);
  END LOOP;
  new_settings := t.settings || wanted;

  -- The definition, analysed again under the new settings, must give the same columns.
  PERFORM set_config('search_path', t.search_path, true);
  previous := @schema@._enter_settings(new_settings);
  BEGIN
    spec := @schema@._analyze_transform(t.spec->'ast');
    spec := jsonb_set(spec, '{ast,target}', t.spec->'ast'->'target');
    PERFORM @schema@._check_definition(spec);
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM @schema@._fail('TRV01', format(
      'transform %I does not hold under those settings: %s', t.target_name, SQLERRM));
  END;
  PERFORM @schema@._leave_settings(previous);
  PERFORM set_config('search_path', old_path, true);
  SELECT string_agg(format('%s %s', c->>'name', c->>'type'), ', ' ORDER BY o) INTO now_cols
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  SELECT string_agg(format('%s %s', c.name, c.type), ', ' ORDER BY c.ordinal) INTO was_cols
    FROM @schema@.transform_columns c WHERE c.transform_id = t.id;
  IF now_cols IS DISTINCT FROM was_cols THEN
    PERFORM @schema@._fail('TRV01', format(
      'under those settings transform %I would give the columns (%s), and its target has (%s): DROP TRANSFORM it and define it again',
      t.target_name, now_cols, was_cols));
  END IF;

  IF new_settings IS DISTINCT FROM t.settings THEN
    UPDATE @schema@.transforms SET settings = new_settings, updated_at = now() WHERE id = t.id;
    PERFORM @schema@._request_rebuild(t.id);
  END IF;
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- _apply, as in 0006, with the statements of 0024; ALTER ... ADD COLUMN analyses the new
-- column (and the definition with it) under the transform's recorded settings.
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
  CASE ast->>'kind'
    WHEN 'transform' THEN RETURN @schema@._define(ast, statement);
    WHEN 'pause' THEN RETURN @schema@._pause(ast);
    WHEN 'resume' THEN RETURN @schema@._resume(ast);
    WHEN 'drop' THEN RETURN @schema@._drop(ast);
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

-- restore_definition (0016) with the settings the transform was defined under (dumps
-- written since 0024 carry them): the statement is analysed, and the transform recorded,
-- under them. The two-argument form, for older dumps, records the loading session's.
CREATE FUNCTION @schema@.restore_definition(statement text, search_path text, settings jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  previous jsonb := @schema@._enter_settings(settings);
  result jsonb;
BEGIN
  result := @schema@.restore_definition(statement, search_path);
  PERFORM @schema@._leave_settings(previous);
  RETURN result;
END
$fn$;

-- Every registered transform (the handle's Definition), as in 0017, with the settings it
-- was defined under and whether it was defined WITHOUT ROW SECURITY.
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
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM @schema@.transforms t
   ORDER BY t.target_name
$fn$;

-- The sources of a transform that have row level security enabled, for status():
-- [{table, forced, optedOut}] (forced: FORCE ROW LEVEL SECURITY, which applies the
-- policies to the table's owner too).
CREATE FUNCTION @schema@._row_security(p_transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'table', ts.source_schema || '.' || ts.source_name, 'forced', c.relforcerowsecurity,
           'optedOut', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false))
           ORDER BY ts.ordinal), '[]')
    FROM @schema@.transform_sources ts
    JOIN @schema@.transforms t ON t.id = ts.transform_id
    JOIN pg_class c ON c.oid = ts.source_oid
   WHERE ts.transform_id = p_transform_id AND c.relrowsecurity
$fn$;

-- Where a transform is (the handle's Status), as in 0023, and which of its sources have row
-- level security (rowSecurity); as before, how its last range of changes was applied
-- (lastApply): lifecycle, held keys, paused columns, source index gaps,
-- corrections, failures, what capture waits on, backfill progress, lag.
-- Refuses an unknown transform with TRN01.
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
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
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
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM @schema@.build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', @schema@._capture_status(t.id),
    'rowSecurity', @schema@._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at) END);
END
$fn$;


-- Transforms defined before this migration over a source that has row level security now
-- were accepted then: they carry on as they were, defined WITHOUT ROW SECURITY from now on
-- (their statement says so, and status() lists the sources), rather than stop on upgrade.
UPDATE @schema@.transforms t
   SET spec = jsonb_set(t.spec, '{ast,without_row_security}', 'true'),
       statement = @schema@.render_statement(jsonb_set(t.spec->'ast', '{without_row_security}', 'true'))
 WHERE EXISTS (SELECT 1 FROM @schema@.transform_sources ts JOIN pg_class c ON c.oid = ts.source_oid
                WHERE ts.transform_id = t.id AND c.relrowsecurity);

-- Defence in depth: Postgres lets PUBLIC execute every new function, so any role granted
-- USAGE on this schema (a writer, by grant_writer) could call apply() or status(). Only
-- the owner (who needs no grant) executes them now. Capture trigger functions need no
-- EXECUTE to fire (Postgres checks it when the trigger is created, not when it fires), so
-- writers keep writing. The functions made later (capture functions, later migrations)
-- are revoked where they are made (trigger-sql.ts, the install SQL).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
