-- Orphan sweep: find entries that are pending (read, not acknowledged) but no
-- longer in their publisher's FIFO, so no worker will ever handle them (an
-- operator deleted or overwrote the FIFO by hand), and refuse them: dead-letter
-- with the reason, acknowledge, post "refused" when asked. Without this, such
-- an entry stays pending forever and stops trimming at it.
--
-- A FIFO holds its publisher's entry ids in stream order (dequeue.lua files
-- them in the same atomic call that reads them), so an entry is in its FIFO
-- only if head <= id <= tail: two LINDEX calls, whatever the FIFO's length.
-- An entry already deleted from the stream is only acknowledged (a FIFO that
-- still holds it skips it when it reaches the head).
--
-- KEYS[1] publish stream            "{qm}:publish"
-- KEYS[2] dead-letter stream        "{qm}:dlq"
-- ARGV[1] consumer group
-- ARGV[2] min_idle_ms: only entries idle at least this long are looked at
-- ARGV[3] count: the most pending entries looked at
-- ARGV[4] start: the smallest entry id to look at ("-" for the oldest)
-- ARGV[5] per-publisher key prefix  "{qm}:pub:"
-- ARGV[6] malformed publisher id
-- ARGV[7] most bytes of a publisher id
-- ARGV[8] reply key prefix          "{qm}:reply:"
-- ARGV[9] reply_ttl_ms
-- ARGV[10] approximate cap of the dead-letter stream, records
-- ARGV[11] max_body_bytes: a dead letter keeps a field (the body) only up to this size
-- returns {next start id or "" when the pending list was read to its end, refused entry ids}

local stream, group = KEYS[1], ARGV[1]
local prefix, malformed, max_pub = ARGV[5], ARGV[6], tonumber(ARGV[7])
local ctx = {stream = stream, group = group, dlq = KEYS[2], dlq_len = ARGV[10], max_body = tonumber(ARGV[11]),
             reply_prefix = ARGV[8], reply_ttl = ARGV[9]}

require_types({{stream, 'stream'}, {KEYS[2], 'stream'}})

local function id_less(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  if ams ~= bms then return ams < bms end
  return tonumber(aseq) < tonumber(bseq)
end

local count = tonumber(ARGV[3])
local pending = redis.call('XPENDING', stream, group, 'IDLE', ARGV[2], ARGV[4], '+', count)
local refused = {}
for _, p in ipairs(pending) do
  local id = p[1]
  local found = redis.call('XRANGE', stream, id, id)
  if #found == 0 then
    redis.call('XACK', stream, group, id)
  else
    local fields = found[1][2]
    local pub = publisher_of(fields, malformed, max_pub)
    local fifo = prefix .. pub .. ':fifo'
    local head = redis.pcall('LINDEX', fifo, 0)
    local tail = redis.pcall('LINDEX', fifo, -1)
    local filed = type(head) == 'string' and type(tail) == 'string'
      and not id_less(id, head) and not id_less(tail, id)
    if not filed then
      local why = foreign(fifo, 'list') or ('not in its publisher\'s FIFO ' .. fifo .. ' (deleted by hand?)')
      refuse_unparsed(ctx, id, fields, pub, 'orphaned: pending but ' .. why)
      refused[#refused + 1] = id
    end
  end
end
local nxt = ''
if #pending == count then
  local last = pending[#pending][1]
  local ms, seq = string.match(last, '^(%d+)-(%d+)$')
  nxt = ms .. '-' .. (tonumber(seq) + 1)
end
return {nxt, refused}
