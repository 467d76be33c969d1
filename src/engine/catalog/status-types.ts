import type { ApplyEstimate } from '../drain/apply-choice.js';
/**
 * Where a transform is in its lifecycle. `unverified`: the database was restored from a
 * logical dump or cloned, and the staging worker has not rebound and rebuilt it yet
 * (ADR 0035); never live until it has.
 */
export type Lifecycle =
  | 'waiting_to_backfill'
  | 'backfilling'
  | 'catching_up'
  | 'live'
  | 'paused'
  | 'unverified';

/** Every lifecycle, in the order a transform goes through them. */
export const LIFECYCLES: readonly Lifecycle[] = [
  'waiting_to_backfill',
  'backfilling',
  'catching_up',
  'live',
  'paused',
  'unverified',
];

/** A restore (or clone) of the database that the instance recognised (ADR 0035). */
export interface Restored {
  /** What told it: the cluster or the database is not the one it was installed in. */
  reason: string;
  detectedAt: Date | null;
}

/** A build (backfill) that keeps failing: it retries with backoff, and pauses after a few. */
export interface BuildFailure {
  attempts: number;
  error: string;
  /** When it is tried again; once paused, when it paused. */
  nextAttemptAt: Date;
}

/** Why capture of a source is broken, or why the drain halted on the transform. */
export interface CaptureFailure {
  kind: 'capture' | 'halt' | 'disruption';
  /** A sentence naming the cause. */
  error: string;
  /** The columns it is about (empty when it is not about a column). */
  columns: string[];
  detectedAt: Date;
}

/**
 * A session a capture wait waits on: one holding or queued for a lock the staging worker's
 * capture change needs, or (after a widen) one whose transaction has held the source since
 * before the widen.
 */
export interface LockBlocker {
  pid: number;
  applicationName: string;
  /** The database the session is connected to. */
  database: string;
  /** `active`, `idle in transaction`…, as pg_stat_activity has it. */
  state: string | null;
  /** When its transaction started (how old it is); null when none is open. */
  xactStart: Date | null;
  queryStart: Date | null;
  /** Its current or last statement. */
  query: string;
}

/**
 * A prepared transaction (PREPARE TRANSACTION) a capture wait waits on. It has no session:
 * it holds its locks until someone runs COMMIT PREPARED or ROLLBACK PREPARED with its gid,
 * in its database.
 */
export interface PreparedBlocker {
  gid: string;
  /** The role that prepared it. */
  owner: string;
  database: string;
  /** When it was prepared (how long it has been waiting for its COMMIT PREPARED). */
  prepared: Date;
  /** Its transaction id. */
  transaction: string;
}

/**
 * What a transform's capture waits on. Nothing cancels the blockers.
 *
 * `install` and `uninstall` wait for a lock on the source (`lockMode`) that every
 * transaction holding or queued for a conflicting one keeps from them. `widen` is a
 * backfill waiting, after capture of the source widened to a column the transform reads,
 * for the transactions that held a writer lock on the source (or a partition or
 * inheritance child) when it widened: they may still run the older UPDATE trigger, which
 * does not capture that column. Transactions that began later, and any elsewhere in the
 * cluster, are not waited on.
 */
export interface CaptureWait {
  /**
   * `publish`: WAL capture (ADR 0023) put the source into the publication, and a backfill
   * waits until every transaction that was running then has ended (one that wrote the
   * table before could write it again unpublished); blockers are those transactions.
   */
  operation: 'install' | 'widen' | 'uninstall' | 'publish';
  /** Schema-qualified source table. */
  table: string;
  /**
   * The lock the change needs (`SHARE ROW EXCLUSIVE`); for `widen`, `ROW EXCLUSIVE`: the
   * blockers hold that or a stronger lock on the table since before the widen.
   */
  lockMode: string;
  /** Sessions waited on, by pid. */
  blockers: LockBlocker[];
  /** Prepared transactions waited on, by gid. */
  prepared: PreparedBlocker[];
  since: Date;
  /**
   * Install and uninstall: how many times the staging worker has tried to take the lock
   * (it backs off to one try every 2 s), so an operator sees it is still trying. Null for
   * a widen, which takes no lock: it watches the transactions it waits on, every pass.
   */
  attempts: number | null;
}

