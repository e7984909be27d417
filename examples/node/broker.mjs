// What every example shares: the server and queue manager they talk to, and the key names
// they build (the protocol's rules, docs/protocol.md and broker/core/keys.py).
//
// BROKER_REDIS_URL  the server (default redis://127.0.0.1:6380/0, `broker server`'s port)
// BROKER_QM         the queue manager (default QM1)
// The same variables the broker's own commands read.
import { createClient } from 'redis';

export const REDIS_URL = process.env.BROKER_REDIS_URL || 'redis://127.0.0.1:6380/0';
export const QM = process.env.BROKER_QM || 'QM1';

/** A connected client; a server that cannot be reached is an error, not a retry loop. */
export async function connect() {
  const client = createClient({ url: REDIS_URL, socket: { reconnectStrategy: false } });
  client.on('error', () => {}); // connect() and each command reject with the error themselves
  await client.connect();
  return client;
}

/**
 * Run an example's body; an error (no server, a refused command) is one line on stderr and
 * exit status 1, not a stack trace.
 */
export async function main(body) {
  try {
    await body();
  } catch (err) {
    console.error(`error: ${err.message || err}`);
    process.exitCode = 1;
  }
}

/** Every key of a queue manager starts with its hash tag: `{QM1}`. */
export const tag = (qm = QM) => `{${qm}}`;

/** The publish stream a publisher XADDs to: `{QM1}:publish`. */
export const publishStream = (qm = QM) => `${tag(qm)}:publish`;

/**
 * Where the result of a publication with `reply 1` is posted:
 * `{QM1}:reply:<n>:<publisher>:<msgid>`, `<n>` the publisher id's length in bytes.
 */
export const replyKey = (publisher, msgid, qm = QM) =>
  `${tag(qm)}:reply:${Buffer.byteLength(publisher)}:${publisher}:${msgid}`;
