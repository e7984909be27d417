#!lua flags=allow-oom
-- allow-oom: runs on a full server too (maxmemory reached; lib.lua): taking messages
-- moves them (LRANGE + LTRIM of a band, LPUSH onto the in-flight list) and renews a
-- lease, adding no memory to speak of, and consuming (then acknowledging, ack.lua or
-- LREM) is how a full server's memory is freed.
-- A consumer takes up to N messages of one subscription into its own in-flight
-- list, highest priority first (Jakarta Messaging §3.4.10), oldest first within
-- a priority. The call is also the consumer's heartbeat: its lease is renewed.
-- A message whose expiration has passed is never handed over: it is counted
-- (and dead-lettered when asked). The delivery count of a message redelivered
-- after its consumer died comes from the redelivery hash.
--
-- KEYS[1] the subscription's consumers   "{qm}:sub:<id>:consumers"   zset consumer -> lease deadline ms
-- KEYS[2] this consumer's in-flight list "{qm}:sub:<id>:inflight:<consumer>"
-- KEYS[3] the subscription's bell        "{qm}:sub:<id>:bell"        list, one element while messages may wait
-- KEYS[4] the redelivery counts          "{qm}:sub:<id>:redelivered" hash entry id -> failed deliveries
-- KEYS[5] the subscription's holder      "{qm}:sub:<id>:active"      string consumer id (held while
--   its lease in the consumers zset runs)
-- KEYS[6] dead-letter stream             "{qm}:dlq"
-- KEYS[7] expired counts                 "{qm}:expired"              hash sub id -> messages expired in its queue
-- KEYS[8..17] the priority bands, highest first: "{qm}:sub:<id>:p9" .. ":p5", "{qm}:sub:<id>", ":p3" .. ":p0"
-- ARGV[1] consumer id
-- ARGV[2] most messages to take; 0 makes the call a heartbeat only
-- ARGV[3] lease_ms of the consumer
-- ARGV[4] now, ms since the epoch, or "" for the server's clock
-- ARGV[5] the consumer mode: 0 shared; 1 exclusive (must hold the subscription); 2 active-standby
--   (must hold it to receive; waits as a standby, registered, while another holds it)
-- ARGV[6] 1: expired messages are dead-lettered; 0: dropped (counted)
-- ARGV[7] approximate cap of the dead-letter stream
-- ARGV[8] the subscription id (expired counts, dead letters)
-- ARGV[9] max_consumers_per_subscription: a consumer not attached (no live lease) is refused
--   while this many consumers have live leases; 0 or absent: no limit
-- returns {status, expired, env1, count1, env2, count2, ...}
--   status: "ok" | "standby" (another consumer holds the subscription: nothing taken)
--     | "full" (max_consumers_per_subscription live consumers already: nothing written; the
--     second value is how many)
--   count: the delivery count (JMSXDeliveryCount), 1 for a first delivery
-- errors "BROKER foreign key: ..." before any write when a key is foreign

local consumers, inflight, bell, redelivered, active, dlq, expired = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local consumer, max_n, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local must_hold, standby_ok = ARGV[5] ~= '0', ARGV[5] == '2'
local to_dlq, dlq_len, sub_id = ARGV[6] == '1', ARGV[7], ARGV[8]
local max_consumers = tonumber(ARGV[9] or '0') or 0
-- most values one LPUSH is given (unpack() takes at most about 8000)
local PUSH_CHUNK = 1000

-- The keys this call may use are checked (the holder only for a mode that has one, the
-- dead-letter stream only when expired messages go there). Only a band that exists can be
-- foreign, and usually only the default one (KEYS[13]) does: two EXISTS calls tell, and
-- then only the bands that may hold messages are checked and read.
local checks = {{consumers, 'zset'}, {inflight, 'list'}, {bell, 'list'}, {redelivered, 'hash'},
                {expired, 'hash'}}
