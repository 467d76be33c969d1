import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import { WRITER_LOCK_MODES, withDescendantsSql } from '../staging/widen-wait.js';
import type {
  CaptureWait,
  DrainFailure,
  Lifecycle,
  LockBlocker,
  PreparedBlocker,
  SourceIndexGap,
  Status,
} from './status-types.js';

/** Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes. */
const CONFLICTS_WITH_SHARE_ROW_EXCLUSIVE = [
  'RowExclusiveLock',
  'ShareUpdateExclusiveLock',
  'ShareLock',
  'ShareRowExclusiveLock',
  'ExclusiveLock',
  'AccessExclusiveLock',
];

interface StatusRow {
  target_name: string;
  paused_at: Date | null;
  pause_reason: string | null;
  phase: Exclude<Lifecycle, 'paused'>;
  cursor_tick: string | null;
  backfill_done: string;
  backfill_total: string | null;
  backfill_started_at: Date | null;
  build_attempts: number;
  build_error: string | null;
  build_next_at: Date | null;
  held_keys: string;
  lag_segments: string;
  lag_seconds: number | null;
  paused_columns: string[];
  paused_upstream_columns: string[];
  upstream_behind: boolean;
  drain_failure: {
    seg: number;
    attempts: number;
    error: string;
    sqlstate: string | null;
    since: string;
    last_seen: string;
    tables: string[];
  } | null;
  source_index_gaps: Array<{
    table: string;
    columns: string[];
    role: SourceIndexGap['role'];
    opted_out: boolean;
    fix: string;
  }>;
  correcting: Array<{ node: string; since: string; remaining: number | null }>;
  capture_failure: {
    kind: 'capture' | 'halt' | 'disruption';
    error: string;
    columns: string[];
    detected_at: string;
  } | null;
  capture: {
    setting: 'trigger' | 'logical';
    sources: Array<{
      table: string;
      mode: 'trigger' | 'logical' | 'switching';
      reason: string | null;
    }>;
    slot: { name: string; retained: string | null; limit: string; confirmed: string | null } | null;
  };
  capture_wait: {
    operation: CaptureWait['operation'];
    table: string;
    lock_mode: string;
    since: string;
    /** Install and uninstall: the lock attempts made so far. */
    attempts?: number;
    oid: string;
    /** For a widen: the transactions waited on (null until the staging worker has looked). */
    holders?: Array<{ vxid: string }> | null;
    /** For a publish: transactions with an xid below this one are waited on. */
    xmax?: string | null;
  } | null;
}

