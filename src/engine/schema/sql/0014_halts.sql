-- Halts (issue #9, ADR 0010): a target changed outside Trellis so the drain cannot keep it
-- (dropped, a column of it dropped, renamed or retyped, its key or its guard trigger
-- removed). The transform stops (captureFailure kind 'halt') with a sentence saying what
-- happened; RESUME repairs what it can and rebuilds, or refuses saying what to do.

-- Every live problem with a transform's target, one row per transform: the first problem
-- as a sentence (and how many more), and the target columns involved.
CREATE FUNCTION @schema@._target_problems()
RETURNS TABLE (transform_id int, error text, columns text[]) LANGUAGE sql STABLE AS $fn$
  WITH targets AS (
    SELECT t.id, t.target_oid, t.target_schema, t.target_name,
           quote_ident(t.target_schema) || '.' || quote_ident(t.target_name) AS display,
           EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.target_oid) AS present,
           p.deferred_ddl IS NOT NULL AS building
      FROM @schema@.transforms t JOIN @schema@.pipeline p ON p.transform_id = t.id
     WHERE t.capture_failure IS NULL),
  problems AS (
    SELECT id, 1 AS o, format('the target %s was dropped', display) AS error, NULL::text AS col
      FROM targets WHERE NOT present
    UNION ALL
    SELECT tg.id, 2,
           CASE WHEN a.attname IS NULL THEN format('column %I of the target %s was dropped or renamed', c.name, tg.display)
                ELSE format('column %I of the target %s changed type from %s to %s', c.name, tg.display,
                            c.type, format_type(a.atttypid, a.atttypmod)) END,
           c.name::text
      FROM targets tg
      JOIN @schema@.transform_columns c ON c.transform_id = tg.id
      LEFT JOIN pg_attribute a ON a.attrelid = tg.target_oid AND a.attname = c.name
                              AND a.attnum > 0 AND NOT a.attisdropped
     WHERE tg.present
       AND (a.attname IS NULL OR format_type(a.atttypid, a.atttypmod) <> c.type)
    UNION ALL
    SELECT id, 3, format('the guard trigger on the target %s was dropped or disabled (the app may have written it)', display), NULL
      FROM targets tg
     WHERE present AND NOT EXISTS (SELECT 1 FROM pg_trigger g
                                    WHERE g.tgrelid = tg.target_oid AND g.tgname = 'trellis_guard' AND g.tgenabled = 'A')
    UNION ALL
    SELECT id, 4, format('the key of the target %s was dropped', display), NULL
      FROM targets tg
     WHERE present AND NOT building
       AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = tg.target_oid AND (x.indisprimary OR x.indisunique)))
  SELECT id,
         (array_agg(error ORDER BY o, error))[1]
           || CASE WHEN count(*) > 1 THEN format(' (and %s more)', count(*) - 1) ELSE '' END,
         coalesce(array_agg(DISTINCT col) FILTER (WHERE col IS NOT NULL), '{}')
    FROM problems GROUP BY id
$fn$;

-- RESUME of a halted transform: the target is made again if it was dropped; a column
-- dropped from it, its key or its guard trigger is added back; a column renamed or
-- retyped is refused (the app's objects may use it as it is now): rename or alter it
-- back, or DROP TRANSFORM and define it again. The rebuild then fills the target.
CREATE FUNCTION @schema@._repair_target(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  qualified text := quote_ident(t.target_schema) || '.' || quote_ident(t.target_name);
  c @schema@.transform_columns;
  a record;
  keys text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = t.target_oid) THEN
    IF to_regclass(qualified) IS NOT NULL THEN
      PERFORM @schema@._fail('TRC01', format(
        'transform %I cannot resume: its target was dropped, and %s is now another table: drop or rename that table, or DROP TRANSFORM',
        t.target_name, qualified));
    END IF;
    UPDATE @schema@.transforms
       SET target_oid = @schema@._create_target(t.target_schema, t.target_name, t.spec), capture_failure = NULL
     WHERE id = t.id;
    RETURN;
  END IF;
  FOR c IN SELECT * FROM @schema@.transform_columns x WHERE x.transform_id = t.id ORDER BY x.ordinal LOOP
    SELECT attname, format_type(atttypid, atttypmod) AS type INTO a
      FROM pg_attribute WHERE attrelid = t.target_oid AND attname = c.name AND attnum > 0 AND NOT attisdropped;
    IF NOT FOUND THEN
      IF EXISTS (SELECT 1 FROM pg_attribute p WHERE p.attrelid = t.target_oid AND p.attnum > 0
                   AND NOT p.attisdropped
                   AND NOT EXISTS (SELECT 1 FROM @schema@.transform_columns y
                                    WHERE y.transform_id = t.id AND y.name = p.attname)) THEN
        PERFORM @schema@._fail('TRC01', format(
          'transform %I cannot resume: column %I of its target is missing, and the target has columns Trellis did not make (was it renamed?): rename it back to %I, or DROP TRANSFORM and define it again',
          t.target_name, c.name, c.name));
      END IF;
      EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s%s', qualified, c.name, c.type,
                     coalesce(' COLLATE ' || c.collation_name, ''));
    ELSIF a.type <> c.type THEN
      PERFORM @schema@._fail('TRC01', format(
        'transform %I cannot resume: column %I of its target is %s, not %s: alter it back, or DROP TRANSFORM and define it again',
        t.target_name, c.name, a.type, c.type));
    END IF;
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = t.target_oid AND (x.indisprimary OR x.indisunique)) THEN
    keys := (SELECT string_agg(quote_ident(k), ', ') FROM jsonb_array_elements_text(t.spec->'key') k);
    -- The rebuild empties the target first: the key can be added at once. (As Trellis:
    -- the guard, if it is there, lets only Trellis write.)
    PERFORM set_config('trellis.maintaining', @schema_literal@, true);
    EXECUTE 'TRUNCATE ' || qualified;
    IF keys IS NULL THEN
      EXECUTE 'CREATE UNIQUE INDEX ON ' || qualified || ' ((true))';
    ELSIF (t.spec->>'key_nullable')::boolean THEN
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD UNIQUE NULLS NOT DISTINCT (' || keys || ')';
    ELSE
      EXECUTE 'ALTER TABLE ' || qualified || ' ADD PRIMARY KEY (' || keys || ')';
    END IF;
  END IF;
  EXECUTE 'DROP TRIGGER IF EXISTS trellis_guard ON ' || qualified;
  EXECUTE 'CREATE TRIGGER trellis_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON '
    || qualified || ' FOR EACH STATEMENT EXECUTE FUNCTION @schema@.guard_target()';
  EXECUTE 'ALTER TABLE ' || qualified || ' ENABLE ALWAYS TRIGGER trellis_guard';
  UPDATE @schema@.transforms SET capture_failure = NULL WHERE id = t.id;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@._resume_stopped(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF t.capture_failure->>'kind' = 'halt' THEN
    PERFORM @schema@._repair_target(t);
  ELSE
    PERFORM @schema@._rebind(t);
  END IF;
END
$fn$;
