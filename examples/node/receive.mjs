// Receive messages as one consumer, print each (its body as hex: any bytes), and acknowledge
// them: one FCALL broker_receive, one FCALL broker_ack.
//
//   node receive.mjs [--consumer c1] [--count 1] [--lease-ms 30000] [--wait-s 0] [--no-ack]
//                    [--now-ms MS] SUB_ID
//
// broker_receive takes up to --count messages into this consumer's in-flight list and renews
// its lease (--lease-ms): a consumer that does not call it again within its lease is dead,
// and what it holds is given back (recover.mjs). With nothing waiting it blocks up to
// --wait-s seconds on the subscription's bell (BLMOVE onto itself: the bell is not taken),
// then receives once more. --no-ack exits without acknowledging: a killed consumer.
// --now-ms: receive as at this time (ms since the epoch) instead of the server's clock; the
// lease ends --lease-ms after it (a test makes a consumer whose lease has already passed).
//
// Prints "status <ok|standby|full> expired=<n>", then one line per message:
// "message msgid=... topic=... publisher=... delivery_count=<n> body_hex=<hex>", then
// "acked <n>". Exits 3 when the subscription's consumers leave no room for this one
// (standby: an exclusive subscription another live consumer holds; full: too many consumers).
import { binary, commandLine, connect, main, parseEnvelope, subscriptionKey } from './broker.mjs';

const { values, positionals } = commandLine(
  'node receive.mjs [--consumer ID] [--count N] [--lease-ms MS] [--wait-s S] [--no-ack] [--now-ms MS] SUB_ID',
  {
    consumer: { type: 'string', default: 'c1' },
    count: { type: 'string', default: '1' },
    'lease-ms': { type: 'string', default: '30000' },
    'wait-s': { type: 'string', default: '0' },
    'no-ack': { type: 'boolean', default: false },
    'now-ms': { type: 'string', default: '' }, // "": the server's clock
  },
  ({ positionals }) => positionals.length === 1,
);
const [subId] = positionals;
const key = subscriptionKey(subId);

// FCALL broker_receive 1 <sub key> <consumer> <count> <lease ms> <now ms>
// -> [status, expired, envelope1, delivery count1, envelope2, delivery count2, ...]
async function receive(client) {
  const reply = await client.fCall('broker_receive', {
    keys: [key],
    arguments: [values.consumer, values.count, values['lease-ms'], values['now-ms']],
  });
  const [status, expired, ...rest] = reply;
  const deliveries = [];
  for (let i = 0; i < rest.length; i += 2) deliveries.push({ envelope: rest[i], count: rest[i + 1] });
  return { status: status.toString(), expired, deliveries };
}

await main(async () => {
  const client = binary(await connect()); // envelopes are bytes: replies as Buffers
  try {
    let got = await receive(client);
    if (got.status === 'ok' && got.deliveries.length === 0 && Number(values['wait-s']) > 0) {
      const bell = `${key}:bell`; // rung by each delivery; BLMOVE onto itself leaves it rung
      await client.blMove(bell, bell, 'RIGHT', 'RIGHT', Number(values['wait-s']));
      got = await receive(client);
    }
    console.log(`status ${got.status} expired=${got.expired}`);
    if (got.status !== 'ok') {
      process.exitCode = 3;
      return;
    }
    for (const { envelope, count } of got.deliveries) {
      const { header, body } = parseEnvelope(envelope);
      console.log(
        `message msgid=${header.msgid} topic=${header.topic} publisher=${header.publisher} ` +
          `delivery_count=${count} body_hex=${body.toString('hex')}`,
      );
    }
    if (values['no-ack'] || got.deliveries.length === 0) return;
    // FCALL broker_ack 1 <sub key> <consumer> <envelope>...: the exact bytes received
    const acked = await client.fCall('broker_ack', {
      keys: [key],
      arguments: [values.consumer, ...got.deliveries.map((d) => d.envelope)],
    });
    console.log(`acked ${acked}`);
  } finally {
    await client.close();
  }
});
