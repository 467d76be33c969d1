// A second app process for the scale-out scenario: a handle running drain loops (no
// staging worker), until SIGTERM.
// Usage: tsx bench/drain-process.ts <url> <drainThreads>
import { Trellis } from '../src/engine/index.js';
import { quiet } from './support.js';

const [url, drainThreads] = process.argv.slice(2);
const trellis = await Trellis.connect({
  url: url!,
  drainThreads: Number(drainThreads),
  logger: quiet,
});
process.stdout.write('ready\n');
process.on('SIGTERM', () => {
  void trellis.shutdown().then(() => process.exit(0));
});
setInterval(() => undefined, 1 << 30);
