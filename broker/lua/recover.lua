#!lua flags=allow-oom
-- allow-oom: runs on a full server too (maxmemory reached; lib.lua): giving a dead
-- consumer's messages back moves them, adding no memory to speak of, and consumers
-- must go on when the server is full, since consuming is what frees memory.
-- Give back the in-flight messages of a subscription's dead consumers: those
-- whose lease deadline has passed. Each message goes back to the head of its
-- priority band, ahead of newer ones, in the order it was received, and its
-- failed deliveries are counted; one delivered more than max_redeliveries
-- times is dead-lettered instead. A live consumer's in-flight list is never
-- touched. Consumers dead for longer than forget_ms are forgotten.
--
-- KEYS[1] the subscription's consumers   "{qm}:sub:<id>:consumers"   zset consumer -> lease deadline ms
-- KEYS[2] the redelivery counts          "{qm}:sub:<id>:redelivered" hash entry id -> failed deliveries
-- KEYS[3] the subscription's bell        "{qm}:sub:<id>:bell"
-- KEYS[4] dead-letter stream             "{qm}:dlq"
-- KEYS[5..14] the priority bands, highest first (as in receive.lua)
-- KEYS[15] the subscription's holder     "{qm}:sub:<id>:active" (released by a closing consumer that holds it)
-- KEYS[16] last use of subscriptions     "{qm}:last_active" hash sub id -> ms: set to now when a consumer
--   closes, and raised to the newest lease deadline of the consumers it forgets
-- ARGV[1] now, ms since the epoch, or "" for the server's clock
-- ARGV[2] max_redeliveries
-- ARGV[3] approximate cap of the dead-letter stream
-- ARGV[4] the in-flight prefix           "{qm}:sub:<id>:inflight:" (.. consumer)
-- ARGV[5] the subscription id
-- ARGV[6] forget_ms: a consumer dead for longer is removed from the consumers zset
-- ARGV[7] a consumer id to give back now whatever its lease (its own close), or ""
--   (it also gives up the holder key if it holds it, and leaves the consumers zset)
-- ARGV[8] the subscription hash "{qm}:subs" (nothing is given back to a removed subscription),
--   only read: passed by name, not in KEYS, so that a subscriber's ACL user needs read access
--   to it only (broker.operations.acl; same slot as the keys)
-- returns {consumers recovered, messages given back, messages dead-lettered}
-- errors "BROKER foreign key: ..." before any write when a key is foreign

local consumers, redelivered, bell, dlq, subs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[8]
local max_redeliveries, dlq_len = tonumber(ARGV[2]), ARGV[3]
local prefix, sub_id, forget_ms, closing = ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7]

local checks = {{consumers, 'zset'}, {redelivered, 'hash'}, {bell, 'list'}, {dlq, 'stream'}, {subs, 'hash'}}
for k = 5, 14 do checks[#checks + 1] = {KEYS[k], 'list'} end
checks[#checks + 1] = {KEYS[15], 'string'}
checks[#checks + 1] = {KEYS[16], 'hash'}
require_types(checks)

local now = now_ms(ARGV[1])
local dead = redis.call('ZRANGEBYSCORE', consumers, '-inf', '(' .. now)
if closing ~= '' and redis.call('ZSCORE', consumers, closing) then dead[#dead + 1] = closing end
local lists = {}
for _, c in ipairs(dead) do
  local key = prefix .. c
  local why = foreign(key, 'list')
  if why then error({err = 'BROKER ' .. why}) end
  lists[#lists + 1] = key
end

local exists = redis.call('HEXISTS', subs, sub_id) == 1
local given, dropped, recovered = 0, 0, 0
for _, key in ipairs(lists) do
  local envs = redis.call('LRANGE', key, 0, -1)   -- newest first (receive pushes on the left)
  if #envs > 0 then recovered = recovered + 1 end
  if exists then
    for _, env in ipairs(envs) do
      local head = envelope_head(env)
      local entry_id = string.match(head, '"entry_id":"([^"]*)"') or ''
      local priority = tonumber(string.match(head, '"priority":(%d)') or '4')
      local failed = redis.call('HINCRBY', redelivered, entry_id, 1)
      if failed > max_redeliveries then
        redis.call('HDEL', redelivered, entry_id)
        dead_letter_envelope(dlq, dlq_len, env,
          'delivered ' .. failed .. ' times to consumers that died without acknowledging it '
            .. '(max_redeliveries ' .. max_redeliveries .. ')',
          entry_id, sub_id)
        dropped = dropped + 1
      else
        -- RPUSH newest first: the oldest ends rightmost, where receive takes from
        redis.call('RPUSH', KEYS[5 + (9 - priority)], env)
        given = given + 1
      end
    end
  end
  redis.call('DEL', key)
end
if given > 0 then ring(bell) end
-- the subscription's last use, kept when its consumers leave the zset (a durable
-- subscription idle for durable_idle_expiry_ms is removed: broker.operations.durables)
local last_active = KEYS[16]
local function used_at(ms)
  if not exists then return end
  local known = tonumber(redis.call('HGET', last_active, sub_id) or '0') or 0
  if ms > known then redis.call('HSET', last_active, sub_id, ms) end
end
if closing ~= '' then
  if redis.call('ZREM', consumers, closing) == 1 then used_at(now) end
  if redis.call('GET', KEYS[15]) == closing then redis.call('DEL', KEYS[15]) end
end
local forgotten = '(' .. (now - forget_ms)
local newest = redis.call('ZREVRANGEBYSCORE', consumers, forgotten, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #newest > 0 then
  used_at(tonumber(newest[2]))
  redis.call('ZREMRANGEBYSCORE', consumers, '-inf', forgotten)
end
return {recovered, given, dropped}
