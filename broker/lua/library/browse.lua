-- broker_browse (no-writes: FCALL_RO; allow-oom): the next messages of a subscription in
-- the order they would be received, without taking them (Jakarta Messaging's QueueBrowser):
-- bands from priority 9 down to 0, oldest first within a band (a band's rightmost end);
-- messages whose expiration has passed are left out.
--
-- KEYS[1] the subscription's key "{qm}:sub:<id>" (its bands derived from it)
-- ARGV[1] most messages returned, default 10, at most 1000
-- ARGV[2] now (expiry), ms since the epoch, or "" for the server's clock
-- returns {envelope, ...}, as stored (bytes)
-- errors "BROKER foreign key: ..." (a band of another type), "BROKER bad argument: ...",
--   "BROKER not a subscription key: ..."

local BROWSE_MAX, BROWSE_PAGE = 1000, 100

local function browse(KEYS, ARGV)
  local sub = subscription_keys(KEYS[1])
  local n = count_arg(ARGV[1], 'most messages', 10)
  if n > BROWSE_MAX then bad_argument('most messages is at most ' .. BROWSE_MAX .. ', not ' .. n) end
  local now = now_arg(ARGV[2])
  local checks = {}
  for _, band in ipairs(sub.bands) do checks[#checks + 1] = {band, 'list'} end
  require_types(checks)
  local out = {}
  for _, band in ipairs(sub.bands) do
    local start = 0
    while #out < n do
      local page = redis.call('LRANGE', band, -(start + BROWSE_PAGE), -(start + 1))
      if #page == 0 then break end
      for i = #page, 1, -1 do
        local env = page[i]
        local expiration = 0
        if string.find(env, '"expiration":', 1, true) then
          expiration = tonumber(string.match(envelope_head(env), '"expiration":(%d+)') or '0')
        end
        if not (expiration > 0 and expiration <= now) then
          out[#out + 1] = env
          if #out >= n then break end
        end
      end
      start = start + BROWSE_PAGE
    end
    if #out >= n then break end
  end
  return out
end

redis.register_function{function_name = 'broker_browse', callback = browse,
                        flags = {'no-writes', 'allow-oom'}}
