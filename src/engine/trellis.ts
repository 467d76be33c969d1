import { type InspectOptionsStylized, inspect } from 'node:util';
import { CallRunner } from './calls.js';
import { detectWalDisruptions } from './capture/wal/slot-safety.js';
import { type Definition, readDefinitions } from './catalog/definitions.js';
import { dumpDefinitionsSql } from './catalog/dump-definitions.js';
import {
  type Explanation,
  explainStatement,
  explainTransform,
  isExplainStatement,
} from './catalog/explain.js';
import { readHistory } from './catalog/history.js';
import {
  type PoisonedRow,
  poisonedSince,
  type QuarantineCount,
  type QuarantineEntry,
  quarantined,
  quarantineStatus,
  type ReleaseResult,
  releaseKey,
  type SamplePage,
  sampleQuarantined,
} from './catalog/quarantine.js';
import { readStatus } from './catalog/status.js';
import type { Status, TransformHistory, WorkerHealth } from './catalog/status-types.js';
import { readWorkers } from './catalog/worker-health.js';
import { classifyConnectError } from './db/classify.js';
import { type ConnectionConfig, parseConnectionUrl } from './db/connection-config.js';
import { ConnectionPool } from './db/pool.js';
import type { Session } from './db/session.js';
import { TrellisError } from './errors.js';
import { quoteIdent } from './identifiers.js';
import { LOCK_CLASS, lockHeldSql } from './internal/advisory-locks.js';
import { trackHandle, untrackHandle } from './internal/open-handles.js';
import { JobRunner } from './jobs/job-runner.js';
import { jobsSchemaFor } from './jobs/jobs-schema.js';
import { SELF_CHECK_QUEUE } from './jobs/queues.js';
import { instanceLogger } from './logger.js';
import { HandleMetrics } from './metrics/handle-metrics.js';
import { recordSelfCheck } from './metrics/self-check.js';
import { type InstanceSnapshot, readSnapshot } from './observe/catalog-snapshot.js';
import { CatalogWatch, SNAPSHOT_MAX_AGE_MS } from './observe/catalog-watch.js';
import { type TrellisEventName, TrellisEvents, type TrellisListener } from './observe/events.js';
import type { LogBridge } from './observe/log-bridge.js';
import { type ConnectOptions, type ResolvedOptions, resolveOptions } from './options.js';
import { latestVersion } from './schema/install-sql.js';
import {
  assertCompatible,
  assertTargetSchema,
  type MigrateResult,
  migrateSchema,
  readSchemaState,
} from './schema/migrator.js';
import { abandonedChecks } from './selfcheck/claim-lock.js';
import { selfCheckHandler } from './selfcheck/handler.js';
import { assertJobId, readJob, readJobs } from './selfcheck/read.js';
import {
  assertSelfChecksInstalled,
  checkArguments,
  requestSelfCheck,
} from './selfcheck/request.js';
import type { SelfCheckJob, SelfCheckMode, SelfCheckOptions } from './selfcheck/types.js';
import { detectDisruptions } from './staging/disruptions.js';
import { type ApplyResult, applyStatement } from './statements/apply.js';
import { ConvergenceWaits, waitTimeout, watermarkToken } from './watermark.js';
import { Background } from './workers/background.js';
import type { ProcessHealth } from './workers/health.js';
import { ProcessRegistry } from './workers/process-registry.js';

/**
 * How long opening a connection may take. A connection whose startup is cut short can
 * stall in the driver until this runs out, so it is kept well below the call timeout
 * for calls, and short for workers (they just try again).
 */
const CONNECT_TIMEOUT_MS = 10_000;
const WORKER_CONNECT_TIMEOUT_MS = 5_000;

/**
 * A scrape reads the catalog snapshot within this (Prometheus's default scrape timeout is
 * 10 s): a database that cannot answer leaves the catalog series out, not the scrape hung.
 */
const SNAPSHOT_READ_TIMEOUT_MS = 5_000;

/** While the app listens for events, the catalog is looked at this often. */
const EVENT_WATCH_MS = 1_000;

/** How long shutdown waits for queued log lines to reach the logger. */
const LOG_FLUSH_MS = 1_000;

/** Where a call's metrics go: set once the handle (and its instance label) exists. */
interface MetricsSink {
  metrics: HandleMetrics | undefined;
}

