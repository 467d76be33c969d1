import { drainThroughput } from './drain-throughput.js';
import { benchDatabase, benchServer } from './support.js';

const server = await benchServer();
try {
  const db = await benchDatabase(server);
  console.log(
    await drainThroughput(db, Number(process.argv[2] ?? 200_000), Number(process.argv[3] ?? 2)),
  );
  await db.sql.end();
} finally {
  await server.stop();
}
