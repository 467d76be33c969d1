import { deriveLifecycle } from '../catalog/status.js';
import type { CaptureFailure, Lifecycle } from '../catalog/status-types.js';
import type { Session } from '../db/session.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import { WRITER_LOCK_MODES, withDescendantsSql } from '../staging/widen-wait.js';

/**
 * What the metrics and the handle's events read of an instance, in one statement: every
 * transform's lifecycle (as status() derives it), lag, backfill progress, capture failure
 * and paused columns; held keys per address; the ledger's pending rows and size; capture
 * waits. Read once per scrape, per staging pass (at most once a second) and, while the app
 * listens for events, once a second: never per row or per transform.
 */
export interface InstanceSnapshot {
  /** When it was read (the reader's clock). */
  at: number;
  transforms: Map<string, TransformSnapshot>;
  /** Keys held per quarantine address (only addresses holding some). */
  held: HeldSnapshot[];
  ledger: LedgerSnapshot;
  captureWaits: CaptureWaitSnapshot[];
  /** WAL capture (ADR 0023): sources per capture mode, and the slot while there is one. */
  wal: WalSnapshot;
  /** The installed schema version (its newest migration). */
  schemaVersion: number | null;
}

export interface TransformSnapshot {
  target: string;
  status: Lifecycle;
  pauseReason: string | null;
  lagSegments: number;
  lagSeconds: number;
  /** Drain time spent on it in all, and its share of the drain's recent time (status().drain). */
  drainSeconds: number;
  drainShare: number | null;
  /** Backfill progress, as status().backfill reports it (null when none to report). */
  backfill: { keysDone: number; keysTotal: number | null } | null;
  captureFailure: CaptureFailure | null;
  /** Paused columns, each `"target.column"`, with why. */
  pausedColumns: Array<{ address: string; reason: string | null }>;
}

export interface HeldSnapshot {
  address: string;
  target: string;
  count: number;
}

export interface LedgerSnapshot {
  /**
   * Ledger rows (one per captured statement and source) not yet applied by the transform
   * furthest behind, counted up to LEDGER_PENDING_CAP, and their size.
   */
  pendingRows: number;
  pendingBytes: number;
  /** The ledger's partitions on disk (drained generations are truncated, ADR 0005). */
  bytes: number;
}

export interface WalSnapshot {
  /** Captured sources by how they are captured now (as status().capture.sources says). */
  sources: { trigger: number; logical: number; switching: number };
  /** The instance's replication slot: WAL held back (null while the slot is missing) and the ceiling. */
  slot: { retainedBytes: number | null; limitBytes: number } | null;
}

export interface CaptureWaitSnapshot {
  table: string;
  operation: 'install' | 'widen' | 'uninstall' | 'publish';
  seconds: number;
  blockers: number;
}

/**
 * Pending ledger rows are counted up to this many: past it the scrape would read the
 * whole backlog each time. A figure at the cap means "at least"; lag per target says how
 * far behind each is.
 */
export const LEDGER_PENDING_CAP = 100_000;

/**
 * Lock modes that conflict with SHARE ROW EXCLUSIVE (capture install/uninstall), as in
 * status(): the same modes a writer of a table holds (ROW EXCLUSIVE and every stronger one).
 */
const CONFLICTS_WITH_SHARE_ROW_EXCLUSIVE = WRITER_LOCK_MODES;

interface Row {
  transforms: Array<{
    target: string;
    paused: boolean;
    pause_reason: string | null;
    phase: Exclude<Lifecycle, 'paused' | 'unverified'>;
    /** The catalog is another database's, not rebound yet (ADR 0035). */
    restored: boolean;
    has_cursor: boolean;
    lag_segments: number;
    lag_seconds: number | null;
    drain: { seconds: number; share: number | string | null };
    has_backfill: boolean;
    backfill_done: number;
    backfill_total: number | null;
    capture_failure: {
      kind: CaptureFailure['kind'];
      error: string;
      columns: string[];
      detected_at: string;
    } | null;
    correcting: boolean;
    upstream_paused: boolean;
    upstream_behind: boolean;
    paused_columns: Array<{ address: string; reason: string | null }>;
  }>;
  held: HeldSnapshot[];
  pending_rows: number;
  pending_bytes: number;
  ledger_bytes: number;
  waits: CaptureWaitSnapshot[];
  wal_sources: { trigger: number; logical: number; switching: number };
  wal_slot: { retained: number | null; limit: number } | null;
  schema_version: number | null;
}