if must_hold then checks[#checks + 1] = {active, 'string'} end
if to_dlq then checks[#checks + 1] = {dlq, 'stream'} end
local bands = {}
local default_band = redis.call('EXISTS', KEYS[13])
if redis.call('EXISTS', unpack(KEYS, 8, 17)) == default_band then
  if default_band == 1 then bands[1] = 13 end
else
  for k = 8, 17 do bands[#bands + 1] = k end
end
for _, k in ipairs(bands) do checks[#checks + 1] = {KEYS[k], 'list'} end
require_types(checks)

local now = now_ms(ARGV[4])
if max_consumers > 0 then
  -- a consumer joins when it has no live lease; refused, before any write, when the
  -- subscription has max_consumers live ones (standbys included)
  local mine = tonumber(redis.call('ZSCORE', consumers, consumer) or '-1')
  if mine < now then
    local live = redis.call('ZCOUNT', consumers, now, '+inf')
    if live >= max_consumers then return {'full', live} end
  end
end
if must_hold then
  -- the holder keeps the subscription while its lease (its deadline in the
  -- consumers zset) runs; a dead holder's messages are given back by recover.lua
  local holder = redis.call('GET', active)
  if holder and holder ~= consumer then
    local deadline = tonumber(redis.call('ZSCORE', consumers, holder) or '0')
    if deadline >= now then
      -- a standby (active-standby) is a consumer too; a refused second exclusive one is not
      if standby_ok then redis.call('ZADD', consumers, now + lease_ms, consumer) end
      return {'standby', 0}
    end
  end
  if holder ~= consumer then redis.call('SET', active, consumer) end
end
redis.call('ZADD', consumers, now + lease_ms, consumer)

local out = {'ok', 0}
local any_redelivered = redis.call('EXISTS', redelivered) == 1
local taken, n_expired = 0, 0
-- A band's oldest messages are its rightmost: take up to the number still wanted with one
-- LRANGE and one LTRIM, and push the ones handed over onto the in-flight list with LPUSH
-- (oldest first, so it ends as a run of LMOVE ... RIGHT LEFT would leave it: newest on
-- the left). Only an envelope that holds the text "expiration": has its header read.
local function hand_over(keep)
  for i = 1, #keep, PUSH_CHUNK do
    redis.call('LPUSH', inflight, unpack(keep, i, math.min(i + PUSH_CHUNK - 1, #keep)))
  end
end
for _, k in ipairs(bands) do
  while taken < max_n do
    local want = max_n - taken
    local envs = redis.call('LRANGE', KEYS[k], -want, -1)
    if #envs == 0 then break end
    redis.call('LTRIM', KEYS[k], 0, -(#envs + 1))
    local keep = {}
    for i = #envs, 1, -1 do
      local env = envs[i]
      local expiration, entry_id = 0, nil
      if string.find(env, '"expiration":', 1, true) then
        local head = envelope_head(env)
        expiration = tonumber(string.match(head, '"expiration":(%d+)') or '0')
        entry_id = string.match(head, '"entry_id":"([^"]*)"') or ''
      end
      if expiration > 0 and expiration <= now then
        n_expired = n_expired + 1
        if any_redelivered then redis.call('HDEL', redelivered, entry_id) end
        if to_dlq then
          dead_letter_envelope(dlq, dlq_len, env, 'expired while waiting in subscription ' .. sub_id,
            entry_id, sub_id)
        end
      else
        local count = 1
        if any_redelivered then
          entry_id = entry_id or string.match(envelope_head(env), '"entry_id":"([^"]*)"') or ''
          count = 1 + tonumber(redis.call('HGET', redelivered, entry_id) or '0')
        end
        keep[#keep + 1] = env
        out[#out + 1] = env
        out[#out + 1] = count
        taken = taken + 1
      end
    end
    hand_over(keep)
    if #envs < want then break end   -- the band is empty now
  end
end
if n_expired > 0 then redis.call('HINCRBY', expired, sub_id, n_expired) end
out[2] = n_expired
if max_n == 0 then
  -- a heartbeat: nothing taken, the bell left as it is
elseif taken < max_n then
  redis.call('DEL', bell)       -- every band is empty
else
  ring(bell)                    -- more may wait: wake the next consumer
end
return out
