#!/usr/bin/env node
// Runs a test file (or the whole suite) several times in a row, each a fresh `vitest run`,
// and stops at the first run that fails (a failed test, an unhandled error, a timeout).
// Usage: node scripts/repeat-test.mjs <times> [vitest args...]
import { spawnSync } from 'node:child_process';

const [timesArg, ...args] = process.argv.slice(2);
const times = Number(timesArg);
if (!Number.isInteger(times) || times < 1) {
  console.error('usage: node scripts/repeat-test.mjs <times> [vitest args...]');
  process.exit(2);
}
const started = Date.now();
for (let run = 1; run <= times; run += 1) {
  const t0 = Date.now();
  const result = spawnSync('npx', ['vitest', 'run', ...args], { stdio: 'inherit' });
  const seconds = ((Date.now() - t0) / 1000).toFixed(0);
  if (result.status !== 0) {
    console.error(`\nrun ${run} of ${times} FAILED (exit ${result.status}) after ${seconds} s`);
    process.exit(1);
  }
  console.log(`\nrun ${run} of ${times} passed in ${seconds} s`);
}
console.log(`${times} of ${times} runs passed in ${((Date.now() - started) / 1000).toFixed(0)} s`);