/** The configuration a handle connected with, as `config()` returns it. */
export interface TrellisConfig {
  schema: string;
  targetSchema: string;
  pool: { max: number; acquireTimeoutMs: number };
  staging: boolean;
  drainThreads: number;
  callTimeoutMs: number;
  /** `application_name` of the handle's sessions (workers append their role). */
  applicationName: string;
}

/** What a handle shows of itself when a logger prints it: nothing secret (never the url). */
export interface TrellisSummary {
  instance: string;
  targetSchema: string;
  staging: boolean;
  drainThreads: number;
}

/**
 * A handle on one Trellis instance (one catalog schema in one database). Every method
 * returns a Promise that settles within the call timeout; failures are `TrellisError`s.
 */
export class Trellis implements AsyncDisposable {
  /** `<database>/<catalog schema>`: names this instance in logs and metrics. */
  readonly instance: string;
  private readonly log: LogBridge;
  private readonly metrics: HandleMetrics;
  private readonly events: TrellisEvents;
  private readonly watch: CatalogWatch;
  private eventTimer: NodeJS.Timeout | undefined;
  private shutdownPromise: Promise<void> | undefined;
  /** Set once the catalog schema was seen installed (it is never uninstalled under us). */
  private installed = false;

  private readonly background: Background | undefined;
  /** This process's row in the catalog, while it runs workers (ADR 0038). */
  private readonly registry: ProcessRegistry | undefined;
  /**
   * Set when the registry found the schema changed under the process into one it cannot
   * run on: the workers stopped, and catalog calls fail with it.
   */
  private refusal: TrellisError | undefined;
  private readonly jobs: JobRunner;
  private readonly waits: ConvergenceWaits;

  private constructor(
    private readonly options: ResolvedOptions,
    private readonly pool: ConnectionPool,
    private readonly calls: CallRunner,
    database: string,
    connection: ConnectionConfig,
    sink: MetricsSink,
  ) {
    this.instance = `${database}/${options.schema}`;
    this.metrics = new HandleMetrics(this.instance, {
      snapshot: () => this.snapshotForScrape(),
      stagingLeader: () => this.background?.stagingLeader() ?? null,
      drainLoopsAlive: () => this.background?.drainLoopsAlive() ?? null,
      workerHealth: () => this.background?.health() ?? null,
      pools: () => [
        { pool: 'calls', ...this.pool.stats() },
        ...(this.background ? [{ pool: 'workers' as const, ...this.background.poolStats() }] : []),
      ],
    });
    sink.metrics = this.metrics;
    this.log = instanceLogger(options.logger, this.instance, options.logBufferLines, (lines) =>
      this.metrics.logLinesDropped(lines),
    );
    this.events = new TrellisEvents(
      (event, error) =>
        this.log.warn(
          { event, error: error instanceof Error ? error.message : String(error) },
          `a listener of the ${event} event failed`,
        ),
      (count) => this.watchForListeners(count),
    );
    // The process whose staging worker is the elected one logs the instance's changes.
    this.watch = new CatalogWatch(
      this.events,
      this.log,
      () => this.background?.stagingLeader() === 1,
    );
    this.waits = new ConvergenceWaits(calls, options.schema, (session) =>
      this.requireInstalled(session),
    );
    // Every handle sends jobs; a handle with drain loops works them too (ADR 0014).
    this.jobs = new JobRunner(
      connection,
      {
        jobsSchema: jobsSchemaFor(options.schema),
        work: options.drainThreads > 0,
        queues: [
          {
            queue: SELF_CHECK_QUEUE,
            handler: selfCheckHandler(options.schema, (target, report) =>
              recordSelfCheck(this.instance, {
                target,
                outcome: report.outcome,
                divergences: report.counts,
              }),
            ),
            abandoned: (session) => abandonedChecks(session, options.schema),
          },
        ],
        applicationName: options.applicationName,
        connectTimeoutMs: Math.min(options.callTimeoutMs, WORKER_CONNECT_TIMEOUT_MS),
      },
      this.log,
    );
    if (options.staging || options.drainThreads > 0) {
      this.background = new Background(
        connection,
        {
          schema: options.schema,
          staging: options.staging,
          drainThreads: options.drainThreads,
          applicationName: options.applicationName,
          connectTimeoutMs: Math.min(options.callTimeoutMs, WORKER_CONNECT_TIMEOUT_MS),
        },
        this.log,
        {
          applied: (work) => this.metrics.page(work),
          tickSealed: () => this.metrics.tickSealed(),
          afterPass: (session) => this.watchOnStagingPass(session),
        },
      );
      const background = this.background;
      this.registry = new ProcessRegistry(
        calls,
        {
          schema: options.schema,
          applicationName: options.applicationName,
          staging: options.staging,
          drainLoops: options.drainThreads,
        },
        () => background.health(),
        this.log,
        (error) => {
          this.refusal = error;
          void background.stop();
        },
      );
    }
  }

