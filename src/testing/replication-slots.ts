import type postgres from 'postgres';

/**
 * Drops the replication slots of database `name` (a Trellis instance with WAL capture
 * keeps one), so the database can be dropped: Postgres refuses to drop a database that
 * has a slot. A slot still in use is freed first by ending its WAL sender; a slot still
 * marked active just after is tried again for up to 5 s.
 */
export async function dropReplicationSlots(admin: postgres.Sql, name: string): Promise<void> {
  const deadline = Date.now() + 5_000;
  for (;;) {
    const slots = await admin.unsafe<Array<{ slot: string; pid: number | null }>>(
      `SELECT slot_name AS slot, active_pid AS pid FROM pg_replication_slots WHERE database = $1`,
      [name],
    );
    if (slots.length === 0) return;
    let left = false;
    for (const { slot, pid } of slots) {
      if (pid !== null) {
        await admin.unsafe('SELECT pg_terminate_backend($1)', [pid]);
        left = true;
        continue;
      }
      try {
        await admin.unsafe('SELECT pg_drop_replication_slot($1)', [slot]);
      } catch (error) {
        // Taken again (or dropped) since it was listed: look again.
        if (Date.now() > deadline) throw error;
        left = true;
      }
    }
    if (!left) return;
    if (Date.now() > deadline) throw new Error(`replication slots of ${name} stay in use`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
