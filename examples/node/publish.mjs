// Publish one message and wait for its result: one XADD, one BLPOP.
//
//   node publish.mjs [--publisher svc-7] [--msgid o-1] [--wait-s 10] TOPIC [BODY]
//   node publish.mjs ... --body-hex 00ff TOPIC      (a body of any bytes, given in hex)
//
// Prints the entry id the server gave the publication, then the result the broker posted
// (one JSON object: status delivered, duplicate, expired or refused, subscriptions, ...).
// Exits 1 when the result did not come within --wait-s (no worker running?).
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { connect, main, publishStream, replyKey } from './broker.mjs';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    publisher: { type: 'string', default: 'svc-7' },
    msgid: { type: 'string' },
    'body-hex': { type: 'string' },
    'wait-s': { type: 'string', default: '10' },
  },
});
const [topic, text = ''] = positionals;
// A body is bytes: a Buffer is sent as it is, a string as its UTF-8 bytes.
const body = values['body-hex'] === undefined ? text : Buffer.from(values['body-hex'], 'hex');
if (!topic || !/^([0-9a-fA-F]{2})*$/.test(values['body-hex'] ?? '')) {
  console.error('usage: node publish.mjs [--publisher ID] [--msgid ID] [--wait-s S] [--body-hex HEX] TOPIC [BODY]');
  process.exit(2);
}
const publisher = values.publisher;
const msgid = values.msgid ?? randomUUID(); // the same msgid on a retry: delivered once (dedup)

await main(async () => {
  const client = await connect();
  try {
    // The entry id is always '*' (the server's clock); `reply 1` asks for the result.
    const entryId = await client.xAdd(publishStream(), '*', {
      publisher,
      topic,
      msgid,
      reply: '1',
      body,
    });
    console.log(`entry ${entryId}`);
    const popped = await client.blPop(replyKey(publisher, msgid), Number(values['wait-s']));
    if (popped === null) {
      console.error(`no result within ${values['wait-s']} s: is a worker running (broker worker)?`);
      process.exitCode = 1;
    } else {
      console.log(`result ${popped.element}`);
    }
  } finally {
    await client.close();
  }
});
