import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';
import { markWidened } from '../staging/widen-wait.js';
import {
  type CaptureSpec,
  captureFunctionsSql,
  captureTriggersSql,
  dropFunctionsSql,
  dropRowTriggerSql,
  dropTriggersSql,
  rowCaptureFunctionSql,
  rowTriggerName,
  rowTriggerSql,
  triggerName,
} from './trigger-sql.js';
import {
  addToPublication,
  readWalCaptureState,
  recordDrainLsn,
  recordPublishXmax,
  removeFromPublication,
  settlePublished,
  type WalCaptureState,
} from './wal/publication.js';

/**
 * The partitions and inheritance children of source `d.source_oid`, at every level
 * (`dt.relid`; pg_inherits holds both), not the source itself.
 */
const DESCENDANTS = `LATERAL (WITH RECURSIVE tree(relid) AS (
                        SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = d.source_oid
                        UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
                      SELECT relid FROM tree) dt`;

/** The lock capture DDL takes on a source: it conflicts with every writer. */
export const CAPTURE_LOCK_MODE = 'SHARE ROW EXCLUSIVE';

/** How long one attempt waits for the source lock: writers queue behind it meanwhile. */
const LOCK_TIMEOUT_MS = 100;

interface DesiredRow {
  oid: string;
  present: boolean;
  qualified: string | null;
  display: string;
  key_columns: string[] | null;
  key_types: string[] | null;
  columns: string[];
  partitions: string[];
  uncaptured: string[];
  /** Why the table cannot be captured from the WAL (null when it can). */
  ineligible: string | null;
  /** A logical replication subscription writes it (pg_subscription_rel). */
  subscribed: boolean;
  /** It has the row-level capture trigger such a table needs under trigger capture. */
  row_captured: boolean;
}

interface InstalledRow {
  id: number;
  oid: string;
  qualified: string;
  key_columns: string[];
  key_types: string[];
  captured_columns: string[];
  installed: boolean;
  present: boolean;
  table_sql: string | null;
  /** Its place in the publication (WAL capture): null, 'publishing' or 'ready'. */
  wal_state: 'publishing' | 'ready' | null;
}

/**
 * Brings capture in line with the catalog: installs it on every table a transform reads,
 * widens (or narrows) the columns an UPDATE must change to be captured, and removes it
 * from tables nothing reads any more. A source whose lock is not free within a short
 * timeout is left for a later pass, with the wait recorded for `status()`.
 */
export class CaptureReconciler {
  /** Per source oid: when to try again after a lock wait. */
  private readonly retryAt = new Map<string, number>();
  /** Per source oid: lock waits in a row (the pause between attempts grows with them). */
  private readonly waits = new Map<string, number>();

  constructor(
    private readonly schema: string,
    private readonly log: Logger,
  ) {}

  /** When the next capture change that waited for a lock is due to be tried again (ms epoch). */
  nextRetryAt(): number {
    let next = Number.POSITIVE_INFINITY;
    for (const at of this.retryAt.values()) next = Math.min(next, at);
    return next;
  }

