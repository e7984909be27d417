#!lua flags=no-writes
-- Read the subscription changes after a worker's routing-table version, with the records they
-- changed, in one atomic call (read only): what the worker applies to its table alone
-- (``broker.topics.routing.RoutingTable.refresh``) instead of reloading every subscription.
--
-- KEYS[1] the index version              "{qm}:version"
-- KEYS[2] the subscription change log    "{qm}:sub_changes" zset "<version> <sub id>" -> version
-- KEYS[3] the subscription hash          "{qm}:subs"
-- ARGV[1] the version the worker's table is at (an integer)
-- ARGV[2] most log entries to read
-- returns {version, entries, records, first}: the version now (nil when absent); the log entries
--   scored above ARGV[1], oldest first, flat (member, score, ...); for each entry the
--   subscription's record now (nil when it has none, or when the member names no id); the
--   log's first entry (member, score): its epoch "epoch <id>" scored 0, or nothing.
--   Returns {} (the caller reloads its whole table) when one of the keys holds another type.

for _, pair in ipairs({{KEYS[1], 'string'}, {KEYS[2], 'zset'}, {KEYS[3], 'hash'}}) do
  if foreign(pair[1], pair[2]) then return {} end
end
local version = redis.call('GET', KEYS[1])
local entries = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local records = {}
for i = 1, #entries, 2 do
  local sub_id = string.match(entries[i], '^%d+ (.+)$')
  records[#records + 1] = sub_id and redis.call('HGET', KEYS[3], sub_id) or false
end
return {version, entries, records, redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')}
