/**
 * SQLSTATE codes the engine reacts to, by name. Errors are classified through these
 * constants, never by message text (which is localised and changes between versions).
 */
export const SQLSTATE = {
  // Trellis's own codes, raised by the SQL in its catalog schema (class "TR").
  trellisParse: 'TRP01',
  trellisValidation: 'TRV01',
  trellisNotFound: 'TRN01',
  trellisConflict: 'TRC01',
  trellisIncompatibleSchema: 'TRI01',
  trellisTransient: 'TRT01',

  queryCanceled: '57014',
  readOnlySqlTransaction: '25006',
  lockNotAvailable: '55P03',
  deadlockDetected: '40P01',
  serializationFailure: '40001',
  uniqueViolation: '23505',
  duplicateObject: '42710',
  duplicateTable: '42P07',
  duplicateSchema: '42P06',
  undefinedTable: '42P01',
  undefinedFunction: '42883',
  invalidSchemaName: '3F000',
  insufficientPrivilege: '42501',
  invalidPassword: '28P01',
  invalidAuthorizationSpecification: '28000',
  invalidCatalogName: '3D000',
  tooManyConnections: '53300',
  cannotConnectNow: '57P03',
  adminShutdown: '57P01',
  crashShutdown: '57P02',
  idleInTransactionTimeout: '25P03',
  idleSessionTimeout: '57P05',
  internalError: 'XX000',
} as const;

/** SQLSTATE classes (first two characters) that mean the session itself is lost. */
export const CONNECTION_LOST_CLASSES = ['08'] as const;

export function sqlstateOf(error: unknown): string | undefined {
  if (typeof error !== 'object' || error === null) return undefined;
  const code = (error as { code?: unknown }).code;
  // postgres.js puts Node's own codes (ECONNREFUSED…) in the same field: a SQLSTATE is
  // exactly five characters of digits and upper-case letters.
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}
