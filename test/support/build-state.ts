import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';

/**
 * Whether trellis-pg's build (dist/, what the shop example and the packed package import)
 * is there and newer than every file under src/.
 */
const repo = resolve(import.meta.dirname, '../..');

export function buildState(): 'missing' | 'stale' | 'current' {
  const built = join(repo, 'dist/ops/index.js');
  if (!existsSync(built)) return 'missing';
  return newestMtime(join(repo, 'src')) > statSync(built).mtimeMs ? 'stale' : 'current';
}

function newestMtime(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    const mtime = entry.isDirectory() ? newestMtime(path) : statSync(path).mtimeMs;
    newest = Math.max(newest, mtime);
  }
  return newest;
}
