-- Source changes that keep a definition valid are followed, not stopped (issue #25 item 2,
-- ADR 0047): a read column renamed (key columns included) or retyped to a type the
-- definition still accepts. The staging worker rebinds the definition to the table as it
-- is (_follow_source_columns, on its reconcile pass, before it stops what cannot be
-- followed), adjusts the target's columns in place (ALTER TABLE: a type, or the name of a
-- key column the engine named after the source's), and then re-derives the whole target in
-- one transaction (src/engine/staging/follow-refill.ts). Meanwhile the drain leaves the
-- transform alone (follow_pending): the ranges it would read may hold "any row changed"
-- rows capture wrote while its triggers named the old column, which the re-derivation
-- covers.

-- Set by _follow_source_columns, cleared once the target is re-derived.
ALTER TABLE @schema@.pipeline ADD COLUMN follow_pending boolean NOT NULL DEFAULT false;

-- `expr` with every reference to column `old_name` of the source aliased `alias` written
-- as `new_name`: an unqualified name, or one qualified by that alias; not a function's
-- name (followed by "("), nor a qualifier (followed by "."), nor a string's text. The
-- caller checks that the result reads the same columns as before (by attnum): a name this
-- got wrong cannot pass unseen.
CREATE FUNCTION @schema@._rename_in_expression(expr text, alias text, old_name text, new_name text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  toks @schema@.grammar_token[];
  n int;
  i int;
  out text := '';
  last int := 1;
  tok @schema@.grammar_token;
  qualified_by text;
BEGIN
  IF expr IS NULL THEN
    RETURN NULL;
  END IF;
  toks := @schema@.grammar_tokenize(expr);
  n := coalesce(array_length(toks, 1), 0);
  FOR i IN 1 .. n LOOP
    tok := toks[i];
    CONTINUE WHEN tok.kind NOT IN ('word', 'ident', 'uident') OR tok.value IS DISTINCT FROM old_name;
    CONTINUE WHEN i < n AND toks[i + 1].kind = 'punct' AND toks[i + 1].text IN ('(', '.');
    qualified_by := NULL;
    IF i > 1 AND toks[i - 1].kind = 'punct' AND toks[i - 1].text = '.' THEN
      -- schema.table.column, or (row).field: left alone.
      CONTINUE WHEN i < 3 OR toks[i - 2].kind NOT IN ('word', 'ident', 'uident')
                    OR (i > 3 AND toks[i - 3].kind = 'punct' AND toks[i - 3].text = '.');
      qualified_by := toks[i - 2].value;
      CONTINUE WHEN qualified_by IS DISTINCT FROM alias;
    END IF;
    out := out || substr(expr, last, tok.pos - last) || quote_ident(new_name);
    last := tok.pos + char_length(tok.text);
  END LOOP;
  RETURN out || substr(expr, last);
END
$fn$;

-- The statement's AST with column `old_name` of source `ordinal` renamed `new_name` in
-- every expression: SELECT items (their names stay: the target's columns keep theirs), ON,
-- WHERE, GROUP BY, HAVING.
CREATE FUNCTION @schema@._rename_in_ast(ast jsonb, ordinal int, old_name text, new_name text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  src jsonb := CASE WHEN ordinal = 0 THEN ast->'from' ELSE ast->'joins'->(ordinal - 1) END;
  alias text := coalesce(src->>'alias', src->>'name');
  j int;
BEGIN
  ast := jsonb_set(ast, '{select}', coalesce((
    SELECT jsonb_agg(jsonb_set(s, '{expr}', to_jsonb(@schema@._rename_in_expression(s->>'expr', alias, old_name, new_name)))
                     ORDER BY o)
      FROM jsonb_array_elements(ast->'select') WITH ORDINALITY AS x(s, o)), '[]'));
  IF ast->>'where' IS NOT NULL THEN
    ast := jsonb_set(ast, '{where}', to_jsonb(@schema@._rename_in_expression(ast->>'where', alias, old_name, new_name)));
  END IF;
  IF ast->>'having' IS NOT NULL THEN
    ast := jsonb_set(ast, '{having}', to_jsonb(@schema@._rename_in_expression(ast->>'having', alias, old_name, new_name)));
  END IF;
  IF jsonb_array_length(coalesce(ast->'group_by', '[]')) > 0 THEN
    ast := jsonb_set(ast, '{group_by}', (
      SELECT jsonb_agg(to_jsonb(@schema@._rename_in_expression(g, alias, old_name, new_name)) ORDER BY o)
        FROM jsonb_array_elements_text(ast->'group_by') WITH ORDINALITY AS x(g, o)));
  END IF;
  FOR j IN 0 .. jsonb_array_length(coalesce(ast->'joins', '[]')) - 1 LOOP
    IF ast->'joins'->j->>'on' IS NOT NULL THEN
      ast := jsonb_set(ast, ARRAY['joins', j::text, 'on'],
                       to_jsonb(@schema@._rename_in_expression(ast->'joins'->j->>'on', alias, old_name, new_name)));
    END IF;
  END LOOP;
  RETURN ast;
END
$fn$;

-- The attnums a spec's source `ordinal` reads, as the table is now.
CREATE FUNCTION @schema@._read_attnums(spec jsonb, ordinal int)
RETURNS int[] LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(array_agg(a.attnum::int ORDER BY a.attnum), '{}')
    FROM jsonb_array_elements(spec->'sources') s
    JOIN pg_attribute a ON a.attrelid = (s->>'oid')::oid AND NOT a.attisdropped
   WHERE (s->>'ordinal')::int = ordinal
     AND a.attname IN (SELECT jsonb_array_elements_text(s->'read_columns'))
$fn$;

-- Follows one transform's read columns renamed or retyped, or raises (TRV01, with why)
-- when it cannot: the definition, its reads renamed, must still bind (under its
-- search_path and settings), read the very same columns, keep its key and aggregation,
-- and give the same columns but for types (and a key column's name) the target can be
-- altered to. The target is altered in place; the key map is made again by the refill.
CREATE FUNCTION @schema@._follow_transform(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  old_path text := current_setting('search_path');
  previous jsonb;
  new_ast jsonb := t.spec->'ast';
  new_spec jsonb;
  r record;
  target_sql text := t.target_oid::regclass::text;
BEGIN
  FOR r IN
    SELECT ts.ordinal, x->>'name' AS old_name, a.attname::text AS new_name
      FROM @schema@.transform_sources ts
      CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) x
      JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (x->>'attnum')::int
     WHERE ts.transform_id = t.id AND NOT a.attisdropped AND a.attname <> x->>'name'
     ORDER BY ts.ordinal, a.attnum
  LOOP
    new_ast := @schema@._rename_in_ast(new_ast, r.ordinal, r.old_name, r.new_name);
  END LOOP;
  PERFORM set_config('search_path', t.search_path, true);
  previous := @schema@._enter_settings(t.settings);
  BEGIN
    new_spec := @schema@._analyze_transform(new_ast);
    new_spec := jsonb_set(new_spec, '{ast,target}', t.spec->'ast'->'target');
    new_spec := new_spec || jsonb_build_object(
      'whole_row', @schema@._check_definition(new_spec),
      'key_map', @schema@._key_map_kind(new_spec));
  EXCEPTION WHEN OTHERS THEN
    PERFORM set_config('search_path', old_path, true);
    PERFORM @schema@._leave_settings(previous);
    PERFORM @schema@._fail('TRV01', format('its definition no longer holds (%s)', SQLERRM));
  END;
  PERFORM set_config('search_path', old_path, true);
  PERFORM @schema@._leave_settings(previous);

  IF (new_spec->>'aggregates')::boolean IS DISTINCT FROM t.aggregates THEN
    PERFORM @schema@._fail('TRV01', 'it would change whether the definition aggregates');
  END IF;
  -- The same columns read, and the same key, by attnum.
  FOR r IN SELECT ts.ordinal, ts.read_attrs, ts.key_columns FROM @schema@.transform_sources ts
            WHERE ts.transform_id = t.id LOOP
    IF @schema@._read_attnums(new_spec, r.ordinal) IS DISTINCT FROM
       ARRAY(SELECT (x->>'attnum')::int FROM jsonb_array_elements(r.read_attrs) x ORDER BY (x->>'attnum')::int) THEN
      PERFORM @schema@._fail('TRV01', 'the definition would read other columns than it did');
    END IF;
  END LOOP;
  -- The target's columns, one for one: the same names (but a key column the engine named
  -- after a source's, which follows it), the same key, collations; types may change.
  FOR r IN
    SELECT c.ordinal, c.name AS old_name, c.type AS old_type, c.is_key, c.implicit, c.collation_name,
           n->>'name' AS new_name, n->>'type' AS new_type, (n->>'is_key')::boolean AS new_key,
           (n->>'implicit')::boolean AS new_implicit, n->>'collation' AS new_collation
      FROM @schema@.transform_columns c
      FULL JOIN (SELECT n, o FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(n, o)) x
        ON x.o - 1 = c.ordinal AND c.transform_id = t.id
     WHERE c.transform_id = t.id OR c.transform_id IS NULL
     ORDER BY coalesce(c.ordinal, x.o - 1)
  LOOP
    IF r.old_name IS NULL OR r.new_name IS NULL OR r.is_key IS DISTINCT FROM r.new_key
       OR r.implicit IS DISTINCT FROM r.new_implicit
       OR r.collation_name IS DISTINCT FROM r.new_collation
       OR (r.old_name <> r.new_name AND NOT r.implicit) THEN
      PERFORM @schema@._fail('TRV01', format('its target''s columns would change (%s %s)',
        coalesce(r.old_name, r.new_name), coalesce(r.new_type, r.old_type)));
    END IF;
    IF r.old_name <> r.new_name THEN
      EXECUTE format('ALTER TABLE %s RENAME COLUMN %I TO %I', target_sql, r.old_name, r.new_name);
    END IF;
    IF r.old_type <> r.new_type THEN
      -- Values are converted as they are; the refill then writes them as the definition gives them.
      EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING %I::%s',
                     target_sql, r.new_name, r.new_type, r.new_name, r.new_type);
    END IF;
    UPDATE @schema@.transform_columns c
       SET name = r.new_name, type = r.new_type, expression = n->>'expression', reads = n->'reads'
      FROM jsonb_array_elements(new_spec->'columns') WITH ORDINALITY AS x(n, o)
     WHERE c.transform_id = t.id AND c.ordinal = r.ordinal AND x.o - 1 = r.ordinal;
  END LOOP;
  UPDATE @schema@.transforms
     SET spec = new_spec, statement = @schema@.render_statement(new_spec->'ast'), updated_at = now()
   WHERE id = t.id;
  PERFORM @schema@._register(t.id, new_spec);
  PERFORM @schema@._record_read_attrs(t.id);
  UPDATE @schema@.pipeline SET follow_pending = true, updated_at = now() WHERE transform_id = t.id;
END
$fn$;

-- Every transform running whose read columns were renamed or retyped, and nothing else
-- changed about its sources that stops it, is followed (see _follow_transform); the
-- others are left to the staging worker's stop (ADR 0008's table says which). Returns
-- each transform looked at, and why it could not be followed (NULL when it was).
CREATE FUNCTION @schema@._follow_source_columns()
RETURNS TABLE (target text, refused text) LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms;
BEGIN
  FOR t IN
    SELECT x.* FROM @schema@.transforms x
     WHERE x.capture_failure IS NULL AND x.paused_at IS NULL
       AND EXISTS (
         SELECT 1 FROM @schema@.transform_sources ts
           CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) r
           JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (r->>'attnum')::int
          WHERE ts.transform_id = x.id AND NOT a.attisdropped
            AND (a.attname <> r->>'name' OR format_type(a.atttypid, a.atttypmod) <> r->>'type'))
       -- Nothing about its sources that stops it: every read column there, every source
       -- there with its key's columns (by attnum), and no column added to one it reads
       -- whole (its rows' JSON would change shape).
       AND NOT EXISTS (
         SELECT 1 FROM @schema@.transform_sources ts
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
    target := t.target_name;
    BEGIN
      -- Locks in the drain's order (page slots, pipeline row, target, catalog row): the
      -- drain applying a range to this target finishes first, and none starts meanwhile.
      PERFORM 1 FROM @schema@.page_slots s WHERE s.transform_id = t.id ORDER BY s.bucket FOR UPDATE;
      PERFORM 1 FROM @schema@.pipeline p WHERE p.transform_id = t.id FOR UPDATE;
      EXECUTE 'LOCK TABLE ' || t.target_oid::regclass::text || ' IN ACCESS EXCLUSIVE MODE';
      SELECT x.* INTO t FROM @schema@.transforms x WHERE x.id = t.id FOR UPDATE;
      IF t.capture_failure IS NOT NULL OR t.paused_at IS NOT NULL THEN
        CONTINUE;
      END IF;
      PERFORM @schema@._follow_transform(t);
      refused := NULL;
    EXCEPTION WHEN OTHERS THEN
      refused := SQLERRM;
    END;
    RETURN NEXT;
  END LOOP;
END
$fn$;

-- The refill's first step, in its transaction: the key map (and group states) made again
-- for the definition as followed (key and group types may have changed), empty for the
-- refill to fill.
CREATE FUNCTION @schema@._follow_remap(transform_id int)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  spec jsonb := (SELECT t.spec FROM @schema@.transforms t WHERE t.id = transform_id);
BEGIN
  EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(@schema_literal@) || '.' || quote_ident('map_' || transform_id);
  PERFORM @schema@._create_key_map(transform_id, spec);
  UPDATE @schema@.transforms t SET updated_at = now() WHERE t.id = transform_id;
  UPDATE @schema@.pipeline p SET apply_costs = NULL WHERE p.transform_id = _follow_remap.transform_id;
END
$fn$;
