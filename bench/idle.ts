import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import postgres from 'postgres';
import { Trellis } from '../src/engine/index.js';
import { type Figure, figure, type Scenario } from './scenario.js';
import { type BenchDb, converge, median, percentile, quiet, trellisOn } from './support.js';

const COUNTS = [1, 10, 100];
/** application_name of the worker handle's sessions: how its backends are found. */
const APP = 'trellis-bench-idle';
/**
 * After the transforms went live and before a measurement. Longer than the workers'
 * longest wait (5 s): a backend reports its commits to pg_stat_database when it goes
 * idle, so one still inside the wait it began when the transforms went live would report
 * the commits of that busy time inside the measurement.
 */
const SETTLE_MS = 12_000;
/** Single writes, each after this much idle time, for the commit → visible figure. */
const WRITES_AFTER_IDLE = 10;
const IDLE_BEFORE_WRITE_MS = 2_000;
const POLL_MS = 2;

/** Kernel clock ticks per second (`getconf CLK_TCK`), what /proc/<pid>/stat counts in. */
const CLOCK_TICKS = 100;

interface Sample {
  at: number;
  commits: number;
  /** CPU seconds used so far, per backend pid of the worker handle. */
  backends: Map<number, number>;
  node: NodeJS.CpuUsage;
}

/** User + system CPU seconds of a process, from /proc (null when it cannot be read). */
function cpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which is in parentheses and may hold spaces).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return null;
  }
}

async function sample(db: BenchDb): Promise<Sample> {
  const [row] = await db.sql<{ commits: string }[]>`
    SELECT xact_commit::text AS commits FROM pg_stat_database WHERE datname = current_database()`;
  const pids = await db.sql<{ pid: number }[]>`
    SELECT pid FROM pg_stat_activity
     WHERE datname = current_database() AND application_name LIKE ${`${APP}%`}`;
  const backends = new Map<number, number>();
  for (const { pid } of pids) {
    const cpu = cpuSeconds(pid);
    if (cpu !== null) backends.set(pid, cpu);
  }
  return {
    at: performance.now(),
    commits: Number(row!.commits),
    backends,
    node: process.cpuUsage(),
  };
}

interface Cost {
  seconds: number;
  commitsPerSecond: number;
  /** Share of one core used by the worker handle's backends (null: /proc not readable). */
  backendCore: number | null;
  nodeCore: number;
  backends: number;
}

/**
 * What the database and this process spend over `ms`: commits in this database (all
 * sessions, this measurement's two queries included), CPU of the worker handle's
 * backends (those alive at both ends), and CPU of this Node process.
 */
async function measure(db: BenchDb, ms: number): Promise<Cost> {
  const before = await sample(db);
  await sleep(ms);
  const after = await sample(db);
  const seconds = (after.at - before.at) / 1000;
  let backendSeconds = 0;
  let backends = 0;
  for (const [pid, cpu] of after.backends) {
    const was = before.backends.get(pid);
    if (was === undefined) continue;
    backendSeconds += cpu - was;
    backends += 1;
  }
  const node = process.cpuUsage(before.node);
  return {
    seconds,
    commitsPerSecond: (after.commits - before.commits) / seconds,
    backendCore: after.backends.size > 0 || backends > 0 ? backendSeconds / seconds : null,
    nodeCore: (node.user + node.system) / 1e6 / seconds,
    backends,
  };
}

/**
 * One write after the pipeline has been idle for a while, `WRITES_AFTER_IDLE` times:
 * commit → visible in a target, polled every POLL_MS, beside commit → visible in the
 * source in the same query (what polling alone adds).
 */
async function writesAfterIdle(db: BenchDb): Promise<{ target: number[]; source: number[] }> {
  const reader = postgres(db.url, { max: 1, onnotice: () => undefined });
  const target: number[] = [];
  const source: number[] = [];
  try {
    for (let i = 0; i < WRITES_AFTER_IDLE; i += 1) {
      await sleep(IDLE_BEFORE_WRITE_MS);
      const table = `idle_src_${(i % COUNTS.at(-1)!) + 1}`;
      const id = 1_000_000 + i;
      await db.sql.unsafe(`INSERT INTO ${table} (id, a) VALUES (${id}, ${i})`);
      const committed = performance.now();
      let inTarget = 0;
      let inSource = 0;
      while (inTarget === 0 && performance.now() - committed < 30_000) {
        const [row] = await reader.unsafe<{ t: boolean; s: boolean }[]>(
          `SELECT EXISTS (SELECT 1 FROM ${table.replace('src', 'view')} WHERE id = ${id}) AS t,
                  EXISTS (SELECT 1 FROM ${table} WHERE id = ${id}) AS s`,
        );
        const now = performance.now();
        if (row!.s && inSource === 0) inSource = now;
        if (row!.t) inTarget = now;
        else await sleep(POLL_MS);
      }
      target.push(inTarget === 0 ? Number.POSITIVE_INFINITY : inTarget - committed);
      source.push(inSource - committed);
    }
  } finally {
    await reader.end({ timeout: 5 });
  }
  return { target, source };
}

