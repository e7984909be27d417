-- One unit of work for one publication: fan out to every subscriber queue,
-- record the message id, acknowledge the stream entry, post the result and
-- pass the publisher's turn on, all or nothing. Fenced: it does nothing unless
-- this worker still holds the publisher's turn and the entry is at the head of
-- the publisher's FIFO (a worker resumed after its lease cannot write).
--
-- KEYS[1] publish stream               "{qm}:publish"
-- KEYS[2] publisher FIFO               "{qm}:pub:<publisher>:fifo"
-- KEYS[3] publisher turn               "{qm}:pub:<publisher>:owner"
-- KEYS[4] active publishers set        "{qm}:publishers"
-- KEYS[5] dedup record                 "{qm}:dedup:<publisher>:<msgid>"
-- KEYS[6] reply list                   "{qm}:reply:<publisher>:<msgid>"
-- KEYS[7] dead-letter stream           "{qm}:dlq"
-- KEYS[8..] subscriber queues          "{qm}:sub:<id>" (deliver only)
-- ARGV[1] consumer group
-- ARGV[2] stream entry id
-- ARGV[3] the worker's fencing token
-- ARGV[4] lease_ms of the publisher's turn
-- ARGV[5] action: "deliver" | "expire" | "refuse" | "skip"
-- ARGV[6] deliver: the envelope; refuse: the reason; otherwise ignored
-- ARGV[7] dedup_window_ms (0: no dedup record, msgid defaulted)
-- ARGV[8] reply_ttl_ms (0: no reply wanted)
-- ARGV[9] publisher id (for the reply)
-- ARGV[10] msgid (for the reply)
-- ARGV[11] refuse: suggested topic, or ""
-- returns {status, subscriptions, released}
--   status: "delivered" | "duplicate" | "expired" | "refused" | "skipped" | "fenced"
--   released: 1 when the FIFO is now empty and the turn was given up

local fifo, owner = KEYS[2], KEYS[3]
local entry_id, token, action = ARGV[2], ARGV[3], ARGV[5]

if redis.call('GET', owner) ~= token or redis.call('LINDEX', fifo, 0) ~= entry_id then
  return {'fenced', 0, 0}
end

local status, count = 'skipped', 0
local dedup_window = tonumber(ARGV[7])
if action == 'deliver' then
  if dedup_window > 0 and redis.call('EXISTS', KEYS[5]) == 1 then
    status = 'duplicate'
  else
    for i = 8, #KEYS do redis.call('LPUSH', KEYS[i], ARGV[6]) end
    count = #KEYS - 7
    if dedup_window > 0 then redis.call('SET', KEYS[5], entry_id, 'PX', dedup_window) end
    status = 'delivered'
  end
elseif action == 'expire' then
  status = 'expired'
elseif action == 'refuse' then
  status = 'refused'
  local original = redis.call('XRANGE', KEYS[1], entry_id, entry_id)
  local fields = {}
  if #original == 1 then fields = original[1][2] end
  fields[#fields + 1] = 'dlq.reason'
  fields[#fields + 1] = ARGV[6]
  fields[#fields + 1] = 'dlq.entry_id'
  fields[#fields + 1] = entry_id
  redis.call('XADD', KEYS[7], '*', unpack(fields))
end

redis.call('XACK', KEYS[1], ARGV[1], entry_id)
redis.call('LPOP', fifo)

local reply_ttl = tonumber(ARGV[8])
if reply_ttl > 0 then
  local result = {status = status, subscriptions = count, entry_id = entry_id,
                  publisher = ARGV[9], msgid = ARGV[10]}
  if status == 'refused' then
    result.reason = ARGV[6]
    if ARGV[11] ~= '' then result.suggestion = ARGV[11] end
  end
  redis.call('LPUSH', KEYS[6], cjson.encode(result))
  redis.call('PEXPIRE', KEYS[6], reply_ttl)
end

local released = 0
if redis.call('LLEN', fifo) == 0 then
  redis.call('DEL', owner)
  redis.call('SREM', KEYS[4], ARGV[9])
  released = 1
else
  redis.call('PEXPIRE', owner, ARGV[4])
end
return {status, count, released}
