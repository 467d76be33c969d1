-- Redefinitions in place (issue #25 follow-up; ADR 0055's fourth addendum).
--
-- _redefine_lock_mode: the strongest lock the next step of a redefinition takes on its
-- target ('ACCESS EXCLUSIVE' when columns are staged, or the switch changes columns, the
-- key, NOT NULL or the engine's join indexes; 'EXCLUSIVE' otherwise), so the staging
-- worker's pre-check counts only the locks that conflict with it: a plain reader's ACCESS
-- SHARE does not conflict with EXCLUSIVE, and no longer holds a filter change's switch off.

CREATE FUNCTION @schema@._redefine_lock_mode(shadow_id int)
RETURNS text LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  s @schema@.transforms;
  t @schema@.transforms;
  plan jsonb;
  wanted text[];
BEGIN
  SELECT * INTO s FROM @schema@.transforms y WHERE y.id = shadow_id AND y.redefines IS NOT NULL;
  IF NOT FOUND THEN
    RETURN 'ACCESS EXCLUSIVE';
  END IF;
  SELECT * INTO t FROM @schema@.transforms y WHERE y.id = s.redefines;
  plan := @schema@._redefine_plan(t, s.spec);
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
CREATE FUNCTION @schema@._redefine_blockers(rel oid, mode text, older_ms float8)
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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
