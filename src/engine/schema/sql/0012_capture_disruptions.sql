-- Capture disruptions (issue #9, ADR 0010): capture changed outside Trellis. The staging
-- worker compares what is installed with what it installed: each of the four triggers on
-- the source and on every partition or child that has capture (present, ENABLE ALWAYS, on
-- the function Trellis made), and the functions' source, whose digest is kept here.
ALTER TABLE @schema@.sources ADD COLUMN capture_digest text;

-- The digest of a source's four capture functions as they are now (NULL when one is gone).
CREATE FUNCTION @schema@._capture_digest(p_source_id int)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT CASE WHEN count(*) = 4 THEN md5(string_agg(p.prosrc || coalesce(array_to_string(p.proconfig, ','), ''), '|' ORDER BY p.proname)) END
    FROM pg_proc p
   WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = @schema_literal@)
     AND p.proname IN (format('capture_%s_insert', p_source_id), format('capture_%s_update', p_source_id),
                       format('capture_%s_delete', p_source_id), format('capture_%s_truncate', p_source_id))
$fn$;
