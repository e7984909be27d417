-- The subscription sweep's probe (broker.clients.consumer.sweep_subscriptions): for each
-- subscription's consumers (a sorted set: consumer -> lease end, ms), whether one of them is
-- dead (its lease ended before ARGV[1]) and the newest lease end, in one call, so that a sweep
-- of many subscriptions is one round trip and one command for the worker to build. Reads only.
--
-- KEYS[1..n] the subscriptions' consumers "{qm}:sub:<id>:consumers"
-- ARGV[1] now, ms since the epoch
-- returns 2 integers per key, in order: dead (1 when a consumer's lease ended before now, or
--   when the key holds another type: a foreign key, for broker_recover to name; else 0) and the
--   newest lease end (ms; 0 when the subscription has no consumer, or the key is foreign)

local now, out = tonumber(ARGV[1]), {}
for i, key in ipairs(KEYS) do
  local dead = redis.pcall('ZRANGE', key, '-inf', '(' .. now, 'BYSCORE', 'LIMIT', 0, 1)
  if type(dead) == 'table' and dead.err then
    out[2 * i - 1], out[2 * i] = 1, 0
  else
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    out[2 * i - 1] = #dead > 0 and 1 or 0
    out[2 * i] = newest[2] and math.floor(tonumber(newest[2])) or 0
  end
end
return out