/** A transform's status, or `not_found`. */
export async function readStatus(
  session: Session,
  schema: string,
  target: string,
): Promise<Status> {
  const s = quoteIdent(schema);
  const [row] = await session.query<StatusRow>(
    `SELECT t.target_name, t.paused_at, t.pause_reason, t.capture_failure, p.phase, p.cursor_tick,
            p.backfill_done, p.backfill_total, p.backfill_started_at,
            p.build_attempts, p.build_error, p.build_next_at,
            (SELECT count(*) FROM ${s}.held_keys h WHERE h.transform_id = t.id) AS held_keys,
            (SELECT count(*) FROM ${s}.ticks k WHERE k.seq > p.cursor_tick) AS lag_segments,
            (SELECT extract(epoch FROM clock_timestamp() - min(k.at))::float8
               FROM ${s}.ticks k WHERE k.seq > p.cursor_tick) AS lag_seconds,
            ARRAY(SELECT t.target_name || '.' || c.name FROM ${s}.transform_columns c
                   WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name) AS paused_columns,
            -- Columns this transform reads of an upstream transform's target that are paused
            -- there (every column it reads, when the upstream transform is paused as a whole).
            ARRAY(SELECT DISTINCT u.target_name || '.' || uc.name
                    FROM ${s}.transform_sources src
                    JOIN ${s}.transforms u ON u.target_oid = src.source_oid
                    JOIN ${s}.transform_columns uc ON uc.transform_id = u.id
                   WHERE src.transform_id = t.id
                     AND uc.name = ANY (src.read_columns)
                     AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
                   ORDER BY 1) AS paused_upstream_columns,
            (SELECT jsonb_build_object(
                      'seg', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
                      'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'last_seen', pg.last_failed_at,
                      'tables', ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                        FROM ${s}.transform_sources ts
                                       WHERE ts.transform_id = t.id ORDER BY ts.ordinal))
               FROM ${s}.pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
              ORDER BY pg.attempts DESC, pg.page LIMIT 1) AS drain_failure,
            -- A lock capture waits for first; else, for a transform not built yet, a widen
            -- of a column it reads waiting for writers that may run the older trigger.
            coalesce(
              (SELECT jsonb_build_object(
                        'operation', src.wait->>'operation', 'table', src.qualified,
                        'lock_mode', src.wait->>'lock_mode', 'since', src.wait->>'since',
                        'attempts', coalesce((src.wait->>'attempts')::int, 1),
                        'oid', src.source_oid::text)
                 FROM ${s}.transform_sources ts JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
                ORDER BY ts.ordinal LIMIT 1),
              (SELECT jsonb_build_object(
                        'operation', 'widen', 'table', src.qualified, 'lock_mode', 'ROW EXCLUSIVE',
                        'since', src.widened_at, 'oid', src.source_oid::text,
                        'holders', src.widen_holders)
                 FROM ${s}.transform_sources ts JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                WHERE ts.transform_id = t.id AND p.phase = 'waiting_to_backfill'
                  AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
                ORDER BY ts.ordinal LIMIT 1),
              (SELECT jsonb_build_object(
                        'operation', 'publish', 'table', src.qualified, 'lock_mode', 'none',
                        'since', src.wal_since, 'oid', src.source_oid::text,
                        'xmax', src.wal_xmax::text)
                 FROM ${s}.transform_sources ts JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                WHERE ts.transform_id = t.id AND p.phase = 'waiting_to_backfill'
                  AND src.wal_state = 'publishing' AND src.installed_at IS NULL
                ORDER BY ts.ordinal LIMIT 1)) AS capture_wait,
            (SELECT jsonb_build_object(
                      'setting', c.capture,
                      'sources', coalesce((
                        SELECT jsonb_agg(jsonb_build_object(
                                 'table', coalesce(src.qualified, ts.source_schema || '.' || ts.source_name),
                                 'mode', CASE WHEN src.wal_state = 'ready' AND src.installed_at IS NULL THEN 'logical'
                                              WHEN src.wal_state IS NULL THEN 'trigger'
                                              ELSE 'switching' END,
                                 'reason', CASE WHEN c.capture = 'logical' AND src.wal_state IS NULL
                                                 AND EXISTS (SELECT 1 FROM pg_class rc WHERE rc.oid = ts.source_oid)
                                                THEN ${s}._wal_ineligible(ts.source_oid) END)
                               ORDER BY ts.ordinal)
                          FROM ${s}.transform_sources ts
                          LEFT JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                         WHERE ts.transform_id = t.id), '[]'),
                      'slot', CASE WHEN c.wal_slot IS NOT NULL THEN jsonb_build_object(
                        'name', c.wal_slot, 'limit', c.wal_retention_limit::text,
                        'retained', (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint::text
                                       FROM pg_replication_slots rs
                                      WHERE rs.slot_name = c.wal_slot AND rs.database = current_database()),
                        'confirmed', (SELECT rs.confirmed_flush_lsn::text FROM pg_replication_slots rs
                                       WHERE rs.slot_name = c.wal_slot AND rs.database = current_database())) END)
               FROM ${s}.config c) AS capture,
            ${s}.source_index_gaps(t.id) AS source_index_gaps,
            (SELECT coalesce(jsonb_agg(jsonb_build_object(
                      'node', c.node, 'since', c.since,
                      'remaining', CASE WHEN c.keys_total IS NOT NULL
                                        THEN greatest(c.keys_total - c.keys_done, 0) END)
                    ORDER BY c.since, c.node), '[]')
               FROM ${s}.corrections c JOIN ${s}.sources src ON src.id = c.source_id
               JOIN ${s}.transform_sources ts ON ts.source_oid = src.source_oid
              WHERE ts.transform_id = t.id) AS correcting,
            -- Some transform upstream (at any depth) is paused or not live yet: this one
            -- cannot be keeping up with its sources' sources.
            EXISTS (
              WITH RECURSIVE up(id) AS (
                SELECT u.id FROM ${s}.transform_sources ts
                  JOIN ${s}.transforms u ON u.target_oid = ts.source_oid
                 WHERE ts.transform_id = t.id
                UNION
                SELECT u.id FROM up
                  JOIN ${s}.transform_sources ts ON ts.transform_id = up.id
                  JOIN ${s}.transforms u ON u.target_oid = ts.source_oid)
              SELECT 1 FROM up JOIN ${s}.transforms u ON u.id = up.id
                JOIN ${s}.pipeline pu ON pu.transform_id = u.id
               WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live') AS upstream_behind
       FROM ${s}.transforms t
       JOIN ${s}.pipeline p ON p.transform_id = t.id
      WHERE t.target_name = $1`,
    [target],
  );
  if (!row) throw new TrellisError('not_found', `there is no transform named ${target}`);

  let status: Lifecycle = row.paused_at ? 'paused' : row.phase;
  // Rows that came or went without DML are being re-derived: a build, of a part of it.
  if ((status === 'live' || status === 'catching_up') && row.correcting.length > 0) {
    status = 'backfilling';
  }
  // A live transform reading a paused upstream column, or reading a target that is still
  // being built, is not keeping up with its sources.
  if (status === 'live' && (row.paused_upstream_columns.length > 0 || row.upstream_behind)) {
    status = 'catching_up';
  }
  const hasCursor = row.cursor_tick !== null;
  return {
    target: row.target_name,
    status,
    pauseReason: row.pause_reason,
    heldKeys: Number(row.held_keys),
    pausedColumns: row.paused_columns,
    pausedUpstreamColumns: row.paused_upstream_columns,
    sourceIndexGaps: row.source_index_gaps.map((g) => ({
      table: g.table,
      columns: g.columns,
      role: g.role,
      optedOut: g.opted_out,
      fix: g.fix,
    })),
    correcting: row.correcting.map((c) => ({
      node: c.node,
      since: new Date(c.since),
      keysRemaining: c.remaining === null ? null : Number(c.remaining),
    })),
    captureFailure: row.capture_failure
      ? {
          kind: row.capture_failure.kind,
          error: row.capture_failure.error,
          columns: row.capture_failure.columns,
          detectedAt: new Date(row.capture_failure.detected_at),
        }
      : null,
    captureWait: row.capture_wait ? await captureWait(session, schema, row.capture_wait) : null,
    buildFailure:
      row.build_attempts > 0 && row.build_error && row.build_next_at
        ? { attempts: row.build_attempts, error: row.build_error, nextAttemptAt: row.build_next_at }
        : null,
    drainFailure: row.drain_failure ? drainFailure(row.drain_failure) : null,
    backfill:
      row.backfill_started_at && (row.phase === 'backfilling' || Number(row.backfill_done) > 0)
        ? {
            keysDone: Number(row.backfill_done),
            keysTotal: row.backfill_total === null ? null : Number(row.backfill_total),
            startedAt: row.backfill_started_at,
          }
        : null,
    lag: {
      segments: hasCursor ? Number(row.lag_segments) : 0,
      seconds: hasCursor ? (row.lag_seconds ?? 0) : 0,
    },
    capture: {
      setting: row.capture.setting,
      sources: row.capture.sources,
      slot: row.capture.slot
        ? {
            name: row.capture.slot.name,
            retainedBytes:
              row.capture.slot.retained === null ? null : Number(row.capture.slot.retained),
            limitBytes: Number(row.capture.slot.limit),
            confirmedLsn: row.capture.slot.confirmed,
          }
        : null,
    },
  };
}

