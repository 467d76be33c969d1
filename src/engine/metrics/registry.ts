import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { LIFECYCLES } from '../catalog/status-types.js';
import { packageVersion } from '../internal/package-version.js';
import type { InstanceSnapshot } from '../observe/catalog-snapshot.js';
import { latestVersion } from '../schema/install-sql.js';
import type { ProcessHealth } from '../workers/health.js';

/**
 * The process-wide metrics registry (prom-client), and every series family Trellis
 * exposes (ADR 0016). Trellis opens no port: `renderPrometheus()` returns the text for a
 * `/metrics` route the app serves, and `metricsRegistry` can be merged with the app's own
 * (`Registry.merge([register, metricsRegistry])`). Every series carries
 * `trellis_instance="<database>/<catalog schema>"`.
 *
 * Two kinds of figures:
 * - counted in this process, as the work happens (drain pages, ticks, calls): counters and
 *   histograms, removed when the instance's last handle in the process shuts down;
 * - read at scrape time: what lives in the database (lag, lifecycle, backfill, held keys,
 *   pauses, ledger, capture waits), one snapshot statement per instance per scrape
 *   (observe/catalog-snapshot.ts), and what the handles hold now (staging leader, drain
 *   loops, pools). Only open handles are scraped, so a handle's series go with it.
 */
export const metricsRegistry = new Registry();

/** What a scrape reads of each open handle (see handle-metrics.ts). */
export interface ScrapeSource {
  readonly instance: string;
  /** The instance's catalog snapshot; undefined when it could not be read in time. */
  snapshot(): Promise<InstanceSnapshot | undefined>;
  /** This handle's staging worker: 1 elected, 0 standing by; null when it runs none. */
  stagingLeader(): number | null;
  drainLoopsAlive(): number | null;
  pools(): Array<{ pool: 'calls' | 'workers'; inUse: number; waiting: number; max: number }>;
  /** This handle's workers (ADR 0038); null when it runs none. */
  workerHealth(): ProcessHealth | null;
}

const sources = new Set<ScrapeSource>();

export function addScrapeSource(source: ScrapeSource): void {
  sources.add(source);
}

export function removeScrapeSource(source: ScrapeSource): void {
  sources.delete(source);
}

interface InstanceScrape {
  snapshot: InstanceSnapshot | undefined;
  handles: ScrapeSource[];
}

/**
 * The scrape in progress. prom-client calls every metric's collect() at once when it
 * renders a registry, so the gauges of one scrape share one read per instance; the next
 * scrape reads afresh (a handle shut down since is no longer there).
 */
let scraping: Promise<Map<string, InstanceScrape>> | undefined;

function scrape(): Promise<Map<string, InstanceScrape>> {
  if (scraping) return scraping;
  const current = (async () => {
    const byInstance = new Map<string, InstanceScrape>();
    for (const source of sources) {
      const entry = byInstance.get(source.instance) ?? { snapshot: undefined, handles: [] };
      entry.handles.push(source);
      byInstance.set(source.instance, entry);
    }
    // One snapshot per instance, from its first handle (several handles on one instance
    // in a process read the same catalog).
    await Promise.all(
      [...byInstance.values()].map(async (entry) => {
        entry.snapshot = await entry.handles[0]!.snapshot().catch(() => undefined);
      }),
    );
    return byInstance;
  })();
  scraping = current;
  const clear = () => {
    if (scraping === current) scraping = undefined;
  };
  current.then(clear, clear);
  return current;
}

/** A gauge whose values are all set at scrape time, for every open instance. */
function scrapedGauge<L extends string>(
  name: string,
  help: string,
  labelNames: readonly L[],
  fill: (
    set: (labels: Record<L, string>, value: number) => void,
    entry: InstanceScrape,
    instance: string,
  ) => void,
): Gauge<L | 'trellis_instance'> {
  return new Gauge<L | 'trellis_instance'>({
    name,
    help,
    labelNames: ['trellis_instance', ...labelNames],
    registers: [metricsRegistry],
    async collect() {
      const instances = await scrape();
      this.reset();
      for (const [instance, entry] of instances) {
        fill(
          (labels, value) =>
            this.set(
              { ...labels, trellis_instance: instance } as Record<L | 'trellis_instance', string>,
              value,
            ),
          entry,
          instance,
        );
      }
    },
  });
}

/** From the snapshot, when there is one. */
function fromSnapshot<L extends string>(
  name: string,
  help: string,
  labelNames: readonly L[],
  fill: (set: (labels: Record<L, string>, value: number) => void, s: InstanceSnapshot) => void,
): void {
  scrapedGauge(name, help, labelNames, (set, entry) => {
    if (entry.snapshot) fill(set, entry.snapshot);
  });
}