/** The statement, for one catalog schema. */
export function snapshotSql(schema: string): string {
  const s = quoteIdent(schema);
  const locksOn = (oid: string, modes: string[]) => `
        l.locktype = 'relation' AND l.relation IN ${withDescendantsSql(oid)}
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.mode = ANY (ARRAY[${modes.map(quoteLiteral).join(', ')}])
        AND l.pid IS DISTINCT FROM pg_backend_pid()
        AND l.pid IS DISTINCT FROM (SELECT h.pid FROM pg_locks h
                                     WHERE h.locktype = 'advisory' AND h.granted
                                       AND h.classid = ${LOCK_CLASS.staging}::oid
                                       AND h.objid = ((hashtext(${quoteLiteral(schema)})::bigint + 4294967296) % 4294967296)::oid
                                     LIMIT 1)`;
  return `
WITH RECURSIVE floor AS (
  SELECT k.snap FROM ${s}.ticks k WHERE k.seq = (SELECT min(cursor_tick) FROM ${s}.pipeline)
),
pending AS (
  SELECT count(*)::float8 AS n, coalesce(sum(pg_column_size(l.*)), 0)::float8 AS bytes
    FROM (SELECT l.* FROM ${s}.ledger l, floor f
           WHERE l.xid >= pg_snapshot_xmin(f.snap)::text::bigint
             AND NOT pg_visible_in_snapshot(l.xid::text::xid8, f.snap)
           LIMIT ${LEDGER_PENDING_CAP}) l
),
-- What status() asks per transform, asked once for all of them (set-based: a subquery per
-- transform made the statement cost a couple of milliseconds a transform).
edges AS (
  SELECT ts.transform_id AS id, u.id AS up
    FROM ${s}.transform_sources ts JOIN ${s}.transforms u ON u.target_oid = ts.source_oid
  UNION
  -- A union's table is fed by its branches (ADR 0059).
  SELECT ts.transform_id, f.transform_id
    FROM ${s}.transform_sources ts JOIN ${s}.union_feeds f ON f.table_oid = ts.source_oid
),
upstream(id, up) AS (
  SELECT id, up FROM edges
  UNION
  SELECT c.id, e.up FROM upstream c JOIN edges e ON e.id = c.up
),
-- Some transform upstream (at any depth) is paused or not live yet.
upstream_behind AS (
  SELECT DISTINCT c.id FROM upstream c
    JOIN ${s}.transforms u ON u.id = c.up JOIN ${s}.pipeline pu ON pu.transform_id = u.id
   WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live'
),
-- It reads a column paused upstream (every column it reads, when that transform is paused).
upstream_paused AS (
  SELECT DISTINCT src.transform_id AS id FROM ${s}.transform_sources src
    JOIN ${s}.transforms u ON u.target_oid = src.source_oid
    JOIN ${s}.transform_columns uc ON uc.transform_id = u.id
   WHERE uc.name = ANY (src.read_columns) AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
),
correcting AS (
  SELECT DISTINCT ts.transform_id AS id FROM ${s}.corrections c
    JOIN ${s}.sources src ON src.id = c.source_id
    JOIN ${s}.transform_sources ts ON ts.source_oid = src.source_oid
),
paused_columns AS (
  SELECT c.transform_id AS id,
         jsonb_agg(jsonb_build_object('address', t.target_name || '.' || c.name, 'reason', c.pause_reason)
                   ORDER BY c.name) AS columns
    FROM ${s}.transform_columns c JOIN ${s}.transforms t ON t.id = c.transform_id
   WHERE c.paused_at IS NOT NULL GROUP BY c.transform_id
)
SELECT
  (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'target', t.target_name, 'paused', t.paused_at IS NOT NULL,
            'pause_reason', t.pause_reason, 'phase', p.phase,
            'restored', (SELECT ${s}._restore_reason()) IS NOT NULL,
            'has_cursor', p.cursor_tick IS NOT NULL,
            'lag_segments', lag.segments, 'lag_seconds', lag.seconds,
            'drain', ${s}._drain_share(t.id),
            'has_backfill', p.backfill_started_at IS NOT NULL
                            AND (p.phase = 'backfilling' OR p.backfill_done > 0),
            -- As status() counts it (migration 0023): a build filling chunks from the chunks left.
            'backfill_done', CASE WHEN p.phase = 'backfilling' AND p.backfill_stage = 'chunks'
                                  THEN greatest(p.backfill_total - (
                                         SELECT coalesce(sum(c.rows), 0) FROM ${s}.build_chunks c
                                          WHERE c.transform_id = t.id), 0)
                                  ELSE p.backfill_done END,
            'backfill_total', p.backfill_total,
            'capture_failure', t.capture_failure,
            'correcting', t.id IN (SELECT id FROM correcting),
            'upstream_paused', t.id IN (SELECT id FROM upstream_paused),
            'upstream_behind', t.id IN (SELECT id FROM upstream_behind),
            'paused_columns', coalesce((SELECT pc.columns FROM paused_columns pc WHERE pc.id = t.id), '[]')
          ) ORDER BY t.target_name), '[]')
     FROM ${s}.transforms t
     JOIN ${s}.pipeline p ON p.transform_id = t.id
     CROSS JOIN LATERAL (
       SELECT count(*) AS segments, extract(epoch FROM clock_timestamp() - min(k.at))::float8 AS seconds
         FROM ${s}.ticks k WHERE k.seq > p.cursor_tick) lag) AS transforms,
  (SELECT coalesce(jsonb_agg(jsonb_build_object('address', a.address, 'target', a.target, 'count', a.n)
                             ORDER BY a.address), '[]')
     FROM (SELECT CASE WHEN h.column_name = '' THEN t.target_name::text
                       ELSE t.target_name || '.' || h.column_name END AS address,
                  t.target_name AS target, count(*) AS n
             FROM ${s}.held_keys h JOIN ${s}.transforms t ON t.id = h.transform_id
            GROUP BY 1, 2) a) AS held,
  (SELECT n FROM pending) AS pending_rows,
  (SELECT bytes FROM pending) AS pending_bytes,
  (SELECT coalesce(sum(pg_total_relation_size(h.inhrelid)), 0)::float8
     FROM pg_inherits h WHERE h.inhparent = ${quoteLiteral(`${s}.ledger`)}::regclass) AS ledger_bytes,
  (SELECT coalesce(jsonb_agg(w ORDER BY w.table, w.operation), '[]') FROM (
     -- A lock capture waits for: every session or prepared transaction holding or queued
     -- for a conflicting lock on the source, its partitions or children.
     SELECT src.qualified AS table, src.wait->>'operation' AS operation,
            extract(epoch FROM clock_timestamp() - (src.wait->>'since')::timestamptz)::float8 AS seconds,
            (SELECT count(DISTINCT coalesce(l.pid::text, l.virtualtransaction)) FROM pg_locks l
              WHERE ${locksOn('src.source_oid', CONFLICTS_WITH_SHARE_ROW_EXCLUSIVE)}) AS blockers
       FROM ${s}.sources src WHERE src.wait IS NOT NULL
     UNION ALL
     -- A widen waited out: the transactions the staging worker recorded (until it has,
     -- every one holding a writer lock).
     SELECT src.qualified, 'widen',
            extract(epoch FROM clock_timestamp() - src.widened_at)::float8,
            coalesce(jsonb_array_length(src.widen_holders),
                     (SELECT count(DISTINCT coalesce(l.pid::text, l.virtualtransaction)) FROM pg_locks l
                       WHERE ${locksOn('src.source_oid', WRITER_LOCK_MODES)}))
       FROM ${s}.sources src WHERE src.widened_at IS NOT NULL
     UNION ALL
     -- WAL capture published a source: the transactions that began before still run.
     SELECT src.qualified, 'publish',
            extract(epoch FROM clock_timestamp() - src.wal_since)::float8,
            (SELECT count(*) FROM ${s}._publish_waits_on(src.wal_xmax))
       FROM ${s}.sources src WHERE src.wal_state = 'publishing' AND src.installed_at IS NULL) w) AS waits,
  (SELECT jsonb_build_object(
            'trigger', count(*) FILTER (WHERE src.wal_state IS NULL),
            'logical', count(*) FILTER (WHERE src.wal_state = 'ready' AND src.installed_at IS NULL),
            'switching', count(*) FILTER (WHERE src.wal_state IS NOT NULL
                                           AND NOT (src.wal_state = 'ready' AND src.installed_at IS NULL)))
     FROM ${s}.sources src) AS wal_sources,
  (SELECT CASE WHEN c.wal_slot IS NOT NULL THEN jsonb_build_object(
            'limit', c.wal_retention_limit,
            'retained', (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::float8
                           FROM pg_replication_slots rs
                          WHERE rs.slot_name = c.wal_slot AND rs.database = current_database())) END
     FROM ${s}.config c) AS wal_slot,
  (SELECT max(version) FROM ${s}.migrations) AS schema_version`;
}

