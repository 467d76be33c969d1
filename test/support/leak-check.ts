import { afterAll, afterEach } from 'vitest';
import { openHandleInstances } from '../../src/engine/internal/open-handles.js';
import { applyTestCapture } from './capture-mode.js';
import { dropTestDatabases, openClientCount } from './database.js';
import { takeRecentLogs } from './recent-logs.js';

applyTestCapture();

// A failing test prints the engine's info, warning and error lines logged meanwhile.
afterEach((context) => {
  const logs = takeRecentLogs();
  if (context.task.result?.state === 'fail' && logs.length > 0) {
    console.error(`[engine log lines during "${context.task.name}"]\n${logs.join('\n')}`);
  }
});

// Registered before any test file's hooks, so (hooks run as a stack) it runs after them:
// a file that leaves a handle or a helper client open fails here.
afterAll(async () => {
  await dropTestDatabases();
  const handles = openHandleInstances();
  if (handles.length > 0) {
    throw new Error(
      `test file left ${handles.length} Trellis handle(s) open: ${handles.join(', ')}`,
    );
  }
  const clients = openClientCount();
  if (clients > 0) throw new Error(`test file left ${clients} helper SQL client(s) open`);
});
