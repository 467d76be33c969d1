import { afterAll } from 'vitest';
import { openHandleInstances } from '../../src/engine/internal/open-handles.js';
import { applyTestCapture } from './capture-mode.js';
import { dropTestDatabases, openClientCount } from './database.js';

applyTestCapture();

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