  async reconcile(session: Session): Promise<void> {
    const s = quoteIdent(this.schema);
    const desired = await session.query<DesiredRow>(
      `SELECT d.source_oid::text AS oid, c.oid IS NOT NULL AS present,
              quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS qualified,
              (SELECT ts.source_schema || '.' || ts.source_name FROM ${s}.transform_sources ts
                WHERE ts.source_oid = d.source_oid LIMIT 1) AS display,
              -- The table's primary key as it is now (a renamed key column is captured
              -- under its new name; transforms it broke are stopped: source-changes.ts).
              pk.key_columns, pk.key_types,
              ARRAY(SELECT a.attname::text
                 FROM pg_attribute a
                WHERE a.attrelid = d.source_oid AND a.attnum > 0 AND NOT a.attisdropped
                  AND a.attname IN (SELECT unnest(ts.read_columns) FROM ${s}.transform_sources ts
                                     WHERE ts.source_oid = d.source_oid)
                  AND NOT a.attname = ANY (pk.key_columns)
                ORDER BY a.attname) AS columns,
              -- A source's partitions and inheritance children, at every level: a plain
              -- FROM reads their rows, and statement triggers on the parent do not fire
              -- for statements run on them, so each gets the same capture; and those that
              -- lack it yet (created, attached or inheriting since).
              ARRAY(SELECT quote_ident(pn.nspname) || '.' || quote_ident(pc.relname)
                      FROM ${DESCENDANTS} JOIN pg_class pc ON pc.oid = dt.relid
                      JOIN pg_namespace pn ON pn.oid = pc.relnamespace) AS partitions,
              ARRAY(SELECT quote_ident(pn.nspname) || '.' || quote_ident(pc.relname)
                      FROM ${DESCENDANTS} JOIN pg_class pc ON pc.oid = dt.relid
                      JOIN pg_namespace pn ON pn.oid = pc.relnamespace
                     WHERE NOT EXISTS (SELECT 1 FROM pg_trigger tg
                                        WHERE tg.tgrelid = dt.relid AND tg.tgname = $1)) AS uncaptured,
              CASE WHEN c.oid IS NOT NULL THEN ${s}._wal_ineligible(d.source_oid) END AS ineligible,
              ${s}._subscribed(d.source_oid) AS subscribed,
              EXISTS (SELECT 1 FROM pg_trigger tg
                       WHERE tg.tgrelid = d.source_oid AND tg.tgname = $2) AS row_captured
         FROM (SELECT DISTINCT source_oid FROM ${s}.transform_sources) d
         LEFT JOIN pg_class c ON c.oid = d.source_oid
         LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN LATERAL (
           SELECT array_agg(a.attname ORDER BY k.i) AS key_columns,
                  array_agg(${s}._key_type(a.attrelid, a.attnum) ORDER BY k.i) AS key_types
             FROM pg_index x
             CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
            WHERE x.indrelid = d.source_oid AND x.indisprimary) pk ON true`,
      [triggerName(this.schema, 'insert'), rowTriggerName(this.schema)],
    );
    const installed = await session.query<InstalledRow>(
      `SELECT src.id, src.source_oid::text AS oid, src.qualified, src.key_columns, src.key_types,
              src.captured_columns, src.installed_at IS NOT NULL AS installed, c.oid IS NOT NULL AS present,
              quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS table_sql, src.wal_state
         FROM ${s}.sources src
         LEFT JOIN pg_class c ON c.oid = src.source_oid
         LEFT JOIN pg_namespace n ON n.oid = c.relnamespace`,
    );
    const byOid = new Map(installed.map((row) => [row.oid, row]));
    const now = Date.now();
    const wal = await readWalCaptureState(session, this.schema);

    for (const want of desired) {
      // A table without a primary key cannot be captured (its readers are stopped).
      if (!want.present || !want.qualified || !want.key_columns) continue;
      if ((this.retryAt.get(want.oid) ?? 0) > now) continue;
      let row = byOid.get(want.oid);
      if (!row) {
        const [created] = await session.query<InstalledRow>(
          `INSERT INTO ${s}.sources (source_oid, qualified, key_columns, key_types)
           VALUES ($1::oid, $2, $3::name[], $4) RETURNING id, source_oid::text AS oid, qualified,
                  key_columns, key_types, captured_columns, false AS installed, true AS present,
                  $5::text AS table_sql, NULL::text AS wal_state`,
          [want.oid, want.display, want.key_columns, want.key_types, want.qualified],
        );
        row = created!;
      }
      const spec: CaptureSpec = {
        schema: this.schema,
        sourceId: row.id,
        table: want.qualified,
        keyColumns: want.key_columns,
        keyTypes: want.key_types ?? [],
        captured: want.columns,
      };
      const wanted = [...want.columns].sort();
      const have = [...row.captured_columns].sort();
      if (await this.followMode(session, wal, want, row, spec)) continue;
      if (!row.installed) {
        await this.change(session, row, 'install', spec, async () => {
          for (const sql of captureFunctionsSql(spec)) await session.query(sql);
          for (const table of [want.qualified!, ...want.partitions]) {
            for (const sql of dropTriggersSql({ ...spec, table })) await session.query(sql);
            for (const sql of captureTriggersSql({ ...spec, table })) await session.query(sql);
          }
          // Nothing was captured before: the backfill (or RESUME's rebuild) reads every row.
          if (want.subscribed) for (const sql of rowTriggerSql(spec)) await session.query(sql);
          else await session.query(dropRowTriggerSql(spec));
        });
        continue;
      }
      if (want.uncaptured.length > 0) {
        await this.change(
          session,
          row,
          'install',
          { ...spec, table: want.uncaptured[0]! },
          async () => {
            for (const table of want.uncaptured.slice(1)) {
              await session.query(`LOCK TABLE ${table} IN ${CAPTURE_LOCK_MODE} MODE`);
            }
            for (const table of want.uncaptured) {
              for (const sql of dropTriggersSql({ ...spec, table })) await session.query(sql);
              for (const sql of captureTriggersSql({ ...spec, table })) await session.query(sql);
            }
          },
        );
      } else if (want.key_columns.join('\0') !== row.key_columns.join('\0')) {
        // The key was renamed or replaced: every function names it. No lock needed.
        await this.change(session, row, 'narrow', spec, async () => {
          for (const sql of captureFunctionsSql(spec)) await session.query(sql);
        });
      } else if (wanted.join('\0') !== have.join('\0')) {
        // Only the UPDATE trigger's function changes: no lock on the source is needed.
        const added = wanted.filter((c) => !have.includes(c));
        await this.change(session, row, added.length > 0 ? 'widen' : 'narrow', spec, async () => {
          for (const sql of captureFunctionsSql(spec, ['update'])) await session.query(sql);
          // Writers that hold the source may still run the older function: backfills
          // reading the added columns wait for them (staging/widen-wait.ts).
          if (added.length > 0) await markWidened(session, this.schema, row.id, added);
        });
      }
      if (want.subscribed !== want.row_captured)
        await this.followSubscription(session, row, spec, want.subscribed);
    }

    const wantedOids = new Set(desired.map((d) => d.oid));
    for (const row of installed) {
      if (wantedOids.has(row.oid) || (this.retryAt.get(row.oid) ?? 0) > now) continue;
      await this.uninstall(session, row, wal);
    }
    // Published sources whose older writers have all ended: their WAL capture is trusted.
    await settlePublished(session, this.schema, wal.publication, this.log);
    // A retry that came due and was not made (its table is gone) is not due any more.
    for (const [oid, at] of this.retryAt) if (at <= now) this.retryAt.delete(oid);
  }