const pct = (core: number | null) => (core === null ? 'n/a' : `${(core * 100).toFixed(2)}%`);

/**
 * What idle live transforms cost when nothing is written: 1, 10 and 100 projections, each
 * over a table of its own, with a staging worker and two drain loops running in this
 * process. Per count: commits per second in the database (pg_stat_database), CPU of the
 * workers' Postgres backends and of this Node process, in shares of one core, after a
 * VACUUM ANALYZE (so autovacuum has nothing to catch up on). The baseline is the same
 * measurement with no workers running (what the database and this process cost on their
 * own). Then, with 100 transforms, single writes that each come
 * after 2 s of idle time: commit → visible in the target.
 */
export const idle: Scenario = {
  name: 'idle',
  title: 'Idle cost: 1, 10 and 100 live transforms, no writes',
  async run({ db, seconds, log }) {
    const windowMs = Math.max(10, seconds * 2) * 1000;
    const max = COUNTS.at(-1)!;
    const tables = Array.from({ length: max }, (_, i) => i + 1)
      .map(
        (n) => `CREATE TABLE idle_src_${n} (id int PRIMARY KEY, a int NOT NULL);
                INSERT INTO idle_src_${n} SELECT g, g FROM generate_series(1, 100) g;`,
      )
      .join('\n');
    await db.sql.unsafe(tables);
    const api = await trellisOn(db.url);
    const figures: Figure[] = [];
    // Autovacuum would otherwise analyse the new tables (and targets) during a
    // measurement: its transactions count as commits in this database.
    const quiesce = () => db.sql.unsafe('VACUUM ANALYZE');
    try {
      await quiesce();
      await sleep(SETTLE_MS);
      const bare = await measure(db, windowMs);
      log(`no workers: ${bare.commitsPerSecond.toFixed(1)} commits/s, node ${pct(bare.nodeCore)}`);
      const workers = await Trellis.connect({
        url: db.url,
        logger: quiet,
        staging: true,
        drainThreads: 2,
        applicationName: APP,
      });
      try {
        let defined = 0;
        for (const count of COUNTS) {
          for (; defined < count; defined += 1) {
            await api.define(
              `TRANSFORM idle_view_${defined + 1} FROM idle_src_${defined + 1} SELECT a`,
            );
          }
          for (let n = 1; n <= count; n += 1) await converge(api, `idle_view_${n}`);
          await quiesce();
          await sleep(SETTLE_MS);
          const cost = await measure(db, windowMs);
          log(
            `${count} idle transforms: ${cost.commitsPerSecond.toFixed(1)} commits/s, workers' backends ${pct(cost.backendCore)} (${cost.backends}), node ${pct(cost.nodeCore)}`,
          );
          const detail = { ...cost, bare };
          const many = count === max;
          figures.push(
            figure({
              scenario: 'idle',
              figure: `${count} idle transform${count === 1 ? '' : 's'}: commits/s`,
              value: cost.commitsPerSecond,
              unit: 'commits/s',
              baseline: { label: 'no workers', value: bare.commitsPerSecond },
              ...(many
                ? { target: { of: 'value', op: '<', threshold: 20, text: '< 20 commits/s' } }
                : {}),
              detail,
            }),
            figure({
              scenario: 'idle',
              figure: `${count} idle transform${count === 1 ? '' : 's'}: CPU, workers' backends + Node`,
              value: ((cost.backendCore ?? 0) + cost.nodeCore) * 100,
              unit: '% of a core',
              baseline: { label: 'no workers, Node', value: bare.nodeCore * 100 },
              ...(many
                ? { target: { of: 'value', op: '<', threshold: 2, text: '< 2% of a core' } }
                : {}),
              detail,
            }),
          );
        }
        const after = await writesAfterIdle(db);
        const sorted = [...after.target].sort((a, b) => a - b);
        log(
          `write after ${IDLE_BEFORE_WRITE_MS / 1000} s idle → visible: median ${median(after.target).toFixed(0)} ms, max ${sorted.at(-1)!.toFixed(0)} ms`,
        );
        figures.push(
          figure({
            scenario: 'idle',
            figure: `one write after ${IDLE_BEFORE_WRITE_MS / 1000} s idle (${max} transforms): commit → visible, median of ${WRITES_AFTER_IDLE}`,
            value: median(after.target),
            unit: 'ms',
            baseline: { label: 'visible in source', value: median(after.source) },
            detail: { samples: after.target, max: percentile(sorted, 100), source: after.source },
          }),
        );
      } finally {
        await workers.shutdown();
      }
    } finally {
      await api.shutdown();
    }
    return figures;
  },
};
