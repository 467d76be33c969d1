#!/usr/bin/env node
// Fetches the Postgres client tools of one major version (pg_dump, pg_restore, pg_dumpall,
// psql) from Debian unstable's packages into a cache directory, for a machine whose own
// packages have no such major (Debian 12 has 15 only). The dump tests need a pg_dump of
// the server's major: CI runs this before the Postgres 18 run (ADR 0030).
//
//   node scripts/fetch-pg-client.mjs [--major 18] [--dir DIR] [--refresh]
//
// Prints the directory of the wrappers (DIR/bin) as its last line of stdout, so
// TRELLIS_PG_DUMP=DIR/bin/pg_dump. DIR defaults to $TRELLIS_PG_CLIENT_DIR, else
// ${XDG_CACHE_HOME:-~/.cache}/trellis-pg/pg-client-<major>. A directory that holds a
// working client is reused without any download (--refresh fetches the current one again).
//
// How: the signed InRelease of unstable is checked with gpgv against the Debian archive
// keyring, the Packages index by its SHA256 there, each .deb by its SHA256 in the index.
// postgresql-client-<major> and the shared libraries it needs (its Depends closure over
// lib* packages, libc6 included) are unpacked with dpkg-deb -x, and each wrapper runs its
// program through unstable's own dynamic loader with the unpacked libraries only: the
// programs need a newer glibc than the machine has, and never see the machine's.
// Needs Linux on x86-64, Node 20+, dpkg-deb and gpgv (both in every Debian and Ubuntu)
// and the debian-archive-keyring package; $TRELLIS_DEBIAN_MIRROR names another mirror.

import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import {
  chmod,
  mkdir,
  readdir,
  readFile,
  realpath,
  rename,
  rm,
  stat,
  writeFile,
} from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { gunzipSync } from 'node:zlib';

const run = promisify(execFile);
const PROGRAMS = ['pg_dump', 'pg_restore', 'pg_dumpall', 'psql'];
const KEYRING = '/usr/share/keyrings/debian-archive-keyring.gpg';
const SUITE = 'sid';

class Failure extends Error {}

function parseArgs(argv) {
  const options = { major: 18, dir: undefined, refresh: false };
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === '--refresh') options.refresh = true;
    else if (arg === '--major') options.major = Number(argv[++i]);
    else if (arg === '--dir') options.dir = argv[++i];
    else if (arg === '--help' || arg === '-h') {
      process.stdout.write(
        'usage: node scripts/fetch-pg-client.mjs [--major 18] [--dir DIR] [--refresh]\n',
      );
      process.exit(0);
    } else throw new Failure(`unknown argument ${arg} (see --help)`);
  }
  if (!Number.isInteger(options.major) || options.major < 10) {
    throw new Failure('--major takes a Postgres major version such as 18');
  }
  const cache = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
  options.dir = resolve(
    options.dir ||
      process.env.TRELLIS_PG_CLIENT_DIR ||
      join(cache, 'trellis-pg', `pg-client-${options.major}`),
  );
  return options;
}

function say(line) {
  process.stderr.write(`fetch-pg-client: ${line}\n`);
}

/** The major a wrapper reports, or undefined when it does not run. */
async function probe(program, major) {
  try {
    const { stdout } = await run(program, ['--version'], { timeout: 20_000 });
    const match = /\(PostgreSQL\) (\d+)\.(\d+)/.exec(stdout);
    return match && Number(match[1]) === major ? stdout.trim() : undefined;
  } catch {
    return undefined;
  }
}

/** A directory this script completed, whose every wrapper runs. */
async function usable(dir, major) {
  if (!existsSync(join(dir, 'manifest.json'))) return undefined;
  let version;
  for (const program of PROGRAMS) {
    version = await probe(join(dir, 'bin', program), major);
    if (!version) return undefined;
  }
  return version;
}