  /**
   * Connects, checks the catalog schema (refusing one newer than this code), and starts
   * the background work the options ask for. The defaults start nothing.
   */
  static async connect(options: ConnectOptions): Promise<Trellis> {
    const resolved = resolveOptions(options);
    const config = parseConnectionUrl(resolved.url);
    const pool = new ConnectionPool(config, {
      max: resolved.pool.max,
      applicationName: resolved.applicationName,
      statementTimeoutMs: resolved.callTimeoutMs,
      connectTimeoutMs: Math.min(resolved.callTimeoutMs, CONNECT_TIMEOUT_MS),
    });
    const sink: MetricsSink = { metrics: undefined };
    const calls = new CallRunner(
      pool,
      {
        callTimeoutMs: resolved.callTimeoutMs,
        acquireTimeoutMs: resolved.pool.acquireTimeoutMs,
      },
      (what, outcome, seconds) => sink.metrics?.call(what, outcome, seconds),
    );
    let reached = false;
    try {
      const database = await calls.run('connect', async (session) => {
        reached = true;
        const [row] = await session.query<{ db: string }>('SELECT current_database() AS db');
        const state = await readSchemaState(session, resolved.schema);
        assertCompatible(state, resolved.schema);
        assertTargetSchema(state, resolved.schema, resolved.targetSchema);
        if (resolved.staging && state.version === 0) {
          throw new TrellisError(
            'not_migrated',
            `the Trellis schema ${resolved.schema} is not installed: run migrate() (or \`trellis sql install\` in a migration) before connecting with staging: true`,
          );
        }
        // Workers of this version run this version's catalog functions: a schema an
        // upgrade has not reached yet is refused here, not met as a missing column later.
        if ((resolved.staging || resolved.drainThreads > 0) && behind(state)) {
          throw outdatedSchema(resolved.schema, state.version, 'before connecting with workers');
        }
        // Settings live in columns a newer migration may add: recorded once it has run.
        if (state.version > 0 && !behind(state)) await recordInstanceSettings(session, resolved);
        return row?.db ?? config.database;
      });
      const handle = new Trellis(resolved, pool, calls, database, config, sink);
      trackHandle(handle);
      // The process is in the catalog (workers(), status()) once connect() resolves.
      await handle.registry?.start();
      handle.log.debug({}, 'connected');
      return handle;
    } catch (error) {
      await calls.shutdown();
      await pool.end(1);
      if (error instanceof TrellisError && error.code === 'timeout' && !reached) {
        // No session within the deadline: a server (or firewall) that never answers is a
        // connection failure to fix in the url or network, not a slow call.
        throw new TrellisError(
          'connection',
          `cannot connect to ${config.description}: no answer within ${resolved.callTimeoutMs} ms: check the host, port and firewall`,
          { cause: error },
        );
      }
      throw error instanceof TrellisError ? error : classifyConnectError(error, config);
    }
  }

  /** Installs or upgrades Trellis's catalog schema; safe to run concurrently and repeatedly. */
  migrate(): Promise<MigrateResult> {
    return this.calls.run('migrate', async (session) => {
      const result = await migrateSchema(session, {
        schema: this.options.schema,
        targetSchema: this.options.targetSchema,
      });
      await recordInstanceSettings(session, this.options);
      return result;
    });
  }

  /**
   * Applies one statement of Trellis's grammar (TRANSFORM, PAUSE, RESUME, DROP, ALTER) and
   * says what it did. Bad statements fail with `parse` or `validation`; unknown targets with
   * `not_found`.
   */
  apply(statement: string): Promise<ApplyResult> {
    return this.calls.run('apply', async (session) => {
      await this.requireInstalled(session);
      return applyStatement(session, this.options.schema, statement, false);
    });
  }

