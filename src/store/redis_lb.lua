-- SPDX-License-Identifier: MIT
-- Leaky bucket, one limit: sent after redis_lean.lua (see there).  The
-- decision of src/algo/leaky_bucket.c with v = level * P in units of g.
-- ARGV [10] L/g, [11] P/g, [12] C (the capacity), [13] g
local L, P, C, g = tonumber(ARGV[10]), tonumber(ARGV[11]),
                   tonumber(ARGV[12]), tonumber(ARGV[13])
local cap = C * P
local v = 0
if st ~= nil then
  v = word_in(g, LEAKY_BUCKET_LEAN)
  if v == nil or v < 0 or v > cap then return DECLINE end
  if dt >= cdiv(v, L) then v = 0 else v = v - dt * L end
end
if OP ~= '0' then
  -- lb_adjust: a refund drains n permits from the bucket, down to empty;
  -- a penalty pours them in, up to the capacity.
  local x
  if OP == '1' then
    if n >= cdiv(v, P) then x = 0 else x = v - n * P end
  else
    if n > fdiv(cap - v, P) then x = cap else x = v + n * P end
  end
  local remaining = 0
  if cap - x > 0 then remaining = fdiv(cap - x, P) end
  local reset = cdiv(x, L)
  write(word_out(x, g), reset)
  return {1, 1, 0, 0, C, remaining, 0, 0, reset}
end
local ok, reason, delay, retry, need = false, 0, 0, 0, 0
local drain = cdiv(v, L)
if n > C then reason = 2; retry = -1
else
  need = n * P
  if n == 0 then ok = true
  elseif v + need <= cap and (drain == 0 or drain <= tonumber(ARGV[4])) then
    ok = true; delay = drain
  else reason = 1; retry = drain end
end
local x = v
if ok then x = v + need end
local remaining = 0
if cap - x > 0 then remaining = fdiv(cap - x, P) end
local reset = cdiv(x, L)
if ok and n > 0 then write(word_out(x, g), reset) end
return {1, ok and 1 or 0, reason, 0, C, remaining, delay, retry, reset}
