/**
 * trellis-pg/ops: an operations page an app mounts on its own HTTP server. Read-only unless
 * the app passes `authorize`.
 * @packageDocumentation
 */
export {
  OPS_ACTIONS,
  type OpsActionName,
  type OpsActionRequest,
  type OpsAuthorize,
} from './actions.js';
export { type OpsHandlerOptions, type OpsRequestHandler, opsHandler } from './handler.js';
export type { OpsHeldAddress, OpsSnapshot, OpsTransform } from './snapshot.js';
export { readOpsSnapshot } from './snapshot.js';