  /** `apply()` for a TRANSFORM only: any other statement fails with `validation`. */
  define(statement: string): Promise<ApplyResult> {
    return this.calls.run('define', async (session) => {
      await this.requireInstalled(session);
      return applyStatement(session, this.options.schema, statement, true);
    });
  }

  /**
   * The instance's workers, whichever processes run them: the staging worker (elected, its
   * last pass, its failures), the WAL decoder under WAL capture, the drain loops, the
   * installed schema version, and every process that runs workers with its trellis-pg and
   * schema versions. Every `status()` carries the same in `workers`.
   */
  workers(): Promise<WorkerHealth> {
    return this.catalogCall('workers', (session) => readWorkers(session, this.options.schema));
  }

  /** Where a transform is in its lifecycle, and what (if anything) holds it up. */
  status(target: string): Promise<Status> {
    return this.calls.run('status', async (session) => {
      await this.requireInstalled(session);
      return readStatus(session, this.options.schema, target);
    });
  }

  /**
   * Rebuilds a target from its sources: it is emptied and backfilled again (status goes
   * back to waiting_to_backfill, then backfilling).
   */
  requestBackfill(target: string): Promise<void> {
    return this.calls.run('requestBackfill', async (session) => {
      await this.requireInstalled(session);
      const s = quoteIdent(this.options.schema);
      const rows = await session.query(
        `SELECT ${s}._request_rebuild(t.id) FROM ${s}.transforms t
          WHERE t.target_name = $1 AND t.target_schema = (SELECT target_schema FROM ${s}.config)`,
        [target],
      );
      if (rows.length === 0)
        throw new TrellisError('not_found', `there is no transform named ${target}`);
    });
  }

  /**
   * Grants `role` (a role name, taken as it is) what writing to captured tables needs,
   * and nothing more: capture triggers run as the writing role and insert its changes
   * into the ledger, so USAGE on the catalog schema and INSERT on the ledger's
   * partitions. Run it on a handle connected as the role that owns Trellis's schema.
   * From SQL (a migration): `SELECT <schema>.grant_writer('role')`.
   */
  grantWriter(role: string): Promise<void> {
    return this.calls.run('grantWriter', async (session) => {
      if (typeof role !== 'string' || role.length === 0) {
        throw new TrellisError('validation', 'grantWriter needs a role name');
      }
      await this.requireInstalled(session);
      const [found] = await session.query<{ oid: string }>(
        'SELECT oid::text AS oid FROM pg_roles WHERE rolname = $1',
        [role],
      );
      if (!found) throw new TrellisError('not_found', `there is no role named ${role}`);
      await session.query(
        `SELECT ${quoteIdent(this.options.schema)}.grant_writer($1::oid::regrole)`,
        [found.oid],
      );
    });
  }

  /** A token standing for every write committed so far, for `awaitConverged`. */
  watermarkToken(): Promise<string> {
    return this.calls.run('watermarkToken', (session) => watermarkToken(session));
  }

  /**
   * Resolves once every write committed before `token` was taken is reflected in
   * `target` (read-your-writes); fails with `timeout` after `timeoutMs` (the call timeout
   * by default; any longer wait the caller asks for, up to MAX_WAIT_MS, is honoured).
   * The wait holds no connection between its checks, so any number of waits share the
   * pool with other calls. Needs a staging worker and a drain somewhere in the fleet.
   */
  awaitConverged(
    target: string,
    token: string,
    options: { timeoutMs?: number } = {},
  ): Promise<void> {
    if (this.calls.isShutDown) {
      return Promise.reject(
        new TrellisError('shutdown', 'awaitConverged: the handle is shut down'),
      );
    }
    let timeoutMs: number;
    try {
      timeoutMs = waitTimeout(options?.timeoutMs, this.options.callTimeoutMs);
    } catch (error) {
      return Promise.reject(error);
    }
    const started = performance.now();
    const waiting = this.waits.wait(target, token, timeoutMs);
    const seconds = () => (performance.now() - started) / 1000;
    waiting.then(
      () => this.metrics.call('awaitConverged', 'ok', seconds()),
      (error: unknown) =>
        this.metrics.call(
          'awaitConverged',
          error instanceof TrellisError ? error.code : 'unknown',
          seconds(),
        ),
    );
    return waiting;
  }

