import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type { CallRunner } from '../calls.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import { packageVersion } from '../internal/package-version.js';
import type { Logger } from '../logger.js';
import { latestVersion } from '../schema/install-sql.js';
import { healthSignature, type ProcessHealth } from './health.js';

/** A heartbeat at least this often: three missed ones make a process stale (`workers()`). */
export const HEARTBEAT_MS = 10_000;
/** How often the workers' health is looked at (in memory) for a change worth writing now. */
const CHANGE_CHECK_MS = 1_000;
/** A heartbeat gives up after this (a call of its own, on the handle's pool). */
const HEARTBEAT_TIMEOUT_MS = 5_000;

export interface RegistryOptions {
  schema: string;
  applicationName: string;
  staging: boolean;
  drainLoops: number;
}

/**
 * This process's row in `<schema>.processes` (ADR 0038): who runs workers, with which
 * trellis-pg and for which schema version, and how its workers fare. Written through the
 * handle's calls (a pooled session for a moment): when the handle connects, when a
 * worker's health changes (looked at in memory every second), and otherwise every
 * HEARTBEAT_MS; deleted at shutdown. An idle process costs one small write every 10 s.
 *
 * Each heartbeat also reads the installed schema version. A schema holding a breaking
 * migration this trellis-pg does not know, or one older than it needs (a restored
 * backup), is refused: `onRefused` stops the workers, and the row says why. A newer schema
 * without a breaking migration is run on, and said once in the log.
 */
export class ProcessRegistry {
  readonly id = randomUUID();
  private timer: NodeJS.Timeout | undefined;
  private lastWritten = 0;
  private lastSignature = '';
  private writing: Promise<void> | undefined;
  private refused: ProcessHealth['refused'];
  private newerSaid = false;
  private stopped = false;

  constructor(
    private readonly calls: CallRunner,
    private readonly options: RegistryOptions,
    private readonly health: () => ProcessHealth,
    private readonly log: Logger,
    private readonly onRefused: (error: TrellisError) => void,
  ) {}

  /** Writes the first row, then keeps it current until `stop()`. */
  async start(): Promise<void> {
    await this.beat();
    this.timer = setInterval(() => {
      const due =
        Date.now() - this.lastWritten >= HEARTBEAT_MS ||
        healthSignature(this.report()) !== this.lastSignature;
      if (due) void this.beat();
    }, CHANGE_CHECK_MS);
    this.timer.unref();
  }

  /** Stops the heartbeat and removes the row (best effort: a stale row ages out). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.writing;
    await this.calls
      .run(
        'processUnregister',
        (session) =>
          session.transaction(
            () =>
              session.query(
                `DELETE FROM ${quoteIdent(this.options.schema)}.processes WHERE id = $1`,
                [this.id],
              ),
            'BEGIN READ WRITE',
          ),
        { internal: true, timeoutMs: HEARTBEAT_TIMEOUT_MS },
      )
      .catch(() => undefined);
  }

  /** The workers' health as the catalog row carries it: with why they stopped, if refused. */
  report(): ProcessHealth {
    return { ...this.health(), ...(this.refused ? { refused: this.refused } : {}) };
  }

  /** One heartbeat at a time; a failed one is logged at debug and tried again next time. */
  private beat(): Promise<void> {
    if (this.writing || this.stopped) return this.writing ?? Promise.resolve();
    this.writing = this.write()
      .catch((error: unknown) => {
        this.log.debug(
          { code: error instanceof TrellisError ? error.code : 'unknown' },
          `process registry: the heartbeat failed: ${error instanceof Error ? error.message : String(error)}`,
        );
      })
      .finally(() => {
        this.writing = undefined;
      });
    return this.writing;
  }

  private async write(): Promise<void> {
    const report = this.report();
    const s = quoteIdent(this.options.schema);
    const known = latestVersion();
    // READ WRITE whatever the database's default: with default_transaction_read_only on,
    // the workers fail on every pass, and this row is how status() learns it (ADR 0038).
    const [row] = await this.calls.run(
      'processHeartbeat',
      (session) =>
        session.transaction(
          () =>
            session.query<{ installed: number | null; breaking: number | null }>(
              `WITH beat AS (
             INSERT INTO ${s}.processes AS p (id, host, pid, application_name, package_version,
                                             schema_version, staging, drain_loops, health)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), health = EXCLUDED.health
             RETURNING 1),
           gone AS (
             DELETE FROM ${s}.processes WHERE heartbeat_at < now() - interval '1 hour' RETURNING 1)
           SELECT max(version) AS installed,
                  max(version) FILTER (WHERE breaking AND version > $6) AS breaking
             FROM ${s}.migrations`,
              [
                this.id,
                hostname(),
                process.pid,
                this.options.applicationName,
                packageVersion(),
                known,
                this.options.staging,
                this.options.drainLoops,
                report,
              ],
            ),
          'BEGIN READ WRITE',
        ),
      { internal: true, timeoutMs: HEARTBEAT_TIMEOUT_MS },
    );
    this.lastWritten = Date.now();
    this.lastSignature = healthSignature(report);
    this.checkSchema(Number(row?.installed ?? 0), row?.breaking ?? null);
  }

  /**
   * Refuses a schema this process cannot run on (ADR 0018 refuses it at connect; this
   * catches a migration run while the process runs).
   */
  private checkSchema(installed: number, breaking: number | null): void {
    if (this.refused) return;
    const known = latestVersion();
    let error: TrellisError | undefined;
    if (breaking !== null) {
      error = new TrellisError(
        'incompatible_schema',
        `the Trellis schema ${this.options.schema} is at breaking version ${breaking}, newer than this trellis-pg (${packageVersion()}, schema ${known}) knows: this process's workers stopped; upgrade trellis-pg`,
      );
    } else if (installed < known) {
      error = new TrellisError(
        'not_migrated',
        `the Trellis schema ${this.options.schema} is at version ${installed}, and this trellis-pg needs version ${known}: this process's workers stopped; run migrate() (or the migration \`trellis generate upgrade\` writes) and restart it`,
      );
    } else if (installed > known && !this.newerSaid) {
      this.newerSaid = true;
      this.log.warn(
        { installed, needs: known },
        `the Trellis schema ${this.options.schema} is at version ${installed}, newer than this trellis-pg (${packageVersion()}, schema ${known}); its workers keep running (no breaking migration): upgrade trellis-pg`,
      );
    }
    if (!error) return;
    this.refused = { code: error.code, message: error.message, at: new Date().toISOString() };
    this.log.error({ code: error.code }, error.message);
    this.onRefused(error);
    // The report now differs from the one written: the next look (within a second) says so.
  }
}
