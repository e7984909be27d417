-- Remove a subscription with every key it owns, in one atomic call: its record,
-- its priority bands, bell, consumers, their in-flight lists, holder key,
-- redelivery counts and last-use time; the index version is bumped so that
-- workers reload. With a cutoff, only an abandoned subscription is removed:
-- a non-durable one (MQTT 5 session expiry) whose consumers' lease deadlines
-- and creation are all before the cutoff, or, in durable mode, an idle durable
-- one whose lease deadlines, creation and last-use time are all before it.
--
-- KEYS[1] the subscription hash          "{qm}:subs"
-- KEYS[2] the index version              "{qm}:version"
-- KEYS[3] the subscription's consumers   "{qm}:sub:<id>:consumers"
-- KEYS[4] the subscription's bell        "{qm}:sub:<id>:bell"
-- KEYS[5] the subscription's holder      "{qm}:sub:<id>:active"
-- KEYS[6] the redelivery counts          "{qm}:sub:<id>:redelivered"
-- KEYS[7] the protocol 2 in-flight list  "{qm}:sub:<id>:inflight"
-- KEYS[8..17] the priority bands
-- KEYS[18] last use of subscriptions     "{qm}:last_active" hash sub id -> ms (its field is removed)
-- ARGV[1] the subscription id
-- ARGV[2] the in-flight prefix           "{qm}:sub:<id>:inflight:" (.. consumer)
-- ARGV[3] cutoff, ms since the epoch: remove only when abandoned since then; "" = remove
-- ARGV[4] "durable": the cutoff removes an idle durable subscription (not a non-durable one); "" otherwise
-- returns {1 removed or 0 no such subscription (or not abandoned), messages it held (waiting + in flight)}
-- errors "BROKER foreign key: ..." before any write when a key is foreign

local subs, version, consumers, last_active = KEYS[1], KEYS[2], KEYS[3], KEYS[18]
local sub_id, prefix, cutoff, durable_mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == 'durable'
require_types({{subs, 'hash'}, {version, 'string'}, {consumers, 'zset'}, {last_active, 'hash'}})

local record = redis.call('HGET', subs, sub_id)
if cutoff ~= '' then
  if not record then return {0, 0} end
  local limit = tonumber(cutoff)
  local ok, data = pcall(cjson.decode, record)
  if not ok or type(data) ~= 'table' or (data.durable == true) ~= durable_mode then return {0, 0} end
  if (tonumber(data.created_ms) or 0) > limit then return {0, 0} end
  local last = redis.call('ZRANGE', consumers, -1, -1, 'WITHSCORES')
  if #last > 0 and tonumber(last[2]) > limit then return {0, 0} end
  if durable_mode and (tonumber(redis.call('HGET', last_active, sub_id) or '0') or 0) > limit then
    return {0, 0}
  end
end

local doomed, held = {}, 0
for k = 3, 17 do doomed[#doomed + 1] = KEYS[k] end
for _, c in ipairs(redis.call('ZRANGE', consumers, 0, -1)) do doomed[#doomed + 1] = prefix .. c end
-- what is lost: the protocol 2 in-flight list, the bands and the consumers' in-flight lists
for k = 5, #doomed do
  if redis.call('TYPE', doomed[k]).ok == 'list' then held = held + redis.call('LLEN', doomed[k]) end
end
redis.call('HDEL', subs, sub_id)
redis.call('HDEL', last_active, sub_id)
redis.call('INCR', version)
redis.call('DEL', unpack(doomed))
if record then return {1, held} end
return {0, 0}
