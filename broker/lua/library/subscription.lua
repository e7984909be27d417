-- The library's shared part (after lib.lua): a subscription's keys found from its one key,
-- and the arguments checked, before any function writes anything. broker.core.library
-- puts `local PROTOCOL_VERSION = <n>` (keys.PROTOCOL_VERSION) in front of lib.lua.
--
-- Every function of the library takes the subscription's key "{qm}:sub:<sub id>" (its
-- default priority band) as KEYS[1] and derives the other keys of that subscription from it,
-- with the same hash tag, so the same cluster slot: the Python twins are in keys.py
-- (sub_band, sub_bell, sub_consumers, consumer_inflight, sub_holder, sub_redelivered,
-- sub_poison, sub_expired, sub_last_active, sub_groups, subscriptions). Every key a function touches is
-- checked against the caller's ACL user by the server, call by call: a subscriber user
-- reaches its own subscriptions' keys only.

-- Stop with "BROKER bad argument: ..." (before any write).
local function bad_argument(why)
  error({err = 'BROKER bad argument: ' .. why})
end

-- The keys of the subscription whose key is `key`: {tag, id, bands (p9 .. p0), bell,
-- consumers, holder, redelivered, poison, expired, last_active, groups, subs, inflight_prefix}.
local function subscription_keys(key)
  local tag, sub_id = string.match(key or '', '^(%b{}):sub:([^:]+)$')
  if not tag then
    error({err = 'BROKER not a subscription key: ' .. tostring(key)
      .. ' (want {<qm>}:sub:<sub id>, a sub id without ":")'})
  end
  local bands = {}
  for p = 9, 0, -1 do
    if p == 4 then bands[#bands + 1] = key else bands[#bands + 1] = key .. ':p' .. p end
  end
  return {tag = tag, id = sub_id, bands = bands, bell = key .. ':bell',
          consumers = key .. ':consumers', holder = key .. ':active',
          redelivered = key .. ':redelivered', poison = key .. ':poison',
          expired = key .. ':expired', last_active = key .. ':last_active', groups = key .. ':groups',
          subs = tag .. ':subs', inflight_prefix = key .. ':inflight:'}
end

-- A whole number >= 0 from argument `value` (named `what`), or `default` when absent or "".
local function count_arg(value, what, default)
  if value == nil or value == '' then return default end
  local n = tonumber(value)
  if not n or n < 0 or n ~= math.floor(n) then
    bad_argument(what .. ' must be a whole number >= 0, not ' .. tostring(value))
  end
  return n
end

-- A consumer id: 1-128 of A-Z a-z 0-9 _ . - (it names the consumer's in-flight list).
local function consumer_arg(value, required)
  if (value == nil or value == '') and not required then return '' end
  if value == nil or #value > 128 or not string.match(value, '^[%w_%.%-]+$') then
    bad_argument('consumer id must be 1-128 of A-Z a-z 0-9 _ . -, not ' .. tostring(value))
  end
  return value
end

-- The time argument: ms since the epoch, or "" / absent for the server's clock.
local function now_arg(value)
  if value == nil or value == '' then return now_ms('') end
  return count_arg(value, 'now', 0)
end

-- Message groups (JMSXGroupID, JMSXGroupSeq; ActiveMQ Classic and Artemis "message groups"):
-- the property that names an envelope's group, as it appears in the header's "props" object.
-- (Searched for without its opening quote: a plain find stops at each occurrence of the
-- first character, and quotes are everywhere in a header, a capital J is rare.)
local GROUP_FIELD = 'JMSXGroupID":'

-- Whether envelope `env` may belong to a group, from its first bytes when it can tell (protocol
-- 7: a worker writes a grouped message's header with "grouped":true first, so a header that starts
-- '{"v":' with a version of 7 or more belongs to no group): a constant check, no search. An older
-- envelope (a version of 6 or less, written before an upgrade and still waiting) or any other
-- shape is searched for the group property as before (group_of reads it then).
local function may_be_grouped(env)
  local _, _, b3, _, _, b6, b7 = string.byte(env, 1, 7)
  if b3 == 118 and b7 then   -- {"v":N
    if b7 == 44 then   -- one digit, then ","
      if b6 >= 55 and b6 <= 57 then return false end
    elseif b7 >= 48 and b7 <= 57 and b6 >= 49 and b6 <= 57 then   -- 10 or more
      return false
    end
  elseif b3 == 103 then   -- {"grouped":true,
    return true
  end
  return string.find(env, GROUP_FIELD, 1, true) ~= nil
end

-- The group of envelope `env` and its sequence number: its JMSXGroupID property (a non-empty
-- string) and its JMSXGroupSeq (a number, or nil); nil for an envelope of no group (no such
-- property, one of another type, or a header that is not JSON: its consumer rejects it).
-- A plain find first: only an envelope that holds the text JMSXGroupID": has its header line
-- read, and only when the text is in the header line, not the body. A group id with no
-- escape in it is matched in the header's text (a string value holding '"JMSXGroupID":"' is
-- JSON-escaped, \", and cannot match: envelope_head's rule); any other is decoded.
local function group_of(env)
  local at = string.find(env, GROUP_FIELD, 1, true)
  if not at then return nil end
  local nl = string.find(env, '\n', 1, true)
  if nl and at > nl then return nil end
  local line = nl and string.sub(env, 1, nl - 1) or env
  local group = string.match(line, '"JMSXGroupID":"([^"\\]*)"')
  if group then
    if group == '' then return nil end
    return group, tonumber(string.match(line, '"JMSXGroupSeq":(%-?%d+)[,}]'))
  end
  local ok, header = pcall(cjson.decode, line)
  if not ok or type(header) ~= 'table' or type(header.props) ~= 'table' then return nil end
  group = header.props.JMSXGroupID
  if type(group) ~= 'string' or group == '' then return nil end
  return group, tonumber(header.props.JMSXGroupSeq)
end

local MODES = {shared = '0', exclusive = '1', activestandby = '2', ['0'] = '0', ['1'] = '1', ['2'] = '2'}

-- The consumer mode "0" shared, "1" exclusive, "2" active-standby: the argument, or the
-- subscription record's "mode" when it is absent or "" (exclusive when the record has none,
-- as SubscriptionRecord.from_json reads it).
local function mode_arg(value, sub)
  if value == nil or value == '' then
    local ok, record = pcall(function() return redis.call('HGET', sub.subs, sub.id) end)
    value = 'exclusive'
    if ok and record then
      local decoded_ok, decoded = pcall(cjson.decode, record)
      if decoded_ok and type(decoded) == 'table' and type(decoded.mode) == 'string' then
        value = decoded.mode
      end
    end
  end
  local mode = MODES[value]
  if not mode then bad_argument('mode must be shared, exclusive or activestandby, not ' .. tostring(value)) end
  return mode
end

redis.register_function{
  function_name = 'broker_version',
  callback = function() return PROTOCOL_VERSION end,
  flags = {'no-writes', 'allow-oom', 'allow-stale'},
}