  /**
   * Runs a capture change in its own transaction. Install takes the source's lock (with a
   * short lock_timeout): it waits out every transaction that wrote the table without the
   * triggers, and later writers fire them. Widen and narrow replace a function only; a
   * widen marks the source so that backfills needing it wait for the writers that may
   * still run the older function (ADR 0009).
   */
  private async change(
    session: Session,
    row: InstalledRow,
    operation: 'install' | 'widen' | 'narrow',
    spec: CaptureSpec,
    ddl: () => Promise<void>,
  ): Promise<boolean> {
    const s = quoteIdent(this.schema);
    const captured = spec.captured;
    try {
      await session.transaction(async () => {
        if (operation === 'install') {
          await session.query(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT_MS}ms'`);
          await session.query(`LOCK TABLE ${spec.table} IN ${CAPTURE_LOCK_MODE} MODE`);
        }
        await ddl();
        // The digest of the functions as installed: a disruption check compares it.
        await session.query(
          `UPDATE ${s}.sources SET captured_columns = $2::name[], key_columns = $3::name[],
                  key_types = $4, installed_at = coalesce(installed_at, now()), wait = NULL,
                  capture_digest = ${s}._capture_digest(id)
            WHERE id = $1`,
          [row.id, captured, spec.keyColumns, spec.keyTypes],
        );
        if (operation === 'install') {
          // Its partitions and children as they are under this lock (none can attach now):
          // later changes to them are corrected (staging/partition-corrections.ts).
          await session.query(
            `SELECT ${s}._record_members(id) FROM ${s}.sources WHERE id = $1 AND members_at IS NULL`,
            [row.id],
          );
        }
      });
    } catch (error) {
      if (sqlstateOf(error) !== SQLSTATE.lockNotAvailable) throw error;
      await this.recordWait(session, row, operation === 'narrow' ? 'widen' : operation);
      return false;
    }
    this.retryAt.delete(row.oid);
    this.waits.delete(row.oid);
    this.log.info({ table: row.qualified, operation, columns: captured }, `capture ${operation}`);
    return true;
  }

