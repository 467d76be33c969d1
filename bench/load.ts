import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import postgres from 'postgres';

const run = promisify(execFile);

/** One transaction of a closed-loop load, as a pgbench script and as postgres.js code. */
export interface Workload {
  /** A pgbench custom script (`\set` lines and one statement). */
  pgbench: string;
  /** The same transaction for the postgres.js fallback. */
  node: (sql: postgres.Sql) => Promise<unknown>;
}

export interface LoadResult {
  tps: number;
  /** Average latency in ms. */
  latencyMs: number;
  tool: 'pgbench' | 'postgres.js';
}

/** pgbench on PATH (BENCH_PGBENCH names another; BENCH_PGBENCH=none forces the fallback). */
export function findPgbench(): string | undefined {
  const named = process.env.BENCH_PGBENCH;
  if (named === 'none') return undefined;
  if (named) return named;
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir && existsSync(join(dir, 'pgbench'))) return join(dir, 'pgbench');
  }
  return undefined;
}

/**
 * Runs `workload` from `clients` clients for `seconds` and reports transactions per second:
 * pgbench (`-M prepared`, 2 threads at most) when there is one, otherwise one postgres.js
 * client per simulated client.
 */
export async function runLoad(
  url: string,
  workload: Workload,
  clients: number,
  seconds: number,
): Promise<LoadResult> {
  const pgbench = findPgbench();
  return pgbench
    ? runPgbench(pgbench, url, workload.pgbench, clients, seconds)
    : runNodeClients(url, workload.node, clients, seconds);
}

async function runPgbench(
  pgbench: string,
  url: string,
  script: string,
  clients: number,
  seconds: number,
): Promise<LoadResult> {
  const u = new URL(url);
  const dir = await mkdtemp(join(tmpdir(), 'trellis-bench-'));
  const file = join(dir, 'script.sql');
  await writeFile(file, script);
  const env: NodeJS.ProcessEnv = { ...process.env };
  if (u.password) env.PGPASSWORD = decodeURIComponent(u.password);
  const sslmode = u.searchParams.get('sslmode');
  if (sslmode) env.PGSSLMODE = sslmode;
  try {
    const { stdout } = await run(
      pgbench,
      [
        '-n',
        '-M',
        'prepared',
        '-h',
        u.hostname,
        '-p',
        u.port || '5432',
        '-U',
        decodeURIComponent(u.username || 'postgres'),
        '-c',
        String(clients),
        '-j',
        String(Math.min(2, clients)),
        '-T',
        String(seconds),
        '-f',
        file,
        decodeURIComponent(u.pathname.slice(1)),
      ],
      { env, maxBuffer: 16 * 1024 * 1024 },
    );
    const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(stdout)?.[1];
    const latency = /latency average = ([\d.]+) ms/.exec(stdout)?.[1];
    const failed = /number of failed transactions: (\d+)/.exec(stdout)?.[1];
    if (!tps) throw new Error(`cannot read pgbench's output:\n${stdout}`);
    if (failed && Number(failed) > 0) throw new Error(`pgbench: ${failed} transactions failed`);
    return { tps: Number(tps), latencyMs: Number(latency ?? Number.NaN), tool: 'pgbench' };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function runNodeClients(
  url: string,
  transaction: (sql: postgres.Sql) => Promise<unknown>,
  clients: number,
  seconds: number,
): Promise<LoadResult> {
  const conns = Array.from({ length: clients }, () =>
    postgres(url, { max: 1, onnotice: () => undefined }),
  );
  try {
    await Promise.all(conns.map((sql) => sql`SELECT 1`));
    let done = 0;
    const started = performance.now();
    const deadline = started + seconds * 1000;
    await Promise.all(
      conns.map(async (sql) => {
        while (performance.now() < deadline) {
          await transaction(sql);
          done += 1;
        }
      }),
    );
    const elapsed = (performance.now() - started) / 1000;
    return {
      tps: done / elapsed,
      latencyMs: (clients * elapsed * 1000) / done,
      tool: 'postgres.js',
    };
  } finally {
    await Promise.all(conns.map((sql) => sql.end({ timeout: 5 })));
  }
}
