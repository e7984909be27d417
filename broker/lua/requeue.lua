-- Give a poison message back to the one subscription it was dead-lettered from
-- (broker.operations.dead_letters): broker_recover (more than max_redeliveries failed deliveries),
-- broker_receive (expired) and broker_reject (malformed) write them with "envelope" and
-- "dlq.subscription" to the subscription's poison stream (protocol 5: to "{qm}:dlq"). The envelope
-- goes to the head of its priority band (received next, as broker_recover gives messages back),
-- the subscription's bell rings, and the dead letter is removed, in one atomic step: a
-- re-queued message is never also kept (no dedup record guards a subscriber queue, so a kept
-- one would be delivered again by the next replay). Checked before the first write: every key
-- type, that the dead letter is still there and holds an envelope, and that the subscription
-- still exists (a removed subscription's queue is never made again).
--
-- KEYS[1] the dead letter's stream: the subscription's poison stream "{qm}:sub:<id>:poison" (or
--   protocol 5's "{qm}:dlq")
-- KEYS[2] the subscription hash "{qm}:subs"
-- KEYS[3] the priority band of the envelope "{qm}:sub:<id>" or "{qm}:sub:<id>:p<N>"
-- KEYS[4] the subscription's bell "{qm}:sub:<id>:bell"
-- ARGV[1] the dead letter's id in KEYS[1]
-- ARGV[2] the subscription id
-- returns 1 re-queued, 0 the dead letter is no longer there, -1 the subscription no longer
--   exists, -2 the dead letter holds no envelope (nothing written but for 1)
-- errors "BROKER foreign key: ..." before any write when a key holds another type

local dlq, subs, band, bell, dlq_id, sub_id = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2]
require_types({{dlq, 'stream'}, {subs, 'hash'}, {band, 'list'}, {bell, 'list'}})
local found = redis.call('XRANGE', dlq, dlq_id, dlq_id)
if #found == 0 then return 0 end
local envelope = field_of(found[1][2], 'envelope')
if envelope == nil then return -2 end
if redis.call('HEXISTS', subs, sub_id) == 0 then return -1 end
redis.call('RPUSH', band, envelope)
ring(bell)
redis.call('XDEL', dlq, dlq_id)
return 1
