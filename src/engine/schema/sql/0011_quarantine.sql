-- Quarantine per address (issue #9, ADR 0010): a key whose re-derivation fails is held at
-- the narrowest address that explains the failure. `column_name` is the target column
-- whose expression failed for the row ('' when no single column explains it: the key is
-- then held for the whole transform). A key held for a column still flows: its row is
-- written with every other column, and that column keeps its last value.
ALTER TABLE @schema@.held_keys ADD COLUMN column_name name NOT NULL DEFAULT '';
ALTER TABLE @schema@.held_keys DROP CONSTRAINT held_keys_pkey;
ALTER TABLE @schema@.held_keys ADD PRIMARY KEY (transform_id, source_id, key, column_name);
-- Samples page through an address's keys in (source, key) order.
CREATE INDEX held_keys_by_address ON @schema@.held_keys (transform_id, column_name, source_id, key);

-- A key as Trellis renders it everywhere (status, samples, logs, releaseKey): a one-column
-- key as its text, a wider one as its text[] literal ('{1,abc}'), as the ledger holds it.
CREATE FUNCTION @schema@.render_key(key text[])
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
  SELECT CASE WHEN cardinality(key) = 1 THEN key[1] ELSE key::text END
$fn$;

-- What RESUME does first for a transform stopped by a capture failure (of any kind): bind
-- its statement to its sources again (see _rebind in 0009). Later migrations add kinds.
CREATE FUNCTION @schema@._resume_stopped(t @schema@.transforms)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM @schema@._rebind(t);
END
$fn$;

-- RESUME, as before (0006), and: a transform stopped by a capture failure is bound to its
-- sources again and rebuilt (_resume_stopped); RESUME of a column also releases the keys held for it (the
-- rebuild re-derives them), and RESUME of a transform retries the keys held for it and for
-- each of its columns.
CREATE OR REPLACE FUNCTION @schema@._resume(ast jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
  t @schema@.transforms := @schema@._transform_named(ast);
  addresses text[] := '{}';
BEGIN
  IF ast->>'column' IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM @schema@.transform_columns c WHERE c.transform_id = t.id AND c.name = ast->>'column') THEN
    PERFORM @schema@._fail('TRN01', format('transform %I has no column %I', t.target_name, ast->>'column'));
  END IF;
  IF ast->>'column' IS NULL AND t.paused_at IS NOT NULL THEN
    -- A transform that stopped on a capture failure or disruption (whoever paused it) is
    -- bound to its sources again, and resumes through a rebuild: the ledger could not have
    -- covered what happened. Any other resumes from where it stopped.
    IF t.capture_failure IS NOT NULL THEN
      PERFORM @schema@._resume_stopped(t);
    END IF;
    addresses := addresses || t.target_name::text;
    UPDATE @schema@.transforms SET paused_at = NULL, pause_reason = NULL, updated_at = now() WHERE id = t.id;
    IF t.capture_failure IS NOT NULL OR t.pause_reason IN ('capture_failure', 'disruption') THEN
      PERFORM @schema@._request_rebuild(t.id);
    ELSIF t.pause_reason = 'build_failure' THEN
      -- The cause was fixed: the build gets its attempts afresh, starting now.
      UPDATE @schema@.pipeline SET build_attempts = 0, build_next_at = NULL WHERE transform_id = t.id;
    END IF;
  END IF;
  WITH resumed AS (
    UPDATE @schema@.transform_columns SET paused_at = NULL, pause_reason = NULL
     WHERE transform_id = t.id AND paused_at IS NOT NULL
       AND (ast->>'column' IS NULL OR name = ast->>'column')
    RETURNING name)
  SELECT addresses || coalesce(array_agg(t.target_name || '.' || name ORDER BY name), '{}')
    INTO addresses FROM resumed;
  -- A paused column was left as it was while its rows changed: rebuild to catch it up.
  IF EXISTS (SELECT 1 FROM unnest(addresses) a WHERE a LIKE '%.%' AND a <> t.target_name::text) THEN
    PERFORM @schema@._request_rebuild(t.id);
  END IF;
  IF ast->>'column' IS NOT NULL THEN
    DELETE FROM @schema@.held_keys h WHERE h.transform_id = t.id AND h.column_name = ast->>'column';
  ELSE
    -- Held keys are tried again: they go back into the ledger as changes of this transaction.
    WITH released AS (
      DELETE FROM @schema@.held_keys h WHERE h.transform_id = t.id RETURNING h.source_id, h.key)
    INSERT INTO @schema@.ledger (gen, source_id, xid, keys)
    SELECT @schema@.ledger_generation(x.xid), r.source_id, x.xid,
           ARRAY[CASE WHEN cardinality(r.key) = 1 THEN r.key[1] ELSE r.key::text END]
      FROM (SELECT DISTINCT source_id, key FROM released) r,
           (SELECT pg_current_xact_id()::text::bigint AS xid) x;
  END IF;
  RETURN jsonb_build_object('kind', 'resumed', 'addresses', to_jsonb(addresses));
END
$fn$;

-- How many keys one address may hold before it pauses itself (pause_reason 'quarantine')
-- instead of holding keys without end. Instance-wide: every drain of the instance applies
-- the same. Handles set it with the connect option `quarantineThreshold`.
ALTER TABLE @schema@.config ADD COLUMN quarantine_threshold int NOT NULL DEFAULT 100
  CHECK (quarantine_threshold > 0);

-- Holds `key` of source `source_id` for `transform_id` at `column_name` ('' for the whole
-- transform), and pauses the address once it holds quarantine_threshold keys: a column
-- pauses (its rows flow on without it), a transform pauses whole. Returns whether it
-- paused.
CREATE FUNCTION @schema@._hold_key(p_transform_id int, p_source_id int, p_key text[],
                                   p_column name, p_error text, p_sqlstate text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  threshold int := (SELECT quarantine_threshold FROM @schema@.config);
  held bigint;
BEGIN
  INSERT INTO @schema@.held_keys (transform_id, source_id, key, column_name, error, sqlstate)
  VALUES (p_transform_id, p_source_id, p_key, p_column, p_error, p_sqlstate)
  ON CONFLICT (transform_id, source_id, key, column_name)
    DO UPDATE SET error = EXCLUDED.error, sqlstate = EXCLUDED.sqlstate, held_at = now();
  SELECT count(*) INTO held FROM @schema@.held_keys
   WHERE transform_id = p_transform_id AND column_name = p_column;
  IF held < threshold THEN
    RETURN false;
  END IF;
  IF p_column = '' THEN
    UPDATE @schema@.transforms SET paused_at = now(), pause_reason = 'quarantine', updated_at = now()
     WHERE id = p_transform_id AND paused_at IS NULL;
  ELSE
    UPDATE @schema@.transform_columns SET paused_at = now(), pause_reason = 'quarantine'
     WHERE transform_id = p_transform_id AND name = p_column AND paused_at IS NULL;
  END IF;
  RETURN FOUND;
END
$fn$;
