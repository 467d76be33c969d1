import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const fixture = fileURLToPath(new URL('../fixtures/worker-process.ts', import.meta.url));
const running = new Set<ChildProcess>();

/** Starts Trellis workers in a child process; resolves once it has connected. */
export async function startWorkerProcess(
  url: string,
  options: { drainThreads: number; staging: boolean },
): Promise<ChildProcess> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', fixture, url, String(options.drainThreads), String(options.staging)],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  running.add(child);
  child.on('exit', () => running.delete(child));
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`worker process exited early (${code})`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('ready')) resolve();
    });
  });
  return child;
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

/** Kills every worker process still running (for afterAll). */
export async function killAllWorkerProcesses(): Promise<void> {
  await Promise.all([...running].map(killHard));
}
