-- Replay one dead letter as a publication (broker.operations.dead_letters): XADD its fields to the publish
-- stream, or to the ingress stream of the principal that published it, and, unless it is kept,
-- remove it from the dead-letter stream in the same atomic step, so that it is never both
-- gone from the dead-letter queue and not re-published, nor re-published twice by two replays.
-- Both keys share the {qm} hash slot. Checked before the first write: both key types, and
-- that the dead letter is still there (another replay or a purge may have taken it).
--
-- KEYS[1] dead-letter stream   "{qm}:dlq"
-- KEYS[2] the stream to publish to: "{qm}:publish" or "{qm}:in:<principal>"
-- ARGV[1] the dead letter's id in KEYS[1]
-- ARGV[2] "1": keep the dead letter (the publication's msgid and the dedup record keep a second
--   replay from delivering it again), "0": remove it
-- ARGV[3..] the publication's fields, name, value, ... (at most 2,000 values)
-- returns 1 re-published, 0 the dead letter is no longer there (nothing written)
-- errors "BROKER foreign key: ..." before any write when a key holds another type

local dlq, target, dlq_id, keep = KEYS[1], KEYS[2], ARGV[1], ARGV[2] == '1'
require_types({{dlq, 'stream'}, {target, 'stream'}})
if #redis.call('XRANGE', dlq, dlq_id, dlq_id) == 0 then return 0 end
redis.call('XADD', target, '*', unpack(ARGV, 3))
if not keep then redis.call('XDEL', dlq, dlq_id) end
return 1
