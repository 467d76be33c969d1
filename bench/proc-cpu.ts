import { readFileSync } from 'node:fs';
import type postgres from 'postgres';

/** Kernel clock ticks per second (`getconf CLK_TCK`), what /proc/<pid>/stat counts in. */
const CLOCK_TICKS = 100;

/** User + system CPU seconds of a process, from /proc (null when it cannot be read). */
export function cpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which is in parentheses and may hold spaces).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return null;
  }
}

/** CPU seconds so far of the backends whose application_name starts with `app`, by pid. */
export async function backendCpu(sql: postgres.Sql, app: string): Promise<Map<number, number>> {
  const pids = await sql<{ pid: number }[]>`
    SELECT pid FROM pg_stat_activity
     WHERE datname = current_database() AND application_name LIKE ${`${app}%`}`;
  const out = new Map<number, number>();
  for (const { pid } of pids) {
    const cpu = cpuSeconds(pid);
    if (cpu !== null) out.set(pid, cpu);
  }
  return out;
}

/** CPU seconds the backends alive at both samples used between them (null: /proc unreadable). */
export function cpuBetween(before: Map<number, number>, after: Map<number, number>): number | null {
  let total = 0;
  let seen = 0;
  for (const [pid, cpu] of after) {
    const was = before.get(pid);
    if (was === undefined) continue;
    total += cpu - was;
    seen += 1;
  }
  return seen === 0 ? null : total;
}
