-- Aggregates kept by delta over a LEFT JOIN that fans out, and a grand total over a join
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

ALTER FUNCTION @schema@._make_key_map(int, jsonb, jsonb) RENAME TO _make_key_map_before_left_deltas;

CREATE FUNCTION @schema@._make_key_map(transform_id int, spec jsonb, classified jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  whole_row boolean;
  left_join boolean;
  grand_total boolean;
  shadow_spec jsonb := spec;
  why text;
BEGIN
  whole_row := coalesce((spec->>'whole_row')::boolean, false)
    OR coalesce((SELECT (t.spec->>'whole_row')::boolean FROM @schema@.transforms t WHERE t.id = transform_id), false);
  left_join := EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s WHERE s->>'join_type' = 'left');
  grand_total := jsonb_array_length(coalesce(spec->'groups', '[]')) = 0;
  IF classified->>'mode' IS DISTINCT FROM 'delta'
     OR NOT (left_join OR grand_total)
     OR jsonb_array_length(spec->'sources') < 2
     OR whole_row
     OR EXISTS (SELECT 1 FROM jsonb_array_elements(spec->'sources') s
                 WHERE (s->>'ordinal')::int > 0 AND coalesce(s->>'join_type', 'inner') NOT IN ('inner', 'left'))
     OR NOT @schema@._join_fans_out(spec)
     OR @schema@._shadow_columns(spec) IS NULL THEN
    PERFORM @schema@._make_key_map_before_left_deltas(transform_id, spec, classified);
    RETURN;
  END IF;
  -- The shadow, as 0033 makes it for a GROUP BY kept by group recompute (0033 keeps one
  -- only for a GROUP BY: a grand total is given a group it indexes nothing for).
  IF grand_total THEN
    shadow_spec := spec || '{"groups": [{"grand_total": true}]}';
  END IF;
  PERFORM @schema@._make_key_map_before_fanout(transform_id, shadow_spec,
    classified || '{"mode": "group", "reason": "made by _make_key_map"}');
  why := CASE WHEN left_join
    THEN '; the join can multiply rows and has a LEFT JOIN, so a change''s join rows are those of the FROM rows it touches, re-joined from the sources'' shadow as they were and as they are (ADR 0067, addendum)'
    ELSE '; the join can multiply rows, so a change''s join rows are signed from the sources'' shadow (ADR 0067)' END;
  UPDATE @schema@.transforms
     SET delta = (classified - 'remap') || jsonb_build_object('fan_out', true,
           'left_join', left_join, 'reason', (classified->>'reason') || why)
   WHERE id = transform_id;
  PERFORM @schema@._create_group_states(transform_id, spec, classified);
END
$fn$;

-- Transforms defined before this migration over a LEFT JOIN that fans out (0049 recorded
-- them as kept by group recompute), or a grand total over a join that fans out (0033's
-- reason), whose aggregates all have an exact delta: recorded as pending, so that their next
-- build (_switch_to_delta) gives them their shadow and group states and keeps them by delta.
UPDATE @schema@.transforms t
   SET delta = t.delta || jsonb_build_object(
         'mode', 'delta', 'reason', 'every aggregate has an exact delta', 'pending', true)
 WHERE t.aggregates
   AND t.delta->>'mode' = 'group'
   AND (t.delta->>'reason' LIKE '%has a LEFT JOIN, whose NULL-extended rows have no delta%'
        OR (t.delta->>'reason' LIKE 'the join can multiply rows (%'
            AND jsonb_array_length(coalesce(t.spec->'groups', '[]')) = 0))
   AND NOT coalesce((t.delta->>'remap')::boolean, false)
   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.delta->'aggs') a WHERE NOT (a->>'delta')::boolean);
