import { TrellisError } from './errors.js';
import { assertIdentifier } from './identifiers.js';
import { consoleLogger, type Logger } from './logger.js';
import { LOG_BUFFER_LINES } from './observe/log-bridge.js';

/** Options of `Trellis.connect`. Every field but `url` has a default, declared once below. */
export interface ConnectOptions {
  /** Postgres URL. TLS through `sslmode` (and `sslrootcert`, `sslcert`, `sslkey`) in the URL. */
  url: string;
  /**
   * The catalog schema: one Trellis instance per catalog schema.
   * @defaultValue `'trellis'`
   */
  schema?: string;
  /**
   * Where targets are created.
   * @defaultValue `'public'`
   */
  targetSchema?: string;
  pool?: {
    /**
     * Connections this handle's calls may hold at once (workers hold their own).
     * @defaultValue `10`
     */
    max?: number;
    /**
     * How long a call waits for a free connection before failing with `timeout`.
     * @defaultValue `5000`
     */
    acquireTimeoutMs?: number;
  };
  /**
   * Run this instance's staging worker (one per fleet wins an advisory lock; others stand by).
   * @defaultValue `false`
   */
  staging?: boolean;
  /**
   * Concurrent drain loops in this process.
   * @defaultValue `0`
   */
  drainThreads?: number;
  /**
   * Where engine log lines go (pino-compatible).
   * @defaultValue warn-level console logger
   */
  logger?: Logger;
  /**
   * Log lines that may wait for a slow logger; past this, lines are dropped and one warning
   * says how many (the engine never waits for the logger).
   * @defaultValue `1000`
   */
  logBufferLines?: number;
  /**
   * Every call settles within this many milliseconds, or fails with `timeout` and the
   * server-side work it started is cancelled.
   * @defaultValue `30000`
   */
  callTimeoutMs?: number;
  /**
   * `application_name` of this handle's sessions (workers append their role).
   * @defaultValue `'trellis-pg'`
   */
  applicationName?: string;
  /**
   * How many keys one quarantine address (`"transform"` or `"transform.column"`) may hold
   * before it pauses itself (`pauseReason: 'quarantine'`). Instance-wide: a handle given it
   * records it in the catalog when it connects (and on `migrate()`), for every drain of the
   * instance; left out, the recorded value stands (100 at install).
   */
  quarantineThreshold?: number;
  /**
   * How the instance captures changes to sources: `'trigger'` (capture triggers, which work
   * on any Postgres) or `'logical'` (a replication slot: writers pay no trigger; needs
   * `wal_level = logical` and the REPLICATION attribute, or the connect fails with
   * `validation` naming the setting). Instance-wide: a handle given it records it in the
   * catalog when it connects (and on `migrate()`), and the staging worker moves each source
   * over; left out, the recorded value stands (`'trigger'` at install).
   */
  capture?: CaptureMode;
  /**
   * WAL capture: how many bytes of WAL the replication slot may hold back. Past it, the
   * staging worker drops the slot and stops the transforms it fed (RESUME rebuilds them)
   * rather than let it fill the disk. Instance-wide, recorded like `capture`.
   * @defaultValue catalog's (4 GiB at install)
   */
  walRetentionLimit?: number;
}

/** How an instance captures changes (see `ConnectOptions.capture`). */
export type CaptureMode = 'trigger' | 'logical';

export interface ResolvedOptions {
  url: string;
  schema: string;
  targetSchema: string;
  pool: { max: number; acquireTimeoutMs: number };
  staging: boolean;
  drainThreads: number;
  logger: Logger;
  logBufferLines: number;
  callTimeoutMs: number;
  applicationName: string;
  quarantineThreshold: number | undefined;
  capture: CaptureMode | undefined;
  walRetentionLimit: number | undefined;
}

export const DEFAULTS = {
  schema: 'trellis',
  targetSchema: 'public',
  pool: { max: 10, acquireTimeoutMs: 5000 },
  staging: false,
  drainThreads: 0,
  logBufferLines: LOG_BUFFER_LINES,
  callTimeoutMs: 30_000,
  applicationName: 'trellis-pg',
} as const satisfies Omit<
  ResolvedOptions,
  'url' | 'logger' | 'quarantineThreshold' | 'capture' | 'walRetentionLimit'
>;

function positiveInt(name: string, value: number, min: number): number {
  if (!Number.isInteger(value) || value < min) {
    throw new TrellisError('validation', `${name} must be an integer >= ${min}, got ${value}`);
  }
  return value;
}

/** Validates options once, at the boundary, and fills in the defaults. */
export function resolveOptions(options: ConnectOptions): ResolvedOptions {
  if (typeof options?.url !== 'string' || options.url.length === 0) {
    throw new TrellisError('validation', 'connect needs a url (postgres://user@host:port/db)');
  }
  const schema = options.schema ?? DEFAULTS.schema;
  const targetSchema = options.targetSchema ?? DEFAULTS.targetSchema;
  assertIdentifier('schema', schema);
  assertIdentifier('targetSchema', targetSchema);
  if (schema === targetSchema) {
    throw new TrellisError('validation', 'schema and targetSchema must differ');
  }
  return {
    url: options.url,
    schema,
    targetSchema,
    pool: {
      max: positiveInt('pool.max', options.pool?.max ?? DEFAULTS.pool.max, 1),
      acquireTimeoutMs: positiveInt(
        'pool.acquireTimeoutMs',
        options.pool?.acquireTimeoutMs ?? DEFAULTS.pool.acquireTimeoutMs,
        0,
      ),
    },
    staging: options.staging ?? DEFAULTS.staging,
    drainThreads: positiveInt('drainThreads', options.drainThreads ?? DEFAULTS.drainThreads, 0),
    logger: options.logger ?? consoleLogger('warn'),
    logBufferLines: positiveInt(
      'logBufferLines',
      options.logBufferLines ?? DEFAULTS.logBufferLines,
      1,
    ),
    callTimeoutMs: positiveInt('callTimeoutMs', options.callTimeoutMs ?? DEFAULTS.callTimeoutMs, 1),
    applicationName: options.applicationName ?? DEFAULTS.applicationName,
    quarantineThreshold:
      options.quarantineThreshold === undefined
        ? undefined
        : positiveInt('quarantineThreshold', options.quarantineThreshold, 1),
    capture: captureMode(options.capture),
    walRetentionLimit:
      options.walRetentionLimit === undefined
        ? undefined
        : positiveInt('walRetentionLimit', options.walRetentionLimit, 1),
  };
}

function captureMode(value: unknown): CaptureMode | undefined {
  if (value === undefined || value === 'trigger' || value === 'logical') return value;
  throw new TrellisError(
    'validation',
    `capture must be 'trigger' or 'logical', got ${JSON.stringify(value)}`,
  );
}
