import type { Trellis } from '../../src/engine/index.js';
import type { TestDatabase } from './database.js';

/** How `definitions()` says a target is kept (delta, group recompute, and why). */
export async function maintenanceOf(trellis: Trellis, target: string) {
  const all = await trellis.definitions();
  return all.find((d) => d.target === target)?.maintenance;
}

/** The kind of key map a transform keeps (ADR 0051), as its catalog row records it. */
export async function keyMapOf(db: TestDatabase, target: string): Promise<string | null> {
  const [row] = await db.sql<{ kind: string | null }[]>`
    SELECT spec->>'key_map' AS kind FROM trellis.transforms WHERE target_name = ${target}`;
  return row?.kind ?? null;
}