async function checkTools() {
  if (process.platform !== 'linux' || process.arch !== 'x64') {
    throw new Failure(
      `Debian's amd64 packages run on Linux x86-64 only, not ${process.platform}-${process.arch}: install the client tools your system packages (e.g. Homebrew's postgresql@18) and set TRELLIS_PG_DUMP`,
    );
  }
  for (const tool of ['dpkg-deb', 'gpgv']) {
    try {
      await run(tool, ['--version']);
    } catch {
      throw new Failure(`${tool} is not on PATH: this script needs Debian's tools (dpkg, gpgv)`);
    }
  }
  if (!existsSync(KEYRING)) {
    throw new Failure(`${KEYRING} is missing: apt-get install debian-archive-keyring`);
  }
}

async function download(url) {
  let response;
  try {
    response = await fetch(url, { signal: AbortSignal.timeout(300_000) });
  } catch (error) {
    throw new Failure(`cannot fetch ${url}: ${error.cause?.message ?? error.message}`);
  }
  if (!response.ok) throw new Failure(`cannot fetch ${url}: HTTP ${response.status}`);
  return Buffer.from(await response.arrayBuffer());
}

/** `text` as one single-quoted word for sh. */
function sh(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

function sha256(buffer) {
  return createHash('sha256').update(buffer).digest('hex');
}

/** Downloads `url` and checks it against the size and SHA256 a signed index gives. */
async function verified(url, size, hash) {
  const body = await download(url);
  if (body.length !== size || sha256(body) !== hash) {
    throw new Failure(
      `${url} is not what the signed index says (${body.length} bytes, sha256 ${sha256(body)}; expected ${size} bytes, sha256 ${hash}): a mirror mid-update? run again`,
    );
  }
  return body;
}

/** The InRelease's signed text, once gpgv has found a good signature by an archive key. */
async function signedRelease(mirror, work) {
  const file = join(work, 'InRelease');
  const out = join(work, 'Release');
  await writeFile(file, await download(`${mirror}/dists/${SUITE}/InRelease`));
  let status = '';
  try {
    ({ stdout: status } = await run('gpgv', [
      '--status-fd',
      '1',
      '--keyring',
      KEYRING,
      '--output',
      out,
      file,
    ]));
  } catch (error) {
    // gpgv fails when any signature has no key here, though another one is good.
    status = error.stdout ?? '';
    if (!/^\[GNUPG:\] VALIDSIG /m.test(status)) {
      throw new Failure(
        `the ${SUITE} InRelease has no good signature by a key in ${KEYRING} (update debian-archive-keyring?): ${String(error.stderr ?? error.message).trim()}`,
      );
    }
  }
  if (!/^\[GNUPG:\] VALIDSIG /m.test(status)) {
    throw new Failure(`gpgv found no valid signature on the ${SUITE} InRelease`);
  }
  // Valid-Until is not enforced: some mirrors serve a snapshot past it; the signature and
  // the hashes are what make the packages Debian's.
  return readFile(out, 'utf8');
}

/** Parses deb822 stanzas (Packages, Release) into objects of their fields. */
function stanzas(text) {
  const result = [];
  for (const block of text.split(/\n\s*\n/)) {
    const fields = {};
    let last;
    for (const line of block.split('\n')) {
      if (/^\s/.test(line) && last) fields[last] += `\n${line.trim()}`;
      else {
        const colon = line.indexOf(':');
        if (colon < 0) continue;
        last = line.slice(0, colon);
        fields[last] = line.slice(colon + 1).trim();
      }
    }
    if (Object.keys(fields).length) result.push(fields);
  }
  return result;
}

async function packagesIndex(mirror, release) {
  const [fields] = stanzas(release);
  const name = 'main/binary-amd64/Packages.gz';
  const line = (fields?.SHA256 ?? '')
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .find((parts) => parts[2] === name);
  if (!line) throw new Failure(`the ${SUITE} InRelease lists no ${name}`);
  const [hash, size] = [line[0], Number(line[1])];
  say(`${SUITE} (${fields.Date}): ${name}, ${(size / 1e6).toFixed(1)} MB`);
  // By hash: the file this InRelease names, even while the mirror updates.
  const url =
    fields['Acquire-By-Hash'] === 'yes'
      ? `${mirror}/dists/${SUITE}/main/binary-amd64/by-hash/SHA256/${hash}`
      : `${mirror}/dists/${SUITE}/${name}`;
  const gz = await verified(url, size, hash);
  const byName = new Map();
  const providers = new Map();
  for (const pkg of stanzas(gunzipSync(gz).toString('utf8'))) {
    if (!pkg.Package || !pkg.Filename) continue;
    byName.set(pkg.Package, pkg);
    for (const provided of (pkg.Provides ?? '').split(',')) {
      const virtual = provided.trim().split(/[\s(]/)[0];
      if (virtual && !providers.has(virtual)) providers.set(virtual, pkg.Package);
    }
  }
  return { byName, providers, date: fields.Date };
}

/**
 * postgresql-client-<major> and the closure of its Depends and Pre-Depends over library
 * packages (libc6, libpq5, libssl3t64, krb5, ldap, sasl, gnutls…): what its programs load.
 * Of alternatives, the first that the index has.
 */
function resolvePackages(index, major) {
  const root = `postgresql-client-${major}`;
  if (!index.byName.has(root)) {
    throw new Failure(`Debian ${SUITE} has no ${root} (any more?): see ADR 0030 for what to do`);
  }
  const wanted = new Map();
  const queue = [root];
  while (queue.length) {
    const name = queue.shift();
    if (wanted.has(name)) continue;
    const pkg = index.byName.get(name);
    wanted.set(name, pkg);
    const deps = [pkg.Depends, pkg['Pre-Depends']].filter(Boolean).join(',');
    for (const group of deps.split(',')) {
      const choices = group
        .split('|')
        .map((c) => c.trim().split(/[\s(:]/)[0])
        .filter(Boolean);
      if (!choices.some((c) => /^(lib|zlib)/.test(c))) continue;
      const found = choices
        .map((c) => (index.byName.has(c) ? c : index.providers.get(c)))
        .find((c) => c !== undefined);
      if (!found) throw new Failure(`${name} depends on ${group.trim()}, which ${SUITE} lacks`);
      queue.push(found);
    }
  }
  return [...wanted.values()];
}

/** Directories under `root` holding shared libraries, for the loader's --library-path. */
async function libraryDirs(root) {
  const found = [];
  const walk = async (dir) => {
    const entries = await readdir(dir, { withFileTypes: true });
    if (entries.some((e) => !e.isDirectory() && /\.so(\.\d+)*$/.test(e.name))) found.push(dir);
    for (const e of entries) if (e.isDirectory()) await walk(join(dir, e.name));
  };
  for (const top of ['lib', 'lib64', 'usr/lib', 'usr/lib64']) {
    const dir = join(root, top);
    // Skip merged-/usr symlinks (lib -> usr/lib) and what is not there.
    if (existsSync(dir) && (await stat(dir)).isDirectory()) {
      if ((await realpath(dir)) === dir) await walk(dir);
    }
  }
  // Plugin and private directories (gconv, sasl2, krb5 plugins) are loaded by path.
  return found.filter((d) => !/\/(gconv|sasl2|krb5|ossl-modules|engines-\d+)(\/|$)/.test(d));
}

async function build(options) {
  const { major, dir } = options;
  const mirror = (process.env.TRELLIS_DEBIAN_MIRROR || 'http://deb.debian.org/debian').replace(
    /\/+$/,
    '',
  );
  await mkdir(dirname(dir), { recursive: true });
  const work = `${dir}.partial-${process.pid}`;
  await rm(work, { recursive: true, force: true });
  await mkdir(join(work, 'debs'), { recursive: true });
  try {
    const release = await signedRelease(mirror, work);
    const index = await packagesIndex(mirror, release);
    const packages = resolvePackages(index, major);
    say(`packages: ${packages.map((p) => `${p.Package} ${p.Version}`).join(', ')}`);
    const root = join(work, 'root');
    await mkdir(root);
    for (const pkg of packages) {
      const deb = join(work, 'debs', pkg.Filename.split('/').pop());
      await writeFile(
        deb,
        await verified(`${mirror}/${pkg.Filename}`, Number(pkg.Size), pkg.SHA256),
      );
      await run('dpkg-deb', ['-x', deb, root]);
    }
    await rm(join(work, 'debs'), { recursive: true });

    // The wrappers name the final directory; `work` becomes it below.
    const finalRoot = join(dir, 'root');
    const loader = ['usr/lib64', 'lib64', 'usr/lib/x86_64-linux-gnu', 'lib/x86_64-linux-gnu']
      .map((d) => join(d, 'ld-linux-x86-64.so.2'))
      .find((p) => existsSync(join(root, p)));
    if (!loader) throw new Failure('the libc6 package unpacked no ld-linux-x86-64.so.2');
    const workLibs = await libraryDirs(root);
    const libs = workLibs.map((d) => join(finalRoot, d.slice(root.length + 1)));
    const client = packages[0];
    await mkdir(join(work, 'bin'));
    for (const program of PROGRAMS) {
      const binary = join(root, 'usr/lib/postgresql', String(major), 'bin', program);
      if (!existsSync(binary)) throw new Failure(`${client.Package} has no ${program}`);
      const wrapper = join(work, 'bin', program);
      await writeFile(
        wrapper,
        [
          '#!/bin/sh',
          `# ${program} of ${client.Package} ${client.Version} (Debian ${SUITE}), run with that`,
          "# release's own loader and libraries. Written by trellis-pg's scripts/fetch-pg-client.mjs.",
          `exec ${sh(join(finalRoot, loader))} --library-path ${sh(libs.join(':'))} \\`,
          `  --argv0 "$0" ${sh(join(finalRoot, 'usr/lib/postgresql', String(major), 'bin', program))} "$@"`,
          '',
        ].join('\n'),
      );
      await chmod(wrapper, 0o755);
    }
    await writeFile(
      join(work, 'manifest.json'),
      `${JSON.stringify(
        {
          major,
          suite: SUITE,
          index: index.date,
          mirror,
          packages: packages.map((p) => ({
            name: p.Package,
            version: p.Version,
            filename: p.Filename,
            sha256: p.SHA256,
          })),
        },
        null,
        2,
      )}\n`,
    );

    // Every library each program needs resolves inside the directory.
    for (const program of PROGRAMS) {
      const { stdout } = await run(join(root, loader), [
        '--library-path',
        workLibs.join(':'),
        '--list',
        join(root, 'usr/lib/postgresql', String(major), 'bin', program),
      ]);
      const missing = stdout.split('\n').filter((l) => l.includes('not found'));
      const outside = stdout
        .split('\n')
        .filter((l) => /=> \//.test(l) && !l.includes(`=> ${root}/`));
      if (missing.length || outside.length) {
        throw new Failure(
          `${program} loads libraries that are missing or from outside ${root}:\n${[...missing, ...outside].join('\n')}`,
        );
      }
    }
    await rm(dir, { recursive: true, force: true });
    try {
      await rename(work, dir);
    } catch (error) {
      // Another run finished first: use its directory when it works.
      if (await usable(dir, major)) return;
      throw error;
    }
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const bin = join(options.dir, 'bin');
  if (!options.refresh) {
    const version = await usable(options.dir, options.major);
    if (version) {
      say(`${version} is in ${bin} already (--refresh fetches the current one)`);
      process.stdout.write(`${bin}\n`);
      return;
    }
  }
  await checkTools();
  await build(options);
  const version = await usable(options.dir, options.major);
  if (!version) {
    await rm(options.dir, { recursive: true, force: true });
    throw new Failure(`the wrappers in ${bin} do not run: see the errors above`);
  }
  say(`${version} in ${bin}`);
  process.stdout.write(`${bin}\n`);
}

try {
  await main();
} catch (error) {
  const message = error instanceof Failure ? error.message : (error.stack ?? String(error));
  process.stderr.write(`fetch-pg-client: FAILED: ${message}\n`);
  process.exit(1);
}
