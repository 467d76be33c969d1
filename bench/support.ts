import postgres from 'postgres';
import { Trellis } from '../src/engine/index.js';
import { startPostgres, type TestPostgres } from '../src/testing/index.js';

export const quiet = { debug() {}, info() {}, warn() {}, error() {} };

export interface BenchDb {
  server: TestPostgres;
  name: string;
  url: string;
  sql: postgres.Sql;
}

/**
 * A durable throwaway cluster (fsync and full-page writes on, as in production) with one
 * database per scenario, and the `settings` the chosen scenarios need. BENCH_DATABASE_URL
 * uses a server of your own instead (its settings as they are).
 */
export async function benchServer(
  settings: Record<string, string | number> = {},
): Promise<TestPostgres> {
  const url = process.env.BENCH_DATABASE_URL;
  return url
    ? startPostgres({ kind: 'url', url })
    : startPostgres({ durable: true, settings: { max_connections: 200, ...settings } });
}

export async function benchDatabase(server: TestPostgres): Promise<BenchDb> {
  const { name, url } = await server.createDatabase();
  return { server, name, url, sql: postgres(url, { max: 10, onnotice: () => undefined }) };
}

export async function dropBenchDatabase(db: BenchDb): Promise<void> {
  await db.sql.end({ timeout: 5 });
  await db.server.dropDatabase(db.name);
}

/**
 * Flushes dirty pages before a measurement, so each one starts from the same state (and
 * pays the same full-page writes). Needs a superuser or pg_checkpoint: skipped without.
 */
export async function checkpoint(db: BenchDb): Promise<void> {
  await db.sql.unsafe('CHECKPOINT').catch(() => undefined);
}

/** How long `work` takes, in ms. */
export async function timed(work: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await work();
  return performance.now() - started;
}

/** Migrates and connects a handle (workers as asked). */
export async function trellisOn(
  url: string,
  options: { staging?: boolean; drainThreads?: number; applicationName?: string } = {},
): Promise<Trellis> {
  const migrator = await Trellis.connect({ url, logger: quiet });
  await migrator.migrate();
  await migrator.shutdown();
  return Trellis.connect({ url, logger: quiet, ...options });
}

export async function converge(
  trellis: Trellis,
  target: string,
  timeoutMs = 600_000,
): Promise<void> {
  await trellis.awaitConverged(target, await trellis.watermarkToken(), { timeoutMs });
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  if (sorted.length === 0) return Number.NaN;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** (max − min) / median of `values`: how far apart repeated measurements lie. */
export function spread(values: number[]): number {
  if (values.length < 2) return 0;
  return (Math.max(...values) - Math.min(...values)) / median(values);
}

/** Repeated measurements, by what was measured. */
export class Samples<T> {
  private readonly byKey = new Map<string, T[]>();

  add(key: string, value: T): void {
    const list = this.byKey.get(key) ?? [];
    list.push(value);
    this.byKey.set(key, list);
  }

  of(key: string): T[] {
    return this.byKey.get(key) ?? [];
  }
}
