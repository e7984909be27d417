-- Topic statistics: one worker's counts since its last flush added in one call
-- (broker.operations.topic_stats.TopicCounter.flush), so that the flush is one round trip and one
-- command for the worker to build, whatever the number of topics.
--
-- Topics the publications hash does not know yet are admitted while it holds fewer than
-- ARGV[1] fields (OTHER, "", not counted against the bound); the counts of the others go to
-- OTHER (looked up, HEXISTS, only when the hash has no room for every topic of the call, known
-- or not: the usual case costs three writes per topic). A foreign statistics key stops the call before any write ("BROKER foreign key: ...",
-- require_types in lib.lua). A write refused (a field that is no integer) is counted and the
-- rest goes on: these are statistics, not guarantees.
--
-- KEYS[1] publications per topic   "{qm}:topic_stats:publications" (hash)
-- KEYS[2] copies per topic         "{qm}:topic_stats:copies" (hash)
-- KEYS[3] last publication's time  "{qm}:topic_stats:last" (sorted set, ms)
-- ARGV[1] max_topics: most topic fields kept (OTHER aside)
-- ARGV[2..] per topic, 4 values: topic string, publications, copies, last publication ms; the
--   OTHER row ("" as its topic), when present, comes last
-- returns {publications flushed, writes refused, the first refusal's message or ""}

require_types({{KEYS[1], 'hash'}, {KEYS[2], 'hash'}, {KEYS[3], 'zset'}})
local pubs_key, copies_key, last_key = KEYS[1], KEYS[2], KEYS[3]
local room = tonumber(ARGV[1]) - redis.call('HLEN', pubs_key)
if redis.call('HEXISTS', pubs_key, '') == 1 then room = room + 1 end
local other_p, other_c, other_t = 0, 0, 0
local flushed, refused, first = 0, 0, ''

local function check(reply)
  if type(reply) == 'table' and reply.err then
    refused = refused + 1
    if first == '' then first = reply.err end
  end
end

local function add(field, p, c, t)
  check(redis.pcall('HINCRBY', pubs_key, field, p))
  check(redis.pcall('HINCRBY', copies_key, field, c))
  check(redis.pcall('ZADD', last_key, 'GT', t, field))
  flushed = flushed + p
end

-- room for every topic of this call, known or not (the usual case): none is looked up
local all_fit = room >= (#ARGV - 1) / 4

for i = 2, #ARGV, 4 do
  local field, p, c, t = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if field == '' then
    other_p, other_c, other_t = other_p + p, other_c + c, math.max(other_t, t)
  elseif all_fit or redis.call('HEXISTS', pubs_key, field) == 1 then
    add(field, p, c, t)
  elseif room > 0 then
    room = room - 1
    add(field, p, c, t)
  else
    other_p, other_c, other_t = other_p + p, other_c + c, math.max(other_t, t)
  end
end
if other_p > 0 then add('', other_p, other_c, other_t) end
return {flushed, refused, first}
