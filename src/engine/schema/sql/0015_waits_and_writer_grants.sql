-- Issue #8, items 9-11. What lets an idle instance cost next to nothing (ADR 0012):
-- convergence judged from the ledger rather than from a newer tick (so no tick is taken
-- while nothing is written; awaitConverged, ADR 0011), idle cursors moved together, and
-- workers that wait for work inside one statement instead of polling with a statement (a
-- commit) each time. And grant_writer() (ADR 0013): what a role that writes captured
-- tables needs, and nothing more.

-- Whether transform p_transform reflects every captured write `p_token` sees: it is past
-- its backfill, not paused, and no ledger row of its sources belongs to a transaction the
-- token sees and its cursor's tick does not. Such a row would still be waiting to be
-- applied; every row the tick sees has been (the cursor moves past a segment only once
-- its keys are re-derived, from a state at least as new). When the tick sees everything
-- the token sees, the ledger is not read at all. Custom plans: the snapshots' bounds
-- decide whether the ledger's BRIN index pays.
CREATE FUNCTION @schema@._converged(p_transform int, p_token pg_snapshot)
RETURNS boolean LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  cur pg_snapshot;
BEGIN
  SELECT k.snap INTO cur
    FROM @schema@.pipeline p
    JOIN @schema@.transforms t ON t.id = p.transform_id
    JOIN @schema@.ticks k ON k.seq = p.cursor_tick
   WHERE p.transform_id = p_transform AND t.paused_at IS NULL
     AND p.phase IN ('catching_up', 'live');
  IF cur IS NULL THEN
    RETURN false;
  END IF;
  IF pg_snapshot_xmax(cur) >= pg_snapshot_xmax(p_token)
     AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(cur) x
                      WHERE x < pg_snapshot_xmax(p_token)
                        AND x NOT IN (SELECT pg_snapshot_xip(p_token))) THEN
    RETURN true;
  END IF;
  RETURN NOT EXISTS (
    SELECT 1 FROM @schema@.ledger l
     WHERE l.source_id IN (SELECT src.id FROM @schema@.transform_sources ts
                             JOIN @schema@.sources src ON src.source_oid = ts.source_oid
                            WHERE ts.transform_id = p_transform)
       AND l.xid >= pg_snapshot_xmin(cur)::text::bigint
       AND l.xid < pg_snapshot_xmax(p_token)::text::bigint
       AND pg_visible_in_snapshot(l.xid::text::xid8, p_token)
       AND NOT pg_visible_in_snapshot(l.xid::text::xid8, cur));
END
$fn$;

-- Whether the staging worker should take a tick now: there is none yet; or captured
-- changes have committed that the newest tick does not see; or, at most every
-- p_keepalive_ms, a transform waits for a newer tick to move on (a backfill waiting for
-- its start tick T0, a finished backfill waiting to go live). With nothing written and
-- nothing waiting, no tick is taken: idle cursors have nothing to move over.
CREATE FUNCTION @schema@._tick_needed(p_keepalive_ms int)
RETURNS boolean LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  last_seq bigint;
  last_snap pg_snapshot;
  last_at timestamptz;
BEGIN
  SELECT seq, snap, at INTO last_seq, last_snap, last_at
    FROM @schema@.ticks ORDER BY seq DESC LIMIT 1;
  IF last_seq IS NULL THEN
    RETURN true;
  END IF;
  -- Rows of transactions still running are invisible here and wait for a later tick.
  IF EXISTS (SELECT 1 FROM @schema@.ledger l
              WHERE l.xid >= pg_snapshot_xmin(last_snap)::text::bigint
                AND NOT pg_visible_in_snapshot(l.xid::text::xid8, last_snap)) THEN
    RETURN true;
  END IF;
  RETURN last_at < clock_timestamp() - make_interval(secs => p_keepalive_ms / 1000.0)
     AND @schema@._waiting_for_tick();
END
$fn$;

-- Some transform can move on only once a newer tick exists (see _tick_needed).
CREATE FUNCTION @schema@._waiting_for_tick()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (
    SELECT 1 FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
     WHERE t.paused_at IS NULL
       AND (p.phase = 'waiting_to_backfill'
            OR (p.phase = 'catching_up' AND p.open_lo IS NULL
                AND p.cursor_tick >= (SELECT max(seq) FROM @schema@.ticks))))
