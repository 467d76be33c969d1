// Types a drizzle-built transform's target infers (issue #24: assertions made only with
// expectTypeOf fail at compile time, not in vitest, so they live here, where
// `npm run typecheck` checks them; this file is never run).
import { expectTypeOf } from 'vitest';
import type { readTotals, reportingLines } from '../support/drizzle-app.js';

// The target typed by what the SELECT produces.
type Row = Awaited<ReturnType<typeof readTotals>>[number];
expectTypeOf<Row>().toEqualTypeOf<{
  customerId: number;
  name: string;
  region: string | null;
  total: string;
  orderCount: number;
  lastPlaced: Date;
}>();
type Line = (typeof reportingLines)['$inferSelect'];
// The LEFT JOINed side is nullable even where its column is NOT NULL.
expectTypeOf<Line>().toEqualTypeOf<{
  employeeId: number;
  fullName: string;
  managerName: string | null;
}>();
