-- Written by `trellis generate upgrade` (trellis-pg 0.1.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 23 to version 26.
-- Only the migrations after version 23, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 23 is refused with what to run.
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
  IF installed < 23 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 23 to 26', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 23 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 26 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (26): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 24) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (24, 'definition_settings', false);
    EXECUTE $trellis_m24$-- Definitions mean one thing wherever they run (issue #21, items 1, 10 and 11; ADRs 0033
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
CREATE FUNCTION "trellis"._recorded_setting_names()
RETURNS text[] LANGUAGE sql IMMUTABLE AS $fn$
  SELECT ARRAY['bytea_output', 'datestyle', 'default_text_search_config', 'extra_float_digits',
               'intervalstyle', 'lc_monetary', 'lc_numeric', 'lc_time', 'timezone',
               'timezone_abbreviations', 'xmlbinary', 'xmloption']
$fn$;

-- The recorded settings as the current session has them: {"timezone": "UTC", ...}.
CREATE FUNCTION "trellis"._session_settings()
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_object_agg(n, current_setting(n)) FROM unnest("trellis"._recorded_setting_names()) n
$fn$;

-- Puts a transform's recorded settings in force for the rest of the transaction (as SET
-- LOCAL does), and returns the values they replaced, for _leave_settings. Only recorded
-- names are taken; a setting the transform did not record (defined by an older version)
-- stays as the session has it.
CREATE FUNCTION "trellis"._enter_settings(settings jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  previous jsonb := '{}';
  s record;
BEGIN
  FOR s IN SELECT e.key, e.value FROM jsonb_each_text(coalesce(settings, '{}')) e
            WHERE e.key = ANY ("trellis"._recorded_setting_names())
              AND current_setting(e.key) IS DISTINCT FROM e.value LOOP
    previous := previous || jsonb_build_object(s.key, current_setting(s.key));
    PERFORM set_config(s.key, s.value, true);
  END LOOP;
  RETURN previous;
END
$fn$;

CREATE FUNCTION "trellis"._leave_settings(previous jsonb)
RETURNS void LANGUAGE sql AS $fn$
  SELECT count(set_config(e.key, e.value, true)) FROM jsonb_each_text(previous) e
$fn$;

-- The settings each transform was defined under. One defined before this migration was
-- built and kept by the engine's sessions, under the defaults a new session gets (the
-- server's, the database's and the role's): those are recorded (reset_val, not what this
-- migration's session may have SET).
ALTER TABLE "trellis".transforms ADD COLUMN settings jsonb;
UPDATE "trellis".transforms SET settings = (
  SELECT jsonb_object_agg(n, s.reset_val)
    FROM unnest("trellis"._recorded_setting_names()) n JOIN pg_settings s ON lower(s.name) = n);
-- A transform defined from now on records the settings of the session that defines it
-- (a migration's, when it is defined in one): the INSERT in _define takes this default.
ALTER TABLE "trellis".transforms
  ALTER COLUMN settings SET DEFAULT "trellis"._session_settings(),
  ALTER COLUMN settings SET NOT NULL;

-- The grammar (0003) grows: ALTER TRANSFORM t SET (name = value, ...) | RESET (name, ...);
-- the option WITHOUT ROW SECURITY, on TRANSFORM and in ALTER TRANSFORM t SET | RESET.

-- From the "(" at token i of ALTER TRANSFORM t SET | RESET to the end of the statement:
-- SET ( name = value {, name = value} ) or RESET ( name {, name} ). A value is a string
-- literal, a number (with its sign) or a word, as SET takes them; names are lower-cased
-- (setting names are not case-sensitive). Which names and values hold is for
-- _alter_settings to say, when the statement is applied.
CREATE FUNCTION "trellis".grammar_settings(toks "trellis".grammar_token[], i int, is_set boolean)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  settings jsonb := '[]';
  names jsonb := '[]';
  nm text;
  v text;
  t "trellis".grammar_token;
BEGIN
  i := i + 1;
  LOOP
    nm := lower("trellis".grammar_name(toks[i], 'a setting name', false));
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
          PERFORM "trellis".grammar_unexpected(toks, i + 1, 'a value (a string, a number or a name)');
        END IF;
      ELSE
        PERFORM "trellis".grammar_unexpected(toks, i, '"=" and a value');
      END IF;
      settings := settings || jsonb_build_array(jsonb_build_object('name', nm, 'value', v));
    ELSE
      names := names || to_jsonb(nm);
    END IF;
    EXIT WHEN NOT (toks[i].kind = 'punct' AND toks[i].text = ',');
    i := i + 1;
  END LOOP;
  IF NOT (toks[i].kind = 'punct' AND toks[i].text = ')') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, '"," or ")"');
  END IF;
  PERFORM "trellis".grammar_end(toks, i + 1, 'end of statement');
  RETURN CASE WHEN is_set THEN jsonb_build_object('kind', 'alter_set_settings', 'settings', settings)
              ELSE jsonb_build_object('kind', 'alter_reset_settings', 'names', names) END;
END
$fn$;

-- grammar_scan, as in 0003: an expression also ends at WITHOUT ROW (SECURITY).
CREATE OR REPLACE FUNCTION "trellis".grammar_scan(toks "trellis".grammar_token[], i int) RETURNS int
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  t "trellis".grammar_token;
  nx "trellis".grammar_token;
  opened "trellis".grammar_token[] := '{}';
  d int := 0;
  want text;
BEGIN
  LOOP
    t := toks[i];
    IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
      IF d > 0 THEN
        want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
        PERFORM "trellis".grammar_fail(format(
          'unbalanced %s: expected %s to close %s (character %s), found %s',
          CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE 'brackets' END,
          want, CASE WHEN opened[d].kind = 'word' THEN 'CASE' ELSE '"' || opened[d].text || '"' END,
          opened[d].pos, "trellis".grammar_describe(t)), t.pos);
      END IF;
      RETURN i;
    END IF;
    IF t.kind = 'punct' THEN
      IF t.text IN ('(', '[') THEN
        d := d + 1;
        opened[d] := t;
      ELSIF t.text IN (')', ']') THEN
        IF d = 0 THEN
          PERFORM "trellis".grammar_fail(format(
            'unbalanced brackets: found "%s" without a matching "%s"',
            t.text, CASE t.text WHEN ')' THEN '(' ELSE '[' END), t.pos);
        END IF;
        IF opened[d].text <> (CASE t.text WHEN ')' THEN '(' ELSE '[' END) THEN
          want := CASE opened[d].text WHEN '(' THEN '")"' WHEN '[' THEN '"]"' ELSE 'END' END;
          PERFORM "trellis".grammar_fail(format(
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
          OR (t.value = 'from' AND NOT "trellis".grammar_kw(toks[i - 1], 'distinct'))
          OR (t.value = 'group' AND "trellis".grammar_kw(nx, 'by'))
          OR (t.value = 'without' AND ("trellis".grammar_kw(nx, 'source') OR "trellis".grammar_kw(nx, 'row')))
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
CREATE OR REPLACE FUNCTION "trellis".parse_statement(statement text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(statement);
  t "trellis".grammar_token := toks[1];
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
  last "trellis".grammar_token;
  before "trellis".grammar_token;
BEGIN
  IF t.kind = 'eof' OR (t.kind = 'punct' AND t.text = ';') THEN
    PERFORM "trellis".grammar_fail(format(
      'empty statement: expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      "trellis".grammar_describe(t)), t.pos);
  END IF;
  IF t.kind <> 'word' OR t.value NOT IN ('transform', 'pause', 'resume', 'drop', 'alter') THEN
    PERFORM "trellis".grammar_fail(format(
      'expected TRANSFORM, PAUSE, RESUME, DROP or ALTER, found %s',
      "trellis".grammar_describe(t)), t.pos);
  END IF;

  IF t.value IN ('pause', 'resume') THEN
    IF NOT "trellis".grammar_kw(toks[2], 'transform') THEN
      PERFORM "trellis".grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    nm := "trellis".grammar_name(toks[3], 'a transform name', true);
    i := 4;
    IF toks[i].kind = 'punct' AND toks[i].text = '.' THEN
      col := "trellis".grammar_name(toks[i + 1], 'a column name after "."', false);
      i := i + 2;
      expected := 'end of statement';
    ELSE
      expected := '"." and a column name, or end of statement';
    END IF;
    PERFORM "trellis".grammar_end(toks, i, expected);
    RETURN jsonb_build_object('kind', t.value, 'transform', nm, 'column', col);
  END IF;

  IF t.value IN ('drop', 'alter') THEN
    IF NOT "trellis".grammar_kw(toks[2], 'transform') THEN
      PERFORM "trellis".grammar_unexpected(toks, 2, 'TRANSFORM');
    END IF;
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, 3, 'a transform name') q;
    -- A qualified target keeps its schema (the engine refuses one that is not its target
    -- schema); the key is there only then, so unqualified statements have the plain shape.
    target := jsonb_build_object('transform', nm)
      || CASE WHEN sch IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('schema', sch) END;
    IF t.value = 'drop' THEN
      PERFORM "trellis".grammar_end(toks, i, 'end of statement');
      RETURN jsonb_build_object('kind', 'drop') || target;
    END IF;
    t := toks[i];
    IF "trellis".grammar_kw(t, 'add') THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      e := "trellis".grammar_scan(toks, i);
      IF e = i THEN
        PERFORM "trellis".grammar_unexpected(toks, i, 'an expression after ADD COLUMN');
      END IF;
      IF NOT "trellis".grammar_kw(toks[e], 'as') THEN
        PERFORM "trellis".grammar_unexpected(toks, e, 'AS and the new column''s name');
      END IF;
      nm := "trellis".grammar_name(toks[e + 1], 'a column name after AS', false);
      PERFORM "trellis".grammar_end(toks, e + 2, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_add_column',
        'expr', "trellis".grammar_text(toks, i, e), 'name', nm) || target;
    ELSIF "trellis".grammar_kw(t, 'drop') THEN
      i := i + 1;
      IF "trellis".grammar_kw(toks[i], 'column') THEN
        i := i + 1;
      END IF;
      nm := "trellis".grammar_name(toks[i], 'a column name', true);
      PERFORM "trellis".grammar_end(toks, i + 1, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_drop_column', 'name', nm) || target;
    ELSIF "trellis".grammar_kw(t, 'set') OR "trellis".grammar_kw(t, 'reset') THEN
      IF toks[i + 1].kind = 'punct' AND toks[i + 1].text = '(' THEN
        RETURN "trellis".grammar_settings(toks, i + 1, t.value = 'set') || target;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 1], 'without') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 1,
          'WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or "(" and settings');
      END IF;
      IF "trellis".grammar_kw(toks[i + 2], 'row') THEN
        IF NOT "trellis".grammar_kw(toks[i + 3], 'security') THEN
          PERFORM "trellis".grammar_unexpected(toks, i + 3, 'SECURITY');
        END IF;
        PERFORM "trellis".grammar_end(toks, i + 4, 'end of statement');
        RETURN jsonb_build_object('kind', 'alter_without_row_security',
          'value', t.value = 'set') || target;
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 2], 'source') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 2, 'SOURCE INDEX or ROW SECURITY');
      END IF;
      IF NOT "trellis".grammar_kw(toks[i + 3], 'index') THEN
        PERFORM "trellis".grammar_unexpected(toks, i + 3, 'INDEX');
      END IF;
      PERFORM "trellis".grammar_end(toks, i + 4, 'end of statement');
      RETURN jsonb_build_object('kind', 'alter_without_source_index',
        'value', t.value = 'set') || target;
    END IF;
    PERFORM "trellis".grammar_unexpected(toks, i, 'ADD, DROP, SET or RESET');
  END IF;

  -- TRANSFORM target FROM source [[AS] alias] {join} SELECT ... [WHERE] [GROUP BY] [HAVING]
  --   [WITHOUT SOURCE INDEX]
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, 2, 'a transform name') q;
  target := jsonb_build_object('schema', sch, 'name', nm);
  IF NOT "trellis".grammar_kw(toks[i], 'from') THEN
    PERFORM "trellis".grammar_unexpected(toks, i, 'FROM');
  END IF;
  SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
    FROM "trellis".grammar_qualified(toks, i + 1, 'a source table name') q;
  SELECT q.alias, q.next INTO alias, i FROM "trellis".grammar_alias(toks, i) q;
  from_ := jsonb_build_object('schema', sch, 'name', nm, 'alias', alias);

  LOOP
    t := toks[i];
    IF "trellis".grammar_kw(t, 'join') THEN
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
    SELECT q.schema_name, q.rel_name, q.next INTO sch, nm, i
      FROM "trellis".grammar_qualified(toks, i, 'a table name after JOIN') q;
    SELECT q.alias, q.next INTO alias, i FROM "trellis".grammar_alias(toks, i) q;
    IF NOT "trellis".grammar_kw(toks[i], 'on') THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'ON and a join condition', 'join');
    END IF;
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a join condition after ON');
    END IF;
    joins := joins || jsonb_build_array(jsonb_build_object('type', jt, 'schema', sch,
      'name', nm, 'alias', alias, 'on', "trellis".grammar_text(toks, i, e)));
    i := e;
  END LOOP;

  IF NOT "trellis".grammar_kw(toks[i], 'select') THEN
    PERFORM "trellis".grammar_unexpected(toks, i,
      CASE WHEN jsonb_array_length(joins) = 0 AND alias IS NULL THEN 'an alias, JOIN or SELECT'
        ELSE 'JOIN or SELECT' END,
      'join');
  END IF;
  i := i + 1;
  IF "trellis".grammar_kw(toks[i], 'distinct') THEN
    PERFORM "trellis".grammar_fail(format(
      'SELECT DISTINCT is not supported: use GROUP BY (expected a select item, found %s)',
      "trellis".grammar_describe(toks[i])), toks[i].pos);
  END IF;
  IF "trellis".grammar_kw(toks[i], 'all') THEN
    i := i + 1;
  END IF;

  LOOP
    start := i;
    e := "trellis".grammar_scan(toks, i);
    IF e = start THEN
      PERFORM "trellis".grammar_unexpected(toks, e, 'a select item', 'select');
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
  expected := '",", WHERE, GROUP BY, HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';

  IF "trellis".grammar_kw(toks[i], 'where') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after WHERE');
    END IF;
    where_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'GROUP BY, HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'group') THEN
    IF NOT "trellis".grammar_kw(toks[i + 1], 'by') THEN
      PERFORM "trellis".grammar_unexpected(toks, i + 1, 'BY after GROUP');
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
    expected := '",", HAVING, WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

  IF "trellis".grammar_kw(toks[i], 'having') THEN
    i := i + 1;
    e := "trellis".grammar_scan(toks, i);
    IF e = i THEN
      PERFORM "trellis".grammar_unexpected(toks, i, 'a condition after HAVING');
    END IF;
    having_ := "trellis".grammar_text(toks, i, e);
    i := e;
    expected := 'WITHOUT SOURCE INDEX, WITHOUT ROW SECURITY or end of statement';
  END IF;

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

  PERFORM "trellis".grammar_end(toks, i, expected,
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
CREATE OR REPLACE FUNCTION "trellis".render_statement(ast jsonb) RETURNS text
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
      || "trellis".grammar_render_name(ast -> 'target' ->> 'schema', ast -> 'target' ->> 'name')
      || ' FROM '
      || "trellis".grammar_render_name(ast -> 'from' ->> 'schema', ast -> 'from' ->> 'name')
      || coalesce(' AS ' || quote_ident(ast -> 'from' ->> 'alias'), '');
    FOR j IN SELECT value FROM jsonb_array_elements(coalesce(ast -> 'joins', '[]')) LOOP
      res := res
        || CASE j ->> 'type' WHEN 'left' THEN ' LEFT JOIN ' ELSE ' JOIN ' END
        || "trellis".grammar_render_name(j ->> 'schema', j ->> 'name')
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
    target := "trellis".grammar_render_name(ast ->> 'schema', ast ->> 'transform');
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
CREATE OR REPLACE FUNCTION "trellis"._check_definition(spec jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  bad record;
  full_info jsonb;
BEGIN
  SELECT s->>'alias' AS alias INTO bad FROM jsonb_array_elements(spec->'sources') s
   WHERE starts_with(s->>'alias', 'trellis#') LIMIT 1;
  IF FOUND THEN
    PERFORM "trellis"._fail('TRV01', format(
      'the name %I is reserved (names starting with trellis# are the engine''s own): give the table another alias',
      bad.alias));
  END IF;
  IF NOT coalesce((spec->'ast'->>'without_row_security')::boolean, false) THEN
    SELECT s->>'qualified' AS source INTO bad
      FROM jsonb_array_elements(spec->'sources') s JOIN pg_class c ON c.oid = (s->>'oid')::oid
     WHERE c.relrowsecurity LIMIT 1;
    IF FOUND THEN
      PERFORM "trellis"._fail('TRV01', format(
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
    PERFORM "trellis"._fail('TRV01', format(
      'a key of type %s would not read back exactly from its text under extra_float_digits = %s and DateStyle = ''%s'', which the transform would record: define it with %s (SET LOCAL in the defining transaction, or ALTER TRANSFORM ... SET)',
      bad.key_type, current_setting('extra_float_digits'), current_setting('datestyle'), bad.fix));
  END IF;
  full_info := "trellis"._analyze_query(
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
    PERFORM "trellis"._fail('TRV01', format(
      'the definition calls %s, which is %s: it may read other tables, and their changes would never reach the target. Use only IMMUTABLE functions of your own (declare it IMMUTABLE if its result depends on its arguments alone)',
      bad.fn, bad.volatility));
  END IF;
  RETURN (full_info->>'whole_row')::boolean;
END
$fn$;

-- _rebind, as in 0009, analysing the statement under the settings it was defined with as
-- well as its search_path: a literal ('01/02/2024'::date) or a cast reads as it did then.
CREATE OR REPLACE FUNCTION "trellis"._rebind(t "trellis".transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  previous jsonb;
  new_spec jsonb;
  now_cols text;
  was_cols text;
BEGIN
  PERFORM set_config('search_path', t.search_path, true);
  previous := "trellis"._enter_settings(t.settings);
  BEGIN
    new_spec := "trellis"._analyze_transform(t.spec->'ast');
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM set_config('search_path', old_path, true);
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot resume: its definition no longer holds (%s). Fix the sources, or DROP TRANSFORM it and define it again',
      t.target_name, SQLERRM));
  END;
  PERFORM set_config('search_path', old_path, true);
  new_spec := jsonb_set(new_spec, '{ast,target}', t.spec->'ast'->'target');
  BEGIN
    new_spec := new_spec || jsonb_build_object(
      'whole_row', "trellis"._check_definition(new_spec),
      'key_map', "trellis"._key_map_kind(new_spec));
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot resume: %s', t.target_name, SQLERRM));
  END;
  PERFORM "trellis"._leave_settings(previous);
  SELECT string_agg(format('%s %s %s', c->>'name', c->>'type', (c->>'is_key')::boolean), ', ' ORDER BY o) INTO now_cols
    FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(c, o);
  SELECT string_agg(format('%s %s %s', c.name, c.type, c.is_key), ', ' ORDER BY c.ordinal) INTO was_cols
    FROM "trellis".transform_columns c WHERE c.transform_id = t.id;
  IF now_cols IS DISTINCT FROM was_cols THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I cannot resume: as its sources are now, its definition gives the columns (%s), and its target has (%s). DROP TRANSFORM it and define it again',
      t.target_name, now_cols, was_cols));
  END IF;
  UPDATE "trellis".transforms SET spec = new_spec, capture_failure = NULL, updated_at = now()
   WHERE id = t.id;
  PERFORM "trellis"._register(t.id, new_spec);
  PERFORM "trellis"._record_read_attrs(t.id);
  -- Key types may have changed: the key map is made again (the rebuild fills it).
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  PERFORM "trellis"._create_key_map(t.id, new_spec);
END
$fn$;

-- ALTER TRANSFORM t SET | RESET WITHOUT ROW SECURITY. RESET is refused while a source has
-- row level security (the definition would no longer hold); neither changes the target.
CREATE FUNCTION "trellis"._alter_without_row_security(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  new_ast jsonb;
  previous jsonb;
BEGIN
  new_ast := CASE WHEN (ast->>'value')::boolean
                  THEN jsonb_set(t.spec->'ast', '{without_row_security}', 'true')
                  ELSE (t.spec->'ast') - 'without_row_security' END;
  IF NOT (ast->>'value')::boolean THEN
    previous := "trellis"._enter_settings(t.settings);
    PERFORM "trellis"._check_definition(jsonb_set(t.spec, '{ast}', new_ast));
    PERFORM "trellis"._leave_settings(previous);
  END IF;
  PERFORM "trellis"._restate(t, new_ast);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- ALTER TRANSFORM t SET (name = value, ...) records those values; RESET (name, ...) records
-- the values in force in the session that runs it. Each name must be one Trellis records,
-- each value one Postgres takes; the definition must still hold, with the same target
-- columns, under the new settings. The target is then rebuilt under them.
CREATE FUNCTION "trellis"._alter_settings(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
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
    IF NOT s.name = ANY ("trellis"._recorded_setting_names()) THEN
      PERFORM "trellis"._fail('TRV01', format(
        '%s is not a setting Trellis records with a transform (those are %s)',
        s.name, array_to_string("trellis"._recorded_setting_names(), ', ')));
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
          PERFORM "trellis"._fail('TRV01', format('%s cannot be %L: %s', s.name, s.value, SQLERRM));
      END;
    END IF;
    wanted := wanted || jsonb_build_object(s.name, canonical);
  END LOOP;
  new_settings := t.settings || wanted;

  -- The definition, analysed again under the new settings, must give the same columns.
  PERFORM set_config('search_path', t.search_path, true);
  previous := "trellis"._enter_settings(new_settings);
  BEGIN
    spec := "trellis"._analyze_transform(t.spec->'ast');
    spec := jsonb_set(spec, '{ast,target}', t.spec->'ast'->'target');
    PERFORM "trellis"._check_definition(spec);
  EXCEPTION WHEN SQLSTATE 'TRV01' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'transform %I does not hold under those settings: %s', t.target_name, SQLERRM));
  END;
  PERFORM "trellis"._leave_settings(previous);
  PERFORM set_config('search_path', old_path, true);
  SELECT string_agg(format('%s %s', c->>'name', c->>'type'), ', ' ORDER BY o) INTO now_cols
    FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o);
  SELECT string_agg(format('%s %s', c.name, c.type), ', ' ORDER BY c.ordinal) INTO was_cols
    FROM "trellis".transform_columns c WHERE c.transform_id = t.id;
  IF now_cols IS DISTINCT FROM was_cols THEN
    PERFORM "trellis"._fail('TRV01', format(
      'under those settings transform %I would give the columns (%s), and its target has (%s): DROP TRANSFORM it and define it again',
      t.target_name, now_cols, was_cols));
  END IF;

  IF new_settings IS DISTINCT FROM t.settings THEN
    UPDATE "trellis".transforms SET settings = new_settings, updated_at = now() WHERE id = t.id;
    PERFORM "trellis"._request_rebuild(t.id);
  END IF;
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- _apply, as in 0006, with the statements of 0024; ALTER ... ADD COLUMN analyses the new
-- column (and the definition with it) under the transform's recorded settings.
CREATE OR REPLACE FUNCTION "trellis"._apply(statement text, transform_only boolean)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  ast jsonb;
  previous jsonb;
  result jsonb;
BEGIN
  IF statement IS NULL THEN
    PERFORM "trellis"._fail('TRP01', 'the statement is NULL');
  END IF;
  ast := "trellis".parse_statement(statement);
  IF transform_only AND ast->>'kind' <> 'transform' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'define() takes a TRANSFORM statement, not %s: use apply() for it', upper(split_part(ast->>'kind', '_', 1))));
  END IF;
  PERFORM pg_advisory_xact_lock(1953653104, hashtext('trellis'));
  CASE ast->>'kind'
    WHEN 'transform' THEN RETURN "trellis"._define(ast, statement);
    WHEN 'pause' THEN RETURN "trellis"._pause(ast);
    WHEN 'resume' THEN RETURN "trellis"._resume(ast);
    WHEN 'drop' THEN RETURN "trellis"._drop(ast);
    WHEN 'alter_add_column' THEN
      previous := "trellis"._enter_settings(("trellis"._transform_named(ast)).settings);
      result := "trellis"._alter_add_column(ast);
      PERFORM "trellis"._leave_settings(previous);
      RETURN result;
    WHEN 'alter_drop_column' THEN RETURN "trellis"._alter_drop_column(ast);
    WHEN 'alter_without_source_index' THEN RETURN "trellis"._alter_without_source_index(ast);
    WHEN 'alter_without_row_security' THEN RETURN "trellis"._alter_without_row_security(ast);
    WHEN 'alter_set_settings', 'alter_reset_settings' THEN RETURN "trellis"._alter_settings(ast);
  END CASE;
  PERFORM "trellis"._fail('TRP01', format('unknown statement kind %s', ast->>'kind'));
  RETURN NULL;
