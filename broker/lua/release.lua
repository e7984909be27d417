-- Give up publishers' turns (graceful stop): delete each owner key this worker
-- still holds, so that another worker's orphan sweep takes the turn at once
-- instead of waiting for the lease to run out.
--
-- ARGV[1] per-publisher key prefix  "{qm}:pub:"
-- ARGV[2] the worker's fencing token
-- ARGV[3..] publishers
-- returns the number of turns given up

local prefix, token, released = ARGV[1], ARGV[2], 0
for i = 3, #ARGV do
  local owner = prefix .. ARGV[i] .. ':owner'
  if redis.pcall('GET', owner) == token then  -- pcall: a foreign key is not ours
    redis.call('DEL', owner)
    released = released + 1
  end
end
return released
