import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import { afterAll } from 'vitest';
import { buildState } from './build-state.js';

/**
 * The shop example (examples/shop) as its README runs it: `drizzle-kit migrate`, the
 * server and the worker as processes of their own, importing trellis-pg through the
 * workspace link to this repository's build (which the suite's setup makes when it is
 * missing or stale: test/support/build-setup.ts).
 */
export const SHOP_DIR = resolve(import.meta.dirname, '../../examples/shop');
const repo = resolve(import.meta.dirname, '../..');
const DRIZZLE_KIT = join(repo, 'node_modules/drizzle-kit/bin.cjs');

const running = new Set<ChildProcess>();
afterAll(() => {
  for (const child of running) child.kill('SIGKILL');
});

/** Fails with the fix when trellis-pg has not been built (the example imports the build). */
export function assertBuilt(): void {
  const state = buildState();
  if (state === 'missing') {
    throw new Error('the shop example imports the built trellis-pg: run `npm run build` first');
  }
  if (state === 'stale') {
    throw new Error('dist/ is older than src/: run `npm run build` (the shop example imports it)');
  }
}

/** `drizzle-kit migrate` in the example, as its README says; rejects with its output. */
export function migrateShop(url: string): Promise<string> {
  return new Promise((done, fail) => {
    execFile(
      process.execPath,
      [DRIZZLE_KIT, 'migrate'],
      { cwd: SHOP_DIR, env: { ...process.env, DATABASE_URL: url }, timeout: 120_000 },
      (error, stdout, stderr) =>
        error ? fail(new Error(`drizzle-kit migrate failed:\n${stdout}${stderr}`)) : done(stdout),
    );
  });
}

export interface ShopProcess {
  child: ChildProcess;
  /** Everything it printed so far. */
  output(): string;
  /** SIGTERM, then its exit code (null if killed by a signal). */
  stop(): Promise<number | null>;
}

/** Spawns `tsx <file>` in the example; resolves once its output matches `ready`. */
function startShopProcess(
  file: string,
  env: Record<string, string>,
  ready: RegExp,
): Promise<ShopProcess & { match: RegExpExecArray }> {
  const child = spawn(process.execPath, ['--import', 'tsx', file], {
    cwd: SHOP_DIR,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(child);
  let seen = '';
  const exited = new Promise<number | null>((done) =>
    child.once('exit', (code) => {
      running.delete(child);
      done(code);
    }),
  );
  const handle: ShopProcess = {
    child,
    output: () => seen,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
  return new Promise((done, fail) => {
    // A deadline for the start, not a wait (the start is told by its output).
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      fail(new Error(`${file} did not start in 60 s:\n${seen}`));
    }, 60_000);
    const onData = (chunk: Buffer) => {
      seen += chunk.toString();
      const match = ready.exec(seen);
      if (match) {
        clearTimeout(timer);
        done({ ...handle, match });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    void exited.then((code) => {
      clearTimeout(timer);
      fail(new Error(`${file} exited (${code}) before it was ready:\n${seen}`));
    });
  });
}

/** The example's server on a free port; `baseUrl` is where it listens. */
export async function startShopServer(
  url: string,
  env: Record<string, string> = {},
): Promise<ShopProcess & { baseUrl: string }> {
  const started = await startShopProcess(
    'src/server.ts',
    { DATABASE_URL: url, PORT: '0', ...env },
    /listening on (http:\/\/localhost:\d+)/,
  );
  return { ...started, baseUrl: started.match[1]! };
}

/** The example's worker process (staging worker and drain loops); `metricsUrl` its /metrics' base. */
export async function startShopWorker(url: string): Promise<ShopProcess & { metricsUrl: string }> {
  const started = await startShopProcess(
    'src/worker.ts',
    { DATABASE_URL: url, METRICS_PORT: '0' },
    /drain loops running; metrics on (http:\/\/localhost:\d+)\/metrics/,
  );
  return { ...started, metricsUrl: started.match[1]! };
}