/** Every pause reason the engine records, so each has a series (0 when none is paused for it). */
export const PAUSE_REASONS = [
  'operator',
  'build_failure',
  'capture_failure',
  'disruption',
  'quarantine',
  'schema_change',
] as const;

// ---- Read at scrape time, from the catalog snapshot -------------------------------------

fromSnapshot(
  'trellis_target_lag_seconds',
  'Age of the oldest captured change a target has not applied yet, in seconds (0 when caught up), as status().lag.seconds.',
  ['target'],
  (set, s) => {
    for (const t of s.transforms.values()) set({ target: t.target }, t.lagSeconds);
  },
);

fromSnapshot(
  'trellis_target_drain_seconds',
  'Drain time spent on a target (pages, ranges applied at once, builds), by every process, in seconds, as status().drain.seconds.',
  ['target'],
  (set, s) => {
    for (const t of s.transforms.values()) set({ target: t.target }, t.drainSeconds);
  },
);

fromSnapshot(
  'trellis_target_drain_share',
  "A target's share of the drain's recent time (decayed over a minute), as status().drain.share: one transform near 1 while others lag is one costly transform.",
  ['target'],
  (set, s) => {
    for (const t of s.transforms.values()) set({ target: t.target }, t.drainShare ?? 0);
  },
);

fromSnapshot(
  'trellis_target_lag_segments',
  'Sealed ledger segments a target has not applied yet, as status().lag.segments.',
  ['target'],
  (set, s) => {
    for (const t of s.transforms.values()) set({ target: t.target }, t.lagSegments);
  },
);

fromSnapshot(
  'trellis_target_state',
  "A target's lifecycle state as status() reports it: 1 for the state it is in, 0 for the others.",
  ['target', 'state'],
  (set, s) => {
    for (const t of s.transforms.values()) {
      for (const state of LIFECYCLES) set({ target: t.target, state }, t.status === state ? 1 : 0);
    }
  },
);

fromSnapshot(
  'trellis_backfill_keys_done',
  'Driving keys the current (or last) backfill of a target has filled.',
  ['target'],
  (set, s) => {
    for (const t of s.transforms.values()) {
      if (t.backfill) set({ target: t.target }, t.backfill.keysDone);
    }
  },
);

fromSnapshot(
  'trellis_backfill_keys_total',
  'Driving keys the current (or last) backfill of a target fills in all (an estimate until it is done).',
  ['target'],
  (set, s) => {
    for (const t of s.transforms.values()) {
      if (t.backfill?.keysTotal != null) set({ target: t.target }, t.backfill.keysTotal);
    }
  },
);

fromSnapshot(
  'trellis_held_keys',
  'Source keys held (quarantined) at a quarantine address ("transform" or "transform.column"), as quarantined() counts them.',
  ['target', 'address'],
  (set, s) => {
    for (const h of s.held) set({ target: h.target, address: h.address }, h.count);
  },
);

fromSnapshot(
  'trellis_paused_transforms',
  'Transforms paused as a whole, by pause reason.',
  ['reason'],
  (set, s) => {
    const counts = new Map<string, number>(PAUSE_REASONS.map((r) => [r, 0]));
    for (const t of s.transforms.values()) {
      if (t.status !== 'paused') continue;
      const reason = t.pauseReason ?? 'operator';
      counts.set(reason, (counts.get(reason) ?? 0) + 1);
    }
    for (const [reason, n] of counts) set({ reason }, n);
  },
);

fromSnapshot(
  'trellis_paused_columns',
  'Columns paused on their own (the rest of their transform flows), by pause reason.',
  ['reason'],
  (set, s) => {
    const counts = new Map<string, number>(PAUSE_REASONS.map((r) => [r, 0]));
    for (const t of s.transforms.values()) {
      for (const c of t.pausedColumns) {
        const reason = c.reason ?? 'operator';
        counts.set(reason, (counts.get(reason) ?? 0) + 1);
      }
    }
    for (const [reason, n] of counts) set({ reason }, n);
  },
);

fromSnapshot(
  'trellis_ledger_pending_rows',
  'Ledger rows (one per captured statement and source table) the transform furthest behind has not applied; counted up to 100000.',
  [],
  (set, s) => set({}, s.ledger.pendingRows),
);

fromSnapshot(
  'trellis_ledger_pending_bytes',
  'Size of those pending ledger rows, in bytes (of at most 100000 rows).',
  [],
  (set, s) => set({}, s.ledger.pendingBytes),
);

fromSnapshot(
  'trellis_ledger_size_bytes',
  "The ledger's partitions on disk, in bytes (a generation every cursor has passed is truncated).",
  [],
  (set, s) => set({}, s.ledger.bytes),
);

