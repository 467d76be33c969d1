/** This package's version, from its package.json. */
export { packageVersion } from '../engine/internal/package-version.js';