  /**
   * Starts a check of `target` against its definition recomputed from the sources, as a
   * background job (pg-boss) that a drain worker somewhere in the fleet runs, and returns
   * the job at once (`queued`). `'full'` compares every row, `'sample'` `options.sample`
   * keys chosen at random (1000 by default). While a check of the target is unfinished,
   * asking again returns it; the next call after it finished replaces it. Refused with
   * `validation` for a target with source index gaps (unless defined WITHOUT SOURCE
   * INDEX), with `conflict` for a paused one. Read it back with `selfCheckJob(id)`.
   */
  selfCheck(
    target: string,
    mode: SelfCheckMode,
    options: SelfCheckOptions = {},
  ): Promise<SelfCheckJob> {
    return this.calls.run('selfCheck', async (session) => {
      const checked = checkArguments(mode, options);
      await this.requireInstalled(session);
      await assertSelfChecksInstalled(session, this.options.schema);
      const { job, started } = await requestSelfCheck(
        session,
        this.options.schema,
        this.jobs,
        target,
        checked,
      );
      if (started) this.jobs.wake();
      return job;
    });
  }

  /**
   * A self-check job as it stands (its state, progress, and once `done` its report), or
   * null when it was replaced by a later check of its target or the transform was dropped.
   */
  selfCheckJob(id: string): Promise<SelfCheckJob | null> {
    return this.calls.run('selfCheckJob', async (session) => {
      assertJobId(id);
      await this.requireInstalled(session);
      await assertSelfChecksInstalled(session, this.options.schema);
      return readJob(session, this.options.schema, id);
    });
  }

  /**
   * The latest self-check of each transform (the one `selfCheckJob` would return for its
   * id), ordered by target name: for an operator's overview (the operations page).
   */
  selfCheckJobs(): Promise<SelfCheckJob[]> {
    return this.calls.run('selfCheckJobs', async (session) => {
      await this.requireInstalled(session);
      await assertSelfChecksInstalled(session, this.options.schema);
      const jobs = await readJobs(session, this.options.schema, 'true', []);
      return jobs.sort((a, b) => (a.target < b.target ? -1 : a.target > b.target ? 1 : 0));
    });
  }

  /**
   * The last hour of every transform, ordered by target: its lag and the changed keys its
   * drain applied a second, sampled every 10 s by the elected staging worker (and its
   * backfill's keys built, while it builds). What the operations page's charts draw.
   */
  history(): Promise<TransformHistory[]> {
    return this.catalogCall('history', (session) => readHistory(session, this.options.schema));
  }

  /** Whether some process runs a drain loop for this instance now. */
  hasLiveDrainWorkers(): Promise<boolean> {
    return this.lockHeld(LOCK_CLASS.drain, 'hasLiveDrainWorkers');
  }

  /** Whether some process runs this instance's (elected) staging worker now. */
  hasLiveStagingWorker(): Promise<boolean> {
    return this.lockHeld(LOCK_CLASS.staging, 'hasLiveStagingWorker');
  }

  private lockHeld(lockClass: number, what: string): Promise<boolean> {
    return this.calls.run(what, async (session) => {
      const [row] = await session.query<{ held: boolean }>(lockHeldSql(lockClass, '$1'), [
        this.options.schema,
      ]);
      return row?.held === true;
    });
  }

  /** Every quarantine address holding keys: its count, oldest hold, and whether it is paused. */
  quarantined(): Promise<QuarantineEntry[]> {
    return this.catalogCall('quarantined', (session) => quarantined(session, this.options.schema));
  }

  /** How many keys `address` (`"transform"` or `"transform.column"`) holds. */
  quarantineStatus(address: string): Promise<QuarantineCount> {
    return this.catalogCall('quarantineStatus', (session) =>
      quarantineStatus(session, this.options.schema, address),
    );
  }

  /**
   * A page of the keys `address` holds, ordered by (source table, key); pass `nextCursor`
   * back for the next page (null at the end).
   */
  sampleQuarantined(
    address: string,
    options: { limit?: number; cursor?: string | null } = {},
  ): Promise<SamplePage> {
    return this.catalogCall('sampleQuarantined', (session) =>
      sampleQuarantined(session, this.options.schema, address, options),
    );
  }

