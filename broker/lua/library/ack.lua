-- broker_ack, broker_reject (allow-oom: they only remove, or move a message to the capped
-- poison stream, and acknowledging is how a full server's memory is freed).
--
-- broker_ack: a consumer acknowledges messages it received: each is removed from its own
-- in-flight list (the exact bytes received). When the acknowledged messages are the oldest
-- ones in flight (the whole batch last received, in any order, or its oldest part), one
-- LTRIM removes them all; otherwise each is removed with LREM ... -1, searched from the
-- oldest end. A message no longer in flight (its consumer's lease lapsed and broker_recover
-- gave it back) is not counted and changes nothing. The redelivery count of each message
-- removed is forgotten.
-- KEYS[1] the subscription's key "{qm}:sub:<id>" (the consumer's in-flight list
--   "{qm}:sub:<id>:inflight:<consumer>" and the redelivery counts "{qm}:sub:<id>:redelivered"
--   are derived from it)
-- ARGV[1] consumer id
-- ARGV[2..n] the envelopes acknowledged, as received
-- returns the number of messages removed from the in-flight list
-- errors "BROKER foreign key: ...", "BROKER bad argument: ...", "BROKER not a subscription
--   key: ...", before any write

local function ack(KEYS, ARGV)
  local sub = subscription_keys(KEYS[1])
  local inflight = sub.inflight_prefix .. consumer_arg(ARGV[1], true)
  local redelivered = sub.redelivered
  require_types({{inflight, 'list'}, {redelivered, 'hash'}})

  local n = #ARGV - 1
  if n <= 0 then return 0 end
  local removed = {}
  -- the oldest n in flight (the rightmost) are exactly the ones acknowledged: one LTRIM
  local tail = redis.call('LRANGE', inflight, -n, -1)
  if #tail == n then
    local wanted = {}
    for i = 2, n + 1 do wanted[ARGV[i]] = (wanted[ARGV[i]] or 0) + 1 end
    local all = true
    for i = 1, n do
      local left = wanted[tail[i]]
      if not left or left == 0 then all = false break end
      wanted[tail[i]] = left - 1
    end
    if all then
      redis.call('LTRIM', inflight, 0, -(n + 1))
      removed = tail
    end
  end
  if #removed == 0 then
    for i = 2, n + 1 do
      if redis.call('LREM', inflight, -1, ARGV[i]) > 0 then removed[#removed + 1] = ARGV[i] end
    end
  end
  if #removed > 0 and redis.call('EXISTS', redelivered) == 1 then
    for _, env in ipairs(removed) do
      local entry_id = string.match(envelope_head(env), '"entry_id":"([^"]*)"')
      if entry_id then redis.call('HDEL', redelivered, entry_id) end
    end
  end
  return #removed
end

redis.register_function{function_name = 'broker_ack', callback = ack, flags = {'allow-oom'}}

-- broker_reject: a consumer makes poison messages of envelopes it took but cannot read (a
-- malformed envelope: no header line, a header that is not a JSON object or not UTF-8, a
-- header field missing or of the wrong type): each is removed from its own in-flight list
-- and added to the subscription's poison stream in this one step, so it is neither lost nor
-- kept twice. A message no longer in flight (acknowledged, or given back by broker_recover
-- after this consumer's lease lapsed) changes nothing. The redelivery count of each message
-- moved is forgotten.
-- KEYS[1] the subscription's key "{qm}:sub:<id>" (in-flight list, redelivery counts and the
--   poison stream "{qm}:sub:<id>:poison" derived from it)
-- ARGV[1] consumer id
-- ARGV[2] approximate cap of the poison stream, default 100000
-- ARGV[3], ARGV[4], ... pairs: an envelope as received, the reason (dlq.reason)
-- returns the number of messages moved to the poison stream
-- errors as broker_ack
local function reject(KEYS, ARGV)
  local sub = subscription_keys(KEYS[1])
  local inflight = sub.inflight_prefix .. consumer_arg(ARGV[1], true)
  local dlq_len = count_arg(ARGV[2], 'poison cap', 100000)
  local redelivered, poison = sub.redelivered, sub.poison
  require_types({{inflight, 'list'}, {redelivered, 'hash'}, {poison, 'stream'}})

  local any_redelivered = redis.call('EXISTS', redelivered) == 1
  local n = 0
  for i = 3, #ARGV - 1, 2 do
    local env = ARGV[i]
    if redis.call('LREM', inflight, -1, env) > 0 then
      local entry_id = string.match(envelope_head(env), '"entry_id":"([^"]*)"') or ''
      if any_redelivered and entry_id ~= '' then redis.call('HDEL', redelivered, entry_id) end
      dead_letter_envelope(poison, dlq_len, env, ARGV[i + 1], entry_id, sub.id)
      n = n + 1
    end
  end
  return n
end

redis.register_function{function_name = 'broker_reject', callback = reject, flags = {'allow-oom'}}