END
$fn$;

-- restore_definition (0016) with the settings the transform was defined under (dumps
-- written since 0024 carry them): the statement is analysed, and the transform recorded,
-- under them. The two-argument form, for older dumps, records the loading session's.
CREATE FUNCTION "trellis".restore_definition(statement text, search_path text, settings jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  previous jsonb := "trellis"._enter_settings(settings);
  result jsonb;
BEGIN
  result := "trellis".restore_definition(statement, search_path);
  PERFORM "trellis"._leave_settings(previous);
  RETURN result;
END
$fn$;

-- Every registered transform (the handle's Definition), as in 0017, with the settings it
-- was defined under and whether it was defined WITHOUT ROW SECURITY.
CREATE OR REPLACE FUNCTION "trellis".definitions()
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
               FROM "trellis".transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM "trellis".transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object(
             'withoutSourceIndex', t.without_source_index,
             'withoutRowSecurity', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false)),
           'settings', t.settings,
           'aggregates', t.aggregates,
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM "trellis".transforms t
   ORDER BY t.target_name
$fn$;

-- The sources of a transform that have row level security enabled, for status():
-- [{table, forced, optedOut}] (forced: FORCE ROW LEVEL SECURITY, which applies the
-- policies to the table's owner too).
CREATE FUNCTION "trellis"._row_security(p_transform_id int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'table', ts.source_schema || '.' || ts.source_name, 'forced', c.relforcerowsecurity,
           'optedOut', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false))
           ORDER BY ts.ordinal), '[]')
    FROM "trellis".transform_sources ts
    JOIN "trellis".transforms t ON t.id = ts.transform_id
    JOIN pg_class c ON c.oid = ts.source_oid
   WHERE ts.transform_id = p_transform_id AND c.relrowsecurity