/** However it is read (a call, the staging worker's session), the snapshot gives up after this. */
const SNAPSHOT_STATEMENT_TIMEOUT_MS = 5_000;

/**
 * Reads the snapshot on `session`: one statement, in a transaction of its own, without
 * JIT and with a short statement timeout. Its cost estimate (pg_locks, the recursive
 * upstream walk) passes the JIT threshold while the work is a few milliseconds: JIT
 * compiling it took about a second (`npm run bench`, scenario scrape).
 */
export async function readSnapshot(session: Session, schema: string): Promise<InstanceSnapshot> {
  const [row] = await session.transaction(async () => {
    await session.query(
      "SELECT set_config('jit', 'off', true), set_config('statement_timeout', $1, true)",
      [String(SNAPSHOT_STATEMENT_TIMEOUT_MS)],
    );
    return session.query<Row>(snapshotSql(schema));
  });
  const transforms = new Map<string, TransformSnapshot>();
  for (const t of row?.transforms ?? []) {
    transforms.set(t.target, {
      target: t.target,
      status: deriveLifecycle({
        paused: t.paused,
        phase: t.phase,
        restored: t.restored,
        correcting: t.correcting,
        upstreamPausedColumns: t.upstream_paused,
        upstreamBehind: t.upstream_behind,
      }),
      pauseReason: t.pause_reason,
      lagSegments: t.has_cursor ? Number(t.lag_segments) : 0,
      lagSeconds: t.has_cursor ? (t.lag_seconds ?? 0) : 0,
      drainSeconds: Number(t.drain.seconds),
      drainShare: t.drain.share === null ? null : Number(t.drain.share),
      backfill: t.has_backfill
        ? {
            keysDone: Number(t.backfill_done),
            keysTotal: t.backfill_total === null ? null : Number(t.backfill_total),
          }
        : null,
      captureFailure: t.capture_failure
        ? {
            kind: t.capture_failure.kind,
            error: t.capture_failure.error,
            columns: t.capture_failure.columns,
            detectedAt: new Date(t.capture_failure.detected_at),
          }
        : null,
      pausedColumns: t.paused_columns,
    });
  }
  return {
    at: Date.now(),
    transforms,
    held: (row?.held ?? []).map((h) => ({ ...h, count: Number(h.count) })),
    ledger: {
      pendingRows: Number(row?.pending_rows ?? 0),
      pendingBytes: Number(row?.pending_bytes ?? 0),
      bytes: Number(row?.ledger_bytes ?? 0),
    },
    captureWaits: (row?.waits ?? []).map((w) => ({
      table: w.table,
      operation: w.operation,
      seconds: Math.max(0, Number(w.seconds)),
      blockers: Number(w.blockers),
    })),
    wal: {
      sources: {
        trigger: Number(row?.wal_sources.trigger ?? 0),
        logical: Number(row?.wal_sources.logical ?? 0),
        switching: Number(row?.wal_sources.switching ?? 0),
      },
      slot: row?.wal_slot
        ? {
            retainedBytes: row.wal_slot.retained === null ? null : Number(row.wal_slot.retained),
            limitBytes: Number(row.wal_slot.limit),
          }
        : null,
    },
    schemaVersion: row?.schema_version == null ? null : Number(row.schema_version),
  };
}