/** A partition of a partitioned source being corrected after attach/detach. */
export interface CorrectingNode {
  node: string;
  since: Date;
  keysRemaining: number | null;
}

/** A ledger page that keeps failing with nothing charged or paused. */
export interface DrainFailure {
  segSeq: number;
  tables: string[];
  error: string;
  sqlstate: string | null;
  since: Date;
  lastSeen: Date;
  attempts: number;
}

/** A source index a GROUP BY or JOIN target needs and lacks. */
export interface SourceIndexGap {
  table: string;
  columns: string[];
  role: 'group_by' | 'join_from' | 'join_joined';
  optedOut: boolean;
  /** A `CREATE INDEX CONCURRENTLY` statement that closes the gap: for psql, outside a transaction. */
  fix: string;
  /**
   * The same index as a plain `CREATE INDEX`: for a migration, which runs in a transaction
   * (drizzle-kit's do) where CONCURRENTLY cannot. It locks the table against writes while it
   * builds.
   */
  fixInMigration: string;
}

/** Backfill progress: keys done and (an estimate of) keys in all. */
export interface BackfillProgress {
  /** Driving keys built, the ones whose rows failed and are held included. */
  keysDone: number;
  keysTotal: number | null;
  /**
   * Keys held so far (their rows failed to derive: see quarantined()), as they are found;
   * the build pauses at quarantineThreshold (ADR 0040).
   */
  keysHeld: number;
  startedAt: Date;
  /**
   * Keys built a second, over the last minute of samples (since the build started while
   * none is that old); null once the build is over.
   */
  rate: number | null;
  /** Seconds left at that rate (null without a total, or while it makes no progress). */
  etaSeconds: number | null;
}

/**
 * How the drain applied the transform's last range of changes, and why (ADR 0029, 0044):
 * each changed row's contribution applied to its groups' states ('delta': aggregates with
 * an exact delta), each changed key re-derived ('rederive'), or, for a GROUP BY whose range
 * touched a large share of its groups, every group recomputed in one pass and merged in
 * ('recompute').
 */
export interface DrainShare {
  seconds: number;
  recentSeconds: number;
  share: number | null;
}

export interface LastApply {
  mode: 'delta' | 'rederive' | 'recompute';
  /**
   * What each way of applying the range was estimated to cost (milliseconds), and whether
   * from this transform's measured costs; null where there was no choice to make (a
   * projection or join, a grand total, keys held, sizes not known yet).
   */
  estimate: ApplyEstimate | null;
  /** Why, in a sentence. */
  reason: string;
  /** Changed keys in the range (a key changed twice counts twice). */
  keys: number;
  at: Date;
}

/** How far behind its sources a transform is. */
export interface Lag {
  /** Sealed ledger segments not yet applied. */
  segments: number;
  /** Age of the oldest change not yet applied, in seconds (0 when caught up). */
  seconds: number;
}

/** Where a transform is, as `status()` reports it. */
/** How a transform's sources are captured (ADR 0023). */
export interface CaptureInfo {
  /** The instance's setting (`ConnectOptions.capture`). */
  setting: 'trigger' | 'logical';
  /**
   * Each source: `trigger`, `logical` (the replication slot alone), or `switching` (both,
   * or in the publication and not trusted yet). `reason` says why a source stays on
   * triggers under `logical` (null otherwise). `subscribed`: a logical replication
   * subscription writes the table (pg_subscription_rel); under trigger capture its rows
   * are then captured row by row as well (ADR 0039).
   */
  sources: Array<{
    table: string;
    mode: 'trigger' | 'logical' | 'switching';
    reason: string | null;
    subscribed: boolean;
  }>;
  /**
   * The instance's replication slot, while it has one: the WAL it holds back (bytes, null
   * while the slot is missing) against the ceiling (`walRetentionLimit`), and the position
   * it acknowledged (every change before it is in the ledger).
   */
  slot: {
    name: string;
    retainedBytes: number | null;
    limitBytes: number;
    confirmedLsn: string | null;
  } | null;
}

