/**
 * The ledger's generations: a row goes to `(xid >> EPOCH_BITS) % GENERATIONS`. The SQL
 * function `<schema>.ledger_generation()` (0007_pipeline.sql) computes the same, and the
 * capture triggers inline it; the three must agree.
 */
export const GENERATIONS = 3;
export const EPOCH_BITS = 16;

/** Heap pages per range of the ledger's BRIN index on xid (0007_pipeline.sql). */
export const LEDGER_PAGES_PER_RANGE = 16;