  /**
   * A captured source that became a logical replication subscription's target (or stopped
   * being one) gets (or loses) the row trigger the subscription's apply worker fires (ADR
   * 0039). The rows the apply worker wrote before the trigger was there reached no ledger:
   * the same transaction records that any row of the table may have changed (as a
   * TRUNCATE does), so its readers are rebuilt rather than left stale. The source's lock
   * waits out the apply worker's transaction in flight.
   */
  private async followSubscription(
    session: Session,
    row: InstalledRow,
    spec: CaptureSpec,
    subscribed: boolean,
  ): Promise<void> {
    const s = quoteIdent(this.schema);
    const done = await this.locked(session, row, 'install', async () => {
      await session.query(`LOCK TABLE ${spec.table} IN ${CAPTURE_LOCK_MODE} MODE`);
      if (!subscribed) {
        await session.query(dropRowTriggerSql(spec));
        return;
      }
      for (const sql of rowCaptureFunctionSql(spec)) await session.query(sql);
      for (const sql of rowTriggerSql(spec)) await session.query(sql);
      await session.query(
        `INSERT INTO ${s}.ledger (gen, source_id, xid, keys)
         SELECT ${s}.ledger_generation(x.xid), $1, x.xid, NULL
           FROM (SELECT pg_current_xact_id()::text::bigint AS xid) x`,
        [row.id],
      );
    });
    if (!done) return;
    this.log.warn(
      { table: row.qualified },
      subscribed
        ? `capture: ${row.qualified} is a logical replication subscription's target: its rows are captured row by row from now on, and its readers are rebuilt for the rows applied before`
        : `capture: ${row.qualified} is no longer a subscription's target: row capture removed`,
    );
  }

  /**
   * Moves a source toward the capture the instance asks for (ADR 0023). Returns true when
   * the source needs nothing more in this pass; false when its triggers are still its
   * capture (or one of two) and the trigger branches should keep them right.
   *
   * - Trigger → WAL: into the publication; once every transaction running then has ended,
   *   `ready` (settlePublished); then the triggers go, under the source's lock. Until then
   *   both capture.
   * - WAL → trigger: triggers installed under the lock, and out of the publication in the
   *   same transaction (every writer without triggers committed before the lock, and is
   *   decoded under the catalog of its time).
   * - A new source under WAL capture is published and never gets triggers; its backfills
   *   wait for `ready`.
   */
  private async followMode(
    session: Session,
    wal: WalCaptureState,
    want: DesiredRow,
    row: InstalledRow,
    spec: CaptureSpec,
  ): Promise<boolean> {
    const table = want.qualified!;
    // A source not published yet waits for the slot (and publication) on triggers; one
    // published stays so while a lost slot is made again (its readers were stopped).
    const logical =
      wal.capture === 'logical' &&
      want.ineligible === null &&
      (wal.ready || row.wal_state !== null);
    if (logical) {
      if (row.wal_state === null) {
        const done = await this.locked(session, row, 'install', async () => {
          await addToPublication(session, this.schema, wal.publication, row.id, table);
        });
        if (done) {
          await recordPublishXmax(session, this.schema, row.id);
          this.log.info({ table: row.qualified }, 'capture: table published (WAL capture)');
        }
        return true;
      }
      if (row.wal_state === 'ready' && row.installed) {
        const done = await this.locked(session, row, 'uninstall', async () => {
          await session.query(`LOCK TABLE ${table} IN ${CAPTURE_LOCK_MODE} MODE`);
          for (const t of [table, ...want.partitions]) {
            for (const sql of dropTriggersSql({ ...spec, table: t })) await session.query(sql);
          }
          // WAL capture decodes what a subscription applies too (ADR 0039).
          await session.query(dropRowTriggerSql(spec));
          for (const sql of dropFunctionsSql(spec)) await session.query(sql);
          await session.query(
            `UPDATE ${quoteIdent(this.schema)}.sources
                SET installed_at = NULL, captured_columns = '{}', capture_digest = NULL,
                    widened_at = NULL, widen_columns = NULL, widen_holders = NULL, wait = NULL
              WHERE id = $1`,
            [row.id],
          );
        });
        if (done)
          this.log.info({ table: row.qualified }, 'capture: triggers dropped (WAL capture)');
        return true;
      }
      if (!row.installed) {
        // WAL capture alone: the recorded key follows the table (the decoder's keys do).
        if (want.key_columns!.join('\0') !== row.key_columns.join('\0')) {
          await session.query(
            `UPDATE ${quoteIdent(this.schema)}.sources SET key_columns = $2::name[], key_types = $3
              WHERE id = $1`,
            [row.id, spec.keyColumns, spec.keyTypes],
          );
        }
        return true;
      }
      return false;
    }
    if (row.wal_state === null) return false;
    let done: boolean;
    if (!row.installed) {
      done = await this.change(session, row, 'install', spec, async () => {
        for (const sql of captureFunctionsSql(spec)) await session.query(sql);
        for (const t of [table, ...want.partitions]) {
          for (const sql of dropTriggersSql({ ...spec, table: t })) await session.query(sql);
          for (const sql of captureTriggersSql({ ...spec, table: t })) await session.query(sql);
        }
        await removeFromPublication(session, this.schema, wal.publication, row.id, table);
      });
    } else {
      done = await this.locked(session, row, 'uninstall', async () => {
        await removeFromPublication(session, this.schema, wal.publication, row.id, table);
      });
    }
    if (done) {
      await recordDrainLsn(session, this.schema);
      this.log.info(
        { table: row.qualified, reason: want.ineligible ?? `capture is ${wal.capture}` },
        'capture: table back on triggers',
      );
    }
    return true;
  }