/** A process of the registry, as a worker's health names it. */
export interface ProcessRef {
  /** The id the process registered with (random, per handle). */
  id: string;
  host: string;
  /** Its OS process id. */
  pid: number;
  /** Its trellis-pg version. */
  packageVersion: string;
}

/** A worker's failure: what its loop logged. */
export interface WorkerError {
  message: string;
  /** The TrellisError code it was classified as. */
  code: string;
  sqlstate: string | null;
  at: Date;
}

/**
 * The instance's staging worker, or its WAL decoder: one session elected by an advisory
 * lock (ADR 0038).
 */
export interface ElectedWorker {
  /** Some session holds the lock that elects it. */
  elected: boolean;
  /**
   * The process running it; not elected, a process that tries to and fails (its error
   * says why nobody is elected). Null when no process reports for it (a trellis-pg older
   * than this schema, or none running).
   */
  process: ProcessRef | null;
  /** Elected and going round without failing; null when no process reports for it. */
  passing: boolean | null;
  /** Its last completed pass (as its process last reported, at most 10 s old). */
  lastPassAt: Date | null;
  /** When its current run of failures began. */
  failingSince: Date | null;
  /** Its latest failure, kept after it recovers. */
  lastError: WorkerError | null;
  /** What is wrong, in a sentence, when it does not pass. */
  problem: string | null;
}

/** The instance's drain loops, across every process. */
export interface DrainWorkers {
  /** Drain loops connected and registered now (sessions holding the drain lock). */
  loops: number;
  /** Some loop goes round without failing; false with none; null when no process reports. */
  passing: boolean | null;
  lastPassAt: Date | null;
  /** While every loop fails: since the last of them began to. */
  failingSince: Date | null;
  lastError: WorkerError | null;
  problem: string | null;
}

/** A process that runs workers for the instance (`<schema>.processes`). */
export interface ProcessInfo {
  id: string;
  host: string;
  pid: number;
  applicationName: string;
  /** Its trellis-pg version. */
  packageVersion: string;
  /** The schema version its trellis-pg needs; compare with WorkerHealth.schemaVersion. */
  schemaVersion: number;
  staging: boolean;
  drainLoops: number;
  startedAt: Date;
  /** Its last report; past 30 s it is `stale` (gone, or unable to write). */
  heartbeatAt: Date;
  stale: boolean;
  /** Why it stopped its workers (a schema it cannot run on), when it did. */
  refused: string | null;
}

/** The workers of the instance (`workers()`, and every `status()`). */
export interface WorkerHealth {
  /** The installed schema version (its newest migration). */
  schemaVersion: number;
  staging: ElectedWorker;
  /** Under WAL capture (or while a slot remains); null under trigger capture. */
  decoder: ElectedWorker | null;
  drain: DrainWorkers;
  /** Every registered process, stale ones included, oldest first. */
  processes: ProcessInfo[];
}

/** What stops the pipeline: the first worker role with a problem. */
export interface WorkerFailure {
  role: 'staging' | 'decoder' | 'drain';
  /** A sentence naming the cause. */
  error: string;
  sqlstate: string | null;
  since: Date | null;
  process: ProcessRef | null;
}

/**
 * What a transform that is not live (or lags) waits on: a capture wait (captureWait has
 * the blockers), capture not in place yet, the first tick, the staging worker (absent,
 * failing, or about to start the build), the drain loops (absent, failing, or at work), a
 * transform upstream, a failing build (buildFailure).
 */
export interface WaitingOn {
  kind: 'capture' | 'tick' | 'staging_worker' | 'drain_worker' | 'upstream' | 'build';
  reason: string;
}