$fn$;

-- Where a transform is (the handle's Status), as in 0023, and which of its sources have row
-- level security (rowSecurity); as before, how its last range of changes was applied
-- (lastApply): lifecycle, held keys, paused columns, source index gaps,
-- corrections, failures, what capture waits on, backfill progress, lag.
-- Refuses an unknown transform with TRN01.
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
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
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
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
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
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at) END);
END
$fn$;


-- Transforms defined before this migration over a source that has row level security now
-- were accepted then: they carry on as they were, defined WITHOUT ROW SECURITY from now on
-- (their statement says so, and status() lists the sources), rather than stop on upgrade.
UPDATE "trellis".transforms t
   SET spec = jsonb_set(t.spec, '{ast,without_row_security}', 'true'),
       statement = "trellis".render_statement(jsonb_set(t.spec->'ast', '{without_row_security}', 'true'))
 WHERE EXISTS (SELECT 1 FROM "trellis".transform_sources ts JOIN pg_class c ON c.oid = ts.source_oid
                WHERE ts.transform_id = t.id AND c.relrowsecurity);

-- Defence in depth: Postgres lets PUBLIC execute every new function, so any role granted
-- USAGE on this schema (a writer, by grant_writer) could call apply() or status(). Only
-- the owner (who needs no grant) executes them now. Capture trigger functions need no
-- EXECUTE to fire (Postgres checks it when the trigger is created, not when it fires), so
-- writers keep writing. The functions made later (capture functions, later migrations)
-- are revoked where they are made (trigger-sql.ts, the install SQL).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
$trellis_m24$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 25) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (25, 'worker_health', false);
    EXECUTE $trellis_m25$-- Worker health, the processes that run workers, and what every wait waits on (issue #21
-- items 4 and 7, issue #23 item 1; ADR 0038). A pipeline whose workers all fail used to
-- keep status 'live' with nothing saying so, and a transform could wait to be built with
-- nothing saying why.

-- Every process running Trellis workers (a handle with staging or drain loops), written
-- by the process itself (src/engine/workers/process-registry.ts): when it starts, every
-- 10 s, when the health of one of its workers changes, and deleted when it shuts down. A
-- process that died without that is seen by its heartbeat getting old; rows an hour old
-- are deleted by the next heartbeat of any process.
CREATE TABLE "trellis".processes (
  id uuid PRIMARY KEY,
  host text NOT NULL,
  pid int NOT NULL,
  application_name text NOT NULL,
  -- trellis-pg's version (package.json) and the schema version it needs (its newest
  -- migration): a process whose schema_version differs from the installed one is older
  -- (or newer) than the schema.
  package_version text NOT NULL,
  schema_version int NOT NULL,
  staging boolean NOT NULL,
  drain_loops int NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  -- Its workers as it last reported them, each present when it runs it:
  --   staging, decoder: {backendPid, elected, lastPassAt, failingSince, failures, lastError}
  --   drain: {loops, alive, failing, lastPassAt, failingSince, lastError}
  --   refused: {code, message, at} once it stopped its workers (a schema it cannot run on)
  -- lastError: {message, code, sqlstate, at}. Times are the process's clock.
  health jsonb NOT NULL DEFAULT '{}'
);

-- The process rows of this instance still reporting (a heartbeat in the last 30 s: three
-- missed heartbeats), with the session ids pg_locks shows for their workers.
CREATE FUNCTION "trellis"._live_processes()
RETURNS SETOF "trellis".processes LANGUAGE sql STABLE AS $fn$
  SELECT * FROM "trellis".processes WHERE heartbeat_at >= now() - interval '30 seconds'
$fn$;

-- The session holding advisory lock p_class (staging 'trst', WAL decoder 'trwl', as in
-- src/engine/internal/advisory-locks.ts) for this instance, if any.
CREATE FUNCTION "trellis"._lock_holder(p_class bigint)
RETURNS int LANGUAGE sql STABLE AS $fn$
  SELECT l.pid FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = p_class::oid
     AND l.objid = ((hashtext('trellis')::bigint + 4294967296) % 4294967296)::oid
   LIMIT 1
$fn$;

