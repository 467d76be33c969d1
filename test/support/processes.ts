import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const running = new Set<ChildProcess>();

function fixture(name: string): string {
  return fileURLToPath(new URL(`../fixtures/${name}`, import.meta.url));
}

/**
 * Spawns a fixture (test/fixtures/<name>) under tsx; resolves once it prints "ready".
 * `onOutput` sees everything it prints on stdout, from the start.
 */
export async function startFixture(
  name: string,
  args: string[],
  stdin: 'ignore' | 'pipe',
  onOutput: (chunk: string) => void = () => undefined,
): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', fixture(name), ...args], {
    stdio: [stdin, 'pipe', 'inherit'],
  });
  running.add(child);
  child.on('exit', () => running.delete(child));
  let seen = '';
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`${name} exited early (${code})`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      onOutput(chunk.toString());
      seen += chunk.toString();
      if (seen.includes('ready\n')) resolve();
    });
  });
  return child;
}

/**
 * Starts Trellis workers in a child process; resolves once it has connected. Its worker
 * sessions are named `<applicationName>:worker` (`trellis-pg:worker` unless given), so a
 * test can tell them from its own process's.
 */
export function startWorkerProcess(
  url: string,
  options: { drainThreads: number; staging: boolean; applicationName?: string },
  onOutput?: (chunk: string) => void,
): Promise<ChildProcess> {
  return startFixture(
    'worker-process.ts',
    [
      url,
      String(options.drainThreads),
      String(options.staging),
      ...(options.applicationName ? [options.applicationName] : []),
    ],
    'ignore',
    onOutput,
  );
}

/** What an app process's calls met (see test/fixtures/app-process.ts). */
export interface AppProcessReport {
  outcomes: Record<string, number>;
  /** Calls that failed with something other than a TrellisError. */
  foreign: number;
}

export interface AppProcess {
  child: ChildProcess;
  /** Whether it is still running (it exits with code 70 on an unhandled rejection). */
  alive(): boolean;
  /** What its calls met so far. */
  stats(): Promise<AppProcessReport>;
  /** Asks it to stop; resolves with its exit code and report. */
  stop(): Promise<{ code: number | null; report: AppProcessReport | undefined }>;
}

/** Starts an app-like process (handle with staging and drains, calls in loops). */
export async function startAppProcess(url: string, targets: string[]): Promise<AppProcess> {
  let output = '';
  const child = await startFixture('app-process.ts', [url, targets.join(',')], 'pipe', (chunk) => {
    output += chunk;
  });
  const exited = new Promise<number | null>((resolve) => {
    if (child.exitCode !== null) resolve(child.exitCode);
    else child.once('exit', (code) => resolve(code));
  });
  return {
    child,
    alive: () => child.exitCode === null && child.signalCode === null,
    async stats() {
      const seen = output.length;
      child.stdin!.write('stats\n');
      for (;;) {
        const line = output
          .slice(seen)
          .split('\n')
          .find((l) => l.startsWith('stats ') && output.slice(seen).includes(`${l}\n`));
        if (line) return JSON.parse(line.slice('stats '.length)) as AppProcessReport;
        if (child.exitCode !== null) throw new Error(`app process exited (${child.exitCode})`);
        await new Promise((resolve) => setTimeout(resolve, 20)); // the poll interval of this wait
      }
    },
    async stop() {
      child.stdin!.write('stop\n');
      const code = await exited;
      const line = output.split('\n').find((l) => l.startsWith('{'));
      return { code, report: line ? (JSON.parse(line) as AppProcessReport) : undefined };
    },
  };
}

/** kill -9: no shutdown, no goodbye to Postgres. */
export async function killHard(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

/** Stops a worker process politely (it shuts its handle down). */
export async function stopWorkerProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  await exited;
}

/** Kills every child process still running (for afterAll). */
export async function killAllWorkerProcesses(): Promise<void> {
  await Promise.all([...running].map(killHard));
}
