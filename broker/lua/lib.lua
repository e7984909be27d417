-- Helpers shared by the broker's scripts: broker/core/scripts.py puts this file in
-- front of every other script before loading it, and broker/core/library.py in front of
-- the function library (lua/library/). Nothing here runs on its own.
--
-- The rule every script keeps (DESIGN.md: Redis does not roll back a script
-- that fails halfway): check every key's type before the first write, so that
-- no command after it can fail. A key of the wrong type (a "foreign key", put
-- there by something other than the broker) is never written over.
--
-- A full server (maxmemory reached, maxmemory-policy noeviction) cannot break a
-- script halfway either: Redis and Valkey refuse a command that may add memory
-- (flag denyoom: SET, LPUSH, XADD, HSET, ...) only while the script has written
-- nothing yet (redis.call then stops it: nothing is written), and let every
-- write through once it has written (the server ends a little over maxmemory).
-- So a script never catches an out-of-memory error of a write with redis.pcall
-- and goes on writing: it stops (commit.lua's dedup record). Scripts with a
-- shebang line (#!lua flags=allow-oom), and the library's consumer functions (flag
-- allow-oom: broker_receive, broker_recover, ...), always run. A function without
-- allow-oom (broker_commit, the unit of work) is refused as a whole on a full server,
-- before it runs: nothing written either. The queue mutex (broker_dequeue) has allow-oom:
-- as a script, its first write (XREADGROUP's) was not one a full server refuses.

-- Why `key` cannot be used as a `want` ("list", "string", "stream", "set",
-- "zset", "hash"), or nil when it holds that type or does not exist.
local function foreign(key, want)
  local found = redis.call('TYPE', key)['ok']
  if found == 'none' or found == want then return nil end
  return 'foreign key: ' .. key .. ' holds a ' .. found .. ', not a ' .. want
end

-- Stop the script, before its first write, when the queue-manager-wide key `key` is foreign
-- (not a `want`, foreign above). The error reply starts with "BROKER foreign key".
local function require_type(key, want)
  local why = foreign(key, want)
  if why then error({err = 'BROKER ' .. why}) end
end

-- require_type for each of {{key, want}, ...}.
local function require_types(list)
  for _, pair in ipairs(list) do require_type(pair[1], pair[2]) end
end

-- What an optional table stands for until a call needs one (never written: reads find nothing in
-- it, and a reply gives it as an empty list). A table made and freed per call costs its allocation
-- and the garbage collector's work, which a call of one publication (a low rate) pays per
-- publication; `writable` makes the table the first time the call writes to it: t = writable(t).
local EMPTY = {}
local function writable(t)
  if t == EMPTY then return {} end
  return t
end

-- Messages in the lists `names` together: LLEN each; a key of another type (a
-- foreign key) holds none of them.
local function total_length(names)
  local total = 0
  for _, name in ipairs(names) do
    local n = redis.pcall('LLEN', name)
    if type(n) == 'number' then total = total + n end
  end
  return total
end

-- The last-delivered id of consumer group `group` on `stream` (XINFO GROUPS), or nil when the
-- stream has no such group.
local function last_delivered_of(stream, group)
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, last = nil, nil
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then last = info[j + 1] end
    end
    if name == group then return last end
  end
  return nil
end

-- A key built from a publisher id and a message id, injective whatever the ids
-- hold: prefix .. <byte length of publisher> .. ":" .. publisher .. ":" .. msgid
-- (keys.py: dedup, reply).
local function id_key(prefix, pub, msgid)
  return prefix .. #pub .. ':' .. pub .. ':' .. msgid
end

-- The value of field `name` in a flat {field, value, ...} list, or nil.
local function field_of(fields, name)
  for j = 1, #fields, 2 do
    if fields[j] == name then return fields[j + 1] end
  end
  return nil
end

-- The FIFO an entry is filed under: its publisher field, or `malformed` when
-- that is missing, empty or longer than max_bytes; and, found in the same scan of the
-- fields, the value of the field named `also` (the first one, as field_of), or nil
-- (dequeue.lua: the delivery_time, at no extra cost for an entry without one). The twin
-- of the Python owner of the rule, broker/core/wire.py: publisher_fifo
-- (tests/unit/test_wire.py checks both agree).
local function publisher_and(fields, malformed, max_bytes, also)
  local pub, other = nil, nil
  for j = 1, #fields, 2 do
    local name = fields[j]
    if name == 'publisher' then
      if pub == nil then pub = fields[j + 1] end
    elseif name == also and other == nil then
      other = fields[j + 1]
    end
  end
  if pub == nil or #pub == 0 or #pub > max_bytes then pub = malformed end
  return pub, other
end

-- The FIFO an entry is filed under (publisher_and).
local function publisher_of(fields, malformed, max_bytes)
  local pub = publisher_and(fields, malformed, max_bytes, nil)
  return pub
end

-- Whether a publication field is one only the broker may set: "principal" (dequeue.lua
-- stamps it), "origin" and "route" (a channel's mover), and every "dlq." field (the
-- dead-letter queue's own). The twin of broker.core.wire.is_broker_only (the Python owner
-- of BROKER_ONLY_FIELDS and BROKER_ONLY_PREFIX; tests/unit/test_wire.py checks both agree).
local BROKER_ONLY_FIELDS = {principal = true, origin = true, route = true}
local function broker_only(name)
  return BROKER_ONLY_FIELDS[name] == true or string.sub(name, 1, 4) == 'dlq.'
end

-- Most fields of an entry a dead letter copies: unpack() (and so one XADD) takes
-- at most about 8000 values, and an entry may have any number of fields.
local DEAD_LETTER_FIELDS = 1000

-- Add a dead letter: the entry's fields (each only when it is at most max_body
-- bytes: the body, or a props or topic made huge; otherwise "dlq.<field>_bytes"
-- says how large it was, and "dlq.entry_id" refers to it; only its first
-- DEAD_LETTER_FIELDS fields, and then "dlq.fields" says how many it had), then
-- the `extra` fields if any ({name, value, ...}: dequeue.lua's "dlq.principal"),
-- "dlq.reason" and "dlq.entry_id". The stream is capped at about maxlen records,
-- each small. `dlq` must be checked first.
local function dead_letter(dlq, maxlen, max_body, entry_id, fields, reason, extra)
  local out = {}
  local copied = math.min(#fields, 2 * DEAD_LETTER_FIELDS)
  for j = 1, copied, 2 do
    if #fields[j + 1] > max_body then
      out[#out + 1] = 'dlq.' .. fields[j] .. '_bytes'
      out[#out + 1] = tostring(#fields[j + 1])
    else
      out[#out + 1] = fields[j]
      out[#out + 1] = fields[j + 1]
    end
  end
  if copied < #fields then
    out[#out + 1] = 'dlq.fields'
    out[#out + 1] = tostring(#fields / 2)
  end
  for j = 1, #(extra or {}) do out[#out + 1] = extra[j] end
  out[#out + 1] = 'dlq.reason'
  out[#out + 1] = reason
  out[#out + 1] = 'dlq.entry_id'
  out[#out + 1] = entry_id
  redis.call('XADD', dlq, 'MAXLEN', '~', maxlen, '*', unpack(out))
end

-- Dead-letter a poison message of one subscription: its envelope as stored, with
-- "dlq.reason", "dlq.entry_id" (from its header, "" when it has none) and
-- "dlq.subscription" (broker_recover: redelivered too often; broker_receive: expired;
-- broker_reject: malformed), in the subscription's poison stream. The stream is capped at about maxlen records. `dlq`
-- must be checked first.
local function dead_letter_envelope(dlq, maxlen, env, reason, entry_id, sub_id)
  redis.call('XADD', dlq, 'MAXLEN', '~', maxlen, '*', 'envelope', env,
    'dlq.reason', reason, 'dlq.entry_id', entry_id, 'dlq.subscription', sub_id)
end

-- Post a publication's result on its reply list (keys.py: reply). The key's
-- type must be checked first (foreign(key, 'list') == nil).
local function post_reply(key, ttl_ms, result)
  redis.call('LPUSH', key, cjson.encode(result))
  redis.call('PEXPIRE', key, ttl_ms)
end

-- Refuse an entry the worker never parsed (its FIFO or turn key is foreign, or
-- it was orphaned): dead-letter it, acknowledge it and, when it asked for its
-- result and its reply key is usable, post "refused" with the reason.
-- ctx: {stream, group, dlq, dlq_len, max_body, reply_prefix, reply_ttl}
local function refuse_unparsed(ctx, entry_id, fields, pub, reason)
  dead_letter(ctx.dlq, ctx.dlq_len, ctx.max_body, entry_id, fields, reason)
  redis.call('XACK', ctx.stream, ctx.group, entry_id)
  if field_of(fields, 'reply') == '1' then
    local msgid = field_of(fields, 'msgid')
    if msgid == nil or msgid == '' then msgid = entry_id end
    local key = id_key(ctx.reply_prefix, pub, msgid)
    if not foreign(key, 'list') then
      post_reply(key, ctx.reply_ttl, {status = 'refused', subscriptions = 0, entry_id = entry_id,
                                      publisher = pub, msgid = msgid, reason = reason})
    end
  end
end


-- The time in ms since the epoch: `given` (a test's clock) or the server's.
local function now_ms(given)
  if given ~= nil and given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The header line of an envelope (broker/core/protocol.py: Envelope) without the body and
-- without its "props" object (the last header field, written by the worker),
-- so that a user property named like a header field is never read as one.
-- Header fields are then found with string.match('"name":...'): a string value
-- holding that text is JSON-escaped (\") and cannot match.
local function envelope_head(env)
  local nl = string.find(env, '\n', 1, true)
  local head = env
  if nl then head = string.sub(env, 1, nl - 1) end
  local props = string.find(head, ',"props":', 1, true)
  if props then head = string.sub(head, 1, props - 1) end
  return head
end

-- Ring a subscription's bell: one element while messages may wait, so that a
-- consumer blocked on it (BLMOVE bell bell RIGHT RIGHT) wakes. Check its type first.
local function ring(bell)
  -- pcall: a bell of another type (a subscriber's own key, planted) is not rung; its consumers find
  -- their messages when their wait ends, and nobody else's delivery stops for it
  if redis.pcall('LLEN', bell) == 0 then redis.pcall('RPUSH', bell, '1') end
end

-- The fields {field, value, ...} of stream entry `id`, or nil when it is gone.
local function entry_fields(stream, id)
  local found = redis.call('XRANGE', stream, id, id)
  if found[1] then return found[1][2] end
  return nil
end

-- Take over entries another worker dequeued, for the worker holding their publisher's turn
-- (take_over.lua; dequeue.lua for the next heads of a saturated publisher). The first
-- `counted` ids (each publisher's FIFO head) are claimed (XCLAIM), which counts a new
-- delivery, unless the worker whose pending entry it was
--   * is `consumer` itself: it lost track of it (after an error) and did not die; or
--   * recorded in the hash `alone` (worker -> entry id) another entry it was handling alone
--     this round (worker.loop: a suspect): its death is charged to that entry only.
-- Those are claimed with JUSTID, their count untouched, and so are the other ids, so that a
-- worker dying on one entry is charged to that entry alone, and the worker holding an entry
-- is the one whose record a take-over reads. The unit of work XACKs it. A record
-- in `alone` of a worker none of whose entries is pending any more is removed. The `alone`
-- key is read and written with pcall: when it is foreign, every head taken over is counted.
-- Returns {{entry id, {field, value, ...}, times delivered (0 when not counted)}, ...} for
-- the ids still in the stream, in the order given.
local function take_over(stream, group, consumer, ids, counted, alone)
  local fields_of, times_of, records = {}, {}, {}
  local claim, quiet = {stream, group, consumer, 0}, {stream, group, consumer, 0}
  for i = 1, counted do
    local id = ids[i]
    local info = redis.call('XPENDING', stream, group, id, id, 1)[1]
    if info then
      local owner, times = info[2], tonumber(info[4])
      local charged = owner ~= consumer
      if charged then
        if records[owner] == nil then
          local record = redis.pcall('HGET', alone, owner)
          records[owner] = type(record) == 'string' and record or false
        end
        if records[owner] and records[owner] ~= id then charged = false end
      end
      if charged then
        claim[#claim + 1] = id
        times_of[id] = times + 1
      else
        quiet[#quiet + 1] = id
        times_of[id] = times
      end
    else
      times_of[id] = 1
    end
  end
  for i = counted + 1, #ids do quiet[#quiet + 1] = ids[i] end
  if #claim > 4 then
    for _, entry in ipairs(redis.call('XCLAIM', unpack(claim))) do
      if entry and entry[2] then fields_of[entry[1]] = entry[2] end
    end
  end
  if #quiet > 4 then
    quiet[#quiet + 1] = 'JUSTID'
    redis.call('XCLAIM', unpack(quiet))
  end
  for owner, record in pairs(records) do
    if record and #redis.call('XPENDING', stream, group, '-', '+', 1, owner) == 0 then
      redis.pcall('HDEL', alone, owner)
    end
  end
  local out = {}
  for i, id in ipairs(ids) do
    local fields = fields_of[id] or entry_fields(stream, id)
    if fields then
      out[#out + 1] = {id, fields, i <= counted and times_of[id] or 0}
    end
  end
  return out
end