-- An elected worker's health (p_role 'staging' or 'decoder'): whether some session holds
-- its lock (elected), the process that runs it (found by the lock holder's backend pid),
-- whether it passes (elected, its process reporting, no failure since its last pass), and
-- `problem`, a sentence saying what is wrong when it does not pass (null when it does, or
-- when no process reports for the lock holder: a trellis-pg older than this schema).
-- Not elected, the process described is one that runs the role and fails, if any: its
-- error says why nobody is elected.
CREATE FUNCTION "trellis"._elected_worker(p_role text, p_class bigint, p_name text, p_start text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  holder int := "trellis"._lock_holder(p_class);
  pr "trellis".processes;
  h jsonb;
  fresh boolean;
  problem text;
BEGIN
  IF holder IS NOT NULL THEN
    SELECT * INTO pr FROM "trellis".processes p
     WHERE (p.health -> p_role ->> 'backendPid')::int = holder
     ORDER BY p.heartbeat_at DESC LIMIT 1;
  ELSE
    SELECT * INTO pr FROM "trellis"._live_processes() p
     WHERE p.health ? p_role
     ORDER BY (p.health -> p_role ->> 'failingSince') IS NULL, p.heartbeat_at DESC LIMIT 1;
  END IF;
  h := pr.health -> p_role;
  fresh := pr.heartbeat_at >= now() - interval '30 seconds';
  IF holder IS NULL THEN
    problem := CASE WHEN h ->> 'failingSince' IS NOT NULL THEN
                 format('no %s is elected: the %s of %s (pid %s) fails: %s', p_name, p_name,
                        pr.host, pr.pid, h -> 'lastError' ->> 'message')
               ELSE format('no %s is running: %s', p_name, p_start) END;
  ELSIF pr.id IS NOT NULL AND NOT fresh THEN
    problem := format('the %s''s process (%s, pid %s) has not reported since %s', p_name,
                      pr.host, pr.pid, pr.heartbeat_at);
  ELSIF pr.id IS NOT NULL AND h ->> 'failingSince' IS NOT NULL THEN
    problem := format('the %s fails: %s', p_name, h -> 'lastError' ->> 'message');
  END IF;
  RETURN jsonb_build_object(
    'elected', holder IS NOT NULL,
    'process', CASE WHEN pr.id IS NOT NULL THEN jsonb_build_object(
                 'id', pr.id, 'host', pr.host, 'pid', pr.pid, 'packageVersion', pr.package_version) END,
    'passing', CASE WHEN holder IS NULL THEN false
                    WHEN pr.id IS NULL THEN NULL
                    ELSE problem IS NULL END,
    'lastPassAt', h -> 'lastPassAt',
    'failingSince', h -> 'failingSince',
    'lastError', h -> 'lastError',
    'problem', problem);
END
$fn$;

-- The instance's workers: the staging worker, the WAL decoder (under WAL capture: null
-- otherwise), the drain loops (sessions holding the drain lock, and what the processes
-- report of theirs), the installed schema version, and every process of the registry,
-- stale ones included. Callable from psql: SELECT jsonb_pretty(trellis.workers()).
CREATE FUNCTION "trellis".workers()
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  installed int := (SELECT max(version) FROM "trellis".migrations);
  logical boolean := (SELECT c.capture = 'logical' OR c.wal_slot IS NOT NULL FROM "trellis".config c);
  loops int;
  drain jsonb;
  drain_problem text;
BEGIN
  SELECT count(*) INTO loops FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = 1953653874::oid  -- 'trdr'
     AND l.objid = ((hashtext('trellis')::bigint + 4294967296) % 4294967296)::oid;
  SELECT jsonb_build_object(
           'reported', count(*),
           'alive', coalesce(sum((p.health -> 'drain' ->> 'alive')::int), 0),
           'failing', coalesce(sum((p.health -> 'drain' ->> 'failing')::int), 0),
           'lastPassAt', max(p.health -> 'drain' ->> 'lastPassAt'),
           -- All failing: since the last of them began to.
           'failingSince', max(p.health -> 'drain' ->> 'failingSince'),
           'lastError', (SELECT q.health -> 'drain' -> 'lastError' FROM "trellis"._live_processes() q
                          WHERE q.health -> 'drain' ->> 'failingSince' IS NOT NULL
                          ORDER BY q.health -> 'drain' -> 'lastError' ->> 'at' DESC LIMIT 1))
    INTO drain
    FROM "trellis"._live_processes() p WHERE p.health ? 'drain';
  IF loops = 0 THEN
    drain_problem := CASE WHEN drain -> 'lastError' IS NOT NULL AND drain -> 'lastError' <> 'null'
                          THEN format('no drain loop is running: %s', drain -> 'lastError' ->> 'message')
                          ELSE 'no drain loop is running: connect a handle with drainThreads > 0 (drain loops build targets and apply changes)' END;
  ELSIF (drain ->> 'alive')::int > 0 AND (drain ->> 'failing')::int >= (drain ->> 'alive')::int THEN
    drain_problem := format('every drain loop fails: %s', drain -> 'lastError' ->> 'message');
  END IF;
  RETURN jsonb_build_object(
    'schemaVersion', installed,
    'staging', "trellis"._elected_worker('staging', 1953657716, 'staging worker',  -- 'trst'
                 'connect a handle with staging: true (one is elected; others stand by)'),
    'decoder', CASE WHEN logical THEN "trellis"._elected_worker('decoder', 1953658732, 'WAL decoder',  -- 'trwl'
                 'the staging worker''s handle (staging: true) runs it') END,
    'drain', jsonb_build_object(
      'loops', loops,
      'passing', CASE WHEN loops = 0 THEN false
                      WHEN (drain ->> 'reported')::int = 0 THEN NULL
                      ELSE drain_problem IS NULL END,
      'lastPassAt', drain -> 'lastPassAt',
      'failingSince', CASE WHEN drain_problem IS NOT NULL THEN drain -> 'failingSince' END,
      'lastError', drain -> 'lastError',
      'problem', drain_problem),
    'processes', coalesce((
      SELECT jsonb_agg(jsonb_build_object(
               'id', p.id, 'host', p.host, 'pid', p.pid, 'applicationName', p.application_name,
               'packageVersion', p.package_version, 'schemaVersion', p.schema_version,
               'staging', p.staging, 'drainLoops', p.drain_loops,
               'startedAt', p.started_at, 'heartbeatAt', p.heartbeat_at,
               'stale', p.heartbeat_at < now() - interval '30 seconds',
               'refused', p.health -> 'refused' ->> 'message')
             ORDER BY p.started_at, p.id)
        FROM "trellis".processes p), '[]'));
END
$fn$;

-- What stops the pipeline, from workers(): the first of the staging worker, the WAL
-- decoder (under WAL capture) and the drain loops that has a problem, or null.
CREATE FUNCTION "trellis"._worker_failure(health jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT jsonb_build_object(
           'role', r.role, 'error', r.w ->> 'problem',
           'sqlstate', r.w -> 'lastError' ->> 'sqlstate',
           'since', coalesce(r.w -> 'failingSince', 'null'::jsonb),
           'process', coalesce(r.w -> 'process', 'null'::jsonb))
    FROM (VALUES (1, 'staging', health -> 'staging'), (2, 'decoder', health -> 'decoder'),
                 (3, 'drain', health -> 'drain')) AS r(ord, role, w)
   WHERE r.w IS NOT NULL AND jsonb_typeof(r.w) = 'object' AND r.w ->> 'problem' IS NOT NULL
   ORDER BY r.ord LIMIT 1
$fn$;

-- What a transform that is not live (or lags) waits on, as {kind, reason}: a capture wait
-- (captureWait says more), the staging worker (not running, failing, or about to start the
-- build), capture not in place yet, the first tick, the drain loops, a transform upstream,
-- a failing build. Null for a live transform with nothing to apply, and for a paused one
-- (pauseReason says why).
CREATE FUNCTION "trellis"._waiting_on(
  p_transform int, p_lifecycle text, p_wait jsonb, p_health jsonb, p_lag_segments bigint,
  p_upstream boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  p "trellis".pipeline;
  uncovered text;
  staging_problem text := p_health -> 'staging' ->> 'problem';
  decoder_problem text := p_health -> 'decoder' ->> 'problem';
  drain_problem text := p_health -> 'drain' ->> 'problem';
BEGIN
  IF p_lifecycle = 'paused' THEN
    RETURN NULL;
  END IF;
  IF p_wait IS NOT NULL THEN
    RETURN jsonb_build_object('kind', 'capture', 'reason',
      format('capture of %s waits (%s): captureWait lists what it waits on',
             p_wait ->> 'table', p_wait ->> 'operation'));
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = p_transform;
  IF p.phase = 'waiting_to_backfill' THEN
    IF staging_problem IS NOT NULL THEN
      RETURN jsonb_build_object('kind', 'staging_worker', 'reason', staging_problem);
    END IF;
    -- A source whose capture does not cover what the transform reads yet (as
    -- startBackfills decides it, src/engine/staging/backfill-start.ts).
    SELECT ts.source_schema || '.' || ts.source_name INTO uncovered
      FROM "trellis".transform_sources ts
      LEFT JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = p_transform
       AND (src.id IS NULL
            OR (src.wal_state IS DISTINCT FROM 'ready'
                AND (src.installed_at IS NULL
                     OR NOT (ARRAY(SELECT unnest(ts.read_columns) EXCEPT SELECT unnest(ts.key_columns))
                             <@ src.captured_columns))))
     ORDER BY ts.ordinal LIMIT 1;
    IF uncovered IS NOT NULL THEN
      RETURN jsonb_build_object('kind', 'capture', 'reason',
        format('capture of %s is not in place yet: the staging worker installs it (or widens it to the columns read) on its next pass%s',
               uncovered, CASE WHEN decoder_problem IS NOT NULL THEN '; ' || decoder_problem ELSE '' END));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM "trellis".ticks) THEN
      RETURN jsonb_build_object('kind', 'tick', 'reason',
        'the staging worker has taken no tick yet: a build starts from one');
    END IF;
    RETURN jsonb_build_object('kind', 'staging_worker', 'reason',
      'the staging worker starts the build on its next pass');
  END IF;
  IF p_lifecycle = 'live' AND p_lag_segments = 0 THEN
    RETURN NULL;
  END IF;
  IF drain_problem IS NOT NULL THEN
    RETURN jsonb_build_object('kind', 'drain_worker', 'reason', drain_problem);
  END IF;
  IF p.build_attempts > 0 AND p.build_error IS NOT NULL AND p.build_next_at IS NOT NULL THEN
    RETURN jsonb_build_object('kind', 'build', 'reason',
      format('its build failed %s time(s) (%s); it is tried again at %s (buildFailure)',
             p.build_attempts, p.build_error, p.build_next_at));
  END IF;
  IF p_upstream AND p_lifecycle = 'catching_up' AND p.phase = 'live' THEN
    RETURN jsonb_build_object('kind', 'upstream', 'reason',
      'it reads a transform that is paused, or not live yet (see pausedUpstreamColumns and its status)');
  END IF;
  RETURN jsonb_build_object('kind', 'drain_worker', 'reason',
    CASE WHEN p_lifecycle = 'backfilling' THEN 'the drain loops are building it (backfill shows how far)'
         ELSE 'the drain loops are applying the changes it has not applied yet (lag)' END);
END
$fn$;

-- Where a transform is (the handle's Status), as in 0024, and now the workers' health
-- (workers), what stops the pipeline (workerFailure), and what it waits on (waitingOn).
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
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
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
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
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
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                      upstream_behind OR jsonb_array_length(paused_upstream) > 0));
END
$fn$;

$trellis_m25$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 26) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (26, 'delta_aggregates', false);
    EXECUTE $trellis_m26$-- Aggregates maintained by delta (issue #22, ADR 0044). A GROUP BY (or grand total) whose
-- every aggregate has an exact inverse is kept by applying each changed row's contribution
-- (minus its old one, plus its new one) to its groups, instead of recomputing the groups
-- from all their rows:
--
--   * the key map (map_<id>) also holds each join row's aggregate inputs (i<n>): its old
--     contribution, which the sources no longer show;
--   * a group state table (groups_<id>) holds, per group, the row count and each
--     aggregate's state (sums, counts, extremes, ...), from which the target row is
--     computed. The target always equals its group states finalised, and the group states
--     always equal the key map's rows folded: every change to one is made with the other,
--     in one statement (src/engine/drain/delta-sql.ts).
--
-- Which aggregates qualify, and how each is kept (`<schema>.transforms.delta`, written by
-- _classify_aggregates at define time):
--   count(*), count(x)                          counts
--   sum / avg of smallint, integer, bigint      sum and count of non-NULL inputs
--   sum / avg of numeric                        finite sum, counts of non-NULL, NaN and
--                                               infinite inputs, and the largest display
--                                               scale with how many inputs have it (the
--                                               sum's scale is the inputs' largest)
--   min / max of integers, dates, timestamps,   the extreme; when a change removes it, the
--   text with a deterministic collation, oid    group's extreme is read again from its
--                                               key-map rows (a rescan)
--   bool_and / every / bool_or                  counts of false (true) and non-NULL inputs
-- each with or without FILTER, in any expression that reads no column outside its
-- aggregates (coalesce(sum(x), 0), sum(a) / nullif(count(*), 0), ...), and HAVING over
-- such expressions. Anything else (DISTINCT or ORDER BY inside, float sums, ordered-set or
-- user-defined aggregates, a column read outside an aggregate) keeps the whole transform
-- on the group recompute of ADR 0006, with the reason recorded.

ALTER TABLE "trellis".transforms ADD COLUMN delta jsonb;

-- How the drain applied a range (status().lastApply): 'delta' joins 'rederive' and 'recompute';
-- the estimates it chose by (apply_estimate), and what each way has cost this transform,
-- per unit, as measured (apply_costs; see src/engine/drain/apply-choice.ts).
ALTER TABLE "trellis".pipeline DROP CONSTRAINT pipeline_apply_mode_check;
ALTER TABLE "trellis".pipeline ADD CONSTRAINT pipeline_apply_mode_check
  CHECK (apply_mode IN ('delta', 'rederive', 'recompute'));
ALTER TABLE "trellis".pipeline
  ADD COLUMN apply_estimate jsonb,
  ADD COLUMN apply_costs jsonb;

-- `node` (a node string of pg_rewrite.ev_action, from its opening brace) with everything
-- nested inside it emptied: `{AGGREF :aggfnoid 2108 ... :args () ... :location 39}`, so its
-- own fields can be read without meeting those of the nodes it holds. Node strings escape
-- braces and parentheses inside tokens with a backslash.
CREATE FUNCTION "trellis"._node_own_fields(node text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  ch text[] := string_to_array(node, NULL);
  result text := '';
  depth int := 0;
  i int := 1;
  n int := coalesce(array_length(ch, 1), 0);
  c text;
BEGIN
  WHILE i <= n LOOP
    c := ch[i];
    IF c = '\' THEN
      IF depth <= 1 THEN
        result := result || c || coalesce(ch[i + 1], '');
      END IF;
      i := i + 2;
      CONTINUE;
    END IF;
    IF c IN ('{', '(') THEN
      depth := depth + 1;
      IF depth <= 2 THEN
        result := result || c;
      END IF;
    ELSIF c IN ('}', ')') THEN
      IF depth <= 2 THEN
        result := result || c;
      END IF;
      depth := depth - 1;
      EXIT WHEN depth = 0;
    ELSIF depth <= 1 THEN
      result := result || c;
    END IF;
    i := i + 1;
  END LOOP;
  RETURN result;
END
$fn$;

-- The aggregate calls in `expr`, one of the SELECT items (or the HAVING) of a definition
-- reading `from_sql` grouped by `grouping`, as Postgres resolves them, each with where it
-- is written in `expr`:
--   [{fn (regprocedure text), name, aggtype (format_type), collation (of its input, or
--     null), star, distinct, ordered, filtered, kind ('n' normal, 'o' ordered-set, 'h'),
--     outer (an outer query's aggregate), first, last (1-based character positions of the
--     call in expr, FILTER included), args (text of its arguments), filter (text of its
--     FILTER condition, or null)}]
-- Each call written in expr (a name, its parenthesised arguments, then FILTER or WITHIN
-- GROUP) is asked of Postgres on its own: a temporary view of that call alone, grouped as
-- the definition is, whose column is an Aggref node when the call is an aggregate. Stored
-- query trees carry no text locations from Postgres 17 on (every :location is -1), so the
-- calls are found in the text and Postgres says what each is. A call that is not an
-- aggregate (coalesce(...), a cast) is looked into for the aggregates it holds.
CREATE FUNCTION "trellis"._aggregate_calls(expr text, from_sql text, group_list text)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  toks "trellis".grammar_token[] := "trellis".grammar_tokenize(expr);
  n int := coalesce(array_length(toks, 1), 0);
  t int := 1;
  s int;
  depth int;
  open_at int;
  close_at int;
  end_at int;
  filter_open int;
  filter_close int;
  call_text text;
  action text;
  node text;
  own text;
  args text;
  filter_text text;
  calls jsonb := '[]';
  coll oid;
  fn oid;
BEGIN
  WHILE t <= n LOOP
    -- A call starts at a name (possibly qualified) followed by an opening parenthesis.
    IF NOT (toks[t].kind IN ('word', 'ident', 'uident')
            AND (t = 1 OR NOT (toks[t - 1].kind = 'punct' AND toks[t - 1].text = '.'))) THEN
      t := t + 1;
      CONTINUE;
    END IF;
    s := t;
    WHILE s + 2 <= n AND toks[s + 1].kind = 'punct' AND toks[s + 1].text = '.'
          AND toks[s + 2].kind IN ('word', 'ident', 'uident') LOOP
      s := s + 2;
    END LOOP;
    IF NOT (s + 1 <= n AND toks[s + 1].kind = 'punct' AND toks[s + 1].text = '(') THEN
      t := s + 1;
      CONTINUE;
    END IF;
    open_at := s + 1;
    close_at := open_at;
    depth := 0;
    LOOP
      EXIT WHEN close_at > n;
      IF toks[close_at].kind = 'punct' AND toks[close_at].text IN ('(', '[') THEN
        depth := depth + 1;
      ELSIF toks[close_at].kind = 'punct' AND toks[close_at].text IN (')', ']') THEN
        depth := depth - 1;
        EXIT WHEN depth = 0;
      END IF;
      close_at := close_at + 1;
    END LOOP;
    IF close_at > n THEN
      EXIT;
    END IF;
    end_at := close_at;
    filter_text := NULL;
    -- WITHIN GROUP (...) and FILTER (...) belong to the call.
    IF end_at + 2 <= n AND toks[end_at + 1].kind = 'word' AND toks[end_at + 1].value = 'within'
       AND toks[end_at + 2].kind = 'word' AND toks[end_at + 2].value = 'group' THEN
      end_at := "trellis"._closing_token(toks, end_at + 3);
    END IF;
    IF end_at IS NOT NULL AND end_at + 1 <= n AND toks[end_at + 1].kind = 'word'
       AND toks[end_at + 1].value = 'filter' THEN
      filter_open := end_at + 2;
      filter_close := "trellis"._closing_token(toks, filter_open);
      IF filter_close IS NOT NULL THEN
        -- (WHERE condition)
        filter_text := btrim(substr(expr, toks[filter_open + 2].pos,
                               toks[filter_close].pos - toks[filter_open + 2].pos));
      END IF;
      end_at := filter_close;
    END IF;
    IF end_at IS NULL THEN
      t := open_at + 1;
      CONTINUE;
    END IF;
    call_text := substr(expr, toks[t].pos, toks[end_at].pos - toks[t].pos + 1);
    action := NULL;
    BEGIN
      DROP VIEW IF EXISTS pg_temp.trellis_aggregates;
      EXECUTE 'CREATE TEMP VIEW trellis_aggregates AS SELECT ' || call_text
        || ' FROM ' || from_sql || ' GROUP BY ' || group_list;
      SELECT r.ev_action::text INTO action
        FROM pg_rewrite r WHERE r.ev_class = 'pg_temp.trellis_aggregates'::regclass;
      DROP VIEW pg_temp.trellis_aggregates;
    EXCEPTION WHEN OTHERS THEN
      -- Not a call Postgres takes alone (it reads an ungrouped column, say): its
      -- arguments may still hold aggregates.
      action := NULL;
    END;
    node := substring(action FROM ':targetList \(\{TARGETENTRY :expr (\{AGGREF .*)$');
    IF node IS NULL THEN
      t := open_at + 1;
      CONTINUE;
    END IF;
    own := "trellis"._node_own_fields(node);
    args := btrim(substr(expr, toks[open_at].pos + 1, toks[close_at].pos - toks[open_at].pos - 1));
    IF toks[open_at + 1].kind = 'word' AND toks[open_at + 1].value = 'all' THEN
      args := btrim(substr(expr, toks[open_at + 2].pos, toks[close_at].pos - toks[open_at + 2].pos));
    END IF;
    coll := nullif((regexp_match(own, ':inputcollid (\d+)'))[1]::oid, 0);
    fn := (regexp_match(own, ':aggfnoid (\d+)'))[1]::oid;
    calls := calls || jsonb_build_array(jsonb_build_object(
      'fn', fn::regprocedure::text,
      'name', (SELECT p.proname FROM pg_proc p WHERE p.oid = fn),
      'builtin', (SELECT p.pronamespace = 'pg_catalog'::regnamespace FROM pg_proc p WHERE p.oid = fn),
      'aggtype', format_type((regexp_match(own, ':aggtype (\d+)'))[1]::oid, NULL),
      'argtype', format_type(nullif((regexp_match(node, ':aggargtypes \(o ?(\d*)'))[1], '')::oid, NULL),
      'collation', (SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
                      FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                     WHERE co.oid = coll),
      'deterministic', coalesce((SELECT co.collisdeterministic FROM pg_collation co WHERE co.oid = coll), true),
      'star', own ~ ':aggstar true',
      'distinct', own !~ ':aggdistinct <>',
      'ordered', own !~ ':aggorder <>',
      'filtered', own !~ ':aggfilter <>',
      'variadic', own ~ ':aggvariadic true',
      'kind', (regexp_match(own, ':aggkind (\w)'))[1],
      'outer', (regexp_match(own, ':agglevelsup (\d+)'))[1]::int > 0,
      'first', toks[t].pos,
      'last', toks[end_at].pos,
      'args', args,
      'filter', filter_text));
    -- An aggregate holds no other (Postgres refuses nested aggregates).
    t := end_at + 1;
  END LOOP;
  RETURN calls;
END
$fn$;

-- The index of the token closing the bracket opened at toks[open_at] (which must be an
-- opening parenthesis), or null when there is none.
CREATE FUNCTION "trellis"._closing_token(toks "trellis".grammar_token[], open_at int)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  n int := coalesce(array_length(toks, 1), 0);
  t int := open_at;
  depth int := 0;
BEGIN
  IF open_at > n OR NOT (toks[open_at].kind = 'punct' AND toks[open_at].text = '(') THEN
    RETURN NULL;
  END IF;
  WHILE t <= n LOOP
    IF toks[t].kind = 'punct' AND toks[t].text IN ('(', '[') THEN
      depth := depth + 1;
    ELSIF toks[t].kind = 'punct' AND toks[t].text IN (')', ']') THEN
      depth := depth - 1;
      IF depth = 0 THEN
        RETURN t;
      END IF;
    END IF;
    t := t + 1;
  END LOOP;
  RETURN NULL;
END
$fn$;

-- How one aggregate call (of _aggregate_calls) is kept by delta, or why it cannot be:
-- {kind, input_kind} or {why}. kind: count, sum_int (smallint/integer), sum_int8, avg_int,
-- sum_numeric, avg_numeric, min, max, bool_and, bool_or. input_kind: 'flag' (the input
-- stored per row is whether it counts), 'value' (the argument), 'none' (count(*)).
CREATE FUNCTION "trellis"._delta_kind(call jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  name text := call->>'name';
  arg text := call->>'argtype';
BEGIN
  IF NOT (call->>'builtin')::boolean THEN
    RETURN jsonb_build_object('why', 'a user-defined aggregate has no known inverse');
  ELSIF (call->>'kind') <> 'n' THEN
    RETURN jsonb_build_object('why', 'an ordered-set or hypothetical-set aggregate needs every row of the group');
  ELSIF (call->>'outer')::boolean THEN
    RETURN jsonb_build_object('why', 'an outer query''s aggregate');
  ELSIF (call->>'distinct')::boolean THEN
    RETURN jsonb_build_object('why', 'DISTINCT needs every row of the group');
  ELSIF (call->>'ordered')::boolean THEN
    RETURN jsonb_build_object('why', 'ORDER BY inside the aggregate needs every row of the group');
  ELSIF (call->>'variadic')::boolean THEN
    RETURN jsonb_build_object('why', 'a VARIADIC call');
  END IF;
  IF name = 'count' THEN
    RETURN jsonb_build_object('kind', 'count',
      'input_kind', CASE WHEN (call->>'star')::boolean AND NOT (call->>'filtered')::boolean THEN 'none' ELSE 'flag' END);
  ELSIF name IN ('sum', 'avg') AND arg IN ('smallint', 'integer') THEN
    RETURN jsonb_build_object('kind', name || '_int', 'input_kind', 'value');
  ELSIF name = 'sum' AND arg = 'bigint' THEN
    RETURN jsonb_build_object('kind', 'sum_int8', 'input_kind', 'value');
  ELSIF name = 'avg' AND arg = 'bigint' THEN
    RETURN jsonb_build_object('kind', 'avg_int', 'input_kind', 'value');
  ELSIF name IN ('sum', 'avg') AND arg = 'numeric' THEN
    RETURN jsonb_build_object('kind', name || '_numeric', 'input_kind', 'value');
  ELSIF name IN ('sum', 'avg') THEN
    RETURN jsonb_build_object('why', format(
      '%s of %s: a delta is not exact for this type (floating-point sums depend on the order rows are added in)', name, arg));
  ELSIF name IN ('min', 'max') THEN
    -- Only types whose equal values are the same value: otherwise which of two equal
    -- values a recompute shows (1.0 or 1.00) depends on the order it reads rows in.
    IF arg IN ('smallint', 'integer', 'bigint', 'oid', 'date',
               'timestamp without time zone', 'timestamp with time zone', 'time without time zone')
       OR (arg IN ('text') AND (call->>'deterministic')::boolean) THEN
      RETURN jsonb_build_object('kind', name, 'input_kind', 'value');
    END IF;
    RETURN jsonb_build_object('why', format(
      '%s of %s: equal values of this type can differ (1.0 and 1.00), so the extreme a recompute shows depends on row order', name, arg));
  ELSIF name IN ('bool_and', 'every') THEN
    RETURN jsonb_build_object('kind', 'bool_and', 'input_kind', 'value');
  ELSIF name = 'bool_or' THEN
    RETURN jsonb_build_object('kind', 'bool_or', 'input_kind', 'value');
  END IF;
  RETURN jsonb_build_object('why', format('%s has no known inverse', name));
END
$fn$;

-- Whether `expr` (with aggregate calls replaced by columns of `placeholders`,
-- [{name, type}]) reads nothing else: then it can be computed from group states alone.
CREATE FUNCTION "trellis"._reads_only(expr text, placeholders jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
  DROP VIEW IF EXISTS pg_temp.trellis_aggregates;
  EXECUTE 'CREATE TEMP VIEW trellis_aggregates AS SELECT (' || expr || ') FROM (SELECT '
    || coalesce((SELECT string_agg('NULL::' || (p->>'type') || ' AS ' || quote_ident(p->>'name'), ', ')
                   FROM jsonb_array_elements(placeholders) p), '')
    || ') ' || quote_ident('trellis#s');
  DROP VIEW pg_temp.trellis_aggregates;
  RETURN true;
EXCEPTION
  WHEN query_canceled OR lock_not_available THEN
    RAISE;
  WHEN OTHERS THEN
    RETURN false;
END
$fn$;

-- Whether two equal values of a GROUP BY item's type (and collation) are always written
-- the same way. Delta maintenance keeps a group's key as the group was first written: where
-- equal values can be written differently (numeric 1.0 and 1.00, float -0 and 0, citext,
-- a case-blind collation, intervals, jsonb), the group a recompute shows takes the image of
-- its rows, which only a group recompute reads. Allowed: the types below, their domains
-- and enums, with a deterministic collation.
CREATE FUNCTION "trellis"._equal_means_identical(type_name text, collation_name text)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE t(oid, typtype, typbasetype, depth) AS (
    SELECT ty.oid, ty.typtype, ty.typbasetype, 0 FROM pg_type ty WHERE ty.oid = to_regtype(type_name)
    UNION ALL
    SELECT ty.oid, ty.typtype, ty.typbasetype, t.depth + 1
      FROM pg_type ty JOIN t ON ty.oid = t.typbasetype WHERE t.typtype = 'd'),
  base AS (SELECT oid, typtype FROM t ORDER BY depth DESC LIMIT 1)
  SELECT coalesce((SELECT base.typtype = 'e'
                       OR base.oid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype,
                                       'boolean'::regtype, 'text'::regtype, 'character varying'::regtype,
                                       'name'::regtype, '"char"'::regtype, 'date'::regtype,
                                       'timestamp'::regtype, 'timestamptz'::regtype,
                                       'time'::regtype, 'uuid'::regtype, 'bytea'::regtype, 'oid'::regtype)
                     FROM base), false)
     AND (collation_name IS NULL
          OR coalesce((SELECT co.collisdeterministic FROM pg_collation co
                         JOIN pg_namespace cn ON cn.oid = co.collnamespace
                        WHERE quote_ident(cn.nspname) || '.' || quote_ident(co.collname) = collation_name
                           OR co.collname = collation_name
                        LIMIT 1), false))
$fn$;

-- How a transform's aggregates are maintained: by delta, or by recomputing each changed
-- group (ADR 0006). Returns null for a transform that does not aggregate, else
--   {mode: 'delta' | 'group', reason,
--    aggs: [{call, kind | null, delta (bool), why (null when delta), input (1-based index
--            into inputs, or null), type, collation, scale (a fixed display scale, or null)}],
--    inputs: [{expr, type, collation}]     -- key map columns i1.., one per distinct input
--    items: {column: expression over "trellis#a<n>"} -- each non-key column
--    having: expression over "trellis#a<n>" | null}
-- Expressions are those of the definition (the search_path in force resolves them).
CREATE FUNCTION "trellis"._classify_aggregates(spec jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  from_sql text := spec->>'from_sql';
  cross_sql text;
  group_list text;
  col jsonb;
  call jsonb;
  calls jsonb;
  kind jsonb;
  aggs jsonb := '[]';
  inputs jsonb := '[]';
  items jsonb := '{}';
  having_expr text;
  rewritten text;
  idx int;
  input_expr text;
  input_idx int;
  info jsonb;
  placeholders jsonb;
  reason text;
  mode text := 'delta';
  part text;
  exprs jsonb;
BEGIN
  IF NOT (spec->>'aggregates')::boolean THEN
    RETURN NULL;
  END IF;
  group_list := coalesce((SELECT string_agg(g->>'expr', ', ' ORDER BY o)
                          FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o)), '()');
  IF group_list = '' THEN
    group_list := '()';
  END IF;
  cross_sql := (SELECT string_agg((s->>'qualified') || ' AS ' || quote_ident(s->>'alias'), ', ' ORDER BY (s->>'ordinal')::int)
                  FROM jsonb_array_elements(spec->'sources') s);
  -- Every expression to rewrite: each non-key column, then HAVING.
  exprs := coalesce((SELECT jsonb_agg(jsonb_build_object('part', c->>'name', 'expr', c->>'expression') ORDER BY o)
                       FROM jsonb_array_elements(spec->'columns') WITH ORDINALITY AS x(c, o)
                      WHERE NOT (c->>'is_key')::boolean), '[]');
  IF spec->'ast'->>'having' IS NOT NULL THEN
    exprs := exprs || jsonb_build_array(jsonb_build_object('part', NULL, 'expr', spec->'ast'->>'having'));
  END IF;
  FOR col IN SELECT value FROM jsonb_array_elements(exprs) LOOP
    part := coalesce('column ' || quote_ident(col->>'part'), 'HAVING');
    calls := "trellis"._aggregate_calls(col->>'expr', from_sql, group_list);
    rewritten := col->>'expr';
    -- Right to left, so earlier positions stay valid.
    FOR call IN SELECT value FROM jsonb_array_elements(calls) ORDER BY (value->>'first')::int DESC LOOP
      kind := "trellis"._delta_kind(call);
      input_expr := NULL;
      input_idx := NULL;
      IF kind ? 'kind' AND kind->>'input_kind' <> 'none' THEN
        IF kind->>'input_kind' = 'flag' THEN
          input_expr := concat_ws(' AND ',
            CASE WHEN (call->>'filtered')::boolean THEN 'coalesce((' || (call->>'filter') || '), false)' END,
            CASE WHEN NOT (call->>'star')::boolean THEN '(' || (call->>'args') || ') IS NOT NULL' END);
          info := jsonb_build_object('columns', jsonb_build_array(jsonb_build_object('type', 'boolean')));
        ELSE
          input_expr := CASE WHEN (call->>'filtered')::boolean
                             THEN 'CASE WHEN (' || (call->>'filter') || ') THEN (' || (call->>'args') || ') END'
                             ELSE '(' || (call->>'args') || ')' END;
          -- Typed as the argument is (numeric(12,2) keeps its scale; a FILTER's CASE would not).
          info := "trellis"._analyze_query('SELECT (' || (call->>'args') || ') FROM ' || cross_sql,
            format('in %s (%s)', part, call->>'args'));
        END IF;
        SELECT o::int INTO input_idx FROM jsonb_array_elements(inputs) WITH ORDINALITY AS x(i, o)
         WHERE i->>'expr' = input_expr;
        IF input_idx IS NULL THEN
          inputs := inputs || jsonb_build_array(jsonb_build_object(
            'expr', input_expr,
            'type', info->'columns'->0->>'type',
            'collation', info->'columns'->0->'collation'));
          input_idx := jsonb_array_length(inputs);
        END IF;
      END IF;
      -- The same call twice (in two columns) is one aggregate.
      SELECT o::int INTO idx FROM jsonb_array_elements(aggs) WITH ORDINALITY AS x(a, o)
       WHERE a->>'fn' = call->>'fn' AND a->>'args' = call->>'args'
         AND a->>'filter' IS NOT DISTINCT FROM call->>'filter' AND a->>'star' = call->>'star';
      IF idx IS NULL THEN
        aggs := aggs || jsonb_build_array(jsonb_build_object(
          'call', substr(col->>'expr', (call->>'first')::int, (call->>'last')::int - (call->>'first')::int + 1),
          'fn', call->>'fn', 'args', call->>'args', 'filter', call->>'filter', 'star', call->>'star',
          'kind', kind->'kind', 'delta', kind ? 'kind', 'why', kind->'why',
          'input', input_idx, 'type', call->>'aggtype', 'collation', call->'collation',
          -- numeric(p,s) inputs all have display scale s: no need to track the largest.
          'scale', CASE WHEN kind->>'kind' IN ('sum_numeric', 'avg_numeric')
                        THEN (regexp_match(inputs->(input_idx - 1)->>'type', '^numeric\(\d+,(\d+)\)$'))[1]::int END));
        idx := jsonb_array_length(aggs);
      END IF;
      IF NOT (kind ? 'kind') AND reason IS NULL THEN
        reason := format('%s: %s', aggs->(idx - 1)->>'call', kind->>'why');
      END IF;
      rewritten := substr(rewritten, 1, (call->>'first')::int - 1)
        || quote_ident('trellis#a' || idx)
        || substr(rewritten, (call->>'last')::int + 1);
    END LOOP;
    IF col->>'part' IS NOT NULL THEN
      items := items || jsonb_build_object(col->>'part', rewritten);
    ELSE
      having_expr := rewritten;
    END IF;
  END LOOP;
  IF reason IS NULL THEN
    SELECT format('GROUP BY %s (%s): equal values of it can be written differently, and a group shows how its rows write it',
                  g->>'expr', concat_ws(' COLLATE ', g->>'type', g->>'collation'))
      INTO reason
      FROM jsonb_array_elements(coalesce(spec->'groups', '[]')) WITH ORDINALITY AS x(g, o)
     WHERE NOT "trellis"._equal_means_identical(g->>'type', g->>'collation')
     ORDER BY o LIMIT 1;
  END IF;
  IF reason IS NULL THEN
    placeholders := coalesce((SELECT jsonb_agg(jsonb_build_object('name', 'trellis#a' || o, 'type', a->>'type'))
                                FROM jsonb_array_elements(aggs) WITH ORDINALITY AS x(a, o)), '[]');
    FOR col IN SELECT value FROM jsonb_array_elements(exprs) LOOP
      rewritten := coalesce(items->>(col->>'part'), having_expr);
      IF NOT "trellis"._reads_only(rewritten, placeholders) THEN
        reason := format('%s reads columns outside its aggregates', coalesce('column ' || quote_ident(col->>'part'), 'HAVING'));
        EXIT;
      END IF;
    END LOOP;
  END IF;
  IF reason IS NOT NULL THEN
    mode := 'group';
  END IF;
  RETURN jsonb_build_object(
    'mode', mode,
    'reason', coalesce(reason, CASE WHEN jsonb_array_length(aggs) = 0
                                    THEN 'no aggregates: each group is its key'
                                    ELSE 'every aggregate has an exact delta' END),
    'aggs', aggs, 'inputs', inputs, 'items', items, 'having', having_expr);
END
$fn$;

-- As before (0009), and for a transform whose aggregates are kept by delta: the key map
-- carries each join row's aggregate inputs, is made for a grand total too, and is indexed
-- by group where an extreme may have to be read again; the group state table is created.
-- The classification is recorded in transforms.delta (and spec.key_map follows it).
CREATE OR REPLACE FUNCTION "trellis"._create_key_map(transform_id int, spec jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM "trellis"._make_key_map(transform_id, spec, "trellis"._classify_aggregates(spec));
END
$fn$;

-- The key map (and, kept by delta, the group state table) of a transform, as
-- `classified` (_classify_aggregates) says; records the classification.
CREATE FUNCTION "trellis"._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  map_sql text := quote_ident('trellis') || '.' || quote_ident('map_' || transform_id);
  state_sql text := quote_ident('trellis') || '.' || quote_ident('groups_' || transform_id);
  kind text := "trellis"._key_map_kind(spec);
  is_delta boolean;
  src jsonb;
  groups text;
BEGIN
  is_delta := classified->>'mode' = 'delta';
  IF is_delta THEN
    kind := 'groups';
  END IF;
  UPDATE "trellis".transforms t
     SET delta = classified,
         spec = t.spec || jsonb_build_object('key_map', kind)
   WHERE t.id = transform_id;
  -- A group state table left by a transform of the same id in a dumped database.
  EXECUTE 'DROP TABLE IF EXISTS ' || state_sql;
  IF kind IS NULL THEN
    RETURN;
  END IF;
  EXECUTE 'CREATE TABLE ' || map_sql || ' (' || (
    SELECT string_agg(col, ', ' ORDER BY o1, o2) FROM (
      SELECT (s->>'ordinal')::int AS o1, k.o AS o2,
             quote_ident(format('k%s_%s', s->>'ordinal', k.o)) || ' ' || k.t AS col
        FROM jsonb_array_elements(spec->'sources') s,
             jsonb_array_elements_text(s->'key_types') WITH ORDINALITY AS k(t, o)
      UNION ALL
      SELECT 1000000, g.o, quote_ident(format('g%s', g.o)) || ' ' || (g.v->>'type')
                            || coalesce(' COLLATE ' || (g.v->>'collation'), '')
        FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS g(v, o)
      UNION ALL
      SELECT 2000000, 0, 'passes boolean NOT NULL' WHERE kind = 'groups'
      UNION ALL
      SELECT 3000000, i.o, quote_ident(format('i%s', i.o)) || ' ' || (i.v->>'type')
                            || coalesce(' COLLATE ' || (i.v->>'collation'), '')
        FROM jsonb_array_elements(CASE WHEN is_delta THEN classified->'inputs' ELSE '[]' END)
             WITH ORDINALITY AS i(v, o)) c) || ')';
  FOR src IN SELECT value FROM jsonb_array_elements(spec->'sources') LOOP
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || (
      SELECT string_agg(quote_ident(format('k%s_%s', src->>'ordinal', k.o)), ', ' ORDER BY k.o)
        FROM jsonb_array_elements_text(src->'key_types') WITH ORDINALITY AS k(t, o)) || ')';
  END LOOP;
  IF NOT is_delta THEN
    RETURN;
  END IF;
  groups := (SELECT string_agg(quote_ident('g' || o), ', ' ORDER BY o)
               FROM jsonb_array_elements(spec->'groups') WITH ORDINALITY AS x(g, o));
  -- A rescan reads a group's rows from the key map.
  IF groups IS NOT NULL AND EXISTS (
       SELECT 1 FROM jsonb_array_elements(classified->'aggs') a
        WHERE a->>'kind' IN ('min', 'max')
           OR (a->>'kind' IN ('sum_numeric', 'avg_numeric') AND a->>'scale' IS NULL)) THEN
    EXECUTE 'CREATE INDEX ON ' || map_sql || ' (' || groups || ')';
  END IF;
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

-- A join with a WHERE keeps a 'rows' key map only when a LEFT JOIN can turn a row the
-- WHERE filtered out into a NULL-extended row that passes: an inner join's old rows are
-- the target's, as without a WHERE. (Maps made before stay, and keep working.)
CREATE OR REPLACE FUNCTION "trellis"._key_map_kind(spec jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN jsonb_array_length(coalesce(spec->'groups', '[]')) > 0 THEN 'groups'
    WHEN jsonb_array_length(spec->'sources') > 1 AND spec->'ast'->>'where' IS NOT NULL
         AND EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left')
      THEN 'rows'
  END
$fn$;

-- A transform's group state table goes with it.
CREATE FUNCTION "trellis"._drop_group_states()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('groups_' || OLD.id);
  RETURN NULL;
END
$fn$;

CREATE TRIGGER drop_group_states AFTER DELETE ON "trellis".transforms
  FOR EACH ROW EXECUTE FUNCTION "trellis"._drop_group_states();


-- ALTER ... ADD COLUMN: as before (0009), and an aggregating transform's key map and group
-- states are made again for the new column.
CREATE OR REPLACE FUNCTION "trellis"._alter_add_column(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms := "trellis"._transform_named(ast);
  new_ast jsonb;
  spec jsonb;
  col jsonb;
BEGIN
  IF EXISTS (SELECT 1 FROM "trellis".transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'name') THEN
    PERFORM "trellis"._fail('TRV01', format('transform %I already has a column %I', t.target_name, ast->>'name'));
  END IF;
  new_ast := jsonb_set(t.spec->'ast', '{select}', (t.spec->'ast'->'select') || jsonb_build_array(
    jsonb_build_object('expr', ast->>'expr', 'name', ast->>'name', 'bare_label', NULL,
                       'label_expr', NULL, 'position', NULL)));
  spec := "trellis"._analyze_transform(new_ast);
  IF (spec->>'aggregates')::boolean <> t.aggregates THEN
    PERFORM "trellis"._fail('TRV01', format(
      'column %I would make transform %I %s: define a new transform instead', ast->>'name', t.target_name,
      CASE WHEN t.aggregates THEN 'stop aggregating' ELSE 'aggregate' END));
  END IF;
  IF "trellis"._check_definition(spec) AND NOT coalesce((t.spec->>'whole_row')::boolean, false) THEN
    UPDATE "trellis".transforms SET spec = spec || '{"whole_row": true}' WHERE id = t.id;
  END IF;
  SELECT c INTO col FROM jsonb_array_elements(spec->'columns') c WHERE c->>'name' = ast->>'name';
  BEGIN
    EXECUTE 'ALTER TABLE ' || t.target_oid::regclass::text || ' ADD COLUMN ' || quote_ident(col->>'name')
      || ' ' || (col->>'type') || coalesce(' COLLATE ' || (col->>'collation'), '');
  EXCEPTION WHEN program_limit_exceeded THEN
    -- Tables can have at most 1600 columns.
    PERFORM "trellis"._fail('TRV01', format('column %I cannot be added to %I: %s', col->>'name', t.target_name, SQLERRM));
  END;
  INSERT INTO "trellis".transform_columns (transform_id, ordinal, name, expression, type,
                                          collation_name, is_key, implicit, reads)
  VALUES (t.id, (SELECT max(ordinal) + 1 FROM "trellis".transform_columns WHERE transform_id = t.id),
          col->>'name', col->>'expression', col->>'type', col->>'collation', false, false, col->'reads');
  -- Sources may now be read in more columns.
  UPDATE "trellis".transform_sources s
     SET read_columns = ARRAY(SELECT jsonb_array_elements_text(n->'read_columns'))::name[]
    FROM jsonb_array_elements(spec->'sources') n
   WHERE s.transform_id = t.id AND s.ordinal = (n->>'ordinal')::int;
  PERFORM "trellis"._record_read_attrs(t.id);
  PERFORM "trellis"._restate(t, new_ast);
  -- The new column's aggregates may need inputs in the key map, states of their own, or
  -- another way of maintenance: both are made again (the rebuild fills them).
  IF t.aggregates THEN
    EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
    PERFORM "trellis"._create_key_map(t.id, spec);
  END IF;
  PERFORM "trellis"._request_rebuild(t.id);
  RETURN jsonb_build_object('kind', 'altered', 'target', t.target_name);
END
$fn$;

-- Transforms defined before this migration keep their key maps and the group recompute
-- until their next build: their classification is recorded as pending, and the build
-- switches them (_switch_to_delta) — converting a live target in place would be a
-- rebuild's work inside this migration. Classified under the search_path each was
-- defined with.
DO $migrate$
DECLARE
  t record;
  old_path text := current_setting('search_path');
  classified jsonb;
BEGIN
  FOR t IN SELECT * FROM "trellis".transforms WHERE aggregates LOOP
    PERFORM set_config('search_path', t.search_path, true);
    BEGIN
      -- Analysed again: a spec's columns are not updated by ALTER ... ADD COLUMN.
      classified := "trellis"._classify_aggregates("trellis"._analyze_transform(t.spec->'ast'));
    EXCEPTION WHEN OTHERS THEN
      -- A definition its sources no longer hold: it stays as it is (RESUME rebinds it).
      classified := NULL;
    END;
    PERFORM set_config('search_path', old_path, true);
    IF classified->>'mode' = 'delta' THEN
      classified := classified || '{"pending": true}';
    END IF;
    UPDATE "trellis".transforms SET delta = classified WHERE id = t.id;
  END LOOP;
END
$migrate$;

-- At the start of a build: a transform whose classification is pending (see above) gets
-- its key map and group state table made for delta maintenance, empty for the build to
-- fill. Returns whether it switched.
CREATE FUNCTION "trellis"._switch_to_delta(transform_id int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  t "trellis".transforms;
BEGIN
  SELECT * INTO t FROM "trellis".transforms x WHERE x.id = transform_id;
  IF NOT coalesce((t.delta->>'pending')::boolean, false) THEN
    RETURN false;
  END IF;
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident('trellis') || '.' || quote_ident('map_' || t.id);
  PERFORM "trellis"._make_key_map(t.id, t.spec, t.delta - 'pending');
  UPDATE "trellis".transforms SET updated_at = now() WHERE id = t.id;
  -- What applying ranges cost it by group recompute says nothing of delta.
  UPDATE "trellis".pipeline SET apply_costs = NULL WHERE pipeline.transform_id = t.id;
  RETURN true;
END
$fn$;

-- As in 0025, and lastApply carries the estimates the choice was made by.
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
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
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
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
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
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        -- A build filling chunks (0022): what its chunks left to fill do not hold.
        'keysDone', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                         THEN greatest(p.backfill_total - (
                                SELECT coalesce(sum(c.rows), 0) FROM "trellis".build_chunks c
                                 WHERE c.transform_id = t.id), 0)
                         ELSE p.backfill_done END,
        'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id),
    'rowSecurity', "trellis"._row_security(t.id),
    'lastApply', CASE WHEN p.apply_mode IS NOT NULL THEN jsonb_build_object(
        'mode', p.apply_mode, 'reason', p.apply_reason, 'keys', p.apply_keys, 'at', p.apply_at,
        'estimate', p.apply_estimate) END,
    -- 0025: the workers' health, what stops the pipeline, and what this transform waits on.
    'workers', health,
    'workerFailure', "trellis"._worker_failure(health),
    'waitingOn', "trellis"._waiting_on(t.id, lifecycle, wait, health, coalesce(lag_segments, 0),
                                      upstream_behind OR jsonb_array_length(paused_upstream) > 0));
END
$fn$;

-- How a transform is kept up to date when its sources change (the handle's Maintenance):
--   {mode: 'rows' | 'delta' | 'group', reason,
--    aggregates: [{call, how: 'delta' | 'delta+rescan' | 'recompute', why}]}
CREATE FUNCTION "trellis"._maintenance(aggregates boolean, delta jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE
    WHEN NOT aggregates THEN jsonb_build_object(
      'mode', 'rows', 'reason', 'each changed key''s target rows are re-derived', 'aggregates', '[]'::jsonb)
    WHEN delta IS NULL THEN jsonb_build_object(
      'mode', 'group', 'reason', 'each changed group is recomputed from its rows', 'aggregates', '[]'::jsonb)
    ELSE (
      WITH d AS (
        SELECT delta->>'mode' = 'delta' AND NOT coalesce((delta->>'pending')::boolean, false) AS kept)
      SELECT jsonb_build_object(
        'mode', CASE WHEN d.kept THEN 'delta' ELSE 'group' END,
        'reason', CASE WHEN coalesce((delta->>'pending')::boolean, false)
                       THEN (delta->>'reason') || ': kept by delta from its next build (defined before trellis-pg kept aggregates by delta; requestBackfill() rebuilds it)'
                       ELSE delta->>'reason' END,
        'aggregates', coalesce((
          SELECT jsonb_agg(jsonb_build_object(
                   'call', a->>'call',
                   'how', CASE WHEN NOT d.kept THEN 'recompute'
                               WHEN a->>'kind' IN ('min', 'max')
                                    OR (a->>'kind' IN ('sum_numeric', 'avg_numeric') AND a->>'scale' IS NULL)
                               THEN 'delta+rescan'
                               ELSE 'delta' END,
                   'why', coalesce(a->>'why', CASE WHEN NOT d.kept THEN
                     format('another part of the definition needs the group''s rows (%s)', delta->>'reason') END))
                 ORDER BY o)
            FROM jsonb_array_elements(delta->'aggs') WITH ORDINALITY AS x(a, o)), '[]'))
        FROM d)
  END
$fn$;

-- Every registered transform (the handle's Definition), as in 0024, with how it is kept
-- (maintenance).
CREATE OR REPLACE FUNCTION "trellis".definitions()
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
               FROM "trellis".transform_sources s WHERE s.transform_id = t.id), '[]'),
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM "trellis".transform_columns c WHERE c.transform_id = t.id), '[]'),
           'options', jsonb_build_object(
             'withoutSourceIndex', t.without_source_index,
             'withoutRowSecurity', coalesce((t.spec->'ast'->>'without_row_security')::boolean, false)),
           'settings', t.settings,
           'aggregates', t.aggregates,
           'maintenance', "trellis"._maintenance(t.aggregates, t.delta),
           'createdAt', t.created_at,
           'updatedAt', t.updated_at)
    FROM "trellis".transforms t
   ORDER BY t.target_name
$fn$;
$trellis_m26$;
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