$fn$;

-- What the staging worker's reconcile pass reads, as one text: when it changes, the pass
-- runs. Trellis's catalog (transforms and their columns, their sources, captured
-- sources); of every source, its pg_class row (present, renamed, moved), columns (added,
-- dropped, renamed, retyped) and indexes (the primary key), and its partitions and
-- inheritance children at every level (created, attached, detached) with their triggers
-- (capture installed, removed, disabled); of every target, the same (dropped, a column
-- changed, its key or guard trigger removed: a halt, 0014); and the functions in this
-- schema (a capture function replaced). A row changed gets a new xmin, which changes the
-- sum of xmins (whatever the xid wraparound); a row removed or added changes a count.
-- VACUUM and ANALYZE update pg_class in place (and freezing keeps the raw xmin): they
-- change nothing here.
CREATE FUNCTION @schema@._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM @schema@.transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM @schema@.transforms)
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.sources),
    (SELECT count(*) || ':' || coalesce(sum(c.xmin::text::bigint), 0)
       FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(a.xmin::text::bigint), 0)
       FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rel) AND a.attnum > 0),
    (SELECT count(*) || ':' || coalesce(sum(x.xmin::text::bigint), 0)
       FROM pg_index x WHERE x.indrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(g.xmin::text::bigint), 0)
       FROM pg_trigger g WHERE g.tgrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(p.xmin::text::bigint), 0)
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = @schema_literal@))
$fn$;

-- Something the staging worker's reconcile pass must come back to soon, whatever else
-- changes: a backfill not started yet, a widen whose writers it waits out (ADR 0009), or a
-- correction whose keys it puts into the ledger chunk by chunk (0013, ADR 0010).
CREATE FUNCTION @schema@._capture_pending()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (SELECT 1 FROM @schema@.sources WHERE widened_at IS NOT NULL)
      OR EXISTS (SELECT 1 FROM @schema@.corrections)
      OR EXISTS (SELECT 1 FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
                  WHERE p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL)
$fn$;

-- The oldest cursor of any transform: what ledger maintenance can free depends on it
-- (src/engine/staging/ledger-maintenance.ts).
CREATE FUNCTION @schema@._cursor_floor()
RETURNS bigint LANGUAGE sql STABLE AS $fn$
  SELECT min(cursor_tick) FROM @schema@.pipeline WHERE cursor_tick IS NOT NULL
$fn$;

-- The staging worker's wait: returns 'tick' as soon as a tick is needed, 'capture' as
-- soon as what capture depends on differs from p_fingerprint, 'maintain' (when
-- p_watch_floor) as soon as the oldest cursor differs from p_floor, or 'timeout' after
-- p_timeout_ms. It looks again only when some transaction has committed since (the
-- current snapshot changed), or while a transform waits for a tick (which time alone can
-- bring), so an idle database costs a snapshot and a sleep per look. It looks every
-- p_poll_ms for its first p_fast_ms, then less and less often, up to every p_max_poll_ms:
-- right after work, more tends to follow; a long idle stretch costs few wake-ups. The
-- whole wait is one statement, one commit.
CREATE FUNCTION @schema@._await_staging_work(
  p_fingerprint text, p_floor bigint, p_watch_floor boolean, p_keepalive_ms int,
  p_timeout_ms int, p_poll_ms int, p_max_poll_ms int, p_fast_ms int)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
  started timestamptz := clock_timestamp();
  deadline timestamptz := started + make_interval(secs => p_timeout_ms / 1000.0);
  slow_from timestamptz := started + make_interval(secs => p_fast_ms / 1000.0);
  pause float8 := p_poll_ms;
  seen text;
  now_snap text;
  timed boolean := false;
  slept text;
