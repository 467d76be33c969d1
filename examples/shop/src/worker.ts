// The shop's worker process: Trellis's staging worker and two drain loops. (`npx trellis
// worker` does the same from the CLI.) On SIGTERM/SIGINT, shutdown() cancels what is in
// flight (claims go back to the ledger: nothing is lost or applied twice) and closes up.
import { consoleLogger, serveMetrics, Trellis } from 'trellis-pg';

const url = process.env.DATABASE_URL;
if (!url) throw new Error('set DATABASE_URL (see README.md)');
const trellis = await Trellis.connect({
  url,
  staging: true,
  drainThreads: 2,
  logger: consoleLogger('info'),
});
// Its own /metrics (drain throughput, page latency, the staging leader: the web process runs
// no worker, so its /metrics has none of these) and /healthz, on METRICS_PORT (9465).
const metrics = await serveMetrics(trellis, { port: Number(process.env.METRICS_PORT ?? 9465) });
console.log(
  `shop worker: staging worker and 2 drain loops running; metrics on ${metrics.url}/metrics, health on ${metrics.url}/healthz`,
);

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.once(signal, () => {
    console.log(`shop worker: ${signal}, shutting down`);
    metrics
      .close()
      .then(() => trellis.shutdown())
      .then(
        () => process.exit(0),
        () => process.exit(1),
      );
  });
}
