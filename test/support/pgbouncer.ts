import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { freePort, unprivilegedUser } from '../../src/testing/cluster.js';
import { IN_CI } from './ci.js';

// PgBouncer, started by the test harness as Postgres is (ADR 0037): Debian's package
// (`apt-get install pgbouncer`, which `.ci/run` does), run as the `postgres` OS user when
// the suite runs as root (PgBouncer refuses root), on a free loopback port, in a directory
// of its own that goes with it, in front of the suite's own cluster.

/** The pgbouncer binary: on PATH, or where Debian's package puts it. */
export function pgbouncerPath(): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/usr/bin'];
  for (const dir of dirs) {
    if (!dir) continue;
    const candidate = join(dir, 'pgbouncer');
    if (existsSync(candidate)) return candidate;
  }
  return undefined;
}

/**
 * Whether the pooler tests can run here; under CI a missing pgbouncer fails the file
 * (`.ci/run` installs it), elsewhere it is skipped with the reason printed.
 */
export function pgbouncerAvailable(file: string): boolean {
  if (pgbouncerPath()) return true;
  if (IN_CI) {
    throw new Error(`${file} needs PgBouncer: .ci/run installs it (apt-get install pgbouncer)`);
  }
  console.log(`[skip] ${file}: no pgbouncer (apt-get install pgbouncer)`);
  return false;
}

export interface PgBouncerOptions {
  /** The suite's Postgres: its admin URL (host and port are what PgBouncer connects to). */
  serverUrl: string;
  poolMode: 'session' | 'transaction' | 'statement';
  /** Startup parameters PgBouncer lets through without forwarding (`ignore_startup_parameters`). */
  ignoreStartupParameters?: string[];
  /** Server connections per database and user. @defaultValue 20 */
  poolSize?: number;
  /** PgBouncer's `server_reset_query` (its default, `DISCARD ALL`, when left out). */
  serverResetQuery?: string;
}

/**
 * A PgBouncer a test started. `url(database)` connects through it; `running` tells whether
 * the process is still up (a crash is what some tests look for), `log()` reads its log.
 */
export class PgBouncer {
  private exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;

  private constructor(
    readonly port: number,
    private readonly dir: string,
    private readonly child: ChildProcess,
    private readonly reaper: ChildProcess,
  ) {
    child.on('exit', (code, signal) => {
      this.exited = { code, signal };
    });
  }

  static async start(options: PgBouncerOptions): Promise<PgBouncer> {
    const binary = pgbouncerPath();
    if (!binary) throw new Error('pgbouncer is not installed (apt-get install pgbouncer)');
    const runAs = await unprivilegedUser();
    const dir = await mkdtemp(join(tmpdir(), 'trellis-pgbouncer-'));
    await chmod(dir, 0o755);
    if (runAs) await chown(dir, runAs.uid, runAs.gid);
    const server = new URL(options.serverUrl);
    const port = await freePort();
    const settings: Record<string, string | number> = {
      listen_addr: '127.0.0.1',
      listen_port: port,
      unix_socket_dir: '',
      auth_type: 'trust',
      auth_file: join(dir, 'userlist.txt'),
      pool_mode: options.poolMode,
      max_client_conn: 500,
      default_pool_size: options.poolSize ?? 20,
      logfile: join(dir, 'pgbouncer.log'),
      pidfile: join(dir, 'pgbouncer.pid'),
      admin_users: 'postgres',
      ignore_startup_parameters: (options.ignoreStartupParameters ?? []).join(','),
      ...(options.serverResetQuery === undefined
        ? {}
        : { server_reset_query: options.serverResetQuery }),
    };
    const ini = [
      '[databases]',
      `* = host=${server.hostname} port=${server.port}`,
      '',
      '[pgbouncer]',
      ...Object.entries(settings).map(([k, v]) => `${k} = ${v}`),
      '',
    ].join('\n');
    for (const [file, content] of [
      ['pgbouncer.ini', ini],
      ['userlist.txt', '"postgres" ""\n'],
    ] as const) {
      await writeFile(join(dir, file), content, { mode: 0o600 });
      if (runAs) await chown(join(dir, file), runAs.uid, runAs.gid);
    }
    const child = spawn(binary, [join(dir, 'pgbouncer.ini')], {
      ...(runAs ?? {}),
      cwd: dir,
      stdio: 'ignore',
    });
    // Stops PgBouncer if this process dies without stopping it (as the cluster's reaper).
    const reaper = spawn(process.execPath, ['-e', REAPER, String(process.pid), String(child.pid)], {
      detached: true,
      stdio: 'ignore',
    });
    reaper.unref();
    const bouncer = new PgBouncer(port, dir, child, reaper);
    try {
      await bouncer.waitListening();
    } catch (error) {
      await bouncer.stop();
      throw error;
    }
    return bouncer;
  }

  /** A URL for `database` through PgBouncer, as the `postgres` user. */
  url(database: string): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${encodeURIComponent(database)}`;
  }

  /** Still running (PgBouncer exits on a FATAL error: "bad client state", say). */
  get running(): boolean {
    return this.exited === undefined;
  }

  /** Its log file, as written so far. */
  async log(): Promise<string> {
    return readFile(join(this.dir, 'pgbouncer.log'), 'utf8').catch(() => '');
  }

  private async waitListening(): Promise<void> {
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if (this.exited) {
        throw new Error(
          `pgbouncer exited at start (${JSON.stringify(this.exited)}): ${await this.log()}`,
        );
      }
      const open = await new Promise<boolean>((resolve) => {
        const socket = connect(this.port, '127.0.0.1');
        socket.once('connect', () => {
          socket.destroy();
          resolve(true);
        });
        socket.once('error', () => resolve(false));
      });
      if (open) return;
      await new Promise((resolve) => setTimeout(resolve, 50)); // the poll interval of this wait
    }
    throw new Error(`pgbouncer did not listen on ${this.port} within 10 s: ${await this.log()}`);
  }

  async stop(): Promise<void> {
    if (this.running) {
      const exited = new Promise((resolve) => this.child.once('exit', resolve));
      this.child.kill('SIGINT');
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5_000))]); // a deadline, not a wait
      if (this.running) this.child.kill('SIGKILL');
    }
    this.reaper.kill();
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** Argv: owner pid, pgbouncer pid. Kills PgBouncer once the owner is gone. */
const REAPER = `
const [owner, child] = process.argv.slice(1).map(Number);
const alive = (pid) => {
  try { process.kill(pid, 0); return true; } catch (e) { return e.code === 'EPERM'; }
};
const timer = setInterval(() => {
  if (alive(owner)) return;
  clearInterval(timer);
  try { process.kill(child, 'SIGKILL'); } catch {}
}, 500);
`;