BEGIN
  LOOP
    now_snap := pg_current_snapshot()::text;
    IF seen IS NULL OR now_snap <> seen OR timed THEN
      IF @schema@._tick_needed(p_keepalive_ms) THEN
        RETURN 'tick';
      END IF;
      IF @schema@._capture_fingerprint() IS DISTINCT FROM p_fingerprint THEN
        RETURN 'capture';
      END IF;
      IF p_watch_floor AND @schema@._cursor_floor() IS DISTINCT FROM p_floor THEN
        RETURN 'maintain';
      END IF;
      timed := @schema@._waiting_for_tick();
      seen := now_snap;
    END IF;
    EXIT WHEN clock_timestamp() >= deadline;
    -- An assignment, not PERFORM: a simple expression, no executor run per look.
    slept := pg_sleep(least(pause, greatest(1, extract(epoch FROM deadline - clock_timestamp()) * 1000)) / 1000.0)::text;
    IF clock_timestamp() >= slow_from THEN
      pause := least(p_max_poll_ms, pause * 1.5);
    END IF;
  END LOOP;
  RETURN 'timeout';
END
$fn$;

-- Whether any drain work is waiting: an open page, a transform behind the newest tick, or
-- a backfill. clock_timestamp(), not now(): it is checked again and again within one
-- statement by _await_drain_work.
CREATE FUNCTION @schema@._has_drain_work()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (SELECT 1 FROM @schema@.pages p JOIN @schema@.transforms t ON t.id = p.transform_id
                  WHERE t.paused_at IS NULL AND (p.not_before IS NULL OR p.not_before <= clock_timestamp()))
      OR EXISTS (SELECT 1 FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
                  WHERE t.paused_at IS NULL
                    AND ((p.phase IN ('catching_up', 'live') AND p.open_lo IS NULL
                          AND p.cursor_tick < (SELECT max(seq) FROM @schema@.ticks))
                         OR (p.phase = 'backfilling'
                             AND (p.build_next_at IS NULL OR p.build_next_at <= clock_timestamp()))))
$fn$;

-- When work that waits for a time (a page or build retried with backoff) comes due next.
CREATE FUNCTION @schema@._next_drain_due()
RETURNS timestamptz LANGUAGE sql STABLE AS $fn$
  SELECT least(
    (SELECT min(p.not_before) FROM @schema@.pages p JOIN @schema@.transforms t ON t.id = p.transform_id
      WHERE t.paused_at IS NULL AND p.not_before > clock_timestamp()),
    (SELECT min(p.build_next_at) FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
      WHERE t.paused_at IS NULL AND p.phase = 'backfilling' AND p.build_next_at > clock_timestamp()))
$fn$;

-- A drain loop's wait: true as soon as there is drain work, false after p_timeout_ms.
-- Looks again only when some transaction has committed since the last look, or when
-- work retried with backoff comes due; p_poll_ms apart for p_fast_ms, then less and less
-- often, up to p_max_poll_ms (see _await_staging_work).
CREATE FUNCTION @schema@._await_drain_work(
  p_timeout_ms int, p_poll_ms int, p_max_poll_ms int, p_fast_ms int)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  started timestamptz := clock_timestamp();
  deadline timestamptz := started + make_interval(secs => p_timeout_ms / 1000.0);
  slow_from timestamptz := started + make_interval(secs => p_fast_ms / 1000.0);
  pause float8 := p_poll_ms;
  seen text;
  now_snap text;
  due timestamptz;
  slept text;
BEGIN
  LOOP
    now_snap := pg_current_snapshot()::text;
    IF seen IS NULL OR now_snap <> seen OR clock_timestamp() >= due THEN
      IF @schema@._has_drain_work() THEN
        RETURN true;
      END IF;
      due := @schema@._next_drain_due();
      seen := now_snap;
    END IF;
    EXIT WHEN clock_timestamp() >= deadline;
    slept := pg_sleep(least(pause, greatest(1, extract(epoch FROM deadline - clock_timestamp()) * 1000)) / 1000.0)::text;
    IF clock_timestamp() >= slow_from THEN
      pause := least(p_max_poll_ms, pause * 1.5);
    END IF;
  END LOOP;
  RETURN false;
END
$fn$;