function drainFailure(f: NonNullable<StatusRow['drain_failure']>): DrainFailure {
  return {
    segSeq: Number(f.seg),
    tables: f.tables,
    error: f.error,
    sqlstate: f.sqlstate,
    since: new Date(f.since),
    lastSeen: new Date(f.last_seen),
    attempts: f.attempts,
  };
}

/**
 * The capture change a transform waits on, with what it waits for: for install and
 * uninstall, every session and prepared transaction holding or queued for a lock on the
 * source (or a partition or inheritance child) that conflicts with it (the staging
 * worker's own request is not a blocker); for a widen, the transactions recorded when it
 * committed that are still there (until the staging worker has recorded them, every one
 * holding a writer lock).
 */
async function captureWait(
  session: Session,
  schema: string,
  wait: NonNullable<StatusRow['capture_wait']>,
): Promise<CaptureWait> {
  if (wait.operation === 'publish') return publishWait(session, wait);
  const widen = wait.operation === 'widen' && 'holders' in wait;
  const modes = widen ? WRITER_LOCK_MODES : CONFLICTS_WITH_SHARE_ROW_EXCLUSIVE;
  // null: any transaction; otherwise only these virtual transaction ids.
  const vxids = widen && wait.holders ? wait.holders.map((h) => h.vxid) : null;
  const locks = `
        l.locktype = 'relation'
        AND l.relation IN ${withDescendantsSql('$1')}
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.mode = ANY ($2::text[])
        AND ($3::text[] IS NULL OR l.virtualtransaction = ANY ($3::text[]))`;
  const blockers = await session.query<{
    pid: number;
    application_name: string;
    datname: string;
    state: string | null;
    xact_start: Date | null;
    query_start: Date | null;
    query: string;
  }>(
    `SELECT DISTINCT ON (a.pid) a.pid, a.application_name, a.datname, a.state, a.xact_start,
            a.query_start, a.query
       FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE ${locks} AND l.pid <> pg_backend_pid()
        AND l.pid NOT IN (SELECT h.pid FROM pg_locks h
                           WHERE h.locktype = 'advisory' AND h.granted AND h.classid = $4::oid
                             AND h.objid = ((hashtext($5)::bigint + 4294967296) % 4294967296)::oid)
      ORDER BY a.pid`,
    [wait.oid, modes, vxids, LOCK_CLASS.staging, schema],
  );
  // A prepared transaction's locks have no pid: it is found by the transaction id lock it
  // holds under the same virtual transaction id.
  const prepared = await session.query<{
    gid: string;
    owner: string;
    database: string;
    prepared: Date;
    transaction: string;
  }>(
    `SELECT DISTINCT ON (p.prepared, p.gid) p.gid, p.owner, p.database, p.prepared,
            p.transaction::text AS transaction
       FROM pg_locks l
       JOIN pg_locks x ON x.locktype = 'transactionid' AND x.pid IS NULL
                      AND x.virtualtransaction = l.virtualtransaction
       JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
      WHERE ${locks} AND l.pid IS NULL
      ORDER BY p.prepared, p.gid`,
    [wait.oid, modes, vxids],
  );
  return {
    operation: wait.operation,
    table: wait.table,
    lockMode: wait.lock_mode,
    since: new Date(wait.since),
    attempts: wait.attempts ?? null,
    blockers: blockers.map(
      (b): LockBlocker => ({
        pid: b.pid,
        applicationName: b.application_name,
        database: b.datname,
        state: b.state,
        xactStart: b.xact_start,
        queryStart: b.query_start,
        query: b.query,
      }),
    ),
    prepared: prepared.map(
      (p): PreparedBlocker => ({
        gid: p.gid,
        owner: p.owner,
        database: p.database,
        prepared: p.prepared,
        transaction: p.transaction,
      }),
    ),
  };
}

