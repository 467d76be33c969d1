#!/usr/bin/env node
// The `trellis` command. The work is in run.ts; this file only binds it to the process.
import { runCli } from './run.js';

process.exitCode = await runCli(process.argv.slice(2), {
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
  env: process.env,
  isTTY: process.stderr.isTTY === true,
});