export interface Status {
  target: string;
  status: Lifecycle;
  /** Why it is paused, when it is: operator, build_failure, capture_failure, disruption, quarantine, schema_change. */
  pauseReason: string | null;
  /** Keys held (quarantined) for this transform. */
  heldKeys: number;
  /** Paused columns of this transform, each `"target.column"`. */
  pausedColumns: string[];
  /** Paused columns of upstream transforms this one reads, each `"target.column"`. */
  pausedUpstreamColumns: string[];
  sourceIndexGaps: SourceIndexGap[];
  correcting: CorrectingNode[];
  captureFailure: CaptureFailure | null;
  captureWait: CaptureWait | null;
  buildFailure: BuildFailure | null;
  drainFailure: DrainFailure | null;
  backfill: BackfillProgress | null;
  /** How the last range of changes was applied (null until one with changes was). */
  lastApply: LastApply | null;
  /**
   * The database was restored from a logical dump or cloned (ADR 0035): `detectedAt` null
   * while the staging worker has not rebound it yet (status `unverified`), else when it
   * did and asked every transform for a rebuild. Null when it never was.
   */
  restored: Restored | null;
  /**
   * What the drain loops (of every process) spent on this transform: seconds in all,
   * seconds lately (decayed with a time constant of a minute), and its share of the recent
   * drain time of every transform (null before any was recorded). Loops take work for the
   * least served transform first (ADR 0045).
   */
  drain: DrainShare;
  /**
   * The last `ALTER TRANSFORM … AS` (ADR 0055): `building` while the new definition is
   * built beside the old one, `switched` once the target holds it, `failed` when it was
   * given up (the old definition stays; `error` says why). Null when never redefined.
   */
  redefinition: Redefinition | null;
  lag: Lag;
  capture: CaptureInfo;
  /**
   * The sources that have row level security enabled: the target holds every row
   * Trellis's role reads, and whoever reads the target reads them, whatever the policies
   * say. Empty for none. A transform is defined over one only `WITHOUT ROW SECURITY`
   * (`optedOut`); one that gains it later stops (ADR 0034).
   */
  rowSecurity: RowSecuritySource[];
  /** The instance's workers (the same for every transform). */
  workers: WorkerHealth;
  /** What stops the pipeline, when something does: status alone can still say `live`. */
  workerFailure: WorkerFailure | null;
  /** What it waits on, when it is not live or lags (null when live and caught up, or paused). */
  waitingOn: WaitingOn | null;
}

/** A source of a transform with row level security enabled (`status().rowSecurity`). */
export interface RowSecuritySource {
  /** Schema-qualified, as `schema.table`. */
  table: string;
  /** `FORCE ROW LEVEL SECURITY`: the policies apply to the table's owner too. */
  forced: boolean;
  /** The transform was defined (or altered) `WITHOUT ROW SECURITY`. */
  optedOut: boolean;
}

/** One sample of a transform (taken every 10 s by the staging worker, kept for an hour). */
export interface HistorySample {
  at: Date;
  /** status().lag at that moment. */
  lagSeconds: number;
  lagSegments: number;
  /**
   * Changed keys the drain applied since the sample before, a second (null for the first
   * sample kept).
   */
  keysPerSecond: number | null;
  /** Keys built, while it was backfilling (null otherwise). */
  backfillDone: number | null;
}

/** The last hour of a transform, oldest sample first (`history()`, the operations page). */
export interface TransformHistory {
  target: string;
  samples: HistorySample[];
}

/** A transform's last redefinition in place (status().redefinition). */
export interface Redefinition {
  state: 'building' | 'failed' | 'switched';
  /** The definition it is being (or was) redefined to. */
  statement: string;
  /** What the switch does (or did) to the target, a sentence each. */
  changes: string[];
  /** Why it was given up (state `failed`). */
  error: string | null;
  /** How long the switch held the target's lock (state `switched`): the drains waited for it. */
  lockMs: number | null;
  /**
   * How long of that the lock was ACCESS EXCLUSIVE (state `switched`): readers waited for
   * this part only; 0 when the switch took none (no column changed).
   */
  readersBlockedMs: number | null;
  /** Whether the new columns were staged and filled before the switch (state `switched`). */
  staged: boolean | null;
  /** When the redefinition was asked for. */
  since: Date | null;
  /** When it was switched or given up. */
  at: Date | null;
}
