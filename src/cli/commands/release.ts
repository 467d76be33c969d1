import { connectCli, printJson } from '../connect.js';
import { CliExit, type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';
import { EXIT_CODES } from '../exit-codes.js';

export const release = defineCommand<ConnectionFlags & JsonFlag>({
  name: 'release',
  summary: 'release one held key once its cause is fixed (it is re-derived now)',
  description: `Releases the key <key> of source table <table> held at <transform> (an address:
"transform" or "transform.column"), and re-derives it now (Trellis.releaseKey()). The key
is written as the quarantine shows it: a one-column key's text, a wider key's text[]
literal ('{1,abc}'). Exits 0 when it went through, 8 when it failed again and is held
again (with its new error).`,
  connects: true,
  json: true,
  setup(command) {
    command
      .argument('<transform>', 'the address holding the key: transform or transform.column')
      .argument('<table>', 'the source table, schema-qualified as the quarantine shows it')
      .argument('<key>', 'the key, as the quarantine shows it');
  },
  epilog: `Example:
  trellis release prices.ratio public.items 42`,
  async run({ operands, options, io }) {
    const [address, table, key] = operands as [string, string, string];
    await using trellis = await connectCli(options, io, 'release');
    const result = await trellis.releaseKey(address, table, key);
    if (options.json) printJson(io, result);
    if (!result.released) {
      throw new CliExit(
        EXIT_CODES.heldAgain,
        `key ${key} of ${table} failed again and is held again at ${result.address}: ${result.error}`,
      );
    }
    if (!options.json) io.out(`released key ${key} of ${table} at ${address}: re-derived\n`);
  },
});