  /** Every key held since `since`, across transforms, oldest first. */
  poisonedSince(since: Date): Promise<PoisonedRow[]> {
    return this.catalogCall('poisonedSince', (session) =>
      poisonedSince(session, this.options.schema, since),
    );
  }

  /**
   * Releases the key `key` (rendered as samples show it) of `srcTable` held at `address`,
   * and re-derives it now: it goes through, or is held again with its new error.
   */
  releaseKey(address: string, srcTable: string, key: string): Promise<ReleaseResult> {
    return this.catalogCall('releaseKey', (session) =>
      releaseKey(session, this.options.schema, address, srcTable, key, this.log),
    );
  }

  /**
   * Checks now (without waiting for the staging worker's next pass) for capture changed
   * outside Trellis — triggers disabled, enabled without ALWAYS, dropped, functions
   * replaced — pauses the readers of every such table (`captureFailure.kind:
   * 'disruption'`), and returns those tables, schema-qualified.
   */
  detectCaptureDisruptions(): Promise<string[]> {
    return this.catalogCall('detectCaptureDisruptions', (session) =>
      session.transaction(async () => {
        const triggers = await detectDisruptions(session, this.options.schema, this.log);
        const wal = await detectWalDisruptions(session, this.options.schema, this.log);
        return [...new Set([...triggers, ...wal])].sort();
      }),
    );
  }

  /**
   * The transforms paused for `reason` (`'disruption'`, …), by target name. For test
   * support (resumeCaptureDisruptions); one catalog read.
   * @internal
   */
  pausedFor(reason: string): Promise<string[]> {
    return this.catalogCall('pausedFor', async (session) => {
      const rows = await session.query<{ target: string }>(
        `SELECT target_name AS target FROM ${quoteIdent(this.options.schema)}.transforms
          WHERE paused_at IS NOT NULL AND pause_reason = $1 ORDER BY 1`,
        [reason],
      );
      return rows.map((r) => r.target);
    });
  }

  /**
   * The server's version number (`server_version_num`, e.g. 150018). For schema dumps,
   * which pick the pg_dump that matches the server.
   * @internal
   */
  serverVersionNum(): Promise<number> {
    return this.calls.run('serverVersionNum', async (session) => {
      const [row] = await session.query<{ v: string }>(
        `SELECT current_setting('server_version_num') AS v`,
      );
      return Number(row?.v);
    });
  }

  /** A call that reads or changes the catalog (`not_migrated` until it is installed). */
  private catalogCall<T>(what: string, fn: (session: Session) => Promise<T>): Promise<T> {
    return this.calls.run(what, async (session) => {
      await this.requireInstalled(session);
      return fn(session);
    });
  }

  /** Every registered transform, ordered by target name. */
  definitions(): Promise<Definition[]> {
    return this.calls.run('definitions', async (session) => {
      await this.requireInstalled(session);
      return readDefinitions(session, this.options.schema);
    });
  }

  /**
   * How transform `target` is kept (ADR 0059): its parts in the order a change flows
   * through them (the transform last), how each is maintained (delta, group recompute,
   * re-derive) and why, the source indexes each uses or needs, and the SQL the drain runs
   * for changed keys. `not_found` for a name no transform users defined has.
   *
   * Given a statement (`[EXPLAIN] TRANSFORM …`) instead of a name, the plan it would get,
   * without defining anything (EXPLAIN TRANSFORM, ADR 0069): the same parts, modes, state
   * and index needs, no drain SQL, and `refused` (code and message) for one that defining
   * would refuse.
   */
  explain(target: string): Promise<Explanation> {
    return this.catalogCall('explain', (session) =>
      isExplainStatement(target)
        ? explainStatement(session, this.options.schema, target)
        : explainTransform(session, this.options.schema, target),
    );
  }

  /**
   * The definitions as SQL for the end of a schema-only `pg_dump` of this database: loaded
   * after it, the SQL records Trellis's schema as installed and registers every transform
   * again (each starts at waiting_to_backfill; a worker builds it). Only definitions: the
   * ledger, progress, pauses, quarantine and claims are runtime state. For a caller that
   * assembles its own dump; `trellis dump` and `appendDefinitions()` use it.
   */
  dumpDefinitionsSql(): Promise<string> {
    return this.catalogCall('dumpDefinitionsSql', (session) =>
      dumpDefinitionsSql(session, this.options.schema),
    );
  }

