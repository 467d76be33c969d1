-- EXPLAIN TRANSFORM <statement> (issue #26, item 2; ADR 0059's explain(), now before a
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
CREATE FUNCTION @schema@._explain_state(t @schema@.transforms)
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
CREATE FUNCTION @schema@._explain_parts(root int)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(jsonb_agg(p ORDER BY (p->>'id')::int = root, (p->>'id')::int), '[]')
    FROM (
      SELECT jsonb_build_object(
        'id', t.id,
        'name', CASE WHEN t.id = root THEN NULL ELSE t.part_name END,
        'target', t.target_name,
        'statement', t.statement,
        'key', to_jsonb(ARRAY(SELECT c.name::text FROM @schema@.transform_columns c
                               WHERE c.transform_id = t.id AND c.is_key ORDER BY c.ordinal)),
        'maintenance', @schema@._maintenance(t.aggregates, t.delta),
        'state', @schema@._explain_state(t),
        'reads', coalesce((
          SELECT jsonb_agg(jsonb_build_object(
                   'table', ts.source_schema || '.' || ts.source_name, 'alias', ts.alias,
                   'join', ts.join_type, 'keyColumns', to_jsonb(ts.key_columns),
                   'writtenBy', to_jsonb(ARRAY(
                      SELECT u.target_name::text FROM @schema@.transforms u
                       WHERE u.id IN (SELECT @schema@._upstream_ids(t.id))
                         AND (u.target_oid = ts.source_oid
                              OR u.id IN (SELECT f.transform_id FROM @schema@.union_feeds f
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
            FROM @schema@.transform_sources ts WHERE ts.transform_id = t.id), '[]'),
        'needs', coalesce((
          SELECT jsonb_agg(jsonb_build_object('table', g->'table', 'columns', g->'columns',
                                              'role', g->'role', 'fix', g->'fix'))
            FROM jsonb_array_elements(@schema@.source_index_gaps(t.id)) g
           WHERE NOT coalesce((g->>'opted_out')::boolean, false)), '[]')) AS p
        FROM @schema@.transforms t
       WHERE t.id = root OR t.part_of = root) x
$fn$;

-- The explanation of a TRANSFORM statement not defined (see the header): {"kind":
-- "explained", "target", "statement", "chain", "parts", "refused": null}, or, for a
-- statement the grammar refuses, {"kind": "explained", "target": null, ..., "refused":
-- {"code", "message", "hint"}} with the code and message defining it would raise.
-- "EXPLAIN " in front of the statement is allowed.
CREATE FUNCTION @schema@.explain(statement text)
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
    defined := @schema@._apply_retrying(body, true);
    SELECT t.id INTO root FROM @schema@.transforms t
     WHERE t.target_name = defined->>'target' AND t.part_of IS NULL AND t.redefines IS NULL
       AND t.target_schema = (SELECT c.target_schema FROM @schema@.config c);
    parts := @schema@._explain_parts(root);
    result := jsonb_build_object(
      'kind', 'explained',
      'target', defined->>'target',
      'statement', (SELECT t.statement FROM @schema@.transforms t WHERE t.id = root),
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
CREATE OR REPLACE FUNCTION @schema@.apply(statement text)
RETURNS jsonb LANGUAGE sql AS $fn$
  SELECT CASE WHEN statement ~* '^\s*explain\s+transform\s'
              THEN @schema@.explain(statement)
              ELSE @schema@._apply_retrying(statement, false) END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
