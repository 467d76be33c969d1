import { execFileSync } from 'node:child_process';
import { resolve } from 'node:path';
import { buildState } from './build-state.js';

/**
 * Builds trellis-pg before the suite when dist/ is missing or older than src/: the shop
 * example's tests import the build, and `npm test` on a fresh clone must pass as it is.
 * (CI builds in a step of its own first, so this does nothing there.)
 */
export function setup(): void {
  const state = buildState();
  if (state === 'current') return;
  console.log(`[test] dist/ is ${state}: npm run build`);
  execFileSync('npm', ['run', 'build', '--silent'], {
    cwd: resolve(import.meta.dirname, '../..'),
    stdio: ['ignore', 'inherit', 'inherit'],
  });
}