-- Grants `role` what writing to captured tables needs, and nothing more: the capture
-- triggers run as the writing role and insert its changes straight into the ledger's
-- partitions. So: USAGE on this schema, and INSERT on each ledger partition (no SELECT,
-- no UPDATE or DELETE, nothing on the catalog). Callable from a migration; run it as the
-- role that owns Trellis's schema (the one that migrated).
CREATE FUNCTION @schema@.grant_writer(role regrole)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  part regclass;
BEGIN
  IF role IS NULL THEN
    RAISE EXCEPTION 'grant_writer needs a role' USING ERRCODE = 'TRV01';
  END IF;
  -- GRANT without the grant option only warns and grants nothing: refuse instead.
  IF NOT has_schema_privilege(@schema_literal@, 'USAGE WITH GRANT OPTION') THEN
    RAISE EXCEPTION 'grant_writer: role % cannot grant access to Trellis''s schema %',
      current_user, @schema_literal@
      USING ERRCODE = '42501', HINT = 'Run it as the role that owns that schema (the one that migrated).';
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO %s', @schema_literal@, role);
  FOR part IN
    SELECT h.inhrelid::regclass FROM pg_inherits h
     WHERE h.inhparent = format('%I.ledger', @schema_literal@)::regclass
     ORDER BY 1
  LOOP
    IF NOT has_table_privilege(part, 'INSERT WITH GRANT OPTION') THEN
      RAISE EXCEPTION 'grant_writer: role % cannot grant INSERT on %', current_user, part
        USING ERRCODE = '42501', HINT = 'Run it as the role that owns Trellis''s schema (the one that migrated).';
    END IF;
    EXECUTE format('GRANT INSERT ON %s TO %s', part, role);
  END LOOP;
END
$fn$;

-- Moves, in one statement per cursor position, the cursor of every transform that has
-- nothing to apply up to the newest tick: live (or catching up, which then goes live),
-- not paused, no range open, and no ledger row of its sources in the range. Without
-- this, each tick would take a transaction per transform that has nothing to do (one at
-- a time: a write to one table made every other transform move its cursor alone).
-- Transforms another drain holds are skipped (SKIP LOCKED); one whose row changed since
-- this statement's snapshot is checked again on its newest version, as FOR UPDATE does.
-- Returns how many moved.
CREATE FUNCTION @schema@._advance_idle_cursors()
RETURNS int LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
  hi_seq bigint;
  hi_snap pg_snapshot;
  lo record;
  moved int := 0;
  n int;
BEGIN
  SELECT seq, snap INTO hi_seq, hi_snap FROM @schema@.ticks ORDER BY seq DESC LIMIT 1;
  IF hi_seq IS NULL THEN
    RETURN 0;
  END IF;
  FOR lo IN
    SELECT k.seq, k.snap FROM @schema@.ticks k
     WHERE k.seq IN (SELECT p.cursor_tick
                       FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
                      WHERE p.phase IN ('catching_up', 'live') AND t.paused_at IS NULL
                        AND p.open_lo IS NULL AND p.cursor_tick < hi_seq)
     ORDER BY k.seq
  LOOP
    WITH changed AS (
      SELECT DISTINCT l.source_id FROM @schema@.ledger l
       WHERE l.xid >= pg_snapshot_xmin(lo.snap)::text::bigint
         AND l.xid < pg_snapshot_xmax(hi_snap)::text::bigint
         AND pg_visible_in_snapshot(l.xid::text::xid8, hi_snap)
         AND NOT pg_visible_in_snapshot(l.xid::text::xid8, lo.snap)),
    idle AS (
      SELECT p.transform_id
        FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
       WHERE p.cursor_tick = lo.seq AND p.phase IN ('catching_up', 'live')
         AND t.paused_at IS NULL AND p.open_lo IS NULL
         AND NOT EXISTS (
           SELECT 1 FROM @schema@.transform_sources ts
             JOIN @schema@.sources src ON src.source_oid = ts.source_oid
            WHERE ts.transform_id = p.transform_id
              AND src.id IN (SELECT source_id FROM changed))
         FOR UPDATE OF p SKIP LOCKED)
    UPDATE @schema@.pipeline p
       SET cursor_tick = hi_seq,
           live_since = CASE WHEN p.phase = 'catching_up' THEN now() ELSE p.live_since END,
           phase = CASE WHEN p.phase = 'catching_up' THEN 'live' ELSE p.phase END,
           updated_at = now()
      FROM idle
     WHERE p.transform_id = idle.transform_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    moved := moved + n;
  END LOOP;
  RETURN moved;
END
$fn$;