fromSnapshot(
  'trellis_capture_wait_seconds',
  'How long capture of a source has waited: for a lock (install, uninstall), or for older writers (widen).',
  ['table', 'operation'],
  (set, s) => {
    for (const w of s.captureWaits) set({ table: w.table, operation: w.operation }, w.seconds);
  },
);

fromSnapshot(
  'trellis_capture_wait_blockers',
  'Sessions and prepared transactions a capture wait waits on (status().captureWait lists them).',
  ['table', 'operation'],
  (set, s) => {
    for (const w of s.captureWaits) set({ table: w.table, operation: w.operation }, w.blockers);
  },
);

fromSnapshot(
  'trellis_capture_sources',
  "Captured source tables by how they are captured now: 'trigger', 'logical' (the replication slot alone, ADR 0023), or 'switching' between the two.",
  ['mode'],
  (set, s) => {
    for (const [mode, n] of Object.entries(s.wal.sources)) set({ mode }, n);
  },
);

fromSnapshot(
  'trellis_wal_retained_bytes',
  "WAL the instance's replication slot holds back, in bytes (WAL capture; absent without a slot). Past trellis_wal_retention_limit_bytes the slot is dropped and its readers stop.",
  [],
  (set, s) => {
    if (s.wal.slot?.retainedBytes != null) set({}, s.wal.slot.retainedBytes);
  },
);

fromSnapshot(
  'trellis_wal_retention_limit_bytes',
  'The ceiling on WAL the replication slot may hold back (walRetentionLimit), in bytes (absent without a slot).',
  [],
  (set, s) => {
    if (s.wal.slot) set({}, s.wal.slot.limitBytes);
  },
);

fromSnapshot(
  'trellis_schema_version',
  "The installed version of Trellis's schema (its newest migration). A process whose trellis_build_info schema_version differs runs a trellis-pg older (or newer) than the schema.",
  [],
  (set, s) => {
    if (s.schemaVersion !== null) set({}, s.schemaVersion);
  },
);

scrapedGauge(
  'trellis_catalog_readable',
  "1 when this scrape read the instance's catalog figures, 0 when it could not (database unreachable, schema not installed, or slower than the scrape deadline): the catalog series are then absent.",
  [],
  (set, entry) => set({}, entry.snapshot ? 1 : 0),
);

// ---- Read at scrape time, from the handles in this process -----------------------------

scrapedGauge(
  'trellis_build_info',
  "1, labelled with this process's trellis-pg version and the schema version it needs (for each instance it has a handle on).",
  ['version', 'schema_version'],
  (set) => set({ version: packageVersion(), schema_version: String(latestVersion()) }, 1),
);

const WORKER_ROLES = ['staging', 'decoder', 'drain'] as const;

scrapedGauge(
  'trellis_worker_failing',
  "This process's worker loops whose last pass failed, by role (staging, decoder, drain; absent for a role it does not run). status().workerFailure says what stops the instance's pipeline.",
  ['role'],
  (set, entry) => {
    const sums = new Map<string, number>();
    for (const h of entry.handles) {
      const health = h.workerHealth();
      if (!health) continue;
      for (const role of WORKER_ROLES) {
        const w = health[role];
        if (!w) continue;
        const failing = 'failing' in w ? w.failing : w.failingSince === null ? 0 : 1;
        sums.set(role, (sums.get(role) ?? 0) + failing);
      }
    }
    for (const [role, n] of sums) set({ role }, n);
  },
);

scrapedGauge(
  'trellis_worker_last_pass_timestamp_seconds',
  'When a worker loop of this process last completed a pass, by role (Unix seconds; an idle loop completes one every few seconds): alert on time() minus this.',
  ['role'],
  (set, entry) => {
    const latest = new Map<string, number>();
    for (const h of entry.handles) {
      const health = h.workerHealth();
      if (!health) continue;
      for (const role of WORKER_ROLES) {
        const at = health[role]?.lastPassAt;
        if (!at) continue;
        const seconds = Date.parse(at) / 1000;
        latest.set(role, Math.max(latest.get(role) ?? 0, seconds));
      }
    }
    for (const [role, seconds] of latest) set({ role }, seconds);
  },
);

scrapedGauge(
  'trellis_staging_leader',
  "1 when a handle in this process runs the instance's elected staging worker, 0 when it stands by (absent when no handle here runs one).",
  [],
  (set, entry) => {
    const values = entry.handles.map((h) => h.stagingLeader()).filter((v) => v !== null);
    if (values.length > 0) set({}, Math.max(...values));
  },
);