  /**
   * Runs `fn` in its own transaction with the short lock timeout; a lock not had in time is
   * recorded as the source's wait and retried later (returns false).
   */
  private async locked(
    session: Session,
    row: InstalledRow,
    operation: 'install' | 'uninstall',
    fn: () => Promise<void>,
  ): Promise<boolean> {
    try {
      await session.transaction(async () => {
        await session.query(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT_MS}ms'`);
        await fn();
      });
    } catch (error) {
      if (sqlstateOf(error) !== SQLSTATE.lockNotAvailable) throw error;
      await this.recordWait(session, row, operation);
      return false;
    }
    this.retryAt.delete(row.oid);
    this.waits.delete(row.oid);
    return true;
  }

  private async uninstall(
    session: Session,
    row: InstalledRow,
    wal: WalCaptureState,
  ): Promise<void> {
    const s = quoteIdent(this.schema);
    const spec = { schema: this.schema, sourceId: row.id, table: row.table_sql ?? '' };
    try {
      await session.transaction(async () => {
        if (row.present && row.table_sql) {
          await session.query(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT_MS}ms'`);
          // Locks the partitions and children too (LOCK TABLE recurses), whose triggers
          // go with the parent's.
          await session.query(`LOCK TABLE ${row.table_sql} IN ${CAPTURE_LOCK_MODE} MODE`);
          const partitions = await session.query<{ name: string }>(
            `SELECT quote_ident(pn.nspname) || '.' || quote_ident(pc.relname) AS name
               FROM (SELECT $1::oid AS source_oid) d, ${DESCENDANTS}
               JOIN pg_class pc ON pc.oid = dt.relid JOIN pg_namespace pn ON pn.oid = pc.relnamespace`,
            [row.oid],
          );
          const tables = new Set([row.table_sql, ...partitions.map((p) => p.name)]);
          for (const table of tables) {
            for (const sql of dropTriggersSql({ ...spec, table })) await session.query(sql);
          }
          await session.query(dropRowTriggerSql({ ...spec, table: row.table_sql }));
        }
        for (const sql of dropFunctionsSql(spec)) await session.query(sql);
        if (row.wal_state !== null) {
          await removeFromPublication(session, this.schema, wal.publication, row.id, row.table_sql);
        }
        await session.query(`DELETE FROM ${s}.sources WHERE id = $1`, [row.id]);
      });
    } catch (error) {
      if (sqlstateOf(error) !== SQLSTATE.lockNotAvailable) throw error;
      await this.recordWait(session, row, 'uninstall');
      return;
    }
    if (row.wal_state !== null) await recordDrainLsn(session, this.schema);
    this.retryAt.delete(row.oid);
    this.waits.delete(row.oid);
    this.log.info({ table: row.qualified }, 'capture uninstalled');
  }

  private async recordWait(
    session: Session,
    row: InstalledRow,
    operation: 'install' | 'widen' | 'uninstall',
  ): Promise<void> {
    const s = quoteIdent(this.schema);
    // Each attempt queues the app's writers behind it for up to the lock timeout: back off
    // (0.25 s, 0.5 s, 1 s, then every 2 s) so a long wait stalls them rarely.
    const attempts = (this.waits.get(row.oid) ?? 0) + 1;
    this.waits.set(row.oid, attempts);
    this.retryAt.set(row.oid, Date.now() + Math.min(2_000, 125 * 2 ** attempts));
    await session.query(
      `UPDATE ${s}.sources
          SET wait = jsonb_build_object('operation', $2::text, 'lock_mode', $3::text,
                       'since', coalesce(wait->>'since', now()::text),
                       'attempts', coalesce((wait->>'attempts')::int, 0) + 1)
        WHERE id = $1`,
      [row.id, operation, CAPTURE_LOCK_MODE],
    );
    this.log.info({ table: row.qualified, operation }, `capture ${operation} waits for a lock`);
  }
}
