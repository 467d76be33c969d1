-- Redefinitions in place to, from and between statements with UNION [ALL] (issue #25
-- follow-up; ADR 0055's third addendum). 0047 refused a UNION anywhere in the new
-- statement by name; 0047's parts machinery already covers it: _define_parts (0041's
-- wrapper) defines a union's branches and its table like any part, under the root name
-- it is given ("trellis#<t>~<id>#…", so the branches and the union's table
-- "trellis#<t>~<id>#union" never meet the ones in force), and _drop_parts_of (0047) drops
-- the union tables the dropped parts fed. What 0047 lacked: a union at the top of the new
-- statement (no WITH queries, no derived table) was not seen as a statement with parts.
--
-- Renamed here and wrapped: _redefine (0047's) -> _redefine_before_unions. Statements
-- without a UNION in the new definition go straight through to it; a union's goes the
-- same way as 0047's parts (its body copied, the refusal lifted, "has parts" including a
-- union at the top; changes marked "0056").

ALTER FUNCTION @schema@._redefine(jsonb) RENAME TO _redefine_before_unions;

CREATE FUNCTION @schema@._redefine(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  def jsonb := ast->'definition';
  res jsonb;
  result jsonb;
  shadow_id int;
BEGIN
  IF t.part_of IS NOT NULL OR t.redefines IS NOT NULL OR NOT @schema@._has_union(def) THEN
    RETURN @schema@._redefine_before_unions(ast);
  END IF;
  -- A switch to a redefinition being replaced finishes first (as _redefine_one waits).
  PERFORM 1 FROM @schema@.pipeline px
   WHERE px.transform_id = t.id
      OR px.transform_id IN (SELECT y.id FROM @schema@.transforms y WHERE y.redefines = t.id)
   ORDER BY px.transform_id FOR UPDATE;
  IF NOT EXISTS (SELECT 1 FROM @schema@.transforms y WHERE y.id = t.id) THEN
    PERFORM @schema@._fail('TRT01', format(
      'transform %I was switched to another definition while this statement waited: apply it again', t.target_name));
  END IF;
  -- A redefinition being built is replaced: its shadow, its parts and its union tables go
  -- first (their names are this one's).
  DELETE FROM @schema@.transforms s WHERE s.redefines = t.id;
  def := jsonb_set(def, '{target}', jsonb_build_object('schema', NULL, 'name', t.target_name));
  -- Postgres reads the statement as written first: names, column aliases, scopes, the
  -- union's column count and types.
  PERFORM @schema@._analyze_query(@schema@._render_view_select(def), 'in the definition');
  PERFORM @schema@._refuse_view_sublinks(def);
  -- 0056: a union at the top too (_define_parts is 0041's wrapper): its branches and its
  -- table, under the shadow's root name; the shadow reads the union's table.
  res := @schema@._define_parts(def, t.target_name || '~' || t.id, '', '{}');
  ast := jsonb_set(ast, '{definition}', res->'ast');
  result := @schema@._redefine_one(ast);
  SELECT s.id INTO shadow_id FROM @schema@.transforms s WHERE s.redefines = t.id;
  IF shadow_id IS NULL THEN
    -- The definition in force, written again: nothing to build, the parts just made (and
    -- the union tables they feed) go.
    PERFORM @schema@._drop_new_parts(ARRAY(SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i));
    RETURN result;
  END IF;
  UPDATE @schema@.transforms p SET part_of = shadow_id
   WHERE p.id IN (SELECT (i)::int FROM jsonb_array_elements_text(res->'ids') i);
  RETURN result;
END
$fn$;

-- Transforms `ids` (parts just defined, belonging to no statement yet) dropped, the last
-- defined first, and the union tables they fed.
CREATE FUNCTION @schema@._drop_new_parts(ids int[])
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  tables oid[];
  rel oid;
  p record;
BEGIN
  tables := ARRAY(SELECT DISTINCT f.table_oid FROM @schema@.union_feeds f WHERE f.transform_id = ANY (ids));
  FOR p IN SELECT y.target_name FROM @schema@.transforms y WHERE y.id = ANY (ids) ORDER BY y.id DESC LOOP
    PERFORM @schema@._drop_one(jsonb_build_object('kind', 'drop', 'transform', p.target_name));
  END LOOP;
  FOREACH rel IN ARRAY tables LOOP
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
      EXECUTE format('DROP TABLE %s', rel::regclass);
    END IF;
  END LOOP;
END
$fn$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
