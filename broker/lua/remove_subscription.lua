-- Remove a subscription with every key it owns, in one atomic call: its record,
-- its priority bands, bell, consumers, their in-flight lists, holder key,
-- redelivery counts, expired count, last-use time and message groups; when a record was removed, the index
-- version is bumped so that workers reload (keys left by an id with no record
-- are only deleted). With a cutoff, only an abandoned subscription is removed:
-- a non-durable one (MQTT 5 session expiry) whose consumers' lease deadlines
-- and creation are all before the cutoff, or, in durable mode, an idle durable
-- one whose lease deadlines, creation and last-use time are all before it.
-- With a least depth, it is removed only while at least that many messages
-- wait in its bands (a slow-subscriber condition still holds). Its poison messages
-- ("{qm}:sub:<id>:poison") are kept: an operator lists, replays (to a subscription of the same
-- id made again) or purges them with broker dlq.
--
-- KEYS[1] the subscription hash          "{qm}:subs"
-- KEYS[2] the index version              "{qm}:version"
-- KEYS[3] the subscription's consumers   "{qm}:sub:<id>:consumers"
-- KEYS[4] the subscription's bell        "{qm}:sub:<id>:bell"
-- KEYS[5] the subscription's holder      "{qm}:sub:<id>:active"
-- KEYS[6] the redelivery counts          "{qm}:sub:<id>:redelivered"
-- KEYS[7] the protocol 2 in-flight list  "{qm}:sub:<id>:inflight"
-- KEYS[8..17] the priority bands
-- KEYS[18] protocol 5's last use of subscriptions "{qm}:last_active" hash sub id -> ms (read; its
--   field is removed; another type is passed over: nobody writes it now)
-- KEYS[19] the subscription change log  "{qm}:sub_changes" zset "<version> <sub id>" -> version,
--   and its epoch "epoch <id>" -> 0 (made with the log, kept by the trim)
--   (a removal is logged there, unless it holds another type: workers then reload their whole table)
-- KEYS[20] the subscription's last use   "{qm}:sub:<id>:last_active" string ms (read leniently: the
--   subscription's consumers write it; deleted with it)
-- KEYS[21] the subscription's expired count "{qm}:sub:<id>:expired" (deleted with it)
-- ARGV[1] the subscription id
-- ARGV[2] the in-flight prefix           "{qm}:sub:<id>:inflight:" (.. consumer)
-- ARGV[3] cutoff, ms since the epoch: remove only when abandoned since then; "" = remove
-- ARGV[4] "durable": the cutoff removes an idle durable subscription (not a non-durable one); "" otherwise
-- ARGV[5] least depth: remove only when its bands hold at least this many messages; "" = remove
-- ARGV[6] most entries kept in the change log (keys.SUB_CHANGES_MAX_LEN)
-- returns {removed, messages}: removed 1, or 0 (no such subscription, not abandoned, or not
--   that deep); messages: those deleted with it (waiting in its bands and in flight), or
--   waiting in its bands when it was not removed for its depth (0 otherwise)
-- errors "BROKER foreign key: ..." before any write when a key is foreign

local subs, version, consumers, last_active = KEYS[1], KEYS[2], KEYS[3], KEYS[18]
local sub_id, prefix, cutoff, durable_mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == 'durable'
local least = ARGV[5] or ''
require_types({{subs, 'hash'}, {version, 'string'}, {consumers, 'zset'}})

local record = redis.call('HGET', subs, sub_id)
if cutoff ~= '' then
  if not record then return {0, 0} end
  local limit = tonumber(cutoff)
  local ok, data = pcall(cjson.decode, record)
  if not ok or type(data) ~= 'table' or (data.durable == true) ~= durable_mode then return {0, 0} end
  if (tonumber(data.created_ms) or 0) > limit then return {0, 0} end
  local last = redis.call('ZRANGE', consumers, -1, -1, 'WITHSCORES')
  if #last > 0 and tonumber(last[2]) > limit then return {0, 0} end
  if durable_mode then
    local own = redis.pcall('GET', KEYS[20])   -- a consumer's own key: another type counts as unknown
    own = type(own) == 'string' and tonumber(own) or 0
    local old = redis.pcall('HGET', last_active, sub_id)   -- protocol 5's: another type counts as unknown
    old = type(old) == 'string' and tonumber(old) or 0
    if math.max(own, old) > limit then return {0, 0} end
  end
end
local bands = {}
for k = 8, 17 do bands[#bands + 1] = KEYS[k] end
local waiting = total_length(bands)
if least ~= '' and (not record or waiting < tonumber(least)) then return {0, waiting} end

local doomed, inflight = {}, {KEYS[7]}
for k = 3, 17 do doomed[#doomed + 1] = KEYS[k] end
doomed[#doomed + 1] = KEYS[20]
doomed[#doomed + 1] = KEYS[21]
-- its message groups "{qm}:sub:<id>:groups" (keys.sub_groups), beside the in-flight prefix
doomed[#doomed + 1] = string.sub(prefix, 1, -#'inflight:' - 1) .. 'groups'
for _, c in ipairs(redis.call('ZRANGE', consumers, 0, -1)) do
  doomed[#doomed + 1] = prefix .. c
  inflight[#inflight + 1] = prefix .. c
end
local messages = waiting + total_length(inflight)
redis.pcall('HDEL', last_active, sub_id)
if record then
  redis.call('HDEL', subs, sub_id)
  -- workers refresh only when a subscription went: they apply the logged change alone
  local now = redis.call('INCR', version)
  local log_key, kind = KEYS[19], redis.call('TYPE', KEYS[19]).ok
  if kind == 'zset' or kind == 'none' then
    if kind == 'none' or now == 1 then  -- a new log (none, or the versions restart) starts with
      local t = redis.call('TIME')         -- its epoch: it is never taken for an older log
      redis.call('DEL', log_key)
      redis.call('ZADD', log_key, 0, 'epoch ' .. now .. '.' .. t[1] .. '.' .. t[2])
    end
    redis.call('ZADD', log_key, now, now .. ' ' .. sub_id)
    redis.call('ZREMRANGEBYRANK', log_key, 1, -(tonumber(ARGV[6]) + 1))
  end
end
redis.call('DEL', unpack(doomed))
if record then return {1, messages} end
return {0, messages}
