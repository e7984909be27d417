-- Fetch entries another worker dequeued (a hand-over, or a dead worker's
-- entries) for the worker holding their publisher's turn (take_over in lib.lua).
-- The first K ids (each publisher's FIFO head) are claimed (XCLAIM), which counts a
-- new delivery (not when taken back from the caller's own pending entries, nor from a
-- worker that recorded another entry it handled alone); the others are claimed with
-- JUSTID, their delivery count untouched, so that an entry that keeps killing its
-- workers can be dead-lettered (max_deliveries), and only that entry.
--
-- KEYS[1] publish stream
-- KEYS[2] entries handled alone  "{qm}:alone" (worker -> entry id; read, and records of workers
--         with nothing pending removed, with pcall: a foreign key counts every head)
-- ARGV[1] consumer group
-- ARGV[2] the worker's consumer name
-- ARGV[3] K: how many of the ids that follow count as a delivery
-- ARGV[4..] entry ids, the K counted ones first
-- returns {{entry id, {field, value, ...}, times delivered (0 when not counted)}, ...}

local ids = {}
for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
return take_over(KEYS[1], ARGV[1], ARGV[2], ids, tonumber(ARGV[3]), KEYS[2])
