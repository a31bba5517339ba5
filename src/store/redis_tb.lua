-- SPDX-License-Identifier: MIT
-- Token bucket, one limit: sent after redis_lean.lua (see there).  The
-- decision of src/algo/token_bucket.h with u = tokens * P in units of g.
-- ARGV [10] L/g, [11] P/g, [12] B, [13] g, [14] the debt bound 2^62 / g,
-- rounded down (a reservation may not take u below it, as in C)
local L, P, B, g = tonumber(ARGV[10]), tonumber(ARGV[11]),
                   tonumber(ARGV[12]), tonumber(ARGV[13])
local full = B * P
local u = full
if st ~= nil then
  u = word_in(g, TOKEN_BUCKET_LEAN)
  -- (|u| <= 2^51 here: below the debt bound only when it is below 2^51)
  if u == nil or u > full or -u > tonumber(ARGV[14]) then return DECLINE end
  if u < full then
    local missing = full - u
    if dt >= cdiv(missing, L) then u = full else u = u + dt * L end
  end
end
if OP ~= '0' then
  -- tb_adjust: a refund adds n tokens, up to the burst; a penalty takes
  -- them, into debt as far as a reservation may go (2^62 scaled): one
  -- that would pass that bound, or take more than TOKEN_BUCKET_LEAN (in
  -- units of g), declines (the C step clamps it), so every number here
  -- stays exact.
  local x
  if OP == '1' then
    if n >= cdiv(full - u, P) then x = full else x = u + n * P end
  else
    if n > fdiv(TOKEN_BUCKET_LEAN, P) then return DECLINE end
    x = u - n * P
    if -x > tonumber(ARGV[14]) then return DECLINE end
  end
  local remaining, reset = 0, 0
  if x > 0 then remaining = fdiv(x, P) end
  if full - x > 0 then reset = cdiv(full - x, L) end
  write(word_out(x, g), reset)
  return {1, 1, 0, 0, B, remaining, 0, 0, reset}
end
local ok, reason, delay, retry, need = false, 0, 0, 0, 0
if n > B then reason = 2; retry = -1
else
  need = n * P
  if n == 0 or u >= need then ok = true
  else
    local late = cdiv(need - u, L)
    local max_wait = tonumber(ARGV[4])
    -- u - need >= -2^52: exact
    local deep = max_wait > 0 and u - need < -tonumber(ARGV[14])
    if max_wait > 0 and not deep and late <= max_wait then
      ok = true; delay = late
    else reason = 1; retry = late end
  end
end
local x = u
if ok then x = u - need end
local remaining, reset = 0, 0
if x > 0 then remaining = fdiv(x, P) end
if full - x > 0 then reset = cdiv(full - x, L) end
if ok and n > 0 then write(word_out(x, g), reset) end
return {1, ok and 1 or 0, reason, 0, B, remaining, delay, retry, reset}
