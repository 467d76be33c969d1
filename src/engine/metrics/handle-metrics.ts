import type { Counter, Histogram } from 'prom-client';
import type { InstanceSnapshot } from '../observe/catalog-snapshot.js';
import { addScrapeSource, families, removeScrapeSource, type ScrapeSource } from './registry.js';

type Labels = Record<string, string>;
type Family = Counter<string> | Histogram<string>;

/**
 * The counted series of one instance in this process, shared by its handles: label sets
 * are remembered so that, when the instance's last handle shuts down, its series go
 * (prom-client removes a series by its full label set).
 */
interface InstanceSeries {
  handles: number;
  touched: Map<Family, Map<string, Labels>>;
}

const instances = new Map<string, InstanceSeries>();

function touch(instance: string, family: Family, labels: Labels): Labels {
  const series = instances.get(instance);
  const full = { ...labels, trellis_instance: instance };
  if (!series) return full;
  let seen = series.touched.get(family);
  if (!seen) {
    seen = new Map();
    series.touched.set(family, seen);
  }
  const key = JSON.stringify(full);
  if (!seen.has(key)) seen.set(key, full);
  return full;
}

/** Adds `value` to a counter of `instance`, if a handle of it is open in this process. */
export function countFor(
  instance: string,
  family: Counter<string>,
  labels: Labels,
  value = 1,
): void {
  if (!instances.has(instance) || value <= 0) return;
  family.inc(touch(instance, family, labels), value);
}

/** What a handle gives the metrics: what a scrape reads of it. */
export interface HandleFigures {
  snapshot(): Promise<InstanceSnapshot | undefined>;
  stagingLeader(): number | null;
  drainLoopsAlive(): number | null;
  pools(): ReturnType<ScrapeSource['pools']>;
  workerHealth(): ReturnType<ScrapeSource['workerHealth']>;
}

/** Work a drain loop applied (or failed on): one page, or one small range applied at once. */
export interface AppliedPage {
  target: string;
  keys: number;
  upserted: number;
  deleted: number;
  seconds: number;
  failed: boolean;
}

/**
 * One handle's metrics: registers what a scrape reads of it for as long as it is open,
 * and counts the work its calls and workers do under its instance's label.
 */
export class HandleMetrics {
  private readonly source: ScrapeSource;
  private closed = false;

  constructor(
    readonly instance: string,
    figures: HandleFigures,
  ) {
    const series = instances.get(instance) ?? { handles: 0, touched: new Map() };
    series.handles += 1;
    instances.set(instance, series);
    this.source = { instance, ...bindAll(figures) };
    addScrapeSource(this.source);
  }

  page(work: AppliedPage): void {
    if (this.closed) return;
    const labels = { target: work.target };
    families.pageDuration.observe(
      touch(this.instance, families.pageDuration, labels),
      work.seconds,
    );
    if (work.failed) {
      countFor(this.instance, families.pagesFailed, labels);
      return;
    }
    countFor(this.instance, families.pagesApplied, labels);
    countFor(this.instance, families.keysRederived, labels, work.keys);
    countFor(this.instance, families.rowsUpserted, labels, work.upserted);
    countFor(this.instance, families.rowsDeleted, labels, work.deleted);
  }

  tickSealed(): void {
    if (!this.closed) countFor(this.instance, families.ticksSealed, {});
  }

  call(method: string, outcome: string, seconds: number): void {
    if (this.closed) return;
    families.callDuration.observe(
      touch(this.instance, families.callDuration, { method, outcome }),
      seconds,
    );
  }

  logLinesDropped(lines: number): void {
    if (!this.closed) countFor(this.instance, families.logLinesDropped, {}, lines);
  }

  /** The handle shut down: its scrape figures go now, its counted series with the instance's last handle. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    removeScrapeSource(this.source);
    const series = instances.get(this.instance);
    if (!series) return;
    series.handles -= 1;
    if (series.handles > 0) return;
    instances.delete(this.instance);
    for (const [family, labelSets] of series.touched) {
      for (const labels of labelSets.values()) family.remove(labels);
    }
  }
}

function bindAll(figures: HandleFigures): Omit<ScrapeSource, 'instance'> {
  return {
    snapshot: () => figures.snapshot(),
    stagingLeader: () => figures.stagingLeader(),
    drainLoopsAlive: () => figures.drainLoopsAlive(),
    pools: () => figures.pools(),
    workerHealth: () => figures.workerHealth(),
  };
}