  /** Fails with `not_migrated` when the catalog schema is not installed. */
  private async requireInstalled(session: Session): Promise<void> {
    if (this.refusal) throw this.refusal;
    if (this.installed) return;
    const state = await readSchemaState(session, this.options.schema);
    if (state.version === 0) {
      throw new TrellisError(
        'not_migrated',
        `the Trellis schema ${this.options.schema} is not installed: run migrate() first`,
      );
    }
    if (behind(state)) throw outdatedSchema(this.options.schema, state.version, 'first');
    this.installed = true;
  }

  /**
   * Listens for changes in the instance, whichever process (or SQL session) made them:
   * `'status'` (a transform's lifecycle, pause reason or paused columns changed; defined;
   * dropped), `'held'` (the keys held at a quarantine address went up or down),
   * `'captureFailure'` (a transform stopped because capture, or its target, stopped being
   * right). While a listener is registered, the handle looks at the catalog once a second
   * (one statement); listeners run outside the engine's work, and one that throws or
   * rejects is logged and changes nothing else. Unknown event names fail with `validation`.
   */
  on<K extends TrellisEventName>(event: K, listener: TrellisListener<K>): this {
    if (this.calls.isShutDown) throw new TrellisError('shutdown', 'the handle is shut down');
    this.events.on(event, listener);
    return this;
  }

  /** Removes a listener `on()` added. */
  off<K extends TrellisEventName>(event: K, listener: TrellisListener<K>): this {
    this.events.off(event, listener);
    return this;
  }

  /** Reads the catalog snapshot through a pooled call (internal: not in the call metrics). */
  private readSnapshotByCall(): Promise<InstanceSnapshot> {
    return this.calls.run(
      'catalogSnapshot',
      (session) => readSnapshot(session, this.options.schema),
      {
        timeoutMs: SNAPSHOT_READ_TIMEOUT_MS,
        internal: true,
      },
    );
  }

  /** For a scrape: the snapshot, or undefined when it cannot be read in time. */
  private async snapshotForScrape(): Promise<InstanceSnapshot | undefined> {
    if (this.calls.isShutDown) return undefined;
    try {
      return await this.watch.fresh(() => this.readSnapshotByCall(), SNAPSHOT_MAX_AGE_MS);
    } catch (error) {
      this.log.debug(
        { code: error instanceof TrellisError ? error.code : 'unknown' },
        'metrics: the catalog could not be read',
      );
      return undefined;
    }
  }

  /** After each pass of the elected staging worker: a snapshot on its session, at most once a second. */
  private async watchOnStagingPass(session: Session): Promise<void> {
    try {
      await this.watch.refreshUnlessBusy(() => readSnapshot(session, this.options.schema));
    } catch (error) {
      this.log.debug(
        { code: error instanceof TrellisError ? error.code : 'unknown' },
        'the catalog snapshot failed on the staging session',
      );
    }
  }

  /** Looks at the catalog once a second while the app has listeners. */
  private watchForListeners(count: number): void {
    if (count > 0 && !this.eventTimer && !this.calls.isShutDown) {
      this.eventTimer = setInterval(() => {
        this.watch
          .fresh(() => this.readSnapshotByCall())
          .catch((error: unknown) => {
            this.log.debug(
              { code: error instanceof TrellisError ? error.code : 'unknown' },
              'events: the catalog could not be read',
            );
          });
      }, EVENT_WATCH_MS);
      this.eventTimer.unref();
      // A first look now: the changes from here on are what listeners hear.
      this.watch.fresh(() => this.readSnapshotByCall()).catch(() => undefined);
    } else if (count === 0 && this.eventTimer) {
      clearInterval(this.eventTimer);
      this.eventTimer = undefined;
    }
  }

  /** The configuration this handle connected with. */
  async config(): Promise<TrellisConfig> {
    if (this.calls.isShutDown) throw new TrellisError('shutdown', 'the handle is shut down');
    const o = this.options;
    return {
      schema: o.schema,
      targetSchema: o.targetSchema,
      pool: { ...o.pool },
      staging: o.staging,
      drainThreads: o.drainThreads,
      callTimeoutMs: o.callTimeoutMs,
      applicationName: o.applicationName,
    };
  }

