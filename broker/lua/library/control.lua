-- broker_request: subscribing as a request (seed 000: "the subscriber sends a request
-- subscription message to a control queue on the broker"; docs/protocol.md): one subscribe or
-- unsubscribe request XADDed to the caller's own control stream, which the workers (run with
-- security = true) answer on "<control stream>:reply:<request id>" (broker.operations.control
-- checks the fields and the subscribe grants; a bad request gets an error answer there).
-- A subscriber ACL user may write its control stream only (no read: no TYPE here; an XADD to a
-- key of another type is refused by the server, writing nothing).
--
-- KEYS[1] the control stream "{qm}:ctl:<client id>"
-- ARGV    field, value pairs: op (subscribe | unsubscribe), topic, name, durable, selector,
--         no_local, reply (the request id: 1-64 of A-Z a-z 0-9 _ . -)
-- returns {entry id, the answer's key}: BLPOP the key for the answer (JSON)
-- errors "BROKER bad argument: ..." (not field/value pairs), "BROKER not a control stream: ..."

local function control_request(KEYS, ARGV)
  local stream = KEYS[1]
  if not string.match(stream or '', '^%b{}:ctl:[%w_%.%-]+$') then
    error({err = 'BROKER not a control stream: ' .. tostring(stream) .. ' (want {<qm>}:ctl:<client id>)'})
  end
  if #ARGV == 0 or #ARGV % 2 ~= 0 then bad_argument('a request is field, value pairs') end
  local reply = nil
  for i = 1, #ARGV, 2 do
    if ARGV[i] == 'reply' then reply = ARGV[i + 1] end
  end
  local id = redis.call('XADD', stream, '*', unpack(ARGV))
  -- a missing or malformed request id is answered on the entry id (broker.operations.control)
  if not reply or #reply > 64 or not string.match(reply, '^[%w_%.%-]+$') then reply = id end
  return {id, stream .. ':reply:' .. reply}
end
redis.register_function{function_name = 'broker_request', callback = control_request}