/**
 * A source published for WAL capture that a backfill waits on: the transactions running
 * when it was published (an xid below `xmax` that a snapshot still counts as running),
 * anywhere in the cluster, prepared ones included.
 */
async function publishWait(
  session: Session,
  wait: NonNullable<StatusRow['capture_wait']>,
): Promise<CaptureWait> {
  const running = `(SELECT (x::text::bigint % 4294967296)::text AS xid
                      FROM pg_snapshot_xip(pg_current_snapshot()) x
                     WHERE $1::text IS NOT NULL AND x < $1::text::xid8)`;
  const blockers = await session.query<{
    pid: number;
    application_name: string;
    datname: string;
    state: string | null;
    xact_start: Date | null;
    query_start: Date | null;
    query: string;
  }>(
    `SELECT a.pid, a.application_name, a.datname, a.state, a.xact_start, a.query_start, a.query
       FROM pg_stat_activity a
      WHERE a.backend_xid::text IN ${running} AND a.pid <> pg_backend_pid()
      ORDER BY a.pid`,
    [wait.xmax ?? null],
  );
  const prepared = await session.query<{
    gid: string;
    owner: string;
    database: string;
    prepared: Date;
    transaction: string;
  }>(
    `SELECT p.gid, p.owner, p.database, p.prepared, p.transaction::text AS transaction
       FROM pg_prepared_xacts p WHERE p.transaction::text IN ${running}
      ORDER BY p.prepared, p.gid`,
    [wait.xmax ?? null],
  );
  return {
    operation: 'publish',
    table: wait.table,
    lockMode: wait.lock_mode,
    since: new Date(wait.since),
    attempts: null,
    blockers: blockers.map(
      (b): LockBlocker => ({
        pid: b.pid,
        applicationName: b.application_name,
        database: b.datname,
        state: b.state,
        xactStart: b.xact_start,
        queryStart: b.query_start,
        query: b.query,
      }),
    ),
    prepared: prepared.map(
      (p): PreparedBlocker => ({
        gid: p.gid,
        owner: p.owner,
        database: p.database,
        prepared: p.prepared,
        transaction: p.transaction,
      }),
    ),
  };
}
