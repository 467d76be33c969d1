/** One numbered migration of Trellis's own catalog schema. */
export interface Migration {
  version: number;
  name: string;
  /** Code older than this migration cannot run against a schema that has it. */
  breaking: boolean;
  /** The SQL, with `@schema@` standing for the quoted catalog schema name. */
  sql: string;
}
