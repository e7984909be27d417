#!lua flags=allow-oom
-- allow-oom: runs on a full server too (maxmemory reached; lib.lua): it moves a message
-- from an in-flight list to the dead-letter stream, which is capped, and a consumer must
-- go on past a message it cannot read when the server is full too.
-- A consumer dead-letters messages it took but cannot read (a malformed envelope: no
-- header line, a header that is not a JSON object or not UTF-8, a header field missing or
-- of the wrong type): each is removed from its own in-flight list and added to the
-- dead-letter stream in this one step, so it is neither lost nor dead-lettered twice. A
-- message no longer in flight (acknowledged, or given back by recover.lua after this
-- consumer's lease lapsed) is not dead-lettered and changes nothing. The redelivery
-- count of each message dead-lettered is forgotten.
--
-- KEYS[1] this consumer's in-flight list "{qm}:sub:<id>:inflight:<consumer>"
-- KEYS[2] the redelivery counts          "{qm}:sub:<id>:redelivered" hash entry id -> failed deliveries
-- KEYS[3] dead-letter stream             "{qm}:dlq"
-- ARGV[1] the subscription id (dlq.subscription)
-- ARGV[2] approximate cap of the dead-letter stream
-- ARGV[3], ARGV[4], ... pairs: an envelope as received, the reason (dlq.reason)
-- returns the number of messages dead-lettered
-- errors "BROKER foreign key: ..." before any write when a key is foreign

local inflight, redelivered, dlq = KEYS[1], KEYS[2], KEYS[3]
local sub_id, dlq_len = ARGV[1], ARGV[2]
require_types({{inflight, 'list'}, {redelivered, 'hash'}, {dlq, 'stream'}})

local any_redelivered = redis.call('EXISTS', redelivered) == 1
local n = 0
for i = 3, #ARGV - 1, 2 do
  local env = ARGV[i]
  if redis.call('LREM', inflight, -1, env) > 0 then
    local entry_id = string.match(envelope_head(env), '"entry_id":"([^"]*)"') or ''
    if any_redelivered and entry_id ~= '' then redis.call('HDEL', redelivered, entry_id) end
    dead_letter_envelope(dlq, dlq_len, env, ARGV[i + 1], entry_id, sub_id)
    n = n + 1
  end
end
return n