  /**
   * What `JSON.stringify` (and so a JSON logger such as pino) writes for the handle: the
   * safe fields only. The url, which may hold a password, never appears.
   */
  toJSON(): TrellisSummary {
    return {
      instance: this.instance,
      targetSchema: this.options.targetSchema,
      staging: this.options.staging,
      drainThreads: this.options.drainThreads,
    };
  }

  /**
   * What `util.inspect` (console.log, most loggers) prints for the handle, e.g.
   * `Trellis { instance: 'app/trellis', targetSchema: 'public', staging: true, drainThreads: 2 }`:
   * the safe fields only, never the options, pool or connection config behind them.
   */
  [inspect.custom](
    _depth: number,
    options: InspectOptionsStylized,
    inspectValue: typeof inspect = inspect,
  ): string {
    return `Trellis ${inspectValue(this.toJSON(), options)}`;
  }

  /**
   * What this handle's own worker loops know of themselves now, read from memory (no
   * query): each loop's last pass and failures (ADR 0038), `running: false` once the
   * workers stopped (shutdown, or a schema this code cannot run on: `refused` says why).
   * Null when the handle runs no workers. `serveMetrics()`'s `/healthz` is built on it.
   */
  processHealth(): (ProcessHealth & { running: boolean }) | null {
    if (!this.background) return null;
    return {
      ...(this.registry?.report() ?? this.background.health()),
      running: this.shutdownPromise === undefined && this.background.running,
    };
  }

  /**
   * Stops the handle: calls in flight are cancelled (they reject with `shutdown`, and their
   * queries are cancelled on the server), later calls reject the same way, and every
   * connection is closed. Resolves once all of that is done; calling it again is harmless.
   */
  shutdown(): Promise<void> {
    this.shutdownPromise ??= (async () => {
      try {
        // Its series leave the registry now: a scrape never reads a handle going away.
        this.metrics.close();
        this.events.removeAll();
        this.waits.shutdown();
        await this.registry?.stop();
        await Promise.all([this.jobs.stop(), this.background?.stop()]);
        await this.calls.shutdown();
        await this.pool.end(5);
      } finally {
        untrackHandle(this);
        this.log.debug({}, 'shut down');
        await this.log.flush(LOG_FLUSH_MS);
        this.log.close();
      }
    })();
    return this.shutdownPromise;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown();
  }
}

/**
 * Records the instance-wide settings a handle was given (ConnectOptions.quarantineThreshold,
 * capture, walRetentionLimit); those left out stay as recorded. `capture: 'logical'` is
 * refused with `validation` when the server or role cannot run it (`set_capture`).
 */
async function recordInstanceSettings(session: Session, options: ResolvedOptions): Promise<void> {
  // A read-only server (a standby, a read-only default) cannot record them: a handle still
  // connects there (its workers are refused and say why, ADR 0036), and the settings are
  // recorded by the next connect or migrate() on a server that takes writes.
  if (session.server?.readOnly) return;
  const s = quoteIdent(options.schema);
  if (options.quarantineThreshold !== undefined) {
    await session.query(
      `UPDATE ${s}.config SET quarantine_threshold = $1
        WHERE quarantine_threshold IS DISTINCT FROM $1`,
      [options.quarantineThreshold],
    );
  }
  if (options.capture !== undefined || options.walRetentionLimit !== undefined) {
    await session.query(
      `SELECT ${s}.set_capture(coalesce($1::text, (SELECT capture FROM ${s}.config)), $2::bigint)`,
      [options.capture ?? null, options.walRetentionLimit ?? null],
    );
  }
}

/** The schema is installed at a version older than this trellis-pg's. */
function behind(state: { version: number }): boolean {
  return state.version > 0 && state.version < latestVersion();
}

function outdatedSchema(schema: string, version: number, when: string): TrellisError {
  return new TrellisError(
    'not_migrated',
    `the Trellis schema ${schema} is at version ${version}, and this trellis-pg needs version ${latestVersion()}: run migrate() (or add the migration \`trellis generate upgrade\` writes) ${when}`,
  );
}
