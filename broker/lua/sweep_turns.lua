-- Orphan sweep: take the turn of publishers whose FIFO still holds entries but
-- whose turn nobody holds (a worker that died or stopped gave up its turn, or its
-- lease ran out), and find again the turns this worker holds but forgot (a
-- dequeue whose reply was lost). The worker then claims the entries (XCLAIM)
-- as it drains.
--
-- KEYS[1] active publishers set     "{qm}:publishers"
-- ARGV[1] per-publisher key prefix  "{qm}:pub:"
-- ARGV[2] the worker's fencing token
-- ARGV[3] lease_ms of a publisher's turn
-- ARGV[4] SSCAN cursor ("0" to start)
-- ARGV[5] SSCAN count
-- returns {next cursor, {publishers whose turn was taken or found}}
-- A publisher whose FIFO or turn key is foreign is left alone (pcall): the
-- orphan sweep (sweep_entries.lua) refuses the entries such a key strands.
-- A foreign KEYS[1] stops the script before it reads or writes anything, with the
-- broker's error "BROKER foreign key: ..." (require_types in lib.lua).

local prefix, token = ARGV[1], ARGV[2]
require_types({{KEYS[1], 'set'}})
local scan = redis.call('SSCAN', KEYS[1], ARGV[4], 'COUNT', ARGV[5])
local taken = {}
for _, pub in ipairs(scan[2]) do
  local backlog = redis.pcall('LLEN', prefix .. pub .. ':fifo')
  if type(backlog) ~= 'number' or backlog == 0 then
    if redis.call('EXISTS', prefix .. pub .. ':turn') == 0 then
      redis.call('SREM', KEYS[1], pub)
    end
  elseif redis.call('SET', prefix .. pub .. ':turn', token, 'NX', 'PX', ARGV[3]) then
    taken[#taken + 1] = pub
  elseif redis.pcall('GET', prefix .. pub .. ':turn') == token then
    -- ours already, but the worker lost track of it (a lost dequeue reply)
    taken[#taken + 1] = pub
  end
end
return {scan[1], taken}
