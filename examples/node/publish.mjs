// Publish one message and wait for its result: one XADD, one BLPOP.
//
//   node publish.mjs [--publisher svc-7] [--msgid o-1] [--wait-s 10] TOPIC [BODY]
//   node publish.mjs ... --body-hex 00ff TOPIC      (a body of any bytes, given in hex)
//   node publish.mjs ... --principal pub1 TOPIC     (security on: pub1's ingress stream)
//
// Prints the entry id the server gave the publication (with --principal, its id in the
// ingress stream: the result's entry_id is the publish stream's), then the result the broker
// posted (one JSON object: status delivered, duplicate, expired or refused, subscriptions, ...).
// Exits 1 when the result did not come within --wait-s (no worker running?).
import { randomUUID } from 'node:crypto';
import { commandLine, connect, ingressStream, main, publishStream, replyKey } from './broker.mjs';

const HEX = /^([0-9a-fA-F]{2})*$/;
const { values, positionals } = commandLine(
  'node publish.mjs [--publisher ID] [--msgid ID] [--wait-s S] [--body-hex HEX] [--principal USER] TOPIC [BODY]',
  {
    publisher: { type: 'string', default: 'svc-7' },
    msgid: { type: 'string' },
    'body-hex': { type: 'string' },
    principal: { type: 'string' },
    'wait-s': { type: 'string', default: '10' },
  },
  ({ values, positionals }) => positionals.length >= 1 && HEX.test(values['body-hex'] ?? ''),
);
const [topic, text = ''] = positionals;
// A body is bytes: a Buffer is sent as it is, a string as its UTF-8 bytes.
const body = values['body-hex'] === undefined ? text : Buffer.from(values['body-hex'], 'hex');
const publisher = values.publisher;
const msgid = values.msgid ?? randomUUID(); // the same msgid on a retry: delivered once (dedup)

await main(async () => {
  const client = await connect();
  try {
    // The entry id is always '*' (the server's clock); `reply 1` asks for the result. With
    // security on, the ACL user in BROKER_REDIS_URL may XADD only to its own ingress stream.
    const stream = values.principal === undefined ? publishStream() : ingressStream(values.principal);
    const entryId = await client.xAdd(stream, '*', {
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
