-- SPDX-License-Identifier: MIT
-- The lean sliding window counter's driver, one limit (docs/redis.md,
-- "Lean scripts"): the common part, then the rule
-- (src/algo/sliding_window.lua).  The state's word is the two 8-byte
-- counts prev and curr (lean.lua reads it as 16 bytes, in 32-bit limbs).
-- Windows are aligned to the clock's zero, offsets found as the lean
-- fixed window finds them: t and t_last share a window when t - t_last
-- is the difference of their offsets, t is in the next one when it is W
-- more.  num [5] L, [6] W (ns), L * W at most SLIDING_WINDOW_LEAN (2^52)
-- and W at most half of it, as the client's gate (lean_of) sends them:
-- every number the rule forms (at most L * W) is then exact.
--@include src/store/redis/lean_lib.lua
--@include src/algo/sliding_window.lua
local LAST = 6
--@call
--@include src/store/redis/lean.lua
local L, W = num[5], num[6]
if WB ~= 16 or L < 1 or W < 1 or L * W > SLIDING_WINDOW_LEAN or
   W > SLIDING_WINDOW_LEAN / 2 then
  return DECLINE -- W within 2^51: a dt of 2^52 or more (math.huge) is
end              -- then always two windows on or more
local e = offset(t_hi, t_lo, W)
local prev, curr, roll = nil, nil, 0
if st ~= nil then
  -- past 2^53 inexact, but then past L too: sw_load declines
  prev, curr = w[2] * E32 + w[1], w[4] * E32 + w[3]
  local el = offset(l_hi, l_lo, W)
  if dt == e - el then roll = 0
  elseif dt == W + e - el then roll = 1
  else roll = 2 end
end
prev, curr = sw_load(prev, curr, L)
if prev == nil then return DECLINE end
prev, curr = sw_advance(prev, curr, roll)
if OP ~= '0' then
  local x, y = sw_adjust(prev, curr, OP == '1' and 1 or 2, n, L)
  local remaining, reset = sw_status(x, y, L, W, e)
  write(struct.pack('<i8i8', x, y), reset)
  return {1, 1, 0, 0, L, remaining, 0, 0, reset}
end
local ok, reason, delay, retry = sw_decide(prev, curr, n, L, W, e)
local x, y = prev, curr
if ok then x, y = sw_commit(prev, curr, n) end
local remaining, reset = sw_status(x, y, L, W, e)
if ok and n > 0 then write(struct.pack('<i8i8', x, y), reset) end
return {1, ok and 1 or 0, reason, 0, L, remaining, delay, retry, reset}
