-- SPDX-License-Identifier: MIT
-- The general step's write (a piece of src/store/redis/step.lua and
-- src/store/redis/fair.lua, after step_decide.lua): an admission writes the new
-- state, moves the version on and sets the expiry.
-- An admission with n >= 1 writes the new state, bumps the version and sets
-- the expiry; anything else writes nothing.  A log's entries still in the
-- window are checked in full first (sl_valid).
if allowed and n > 0 and st ~= nil then
  local llo, lhi = u32(st, 1), u32(st, 5)
  for c = 1, count do
    if A[c] == 4 and not sl_valid(st, view[c], llo, lhi) then
      return DECLINE
    end
  end
end
if allowed and n > 0 then
  local parts = {put_t(t), put32(id), string.char(count, fmt)}
  for c = 1, count do
    local a, v, r = A[c], view[c], ver[c]
    if a == 1 then parts[#parts + 1] = puti64(r.new)
    elseif a == 2 or a == 3 then parts[#parts + 1] = put64(r.new)
    elseif a == 5 then
      local x, y = sw_commit(v.x, v.y, n)
      parts[#parts + 1] = put64(x) .. put64(y)
    else parts[#parts + 1] = sl_commit(st, v, n, t) end
  end

  local state = table.concat(parts)
  -- One write: the version moves on (a new key's starts from TIME in
  -- microseconds, as the compare-and-set script's does) with the state.
  local ver
  if tm == nil and (cur[1] == false or vtop or ttl_us ~= 0) then
    tm = redis.call('TIME')
  end
  if cur[1] == false or vtop then
    ver = tm[1] * 1000000 + tm[2]
  else
    ver = tonumber(cur[1]) + 1
  end
  if ver ~= nil and ver < 2^53 then
    redis.call('HSET', KEYS[1], 'v', string.format('%.0f', ver), 's', state)
  else -- past exact doubles (never in practice): let Redis count
    redis.call('HINCRBY', KEYS[1], 'v', 1)
    redis.call('HSET', KEYS[1], 's', state)
  end
  -- ttl: 0 no expiry; -1 this decision's reset_after; else microseconds
  if ttl_us == 0 then
    redis.call('PERSIST', KEYS[1])
  else
    local us = ttl_us
    if us < 0 then us = cdiv(reset, 1000) end
    expire_at(KEYS[1], us, tm)
  end
end