scrapedGauge(
  'trellis_drain_loops_alive',
  "Drain loops in this process connected and registered (drainThreads of the instance's handles, less those reconnecting).",
  [],
  (set, entry) => {
    const values = entry.handles.map((h) => h.drainLoopsAlive()).filter((v) => v !== null);
    if (values.length > 0)
      set(
        {},
        values.reduce((a, b) => a + b, 0),
      );
  },
);

function poolGauge(name: string, help: string, pick: 'inUse' | 'waiting' | 'max'): void {
  scrapedGauge(name, help, ['pool'], (set, entry) => {
    const sums = new Map<string, number>();
    for (const h of entry.handles) {
      for (const p of h.pools()) sums.set(p.pool, (sums.get(p.pool) ?? 0) + p[pick]);
    }
    for (const [pool, n] of sums) set({ pool }, n);
  });
}

poolGauge(
  'trellis_pool_connections_in_use',
  'Connections held now: pool="calls" by the handles\' calls, pool="workers" by the staging worker and drain loops.',
  'inUse',
);
poolGauge(
  'trellis_pool_connections_max',
  'The cap of each pool (pool.max for calls; one per worker for workers).',
  'max',
);
poolGauge(
  'trellis_pool_waiting',
  'Calls (or workers) waiting for a free connection now (pool.max is reached).',
  'waiting',
);

// ---- Counted in this process, as the work happens ---------------------------------------

const DURATION_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

export const families = {
  keysRederived: new Counter({
    name: 'trellis_keys_rederived_total',
    help: "Changed source keys re-derived into a target by this process's drain loops (pages and ranges applied).",
    labelNames: ['trellis_instance', 'target'],
    registers: [metricsRegistry],
  }),
  rowsUpserted: new Counter({
    name: 'trellis_rows_upserted_total',
    help: "Target rows inserted or updated by this process's drain loops.",
    labelNames: ['trellis_instance', 'target'],
    registers: [metricsRegistry],
  }),
  rowsDeleted: new Counter({
    name: 'trellis_rows_deleted_total',
    help: "Target rows deleted by this process's drain loops (rows that no longer qualify).",
    labelNames: ['trellis_instance', 'target'],
    registers: [metricsRegistry],
  }),
  pagesApplied: new Counter({
    name: 'trellis_pages_applied_total',
    help: "Drain pages (and small ledger ranges applied at once) applied by this process's drain loops.",
    labelNames: ['trellis_instance', 'target'],
    registers: [metricsRegistry],
  }),
  pagesFailed: new Counter({
    name: 'trellis_pages_failed_total',
    help: "Drain pages that failed for no row's fault (retried with backoff; status().drainFailure says why).",
    labelNames: ['trellis_instance', 'target'],
    registers: [metricsRegistry],
  }),
  pageDuration: new Histogram({
    name: 'trellis_page_duration_seconds',
    help: 'Time to apply one drain page (or small range), in its transaction, failed ones included.',
    labelNames: ['trellis_instance', 'target'],
    buckets: DURATION_BUCKETS,
    registers: [metricsRegistry],
  }),
  ticksSealed: new Counter({
    name: 'trellis_ticks_sealed_total',
    help: "Ticks (ledger segments sealed) taken by this process's staging worker.",
    labelNames: ['trellis_instance'],
    registers: [metricsRegistry],
  }),
  callDuration: new Histogram({
    name: 'trellis_call_duration_seconds',
    help: 'Duration of handle calls, by method and outcome ("ok", or the TrellisError code it failed with).',
    labelNames: ['trellis_instance', 'method', 'outcome'],
    buckets: DURATION_BUCKETS,
    registers: [metricsRegistry],
  }),
  logLinesDropped: new Counter({
    name: 'trellis_log_lines_dropped_total',
    help: "Engine log lines dropped because the app's logger fell behind (its buffer was full).",
    labelNames: ['trellis_instance'],
    registers: [metricsRegistry],
  }),
  selfChecks: new Counter({
    name: 'trellis_self_checks_total',
    help: 'Finished self-checks of a target, by outcome.',
    labelNames: ['trellis_instance', 'target', 'outcome'],
    registers: [metricsRegistry],
  }),
  selfCheckDivergences: new Counter({
    name: 'trellis_self_check_divergences_total',
    help: 'Rows a finished self-check found diverging from the definition, by kind (missing, extra, differs).',
    labelNames: ['trellis_instance', 'target', 'kind'],
    registers: [metricsRegistry],
  }),
};

/** The registry's text format, for a `/metrics` route. */
export function renderPrometheus(): Promise<string> {
  return metricsRegistry.metrics();
}

/** The Content-Type of `renderPrometheus()`'s text. */
export const prometheusContentType: string = metricsRegistry.contentType;
